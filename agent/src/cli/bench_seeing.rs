//! `podlapse bench-seeing --trace FILE` (hidden; for `cargo xtask bench`): each container
//! state change in a trace, from the kernel event to the agent's status showing it.

use std::path::PathBuf;
use std::process::ExitCode;

use super::EXIT_BAD_INPUT;
use crate::timeline::seen_latencies;

#[derive(Debug, Clone, clap::Args)]
pub struct BenchSeeingArgs {
    /// A trace recorded by `podlapse run --trace` with the probes loaded.
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
}

pub fn run(args: &BenchSeeingArgs) -> ExitCode {
    let trace = match super::trace_file::read(&args.trace) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let ebpf = match &trace.footer {
        Some(f) => f.ebpf,
        None => trace
            .records
            .iter()
            .any(|r| matches!(r, crate::trace::TraceRecord::Kernel(_))),
    };
    if !ebpf {
        eprintln!(
            "podlapse: {}: recorded without the probes, so it has no kernel events to measure from",
            args.trace.display()
        );
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    let seeing = seen_latencies(&trace.records);
    let doc = serde_json::json!({
        "lost_events": trace.footer.as_ref().map(|f| f.lost_events),
        "samples": seeing.samples.iter().map(|s| serde_json::json!({
            "pod_uid": s.pod_uid,
            "container_id": s.container_id,
            "change": s.change,
            "kernel_ns": s.kernel_ns,
            "seen_ns": s.seen_ns,
            "latency_ns": s.latency_ns(),
            "runtime_done_ns": s.runtime_done_ns,
        })).collect::<Vec<_>>(),
        "unseen": seeing.unseen,
    });
    println!("{doc}");
    ExitCode::SUCCESS
}
