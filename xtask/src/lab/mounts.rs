//! Mounts the lab leaves behind: overlay rootfs mounts, sandbox `/dev/shm` mounts and the
//! nsfs bind mounts that keep pod network namespaces alive.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountEntry {
    pub mount_id: u64,
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
}

/// Parses `/proc/self/mountinfo`:
/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`.
/// The optional fields run up to a lone `-`, after which come the type and the source.
pub(crate) fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let mount_id = fields.first()?.parse().ok()?;
            let mount_point = PathBuf::from(unescape(fields.get(4)?));
            let sep = fields.iter().skip(6).position(|f| *f == "-")? + 6;
            let fs_type = unescape(fields.get(sep + 1)?);
            let source = unescape(fields.get(sep + 2).copied().unwrap_or(""));
            Some(MountEntry {
                mount_id,
                mount_point,
                fs_type,
                source,
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(crate) fn current_mounts() -> Vec<MountEntry> {
    fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_mountinfo(&t))
        .unwrap_or_default()
}

/// Mounts at or below any of `dirs`, deepest first (and, at equal depth, the most recently
/// mounted first), which is the order they can be unmounted in.
pub(crate) fn mounts_under(mounts: &[MountEntry], dirs: &[PathBuf]) -> Vec<MountEntry> {
    let mut found: Vec<MountEntry> = mounts
        .iter()
        .filter(|m| dirs.iter().any(|d| m.mount_point.starts_with(d)))
        .cloned()
        .collect();
    found.sort_by(|a, b| {
        let depth = |m: &MountEntry| m.mount_point.components().count();
        depth(b).cmp(&depth(a)).then(b.mount_id.cmp(&a.mount_id))
    });
    found
}

/// Unmounts `path`, detaching it lazily if a plain unmount says it is busy. A path that is
/// no longer a mount point counts as done.
pub(crate) fn unmount(path: &Path) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the calls.
    let rc = unsafe { libc::umount2(c.as_ptr(), libc::UMOUNT_NOFOLLOW) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EINVAL) | Some(libc::ENOENT) => Ok(()),
        Some(libc::EBUSY) => {
            // SAFETY: as above.
            let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
            if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        }
        _ => Err(err),
    }
}

/// Unmounts everything at or below `dirs`, rereading the mount table between rounds because
/// mounts can be stacked on the same point. Returns what was unmounted and what could not be.
pub(crate) fn unmount_all_under(dirs: &[PathBuf]) -> (Vec<String>, Vec<String>) {
    let mut done = Vec::new();
    let mut failed = Vec::new();
    for _round in 0..8 {
        let pending = mounts_under(&current_mounts(), dirs);
        if pending.is_empty() {
            return (done, failed);
        }
        let mut progress = false;
        for m in pending {
            match unmount(&m.mount_point) {
                Ok(()) => {
                    progress = true;
                    done.push(format!("{} ({})", m.mount_point.display(), m.fs_type));
                }
                Err(e) => {
                    failed.push(format!("unmount {}: {e}", m.mount_point.display()));
                }
            }
        }
        if !progress {
            break;
        }
        failed.clear();
    }
    for m in mounts_under(&current_mounts(), dirs) {
        let msg = format!("still mounted: {} ({})", m.mount_point.display(), m.fs_type);
        if !failed.contains(&msg) {
            failed.push(msg);
        }
    }
    (done, failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
600 27 0:90 / /var/lib/podlapse-lab/containerd/state/io.containerd.runtime.v2.task/k8s.io/abc/rootfs rw,relatime shared:5 master:1 - overlay overlay rw,lowerdir=/a:/b,upperdir=/c,workdir=/d
601 27 0:91 / /var/lib/podlapse-lab/containerd/state/io.containerd.grpc.v1.cri/sandboxes/abc/shm rw,nosuid - tmpfs shm rw,size=65536k
602 27 0:4 net:[4026532290] /var/lib/podlapse-lab/containerd/state/io.containerd.grpc.v1.cri/netns/cni-1234 rw shared:7 - nsfs nsfs rw
603 27 0:92 / /var/lib/podlapse-lab-images/x rw - tmpfs tmpfs rw
604 27 0:93 / /tmp/with\\040space rw - tmpfs tmpfs rw
599 600 0:94 / /var/lib/podlapse-lab/containerd/state/io.containerd.runtime.v2.task/k8s.io/abc/rootfs/dev rw - tmpfs tmpfs rw
";

    #[test]
    fn parses_fields_and_escapes() {
        let m = parse_mountinfo(SAMPLE);
        assert_eq!(m.len(), 8);
        assert_eq!(m[2].fs_type, "overlay");
        assert_eq!(m[4].fs_type, "nsfs");
        assert_eq!(m[4].mount_id, 602);
        assert_eq!(m[6].mount_point, PathBuf::from("/tmp/with space"));
        assert_eq!(m[0].source, "/dev/vda");
    }

    #[test]
    fn selects_lab_mounts_deepest_first() {
        let m = parse_mountinfo(SAMPLE);
        let under = mounts_under(&m, &[PathBuf::from("/var/lib/podlapse-lab")]);
        let points: Vec<String> = under
            .iter()
            .map(|m| m.mount_point.display().to_string())
            .collect();
        assert_eq!(under.len(), 4, "{points:?}");
        // The nested mount first although it has the lowest id, then equal depths newest
        // first.
        assert!(points[0].ends_with("/rootfs/dev"), "{points:?}");
        assert!(points[1].ends_with("/shm"), "{points:?}");
        assert!(points.iter().all(|p| !p.contains("podlapse-lab-images")));
    }
}
