//! kubelet's container manager, the pod-level part (pkg/kubelet/cm): the QoS cgroups
//! under the node's cgroup root and one cgroup per pod below them, limited by
//! [`crate::kubelet::qos::pod_resource_config`], whose path the sandbox config passes to
//! the runtime as `cgroup_parent` so runc nests the pod's containers inside it.
//!
//! ```text
//! <root>                      Guaranteed pods: <root>/pod<uid>
//! <root>/burstable            Burstable pods:  <root>/burstable/pod<uid>
//! <root>/besteffort           BestEffort pods: <root>/besteffort/pod<uid>
//! ```
//!
//! This is the shell side: it reads and writes cgroupfs. It uses the cgroupfs naming
//! (kubelet's `--cgroup-driver=cgroupfs`), which is what containerd expects when its runc
//! runtime does not set `SystemdCgroup`.

mod cgroup_name;
mod cgroupfs;
mod error;
mod layout;
mod pod_container_manager;
mod systemd;

pub use cgroup_name::{CgroupDriver, CgroupName};
pub use error::CmError;
pub use layout::{CgroupLayout, Hierarchy, MOUNTINFO, cgroup_dir};
pub use pod_container_manager::{
    BEST_EFFORT_CGROUP, BURSTABLE_CGROUP, POD_CGROUP_PREFIX, PodContainerManager,
    cpu_shares_to_weight,
};
