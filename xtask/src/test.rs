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
    "perfetto_native",
    "diagnose_network",
];
/// Integration tests that use the lab this command starts.
const SHARED_LAB_TESTS: &[&str] = &[
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
    "diagnose_faults",
    "crash_safe_trace",
    "otel_export",
    // Kills and restarts the lab's containerd: last, in a binary of its own.
    "fault_containerd",
];

#[derive(Debug, clap::Args)]
pub struct TestArgs {
    /// Only format, lint and unit tests; no lab.
    #[arg(long)]
    pub unit_only: bool,
    /// Skip the modern-node suite in the QEMU guest (for quick local runs; CI runs it).
    #[arg(long)]
    pub host_only: bool,
}

pub fn run(args: &TestArgs) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let total = if args.unit_only {
        4
    } else if args.host_only {
        7
    } else {
        8
    };
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
    // The probes are their own workspace (built for the BPF target), so `--all` above
    // does not reach them.
    workspace::run(
        workspace::cargo()
            .args(["fmt", "--manifest-path"])
            .arg(workspace::root().join("agent-ebpf/probes/Cargo.toml"))
            .args(["--", "--check"]),
        "cargo fmt --check (the probes)",
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
    crate::licences::check()?;
    eprintln!("[4/{total}] unit tests");
    workspace::run(
        workspace::cargo().args(["test", "--workspace", "--exclude", workspace::TESTS_PACKAGE]),
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
        lab::down(&paths, &crate::ui::lab_says)?;
    }
    let integration = |tests: &[&str]| {
        let mut cmd = workspace::cargo();
        cmd.args(["test", "--package", workspace::TESTS_PACKAGE]);
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
    let host_started = std::time::Instant::now();
    let mut result = integration(SHARED_LAB_TESTS);
    let mut times = vec![
        ("before the host lab's suite", host_started - started),
        ("the host lab's suite", host_started.elapsed()),
    ];
    if result.is_ok() && !args.host_only {
        // The guest's registry is the host lab's, so it runs while the lab is up.
        eprintln!("[8/{total}] the modern-node suite, in the QEMU guest");
        let modern_started = std::time::Instant::now();
        result = crate::node_vm::suite::run_on_lab(
            &crate::node_vm::NodeVmPaths::from_env(),
            &paths,
            &[],
        );
        times.push(("the modern-node suite", modern_started.elapsed()));
    }
    // The lab comes down whether or not the tests passed.
    let down = lab::down(&paths, &crate::ui::lab_says);
    for (part, took) in &times {
        eprintln!("time: {part}: {:.0} s", took.as_secs_f64());
    }
    eprintln!("time: in all: {:.0} s", started.elapsed().as_secs_f64());
    result?;
    down?;
    Ok(())
}
