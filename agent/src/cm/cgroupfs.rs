//! Plain cgroupfs operations on one directory tree: create, write, list processes, kill,
//! remove. Every error names the directory or file.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::CmError;

/// Creates `dir` and any missing parents below `mountpoint`, one level at a time so each
/// level can be prepared (cpuset values, v2 delegation) before its child appears.
pub(super) fn create_below(
    mountpoint: &Path,
    dir: &Path,
    mut prepare: impl FnMut(&Path) -> Result<(), CmError>,
) -> Result<(), CmError> {
    let rel = dir.strip_prefix(mountpoint).unwrap_or(dir);
    let mut current = mountpoint.to_path_buf();
    prepare(&current)?;
    for part in rel.components() {
        current.push(part);
        match fs::create_dir(&current) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(CmError::Create {
                    path: current,
                    source,
                });
            }
        }
        prepare(&current)?;
    }
    Ok(())
}

/// Writes one value to an existing cgroup file. The file is never created: a missing
/// file means the controller is absent, and that should fail loudly.
pub(super) fn write(dir: &Path, file: &str, value: &str) -> Result<(), CmError> {
    let path = dir.join(file);
    let result = fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, value.as_bytes()));
    result.map_err(|source| CmError::Write {
        path,
        value: value.to_string(),
        source,
    })
}

pub(super) fn read(dir: &Path, file: &str) -> Result<String, CmError> {
    let path = dir.join(file);
    fs::read_to_string(&path).map_err(|source| CmError::Read { path, source })
}

/// The processes directly in `dir` (its `cgroup.procs`); none when the cgroup is gone.
pub(super) fn procs(dir: &Path) -> Result<Vec<i32>, CmError> {
    let path = dir.join("cgroup.procs");
    match fs::read_to_string(&path) {
        Ok(text) => Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(CmError::Read { path, source }),
    }
}

/// `dir` and every cgroup below it, deepest first, so removing in this order never hits
/// a cgroup that still has children.
pub(super) fn subtree_deepest_first(dir: &Path) -> Result<Vec<PathBuf>, CmError> {
    let mut all = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(source) => return Err(CmError::Read { path: d, source }),
        };
        for entry in entries {
            let entry = entry.map_err(|source| CmError::Read {
                path: d.clone(),
                source,
            })?;
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
        all.push(d);
    }
    all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    Ok(all)
}

/// kubelet's tryKillingCgroupProcesses: SIGKILL every process found in the pod's cgroups,
/// up to five rounds, a process that is already gone counting as killed.
pub(super) fn kill_all(pids: &[(i32, PathBuf)]) -> Result<(), CmError> {
    let mut killed = vec![false; pids.len()];
    let mut last_error = None;
    for _ in 0..5 {
        last_error = None;
        for (i, (pid, dir)) in pids.iter().enumerate() {
            if killed[i] {
                continue;
            }
            match kill(Pid::from_raw(*pid), Signal::SIGKILL) {
                Ok(()) | Err(Errno::ESRCH) => killed[i] = true,
                Err(source) => {
                    last_error = Some(CmError::Kill {
                        path: dir.clone(),
                        pid: *pid,
                        source,
                    })
                }
            }
        }
        if last_error.is_none() {
            return Ok(());
        }
    }
    last_error.map_or(Ok(()), Err)
}

/// Removes an empty cgroup directory. A killed process takes a moment to leave its
/// cgroup, so EBUSY is retried with a doubling delay (about 1.3 s in all) before the
/// cgroup is reported busy with whatever processes it still holds.
pub(super) fn remove(dir: &Path) -> Result<(), CmError> {
    let mut delay = Duration::from_millis(10);
    for attempt in 0..8 {
        if attempt > 0 {
            std::thread::sleep(delay);
            delay *= 2;
        }
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc_ebusy()) => continue,
            Err(source) => {
                return Err(CmError::Remove {
                    path: dir.to_path_buf(),
                    source,
                });
            }
        }
    }
    let pids = procs(dir)?;
    if pids.is_empty() {
        // Busy without processes: a child cgroup appeared meanwhile (runc racing us).
        return Err(CmError::Remove {
            path: dir.to_path_buf(),
            source: std::io::Error::from_raw_os_error(libc_ebusy()),
        });
    }
    Err(CmError::CgroupBusy {
        path: dir.to_path_buf(),
        pids,
    })
}

fn libc_ebusy() -> i32 {
    Errno::EBUSY as i32
}
