//! Benchmark 5: a generated 10,000-pod trace replayed in virtual time, twice. Speed is the
//! trace's recorded span over the replay's wall time; the two outputs must be identical.

use std::fmt::Write as _;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::{Figure, Outcome};

pub const PODS: usize = 10_000;
const GOAL_SPEED: f64 = 1000.0;
const NODE: &str = "podtrace-bench";
const IMAGE: &str = "127.0.0.1:5000/podtrace/app:1.0";
/// Pods arrive this far apart, so about fifty are starting at any moment, as on a busy node.
const ARRIVAL_NS: u64 = 10_000_000;
/// The recording's monotonic clock at the header, as a node up for a while would show.
const STARTED_NS: u64 = 5_000_000_000_000;

/// Deterministic durations, so the same trace is generated on every machine.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A duration in `[lo_ms, hi_ms)`, in nanoseconds.
    fn between_ms(&mut self, lo_ms: u64, hi_ms: u64) -> u64 {
        lo_ms * 1_000_000 + self.next() % ((hi_ms - lo_ms) * 1_000_000)
    }
}

fn hex64(seed: u64, salt: u64) -> String {
    let mut r = SplitMix(seed.wrapping_mul(31).wrapping_add(salt));
    (0..4).fold(String::new(), |mut s, _| {
        let _ = write!(s, "{:016x}", r.next());
        s
    })
}

fn pod_uid(i: usize) -> String {
    let h = hex64(i as u64, 7);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn pod(i: usize, uid: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("bench-{i:05}"), "namespace": "default", "uid": uid},
        "spec": {
            "containers": [{
                "command": ["sleep", "3600"],
                "image": IMAGE,
                // Always, so every pod has a PullImage of its own to replay.
                "imagePullPolicy": "Always",
                "name": "app",
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File"
            }],
            "dnsPolicy": "ClusterFirst",
            "nodeName": NODE,
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "terminationGracePeriodSeconds": 30
        }
    })
}

/// What a generated trace spans, for the speed figure.
pub struct Generated {
    pub span_ns: u64,
    pub records: usize,
}

/// Writes a trace (format v1) of `pods` pods, each created the way a recorded run creates
/// it: RunPodSandbox, the sandbox status with its IP, PullImage, CreateContainer and
/// StartContainer, with durations in the ranges the lab records.
pub fn generate(path: &Path, pods: usize) -> anyhow::Result<Generated> {
    let mut rng = SplitMix(42);
    // (time the record was written, sequence, record): a recorder writes a call when it ends.
    let mut records: Vec<(u64, usize, Value)> = Vec::with_capacity(pods * 6 + 1);
    let push = |records: &mut Vec<(u64, usize, Value)>, at: u64, v: Value| {
        let seq = records.len();
        records.push((at, seq, v));
    };
    let t0 = STARTED_NS + 50_000_000;
    push(
        &mut records,
        t0 + 1_000_000,
        json!({"type": "cri", "method": "Status", "attempt": 0, "start_ns": t0,
               "end_ns": t0 + 1_000_000, "code": "OK",
               "response": {"NetworkReady": "true", "RuntimeReady": "true"}}),
    );
    let mut last = t0;
    for i in 0..pods {
        let uid = pod_uid(i);
        let sandbox = hex64(i as u64, 11);
        let container = hex64(i as u64, 13);
        let ip = format!("10.{}.{}.{}", 128 + (i >> 16), (i >> 8) & 0xff, i & 0xff);
        let seen = t0 + 2_000_000 + i as u64 * ARRIVAL_NS;
        push(
            &mut records,
            seen,
            json!({"type": "pod", "at_ns": seen, "op": "ADD", "pod": pod(i, &uid)}),
        );
        let mut t = seen + rng.between_ms(1, 3);
        let call = |records: &mut Vec<(u64, usize, Value)>, t: &mut u64, dur: u64, mut v: Value| {
            let end = *t + dur;
            v["type"] = json!("cri");
            v["pod_uid"] = json!(uid);
            v["attempt"] = json!(0);
            v["start_ns"] = json!(*t);
            v["end_ns"] = json!(end);
            v["code"] = json!("OK");
            push(records, end, v);
            *t = end + 100_000;
        };
        let d = rng.between_ms(250, 450);
        call(
            &mut records,
            &mut t,
            d,
            json!({"method": "RunPodSandbox", "sandbox_id": sandbox}),
        );
        let d = rng.between_ms(1, 2);
        call(
            &mut records,
            &mut t,
            d,
            json!({"method": "PodSandboxStatus", "sandbox_id": sandbox,
                   "response": {"ip": ip, "state": "0"}}),
        );
        let d = rng.between_ms(20, 40);
        call(
            &mut records,
            &mut t,
            d,
            json!({"method": "PullImage", "image": IMAGE,
                   "response": {"auth": "false", "image_ref":
                       "sha256:796ed3ee7deb212ebc20b5863c8bcd3b3db0ddf010ff4ab7495113d82695dbaa"}}),
        );
        let d = rng.between_ms(15, 30);
        call(
            &mut records,
            &mut t,
            d,
            json!({"method": "CreateContainer", "container": "app", "sandbox_id": sandbox,
                   "container_id": container, "image": IMAGE}),
        );
        let d = rng.between_ms(60, 120);
        call(
            &mut records,
            &mut t,
            d,
            json!({"method": "StartContainer", "container": "app", "sandbox_id": sandbox,
                   "container_id": container}),
        );
        last = last.max(t);
    }
    records.sort_by_key(|(at, seq, _)| (*at, *seq));
    let ended_ns = last + 1_000_000_000;
    let cri = records.iter().filter(|r| r.2["type"] == "cri").count();
    let header = json!({
        "type": "header", "schema_version": 1, "podtrace_version": "0.1.0", "node": NODE,
        "kernel": "generated", "runtime_name": "containerd", "runtime_version": "generated",
        "config": {
            "allocatable": {"max_pods": pods + 10, "memory_bytes": 1_i64 << 50,
                            "milli_cpu": 1_i64 << 40},
            "backoff_initial_ns": 10_000_000_000_u64, "backoff_max_ns": 300_000_000_000_u64,
            "cgroup_root": "/podtrace", "error_backoff_ns": 10_000_000_000_u64,
            "housekeeping": false,
            // Unlimited, as the generated pulls overlap.
            "max_parallel_image_pulls": null,
            "relist_period_ns": 1_000_000_000_u64, "resync_interval_ns": 60_000_000_000_u64,
            "until_ready": true
        },
        "started_wall_ns": 1_795_336_392_910_148_563_u64, "started_ns": STARTED_NS
    });
    let footer = json!({
        "type": "footer", "ended_ns": ended_ns,
        "counts": {"cri": cri, "pod": pods},
        "lost_events": 0, "lost_by_kind": {}, "ebpf": false
    });
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = BufWriter::new(file);
    writeln!(out, "{header}")?;
    for (_, _, r) in &records {
        writeln!(out, "{r}")?;
    }
    writeln!(out, "{footer}")?;
    out.flush()?;
    Ok(Generated {
        span_ns: ended_ns - STARTED_NS,
        records: records.len() + 2,
    })
}

struct Run {
    wall_s: f64,
    finished: bool,
    exit: Option<i32>,
    output: Vec<u8>,
}

/// A replay that has not finished by then is stopped; its speed is then at most the span
/// over this, which keeps the whole bench under its time budget.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(100);

fn replay_once(bin: &Path, trace: &Path, out_path: &Path) -> anyhow::Result<Run> {
    let out = std::fs::File::create(out_path)?;
    let start = Instant::now();
    let mut child = Command::new(bin)
        .arg("replay")
        .arg(trace)
        .args(["-o", "json"])
        .stdout(out)
        .stderr(Stdio::null())
        .spawn()
        .context("running podtrace replay")?;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if start.elapsed() > REPLAY_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let wall_s = start.elapsed().as_secs_f64();
    let Some(status) = status else {
        return Ok(Run {
            wall_s,
            exit: None,
            finished: false,
            output: Vec::new(),
        });
    };
    // 0 is a match and 1 a divergence; both are a finished replay whose speed counts.
    if !matches!(status.code(), Some(0 | 1)) {
        bail!("podtrace replay failed ({status})");
    }
    Ok(Run {
        wall_s,
        exit: status.code(),
        finished: true,
        output: std::fs::read(out_path)?,
    })
}

pub fn run(bin: &Path, dir: &Path, pods: usize) -> anyhow::Result<Outcome> {
    let trace: PathBuf = dir.join(format!("replay-{pods}-pods.jsonl"));
    let generated = generate(&trace, pods)?;
    let span_s = generated.span_ns as f64 / 1e9;
    eprintln!(
        "bench: replay: {} records spanning {span_s:.1} s in {}",
        generated.records,
        trace.display()
    );
    let mut runs = Vec::new();
    for n in 0..2 {
        let r = replay_once(
            bin,
            &trace,
            &dir.join(format!("replay-output-{}.json", n + 1)),
        )?;
        eprintln!(
            "bench: replay: run {} took {:.2} s (exit {:?})",
            n + 1,
            r.wall_s,
            r.exit
        );
        runs.push(r);
    }
    let finished = runs.iter().all(|r| r.finished);
    let identical = finished && runs[0].output == runs[1].output;
    let speeds: Vec<f64> = runs.iter().map(|r| span_s / r.wall_s).collect();
    let slowest = speeds.iter().copied().fold(f64::INFINITY, f64::min);
    let matched = runs.iter().all(|r| r.exit == Some(0));
    let met = slowest >= GOAL_SPEED && identical;
    let verdict = if !finished {
        format!(
            "missed: a replay did not finish in {} s, so the speed is below {slowest:.2}×, \
             over {:.0}× short of {GOAL_SPEED:.0}×",
            REPLAY_TIMEOUT.as_secs(),
            GOAL_SPEED / slowest
        )
    } else if met {
        format!("met: {slowest:.0}× ≥ {GOAL_SPEED:.0}×, outputs identical")
    } else if !identical {
        "missed: the two replays' outputs differ".to_string()
    } else {
        format!(
            "missed: {slowest:.2}× is {:.0}× short of {GOAL_SPEED:.0}×",
            GOAL_SPEED / slowest
        )
    };
    Ok(Outcome {
        number: 5,
        title: "Replay speed",
        method: format!(
            "A generated trace of {pods} pods (one container each; RunPodSandbox, \
             PodSandboxStatus, PullImage, CreateContainer, StartContainer with recorded-like \
             durations; a pod every {} ms), {} records spanning {span_s:.1} s of recorded time, \
             replayed twice with `podtrace replay -o json` (release build). Speed = recorded \
             span / wall time of the replay.",
            ARRIVAL_NS / 1_000_000,
            generated.records
        ),
        figures: vec![
            Figure::new("recorded span", format!("{span_s:.1} s")),
            Figure::new(
                "replay wall time (run 1, run 2)",
                format!(
                    "{:.2} s{}, {:.2} s{}",
                    runs[0].wall_s,
                    if runs[0].finished { "" } else { " (stopped)" },
                    runs[1].wall_s,
                    if runs[1].finished { "" } else { " (stopped)" }
                ),
            ),
            Figure::new(
                "speed (run 1, run 2)",
                format!("{:.2}×, {:.2}× real time", speeds[0], speeds[1]),
            ),
            Figure::new(
                "outputs byte-identical",
                if !finished {
                    "unknown (a replay did not finish)"
                } else if identical {
                    "yes"
                } else {
                    "no"
                }
                .to_string(),
            ),
            Figure::new(
                "replay matched the recording",
                if matched {
                    "yes (exit 0)".to_string()
                } else if !finished {
                    "unknown (a replay did not finish)".to_string()
                } else {
                    format!(
                        "no (exit {:?}, {:?}): the generated calls diverge from the reconciler's",
                        runs[0].exit, runs[1].exit
                    )
                },
            ),
        ],
        goal: format!("≥ {GOAL_SPEED:.0}× real time, identical output"),
        verdict,
        samples: json!({
            "pods": pods,
            "records": generated.records,
            "span_s": span_s,
            "wall_s": runs.iter().map(|r| r.wall_s).collect::<Vec<_>>(),
            "speed": speeds,
            "identical": identical,
            "exit_codes": runs.iter().map(|r| r.exit).collect::<Vec<_>>(),
            "finished": runs.iter().map(|r| r.finished).collect::<Vec<_>>(),
            "timeout_s": REPLAY_TIMEOUT.as_secs(),
        }),
    })
}
