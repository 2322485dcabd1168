//! What can go wrong between the probes object on disk and events in a channel.

use std::io;
use std::path::PathBuf;

/// Errors of the eBPF loader and reader. [`EbpfError::is_unavailable`] separates "this
/// node cannot run the probes" (the caller may continue without kernel events) from
/// faults in podlapse or its probes.
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    /// No probes object where podlapse looked.
    #[error(
        "no eBPF probes object at {path} ({source_of_path}); build it with `cargo xtask build-ebpf`, or leave out --probes and $PODLAPSE_PROBES to use the embedded one"
    )]
    ObjectMissing {
        path: PathBuf,
        source_of_path: super::object::ObjectSource,
    },
    /// The probes object exists but could not be read.
    #[error("reading the eBPF probes object {path}: {source}")]
    ObjectUnreadable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// tracefs, where tracepoints are attached, is not mounted.
    #[error("tracefs is not mounted (looked in {})", .looked.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" and "))]
    TracefsMissing { looked: Vec<PathBuf> },
    /// The kernel is older than the BPF ring buffer the probes write into (5.8).
    #[error(
        "kernel {release} has no BPF ring buffer, which the probes write their events into (it came in 5.8)"
    )]
    NoRingBuffer { release: String },
    /// The kernel exposes no BTF, so struct offsets cannot be resolved.
    #[error("the kernel exposes no BTF at {path} (a kernel built without CONFIG_DEBUG_INFO_BTF)")]
    BtfMissing { path: PathBuf },
    /// The kernel's BTF could not be parsed.
    #[error("parsing the kernel's BTF at {path}: {source}")]
    BtfUnreadable {
        path: PathBuf,
        #[source]
        source: super::btf::BtfFormatError,
    },
    /// A struct member the probes read is not in the kernel's BTF.
    #[error("the kernel's BTF at {path} has no member `{member}` in `struct {strukt}`")]
    BtfMemberMissing {
        path: PathBuf,
        strukt: &'static str,
        member: String,
    },
    /// The kernel refused a BPF operation for lack of privilege.
    #[error("the kernel denied BPF while {doing}: {source} ({needs})")]
    NotPermitted {
        doing: String,
        #[source]
        source: io::Error,
        /// What privilege the operation needs on this kernel: [`privilege_needed`].
        needs: String,
    },
    /// The object could not be loaded (its maps, BTF or relocations).
    #[error("loading the eBPF probes object {path}: {source}")]
    Load {
        path: PathBuf,
        #[source]
        source: Box<aya::EbpfError>,
    },
    /// Kernel-function hooks were asked for and the kernel refused them.
    #[error(
        "the network namespace kernel-function hooks did not attach ({why}); leave out --netns-hooks kprobes to fall back to the syscall tracepoints"
    )]
    NetnsFunctions { why: String },
    /// A program the loader attaches is not in the object, or is not a tracepoint.
    #[error("program {program} in {path}: {reason}")]
    ProgramMissing {
        program: &'static str,
        path: PathBuf,
        reason: String,
    },
    /// The kernel's verifier rejected a program (its log is in the source).
    #[error("loading program {program} (tracepoint {category}:{tracepoint}): {source}")]
    ProgramLoad {
        program: &'static str,
        category: &'static str,
        tracepoint: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// The kernel has no tracepoint where a program attaches: it moved (another name or
    /// category) or went on this kernel.
    #[error(
        "kernel {release} has no tracepoint {category}:{tracepoint} (no {}), which program {program} attaches to{}",
        .looked.display(),
        .elsewhere.as_ref().map(|c| format!("; a tracepoint of that name is under {c}:, whose fields the program was not built for")).unwrap_or_default()
    )]
    TracepointMissing {
        program: &'static str,
        category: &'static str,
        tracepoint: &'static str,
        release: String,
        /// The directory tracefs would have for it.
        looked: PathBuf,
        /// Another category with a tracepoint of the same name, if there is one.
        elsewhere: Option<String>,
    },
    /// Attaching a program to its tracepoint failed.
    #[error("attaching program {program} to tracepoint {category}:{tracepoint}: {source}")]
    Attach {
        program: &'static str,
        category: &'static str,
        tracepoint: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// The kernel's information about a loaded program (its run-time statistics) could
    /// not be read.
    #[error("reading the kernel's information about program {program}: {source}")]
    ProgramInfo {
        program: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// A map the loader uses is missing, has another type, or could not be written.
    #[error("map {map} of the eBPF probes: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    /// A filter value does not fit its map entry.
    #[error("{what} {value:?} is empty or longer than {max} bytes")]
    FilterTooLong {
        what: &'static str,
        value: String,
        max: usize,
    },
    /// More cgroup prefixes than the filter map holds.
    #[error("{count} cgroup prefixes given; the probes hold at most {max}")]
    TooManyPrefixes { count: usize, max: u32 },
    /// The ring buffer size is not a power-of-two multiple of the page size.
    #[error(
        "ring buffer size {bytes} is not a power of two of at least the page size ({page} bytes)"
    )]
    RingBufSize { bytes: u32, page: u32 },
    /// Polling the ring buffer's file descriptor failed.
    #[error("reading the ring buffer {map}: {source}")]
    RingBufRead {
        map: &'static str,
        #[source]
        source: io::Error,
    },
    /// Starting the reader of the probes' diagnostics (aya-log) failed.
    #[error("reading the probes' log: {source}")]
    Log {
        #[source]
        source: Box<aya_log::Error>,
    },
}

impl EbpfError {
    /// True when the node cannot run the probes (no permission, no tracefs, no BTF, no
    /// object): a caller may say so once and continue without kernel events.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            EbpfError::ObjectMissing { .. }
                | EbpfError::TracefsMissing { .. }
                | EbpfError::NoRingBuffer { .. }
                | EbpfError::TracepointMissing { .. }
                | EbpfError::BtfMissing { .. }
                | EbpfError::NotPermitted { .. }
        )
    }
}

/// Errnos that mean "not permitted" for map creation and attaching. Not for program
/// loads: there the verifier answers EACCES for a program it rejects.
pub(crate) const DENIED: &[i32] = &[libc::EPERM, libc::EACCES];
/// Errnos that mean "not permitted" for a program load.
pub(crate) const DENIED_LOAD: &[i32] = &[libc::EPERM];

/// The first `io::Error` in `err`'s source chain whose errno is one of `denied`.
/// Where the kernel says how far perf_event_open(2) is restricted.
pub(crate) const PERF_EVENT_PARANOID: &str = "/proc/sys/kernel/perf_event_paranoid";

/// What a denied operation needs, on a kernel whose `kernel.perf_event_paranoid` is
/// `paranoid`. Attaching a tracepoint or a kprobe goes through perf_event_open(2); a kernel
/// with Debian's or Ubuntu's restriction (paranoid above 2) allows that to CAP_SYS_ADMIN
/// alone, whatever CAP_PERFMON says.
pub(crate) fn privilege_needed(attaching: bool, paranoid: Option<i32>) -> String {
    match paranoid {
        Some(level) if attaching && level > 2 => format!(
            "this kernel's kernel.perf_event_paranoid is {level}, which allows perf_event_open, \
             and so attaching tracepoints and kprobes, to CAP_SYS_ADMIN only: add CAP_SYS_ADMIN, \
             or set kernel.perf_event_paranoid to 2 on the node"
        ),
        _ => "needs CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN".to_string(),
    }
}

/// [`privilege_needed`] on the running kernel.
pub(crate) fn privilege_needed_here(attaching: bool) -> String {
    let paranoid = std::fs::read_to_string(PERF_EVENT_PARANOID)
        .ok()
        .and_then(|s| s.trim().parse().ok());
    privilege_needed(attaching, paranoid)
}

pub(crate) fn permission_error(
    err: &(dyn std::error::Error + 'static),
    denied: &[i32],
) -> Option<io::Error> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>()
            && io.raw_os_error().is_some_and(|n| denied.contains(&n))
        {
            return Some(io::Error::from_raw_os_error(io.raw_os_error().unwrap_or(0)));
        }
        cur = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] io::Error);

    #[test]
    fn permission_errors_are_found_down_the_chain() {
        let e = Outer(io::Error::from_raw_os_error(libc::EPERM));
        assert_eq!(
            permission_error(&e, DENIED).and_then(|e| e.raw_os_error()),
            Some(libc::EPERM)
        );
        let e = Outer(io::Error::from_raw_os_error(libc::EINVAL));
        assert!(permission_error(&e, DENIED).is_none());
        // A verifier rejection is EACCES too, and is not a missing privilege.
        let e = Outer(io::Error::from_raw_os_error(libc::EACCES));
        assert!(permission_error(&e, DENIED_LOAD).is_none());
    }

    #[test]
    fn a_denied_attach_on_a_restricted_perf_kernel_names_the_sysctl_and_sys_admin() {
        let restricted = privilege_needed(true, Some(3));
        assert!(
            restricted.contains("perf_event_paranoid is 3"),
            "{restricted}"
        );
        assert!(restricted.contains("add CAP_SYS_ADMIN"), "{restricted}");
        // Loading is not perf_event_open: CAP_BPF is what it lacked, whatever the sysctl.
        for (attaching, paranoid) in [(false, Some(3)), (true, Some(2)), (true, None)] {
            let usual = privilege_needed(attaching, paranoid);
            assert!(usual.contains("CAP_BPF and CAP_PERFMON"), "{usual}");
        }
    }

    #[test]
    fn only_node_limits_count_as_unavailable() {
        let denied = EbpfError::NotPermitted {
            doing: "creating map EVENTS".into(),
            source: io::Error::from_raw_os_error(libc::EPERM),
            needs: privilege_needed(false, Some(3)),
        };
        assert!(denied.is_unavailable());
        assert!(denied.to_string().contains("CAP_BPF"));
        let tracefs = EbpfError::TracefsMissing {
            looked: vec![
                "/sys/kernel/tracing".into(),
                "/sys/kernel/debug/tracing".into(),
            ],
        };
        assert!(tracefs.is_unavailable());
        assert!(
            tracefs
                .to_string()
                .contains("/sys/kernel/tracing and /sys/kernel/debug/tracing")
        );
        let size = EbpfError::RingBufSize {
            bytes: 1000,
            page: 4096,
        };
        assert!(!size.is_unavailable());
    }
}
