//! What a recorded CRI call answered, typed by its method ([`ResponseFields`]), with the
//! readers' questions as accessors: a sandbox's state and IP, a container's state, exit
//! code and reason, the runtime's conditions, an image's presence and reference.
//!
//! In a trace it is the call's `response`: a map of field names to strings, in name order,
//! left out when empty (`cri_response_serde.rs`, the one place that knows those names and
//! spellings). A field a trace holds that this version does not type (an older or newer
//! recorder's, a hand-written one, a value not spelled as the recorder spells it) is kept
//! as it was written, so reading a trace and writing it again gives the same bytes.

use std::net::IpAddr;

use super::{
    ContainerReason, ContainerState, PodSandboxState, ResponseFields, RuntimeCondition,
    RuntimeConditionType,
};

/// Fields kept as the trace wrote them, by name in name order.
pub(super) type UnknownFields = litemap::LiteMap<String, String>;

/// A call's recorded response. Empty (most state-changing calls) it is one null pointer
/// and allocates nothing; otherwise one box holds the method's fields and any kept as
/// written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CriResponse(Option<Box<Recorded>>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Recorded {
    pub(super) fields: ResponseFields,
    pub(super) unknown: UnknownFields,
}

impl CriResponse {
    /// No field recorded.
    pub fn empty() -> CriResponse {
        CriResponse(None)
    }

    /// `fields` and, kept as written, `unknown`; empty when both are.
    pub(super) fn with_unknown(fields: ResponseFields, unknown: UnknownFields) -> CriResponse {
        if fields.is_empty() && unknown.is_empty() {
            return CriResponse(None);
        }
        let fields = if fields.is_empty() {
            ResponseFields::None
        } else {
            fields
        };
        CriResponse(Some(Box::new(Recorded { fields, unknown })))
    }

    pub(super) fn recorded(&self) -> Option<&Recorded> {
        self.0.as_deref()
    }

    /// True when the call recorded no field: the trace leaves `response` out.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The method's fields.
    pub fn fields(&self) -> &ResponseFields {
        const NONE: &ResponseFields = &ResponseFields::None;
        self.0.as_ref().map_or(NONE, |r| &r.fields)
    }

    /// True when the trace held fields this version does not type, kept as written.
    pub fn has_unknown_fields(&self) -> bool {
        self.0.as_ref().is_some_and(|r| !r.unknown.is_empty())
    }

    /// PodSandboxStatus: the sandbox's state.
    pub fn pod_sandbox_state(&self) -> Option<PodSandboxState> {
        match self.fields() {
            ResponseFields::PodSandboxStatus(f) => f.state,
            _ => None,
        }
    }

    /// PodSandboxStatus: the pod's IP; `None` also for a sandbox on the host's network.
    pub fn pod_ip(&self) -> Option<IpAddr> {
        match self.fields() {
            ResponseFields::PodSandboxStatus(f) => f.network.and_then(|n| n.ip),
            _ => None,
        }
    }

    /// ContainerStatus: the container's state.
    pub fn container_state(&self) -> Option<ContainerState> {
        match self.fields() {
            ResponseFields::ContainerStatus(f) => f.state,
            _ => None,
        }
    }

    /// ContainerStatus: the container's exit code; ExecSync: the command's.
    pub fn exit_code(&self) -> Option<i32> {
        match self.fields() {
            ResponseFields::ContainerStatus(f) => f.exit_code,
            ResponseFields::ExecSync(f) => f.exit_code,
            _ => None,
        }
    }

    /// ContainerStatus: why the container is in its state, when the runtime said.
    pub fn reason(&self) -> Option<&ContainerReason> {
        match self.fields() {
            ResponseFields::ContainerStatus(f) => f.reason.as_ref(),
            _ => None,
        }
    }

    /// Status: the runtime's condition of type `t`, if it gave one.
    pub fn condition(&self, t: &RuntimeConditionType) -> Option<&RuntimeCondition> {
        match self.fields() {
            ResponseFields::Status(f) => f.condition(t),
            _ => None,
        }
    }

    /// Status: the `NetworkReady` condition, if the runtime gave it.
    pub fn network_ready(&self) -> Option<&RuntimeCondition> {
        self.condition(&RuntimeConditionType::NetworkReady)
    }

    /// ImageStatus: whether the runtime had the image.
    pub fn image_present(&self) -> Option<bool> {
        match self.fields() {
            ResponseFields::ImageStatus(f) => f.present,
            _ => None,
        }
    }

    /// PullImage: the reference of the image pulled.
    pub fn image_ref(&self) -> Option<&str> {
        match self.fields() {
            ResponseFields::PullImage(f) => f.image_ref.as_deref(),
            _ => None,
        }
    }

    /// ListPodSandbox, ListContainers: how many the runtime listed.
    pub fn count(&self) -> Option<u32> {
        match self.fields() {
            ResponseFields::ListPodSandbox(f) | ResponseFields::ListContainers(f) => f.count,
            _ => None,
        }
    }
}

impl From<ResponseFields> for CriResponse {
    fn from(fields: ResponseFields) -> CriResponse {
        CriResponse::with_unknown(fields, UnknownFields::new())
    }
}

/// `CriResponse::from(fields)` for each method's fields.
macro_rules! from_fields {
    ($($variant:ident($fields:ident)),* $(,)?) => {$(
        impl From<super::$fields> for CriResponse {
            fn from(fields: super::$fields) -> CriResponse {
                ResponseFields::$variant(fields).into()
            }
        }
    )*};
}

from_fields!(
    Version(VersionFields),
    Status(StatusFields),
    PodSandboxStatus(PodSandboxStatusFields),
    ContainerStatus(ContainerStatusFields),
    ExecSync(ExecSyncFields),
    ImageStatus(ImageStatusFields),
    PullImage(PullImageFields),
    StopContainer(StopContainerFields),
    UpdateContainerResources(UpdateContainerResourcesFields),
);
