//! What a trace records, as types shared by the agent that writes them and everything that
//! reads them (timeline, report, diagnose, replay).

mod comm;
mod cri_call;
mod cri_method;
pub mod escaped;
mod grpc_code;
pub mod ids;
mod kernel_event;
mod pod_event;
mod runtime_span;

pub use comm::Comm;
pub use cri_call::{CriCall, ResponseFields};
pub use cri_method::{CriMethod, UnknownCriMethod};
pub use grpc_code::{GrpcCode, UnknownGrpcCode};
pub use kernel_event::{
    Cgroup, CniExec, CniOutput, CniWriteHook, EventMeta, KernelEvent, NetnsCall, RuntimeExec,
    WriteHookChange, cni_args_value, kind_name, split_wait_status,
};
pub use pod_event::{EventType, PodEvent, PodWait, WaitKind};
pub use runtime_span::{Attributes, RuntimeSpan, RuntimeSpanEvent};
