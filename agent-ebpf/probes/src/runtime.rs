//! Execs of the container runtime's own programs (`runc`, `crun`, a containerd shim),
//! with their arguments: runc's subcommand and container ID and the shim's `-id` tie
//! each run to the sandbox or container it works on, so user space can time the shim's
//! start and runc's create, init and start inside RunPodSandbox and StartContainer.
//!
//! Reported from `sched_process_exec` (see `sched.rs`): the program is told by its new
//! `comm`, so any other exec costs one compare of a few bytes.

use aya_ebpf::helpers::r#gen::bpf_probe_read_user;
use podlapse_ebpf_common::{ARGV_LEN, EventKind, RuntimeExecEvent, argv_flags};

use crate::{fill_header, reserve, task};

/// Reports the exec of a runtime program with its arguments.
#[inline(always)]
pub fn report_runtime() -> Result<(), u32> {
    let Some(mut entry) = reserve::<RuntimeExecEvent>(EventKind::RuntimeExec) else {
        return Err(1);
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is the reserved entry; the user memory is read by a checked helper
    // with a length bounded by the buffer.
    unsafe {
        fill_header(&raw mut (*ev).header, EventKind::RuntimeExec);
        (*ev).argv_len = 0;
        (*ev).flags = argv_flags::UNREADABLE;
        (*ev).forked_ns = task::current_start_time();
        (*ev).argv[0] = 0;
        if let Some((start, end)) = task::exec_args() {
            let len = end - start;
            // A longer list is read from its end: runc's container ID is its last
            // argument.
            let (from, n, flags) = if len > ARGV_LEN as u64 {
                (end - ARGV_LEN as u64, ARGV_LEN as u32, argv_flags::HEAD_CUT)
            } else {
                (start, len as u32, 0)
            };
            // The mask keeps the size provably within the buffer for the verifier.
            let n = n & (2 * ARGV_LEN as u32 - 1);
            let n = if n > ARGV_LEN as u32 {
                ARGV_LEN as u32
            } else {
                n
            };
            let ret = bpf_probe_read_user(
                (&raw mut (*ev).argv).cast(),
                n,
                from as *const core::ffi::c_void,
            );
            if ret == 0 {
                (*ev).argv_len = n;
                (*ev).flags = flags;
            }
        }
    }
    entry.submit();
    Ok(())
}
