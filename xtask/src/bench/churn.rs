//! Benchmark 7: the agent's resident memory under pod churn. Rounds of ten pods created,
//! Running, then deleted and cleaned up, on one agent recording a trace; VmRSS after
//! rounds 10 and 60, and once the deleted pods' retention has passed, against the RSS
//! with no pods. A node agent runs for months on nodes whose pods come and go: what it
//! keeps must not grow with every pod it ever ran.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;

use super::agent::Agent;
use super::memory::{rss_kib, sample, status_kib};
use super::pods::sleep_pod;
use super::units::{max_mib, mib};
use super::{Figure, Outcome};

pub const ROUNDS: usize = 60;
const PODS_PER_ROUND: usize = 10;
/// The round whose RSS is compared with the last one's.
const EARLY_ROUND: usize = 10;
const GROWTH_GOAL_MIB: f64 = 3.0;
const IDLE_GOAL_MIB: f64 = 2.0;
const NODE: &str = "podlapse-bench-churn";
/// The agent's default `--deleted-pod-retention`: the bench measures the default.
const RETENTION: Duration = Duration::from_secs(10);
const SETTLE: Duration = Duration::from_secs(5);

/// Ten pods written, all Running, their manifests removed, all cleaned up.
fn round(agent: &mut Agent, round: usize) -> anyhow::Result<()> {
    for i in 0..PODS_PER_ROUND {
        std::fs::write(
            agent.manifests.join(format!("churn-{round:02}-{i}.yaml")),
            sleep_pod(&format!("churn-{round:02}-{i}")),
        )?;
    }
    agent.wait_for(
        &format!("round {round}'s pods Running"),
        Duration::from_secs(120),
        |a| Ok(a.phases()?.iter().filter(|p| *p == "Running").count() == PODS_PER_ROUND),
    )?;
    if let Err(e) = agent.remove_all(Duration::from_secs(120)) {
        // Say what was left, so a stall can be told from a slow node.
        let left = agent
            .phases()
            .map(|p| format!("{p:?}"))
            .unwrap_or_else(|e| format!("unknown ({e:#})"));
        return Err(e.context(format!("round {round}: pods left with phases {left}")));
    }
    Ok(())
}

/// Waits until the agent's timeline has forgotten every deleted pod.
fn wait_forgotten(agent: &mut Agent) -> anyhow::Result<Duration> {
    // Once the retention has passed and the agent's next pass (every 5 s) ran: waited
    // for through the timeline rather than for a fixed time.
    agent.wait_for(
        "the deleted pods to be forgotten",
        RETENTION + Duration::from_secs(60),
        |a| {
            Ok(a.query("timeline")?["pods"]
                .as_array()
                .is_none_or(Vec::is_empty))
        },
    )
}

/// What the churn measured. RSS samples and peaks in KiB.
struct Churn {
    rounds: usize,
    /// VmRSS samples as started, before any pod.
    cold: Vec<u64>,
    /// VmRSS samples with no pods, after the warm-up round; RssAnon then.
    idle: Vec<u64>,
    idle_anon: u64,
    /// After round [`EARLY_ROUND`]: VmRSS samples and RssAnon.
    early: Vec<u64>,
    early_anon: u64,
    /// After the last round: VmRSS samples and RssAnon.
    last: Vec<u64>,
    last_anon: u64,
    /// Once the deleted pods were forgotten: VmRSS samples, VmHWM and RssAnon.
    after: Vec<u64>,
    hwm: u64,
    after_anon: u64,
    /// VmRSS read once after each round, and each round's time.
    after_round: Vec<u64>,
    round_secs: Vec<f64>,
    /// The whole churn, and from its last round until the pods were forgotten.
    churn_s: f64,
    forgotten: Duration,
    trace_bytes: u64,
}

pub fn run(bin: &Path, dir: &Path, rounds: usize) -> anyhow::Result<Outcome> {
    Ok(render(&measure(bin, dir, rounds)?))
}

/// `--churn-rounds`: a number of rounds greater than [`EARLY_ROUND`], or the last round
/// would be the early one and there would be no growth to measure.
pub fn parse_rounds(s: &str) -> Result<usize, String> {
    let n: usize = s
        .parse()
        .map_err(|e| format!("{s:?} is not a number of rounds: {e}"))?;
    if n <= EARLY_ROUND {
        return Err(format!(
            "{n} rounds: the churn compares round {EARLY_ROUND} with the last round, so it needs more than {EARLY_ROUND}"
        ));
    }
    Ok(n)
}

/// Runs the warm-up round and `rounds` (more than [`EARLY_ROUND`]) rounds on one agent,
/// sampling its memory at each point.
fn measure(bin: &Path, dir: &Path, rounds: usize) -> anyhow::Result<Churn> {
    let rounds = rounds.max(EARLY_ROUND + 1);
    let work = dir.join("churn");
    let trace = work.join("churn.trace");
    let mut agent = Agent::start(
        bin,
        &work,
        NODE,
        &["--trace".to_string(), trace.display().to_string()],
    )?;
    let pid = agent.pid();
    std::thread::sleep(SETTLE);
    let (cold, _) = sample(pid)?;
    // One round first, its pods forgotten: the agent has then paged in the code that
    // runs pods, which an agent that never ran one has not. That is the "no pods" state
    // the churn is compared with.
    round(&mut agent, 0)?;
    wait_forgotten(&mut agent)?;
    std::thread::sleep(SETTLE);
    let (idle, _) = sample(pid)?;
    let idle_anon = status_kib(pid, "RssAnon:")?;
    let mut after_round: Vec<u64> = Vec::with_capacity(rounds);
    let mut round_secs: Vec<f64> = Vec::with_capacity(rounds);
    let (mut early, mut last) = (Vec::new(), Vec::new());
    let (mut early_anon, mut last_anon) = (0, 0);
    let started = Instant::now();
    for r in 1..=rounds {
        let began = Instant::now();
        round(&mut agent, r)?;
        round_secs.push(began.elapsed().as_secs_f64());
        if r == EARLY_ROUND {
            early = sample(pid)?.0;
            early_anon = status_kib(pid, "RssAnon:")?;
        } else if r == rounds {
            last = sample(pid)?.0;
            last_anon = status_kib(pid, "RssAnon:")?;
        }
        after_round.push(rss_kib(pid)?.0);
        eprintln!(
            "bench: churn: round {r}/{rounds} in {:.1} s, RSS {:.1} MiB",
            round_secs.last().copied().unwrap_or(0.0),
            mib(*after_round.last().unwrap_or(&0))
        );
    }
    let churn_s = started.elapsed().as_secs_f64();
    let forgotten = wait_forgotten(&mut agent)?;
    std::thread::sleep(SETTLE);
    let (after, hwm) = sample(pid)?;
    let after_anon = status_kib(pid, "RssAnon:")?;
    let status = agent.stop()?;
    if !status.success() {
        bail!(
            "the agent exited with {status} (see {})",
            work.join("agent.log").display()
        );
    }
    let trace_bytes = std::fs::metadata(&trace).map(|m| m.len()).unwrap_or(0);
    Ok(Churn {
        rounds,
        cold,
        idle,
        idle_anon,
        early,
        early_anon,
        last,
        last_anon,
        after,
        hwm,
        after_anon,
        after_round,
        round_secs,
        churn_s,
        forgotten,
        trace_bytes,
    })
}

/// How the figures were made, for BENCHMARKS.md.
fn method(m: &Churn) -> String {
    format!(
        "One agent (`podlapse run --manifests DIR --trace FILE`, release build, probes \
         loaded, default --deleted-pod-retention of {r} s) on the node lab runs {rounds} \
         rounds: ten `sleep` pods written, all Running, their manifests removed, all \
         cleaned up. VmRSS from /proc/<pid>/status, the highest of {n} samples over \
         {s} s: with no pods (after one warm-up round whose pods were forgotten, so the \
         code that runs pods is paged in; the agent as started is shown too), after \
         round {EARLY_ROUND}, after round {rounds}, and after the churn once the \
         agent's timeline had forgotten every deleted pod (waited for through \
         `podlapse timeline`, {f:.0} s after the last round); RssAnon (the agent's own \
         memory, without its binary's pages) read once at each point; VmHWM is the peak.",
        r = RETENTION.as_secs(),
        rounds = m.rounds,
        n = 10,
        s = SETTLE.as_secs(),
        f = m.forgotten.as_secs_f64(),
    )
}

/// The figures, verdict, method and samples of a run.
fn render(m: &Churn) -> Outcome {
    let rounds = m.rounds;
    let (cold_mib, idle_mib, early_mib, last_mib, after_mib) = (
        max_mib(&m.cold),
        max_mib(&m.idle),
        max_mib(&m.early),
        max_mib(&m.last),
        max_mib(&m.after),
    );
    let growth = last_mib - early_mib;
    let over_idle = after_mib - idle_mib;
    let met = growth <= GROWTH_GOAL_MIB && over_idle <= IDLE_GOAL_MIB;
    let verdict = format!(
        "{}: {growth:+.1} MiB from round {EARLY_ROUND} to {rounds} (goal ≤ {GROWTH_GOAL_MIB:.0}), \
         {over_idle:+.1} MiB over idle after the churn (goal ≤ {IDLE_GOAL_MIB:.0})",
        if met { "met" } else { "missed" }
    );
    Outcome {
        number: 7,
        title: "Churn",
        method: method(m),
        figures: vec![
            Figure::new(
                "RSS as started, before any pod",
                format!("{cold_mib:.1} MiB"),
            ),
            Figure::new(
                "RSS, no pods (after the warm-up round)",
                format!("{idle_mib:.1} MiB"),
            ),
            Figure::new(
                &format!("RSS after round {EARLY_ROUND}"),
                format!("{early_mib:.1} MiB"),
            ),
            Figure::new(
                &format!("RSS after round {rounds}"),
                format!("{last_mib:.1} MiB"),
            ),
            Figure::new(
                &format!("growth, round {EARLY_ROUND} to {rounds}"),
                format!("{growth:+.1} MiB"),
            ),
            Figure::new(
                "RSS after the churn, deleted pods forgotten",
                format!("{after_mib:.1} MiB ({over_idle:+.1} MiB over no pods)"),
            ),
            Figure::new(
                "peak RSS (VmHWM at the end)",
                format!("{:.1} MiB", mib(m.hwm)),
            ),
            Figure::new(
                "round time (median)",
                format!("{:.1} s", super::stats::percentile(&m.round_secs, 50.0)),
            ),
            Figure::new(
                "pods run / trace written",
                format!(
                    "{} / {:.1} MiB",
                    rounds * PODS_PER_ROUND,
                    m.trace_bytes as f64 / (1024.0 * 1024.0)
                ),
            ),
        ],
        goal: format!(
            "≤ {GROWTH_GOAL_MIB:.0} MiB growth from round {EARLY_ROUND} to {rounds}; after the \
             churn ≤ {IDLE_GOAL_MIB:.0} MiB over no pods"
        ),
        verdict,
        samples: json!({
            "rounds": rounds,
            "pods_per_round": PODS_PER_ROUND,
            "cold_rss_kib": m.cold,
            "idle_rss_kib": m.idle,
            "idle_anon_kib": m.idle_anon,
            "early_anon_kib": m.early_anon,
            "last_anon_kib": m.last_anon,
            "after_anon_kib": m.after_anon,
            "early_round": EARLY_ROUND,
            "early_rss_kib": m.early,
            "last_rss_kib": m.last,
            "after_rss_kib": m.after,
            "after_hwm_kib": m.hwm,
            "rss_after_each_round_kib": m.after_round,
            "round_seconds": m.round_secs,
            "churn_seconds": m.churn_s,
            "seconds_to_forgotten": m.forgotten.as_secs_f64(),
            "trace_bytes": m.trace_bytes,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_churn_needs_a_round_after_the_early_one() {
        assert_eq!(parse_rounds("11"), Ok(11));
        let err = parse_rounds("10").unwrap_err();
        assert!(err.contains("more than 10"), "{err}");
        assert!(parse_rounds("ten").unwrap_err().contains("\"ten\""));
    }
}
