//! Kernel events from eBPF probes: the user-space side.
//!
//! The probes (`agent-ebpf/probes`, built by `cargo xtask build-ebpf`) attach to classic
//! tracepoints (and, for network namespaces where the kernel allows, to kernel functions:
//! [`NetnsHooks`]) and write [`podlapse_ebpf_common`] records into one ring buffer. This
//! module loads them ([`KernelProbes::start`]), resolves the kernel struct offsets they
//! need from BTF ([`btf`]), writes their filters, reads the ring buffer asynchronously
//! (every few milliseconds, every millisecond while the agent waits for an event it needs
//! at once, and at once when the probes wake the reader because much of the ring is
//! unread) and decodes each record into a [`KernelEvent`]. Events lost to a
//! full ring buffer are counted in the kernel and reported by [`KernelProbes::lost`].
//!
//! Timestamps are `bpf_ktime_get_ns()`, i.e. CLOCK_MONOTONIC: [`now_ktime_ns`] reads the
//! same clock, so CRI spans measured in user space and kernel events line up.
//!
//! A node that cannot run the probes (no permission, no tracefs, no BTF, no object)
//! yields an error whose [`EbpfError::is_unavailable`] is true: say so once and go on.

mod bpf_stats;
pub mod btf;
mod cni_output_gate;
mod error;
pub mod event;
#[cfg(test)]
mod fuzz_seeds;
mod loader;
mod netns_gate;
mod netns_hooks;
pub mod object;
mod pace;
mod reader;
mod tracepoints;
mod write_hooks;

pub use bpf_stats::{BpfStatsState, SYSCTL as BPF_STATS_SYSCTL};
pub use btf::KernelOffsets;
pub use cni_output_gate::{CNI_OUTPUT_LINGER, CniOutputGate, CniOutputHold, MAX_PLUGIN_RUN};
pub use error::EbpfError;
pub use event::{Cgroup, CniExec, Comm, DecodeError, EventMeta, KernelEvent, NetnsCall};
pub use loader::{
    DEFAULT_CGROUP_PREFIXES, DEFAULT_CNI_BIN_DIR, DEFAULT_RINGBUF_BYTES, KernelProbes, LostEvents,
    NetnsAttach, ProbeConfig, ProbeSummary, ProgramStats, find_tracefs,
};
pub use netns_gate::{NETNS_LINGER, NetnsGate, NetnsHold};
pub use netns_hooks::{NetnsHookChoice, NetnsHooks, kprobes_present};
pub use object::{ObjectSource, ProbesObject};
pub use pace::ReadPace;
pub use reader::{EventInjector, EventReceiver};
pub use write_hooks::WriteHook;

pub use crate::clock::now_ktime_ns;
