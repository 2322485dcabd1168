//! Loading the probes: check the node can run them, resolve struct offsets, load the
//! object with its globals and ring-buffer size, fill the filter maps, attach every
//! program, and start the ring-buffer reader.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aya::maps::{Array, MapData, PerCpuArray, RingBuf};
use aya::programs::TracePoint;
use aya::{Ebpf, EbpfLoader};
use podlapse_ebpf_common::{
    EventKind, MAX_CGROUP_PREFIXES, NODE_PROCESSES_ON, PID_MAX_LIMIT, PREFIX_LEN, Prefix, names,
};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::btf::{KernelOffsets, VMLINUX_BTF};
use super::cni_output_gate::CniOutputGate;
use super::error::{DENIED, DENIED_LOAD, EbpfError, permission_error, privilege_needed_here};
use super::event::kind_name;
use super::netns_gate::NetnsGate;
use super::netns_hooks::{NetnsHookChoice, NetnsHooks, attach_functions};
use super::object::ProbesObject;
use super::pace::{POLL_PERIOD, ReadPace};
use super::reader::{EventReceiver, ReaderStats, channel, read_events};
use super::tracepoints::Tracefs;
use super::write_hooks;

/// Where tracefs may be mounted, in the order aya looks.
pub const TRACEFS_MOUNTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Default ring buffer: room for ~500 of the largest events (CNI execs). A hundred pods
/// created and removed at once on a cgroup v1 node are about 26,000 events (~250 bytes
/// each) over some 20 s, a few hundred KiB a second. The reader drains it every 10 ms
/// (`pace::POLL_PERIOD`; up to 80 ms while it stays empty) and is woken early at each
/// eighth (64 KiB) of unread data, which leaves seven eighths as headroom while it gets
/// scheduled. Its pages are the kernel's, and the reader maps them twice (the ring wraps
/// through a second mapping), so each KiB here is two of the agent's resident memory once
/// the ring has gone round: 1 MiB cost 2 MiB of RSS for headroom no workload here used.
pub const DEFAULT_RINGBUF_BYTES: u32 = 1 << 19;
/// podlapse's and kubelet's pod cgroups as the cgroupfs driver and as the systemd driver
/// name them (a prefix matches whole path components), and containerd's own namespace.
pub const DEFAULT_CGROUP_PREFIXES: [&str; 5] = [
    "/podlapse",
    "/podlapse.slice",
    "/kubepods",
    "/kubepods.slice",
    "/k8s.io",
];
/// The CNI plugins' conventional directory, when the runtime does not say its own.
pub const DEFAULT_CNI_BIN_DIR: &str = "/opt/cni/bin/";

/// One program of the object: its name and the tracepoint it attaches to.
pub(super) struct ProgramSpec {
    pub(super) program: &'static str,
    pub(super) category: &'static str,
    pub(super) tracepoint: &'static str,
    need: Need,
}

/// Whether a program must attach for the probes to run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Need {
    /// The load fails without it.
    Required,
    /// Required, and a syscall tracepoint: attached at load, or with
    /// [`NetnsAttach::OnDemand`] only while the gate is held.
    Netns,
    /// Attached only with [`ProbeConfig::clone_netns`], with the namespace programs; if
    /// it cannot attach, it is skipped with a reason instead of failing the load.
    CloneNetns,
}

/// When the network-namespace programs (syscall tracepoints) are attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NetnsAttach {
    /// From load to stop, as `kernel-events` runs them.
    #[default]
    Always,
    /// Loaded and verified at start, attached only while a [`NetnsGate`] hold is taken
    /// (the agent takes one around the CRI calls that create or enter pod namespaces).
    /// The execs and exits of the node's own processes are reported only then too, as
    /// context around pod work: between those calls the probes drop them in the kernel
    /// and report only what they tie to pods, the runtime and CNI plugins.
    OnDemand,
}

const fn spec(program: &'static str, category: &'static str, need: Need) -> ProgramSpec {
    ProgramSpec {
        program,
        category,
        tracepoint: program,
        need,
    }
}

const PROGRAMS: &[ProgramSpec] = &[
    spec("sched_process_exec", "sched", Need::Required),
    spec("sched_process_exit", "sched", Need::Required),
    spec("cgroup_mkdir", "cgroup", Need::Required),
    spec("cgroup_rmdir", "cgroup", Need::Required),
    spec("cgroup_attach_task", "cgroup", Need::Required),
    spec("sys_enter_unshare", "syscalls", Need::Netns),
    spec("sys_exit_unshare", "syscalls", Need::Netns),
    spec("sys_enter_setns", "syscalls", Need::Netns),
    spec("sys_exit_setns", "syscalls", Need::Netns),
    spec("sys_enter_clone", "syscalls", Need::CloneNetns),
    spec("sys_exit_clone", "syscalls", Need::CloneNetns),
    spec("sys_enter_clone3", "syscalls", Need::CloneNetns),
    spec("sys_exit_clone3", "syscalls", Need::CloneNetns),
    spec("sched_process_fork", "sched", Need::CloneNetns),
];

/// What to load and how to filter.
pub struct ProbeConfig {
    pub object: ProbesObject,
    /// Size of the ring buffer: a power of two, at least one page.
    pub ringbuf_bytes: u32,
    /// Cgroup path prefixes whose cgroup events are kept (matched per path component).
    pub cgroup_prefixes: Vec<String>,
    /// The directory whose executables are CNI plugins.
    pub cni_bin_dir: String,
    /// Decoded events buffered between the reader and the consumer (the reader holds
    /// up to one more batch while it waits for room).
    pub channel_capacity: usize,
    /// Where the probes' own diagnostics (aya-log) go; `None` leaves them unread.
    pub ebpf_log: Option<Box<dyn log::Log>>,
    /// Also report network namespaces created by clone/clone3 with `CLONE_NEWNET`.
    /// Off by default: containerd creates a pod's netns with unshare and runc and the
    /// CNI plugins enter it with setns, while clone runs in every fork on the node, and
    /// with its tracepoints enabled every fork pays for them.
    pub clone_netns: bool,
    /// When the network-namespace programs are attached. Only the syscall tracepoints
    /// are held back: kernel-function hooks cost nothing while nothing calls them, so
    /// they are attached from the start.
    pub netns_attach: NetnsAttach,
    /// Which hooks feed the network-namespace events.
    pub netns_hooks: NetnsHookChoice,
    /// Report the node's own processes' execs and exits as context around pod work:
    /// always with [`NetnsAttach::Always`], while the gate is held with
    /// [`NetnsAttach::OnDemand`]. Off: never; the probes drop them in the kernel.
    pub node_processes: bool,
    /// Whether the exec or exit of a process of pod work wakes the reader at once (for
    /// the agent, which shows a container running or terminated as soon as it reads
    /// it). Off: such events wait for the reader's next drain like the rest.
    pub wake_for_pod_work: bool,
    /// How often the reader drains the ring while events flow (it backs off to eight
    /// times this while the ring stays empty).
    pub read_period: Duration,
    /// Capture what CNI plugins print (their result or error): a write hook attached
    /// while a plugin runs ([`CniOutputGate`]).
    pub cni_output: bool,
}

impl ProbeConfig {
    pub fn new(object: ProbesObject) -> ProbeConfig {
        ProbeConfig {
            object,
            ringbuf_bytes: DEFAULT_RINGBUF_BYTES,
            cgroup_prefixes: DEFAULT_CGROUP_PREFIXES.map(String::from).to_vec(),
            cni_bin_dir: DEFAULT_CNI_BIN_DIR.to_string(),
            channel_capacity: 16 * 1024,
            ebpf_log: None,
            clone_netns: false,
            netns_attach: NetnsAttach::Always,
            netns_hooks: NetnsHookChoice::Auto,
            node_processes: true,
            wake_for_pod_work: true,
            read_period: POLL_PERIOD,
            cni_output: true,
        }
    }
}

/// Events the kernel dropped because the ring buffer was full, summed over CPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct LostEvents {
    pub total: u64,
    /// Only kinds with losses.
    pub by_kind: BTreeMap<&'static str, u64>,
}

/// The end of a run of the probes.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ProbeSummary {
    /// Events decoded and handed to the channel.
    pub events: u64,
    /// Records that did not decode (a probes object from another podlapse).
    pub undecodable: u64,
    pub lost: LostEvents,
}

/// One program's cost as the kernel counts it: both counters stay zero unless the kernel's
/// BPF statistics are enabled (`kernel.bpf_stats_enabled`, or `BPF_ENABLE_STATS`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ProgramStats {
    pub program: &'static str,
    /// Time spent running the program, summed over its runs.
    pub run_time_ns: u64,
    /// How many times it ran.
    pub run_count: u64,
    /// Instructions the verifier processed to load it (its load cost, counted by the
    /// kernel since 5.16 whatever the statistics setting); `None` on older kernels.
    pub verified_insns: Option<u32>,
}

/// Loaded and attached probes. Dropping it detaches them; [`KernelProbes::stop`] also
/// drains what is left in the ring buffer and reports the losses.
pub struct KernelProbes {
    // Owns the programs and their links: the probes stay attached while it lives.
    ebpf: Arc<Mutex<Ebpf>>,
    /// The namespace programs, when they attach on demand.
    gate: Option<NetnsGate>,
    /// The write hook that captures CNI plugins' output, attached while they run.
    cni_gate: Option<CniOutputGate>,
    /// Why there is none.
    cni_output_off: Option<String>,
    lost: PerCpuArray<MapData, u64>,
    stop: Option<oneshot::Sender<()>>,
    reader: Option<JoinHandle<Result<ReaderStats, EbpfError>>>,
    attached: Vec<&'static str>,
    skipped: Vec<(&'static str, String)>,
    netns_hooks: NetnsHooks,
    offsets: KernelOffsets,
    object: ProbesObject,
    ringbuf_bytes: u32,
    pace: ReadPace,
}

impl KernelProbes {
    /// Loads and attaches the probes and starts reading. Must run inside a tokio
    /// runtime. The receiver yields events in ring-buffer order.
    pub fn start(mut config: ProbeConfig) -> Result<(KernelProbes, EventReceiver), EbpfError> {
        let release = std::fs::read_to_string(OSRELEASE).unwrap_or_default();
        let tracefs = Tracefs::new(find_tracefs()?, &release);
        check_ringbuf_kernel(&release)?;
        // Before 5.11 the kernel charges maps to RLIMIT_MEMLOCK (8 MiB by default under
        // systemd), far less than the probes' maps: raised, as libbpf does.
        let memlock = raise_memlock_limit();
        let offsets = KernelOffsets::from_btf_file(Path::new(VMLINUX_BTF))?;
        check_ringbuf_size(config.ringbuf_bytes)?;
        let cgroup_prefixes = cgroup_prefixes(&config.cgroup_prefixes)?;
        let cni_bin_dir = cni_bin_dir(&config.cni_bin_dir)?;
        let path = config.object.path.clone();
        let data = config.object.bytes().map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                EbpfError::ObjectMissing {
                    path: path.clone(),
                    source_of_path: config.object.source,
                }
            } else {
                EbpfError::ObjectUnreadable {
                    path: path.clone(),
                    source,
                }
            }
        })?;

        let mut ebpf = EbpfLoader::new()
            .set_global(names::TASK_NSPROXY_OFFSET, &offsets.task_nsproxy, true)
            .set_global(names::NSPROXY_NET_NS_OFFSET, &offsets.nsproxy_net_ns, true)
            .set_global(names::NET_INUM_OFFSET, &offsets.net_inum, true)
            // Optional: an object built before kernel-function hooks has no such global.
            .set_global(names::NS_COMMON_INUM_OFFSET, &offsets.ns_common_inum, false)
            .set_global(names::TASK_EXIT_CODE_OFFSET, &offsets.task_exit_code, true)
            // Optional: an object built before exec events carried the parent has no
            // such globals, and its events simply report no parent.
            .set_global(
                names::TASK_REAL_PARENT_OFFSET,
                &offsets.task_real_parent,
                false,
            )
            .set_global(names::TASK_TGID_OFFSET, &offsets.task_tgid, false)
            .set_global(names::TASK_MM_OFFSET, &offsets.task_mm, true)
            .set_global(names::MM_START_STACK_OFFSET, &offsets.mm_start_stack, true)
            .set_global(names::MM_ARG_START_OFFSET, &offsets.mm_arg_start, true)
            .set_global(names::MM_ARG_END_OFFSET, &offsets.mm_arg_end, true)
            // Optional like the parent's: an older object reports no fork times.
            .set_global(
                names::TASK_START_TIME_OFFSET,
                &offsets.task_start_time,
                false,
            )
            // Optional too: without it the probes read the comm through the helper.
            .set_global(names::TASK_COMM_OFFSET, &offsets.task_comm, false)
            // Optional: an older object always wakes for pod work.
            .set_global(
                names::WAKE_FOR_POD_WORK,
                &u32::from(config.wake_for_pod_work),
                false,
            )
            // Optional: an older object has no capture to wake the reader for.
            .set_global(names::WAKE_FOR_CNI, &u32::from(config.cni_output), false)
            .set_max_entries(names::EVENTS, config.ringbuf_bytes)
            .set_max_entries(names::TRACKED, tracked_entries(read_pid_max()))
            .load(&data)
            .map_err(|source| match permission_error(&source, DENIED) {
                Some(denied) => EbpfError::NotPermitted {
                    doing: format!("loading {} (creating its maps)", path.display()),
                    source: denied,
                    needs: match (&memlock, charges_memlock(&release)) {
                        (Err(e), true) => format!(
                            "kernel {} charges BPF maps to RLIMIT_MEMLOCK, which could not be raised ({e}): raise it (LimitMEMLOCK=infinity, or CAP_SYS_RESOURCE), or {}",
                            release.trim(),
                            privilege_needed_here(false)
                        ),
                        _ => privilege_needed_here(false),
                    },
                },
                None => EbpfError::Load {
                    path: path.clone(),
                    source: Box::new(source),
                },
            })?;

        write_filters(&mut ebpf, &cgroup_prefixes, &cni_bin_dir)?;
        // With the gate, the node's own processes are reported only while it is held.
        set_node_processes(
            &mut ebpf,
            config.node_processes && config.netns_attach == NetnsAttach::Always,
        )?;
        if let Some(logger) = config.ebpf_log.take() {
            aya_log::EbpfLogger::init_with_logger(&mut ebpf, logger).map_err(|source| {
                EbpfError::Log {
                    source: Box::new(source),
                }
            })?;
        }
        let Attached {
            attached,
            skipped,
            gated,
            netns_hooks,
        } = attach_all(&mut ebpf, &path, &tracefs, &config, &offsets)?;

        let write_hook = if config.cni_output {
            write_hooks::choose(&mut ebpf)
        } else {
            Err("not asked for".to_string())
        };
        match &write_hook {
            Ok(hook) => {
                tracing::info!("CNI plugins' output from a {hook}, attached while they run")
            }
            Err(why) => tracing::info!("CNI plugins' output not captured: {why}"),
        }

        let ring = take_map(&mut ebpf, names::EVENTS, RingBuf::try_from)?;
        let lost = take_map(&mut ebpf, names::LOST, PerCpuArray::try_from)?;
        let (tx, rx) = channel(config.channel_capacity);
        let (stop_tx, stop_rx) = oneshot::channel();
        let pace = ReadPace::with_period(config.read_period);
        let ebpf = Arc::new(Mutex::new(ebpf));
        let (cni_gate, cni_output_off) = match write_hook {
            Ok(hook) => (
                Some(CniOutputGate::new(ebpf.clone(), hook, tx.injector())),
                None,
            ),
            Err(why) => (None, Some(why)),
        };
        // On the event thread: a ring that turned readable is drained at once, whatever
        // the rest of the agent is doing.
        let reader = crate::event_thread::spawn(read_events(
            ring,
            tx,
            stop_rx,
            pace.clone(),
            cni_gate.clone(),
        ));
        let gate = (config.netns_attach == NetnsAttach::OnDemand)
            .then(|| NetnsGate::new(ebpf.clone(), gated, config.node_processes));
        Ok((
            KernelProbes {
                ebpf,
                gate,
                cni_gate,
                cni_output_off,
                lost,
                stop: Some(stop_tx),
                reader: Some(reader),
                attached,
                skipped,
                netns_hooks,
                offsets,
                object: config.object.clone(),
                ringbuf_bytes: config.ringbuf_bytes,
                pace,
            },
            rx,
        ))
    }

    /// How often the reader drains the ring: hurry it while waiting for an event that
    /// must be seen at once.
    pub fn pace(&self) -> ReadPace {
        self.pace.clone()
    }

    /// Programs attached from the start, by name.
    pub fn attached(&self) -> &[&'static str] {
        &self.attached
    }

    /// The gate over the namespace programs, when they attach on demand.
    pub fn netns_gate(&self) -> Option<NetnsGate> {
        self.gate.clone()
    }

    /// The gate over the write hook that captures CNI plugins' output, if it loaded.
    pub fn cni_output_gate(&self) -> Option<CniOutputGate> {
        self.cni_gate.clone()
    }

    /// Why CNI plugins' output is not captured, when it is not.
    pub fn cni_output_off(&self) -> Option<&str> {
        self.cni_output_off.as_deref()
    }

    /// Which hooks feed the network-namespace events.
    pub fn netns_hooks(&self) -> &NetnsHooks {
        &self.netns_hooks
    }

    /// Optional programs that could not attach, with why.
    pub fn skipped(&self) -> &[(&'static str, String)] {
        &self.skipped
    }

    pub fn offsets(&self) -> KernelOffsets {
        self.offsets
    }

    pub fn object(&self) -> &ProbesObject {
        &self.object
    }

    pub fn ringbuf_bytes(&self) -> u32 {
        self.ringbuf_bytes
    }

    /// Events lost so far: failed ring-buffer reservations, summed over CPUs.
    pub fn lost(&self) -> Result<LostEvents, EbpfError> {
        let mut lost = LostEvents::default();
        for kind in EventKind::ALL {
            let per_cpu = self
                .lost
                .get(&(kind as u32), 0)
                .map_err(|source| EbpfError::Map {
                    map: names::LOST,
                    source: Box::new(source),
                })?;
            let n: u64 = per_cpu.iter().sum();
            if n > 0 {
                lost.by_kind.insert(kind_name(kind), n);
                lost.total += n;
            }
        }
        Ok(lost)
    }

    /// Each program's run time and run count so far: those attached from the start, in
    /// attach order, then those behind the gate.
    pub fn program_stats(&self) -> Result<Vec<ProgramStats>, EbpfError> {
        let mut gated = self
            .gate
            .as_ref()
            .map(NetnsGate::programs)
            .unwrap_or_default();
        if let Some(cni) = &self.cni_gate {
            gated.push(write_hooks::program(&cni.hook()));
        }
        let ebpf = self.ebpf.lock().unwrap_or_else(|e| e.into_inner());
        self.attached
            .iter()
            .chain(gated.iter())
            .map(|&program| {
                let info = ebpf
                    .program(program)
                    .ok_or_else(|| EbpfError::ProgramMissing {
                        program,
                        path: self.object.path.clone(),
                        reason: "not in the object".to_string(),
                    })?
                    .info()
                    .map_err(|source| EbpfError::ProgramInfo {
                        program,
                        source: Box::new(source),
                    })?;
                Ok(ProgramStats {
                    program,
                    run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
                    run_count: info.run_count(),
                    verified_insns: info.verified_instruction_count(),
                })
            })
            .collect()
    }

    /// Stops reading after draining what the ring buffer holds, and reports the run.
    /// The probes detach when this returns. The drain sends into the channel: keep
    /// receiving while this runs (or drop the receiver), or a full channel stalls it.
    pub async fn stop(mut self) -> Result<ProbeSummary, EbpfError> {
        // While the stream is open, so the trace ends on the hook's detach.
        if let Some(gate) = self.cni_output_gate() {
            gate.detach("the probes are stopping");
        }
        if let Some(stop) = self.stop.take() {
            // The reader may already have ended (its receiver dropped): nothing to tell.
            let _ = stop.send(());
        }
        let stats = match self.reader.take() {
            Some(reader) => reader.await.unwrap_or_else(|e| {
                // The reader does not panic; if the runtime cancelled it, it read
                // nothing more.
                tracing::warn!("kernel event reader ended abnormally: {e}");
                Ok(ReaderStats::default())
            })?,
            None => ReaderStats::default(),
        };
        Ok(ProbeSummary {
            events: stats.events,
            undecodable: stats.undecodable,
            lost: self.lost()?,
        })
    }
}

impl Drop for KernelProbes {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The tracefs mount aya will attach through, or what was looked for.
pub fn find_tracefs() -> Result<PathBuf, EbpfError> {
    TRACEFS_MOUNTS
        .iter()
        .map(Path::new)
        .find(|m| m.join("events").is_dir())
        .map(Path::to_path_buf)
        .ok_or_else(|| EbpfError::TracefsMissing {
            looked: TRACEFS_MOUNTS.iter().map(PathBuf::from).collect(),
        })
}

/// Where the kernel says its release.
const OSRELEASE: &str = "/proc/sys/kernel/osrelease";
/// The first kernel with `BPF_MAP_TYPE_RINGBUF`.
const RINGBUF_SINCE: (u32, u32) = (5, 8);

/// Refuses a kernel older than the ring buffer with one clear line, before loading an
/// object whose map the kernel would reject with a bare EINVAL. A release that does not
/// parse is let through: the load then says what the kernel thinks.
fn check_ringbuf_kernel(release: &str) -> Result<(), EbpfError> {
    if older_than(release, RINGBUF_SINCE) {
        return Err(EbpfError::NoRingBuffer {
            release: release.trim().to_string(),
        });
    }
    Ok(())
}

/// Whether kernel `release` charges BPF maps to RLIMIT_MEMLOCK: before 5.11, which moved
/// them to the memory cgroup.
fn charges_memlock(release: &str) -> bool {
    older_than(release, (5, 11))
}

/// Whether kernel `release` (`5.10.0-32-cloud-amd64`) is older than `(major, minor)`. An
/// unparsable release is taken as a newer kernel.
fn older_than(release: &str, version: (u32, u32)) -> bool {
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u32>);
    matches!(
        (parts.next(), parts.next()),
        (Some(Ok(major)), Some(Ok(minor))) if (major, minor) < version
    )
}

/// Lifts RLIMIT_MEMLOCK to unlimited for this process (a no-op where it already is).
/// Harmless on kernels that no longer charge maps to it; on those that do (5.10: Amazon
/// Linux 2, Debian 11) the probes' maps do not fit in the default 8 MiB. Without
/// CAP_SYS_RESOURCE the hard limit stays where it is: the soft one is raised to it, and
/// the refusal is returned.
fn raise_memlock_limit() -> std::io::Result<()> {
    let now = memlock_limit()?;
    if now.rlim_cur == libc::RLIM_INFINITY {
        return Ok(());
    }
    let set = |cur, max| {
        let limit = libc::rlimit {
            rlim_cur: cur,
            rlim_max: max,
        };
        // SAFETY: setrlimit reads the rlimit passed by reference.
        if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    set(libc::RLIM_INFINITY, libc::RLIM_INFINITY).or_else(|refused| {
        if now.rlim_cur < now.rlim_max {
            set(now.rlim_max, now.rlim_max)?;
        }
        Err(refused)
    })
}

fn memlock_limit() -> std::io::Result<libc::rlimit> {
    let mut now = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the rlimit passed by reference.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut now) } == 0 {
        Ok(now)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A BPF ring buffer's size must be a power of two and a multiple of the page size.
pub fn check_ringbuf_size(bytes: u32) -> Result<(), EbpfError> {
    let page = page_size();
    if bytes < page || !bytes.is_power_of_two() {
        return Err(EbpfError::RingBufSize { bytes, page });
    }
    Ok(())
}

fn page_size() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(n).unwrap_or(4096)
}

/// The filter entries for the configured cgroup prefixes. A trailing `/` is dropped:
/// matching is per path component already.
pub fn cgroup_prefixes(prefixes: &[String]) -> Result<Vec<Prefix>, EbpfError> {
    if prefixes.len() > MAX_CGROUP_PREFIXES as usize {
        return Err(EbpfError::TooManyPrefixes {
            count: prefixes.len(),
            max: MAX_CGROUP_PREFIXES,
        });
    }
    prefixes
        .iter()
        .map(|p| {
            let trimmed = match p.trim_end_matches('/') {
                "" => "/",
                t => t,
            };
            Prefix::new(trimmed.as_bytes()).ok_or_else(|| EbpfError::FilterTooLong {
                what: "cgroup prefix",
                value: p.clone(),
                max: PREFIX_LEN,
            })
        })
        .collect()
}

/// The filter entry for the CNI plugin directory, with the trailing `/` that makes it
/// match the files inside it only.
pub fn cni_bin_dir(dir: &str) -> Result<Prefix, EbpfError> {
    let with_slash = format!("{}/", dir.trim_end_matches('/'));
    Prefix::new(with_slash.as_bytes()).ok_or_else(|| EbpfError::FilterTooLong {
        what: "CNI bin dir",
        value: dir.to_string(),
        max: PREFIX_LEN,
    })
}

fn write_filters(
    ebpf: &mut Ebpf,
    cgroup_prefixes: &[Prefix],
    cni_bin_dir: &Prefix,
) -> Result<(), EbpfError> {
    let map_err = |map| {
        move |source| EbpfError::Map {
            map,
            source: Box::new(source),
        }
    };
    let mut prefixes: Array<_, Prefix> = Array::try_from(
        ebpf.map_mut(names::CGROUP_PREFIXES)
            .ok_or(aya::maps::MapError::InvalidName {
                name: names::CGROUP_PREFIXES.to_string(),
            })
            .map_err(map_err(names::CGROUP_PREFIXES))?,
    )
    .map_err(map_err(names::CGROUP_PREFIXES))?;
    for (i, p) in cgroup_prefixes.iter().enumerate() {
        prefixes
            .set(i as u32, p, 0)
            .map_err(map_err(names::CGROUP_PREFIXES))?;
    }
    let mut dir: Array<_, Prefix> = Array::try_from(
        ebpf.map_mut(names::CNI_BIN_DIR)
            .ok_or(aya::maps::MapError::InvalidName {
                name: names::CNI_BIN_DIR.to_string(),
            })
            .map_err(map_err(names::CNI_BIN_DIR))?,
    )
    .map_err(map_err(names::CNI_BIN_DIR))?;
    dir.set(0, cni_bin_dir, 0)
        .map_err(map_err(names::CNI_BIN_DIR))?;
    Ok(())
}

/// The node's `pid_max`, when it can be read.
fn read_pid_max() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Entries of the probes' tracked-process map (a byte per process ID): every ID the
/// node can hand out. Unknown `pid_max`: the kernel's limit, so no ID falls outside
/// (an ID beyond the map is reported rather than filtered, at a cost, not a loss).
fn tracked_entries(pid_max: Option<u32>) -> u32 {
    pid_max.map_or(PID_MAX_LIMIT, |n| n.clamp(1, PID_MAX_LIMIT))
}

/// Whether the execs and exits of the node's own processes (neither in a pod's cgroup
/// nor the runtime's, a CNI plugin's or what they exec) reach the ring buffer.
pub(super) fn set_node_processes(ebpf: &mut Ebpf, on: bool) -> Result<(), EbpfError> {
    let map_err = |source| EbpfError::Map {
        map: names::NODE_PROCESSES,
        source: Box::new(source),
    };
    let mut flag: Array<_, u32> = Array::try_from(
        ebpf.map_mut(names::NODE_PROCESSES)
            .ok_or(aya::maps::MapError::InvalidName {
                name: names::NODE_PROCESSES.to_string(),
            })
            .map_err(map_err)?,
    )
    .map_err(map_err)?;
    flag.set(0, if on { NODE_PROCESSES_ON } else { 0 }, 0)
        .map_err(map_err)
}

/// What [`attach_all`] attached, skipped and left for the gate.
struct Attached {
    attached: Vec<&'static str>,
    skipped: Vec<(&'static str, String)>,
    gated: Vec<&'static ProgramSpec>,
    netns_hooks: NetnsHooks,
}

/// Loads every program and attaches those that run from the start: the namespace
/// programs are the kernel-function hooks where they attach (and are wanted), else the
/// syscall tracepoints. With [`NetnsAttach::OnDemand`], those tracepoints are loaded (so
/// the verifier has accepted them) and returned for the gate instead.
fn attach_all(
    ebpf: &mut Ebpf,
    path: &Path,
    tracefs: &Tracefs,
    config: &ProbeConfig,
    offsets: &KernelOffsets,
) -> Result<Attached, EbpfError> {
    let mut attached = Vec::new();
    let mut skipped = Vec::new();
    let mut gated = Vec::new();
    let netns_hooks = match config.netns_hooks {
        NetnsHookChoice::SyscallTracepoints => NetnsHooks::SyscallTracepoints { why: None },
        // Without the inode of the namespace being entered, a setns from the kernel
        // function could not be tied to its pod; the tracepoints read it another way.
        choice if offsets.ns_common_inum == 0 => {
            let why = "the kernel's BTF has no ns_common.inum".to_string();
            if choice == NetnsHookChoice::KernelFunctions {
                return Err(EbpfError::NetnsFunctions { why });
            }
            NetnsHooks::SyscallTracepoints { why: Some(why) }
        }
        choice => match attach_functions(ebpf) {
            Ok(programs) => {
                attached.extend(programs);
                NetnsHooks::KernelFunctions
            }
            Err(why) if choice == NetnsHookChoice::Auto => {
                NetnsHooks::SyscallTracepoints { why: Some(why) }
            }
            Err(why) => return Err(EbpfError::NetnsFunctions { why }),
        },
    };
    tracing::info!("network namespace events from {netns_hooks}");
    for spec in PROGRAMS {
        let optional = match spec.need {
            Need::Netns if netns_hooks == NetnsHooks::KernelFunctions => continue,
            Need::Required | Need::Netns => false,
            Need::CloneNetns if !config.clone_netns => continue,
            Need::CloneNetns => true,
        };
        let on_demand = config.netns_attach == NetnsAttach::OnDemand && spec.need != Need::Required;
        match attach_one(ebpf, path, tracefs, spec, !on_demand) {
            Ok(()) if on_demand => gated.push(spec),
            Ok(()) => attached.push(spec.program),
            Err(e) if optional && !matches!(e, EbpfError::NotPermitted { .. }) => {
                skipped.push((spec.program, e.to_string()));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Attached {
        attached,
        skipped,
        gated,
        netns_hooks,
    })
}

/// Loads `spec`'s program and, with `attach`, attaches it: first of all, its tracepoint
/// must be on this kernel.
fn attach_one(
    ebpf: &mut Ebpf,
    path: &Path,
    tracefs: &Tracefs,
    spec: &ProgramSpec,
    attach: bool,
) -> Result<(), EbpfError> {
    tracefs.check(spec.program, spec.category, spec.tracepoint)?;
    let missing = |reason: String| EbpfError::ProgramMissing {
        program: spec.program,
        path: path.to_path_buf(),
        reason,
    };
    let program: &mut TracePoint = ebpf
        .program_mut(spec.program)
        .ok_or_else(|| missing("not in the object".to_string()))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| missing(e.to_string()))?;
    program
        .load()
        .map_err(|source| match permission_error(&source, DENIED_LOAD) {
            Some(denied) => EbpfError::NotPermitted {
                doing: format!("loading program {}", spec.program),
                source: denied,
                needs: privilege_needed_here(false),
            },
            None => EbpfError::ProgramLoad {
                program: spec.program,
                category: spec.category,
                tracepoint: spec.tracepoint,
                source: Box::new(source),
            },
        })?;
    if !attach {
        return Ok(());
    }
    program
        .attach(spec.category, spec.tracepoint)
        .map_err(|source| match permission_error(&source, DENIED) {
            Some(denied) => EbpfError::NotPermitted {
                doing: format!(
                    "attaching {} to tracepoint {}:{}",
                    spec.program, spec.category, spec.tracepoint
                ),
                source: denied,
                needs: privilege_needed_here(true),
            },
            None => EbpfError::Attach {
                program: spec.program,
                category: spec.category,
                tracepoint: spec.tracepoint,
                source: Box::new(source),
            },
        })?;
    Ok(())
}

fn take_map<T>(
    ebpf: &mut Ebpf,
    name: &'static str,
    convert: impl FnOnce(aya::maps::Map) -> Result<T, aya::maps::MapError>,
) -> Result<T, EbpfError> {
    let map = ebpf.take_map(name).ok_or_else(|| EbpfError::Map {
        map: name,
        source: Box::new(aya::maps::MapError::InvalidName {
            name: name.to_string(),
        }),
    })?;
    convert(map).map_err(|source| EbpfError::Map {
        map: name,
        source: Box::new(source),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_before_5_11_charge_maps_to_the_memlock_limit() {
        assert!(charges_memlock("5.10.0-32-cloud-amd64"));
        assert!(charges_memlock("4.19.0"));
        assert!(!charges_memlock("5.11.0"));
        assert!(!charges_memlock("6.12.117+deb13-cloud-amd64\n"));
        assert!(!charges_memlock("weird"));
    }

    /// Unlimited where the process may (CAP_SYS_RESOURCE, or an unlimited hard limit),
    /// else the soft limit up to the hard one and the refusal returned.
    #[test]
    fn the_memlock_limit_is_raised_as_far_as_the_process_may() {
        let before = memlock_limit().unwrap();
        let raised = raise_memlock_limit();
        let after = memlock_limit().unwrap();
        match raised {
            Ok(()) => assert_eq!(after.rlim_cur, libc::RLIM_INFINITY),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
                assert_ne!(before.rlim_max, libc::RLIM_INFINITY);
                assert_eq!(
                    (after.rlim_cur, after.rlim_max),
                    (before.rlim_max, before.rlim_max)
                );
            }
        }
    }

    #[test]
    fn a_kernel_before_the_ring_buffer_is_one_line_naming_its_release() {
        for old in ["5.4.0-150-generic", "4.19.0-27-cloud-amd64", "5.7.19"] {
            let e = check_ringbuf_kernel(old).unwrap_err();
            assert!(e.is_unavailable(), "{e}");
            let line = e.to_string();
            assert!(line.contains(old) && line.contains("5.8"), "{line}");
        }
        for new in [
            "5.8.0",
            "5.10.0-32-cloud-amd64",
            "6.12.117+deb13-cloud-amd64",
            "7.2.13+deb14-cloud-amd64\n",
            "",
            "weird",
        ] {
            assert!(check_ringbuf_kernel(new).is_ok(), "{new}");
        }
    }

    #[test]
    fn ring_buffer_sizes_are_page_multiples_and_powers_of_two() {
        let page = page_size();
        assert!(check_ringbuf_size(page).is_ok());
        assert!(check_ringbuf_size(DEFAULT_RINGBUF_BYTES).is_ok());
        assert!(check_ringbuf_size(page / 2).is_err());
        assert!(check_ringbuf_size(page * 3).is_err());
    }

    #[test]
    fn the_tracked_map_covers_every_process_id_the_node_can_hand_out() {
        assert_eq!(tracked_entries(Some(32_768)), 32_768);
        assert_eq!(tracked_entries(Some(4_194_304)), PID_MAX_LIMIT);
        // Unreadable: the kernel's limit, never a map too small for the node's IDs.
        assert_eq!(tracked_entries(None), PID_MAX_LIMIT);
        assert_eq!(tracked_entries(Some(u32::MAX)), PID_MAX_LIMIT);
        assert_eq!(tracked_entries(Some(0)), 1);
    }

    #[test]
    fn filters_are_normalised_and_bounded() {
        let p = cgroup_prefixes(&["/k8s.io/".to_string(), "/".to_string()]).unwrap();
        assert_eq!(&p[0].bytes[..p[0].len as usize], b"/k8s.io");
        assert_eq!(&p[1].bytes[..p[1].len as usize], b"/");
        let many: Vec<String> = (0..9).map(|i| format!("/p{i}")).collect();
        assert!(matches!(
            cgroup_prefixes(&many),
            Err(EbpfError::TooManyPrefixes { count: 9, .. })
        ));
        let long = format!("/{}", "x".repeat(PREFIX_LEN));
        assert!(matches!(
            cgroup_prefixes(&[long]),
            Err(EbpfError::FilterTooLong { .. })
        ));
        let d = cni_bin_dir("/usr/lib/cni").unwrap();
        assert_eq!(&d.bytes[..d.len as usize], b"/usr/lib/cni/");
        let d = cni_bin_dir("/opt/cni/bin/").unwrap();
        assert_eq!(&d.bytes[..d.len as usize], b"/opt/cni/bin/");
    }

    #[test]
    fn every_required_tracepoint_is_in_the_program_table_once() {
        let mut names: Vec<_> = PROGRAMS.iter().map(|p| p.program).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n);
        for required in [
            "sched_process_exec",
            "sched_process_exit",
            "cgroup_attach_task",
            "sys_enter_unshare",
            "sys_exit_setns",
        ] {
            assert!(
                PROGRAMS
                    .iter()
                    .any(|p| p.program == required && p.need != Need::CloneNetns),
                "{required}"
            );
        }
    }
}
