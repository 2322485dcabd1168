//! Which hook sees CNI plugins' writes to their standard output.
//!
//! Where the kernel lets kprobes attach, a kprobe on `ksys_write` (the body of write(2))
//! does; elsewhere the `syscalls:sys_enter_write` tracepoint does. Both run the same code
//! (`agent-ebpf/probes/src/cni_output.rs`) and both cost every write on the node while
//! attached (the tracepoint also sends every other syscall down the slow path), so
//! either is attached only while a CNI plugin runs ([`super::CniOutputGate`]). The
//! choice is made at load: the kprobe is loaded and attached once to learn whether the
//! kernel takes it, then detached; a refusal falls back to the tracepoint with the
//! reason kept, the way the namespace hooks do.

use std::fmt;

use aya::Ebpf;
use aya::programs::kprobe::KProbeLink;
use aya::programs::trace_point::TracePointLink;
use aya::programs::{KProbe, TracePoint};

use super::netns_hooks::kprobes_present;

/// The kprobe program and the function it attaches to.
const KPROBE_PROGRAM: &str = "kprobe_ksys_write";
const KPROBE_FUNCTION: &str = "ksys_write";
/// The tracepoint program, its category and its tracepoint (its own name).
const TRACEPOINT_PROGRAM: &str = "sys_enter_write";
const TRACEPOINT_CATEGORY: &str = "syscalls";

/// The hook that captures CNI plugins' output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteHook {
    /// A kprobe on `ksys_write`.
    KernelFunction,
    /// The `sys_enter_write` tracepoint; `why` the kprobe is not used.
    SyscallTracepoint { why: String },
}

impl WriteHook {
    /// The hook's short name, as the trace's `cni_write_hook` records give it.
    pub fn name(&self) -> &'static str {
        match self {
            WriteHook::KernelFunction => "kprobe:ksys_write",
            WriteHook::SyscallTracepoint { .. } => "tracepoint:syscalls:sys_enter_write",
        }
    }
}

impl fmt::Display for WriteHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WriteHook::KernelFunction => f.write_str("kprobe on ksys_write"),
            WriteHook::SyscallTracepoint { why } => write!(
                f,
                "tracepoint on the write syscall (kernel function refused: {why})"
            ),
        }
    }
}

/// An attached write hook: dropping it detaches it.
pub(super) enum WriteLink {
    // Held only to be dropped.
    KernelFunction(#[allow(dead_code)] KProbeLink),
    SyscallTracepoint(#[allow(dead_code)] TracePointLink),
}

/// Loads the kprobe and tries it once, else loads the tracepoint: the hook to attach on
/// demand. `Err` only when neither loads (an object built before the capture).
pub(super) fn choose(ebpf: &mut Ebpf) -> Result<WriteHook, String> {
    let why = match try_kprobe(ebpf) {
        Ok(()) => return Ok(WriteHook::KernelFunction),
        Err(why) => why,
    };
    let tp = tracepoint(ebpf)?;
    tp.load()
        .map_err(|e| format!("loading {TRACEPOINT_PROGRAM}: {}", chain(&e)))?;
    Ok(WriteHook::SyscallTracepoint { why })
}

fn try_kprobe(ebpf: &mut Ebpf) -> Result<(), String> {
    kprobes_present()?;
    let with =
        |e: &dyn std::error::Error| format!("{KPROBE_PROGRAM} on {KPROBE_FUNCTION}: {}", chain(e));
    let kprobe: &mut KProbe = ebpf
        .program_mut(KPROBE_PROGRAM)
        .ok_or_else(|| format!("{KPROBE_PROGRAM} is not in the probes object"))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| with(&e))?;
    kprobe.load().map_err(|e| with(&e))?;
    // Attached and detached at once: whether the kernel takes it (a function inlined
    // away or on a blocklist is refused here, not later).
    let id = kprobe.attach(KPROBE_FUNCTION, 0).map_err(|e| with(&e))?;
    kprobe.detach(id).map_err(|e| with(&e))?;
    Ok(())
}

fn tracepoint(ebpf: &mut Ebpf) -> Result<&mut TracePoint, String> {
    ebpf.program_mut(TRACEPOINT_PROGRAM)
        .ok_or_else(|| format!("{TRACEPOINT_PROGRAM} is not in the probes object"))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| format!("{TRACEPOINT_PROGRAM}: {e}"))
}

/// Attaches `hook` (loaded by [`choose`]).
pub(super) fn attach(ebpf: &mut Ebpf, hook: &WriteHook) -> Result<WriteLink, String> {
    match hook {
        WriteHook::KernelFunction => {
            let with = |e: &dyn std::error::Error| {
                format!(
                    "attaching {KPROBE_PROGRAM} to {KPROBE_FUNCTION}: {}",
                    chain(e)
                )
            };
            let kprobe: &mut KProbe = ebpf
                .program_mut(KPROBE_PROGRAM)
                .ok_or_else(|| format!("{KPROBE_PROGRAM} is not in the probes object"))?
                .try_into()
                .map_err(|e: aya::programs::ProgramError| with(&e))?;
            let id = kprobe.attach(KPROBE_FUNCTION, 0).map_err(|e| with(&e))?;
            let link = kprobe.take_link(id).map_err(|e| with(&e))?;
            Ok(WriteLink::KernelFunction(link))
        }
        WriteHook::SyscallTracepoint { .. } => {
            let with = |e: &dyn std::error::Error| {
                format!(
                    "attaching {TRACEPOINT_PROGRAM} to {TRACEPOINT_CATEGORY}:{TRACEPOINT_PROGRAM}: {}",
                    chain(e)
                )
            };
            let tp = tracepoint(ebpf)?;
            let id = tp
                .attach(TRACEPOINT_CATEGORY, TRACEPOINT_PROGRAM)
                .map_err(|e| with(&e))?;
            let link = tp.take_link(id).map_err(|e| with(&e))?;
            Ok(WriteLink::SyscallTracepoint(link))
        }
    }
}

/// The programs behind the hooks, for their run statistics.
pub(super) fn program(hook: &WriteHook) -> &'static str {
    match hook {
        WriteHook::KernelFunction => KPROBE_PROGRAM,
        WriteHook::SyscallTracepoint { .. } => TRACEPOINT_PROGRAM,
    }
}

/// An error and its sources, joined by `: `.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hooks_say_what_they_are_and_why_not_the_kernel_function() {
        assert_eq!(WriteHook::KernelFunction.name(), "kprobe:ksys_write");
        let tp = WriteHook::SyscallTracepoint {
            why: "this kernel has no kprobes".into(),
        };
        assert_eq!(tp.name(), "tracepoint:syscalls:sys_enter_write");
        assert!(
            tp.to_string()
                .ends_with("(kernel function refused: this kernel has no kprobes)")
        );
        assert_eq!(program(&tp), "sys_enter_write");
    }
}
