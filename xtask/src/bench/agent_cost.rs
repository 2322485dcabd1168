//! What the agent costs the node per pod, as the kernel accounts it (benchmarks 2, 4 and
//! 11): one long-lived `podlapse run --manifests DIR` (release build, probes loaded, as a
//! node runs it) in a cgroup of its own, fed batches of pods through its manifest
//! directory. A batch is its pods written at once, every one started, every manifest
//! removed and every pod cleaned up; its [`RoundCost`] is what the kernel accounted over
//! that whole window: the agent's cgroup and its programs' run time (BPF statistics)
//! against the node's CPU (the lab's containerd in a cgroup of its own with what it
//! starts, and the pods' cgroups).
//!
//! How the batch's end is seen matters: a wait that asked the agent (its API) would make
//! it work for every look, inside the window it is charged for. So the waits read the
//! kernel's evidence instead, at no cost to the agent: the pods' `sleep` processes in
//! their cgroups for "started", and no pod cgroup left under the root for "cleaned up".
//! The agent is asked for the pods' times to Running (its own timeline) once their
//! processes run, before their removal, again every 200 ms until each shows Running:
//! usually once a batch, and inside the window, so its cost is in the share. After the
//! removal it would not do: a deleted pod is kept for the agent's retention (10 s), and
//! 250 pods take longer to remove.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use serde_json::Value;

use super::accounting::{self, BpfStats, Hierarchy, NodeCpu, OwnedCgroup, RoundCost};
use super::agent::Agent;
use super::pods::sleep_pod;

/// The agent's cgroup, outside the node's.
const AGENT_CGROUP: &str = "/podlapse.bench-agent";
/// The agent's pod cgroups under its default `--cgroup-root`: the cgroupfs driver's
/// directory, the systemd driver's slice.
const POD_ROOTS: [&str; 2] = ["/podlapse", "/podlapse.slice"];

/// The node the agent runs pods on.
#[derive(Debug, Clone)]
pub enum Node {
    /// The node lab (`cargo xtask lab`): its containerd is moved into a cgroup of the
    /// benchmark's.
    Lab,
    /// A systemd node's containerd: its socket, and its service's cgroup
    /// (`/system.slice/containerd.service`), read where it is.
    Service {
        cri: std::path::PathBuf,
        cgroup: String,
    },
}
/// How often a wait reads the kernel's evidence (a few reads per pod, this process's CPU).
const LOOK: Duration = Duration::from_millis(20);
/// How often the agent's timeline is asked again for pods not yet shown Running.
const ASK: Duration = Duration::from_millis(200);

/// One batch as the kernel accounted it, and each pod's time to Running as the agent
/// timed it (from its ADD to the Running status), in seconds.
#[derive(Debug, Clone, Serialize)]
pub struct Batch {
    pub cost: RoundCost,
    pub to_running_s: Vec<f64>,
    /// From the manifests' writing to the last pod cgroup's removal.
    pub window_s: f64,
    /// What the agent spends with no pods at all, over a window as long, in ns, where
    /// its idle rate was measured ([`AgentCost::measure_idle`]).
    pub agent_idle_ns: Option<u64>,
}

impl Batch {
    /// The batch's last pod to be Running, from its ADD: what the direct driver's batch
    /// time compares with.
    pub fn slowest_s(&self) -> f64 {
        self.to_running_s.iter().copied().fold(0.0, f64::max)
    }
}

/// Each round's wall-clock ratio, the context beside a share: the direct driver's batch
/// time (`direct_s`, its slowest pod) over the agent's batch's (its slowest pod), so that
/// above 1 the agent was the faster.
pub fn context_ratios(batches: &[Batch], direct_s: &[f64]) -> Vec<f64> {
    batches
        .iter()
        .zip(direct_s)
        .map(|(b, d)| d / b.slowest_s())
        .collect()
}

/// The long-lived agent, the cgroups that account for it and the node, and the BPF
/// statistics while it lives.
pub struct AgentCost {
    // Dropped in this order: the agent stops before its cgroup goes.
    agent: Agent,
    node: NodeCpu,
    cgroup: OwnedCgroup,
    /// The pod cgroups' root directory the kernel's evidence is read under.
    pod_root: std::path::PathBuf,
    programs: BTreeSet<u32>,
    stats: Result<BpfStats, String>,
    batches: usize,
    /// The agent's CPU with no pods, ns per second.
    idle_ns_per_s: Option<f64>,
    /// The agent's node name: its pods from manifests are named `{pod}-{node}`, as
    /// kubelet names a static pod.
    node_name: String,
}

impl AgentCost {
    /// Starts the agent in `work` on the lab, which must run no pod yet (the shims of
    /// pods started before would not be counted as the node's).
    pub fn start(bin: &Path, work: &Path, name: &str) -> anyhow::Result<AgentCost> {
        AgentCost::start_on(bin, work, name, &Node::Lab)
    }

    /// [`AgentCost::start`] on `node`.
    pub fn start_on(bin: &Path, work: &Path, name: &str, node: &Node) -> anyhow::Result<AgentCost> {
        let hierarchy = Hierarchy::detect()?;
        let (node_cpu, cri) = match node {
            Node::Lab => (
                NodeCpu::of_lab(&hierarchy, &POD_ROOTS)?,
                xtask::lab::LabPaths::from_env().cri_socket(),
            ),
            Node::Service { cri, cgroup } => (
                NodeCpu::of_cgroup(&hierarchy, cgroup, &POD_ROOTS)?,
                cri.clone(),
            ),
        };
        let cgroup = OwnedCgroup::create(&hierarchy, AGENT_CGROUP)?;
        let stats = BpfStats::enable().map_err(|e| format!("{e:#}"));
        let before = accounting::program_ids();
        let agent = Agent::start_in(bin, work, name, &[], &cri, Some(cgroup.procs_file()))?;
        // The agent made its QoS cgroups as it started: its driver's root is the one there.
        let pod_root = POD_ROOTS
            .iter()
            .map(|r| hierarchy.dir(r))
            .find(|d| d.is_dir())
            .with_context(|| {
                format!(
                    "the agent made none of its pod cgroup roots ({})",
                    POD_ROOTS.join(", ")
                )
            })?;
        let programs = if stats.is_ok() {
            accounting::programs_since(&before)
        } else {
            BTreeSet::new()
        };
        Ok(AgentCost {
            agent,
            node: node_cpu,
            cgroup,
            pod_root,
            programs,
            stats,
            batches: 0,
            idle_ns_per_s: None,
            node_name: name.to_string(),
        })
    }

    /// The agent's peak resident memory so far (VmHWM), in KiB.
    pub fn peak_rss_kib(&self) -> anyhow::Result<u64> {
        super::memory::status_kib(self.agent.pid(), "VmHWM:")
    }

    /// Why the programs' run time is not counted, where it is not.
    pub fn programs_unmeasured(&self) -> Option<String> {
        match &self.stats {
            Err(e) => Some(e.clone()),
            Ok(_) if self.programs.is_empty() => {
                Some("the agent loaded no program (its probes are off)".into())
            }
            Ok(_) => None,
        }
    }

    /// The kernel's BPF statistics were on before the benchmark (left on).
    pub fn stats_were_on(&self) -> bool {
        self.stats.as_ref().is_ok_and(|s| s.were_on)
    }

    /// Runs one batch of `pods` pods named `{tag}-NNN`, within `timeout` for each of its
    /// two waits.
    pub fn batch(&mut self, tag: &str, pods: usize, timeout: Duration) -> anyhow::Result<Batch> {
        Ok(self.batch_beside(tag, pods, timeout, &BTreeSet::new())?.0)
    }

    /// [`AgentCost::batch`], with the run time the kernel counted for programs `beside`
    /// (another process's, loaded beside the agent) over the same window.
    pub fn batch_beside(
        &mut self,
        tag: &str,
        pods: usize,
        timeout: Duration,
        beside: &BTreeSet<u32>,
    ) -> anyhow::Result<(Batch, accounting::ProgramsRun)> {
        self.batches += 1;
        let names: Vec<String> = (0..pods).map(|i| format!("{tag}-{i:03}")).collect();
        // Written aside, then renamed in: the agent's watch never reads half a manifest,
        // and the writing stays outside the window.
        let staging = self.agent.manifests.with_file_name("staging");
        std::fs::create_dir_all(&staging)
            .with_context(|| format!("creating {}", staging.display()))?;
        for name in &names {
            std::fs::write(staging.join(format!("{name}.yaml")), sleep_pod(name))?;
        }
        // What runs under the root before the batch (another arm's leftovers, say) is
        // not the batch's: its waits count from there.
        let base = Evidence::read(&self.pod_root)?;
        let start = self.read()?;
        let beside_start = accounting::programs_run(beside);
        let began = Instant::now();
        for name in &names {
            let file = format!("{name}.yaml");
            std::fs::rename(staging.join(&file), self.agent.manifests.join(&file))
                .with_context(|| format!("moving {file} into the agent's manifests"))?;
        }
        self.wait(&format!("{pods} pods' processes started"), timeout, |ev| {
            ev.started >= base.started + pods
        })?;
        // The pods' times to Running, from the agent's timeline while they still run: a
        // deleted pod is kept only for the agent's retention (10 s), less than 250 pods
        // take to be removed.
        let to_running_s = self.wait_running(&names, timeout)?;
        for name in &names {
            let path = self.agent.manifests.join(format!("{name}.yaml"));
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
        self.wait("every pod cleaned up", timeout, |ev| {
            ev.started <= base.started && ev.pod_cgroups <= base.pod_cgroups
        })?;
        let end = self.read()?;
        let beside_end = accounting::programs_run(beside);
        let window_s = began.elapsed().as_secs_f64();
        let (runtime_ns, pods_ns) = start.node.until(&end.node)?;
        let cost = RoundCost {
            pods,
            runtime_ns,
            pods_ns,
            agent_ns: end.agent_ns - start.agent_ns,
            programs_ns: self
                .programs_unmeasured()
                .is_none()
                .then(|| end.programs.run_time_ns - start.programs.run_time_ns),
        };
        let beside_run = accounting::ProgramsRun {
            run_time_ns: beside_end.run_time_ns - beside_start.run_time_ns,
            run_count: beside_end.run_count - beside_start.run_count,
        };
        Ok((
            Batch {
                cost,
                to_running_s,
                window_s,
                agent_idle_ns: self.idle_ns_per_s.map(|r| (r * window_s) as u64),
            },
            beside_run,
        ))
    }

    /// The agent's CPU over `length` with no pods (its relists, housekeeping and
    /// timers), ns per second: the part of a batch's cost that comes with time, not
    /// with pods. Call it with no pod on the node.
    pub fn measure_idle(&mut self, length: Duration) -> anyhow::Result<f64> {
        let before = self.cgroup.usage_ns()?;
        self.idle(length)?;
        let rate = (self.cgroup.usage_ns()? - before) as f64 / length.as_secs_f64();
        self.idle_ns_per_s = Some(rate);
        Ok(rate)
    }

    /// Reads the kernel's evidence for `length` as a batch's waits do, with no pods: the
    /// same work of this process's over a window with nothing else in it.
    pub fn idle(&self, length: Duration) -> anyhow::Result<()> {
        let since = Instant::now();
        while since.elapsed() < length {
            Evidence::read(&self.pod_root)?;
            std::thread::sleep(LOOK);
        }
        Ok(())
    }

    fn read(&self) -> anyhow::Result<Reading> {
        Ok(Reading {
            node: self.node.read()?,
            agent_ns: self.cgroup.usage_ns()?,
            programs: accounting::programs_run(&self.programs),
        })
    }

    /// Waits until `done` holds of the kernel's evidence; fails when the agent exits or
    /// `timeout` passes, saying what was seen last.
    fn wait(
        &mut self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&Evidence) -> bool,
    ) -> anyhow::Result<()> {
        let since = Instant::now();
        loop {
            let seen = Evidence::read(&self.pod_root)?;
            if done(&seen) {
                return Ok(());
            }
            if let Some(status) = self.agent.exited()? {
                bail!("the agent exited ({status}) while waiting for {what}");
            }
            if since.elapsed() > timeout {
                bail!(
                    "{what}: not within {timeout:?} ({} pod processes running, {} pod \
                     cgroups left)",
                    seen.started,
                    seen.pod_cgroups
                );
            }
            std::thread::sleep(LOOK);
        }
    }

    /// Each of `names`' time to Running, from the agent's timeline: its `running` stage
    /// after `seen_ns`. Asked again every [`ASK`] until every pod has one: its status
    /// shows Running a moment after its process runs.
    fn wait_running(&mut self, names: &[String], timeout: Duration) -> anyhow::Result<Vec<f64>> {
        let named: Vec<String> = names
            .iter()
            .map(|n| format!("{n}-{}", self.node_name))
            .collect();
        let wanted: BTreeSet<&str> = named.iter().map(String::as_str).collect();
        let since = Instant::now();
        loop {
            let times = to_running_s(&self.agent.query("timeline")?, &wanted);
            if times.len() == names.len() {
                return Ok(times);
            }
            if let Some(status) = self.agent.exited()? {
                bail!("the agent exited ({status}) while its pods were to show Running");
            }
            if since.elapsed() > timeout {
                bail!(
                    "the agent's timeline has a time to Running for {} of the batch's {} pods \
                     after {timeout:?}",
                    times.len(),
                    names.len()
                );
            }
            std::thread::sleep(ASK);
        }
    }

    /// Stops the agent (SIGTERM) and says how it exited.
    pub fn stop(mut self) -> anyhow::Result<()> {
        let status = self.agent.stop()?;
        anyhow::ensure!(status.success(), "podlapse run exited {status}");
        Ok(())
    }
}

/// What the clock and the cgroups read at one moment of a batch.
struct Reading {
    node: accounting::NodeReading,
    agent_ns: u64,
    programs: accounting::ProgramsRun,
}

/// Times to Running of the pods `wanted` names, from a timeline's JSON (`podlapse
/// timeline -o json`): each pod's `running` stage's start less its `seen_ns`.
fn to_running_s(timeline: &Value, wanted: &BTreeSet<&str>) -> Vec<f64> {
    let pods = timeline["pods"].as_array().map_or(&[][..], Vec::as_slice);
    pods.iter()
        .filter(|p| p["name"].as_str().is_some_and(|n| wanted.contains(n)))
        .filter_map(|p| {
            let seen = p["seen_ns"].as_u64()?;
            let running = p["stages"]
                .as_array()?
                .iter()
                .find(|s| s["stage"] == "running")?["start_ns"]
                .as_u64()?;
            Some(running.saturating_sub(seen) as f64 / 1e9)
        })
        .collect()
}

/// What the kernel shows of the agent's pods: their `sleep` processes, and the pod
/// cgroups under its root.
#[derive(Debug, Default, PartialEq, Eq)]
struct Evidence {
    started: usize,
    pod_cgroups: usize,
}

impl Evidence {
    /// Walks the pod cgroups under the root and their containers' `cgroup.procs`: a few
    /// reads per pod, where a scan of /proc would read every process on the node.
    fn read(pod_root: &Path) -> anyhow::Result<Evidence> {
        let pods = pod_cgroup_dirs(pod_root);
        let mut started = 0;
        for pod in &pods {
            let Ok(containers) = std::fs::read_dir(pod) else {
                continue;
            };
            for container in containers.filter_map(Result::ok) {
                // A cgroup removed between the listing and the read holds nothing.
                let Ok(procs) = std::fs::read_to_string(container.path().join("cgroup.procs"))
                else {
                    continue;
                };
                started += procs
                    .split_whitespace()
                    .filter(|pid| {
                        std::fs::read_to_string(format!("/proc/{pid}/comm"))
                            .is_ok_and(|c| c.trim() == "sleep")
                    })
                    .count();
            }
        }
        Ok(Evidence {
            started,
            pod_cgroups: pods.len(),
        })
    }
}

/// Pod cgroups below `root` (its QoS classes' and its own): cgroupfs's `pod<uid>`, the
/// systemd driver's `…-pod<uid>.slice`.
fn pod_cgroup_dirs(root: &Path) -> Vec<std::path::PathBuf> {
    fn walk(dir: &Path, depth: usize, found: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.filter_map(Result::ok) {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = e.file_name().to_string_lossy().to_string();
            // A systemd slice is a pod's when its last part is (`podlapse-besteffort.slice`
            // is a QoS class's); a cgroupfs directory is `pod` and the UID.
            let pod = match name.strip_suffix(".slice") {
                Some(slice) => slice
                    .rsplit('-')
                    .next()
                    .is_some_and(|p| p.starts_with("pod")),
                None => name.starts_with("pod"),
            };
            if pod {
                found.push(e.path());
            } else if depth > 0 {
                walk(&e.path(), depth - 1, found);
            }
        }
    }
    let mut found = Vec::new();
    walk(root, 1, &mut found);
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_rounds_context_is_the_direct_batch_over_the_agents_slowest_pod() {
        let batch = |slowest: f64| Batch {
            cost: RoundCost {
                pods: 2,
                runtime_ns: 0,
                pods_ns: 0,
                agent_ns: 0,
                programs_ns: None,
            },
            to_running_s: vec![0.1, slowest],
            window_s: 1.0,
            agent_idle_ns: None,
        };
        assert_eq!(
            context_ratios(&[batch(0.5), batch(0.25)], &[0.4, 0.5]),
            vec![0.8, 2.0]
        );
    }

    #[test]
    fn a_pods_time_to_running_is_its_running_stage_after_it_was_seen() {
        let timeline = json!({"pods": [
            {"name": "c8-r1-000", "seen_ns": 1_000_000_000u64, "stages": [
                {"stage": "pod_seen", "start_ns": 1_000_000_000u64},
                {"stage": "running", "start_ns": 1_250_000_000u64},
            ]},
            // Not Running yet: no time, and the batch's count says so.
            {"name": "c8-r1-001", "seen_ns": 1_000_000_000u64, "stages": [
                {"stage": "pod_seen", "start_ns": 1_000_000_000u64},
            ]},
            // Another batch's pod.
            {"name": "c8-r0-000", "seen_ns": 5u64, "stages": [
                {"stage": "running", "start_ns": 9u64},
            ]},
        ]});
        let wanted: BTreeSet<&str> = ["c8-r1-000", "c8-r1-001"].into_iter().collect();
        assert_eq!(to_running_s(&timeline, &wanted), vec![0.25]);
        assert!(to_running_s(&json!({}), &wanted).is_empty());
    }

    #[test]
    fn pod_cgroups_are_counted_under_the_root_and_its_qos_classes() {
        let root = std::env::temp_dir().join(format!("podlapse-cost-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in [
            "besteffort/pod0b1e-22/container",
            "burstable/pod-b",
            "podc",
            "besteffort",
            "podlapse-besteffort.slice/podlapse-besteffort-podd.slice",
        ] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let mut found: Vec<String> = pod_cgroup_dirs(&root)
            .iter()
            .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
            .collect();
        found.sort();
        assert_eq!(
            found,
            [
                "besteffort/pod0b1e-22",
                "burstable/pod-b",
                "podc",
                "podlapse-besteffort.slice/podlapse-besteffort-podd.slice"
            ]
        );
        std::fs::remove_dir_all(&root).unwrap();
        assert!(
            pod_cgroup_dirs(&root).is_empty(),
            "a root that is gone holds no pods"
        );
    }
}
