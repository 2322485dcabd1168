//! Benchmark 5: a generated 10,000-pod trace replayed in virtual time, twice. Speed is the
//! trace's recorded span over the wall time of the whole `podlapse replay` process (reading
//! the trace included); the two outputs must be identical.

mod callgrind;
mod generate;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use xtask::poll::Poll;
use xtask::text::list;

use super::{Figure, Outcome};
use callgrind::{BASELINE_AT, BASELINE_G};
use generate::{ARRIVAL_MS, Generated, LIFETIME_MS, MAX_PODS, generate};

pub const PODS: usize = 10_000;
const GOAL_SPEED: f64 = 10_000.0;

struct Run {
    wall_s: f64,
    finished: bool,
    exit: Option<i32>,
    output: Vec<u8>,
    /// What the replay said its phases took (`--timing`), when it finished.
    phases: Option<Phases>,
}

/// The replay's own account of its wall time.
#[derive(Clone, Copy)]
struct Phases {
    read_s: f64,
    replay_s: f64,
    compare_s: f64,
}

/// A replay that has not finished by then is stopped; its speed is then at most the span
/// over this, which keeps the whole bench under its time budget.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(100);

const TIMING_PREFIX: &str = "podlapse replay timing: ";

fn phases(stderr: &str) -> Option<Phases> {
    let line = stderr.lines().find_map(|l| l.strip_prefix(TIMING_PREFIX))?;
    let v: Value = serde_json::from_str(line).ok()?;
    let f = |k: &str| v.get(k).and_then(Value::as_f64);
    Some(Phases {
        read_s: f("read_s")?,
        replay_s: f("replay_s")?,
        compare_s: f("compare_and_output_s")?,
    })
}

fn replay_once(bin: &Path, trace: &Path, out_path: &Path) -> anyhow::Result<Run> {
    let out = std::fs::File::create(out_path)?;
    let err_path = out_path.with_extension("stderr");
    let err = std::fs::File::create(&err_path)?;
    let start = Instant::now();
    let mut child = Command::new(bin)
        .arg("replay")
        .arg(trace)
        .args(["-o", "json", "--timing"])
        .stdout(out)
        .stderr(err)
        .stdin(Stdio::null())
        .spawn()
        .context("running podlapse replay")?;
    let status = Poll::new("podlapse replay", REPLAY_TIMEOUT, Duration::from_millis(5))
        .since(start)
        .within(|| child.try_wait())?;
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let wall_s = start.elapsed().as_secs_f64();
    let Some(status) = status else {
        return Ok(Run {
            wall_s,
            exit: None,
            finished: false,
            output: Vec::new(),
            phases: None,
        });
    };
    // 0 is a match and 1 a divergence; both are a finished replay whose speed counts.
    if !matches!(status.code(), Some(0 | 1)) {
        bail!("podlapse replay failed ({status})");
    }
    Ok(Run {
        wall_s,
        exit: status.code(),
        finished: true,
        output: std::fs::read(out_path)?,
        phases: phases(&std::fs::read_to_string(&err_path).unwrap_or_default()),
    })
}

fn both(runs: &[Run], f: impl Fn(&Run) -> String) -> String {
    format!("{}, {}", f(&runs[0]), f(&runs[1]))
}

fn phase(r: &Run, f: impl Fn(&Phases) -> f64) -> String {
    r.phases
        .as_ref()
        .map_or("-".to_string(), |p| format!("{:.2} s", f(p)))
}

/// What the two replays of the generated trace measured.
struct Replays {
    pods: usize,
    generated: Generated,
    trace_mb: f64,
    /// The trace's recorded span.
    span_s: f64,
    runs: Vec<Run>,
    /// A third replay under callgrind.
    counted: callgrind::Counted,
}

pub fn run(bin: &Path, dir: &Path, pods: usize) -> anyhow::Result<Outcome> {
    Ok(render(&measure(bin, dir, pods)?))
}

/// Generates the trace of `pods` pods and replays it twice.
fn measure(bin: &Path, dir: &Path, pods: usize) -> anyhow::Result<Replays> {
    let trace: PathBuf = dir.join(format!("replay-{pods}-pods.jsonl"));
    let generated = generate(&trace, pods)?;
    let span_s = generated.span_ns as f64 / 1e9;
    let trace_mb = std::fs::metadata(&trace).map_or(0.0, |m| m.len() as f64 / 1e6);
    eprintln!(
        "bench: replay: {} records ({trace_mb:.0} MB) spanning {span_s:.1} s in {}",
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
    eprintln!("bench: replay: run 3 under callgrind (a few minutes)");
    let counted = callgrind::count(bin, &trace, &dir.join("replay-output-callgrind.json"))?;
    eprintln!(
        "bench: replay: {} instructions under callgrind ({:.0} s)",
        counted.instructions, counted.wall_s
    );
    Ok(Replays {
        pods,
        generated,
        trace_mb,
        span_s,
        runs,
        counted,
    })
}

/// What the replays came to against the goal.
struct Verdict {
    finished: bool,
    identical: bool,
    matched: bool,
    /// Speed of each run, whole process; context.
    speeds: Vec<f64>,
    slowest: f64,
    /// The instructions of the run under callgrind, in billions.
    instructions_g: f64,
    sha256: String,
}

impl Verdict {
    fn of(m: &Replays) -> Verdict {
        let runs = &m.runs;
        let finished = runs.iter().all(|r| r.finished);
        let speeds: Vec<f64> = runs.iter().map(|r| m.span_s / r.wall_s).collect();
        Verdict {
            finished,
            identical: finished
                && runs[0].output == runs[1].output
                && runs[0].output == m.counted.output,
            instructions_g: m.counted.instructions as f64 / 1e9,
            sha256: m.counted.sha256.clone(),
            matched: runs.iter().all(|r| r.exit == Some(0)),
            slowest: speeds.iter().copied().fold(f64::INFINITY, f64::min),
            speeds,
        }
    }

    /// The instructions against b0be392's, in words.
    fn instructions(&self) -> String {
        format!(
            "{:.3} G instructions, {:.2}× {BASELINE_AT}'s {BASELINE_G} G (the redesign's goal: \
             ≤ {:.1} G)",
            self.instructions_g,
            self.instructions_g / BASELINE_G,
            BASELINE_G / 2.0
        )
    }

    fn text(&self) -> String {
        if !self.finished {
            format!(
                "missed: a timed replay did not finish in {} s, so its output is unknown",
                REPLAY_TIMEOUT.as_secs()
            )
        } else if !self.identical {
            format!(
                "missed: the three replays' outputs differ; {}",
                self.instructions()
            )
        } else {
            format!(
                "met: outputs byte-identical (sha256 {}); {}",
                &self.sha256[..16],
                self.instructions()
            )
        }
    }
}

/// The figures, verdict, method and samples of the two replays.
fn render(m: &Replays) -> Outcome {
    let (runs, generated, span_s) = (&m.runs, &m.generated, m.span_s);
    let v = Verdict::of(m);
    let reconciler_speeds: Vec<Option<f64>> = runs
        .iter()
        .map(|r| r.phases.map(|p| span_s / p.replay_s))
        .collect();
    Outcome {
        number: 5,
        title: "Replay speed",
        method: method(m),
        figures: figures(m, &v, &reconciler_speeds),
        goal: format!(
            "output byte-identical; instructions for the whole process (callgrind) reported \
             against {BASELINE_AT}'s {BASELINE_G} G"
        ),
        verdict: v.text(),
        samples: json!({
            "pods": m.pods,
            "arrival_ms": [ARRIVAL_MS.0, ARRIVAL_MS.1],
            "lifetime_ms": [LIFETIME_MS.0, LIFETIME_MS.1],
            "max_alive": generated.max_alive,
            "mean_alive": generated.mean_alive,
            "records": generated.records,
            "cri_calls": generated.cri_calls,
            "trace_mb": m.trace_mb,
            "span_s": span_s,
            "wall_s": runs.iter().map(|r| r.wall_s).collect::<Vec<_>>(),
            "speed": v.speeds,
            "read_s": runs.iter().map(|r| r.phases.map(|p| p.read_s)).collect::<Vec<_>>(),
            "replay_s": runs.iter().map(|r| r.phases.map(|p| p.replay_s)).collect::<Vec<_>>(),
            "compare_s": runs.iter().map(|r| r.phases.map(|p| p.compare_s)).collect::<Vec<_>>(),
            "reconciler_speed": reconciler_speeds,
            "identical": v.identical,
            "exit_codes": runs.iter().map(|r| r.exit).collect::<Vec<_>>(),
            "finished": runs.iter().map(|r| r.finished).collect::<Vec<_>>(),
            "timeout_s": REPLAY_TIMEOUT.as_secs(),
            "instructions": m.counted.instructions,
            "callgrind_wall_s": m.counted.wall_s,
            "callgrind_profile": m.counted.profile,
            "output_sha256": m.counted.sha256,
            "context_speed_line": GOAL_SPEED,
        }),
    }
}

/// How the trace was made and the replays timed, for BENCHMARKS.md.
fn method(m: &Replays) -> String {
    let (generated, pods, trace_mb, span_s) = (&m.generated, m.pods, m.trace_mb, m.span_s);
    let (arrival, lifetime) = (
        (ARRIVAL_MS.0 as f64 / 1e3, ARRIVAL_MS.1 as f64 / 1e3),
        (LIFETIME_MS.0 / 1000, LIFETIME_MS.1 / 1000),
    );
    format!(
        "A generated trace of a busy node's pod churn: {pods} pods of one container each, \
         arriving {:.1}–{:.1} s apart (uniform; {:.1} pods/s on average), each running \
         {}–{} s (uniform) once started before its manifest is removed, so at most \
         {} and on average {:.0} pods are on the node at once (kubelet's default \
         max-pods, {MAX_PODS}, is the trace's allocatable). Each pod's calls are the ones \
         `podlapse run --trace` records for it: RunPodSandbox, PullImage (policy Always, \
         parallel pulls), CreateContainer, StartContainer, StopContainer, StopPodSandbox, \
         RemoveContainer, RemovePodSandbox with durations in the ranges the lab records, \
         the reads around each sync, and a relist every second; no kernel events. \
         {} records ({} CRI calls, {trace_mb:.0} MB) spanning {span_s:.1} s of recorded \
         time, replayed twice with `podlapse replay -o json` (release build). Speed = \
         recorded span / wall time of the whole `podlapse replay` process, reading the \
         trace included. The reconciler-only figure divides the span by the time the \
         process spent in the virtual-time replay alone (its `--timing` report), leaving \
         out reading the trace and comparing. The speeds are context: the verdict is a \
         third replay's whole process under callgrind (`valgrind --tool=callgrind`, every \
         thread's instructions), its output byte-identical with the timed runs', and its \
         instruction count reported against {BASELINE_AT}'s {BASELINE_G} G.",
        arrival.0,
        arrival.1,
        2.0 / (arrival.0 + arrival.1),
        lifetime.0,
        lifetime.1,
        generated.max_alive,
        generated.mean_alive,
        generated.records,
        generated.cri_calls,
    )
}

/// The results table.
fn figures(m: &Replays, v: &Verdict, reconciler_speeds: &[Option<f64>]) -> Vec<Figure> {
    let (runs, generated) = (&m.runs, &m.generated);
    vec![
        Figure::new("recorded span", format!("{:.1} s", m.span_s)),
        Figure::new(
            "pods on the node at once (max, mean)",
            format!("{}, {:.1}", generated.max_alive, generated.mean_alive),
        ),
        Figure::new(
            "replay wall time, whole process (run 1, run 2)",
            both(runs, |r| {
                format!(
                    "{:.2} s{}",
                    r.wall_s,
                    if r.finished { "" } else { " (stopped)" }
                )
            }),
        ),
        Figure::new(
            "speed, whole process (run 1, run 2)",
            format!("{:.0}×, {:.0}× real time", v.speeds[0], v.speeds[1]),
        ),
        Figure::new(
            "of which reading the trace (run 1, run 2)",
            both(runs, |r| phase(r, |p| p.read_s)),
        ),
        Figure::new(
            "of which the virtual-time replay (run 1, run 2)",
            both(runs, |r| phase(r, |p| p.replay_s)),
        ),
        Figure::new(
            "of which comparing and writing the output (run 1, run 2)",
            both(runs, |r| phase(r, |p| p.compare_s)),
        ),
        Figure::new(
            "speed, reconciler only (run 1, run 2)",
            list(reconciler_speeds, ", ", |s| {
                s.map_or("-".to_string(), |s| format!("{s:.0}×"))
            }) + " real time",
        ),
        Figure::new(
            "instructions, whole process under callgrind (its wall time)",
            format!(
                "{} ({:.3} G; {:.0} s)",
                m.counted.instructions, v.instructions_g, m.counted.wall_s
            ),
        ),
        Figure::new(
            "context: the timed runs' slower speed against the old line",
            format!("{:.0}× against {GOAL_SPEED:.0}×", v.slowest),
        ),
        Figure::new(
            "outputs byte-identical (the timed runs and the one under callgrind)",
            if !v.finished {
                "unknown (a replay did not finish)"
            } else if v.identical {
                "yes"
            } else {
                "no"
            }
            .to_string(),
        ),
        Figure::new(
            "replay matched the recording",
            if v.matched {
                "yes (exit 0)".to_string()
            } else if !v.finished {
                "unknown (a replay did not finish)".to_string()
            } else {
                format!(
                    "no (exit {:?}, {:?}): the generated calls diverge from the reconciler's",
                    runs[0].exit, runs[1].exit
                )
            },
        ),
    ]
}
