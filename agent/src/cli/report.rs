//! `podtrace report`: stage latency statistics and each pod's startup breakdown from
//! recorded traces, as a table, JSON, markdown or a Perfetto (Chrome JSON) trace, and
//! optionally an SVG picture.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::report::{self, TraceInput};

#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// Traces written by `podtrace run --trace`; their pods are pooled.
    #[arg(value_name = "TRACE", required = true, num_args = 1..)]
    pub traces: Vec<PathBuf>,
    /// Output format. `perfetto` writes Chrome JSON trace events for ui.perfetto.dev.
    #[arg(short = 'o', long = "output", default_value = "table",
          value_parser = ["table", "json", "markdown", "perfetto"])]
    pub output: String,
    /// Also draw the first pod's waterfall and the stage latency distributions here.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Only this pod: a name, namespace/name, or UID.
    #[arg(long, value_name = "NAME")]
    pub pod: Option<String>,
}

pub fn run(args: &ReportArgs) -> ExitCode {
    let mut inputs = Vec::new();
    for path in &args.traces {
        let trace = match super::trace_file::read(path) {
            Ok(t) => t,
            Err(code) => return code,
        };
        let mut timeline = super::timeline::from_records(&trace.records);
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
        eprintln!("podtrace: no pod {pod:?} in the traces");
        return ExitCode::FAILURE;
    }
    if let Some(path) = &args.svg
        && let Err(e) = std::fs::write(path, report::svg(&inputs))
    {
        eprintln!("podtrace: --svg {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    let text = match args.output.as_str() {
        "perfetto" => format!("{}\n", report::chrome_trace(&inputs)),
        output => {
            let r = report::build(&inputs);
            match output {
                "json" => format!(
                    "{}\n",
                    serde_json::to_string_pretty(&r).expect("a report serializes")
                ),
                "markdown" => report::markdown(&r),
                _ => report::table(&r),
            }
        }
    };
    print!("{text}");
    ExitCode::SUCCESS
}
