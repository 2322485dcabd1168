//! What a trace records, as types shared by the agent that writes them and everything that
//! reads them (timeline, report, diagnose, replay).

mod comm;
mod cri_call;
mod cri_call_de;
mod cri_method;
mod cri_response;
mod cri_response_fields;
mod cri_response_serde;
#[cfg(test)]
mod cri_response_tests;
mod cri_state;
pub mod escaped;
mod grpc_code;
pub mod ids;
mod kernel_event;
mod pod_event;
mod runtime_span;

pub use comm::Comm;
pub use cri_call::CriCall;
pub use cri_method::{CriMethod, UnknownCriMethod};
pub use cri_response::CriResponse;
pub use cri_response_fields::{
    ContainerStatusFields, ExecSyncFields, ImageStatusFields, ListFields, PodSandboxNetwork,
    PodSandboxStatusFields, PullImageFields, ResponseFields, RuntimeCondition,
    RuntimeConditionType, StatusFields, StopContainerFields, UpdateContainerResourcesFields,
    VersionFields,
};
pub use cri_state::{ContainerReason, ContainerState, PodSandboxState};
pub use grpc_code::{GrpcCode, UnknownGrpcCode};
pub use kernel_event::{
    Cgroup, CniExec, CniOutput, CniWriteHook, EventMeta, KernelEvent, NetnsCall, RuntimeExec,
    WriteHookChange, cni_args_value, kind_name, split_wait_status,
};
pub use pod_event::{EventType, PodEvent, PodWait, WaitKind};
pub use runtime_span::{Attributes, RuntimeSpan, RuntimeSpanEvent};
