//! Pod volumes on the node: the pod directory, emptyDir (on disk or tmpfs for
//! `medium: Memory`), downwardAPI files, and checks for hostPath. kubelet's volume manager does this before
//! the sandbox is created.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

use super::config::RuntimeConfig;
use super::labels;
use super::{SyncError, SyncReason};
use crate::kubelet::downward_api;

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
        } else if let Some(source) = &v.downward_api {
            let dir = cfg.downward_api_path(uid, &v.name);
            let node = cfg.allocatable.as_ref().ok_or_else(|| {
                config_error(format!(
                    "downwardAPI {:?}: the node's allocatable is not known",
                    v.name
                ))
            })?;
            let files = downward_api::volume_files(pod, source, node)
                .map_err(|e| config_error(format!("downwardAPI {:?}: {e}", v.name)))?;
            write_atomically(&dir, &files)
                .map_err(|e| config_error(format!("downwardAPI {:?}: {e}", v.name)))?;
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

/// kubelet's AtomicWriter layout: the files in a timestamped directory `..<stamp>`, the
/// link `..data` to it, and a link per top-level entry through `..data`, so a reader
/// sees either all the old files or all the new ones. Written once per pod start; an
/// existing `..data` is left as it is.
fn write_atomically(dir: &Path, files: &[downward_api::VolumeFile]) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let data = dir.join("..data");
    if data.exists() {
        return Ok(());
    }
    let stamp = chrono_like_stamp();
    let version = dir.join(&stamp);
    let fail = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    for f in files {
        let rel = Path::new(&f.path);
        if rel.is_absolute() || rel.components().any(|c| c.as_os_str() == "..") {
            return Err(format!(
                "path {:?} must be relative and not contain '..'",
                f.path
            ));
        }
        let target = version.join(rel);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| fail("creating", parent, e))?;
        }
        std::fs::write(&target, &f.contents).map_err(|e| fail("writing", &target, e))?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(f.mode as u32))
            .map_err(|e| fail("setting the mode of", &target, e))?;
    }
    std::fs::create_dir_all(&version).map_err(|e| fail("creating", &version, e))?;
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&stamp, &tmp).map_err(|e| fail("linking", &tmp, e))?;
    std::fs::rename(&tmp, &data).map_err(|e| fail("renaming to", &data, e))?;
    let mut tops: Vec<&str> = files
        .iter()
        .filter_map(|f| Path::new(&f.path).components().next())
        .filter_map(|c| c.as_os_str().to_str())
        .collect();
    tops.sort();
    tops.dedup();
    for top in tops {
        let link = dir.join(top);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(Path::new("..data").join(top), &link)
            .map_err(|e| fail("linking", &link, e))?;
    }
    Ok(())
}

/// The name of a version directory: `..` and the time, as kubelet's writer names it.
fn chrono_like_stamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("..{}_{:09}", now.as_secs(), now.subsec_nanos())
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
