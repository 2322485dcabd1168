//! A recorded CRI call's response is read and written through its types
//! (`podlapse_core::record::CriResponse`): only the core's `cri_response_serde.rs` knows
//! its fields' names and spellings in a trace. A change that reads or writes a response
//! by string key again, here or in the core, tests included, fails here, naming the file
//! and line.

use crate::module_graph_tests::rust_files;
use std::path::Path;

/// Ways of reaching into a map of fields by key, as they read with whitespace removed
/// (so a chain split over lines is caught too).
const BY_KEY: &[&str] = &[
    "response.get(",
    "response.get_mut(",
    "response.insert(",
    "response.remove(",
    "response.entry(",
    "response.contains_key(",
    "response.iter(",
    "response[",
    "ResponseFields::from_iter(",
];

/// The files that may: the serde layer, and this list.
const EXEMPT: &[&str] = &["cri_response_serde.rs", "typed_responses_tests.rs"];

/// Where `text` reads a response by key: (line, the way), comments left out.
fn by_key(text: &str) -> Vec<(usize, &'static str)> {
    // The code without whitespace, and the line each of its characters is on.
    let mut code = String::new();
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split("//").next().unwrap_or_default();
        for c in line.chars().filter(|c| !c.is_whitespace()) {
            code.push(c);
            lines.extend(std::iter::repeat_n(i + 1, c.len_utf8()));
        }
    }
    let mut found: Vec<(usize, &'static str)> = BY_KEY
        .iter()
        .flat_map(|way| code.match_indices(way).map(|(at, _)| (lines[at], *way)))
        .collect();
    found.sort_unstable();
    found
}

#[test]
fn no_module_reads_or_writes_a_response_by_key() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    rust_files(&root.join("core/src"), &mut files);
    assert!(files.len() > 100, "only {} files found", files.len());
    let mut found = Vec::new();
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy();
        if EXEMPT.contains(&name.as_ref()) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (line, way) in by_key(&text) {
            let path = path.strip_prefix(root).unwrap_or(&path);
            found.push(format!("{}:{line}: `{way}`", path.display()));
        }
    }
    assert!(
        found.is_empty(),
        "a CRI response read or written by key; use CriResponse's types and accessors:\n{}",
        found.join("\n")
    );
}

#[test]
fn a_read_by_key_is_found_however_it_is_laid_out() {
    let text = "let a = 1;\n\
                let code = c\n    .response\n    .get(\"exit_code\");\n\
                // c.response.get(\"in a comment\")\n\
                status.response.insert(\"state\".into(), \"0\".into());\n\
                let ip = &st.response[\"ip\"];\n";
    assert_eq!(
        by_key(text),
        vec![
            (3, "response.get("),
            (6, "response.insert("),
            (7, "response["),
        ]
    );
    assert!(by_key("c.response.exit_code()").is_empty());
}
