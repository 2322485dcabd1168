//! Benchmark 11: a node at a raised max-pods with 250 pods created at once: how long
//! until every one is Running, podlapse against the direct CRI driver, and how much
//! memory the agent holds meanwhile.

use std::path::Path;

use serde_json::json;
use xtask::text::list;

use super::agent::MAX_PODS;
use super::direct::{Arm, create_sampled};
use super::sequential::{Decision, Rule, Verdict};
use super::units::{max_mib, mib};
use super::{Figure, Outcome};

/// Pods per batch: most of the lab's /24 pod network (253 addresses).
pub const PODS: usize = 250;
/// Rounds of one batch per arm, alternating ABBA, until the median of their ratios is
/// clear of the line ([`Rule`]). One batch of an arm has taken 12% longer than the other
/// on a quiet node, so a verdict takes several rounds; a round takes about four minutes
/// (two batches of about 80 s to Running, and their cleanup), and six rounds were the
/// benchmark's whole time before. First look at 8 (the fewest even count with an interval
/// at each look's share of the 5%), the last at 14: at most 2.3 times those six rounds.
/// Even counts keep ABBA's two orders equal.
const RULE: Rule = Rule::new(GOAL_RATIO, 8, 6, 14);
const GOAL_RATIO: f64 = 0.95;
const GOAL_MIB: f64 = 40.0;

/// What benchmark 11 measured: each arm's batch times (podlapse's, then the direct
/// driver's), the agent's peak RSS per batch, every batch's raw figures, and the decision
/// on the rounds' ratios.
struct Measured {
    took: [Vec<f64>; 2],
    rss_kib: Vec<u64>,
    raw: Vec<serde_json::Value>,
    decision: Decision,
}

pub fn run(bin: &Path, dir: &Path) -> anyhow::Result<Outcome> {
    Ok(render(&measure(bin, dir)?))
}

fn measure(bin: &Path, dir: &Path) -> anyhow::Result<Measured> {
    let work = dir.join("many-pods");
    // One untimed pod per arm first, as in benchmark 2: the first pod after a pause pays
    // for cold caches.
    for arm in [Arm::Podlapse, Arm::Direct] {
        create_sampled(bin, &work, arm, "warm", 1)?;
    }
    let mut took = [Vec::new(), Vec::new()];
    let mut rss_kib = Vec::new();
    let mut raw = Vec::new();
    let decision = RULE.run(|round| -> anyhow::Result<f64> {
        for arm in Arm::abba(round) {
            let r = create_sampled(bin, &work, arm, &format!("r{round}"), PODS)?;
            // The batch lasts until its slowest pod is Running.
            let slowest = r.seconds.iter().copied().fold(0.0, f64::max);
            eprintln!(
                "bench: {PODS} pods: round {} {}: all Running after {slowest:.1} s, peak RSS {:.1} MiB",
                round + 1,
                arm.name(),
                mib(r.peak_rss_kib)
            );
            took[(arm == Arm::Direct) as usize].push(slowest);
            if arm == Arm::Podlapse {
                rss_kib.push(r.peak_rss_kib);
            }
            raw.push(json!({
                "round": round,
                "arm": arm.name(),
                "seconds": r.seconds,
                "peak_rss_kib": r.peak_rss_kib,
            }));
        }
        // Pods per second of each arm, as a ratio: the direct driver's time over
        // podlapse's in this round (its two batches ran next to each other).
        Ok(took[1][round] / took[0][round])
    })?;
    Ok(Measured {
        took,
        rss_kib,
        raw,
        decision,
    })
}

fn render(m: &Measured) -> Outcome {
    let Measured {
        took,
        rss_kib,
        raw,
        decision,
    } = m;
    let rounds = decision.rounds;
    let sum = |v: &[f64]| v.iter().sum::<f64>();
    let (podlapse, direct) = (sum(&took[0]), sum(&took[1]));
    let round_ratios: Vec<f64> = took[0].iter().zip(&took[1]).map(|(p, d)| d / p).collect();
    let pooled = direct / podlapse;
    let peak_mib = max_mib(rss_kib);
    let memory_met = peak_mib <= GOAL_MIB;
    let memory = if memory_met {
        format!("peak RSS {peak_mib:.1} MiB")
    } else {
        format!(
            "peak RSS {peak_mib:.1} MiB is {:.1} MiB over {GOAL_MIB:.0} MiB",
            peak_mib - GOAL_MIB
        )
    };
    let overall = Verdict::all([
        decision.verdict,
        if memory_met {
            Verdict::Met
        } else {
            Verdict::Missed
        },
    ]);
    // The ratio's verdict leads; the memory goal's miss, when only it missed, first.
    let verdict = if overall == decision.verdict {
        format!("{}; {memory}", decision.text())
    } else {
        format!("{}: {memory}; pods/s {}", overall.word(), decision.text())
    };
    let secs = |v: &[f64]| list(v, ", ", |s| format!("{s:.1} s"));
    let interval = decision.interval_text();
    Outcome {
        number: 11,
        title: "250 pods at once",
        method: format!(
            "{PODS} one-container `sleep` pods (image present) submitted at once, one batch \
             per arm and round, arms alternating ABBA after one untimed pod per arm: \
             `podlapse run --until-ready --cleanup --max-pods {MAX_PODS}` (release build, \
             probes loaded) against `podlapse bench-direct`, each batch in a process of its \
             own. A batch lasts until its slowest pod is Running (podlapse: from the pods' \
             ADD; direct: from each pod's first call); a round's ratio is the direct \
             driver's batch time over podlapse's, and the verdict uses the median of the \
             rounds' ratios (the pooled ratio, summed times, is shown too). {} The agent's \
             memory is the highest VmRSS of its process, read every 20 ms from start to \
             exit (its {PODS} pods starting, Running, and cleaned up).",
            RULE.describe()
        ),
        figures: vec![
            Figure::new("until all Running, per batch: podlapse", secs(&took[0])),
            Figure::new("until all Running, per batch: direct", secs(&took[1])),
            Figure::new(
                "pods/s, pooled: podlapse / direct",
                format!(
                    "{:.2} / {:.2} = {pooled:.3}×",
                    (PODS * rounds) as f64 / podlapse,
                    (PODS * rounds) as f64 / direct
                ),
            ),
            Figure::new(
                &format!("ratio per round (direct's time / podlapse's; {rounds} rounds)"),
                list(&round_ratios, ", ", |r| format!("{r:.3}×")),
            ),
            Figure::new(
                "median of rounds (the verdict's), 95% interval",
                format!("{:.3}×, {interval}", decision.median),
            ),
            Figure::new(
                "the agent's peak RSS per batch",
                list(rss_kib, ", ", |k| format!("{:.1} MiB", mib(*k))),
            ),
        ],
        goal: format!(
            "≥ {GOAL_RATIO}× the direct driver, agent RSS ≤ {GOAL_MIB:.0} MiB with {PODS} pods"
        ),
        verdict,
        samples: json!({
            "pods": PODS,
            "batches": raw,
            "round_ratios": round_ratios,
            "decision": decision.to_json(),
        }),
    }
}
