//! The layout of everything podlapse's eBPF probes and its user space exchange: the
//! events in the ring buffer, the filter entries user space writes into maps, and the
//! names of the maps and globals.
//!
//! Every event starts with an [`EventHeader`]; its `kind` says which payload struct the
//! record is. All types are `#[repr(C)]` with explicit padding, so the bytes the kernel
//! writes are the bytes user space reads, and no byte is uninitialised padding. The
//! sizes are asserted at compile time: a change here is a change to both sides.
#![no_std]

#[cfg(test)]
extern crate std;

/// Length of a task's `comm`, as the kernel's `TASK_COMM_LEN`.
pub const COMM_LEN: usize = 16;
/// Bytes kept of a path: an exec'd file, a cgroup path, a CNI plugin.
pub const PATH_LEN: usize = 256;
/// Bytes of a configured path prefix (cgroup roots, the CNI plugin directory).
pub const PREFIX_LEN: usize = 64;
/// How many cgroup path prefixes the filter map holds.
pub const MAX_CGROUP_PREFIXES: u32 = 8;
/// How many `envp` entries the CNI probe looks at before giving up. A plugin inherits
/// the runtime's whole environment with the `CNI_*` variables among it, so this must
/// exceed the runtime's environment: containerd under systemd has about ten entries, the
/// lab's (started from a shell) about seventy. The verifier walks the scan once per
/// entry at every load, so the bound is the load's cost too: at 256 the exec program
/// was 158,000 verified instructions, 0.2 s of kernel time on the host and 5.9 s in the
/// emulated modern node (`kernel-events --json` reports the count). A scan that reaches
/// the bound is flagged, and said in the trace.
pub const MAX_ENV_SCAN: u32 = 128;
/// Bytes kept of a container runtime process's arguments (`runc`, the containerd shim):
/// enough for runc's flags, bundle and pid-file paths and the container ID. A longer
/// argument list is read from its end, where runc puts the ID.
pub const ARGV_LEN: usize = 1024;

/// Bytes of a CNI plugin's standard output one [`CniOutputEvent`] carries.
pub const CNI_OUTPUT_CHUNK: usize = 256;
/// Bytes of its standard output copied per plugin process: the first ones, where its
/// result or error is. Later writes are only counted.
pub const CNI_OUTPUT_MAX: u32 = 1024;
/// Live CNI plugin processes followed at once (an LRU map: a plugin whose exit was never
/// seen ages out).
pub const MAX_CNI_PLUGINS: u32 = 1024;

/// The value of [`names::NODE_PROCESSES`] that reports every exec and exit on the node.
pub const NODE_PROCESSES_ON: u32 = 1;
/// Entries of [`names::TRACKED`] (one byte per process ID) when user space does not size
/// it to the node's `pid_max`: the kernel's default `pid_max`.
pub const DEFAULT_PID_MAX: u32 = 32_768;
/// The largest `pid_max` a 64-bit kernel allows (`PID_MAX_LIMIT`).
pub const PID_MAX_LIMIT: u32 = 4 * 1024 * 1024;
/// Entries of [`names::POD_CGROUPS`] (an LRU map too).
pub const MAX_POD_CGROUPS: u32 = 16_384;

/// `CLONE_NEWNET` from `<linux/sched.h>`.
pub const CLONE_NEWNET: u64 = 0x4000_0000;

/// Names of the maps and globals in the probes object, as user space looks them up.
pub mod names {
    /// The ring buffer every event goes through.
    pub const EVENTS: &str = "EVENTS";
    /// Per-CPU counters of failed ring-buffer reservations, indexed by event kind.
    pub const LOST: &str = "LOST";
    /// Cgroup path prefixes ([`crate::Prefix`]) whose cgroup events are kept.
    pub const CGROUP_PREFIXES: &str = "CGROUP_PREFIXES";
    /// The directory ([`crate::Prefix`], one entry) whose executables are CNI plugins.
    pub const CNI_BIN_DIR: &str = "CNI_BIN_DIR";
    /// One `u32`: non-zero while the execs and exits of the node's own processes are
    /// reported too; zero keeps only those the probes tie to pods (see
    /// [`crate::NODE_PROCESSES_ON`]).
    pub const NODE_PROCESSES: &str = "NODE_PROCESSES";
    /// Process IDs whose execs and exits are always reported: the runtime's programs,
    /// CNI plugins, and what they exec (one byte per process ID up to `pid_max`).
    pub const TRACKED: &str = "TRACKED";
    /// Cgroup v2 IDs of the cgroups created under the configured prefixes.
    pub const POD_CGROUPS: &str = "POD_CGROUPS";
    /// Byte offset of `task_struct.nsproxy`.
    pub const TASK_NSPROXY_OFFSET: &str = "TASK_NSPROXY_OFFSET";
    /// Byte offset of `nsproxy.net_ns`.
    pub const NSPROXY_NET_NS_OFFSET: &str = "NSPROXY_NET_NS_OFFSET";
    /// Byte offset of `net.ns.inum` (the netns inode) from the start of `struct net`.
    pub const NET_INUM_OFFSET: &str = "NET_INUM_OFFSET";
    /// Byte offset of `ns_common.inum`: a namespace's inode, from the `struct ns_common`
    /// the kernel hands a namespace's `install` operation.
    pub const NS_COMMON_INUM_OFFSET: &str = "NS_COMMON_INUM_OFFSET";
    /// Byte offset of `task_struct.exit_code`.
    pub const TASK_EXIT_CODE_OFFSET: &str = "TASK_EXIT_CODE_OFFSET";
    /// Byte offset of `task_struct.real_parent`.
    pub const TASK_REAL_PARENT_OFFSET: &str = "TASK_REAL_PARENT_OFFSET";
    /// Byte offset of `task_struct.tgid`.
    pub const TASK_TGID_OFFSET: &str = "TASK_TGID_OFFSET";
    /// Byte offset of `task_struct.mm`.
    pub const TASK_MM_OFFSET: &str = "TASK_MM_OFFSET";
    /// Byte offset of `mm_struct.start_stack`: where a new program's `argc` is, followed
    /// by its `argv` and `envp` pointers.
    pub const MM_START_STACK_OFFSET: &str = "MM_START_STACK_OFFSET";
    /// Byte offset of `mm_struct.arg_start`.
    pub const MM_ARG_START_OFFSET: &str = "MM_ARG_START_OFFSET";
    /// Byte offset of `mm_struct.arg_end`.
    pub const MM_ARG_END_OFFSET: &str = "MM_ARG_END_OFFSET";
    /// Byte offset of `task_struct.start_time`: when the task was forked (CLOCK_MONOTONIC
    /// ns, the clock of `bpf_ktime_get_ns`).
    pub const TASK_START_TIME_OFFSET: &str = "TASK_START_TIME_OFFSET";
    /// Byte offset of `task_struct.comm`.
    pub const TASK_COMM_OFFSET: &str = "TASK_COMM_OFFSET";
    /// Non-zero (the default): a CNI plugin's exec and a network namespace's creation
    /// wake the reader at once, so user space attaches the write hook before the plugin
    /// writes its result (whatever [`WAKE_FOR_POD_WORK`] says).
    pub const WAKE_FOR_CNI: &str = "WAKE_FOR_CNI";
    /// Live CNI plugin processes (tgid) and how much each wrote to its standard output.
    pub const CNI_PLUGINS: &str = "CNI_PLUGINS";
    /// Non-zero (the default): the exec or exit of a process of pod work wakes the
    /// reader at once. Zero: it waits for the reader's next drain like any other event,
    /// for a consumer that acts on nothing at once (`observe`).
    pub const WAKE_FOR_POD_WORK: &str = "WAKE_FOR_POD_WORK";
}

/// What an event is. The discriminant is the header's `kind` and the index into the
/// lost-event counters.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// `sched:sched_process_exec`: [`ExecEvent`].
    Exec = 1,
    /// `sched:sched_process_exit` of a thread-group leader: [`ExitEvent`].
    Exit = 2,
    /// `cgroup:cgroup_mkdir`: [`CgroupEvent`].
    CgroupMkdir = 3,
    /// `cgroup:cgroup_rmdir`: [`CgroupEvent`].
    CgroupRmdir = 4,
    /// `cgroup:cgroup_attach_task`: [`CgroupEvent`].
    CgroupAttach = 5,
    /// unshare, setns or clone with `CLONE_NEWNET`, after it returned (from the syscall
    /// tracepoints, or from the kernel functions that create and enter a network
    /// namespace): [`NetnsEvent`].
    Netns = 6,
    /// exec of a file in the CNI plugin directory: [`CniExecEvent`].
    CniExec = 7,
    /// exec of a container runtime program (runc, crun, a containerd shim):
    /// [`RuntimeExecEvent`].
    RuntimeExec = 8,
    /// A CNI plugin's write to its standard output, or the total at its exit:
    /// [`CniOutputEvent`].
    CniOutput = 9,
    /// The agent's own record of the write hook's attach and detach: never in the ring
    /// buffer, never lost (its counter stays zero).
    CniWriteHook = 10,
}

impl EventKind {
    /// One past the largest discriminant: the size of the lost-event counter array.
    pub const COUNT: u32 = 11;
    pub const ALL: [EventKind; 10] = [
        EventKind::Exec,
        EventKind::Exit,
        EventKind::CgroupMkdir,
        EventKind::CgroupRmdir,
        EventKind::CgroupAttach,
        EventKind::Netns,
        EventKind::CniExec,
        EventKind::RuntimeExec,
        EventKind::CniOutput,
        EventKind::CniWriteHook,
    ];

    pub fn from_u32(v: u32) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| *k as u32 == v)
    }
}

/// Which syscall a [`NetnsEvent`] reports.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetnsSyscall {
    Unshare = 1,
    Setns = 2,
    Clone = 3,
    Clone3 = 4,
}

impl NetnsSyscall {
    pub fn from_u32(v: u32) -> Option<NetnsSyscall> {
        [
            NetnsSyscall::Unshare,
            NetnsSyscall::Setns,
            NetnsSyscall::Clone,
            NetnsSyscall::Clone3,
        ]
        .into_iter()
        .find(|s| *s as u32 == v)
    }
}

/// The start of every record in the ring buffer.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EventHeader {
    /// An [`EventKind`] discriminant.
    pub kind: u32,
    /// The CPU the probe ran on.
    pub cpu: u32,
    /// The kernel's pid of the current task: the thread ID.
    pub pid: u32,
    /// The thread-group ID: what user space calls the process ID.
    pub tgid: u32,
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC, the clock user space reads too.
    pub ktime_ns: u64,
    /// `bpf_get_current_cgroup_id()`: the current task's cgroup in the v2 (unified)
    /// hierarchy, the ID a `cgroup_mkdir` in hierarchy 0 reports. It places an exec
    /// inside a pod's cgroup without tracking forks.
    pub cgroup_id: u64,
    /// The current task's `comm`, NUL-padded.
    pub comm: [u8; COMM_LEN],
}

/// `sched_process_exec`: a task replaced its program.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ExecEvent {
    pub header: EventHeader,
    /// The pid before the exec (differs when a non-leader thread exec'd).
    pub old_pid: u32,
    /// The process ID of the task's parent (`real_parent->tgid`); 0 when unknown. It
    /// ties a helper a CNI plugin runs (iptables under bridge) to that plugin's pod.
    pub ppid: u32,
    /// The executed file, NUL-terminated.
    pub filename: [u8; PATH_LEN],
}

/// `sched_process_exit` where pid == tgid: a process ended.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ExitEvent {
    pub header: EventHeader,
    /// `task_struct.exit_code` as `wait(2)` encodes it: status in bits 8..16, the
    /// terminating signal in bits 0..7. `i32::MIN` when the offset was unknown.
    pub exit_code: i32,
    pub _pad: u32,
}

/// `cgroup_mkdir`, `cgroup_rmdir` (the cgroup itself) and `cgroup_attach_task` (the
/// destination cgroup and the task moved into it).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CgroupEvent {
    pub header: EventHeader,
    /// The cgroup's ID (its kernfs inode number).
    pub id: u64,
    /// The hierarchy ID: cgroup v1 has one per controller, v2 is its own.
    pub root: i32,
    /// Depth below the hierarchy's root.
    pub level: i32,
    /// `cgroup_attach_task` only: the task moved, else 0.
    pub target_pid: u32,
    pub _pad: u32,
    /// `cgroup_attach_task` only: the moved task's comm.
    pub target_comm: [u8; COMM_LEN],
    /// The cgroup's path within its hierarchy, NUL-terminated.
    pub path: [u8; PATH_LEN],
}

/// A namespace syscall that asked for a network namespace, reported when it returned.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetnsEvent {
    pub header: EventHeader,
    /// `bpf_ktime_get_ns()` at syscall entry (or entry of the kernel function that
    /// reported it); the header's time is the return.
    pub start_ns: u64,
    /// The flags the syscall was given (clone flags, unshare flags, setns nstype).
    pub flags: u64,
    /// The syscall's return value: 0 or -errno (clone: the child's pid, or 0 in the
    /// child).
    pub ret: i64,
    /// A [`NetnsSyscall`] discriminant.
    pub syscall: u32,
    /// Inode of the network namespace the task is in after the call; 0 if unknown.
    pub netns_inum: u32,
    /// setns: the namespace fd; -1 otherwise, and when a kernel function reported it.
    pub fd: i32,
    /// clone, reported by the child: the thread that called clone; 0 otherwise.
    pub parent_pid: u32,
}

/// Bits of [`CniExecEvent::flags`].
pub mod cni_flags {
    /// `envp` had more entries than [`crate::MAX_ENV_SCAN`]: variables past the bound
    /// were not looked at.
    pub const ENV_TRUNCATED: u32 = 1;
    /// `envp` could not be read.
    pub const ENV_UNREADABLE: u32 = 2;
}

/// An exec (`sched_process_exec`) of a file in the CNI plugin directory, with the
/// `CNI_*` variables from the new program's environment. Values are NUL-terminated; empty when absent.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CniExecEvent {
    pub header: EventHeader,
    /// Environment entries looked at.
    pub env_scanned: u32,
    /// [`cni_flags`] bits.
    pub flags: u32,
    /// When the plugin's process was forked (the task's `start_time`, the clock of
    /// `header.ktime_ns`); 0 when unknown.
    pub forked_ns: u64,
    pub filename: [u8; PATH_LEN],
    /// `CNI_COMMAND`: ADD, DEL, CHECK, VERSION, ...
    pub command: [u8; 16],
    /// `CNI_IFNAME`.
    pub ifname: [u8; 16],
    /// `CNI_CONTAINERID`: the sandbox ID.
    pub container_id: [u8; 128],
    /// `CNI_NETNS`: the path of the sandbox's network namespace.
    pub netns: [u8; PATH_LEN],
    /// `CNI_ARGS`: `K8S_POD_NAMESPACE=..;K8S_POD_NAME=..;...`.
    pub args: [u8; PATH_LEN],
}

/// Bits of [`RuntimeExecEvent::flags`].
pub mod argv_flags {
    /// The arguments were longer than [`crate::ARGV_LEN`]: `argv` holds their end.
    pub const HEAD_CUT: u32 = 1;
    /// The arguments could not be read.
    pub const UNREADABLE: u32 = 2;
}

/// An exec (`sched_process_exec`) of a container runtime program, told by its `comm`
/// (`runc`, `crun`, `containerd-shim*`), with its arguments: runc's subcommand and
/// container ID, and the shim's `-id`, tie the process to a sandbox or container.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RuntimeExecEvent {
    pub header: EventHeader,
    /// Bytes of `argv` filled.
    pub argv_len: u32,
    /// [`argv_flags`] bits.
    pub flags: u32,
    /// When the process was forked (the task's `start_time`, the clock of
    /// `header.ktime_ns`); 0 when unknown.
    pub forked_ns: u64,
    /// The arguments as the kernel keeps them: NUL-separated, `argv[0]` first.
    pub argv: [u8; ARGV_LEN],
}

/// Bits of [`CniOutputEvent::flags`].
pub mod cni_output_flags {
    /// The bytes could not be read from the writer's memory: `copied` is 0.
    pub const UNREADABLE: u32 = 1;
    /// The plugin's process exited: no data, `offset` is everything it wrote.
    pub const END: u32 = 2;
}

/// A chunk of what a CNI plugin process (the header's tgid) wrote to fd 1, or, with
/// [`cni_output_flags::END`], its total at exit. Only the first [`CNI_OUTPUT_MAX`]
/// bytes of a process's output are copied; later writes are only counted.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CniOutputEvent {
    pub header: EventHeader,
    /// Where this chunk starts in the process's output: the bytes its earlier writes
    /// asked to write, plus this chunk's place in its write. END: the total.
    pub offset: u64,
    /// The write's `count`, all of it (0 at END).
    pub count: u64,
    /// Bytes of the output this chunk stands for, at most [`CNI_OUTPUT_CHUNK`].
    pub len: u32,
    /// Bytes of `data` filled: `len`, or 0 when unreadable.
    pub copied: u32,
    /// [`cni_output_flags`] bits.
    pub flags: u32,
    /// END: writes to fd 1 the process made.
    pub writes: u32,
    /// END: bytes copied in all.
    pub captured: u32,
    pub _pad: u32,
    pub data: [u8; CNI_OUTPUT_CHUNK],
}

/// A `comm` as the probes hold it: its 16 bytes as two native-endian words, so that
/// reading, comparing and storing it are a few word operations where a byte array costs
/// dozens of byte loads and shifts (the BPF target has no unaligned loads).
pub type CommWords = [u64; 2];

/// The words of a comm's bytes.
#[inline(always)]
pub const fn comm_words(comm: &[u8; COMM_LEN]) -> CommWords {
    let mut w0 = [0u8; 8];
    let mut w1 = [0u8; 8];
    let mut i = 0;
    while i < 8 {
        w0[i] = comm[i];
        w1[i] = comm[i + 8];
        i += 1;
    }
    [u64::from_ne_bytes(w0), u64::from_ne_bytes(w1)]
}

/// True when an exec'd program's `comm` (its file name, cut to 15 bytes) is one of the
/// container runtime's own programs whose arguments the probes read. Every exec on the
/// node runs this: two word compares.
#[inline(always)]
pub fn is_runtime_comm(comm: &CommWords) -> bool {
    let [w0, w1] = *comm;
    // "runc" or "crun" and the NUL after it: the first five bytes.
    const FIVE: u64 = u64::from_ne_bytes([0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0]);
    const RUNC: u64 = u64::from_ne_bytes(*b"runc\0\0\0\0");
    const CRUN: u64 = u64::from_ne_bytes(*b"crun\0\0\0\0");
    const SHIM0: u64 = u64::from_ne_bytes(*b"containe");
    // "rd-shim": the first seven bytes of the second word.
    const SHIM1: u64 = u64::from_ne_bytes(*b"rd-shim\0");
    const SEVEN: u64 = u64::from_ne_bytes([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]);
    w0 & FIVE == RUNC || w0 & FIVE == CRUN || (w0 == SHIM0 && w1 & SEVEN == SHIM1)
}

/// Bytes of an environment entry the CNI probe reads to tell which variable it is: the
/// longest name with its `=` is `CNI_CONTAINERID=` (16), and the string read needs one
/// byte for the NUL. Held as words, [`EnvHead`], so it is compared a word at a time.
pub const ENV_HEAD: usize = 24;

/// The first [`ENV_HEAD`] bytes of an environment entry, in native-endian words.
pub type EnvHead = [u64; ENV_HEAD / 8];

/// Where a `CNI_*` variable's value goes in a [`CniExecEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CniVar {
    /// Offset of the field in [`CniExecEvent`].
    pub field: usize,
    /// The field's size.
    pub len: u32,
    /// Where the value starts in the entry: the length of the name and its `=`.
    pub skip: usize,
}

/// Which `CNI_*` variable an environment entry is, from its first [`ENV_HEAD`] bytes
/// (NUL after the string), as the field of [`CniExecEvent`] its value goes to.
///
/// The probe runs this on every entry of a plugin's environment, inside a loop the
/// verifier walks once per iteration: the names are compared a word at a time, and the
/// answer is the field's place rather than a choice among five copies, so an entry costs
/// a handful of branches and one read, whichever variable it is.
#[inline(always)]
pub fn cni_env_var(head: &EnvHead) -> Option<CniVar> {
    const fn word(name: &[u8], from: usize) -> u64 {
        let mut w = [0u8; 8];
        let mut i = 0;
        while i < 8 && from + i < name.len() {
            w[i] = name[from + i];
            i += 1;
        }
        u64::from_ne_bytes(w)
    }
    const fn mask(bytes: usize) -> u64 {
        if bytes >= 8 {
            u64::MAX
        } else {
            let mut w = [0u8; 8];
            let mut i = 0;
            while i < bytes {
                w[i] = 0xff;
                i += 1;
            }
            u64::from_ne_bytes(w)
        }
    }
    const fn var(field: usize, len: usize) -> (usize, u32) {
        (field, len as u32)
    }
    // (field, name with its '='): the first word picks the name, the second confirms
    // the rest of it.
    const NAMES: [((usize, u32), &[u8]); 5] = [
        (
            var(core::mem::offset_of!(CniExecEvent, command), 16),
            b"CNI_COMMAND=",
        ),
        (
            var(core::mem::offset_of!(CniExecEvent, container_id), 128),
            b"CNI_CONTAINERID=",
        ),
        (
            var(core::mem::offset_of!(CniExecEvent, netns), PATH_LEN),
            b"CNI_NETNS=",
        ),
        (
            var(core::mem::offset_of!(CniExecEvent, ifname), 16),
            b"CNI_IFNAME=",
        ),
        (
            var(core::mem::offset_of!(CniExecEvent, args), PATH_LEN),
            b"CNI_ARGS=",
        ),
    ];
    const CNI_: u64 = word(b"CNI_", 0);
    let [w0, w1, _] = *head;
    if w0 & mask(4) != CNI_ {
        return None;
    }
    let mut i = 0;
    while i < NAMES.len() {
        let ((field, len), name) = NAMES[i];
        if w0 == word(name, 0) && w1 & mask(name.len() - 8) == word(name, 8) {
            return Some(CniVar {
                field,
                len,
                skip: name.len(),
            });
        }
        i += 1;
    }
    None
}

/// A path prefix in a filter map. `len == 0` marks an unused slot. `mask` and
/// `boundary` are derived from the bytes by [`Prefix::new`] so that the probes compare
/// without branching on `len`: a branch per byte makes the verifier walk every
/// combination, and an index bounded by `len` is one it cannot prove in range.
/// Aligned to 8 so the probes load `bytes` and `mask` a word at a time.
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy)]
pub struct Prefix {
    pub len: u32,
    /// 1 when the byte after the prefix must end a path component (`/` or NUL): the
    /// prefix neither ends in `/` nor fills [`PREFIX_LEN`].
    pub boundary: u32,
    pub bytes: [u8; PREFIX_LEN],
    /// 0xff where `bytes` is part of the prefix, 0 after it.
    pub mask: [u8; PREFIX_LEN],
}

impl Prefix {
    pub const EMPTY: Prefix = Prefix {
        len: 0,
        boundary: 0,
        bytes: [0; PREFIX_LEN],
        mask: [0; PREFIX_LEN],
    };

    /// The prefix for `s`, or `None` when it is empty or does not fit.
    pub fn new(s: &[u8]) -> Option<Prefix> {
        if s.is_empty() || s.len() > PREFIX_LEN {
            return None;
        }
        let mut p = Prefix::EMPTY;
        p.bytes[..s.len()].copy_from_slice(s);
        p.mask[..s.len()].fill(0xff);
        p.len = s.len() as u32;
        p.boundary = u32::from(s.len() < PREFIX_LEN && s[s.len() - 1] != b'/');
        Some(p)
    }
}

/// True when the NUL-terminated `path` (its first [`PREFIX_LEN`] bytes are enough)
/// starts with `prefix` at a path-component boundary: `/k8s.io` matches `/k8s.io` and
/// `/k8s.io/abc`, not `/k8s.ionic`. A prefix ending in `/` matches anything below it.
/// The probes run this very function, so user space can test what the kernel keeps.
#[inline(always)]
pub fn prefix_matches(prefix: &Prefix, path: &[u8; PREFIX_LEN]) -> bool {
    if prefix.len == 0 {
        return false;
    }
    // Eight bytes at a time, leaving at the first word that differs: most paths differ
    // from the prefix within the first word or two, and every exec runs this. Each exit
    // ends its path, so the verifier walks eight paths, not combinations.
    let mut i = 0;
    while i < PREFIX_LEN / 8 {
        let (p, b, m) = (word(path, i), word(&prefix.bytes, i), word(&prefix.mask, i));
        if (p ^ b) & m != 0 {
            return false;
        }
        i += 1;
    }
    if prefix.boundary == 0 {
        return true;
    }
    // Masked, not compared: `boundary` is only set when len < PREFIX_LEN.
    let next = path[(prefix.len as usize) & (PREFIX_LEN - 1)];
    next == 0 || next == b'/'
}

/// The `i`th 8-byte word of `bytes` (unaligned: a path inside an event need not be).
#[inline(always)]
fn word(bytes: &[u8; PREFIX_LEN], i: usize) -> u64 {
    // SAFETY: `i < PREFIX_LEN / 8`, so the eight bytes read are inside `bytes`.
    unsafe { core::ptr::read_unaligned(bytes.as_ptr().add((i & 7) * 8) as *const u64) }
}

/// The probes wake the ring buffer's reader each time the unread data grows past
/// another `1 / 2^WAKEUP_SHIFT` of the ring (an eighth); user space also drains the ring
/// on a short timer, so no record waits for a wakeup.
pub const WAKEUP_SHIFT: u32 = 3;

/// Bytes a record with a `payload`-byte sample takes in a BPF ring buffer: the kernel's
/// 8-byte record header, and the whole rounded up to 8.
pub const fn ringbuf_record_bytes(payload: usize) -> u64 {
    ((payload as u64) + 8 + 7) & !7
}

/// Whether the record just reserved, of `record` bytes (see [`ringbuf_record_bytes`]),
/// took the ring's unread data (`avail`, `BPF_RB_AVAIL_DATA` right after the
/// reservation, so including the record) across a multiple of `ring_size >>`
/// [`WAKEUP_SHIFT`]: then it is submitted with `BPF_RB_FORCE_WAKEUP`, otherwise with
/// `BPF_RB_NO_WAKEUP`. A reader that falls behind gets one wakeup per eighth of the ring
/// rather than one per record; a record larger than an eighth (a one-page ring) always
/// wakes it. `ring_size` is a power of two (the kernel requires it), so the marks are
/// too and crossing one is a change in the bits above it. The probes run this very
/// function.
#[inline(always)]
pub fn wakeup_due(avail: u64, record: u64, ring_size: u64) -> bool {
    let mark = ring_size >> WAKEUP_SHIFT;
    let before = avail.saturating_sub(record);
    // `before` and `avail` are in different multiples of `mark` exactly when they
    // differ in a bit at or above it. A zero mark (no ring size) always wakes.
    (before ^ avail) >= mark
}

const _: () = {
    const H: usize = core::mem::size_of::<EventHeader>();
    assert!(H == 48);
    assert!(core::mem::size_of::<ExecEvent>() == H + 8 + PATH_LEN);
    assert!(core::mem::size_of::<ExitEvent>() == H + 8);
    assert!(core::mem::size_of::<CgroupEvent>() == H + 24 + COMM_LEN + PATH_LEN);
    assert!(core::mem::size_of::<NetnsEvent>() == H + 40);
    assert!(core::mem::size_of::<CniExecEvent>() == H + 16 + 3 * PATH_LEN + 32 + 128);
    assert!(core::mem::size_of::<RuntimeExecEvent>() == H + 16 + ARGV_LEN);
    assert!(ARGV_LEN.is_power_of_two());
    assert!(core::mem::size_of::<CniOutputEvent>() == H + 40 + CNI_OUTPUT_CHUNK);
    assert!(CNI_OUTPUT_CHUNK.is_power_of_two());
    assert!((CNI_OUTPUT_MAX as usize).is_multiple_of(CNI_OUTPUT_CHUNK));
    assert!(core::mem::size_of::<Prefix>() == 8 + 2 * PREFIX_LEN);
    assert!(PREFIX_LEN.is_power_of_two());
    assert!(PREFIX_LEN.is_multiple_of(8) && PREFIX_LEN <= PATH_LEN);
};

#[cfg(feature = "user")]
mod user {
    // SAFETY: each type is #[repr(C)], made only of integers and byte arrays, with
    // explicit padding fields (the size asserts above prove there is no hidden
    // padding), so every bit pattern is valid and every byte is initialised.
    unsafe impl aya::Pod for crate::EventHeader {}
    unsafe impl aya::Pod for crate::ExecEvent {}
    unsafe impl aya::Pod for crate::ExitEvent {}
    unsafe impl aya::Pod for crate::CgroupEvent {}
    unsafe impl aya::Pod for crate::NetnsEvent {}
    unsafe impl aya::Pod for crate::CniExecEvent {}
    unsafe impl aya::Pod for crate::RuntimeExecEvent {}
    unsafe impl aya::Pod for crate::CniOutputEvent {}
    unsafe impl aya::Pod for crate::Prefix {}
}

#[cfg(test)]
mod tests {
    use std::format;

    use super::*;

    fn env_head(entry: &str) -> EnvHead {
        let mut h = [0u8; ENV_HEAD];
        let n = entry.len().min(ENV_HEAD - 1);
        h[..n].copy_from_slice(&entry.as_bytes()[..n]);
        let mut words = [0u64; ENV_HEAD / 8];
        for (w, b) in words.iter_mut().zip(h.chunks(8)) {
            *w = u64::from_ne_bytes(b.try_into().unwrap());
        }
        words
    }

    #[test]
    fn what_follows_the_nul_of_a_short_entry_does_not_make_it_a_variable() {
        // The probe reuses its buffer: an entry shorter than a name ends in a NUL inside
        // the compared bytes, whatever the earlier entry left after it.
        let mut head = env_head("CNI_ARGS=x");
        let short = env_head("CNI_");
        head[0] = short[0];
        assert_eq!(cni_env_var(&head), None);
    }

    #[test]
    fn each_cni_variable_is_told_by_its_whole_name_and_its_value_offset() {
        use core::mem::offset_of;
        let var = |field, len, skip| Some(CniVar { field, len, skip });
        let command = var(offset_of!(CniExecEvent, command), 16, 12);
        let args = var(offset_of!(CniExecEvent, args), PATH_LEN as u32, 9);
        for (entry, want) in [
            ("CNI_COMMAND=ADD", command),
            (
                "CNI_CONTAINERID=0123456789abcdef",
                var(offset_of!(CniExecEvent, container_id), 128, 16),
            ),
            (
                "CNI_NETNS=/var/run/netns/cni-1",
                var(offset_of!(CniExecEvent, netns), PATH_LEN as u32, 10),
            ),
            (
                "CNI_IFNAME=eth0",
                var(offset_of!(CniExecEvent, ifname), 16, 11),
            ),
            ("CNI_ARGS=K8S_POD_NAME=web", args),
            // Empty values are still the variable.
            ("CNI_COMMAND=", command),
            ("CNI_ARGS=", args),
        ] {
            assert_eq!(cni_env_var(&env_head(entry)), want, "{entry}");
        }
        // The value's field lies inside the event.
        let ev = core::mem::size_of::<CniExecEvent>();
        for v in [command, args].into_iter().flatten() {
            assert!(v.field + v.len as usize <= ev);
        }
    }

    #[test]
    fn other_variables_and_near_names_are_not_cni_variables() {
        for entry in [
            "PATH=/usr/bin",
            "CNI_PATH=/opt/cni/bin",
            "CNI_COMMANDS=ADD",
            "CNI_COMMAND",
            "CNI_CONTAINERIDX=1",
            "CNI_NETNSX=/x",
            "CNI_IFNAMES=eth0",
            "CNI_ARGSX=1",
            "CNI_ARG=1",
            "cni_command=ADD",
            "CNI_",
            "",
        ] {
            assert_eq!(cni_env_var(&env_head(entry)), None, "{entry}");
        }
    }

    fn path(s: &str) -> [u8; PREFIX_LEN] {
        let mut p = [0u8; PREFIX_LEN];
        let n = s.len().min(PREFIX_LEN);
        p[..n].copy_from_slice(&s.as_bytes()[..n]);
        p
    }

    #[test]
    fn prefixes_match_at_component_boundaries() {
        let k8s = Prefix::new(b"/k8s.io").unwrap();
        assert!(prefix_matches(&k8s, &path("/k8s.io")));
        assert!(prefix_matches(&k8s, &path("/k8s.io/0123abcd")));
        assert!(!prefix_matches(&k8s, &path("/k8s.ionic/x")));
        assert!(!prefix_matches(&k8s, &path("/system.slice")));
        assert!(!prefix_matches(&k8s, &path("/k8s")));
        let cni = Prefix::new(b"/usr/lib/cni/").unwrap();
        assert!(prefix_matches(&cni, &path("/usr/lib/cni/bridge")));
        assert!(!prefix_matches(&cni, &path("/usr/lib/cnix/bridge")));
        assert!(!prefix_matches(&Prefix::EMPTY, &path("/k8s.io")));
    }

    #[test]
    fn runtime_programs_are_told_by_their_comm() {
        let comm = |s: &str| {
            let mut c = [0u8; COMM_LEN];
            c[..s.len()].copy_from_slice(s.as_bytes());
            comm_words(&c)
        };
        assert!(is_runtime_comm(&comm("runc")));
        assert!(is_runtime_comm(&comm("crun")));
        // The kernel cuts `containerd-shim-runc-v2` to 15 bytes.
        assert!(is_runtime_comm(&comm("containerd-shim")));
        assert!(!is_runtime_comm(&comm("runc:[2:INIT]")));
        assert!(!is_runtime_comm(&comm("runcx")));
        assert!(!is_runtime_comm(&comm("containerd")));
        assert!(!is_runtime_comm(&comm("exe")));
        assert!(!is_runtime_comm(&comm("containerd-shi")));
        assert!(!is_runtime_comm(&comm("container")));
        assert!(!is_runtime_comm(&comm("run")));
    }

    #[test]
    fn a_prefix_as_long_as_the_buffer_needs_no_boundary() {
        let long = "/".repeat(PREFIX_LEN);
        let p = Prefix::new(long.as_bytes()).unwrap();
        assert!(prefix_matches(&p, &path(&long)));
        assert!(Prefix::new(format!("{long}x").as_bytes()).is_none());
        assert!(Prefix::new(b"").is_none());
    }

    #[test]
    fn ring_buffer_records_carry_an_8_byte_header_and_round_up_to_8() {
        assert_eq!(ringbuf_record_bytes(size_of::<ExecEvent>()), 320);
        assert_eq!(ringbuf_record_bytes(size_of::<ExitEvent>()), 64);
        assert_eq!(ringbuf_record_bytes(size_of::<CniExecEvent>()), 1000);
        assert_eq!(ringbuf_record_bytes(1), 16);
        assert_eq!(ringbuf_record_bytes(0), 8);
    }

    #[test]
    fn the_reader_is_woken_once_per_eighth_of_the_ring_crossed() {
        const RING: u64 = 1 << 20;
        const MARK: u64 = RING / 8;
        let exec = ringbuf_record_bytes(size_of::<ExecEvent>());
        let exit = ringbuf_record_bytes(size_of::<ExitEvent>());
        // Records into an empty ring wake nobody until one reaches the first mark.
        assert!(!wakeup_due(exec, exec, RING));
        assert!(!wakeup_due(MARK - 1, exec, RING));
        assert!(wakeup_due(MARK, exec, RING));
        assert!(wakeup_due(MARK + exec - 8, exec, RING));
        // Starting on the mark is not crossing it.
        assert!(!wakeup_due(MARK + exec, exec, RING));
        assert!(wakeup_due(3 * MARK + 16, exec, RING));

        // A reader that never reads: exec and exit events until the ring is full wake
        // it once per mark passed, each at the first record that reaches the mark.
        let mut avail = 0;
        let mut woken_at = std::vec::Vec::new();
        for i in 0.. {
            let record = if i % 2 == 0 { exec } else { exit };
            if avail + record > RING {
                break;
            }
            avail += record;
            if wakeup_due(avail, record, RING) {
                woken_at.push(avail);
            }
        }
        assert_eq!(woken_at.len() as u64, avail / MARK, "{woken_at:?}");
        for (k, at) in woken_at.iter().enumerate() {
            let mark = (k as u64 + 1) * MARK;
            assert!(
                *at >= mark && *at - mark < exec,
                "mark {mark} woken at {at}"
            );
        }
    }

    #[test]
    fn records_larger_than_an_eighth_of_the_ring_always_wake() {
        let page = 4096;
        let cni = ringbuf_record_bytes(size_of::<CniExecEvent>());
        assert!(cni > page / 8);
        for avail in [cni, cni + 8, 2 * cni, page] {
            assert!(wakeup_due(avail, cni, page), "{avail}");
        }
        // No ring size to go by: always wake, as without the marks.
        assert!(wakeup_due(64, 64, 0));
    }

    #[test]
    fn kinds_round_trip() {
        for k in EventKind::ALL {
            assert_eq!(EventKind::from_u32(k as u32), Some(k));
            assert!((k as u32) < EventKind::COUNT);
        }
        assert_eq!(EventKind::from_u32(0), None);
        assert_eq!(NetnsSyscall::from_u32(3), Some(NetnsSyscall::Clone));
    }
}
