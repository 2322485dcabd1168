//! A process's exit status from its pidfd (`PIDFD_GET_INFO` with `PIDFD_INFO_EXIT`, Linux
//! 6.15 and later), so the agent can show a container's exit without waiting for the
//! runtime. The kernel keeps the status once the process's parent (the runtime's shim)
//! has reaped it, which takes from under a millisecond to tens of them on a busy node.
//! Until then the process is a zombie, and `/proc/<pid>/stat` already holds its wait
//! status: the agent reads it there, and asks the pidfd afterwards whether the process
//! was still unreaped, so the pid read cannot have been reused by another process.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

/// `struct pidfd_info` of `<linux/pidfd.h>`, its first version (64 bytes).
#[repr(C)]
#[derive(Default)]
struct PidfdInfo {
    mask: u64,
    cgroupid: u64,
    pid: u32,
    tgid: u32,
    ppid: u32,
    ruid: u32,
    rgid: u32,
    euid: u32,
    egid: u32,
    suid: u32,
    sgid: u32,
    fsuid: u32,
    fsgid: u32,
    exit_code: i32,
    coredump_mask: u32,
    spare: u32,
}

/// `_IOWR(PIDFS_IOCTL_MAGIC, 11, struct pidfd_info)`.
const PIDFD_GET_INFO: libc::c_ulong = (3 << 30) | (64 << 16) | (0xFF << 8) | 11;
const PIDFD_INFO_EXIT: u64 = 1 << 3;

/// What the kernel says of the exit now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitInfo {
    /// The wait status (as `waitpid` gives it).
    Reaped(i32),
    /// Exited or exiting, not reaped yet: ask again.
    NotYet,
    /// This kernel cannot say (older than 6.15).
    Unsupported,
}

pub fn exit_info(fd: BorrowedFd<'_>) -> ExitInfo {
    let mut info = PidfdInfo {
        mask: PIDFD_INFO_EXIT,
        ..PidfdInfo::default()
    };
    // SAFETY: PIDFD_GET_INFO writes at most size_of::<PidfdInfo>() bytes (the size is
    // encoded in the request) into `info`, which lives for the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), PIDFD_GET_INFO, &mut info as *mut PidfdInfo) };
    if rc < 0 {
        return match std::io::Error::last_os_error().raw_os_error() {
            // Running, or gone without exit information.
            Some(libc::ESRCH) => ExitInfo::NotYet,
            _ => ExitInfo::Unsupported,
        };
    }
    if info.mask & PIDFD_INFO_EXIT != 0 {
        ExitInfo::Reaped(info.exit_code)
    } else {
        ExitInfo::NotYet
    }
}

/// The wait status of `pid` if it is a zombie now: field 52 (`exit_code`) of
/// `/proc/<pid>/stat`, whose state (field 3) is `Z`.
fn zombie_wait_status(pid: u32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command (field 2) is in parentheses and may hold anything: fields after it
    // start past the last ')'.
    let mut rest = stat.get(stat.rfind(')')? + 1..)?.split_ascii_whitespace();
    if rest.next()? != "Z" {
        return None;
    }
    // Field 52 is the 49th after the state.
    rest.nth(48)?.parse().ok()
}

/// The wait status of the exited process `pid` behind `fd`: from its zombie at once, or
/// from the pidfd once reaped; polled for at most `limit`.
pub async fn exit_wait_status(fd: BorrowedFd<'_>, pid: u32, limit: Duration) -> Option<i32> {
    /// The shim reaps as soon as it gets SIGCHLD: a short step finds it at once.
    const STEP: Duration = Duration::from_micros(500);
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match exit_info(fd) {
            ExitInfo::Reaped(status) => return Some(status),
            ExitInfo::Unsupported => return None,
            ExitInfo::NotYet => {}
        }
        if let Some(status) = zombie_wait_status(pid) {
            // Not reaped after the read either: the zombie read was this process, as a
            // pid is not reused before its zombie is reaped.
            return match exit_info(fd) {
                ExitInfo::NotYet => Some(status),
                ExitInfo::Reaped(reaped) => Some(reaped),
                ExitInfo::Unsupported => None,
            };
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(STEP).await;
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};

    use super::*;

    /// The running kernel's (major, minor).
    fn kernel_release() -> (u32, u32) {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
        let mut parts = release
            .trim()
            .split(|c: char| !c.is_ascii_digit())
            .map(|p| p.parse().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    }

    #[test]
    fn a_reaped_childs_exit_status_comes_from_its_pidfd() {
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", "exit 7"])
            .spawn()
            .expect("sh runs");
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, child.id() as libc::pid_t, 0) };
        assert!(raw >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
        // SAFETY: the kernel just returned this fd and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
        let status = child.wait().expect("reaped");
        assert_eq!(status.code(), Some(7));
        match exit_info(fd.as_fd()) {
            ExitInfo::Reaped(ws) => {
                assert_eq!(
                    crate::kubelet::observed_exit::exit_code_of_wait_status(ws),
                    7
                )
            }
            // Only kernels before 6.15 may fail to say; the next test pins what the agent
            // does then.
            ExitInfo::Unsupported => assert!(
                kernel_release() < (6, 15),
                "PIDFD_GET_INFO refused on {:?}",
                kernel_release()
            ),
            ExitInfo::NotYet => panic!("a reaped child must have exit information"),
        }
    }

    #[tokio::test]
    async fn an_unreaped_childs_exit_status_comes_from_its_zombie() {
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", "kill -TERM $$"])
            .spawn()
            .expect("sh runs");
        let pid = child.id();
        // SAFETY: as above.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        assert!(raw >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
        // SAFETY: as above.
        let fd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
        // Wait for the exit without reaping: the pidfd turns readable.
        let mut poll = libc::pollfd {
            fd: raw as i32,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the call's duration.
        assert_eq!(
            unsafe { libc::poll(&mut poll, 1, 10_000) },
            1,
            "no exit seen"
        );
        let status = exit_wait_status(fd.as_fd(), pid, Duration::from_millis(100)).await;
        if matches!(exit_info(fd.as_fd()), ExitInfo::Unsupported) {
            // Before 6.15 the agent gives no status rather than one it cannot tie to
            // this process, and waits for the runtime's report instead.
            assert!(kernel_release() < (6, 15), "PIDFD_GET_INFO refused");
            assert_eq!(
                status, None,
                "a kernel without PIDFD_GET_INFO gave a status"
            );
        } else {
            let status = status.expect("the zombie's status");
            assert_eq!(
                crate::kubelet::observed_exit::exit_code_of_wait_status(status),
                128 + libc::SIGTERM
            );
            assert!(
                matches!(exit_info(fd.as_fd()), ExitInfo::NotYet),
                "read before the child was reaped"
            );
        }
        child.wait().expect("reaped");
    }
}
