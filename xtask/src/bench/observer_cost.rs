//! Benchmark 12: what `podlapse observe` costs the pods of the client it watches. The
//! test suite's kubelet-like CRI client (`cri-pod-client`, the official CRI protos, kubelet's
//! calls and labels) starts the same pods at once with and without an observer running
//! beside it (probes loaded, the runtime's event stream, its API served), the two arms
//! alternating in ABBA order round by round. Each pod's time to Running is the client's
//! own: from its first call to StartContainer's return.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::sequential::{Decision, Rule};
use super::stats::percentile;
use super::write_hook::{self, HookWindows};
use super::{Figure, Outcome};
use crate::lab::{IMAGE_APP, LabPaths};
use crate::workspace;

/// Pods per round and arm, created at once.
const PODS: usize = 4;
/// Rounds, each running both arms, until the median of the rounds' p50 ratios is clear
/// of the goal ([`Rule`]). A round takes about 11 s (each arm's 2 s warm-up, its pods,
/// 2 s settle; the observer's start and stop), and 40 rounds were the benchmark's whole
/// time before: looks at 20, 40, 60, 80 and 100 rounds, so at most 2.5 times that. Each
/// batch of 20 is five whole ABBA cycles of four rounds.
const RULE: Rule = Rule::new(GOAL, 20, 20, 100);
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
/// The goal: p50 without the observer / p50 with it.
const GOAL: f64 = 0.99;

/// The lab's CRI socket as `observe` and the client take it.
fn cri_endpoint() -> String {
    format!("unix://{}", LabPaths::from_env().cri_socket().display())
}

fn build_client() -> anyhow::Result<PathBuf> {
    let (mut cmd, bin) = workspace::build_bin(workspace::TESTS_PACKAGE, "cri-pod-client", true);
    workspace::run(&mut cmd, "cargo build --release --bin cri-pod-client")?;
    Ok(bin)
}

/// `podlapse observe` in the background, once it says it observes.
struct Observer(Child);

impl Observer {
    fn start(bin: &Path, dir: &Path, round: usize) -> anyhow::Result<Observer> {
        let mut child = Command::new(bin)
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

    /// The CPU time the observer used so far (user and system), in ms.
    fn cpu_ms(&self) -> anyhow::Result<f64> {
        let path = format!("/proc/{}/stat", self.0.id());
        let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        // After the command name, which is in parentheses and may hold spaces: the
        // fields from the third on; utime and stime are the 14th and 15th.
        let rest = stat
            .rsplit_once(')')
            .map(|(_, r)| r)
            .with_context(|| format!("{path}: no command name"))?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = fields
            .get(11..13)
            .with_context(|| format!("{path}: too few fields"))?
            .iter()
            .map(|f| f.parse::<f64>())
            .sum::<Result<f64, _>>()
            .with_context(|| format!("{path}: utime/stime"))?;
        // SAFETY: sysconf has no memory arguments.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        Ok(ticks * 1000.0 / hz)
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
/// the observer's CPU time over each observed arm, each round's ratio, and the decision.
struct Measured {
    without: Vec<f64>,
    with: Vec<f64>,
    observer_cpu_ms: Vec<f64>,
    /// The CNI write hook over every observed arm, from the observer's traces.
    write_hook: HookWindows,
    ratios: Vec<f64>,
    decision: Decision,
}

pub fn run(bin: &Path, dir: &Path) -> anyhow::Result<Outcome> {
    Ok(render(&measure(bin, dir)?))
}

fn measure(bin: &Path, dir: &Path) -> anyhow::Result<Measured> {
    let client = build_client()?;
    let dir = dir.join("observer");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // Untimed: the image's pull and the first probes' load.
    pods(&client, 0, "warm")?;
    let (mut without, mut with) = (Vec::new(), Vec::new());
    // The observer's own CPU time over each observed arm's pods.
    let mut observer_cpu_ms = Vec::new();
    let mut hook = HookWindows::default();
    let mut ratios = Vec::new();
    let decision = RULE.run(|i| -> anyhow::Result<f64> {
        let round = i + 1;
        // ABBA: the arm that goes first alternates by pairs of rounds.
        let observer_first = round % 4 == 2 || round % 4 == 3;
        let (mut alone, mut observed) = (Vec::new(), Vec::new());
        for is_observed in [observer_first, !observer_first] {
            eprintln!(
                "bench: 12. round {round} (at most {}): {}",
                RULE.cap,
                if is_observed { "observed" } else { "alone" }
            );
            if is_observed {
                let observer = Observer::start(bin, &dir, round)?;
                std::thread::sleep(WARM);
                let cpu_before = observer.cpu_ms()?;
                observed = pods(&client, round, "observed")?;
                observer_cpu_ms.push(observer.cpu_ms()? - cpu_before);
                observer.stop()?;
                hook.add(&write_hook::from_trace(&Observer::trace(&dir, round))?);
            } else {
                std::thread::sleep(WARM);
                alone = pods(&client, round, "alone")?;
            }
            std::thread::sleep(SETTLE);
        }
        let ratio = percentile(&alone, 50.0) / percentile(&observed, 50.0);
        without.extend(alone);
        with.extend(observed);
        ratios.push(ratio);
        Ok(ratio)
    })?;
    Ok(Measured {
        without,
        with,
        observer_cpu_ms,
        write_hook: hook,
        ratios,
        decision,
    })
}

fn render(m: &Measured) -> Outcome {
    let Measured {
        without,
        with,
        observer_cpu_ms,
        write_hook,
        ratios,
        decision,
    } = m;
    let (p50_without, p50_with) = (percentile(without, 50.0), percentile(with, 50.0));
    let pooled = p50_without / p50_with;
    let interval = decision.interval_text();
    let figures = vec![
        Figure::new(
            "time to Running p50: alone / observed",
            format!("{p50_without:.1} ms / {p50_with:.1} ms"),
        ),
        Figure::new(
            "time to Running p90: alone / observed",
            format!(
                "{:.1} ms / {:.1} ms",
                percentile(without, 90.0),
                percentile(with, 90.0)
            ),
        ),
        Figure::new(
            "p50 ratio, all rounds' pods pooled: alone / observed",
            format!("{pooled:.3}"),
        ),
        Figure::new(
            &format!(
                "round ratios (each round's p50s; {} rounds): median (the verdict's), 95% \
                 interval",
                decision.rounds
            ),
            format!("{:.3}, {interval}", decision.median),
        ),
        Figure::new(
            "the observer's CPU time per pod (its arm's pods, start to teardown)",
            format!(
                "{:.1} ms p50, {:.1} ms p90",
                percentile(observer_cpu_ms, 50.0) / PODS as f64,
                percentile(observer_cpu_ms, 90.0) / PODS as f64
            ),
        ),
        Figure::new(
            "the CNI plugins' output capture: the write hook over the observed arms",
            write_hook.text(),
        ),
    ];
    Outcome {
        number: 12,
        title: "observer cost",
        method: format!(
            "Rounds of {PODS} one-container `sleep` pods created at once by the test \
             suite's kubelet-like CRI client (`cri-pod-client`: the official CRI protos, \
             kubelet's labels and call order), image present, in two arms alternating in \
             ABBA order: alone, and with `podlapse observe --require-ebpf` running beside \
             it (probes loaded, the runtime's event stream, relists every second, its API \
             served), started {} s before the arm's pods (the alone arm waits as long) and \
             stopped after them. Each pod's time to Running \
             is the client's: from its first call to StartContainer's return. One untimed \
             warm-up round first. A round's ratio is its alone arm's p50 over its observed \
             arm's, and the verdict uses the median of the rounds' ratios (the pooled p50 \
             ratio is shown too). {}",
            WARM.as_secs(),
            RULE.describe()
        ),
        figures,
        goal: format!("p50 time to Running alone / observed ≥ {GOAL} (median of rounds)"),
        verdict: decision.text(),
        samples: json!({
            "pods_per_round": PODS,
            "alone_ms": without,
            "observed_ms": with,
            "round_ratios": ratios,
            "decision": decision.to_json(),
            "observer_cpu_ms_per_arm": observer_cpu_ms,
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
