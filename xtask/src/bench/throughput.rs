//! Benchmark 2: the agent's own CPU per pod (its process and its programs) as a share of
//! the node's CPU per pod, at each concurrency, as the kernel accounts it
//! ([`super::agent_cost`]). Batches of c pods go to one long-lived agent; beside each,
//! the direct CRI driver (`podlapse bench-direct`: the same requests, nothing in between)
//! runs a batch of its own, and the two batches' times to Running are the wall-clock
//! context, deciding nothing.

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use xtask::text::list;

use super::agent_cost::{self, AgentCost, Batch};
use super::direct::{Arm, create};
use super::sequential::{Decision, Rule, Verdict};
use super::{Outcome, cost_report};

const CONCURRENCY: &[usize] = &[1, 2, 8, 32];
/// The goal: the agent's CPU and its programs' run time, at most this share (percent) of
/// the node's CPU per pod.
const GOAL_SHARE: f64 = 2.0;
/// The wall-clock context's line: podlapse's pods/s over the direct driver's.
const CONTEXT_LINE: f64 = 0.95;
/// A share moves little from batch to batch: the first look at 8 (the fewest with an
/// interval at each look's part of the 5%), the last at 16. A round at concurrency 32
/// takes about 20 s (both arms' batches and cleanups), so the benchmark's worst case is
/// about 10 minutes.
const RULE: Rule = Rule::at_most(GOAL_SHARE, 8, 8, 16);
/// The context, judged on the same rounds.
const CONTEXT: Rule = Rule::new(CONTEXT_LINE, 8, 8, 16);

/// How long the agent's idle CPU is measured, once, after the first warm-up.
const IDLE: Duration = Duration::from_secs(10);

/// Benchmark 2 at one concurrency.
struct AtConcurrency {
    c: usize,
    batches: Vec<Batch>,
    /// The direct driver's batch times (its slowest pod), in seconds.
    direct_s: Vec<f64>,
    decision: Decision,
    context: Decision,
}

pub fn run(bin: &Path, dir: &Path) -> anyhow::Result<Outcome> {
    let work = dir.join("throughput");
    let mut rig = AgentCost::start(bin, &work.join("agent"), "podlapse-bench-throughput")?;
    let mut measured = Vec::new();
    for &c in CONCURRENCY {
        measured.push(at(bin, &work, &mut rig, c)?);
    }
    let unmeasured = rig.programs_unmeasured();
    let were_on = rig.stats_were_on();
    rig.stop()?;
    Ok(render(&measured, unmeasured, were_on))
}

fn at(bin: &Path, work: &Path, rig: &mut AgentCost, c: usize) -> anyhow::Result<AtConcurrency> {
    let timeout = Duration::from_secs(120) + Duration::from_secs(2) * c as u32;
    // One untimed batch per arm first: the first pods after a pause pay for cold caches
    // (they took 2 to 6 times as long as the rest in earlier runs).
    rig.batch(&format!("c{c}-warm"), c, timeout)?;
    create(bin, work, Arm::Direct, &format!("c{c}-warm"), c)?;
    if c == CONCURRENCY[0] {
        let rate = rig.measure_idle(IDLE)?;
        eprintln!(
            "bench: 2. the agent with no pods: {:.2} ms of CPU per s",
            rate / 1e6
        );
    }
    let mut batches: Vec<Batch> = Vec::new();
    let mut direct_s = Vec::new();
    let decision = RULE.run(|r| -> anyhow::Result<f64> {
        for arm in Arm::abba(r) {
            match arm {
                Arm::Podlapse => batches.push(rig.batch(&format!("c{c}-r{r}"), c, timeout)?),
                Arm::Direct => {
                    let s = create(bin, work, arm, &format!("c{c}-r{r}"), c)?;
                    direct_s.push(s.iter().copied().fold(0.0, f64::max));
                }
            }
        }
        let b = batches.last().expect("the round ran the agent's batch");
        eprintln!(
            "bench: 2. concurrency {c}, round {}: the agent added {:.2} ms per pod over the \
             node's {:.1} ms: {:.2}%",
            r + 1,
            b.cost.added_ms_per_pod(),
            b.cost.node_ms_per_pod(),
            b.cost.share()
        );
        Ok(b.cost.share())
    })?;
    let context = CONTEXT.decide(&agent_cost::context_ratios(&batches, &direct_s));
    eprintln!("bench: 2. concurrency {c}: {}", decision.text());
    Ok(AtConcurrency {
        c,
        batches,
        direct_s,
        decision,
        context,
    })
}

fn render(measured: &[AtConcurrency], unmeasured: Option<String>, were_on: bool) -> Outcome {
    let mut figures = Vec::new();
    for m in measured {
        figures.extend(cost_report::figures(
            &format!("concurrency {}", m.c),
            &m.decision,
            &m.batches,
            unmeasured.as_deref(),
        ));
        figures.push(cost_report::context_figure(
            &format!("concurrency {}: ", m.c),
            &m.batches,
            &m.direct_s,
            &m.context,
            CONTEXT_LINE,
        ));
    }
    if were_on {
        figures.push(cost_report::stats_were_on());
    }
    let overall = Verdict::all(measured.iter().map(|m| m.decision.verdict));
    let verdict = format!(
        "{}: {}",
        overall.word(),
        list(measured, "; ", |m| {
            format!(
                "at concurrency {}, {}",
                m.c,
                cost_report::verdict(&m.decision, &m.batches, unmeasured.as_deref())
            )
        })
    );
    Outcome {
        number: 2,
        title: "Throughput",
        method: format!(
            "One long-lived agent (`podlapse run --manifests DIR`, release build, probes \
             loaded) takes batches of c one-container `sleep` pods (image present) at each \
             concurrency c: the batch's manifests moved into its directory at once, every \
             pod started, every manifest removed and every pod cleaned up. {} Beside each \
             batch, in ABBA order, the direct CRI driver (`podlapse bench-direct`: the same \
             requests, nothing in between, a process of its own) runs c pods of its own; \
             one untimed batch per arm first. The wall clock is context: a round's ratio \
             is the direct driver's batch time (its slowest pod, from its first call) over \
             the agent's (its slowest pod, from the pod's ADD to the Running status, the \
             agent's own timestamps), judged by the same rule against {CONTEXT_LINE} and \
             deciding nothing. Share rule at every concurrency: {}",
            cost_report::method(),
            RULE.describe()
        ),
        figures,
        goal: format!(
            "the agent's CPU and its programs' run time ≤ {GOAL_SHARE}% of the node's CPU \
             per pod, at every concurrency (median of rounds)"
        ),
        verdict,
        samples: json!({
            "concurrency": measured.iter().map(|m| json!({
                "c": m.c,
                "batches": m.batches,
                "direct_s": m.direct_s,
                "round_shares": m.batches.iter().map(|b| b.cost.share()).collect::<Vec<_>>(),
                "decision": m.decision.to_json(),
                "context_decision": m.context.to_json(),
            })).collect::<Vec<_>>(),
            "programs_unmeasured": unmeasured,
            "bpf_stats_were_on": were_on,
        }),
    }
}
