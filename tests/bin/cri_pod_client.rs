//! A stand-alone CRI client that plays "a kubelet" for the tests of `podlapse observe`:
//! it creates and tears down pods with the CRI v1 calls kubelet makes, in kubelet's order,
//! using only the official protos (`k8s-cri`) and nothing from podlapse itself.
//!
//! `cri-pod-client --cri unix:///run/containerd.sock run --pods N --prefix NAME --image IMG`
//! prints one JSON line per pod once it is started (or failed), holds, then tears down.
//! `cri-pod-client --cri ... cleanup --prefix NAME` removes what an earlier run left.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use clap::{Args, Parser, Subcommand};
use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::*;
use serde_json::json;
use tokio::net::UnixStream;
use tokio::signal::unix::{SignalKind, signal};
use tonic::transport::{Channel, Uri};

#[path = "kubelet_tracing.rs"]
mod kubelet_tracing;
use kubelet_tracing::KubeletTracer;

/// kubelet's default runtime request timeout, and its separate one for pulls.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);
const PULL_TIMEOUT: Duration = Duration::from_secs(300);
const NAMESPACE: &str = "default";
const CONTAINER: &str = "app";
/// kubelet's label keys (pkg/kubelet/types/labels.go).
const POD_NAME: &str = "io.kubernetes.pod.name";
const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
const POD_UID: &str = "io.kubernetes.pod.uid";

#[derive(Parser)]
#[command(about = "Creates and removes pods over CRI v1 the way kubelet does")]
struct Cli {
    /// The runtime's CRI endpoint: unix:///path/to/socket (or a bare path).
    #[arg(long)]
    cri: String,
    /// kubelet's --cgroup-root: BestEffort pod cgroups are <root>/besteffort/pod<uid>.
    #[arg(long, global = true, default_value = "/kubepods")]
    cgroup_root: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create N pods concurrently, hold them, then tear them down.
    Run(RunArgs),
    /// Stop and remove every sandbox whose pod name starts with the prefix.
    Cleanup {
        #[arg(long)]
        prefix: String,
    },
}

#[derive(Args)]
struct RunArgs {
    #[arg(long)]
    pods: usize,
    #[arg(long)]
    prefix: String,
    #[arg(long)]
    image: String,
    #[arg(long, default_value_t = 0)]
    hold_seconds: u64,
    /// Also append the per-pod JSON lines to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Retry a failed RunPodSandbox every MS milliseconds (kubelet's pod worker resync).
    #[arg(long, value_name = "MS")]
    retry_sandbox_every: Option<u64>,
    #[arg(long, default_value_t = 60)]
    retry_for_seconds: u64,
    /// Send each pod's calls with a sampled trace context of its own, as kubelet does with
    /// tracing on (one trace per pod).
    #[arg(long)]
    trace_calls: bool,
    /// Export the spans a kubelet with tracing on exports to this OTLP/gRPC endpoint
    /// (http://HOST:PORT): a `syncPod` per sync, each CRI call a client span under it,
    /// each call's `traceparent` naming its span (`kubelet_tracing.rs`).
    #[arg(long, value_name = "URL", conflicts_with = "trace_calls")]
    kubelet_spans: Option<String>,
}

#[derive(Clone)]
struct Cri {
    rt: RuntimeServiceClient<Channel>,
    img: ImageServiceClient<Channel>,
    driver: CgroupDriver,
    cgroup_root: String,
    /// The W3C `traceparent` every call carries (`run --trace-calls`): kubelet with its
    /// tracing on sends its span's context, sampled, so the runtime traces the call.
    traceparent: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    /// The kubelet's spans of the pod (`run --kubelet-spans`).
    kubelet: Option<KubeletTracer>,
}

/// One CRI call with kubelet's deadline (sent as `grpc-timeout`, enforced by tonic's
/// channel): `call!(cri.rt.run_pod_sandbox(request), "pod x")`; the error names the CRI
/// method (`RunPodSandbox`) and what the call was for.
macro_rules! call {
    ($cri:ident . $svc:ident . $method:ident ($msg:expr), $what:expr $(, $timeout:expr)?) => {{
        let mut request = tonic::Request::new($msg);
        request.set_timeout(CALL_TIMEOUT);
        if let Some(tp) = &$cri.traceparent {
            request.metadata_mut().insert("traceparent", tp.clone());
        }
        // As the kubelet's otelgrpc handler: the call's own client span, named by the
        // call's traceparent.
        let traced = match &$cri.kubelet {
            Some(k) => k.call_context()?,
            None => None,
        };
        if let Some((_, tp)) = &traced {
            request.metadata_mut().insert("traceparent", tp.parse()?);
        }
        $(request.set_timeout($timeout);)?
        let started_ns = kubelet_tracing::now_ns();
        let result = $cri.$svc.$method(request).await;
        if let (Some(k), Some((id, _))) = (&$cri.kubelet, traced) {
            let service = match stringify!($svc) {
                "rt" => "runtime.v1.RuntimeService",
                _ => "runtime.v1.ImageService",
            };
            let (code, message) = match &result {
                Ok(_) => (tonic::Code::Ok, String::new()),
                Err(s) => (s.code(), s.message().to_string()),
            };
            k.called(id, service, &camel(stringify!($method)), started_ns, code, &message);
        }
        result.map(tonic::Response::into_inner).map_err(|s| {
            let rpc = camel(stringify!($method));
            anyhow!("{rpc} for {}: {:?}: {}", $what, s.code(), s.message())
        })
    }};
}

/// `run_pod_sandbox` → `RunPodSandbox`: the CRI method a generated client method calls.
fn camel(method: &str) -> String {
    let word = |w: &str| w[..1].to_uppercase() + &w[1..];
    method.split('_').map(word).collect()
}

/// Dials the unix socket (the URI is unused), checks for CRI v1 with `Version` and learns
/// the cgroup driver, as kubelet does when it connects to the runtime.
async fn connect(endpoint: &str, cgroup_root: &str) -> anyhow::Result<Cri> {
    let path = PathBuf::from(endpoint.strip_prefix("unix://").unwrap_or(endpoint));
    if !path.is_absolute() {
        bail!("--cri {endpoint}: expected unix:///absolute/path");
    }
    let dial = path.clone();
    let channel = tonic::transport::Endpoint::from_static("http://cri.local")
        .connect_timeout(Duration::from_secs(10))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let dial = dial.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(dial).await?)) }
        }))
        .await
        .with_context(|| format!("connecting to {}", path.display()))?;
    let mut cri = Cri {
        rt: RuntimeServiceClient::new(channel.clone()),
        img: ImageServiceClient::new(channel),
        driver: CgroupDriver::Cgroupfs,
        cgroup_root: cgroup_root.into(),
        traceparent: None,
        kubelet: None,
    };
    let version = VersionRequest {
        version: "v1".into(),
    };
    let short = Duration::from_secs(10);
    let v = call!(cri.rt.version(version), path.display(), short)?;
    let (name, ver, api) = (v.runtime_name, v.runtime_version, v.runtime_api_version);
    // kubelet's cgroup driver detection: the RuntimeConfig RPC; where the runtime does not
    // implement it (containerd 1.7), kubelet uses its own --cgroup-driver, which the
    // operator sets to the runtime's: read here from the runtime's verbose status, as an
    // operator would from its config.
    let mut request = tonic::Request::new(RuntimeConfigRequest {});
    request.set_timeout(CALL_TIMEOUT);
    let runtime_config = cri.rt.runtime_config(request).await;
    cri.driver = match runtime_config.map(tonic::Response::into_inner) {
        Ok(RuntimeConfigResponse { linux: Some(l) }) => l.cgroup_driver(),
        Ok(_) => CgroupDriver::Cgroupfs,
        Err(s) if s.code() == tonic::Code::Unimplemented => {
            let status = StatusRequest { verbose: true };
            let info = call!(cri.rt.status(status), path.display(), short)?.info;
            configured_driver(&info)
        }
        Err(s) => bail!("RuntimeConfig: {:?}: {}", s.code(), s.message()),
    };
    eprintln!(
        "cri-pod-client: {name} {ver} (CRI {api}), cgroup driver {:?}",
        cri.driver
    );
    Ok(cri)
}

impl Cri {
    /// kubelet's pod cgroup for a BestEffort pod (GetPodContainerName): root/besteffort/
    /// pod<uid> in the driver's form; for systemd, kubelet's ToSystemd: the expanded slice
    /// path, '-' in a component escaped to '_' (containerd keeps only the last slice).
    fn pod_cgroup(&self, uid: &str) -> String {
        let root = self.cgroup_root.split('/').filter(|p| !p.is_empty());
        let mut parts: Vec<String> = root.map(String::from).collect();
        parts.extend(["besteffort".to_string(), format!("pod{uid}")]);
        match self.driver {
            CgroupDriver::Cgroupfs => format!("/{}", parts.join("/")),
            CgroupDriver::Systemd => {
                let escaped: Vec<String> = parts.iter().map(|p| p.replace('-', "_")).collect();
                let slice = |end| format!("/{}.slice", escaped[..end].join("-"));
                (1..=escaped.len()).map(slice).collect()
            }
        }
    }

    /// The sandboxes of a pod UID, found by kubelet's label as kubelet finds them.
    async fn sandboxes_of(&mut self, uid: &str) -> anyhow::Result<Vec<PodSandbox>> {
        let label_selector = HashMap::from([(POD_UID.into(), uid.into())]);
        let filter = PodSandboxFilter {
            label_selector,
            ..Default::default()
        };
        let list = ListPodSandboxRequest {
            filter: Some(filter),
        };
        Ok(call!(self.rt.list_pod_sandbox(list), format!("uid {uid}"))?.items)
    }

    /// kubelet's killPodWithSyncResult, then its garbage collector: stop the containers
    /// (grace 2s), stop the sandbox, remove the containers and the sandbox. Every step is
    /// tried; the errors are joined.
    async fn tear_down(
        &mut self,
        pod: &str,
        sandbox: &str,
        containers: &[String],
    ) -> anyhow::Result<()> {
        let what = format!("pod {pod}");
        let mut errors = Vec::new();
        for id in containers {
            let stop = StopContainerRequest {
                container_id: id.clone(),
                timeout: 2,
            };
            errors.extend(call!(self.rt.stop_container(stop), what).err());
        }
        let stop = StopPodSandboxRequest {
            pod_sandbox_id: sandbox.into(),
        };
        errors.extend(call!(self.rt.stop_pod_sandbox(stop), what).err());
        for id in containers {
            let remove = RemoveContainerRequest {
                container_id: id.clone(),
            };
            errors.extend(call!(self.rt.remove_container(remove), what).err());
        }
        let remove = RemovePodSandboxRequest {
            pod_sandbox_id: sandbox.into(),
        };
        errors.extend(call!(self.rt.remove_pod_sandbox(remove), what).err());
        match errors.into_iter().reduce(|a, b| anyhow!("{a:#}; {b:#}")) {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// kubelet's pod cleanup once no sandbox of the pod is left: the pod cgroup destroyed
    /// (cgroupfs: rmdir in every v1 hierarchy, or in the v2 tree; a systemd slice is left
    /// to systemd) and the pod's log directory removed.
    fn forget(&self, pod: &str, uid: &str) {
        if self.driver == CgroupDriver::Cgroupfs {
            let cgroup = self.pod_cgroup(uid);
            let rel = cgroup.trim_start_matches('/');
            let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup").join(rel));
            for hierarchy in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten() {
                let _ = hierarchy.map(|h| std::fs::remove_dir(h.path().join(rel)));
            }
        }
        let _ = std::fs::remove_dir_all(log_dir(pod, uid));
    }
}

/// kubelet's pod log directory (BuildPodLogsDirectory).
fn log_dir(pod: &str, uid: &str) -> String {
    format!("/var/log/pods/{NAMESPACE}_{pod}_{uid}")
}

/// One pod of the run, and how far its creation got.
#[derive(Default)]
struct Pod {
    name: String,
    uid: String,
    sandbox_id: Option<String>,
    container_id: Option<String>,
    error: Option<String>,
    /// From its first call to StartContainer's return: the pod's time to Running as
    /// this client sees it.
    run_ms: Option<f64>,
}

/// kubelet's generatePodSandboxConfig for a static BestEffort pod with default settings.
fn sandbox_config(pod: &Pod, attempt: u32, cgroup_parent: String) -> PodSandboxConfig {
    let ns = NamespaceOption {
        network: NamespaceMode::Pod as i32,
        pid: NamespaceMode::Container as i32,
        ipc: NamespaceMode::Pod as i32,
        ..Default::default()
    };
    let (name, uid, namespace) = (pod.name.clone(), pod.uid.clone(), NAMESPACE.into());
    let security_context = LinuxSandboxSecurityContext {
        namespace_options: Some(ns),
        ..Default::default()
    };
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name,
            uid,
            namespace,
            attempt,
        }),
        hostname: pod.name.clone(),
        log_directory: log_dir(&pod.name, &pod.uid),
        labels: pod_labels(pod),
        annotations: HashMap::from([
            ("kubernetes.io/config.source".into(), "file".into()),
            (
                "kubernetes.io/config.seen".into(),
                jiff::Timestamp::now().to_string(),
            ),
        ]),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent,
            security_context: Some(security_context),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// kubelet's newPodLabels (the pod has no labels of its own).
fn pod_labels(pod: &Pod) -> HashMap<String, String> {
    HashMap::from([
        (POD_NAME.into(), pod.name.clone()),
        (POD_NAMESPACE.into(), NAMESPACE.into()),
        (POD_UID.into(), pod.uid.clone()),
    ])
}

/// kubelet's PodSandboxChanged for a pod with no ready sandbox: the newest sandbox of the
/// UID gives attempt + 1, after kubelet's KillPod stops it; with none (containerd cleans a
/// failed RunPodSandbox up entirely), kubelet starts over at attempt 0.
async fn next_attempt(cri: &mut Cri, pod: &Pod) -> anyhow::Result<u32> {
    let sandboxes = cri.sandboxes_of(&pod.uid).await?;
    let Some(newest) = sandboxes.into_iter().max_by_key(|s| s.created_at) else {
        return Ok(0);
    };
    let stop = StopPodSandboxRequest {
        pod_sandbox_id: newest.id,
    };
    call!(cri.rt.stop_pod_sandbox(stop), format!("pod {}", pod.name))?;
    Ok(newest.metadata.map_or(0, |m| m.attempt + 1))
}

/// kubelet's SyncPod for a new pod with one container: sandbox, image, create, start.
async fn start_pod(cri: &mut Cri, args: &RunArgs, pod: &mut Pod) -> anyhow::Result<()> {
    let what = format!("pod {}", pod.name);
    // kubelet creates the pod's log directory, and the container's below it.
    let logs = log_dir(&pod.name, &pod.uid);
    std::fs::create_dir_all(format!("{logs}/{CONTAINER}"))
        .with_context(|| format!("creating {logs}"))?;

    // RunPodSandbox; on failure the pod worker syncs the pod again (if asked to retry).
    let started = Instant::now();
    let mut attempt = 0;
    let config = loop {
        if let Some(k) = cri.kubelet.as_mut() {
            k.begin_sync()?;
        }
        let config = sandbox_config(pod, attempt, cri.pod_cgroup(&pod.uid));
        let run = RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        };
        let error = match call!(cri.rt.run_pod_sandbox(run), what) {
            Ok(r) => {
                pod.sandbox_id = Some(r.pod_sandbox_id);
                break config;
            }
            Err(e) => e,
        };
        // The sync fails with the call's error, as kubelet's SyncPod returns it.
        if let Some(k) = &cri.kubelet {
            k.end_sync(Some(&format!("{error:#}"))).await?;
        }
        let Some(every) = args.retry_sandbox_every else {
            return Err(error);
        };
        let line = json!({"name": pod.name, "uid": pod.uid, "attempt": attempt, "error": format!("{error:#}")});
        eprintln!("{line}");
        if started.elapsed() >= Duration::from_secs(args.retry_for_seconds) {
            return Err(error.context(format!("retried for {}s", args.retry_for_seconds)));
        }
        tokio::time::sleep(Duration::from_millis(every)).await;
        attempt = next_attempt(cri, pod).await?;
    };

    // The image manager's EnsureImageExists with pull policy IfNotPresent.
    let image = ImageSpec {
        image: args.image.clone(),
        ..Default::default()
    };
    let status = ImageStatusRequest {
        image: Some(image.clone()),
        verbose: false,
    };
    if call!(cri.img.image_status(status), what)?.image.is_none() {
        let sandbox_config = Some(config.clone());
        let pull = PullImageRequest {
            image: Some(image.clone()),
            auth: None,
            sandbox_config,
        };
        call!(cri.img.pull_image(pull), what, PULL_TIMEOUT)?;
    }

    // startContainer: generateContainerConfig, CreateContainer, StartContainer.
    let mut labels = pod_labels(pod);
    labels.insert("io.kubernetes.container.name".into(), CONTAINER.into());
    let command = vec!["sleep".to_string(), "3600".to_string()];
    // kubelet's container hash is FNV-32a over the container spec, in hex.
    let spec = format!("{CONTAINER}\0{}\0{}", args.image, command.join(" "));
    let hash = spec.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    // kubelet sends the pod's namespace modes for each container too.
    let namespace_options = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref()?.namespace_options.clone());
    let container = ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: CONTAINER.into(),
            attempt: 0,
        }),
        image: Some(image),
        command,
        labels,
        annotations: HashMap::from([
            ("io.kubernetes.container.hash".into(), format!("{hash:x}")),
            ("io.kubernetes.container.restartCount".into(), "0".into()),
        ]),
        log_path: format!("{CONTAINER}/0.log"),
        linux: Some(LinuxContainerConfig {
            resources: Some(LinuxContainerResources::default()),
            security_context: Some(LinuxContainerSecurityContext {
                namespace_options,
                ..Default::default()
            }),
        }),
        ..Default::default()
    };
    let pod_sandbox_id = pod.sandbox_id.clone().unwrap_or_default();
    let create = CreateContainerRequest {
        pod_sandbox_id,
        config: Some(container),
        sandbox_config: Some(config),
    };
    let container_id = call!(cri.rt.create_container(create), what)?.container_id;
    pod.container_id = Some(container_id.clone());
    let start = StartContainerRequest { container_id };
    call!(cri.rt.start_container(start), what)?;
    if let Some(k) = &cri.kubelet {
        k.end_sync(None).await?;
    }
    Ok(())
}

/// The pod's JSON lines go to stdout and, if asked, to a file, one whole line at a time.
fn report(out: &Mutex<Option<std::fs::File>>, pod: &Pod) {
    let line = json!({
        "name": pod.name, "namespace": NAMESPACE, "uid": pod.uid,
        "sandbox_id": pod.sandbox_id, "container_id": pod.container_id,
        "ok": pod.error.is_none(), "error": pod.error, "run_ms": pod.run_ms,
    });
    let mut file = out.lock().unwrap();
    println!("{line}");
    if let Some(f) = file.as_mut() {
        let _ = writeln!(f, "{line}").and_then(|_| f.flush());
    }
}

/// A random (v4) UUID from the kernel.
fn random_uuid() -> anyhow::Result<String> {
    let uuid = std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .context("reading /proc/sys/kernel/random/uuid")?;
    Ok(uuid.trim().to_string())
}

/// A sampled W3C trace context with a random trace ID and parent span ID.
fn traceparent() -> anyhow::Result<tonic::metadata::MetadataValue<tonic::metadata::Ascii>> {
    let trace = random_uuid()?.replace('-', "");
    let span = &random_uuid()?.replace('-', "")[..16];
    format!("00-{trace}-{span}-01")
        .parse()
        .context("a traceparent header")
}

async fn run(cri: Cri, args: RunArgs) -> anyhow::Result<bool> {
    // Registered now, so a signal during creation ends the hold at once.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let open = |p: &PathBuf| std::fs::File::options().create(true).append(true).open(p);
    let out = args
        .out
        .as_ref()
        .map(|p| open(p).with_context(|| format!("opening {}", p.display())));
    let out = Arc::new(Mutex::new(out.transpose()?));
    let args = Arc::new(args);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..args.pods {
        let (mut cri, args, out) = (cri.clone(), args.clone(), out.clone());
        tasks.spawn(async move {
            let mut pod = Pod {
                name: format!("{}-{i}", args.prefix),
                ..Default::default()
            };
            // A new UID per pod, random (v4) as the API server's, from the kernel.
            let result = async {
                pod.uid = random_uuid().with_context(|| format!("a UID for pod {}", pod.name))?;
                if args.trace_calls {
                    cri.traceparent = Some(traceparent()?);
                }
                if let Some(url) = &args.kubelet_spans {
                    cri.kubelet = Some(KubeletTracer::new(url, &pod.uid, NAMESPACE, &pod.name)?);
                }
                let started = Instant::now();
                if let Err(e) = start_pod(&mut cri, &args, &mut pod).await {
                    if let Some(k) = &cri.kubelet {
                        k.end_sync(Some(&format!("{e:#}"))).await?;
                    }
                    return Err(e);
                }
                pod.run_ms = Some(started.elapsed().as_secs_f64() * 1e3);
                anyhow::Ok(())
            }
            .await;
            pod.error = result.err().map(|e| format!("{e:#}"));
            report(&out, &pod);
            pod
        });
    }
    let pods = tasks.join_all().await;
    let all_ok = pods.iter().all(|p| p.error.is_none());

    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(args.hold_seconds)) => {}
        _ = term.recv() => eprintln!("cri-pod-client: SIGTERM, tearing down"),
        _ = int.recv() => eprintln!("cri-pod-client: SIGINT, tearing down"),
    }

    let mut teardowns = tokio::task::JoinSet::new();
    for pod in pods.into_iter().filter(|p| !p.uid.is_empty()) {
        let mut cri = cri.clone();
        teardowns.spawn(async move {
            let (name, uid) = (&pod.name, &pod.uid);
            if let Some(sandbox) = &pod.sandbox_id {
                cri.tear_down(name, sandbox, pod.container_id.as_slice())
                    .await?;
            }
            // Sandboxes of earlier attempts the runtime kept, as kubelet's GC removes them.
            for stale in cri.sandboxes_of(uid).await? {
                cri.tear_down(name, &stale.id, &[]).await?;
            }
            cri.forget(name, uid);
            Ok::<_, anyhow::Error>(())
        });
    }
    for result in teardowns.join_all().await {
        if let Err(e) = result {
            eprintln!("cri-pod-client: teardown: {e:#}");
        }
    }
    Ok(all_ok)
}

/// Removes every sandbox (and its containers) whose kubelet pod-name label starts with
/// the prefix, as a run's teardown does.
async fn cleanup(mut cri: Cri, prefix: &str) -> anyhow::Result<bool> {
    let list = ListPodSandboxRequest { filter: None };
    let sandboxes = call!(cri.rt.list_pod_sandbox(list), "all pods")?.items;
    let mut ok = true;
    for s in sandboxes {
        let Some(name) = s.labels.get(POD_NAME).filter(|n| n.starts_with(prefix)) else {
            continue;
        };
        let uid = s.metadata.as_ref().map_or("", |m| &m.uid);
        let filter = ContainerFilter {
            pod_sandbox_id: s.id.clone(),
            ..Default::default()
        };
        let list = ListContainersRequest {
            filter: Some(filter),
        };
        let containers = call!(cri.rt.list_containers(list), format!("pod {name}"))?;
        let ids: Vec<String> = containers.containers.into_iter().map(|c| c.id).collect();
        match cri.tear_down(name, &s.id, &ids).await {
            Ok(()) => {
                let (id, n) = (&s.id, ids.len());
                eprintln!("cri-pod-client: removed {name} (sandbox {id}, {n} containers)");
                if cri.sandboxes_of(uid).await?.is_empty() {
                    cri.forget(name, uid);
                }
            }
            Err(e) => {
                ok = false;
                eprintln!("cri-pod-client: {e:#}");
            }
        }
    }
    Ok(ok)
}

/// Exit 0 when every pod started (run) or was removed (cleanup), 1 otherwise.
#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match connect(&cli.cri, &cli.cgroup_root).await {
        Err(e) => Err(e),
        Ok(cri) => match cli.cmd {
            Cmd::Run(args) => run(cri, args).await,
            Cmd::Cleanup { prefix } => cleanup(cri, &prefix).await,
        },
    };
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("cri-pod-client: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The cgroup driver containerd's CRI config (its verbose status `config`) gives its
/// default runc runtime: `SystemdCgroup`, cgroupfs when unset.
fn configured_driver(info: &HashMap<String, String>) -> CgroupDriver {
    let config: serde_json::Value = info
        .get("config")
        .and_then(|c| serde_json::from_str(c).ok())
        .unwrap_or_default();
    let containerd = &config["containerd"];
    let default = containerd["defaultRuntimeName"].as_str().unwrap_or("runc");
    match containerd["runtimes"][default]["options"]["SystemdCgroup"].as_bool() {
        Some(true) => CgroupDriver::Systemd,
        _ => CgroupDriver::Cgroupfs,
    }
}
