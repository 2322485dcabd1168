//! Which hooks feed the network-namespace events.
//!
//! Where the kernel lets kprobes attach (distribution kernels: Debian, Ubuntu, COS,
//! Bottlerocket), the kernel functions that create and enter a network namespace
//! report them: `unshare_nsproxy_namespaces`, the part of unshare(2) that builds new
//! namespaces, and `netns_install`, the network namespace's `install` operation that
//! setns(2) calls. They cost only when they run. Elsewhere (a kernel built without
//! kprobes, or one that refuses them), the syscall tracepoints of unshare and setns
//! report them, which send every syscall of the node down the kernel's slow path while
//! attached: the fallback, chosen at load with the reason logged once. The events and
//! every stage built from them are the same whichever hook fed them, but for two
//! details: a setns reported by `netns_install` carries no fd, and an unshare's start is
//! the function's entry rather than the syscall's.

use std::fmt;
use std::path::Path;

use aya::Ebpf;
use aya::programs::KProbe;

/// The perf event source kprobes attach through; a kernel built without kprobes has
/// none.
const KPROBE_PMU: &str = "/sys/bus/event_source/devices/kprobe/type";

/// One kernel-function program of the object.
pub(super) struct FunctionProgram {
    pub(super) program: &'static str,
    pub(super) function: &'static str,
}

/// The programs, entry before return for each function.
pub(super) const FUNCTION_PROGRAMS: [FunctionProgram; 4] = [
    FunctionProgram {
        program: "kprobe_unshare_nsproxy_namespaces",
        function: "unshare_nsproxy_namespaces",
    },
    FunctionProgram {
        program: "kretprobe_unshare_nsproxy_namespaces",
        function: "unshare_nsproxy_namespaces",
    },
    FunctionProgram {
        program: "kprobe_netns_install",
        function: "netns_install",
    },
    FunctionProgram {
        program: "kretprobe_netns_install",
        function: "netns_install",
    },
];

/// Which hooks to use for the network-namespace events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NetnsHookChoice {
    /// Kernel functions where the kernel allows them, else the syscall tracepoints.
    #[default]
    Auto,
    /// Kernel functions, or fail to load.
    KernelFunctions,
    /// The syscall tracepoints, even where kernel functions would attach.
    SyscallTracepoints,
}

/// The hooks that feed the network-namespace events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetnsHooks {
    /// kprobes on the kernel functions.
    KernelFunctions,
    /// The unshare and setns syscall tracepoints; `why` the kernel functions are not
    /// used, unless they were not asked for.
    SyscallTracepoints { why: Option<String> },
}

impl NetnsHooks {
    /// A short name: `kprobes` or `tracepoints`.
    pub fn kind(&self) -> &'static str {
        match self {
            NetnsHooks::KernelFunctions => "kprobes",
            NetnsHooks::SyscallTracepoints { .. } => "tracepoints",
        }
    }
}

impl fmt::Display for NetnsHooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetnsHooks::KernelFunctions => {
                f.write_str("kprobes on unshare_nsproxy_namespaces and netns_install")
            }
            NetnsHooks::SyscallTracepoints { why: None } => {
                f.write_str("tracepoints on the unshare and setns syscalls (asked for)")
            }
            NetnsHooks::SyscallTracepoints { why: Some(why) } => write!(
                f,
                "tracepoints on the unshare and setns syscalls (kernel functions refused: {why})"
            ),
        }
    }
}

/// Whether this kernel has kprobes to attach through, or why not. Present is not yet
/// attached: a kernel may still refuse a function (a lockdown, a function inlined away).
pub fn kprobes_present() -> Result<(), String> {
    if Path::new(KPROBE_PMU).exists() {
        Ok(())
    } else {
        Err(format!("this kernel has no kprobes: no {KPROBE_PMU}"))
    }
}

/// Loads and attaches every kernel-function program, or none: on a failure, those
/// already attached are unloaded (which detaches them) and the error says which program
/// and function failed, and why.
pub(super) fn attach_functions(ebpf: &mut Ebpf) -> Result<Vec<&'static str>, String> {
    kprobes_present()?;
    let mut done: Vec<&'static str> = Vec::with_capacity(FUNCTION_PROGRAMS.len());
    for p in &FUNCTION_PROGRAMS {
        if let Err(why) = attach_function(ebpf, p) {
            for program in done {
                if let Some(Ok(kprobe)) = ebpf.program_mut(program).map(<&mut KProbe>::try_from) {
                    // Unloading detaches its links; a failure leaves it attached until
                    // the probes are dropped, which costs only calls of that function.
                    let _ = kprobe.unload();
                }
            }
            return Err(why);
        }
        done.push(p.program);
    }
    Ok(done)
}

fn attach_function(ebpf: &mut Ebpf, p: &FunctionProgram) -> Result<(), String> {
    let with = |e: &dyn std::error::Error| format!("{} on {}: {}", p.program, p.function, chain(e));
    let kprobe: &mut KProbe = ebpf
        .program_mut(p.program)
        .ok_or_else(|| {
            format!(
                "{} is not in the probes object (built before kernel-function hooks)",
                p.program
            )
        })?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| with(&e))?;
    kprobe.load().map_err(|e| with(&e))?;
    kprobe.attach(p.function, 0).map_err(|e| with(&e))?;
    Ok(())
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
    fn the_hooks_say_what_they_are_and_why_not_kernel_functions() {
        assert_eq!(NetnsHooks::KernelFunctions.kind(), "kprobes");
        assert_eq!(
            NetnsHooks::KernelFunctions.to_string(),
            "kprobes on unshare_nsproxy_namespaces and netns_install"
        );
        let refused = NetnsHooks::SyscallTracepoints {
            why: Some("no kprobe PMU".to_string()),
        };
        assert_eq!(refused.kind(), "tracepoints");
        assert!(
            refused
                .to_string()
                .ends_with("(kernel functions refused: no kprobe PMU)")
        );
        assert!(
            NetnsHooks::SyscallTracepoints { why: None }
                .to_string()
                .ends_with("(asked for)")
        );
    }

    #[test]
    fn every_function_has_an_entry_and_a_return_program() {
        for p in &FUNCTION_PROGRAMS {
            let entry = format!("kprobe_{}", p.function);
            let ret = format!("kretprobe_{}", p.function);
            assert!(p.program == entry || p.program == ret, "{}", p.program);
            assert!(FUNCTION_PROGRAMS.iter().any(|q| q.program == entry));
            assert!(FUNCTION_PROGRAMS.iter().any(|q| q.program == ret));
        }
    }
}
