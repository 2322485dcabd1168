//! Benchmark 1 (and the direct arms of 2 and 11): podlapse's pipeline against the direct CRI driver
//! (`podlapse bench-direct`: the same requests in the same order, nothing in between), on
//! the node lab with the image already present. Arms alternate within one run.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::agent::roomy_node;
use super::pods::sleep_pod;
use super::stats::percentile;
use super::{Figure, Outcome};

/// Pods per arm in benchmark 1: each takes a process of its own with its cleanup
/// (about 3 s a pod for both arms), so sixty per arm (200 before) keep the benchmark
/// near four minutes of the full run's 75.
pub const OVERHEAD_PODS: usize = 60;
/// The direct driver's pod cgroups' root (the lab's teardown removes `podlapse-*`).
const DIRECT_CGROUP_ROOT: &str = "/podlapse-direct";
const GOAL_RATIO: f64 = 1.05;
const GOAL_GAP_MS: f64 = 10.0;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Arm {
    Podlapse,
    Direct,
}

impl Arm {
    pub(super) fn name(self) -> &'static str {
        match self {
            Arm::Podlapse => "podlapse",
            Arm::Direct => "direct",
        }
    }

    /// Both arms in ABBA order: podlapse first in even rounds `i`, the direct driver first
    /// in odd ones.
    pub(super) fn abba(i: usize) -> [Arm; 2] {
        if i.is_multiple_of(2) {
            [Arm::Podlapse, Arm::Direct]
        } else {
            [Arm::Direct, Arm::Podlapse]
        }
    }
}

/// Creates `pods` pods with one arm and returns each pod's time to Running, in seconds.
/// Both arms print `{"pods": [{"name", "seconds", ...}]}`.
pub(super) fn create(
    bin: &Path,
    work: &Path,
    arm: Arm,
    tag: &str,
    pods: usize,
) -> anyhow::Result<Vec<f64>> {
    Ok(create_sampled(bin, work, arm, tag, pods)?.seconds)
}

/// What one arm's process did.
pub struct ArmRun {
    /// Each pod's time to Running, in seconds.
    pub seconds: Vec<f64>,
}

/// [`create`], as a struct.
pub(super) fn create_sampled(
    bin: &Path,
    work: &Path,
    arm: Arm,
    tag: &str,
    pods: usize,
) -> anyhow::Result<ArmRun> {
    let dir: PathBuf = work.join(format!("{}-{tag}", arm.name()));
    let _ = std::fs::remove_dir_all(&dir);
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    for i in 0..pods {
        let name = format!("{}-{tag}-{i:03}", arm.name());
        std::fs::write(manifests.join(format!("{name}.yaml")), sleep_pod(&name))?;
    }
    let mut cmd = Command::new(bin);
    match arm {
        Arm::Podlapse => roomy_node(cmd.args(["run", "--until-ready", "--cleanup", "--json"])),
        // Its own cgroup root: an agent running beside it (benchmarks 2 and 11) would
        // take pod cgroups under its own root that none of its pods own for orphans, and
        // kill what runs in them, as kubelet's housekeeping does.
        Arm::Direct => cmd.args([
            "bench-direct",
            "--cleanup",
            "--cgroup-root",
            DIRECT_CGROUP_ROOT,
        ]),
    };
    let node = format!("podlapse-bench-{}", arm.name());
    let out = super::on_lab(&mut cmd, &dir, &manifests, &node)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running the {} arm", arm.name()))?;
    // Kept for after the run: cleanup errors from either arm show only here.
    std::fs::write(dir.join("stderr.log"), &out.stderr)?;
    let doc: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "the {} arm printed no result ({}): {}",
            arm.name(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let list = doc["pods"].as_array().cloned().unwrap_or_default();
    let bad: Vec<&Value> = list
        .iter()
        .filter(|p| p["error"].is_string() || p["phase"].as_str().is_some_and(|s| s != "Running"))
        .collect();
    // podlapse exits 1 when its cleanup failed even though every pod ran; the timing still
    // counts, and the lab's teardown removes whatever was left.
    if !out.status.success() {
        eprintln!(
            "bench: the {} arm exited {} (cleaned up: {}): {}",
            arm.name(),
            out.status,
            doc["cleaned_up"],
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
    }
    if !bad.is_empty() || list.len() != pods {
        bail!(
            "the {} arm did not run every pod ({} of {pods} listed, {} failed, {}): {}",
            arm.name(),
            list.len(),
            bad.len(),
            out.status,
            bad.first().map(|p| p.to_string()).unwrap_or_default()
        );
    }
    Ok(ArmRun {
        seconds: list.iter().filter_map(|p| p["seconds"].as_f64()).collect(),
    })
}

pub fn overhead(bin: &Path, dir: &Path, pods: usize) -> anyhow::Result<Outcome> {
    Ok(render_overhead(pods, &measure_overhead(bin, dir, pods)?))
}

/// Benchmark 1's runs: each pod's time to Running, per arm, in the order they ran.
fn measure_overhead(bin: &Path, dir: &Path, pods: usize) -> anyhow::Result<Vec<(Arm, Vec<f64>)>> {
    let work = dir.join("overhead");
    let mut samples: Vec<(Arm, Vec<f64>)> = Vec::new();
    // One pod at a time, each arm in a process of its own per pod, so a pod's time is its
    // pipeline's and never a queue behind other pods. Arms alternate ABBA per pair: neither
    // always goes first on a node that warms up or fills up.
    for i in 0..pods {
        for arm in Arm::abba(i) {
            let s = create(bin, &work, arm, &format!("p{i:03}"), 1)?;
            samples.push((arm, s));
        }
        if (i + 1) % 25 == 0 {
            eprintln!("bench: overhead: {} of {pods} pods per arm", i + 1);
        }
    }
    Ok(samples)
}

fn render_overhead(pods: usize, samples: &[(Arm, Vec<f64>)]) -> Outcome {
    let pooled = |arm: Arm| -> Vec<f64> {
        samples
            .iter()
            .filter(|(a, _)| *a == arm)
            .flat_map(|(_, s)| s.iter().copied())
            .collect()
    };
    let (p, d) = (pooled(Arm::Podlapse), pooled(Arm::Direct));
    let ms = |v: &[f64], q: f64| percentile(v, q) * 1e3;
    let (p50, d50, p99, d99) = (ms(&p, 50.0), ms(&d, 50.0), ms(&p, 99.0), ms(&d, 99.0));
    let ratio50 = p50 / d50;
    let gap50 = p50 - d50;
    let met = ratio50 <= GOAL_RATIO && gap50 <= GOAL_GAP_MS;
    let verdict = if met {
        format!("met: p50 ratio {ratio50:.3}, gap {gap50:.1} ms")
    } else {
        let mut misses = Vec::new();
        if ratio50 > GOAL_RATIO {
            misses.push(format!(
                "p50 ratio {ratio50:.3} is {:.3} over {GOAL_RATIO}",
                ratio50 - GOAL_RATIO
            ));
        }
        if gap50 > GOAL_GAP_MS {
            misses.push(format!(
                "p50 gap {gap50:.1} ms is {:.1} ms over {GOAL_GAP_MS:.0} ms",
                gap50 - GOAL_GAP_MS
            ));
        }
        format!("missed: {}", misses.join("; "))
    };
    Outcome {
        number: 1,
        title: "Pipeline overhead",
        method: format!(
            "{pods} one-container `sleep` pods per arm, image present, one pod at a time, \
             each in a process of its own: `podlapse run --until-ready --cleanup` (time from \
             the pod's ADD to the Running status) against `podlapse bench-direct` \
             (RunPodSandbox, PodSandboxStatus, CreateContainer, StartContainer with the same \
             requests, the pod's cgroup as the sandbox's cgroup parent included: the driver \
             does not create it, runc makes the missing directories; from the first call's \
             start to the last call's end). Arms alternate \
             in ABBA order pod by pod; process start and cleanup are outside both timings."
        ),
        figures: vec![
            Figure::new(
                "time to Running p50: podlapse / direct",
                format!("{p50:.1} ms / {d50:.1} ms"),
            ),
            Figure::new(
                "time to Running p99: podlapse / direct",
                format!("{p99:.1} ms / {d99:.1} ms"),
            ),
            Figure::new(
                "ratio p50 / p99",
                format!("{ratio50:.3} / {:.3}", p99 / d99),
            ),
            Figure::new(
                "gap p50 / p99",
                format!("{gap50:.1} ms / {:.1} ms", p99 - d99),
            ),
        ],
        goal: format!("p50 ratio ≤ {GOAL_RATIO} and gap ≤ {GOAL_GAP_MS:.0} ms"),
        verdict,
        samples: json!({
            "pods": pods,
            "runs": samples.iter().map(|(a, s)| json!({"arm": a.name(), "seconds": s}))
                .collect::<Vec<_>>(),
        }),
    }
}
