//! Which cgroup hierarchies this node mounts and where, read from `/proc/self/mountinfo`.
//!
//! A cgroup path such as `/podlapse/burstable` exists once per hierarchy: under every v1
//! mount and, on a hybrid node, under the v2 `unified` mount as well, because runc joins
//! all of them. Paths map to `<mountpoint><path>` whatever the mount's root is, as runc's
//! cgroupfs driver maps an absolute cgroups path.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::CmError;

/// Where mountinfo lives for the calling process.
pub const MOUNTINFO: &str = "/proc/self/mountinfo";

/// Controllers a v1 hierarchy can carry; other super options are mount flags.
const V1_CONTROLLERS: &[&str] = &[
    "blkio",
    "cpu",
    "cpuacct",
    "cpuset",
    "debug",
    "devices",
    "freezer",
    "hugetlb",
    "memory",
    "misc",
    "net_cls",
    "net_prio",
    "perf_event",
    "pids",
    "rdma",
];

/// One mounted v1 hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    pub mountpoint: PathBuf,
    /// Its controllers, and `name=<x>` for a named hierarchy such as `name=systemd`.
    pub controllers: BTreeSet<String>,
}

/// The node's cgroup mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupLayout {
    /// One hierarchy per controller (or co-mounted group). `unified` is the v2 mount a
    /// hybrid node keeps beside them, which carries no limits podlapse sets.
    V1 {
        hierarchies: Vec<Hierarchy>,
        unified: Option<PathBuf>,
    },
    /// The single v2 hierarchy; controllers reach children through
    /// `cgroup.subtree_control`.
    V2 { mountpoint: PathBuf },
}

impl CgroupLayout {
    /// The calling process's view of the cgroup mounts.
    pub fn discover() -> Result<CgroupLayout, CmError> {
        let text = std::fs::read_to_string(MOUNTINFO).map_err(|source| CmError::Read {
            path: PathBuf::from(MOUNTINFO),
            source,
        })?;
        CgroupLayout::from_mountinfo(&text)
    }

    /// Parses mountinfo text. A hierarchy mounted twice (bind mounts) counts once, at the
    /// mount of its root when there is one.
    pub fn from_mountinfo(text: &str) -> Result<CgroupLayout, CmError> {
        // (device, root is "/", mountpoint, controllers) per cgroup v1 mount.
        let mut v1: Vec<(String, bool, PathBuf, BTreeSet<String>)> = Vec::new();
        let mut v2: Option<(bool, PathBuf)> = None;
        for line in text.lines() {
            let Some(m) = parse_line(line) else {
                continue;
            };
            let at_root = m.root == "/";
            match m.fs_type {
                "cgroup" => {
                    let controllers: BTreeSet<String> = m
                        .super_options
                        .split(',')
                        .filter(|o| V1_CONTROLLERS.contains(o) || o.starts_with("name="))
                        .map(str::to_string)
                        .collect();
                    if controllers.is_empty() {
                        continue;
                    }
                    match v1.iter_mut().find(|h| h.0 == m.device) {
                        Some(seen) if !seen.1 && at_root => {
                            *seen = (m.device.to_string(), at_root, m.mountpoint, controllers)
                        }
                        Some(_) => {}
                        None => v1.push((m.device.to_string(), at_root, m.mountpoint, controllers)),
                    }
                }
                "cgroup2" => match &v2 {
                    Some((seen_at_root, _)) if *seen_at_root || !at_root => {}
                    _ => v2 = Some((at_root, m.mountpoint)),
                },
                _ => {}
            }
        }
        // A v1 mount that carries only a name (systemd's tracking hierarchy) does not
        // make a node v1: controllers live on the v2 mount then.
        let has_v1_controllers = v1
            .iter()
            .any(|h| h.3.iter().any(|c| !c.starts_with("name=")));
        if has_v1_controllers {
            Ok(CgroupLayout::V1 {
                hierarchies: v1
                    .into_iter()
                    .map(|(_, _, mountpoint, controllers)| Hierarchy {
                        mountpoint,
                        controllers,
                    })
                    .collect(),
                unified: v2.map(|(_, p)| p),
            })
        } else if let Some((_, mountpoint)) = v2 {
            Ok(CgroupLayout::V2 { mountpoint })
        } else {
            Err(CmError::NoCgroupMounts {
                mountinfo: PathBuf::from(MOUNTINFO),
            })
        }
    }

    pub fn is_unified(&self) -> bool {
        matches!(self, CgroupLayout::V2 { .. })
    }

    /// Every mountpoint a cgroup path exists under: the v1 hierarchies, then the v2 mount.
    pub fn mountpoints(&self) -> Vec<&Path> {
        match self {
            CgroupLayout::V1 {
                hierarchies,
                unified,
            } => hierarchies
                .iter()
                .map(|h| h.mountpoint.as_path())
                .chain(unified.as_deref())
                .collect(),
            CgroupLayout::V2 { mountpoint } => vec![mountpoint.as_path()],
        }
    }

    /// The v1 mountpoint of `controller`, if a hierarchy carries it.
    pub fn controller_mountpoint(&self, controller: &str) -> Option<&Path> {
        match self {
            CgroupLayout::V1 { hierarchies, .. } => hierarchies
                .iter()
                .find(|h| h.controllers.contains(controller))
                .map(|h| h.mountpoint.as_path()),
            CgroupLayout::V2 { .. } => None,
        }
    }
}

/// The directory of cgroup `path` (absolute, `/`-separated) under `mountpoint`.
pub fn cgroup_dir(mountpoint: &Path, path: &str) -> PathBuf {
    mountpoint.join(path.trim_start_matches('/'))
}

struct Mount<'a> {
    device: &'a str,
    root: String,
    mountpoint: PathBuf,
    fs_type: &'a str,
    super_options: &'a str,
}

/// One mountinfo line: `id parent major:minor root mountpoint options [optional...] -
/// fstype source super-options`.
fn parse_line(line: &str) -> Option<Mount<'_>> {
    let (left, right) = line.split_once(" - ")?;
    let mut l = left.split(' ');
    let (_id, _parent, device, root, mountpoint) =
        (l.next()?, l.next()?, l.next()?, l.next()?, l.next()?);
    let mut r = right.split(' ');
    let (fs_type, _source, super_options) = (r.next()?, r.next()?, r.next().unwrap_or(""));
    Some(Mount {
        device,
        root: unescape(root),
        mountpoint: PathBuf::from(unescape(mountpoint)),
        fs_type,
        super_options,
    })
}

/// mountinfo writes space, tab, newline and backslash as `\ooo` octal escapes.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && b.get(i + 1..i + 4)
                .is_some_and(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This project's lab VM: v1 per controller plus the v2 `unified` mount.
    const HYBRID: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn hybrid_lab_layout() {
        let layout = CgroupLayout::from_mountinfo(HYBRID).unwrap();
        let CgroupLayout::V1 {
            hierarchies,
            unified,
        } = &layout
        else {
            panic!("expected v1: {layout:?}");
        };
        assert_eq!(hierarchies.len(), 9);
        assert_eq!(
            unified.as_deref(),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            layout.controller_mountpoint("memory"),
            Some(Path::new("/sys/fs/cgroup/memory"))
        );
        assert_eq!(
            layout.controller_mountpoint("name=systemd"),
            Some(Path::new("/sys/fs/cgroup/systemd"))
        );
        assert_eq!(layout.mountpoints().len(), 10);
        assert_eq!(
            layout.mountpoints().last(),
            Some(&Path::new("/sys/fs/cgroup/unified"))
        );
        assert!(!layout.is_unified());
    }

    #[test]
    fn comounted_controllers_and_flags() {
        let text = "\
30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
31 25 0:27 / /sys/fs/cgroup/net_cls,net_prio rw - cgroup cgroup rw,net_cls,net_prio
32 25 0:28 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,release_agent=/x,name=systemd
33 25 0:29 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory,clone_children
";
        let layout = CgroupLayout::from_mountinfo(text).unwrap();
        let cpu = layout.controller_mountpoint("cpuacct").unwrap();
        assert_eq!(cpu, Path::new("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(layout.controller_mountpoint("cpu"), Some(cpu));
        let CgroupLayout::V1 { hierarchies, .. } = &layout else {
            unreachable!()
        };
        let names: Vec<_> = hierarchies
            .iter()
            .map(|h| h.controllers.iter().cloned().collect::<Vec<_>>().join(","))
            .collect();
        assert_eq!(
            names,
            ["cpu,cpuacct", "net_cls,net_prio", "name=systemd", "memory"]
        );
    }

    #[test]
    fn pure_v2() {
        let text = "\
25 1 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
        assert_eq!(
            CgroupLayout::from_mountinfo(text).unwrap(),
            CgroupLayout::V2 {
                mountpoint: PathBuf::from("/sys/fs/cgroup")
            }
        );
    }

    #[test]
    fn a_named_v1_hierarchy_alone_is_still_v2() {
        let text = "\
25 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw
26 1 0:23 / /run/systemd-v1 rw - cgroup cgroup rw,name=systemd
";
        assert!(CgroupLayout::from_mountinfo(text).unwrap().is_unified());
    }

    #[test]
    fn bind_mounts_count_once_preferring_the_root() {
        let text = "\
40 1 0:32 /kubepods /host/memory rw - cgroup cgroup rw,memory
41 1 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
42 1 0:32 / /elsewhere/memory rw - cgroup cgroup rw,memory
";
        let layout = CgroupLayout::from_mountinfo(text).unwrap();
        assert_eq!(layout.mountpoints(), [Path::new("/sys/fs/cgroup/memory")]);
    }

    #[test]
    fn escaped_mountpoints() {
        let text = "40 1 0:32 / /mnt/cg\\040v1/mem rw - cgroup cgroup rw,memory\n";
        let layout = CgroupLayout::from_mountinfo(text).unwrap();
        assert_eq!(layout.mountpoints(), [Path::new("/mnt/cg v1/mem")]);
        assert_eq!(unescape("a\\134b\\011"), "a\\b\t");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
    }

    #[test]
    fn no_cgroups_at_all() {
        let err = CgroupLayout::from_mountinfo("22 27 0:21 / /proc rw - proc proc rw\n");
        assert!(matches!(err, Err(CmError::NoCgroupMounts { .. })));
    }

    #[test]
    fn paths_join_below_the_mountpoint() {
        assert_eq!(
            cgroup_dir(Path::new("/sys/fs/cgroup/cpu"), "/podlapse/burstable"),
            Path::new("/sys/fs/cgroup/cpu/podlapse/burstable")
        );
    }
}
