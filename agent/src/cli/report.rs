//! `podlapse report`: stage latency statistics and each pod's startup breakdown from
//! recorded traces, as a table, JSON, markdown, a Perfetto trace (native protobuf, or
//! Chrome JSON trace events), and optionally an SVG picture.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use super::output::ReportFormat;
use crate::report::{self, TraceInput};

#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// Traces written by `podlapse run --trace` or `podlapse observe`; their pods are
    /// pooled. The files of one rotated trace are read as one recording.
    #[arg(value_name = "TRACE", required = true, num_args = 1..)]
    pub traces: Vec<PathBuf>,
    /// Output format. `perfetto` writes Perfetto's native protobuf trace (binary: redirect
    /// it to a `.pftrace` file and open it in ui.perfetto.dev); `chrome-json` writes
    /// Chrome JSON trace events, which Perfetto, chrome://tracing and speedscope read.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = ReportFormat::Table)]
    pub output: ReportFormat,
    /// Also draw a pod's waterfall (the slowest to Running, or --svg-pod's) above the
    /// stage latency distributions of every pod in the report, here.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// The pod whose waterfall --svg draws: a name, namespace/name, or UID. The
    /// distributions below it still cover every pod in the report.
    #[arg(long, value_name = "NAME", requires = "svg")]
    pub svg_pod: Option<String>,
    /// Only this pod: a name, namespace/name, or UID.
    #[arg(long, value_name = "NAME")]
    pub pod: Option<String>,
}

pub fn run(args: &ReportArgs) -> ExitCode {
    if args.output == ReportFormat::Perfetto && std::io::stdout().is_terminal() {
        eprintln!(
            "podlapse: -o perfetto writes a binary trace; redirect it to a file \
             (podlapse report -o perfetto TRACE > startup.pftrace)"
        );
        return ExitCode::from(2);
    }
    let mut inputs = Vec::new();
    // Every pod in the traces, to name when --pod matches none.
    let mut names = std::collections::BTreeSet::new();
    let recordings = match super::trace_file::read_recordings(&args.traces) {
        Ok(r) => r,
        Err(code) => return code,
    };
    for recording in recordings {
        let (trace, path) = (recording.trace, &recording.files[0]);
        let mut timeline = super::timeline::from_records(&trace.records);
        names.extend(
            timeline
                .pods
                .iter()
                .map(|p| format!("{}/{}", p.namespace, p.name)),
        );
        if let Some(pod) = &args.pod {
            timeline = timeline.only(pod);
        }
        inputs.push(TraceInput {
            name: path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            ),
            records: trace.records,
            timeline,
        });
    }
    if let Some(pod) = &args.pod
        && inputs.iter().all(|t| t.timeline.pods.is_empty())
    {
        eprintln!(
            "podlapse: {}",
            super::no_such_pod(pod, "in the traces", names)
        );
        return ExitCode::FAILURE;
    }
    if let Some(pod) = &args.svg_pod
        && !inputs
            .iter()
            .any(|t| t.timeline.pods.iter().any(|p| p.is(pod)))
    {
        eprintln!(
            "podlapse: --svg-pod: {}",
            super::no_such_pod(pod, "in the report", names)
        );
        return ExitCode::FAILURE;
    }
    if let Some(path) = &args.svg
        && let Err(e) = std::fs::write(path, report::svg(&inputs, args.svg_pod.as_deref()))
    {
        eprintln!("podlapse: --svg {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    let text = match args.output {
        ReportFormat::Perfetto => return write_stdout(&report::perfetto_trace(&inputs)),
        ReportFormat::ChromeJson => format!("{}\n", report::chrome_trace(&inputs)),
        ReportFormat::Json => format!(
            "{}\n",
            serde_json::to_string_pretty(&report::build(&inputs)).expect("a report serializes")
        ),
        ReportFormat::Markdown => report::markdown(&report::build(&inputs)),
        ReportFormat::Table => report::table(&report::build(&inputs)),
    };
    write_stdout(text.as_bytes())
}

fn write_stdout(bytes: &[u8]) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("podlapse: writing the report to stdout: {e}");
            ExitCode::FAILURE
        }
    }
}
