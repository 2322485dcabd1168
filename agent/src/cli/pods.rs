//! `podtrace pods` and `podtrace events`: what the running agent sees, like
//! `kubectl get pods` and `kubectl get events`.

use std::path::PathBuf;
use std::process::ExitCode;

use k8s_openapi::api::core::v1::PodStatus;

use crate::syncloop::api;
use crate::syncloop::clock::wall_now;

#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// The agent's API socket.
    #[arg(long = "api-socket", default_value = api::DEFAULT_API_SOCKET, value_name = "PATH")]
    pub socket: PathBuf,
    /// Output format.
    #[arg(short = 'o', long = "output", default_value = "table", value_parser = ["table", "json"])]
    pub output: String,
}

pub async fn pods(args: &ApiArgs) -> ExitCode {
    let doc = match api::get(&args.socket, "/pods").await {
        Ok(d) => d,
        Err(e) => {
            eprintln!("podtrace: {e}");
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
    };
    if args.output == "json" {
        println!(
            "{}",
            serde_json::to_string_pretty(&doc["pods"]).unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    println!(
        "{:<40} {:<6} {:<26} {:<9} {:<6} IP",
        "NAME", "READY", "STATUS", "RESTARTS", "AGE"
    );
    for p in doc["pods"].as_array().into_iter().flatten() {
        let status: PodStatus = serde_json::from_value(p["status"].clone()).unwrap_or_default();
        let containers = status.container_statuses.as_deref().unwrap_or_default();
        let ready = containers.iter().filter(|c| c.ready).count();
        let restarts: i32 = containers.iter().map(|c| c.restart_count).sum();
        let age = (wall_now() - p["first_seen"].as_i64().unwrap_or(0)) / 1_000_000_000;
        println!(
            "{:<40} {:<6} {:<26} {:<9} {:<6} {}",
            format!(
                "{}/{}",
                p["namespace"].as_str().unwrap_or(""),
                p["name"].as_str().unwrap_or("")
            ),
            format!("{ready}/{}", containers.len()),
            display_status(&status),
            restarts,
            human_age(age),
            status.pod_ip.as_deref().unwrap_or("<none>"),
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
            eprintln!("podtrace: {e}");
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
    };
    let events: Vec<&serde_json::Value> = doc["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| args.pod.as_deref().is_none_or(|p| e["pod"] == p))
        .collect();
    if args.api.output == "json" {
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

/// kubectl's STATUS column: the pod's reason, else an init container's progress or
/// problem, else the most telling container reason, else the phase.
pub fn display_status(st: &PodStatus) -> String {
    if let Some(r) = st.reason.as_deref().filter(|r| !r.is_empty()) {
        return r.to_string();
    }
    let init = st.init_container_statuses.as_deref().unwrap_or_default();
    for (i, c) in init.iter().enumerate() {
        let state = c.state.as_ref();
        if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
            if t.exit_code == 0 {
                continue;
            }
            return match t.reason.as_deref() {
                Some(r) if !r.is_empty() => format!("Init:{r}"),
                _ => format!("Init:ExitCode:{}", t.exit_code),
            };
        }
        if let Some(r) = state
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.as_deref())
            .filter(|r| *r != "PodInitializing" && *r != "ContainerCreating")
        {
            return format!("Init:{r}");
        }
        return format!("Init:{i}/{}", init.len());
    }
    let mut reason = st.phase.clone().unwrap_or_else(|| "Unknown".into());
    for c in st
        .container_statuses
        .as_deref()
        .unwrap_or_default()
        .iter()
        .rev()
    {
        let state = c.state.as_ref();
        if let Some(r) = state
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.clone())
        {
            reason = r;
        } else if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
            reason = t
                .reason
                .clone()
                .unwrap_or_else(|| format!("ExitCode:{}", t.exit_code));
        }
    }
    reason
}

fn human_age(secs: i64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
    }
}
