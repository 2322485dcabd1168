//! `down`: remove every trace of the lab, in the order that lets each step succeed:
//! workloads, processes, mounts, links, firewall rules, host files, cgroups, the root.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::baseline::{self, Baseline, Select, WATCHED_DIRS};
use super::containerd;
use super::error::LabError;
use super::mounts;
use super::network::{self, Dump, Family};
use super::paths::{self, LabPaths};
use super::process;
use super::registry;
use super::state::DownReport;

/// How long containerd and the registry get to exit on SIGTERM before SIGKILL.
const GRACE: Duration = Duration::from_secs(5);

pub(crate) fn down_locked(
    paths: &LabPaths,
    progress: &dyn Fn(&str),
) -> Result<DownReport, LabError> {
    let mut report = DownReport::default();
    let mut problems = Vec::new();
    let baseline = Baseline::load(paths);

    // First, so that the lab stops counting as up the moment teardown begins.
    let state_file = paths.state_file();
    if state_file.exists() {
        match fs::remove_file(&state_file) {
            Ok(()) => report.paths.push(state_file.display().to_string()),
            Err(e) => problems.push(format!("remove {}: {e}", state_file.display())),
        }
    }

    if containerd::responsive(paths) {
        progress("removing pods and containers through containerd");
        let (removed, p) = containerd::remove_workloads(paths);
        report.containers = removed;
        problems.extend(p);
    }

    progress("stopping lab processes");
    stop_processes(paths, baseline.as_ref(), &mut report, &mut problems);

    progress("unmounting and removing network namespaces");
    let lab_netns = baseline::dir_entries(&paths.netns_dir()).unwrap_or_default();
    let host_netns = new_host_netns(baseline.as_ref());
    let mut mount_dirs = vec![paths.root.clone()];
    mount_dirs.extend(host_netns.iter().cloned());
    let (unmounted, failed) = mounts::unmount_all_under(&mount_dirs);
    report.mounts = unmounted;
    problems.extend(failed);
    report.netns.extend(
        lab_netns
            .iter()
            .map(|n| paths.netns_dir().join(n).display().to_string()),
    );
    for ns in &host_netns {
        match fs::remove_file(ns) {
            Ok(()) => report.netns.push(ns.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => problems.push(format!("remove {}: {e}", ns.display())),
        }
    }

    // The bridge, the firewall rules, the CNI cache and the k8s.io cgroups are shared by
    // every lab on the host; while a lab under another root runs, or its root is still there
    // (a lab whose daemons were killed), they are its, for its own `down` to remove.
    match other_lab(paths) {
        Some(other) => {
            if baseline.is_some() {
                problems.push(format!(
                    "the lab at {} {}; left the bridge, iptables rules, CNI cache and cgroups \
                     alone",
                    other.root.display(),
                    other.why
                ));
            }
        }
        None => {
            progress("removing the bridge and veths");
            network::delete_links(&mut report.links, &mut problems);

            progress("removing iptables rules and chains");
            remove_firewall(baseline.as_ref(), &mut report, &mut problems);

            progress("removing host files and cgroups");
            remove_host_paths(baseline.as_ref(), &mut report, &mut problems);
            remove_cgroups(baseline.as_ref(), &mut report, &mut problems);
        }
    }

    if paths.root.exists() {
        progress("removing the lab root");
        remove_root(paths, &mut report, &mut problems);
    }

    if problems.is_empty() {
        Ok(report)
    } else {
        Err(LabError::TeardownIncomplete {
            problems,
            report: Box::new(report),
        })
    }
}

/// Another lab that owns the host's shared lab resources, and why.
pub(crate) struct OtherLab {
    pub(crate) root: PathBuf,
    why: &'static str,
}

/// Another lab that still owns the shared resources: one whose containerd or registry runs,
/// else the default root (or `PODLAPSE_LAB_DIR`'s) when it still holds a lab, up or crashed.
fn other_lab(paths: &LabPaths) -> Option<OtherLab> {
    if let Some(root) = other_running_lab(paths) {
        return Some(OtherLab {
            root,
            why: "is running",
        });
    }
    other_lab_among(
        paths,
        &[
            LabPaths::from_env().root,
            PathBuf::from(paths::DEFAULT_LAB_DIR),
        ],
    )
}

/// The first of `roots`, other than this lab's own, that still holds a lab.
pub(crate) fn other_lab_among(paths: &LabPaths, roots: &[PathBuf]) -> Option<OtherLab> {
    roots
        .iter()
        .find(|root| **root != paths.root && LabPaths::new(root.as_path()).holds_a_lab())
        .map(|root| OtherLab {
            root: root.clone(),
            why: "still exists (run `cargo xtask lab down` for it)",
        })
}

/// The root of another lab whose containerd or registry is running, if any: a daemon whose
/// config file sits where a lab keeps it, under a directory with a lab's marker files.
fn other_running_lab(paths: &LabPaths) -> Option<PathBuf> {
    const CONFIGS: [(&str, &str); 2] = [
        (containerd::PROGRAM, "containerd/config.toml"),
        (registry::PROGRAM, "registry/config.yml"),
    ];
    process::all_pids().into_iter().find_map(|pid| {
        let comm = process::proc_stat(pid)?.comm;
        let (_, suffix) = CONFIGS.iter().find(|(c, _)| *c == comm)?;
        let cmdline = process::cmdline(pid);
        let config = cmdline.split(' ').find(|a| a.ends_with(suffix))?;
        let root = Path::new(config).parent()?.parent()?.to_owned();
        (root != paths.root && LabPaths::new(root.clone()).holds_a_lab() && process::is_alive(pid))
            .then_some(root)
    })
}

/// containerd first (so nothing new starts), then the shims with everything they run, any
/// runc still at work and every process left in a cgroup the lab created; the registry last.
/// Only processes whose command line names the lab root, their descendants and the lab's
/// cgroup members are touched.
fn stop_processes(
    paths: &LabPaths,
    baseline: Option<&Baseline>,
    report: &mut DownReport,
    problems: &mut Vec<String>,
) {
    let protected = process::self_and_ancestors();
    let lab_pids = |want: &dyn Fn(&str) -> bool| -> BTreeSet<u32> {
        process::all_pids()
            .into_iter()
            .filter(|p| !protected.contains(p))
            .filter(|&p| process::proc_stat(p).is_some_and(|s| want(&s.comm)))
            .filter(|&p| paths.mentions_root(&process::cmdline(p)))
            .collect()
    };
    let record = |pids: &BTreeSet<u32>, report: &mut DownReport| {
        for &p in pids {
            report.processes.push(process::describe_pid(p));
        }
    };

    let daemons = lab_pids(&|comm| comm == containerd::PROGRAM);
    record(&daemons, report);
    for p in process::terminate(&daemons, GRACE) {
        problems.push(format!("containerd pid {p} survived SIGKILL"));
    }

    // Container processes may fork while their siblings die, so sweep until nothing is left.
    let is_runtime = |comm: &str| comm.starts_with("containerd-shim") || comm == "runc";
    let mut survivors = BTreeSet::new();
    for _ in 0..4 {
        let shims = lab_pids(&|comm| comm.starts_with("containerd-shim"));
        let mut victims = process::descendants(&shims);
        victims.extend(&shims);
        victims.extend(pids_in_new_cgroups(baseline));
        victims.extend(lab_pids(&is_runtime));
        victims.retain(|p| !protected.contains(p) && process::is_alive(*p));
        if victims.is_empty() {
            break;
        }
        record(&victims, report);
        survivors = process::kill_now(&victims);
    }
    for p in survivors.into_iter().filter(|p| process::is_alive(*p)) {
        problems.push(format!("survived SIGKILL: {}", process::describe_pid(p)));
    }

    let registries = lab_pids(&|comm| comm == registry::PROGRAM);
    record(&registries, report);
    for p in process::terminate(&registries, GRACE) {
        problems.push(format!("registry pid {p} survived SIGKILL"));
    }
}

/// Processes in cgroups at or below `k8s.io` that did not exist before `up`.
fn pids_in_new_cgroups(baseline: Option<&Baseline>) -> BTreeSet<u32> {
    let Some(b) = baseline else {
        return BTreeSet::new();
    };
    baseline::lab_cgroups()
        .into_iter()
        .filter(|c| !b.cgroups.contains(c))
        .filter_map(|c| fs::read_to_string(c.join("cgroup.procs")).ok())
        .flat_map(|t| {
            t.lines()
                .filter_map(|l| l.trim().parse::<u32>().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `cni-*` entries of /run/netns created since `up` (none without a baseline: another
/// runtime's namespaces look the same).
fn new_host_netns(baseline: Option<&Baseline>) -> Vec<PathBuf> {
    let Some(b) = baseline else {
        return Vec::new();
    };
    let dir = Path::new(paths::HOST_NETNS_DIR);
    let before = b.dirs.get(dir).cloned().flatten().unwrap_or_default();
    baseline::dir_entries(dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.starts_with("cni-") && !before.contains(e))
        .map(|e| dir.join(e))
        .collect()
}

fn remove_firewall(
    baseline: Option<&Baseline>,
    report: &mut DownReport,
    problems: &mut Vec<String>,
) {
    for family in Family::ALL {
        let now = match network::save(family) {
            Ok(text) => Dump::parse(&text),
            Err(e) => {
                problems.push(e.to_string());
                continue;
            }
        };
        let before = match baseline {
            Some(b) => Dump::parse(b.iptables(family)),
            None => now.without_lab_rules(),
        };
        let cleanup = network::cleanup(&before, &now);
        match network::apply(family, &cleanup) {
            Ok(()) => {
                let label = family.label();
                report
                    .iptables_rules
                    .extend(cleanup.rules.iter().map(|r| format!("{label} {r}")));
                report
                    .iptables_chains
                    .extend(cleanup.chains.iter().map(|c| format!("{label} {c}")));
            }
            Err(e) => problems.push(e.to_string()),
        }
    }
    if let Some(b) = baseline {
        network::delete_new_empty_tables(&b.nft_tables, &mut report.host_settings, problems);
        network::restore_ip_forward(b.ip_forward.as_deref(), &mut report.host_settings, problems);
    }
}

/// Entries of the watched host directories that appeared since `up`; directories that did
/// not exist then go entirely once emptied.
fn remove_host_paths(
    baseline: Option<&Baseline>,
    report: &mut DownReport,
    problems: &mut Vec<String>,
) {
    for w in WATCHED_DIRS {
        let dir = Path::new(w.path);
        let Some(now) = baseline::dir_entries(dir) else {
            continue;
        };
        let before: Option<Vec<String>> = match baseline {
            Some(b) => match b.dirs.get(dir) {
                Some(entries) => entries.clone(),
                None => continue,
            },
            // Without a baseline only the CNI result cache is unmistakably the lab's.
            None if w.select == Select::CniResults => Some(Vec::new()),
            None => continue,
        };
        let existed = before.is_some();
        let before = before.unwrap_or_default();
        let new: Vec<&String> = now.iter().filter(|e| !before.contains(e)).collect();
        for entry in w.select.pick(&new, &now) {
            let path = dir.join(entry);
            let _ = mounts::unmount(&path);
            match remove_any(&path) {
                Ok(()) => report.paths.push(path.display().to_string()),
                Err(e) => problems.push(format!("remove {}: {e}", path.display())),
            }
        }
        if !existed && baseline::dir_entries(dir).is_some_and(|e| e.is_empty()) {
            match fs::remove_dir(dir) {
                Ok(()) => report.paths.push(dir.display().to_string()),
                Err(e) => problems.push(format!("remove {}: {e}", dir.display())),
            }
        }
    }
}

fn remove_any(path: &Path) -> std::io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Cgroup directories (only removable with rmdir, children first) created since `up`.
fn remove_cgroups(
    baseline: Option<&Baseline>,
    report: &mut DownReport,
    problems: &mut Vec<String>,
) {
    let Some(b) = baseline else {
        return;
    };
    let mut new: Vec<PathBuf> = baseline::lab_cgroups()
        .into_iter()
        .filter(|c| !b.cgroups.contains(c))
        .collect();
    new.sort_by_key(|c| std::cmp::Reverse(c.components().count()));
    for c in new {
        match fs::remove_dir(&c) {
            Ok(()) => report.paths.push(c.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => problems.push(format!("rmdir cgroup {}: {e}", c.display())),
        }
    }
}

/// Removes the root, but never while anything is mounted below it: removing recursively
/// through a mount would delete whatever the mount shows.
fn remove_root(paths: &LabPaths, report: &mut DownReport, problems: &mut Vec<String>) {
    let still = mounts::mounts_under(&mounts::current_mounts(), std::slice::from_ref(&paths.root));
    if !still.is_empty() {
        problems.push(format!(
            "left {} in place: {} mount(s) below it could not be removed",
            paths.root.display(),
            still.len()
        ));
        return;
    }
    match fs::remove_dir_all(&paths.root) {
        Ok(()) => report.paths.push(paths.root.display().to_string()),
        Err(e) => problems.push(format!("remove {}: {e}", paths.root.display())),
    }
}
