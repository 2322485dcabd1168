//! What the kernel accounts, for the benchmarks that judge a cost as a share of the
//! node's CPU: the CPU time of cgroups (cgroup v1's `cpuacct.usage` in ns, else cgroup
//! v2's `cpu.stat` `usage_usec`), and the run time of eBPF programs (the kernel's BPF
//! statistics, on only while a [`BpfStats`] lives).
//!
//! The node's CPU comes from cgroups the benchmark owns: the lab's containerd is moved
//! into a cgroup of its own ([`NodeCpu`]), so its shims, runc and the CNI plugins it
//! starts are counted with it, and the pods' cgroups are read at their root. The agent
//! under test runs in another ([`OwnedCgroup`]). A round's [`RoundCost`] is the difference
//! of readings before and after the round's pods; [`RoundCost::share`] is what podlapse
//! added over what the node spent.

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use serde::Serialize;

/// Where the kernel's BPF statistics switch is.
pub const STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// The cgroup hierarchy CPU time is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// A cgroup v1 hierarchy with the cpuacct controller, mounted here.
    V1Cpuacct(PathBuf),
    /// The cgroup v2 hierarchy, mounted here.
    V2(PathBuf),
}

impl Hierarchy {
    /// The node's: cgroup v1's cpuacct hierarchy where one is mounted (nanoseconds, and
    /// the one the host's cgroupfs pods are charged in), else the v2 hierarchy.
    pub fn detect() -> anyhow::Result<Hierarchy> {
        let mounts = std::fs::read_to_string("/proc/self/mounts")
            .context("reading /proc/self/mounts for the cgroup hierarchies")?;
        Hierarchy::from_mounts(&mounts)
            .context("no cgroup v1 cpuacct hierarchy and no cgroup v2 one in /proc/self/mounts")
    }

    fn from_mounts(mounts: &str) -> Option<Hierarchy> {
        let entries: Vec<(&str, &str, &str)> = mounts
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                Some((*f.get(1)?, *f.get(2)?, *f.get(3)?))
            })
            .collect();
        let v1 = entries
            .iter()
            .find(|(_, fs, opts)| *fs == "cgroup" && opts.split(',').any(|o| o == "cpuacct"));
        let v2 = entries.iter().find(|(_, fs, _)| *fs == "cgroup2");
        match (v1, v2) {
            (Some((dir, _, _)), _) => Some(Hierarchy::V1Cpuacct(PathBuf::from(dir))),
            (None, Some((dir, _, _))) => Some(Hierarchy::V2(PathBuf::from(dir))),
            (None, None) => None,
        }
    }

    fn root(&self) -> &Path {
        match self {
            Hierarchy::V1Cpuacct(d) | Hierarchy::V2(d) => d,
        }
    }

    /// The directory of cgroup `path` (`/podlapse`, say).
    pub fn dir(&self, path: &str) -> PathBuf {
        self.root().join(path.trim_start_matches('/'))
    }

    /// The CPU time charged to the cgroup at `dir` and below, in ns; `None` when it does
    /// not exist.
    pub fn usage_ns(&self, dir: &Path) -> anyhow::Result<Option<u64>> {
        let (file, parse): (&str, fn(&str) -> Option<u64>) = match self {
            Hierarchy::V1Cpuacct(_) => ("cpuacct.usage", |t| t.trim().parse().ok()),
            Hierarchy::V2(_) => ("cpu.stat", parse_cpu_stat_ns),
        };
        let path = dir.join(file);
        match std::fs::read_to_string(&path) {
            Ok(text) => parse(&text)
                .map(Some)
                .with_context(|| format!("{}: no CPU usage in {text:?}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !dir.exists() => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
}

/// `usage_usec` of a cgroup v2 `cpu.stat`, in ns.
fn parse_cpu_stat_ns(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|us| us * 1000)
}

/// A cgroup the benchmark made for processes of its own choosing; on drop its processes
/// go back to the hierarchy's root and the directory goes.
pub struct OwnedCgroup {
    hierarchy: Hierarchy,
    dir: PathBuf,
}

impl OwnedCgroup {
    /// Makes cgroup `path` (a leftover of a run cut short is reused).
    pub fn create(hierarchy: &Hierarchy, path: &str) -> anyhow::Result<OwnedCgroup> {
        let dir = hierarchy.dir(path);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(OwnedCgroup {
            hierarchy: hierarchy.clone(),
            dir,
        })
    }

    /// Moves process `pid`, all its threads, into the cgroup; what it starts from then on
    /// is born there.
    pub fn add(&self, pid: u32) -> anyhow::Result<()> {
        let procs = self.dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .with_context(|| format!("moving process {pid} into {}", procs.display()))
    }

    /// The cgroup's CPU time so far, in ns.
    pub fn usage_ns(&self) -> anyhow::Result<u64> {
        self.hierarchy
            .usage_ns(&self.dir)?
            .with_context(|| format!("{} is gone", self.dir.display()))
    }

    /// The directory, for a child process to join before it runs (see [`join_in_child`]).
    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }
}

impl Drop for OwnedCgroup {
    fn drop(&mut self) {
        let root = self.hierarchy.root().join("cgroup.procs");
        if let Ok(procs) = std::fs::read_to_string(self.procs_file()) {
            for pid in procs.split_whitespace() {
                let _ = std::fs::write(&root, pid);
            }
        }
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!("bench: could not remove {}: {e}", self.dir.display());
        }
    }
}

/// Makes `cmd`'s process join the cgroup whose `cgroup.procs` is `procs` before it runs
/// anything, so every thread and child it has is charged there.
pub fn join_in_child(cmd: &mut std::process::Command, procs: PathBuf) {
    use std::os::unix::process::CommandExt;
    let procs = std::ffi::CString::new(procs.into_os_string().into_encoded_bytes())
        .expect("a cgroup path has no NUL");
    // SAFETY: between fork and exec only async-signal-safe calls: open, write, close on
    // memory allocated before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // "0" is the writing process itself.
            let n = libc::write(fd, b"0".as_ptr().cast(), 1);
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            if n != 1 {
                return Err(err);
            }
            Ok(())
        });
    }
}

/// The node's CPU: the runtime's cgroup (the lab's containerd moved into one of the
/// benchmark's, or a systemd node's `containerd.service`: either holds the shims, runc
/// and CNI plugins it starts) and the pods' cgroups under their roots.
pub struct NodeCpu {
    hierarchy: Hierarchy,
    runtime: PathBuf,
    /// The cgroup the benchmark made for the runtime, removed on drop.
    _owned: Option<OwnedCgroup>,
    pod_roots: Vec<PathBuf>,
}

/// The cgroup the lab's containerd is moved into. Not a pod cgroup root's name, so the
/// lab's teardown leaves it to [`OwnedCgroup`]'s drop.
const RUNTIME_CGROUP: &str = "/podlapse.bench-runtime";

impl NodeCpu {
    /// Moves the lab's containerd (pid `containerd`) into a cgroup of its own; the pods
    /// are read under `pod_roots` (cgroup paths: `/podlapse`, `/kubepods`). Call it with
    /// no pod running: a shim started before is not moved.
    pub fn around(
        hierarchy: &Hierarchy,
        containerd: u32,
        pod_roots: &[&str],
    ) -> anyhow::Result<NodeCpu> {
        let runtime = OwnedCgroup::create(hierarchy, RUNTIME_CGROUP)?;
        runtime.add(containerd)?;
        Ok(NodeCpu {
            hierarchy: hierarchy.clone(),
            runtime: runtime.dir.clone(),
            _owned: Some(runtime),
            pod_roots: pod_roots.iter().map(|p| hierarchy.dir(p)).collect(),
        })
    }

    /// The runtime's own cgroup as its service manager made it (`/system.slice/
    /// containerd.service`), nothing moved: on a systemd node the runtime's shims stay in
    /// its service's cgroup.
    pub fn of_cgroup(
        hierarchy: &Hierarchy,
        runtime: &str,
        pod_roots: &[&str],
    ) -> anyhow::Result<NodeCpu> {
        let dir = hierarchy.dir(runtime);
        if !dir.is_dir() {
            bail!("the runtime's cgroup {} does not exist", dir.display());
        }
        Ok(NodeCpu {
            hierarchy: hierarchy.clone(),
            runtime: dir,
            _owned: None,
            pod_roots: pod_roots.iter().map(|p| hierarchy.dir(p)).collect(),
        })
    }

    /// [`NodeCpu::around`] the lab's containerd, as `lab up` recorded it.
    pub fn of_lab(hierarchy: &Hierarchy, pod_roots: &[&str]) -> anyhow::Result<NodeCpu> {
        let paths = xtask::lab::LabPaths::from_env();
        let status = xtask::lab::status(&paths)?;
        let Some(state) = status
            .state
            .filter(|_| status.parts.iter().all(|p| p.running))
        else {
            bail!("the node lab at {} is not up", paths.root.display());
        };
        NodeCpu::around(hierarchy, state.containerd_pid, pod_roots)
    }

    /// The node's CPU time so far, in ns.
    pub fn read(&self) -> anyhow::Result<NodeReading> {
        let mut pods = Vec::with_capacity(self.pod_roots.len());
        for dir in &self.pod_roots {
            pods.push((dir.clone(), self.hierarchy.usage_ns(dir)?));
        }
        Ok(NodeReading {
            runtime_ns: self
                .hierarchy
                .usage_ns(&self.runtime)?
                .with_context(|| format!("{} is gone", self.runtime.display()))?,
            pods_ns: pods,
        })
    }
}

/// One reading of [`NodeCpu`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReading {
    pub runtime_ns: u64,
    /// Each pod root's, `None` while it does not exist.
    pub pods_ns: Vec<(PathBuf, Option<u64>)>,
}

impl NodeReading {
    /// The CPU the node spent from `self` to `later`: the runtime's, and the pods' (a
    /// root made in between counts from zero; one removed in between is an error, since
    /// what it held is lost).
    pub fn until(&self, later: &NodeReading) -> anyhow::Result<(u64, u64)> {
        let runtime = later
            .runtime_ns
            .checked_sub(self.runtime_ns)
            .ok_or_else(|| anyhow!("the runtime's cgroup CPU time went down"))?;
        let mut pods = 0;
        for ((dir, before), (_, after)) in self.pods_ns.iter().zip(&later.pods_ns) {
            match (before, after) {
                (Some(_), None) => {
                    bail!(
                        "pod cgroup root {} was removed during the round",
                        dir.display()
                    )
                }
                (b, Some(a)) => pods += a.saturating_sub(b.unwrap_or(0)),
                (None, None) => {}
            }
        }
        Ok((runtime, pods))
    }
}

/// The kernel's BPF run-time statistics, on while this lives. `BPF_ENABLE_STATS` hands
/// back a file descriptor and the kernel counts while it is open: closing it (even when
/// the process dies) puts the setting back, so nothing on the machine stays changed; a
/// setting already on before stays on.
pub struct BpfStats {
    _fd: OwnedFd,
    /// `kernel.bpf_stats_enabled` was already on before: said in the report.
    pub were_on: bool,
}

impl BpfStats {
    pub fn enable() -> anyhow::Result<BpfStats> {
        let were_on = std::fs::read_to_string(STATS_SYSCTL)
            .map(|s| s.trim() == "1")
            .unwrap_or(false);
        aya::sys::enable_stats(aya::sys::Stats::RunTime)
            .map(|fd| BpfStats { _fd: fd, were_on })
            .map_err(|e| anyhow!("enabling the kernel's BPF statistics (BPF_ENABLE_STATS): {e}"))
    }
}

/// The ids of every eBPF program loaded now.
pub fn program_ids() -> BTreeSet<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| p.id())
        .collect()
}

/// The programs loaded since `before` (a [`program_ids`] snapshot): the agent's, when it
/// is what started in between.
pub fn programs_since(before: &BTreeSet<u32>) -> BTreeSet<u32> {
    program_ids().difference(before).copied().collect()
}

/// The run time and hits the kernel counted so far for programs `ids`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ProgramsRun {
    pub run_time_ns: u64,
    pub run_count: u64,
}

pub fn programs_run(ids: &BTreeSet<u32>) -> ProgramsRun {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| ids.contains(&p.id()))
        .fold(ProgramsRun::default(), |sum, p| ProgramsRun {
            run_time_ns: sum.run_time_ns + p.run_time().as_nanos() as u64,
            run_count: sum.run_count + p.run_count(),
        })
}

/// What one round cost: the node's CPU for its pods, and what podlapse added.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct RoundCost {
    pub pods: usize,
    /// containerd and everything it started (shims, runc, the CNI plugins), in ns.
    pub runtime_ns: u64,
    /// The pods' cgroups, in ns.
    pub pods_ns: u64,
    /// podlapse's own process (its threads and children), in ns.
    pub agent_ns: u64,
    /// podlapse's programs' run time, in ns; `None` where the kernel counted none.
    pub programs_ns: Option<u64>,
}

impl RoundCost {
    /// The node's own CPU: its cgroups' time less the programs' (which run in the
    /// context of the task that hit them, mostly the node's: taking all of it off
    /// makes the share a little larger, never smaller).
    pub fn node_ns(&self) -> u64 {
        (self.runtime_ns + self.pods_ns).saturating_sub(self.programs_ns.unwrap_or(0))
    }

    /// What podlapse added: its process and its programs.
    pub fn added_ns(&self) -> u64 {
        self.agent_ns + self.programs_ns.unwrap_or(0)
    }

    /// The added CPU as a share of the node's, in percent.
    pub fn share(&self) -> f64 {
        share(self.added_ns(), self.node_ns())
    }

    /// The programs' part alone, in percent.
    pub fn programs_share(&self) -> Option<f64> {
        self.programs_ns.map(|p| share(p, self.node_ns()))
    }

    /// The node's CPU per pod, in ms.
    pub fn node_ms_per_pod(&self) -> f64 {
        self.node_ns() as f64 / 1e6 / self.pods.max(1) as f64
    }

    /// podlapse's added CPU per pod, in ms.
    pub fn added_ms_per_pod(&self) -> f64 {
        self.added_ns() as f64 / 1e6 / self.pods.max(1) as f64
    }
}

/// `part` over `whole`, in percent; infinite over nothing.
pub fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        f64::INFINITY
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// The median of some rounds' values of `f`.
pub fn median_of(rounds: &[RoundCost], f: impl Fn(&RoundCost) -> f64) -> f64 {
    super::stats::median(&rounds.iter().map(f).collect::<Vec<_>>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpuacct_hierarchy_is_preferred_and_v2_is_the_fallback() {
        let hybrid = "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n\
                      cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0\n\
                      cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";
        assert_eq!(
            Hierarchy::from_mounts(hybrid),
            Some(Hierarchy::V1Cpuacct("/sys/fs/cgroup/cpuacct".into()))
        );
        let joint = "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n";
        assert_eq!(
            Hierarchy::from_mounts(joint),
            Some(Hierarchy::V1Cpuacct("/sys/fs/cgroup/cpu,cpuacct".into()))
        );
        let unified = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n";
        let v2 = Hierarchy::from_mounts(unified).unwrap();
        assert_eq!(v2, Hierarchy::V2("/sys/fs/cgroup".into()));
        assert_eq!(
            v2.dir("/kubepods.slice"),
            PathBuf::from("/sys/fs/cgroup/kubepods.slice")
        );
        assert_eq!(Hierarchy::from_mounts("proc /proc proc rw 0 0\n"), None);
    }

    #[test]
    fn cgroup_v2_usage_is_read_in_ns_from_cpu_stat() {
        let stat = "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\n";
        assert_eq!(parse_cpu_stat_ns(stat), Some(1_234_567_000));
        assert_eq!(parse_cpu_stat_ns("user_usec 3\n"), None);
    }

    #[test]
    fn the_nodes_cpu_over_a_round_counts_a_new_pod_root_from_zero_and_refuses_a_lost_one() {
        let at = |runtime_ns, a, b| NodeReading {
            runtime_ns,
            pods_ns: vec![("/cg/podlapse".into(), a), ("/cg/kubepods".into(), b)],
        };
        let before = at(1_000, Some(500), None);
        let after = at(4_000, Some(800), Some(200));
        assert_eq!(before.until(&after).unwrap(), (3_000, 500));
        let lost = at(4_000, None, Some(200));
        let err = before.until(&lost).unwrap_err().to_string();
        assert!(
            err.contains("/cg/podlapse was removed during the round"),
            "{err}"
        );
        assert!(after.until(&before).is_err(), "time does not go back");
    }

    #[test]
    fn a_share_is_what_podlapse_added_over_the_nodes_own_cpu() {
        let round = RoundCost {
            pods: 4,
            runtime_ns: 300_000_000,
            pods_ns: 110_000_000,
            agent_ns: 6_000_000,
            programs_ns: Some(10_000_000),
        };
        // The programs ran inside the node's 410 ms: its own work is 400 ms, and
        // podlapse added 6 + 10 = 16 ms of it: 4%.
        assert_eq!(round.node_ns(), 400_000_000);
        assert_eq!(round.added_ns(), 16_000_000);
        assert!((round.share() - 4.0).abs() < 1e-9);
        assert!((round.programs_share().unwrap() - 2.5).abs() < 1e-9);
        assert!((round.node_ms_per_pod() - 100.0).abs() < 1e-9);
        assert!((round.added_ms_per_pod() - 4.0).abs() < 1e-9);
        // Where the kernel counted no programs, the share is the process's alone.
        let uncounted = RoundCost {
            programs_ns: None,
            ..round
        };
        assert!((uncounted.share() - 6.0 / 4.1).abs() < 1e-9);
        assert_eq!(uncounted.programs_share(), None);
        assert_eq!(share(1, 0), f64::INFINITY);
    }
}
