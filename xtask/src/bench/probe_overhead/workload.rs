//! Benchmark 4's exec workload: workers exec a static `true` as fast as they can, for a
//! time or a count, while the arms beside them run or not.

use std::ffi::CString;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};

use super::ArmRun;

/// The binary the workload execs: busybox's `true` when busybox is there (static on the
/// lab's hosts: no dynamic loader, so the exec itself is as cheap as it gets and the
/// probes' share as large), else coreutils' `true`.
pub(super) struct ExecTarget {
    pub(super) path: CString,
    pub(super) argv: Vec<CString>,
    pub(super) shown: String,
}

/// `explicit` when given (a busybox, run as `true`: the host's static one, taken into the
/// modern node so both kernels run the same workload), else the first candidate there is.
pub(super) fn exec_target(explicit: Option<&Path>) -> anyhow::Result<ExecTarget> {
    if let Some(path) = explicit {
        if !path.is_file() {
            bail!("--exec {}: no such file", path.display());
        }
        let shown = format!("{} true", path.display());
        return Ok(ExecTarget {
            path: CString::new(path.as_os_str().as_encoded_bytes())
                .with_context(|| format!("--exec {}: a NUL in the path", path.display()))?,
            argv: vec![CString::new("true")?],
            shown,
        });
    }
    let candidates: [(&str, &[&str]); 4] = [
        ("/bin/busybox", &["true"]),
        ("/usr/bin/busybox", &["true"]),
        ("/bin/true", &["true"]),
        ("/usr/bin/true", &["true"]),
    ];
    let (path, argv) = candidates
        .iter()
        .find(|(p, _)| Path::new(p).is_file())
        .ok_or_else(|| {
            anyhow!(
                "no binary for the exec workload: looked for {}",
                candidates.map(|c| c.0).join(", ")
            )
        })?;
    Ok(ExecTarget {
        path: CString::new(*path)?,
        argv: argv
            .iter()
            .map(|a| CString::new(*a))
            .collect::<Result<_, _>>()?,
        shown: format!("{path} {}", argv.join(" ")).trim().to_string(),
    })
}

/// Spawns the target and waits for it, again and again while `more(execs so far)`;
/// counts each exec into `done` as it ends, and returns how many ran.
pub(super) fn exec_loop(
    target: &ExecTarget,
    more: impl Fn(u64) -> bool,
    done: &AtomicU64,
) -> anyhow::Result<u64> {
    let argv: Vec<*mut libc::c_char> = target
        .argv
        .iter()
        .map(|a| a.as_ptr().cast_mut())
        .chain(std::iter::once(std::ptr::null_mut()))
        .collect();
    let envp: [*mut libc::c_char; 1] = [std::ptr::null_mut()];
    let mut execs = 0;
    while more(execs) {
        let mut pid: libc::pid_t = 0;
        // SAFETY: path, argv and envp are NUL-terminated and outlive the call; no file
        // actions and no attributes.
        let rc = unsafe {
            libc::posix_spawn(
                &mut pid,
                target.path.as_ptr(),
                std::ptr::null(),
                std::ptr::null(),
                argv.as_ptr(),
                envp.as_ptr(),
            )
        };
        if rc != 0 {
            bail!(
                "spawning {}: {}",
                target.shown,
                std::io::Error::from_raw_os_error(rc)
            );
        }
        let mut status = 0;
        loop {
            // SAFETY: waits for the child just spawned; status is a valid pointer.
            let r = unsafe { libc::waitpid(pid, &mut status, 0) };
            if r == pid {
                break;
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                bail!("waiting for {} (pid {pid}): {e}", target.shown);
            }
        }
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            bail!("{} (pid {pid}) ended with status {status:#x}", target.shown);
        }
        execs += 1;
        done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(execs)
}

/// `workers` exec loops side by side for `length`.
pub(super) fn workload(
    target: &ExecTarget,
    workers: usize,
    length: Duration,
) -> anyhow::Result<ArmRun> {
    workload_until(target, workers, length, u64::MAX)
}

/// `workers` exec loops side by side for `length` or until each has run `max` execs.
pub(super) fn workload_until(
    target: &ExecTarget,
    workers: usize,
    length: Duration,
    max: u64,
) -> anyhow::Result<ArmRun> {
    let start = Instant::now();
    let deadline = start + length;
    let done = AtomicU64::new(0);
    let more = |execs: u64| execs < max && Instant::now() < deadline;
    let counts = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| s.spawn(|| exec_loop(target, more, &done)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow!("an exec worker panicked"))
                    .and_then(|r| r)
            })
            .collect::<anyhow::Result<Vec<u64>>>()
    })?;
    Ok(ArmRun {
        execs: counts.iter().sum(),
        seconds: start.elapsed().as_secs_f64(),
    })
}
