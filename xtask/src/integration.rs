//! The integration tests of `tests/`: four binaries, grouped by what they need of the node,
//! each made of modules named as the tests' targets once were (`kernel_events`,
//! `run_pods`, ...). The harness runs one module at a time, so tests of different modules
//! never overlap: the probe tests see every exec on the node, and a module's tests are
//! written against the lab as only they use it. Inside a module, tests run as libtest
//! runs them (two at a time here, on two CPUs).
//!
//! One binary instead of a dozen per group: each binary links the agent and the tests'
//! support once, and `cargo xtask test` builds four, not twenty-two.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};

use crate::workspace;

/// A test binary of `tests/` and its modules.
pub struct Binary {
    pub name: &'static str,
    pub modules: &'static [&'static str],
}

/// On the host, without a lab: run while the shared lab is down.
pub const NO_LAB: Binary = Binary {
    name: "no_lab",
    modules: &["cgroups", "deploy", "replay", "report", "perfetto_native"],
};

/// Each test starts and stops a lab of its own: run while the shared lab is down.
pub const OWN_LAB: Binary = Binary {
    name: "own_lab",
    modules: &["lab_lifecycle", "timeline_cni_failure", "diagnose_network"],
};

/// Against the lab `cargo xtask test` starts (`modern_node` only in the guest).
pub const SHARED_LAB: Binary = Binary {
    name: "shared_lab",
    modules: &[
        "cri_info",
        "run_pods",
        "conformance",
        "pipeline",
        "agent",
        "probes",
        "grpc_probes",
        "sidecars",
        "resize",
        "kernel_events",
        "timeline",
        "observe",
        "observe_outputs",
        "daemonset",
        "observe_kubelet",
        "observe_rotation",
        "diagnose_faults",
        "no_ip",
        "crash_safe_trace",
        "otel_export",
        "sources",
        "modern_node",
    ],
};

/// Kills and restarts the shared lab's containerd: last, on its own.
pub const DESTRUCTIVE: Binary = Binary {
    name: "destructive",
    modules: &["fault_containerd"],
};

pub const BINARIES: [&Binary; 4] = [&NO_LAB, &OWN_LAB, &SHARED_LAB, &DESTRUCTIVE];

/// The modules of `binary` the host runs: all but `modern_node`, which checks the modern
/// node's shape and runs in the guest.
fn host_modules(binary: &Binary) -> impl Iterator<Item = &'static str> + '_ {
    binary
        .modules
        .iter()
        .copied()
        .filter(|m| *m != "modern_node")
}

/// The binary a module is in.
pub fn binary_of(module: &str) -> Option<&'static Binary> {
    BINARIES.into_iter().find(|b| b.modules.contains(&module))
}

/// The test package's own programs the tests run (cargo builds them with the tests).
pub const CRI_POD_CLIENT: &str = "cri-pod-client";

/// What [`build`] built: each test binary's executable, and the CRI client program.
pub struct Built {
    pub binaries: Vec<(&'static str, PathBuf)>,
    pub cri_pod_client: PathBuf,
}

impl Built {
    pub fn executable(&self, binary: &str) -> anyhow::Result<&Path> {
        self.binaries
            .iter()
            .find(|(b, _)| *b == binary)
            .map(|(_, exe)| exe.as_path())
            .with_context(|| format!("the test binary {binary} was not built"))
    }
}

/// `cargo test --no-run` for `binaries` (test target names); their executables.
pub fn build(binaries: &[&'static str]) -> anyhow::Result<Built> {
    let mut cmd = workspace::cargo();
    // The whole workspace selected, as the unit tests' build does: the same features, so
    // the agent's crates compiled there are reused, not compiled again.
    cmd.args(["test", "--workspace", "--no-run", "--message-format=json"]);
    for b in binaries {
        cmd.args(["--test", b]);
    }
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the test binaries failed ({})", out.status);
    }
    let mut built = Vec::new();
    let mut client = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(name), Some(exe)) = (msg["target"]["name"].as_str(), msg["executable"].as_str())
        else {
            continue;
        };
        match msg["target"]["kind"][0].as_str() {
            Some("test") => {
                if let Some(b) = binaries.iter().find(|b| **b == name) {
                    built.push((*b, PathBuf::from(exe)));
                }
            }
            Some("bin") if name == CRI_POD_CLIENT => client = Some(PathBuf::from(exe)),
            _ => {}
        }
    }
    for b in binaries {
        if !built.iter().any(|(n, _)| n == b) {
            bail!("cargo built no executable for the test binary {b}");
        }
    }
    Ok(Built {
        binaries: built,
        cri_pod_client: client.context("cargo built no cri-pod-client")?,
    })
}

/// Every test of `exe`, by full name (`module::test`), as libtest lists them.
pub fn list(exe: &Path) -> anyhow::Result<Vec<String>> {
    let out = workspace::output_of(
        Command::new(exe).args(["--list", "--format", "terse"]),
        &format!("{} --list", exe.display()),
    )?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_string)
        .collect())
}

/// The libtest arguments that run `names` of `module` (every test of it when `names` is
/// empty) and nothing else, chosen from `listed` ([`list`]). A module with no test, or a
/// name it does not have, is an error: a run of nothing would pass.
pub fn selection(listed: &[String], module: &str, names: &[&str]) -> anyhow::Result<Vec<String>> {
    let prefix = format!("{module}::");
    let of_module: Vec<&String> = listed.iter().filter(|t| t.starts_with(&prefix)).collect();
    if of_module.is_empty() {
        bail!("the test binary has no module {module} (or no test in it)");
    }
    let chosen: Vec<String> = if names.is_empty() {
        of_module.into_iter().cloned().collect()
    } else {
        names
            .iter()
            .map(|n| {
                let full = format!("{prefix}{n}");
                if of_module.contains(&&full) {
                    Ok(full)
                } else {
                    Err(anyhow::anyhow!("{module} has no test {n}"))
                }
            })
            .collect::<anyhow::Result<_>>()?
    };
    Ok(std::iter::once("--exact".to_string())
        .chain(chosen)
        .collect())
}

/// Runs the modules of the built `binary` the host runs, in order, each on its own, with
/// `env` set and the test package as the working directory (as `cargo test` runs tests).
/// Stops at the first module that fails.
pub fn run_on_host(
    built: &Built,
    binary: &Binary,
    env: &[(&str, &std::ffi::OsStr)],
) -> anyhow::Result<()> {
    let exe = built.executable(binary.name)?;
    let listed = list(exe)?;
    for module in host_modules(binary) {
        let args = selection(&listed, module, &[])?;
        eprintln!("--- {} ({} tests)", module, args.len() - 1);
        let started = Instant::now();
        let mut cmd = Command::new(exe);
        cmd.args(&args)
            .current_dir(workspace::root().join("tests"))
            .stdin(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        workspace::run(&mut cmd, &format!("the {module} tests"))?;
        eprintln!(
            "--- {module}: passed in {:.0} s",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed() -> Vec<String> {
        [
            "probes::exec_probes_and_hooks_run_in_the_container",
            "probes::http_tcp_and_sleep_reach_the_pod_ip",
            "grpc_probes::a_deaf_port_fails",
            "timeline::five_pods_at_once",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn a_module_is_its_own_tests_not_those_of_a_module_whose_name_ends_like_it() {
        let args = selection(&listed(), "probes", &[]).unwrap();
        assert_eq!(
            args,
            [
                "--exact",
                "probes::exec_probes_and_hooks_run_in_the_container",
                "probes::http_tcp_and_sleep_reach_the_pod_ip"
            ]
        );
    }

    #[test]
    fn named_tests_are_chosen_exactly_and_an_unknown_name_is_an_error() {
        let args = selection(
            &listed(),
            "probes",
            &["http_tcp_and_sleep_reach_the_pod_ip"],
        )
        .unwrap();
        assert_eq!(
            args,
            ["--exact", "probes::http_tcp_and_sleep_reach_the_pod_ip"]
        );
        let err = selection(&listed(), "probes", &["no_such_test"]).unwrap_err();
        assert_eq!(err.to_string(), "probes has no test no_such_test");
    }

    #[test]
    fn a_module_without_tests_is_an_error_not_an_empty_pass() {
        let err = selection(&listed(), "sidecars", &[]).unwrap_err();
        assert!(err.to_string().contains("no module sidecars"), "{err}");
    }

    #[test]
    fn every_module_is_in_one_binary() {
        let mut all: Vec<&str> = BINARIES
            .iter()
            .flat_map(|b| b.modules.iter().copied())
            .collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "a module is in two binaries");
        assert_eq!(
            binary_of("kernel_events").map(|b| b.name),
            Some("shared_lab")
        );
        assert_eq!(
            binary_of("fault_containerd").map(|b| b.name),
            Some("destructive")
        );
    }

    #[test]
    fn the_host_runs_every_module_but_the_modern_nodes_own() {
        let host: Vec<&str> = BINARIES.iter().flat_map(|b| host_modules(b)).collect();
        let all: usize = BINARIES.iter().map(|b| b.modules.len()).sum();
        assert_eq!(host.len(), all - 1);
        assert!(!host.contains(&"modern_node"));
    }

    /// A module added to a binary but not here would never run.
    #[test]
    fn the_modules_are_those_each_binarys_main_declares() {
        let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests");
        for b in BINARIES {
            let main = tests.join(b.name).join("main.rs");
            let text = std::fs::read_to_string(&main).unwrap();
            let mut declared: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
                .collect();
            declared.sort_unstable();
            let mut here = b.modules.to_vec();
            here.sort_unstable();
            assert_eq!(declared, here, "{}", main.display());
        }
    }
}
