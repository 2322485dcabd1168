//! `podlapse bench-direct` (hidden): the runtime's own limit for `cargo xtask bench`. For
//! each pod it makes the calls podlapse's pipeline makes for a pod whose image is present
//! (RunPodSandbox, PodSandboxStatus, CreateContainer, StartContainer), with the same
//! requests (the pod's cgroup as the sandbox's parent included) and nothing in between,
//! and prints each pod's time to Running as JSON.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::Semaphore;

use super::{CriArgs, EXIT_BAD_INPUT, node};
use crate::cm::{CgroupLayout, PodContainerManager};
use crate::config::load_paths;
use crate::cri::{CriClient, RuntimeService, api};
use crate::kuberuntime::container::{PodRuntimeFacts, generate_container_config};
use crate::kuberuntime::sandbox::{create_pod_sandbox, generate_pod_sandbox_config};
use crate::kuberuntime::security_context::ImageUser;
use crate::kuberuntime::{RuntimeConfig, labels};

#[derive(Debug, Clone, clap::Args)]
pub struct BenchDirectArgs {
    /// Pod manifests (files or directories), as for `podlapse run`.
    #[arg(long, required = true, num_args = 1.., value_name = "PATH")]
    pub manifests: Vec<PathBuf>,
    /// Pods in flight at once (0: all of them).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub concurrency: usize,
    /// Stop and remove the sandboxes afterwards, and the pod cgroups runc made (not
    /// timed).
    #[arg(long)]
    pub cleanup: bool,
    /// The pod cgroups' root, as `podlapse run --cgroup-root`: each sandbox's
    /// `cgroup_parent` is its pod's cgroup there, the same request the pipeline sends.
    /// The driver does not create it (that is the pipeline's work, not the runtime's):
    /// runc makes the missing directories. "" leaves the parent to the runtime.
    #[arg(long, default_value = "/podlapse", value_name = "PATH")]
    pub cgroup_root: String,
    #[command(flatten)]
    pub node: node::NodeArgs,
    #[command(flatten)]
    pub cri: CriArgs,
}

#[derive(serde::Serialize)]
struct PodTime {
    name: String,
    seconds: f64,
    error: Option<String>,
}

/// Creates the pod's sandbox and starts its containers. The sandbox ID comes back with
/// any error after it was created, so cleanup removes it too.
async fn create(
    cri: &CriClient,
    pod: &Pod,
    cfg: &RuntimeConfig,
    pcm: Option<&PodContainerManager>,
) -> Result<String, (Option<String>, String)> {
    let mut sandbox = None;
    match create_in(cri, pod, cfg, pcm, &mut sandbox).await {
        Ok(()) => Ok(sandbox.unwrap_or_default()),
        Err(e) => Err((sandbox, e)),
    }
}

async fn create_in(
    cri: &CriClient,
    pod: &Pod,
    cfg: &RuntimeConfig,
    pcm: Option<&PodContainerManager>,
    sandbox: &mut Option<String>,
) -> Result<(), String> {
    let mut sandbox_config = generate_pod_sandbox_config(pod, 0, cfg);
    if let (Some(pcm), Some(linux)) = (pcm, sandbox_config.linux.as_mut()) {
        linux.cgroup_parent = pcm.pod_cgroup_name(pod).map_err(|e| e.to_string())?;
    }
    let sandbox_id = create_pod_sandbox(cri, Box::new(sandbox_config.clone()), "", true)
        .await
        .map_err(|e| e.to_string())?;
    *sandbox = Some(sandbox_id.clone());
    let status = cri
        .pod_sandbox_status(&sandbox_id)
        .await
        .map_err(|e| e.to_string())?;
    let network = status.status.and_then(|s| s.network).unwrap_or_default();
    let facts = PodRuntimeFacts {
        pod_ip: network.ip.clone(),
        pod_ips: std::iter::once(network.ip)
            .chain(network.additional_ips.into_iter().map(|i| i.ip))
            .filter(|ip| !ip.is_empty())
            .collect(),
    };
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.clone())
        .unwrap_or_default();
    for c in &containers {
        let image = c.image.clone().unwrap_or_default();
        // The bench images name no user: kubelet's ImageStatus would say root.
        let config = generate_container_config(pod, c, &image, &ImageUser::root(), 0, &facts, cfg)
            .map_err(|e| e.to_string())?;
        // The pipeline makes the same directory before CreateContainer; the runtime needs it.
        let log_dir = std::path::Path::new(&sandbox_config.log_directory).join(&c.name);
        std::fs::create_dir_all(&log_dir).map_err(|e| e.to_string())?;
        let id = cri
            .create_container(api::CreateContainerRequest {
                pod_sandbox_id: sandbox_id.clone(),
                config: Some(config),
                sandbox_config: Some(sandbox_config.clone()),
            })
            .await
            .map_err(|e| e.to_string())?;
        cri.start_container(&id).await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

pub async fn run(args: &BenchDirectArgs) -> ExitCode {
    let cfg = args.node.runtime_config();
    let (pods, errors) = load_paths(&args.manifests, &cfg.node_name);
    for e in &errors {
        eprintln!("podlapse: {e}");
    }
    if pods.is_empty() || !errors.is_empty() {
        eprintln!("podlapse: no valid pods in {:?}", args.manifests);
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    let cri = match args.cri.connect().await {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprintln!("podlapse: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    // As the agent does at start, before any pod: the QoS tiers with their settings.
    let pcm = match (!args.cgroup_root.is_empty())
        .then(|| {
            let pcm = PodContainerManager::new(
                &args.cgroup_root,
                CgroupLayout::discover()?,
                crate::cm::CgroupDriver::Cgroupfs,
            )?;
            pcm.ensure_qos_cgroups()?;
            Ok::<_, crate::cm::CmError>(pcm)
        })
        .transpose()
    {
        Ok(pcm) => pcm.map(Arc::new),
        Err(e) => {
            eprintln!("podlapse: --cgroup-root {}: {e}", args.cgroup_root);
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let cfg = Arc::new(cfg);
    let limit = if args.concurrency == 0 {
        pods.len()
    } else {
        args.concurrency
    };
    let permits = Arc::new(Semaphore::new(limit));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for p in pods {
        let (cri, cfg, permits, pcm) = (cri.clone(), cfg.clone(), permits.clone(), pcm.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = permits.acquire_owned().await;
            let t = Instant::now();
            let result = create(&cri, &p.pod, &cfg, pcm.as_deref()).await;
            let seconds = t.elapsed().as_secs_f64();
            (
                labels::pod_name(&p.pod).to_string(),
                labels::pod_uid(&p.pod).to_string(),
                seconds,
                result,
            )
        }));
    }
    let mut times = Vec::new();
    let mut sandboxes = Vec::new();
    let mut uids = Vec::new();
    for task in tasks {
        let Ok((name, uid, seconds, result)) = task.await else {
            continue;
        };
        uids.push(uid);
        let error = match result {
            Ok(id) => {
                sandboxes.push(id);
                None
            }
            Err((id, e)) => {
                sandboxes.extend(id);
                Some(e)
            }
        };
        times.push(PodTime {
            name,
            seconds,
            error,
        });
    }
    let wall = started.elapsed().as_secs_f64();
    if args.cleanup {
        for id in &sandboxes {
            if let Err(e) = cri.stop_pod_sandbox(id).await {
                eprintln!("podlapse: stopping sandbox {id}: {e}");
            }
            if let Err(e) = cri.remove_pod_sandbox(id).await {
                eprintln!("podlapse: removing sandbox {id}: {e}");
            }
        }
        if let Some(pcm) = &pcm {
            for uid in &uids {
                if let Err(e) = pcm.destroy_pod_cgroup(uid) {
                    eprintln!("podlapse: removing the pod cgroup of {uid}: {e}");
                }
            }
        }
    }
    let failed = times.iter().any(|t| t.error.is_some());
    let doc = serde_json::json!({"wall_seconds": wall, "concurrency": limit, "pods": times});
    println!("{doc}");
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
