//! Benchmark 8: every fuzz target (`cargo xtask fuzz`) for a bounded time: executions,
//! their rate, the corpus reached, and crashes.

use serde_json::json;

use super::{Figure, Outcome};
use crate::fuzz::{self, FuzzRun};

pub const SECONDS: u64 = 60;

/// Builds the targets before any benchmark runs: the build is long, would load the
/// machine under other benchmarks if it ran later, and reads the working tree, which
/// must be the one the release build read.
pub fn build() -> anyhow::Result<()> {
    fuzz::build_all()
}

/// Runs each target, already built by [`build`], for `seconds`.
pub fn run(seconds: u64) -> anyhow::Result<Outcome> {
    Ok(render(seconds, &measure(seconds)?))
}

fn measure(seconds: u64) -> anyhow::Result<Vec<FuzzRun>> {
    let mut runs = Vec::new();
    for target in fuzz::TARGETS {
        let r = fuzz::fuzz(target, seconds, fuzz::Build::Prebuilt)?;
        eprintln!("bench: {}", fuzz::summary(&r));
        runs.push(r);
    }
    Ok(runs)
}

fn render(seconds: u64, runs: &[FuzzRun]) -> Outcome {
    let crashed: Vec<&str> = runs
        .iter()
        .filter(|r| r.crash.is_some())
        .map(|r| r.target.as_str())
        .collect();
    let verdict = if crashed.is_empty() {
        format!(
            "met: 0 crashes in {} executions",
            runs.iter().map(|r| r.executions).sum::<u64>()
        )
    } else {
        format!("missed: {} crashed", crashed.join(", "))
    };
    Outcome {
        number: 8,
        title: "Fuzzing",
        method: format!(
            "`cargo xtask fuzz TARGET --seconds {seconds}` for each target: cargo-fuzz \
             (libFuzzer, AddressSanitizer, release build with debug assertions) from the \
             committed seeds in agent/fuzz/seeds/ and the corpus earlier runs left in \
             agent/fuzz/corpus/; executions and rate from libFuzzer's final stats. The \
             targets are built before the benchmarks start and run as built."
        ),
        figures: runs
            .iter()
            .map(|r| {
                Figure::new(
                    &r.target,
                    format!(
                        "{} executions ({:.0}/s), corpus {}, {}",
                        r.executions,
                        r.executions as f64 / r.seconds.max(0.001),
                        r.corpus,
                        match &r.crash {
                            Some(input) => format!("crashed on {}", input.display()),
                            None => "0 crashes".into(),
                        }
                    ),
                )
            })
            .collect(),
        goal: "0 crashes in every target".into(),
        verdict,
        samples: json!(
            runs.iter()
                .map(|r| json!({
                    "target": r.target,
                    "executions": r.executions,
                    "seconds": r.seconds,
                    "corpus": r.corpus,
                    "crash": r.crash.as_ref().map(|p| p.display().to_string()),
                }))
                .collect::<Vec<_>>()
        ),
    }
}
