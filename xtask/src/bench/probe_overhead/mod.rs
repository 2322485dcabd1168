//! Benchmark 4: what podlapse's probes cost an exec-heavy workload. One worker per CPU
//! spawns a tiny static binary in a loop; arms with the probes attached (`podlapse
//! kernel-events --summary-only`, which loads them as the agent does and drains the ring
//! buffer with the agent's reader) and without alternate ABBA as windows onto one
//! continuous run of the workload. Then a
//! 60 s run at the same full speed with the probes on counts lost events, with the
//! kernel's BPF statistics on for that run only, so each program's run time per hit
//! comes from the kernel. Between them, the every-program cost is split into the
//! kernel's, the programs' and the reader's parts, each a paired series of its own. All
//! of it runs on this machine's kernel and on the modern node's (`in_node.rs`).

mod in_node;
pub mod kernel_shares;
mod pod_share;
mod probes;
mod report;
mod verdict;
mod workload;

use probes::{Probes, ProgramRun, Summary, program_row, worst_per_hit};
use workload::{ExecTarget, exec_loop, exec_target, workload, workload_until};

use super::agent_cost::Node;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use serde::{Deserialize, Serialize};
use xtask::text::list;

use super::Outcome;
use super::sequential::{Decision, Rule};
use super::syscall_tracepoints::{SyscallTracepoints, syscall_programs};

/// Rounds of four arms each (ABBA, then BAAB, ...) in the agent's configuration: the
/// exec workload's rate against untraced, context only (the kernel's accounting decides:
/// a round's ratio spreads 10-20% on this machine, and 160 rounds left it undecided).
/// Six rounds, the fewest with a 95% interval of the median; a round takes about 11 s
/// (four arms of 1 s settle and a 1.5 s window, the probes' start and stop).
const AGENT_RULE: Rule = Rule::new(GOAL_RATIO, 6, 6, 6);
const ARM: Duration = Duration::from_millis(1500);
/// Untimed, before each arm's window: the workload runs on through it while an on arm's
/// probes start (or the last arm's stop), so neither lands in a window. Measured in
/// 150 ms slices after kernel-events attached in the agent's configuration, the
/// workload ran 4-10% slower in the first slice than in the same slice of an arm without
/// it, and 1-3% slower until about a second in (two runs of eight arms each): far more
/// than the programs' own run time, and gone once the agent has been up a second.
const SETTLE: Duration = Duration::from_millis(1000);
/// An untimed run first, so neither arm pays for cold caches.
const WARMUP: Duration = Duration::from_secs(2);
const LOSS_RUN: Duration = Duration::from_secs(60);
/// The counted run in the agent's configuration between sandbox operations.
const AGENT_RUN: Duration = Duration::from_secs(20);
/// Execs while the reader is paused: each leaves an exec event (312 bytes + an 8-byte
/// record header) and an exit event (56 + 8) in the ring, about 260 KiB in all, well
/// within the default 512 KiB ring even with the rest of the machine's execs, so nothing
/// is lost and the programs run their full paths.
const PAUSED_EXECS: u64 = 700;
/// A paused run that takes longer than this stops short of [`PAUSED_EXECS`].
const PAUSED_LIMIT: Duration = Duration::from_secs(30);
/// How long the probes may take to load and attach.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// What kernel-events prints once every program is attached.
const READY_LINE: &str = "podlapse: watching kernel events:";
const STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// The workload with the agent's probes (namespace programs detached between sandbox
/// operations), and with every program attached, against untraced.
const GOAL_RATIO: f64 = 0.99;
const GOAL_ALL_RATIO: f64 = 0.98;
const GOAL_LOST: u64 = 0;
const GOAL_NS_PER_HIT: f64 = 500.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Arm {
    On,
    Off,
}

impl Arm {
    fn name(self) -> &'static str {
        match self {
            Arm::On => "on",
            Arm::Off => "off",
        }
    }
}

/// ABBA in even rounds, BAAB in odd ones: neither arm is always first or last, so a
/// machine that speeds up or slows down during a round favours neither.
fn order(round: usize) -> [Arm; 4] {
    if round.is_multiple_of(2) {
        [Arm::On, Arm::Off, Arm::Off, Arm::On]
    } else {
        [Arm::Off, Arm::On, Arm::On, Arm::Off]
    }
}

/// What one arm's workload did.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct ArmRun {
    execs: u64,
    seconds: f64,
}

/// Execs per second over several runs: total execs over total time.
fn rate(runs: &[ArmRun]) -> f64 {
    let execs: u64 = runs.iter().map(|r| r.execs).sum();
    let seconds: f64 = runs.iter().map(|r| r.seconds).sum();
    execs as f64 / seconds
}

/// Execs/s with the probes over execs/s without, from one round's (or all rounds') arms.
fn ratio(arms: &[(Arm, ArmRun)]) -> f64 {
    rate(&runs_of(arms, Arm::On)) / rate(&runs_of(arms, Arm::Off))
}

/// The runs of the arms of one kind, in order.
fn runs_of(arms: &[(Arm, ArmRun)], want: Arm) -> Vec<ArmRun> {
    arms.iter()
        .filter(|(a, _)| *a == want)
        .map(|(_, r)| *r)
        .collect()
}

/// IRQ work interrupts summed over CPUs, from /proc/interrupts' `IWI:` line. A ring
/// buffer wakes its reader through IRQ work, so this counts wakeups (and the little else
/// that uses IRQ work).
fn irq_work_interrupts(interrupts: &str) -> Option<u64> {
    let line = interrupts
        .lines()
        .find(|l| l.trim_start().starts_with("IWI:"))?;
    let counts: Vec<u64> = line
        .trim_start()
        .trim_start_matches("IWI:")
        .split_whitespace()
        .map_while(|t| t.parse().ok())
        .collect();
    (!counts.is_empty()).then(|| counts.iter().sum())
}

fn read_irq_work() -> Option<u64> {
    irq_work_interrupts(&std::fs::read_to_string("/proc/interrupts").ok()?)
}

fn stats_sysctl() -> anyhow::Result<String> {
    Ok(std::fs::read_to_string(STATS_SYSCTL)
        .with_context(|| format!("reading {STATS_SYSCTL}"))?
        .trim()
        .to_string())
}

/// The kernel's BPF run-time statistics, on while this lives. `BPF_ENABLE_STATS` hands
/// back a file descriptor and the kernel counts while it is open: closing it (even when
/// the process dies) puts the setting back, so nothing on the machine stays changed.
struct BpfStats {
    _fd: OwnedFd,
}

impl BpfStats {
    fn enable() -> anyhow::Result<BpfStats> {
        aya::sys::enable_stats(aya::sys::Stats::RunTime)
            .map(|fd| BpfStats { _fd: fd })
            .map_err(|e| anyhow!("enabling the kernel's BPF statistics (BPF_ENABLE_STATS): {e}"))
    }
}

/// Tracepoint programs loaded before this benchmark started anything: another tracer's
/// probes cost both arms alike, but they are worth knowing about.
fn other_tracepoint_programs() -> Vec<String> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| matches!(p.program_type(), Ok(aya::programs::ProgramType::TracePoint)))
        .map(|p| format!("{} (id {})", p.name_as_str().unwrap_or("?"), p.id()))
        .collect()
}

/// What the runs with the kernel's statistics on measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Counted {
    /// The probes on for [`LOSS_RUN`] at full speed.
    run: ArmRun,
    summary: Summary,
    /// What kernel-events said meanwhile (loss reports).
    said: Vec<String>,
    /// IRQ work interrupts during that run.
    irq_work: Option<u64>,
    /// [`PAUSED_EXECS`] with the reader paused.
    paused_run: ArmRun,
    paused: Summary,
    /// The agent's configuration between sandbox operations, for [`AGENT_RUN`]: the
    /// workload's execs and exits are dropped in the kernel.
    agent: Summary,
}

fn counted_runs(
    bin: &Path,
    work: &Path,
    target: &ExecTarget,
    workers: usize,
) -> anyhow::Result<Counted> {
    let probes = Probes::start(bin, work.join("kernel-events-paused.log"), &[])?;
    probes.pause();
    let per_worker = PAUSED_EXECS.div_ceil(workers as u64);
    let paused_run = workload_until(target, workers, PAUSED_LIMIT, per_worker)?;
    let (paused, _) = probes.stop()?;

    let probes = Probes::start(bin, work.join("kernel-events-loss-run.log"), &[])?;
    let before = read_irq_work();
    let run = workload(target, workers, LOSS_RUN)?;
    let after = read_irq_work();
    let (summary, said) = probes.stop()?;

    let probes = Probes::start(bin, work.join("kernel-events-agent-run.log"), AGENT_ARGS)?;
    workload(target, workers, AGENT_RUN)?;
    let (agent, _) = probes.stop()?;
    Ok(Counted {
        run,
        summary,
        said,
        irq_work: before.zip(after).map(|(b, a)| a.saturating_sub(b)),
        paused_run,
        paused,
        agent,
    })
}

/// Ratios as a figure shows them.
fn joined(ratios: &[f64]) -> String {
    list(ratios, ", ", |r| format!("{r:.3}"))
}

/// What an arm runs beside the workload.
enum Mode {
    /// Nothing: the untraced baseline.
    Untraced,
    /// `podlapse kernel-events` with these arguments.
    Probes {
        name: &'static str,
        args: &'static [&'static str],
    },
    /// `podlapse kernel-events` with these arguments, stopped (SIGSTOP) once attached and
    /// settled: the programs run their full paths, nothing reads what they write.
    ReaderPaused {
        name: &'static str,
        args: &'static [&'static str],
    },
    /// These syscall tracepoints enabled with no program ([`SyscallTracepoints`]).
    SyscallTracepoints(Vec<String>),
}

impl Mode {
    fn name(&self) -> &'static str {
        match self {
            Mode::Untraced => "untraced",
            Mode::Probes { name, .. } | Mode::ReaderPaused { name, .. } => name,
            Mode::SyscallTracepoints(_) => "syscall-tracepoints",
        }
    }
}

/// As the agent runs them between sandbox operations: the namespace programs loaded but
/// detached.
const AGENT_MODE: Mode = Mode::Probes {
    name: "agent",
    args: AGENT_ARGS,
};
const AGENT_ARGS: &[&str] = &["--netns-on-demand"];
/// Every program attached: the agent while it creates or removes a sandbox (and for a
/// second after), and `kernel-events`.
const ALL_ON_MODE: Mode = Mode::Probes {
    name: "all-attached",
    args: &[],
};
/// Every program attached, the reader stopped: with a ring of [`PAUSED_RING_BYTES`], so a
/// window's events fit in it and nothing is lost (a full ring would cut the programs'
/// paths short at the reservation).
const PAUSED_MODE: Mode = Mode::ReaderPaused {
    name: "reader-paused",
    args: &["--ringbuf-bytes", "16777216"],
};
const PAUSED_RING_BYTES: u64 = 16 << 20;
/// Rounds with every program attached, context as [`AGENT_RULE`]'s.
const ALL_ON_RULE: Rule = Rule::new(GOAL_ALL_RATIO, 6, 6, 6);
/// Each part of the every-program cost (the kernel's tracepoints, the programs, the
/// reader) is a series of rounds of its own, its two arms side by side: context, whose
/// interval tells a part from nothing only where it is large.
const SPLIT_RULE: Rule = Rule::new(1.0, 6, 6, 6);

/// Alternating rounds, what their rule concluded, and the reader's CPU in their on arms.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Alternated {
    rounds: Vec<Vec<(Arm, ArmRun, Option<Summary>)>>,
    decision: Decision,
    /// The reader's own CPU time during the on arms, and the arms' length.
    reader_ns: u64,
    on_seconds: f64,
}

impl Alternated {
    fn round_ratios(&self) -> Vec<f64> {
        self.rounds
            .iter()
            .map(|arms| ratio(&arms.iter().map(|(a, r, _)| (*a, *r)).collect::<Vec<_>>()))
            .collect()
    }

    fn pooled(&self) -> f64 {
        ratio(&self.arm_runs())
    }

    /// Every arm of every round, in order.
    fn arm_runs(&self) -> Vec<(Arm, ArmRun)> {
        self.rounds
            .iter()
            .flatten()
            .map(|(a, r, _)| (*a, *r))
            .collect()
    }

    /// Execs per second over every arm of one kind.
    fn rate(&self, want: Arm) -> f64 {
        rate(&runs_of(&self.arm_runs(), want))
    }

    /// kernel-events' summaries of the on arms that ran it, in order.
    fn summaries(&self) -> impl Iterator<Item = &Summary> {
        self.rounds
            .iter()
            .flatten()
            .filter_map(|(_, _, s)| s.as_ref())
    }

    /// A count summed over those summaries.
    fn summed(&self, count: impl Fn(&Summary) -> u64) -> u64 {
        self.summaries().map(count).sum()
    }
}

/// `workers` exec loops that run until `stop`, counting into `done`: the alternating
/// arms are windows onto this one run. A loop that fails sets `stop` too.
fn continuous<'s>(
    scope: &'s std::thread::Scope<'s, '_>,
    target: &'s ExecTarget,
    workers: usize,
    done: &'s AtomicU64,
    stop: &'s AtomicBool,
) -> Vec<std::thread::ScopedJoinHandle<'s, anyhow::Result<u64>>> {
    (0..workers)
        .map(|_| {
            scope.spawn(move || {
                let r = exec_loop(target, |_| !stop.load(Ordering::Relaxed), done);
                stop.store(true, Ordering::Relaxed);
                r
            })
        })
        .collect()
}

/// The execs in the next `length` of a continuous run.
fn window(done: &AtomicU64, length: Duration) -> ArmRun {
    let (execs, start) = (done.load(Ordering::Relaxed), Instant::now());
    std::thread::sleep(length);
    ArmRun {
        execs: done.load(Ordering::Relaxed) - execs,
        seconds: start.elapsed().as_secs_f64(),
    }
}

/// Rounds of `on` against `off` as `rule` takes them, each arm a window onto one
/// continuous run of the workload.
fn alternate(
    bin: &Path,
    work: &Path,
    target: &ExecTarget,
    workers: usize,
    rule: &Rule,
    on: &Mode,
    off: &Mode,
) -> anyhow::Result<Alternated> {
    let (done, stop) = (AtomicU64::new(0), AtomicBool::new(false));
    std::thread::scope(|s| {
        let loops = continuous(s, target, workers, &done, &stop);
        let rounds = alternate_windows(bin, work, &done, &stop, rule, on, off);
        stop.store(true, Ordering::Relaxed);
        for l in loops {
            l.join().map_err(|_| anyhow!("an exec worker panicked"))??;
        }
        rounds
    })
}

/// One arm's window, what kernel-events summed up if the arm ran it, and its reader's
/// CPU time in the window.
type ArmWindow = (ArmRun, Option<Summary>, u64);

/// One arm: `mode` set up, [`SETTLE`] while the workload runs on, then the window. Probes
/// start before the settle and stop after the window, so neither lands in it.
fn arm(bin: &Path, log: PathBuf, done: &AtomicU64, mode: &Mode) -> anyhow::Result<ArmWindow> {
    match mode {
        Mode::Untraced => {
            std::thread::sleep(SETTLE);
            Ok((window(done, ARM), None, 0))
        }
        Mode::Probes { args, .. } => {
            let probes = Probes::start(bin, log, args)?;
            std::thread::sleep(SETTLE);
            let before = probes.cpu_ns();
            let run = window(done, ARM);
            let reader_ns = probes.cpu_ns().saturating_sub(before);
            let (summary, _) = probes.stop()?;
            Ok((run, Some(summary), reader_ns))
        }
        Mode::ReaderPaused { args, .. } => {
            let probes = Probes::start(bin, log, args)?;
            // The reader drains what attaching left before it stops.
            std::thread::sleep(SETTLE);
            probes.pause();
            let run = window(done, ARM);
            let (summary, _) = probes.stop()?;
            Ok((run, Some(summary), 0))
        }
        Mode::SyscallTracepoints(names) => {
            let enabled = SyscallTracepoints::enable(names)?;
            std::thread::sleep(SETTLE);
            let run = window(done, ARM);
            drop(enabled);
            Ok((run, None, 0))
        }
    }
}

/// The rounds of [`alternate`], as many as `rule` takes.
fn alternate_windows(
    bin: &Path,
    work: &Path,
    done: &AtomicU64,
    stop: &AtomicBool,
    rule: &Rule,
    on: &Mode,
    off: &Mode,
) -> anyhow::Result<Alternated> {
    let mut rounds: Vec<Vec<(Arm, ArmRun, Option<Summary>)>> = Vec::new();
    // The reader's own CPU time during the on arms, and the arms' length.
    let (mut reader_ns, mut on_seconds) = (0_u64, 0.0_f64);
    let series = format!("{} against {}", on.name(), off.name());
    let decision = rule.run(|round| -> anyhow::Result<f64> {
        let mut arms = Vec::new();
        for (i, which) in order(round).into_iter().enumerate() {
            if stop.load(Ordering::Relaxed) {
                bail!("the exec workload stopped");
            }
            let mode = if which == Arm::On { on } else { off };
            let log = work.join(format!(
                "kernel-events-{}-r{}-{}.log",
                mode.name(),
                round + 1,
                i + 1
            ));
            let (run, summary, cpu) = arm(bin, log, done, mode)?;
            if which == Arm::On {
                reader_ns += cpu;
                on_seconds += run.seconds;
            }
            arms.push((which, run, summary));
        }
        let pairs: Vec<(Arm, ArmRun)> = arms.iter().map(|(a, r, _)| (*a, *r)).collect();
        eprintln!(
            "bench: probe overhead ({series}): round {} of at most {} ({}): {:.0} execs/s \
             {}, {:.0} {}: {:.3}×",
            round + 1,
            rule.cap,
            order(round).map(Arm::name).join(" "),
            rate(&runs_of(&pairs, Arm::On)),
            on.name(),
            rate(&runs_of(&pairs, Arm::Off)),
            off.name(),
            ratio(&pairs)
        );
        rounds.push(arms);
        Ok(ratio(&pairs))
    })?;
    eprintln!("bench: probe overhead ({series}): {}", decision.text());

    Ok(Alternated {
        rounds,
        decision,
        reader_ns,
        on_seconds,
    })
}

/// The every-program cost in parts, each a series of its own two arms side by side:
/// the kernel's syscall tracepoints against untraced, the programs with their reader
/// paused against those tracepoints, and every program read against the reader paused.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Split {
    /// The syscall tracepoints the all-attached programs sit on: none where the
    /// namespace programs hook kernel functions.
    syscall_tracepoints: Vec<String>,
    /// Tracepoints alone against untraced; `None` without syscall tracepoints.
    kernel: Option<Alternated>,
    /// The programs, reader paused, against the tracepoints alone (or untraced).
    programs: Alternated,
    /// Every program attached and read against the reader paused.
    reader: Alternated,
}

/// Everything the benchmark measured on one kernel, in the order it ran: what the modern
/// node's run sends back to the host as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Measured {
    /// The kernel's release (`uname -r`).
    kernel: String,
    /// Whether the CPU was emulated (the modern node's QEMU runs without KVM): the host
    /// that booted it says so, and the programs' run time per hit is then not judged.
    #[serde(default)]
    emulated: bool,
    /// The most rounds any series ran (`--probe-rounds-cap`), when capped.
    #[serde(default)]
    cap: Option<usize>,
    workers: usize,
    /// The exec workload's command, as shown.
    target: String,
    /// Tracepoint programs loaded before the benchmark started anything.
    others: Vec<String>,
    /// kernel.bpf_stats_enabled before the benchmark and after the counted runs.
    stats_before: String,
    stats_after: String,
    warm: ArmRun,
    /// The alternating rounds in the agent's configuration (the verdict's).
    agent: Alternated,
    /// The alternating rounds with every program attached.
    all_on: Alternated,
    /// The every-program cost split into wall-clock parts: on request, on the host only
    /// (the kernel's accounting tells the parts on every kernel; under emulation the
    /// split's three series took most of the benchmark's time).
    #[serde(default)]
    split: Option<Split>,
    counted: Counted,
    /// The lines on pods, where the run measured them itself (the modern node's).
    #[serde(default)]
    pods: Option<pod_share::PodShares>,
}

/// Where benchmark 4 runs: this machine's kernel, and the modern node's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kernel {
    /// This machine's kernel.
    Host,
    /// The modern node's kernel, in its QEMU guest.
    Node,
}

/// `--probe-rounds-cap [KERNEL=]N`: at most N rounds in each series, on that kernel or on
/// every one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundsCap {
    pub kernel: Option<Kernel>,
    pub rounds: usize,
}

impl std::str::FromStr for RoundsCap {
    type Err = String;

    fn from_str(s: &str) -> Result<RoundsCap, String> {
        let (kernel, n) = match s.split_once('=') {
            Some((k, n)) => (
                Some(
                    <Kernel as clap::ValueEnum>::from_str(k, false)
                        .map_err(|_| format!("{s:?}: {k:?} is not a kernel (host or node)"))?,
                ),
                n,
            ),
            None => (None, s),
        };
        let rounds = n
            .parse::<usize>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| format!("{s:?}: {n:?} is not a number of rounds (1 or more)"))?;
        Ok(RoundsCap { kernel, rounds })
    }
}

impl std::fmt::Display for RoundsCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kernel {
            Some(k) => write!(f, "{}={}", k.arg(), self.rounds),
            None => write!(f, "{}", self.rounds),
        }
    }
}

/// The cap for `kernel`: its own if given, else one for every kernel.
fn cap_for(caps: &[RoundsCap], kernel: Kernel) -> Option<usize> {
    caps.iter()
        .rev()
        .find(|c| c.kernel == Some(kernel))
        .or_else(|| caps.iter().rev().find(|c| c.kernel.is_none()))
        .map(|c| c.rounds)
}

/// Benchmark 4 on each of `kernels`, `caps` capping their series' rounds. A kernel whose
/// run fails is said in the verdict; the other's figures stay.
pub fn run(
    bin: &Path,
    dir: &Path,
    kernels: &[Kernel],
    caps: &[RoundsCap],
    with_split: bool,
) -> anyhow::Result<Outcome> {
    let mut runs = Vec::new();
    for kernel in kernels {
        let cap = cap_for(caps, *kernel);
        // The lines on pods need the lab: its containerd on the host, its registry
        // (forwarded) for the modern node's pulls.
        let (measured, pods) = match kernel {
            Kernel::Host => {
                let measured = measure(bin, dir, None, cap, with_split);
                let pods = super::with_lab(|| {
                    pod_share::measure(bin, dir, &Node::Lab, pod_share::Scale::HOST)
                })
                .unwrap_or_else(|e| pod_share::PodShares::NotMeasured(format!("{e:#}")));
                (measured, pods)
            }
            Kernel::Node => match super::with_lab(|| in_node::measure(bin, dir, cap)) {
                Ok(mut m) => {
                    let pods = m.pods.take().unwrap_or_else(|| {
                        pod_share::PodShares::NotMeasured(
                            "the modern node's run sent no pods back".into(),
                        )
                    });
                    (Ok(m), pods)
                }
                Err(e) => (
                    Err(e),
                    pod_share::PodShares::NotMeasured("the modern node's run failed".into()),
                ),
            },
        };
        if let Err(e) = &measured {
            eprintln!(
                "bench: probe overhead on the {} failed: {e:#}",
                kernel.label()
            );
        }
        runs.push((*kernel, measured.map_err(|e| format!("{e:#}")), pods));
    }
    if runs.iter().all(|(_, m, _)| m.is_err()) {
        bail!(
            "{}",
            list(&runs, "; ", |(k, m, _)| {
                format!("{}: {}", k.label(), m.as_ref().err().map_or("", |e| e))
            })
        );
    }
    Ok(report::render(&runs))
}

impl Kernel {
    /// As `--probe-kernel` takes it.
    pub fn arg(self) -> &'static str {
        match self {
            Kernel::Host => "host",
            Kernel::Node => "node",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Kernel::Host => "host",
            Kernel::Node => "modern node",
        }
    }
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

/// The warm-up, the alternating rounds of each mode, the split, then the counted runs
/// with the kernel's statistics on. `exec` is the workload's binary when not found here;
/// `cap` caps every series' rounds.
pub fn measure(
    bin: &Path,
    dir: &Path,
    exec: Option<&Path>,
    cap: Option<usize>,
    with_split: bool,
) -> anyhow::Result<Measured> {
    let work = dir.join("probe-overhead");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let target = exec_target(exec)?;
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let others = other_tracepoint_programs();
    if !others.is_empty() {
        eprintln!(
            "bench: probe overhead: tracepoint programs already loaded (they cost both arms): {}",
            others.join(", ")
        );
    }
    let stats_before = stats_sysctl()?;

    let warm = workload(&target, workers, WARMUP)?;
    eprintln!(
        "bench: probe overhead: {workers} workers exec `{}`: {:.0} execs/s untraced (warm-up)",
        target.shown,
        rate(&[warm])
    );

    // The agent's configuration between the CRI calls that create or enter pod
    // namespaces (the verdict's), then every program attached, as during those calls.
    let series = |rule: Rule, on: &Mode, off: &Mode| {
        alternate(bin, &work, &target, workers, &rule.capped(cap), on, off)
    };
    let agent = series(AGENT_RULE, &AGENT_MODE, &Mode::Untraced)?;
    let all_on = series(ALL_ON_RULE, &ALL_ON_MODE, &Mode::Untraced)?;
    let split = if with_split {
        Some(split(&all_on, series)?)
    } else {
        None
    };

    // The kernel's statistics on for the counted runs alone: counting costs two clock
    // reads per program run, which the alternating arms must not pay.
    let stats = BpfStats::enable()?;
    let counted = counted_runs(bin, &work, &target, workers);
    drop(stats);
    let stats_after = stats_sysctl()?;
    if stats_after != stats_before {
        eprintln!(
            "bench: probe overhead: {STATS_SYSCTL} was {stats_before} before and is \
             {stats_after} now (changed by someone else?)"
        );
    }
    let counted = counted?;
    eprintln!(
        "bench: probe overhead: reader paused: {} execs, {} events, {} lost",
        counted.paused_run.execs, counted.paused.events, counted.paused.lost
    );
    eprintln!(
        "bench: probe overhead: {} s at full speed: {:.0} execs/s, {} events, {} lost",
        LOSS_RUN.as_secs(),
        rate(&[counted.run]),
        counted.summary.events,
        counted.summary.lost
    );
    Ok(Measured {
        kernel: kernel_release(),
        emulated: false,
        cap,
        workers,
        target: target.shown,
        others,
        stats_before,
        stats_after,
        warm,
        agent,
        all_on,
        split,
        counted,
        pods: None,
    })
}

/// The lines on pods on a systemd node's containerd (its socket `cri`, its service's
/// cgroup), at the modern node's scale, into `measured`; a failure is said there.
pub fn measure_pods(measured: &mut Measured, bin: &Path, dir: &Path, cri: &Path, cgroup: &str) {
    let node = Node::Service {
        cri: cri.to_path_buf(),
        cgroup: cgroup.to_string(),
    };
    let pods = pod_share::measure(bin, dir, &node, pod_share::Scale::EMULATED)
        .unwrap_or_else(|e| pod_share::PodShares::NotMeasured(format!("{e:#}")));
    measured.pods = Some(pods);
}

/// The split's three series (two without syscall tracepoints under the programs).
fn split(
    all_on: &Alternated,
    series: impl Fn(Rule, &Mode, &Mode) -> anyhow::Result<Alternated>,
) -> anyhow::Result<Split> {
    // The syscall tracepoints those programs sit on, enabled with no program: the part
    // of the all-attached cost that is the kernel's, whatever the programs do.
    let syscall_tracepoints = syscall_programs(
        all_on
            .summaries()
            .flat_map(|s| s.programs.iter().map(|p| p.program.as_str())),
    );
    let tracepoints = Mode::SyscallTracepoints(syscall_tracepoints.clone());
    let (kernel, below_programs) = if syscall_tracepoints.is_empty() {
        (None, &Mode::Untraced)
    } else {
        (
            Some(series(SPLIT_RULE, &tracepoints, &Mode::Untraced)?),
            &tracepoints,
        )
    };
    let programs = series(SPLIT_RULE, &PAUSED_MODE, below_programs)?;
    let reader = series(SPLIT_RULE, &ALL_ON_MODE, &PAUSED_MODE)?;
    Ok(Split {
        syscall_tracepoints,
        kernel,
        programs,
        reader,
    })
}

#[cfg(test)]
mod tests {
    use super::report::tests::program;
    use super::*;

    fn run(execs: u64, seconds: f64) -> ArmRun {
        ArmRun { execs, seconds }
    }

    #[test]
    fn a_rounds_cap_names_its_kernel_or_every_one() {
        let caps: Vec<RoundsCap> = ["16", "node=8"]
            .iter()
            .map(|c| c.parse().unwrap())
            .collect();
        assert_eq!(cap_for(&caps, Kernel::Host), Some(16));
        assert_eq!(cap_for(&caps, Kernel::Node), Some(8));
        assert_eq!(cap_for(&[], Kernel::Node), None);
        assert_eq!(caps[1].to_string(), "node=8");
        let e = "guest=8".parse::<RoundsCap>().unwrap_err();
        assert!(e.contains("\"guest\" is not a kernel"), "{e}");
        let e = "node=0".parse::<RoundsCap>().unwrap_err();
        assert!(e.contains("\"0\" is not a number of rounds"), "{e}");
    }

    #[test]
    fn rounds_alternate_abba_and_baab() {
        assert_eq!(order(0), [Arm::On, Arm::Off, Arm::Off, Arm::On]);
        assert_eq!(order(1), [Arm::Off, Arm::On, Arm::On, Arm::Off]);
        assert_eq!(order(2), order(0));
        // Each round has two arms of each kind.
        for r in 0..4 {
            assert_eq!(order(r).iter().filter(|a| **a == Arm::On).count(), 2);
        }
    }

    #[test]
    fn a_round_ratio_is_pooled_rates_not_a_mean_of_ratios() {
        // On: 900 execs in 10 s = 90/s; off: 1000 execs in 10 s = 100/s.
        let arms = [
            (Arm::On, run(400, 5.0)),
            (Arm::Off, run(500, 5.0)),
            (Arm::Off, run(500, 5.0)),
            (Arm::On, run(500, 5.0)),
        ];
        assert!((ratio(&arms) - 0.9).abs() < 1e-12, "{}", ratio(&arms));
        // Arm lengths that differ weigh by time.
        let arms = [(Arm::On, run(100, 1.0)), (Arm::On, run(300, 3.0))];
        assert!((rate(&arms.map(|a| a.1)) - 100.0).abs() < 1e-12);
    }

    #[test]
    fn irq_work_is_summed_over_cpus_from_proc_interrupts() {
        let text = "           CPU0       CPU1\n\
                    NMI:          0          0   Non-maskable interrupts\n\
                    IWI:     211580     206551   IRQ work interrupts\n\
                    RES:    1038286     933716   Rescheduling interrupts\n";
        assert_eq!(irq_work_interrupts(text), Some(418_131));
        assert_eq!(
            irq_work_interrupts("RES: 1 2 Rescheduling interrupts\n"),
            None
        );
        assert_eq!(irq_work_interrupts("IWI: IRQ work interrupts\n"), None);
    }

    #[test]
    fn a_program_row_shows_the_paused_run_only_when_it_ran() {
        let p = |t, n| program("sched_process_exec", t, n);
        assert_eq!(
            program_row(&p(11_000, 10), Some(&p(3000, 3))),
            "10, 1100 ns (1000 ns)"
        );
        assert_eq!(program_row(&p(11_000, 10), Some(&p(0, 0))), "10, 1100 ns");
        assert_eq!(program_row(&p(11_000, 10), None), "10, 1100 ns");
        assert_eq!(program_row(&p(0, 0), Some(&p(3000, 3))), "0, -");
    }

    #[test]
    fn the_worst_program_is_the_highest_per_hit_among_those_that_ran() {
        let programs = [
            program("a", 1000, 10),
            program("b", 900, 3),
            program("c", 50, 0),
            program("d", 0, 100),
        ];
        assert_eq!(worst_per_hit(&programs), Some(("b", 300.0)));
        assert_eq!(worst_per_hit(&[program("c", 50, 0)]), None);
    }
}
