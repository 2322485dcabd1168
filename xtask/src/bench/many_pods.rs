//! Benchmark 11: a node at a raised max-pods with 250 pods created at once: the agent's
//! own CPU per pod (its process and its programs) as a share of the node's, as the
//! kernel accounts it ([`super::agent_cost`]), and the memory the agent holds meanwhile.
//! The direct CRI driver's batches beside the agent's give the wall-clock context.

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use xtask::text::list;

use super::agent::MAX_PODS;
use super::agent_cost::{self, AgentCost, Batch};
use super::direct::{Arm, create_sampled};
use super::sequential::{Decision, Rule, Verdict};
use super::units::mib;
use super::{Figure, Outcome, cost_report};

/// Pods per batch: most of the lab's /24 pod network (253 addresses).
pub const PODS: usize = 250;
/// One look after six rounds, the fewest with a 95% interval of the median: a round is
/// the agent's batch and the direct driver's, about four minutes with their cleanups, so
/// the benchmark takes about 25 minutes, the most of any. A share moves little from
/// batch to batch; a ratio of wall-clock times does, and is context only.
const RULE: Rule = Rule::at_most(GOAL_SHARE, 6, 6, 6);
const CONTEXT: Rule = Rule::new(CONTEXT_LINE, 6, 6, 6);
const GOAL_SHARE: f64 = 2.0;
const CONTEXT_LINE: f64 = 0.95;
const GOAL_MIB: f64 = 40.0;
/// Each of a batch's waits: 250 pods took about 80 s to Running on the host lab.
const BATCH_TIMEOUT: Duration = Duration::from_secs(900);

/// What benchmark 11 measured.
struct Measured {
    batches: Vec<Batch>,
    /// The direct driver's batch times (its slowest pod), in seconds.
    direct_s: Vec<f64>,
    /// The agent's VmHWM after each batch, KiB.
    peak_kib: Vec<u64>,
    decision: Decision,
    context: Decision,
    unmeasured: Option<String>,
    were_on: bool,
}

pub fn run(bin: &Path, dir: &Path) -> anyhow::Result<Outcome> {
    Ok(render(&measure(bin, dir)?))
}

fn measure(bin: &Path, dir: &Path) -> anyhow::Result<Measured> {
    let work = dir.join("many-pods");
    let mut rig = AgentCost::start(bin, &work.join("agent"), "podlapse-bench-many")?;
    // One untimed pod per arm first, as in benchmark 2: the first pod after a pause pays
    // for cold caches.
    rig.batch("warm", 1, BATCH_TIMEOUT)?;
    create_sampled(bin, &work, Arm::Direct, "warm", 1)?;
    rig.measure_idle(Duration::from_secs(10))?;
    let mut batches: Vec<Batch> = Vec::new();
    let mut direct_s = Vec::new();
    let mut peak_kib = Vec::new();
    let decision = RULE.run(|round| -> anyhow::Result<f64> {
        for arm in Arm::abba(round) {
            let tag = format!("r{round}");
            match arm {
                Arm::Podlapse => {
                    let b = rig.batch(&tag, PODS, BATCH_TIMEOUT)?;
                    peak_kib.push(rig.peak_rss_kib()?);
                    eprintln!(
                        "bench: 11. round {}: the agent's pods all Running after {:.1} s; it \
                         added {:.2} ms per pod over the node's {:.1} ms: {:.2}%",
                        round + 1,
                        b.slowest_s(),
                        b.cost.added_ms_per_pod(),
                        b.cost.node_ms_per_pod(),
                        b.cost.share()
                    );
                    batches.push(b);
                }
                Arm::Direct => {
                    let r = create_sampled(bin, &work, arm, &tag, PODS)?;
                    direct_s.push(r.seconds.iter().copied().fold(0.0, f64::max));
                }
            }
        }
        Ok(batches
            .last()
            .expect("the round ran the agent's batch")
            .cost
            .share())
    })?;
    let context = CONTEXT.decide(&agent_cost::context_ratios(&batches, &direct_s));
    let unmeasured = rig.programs_unmeasured();
    let were_on = rig.stats_were_on();
    rig.stop()?;
    Ok(Measured {
        batches,
        direct_s,
        peak_kib,
        decision,
        context,
        unmeasured,
        were_on,
    })
}

fn render(m: &Measured) -> Outcome {
    let costs: Vec<_> = m.batches.iter().map(|b| b.cost).collect();
    let peak_mib = mib(m.peak_kib.iter().copied().max().unwrap_or(0));
    let memory_met = peak_mib <= GOAL_MIB;
    let memory = if memory_met {
        format!("peak RSS {peak_mib:.1} MiB")
    } else {
        format!(
            "peak RSS {peak_mib:.1} MiB is {:.1} MiB over {GOAL_MIB:.0} MiB",
            peak_mib - GOAL_MIB
        )
    };
    let share = cost_report::verdict(&m.decision, &m.batches, m.unmeasured.as_deref());
    let overall = Verdict::all([
        m.decision.verdict,
        if memory_met {
            Verdict::Met
        } else {
            Verdict::Missed
        },
    ]);
    let verdict = if overall == m.decision.verdict {
        format!("{share}; {memory}")
    } else {
        format!("{}: {memory}; the share {share}", overall.word())
    };
    let secs = |v: &[f64]| list(v, ", ", |s| format!("{s:.1} s"));
    let agent_s: Vec<f64> = m.batches.iter().map(Batch::slowest_s).collect();
    let mut figures = cost_report::figures(
        &format!("{PODS} pods"),
        &m.decision,
        &m.batches,
        m.unmeasured.as_deref(),
    );
    figures.extend([
        Figure::new(
            "context: until all Running, per batch: podlapse",
            secs(&agent_s),
        ),
        Figure::new(
            "context: until all Running, per batch: direct",
            secs(&m.direct_s),
        ),
        cost_report::context_figure("", &m.batches, &m.direct_s, &m.context, CONTEXT_LINE),
        Figure::new(
            "the agent's peak RSS (VmHWM) after each batch",
            list(&m.peak_kib, ", ", |k| format!("{:.1} MiB", mib(*k))),
        ),
    ]);
    if m.were_on {
        figures.push(cost_report::stats_were_on());
    }
    Outcome {
        number: 11,
        title: "250 pods at once",
        method: format!(
            "One long-lived agent (`podlapse run --manifests DIR --max-pods {MAX_PODS}`, \
             release build, probes loaded) takes batches of {PODS} one-container `sleep` \
             pods (image present), every manifest moved into its directory at once; a \
             batch ends when every pod is cleaned up after its manifest's removal. {} \
             Beside each batch, in ABBA order, the direct CRI driver (`podlapse \
             bench-direct`, a process of its own) runs {PODS} pods; one untimed pod per \
             arm first. The wall clock is context: a round's ratio is the direct driver's \
             batch time (its slowest pod) over the agent's (its slowest pod, from the \
             pod's ADD to the Running status), judged by the same rule against \
             {CONTEXT_LINE} and deciding nothing. {} The agent's memory is the kernel's \
             high-water mark of its resident set (VmHWM), read after each batch.",
            cost_report::method(),
            RULE.describe()
        ),
        figures,
        goal: format!(
            "the agent's CPU and its programs' run time ≤ {GOAL_SHARE}% of the node's CPU \
             per pod with {PODS} pods (median of rounds), agent RSS ≤ {GOAL_MIB:.0} MiB"
        ),
        verdict,
        samples: json!({
            "pods": PODS,
            "batches": m.batches,
            "direct_s": m.direct_s,
            "peak_rss_kib": m.peak_kib,
            "round_shares": costs.iter().map(|c| c.share()).collect::<Vec<_>>(),
            "decision": m.decision.to_json(),
            "context_decision": m.context.to_json(),
            "programs_unmeasured": m.unmeasured,
            "bpf_stats_were_on": m.were_on,
        }),
    }
}
