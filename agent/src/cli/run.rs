//! `podlapse run`: the agent. It creates the manifests' pods through kubelet's pipeline and
//! keeps them as the manifests say. With `--until-ready` it exits once every pod is
//! Running (or has failed), optionally removing them first (`--cleanup`); without it, it
//! watches the manifests and runs until SIGINT/SIGTERM, serving the local API. The work
//! is the `agent` module's; this parses the flags into its options and prints.

use std::process::ExitCode;
use std::time::Duration;

use super::outcome_lines::print_outcome;
use super::progress::Progress;
use super::{RunArgs, agent_failed};
use crate::agent::{
    Options, PodOutcome, ProbeRequest, ReadyOptions, ReadyRun, ReadyWatch, ServeOptions, Started,
    prepare,
};
use crate::config::ManifestError;

pub async fn run(args: RunArgs) -> ExitCode {
    let trace_rotation = match args.trace_rotation.rotation() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("podlapse: {e}");
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
    };
    let runtime_otlp = match super::runtime_otlp_listen(args.runtime_otlp_listen.as_deref()) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let cri = match args.cri.connect().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("podlapse: {e}");
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
    };
    let prepared = match prepare(options(&args, runtime_otlp, trace_rotation), cri).await {
        Ok(p) => p,
        Err(e) => return agent_failed(&e),
    };
    let mut started = match prepared.start().await {
        Ok(s) => s,
        Err(e) => return agent_failed(&e),
    };
    for note in started.take_notes() {
        eprintln!("podlapse: {note}");
    }
    let code = if args.until_ready {
        until_ready(&args, &started).await
    } else {
        let opts = ServeOptions {
            manifests: args.manifests.clone(),
            api_socket: args.api_socket.clone(),
            metrics_addr: args.metrics_addr.clone(),
        };
        let served = started
            .serve(&opts, |bound| {
                eprintln!("podlapse: metrics on http://{bound}/metrics");
            })
            .await;
        match served {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => agent_failed(&e),
        }
    };
    let finished = started.finish().await;
    for note in &finished.notes {
        eprintln!("podlapse: {note}");
    }
    for loss in &finished.failures {
        eprintln!("podlapse: {loss}");
    }
    if !finished.failures.is_empty() {
        return ExitCode::FAILURE;
    }
    code
}

/// The agent's options from the flags.
fn options(
    args: &RunArgs,
    runtime_otlp: Option<crate::otel::Listen>,
    trace_rotation: Option<crate::trace::Rotation>,
) -> Options {
    // Every output that shows stages (the trace, the export, /metrics, the API, the
    // summary) shows the kernel's: the probes run unless turned off.
    let want_kernel = !args.no_ebpf;
    Options {
        cfg: args.node.runtime_config(),
        settings: args.kubelet.settings(),
        cgroup_driver: args.kubelet.cgroup_driver,
        node_labels: args.kubelet.node_labels(),
        until_ready: args.until_ready,
        trace: args.trace.clone(),
        trace_rotation,
        otlp_endpoint: args.otlp_endpoint.clone(),
        runtime_otlp,
        deleted_pod_retention: args.deleted_pod_retention,
        runtime_span_wait: args.runtime_span_wait,
        probes: want_kernel.then(|| ProbeRequest {
            config: args.ebpf.probe_config(),
            require: args.ebpf.require_ebpf,
        }),
        cni_bin_dir: args.ebpf.cni_bin_dir.clone(),
    }
}

/// The one-shot run: a line per pod as it settles (under a progress bar), then the
/// summary.
async fn until_ready(args: &RunArgs, started: &Started) -> ExitCode {
    let opts = ReadyOptions {
        manifests: args.manifests.clone(),
        ready_timeout: Duration::from_secs(args.ready_timeout),
        hold: args.hold,
        cleanup: args.cleanup,
    };
    let mut lines = Lines {
        progress: None,
        json: args.json,
    };
    let run = started.until_ready(&opts, &mut lines).await;
    if let Some(p) = &lines.progress {
        p.finish();
    }
    match run {
        Ok(run) => summarize(args, started.node_name(), &run),
        Err(e) => agent_failed(&e),
    }
}

/// What the one-shot run prints as it goes.
struct Lines {
    progress: Option<Progress>,
    json: bool,
}

impl ReadyWatch for Lines {
    fn manifest_error(&mut self, error: &ManifestError) {
        eprintln!("podlapse: {error}");
    }

    fn pods(&mut self, count: usize) {
        self.progress = Some(Progress::new(count as u64, "pods"));
    }

    fn doing(&mut self, what: &str) {
        if let Some(p) = &self.progress {
            p.set_message(what.to_string());
        }
    }

    fn settled(&mut self, outcome: &PodOutcome) {
        match &self.progress {
            Some(p) => {
                if !self.json {
                    p.suspend(|| print_outcome(outcome));
                }
                p.inc();
            }
            None if !self.json => print_outcome(outcome),
            None => {}
        }
    }
}

/// Prints every pod's outcome (a line, or the JSON document) and the run's exit code:
/// success only when every pod ran, every manifest was valid and the cleanup finished.
fn summarize(args: &RunArgs, node: &str, run: &ReadyRun) -> ExitCode {
    if let Some((left, stall)) = run.cleanup_stalled {
        eprintln!(
            "podlapse: cleanup: {left} pods still terminating, with no progress for {stall:?}"
        );
    }
    let cleanup_failed = run.cleanup_stalled.is_some();
    let outcomes = &run.outcomes;
    let errors = &run.manifest_errors;
    let running = outcomes.iter().filter(|o| o.all_running()).count();
    if args.json {
        let doc = serde_json::json!({
            "node": node,
            "pods": outcomes,
            "manifest_errors": errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            "cleaned_up": args.cleanup && !cleanup_failed,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("serializable")
        );
    } else {
        println!(
            "{running}/{} pods Running with every container running{}{}",
            outcomes.len(),
            if errors.is_empty() {
                String::new()
            } else {
                format!(", {} manifest errors", errors.len())
            },
            match (args.cleanup, cleanup_failed) {
                (false, _) => "",
                (true, false) => ", cleaned up",
                (true, true) => ", cleanup FAILED",
            },
        );
    }
    if running == outcomes.len() && errors.is_empty() && !cleanup_failed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
