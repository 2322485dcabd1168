//! `podtrace run`: create the manifests' pods over CRI, report each as it reaches Running,
//! optionally clean them up.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tokio::task::JoinSet;

use super::{EXIT_BAD_INPUT, RunArgs};
use crate::config::{StaticPod, load_paths};
use crate::cri::CriClient;
use crate::kubelet::status::{WaitingReasons, generate_api_pod_status, phase};
use crate::kuberuntime::{
    EventLog, RuntimeConfig, get_pod_status, kill, labels, sync_pod, volumes,
};

/// How often a pod that is waiting on the runtime is looked at again. Bounded polling is
/// the fallback until pod lifecycle events drive the workers.
const RECHECK: Duration = Duration::from_millis(50);

/// Where one pod ended up.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PodOutcome {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub phase: String,
    pub ip: Option<String>,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub seconds: f64,
    pub events: Vec<crate::kuberuntime::PodEvent>,
}

impl PodOutcome {
    fn running(&self) -> bool {
        self.phase == phase::RUNNING
    }
}

pub async fn run(args: RunArgs) -> ExitCode {
    let cfg = args.node.runtime_config();
    let (mut pods, errors) = load_paths(&args.manifests, &cfg.node_name);
    for e in &errors {
        eprintln!("podtrace: {e}");
    }
    if pods.is_empty() {
        eprintln!("podtrace: no valid pods in {:?}", args.manifests);
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    // HandlePodAdditions: oldest first; static pods without a timestamp keep file order.
    pods.sort_by(|a, b| {
        let t = |p: &StaticPod| p.pod.metadata.creation_timestamp.clone().map(|t| t.0);
        t(a).cmp(&t(b))
    });
    let cri = match args.cri.connect().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("podtrace: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    if !args.until_ready {
        eprintln!("podtrace: run currently needs --until-ready (it exits once pods are Running)");
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    let cfg = Arc::new(cfg);
    let deadline = Duration::from_secs(args.ready_timeout);
    let mut workers = JoinSet::new();
    for p in &pods {
        let (cri, cfg, pod) = (cri.clone(), cfg.clone(), p.pod.clone());
        workers.spawn(async move { pod_until_ready(&cri, &cfg, &pod, deadline).await });
    }
    let mut outcomes = Vec::new();
    while let Some(done) = workers.join_next().await {
        let outcome = done.expect("pod task panicked");
        if !args.json {
            print_outcome(&outcome);
        }
        outcomes.push(outcome);
    }
    outcomes.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));

    let mut cleanup_failed = false;
    if args.cleanup {
        for p in &pods {
            if let Err(e) = cleanup(&cri, &cfg, &p.pod).await {
                eprintln!("podtrace: cleanup of {}: {e}", labels::pod_name(&p.pod));
                cleanup_failed = true;
            }
        }
    }
    let running = outcomes.iter().filter(|o| o.running()).count();
    if args.json {
        let doc = serde_json::json!({
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
            "{running}/{} pods Running{}{}",
            outcomes.len(),
            if errors.is_empty() {
                String::new()
            } else {
                format!(", {} manifest errors", errors.len())
            },
            if args.cleanup {
                if cleanup_failed {
                    ", cleanup FAILED"
                } else {
                    ", cleaned up"
                }
            } else {
                ""
            },
        );
    }
    if running == outcomes.len() && errors.is_empty() && !cleanup_failed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn print_outcome(o: &PodOutcome) {
    let who = format!("{}/{}", o.namespace, o.name);
    match (&o.reason, o.running()) {
        (_, true) => println!(
            "{who:<32} {:<9} {:<15} {:>7.3}s",
            o.phase,
            o.ip.as_deref().unwrap_or("-"),
            o.seconds
        ),
        (reason, false) => println!(
            "{who:<32} {:<9} {:<15} {:>7.3}s  {}: {}",
            o.phase,
            o.ip.as_deref().unwrap_or("-"),
            o.seconds,
            reason.as_deref().unwrap_or("Unknown"),
            o.message.as_deref().unwrap_or(""),
        ),
    }
}

/// Syncs one pod until it is Running, has ended, or a sync step failed.
async fn pod_until_ready(
    cri: &CriClient,
    cfg: &RuntimeConfig,
    pod: &Pod,
    deadline: Duration,
) -> PodOutcome {
    let started = Instant::now();
    let events = EventLog::default();
    let mut outcome = PodOutcome {
        namespace: labels::pod_namespace(pod).to_string(),
        name: labels::pod_name(pod).to_string(),
        uid: labels::pod_uid(pod).to_string(),
        phase: phase::PENDING.to_string(),
        ip: None,
        reason: None,
        message: None,
        seconds: 0.0,
        events: Vec::new(),
    };
    let waiting = WaitingReasons::new();
    loop {
        let status =
            match get_pod_status(cri, &outcome.uid, &outcome.name, &outcome.namespace).await {
                Ok(s) => s,
                Err(e) => {
                    outcome.reason = Some("RuntimeError".into());
                    outcome.message = Some(e.to_string());
                    break;
                }
            };
        let api = generate_api_pod_status(pod, &status, &waiting);
        outcome.phase = api.phase.clone().unwrap_or_default();
        outcome.ip = api.pod_ip.clone();
        if outcome.phase != phase::PENDING {
            break;
        }
        let result = sync_pod(cri, cfg, pod, &status, &events).await;
        if let Some(e) = result.error {
            outcome.reason = Some(e.reason.to_string());
            outcome.message = Some(e.message);
            break;
        }
        if result.actions.is_noop() {
            if started.elapsed() > deadline {
                outcome.reason = Some("Timeout".into());
                outcome.message = Some(format!("not Running after {deadline:?}"));
                break;
            }
            tokio::time::sleep(RECHECK).await;
        }
    }
    outcome.seconds = started.elapsed().as_secs_f64();
    outcome.events = events.take();
    outcome
}

/// Stops and removes the pod's runtime objects, then its directories.
async fn cleanup(cri: &CriClient, cfg: &RuntimeConfig, pod: &Pod) -> anyhow::Result<()> {
    let (uid, name, ns) = (
        labels::pod_uid(pod),
        labels::pod_name(pod),
        labels::pod_namespace(pod),
    );
    let status = get_pod_status(cri, uid, name, ns).await?;
    let grace = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    kill::kill_pod(cri, &status, grace).await?;
    kill::remove_pod(cri, &status).await?;
    volumes::remove_pod_dir(uid, cfg)?;
    let log_dir = cfg.pod_log_dir(ns, name, uid);
    match std::fs::remove_dir_all(&log_dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}
