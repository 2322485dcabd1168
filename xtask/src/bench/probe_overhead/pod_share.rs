//! Benchmark 4's lines on pods: the programs' run time per pod created, as a share of
//! the node's CPU per pod, as the kernel accounts both. One long-lived agent (its
//! programs in the agent's configuration: the namespace programs attached only around
//! sandbox operations) takes batches of pods ([`super::super::agent_cost`]), while
//! `podlapse kernel-events` runs beside it with every program attached all the time;
//! the kernel's BPF statistics give each set's run time over each batch.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::super::Figure;
use super::super::accounting::{self, ProgramsRun, RoundCost, share};
use super::super::agent_cost::{AgentCost, Node};
use super::super::sequential::{Decision, Rule, Verdict};
use super::super::syscall_tracepoints::{SlowPath, SyscallCount, syscall_programs};
use super::Probes;

/// Rounds of the syscall loop each way, and its calls per round.
const SLOW_PATH_ROUNDS: usize = 8;
const SLOW_PATH_CALLS: u64 = 1_000_000;

/// How many pods a batch has and how many batches decide, on a kernel.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Scale {
    pub pods: usize,
    pub rule: Rule,
    pub all_rule: Rule,
}

impl Scale {
    /// The host: batches of eight pods, about 6 s each with their cleanup; first look at
    /// 8 (the fewest with an interval at each look's part of the 5%), the last at 16.
    pub const HOST: Scale = Scale {
        pods: 8,
        rule: Rule::at_most(GOAL_AGENT, 8, 8, 16),
        all_rule: Rule::at_most(GOAL_ALL, 8, 8, 16),
    };
    /// The modern node under software emulation, where a pod takes tens of seconds:
    /// batches of three, one look at six (the fewest with a 95% interval).
    pub const EMULATED: Scale = Scale {
        pods: 3,
        rule: Rule::at_most(GOAL_AGENT, 6, 6, 6),
        all_rule: Rule::at_most(GOAL_ALL, 6, 6, 6),
    };
}
/// The lines, in percent of the node's CPU per pod.
pub const GOAL_AGENT: f64 = 0.5;
pub const GOAL_ALL: f64 = 1.5;
/// Each of a batch's waits; pods under emulation take tens of seconds each.
const BATCH_TIMEOUT: Duration = Duration::from_secs(600);

/// One batch: the node's CPU and the agent's programs ([`RoundCost`]), and every program
/// attached beside it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Round {
    pub cost: RoundCost,
    pub all: ProgramsRun,
}

impl Round {
    /// The node's own CPU: its cgroups' less both sets of programs (they ran in its
    /// tasks).
    fn node_ns(&self) -> u64 {
        self.cost.node_ns().saturating_sub(self.all.run_time_ns)
    }

    /// The agent's programs' share, in percent.
    pub fn agent_share(&self) -> f64 {
        share(self.cost.programs_ns.unwrap_or(0), self.node_ns())
    }

    /// Every program attached: its share, in percent.
    pub fn all_share(&self) -> f64 {
        share(self.all.run_time_ns, self.node_ns())
    }
}

/// What the pods' batches measured, or why the programs could not be counted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum PodShares {
    Measured(Box<Shares>),
    NotMeasured(String),
}

/// The batches, the decisions on both lines, and the slow path's share.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Shares {
    scale: Scale,
    rounds: Vec<Round>,
    agent: Decision,
    all: Decision,
    were_on: bool,
    slow_path: Result<SlowPathShare, String>,
}

/// The syscall tracepoints' slow path as a share of the node's CPU per pod: the ns it
/// adds to a syscall, times the syscalls a pod's creation makes on the node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SlowPathShare {
    /// The tracepoints every program attached sits on.
    pub tracepoints: Vec<String>,
    pub slow_path: SlowPath,
    /// The node's syscalls per pod: a batch's count less an idle window's as long.
    pub syscalls_per_pod: f64,
    /// The node's CPU per pod, ns (median of the measured batches).
    pub node_ns_per_pod: f64,
}

impl SlowPathShare {
    /// In percent, were the tracepoints enabled for the whole of a pod's creation.
    pub fn share(&self) -> f64 {
        100.0 * self.syscalls_per_pod * self.slow_path.added_ns().max(0.0) / self.node_ns_per_pod
    }
}

/// Runs the batches on `node` (which must run no pod yet).
pub fn measure(bin: &Path, dir: &Path, node: &Node, scale: Scale) -> anyhow::Result<PodShares> {
    let pods = scale.pods;
    let work = dir.join("probe-overhead-pods");
    let mut rig = AgentCost::start_on(bin, &work.join("agent"), "podlapse-bench-probes", node)?;
    if let Some(why) = rig.programs_unmeasured() {
        rig.stop()?;
        return Ok(PodShares::NotMeasured(why));
    }
    let before = accounting::program_ids();
    let probes = Probes::start(bin, work.join("kernel-events.log"), &[])?;
    let beside = accounting::programs_since(&before);
    rig.batch("warm", pods, BATCH_TIMEOUT)?;
    let mut rounds = Vec::new();
    let agent = scale.rule.run(|r| -> anyhow::Result<f64> {
        let (batch, all) = rig.batch_beside(&format!("r{r}"), pods, BATCH_TIMEOUT, &beside)?;
        let round = Round {
            cost: batch.cost,
            all,
        };
        eprintln!(
            "bench: 4. pods, round {}: programs per pod: the agent's {:.3} ms ({:.2}%), every \
             one attached {:.3} ms ({:.2}%), of the node's {:.1} ms",
            r + 1,
            round.cost.programs_ns.unwrap_or(0) as f64 / 1e6 / pods as f64,
            round.agent_share(),
            all.run_time_ns as f64 / 1e6 / pods as f64,
            round.all_share(),
            round.node_ns() as f64 / 1e6 / pods as f64
        );
        rounds.push(round);
        Ok(round.agent_share())
    })?;
    let all = scale
        .all_rule
        .decide(&rounds.iter().map(Round::all_share).collect::<Vec<_>>());
    let were_on = rig.stats_were_on();
    let (summary, _) = probes.stop()?;
    let tracepoints = syscall_programs(summary.programs.iter().map(|p| p.program.as_str()));
    let node_ns_per_pod = super::super::stats::median(
        &rounds
            .iter()
            .map(|r| r.node_ns() as f64 / pods as f64)
            .collect::<Vec<_>>(),
    );
    let slow_path =
        slow_path(&mut rig, pods, tracepoints, node_ns_per_pod).map_err(|e| format!("{e:#}"));
    rig.stop()?;
    Ok(PodShares::Measured(Box::new(Shares {
        scale,
        rounds,
        agent,
        all,
        were_on,
        slow_path,
    })))
}

/// The slow path's share: its ns per syscall (the syscall loop), and the node's syscalls
/// per pod (one batch counted, less an idle window as long).
fn slow_path(
    rig: &mut AgentCost,
    pods: usize,
    tracepoints: Vec<String>,
    node_ns_per_pod: f64,
) -> anyhow::Result<SlowPathShare> {
    if tracepoints.is_empty() {
        anyhow::bail!("no program sits on a syscall tracepoint on this kernel");
    }
    let slow_path = SlowPath::measure(&tracepoints, SLOW_PATH_ROUNDS, SLOW_PATH_CALLS)?;
    let count = SyscallCount::start()?;
    let before = count.read()?;
    let batch = rig.batch("syscalls", pods, BATCH_TIMEOUT)?;
    let in_batch = count.read()? - before;
    let before = count.read()?;
    rig.idle(Duration::from_secs_f64(batch.window_s))?;
    let idle = count.read()? - before;
    Ok(SlowPathShare {
        tracepoints,
        slow_path,
        syscalls_per_pod: in_batch.saturating_sub(idle) as f64 / pods as f64,
        node_ns_per_pod,
    })
}

impl PodShares {
    /// The verdict on both lines, in words.
    pub fn judged(&self) -> (Verdict, String) {
        match self {
            PodShares::NotMeasured(why) => (
                Verdict::Met,
                format!("the programs' share of the node's CPU per pod not measured: {why}"),
            ),
            PodShares::Measured(m) => (
                Verdict::all([m.agent.verdict, m.all.verdict]),
                format!(
                    "the programs' run time per pod created in the agent's configuration, {}; \
                     with every program attached, {}; the syscall tracepoints' slow path \
                     (reported): {}",
                    m.agent.text(),
                    m.all.text(),
                    slow_path_text(&m.slow_path)
                ),
            ),
        }
    }

    pub fn figures(&self) -> Vec<Figure> {
        let PodShares::Measured(m) = self else {
            return Vec::new();
        };
        let Shares {
            scale,
            rounds,
            agent,
            all,
            were_on,
            slow_path,
        } = m.as_ref();
        let med = |f: &dyn Fn(&Round) -> f64| {
            super::super::stats::median(&rounds.iter().map(f).collect::<Vec<_>>())
        };
        let pods = scale.pods;
        let per_pod = |ns: u64| ns as f64 / 1e6 / pods as f64;
        let mut figures = vec![
            Figure::new(
                &format!(
                    "pods: the agent's programs' share of the node's CPU ({} batches of \
                     {pods}): median (the verdict's), 95% interval",
                    agent.rounds
                ),
                format!(
                    "{}, {}",
                    agent.rule.show(agent.median),
                    agent.interval_text()
                ),
            ),
            Figure::new(
                "pods: every program attached beside it: share, median, 95% interval",
                format!("{}, {}", all.rule.show(all.median), all.interval_text()),
            ),
            Figure::new(
                "pods: per pod, the node's CPU / the agent's programs (hits) / every \
                 program attached (hits) (medians of batches)",
                format!(
                    "{:.1} ms / {:.3} ms / {:.3} ms ({:.0} hits)",
                    med(&|r| per_pod(r.node_ns())),
                    med(&|r| per_pod(r.cost.programs_ns.unwrap_or(0))),
                    med(&|r| per_pod(r.all.run_time_ns)),
                    med(&|r| r.all.run_count as f64 / pods as f64),
                ),
            ),
        ];
        figures.push(Figure::new(
            "pods: the syscall tracepoints' slow path: ns added per syscall (median of the \
             loop's rounds, off → on), the node's syscalls per pod, share of the node's CPU \
             per pod were they enabled throughout",
            match slow_path {
                Ok(s) => format!(
                    "{:.1} ns ({:.1} → {:.1} ns per getppid), {:.0} syscalls, {:.2}% ({})",
                    s.slow_path.added_ns(),
                    super::super::stats::median(&s.slow_path.off_ns),
                    super::super::stats::median(&s.slow_path.on_ns),
                    s.syscalls_per_pod,
                    s.share(),
                    s.tracepoints.join(", ")
                ),
                Err(why) => format!("not measured: {why}"),
            },
        ));
        if *were_on {
            figures.push(super::super::cost_report::stats_were_on());
        }
        figures
    }

    pub fn samples(&self) -> Value {
        match self {
            PodShares::NotMeasured(why) => json!({"not_measured": why}),
            PodShares::Measured(m) => json!({
                "slow_path": match &m.slow_path {
                    Ok(s) => json!(s),
                    Err(why) => json!({"not_measured": why}),
                },
                "pods_per_batch": m.scale.pods,
                "rounds": m.rounds,
                "agent_shares": m.rounds.iter().map(Round::agent_share).collect::<Vec<_>>(),
                "all_shares": m.rounds.iter().map(Round::all_share).collect::<Vec<_>>(),
                "agent_decision": m.agent.to_json(),
                "all_decision": m.all.to_json(),
                "bpf_stats_were_on": m.were_on,
            }),
        }
    }
}

/// The slow path's share in words: how often the agent attaches the tracepoints with it.
fn slow_path_text(slow_path: &Result<SlowPathShare, String>) -> String {
    match slow_path {
        Ok(s) => format!(
            "{:.1} ns per syscall, {:.0} syscalls per pod: {:.2}% of the node's CPU per pod \
             were the tracepoints enabled throughout (the agent enables them only around \
             sandbox operations and a second after)",
            s.slow_path.added_ns(),
            s.syscalls_per_pod,
            s.share()
        ),
        Err(why) => format!("not measured: {why}"),
    }
}

/// How the pods' lines are measured, for the method.
pub fn method() -> String {
    format!(
        "The lines on pods: one long-lived agent (`podlapse run`, its programs in the \
         agent's configuration) takes batches of `sleep` pods ({} on the host, {} on the \
         modern node; image present; \
         every pod started, every manifest removed, every pod cleaned up) while \
         `podlapse kernel-events` runs beside it with every program attached; a batch's \
         share is a set of programs' run time over the batch (the kernel's BPF statistics) \
         over the node's CPU in the same window (the lab's containerd in a cgroup of its \
         own, with its shims, runc and CNI plugins, and the pods' cgroups, less both sets \
         of programs' run time). The agent's set is judged against {GOAL_AGENT}%, every \
         program's against {GOAL_ALL}%, on the same batches. On the host: {} On the \
         modern node (the lab's registry forwarded to it, its containerd's service \
         cgroup as the runtime's): one look at {} batches. The syscall \
         tracepoints' slow path is reported: the ns it adds to a syscall (this process's \
         CPU time per getppid(2), {SLOW_PATH_CALLS} calls a round, {SLOW_PATH_ROUNDS} \
         rounds alternating with those tracepoints enabled as counting perf events with \
         no program and without; the medians' difference), times the node's syscalls per \
         pod (`raw_syscalls:sys_enter` counted over one more batch, less an idle window \
         as long), over the node's CPU per pod.",
        Scale::HOST.pods,
        Scale::EMULATED.pods,
        Scale::HOST.rule.describe(),
        Scale::EMULATED.rule.cap
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Batches of eight pods whose node CPU is 2,000 ms, the agent's programs taking
    /// `agent_ms` of it and every program `all_ms`.
    pub(crate) fn round(agent_ms: u64, all_ms: u64) -> Round {
        Round {
            cost: RoundCost {
                pods: 8,
                runtime_ns: 1_500_000_000,
                pods_ns: 500_000_000 + (agent_ms + all_ms) * 1_000_000,
                agent_ns: 9_000_000,
                programs_ns: Some(agent_ms * 1_000_000),
            },
            all: ProgramsRun {
                run_time_ns: all_ms * 1_000_000,
                run_count: 40_000,
            },
        }
    }

    /// Shares measured over eight such batches, decided at the host's scale.
    pub(crate) fn measured(agent_ms: u64, all_ms: u64) -> PodShares {
        let rounds = vec![round(agent_ms, all_ms); 8];
        let scale = Scale::HOST;
        let agent = scale
            .rule
            .decide(&rounds.iter().map(Round::agent_share).collect::<Vec<_>>());
        let all = scale
            .all_rule
            .decide(&rounds.iter().map(Round::all_share).collect::<Vec<_>>());
        PodShares::Measured(Box::new(Shares {
            scale,
            rounds,
            agent,
            all,
            were_on: false,
            slow_path: Err("not measured here".into()),
        }))
    }

    #[test]
    fn both_sets_of_programs_come_off_the_nodes_cpu() {
        let round = round(4, 16);
        // 2,020 ms less 4 and 16 ms of programs: the node's own 2,000 ms.
        assert_eq!(round.node_ns(), 2_000_000_000);
        assert!((round.agent_share() - 0.2).abs() < 1e-9);
        assert!((round.all_share() - 0.8).abs() < 1e-9);
        let rounds = vec![round; 8];
        let scale = Scale::HOST;
        let decided = scale
            .rule
            .decide(&rounds.iter().map(Round::agent_share).collect::<Vec<_>>());
        let all = scale
            .all_rule
            .decide(&rounds.iter().map(Round::all_share).collect::<Vec<_>>());
        let shares = PodShares::Measured(Box::new(Shares {
            scale,
            rounds,
            agent: decided,
            all,
            were_on: false,
            slow_path: Ok(SlowPathShare {
                tracepoints: vec!["sys_enter_setns".into()],
                slow_path: SlowPath {
                    off_ns: vec![100.0; 3],
                    on_ns: vec![150.0; 3],
                },
                syscalls_per_pod: 40_000.0,
                node_ns_per_pod: 250_000_000.0,
            }),
        }));
        let (verdict, text) = shares.judged();
        assert_eq!(verdict, Verdict::Met);
        assert!(
            text.contains("agent's configuration, met: median share 0.20%"),
            "{text}"
        );
        assert!(
            text.contains("every program attached, met: median share 0.80%"),
            "{text}"
        );
    }
}
