//! Integration tests against the lab `cargo xtask test` starts (and, for the modules the
//! modern-node suite names, inside its QEMU guest). Each module runs on its own, one
//! after another (`xtask/src/integration.rs`): the probe tests see every exec on the node,
//! so no other module's pods may run beside them.

/// `podlapse run` as an agent: back-off, pull recovery, edits, deletion, adoption,
/// housekeeping, hooks, readiness, liveness, invalid manifests.
mod agent;
/// Real-world-shaped manifests: the security context and namespaces the runtime applied,
/// seen from inside the container, and kubelet's refusals.
mod conformance;
/// A trace cut short by a crash or a full disk keeps what was recorded.
mod crash_safe_trace;
/// What `podlapse cri info` reads from the runtime.
mod cri_info;
/// deploy/daemonset.yaml's pod run through podlapse's kubelet pipeline from podlapse's
/// image, observing pods for a real Prometheus; loads the probes.
mod daemonset;
/// `podlapse diagnose` against the live agent: missing image, crash on start, healthy.
mod diagnose_faults;
/// gRPC liveness probes against a health server in the pod.
mod grpc_probes;
/// Loads the eBPF probes (root); the sandbox test uses the lab.
mod kernel_events;
/// Runs inside the modern node's guest (`cargo xtask node-vm test`), not on the host.
mod modern_node;
/// "Why has this pod no IP?" for the causes real nodes have: the node's CNI
/// configuration broken one way at a time, pods of another client observed; loads the
/// probes.
mod no_ip;
/// `podlapse observe` beside other CRI clients (cri-pod-client, a second podlapse); loads
/// the probes.
mod observe;
/// `podlapse observe` receiving the kubelet's own spans (the suite's client exports them
/// as a tracing kubelet does); changes the node's CNI configuration and loads the probes.
mod observe_kubelet;
/// `podlapse observe --metrics-addr`: the observed pods' stages and the live diagnosis
/// as Prometheus metrics; changes the node's CNI configuration and loads the probes.
mod observe_outputs;
/// `podlapse observe --trace-max-bytes`: a rotated trace over a few hundred pods, read
/// file by file and as one; loads the probes.
mod observe_rotation;
/// OTLP export of pod startups to a test receiver, with the runtime's spans where it
/// traces.
mod otel_export;
/// Init order, failing init, pull Never, admission, hostNetwork.
mod pipeline;
/// Exec, HTTP, TCP and sleep probes and hooks.
mod probes;
/// In-place pod resize: NotRequired, RestartContainer, infeasible.
mod resize;
/// The example pods and bad input to `podlapse run`.
mod run_pods;
/// Sidecars (restartable init containers): startup order, restarts, termination order.
mod sidecars;
/// Every output of a run carries every stage source, or says on the pod why not.
mod sources;
/// Per-pod stage timelines on the lab (loads the probes).
mod timeline;
