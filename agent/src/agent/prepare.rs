//! The agent's first phase: everything learnt before anything starts. The collector's
//! address is checked, and the node's shape (cgroup driver, CNI directory, what its
//! runtime supports) comes from the runtime itself, so a wrong flag or a node unlike
//! the one expected is said before a pod or a probe is touched.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cm::{CgroupDriver, CgroupName};
use crate::cri::{CriClient, NodeShape};
use crate::kubelet::node_admission::NodeFacts;
use crate::kuberuntime::RuntimeConfig;
use crate::otel::Listen;
use crate::syncloop::KubeletSettings;
use crate::trace::RunConfig;

use super::AgentError;
use super::recorder::ProbeRequest;

/// What the agent is asked to do: `podlapse run`'s flags, parsed.
pub struct Options {
    pub cfg: RuntimeConfig,
    pub settings: KubeletSettings,
    /// `--cgroup-driver`, when given: otherwise the runtime says.
    pub cgroup_driver: Option<CgroupDriver>,
    pub node_labels: BTreeMap<String, String>,
    pub until_ready: bool,
    pub trace: Option<PathBuf>,
    /// `--trace-max-bytes` and `--trace-keep`.
    pub trace_rotation: Option<crate::trace::Rotation>,
    /// `--otlp-endpoint` (the standard OTLP variables are read too).
    pub otlp_endpoint: Option<String>,
    pub runtime_otlp: Option<Listen>,
    pub deleted_pod_retention: Duration,
    /// How long the end waits for the runtime's spans (`--runtime-span-wait`).
    pub runtime_span_wait: Duration,
    /// The probes, when the run wants kernel events; `--cni-bin-dir` in it, if given,
    /// else the runtime's CNI directory is filled in.
    pub probes: Option<ProbeRequest>,
    /// `--cni-bin-dir`, when given.
    pub cni_bin_dir: Option<String>,
}

/// The agent with everything known and nothing started.
pub struct Prepared {
    pub(super) cfg: RuntimeConfig,
    pub(super) settings: KubeletSettings,
    pub(super) cri: CriClient,
    pub(super) otlp_endpoint: Option<String>,
    pub(super) runtime_otlp: Option<Listen>,
    pub(super) trace: Option<PathBuf>,
    pub(super) trace_rotation: Option<crate::trace::Rotation>,
    pub(super) probes: Option<ProbeRequest>,
    pub(super) run_config: RunConfig,
    pub(super) deleted_pod_retention: Duration,
    pub(super) runtime_span_wait: Duration,
    /// The pod cgroups' root as the node's driver names it, which the probes watch.
    pub(super) watched_root: Option<String>,
}

impl Prepared {
    pub fn node_name(&self) -> &str {
        &self.cfg.node_name
    }
}

/// Checks the options against the node that `cri`'s runtime runs.
pub async fn prepare(opts: Options, cri: CriClient) -> Result<Prepared, AgentError> {
    // A malformed collector endpoint is said before anything starts.
    let otlp_endpoint = crate::otel::endpoint(opts.otlp_endpoint.as_deref())?;
    let (mut cfg, mut settings) = (opts.cfg, opts.settings);
    // A one-shot run does not own the node: removing pods it did not start would break
    // other users of the runtime. Housekeeping belongs to the long-running agent.
    settings.housekeeping &= !opts.until_ready;
    let need_driver = settings.cgroup_root.is_some();
    let shape = NodeShape::detect(&cri, opts.cgroup_driver, need_driver).await?;
    cfg.user_namespace_handlers = Some(shape.user_namespace_handlers.clone());
    cfg.allocatable = Some(settings.allocatable.clone());
    settings.node = Some(NodeFacts {
        apparmor: apparmor_enabled(),
        supplemental_groups_policy: shape.supplemental_groups_policy,
        ..NodeFacts::new(&cfg.node_name, std::env::consts::ARCH, &opts.node_labels)
    });
    if let Some((driver, source)) = shape.cgroup_driver {
        tracing::info!(%driver, %source, "cgroup driver");
        settings.cgroup_driver = driver;
    }
    let cni_bin_dir = cni_bin_dir(opts.cni_bin_dir, &shape)?;
    let mut probes = opts.probes;
    if let (Some(p), Some(dir)) = (probes.as_mut(), cni_bin_dir) {
        p.config.cni_bin_dir = dir;
    }
    let mut run_config = run_config(opts.until_ready, &settings);
    // The node's IP, so a diagnosis of a host-network pod can name it.
    run_config.node_ip = Some(cfg.node_ip.clone());
    // The kernel filter watches the pod cgroups under the root as the driver names it
    // (`/podlapse` with cgroupfs, `/podlapse.slice` with systemd).
    let watched_root = settings
        .cgroup_root
        .as_deref()
        .map(|r| CgroupName::from_cgroupfs(r).to_driver(settings.cgroup_driver));
    Ok(Prepared {
        cfg,
        settings,
        cri,
        otlp_endpoint,
        runtime_otlp: opts.runtime_otlp,
        trace: opts.trace,
        trace_rotation: opts.trace_rotation,
        probes,
        run_config,
        deleted_pod_retention: opts.deleted_pod_retention,
        runtime_span_wait: opts.runtime_span_wait,
        watched_root,
    })
}

/// The CNI plugin directory the probes watch: `--cni-bin-dir` if given, else where the
/// runtime's status info says it runs plugins from (`None`: the probes' default). A
/// directory that does not exist is refused, saying where it came from and what the
/// runtime says.
fn cni_bin_dir(flag: Option<String>, shape: &NodeShape) -> Result<Option<String>, AgentError> {
    let (dir, from) = match flag {
        Some(dir) => (Some(dir), "--cni-bin-dir"),
        None => (
            shape.cni_bin_dirs.first().cloned(),
            "the runtime's status info",
        ),
    };
    if let Some(d) = dir.as_deref()
        && !Path::new(d).is_dir()
    {
        let runtime_says = if shape.cni_bin_dirs.is_empty() {
            "says no CNI directory".to_string()
        } else {
            format!("says {}", shape.cni_bin_dirs.join(", "))
        };
        return Err(AgentError::CniBinDirMissing {
            dir: d.to_string(),
            from,
            runtime_says,
        });
    }
    Ok(dir)
}

/// The settings a trace header records.
fn run_config(until_ready: bool, s: &KubeletSettings) -> RunConfig {
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
        until_ready,
    }
}

/// The host's kernel enforces AppArmor, as kubelet's `apparmor.IsEnabled` (runc's) asks:
/// its securityfs directory is there and the module says it is enabled.
fn apparmor_enabled() -> bool {
    Path::new("/sys/kernel/security/apparmor").is_dir()
        && std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
            .is_ok_and(|v| v.trim() == "Y")
}
