//! `podlapse diagnose`: why each pod has no IP or is not Running, from a trace file or
//! the running agent. Exit code 0 when every pod is healthy, 1 when one is not, 2 on bad
//! input.

use std::process::ExitCode;

use crate::diagnose::{Diagnosis, diagnose, render};
use crate::syncloop::api;

#[derive(Debug, Clone, clap::Args)]
pub struct DiagnoseArgs {
    #[command(flatten)]
    pub source: super::trace_or_agent::TraceOrAgentArgs,
}

pub async fn run(args: &DiagnoseArgs) -> ExitCode {
    let args = &args.source;
    let diagnosis = match args.traces.is_empty() {
        false => match super::trace_file::read_one(&args.traces) {
            Ok(trace) => diagnose(&trace.records, None),
            Err(code) => return code,
        },
        true => {
            let doc = match api::get(&args.socket, "/diagnose").await {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("podlapse: {e}");
                    return ExitCode::from(super::EXIT_BAD_INPUT);
                }
            };
            match serde_json::from_value::<Diagnosis>(doc) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!(
                        "podlapse: agent API {}: not a diagnosis: {e}",
                        args.socket.display()
                    );
                    return ExitCode::from(super::EXIT_BAD_INPUT);
                }
            }
        }
    };
    let diagnosis = match &args.pod {
        Some(pod) => {
            let names: Vec<String> = diagnosis
                .pods
                .iter()
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .collect();
            let d = diagnosis.only(pod);
            if d.pods.is_empty() {
                eprintln!(
                    "podlapse: {}",
                    super::no_such_pod(pod, "to diagnose", names)
                );
                return ExitCode::from(super::EXIT_BAD_INPUT);
            }
            d
        }
        None => diagnosis,
    };
    if args.output == super::output::Output::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(&diagnosis).expect("a diagnosis serializes")
        );
    } else {
        print!("{}", render(&diagnosis));
    }
    if diagnosis.all_healthy() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
