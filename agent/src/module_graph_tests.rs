//! The agent's top-level modules must not import each other in a cycle: a cycle is how
//! an IO module's types end up in the pure ones and the shell's wiring in everything.
//! The graph is read from the source (`crate::<module>` in non-test code), so a change
//! that closes a cycle fails here, naming it. What every module may share without an
//! edge (kubelet's decisions, the records of a trace) is the core crate's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`.
pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file that is not a test: up to its first `#[cfg(test)]`, comments
/// removed. Test files (`tests.rs`, `*_tests.rs`) have none.
fn non_test_code(path: &Path) -> String {
    let name = path.file_name().unwrap().to_string_lossy();
    if name == "tests.rs" || name.ends_with("_tests.rs") {
        return String::new();
    }
    let text = std::fs::read_to_string(path).unwrap();
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    code.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules each top-level module imports.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = src();
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.is_dir() || (stem != "lib" && stem != "main" && !stem.ends_with("_tests")) {
            modules.insert(stem, path);
        }
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    let mut graph = BTreeMap::new();
    for (name, path) in &modules {
        let mut files = Vec::new();
        if path.is_dir() {
            rust_files(path, &mut files);
        } else {
            files.push(path.clone());
        }
        let mut to = BTreeSet::new();
        for file in files {
            let code = non_test_code(&file);
            for (i, _) in code.match_indices("crate::") {
                let rest = &code[i + "crate::".len()..];
                let target: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if target != *name && names.contains(&target) {
                    to.insert(target);
                }
            }
        }
        graph.insert(name.clone(), to);
    }
    graph
}

/// A cycle in `graph`, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, graph, &mut Vec::new(), &mut done) {
            return Some(cycle);
        }
    }
    None
}

#[test]
fn the_agents_modules_import_each_other_in_no_cycle() {
    let graph = graph();
    assert!(
        graph.len() >= 15,
        "only {} modules found in {}",
        graph.len(),
        src().display()
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "the agent's modules import each other in a cycle: {}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn a_cycle_is_found_and_named() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", &["b"][..]),
        ("b", &["c"][..]),
        ("c", &["a"][..]),
        ("d", &["a"][..]),
    ]
    .into_iter()
    .map(|(k, v)| {
        (
            k.to_string(),
            v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>(),
        )
    })
    .collect();
    let cycle = find_cycle(&graph).unwrap();
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 4, "{cycle:?}");
    let mut acyclic = graph.clone();
    acyclic.get_mut("c").unwrap().clear();
    assert_eq!(find_cycle(&acyclic), None);
}
