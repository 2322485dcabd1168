//! The runtime shell: kubelet's `kuberuntime` manager. It performs the core's decisions
//! over CRI (sandboxes, images, containers), creates pod directories and volumes, and
//! reads the runtime's view of each pod back.

pub mod config;
pub mod container;
mod error;
pub mod event;
pub mod image;
pub mod kill;
pub mod labels;
pub mod pod_status;
pub mod resources;
pub mod sandbox;
pub mod security_context;
pub mod sync_pod;
pub mod userns;
pub mod volumes;

pub use config::{HostDns, RuntimeConfig};
pub use error::{SyncError, SyncReason};
pub use event::{EventLog, EventRecorder, PodEvent};
pub use image::PullLimiter;
pub use pod_status::get_pod_status;
pub use sync_pod::{ContainerOutcome, PodSyncResult, SyncContext, sync_pod};
