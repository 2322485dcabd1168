//! Benchmark 6: the agent's resident memory managing 100 pods on the node lab, against the
//! same agent with no pods, both read from /proc/<pid>/status in one run.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use super::agent::Agent;
use super::pods::sleep_pod;
use super::units::{max_mib, mib};
use super::{Figure, Outcome};

pub const PODS: usize = 100;
const GOAL_MIB: f64 = 28.0;
const NODE: &str = "podlapse-bench-mem";
const SETTLE: Duration = Duration::from_secs(5);
const SAMPLES: usize = 10;

/// A `kB` field of /proc/<pid>/status (`key` with its colon, e.g. `"RssAnon:"`), in KiB.
pub fn status_kib(pid: u32, key: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .with_context(|| format!("no {key} in /proc/{pid}/status"))
}

/// VmRSS and VmHWM in KiB.
pub fn rss_kib(pid: u32) -> anyhow::Result<(u64, u64)> {
    Ok((status_kib(pid, "VmRSS:")?, status_kib(pid, "VmHWM:")?))
}

/// The highest VmRSS over a few samples, and VmHWM at the end, in KiB.
pub fn sample(pid: u32) -> anyhow::Result<(Vec<u64>, u64)> {
    let mut rss = Vec::with_capacity(SAMPLES);
    let mut hwm = 0;
    for _ in 0..SAMPLES {
        let (r, h) = rss_kib(pid)?;
        rss.push(r);
        hwm = h;
        std::thread::sleep(SETTLE / SAMPLES as u32);
    }
    Ok((rss, hwm))
}

/// What one run of the benchmark read from /proc/<pid>/status, in KiB, and its times.
struct Memory {
    idle_rss: Vec<u64>,
    idle_hwm: u64,
    busy_rss: Vec<u64>,
    busy_hwm: u64,
    busy_file: u64,
    busy_anon: u64,
    after_rss: Vec<u64>,
    after_hwm: u64,
    took: Duration,
    cleanup: Duration,
}

pub fn run(bin: &Path, dir: &Path) -> anyhow::Result<Outcome> {
    Ok(render(&measure(bin, dir)?))
}

/// Runs the agent through no pods, 100 pods Running and their cleanup, sampling each.
fn measure(bin: &Path, dir: &Path) -> anyhow::Result<Memory> {
    let work: PathBuf = dir.join("memory");
    let mut agent = Agent::start(bin, &work, NODE, &[])?;
    let pid = agent.pid();
    // The agent returns freed heap pages every 2 s (its housekeeping period): measure it
    // settled, as it runs, not in the middle of a burst.
    std::thread::sleep(SETTLE);
    let (idle_rss, idle_hwm) = sample(pid)?;
    for i in 0..PODS {
        std::fs::write(
            agent.manifests.join(format!("mem-{i:03}.yaml")),
            sleep_pod(&format!("mem-{i:03}")),
        )?;
    }
    let took = agent.wait_for("100 pods Running", Duration::from_secs(300), |a| {
        Ok(a.phases()?.iter().filter(|p| *p == "Running").count() == PODS)
    })?;
    std::thread::sleep(SETTLE);
    eprintln!(
        "bench: memory: {PODS} pods Running after {:.1} s",
        took.as_secs_f64()
    );
    let (busy_rss, busy_hwm) = sample(pid)?;
    // What the 100-pod RSS is made of: the binary's pages (file-backed, clean) and the
    // heap with the rest of the anonymous memory.
    let (busy_file, busy_anon) = (status_kib(pid, "RssFile:")?, status_kib(pid, "RssAnon:")?);
    let cleanup = agent.remove_all(Duration::from_secs(180))?;
    eprintln!(
        "bench: memory: pods removed after {:.1} s",
        cleanup.as_secs_f64()
    );
    std::thread::sleep(SETTLE);
    let (after_rss, after_hwm) = sample(pid)?;
    agent.stop()?;
    Ok(Memory {
        idle_rss,
        idle_hwm,
        busy_rss,
        busy_hwm,
        busy_file,
        busy_anon,
        after_rss,
        after_hwm,
        took,
        cleanup,
    })
}

/// The figures, verdict and samples of a run.
fn render(m: &Memory) -> Outcome {
    let max = |v: &[u64]| v.iter().copied().max().unwrap_or(0);
    let busy = max_mib(&m.busy_rss);
    let peak = mib(m.after_hwm);
    // The peak bounds every sample, the 100-pod one included.
    let met = peak <= GOAL_MIB;
    let verdict = if met {
        format!("met: peak {peak:.1} MiB ≤ {GOAL_MIB:.0} MiB ({busy:.1} MiB with {PODS} pods)")
    } else {
        format!(
            "missed: peak {peak:.1} MiB is {:.1} MiB ({:.0}%) over {GOAL_MIB:.0} MiB ({busy:.1} MiB with {PODS} pods)",
            peak - GOAL_MIB,
            (peak / GOAL_MIB - 1.0) * 100.0
        )
    };
    Outcome {
        number: 6,
        title: "Memory",
        method: format!(
            "The agent (`podlapse run --manifests DIR`, release build, probes loaded when the \
             object is built) on the node lab: VmRSS from /proc/<pid>/status sampled {SAMPLES} \
             times over {s} s, each time {s} s after the state was reached: with no pods, \
             then with {PODS} `sleep` pods Running, then after their manifests were removed \
             and the pods cleaned up; VmHWM is the peak.",
            s = SETTLE.as_secs()
        ),
        figures: vec![
            Figure::new(
                "RSS, no pods (max of samples)",
                format!("{:.1} MiB", mib(max(&m.idle_rss))),
            ),
            Figure::new(
                &format!("RSS, {PODS} pods Running (max of samples)"),
                format!("{busy:.1} MiB"),
            ),
            Figure::new(
                &format!("RSS per pod ({PODS} pods − none) / {PODS}"),
                format!(
                    "{:.0} KiB",
                    (max(&m.busy_rss) as f64 - max(&m.idle_rss) as f64) / PODS as f64
                ),
            ),
            Figure::new(
                &format!("of it with {PODS} pods: file-backed (the binary) / anonymous (heap)"),
                format!("{:.1} MiB / {:.1} MiB", mib(m.busy_file), mib(m.busy_anon)),
            ),
            Figure::new(
                "peak RSS before any pod (VmHWM after loading the probes)",
                format!("{:.1} MiB", mib(m.idle_hwm)),
            ),
            // Tells the probes' load from the burst of creating the pods: whichever of the
            // two is higher is the run's peak until the cleanup.
            Figure::new(
                &format!("peak RSS by the time {PODS} pods were Running (VmHWM then)"),
                format!("{:.1} MiB", mib(m.busy_hwm)),
            ),
            Figure::new(
                "RSS after cleanup",
                format!("{:.1} MiB", mib(max(&m.after_rss))),
            ),
            Figure::new(
                "peak RSS over the whole run (VmHWM at the end)",
                format!("{peak:.1} MiB"),
            ),
            Figure::new(
                &format!("time to {PODS} Running / to cleaned up"),
                format!(
                    "{:.1} s / {:.1} s",
                    m.took.as_secs_f64(),
                    m.cleanup.as_secs_f64()
                ),
            ),
        ],
        goal: format!("peak RSS (VmHWM) ≤ {GOAL_MIB:.0} MiB over the run, {PODS} pods included"),
        verdict,
        samples: json!({
            "pods": PODS,
            "idle_rss_kib": m.idle_rss,
            "idle_hwm_kib": m.idle_hwm,
            "busy_rss_kib": m.busy_rss,
            "busy_hwm_kib": m.busy_hwm,
            "busy_file_kib": m.busy_file,
            "busy_anon_kib": m.busy_anon,
            "after_rss_kib": m.after_rss,
            "after_hwm_kib": m.after_hwm,
            "seconds_to_running": m.took.as_secs_f64(),
            "seconds_to_cleanup": m.cleanup.as_secs_f64(),
        }),
    }
}
