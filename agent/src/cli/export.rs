//! `podlapse export`: recorded traces' pod startups sent to an OpenTelemetry collector,
//! as the agent's live export sends them (the same spans, IDs and times).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::otel::{self, ExportQueue};

#[derive(Debug, Clone, clap::Args)]
pub struct ExportArgs {
    /// Traces written by `podlapse run --trace` or `podlapse observe`; the files of one
    /// rotated trace are read as one recording.
    #[arg(value_name = "TRACE", required = true, num_args = 1..)]
    pub traces: Vec<PathBuf>,
    /// The collector (http://HOST:4317 or https://...); else the standard
    /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// How long to wait for the collector to take every span.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

pub async fn run(args: &ExportArgs) -> ExitCode {
    let endpoint = match otel::endpoint(args.otlp_endpoint.as_deref()) {
        Ok(Some(e)) => e,
        Ok(None) => {
            eprintln!(
                "podlapse: export needs --otlp-endpoint URL (or OTEL_EXPORTER_OTLP_ENDPOINT)"
            );
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
        Err(e) => {
            eprintln!("podlapse: {e}");
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
    };
    // Every trace is read before anything is sent: a bad file sends nothing.
    let traces: Vec<_> = match super::trace_file::read_recordings(&args.traces) {
        Ok(r) => r
            .into_iter()
            .map(|r| (r.files[0].clone(), r.trace))
            .collect(),
        Err(code) => return code,
    };
    let mut batches = Vec::new();
    for (path, trace) in &traces {
        let timeline = super::timeline::from_records(&trace.records);
        let spans = otel::trace_spans(&trace.header, &trace.records, &timeline);
        let runtime = otel::runtime_batches(&trace.header, &trace.records, &timeline);
        let forwarded: usize = runtime.iter().map(|(_, _, s)| s.len()).sum();
        if forwarded == 0 {
            eprintln!(
                "podlapse: {}: {} pods, {} spans",
                path.display(),
                timeline.pods.len(),
                spans.len()
            );
        } else {
            eprintln!(
                "podlapse: {}: {} pods, {} spans and {forwarded} of the runtime's",
                path.display(),
                timeline.pods.len(),
                spans.len()
            );
        }
        batches.push((spans, runtime));
    }
    let total: usize = batches
        .iter()
        .map(|(s, r)| s.len() + r.iter().map(|(_, _, s)| s.len()).sum::<usize>())
        .sum();
    let node = traces
        .first()
        .map(|(_, t)| t.header.node.clone())
        .unwrap_or_default();
    let exporter = match otel::exporter(&endpoint, &node) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("podlapse: {e}");
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
    };
    let queue = ExportQueue::start(
        exporter,
        endpoint.clone(),
        otel::ExportStats::default(),
        otel::resource(&node),
    );
    for (spans, runtime) in batches {
        queue.send(spans);
        for (key, resource, spans) in runtime {
            queue.send_foreign(key, resource, spans);
        }
    }
    let stats = queue.close(args.timeout).await;
    if stats.exported() as usize == total {
        eprintln!("podlapse: sent {total} spans to {endpoint}");
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "podlapse: {} of {total} spans reached {endpoint} ({} dropped)",
            stats.exported(),
            stats.dropped()
        );
        ExitCode::FAILURE
    }
}
