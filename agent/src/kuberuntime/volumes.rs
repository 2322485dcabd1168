//! Pod volumes on the node: the pod directory, emptyDir (on disk or tmpfs for
//! `medium: Memory`), and checks for hostPath. kubelet's volume manager does this before
//! the sandbox is created.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

use super::config::RuntimeConfig;
use super::labels;
use super::{SyncError, SyncReason};

fn config_error(message: String) -> SyncError {
    SyncError::new(SyncReason::CreateContainerConfigError, message)
}

/// Creates the pod directory and every emptyDir, mounting tmpfs for memory-backed ones.
/// Idempotent: a second call for the same pod changes nothing.
pub fn mount_pod_volumes(pod: &Pod, cfg: &RuntimeConfig) -> Result<(), SyncError> {
    let uid = labels::pod_uid(pod);
    let pod_dir = cfg.pod_dir(uid);
    std::fs::create_dir_all(&pod_dir)
        .map_err(|e| config_error(format!("creating pod directory {}: {e}", pod_dir.display())))?;
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        if let Some(ed) = &v.empty_dir {
            let dir = cfg.empty_dir_path(uid, &v.name);
            std::fs::create_dir_all(&dir).map_err(|e| {
                config_error(format!(
                    "emptyDir {:?}: creating {}: {e}",
                    v.name,
                    dir.display()
                ))
            })?;
            if ed.medium.as_deref() == Some("Memory") && !is_mount_point(&dir) {
                let size = ed
                    .size_limit
                    .as_ref()
                    .and_then(crate::kubelet::quantity::value)
                    .map(|b| format!("size={b}"));
                nix::mount::mount(
                    Some("tmpfs"),
                    &dir,
                    Some("tmpfs"),
                    nix::mount::MsFlags::empty(),
                    size.as_deref(),
                )
                .map_err(|e| {
                    config_error(format!(
                        "emptyDir {:?}: mounting tmpfs at {}: {e}",
                        v.name,
                        dir.display()
                    ))
                })?;
            }
        } else if let Some(hp) = &v.host_path {
            let path = Path::new(&hp.path);
            match hp.type_.as_deref().unwrap_or("") {
                "DirectoryOrCreate" => std::fs::create_dir_all(path).map_err(|e| {
                    config_error(format!("hostPath {:?}: creating {}: {e}", v.name, hp.path))
                })?,
                "Directory" if !path.is_dir() => {
                    return Err(config_error(format!(
                        "hostPath {:?}: {} is not a directory",
                        v.name, hp.path
                    )));
                }
                "File" if !path.is_file() => {
                    return Err(config_error(format!(
                        "hostPath {:?}: {} is not a file",
                        v.name, hp.path
                    )));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Unmounts memory-backed emptyDirs and removes the pod directory.
pub fn remove_pod_dir(uid: &str, cfg: &RuntimeConfig) -> std::io::Result<()> {
    let pod_dir = cfg.pod_dir(uid);
    for m in mounts_under(&pod_dir) {
        let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
    }
    match std::fs::remove_dir_all(&pod_dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn is_mount_point(dir: &Path) -> bool {
    mounts_under(dir).iter().any(|m| m == dir)
}

/// Mount points at or below `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}
