//! `podtrace run`: the agent. It creates the manifests' pods through kubelet's pipeline and
//! keeps them as the manifests say. With `--until-ready` it exits once every pod is
//! Running (or has failed), optionally removing them first (`--cleanup`); without it, it
//! watches the manifests and runs until SIGINT/SIGTERM, serving the local API.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;

use super::kernel_events::EbpfArgs;
use super::progress::Progress;
use super::recorder::RunRecorder;
use super::run_outcome::{PodOutcome, by_name, outcome_of, print_outcome, settled};
use super::{EXIT_BAD_INPUT, RunArgs};
use crate::cm::CgroupName;
use crate::config::load_paths;
use crate::config::source::{self, PodUpdate};
use crate::cri::NodeShape;
use crate::cri::Recording;
use crate::kubelet::node_admission::NodeFacts;
use crate::kubelet::observed_exit::with_observed_exit;
use crate::kubelet::observed_start::with_observed_start;
use crate::kuberuntime::labels;
use crate::queues;
use crate::syncloop::{Kubelet, StatusStore};
use crate::trace::{RunConfig, TraceConfig};

pub async fn run(args: RunArgs) -> ExitCode {
    // A malformed collector endpoint is said before anything starts.
    let otlp = match crate::otel::endpoint(args.otlp_endpoint.as_deref()) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("podtrace: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let runtime_otlp = match super::runtime_otlp_listen(args.runtime_otlp_listen.as_deref()) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let mut cfg = args.node.runtime_config();
    let mut settings = args.kubelet.settings();
    // A one-shot run does not own the node: removing pods it did not start would break
    // other users of the runtime. Housekeeping belongs to the long-running agent.
    settings.housekeeping &= !args.until_ready;
    let cri = match args.cri.connect().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("podtrace: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    // The node's shape from the runtime: its cgroup driver and CNI directory.
    let need_driver = settings.cgroup_root.is_some();
    let shape = match NodeShape::detect(&cri, args.kubelet.cgroup_driver, need_driver).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("podtrace: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    cfg.user_namespace_handlers = Some(shape.user_namespace_handlers.clone());
    cfg.allocatable = Some(settings.allocatable.clone());
    settings.node = Some(NodeFacts {
        apparmor: apparmor_enabled(),
        supplemental_groups_policy: shape.supplemental_groups_policy,
        ..NodeFacts::new(
            &cfg.node_name,
            std::env::consts::ARCH,
            &args.kubelet.node_labels(),
        )
    });
    if let Some((driver, source)) = shape.cgroup_driver {
        tracing::info!(%driver, %source, "cgroup driver");
        settings.cgroup_driver = driver;
    }
    let ebpf_args = match with_cni_bin_dir(&args.ebpf, &shape) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let node = cfg.node_name.clone();
    let mut config = run_config(&args, &settings);
    // The node's IP, so a diagnosis of a host-network pod can name it.
    config.node_ip = Some(cfg.node_ip.clone());
    // Kernel events have a reader when a trace is written or the agent serves its API;
    // --require-ebpf asks for them regardless, so a node without them fails loudly.
    let want_kernel =
        !args.no_ebpf && (args.trace.is_some() || !args.until_ready || args.ebpf.require_ebpf);
    // The kernel filter watches the pod cgroups under the root as the driver names it
    // (`/podtrace` with cgroupfs, `/podtrace.slice` with systemd).
    let watched_root = settings
        .cgroup_root
        .as_deref()
        .map(|r| CgroupName::from_cgroupfs(r).to_driver(settings.cgroup_driver));
    let mut recorder = match RunRecorder::start(
        args.trace.as_deref(),
        want_kernel,
        &ebpf_args,
        watched_root.as_deref(),
        &cri,
        &node,
        TraceConfig::Run(Box::new(config)),
    )
    .await
    {
        Ok(r) => r,
        Err(code) => return code,
    };
    recorder.set_deleted_pod_retention(args.deleted_pod_retention);
    if let Some(endpoint) = &otlp
        && let Err(e) = recorder.start_otlp(endpoint, &node)
    {
        eprintln!("podtrace: {e}");
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    if let Some(listen) = runtime_otlp
        && let Err(e) = recorder.start_runtime_receiver(listen).await
    {
        eprintln!("podtrace: {e}");
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    let cri = Recording::new(cri, Arc::new(recorder.sink()));
    let mut kubelet = match Kubelet::new(cri, cfg, settings) {
        Ok(k) => k,
        Err(e) => {
            eprintln!(
                "podtrace: pod cgroups: {e} (use --cgroup-root \"\" to leave cgroups to the runtime)"
            );
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    kubelet.set_metrics(recorder.metrics());
    let store = kubelet.store();
    recorder.tap_events(&store);
    // Show a start as soon as the kernel execs the container's program; the sync after
    // StartContainer publishes the runtime's own account.
    let starts = store.clone();
    recorder.observe_starts(Arc::new(move |s| {
        starts.update_status(&s.pod_uid, |current| {
            with_observed_start(current, &s.container_name, &s.container_id, s.attempt)
        });
    }));
    // Likewise its exit, from the kernel's exit event (the pidfd watch reports it too;
    // whichever comes first shows it).
    let exits = store.clone();
    recorder.observe_exits(Arc::new(move |e| {
        exits.update_status(&e.pod_uid, |current| {
            with_observed_exit(current, &e.container_id, e.exit_code)
        });
    }));
    let (tx, rx) = kubelet.pod_update_channel();
    let tx = Forward {
        tx,
        recorder: &recorder,
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let agent = tokio::spawn(kubelet.run(rx, stop_rx));
    let code = if args.until_ready {
        until_ready(&args, &node, &store, &tx).await
    } else {
        serve_with_api(&args, &node, &store, &recorder, &tx).await
    };
    let _ = stop_tx.send(true);
    let _ = agent.await;
    let finished = recorder.finish().await;
    if finished != ExitCode::SUCCESS {
        return finished;
    }
    code
}

/// The probes' arguments with the CNI plugin directory filled in from the runtime's
/// status info unless `--cni-bin-dir` named one; a directory that does not exist is
/// refused, saying where it came from and what the runtime says.
fn with_cni_bin_dir(ebpf: &EbpfArgs, shape: &NodeShape) -> Result<EbpfArgs, ExitCode> {
    let mut ebpf_args = ebpf.clone();
    let cni_source = if ebpf_args.cni_bin_dir.is_some() {
        "--cni-bin-dir"
    } else {
        ebpf_args.cni_bin_dir = shape.cni_bin_dirs.first().cloned();
        "the runtime's status info"
    };
    if let Some(dir) = ebpf_args.cni_bin_dir.as_deref()
        && !std::path::Path::new(dir).is_dir()
    {
        let said = if shape.cni_bin_dirs.is_empty() {
            "says no CNI directory".to_string()
        } else {
            format!("says {}", shape.cni_bin_dirs.join(", "))
        };
        eprintln!(
            "podtrace: the CNI plugin directory {dir} (from {cni_source}) does not exist; the runtime {said}"
        );
        return Err(ExitCode::from(EXIT_BAD_INPUT));
    }
    Ok(ebpf_args)
}

/// The long-running agent: its API served and its heap trimmed while it follows the
/// manifests until stopped.
async fn serve_with_api(
    args: &RunArgs,
    node: &str,
    store: &Arc<StatusStore>,
    recorder: &RunRecorder,
    tx: &Forward<'_>,
) -> ExitCode {
    let api = crate::syncloop::api::ApiState::new(store.clone(), recorder.collector());
    match crate::syncloop::api::serve(&args.api_socket, api) {
        Ok(server) => {
            let trimmer = tokio::spawn(super::malloc::trim_every(super::malloc::TRIM_PERIOD));
            let code = serve(args, node, tx).await;
            trimmer.abort();
            server.abort();
            let _ = server.await;
            code
        }
        Err(e) => {
            eprintln!("podtrace: {e}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}

/// Hands config updates to the agent, recording them on the way.
struct Forward<'a> {
    tx: queues::Sender<PodUpdate>,
    recorder: &'a RunRecorder,
}

impl Forward<'_> {
    /// Records the update and hands it to the sync loop, waiting for room in its queue.
    async fn send(&self, update: PodUpdate) -> Result<(), queues::Stopped> {
        self.recorder.pod_update(&update);
        self.tx.send(update).await
    }
}

/// The settings a trace header records.
fn run_config(args: &RunArgs, s: &crate::syncloop::KubeletSettings) -> RunConfig {
    RunConfig {
        allocatable: s.allocatable.clone(),
        backoff_initial_ns: s.backoff_initial.as_nanos() as u64,
        backoff_max_ns: s.backoff_max.as_nanos() as u64,
        cgroup_root: s.cgroup_root.clone(),
        error_backoff_ns: s.error_backoff.as_nanos() as u64,
        housekeeping: s.housekeeping,
        max_parallel_image_pulls: s.max_parallel_image_pulls,
        node: s.node.clone(),
        node_ip: None,
        relist_period_ns: s.relist_period.as_nanos() as u64,
        resync_interval_ns: s.resync_interval.as_nanos() as u64,
        until_ready: args.until_ready,
    }
}

/// Agent mode: follow the manifests until a signal.
async fn serve(args: &RunArgs, node: &str, tx: &Forward<'_>) -> ExitCode {
    let mut updates = match source::watch(args.manifests.clone(), node.to_string()) {
        Ok(rx) => rx,
        Err(e) => {
            eprintln!("podtrace: watching {:?}: {e}", args.manifests);
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let mut sigterm = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("podtrace: cannot handle SIGTERM: {e}");
            return ExitCode::FAILURE;
        }
    };
    let metrics_server = match start_metrics(args, tx.recorder).await {
        Ok(server) => server,
        Err(code) => return code,
    };
    // Loss counters live in the kernel; fold them into the metrics now and then.
    let mut refresh = tokio::time::interval(METRICS_REFRESH);
    let code = loop {
        tokio::select! {
            u = updates.recv() => match u {
                // While the sync loop's queue is full this waits, still answering signals.
                Some(u) => tokio::select! {
                    _ = tx.send(u) => {}
                    _ = tokio::signal::ctrl_c() => break ExitCode::SUCCESS,
                    _ = sigterm.recv() => break ExitCode::SUCCESS,
                },
                None => break ExitCode::FAILURE,
            },
            _ = refresh.tick() => tx.recorder.refresh_metrics(),
            _ = tokio::signal::ctrl_c() => break ExitCode::SUCCESS,
            _ = sigterm.recv() => break ExitCode::SUCCESS,
        }
    };
    if let Some(server) = metrics_server {
        server.abort();
    }
    code
}

/// How often the probes' loss counters reach the metrics.
const METRICS_REFRESH: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves `/metrics` on `--metrics-addr` unless it is `off`.
async fn start_metrics(
    args: &RunArgs,
    recorder: &RunRecorder,
) -> Result<Option<tokio::task::JoinHandle<()>>, ExitCode> {
    if args.metrics_addr == "off" {
        return Ok(None);
    }
    let addr: std::net::SocketAddr = args.metrics_addr.parse().map_err(|e| {
        eprintln!("podtrace: --metrics-addr {:?}: {e}", args.metrics_addr);
        ExitCode::from(EXIT_BAD_INPUT)
    })?;
    let (metrics, collector) = (recorder.metrics(), recorder.collector());
    let before = {
        let (metrics, netns) = (metrics.clone(), recorder.netns_refresher());
        Arc::new(move || {
            metrics.observe_collector(&collector);
            netns();
        })
    };
    match crate::metrics::serve(addr, metrics, before).await {
        Ok((bound, task)) => {
            eprintln!("podtrace: metrics on http://{bound}/metrics");
            Ok(Some(task))
        }
        Err(e) => {
            eprintln!("podtrace: {e}");
            Err(ExitCode::from(EXIT_BAD_INPUT))
        }
    }
}

async fn until_ready(
    args: &RunArgs,
    node: &str,
    store: &Arc<StatusStore>,
    tx: &Forward<'_>,
) -> ExitCode {
    let (pods, errors) = load_paths(&args.manifests, node);
    for e in &errors {
        eprintln!("podtrace: {e}");
    }
    if pods.is_empty() {
        eprintln!("podtrace: no valid pods in {:?}", args.manifests);
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    let pods: Vec<Pod> = pods.into_iter().map(|p| p.pod).collect();
    let uids: BTreeSet<String> = pods
        .iter()
        .map(|p| labels::pod_uid(p).to_string())
        .collect();
    let mut changes = store.subscribe();
    let _ = tx.send(PodUpdate::Add(pods.clone())).await;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.ready_timeout);
    let mut done: BTreeMap<String, PodOutcome> = BTreeMap::new();
    let progress = Progress::new(uids.len() as u64, "pods");
    progress.set_message("creating");
    loop {
        // Looked at in place after every change: with hundreds of pods starting, copying
        // each pod's record every time cost the node more CPU than the pods' own syncs.
        let mut settled_now: Vec<(String, PodOutcome)> = Vec::new();
        store.for_each(|rec| {
            if uids.contains(&rec.uid)
                && !done.contains_key(&rec.uid)
                && let Some(outcome) = settled(rec)
            {
                settled_now.push((rec.uid.clone(), outcome));
            }
        });
        settled_now.sort_by(|(_, a), (_, b)| by_name(a, b));
        for (uid, outcome) in settled_now {
            if !args.json {
                progress.suspend(|| print_outcome(&outcome));
            }
            progress.inc();
            done.insert(uid, outcome);
        }
        if done.len() == uids.len() {
            break;
        }
        tokio::select! {
            _ = changes.changed() => {}
            _ = tokio::time::sleep_until(deadline) => {
                let mut late: Vec<(String, PodOutcome)> = Vec::new();
                store.for_each(|rec| {
                    if uids.contains(&rec.uid) && !done.contains_key(&rec.uid) {
                        late.push((rec.uid.clone(), outcome_of(rec)));
                    }
                });
                late.sort_by(|(_, a), (_, b)| by_name(a, b));
                for (uid, mut o) in late {
                    o.reason.get_or_insert_with(|| "Timeout".into());
                    o.message.get_or_insert_with(|| format!("not Running after {}s", args.ready_timeout));
                    if !args.json {
                        print_outcome(&o);
                    }
                    done.insert(uid, o);
                }
                break;
            }
        }
    }

    if let Some(hold) = args.hold {
        progress.set_message(format!("holding for {hold:?}"));
        tokio::time::sleep(hold).await;
    }
    let mut cleanup_failed = false;
    if args.cleanup {
        progress.set_message("cleaning up");
        let _ = tx.send(PodUpdate::Remove(pods.clone())).await;
        cleanup_failed = !removed(store, &uids, &mut changes, &pods).await;
    }

    progress.finish();
    summarize(args, node, done, &errors, cleanup_failed)
}

/// Prints every pod's outcome (a line, or the JSON document) and the run's exit code:
/// success only when every pod ran, every manifest was valid and the cleanup finished.
fn summarize(
    args: &RunArgs,
    node: &str,
    done: BTreeMap<String, PodOutcome>,
    errors: &[crate::config::ManifestError],
    cleanup_failed: bool,
) -> ExitCode {
    let outcomes: Vec<PodOutcome> = {
        let mut v: Vec<PodOutcome> = done.into_values().collect();
        v.sort_by(by_name);
        v
    };
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

/// Waits until the store holds none of `uids` (the pods were removed); false when it gave
/// up on a runtime that made no progress.
async fn removed(
    store: &Arc<StatusStore>,
    uids: &BTreeSet<String>,
    changes: &mut tokio::sync::watch::Receiver<u64>,
    pods: &[Pod],
) -> bool {
    let grace = pods
        .iter()
        .filter_map(|p| p.spec.as_ref()?.termination_grace_period_seconds)
        .max()
        .unwrap_or(30);
    // The runtime tears pods down at its own pace (a CNI DEL each, serialized on the
    // node's iptables lock), which on a loaded or emulated node is many times a quiet
    // one's, and a status may not change for the whole of a slow StopPodSandbox. So
    // the wait goes on while the pods make progress, and gives up only once nothing
    // about them changed for the grace period and two minutes more: a hung runtime's
    // bound, not a guess of its speed.
    let stall = Duration::from_secs(grace as u64 + 120);
    let mut limit = tokio::time::Instant::now() + stall;
    loop {
        let mut left = 0;
        store.for_each(|r| left += usize::from(uids.contains(&r.uid)));
        if left == 0 {
            return true;
        }
        tokio::select! {
            _ = changes.changed() => limit = tokio::time::Instant::now() + stall,
            _ = tokio::time::sleep_until(limit) => {
                eprintln!(
                    "podtrace: cleanup: {left} pods still terminating, with no progress for {stall:?}"
                );
                return false;
            }
        }
    }
}

/// The host's kernel enforces AppArmor, as kubelet's `apparmor.IsEnabled` (runc's) asks:
/// its securityfs directory is there and the module says it is enabled.
fn apparmor_enabled() -> bool {
    std::path::Path::new("/sys/kernel/security/apparmor").is_dir()
        && std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
            .is_ok_and(|v| v.trim() == "Y")
}
