//! The fields a recording keeps of each CRI method's answer, one type per method, with
//! CRI's names: what the timeline, replay, diagnose and metrics read, and a request field
//! where that is what matters (StopContainer's timeout, PullImage's `auth`). A field is
//! `None` when the call did not record it (a failed call keeps only what was recorded
//! before it was made).

use std::net::IpAddr;

use super::{ContainerReason, ContainerState, PodSandboxState};

/// A call's recorded fields, by the method that answered them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ResponseFields {
    /// Nothing of the answer is kept (RunPodSandbox, CreateContainer, StartContainer, the
    /// stops and removals), or nothing was recorded.
    #[default]
    None,
    Version(VersionFields),
    Status(StatusFields),
    PodSandboxStatus(PodSandboxStatusFields),
    ListPodSandbox(ListFields),
    ListContainers(ListFields),
    ContainerStatus(ContainerStatusFields),
    ExecSync(ExecSyncFields),
    ImageStatus(ImageStatusFields),
    PullImage(PullImageFields),
    StopContainer(StopContainerFields),
    UpdateContainerResources(UpdateContainerResourcesFields),
}

impl ResponseFields {
    /// True when no field is set, whatever the method.
    pub fn is_empty(&self) -> bool {
        match self {
            ResponseFields::None => true,
            ResponseFields::Version(f) => f.runtime_name.is_none() && f.runtime_version.is_none(),
            ResponseFields::Status(f) => f.conditions.is_empty(),
            ResponseFields::PodSandboxStatus(f) => f.state.is_none() && f.network.is_none(),
            ResponseFields::ListPodSandbox(f) | ResponseFields::ListContainers(f) => {
                f.count.is_none()
            }
            ResponseFields::ContainerStatus(f) => {
                f.state.is_none() && f.exit_code.is_none() && f.reason.is_none()
            }
            ResponseFields::ExecSync(f) => f.exit_code.is_none(),
            ResponseFields::ImageStatus(f) => f.present.is_none(),
            ResponseFields::PullImage(f) => f.auth.is_none() && f.image_ref.is_none(),
            ResponseFields::StopContainer(f) => f.timeout.is_none(),
            ResponseFields::UpdateContainerResources(f) => {
                f.cpu_quota.is_none() && f.cpu_shares.is_none() && f.memory_limit_in_bytes.is_none()
            }
        }
    }
}

/// Version: which runtime answered.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VersionFields {
    pub runtime_name: Option<String>,
    pub runtime_version: Option<String>,
}

/// Status: the runtime's conditions, one per type.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StatusFields {
    /// By type name, as a trace writes them (so two answers with the same conditions are
    /// equal whatever order the runtime listed them in).
    pub conditions: Vec<RuntimeCondition>,
}

impl StatusFields {
    /// The runtime's conditions; a type listed again updates the one before (its status,
    /// and its reason and message when it has them).
    pub fn new(conditions: impl IntoIterator<Item = RuntimeCondition>) -> StatusFields {
        let mut fields = StatusFields::default();
        for c in conditions {
            fields.set(c);
        }
        fields
    }

    /// Adds `condition`, or updates the condition of its type.
    pub fn set(&mut self, condition: RuntimeCondition) {
        match self
            .conditions
            .iter_mut()
            .find(|c| c.r#type == condition.r#type)
        {
            Some(c) => {
                c.status = condition.status;
                if condition.reason.is_some() {
                    c.reason = condition.reason;
                }
                if condition.message.is_some() {
                    c.message = condition.message;
                }
            }
            None => {
                let at = self
                    .conditions
                    .partition_point(|c| c.r#type.as_str() < condition.r#type.as_str());
                self.conditions.insert(at, condition);
            }
        }
    }

    /// The condition of type `t`, if the runtime gave it.
    pub fn condition(&self, t: &RuntimeConditionType) -> Option<&RuntimeCondition> {
        self.conditions.iter().find(|c| c.r#type == *t)
    }
}

/// One of the runtime's conditions (CRI's `RuntimeCondition`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeCondition {
    pub r#type: RuntimeConditionType,
    pub status: bool,
    /// Why it is false (`<type>_reason` in a trace): recorded only for a false one, which
    /// is what a diagnosis needs ("cni plugin not initialized").
    pub reason: Option<String>,
    /// The runtime's words for it (`<type>_message`), likewise.
    pub message: Option<String>,
}

impl RuntimeCondition {
    /// A condition of type `t` with `status` and nothing said about it.
    pub fn new(t: RuntimeConditionType, status: bool) -> RuntimeCondition {
        RuntimeCondition {
            r#type: t,
            status,
            reason: None,
            message: None,
        }
    }
}

/// A runtime condition's type: the two every CRI runtime reports, or another by name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RuntimeConditionType {
    /// `RuntimeReady`: the runtime is up and can run sandboxes and containers.
    RuntimeReady,
    /// `NetworkReady`: the runtime's network (CNI) is ready for pods.
    NetworkReady,
    /// Any other type, by its name; never one of the names above.
    Other(String),
}

impl RuntimeConditionType {
    /// The type named `name`.
    pub fn new(name: &str) -> RuntimeConditionType {
        match name {
            "RuntimeReady" => RuntimeConditionType::RuntimeReady,
            "NetworkReady" => RuntimeConditionType::NetworkReady,
            other => RuntimeConditionType::Other(other.to_string()),
        }
    }

    /// The type's name in CRI.
    pub fn as_str(&self) -> &str {
        match self {
            RuntimeConditionType::RuntimeReady => "RuntimeReady",
            RuntimeConditionType::NetworkReady => "NetworkReady",
            RuntimeConditionType::Other(name) => name,
        }
    }
}

/// PodSandboxStatus: the sandbox's state and its network.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodSandboxStatusFields {
    pub state: Option<PodSandboxState>,
    /// The sandbox's network status, when the runtime gave one.
    pub network: Option<PodSandboxNetwork>,
}

/// A sandbox's network status (CRI's `PodSandboxNetworkStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodSandboxNetwork {
    /// The pod's IP; `None` for a sandbox on the host's network (CRI's empty `ip`).
    pub ip: Option<IpAddr>,
}

/// ListPodSandbox and ListContainers: how many the runtime listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ListFields {
    pub count: Option<u32>,
}

/// ContainerStatus: the container's state, and how it ended once it has.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerStatusFields {
    pub state: Option<ContainerState>,
    pub exit_code: Option<i32>,
    /// Recorded only when the runtime gave one.
    pub reason: Option<ContainerReason>,
}

/// ExecSync: the command's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExecSyncFields {
    pub exit_code: Option<i32>,
}

/// ImageStatus: whether the runtime has the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImageStatusFields {
    pub present: Option<bool>,
}

/// PullImage: whether the request carried credentials (never what they were), and the
/// reference of the image pulled.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PullImageFields {
    pub auth: Option<bool>,
    pub image_ref: Option<String>,
}

/// StopContainer: the grace period asked for, in seconds (the request's `timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StopContainerFields {
    pub timeout: Option<i64>,
}

/// UpdateContainerResources: the Linux resources asked for (the request's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UpdateContainerResourcesFields {
    pub cpu_quota: Option<i64>,
    pub cpu_shares: Option<i64>,
    pub memory_limit_in_bytes: Option<i64>,
}
