//! `podlapse pods` and `podlapse events`: what the running agent sees, like
//! `kubectl get pods` and `kubectl get events`.

use std::path::PathBuf;
use std::process::ExitCode;

use super::output::Output;
use super::pod_printer::{api_pod, pod_list, pod_row};
use crate::clock::wall_now;
use crate::syncloop::api;

#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// The agent's API socket.
    #[arg(long = "api-socket", default_value = api::DEFAULT_API_SOCKET, value_name = "PATH")]
    pub socket: PathBuf,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

pub async fn pods(args: &ApiArgs) -> ExitCode {
    let doc = match api::get(&args.socket, "/pods").await {
        Ok(d) => d,
        Err(e) => {
            eprintln!("podlapse: {e}");
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
    };
    let records = doc["pods"].as_array().cloned().unwrap_or_default();
    let pods: Vec<_> = records.iter().map(api_pod).collect();
    // The node's network first: with it broken, every pod below waits on it.
    let node: Vec<crate::diagnose::NodeFinding> =
        serde_json::from_value(doc["node"].clone()).unwrap_or_default();
    for f in &node {
        let line = format!("node: {}: {}", f.cause, f.summary);
        match args.output {
            Output::Json => eprintln!("podlapse: {line}"),
            _ => println!("{line}"),
        }
    }
    if args.output == Output::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(&pod_list(&pods)).unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    println!(
        "{:<40} {:<6} {:<26} {:<9} {:<6} IP",
        "NAME", "READY", "STATUS", "RESTARTS", "AGE"
    );
    for (record, pod) in records.iter().zip(&pods) {
        let row = pod_row(pod);
        let age = (wall_now() - record["first_seen"].as_i64().unwrap_or(0)) / 1_000_000_000;
        println!(
            "{:<40} {:<6} {:<26} {:<9} {:<6} {}",
            format!(
                "{}/{}",
                pod.metadata.namespace.as_deref().unwrap_or(""),
                pod.metadata.name.as_deref().unwrap_or("")
            ),
            format!("{}/{}", row.ready, row.total),
            row.status,
            row.restarts,
            human_age(age),
            pod.status
                .as_ref()
                .and_then(|s| s.pod_ip.as_deref())
                .unwrap_or("<none>"),
        );
    }
    ExitCode::SUCCESS
}

#[derive(Debug, Clone, clap::Args)]
pub struct EventsArgs {
    #[command(flatten)]
    pub api: ApiArgs,
    /// Only this pod's events.
    #[arg(long, value_name = "NAME")]
    pub pod: Option<String>,
}

pub async fn events(args: &EventsArgs) -> ExitCode {
    let doc = match api::get(&args.api.socket, "/events").await {
        Ok(d) => d,
        Err(e) => {
            eprintln!("podlapse: {e}");
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
    };
    let events: Vec<&serde_json::Value> = doc["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| args.pod.as_deref().is_none_or(|p| e["pod"] == p))
        .collect();
    if let Some(pod) = &args.pod
        && events.is_empty()
    {
        // Not an error (a pod may have no events yet), but a name that matches nothing
        // is most often a manifest's name where the pod's is wanted.
        let mut named: Vec<&str> = doc["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["pod"].as_str())
            .collect();
        named.sort_unstable();
        named.dedup();
        eprintln!(
            "podlapse: no events of pod {pod:?}; pods with events: {} (a static pod is named <name>-<node name>)",
            if named.is_empty() {
                "none".to_string()
            } else {
                named.join(", ")
            }
        );
    }
    if args.api.output == Output::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(&events).unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    println!(
        "{:<6} {:<8} {:<24} {:<32} MESSAGE",
        "AGE", "TYPE", "REASON", "OBJECT"
    );
    for e in events {
        let age = (wall_now() - e["at"].as_i64().unwrap_or(0)) / 1_000_000_000;
        let object = match e["container"].as_str() {
            Some(c) => format!("pod/{} ({c})", e["pod"].as_str().unwrap_or("")),
            None => format!("pod/{}", e["pod"].as_str().unwrap_or("")),
        };
        println!(
            "{:<6} {:<8} {:<24} {:<32} {}",
            human_age(age),
            e["kind"].as_str().unwrap_or(""),
            e["reason"].as_str().unwrap_or(""),
            object,
            e["message"].as_str().unwrap_or("")
        );
    }
    ExitCode::SUCCESS
}

fn human_age(secs: i64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
    }
}
