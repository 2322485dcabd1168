//! `cargo xtask bench`: podlapse against its own goals on this machine. Writes
//! `BENCHMARKS.md` (figures, the command, the machine) and `target/bench/samples.json`
//! (every raw sample). Not part of `cargo xtask test`: timing is never asserted in a test.

mod accounting;
mod agent;
mod agent_cost;
mod churn;
mod cost_report;
mod direct;
mod fuzzing;
mod machine;
mod many_pods;
mod memory;
mod observer_cost;
mod otlp;
mod pods;
mod probe_overhead;
mod replay_speed;
mod seeing;
mod sequential;
mod shares;
mod stats;
mod syscall_tracepoints;
mod throughput;
mod units;
mod write_hook;

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use serde_json::{Value, json};

use xtask::lab::{self, LabPaths, UpOutcome};

use crate::workspace;
use xtask::text::list;

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Run only these benchmarks (by number: 1 pipeline overhead, 2 throughput, 3 seeing
    /// state, 4 probe overhead, 5 replay, 6 memory, 7 churn, 8 fuzzing, 9 startup
    /// explained, 10 OTLP collector away, 11 250 pods at once, 12 observer cost, 13 probes
    /// across kernels); default all but 13, which runs on request. A run of some keeps the
    /// other benchmarks' sections of BENCHMARKS.md, and a full run keeps 13's.
    #[arg(long = "only", value_name = "N")]
    pub only: Vec<u8>,
    /// Pods per arm and round in the pipeline overhead benchmark (1).
    #[arg(long, default_value_t = direct::OVERHEAD_PODS, value_name = "N")]
    pub overhead_pods: usize,
    /// Pods in the generated replay trace (benchmark 5).
    #[arg(long, default_value_t = replay_speed::PODS, value_name = "N")]
    pub replay_pods: usize,
    /// Rounds of ten pods in the churn benchmark (7); more than 10, since round 10's RSS
    /// is compared with the last round's.
    #[arg(long, default_value_t = churn::ROUNDS, value_name = "N", value_parser = churn::parse_rounds)]
    pub churn_rounds: usize,
    /// Seconds each fuzz target runs in the fuzzing benchmark (8).
    #[arg(long, default_value_t = fuzzing::SECONDS, value_name = "N")]
    pub fuzz_seconds: u64,
    /// The kernels the probe overhead benchmark (4) runs on: this machine's (`host`) and
    /// the modern node's (`node`, in its QEMU guest); default both.
    #[arg(long = "probe-kernel", value_enum, value_name = "KERNEL")]
    pub probe_kernels: Vec<probe_overhead::Kernel>,
    /// At most N rounds in each of benchmark 4's series, on every kernel or on the one
    /// named (`node=8`; repeatable): a shorter run, whose verdicts may then be
    /// undecided. Default each series' own cap.
    #[arg(long, value_name = "[KERNEL=]N")]
    pub probe_rounds_cap: Vec<probe_overhead::RoundsCap>,
    /// Benchmark 4 on the host also splits the every-program cost into wall-clock parts
    /// (three more series of alternating arms; the kernel's accounting tells the parts
    /// without them).
    #[arg(long)]
    pub probe_split: bool,
}

/// `xtask bench-probe-overhead`: benchmark 4's measurement alone.
#[derive(Debug, Clone, clap::Args)]
pub struct ProbeOverheadArgs {
    /// The podlapse binary whose `kernel-events` loads the probes.
    #[arg(long, value_name = "PATH")]
    pub podlapse: PathBuf,
    /// Where the run's logs go.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Where what it measured goes, as JSON.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Benchmark 13's measurement instead of 4's: only what the kernel accounts (the
    /// counted runs and the lines on pods, which `--pods-cri` then requires).
    #[arg(long, requires = "pods_cri")]
    pub shares_only: bool,
    /// The workload's binary (a busybox, run as `true`); default the first found here.
    #[arg(long, value_name = "PATH")]
    pub exec: Option<PathBuf>,
    /// At most this many rounds in each series.
    #[arg(long, value_name = "N")]
    pub cap: Option<usize>,
    /// Also the lines on pods, on the containerd whose CRI socket this is (a systemd
    /// node's, with `--pods-runtime-cgroup`), at the modern node's scale.
    #[arg(long, value_name = "SOCKET", requires = "pods_runtime_cgroup")]
    pub pods_cri: Option<PathBuf>,
    /// The runtime's service cgroup, as the node's CPU (`/system.slice/containerd.service`).
    #[arg(long, value_name = "CGROUP", requires = "pods_cri")]
    pub pods_runtime_cgroup: Option<String>,
}

/// Benchmark 4 measured here, its figures written to `args.out` for another machine to
/// render (the modern node's run).
pub fn probe_overhead_alone(args: &ProbeOverheadArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    if args.shares_only
        && let (Some(cri), Some(cgroup)) = (&args.pods_cri, &args.pods_runtime_cgroup)
    {
        let node = agent_cost::Node::Service {
            cri: cri.clone(),
            cgroup: cgroup.clone(),
        };
        let shares = probe_overhead::kernel_shares::measure(
            &args.podlapse,
            &args.dir,
            args.exec.as_deref(),
            &node,
        )?;
        return write_whole(&args.out, &serde_json::to_string(&shares)?);
    }
    let mut measured = probe_overhead::measure(
        &args.podlapse,
        &args.dir,
        args.exec.as_deref(),
        args.cap,
        false,
    )?;
    if let (Some(cri), Some(cgroup)) = (&args.pods_cri, &args.pods_runtime_cgroup) {
        probe_overhead::measure_pods(&mut measured, &args.podlapse, &args.dir, cri, cgroup);
    }
    write_whole(&args.out, &serde_json::to_string(&measured)?)
}

/// Written whole, then renamed: a run cut short leaves no half a result.
fn write_whole(out: &std::path::Path, text: &str) -> anyhow::Result<()> {
    let partial = out.with_extension("partial");
    std::fs::write(&partial, text).with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, out)
        .with_context(|| format!("renaming {} to {}", partial.display(), out.display()))
}

/// One line of a benchmark's results table.
pub struct Figure {
    pub name: String,
    pub value: String,
}

impl Figure {
    pub fn new(name: &str, value: String) -> Figure {
        Figure {
            name: name.to_string(),
            value,
        }
    }
}

/// What one benchmark measured, for BENCHMARKS.md and the samples file.
pub struct Outcome {
    pub number: u8,
    pub title: &'static str,
    pub method: String,
    pub figures: Vec<Figure>,
    pub goal: String,
    pub verdict: String,
    pub samples: Value,
}

const BENCHMARKS: &[(u8, &str)] = &[
    (1, "pipeline overhead"),
    (2, "throughput"),
    (3, "seeing state"),
    (4, "probe overhead"),
    (5, "replay speed"),
    (6, "memory"),
    (7, "churn"),
    (8, "fuzzing"),
    (9, "startup explained"),
    (10, "OTLP collector away"),
    (11, "250 pods at once"),
    (12, "observer cost"),
    (
        probe_overhead::kernel_shares::NUMBER,
        "probes across kernels",
    ),
];

/// Benchmarks a full run leaves out (their section kept from the run that wrote it):
/// 13's three guests would take the full run past its bound.
const ON_REQUEST: &[u8] = &[probe_overhead::kernel_shares::NUMBER];

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let command = std::iter::once("cargo xtask bench".to_string())
        .chain(args.only.iter().map(|n| format!("--only {n}")))
        .chain(
            (args.overhead_pods != direct::OVERHEAD_PODS)
                .then(|| format!("--overhead-pods {}", args.overhead_pods)),
        )
        .chain(
            (args.replay_pods != replay_speed::PODS)
                .then(|| format!("--replay-pods {}", args.replay_pods)),
        )
        .chain(
            (args.fuzz_seconds != fuzzing::SECONDS)
                .then(|| format!("--fuzz-seconds {}", args.fuzz_seconds)),
        )
        .chain(
            (args.churn_rounds != churn::ROUNDS)
                .then(|| format!("--churn-rounds {}", args.churn_rounds)),
        )
        .chain(
            args.probe_kernels
                .iter()
                .map(|k| format!("--probe-kernel {}", k.arg())),
        )
        .chain(
            args.probe_rounds_cap
                .iter()
                .map(|c| format!("--probe-rounds-cap {c}")),
        )
        .chain(args.probe_split.then(|| "--probe-split".to_string()))
        .collect::<Vec<_>>()
        .join(" ");
    let selected: Vec<u8> = BENCHMARKS
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| {
            if args.only.is_empty() {
                !ON_REQUEST.contains(n)
            } else {
                args.only.contains(n)
            }
        })
        .collect();
    // As `test` and `demo` do: a fresh machine gets what the benchmarks build and run
    // with (protoc, the lab's packages, the probes' toolchain) before anything starts.
    let report = crate::setup::run(true, &|s| eprintln!("bench: setup: {s}"));
    if !report.ok() {
        report.print();
        anyhow::bail!("setup failed; see the table above");
    }
    let dir = workspace::target_dir().join("bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    eprintln!("bench: building podlapse (release)");
    let bin = build_release()?;
    if selected.contains(&8) {
        fuzzing::build()?;
    }
    // Benchmark 12's client too: its release build takes minutes that are no part of
    // what the benchmark measures.
    if selected.contains(&12) {
        observer_cost::build_client()?;
    }
    let mut machine = machine::describe();
    let mut run = Provenance::now(&command);
    let started = std::time::Instant::now();
    let report = |machine: &machine::Machine,
                  run: &Provenance,
                  outcomes: &[Outcome],
                  failures: &[(u8, String)],
                  finished: bool| {
        let total_s = started.elapsed().as_secs_f64();
        write_report(&dir, machine, run, total_s, outcomes, failures, finished)
    };
    let mut outcomes = Vec::new();
    let mut failures: Vec<(u8, String)> = Vec::new();
    for n in selected {
        let name = BENCHMARKS.iter().find(|(m, _)| *m == n).map_or("", |b| b.1);
        eprintln!("bench: {n}. {name}");
        let began = std::time::Instant::now();
        let outcome = match n {
            1 => with_lab(|| direct::overhead(&bin, &dir, args.overhead_pods)),
            2 => with_lab(|| throughput::run(&bin, &dir)),
            3 => with_lab(|| seeing::run(&bin, &dir)),
            4 => probe_overhead::run(
                &bin,
                &dir,
                if args.probe_kernels.is_empty() {
                    &[probe_overhead::Kernel::Host, probe_overhead::Kernel::Node]
                } else {
                    &args.probe_kernels
                },
                &args.probe_rounds_cap,
                args.probe_split,
            ),
            5 => replay_speed::run(&bin, &dir, args.replay_pods),
            6 => with_lab(|| memory::run(&bin, &dir)),
            7 => with_lab(|| churn::run(&bin, &dir, args.churn_rounds)),
            8 => fuzzing::run(args.fuzz_seconds),
            9 => with_lab(|| shares::run_all(&bin, &dir)),
            10 => with_lab(|| otlp::run(&bin, &dir)),
            11 => with_lab(|| many_pods::run(&bin, &dir)),
            12 => with_lab(|| observer_cost::run(&bin, &dir)),
            probe_overhead::kernel_shares::NUMBER => probe_overhead::kernel_shares::run(&bin, &dir),
            _ => continue,
        };
        let took = began.elapsed().as_secs_f64();
        run.seconds.insert(n, took);
        eprintln!("bench: {n}. {name}: {took:.0} s");
        match outcome {
            Ok(o) => outcomes.push(o),
            // One benchmark failing must not lose the others' figures.
            Err(e) => {
                eprintln!("bench: {n}. {name} failed: {e:#}");
                failures.push((n, format!("{e:#}")));
            }
        }
        if let Some(runtime) = LAB_RUNTIME.get() {
            machine.runtime = runtime.clone();
        }
        // A run cut short (a crash, a killed lab, a session ending) keeps what it
        // measured: the figures so far are written after every benchmark.
        report(&machine, &run, &outcomes, &failures, false)?;
    }
    let (samples_path, copy) = report(&machine, &run, &outcomes, &failures, true)?;
    if !args.only.is_empty() {
        merge_into_previous(&run, &outcomes)?;
    } else {
        keep_on_request_sections()?;
    }
    println!(
        "wrote {}",
        workspace::root().join("BENCHMARKS.md").display()
    );
    println!(
        "raw samples: {} (copy: {})",
        samples_path.display(),
        copy.display()
    );
    if outcomes.is_empty() {
        anyhow::bail!("no benchmark finished");
    }
    Ok(())
}

/// What every one-shot `podlapse run` (or `bench-direct`) of a benchmark is given: its
/// manifests, a node name, its own root and log directories under `dir`, and the lab's
/// runtime.
fn on_lab<'c>(
    cmd: &'c mut std::process::Command,
    dir: &std::path::Path,
    manifests: &std::path::Path,
    node: &str,
) -> &'c mut std::process::Command {
    cmd.arg("--manifests")
        .arg(manifests)
        .args(["--node-name", node])
        .arg("--root-dir")
        .arg(dir.join("root"))
        .arg("--pod-logs-dir")
        .arg(dir.join("logs"))
        .arg("--cri")
        .arg(LabPaths::from_env().cri_socket())
}

/// A child's output, line by line, read on a thread of its own so the child never blocks
/// on a full pipe.
fn lines_of(r: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The lab's runtime as its binary said while the lab was up, for the machine table.
static LAB_RUNTIME: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Runs `f` on the node lab, starting it first when it is down and then taking it down
/// again, so a bench leaves the lab as it found it.
fn with_lab<T>(f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let paths = LabPaths::from_env();
    let started = matches!(
        lab::up(&paths, &crate::ui::lab_says)?,
        UpOutcome::Started(_)
    );
    // The lab's runtime is known for sure only while the lab is up (a fresh machine
    // unpacks it at the first `up`, and `down` may remove it).
    if let Some((version, _)) = xtask::lab::containerd_version(&paths) {
        let _ = LAB_RUNTIME.set(format!("containerd {version}"));
    }
    let result = f();
    if started {
        lab::down(&paths, &crate::ui::lab_says)?;
    }
    result
}

/// Which code a run measured, when, and how long each benchmark took.
pub struct Provenance {
    /// The command line, as a user would type it again.
    pub command: String,
    /// `git describe --always --dirty` of the workspace at the run's start.
    pub commit: String,
    /// The run's start, UTC.
    pub date: String,
    /// Each benchmark's wall time in this run, in seconds, by number.
    pub seconds: std::collections::BTreeMap<u8, f64>,
}

impl Provenance {
    fn now(command: &str) -> Provenance {
        let commit = std::process::Command::new("git")
            .args(["describe", "--always", "--dirty", "--abbrev=12"])
            .current_dir(workspace::root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map_or_else(
                || "unknown (not a git checkout)".to_string(),
                |o| String::from_utf8_lossy(&o.stdout).trim().to_string(),
            );
        Provenance {
            command: command.to_string(),
            commit,
            date: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            seconds: Default::default(),
        }
    }

    /// "at 0123abcd on 2026-12-04T21:00:00Z".
    fn at(&self) -> String {
        format!("at `{}` on {}", self.commit, self.date)
    }

    /// A benchmark's line on its own time: "Took 312 s in this run."
    fn took(&self, n: u8) -> Option<String> {
        self.seconds
            .get(&n)
            .map(|s| format!("Took {s:.0} s in the run {}.", self.at()))
    }
}

/// Writes the raw samples and the report. While the run goes on (`finished` false) the
/// report goes to `target/bench/BENCHMARKS.partial.md`; at the end, to BENCHMARKS.md.
fn write_report(
    dir: &std::path::Path,
    machine: &machine::Machine,
    run: &Provenance,
    total_s: f64,
    outcomes: &[Outcome],
    failures: &[(u8, String)],
    finished: bool,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let samples_path = dir.join("samples.json");
    let samples = json!({
        "command": run.command,
        "commit": run.commit,
        "date": run.date,
        "machine": machine.to_json(),
        "total_seconds": total_s,
        "seconds": run.seconds,
        "finished": finished,
        "benchmarks": outcomes.iter().map(|o| json!({
            "number": o.number,
            "title": o.title,
            "goal": o.goal,
            "verdict": o.verdict,
            "samples": o.samples,
        })).collect::<Vec<_>>(),
    });
    std::fs::write(&samples_path, serde_json::to_string_pretty(&samples)?)
        .with_context(|| format!("writing {}", samples_path.display()))?;
    let copy = dir.join(format!("samples-{}.json", machine.unix_time));
    std::fs::copy(&samples_path, &copy)
        .with_context(|| format!("copying to {}", copy.display()))?;
    let md_path: PathBuf = if finished {
        workspace::root().join("BENCHMARKS.md")
    } else {
        dir.join("BENCHMARKS.partial.md")
    };
    std::fs::write(
        &md_path,
        render(machine, run, total_s, outcomes, failures, finished),
    )
    .with_context(|| format!("writing {}", md_path.display()))?;
    Ok((samples_path, copy))
}

/// After a run of some benchmarks (`--only`): BENCHMARKS.md as it was in git, with this
/// run's summary rows and sections in place of theirs, each section saying which run it
/// came from. Without a committed BENCHMARKS.md, the partial report stands.
fn merge_into_previous(run: &Provenance, outcomes: &[Outcome]) -> anyhow::Result<()> {
    let Some(old) = committed_report()? else {
        return Ok(());
    };
    let path = workspace::root().join("BENCHMARKS.md");
    let merged = merge_report(&old, run, outcomes);
    std::fs::write(&path, merged).with_context(|| format!("writing {}", path.display()))
}

/// BENCHMARKS.md as the checkout's HEAD has it; None where it has none.
fn committed_report() -> anyhow::Result<Option<String>> {
    let committed = std::process::Command::new("git")
        .args(["show", "HEAD:BENCHMARKS.md"])
        .current_dir(workspace::root())
        .output()
        .context("git show HEAD:BENCHMARKS.md")?;
    Ok(committed
        .status
        .success()
        .then(|| String::from_utf8_lossy(&committed.stdout).into_owned()))
}

/// `old` with `outcomes`' rows and sections in place (see [`merge_into_previous`]).
fn merge_report(old: &str, run: &Provenance, outcomes: &[Outcome]) -> String {
    let mut parts = ReportParts::parse(old);
    for o in outcomes {
        parts.rows.insert(o.number, summary_row(o));
        let mut s = section(o, run);
        s = s.replacen(
            "\n\n",
            &format!(
                "\n\nRun again on its own: `{}`, {}.\n\n",
                run.command,
                run.at()
            ),
            1,
        );
        parts.sections.insert(o.number, s);
    }
    parts.head = parts.head.replace(
        "every figure below comes from that one run.",
        "every figure below comes from that one run, except the sections that say they were run again on their own.",
    );
    // What the old report said was not in its run is not this one's to say.
    parts.tail.clear();
    parts.compose()
}

/// After a full run: the benchmarks it leaves out ([`ON_REQUEST`]) keep the row and
/// section the committed BENCHMARKS.md has for them, from the run that wrote them.
fn keep_on_request_sections() -> anyhow::Result<()> {
    let Some(old) = committed_report()? else {
        return Ok(());
    };
    let path = workspace::root().join("BENCHMARKS.md");
    let new =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let kept = keep_sections(&new, &old, ON_REQUEST);
    std::fs::write(&path, kept).with_context(|| format!("writing {}", path.display()))
}

/// `new` with `old`'s rows and sections of `numbers` that `new` lacks, each saying it
/// came from an earlier run, and `new`'s lines on them in "Not in this run" dropped.
fn keep_sections(new: &str, old: &str, numbers: &[u8]) -> String {
    let old = ReportParts::parse(old);
    let mut parts = ReportParts::parse(new);
    let mut kept = Vec::new();
    for n in numbers {
        if parts.sections.contains_key(n) {
            continue;
        }
        if let (Some(row), Some(section)) = (old.rows.get(n), old.sections.get(n)) {
            parts.rows.insert(*n, row.clone());
            parts.sections.insert(*n, section.clone());
            kept.push(*n);
        }
    }
    if !kept.is_empty() {
        parts.head = parts.head.replace(
            "every figure below comes from that one run.",
            "every figure below comes from that one run, except the sections that say they were run on their own.",
        );
        parts.tail = parts
            .tail
            .lines()
            .filter(|l| !kept.iter().any(|n| l.starts_with(&format!("- {n}. "))))
            .map(|l| format!("{l}\n"))
            .collect();
        if parts.tail.trim() == "## Not in this run" {
            parts.tail.clear();
        }
    }
    parts.compose()
}

/// A report in its parts: the head (title, provenance, machine), the summary's rows and
/// the sections by benchmark number, and what follows them ("Not in this run").
struct ReportParts {
    head: String,
    rows: std::collections::BTreeMap<u8, String>,
    sections: std::collections::BTreeMap<u8, String>,
    tail: String,
}

impl ReportParts {
    fn parse(text: &str) -> ReportParts {
        let (head, rest) = text.split_once("\n## Summary\n").unwrap_or((text, ""));
        let mut parts = ReportParts {
            head: head.to_string(),
            rows: Default::default(),
            sections: Default::default(),
            tail: String::new(),
        };
        let number = |line: &str, prefix: &str| -> Option<u8> {
            line.strip_prefix(prefix)?
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        };
        let mut current: Option<u8> = None;
        let mut in_tail = false;
        for line in rest.lines() {
            // The summary table comes before the first section.
            if current.is_none()
                && !in_tail
                && let Some(n) = number(line, "| ")
            {
                parts.rows.insert(n, line.to_string());
                continue;
            }
            if line.starts_with("## ") {
                current = number(line, "## ");
                in_tail = current.is_none();
            }
            let into = match current {
                Some(n) => parts.sections.entry(n).or_default(),
                None if in_tail => &mut parts.tail,
                None => continue,
            };
            into.push_str(line);
            into.push('\n');
        }
        parts
    }

    fn compose(&self) -> String {
        let mut out = self.head.trim_end().to_string();
        out.push_str("\n\n## Summary\n\n| # | benchmark | goal | result |\n|---|---|---|---|\n");
        for r in self.rows.values() {
            out.push_str(r);
            out.push('\n');
        }
        for s in self.sections.values() {
            out.push('\n');
            out.push_str(s.trim_end());
            out.push('\n');
        }
        if !self.tail.trim().is_empty() {
            out.push('\n');
            out.push_str(self.tail.trim_end());
            out.push('\n');
        }
        out
    }
}

fn summary_row(o: &Outcome) -> String {
    format!(
        "| {} | {} | {} | {} |",
        o.number, o.title, o.goal, o.verdict
    )
}

/// One benchmark's section: its heading, method, figures and result.
fn section(o: &Outcome, run: &Provenance) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## {}. {}\n", o.number, o.title);
    let _ = writeln!(s, "{}\n", o.method);
    if let Some(took) = run.took(o.number) {
        let _ = writeln!(s, "{took}\n");
    }
    let _ = writeln!(s, "| figure | value |\n|---|---|");
    for f in &o.figures {
        let _ = writeln!(s, "| {} | {} |", f.name, f.value);
    }
    let _ = writeln!(s, "\nGoal: {}. Result: {}.", o.goal, o.verdict);
    s
}

fn build_release() -> anyhow::Result<PathBuf> {
    let (mut cmd, bin) = workspace::build_bin("podlapse", "podlapse", true);
    workspace::run(&mut cmd, "cargo build --release --package podlapse")?;
    Ok(bin)
}

fn render(
    machine: &machine::Machine,
    run: &Provenance,
    total_s: f64,
    outcomes: &[Outcome],
    failures: &[(u8, String)],
    finished: bool,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Benchmarks\n");
    let _ = writeln!(
        s,
        "Produced by `{}` {} (raw samples in `target/bench/samples.json`), in {total_s:.0} s ({:.0} min).",
        run.command,
        run.at(),
        total_s / 60.0
    );
    if !run.seconds.is_empty() {
        let _ = writeln!(
            s,
            "Each benchmark's time: {}.",
            list(
                &run.seconds.iter().collect::<Vec<_>>(),
                ", ",
                |(n, t)| format!("{n}. {t:.0} s")
            )
        );
    }
    let _ = writeln!(
        s,
        "Regenerate with the same command; every figure below comes from that one run.\n"
    );
    let _ = writeln!(s, "## Machine\n");
    let _ = writeln!(s, "| | |\n|---|---|");
    for (k, v) in machine.rows() {
        let _ = writeln!(s, "| {k} | {v} |");
    }
    let _ = writeln!(s, "\n## Summary\n");
    let _ = writeln!(s, "| # | benchmark | goal | result |\n|---|---|---|---|");
    for o in outcomes {
        let _ = writeln!(s, "{}", summary_row(o));
    }
    for o in outcomes {
        let _ = write!(s, "\n{}", section(o, run));
    }
    let missing: Vec<String> = BENCHMARKS
        .iter()
        .filter(|(n, _)| !outcomes.iter().any(|o| o.number == *n))
        .map(|(n, name)| match failures.iter().find(|(f, _)| f == n) {
            Some((_, why)) => format!("- {n}. {name}: failed in this run: {why}"),
            None if ON_REQUEST.contains(n) => format!(
                "- {n}. {name}: runs on request (`cargo xtask bench --only {n}`), and no \
                 earlier run of it is on record"
            ),
            None if finished => format!("- {n}. {name}: not selected in this run"),
            None => {
                format!("- {n}. {name}: not run yet (the run is still going, or was cut short)")
            }
        })
        .collect();
    if !missing.is_empty() {
        let _ = writeln!(s, "\n## Not in this run\n");
        for m in missing {
            let _ = writeln!(s, "{m}");
        }
    }
    s
}

/// Fails, showing `text` and the first of `needles` it lacks, unless it holds all of them.
#[cfg(test)]
fn assert_has(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "no {needle:?} in:\n{text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provenance(commit: &str, date: &str) -> Provenance {
        Provenance {
            command: "cargo xtask bench".into(),
            commit: commit.into(),
            date: date.into(),
            seconds: Default::default(),
        }
    }

    fn outcome(number: u8, verdict: &str) -> Outcome {
        Outcome {
            number,
            title: "t",
            method: "how".into(),
            figures: vec![Figure::new("8 pods", "1 ms".into())],
            goal: "g".into(),
            verdict: verdict.into(),
            samples: json!({}),
        }
    }

    #[test]
    fn a_run_of_some_benchmarks_replaces_only_their_rows_and_sections() {
        let mut full = provenance("abc123", "2026-12-01T10:00:00Z");
        full.seconds.insert(1, 61.4);
        full.seconds.insert(2, 300.0);
        let old = render(
            &machine::describe(),
            &full,
            10.0,
            &[outcome(1, "old one"), outcome(2, "old two")],
            &[],
            true,
        );
        assert!(old.contains("at `abc123` on 2026-12-01T10:00:00Z"), "{old}");
        assert!(
            old.contains("Each benchmark's time: 1. 61 s, 2. 300 s."),
            "{old}"
        );
        assert!(old.contains("Took 61 s in the run at `abc123`"), "{old}");
        let mut again = provenance("def456", "2026-12-02T10:00:00Z");
        again.command = "cargo xtask bench --only 2".into();
        again.seconds.insert(2, 42.0);
        again.seconds.insert(12, 7.0);
        let merged = merge_report(
            &old,
            &again,
            &[outcome(2, "new two"), outcome(12, "new twelve")],
        );
        // The sections run again say their own commit and time; the rest keep the
        // full run's.
        assert!(
            merged.contains("Took 61 s in the run at `abc123`"),
            "{merged}"
        );
        assert!(
            merged.contains("Took 42 s in the run at `def456`"),
            "{merged}"
        );
        assert!(!merged.contains("Took 300 s"), "{merged}");
        assert!(
            merged.contains("`cargo xtask bench --only 2`, at `def456` on 2026-12-02"),
            "{merged}"
        );
        assert!(merged.contains("| 1 | t | g | old one |"), "{merged}");
        assert!(merged.contains("| 2 | t | g | new two |"), "{merged}");
        assert!(!merged.contains("old two"), "{merged}");
        assert!(merged.contains("| 12 | t | g | new twelve |"), "{merged}");
        // Figure rows stay in their sections, never taken for summary rows.
        assert_eq!(merged.matches("| 8 pods | 1 ms |").count(), 3, "{merged}");
        let one = merged.find("## 1. t").unwrap();
        let two = merged.find("## 2. t").unwrap();
        let twelve = merged.find("## 12. t").unwrap();
        assert!(one < two && two < twelve, "{merged}");
        assert_eq!(
            merged.matches("Run again on its own").count(),
            2,
            "{merged}"
        );
        assert!(merged.contains("except the sections"), "{merged}");
    }

    #[test]
    fn a_full_run_keeps_the_section_of_a_benchmark_run_on_request() {
        let first = provenance("abc123", "2026-12-01T10:00:00Z");
        let mut on_request = provenance("abc123", "2026-12-01T12:00:00Z");
        on_request.command = "cargo xtask bench --only 13".into();
        on_request.seconds.insert(13, 1800.0);
        let old = render(
            &machine::describe(),
            &first,
            10.0,
            &[outcome(1, "one")],
            &[],
            true,
        );
        let old = merge_report(&old, &on_request, &[outcome(13, "thirteen")]);
        assert!(old.contains("| 13 | t | g | thirteen |"), "{old}");

        // The next full run leaves 13 out: its row and section stay, from their run.
        let full = provenance("fed321", "2026-12-09T10:00:00Z");
        let new = render(
            &machine::describe(),
            &full,
            10.0,
            &[outcome(1, "new one")],
            &[],
            true,
        );
        assert!(
            new.contains("13. probes across kernels: runs on request"),
            "{new}"
        );
        let kept = keep_sections(&new, &old, ON_REQUEST);
        assert_has(
            &kept,
            &[
                "| 1 | t | g | new one |",
                "| 13 | t | g | thirteen |",
                "## 13. t",
                "`cargo xtask bench --only 13`, at `abc123` on 2026-12-01T12:00:00Z",
                "Took 1800 s",
                "except the sections that say they were run on their own",
            ],
        );
        assert!(!kept.contains("runs on request"), "{kept}");
        assert!(!kept.contains("old one"), "{kept}");
        // The other benchmarks not in this run are still said.
        assert!(
            kept.contains("- 2. throughput: not selected in this run"),
            "{kept}"
        );
        assert!(kept.find("## 1. t").unwrap() < kept.find("## 13. t").unwrap());

        // Without an earlier run of 13, the report says how to run it.
        let first_ever = keep_sections(
            &new,
            &render(&machine::describe(), &first, 1.0, &[], &[], true),
            ON_REQUEST,
        );
        assert!(
            first_ever.contains("13. probes across kernels: runs on request"),
            "{first_ever}"
        );
    }
}
