//! `cargo xtask test`: every check CI runs. Format and lint, unit tests, then integration
//! tests against the real node lab, which this command starts and stops itself.

use anyhow::bail;
use xtask::lab::{self, LabPaths};

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
    // Nothing above compiles the fuzzers: linted here, against the agent as it is now and
    // with their lock file as committed, they cannot drift from its API unseen. Checked
    // into this target directory, they reuse the dependencies checked above.
    workspace::run(
        workspace::cargo()
            .args(["clippy", "--locked", "--bins", "--manifest-path"])
            .arg(workspace::root().join("agent/fuzz/Cargo.toml"))
            .arg("--target-dir")
            .arg(workspace::target_dir())
            .args(["--", "-D", "warnings"]),
        "cargo clippy (the fuzzers)",
    )?;
    crate::licences::check()?;
    crate::alert_rules::check()?;
    eprintln!("[4/{total}] unit tests");
    // The libraries' and binaries' own tests, the integration tests' binaries left out.
    // Every cargo command of this run selects the whole workspace, so each crate is
    // compiled with one set of features and once (see workspace::build_bin).
    workspace::run(
        workspace::cargo().args(["test", "--workspace", "--lib", "--bins"]),
        "unit tests",
    )?;
    kernel_btf_matrix()?;
    if args.unit_only {
        return Ok(());
    }

    let bin = workspace::build_podlapse()?;
    // The kernel_events tests load the probes from <target>/bpf, beside the binary.
    crate::build_ebpf::run()?;
    let paths = LabPaths::from_env();
    if paths.holds_a_lab() {
        eprintln!(
            "a node lab is up or was left by a crash; taking it down so the tests start from \
             a clean node"
        );
        lab::down(&paths, &crate::ui::lab_says)?;
    }
    // Four binaries, built once; each module then runs on its own.
    let built = integration::build(&integration::BINARIES.map(|b| b.name))?;
    let examples = workspace::root().join("examples");
    let env = [
        ("PODLAPSE_BIN", bin.as_os_str()),
        ("PODLAPSE_LAB_DIR", paths.root.as_os_str()),
        ("PODLAPSE_EXAMPLES", examples.as_os_str()),
    ];

    eprintln!("[5/{total}] tests without the shared lab (some start and stop a lab of their own)");
    integration::run_on_host(&built, &integration::NO_LAB, &env)?;
    integration::run_on_host(&built, &integration::OWN_LAB, &env)?;

    let step = Step::start(6, total, "starting the node lab");
    lab::up(&paths, &|s| step.say(s))?;
    step.done("up");
    eprintln!("[7/{total}] integration tests on the lab");
    let host_started = std::time::Instant::now();
    let mut result = integration::run_on_host(&built, &integration::SHARED_LAB, &env)
        .and_then(|_| integration::run_on_host(&built, &integration::DESTRUCTIVE, &env));
    let mut times: Vec<(String, std::time::Duration)> = vec![
        ("before the host lab's suite".into(), host_started - started),
        ("the host lab's suite".into(), host_started.elapsed()),
    ];
    let mut kernel_lines = Vec::new();
    if result.is_ok() && !args.host_only {
        // The guest's registry is the host lab's, so it runs while the lab is up: the
        // full suite on the modern node's own kernel, then the kernel suite on each of
        // the others, every one of them run and reported whatever the one before did.
        eprintln!("[8/{total}] the modern-node suite, in the QEMU guest, on each kernel");
        let vm = crate::node_vm::NodeVmPaths::from_env();
        let reference = crate::node_vm::kernels::by_name(crate::node_vm::kernels::REFERENCE)?;
        let others = crate::node_vm::kernels::KERNELS
            .iter()
            .filter(|k| !k.is_reference());
        for kernel in std::iter::once(reference).chain(others) {
            let began = std::time::Instant::now();
            let ran = crate::node_vm::suite::run_on_lab(&vm, &paths, &[], kernel);
            let took = began.elapsed();
            let what = if kernel.is_reference() {
                "the modern-node suite"
            } else {
                "the kernel suite"
            };
            times.push((format!("the guest on kernel {}", kernel.name), took));
            kernel_lines.push(match &ran {
                Ok(()) => format!(
                    "kernel {kernel}: {what} passed in {:.0} s",
                    took.as_secs_f64()
                ),
                Err(e) => format!(
                    "kernel {kernel}: {what} FAILED after {:.0} s: {}",
                    took.as_secs_f64(),
                    first_line(&format!("{e:#}"))
                ),
            });
            if result.is_ok() {
                result = ran.map_err(|e| e.context(format!("on kernel {kernel}")));
            }
        }
    }
    // The lab comes down whether or not the tests passed.
    let down = lab::down(&paths, &crate::ui::lab_says);
    for line in &kernel_lines {
        eprintln!("{line}");
    }
    for (part, took) in &times {
        eprintln!("time: {part}: {:.0} s", took.as_secs_f64());
    }
    eprintln!("time: in all: {:.0} s", started.elapsed().as_secs_f64());
    result?;
    down?;
    Ok(())
}

/// An error's first line, for a summary line of its own.
fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or(text)
}

/// The agent's BTF reader against the BTF of every kernel the modern node boots, taken
/// from their cached packages: a kernel whose BTF it cannot read fails here, before any
/// guest boots. A kernel the registry no longer serves is named, and fails the step after
/// the others are read.
fn kernel_btf_matrix() -> anyhow::Result<()> {
    use crate::node_vm::{kernel_btf, kernels};
    let mut files = Vec::new();
    let mut missing = Vec::new();
    for k in kernels::KERNELS {
        match kernel_btf::vmlinux_btf(k, &|s| eprintln!("kernel {}: {s}", k.name)) {
            Ok(path) => files.push(format!("{}={}", k.name, path.display())),
            Err(e) => missing.push(format!("kernel {k}: {e:#}")),
        }
    }
    if !files.is_empty() {
        workspace::run(
            workspace::cargo()
                .args(["test", "--workspace", "--lib", "--"])
                .args([
                    "ebpf::btf::tests::the_btf_of_every_kernel_of_the_matrix_resolves_every_offset",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                ])
                .env("PODLAPSE_KERNEL_BTF", files.join(",")),
            "the BTF reader on each kernel of the matrix",
        )?;
    }
    if !missing.is_empty() {
        bail!(
            "the BTF of these kernels was not read:\n{}",
            missing.join("\n")
        );
    }
    Ok(())
}
