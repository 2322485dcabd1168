//! Benchmark 6: the agent's resident memory managing 100 pods on the node lab, against the
//! same agent with no pods, both read from /proc/<pid>/status in one run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use xtask::lab::LabPaths;

use super::{Figure, Outcome};

pub const PODS: usize = 100;
const GOAL_MIB: f64 = 30.0;
const NODE: &str = "podtrace-bench-mem";
const IMAGE: &str = "127.0.0.1:5000/podtrace/app:1.0";
const SETTLE: Duration = Duration::from_secs(5);
const SAMPLES: usize = 10;

/// VmRSS and VmHWM in KiB.
fn rss_kib(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .with_context(|| format!("no {key} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

fn manifest(i: usize) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: mem-{i:03}\n  namespace: default\n\
         spec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    \
         image: {IMAGE}\n    imagePullPolicy: IfNotPresent\n    command: [\"sleep\", \"3600\"]\n"
    )
}

/// Phases of the agent's pods, from `podtrace pods -o json`.
fn phases(bin: &Path, socket: &Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new(bin)
        .args(["pods", "-o", "json", "--api-socket"])
        .arg(socket)
        .output()
        .context("running podtrace pods")?;
    if !out.status.success() {
        bail!(
            "podtrace pods: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let pods: Vec<Value> = serde_json::from_slice(&out.stdout).context("parsing podtrace pods")?;
    Ok(pods
        .iter()
        .map(|p| p["status"]["phase"].as_str().unwrap_or("").to_string())
        .collect())
}

fn wait_for(
    what: &str,
    timeout: Duration,
    agent: &mut Child,
    mut done: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    loop {
        if let Some(status) = agent.try_wait()? {
            bail!("the agent exited ({status}) while waiting for {what}");
        }
        // The API socket appears a moment after the agent starts.
        if done().unwrap_or(false) {
            return Ok(start.elapsed());
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The highest VmRSS over a few samples, and VmHWM at the end, in KiB.
fn sample(pid: u32) -> anyhow::Result<(Vec<u64>, u64)> {
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

struct Agent {
    child: Child,
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SIGTERM, as an operator stops it: a clean exit, and on the success path its pods
        // are already gone.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn run(bin: &Path, dir: &Path) -> anyhow::Result<Outcome> {
    let lab = LabPaths::from_env();
    let work: PathBuf = dir.join("memory");
    let _ = std::fs::remove_dir_all(&work);
    let manifests = work.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let socket = work.join("api.sock");
    let log = std::fs::File::create(work.join("agent.log"))?;
    let child = Command::new(bin)
        .arg("run")
        .arg("--manifests")
        .arg(&manifests)
        .args(["--metrics-addr", "127.0.0.1:0", "--node-name", NODE])
        .arg("--api-socket")
        .arg(&socket)
        .arg("--root-dir")
        .arg(work.join("root"))
        .arg("--pod-logs-dir")
        .arg(work.join("logs"))
        .arg("--cri")
        .arg(lab.cri_socket())
        .args(["--node-cpu", "1000000", "--node-memory"])
        .arg((1_u64 << 40).to_string())
        .args(["--max-pods", "1000"])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting podtrace run")?;
    let pid = child.id();
    let mut agent = Agent { child };
    wait_for(
        "the agent's API",
        Duration::from_secs(30),
        &mut agent.child,
        || phases(bin, &socket).map(|p| p.is_empty()),
    )?;
    let (idle_rss, idle_hwm) = sample(pid)?;
    for i in 0..PODS {
        std::fs::write(manifests.join(format!("mem-{i:03}.yaml")), manifest(i))?;
    }
    let took = wait_for(
        "100 pods Running",
        Duration::from_secs(300),
        &mut agent.child,
        || {
            Ok(phases(bin, &socket)?
                .iter()
                .filter(|p| *p == "Running")
                .count()
                == PODS)
        },
    )?;
    eprintln!(
        "bench: memory: {PODS} pods Running after {:.1} s",
        took.as_secs_f64()
    );
    let (busy_rss, busy_hwm) = sample(pid)?;
    for i in 0..PODS {
        std::fs::remove_file(manifests.join(format!("mem-{i:03}.yaml")))?;
    }
    let cleanup = wait_for(
        "the pods' removal",
        Duration::from_secs(180),
        &mut agent.child,
        || Ok(phases(bin, &socket)?.is_empty()),
    )?;
    eprintln!(
        "bench: memory: pods removed after {:.1} s",
        cleanup.as_secs_f64()
    );
    let (after_rss, after_hwm) = sample(pid)?;
    drop(agent);
    let mib = |kib: u64| kib as f64 / 1024.0;
    let max = |v: &[u64]| v.iter().copied().max().unwrap_or(0);
    let busy = mib(max(&busy_rss));
    let peak = mib(after_hwm);
    let met = busy <= GOAL_MIB;
    let verdict = if met {
        format!("met: {busy:.1} MiB ≤ {GOAL_MIB:.0} MiB (peak {peak:.1} MiB)")
    } else {
        format!(
            "missed: {busy:.1} MiB is {:.1} MiB ({:.0}%) over {GOAL_MIB:.0} MiB",
            busy - GOAL_MIB,
            (busy / GOAL_MIB - 1.0) * 100.0
        )
    };
    Ok(Outcome {
        number: 6,
        title: "Memory",
        method: format!(
            "The agent (`podtrace run --manifests DIR`, release build, probes loaded when the \
             object is built) on the node lab: VmRSS from /proc/<pid>/status sampled {SAMPLES} \
             times over {} s with no pods, then with {PODS} `sleep` pods Running, then after \
             their manifests were removed and the pods cleaned up; VmHWM is the peak.",
            SETTLE.as_secs()
        ),
        figures: vec![
            Figure::new(
                "RSS, no pods (max of samples)",
                format!("{:.1} MiB", mib(max(&idle_rss))),
            ),
            Figure::new(
                &format!("RSS, {PODS} pods Running (max of samples)"),
                format!("{busy:.1} MiB"),
            ),
            Figure::new(
                &format!("RSS per pod ({PODS} pods − none) / {PODS}"),
                format!(
                    "{:.0} KiB",
                    (max(&busy_rss) as f64 - max(&idle_rss) as f64) / PODS as f64
                ),
            ),
            Figure::new(
                "RSS after cleanup",
                format!("{:.1} MiB", mib(max(&after_rss))),
            ),
            Figure::new(
                "peak RSS over the whole run (VmHWM at the end)",
                format!("{peak:.1} MiB"),
            ),
            Figure::new(
                &format!("time to {PODS} Running / to cleaned up"),
                format!(
                    "{:.1} s / {:.1} s",
                    took.as_secs_f64(),
                    cleanup.as_secs_f64()
                ),
            ),
        ],
        goal: format!("≤ {GOAL_MIB:.0} MiB with {PODS} pods"),
        verdict,
        samples: json!({
            "pods": PODS,
            "idle_rss_kib": idle_rss,
            "idle_hwm_kib": idle_hwm,
            "busy_rss_kib": busy_rss,
            "busy_hwm_kib": busy_hwm,
            "after_rss_kib": after_rss,
            "after_hwm_kib": after_hwm,
            "seconds_to_running": took.as_secs_f64(),
            "seconds_to_cleanup": cleanup.as_secs_f64(),
        }),
    })
}
