//! `podlapse replay`: replay traces through the reconciler in virtual time and compare
//! with what was recorded. Exit 0 when every trace matches, 1 on a divergence, 2 on bad
//! input.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use super::output::ReplayOutput;
use crate::cri::CriMethod;
use crate::replay::{Recorded, Tolerance, WhatIf, compare, replay_and};

#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// Trace files recorded with `podlapse run --trace`.
    #[arg(required = true, value_name = "TRACE")]
    pub traces: Vec<PathBuf>,
    /// Startup latency tolerance, absolute (ms).
    #[arg(long, default_value_t = 20.0, value_name = "MS")]
    pub tolerance_ms: f64,
    /// Startup latency tolerance, relative (%).
    #[arg(long, default_value_t = 10.0, value_name = "PCT")]
    pub tolerance_pct: f64,
    /// What-if: scale a CRI method's recorded latency, e.g. PullImage=0.5 (repeatable).
    #[arg(long = "scale", value_name = "METHOD=FACTOR", value_parser = parse_scale)]
    pub scale: Vec<(CriMethod, f64)>,
    /// What-if: pull images in parallel, at most N at once (0: no limit).
    #[arg(long, value_name = "N")]
    pub parallel_image_pulls: Option<usize>,
    /// Test-only: flip one reconciler decision (pull every image as Always) to show the
    /// comparison catches it.
    #[arg(long, hide = true)]
    pub test_flip_pull_policy: bool,
    /// For benchmarks: print to stderr how long reading, replaying and comparing took.
    #[arg(long, hide = true)]
    pub timing: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = ReplayOutput::Text)]
    pub output: ReplayOutput,
}

fn parse_scale(s: &str) -> Result<(CriMethod, f64), String> {
    let (m, f) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not METHOD=FACTOR"))?;
    let f: f64 = f
        .parse()
        .map_err(|_| format!("{s:?}: {f:?} is not a number"))?;
    if !(f.is_finite() && f > 0.0) {
        return Err(format!("{s:?}: the factor must be a positive number"));
    }
    let m: CriMethod = m.parse().map_err(|e| format!("{s:?}: {e}"))?;
    Ok((m, f))
}

pub fn run(args: &ReplayArgs) -> ExitCode {
    let what_if = WhatIf {
        scale: args.scale.iter().cloned().collect(),
        max_parallel_image_pulls: args.parallel_image_pulls.map(|n| (n > 0).then_some(n)),
        flip_pull_policy: args.test_flip_pull_policy,
    };
    let predicting = !what_if.scale.is_empty() || what_if.max_parallel_image_pulls.is_some();
    let tolerance = Tolerance {
        abs_ns: (args.tolerance_ms.max(0.0) * 1e6) as u64,
        pct: args.tolerance_pct.max(0.0),
    };
    let began = Instant::now();
    let mut traces = Vec::new();
    for path in &args.traces {
        match super::trace_file::read(path) {
            Ok(t) if t.header.observed.is_some() => {
                eprintln!(
                    "podlapse: {}: an observed trace (podlapse observe) cannot be replayed: \
                     another CRI client made its decisions, so there are none of podlapse's \
                     to compare; its timeline, report and diagnosis work on it",
                    path.display()
                );
                return ExitCode::from(super::EXIT_BAD_INPUT);
            }
            Ok(t) => traces.push(t),
            Err(code) => return code,
        }
    }
    let read = began.elapsed();
    let mut replaying = Duration::ZERO;
    let mut all_ok = true;
    let mut docs = Vec::new();
    let mut replays = Vec::new();
    let progress = super::progress::Progress::new(traces.len() as u64, "replay");
    for trace in &traces {
        progress.set_message(trace.path.display().to_string());
        let replay_began = Instant::now();
        // What the comparison takes from the recording is made while the replay runs.
        let (replayed, recorded) = replay_and(trace, &what_if, || Recorded::of(trace));
        replaying += replay_began.elapsed();
        progress.inc();
        let cmp = compare(trace, &recorded, &replayed, tolerance);
        replays.push(replayed);
        // A what-if replay predicts different latencies on purpose; only its calls count.
        let ok = if predicting {
            cmp.pods.iter().all(|p| p.divergence.is_none())
        } else {
            cmp.ok()
        };
        all_ok &= ok;
        if args.output == ReplayOutput::Json {
            docs.push(cmp);
        } else {
            progress.suspend(|| {
                print!("{cmp}");
                if predicting {
                    print!("{}", cmp.stage_table());
                }
            });
        }
    }
    progress.finish();
    if args.output == ReplayOutput::Json
        && let Err(e) = write_json(&docs)
    {
        eprintln!("podlapse: writing the comparison: {e}");
        return ExitCode::FAILURE;
    }
    if args.timing {
        let total = began.elapsed();
        eprintln!(
            "podlapse replay timing: {}",
            serde_json::json!({
                "read_s": read.as_secs_f64(),
                "replay_s": replaying.as_secs_f64(),
                "compare_and_output_s": (total - read - replaying).as_secs_f64(),
            })
        );
    }
    // The process exits next, and the OS takes the memory back at once: handing every
    // record back to the allocator one by one first would only delay the exit.
    std::mem::forget(traces);
    std::mem::forget(replays);
    std::mem::forget(docs);
    if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The comparisons as one pretty-printed JSON array and a newline, written to stdout as
/// they are serialized rather than built as one string first.
fn write_json(docs: &[crate::replay::Comparison]) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    serde_json::to_writer_pretty(&mut out, docs)?;
    writeln!(out)?;
    out.flush()
}
