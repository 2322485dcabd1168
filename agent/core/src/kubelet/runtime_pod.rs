//! The runtime's view of one pod (kubelet's `kubecontainer.PodStatus`): its sandboxes and
//! containers as the CRI last reported them. Plain data, built by the runtime shell and
//! read by the deterministic core.

use serde::Serialize;

/// Nanoseconds on the CRI's clock (the runtime's `created_at`, `started_at`, ...).
pub type Nanos = i64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum SandboxState {
    Ready,
    NotReady,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SandboxStatus {
    pub id: String,
    pub state: SandboxState,
    pub attempt: u32,
    pub created_at: Nanos,
    /// Primary pod IP; empty for hostNetwork pods or before CNI ran.
    pub ip: String,
    pub additional_ips: Vec<String>,
    /// True when the sandbox uses the node's network namespace.
    pub host_network: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    #[default]
    Unknown,
}

/// A container's resources as the core compares them (kubelet's containerResources):
/// milli-CPU and bytes. Zero means unset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ContainerResources {
    pub cpu_request_milli: i64,
    pub cpu_limit_milli: i64,
    pub memory_request: i64,
    pub memory_limit: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ContainerStatus {
    pub id: String,
    pub name: String,
    pub state: ContainerState,
    /// The attempt the container was created with: kubelet's restart count.
    pub restart_count: u32,
    /// kubelet's container hash annotation: the spec the container was created from.
    pub hash: String,
    pub created_at: Nanos,
    pub started_at: Nanos,
    pub finished_at: Nanos,
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
    pub image: String,
    pub image_ref: String,
    /// The resources the runtime applied to the running container (kubelet's actuated
    /// resources), when the runtime reports them.
    pub resources: Option<ContainerResources>,
}

/// Everything the runtime knows about one pod. Sandboxes newest first; containers newest
/// first per name, as kubelet sorts them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RuntimePodStatus {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub sandboxes: Vec<SandboxStatus>,
    pub containers: Vec<ContainerStatus>,
}

impl RuntimePodStatus {
    /// The newest status of the container with this name.
    pub fn container(&self, name: &str) -> Option<&ContainerStatus> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// The newest sandbox, if any.
    pub fn newest_sandbox(&self) -> Option<&SandboxStatus> {
        self.sandboxes.first()
    }

    /// Sorts into the order the core relies on: newest first, ties broken by ID so the
    /// order never depends on what order the runtime listed them in.
    pub fn normalize(&mut self) {
        self.sandboxes.sort_by(|a, b| {
            b.created_at
                .cmp(&a.created_at)
                .then_with(|| a.id.cmp(&b.id))
        });
        self.containers.sort_by(|a, b| {
            a.name
                .cmp(&b.name)
                .then_with(|| b.created_at.cmp(&a.created_at))
                .then_with(|| a.id.cmp(&b.id))
        });
    }
}
