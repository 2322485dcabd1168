//! `cargo xtask`: podlapse's workflows.

mod alert_rules;
mod bench;
mod build_ebpf;
mod demo;
mod fuzz;
mod image;
mod integration;
mod licences;
mod node_vm;
mod record;
mod setup;
mod test;
mod ui;
mod workspace;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use xtask::lab::{self, LabPaths, UpOutcome};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "podlapse's workflows")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Check every prerequisite and install what is missing (root, Debian).
    Setup {
        /// Only check; install nothing.
        #[arg(long)]
        check: bool,
    },
    /// The node lab: containerd, CNI and a local registry with the test images.
    Lab {
        #[command(subcommand)]
        command: LabCmd,
    },
    /// Setup, build, lab up, run the example pods, show results, lab down.
    Demo,
    /// Format and lint checks, unit tests, and integration tests on the real lab.
    Test(test::TestArgs),
    /// Build the eBPF probes and copy the object to target/bpf/podlapse-probes.o.
    BuildEbpf,
    /// Build podlapse's OCI image (the release binary, offline) into target/image/oci.
    Image(image::ImageArgs),
    /// Record the CI fixtures in traces/ from traces/scenarios/ on the node lab.
    Record {
        /// Scenario names (default: all).
        names: Vec<String>,
    },
    /// Replay every fixture in traces/ through the reconciler and compare.
    Replay,
    /// Run the benchmarks and write BENCHMARKS.md and target/bench/samples.json.
    Bench(bench::BenchArgs),
    /// Benchmark 4's measurement on this machine's kernel alone, written as JSON: what
    /// `bench` runs in the modern node and renders on the host.
    #[command(hide = true)]
    BenchProbeOverhead(bench::ProbeOverheadArgs),
    /// Fuzz the manifest reader, the trace reader, the agent API and the eBPF decoder.
    Fuzz(fuzz::FuzzArgs),
    /// The modern node: Debian trixie in a QEMU guest (cgroup v2, systemd, containerd 2.x).
    NodeVm {
        #[command(subcommand)]
        command: node_vm::NodeVmCmd,
    },
}

#[derive(Subcommand)]
enum LabCmd {
    /// Start the lab (says so and changes nothing when it is already up).
    Up,
    /// Stop the lab and remove everything it made.
    Down,
    /// What runs, and where its sockets and logs are.
    Status,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Setup { check } => {
            let report = setup::run(!check, &|s| eprintln!("setup: {s}"));
            report.print();
            if report.ok() {
                Ok(())
            } else {
                Err(anyhow::anyhow!(
                    "some prerequisites are missing (see the table)"
                ))
            }
        }
        Cmd::Lab { command } => lab_command(command),
        Cmd::Demo => demo::run(),
        Cmd::Test(args) => test::run(&args),
        Cmd::NodeVm { command } => node_vm::run(command),
        Cmd::BuildEbpf => build_ebpf::run().map(|path| println!("{}", path.display())),
        Cmd::Image(args) => image::run(&args),
        Cmd::Record { names } => record::run(&names),
        Cmd::Replay => record::replay_all(),
        Cmd::Bench(args) => bench::run(&args),
        Cmd::BenchProbeOverhead(args) => bench::probe_overhead_alone(&args),
        Cmd::Fuzz(args) => fuzz::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn lab_command(cmd: LabCmd) -> anyhow::Result<()> {
    let paths = LabPaths::from_env();
    match cmd {
        LabCmd::Up => match lab::up(&paths, &ui::lab_says)? {
            UpOutcome::Started(_) => {
                println!("{}", lab::status(&paths)?);
            }
            UpOutcome::AlreadyUp(_) => {
                println!("the lab is already up; nothing changed");
                println!("{}", lab::status(&paths)?);
            }
        },
        LabCmd::Down => {
            let report = lab::down(&paths, &ui::lab_says)?;
            println!("{report}");
        }
        LabCmd::Status => println!("{}", lab::status(&paths)?),
    }
    Ok(())
}
