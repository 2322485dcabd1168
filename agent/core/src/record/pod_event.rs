//! Pod events kubelet would record (Pulling, Pulled, Created, Started, Killing, BackOff,
//! FailedCreatePodSandBox, ...), and the waits of a pod queued behind the agent's own
//! decisions. The agent's shell records them; a trace keeps them.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    Normal,
    Warning,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodEvent {
    pub kind: EventType,
    pub reason: String,
    pub message: String,
    /// The container the event is about, if any.
    pub container: Option<String>,
}

impl PodEvent {
    pub fn normal(
        reason: impl Into<String>,
        message: impl Into<String>,
        container: Option<String>,
    ) -> Self {
        PodEvent {
            kind: EventType::Normal,
            reason: reason.into(),
            message: message.into(),
            container,
        }
    }

    pub fn warning(
        reason: impl Into<String>,
        message: impl Into<String>,
        container: Option<String>,
    ) -> Self {
        PodEvent {
            kind: EventType::Warning,
            reason: reason.into(),
            message: message.into(),
            container,
        }
    }
}

/// What a pod waited for, queued behind something the agent itself decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitKind {
    /// kubelet's image puller: serialized pulls (its default), or the parallel-pull limit.
    ImagePuller,
    /// An update for the pod arrived while its pod worker was busy with earlier work; it
    /// ran once that work ended.
    PodWorker,
    /// A back-off kubelet decided (CrashLoopBackOff, ImagePullBackOff): the pod's next
    /// sync waited for it to end.
    BackOff,
    /// The runtime's network was not ready, so no sandbox could get a pod network.
    Network,
    /// A container's startup probe had not passed yet (a sidecar holds back the
    /// containers after it until it does).
    StartupProbe,
}

impl WaitKind {
    pub fn name(self) -> &'static str {
        match self {
            WaitKind::ImagePuller => "image_puller",
            WaitKind::PodWorker => "pod_worker",
            WaitKind::BackOff => "back_off",
            WaitKind::Network => "network",
            WaitKind::StartupProbe => "startup_probe",
        }
    }
}

/// Time a pod spent queued: how long, for what, and behind whose work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodWait {
    pub wait: WaitKind,
    /// The container it waited for, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Who it waited behind (`namespace/name` of the pods whose work ran first), in the
    /// order their work started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub behind: Vec<String>,
    /// What it waited behind, said once (the image being pulled, the limit).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}
