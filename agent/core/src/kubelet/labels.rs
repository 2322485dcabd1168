//! The label keys kubelet puts on sandboxes and containers, and podlapse's own: the
//! vocabulary that ties runtime objects back to pods. The agent's `kuberuntime::labels`
//! builds the label maps from them.

pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const CONTAINER_TERMINATION_MESSAGE_PATH: &str =
    "io.kubernetes.container.terminationMessagePath";
pub const CONTAINER_TERMINATION_MESSAGE_POLICY: &str =
    "io.kubernetes.container.terminationMessagePolicy";
pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Marks runtime objects podlapse created; housekeeping only ever touches these.
pub const MANAGED_BY: &str = "io.podlapse.managed-by";
pub const MANAGED_BY_VALUE: &str = "podlapse";
/// The node (agent) that owns a runtime object: housekeeping of one agent never touches
/// another's pods on a shared runtime.
pub const NODE: &str = "io.podlapse.node";
