//! How a sync step fails: kubelet's reason strings, so events and statuses read the same.

use std::fmt;

use crate::cri::CriError;

/// kubelet's reasons for a failed sync step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub enum SyncReason {
    CreatePodSandboxError,
    ConfigPodSandboxError,
    KillPodSandboxError,
    ErrImagePull,
    ImagePullBackOff,
    CrashLoopBackOff,
    NetworkNotReady,
    FailedPreStopHook,
    ErrImageNeverPull,
    ImageInspectError,
    CreateContainerConfigError,
    CreateContainerError,
    RunContainerError,
    KillContainerError,
    PostStartHookError,
    /// UpdateContainerResources failed during an in-place resize.
    UpdateContainerResourcesError,
}

impl fmt::Display for SyncReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl SyncReason {
    /// The reason of the pod event kubelet records for this failure.
    pub fn event_reason(self) -> &'static str {
        match self {
            SyncReason::CreatePodSandboxError => "FailedCreatePodSandBox",
            SyncReason::ConfigPodSandboxError => "FailedCreatePodSandBox",
            SyncReason::KillPodSandboxError => "FailedKillPod",
            SyncReason::KillContainerError => "FailedKillPod",
            _ => "FailedSync",
        }
    }

    /// The event's message, worded as kubelet words it.
    pub fn event_message(self, message: &str) -> String {
        match self {
            SyncReason::CreatePodSandboxError | SyncReason::ConfigPodSandboxError => {
                format!("Failed to create pod sandbox: {message}")
            }
            SyncReason::KillPodSandboxError | SyncReason::KillContainerError => {
                format!("error killing pod: {message}")
            }
            _ => format!("error syncing pod: {self}: {message}"),
        }
    }
}

/// A sync step that failed, with kubelet's reason and the message a user sees.
#[derive(Debug, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct SyncError {
    pub reason: SyncReason,
    pub message: String,
    /// The container the step was for, if any.
    pub container: Option<String>,
    /// When the step may be tried again (a back-off ending), if it is waiting for one.
    pub retry_at: Option<crate::kubelet::runtime_pod::Nanos>,
    #[source]
    pub source: Option<Box<CriError>>,
}

impl SyncError {
    pub fn new(reason: SyncReason, message: impl Into<String>) -> SyncError {
        SyncError {
            reason,
            message: message.into(),
            container: None,
            retry_at: None,
            source: None,
        }
    }

    pub fn cri(reason: SyncReason, source: CriError) -> SyncError {
        SyncError {
            reason,
            message: source.to_string(),
            container: None,
            retry_at: None,
            source: Some(Box::new(source)),
        }
    }

    pub fn for_container(mut self, name: &str) -> SyncError {
        self.container = Some(name.to_string());
        self
    }
}
