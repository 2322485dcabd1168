//! `cargo xtask test`: every check CI runs. Format, the builds the lab needs, the tests
//! that need no shared lab; then, with the node lab up (this command starts and stops
//! it), the modern-node suite in the QEMU guest beside the host's lints, unit tests and
//! lab suite.

use std::time::{Duration, Instant};

use anyhow::bail;
use xtask::lab::{self, LabPaths};

use crate::node_vm::NodeVmPaths;
use crate::node_vm::background::Background;
use crate::node_vm::suite::Suite;
use crate::ui::Step;
use crate::{integration, setup, workspace};

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
    let started = Instant::now();
    let total = if args.unit_only { 4 } else { 8 };
    let step = Step::start(1, total, "checking prerequisites");
    let report = setup::run(true, &|s| step.say(s));
    if !report.ok() {
        step.done("missing prerequisites");
        report.print();
        bail!("setup failed; see the table above");
    }
    step.done("ready");
    eprintln!("[2/{total}] cargo fmt --check");
    format_check()?;
    if args.unit_only {
        eprintln!("[3/{total}] cargo clippy -D warnings");
        lints()?;
        eprintln!("[4/{total}] unit tests");
        return unit_tests();
    }

    // Everything the lab's tests and the guest run is built first, so the guest's suite
    // can start as early as it can and build nothing of its own.
    eprintln!("[3/{total}] building podlapse, the probes and the integration tests");
    let bin = workspace::build_podlapse()?;
    // The kernel_events tests load the probes from <target>/bpf, beside the binary.
    crate::build_ebpf::run()?;
    let built = integration::build(&integration::BINARIES.map(|b| b.name))?;
    let suite = if args.host_only {
        None
    } else {
        Some(crate::node_vm::suite::prepare(&[])?)
    };
    let paths = LabPaths::from_env();
    if paths.holds_a_lab() {
        eprintln!(
            "a node lab is up or was left by a crash; taking it down so the tests start from \
             a clean node"
        );
        lab::down(&paths, &crate::ui::lab_says)?;
    }
    let examples = workspace::root().join("examples");
    let env = [
        ("PODLAPSE_BIN", bin.as_os_str()),
        ("PODLAPSE_EXAMPLES", examples.as_os_str()),
        ("PODLAPSE_LAB_DIR", paths.root.as_os_str()),
    ];
    eprintln!("[4/{total}] tests without the shared lab (some start and stop a lab of their own)");
    integration::run_on_host(&built, &integration::NO_LAB, &env)?;
    integration::run_on_host(&built, &integration::OWN_LAB, &env)?;

    let step = Step::start(5, total, "starting the node lab");
    lab::up(&paths, &|s| step.say(s))?;
    step.done("up");
    let mut times = vec![("before the node lab", started.elapsed())];
    let result = on_the_lab(total, suite.as_ref(), &built, &env, &mut times);
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

/// With the lab up: the modern-node suite in the guest, in the background (its registry
/// is the lab's), beside the host's lints, unit tests and lab suite, which fill the cores
/// the emulated guest leaves; then the suite's output as it finishes. A failure on the
/// host stops the guest's suite.
fn on_the_lab(
    total: usize,
    suite: Option<&Suite>,
    built: &integration::Built,
    env: &[(&str, &std::ffi::OsStr)],
    times: &mut Vec<(&'static str, Duration)>,
) -> anyhow::Result<()> {
    let guest = suite.map(Background::start).transpose()?;
    let host_started = Instant::now();
    let host = (|| {
        eprintln!("[6/{total}] cargo clippy -D warnings");
        lints()?;
        eprintln!("[7/{total}] unit tests");
        unit_tests()?;
        eprintln!("[8/{total}] integration tests on the lab");
        integration::run_on_host(built, &integration::SHARED_LAB, env)?;
        integration::run_on_host(built, &integration::DESTRUCTIVE, env)
    })();
    times.push(("the host's checks with the lab up", host_started.elapsed()));
    let Some(guest) = guest else {
        return host;
    };
    if let Err(e) = host {
        if let Err(stop) = guest.cancel(&NodeVmPaths::from_env()) {
            eprintln!("stopping the modern node: {stop:#}");
        }
        return Err(e);
    }
    eprintln!("the modern-node suite, in the QEMU guest: what it has said so far, then as it runs");
    let (took, passed) = guest.follow()?;
    times.push(("the modern-node suite, from its start", took));
    passed
}

fn format_check() -> anyhow::Result<()> {
    workspace::run(
        workspace::cargo().args(["fmt", "--all", "--", "--check"]),
        "cargo fmt --check",
    )?;
    // The probes (built for the BPF target) and the fuzzers (built with cargo-fuzz's
    // sanitizer flags) are workspaces of their own, so `--all` above reaches neither.
    for (manifest, what) in [
        (
            "agent-ebpf/probes/Cargo.toml",
            "cargo fmt --check (the probes)",
        ),
        ("agent/fuzz/Cargo.toml", "cargo fmt --check (the fuzzers)"),
    ] {
        workspace::run(
            workspace::cargo()
                .args(["fmt", "--manifest-path"])
                .arg(workspace::root().join(manifest))
                .args(["--", "--check"]),
            what,
        )?;
    }
    Ok(())
}

/// clippy over the workspace and the fuzzers, the licences and the alert rules; the
/// builds at low priority, as they may run beside the guest.
fn lints() -> anyhow::Result<()> {
    workspace::run(
        workspace::at_low_priority(&mut workspace::cargo()).args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
        "cargo clippy",
    )?;
    // Nothing above compiles the fuzzers: linted here, against the agent as it is now and
    // with their lock file as committed, they cannot drift from its API unseen. Checked
    // into this target directory, they reuse the dependencies checked above.
    workspace::run(
        workspace::at_low_priority(&mut workspace::cargo())
            .args(["clippy", "--locked", "--bins", "--manifest-path"])
            .arg(workspace::root().join("agent/fuzz/Cargo.toml"))
            .arg("--target-dir")
            .arg(workspace::target_dir())
            .args(["--", "-D", "warnings"]),
        "cargo clippy (the fuzzers)",
    )?;
    crate::licences::check()?;
    crate::alert_rules::check()
}

/// The workspace's unit tests: built at low priority, run at the usual one (a test may
/// have a time bound).
fn unit_tests() -> anyhow::Result<()> {
    let unit = ["test", "--workspace", "--exclude", workspace::TESTS_PACKAGE];
    workspace::run(
        workspace::at_low_priority(&mut workspace::cargo())
            .args(unit)
            .arg("--no-run"),
        "building the unit tests",
    )?;
    workspace::run(workspace::cargo().args(unit), "unit tests")
}
