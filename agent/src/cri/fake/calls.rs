//! The fake runtime's call log: every CRI call in the order it was made, each with the
//! argument a test asserts on, so a test compares the log with a literal list.

pub use podlapse_core::record::CriMethod as Method;

/// One call the fake runtime answered (or failed), with its salient argument: the pod and
/// attempt of a sandbox being run, the sandbox or container it is about, the container's
/// name and attempt from the config being created, the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeCall {
    Version,
    Status,
    RunPodSandbox {
        pod_uid: String,
        attempt: u32,
    },
    StopPodSandbox {
        sandbox_id: String,
    },
    RemovePodSandbox {
        sandbox_id: String,
    },
    PodSandboxStatus {
        sandbox_id: String,
    },
    ListPodSandbox,
    CreateContainer {
        sandbox_id: String,
        name: String,
        attempt: u32,
    },
    StartContainer {
        container_id: String,
    },
    /// With the grace period (seconds) the container was given.
    StopContainer {
        container_id: String,
        timeout: i64,
    },
    RemoveContainer {
        container_id: String,
    },
    UpdateContainerResources {
        container_id: String,
    },
    ListContainers,
    ContainerStatus {
        container_id: String,
    },
    ExecSync {
        container_id: String,
    },
    ImageStatus {
        image: String,
    },
    PullImage {
        image: String,
    },
}

impl FakeCall {
    /// The CRI method called.
    pub fn method(&self) -> Method {
        match self {
            FakeCall::Version => Method::Version,
            FakeCall::Status => Method::Status,
            FakeCall::RunPodSandbox { .. } => Method::RunPodSandbox,
            FakeCall::StopPodSandbox { .. } => Method::StopPodSandbox,
            FakeCall::RemovePodSandbox { .. } => Method::RemovePodSandbox,
            FakeCall::PodSandboxStatus { .. } => Method::PodSandboxStatus,
            FakeCall::ListPodSandbox => Method::ListPodSandbox,
            FakeCall::CreateContainer { .. } => Method::CreateContainer,
            FakeCall::StartContainer { .. } => Method::StartContainer,
            FakeCall::StopContainer { .. } => Method::StopContainer,
            FakeCall::RemoveContainer { .. } => Method::RemoveContainer,
            FakeCall::UpdateContainerResources { .. } => Method::UpdateContainerResources,
            FakeCall::ListContainers => Method::ListContainers,
            FakeCall::ContainerStatus { .. } => Method::ContainerStatus,
            FakeCall::ExecSync { .. } => Method::ExecSync,
            FakeCall::ImageStatus { .. } => Method::ImageStatus,
            FakeCall::PullImage { .. } => Method::PullImage,
        }
    }

    /// The image the call is about, if it is an image call.
    pub fn image(&self) -> Option<&str> {
        match self {
            FakeCall::ImageStatus { image } | FakeCall::PullImage { image } => Some(image),
            _ => None,
        }
    }
}
