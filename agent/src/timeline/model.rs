//! What the builder produces: per pod, the named stages of its startup, each a span on
//! the one monotonic clock CRI calls and kernel events share.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use podlapse_core::record::GrpcCode;

use super::cni_reply::{CniCapture, CniReply};
use super::sources::PodSources;
use super::stage_kind::StageKind;
use super::stage_name::StageName;

/// Where a stage's times come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StageSource {
    /// A CRI call's span, as the recording wrapper measured it.
    Cri,
    /// Kernel events from the eBPF probes.
    Kernel,
    /// The agent itself: a config change or a pod event it recorded.
    Agent,
    /// The container runtime's own spans (`--runtime-otlp-listen`), inside the CRI call
    /// that holds them.
    Runtime,
    /// The kubelet's own spans (its syncs and CRI calls), received by the observer.
    Kubelet,
}

impl std::fmt::Display for StageSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StageSource::Cri => "cri",
            StageSource::Kernel => "kernel",
            StageSource::Kubelet => "kubelet",
            StageSource::Agent => "agent",
            StageSource::Runtime => "runtime",
        })
    }
}

/// One stage of one pod's startup. Self-contained (it names its pod), so a trace can hold
/// stages as `stage` records one per line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stage {
    pub pod_uid: String,
    pub namespace: String,
    pub pod: String,
    /// `pod_seen`, `cni_plugin:bridge`, `container_start:app`, ...
    pub stage: StageName,
    /// CLOCK_MONOTONIC ns. A point in time (an exec, a decision) has `end_ns == start_ns`.
    pub start_ns: u64,
    pub end_ns: u64,
    pub duration_ns: u64,
    pub source: StageSource,
    /// False when the stage failed: a CRI error, a process that exited non-zero or was
    /// killed.
    pub ok: bool,
    /// A process's exit code (CNI plugins, exec hooks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended a process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// A CRI call's status code (`OK`, `Unknown`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<GrpcCode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The process a kernel stage is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The network namespace a stage created or used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_inum: Option<u32>,
    /// The v2 cgroup a stage created or ran in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_id: Option<u64>,
    /// For people: the file exec'd, the pod IP, the runtime's error message, ...
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// A CNI plugin run (`cni_plugin:<name>`): what it printed, read as a CNI reply, or
    /// why it was not captured. None on every other stage, and in traces recorded
    /// before the capture.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<CniReply>,
    /// A CNI plugin run whose output the probes saw: how much it wrote, how much was
    /// captured, whether it was cut, through which hook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<CniCapture>,
}

impl Stage {
    /// A process the kernel saw start and not (yet) end: it is marked failed in a timeline
    /// built now ("exit not seen"), but may still exit 0. A kernel stage that failed for
    /// good has an exit code or a signal.
    pub fn outcome_pending(&self) -> bool {
        self.source == StageSource::Kernel
            && !self.ok
            && self.exit_code.is_none()
            && self.signal.is_none()
    }

    /// A successful stage with no details yet; `end_ns` is raised to `start_ns` if earlier.
    pub fn new(
        pod_uid: &str,
        namespace: &str,
        pod: &str,
        stage: StageName,
        start_ns: u64,
        end_ns: u64,
        source: StageSource,
    ) -> Stage {
        let end_ns = end_ns.max(start_ns);
        Stage {
            pod_uid: pod_uid.to_string(),
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            stage,
            start_ns,
            end_ns,
            duration_ns: end_ns - start_ns,
            source,
            ok: true,
            exit_code: None,
            signal: None,
            code: None,
            sandbox_id: None,
            container: None,
            container_id: None,
            pid: None,
            netns_inum: None,
            cgroup_id: None,
            detail: String::new(),
            reply: None,
            capture: None,
        }
    }

    /// The part of the name before `:` (`cni_plugin` for `cni_plugin:bridge`; `runtime`
    /// for every `runtime:<step>`).
    pub fn kind(&self) -> &StageKind {
        self.stage.kind()
    }
}

/// One pod's stages and what the kernel attributed to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodTimeline {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// When the agent first saw the pod (`pod_seen`): offsets are measured from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen_ns: Option<u64>,
    /// Every sandbox the pod had, from CRI or from the kernel (a sandbox whose
    /// RunPodSandbox failed is known only by the ID its CNI plugins were given).
    pub sandbox_ids: Vec<String>,
    /// Container ID to container name.
    pub containers: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// In the order they started.
    pub stages: Vec<Stage>,
    /// Kernel events attributed to the pod, by kind.
    pub kernel_events: BTreeMap<String, u64>,
    /// What the timeline cannot show and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Which sources of stages the pod has, and why any is absent; None for a recording
    /// that did not record its sources (older traces, replays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<PodSources>,
}

impl PodTimeline {
    /// Whether `pod` names this pod: its name, `namespace/name`, or its UID.
    pub fn is(&self, pod: &str) -> bool {
        self.name == pod
            || self.uid == pod
            || pod.split_once('/') == Some((self.namespace.as_str(), self.name.as_str()))
    }

    /// From the first sight of the pod to Running, if it got there.
    pub fn to_running_ns(&self) -> Option<u64> {
        let running = self.stage(StageKind::Running)?.start_ns;
        let seen = self
            .seen_ns
            .or_else(|| self.stages.iter().map(|s| s.start_ns).min())?;
        Some(running.saturating_sub(seen))
    }

    /// The first stage of this name: a kind alone (`StageKind::Running`) or a kind and
    /// what it is about (`container_start:app`).
    pub fn stage(&self, name: impl Into<StageName>) -> Option<&Stage> {
        let name = name.into();
        self.stages.iter().find(|s| s.stage == name)
    }

    /// Stages that failed, in order.
    pub fn failures(&self) -> impl Iterator<Item = &Stage> {
        self.stages.iter().filter(|s| !s.ok)
    }

    /// Whether the probes follow this pod (some of its kernel events came) and a
    /// container the runtime says started has no first exec from the kernel yet. The
    /// exec comes through the probes' ring buffer, which on a loaded node is read seconds
    /// behind the runtime's events; its time is before the pod went quiet, so waiting for
    /// quiet does not wait for it.
    pub fn kernel_exec_pending(&self) -> bool {
        self.kernel_events.values().any(|&n| n > 0)
            && self.stages.iter().any(|s| {
                *s.stage.kind() == StageKind::ContainerStarted
                    && s.stage.name().is_some_and(|c| {
                        self.stage(StageName::of(StageKind::AppFirstExec, c))
                            .is_none()
                    })
            })
    }

    /// Failures whose outcome is known: [`PodTimeline::failures`] without the kernel's
    /// processes still running ([`Stage::outcome_pending`]). What decides, while the pod
    /// is being watched live, that it has failed and its stages can be counted and sent:
    /// on a slow node a CNI plugin runs for seconds before it exits 0.
    pub fn settled_failures(&self) -> impl Iterator<Item = &Stage> {
        self.failures().filter(|s| !s.outcome_pending())
    }
}

/// Every pod's timeline, and the kernel events no pod could be tied to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeline {
    /// Ordered by namespace, name and UID.
    pub pods: Vec<PodTimeline>,
    /// Kernel events in the input.
    pub kernel_events: u64,
    /// Kernel events with no pod identity: they stay on the node.
    pub node_events: u64,
    /// Kernel events of pods this agent does not run (another kubelet on the runtime).
    #[serde(default)]
    pub other_pod_events: u64,
}

impl Timeline {
    /// Every pod's stages, pod by pod.
    pub fn stages(&self) -> impl Iterator<Item = &Stage> {
        self.pods.iter().flat_map(|p| p.stages.iter())
    }

    /// Only the pods `pod` names: a name, `namespace/name`, or a UID.
    pub fn only(mut self, pod: &str) -> Timeline {
        self.pods.retain(|p| p.is(pod));
        self
    }

    /// Groups stage records (as a trace holds them, in the builder's order) back into
    /// pods, for a trace that kept only its stages.
    pub fn from_stages(stages: impl IntoIterator<Item = Stage>) -> Timeline {
        let mut pods: BTreeMap<(String, String, String), PodTimeline> = BTreeMap::new();
        for s in stages {
            let key = (s.namespace.clone(), s.pod.clone(), s.pod_uid.clone());
            let p = pods.entry(key).or_insert_with(|| PodTimeline {
                uid: s.pod_uid.clone(),
                namespace: s.namespace.clone(),
                name: s.pod.clone(),
                seen_ns: None,
                sandbox_ids: Vec::new(),
                containers: BTreeMap::new(),
                ip: None,
                stages: Vec::new(),
                kernel_events: BTreeMap::new(),
                notes: Vec::new(),
                sources: None,
            });
            if s.stage.is(&StageKind::PodSeen) {
                p.seen_ns = Some(s.start_ns);
            }
            if let Some(id) = &s.sandbox_id
                && !p.sandbox_ids.contains(id)
            {
                p.sandbox_ids.push(id.clone());
            }
            if let (Some(id), Some(name)) = (&s.container_id, &s.container) {
                p.containers.insert(id.clone(), name.clone());
            }
            p.stages.push(s);
        }
        // Stages keep the order they were written in: the builder's.
        Timeline {
            pods: pods.into_values().collect(),
            kernel_events: 0,
            node_events: 0,
            other_pod_events: 0,
        }
    }
}
