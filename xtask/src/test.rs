//! `cargo xtask test`: every check CI runs. Format and lint, unit tests, then integration
//! tests against the real node lab, which this command starts and stops itself.

use anyhow::bail;
use xtask::lab::{self, LabPaths};

use crate::ui::Step;
use crate::{setup, workspace};

/// Integration tests that need no shared lab (some start and stop their own): they run
/// while the shared lab is down.
const SELF_MANAGED_LAB_TESTS: &[&str] = &[
    "lab_lifecycle",
    "cgroups",
    "replay",
    "timeline_cni_failure",
    "report",
    "diagnose_network",
];
/// Integration tests that use the lab this command starts.
const SHARED_LAB_TESTS: &[&str] = &[
    "cri_info",
    "run_pods",
    "pipeline",
    "agent",
    "probes",
    "grpc_probes",
    "sidecars",
    "resize",
    "kernel_events",
    "timeline",
    "diagnose_faults",
];

#[derive(Debug, clap::Args)]
pub struct TestArgs {
    /// Only format, lint and unit tests; no lab.
    #[arg(long)]
    pub unit_only: bool,
}

pub fn run(args: &TestArgs) -> anyhow::Result<()> {
    let total = if args.unit_only { 4 } else { 7 };
    let step = Step::start(1, total, "checking prerequisites");
    let report = setup::run(true, &|s| step.say(s));
    if !report.ok() {
        step.done("missing prerequisites");
        report.print();
        bail!("setup failed; see the table above");
    }
    step.done("ready");

    eprintln!("[2/{total}] cargo fmt --check");
    workspace::run(
        workspace::cargo().args(["fmt", "--all", "--", "--check"]),
        "cargo fmt --check",
    )?;
    eprintln!("[3/{total}] cargo clippy -D warnings");
    workspace::run(
        workspace::cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
        "cargo clippy",
    )?;
    eprintln!("[4/{total}] unit tests");
    workspace::run(
        workspace::cargo().args(["test", "--workspace", "--exclude", "podtrace-tests"]),
        "unit tests",
    )?;
    if args.unit_only {
        return Ok(());
    }

    let bin = workspace::build_podtrace(true)?;
    // The kernel_events tests load the probes from <target>/bpf, beside the binary.
    crate::build_ebpf::run()?;
    let paths = LabPaths::from_env();
    if paths.state_file().exists() {
        eprintln!("the node lab is up; taking it down so the tests start from a clean node");
        lab::down(&paths, &|s| eprintln!("lab: {s}"))?;
    }
    let integration = |tests: &[&str]| {
        let mut cmd = workspace::cargo();
        cmd.args(["test", "--package", "podtrace-tests"]);
        for t in tests {
            cmd.args(["--test", t]);
        }
        cmd.env("PODTRACE_BIN", &bin)
            .env("PODTRACE_LAB_DIR", &paths.root)
            .env("PODTRACE_EXAMPLES", workspace::root().join("examples"));
        workspace::run(&mut cmd, "integration tests")
    };

    eprintln!("[5/{total}] lab lifecycle tests (each starts and stops its own lab)");
    integration(SELF_MANAGED_LAB_TESTS)?;

    let step = Step::start(6, total, "starting the node lab");
    lab::up(&paths, &|s| step.say(s))?;
    step.done("up");
    eprintln!("[7/{total}] integration tests on the lab");
    let result = integration(SHARED_LAB_TESTS);
    // The lab comes down whether or not the tests passed.
    let down = lab::down(&paths, &|s| eprintln!("lab: {s}"));
    result?;
    down?;
    Ok(())
}
