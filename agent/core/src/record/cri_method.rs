//! The CRI methods podlapse calls, as a type: what a recorded call was, what the fake
//! runtime logs and fails, and what the timeline, diagnose and replay match on.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A CRI method podlapse calls, by its name in the CRI API: in a trace's JSON it is that
/// name, and a name podlapse does not call is refused when a trace is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CriMethod {
    Version,
    Status,
    RunPodSandbox,
    StopPodSandbox,
    RemovePodSandbox,
    PodSandboxStatus,
    ListPodSandbox,
    CreateContainer,
    StartContainer,
    StopContainer,
    RemoveContainer,
    UpdateContainerResources,
    ListContainers,
    ContainerStatus,
    ExecSync,
    ImageStatus,
    PullImage,
}

impl CriMethod {
    /// The method's name as the CRI API (and `CriError`) spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            CriMethod::Version => "Version",
            CriMethod::Status => "Status",
            CriMethod::RunPodSandbox => "RunPodSandbox",
            CriMethod::StopPodSandbox => "StopPodSandbox",
            CriMethod::RemovePodSandbox => "RemovePodSandbox",
            CriMethod::PodSandboxStatus => "PodSandboxStatus",
            CriMethod::ListPodSandbox => "ListPodSandbox",
            CriMethod::CreateContainer => "CreateContainer",
            CriMethod::StartContainer => "StartContainer",
            CriMethod::StopContainer => "StopContainer",
            CriMethod::RemoveContainer => "RemoveContainer",
            CriMethod::UpdateContainerResources => "UpdateContainerResources",
            CriMethod::ListContainers => "ListContainers",
            CriMethod::ContainerStatus => "ContainerStatus",
            CriMethod::ExecSync => "ExecSync",
            CriMethod::ImageStatus => "ImageStatus",
            CriMethod::PullImage => "PullImage",
        }
    }

    /// True for the calls that change the runtime's state (what a sync does, as opposed
    /// to what it reads).
    pub fn mutates(self) -> bool {
        matches!(
            self,
            CriMethod::RunPodSandbox
                | CriMethod::StopPodSandbox
                | CriMethod::RemovePodSandbox
                | CriMethod::CreateContainer
                | CriMethod::StartContainer
                | CriMethod::StopContainer
                | CriMethod::RemoveContainer
                | CriMethod::UpdateContainerResources
                | CriMethod::ExecSync
                | CriMethod::PullImage
        )
    }

    /// The CRI service the method is of, as gRPC names it.
    pub fn service(self) -> &'static str {
        match self {
            CriMethod::PullImage | CriMethod::ImageStatus => "runtime.v1.ImageService",
            _ => "runtime.v1.RuntimeService",
        }
    }

    /// Calls that only read state: frequent, and not stages of a pod's startup.
    pub fn is_observation(self) -> bool {
        matches!(
            self,
            CriMethod::Version
                | CriMethod::Status
                | CriMethod::ListPodSandbox
                | CriMethod::ListContainers
                | CriMethod::PodSandboxStatus
                | CriMethod::ContainerStatus
                | CriMethod::ImageStatus
        )
    }

    /// Every method, in the CRI API's order.
    pub const ALL: [CriMethod; 17] = [
        CriMethod::Version,
        CriMethod::Status,
        CriMethod::RunPodSandbox,
        CriMethod::StopPodSandbox,
        CriMethod::RemovePodSandbox,
        CriMethod::PodSandboxStatus,
        CriMethod::ListPodSandbox,
        CriMethod::CreateContainer,
        CriMethod::StartContainer,
        CriMethod::StopContainer,
        CriMethod::RemoveContainer,
        CriMethod::UpdateContainerResources,
        CriMethod::ListContainers,
        CriMethod::ContainerStatus,
        CriMethod::ExecSync,
        CriMethod::ImageStatus,
        CriMethod::PullImage,
    ];
}

impl fmt::Display for CriMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no CRI method podlapse calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownCriMethod(pub String);

impl fmt::Display for UnknownCriMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not a CRI method podlapse calls", self.0)
    }
}

impl std::error::Error for UnknownCriMethod {}

impl FromStr for CriMethod {
    type Err = UnknownCriMethod;

    fn from_str(s: &str) -> Result<CriMethod, UnknownCriMethod> {
        CriMethod::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| UnknownCriMethod(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_is_its_cri_name_in_json_and_back() {
        for m in CriMethod::ALL {
            let json = serde_json::to_string(&m).unwrap();
            assert_eq!(json, format!("\"{}\"", m.as_str()));
            assert_eq!(serde_json::from_str::<CriMethod>(&json).unwrap(), m);
            assert_eq!(m.as_str().parse::<CriMethod>(), Ok(m));
            assert_eq!(m.to_string(), m.as_str());
        }
    }

    #[test]
    fn a_name_podlapse_does_not_call_is_refused_by_name() {
        let err = serde_json::from_str::<CriMethod>("\"ReopenContainerLog\"").unwrap_err();
        assert!(err.to_string().contains("ReopenContainerLog"), "{err}");
        assert_eq!(
            "Nope".parse::<CriMethod>().unwrap_err().to_string(),
            "\"Nope\" is not a CRI method podlapse calls"
        );
    }
}
