//! Benchmark 12: what `podlapse observe` costs the node whose pods it watches. The test
//! suite's kubelet-like CRI client (`cri-pod-client`, the official CRI protos, kubelet's
//! calls and labels) starts the same pods at once with and without an observer running
//! beside it (probes loaded, the runtime's event stream, its API served), the two arms
//! alternating in ABBA order round by round.
//!
//! The verdict is the observer's cost as the kernel accounts it: over each observed arm's
//! pods, the CPU of the observer's cgroup and its programs' run time (BPF statistics), as
//! a share of the node's CPU for those pods (the lab's containerd in a cgroup of its own,
//! with what it starts, and the pods' cgroups). Each pod's time to Running (the client's
//! own: from its first call to StartContainer's return), alone over observed, is context.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use xtask::text::list;

use super::accounting::{
    self, BpfStats, Hierarchy, NodeCpu, OwnedCgroup, RoundCost, join_in_child,
};
use super::sequential::{Decision, Rule};
use super::stats::percentile;
use super::write_hook::{self, HookWindows};
use super::{Figure, Outcome};
use crate::lab::{IMAGE_APP, LabPaths};
use crate::workspace;

/// Pods per round and arm, created at once.
const PODS: usize = 4;
/// Rounds, each running both arms, until the median of the rounds' CPU shares is clear of
/// the goal ([`Rule`]). A round takes about 11 s (each arm's 2 s warm-up, its pods, 2 s
/// settle; the observer's start and stop). A share moves little from round to round, so
/// the first look is at 8 (the fewest with an interval at each look's part of the 5%),
/// then 16 and 24: at most about 4.5 minutes. Each batch is two whole ABBA cycles.
const RULE: Rule = Rule::at_most(GOAL, 8, 8, 24);
/// The time to Running, alone over observed, judged on the same rounds as context: it
/// decides nothing (a round's ratio spreads 10-20% on this machine), and its interval
/// shows what the wall clock can tell.
const CONTEXT: Rule = Rule::new(CONTEXT_LINE, 8, 8, 24);
const CONTEXT_LINE: f64 = 0.99;
/// The observer's cgroup, outside the node's.
const OBSERVER_CGROUP: &str = "/podlapse.bench-observer";
/// The client's pods' cgroups: kubelet's `--cgroup-root` as `cri-pod-client` defaults it.
const POD_ROOTS: &[&str] = &["/kubepods"];
/// Between arms: the runtime's cleanup of the last arm's pods (shims exiting, snapshots
/// removed) would otherwise land on the next arm's start.
const SETTLE: Duration = Duration::from_secs(2);
/// Before an arm's pods, in both arms: an observer on a node runs for days, and what its
/// first moments cost (the runtime handing a new subscriber the events it kept, the first
/// list, the memory the probes' loading gave back) is not what a pod meets. The alone arm
/// waits as long, so both start equally far from the last arm's cleanup.
const WARM: Duration = Duration::from_secs(2);
/// Loading the probes; a bound for a hung observer only.
const OBSERVER_UP: Duration = Duration::from_secs(120);
/// The goal: the observer's CPU and its programs' run time, at most this share (percent)
/// of the node's CPU for the observed pods.
const GOAL: f64 = 1.0;

/// The lab's CRI socket as `observe` and the client take it.
fn cri_endpoint() -> String {
    format!("unix://{}", LabPaths::from_env().cri_socket().display())
}

pub fn build_client() -> anyhow::Result<PathBuf> {
    let (mut cmd, bin) = workspace::build_bin(workspace::TESTS_PACKAGE, "cri-pod-client", true);
    workspace::run(&mut cmd, "cargo build --release --bin cri-pod-client")?;
    Ok(bin)
}

/// `podlapse observe` in the background, once it says it observes.
struct Observer(Child);

impl Observer {
    fn start(
        bin: &Path,
        dir: &Path,
        round: usize,
        cgroup: &OwnedCgroup,
    ) -> anyhow::Result<Observer> {
        let mut cmd = Command::new(bin);
        join_in_child(&mut cmd, cgroup.procs_file());
        let mut child = cmd
            .arg("observe")
            .arg("--trace")
            .arg(Observer::trace(dir, round))
            .arg("--api-socket")
            .arg(dir.join("observer.sock"))
            .arg("--cri")
            .arg(cri_endpoint())
            .arg("--require-ebpf")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting podlapse observe")?;
        let rx = super::lines_of(child.stderr.take().context("the observer's stderr")?);
        let mut said = Vec::new();
        loop {
            match rx.recv_timeout(OBSERVER_UP) {
                Ok(line) if line.contains("podlapse: observing ") => break,
                Ok(line) => said.push(line),
                Err(e) => {
                    let _ = child.kill();
                    bail!("podlapse observe did not start ({e}): {}", said.join("\n"));
                }
            }
        }
        // The rest of what it says is not read: drain it so it never blocks.
        std::thread::spawn(move || for _ in rx {});
        Ok(Observer(child))
    }

    /// Round `round`'s trace.
    fn trace(dir: &Path, round: usize) -> PathBuf {
        dir.join(format!("observed-{round}.jsonl"))
    }

    fn stop(mut self) -> anyhow::Result<()> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let status = self.0.wait().context("waiting for podlapse observe")?;
        anyhow::ensure!(status.success(), "podlapse observe exited {status}");
        Ok(())
    }
}

/// One arm of a round: the client's pods at once, their times to Running in ms.
fn pods(client: &Path, round: usize, arm: &str) -> anyhow::Result<Vec<f64>> {
    let out = Command::new(client)
        .arg("--cri")
        .arg(cri_endpoint())
        .args(["run", "--pods", &PODS.to_string(), "--prefix"])
        .arg(format!("bench-{arm}-{round}"))
        .args(["--image", IMAGE_APP])
        .output()
        .context("running cri-pod-client")?;
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "cri-pod-client failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ms: Vec<f64> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|p| p["run_ms"].as_f64())
        .collect();
    anyhow::ensure!(
        ms.len() == PODS,
        "{} of {PODS} pods timed: {text}",
        ms.len()
    );
    Ok(ms)
}

/// What benchmark 12 measured: every pod's time to Running in ms, alone and observed,
/// each observed arm's cost as the kernel accounted it, each round's ratio, and the
/// decisions.
struct Measured {
    without: Vec<f64>,
    with: Vec<f64>,
    /// Each observed arm's CPU: the node's and what the observer added.
    costs: Vec<RoundCost>,
    /// The runtime's CPU in the warm-up before each arm's pods, in ms: alone, observed.
    runtime_warm_ms: [Vec<f64>; 2],
    /// Why the programs' run time is not counted, where it is not.
    programs_unmeasured: Option<String>,
    /// The kernel's BPF statistics were already on before the benchmark.
    stats_were_on: bool,
    /// The CNI write hook over every observed arm, from the observer's traces.
    write_hook: HookWindows,
    ratios: Vec<f64>,
    decision: Decision,
    context: Decision,
}

pub fn run(bin: &Path, dir: &Path) -> anyhow::Result<Outcome> {
    Ok(render(&measure(bin, dir)?))
}

/// What the clock and the node's cgroups read at one moment of an arm.
struct Reading {
    node: accounting::NodeReading,
    observer_ns: u64,
    programs: accounting::ProgramsRun,
}

fn measure(bin: &Path, dir: &Path) -> anyhow::Result<Measured> {
    let client = build_client()?;
    let dir = dir.join("observer");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let hierarchy = Hierarchy::detect()?;
    // Untimed: the image's pull and the first probes' load; then no pod runs, so every
    // shim from here on is born in the runtime's cgroup.
    pods(&client, 0, "warm")?;
    let node = NodeCpu::of_lab(&hierarchy, POD_ROOTS)?;
    let observer_cgroup = OwnedCgroup::create(&hierarchy, OBSERVER_CGROUP)?;
    let stats = BpfStats::enable();
    let (stats_were_on, programs_unmeasured) = match &stats {
        Ok(s) => (s.were_on, None),
        Err(e) => (false, Some(format!("{e:#}"))),
    };
    let read = |programs: &std::collections::BTreeSet<u32>| -> anyhow::Result<Reading> {
        Ok(Reading {
            node: node.read()?,
            observer_ns: observer_cgroup.usage_ns()?,
            programs: accounting::programs_run(programs),
        })
    };
    let (mut without, mut with) = (Vec::new(), Vec::new());
    let mut costs = Vec::new();
    let mut runtime_warm_ms = [Vec::new(), Vec::new()];
    let mut hook = HookWindows::default();
    let mut ratios = Vec::new();
    let decision = RULE.run(|i| -> anyhow::Result<f64> {
        let round = i + 1;
        // ABBA: the arm that goes first alternates by pairs of rounds.
        let observer_first = round % 4 == 2 || round % 4 == 3;
        let (mut alone, mut observed) = (Vec::new(), Vec::new());
        let mut cost = None;
        for is_observed in [observer_first, !observer_first] {
            eprintln!(
                "bench: 12. round {round} (at most {}): {}",
                RULE.cap,
                if is_observed { "observed" } else { "alone" }
            );
            let before_start = accounting::program_ids();
            let observer = if is_observed {
                Some(Observer::start(bin, &dir, round, &observer_cgroup)?)
            } else {
                None
            };
            // The observer's programs: those loaded since it started.
            let programs = match (&observer, &stats) {
                (Some(_), Ok(_)) => accounting::programs_since(&before_start),
                _ => Default::default(),
            };
            let warm = node.read()?;
            std::thread::sleep(WARM);
            let start = read(&programs)?;
            let (runtime_warm, _) = warm.until(&start.node)?;
            runtime_warm_ms[is_observed as usize].push(runtime_warm as f64 / 1e6);
            let times = pods(
                &client,
                round,
                if is_observed { "observed" } else { "alone" },
            )?;
            let end = read(&programs)?;
            if let Some(observer) = observer {
                let (runtime_ns, pods_ns) = start.node.until(&end.node)?;
                cost = Some(RoundCost {
                    pods: PODS,
                    runtime_ns,
                    pods_ns,
                    agent_ns: end.observer_ns - start.observer_ns,
                    programs_ns: stats
                        .is_ok()
                        .then(|| end.programs.run_time_ns - start.programs.run_time_ns),
                });
                observer.stop()?;
                hook.add(&write_hook::from_trace(&Observer::trace(&dir, round))?);
                observed = times;
            } else {
                alone = times;
            }
            std::thread::sleep(SETTLE);
        }
        let cost = cost.context("the round had no observed arm")?;
        eprintln!(
            "bench: 12. round {round}: the observer added {:.2} ms per pod over the node's \
             {:.1} ms: {:.2}%",
            cost.added_ms_per_pod(),
            cost.node_ms_per_pod(),
            cost.share()
        );
        ratios.push(percentile(&alone, 50.0) / percentile(&observed, 50.0));
        without.extend(alone);
        with.extend(observed);
        costs.push(cost);
        Ok(cost.share())
    })?;
    drop(stats);
    let context = CONTEXT.decide(&ratios);
    Ok(Measured {
        without,
        with,
        costs,
        runtime_warm_ms,
        programs_unmeasured,
        stats_were_on,
        write_hook: hook,
        ratios,
        decision,
        context,
    })
}

fn render(m: &Measured) -> Outcome {
    let Measured {
        without,
        with,
        costs,
        runtime_warm_ms,
        programs_unmeasured,
        stats_were_on,
        write_hook,
        ratios,
        decision,
        context,
    } = m;
    let (p50_without, p50_with) = (percentile(without, 50.0), percentile(with, 50.0));
    let pooled = p50_without / p50_with;
    let med = |f: &dyn Fn(&RoundCost) -> f64| accounting::median_of(costs, f);
    let programs = match programs_unmeasured {
        None => format!(
            "{:.3} ms per pod, {:.2}% of the node's CPU (median of rounds)",
            med(&|c| c.programs_ns.unwrap_or(0) as f64 / 1e6 / c.pods as f64),
            med(&|c| c.programs_share().unwrap_or(0.0))
        ),
        Some(why) => format!("not measured: {why}"),
    };
    let mut figures = vec![
        Figure::new(
            &format!(
                "the observer's share of the node's CPU ({} rounds): median (the verdict's), \
                 95% interval",
                decision.rounds
            ),
            format!(
                "{}, {}",
                decision.rule.show(decision.median),
                decision.interval_text()
            ),
        ),
        Figure::new(
            "the node's CPU per pod: the runtime (containerd, shims, runc, CNI plugins) + \
             the pods' cgroups (median of rounds)",
            format!(
                "{:.1} ms ({:.1} + {:.1})",
                med(&|c| c.node_ms_per_pod()),
                med(&|c| c.runtime_ns as f64 / 1e6 / c.pods as f64),
                med(&|c| c.pods_ns as f64 / 1e6 / c.pods as f64)
            ),
        ),
        Figure::new(
            "the observer's process CPU per pod (median of rounds)",
            format!(
                "{:.2} ms, {:.2}% of the node's",
                med(&|c| c.agent_ns as f64 / 1e6 / c.pods as f64),
                med(&|c| accounting::share(c.agent_ns, c.node_ns()))
            ),
        ),
        Figure::new("the observer's programs' run time", programs),
        Figure::new(
            &format!(
                "the runtime's CPU in the {} s before the pods: alone / observed (the \
                 observer's start, its first list and event subscription; not in the share)",
                WARM.as_secs()
            ),
            format!(
                "{:.1} ms / {:.1} ms (medians)",
                super::stats::median(&runtime_warm_ms[0]),
                super::stats::median(&runtime_warm_ms[1])
            ),
        ),
        Figure::new(
            "context: time to Running p50: alone / observed",
            format!("{p50_without:.1} ms / {p50_with:.1} ms"),
        ),
        Figure::new(
            "context: p50 ratio, all rounds' pods pooled: alone / observed",
            format!("{pooled:.3}"),
        ),
        Figure::new(
            "context: round ratios (each round's p50s): median, 95% interval",
            format!(
                "{:.3}, {} ({} against {CONTEXT_LINE}, deciding nothing)",
                context.median,
                context.interval_text(),
                context.verdict.word()
            ),
        ),
        Figure::new(
            "the CNI plugins' output capture: the write hook over the observed arms",
            write_hook.text(),
        ),
    ];
    if *stats_were_on {
        figures.push(Figure::new(
            "the kernel's BPF statistics",
            "already on before the benchmark (kernel.bpf_stats_enabled = 1): left on".into(),
        ));
    }
    let verdict = match (decision.verdict, programs_unmeasured) {
        (super::sequential::Verdict::Missed, _) => format!(
            "{}; of it, the observer's process {:.2}% and its programs {}",
            decision.text(),
            med(&|c| accounting::share(c.agent_ns, c.node_ns())),
            match programs_unmeasured {
                None => format!("{:.2}%", med(&|c| c.programs_share().unwrap_or(0.0))),
                Some(_) => "not measured".into(),
            }
        ),
        (_, Some(why)) => format!(
            "{} (the observer's process only: its programs not measured: {why})",
            decision.text()
        ),
        _ => decision.text(),
    };
    Outcome {
        number: 12,
        title: "observer cost",
        method: method(),
        figures,
        goal: format!(
            "the observer's CPU and its programs' run time ≤ {GOAL}% of the node's CPU per \
             observed pod (median of rounds)"
        ),
        verdict,
        samples: json!({
            "pods_per_round": PODS,
            "alone_ms": without,
            "observed_ms": with,
            "round_costs": costs,
            "round_shares": costs.iter().map(RoundCost::share).collect::<Vec<_>>(),
            "runtime_warm_ms": {"alone": runtime_warm_ms[0], "observed": runtime_warm_ms[1]},
            "programs_unmeasured": programs_unmeasured,
            "bpf_stats_were_on": stats_were_on,
            "round_ratios": ratios,
            "decision": decision.to_json(),
            "context_decision": context.to_json(),
            "write_hook": {
                "attaches": write_hook.attaches,
                "attached_ms": write_hook.attached_ms,
                "observed_ms": write_hook.trace_ms,
                "idle_windows": write_hook.idle_windows,
                "plugin_runs": write_hook.plugin_runs,
                "plugin_runs_before_attach": write_hook.missed_runs,
            },
        }),
    }
}

/// How benchmark 12 measures, for BENCHMARKS.md.
fn method() -> String {
    format!(
        "Rounds of {PODS} one-container `sleep` pods created at once by the test \
         suite's kubelet-like CRI client (`cri-pod-client`: the official CRI protos, \
         kubelet's labels and call order), image present, in two arms alternating in \
         ABBA order: alone, and with `podlapse observe --require-ebpf` running beside \
         it (probes loaded, the runtime's event stream, relists every second, its API \
         served), started {} s before the arm's pods (the alone arm waits as long) and \
         stopped after them. One untimed warm-up round first. A round's share is what \
         the kernel accounted over the observed arm's pods, from the client's start to \
         its exit (the pods created, Running and removed): the CPU of the observer's \
         cgroup (`{OBSERVER_CGROUP}`: its threads and anything it starts) plus its \
         programs' run time (the kernel's BPF statistics, on for the benchmark), over \
         the node's CPU in the same window: the lab's containerd moved into a cgroup of \
         its own before the first timed round (its shims, runc and the CNI plugins are \
         born there), plus the pods' cgroups under {}, less the programs' run time \
         (which runs in the tasks that hit the probes, mostly the node's: taking all of \
         it off the node makes the share larger, never smaller). What the runtime spends \
         serving the observer's lists and event stream is the node's, not in the share; \
         its CPU in the warm-up before each arm's pods is shown. {} Each pod's time to \
         Running (the client's: from its first call to StartContainer's return), a \
         round's ratio its alone arm's p50 over its observed arm's, is context.",
        WARM.as_secs(),
        list(POD_ROOTS, ", ", |r| format!("`{r}`")),
        RULE.describe()
    )
}
