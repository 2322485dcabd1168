//! Benchmark 10: pod startup while the OTLP collector is away. The same eight pods,
//! created at once, with the export off, to an endpoint that refuses connections (a
//! collector stopped), and to one that accepts and never answers (a collector hung, so
//! every export waits out its timeout); arms interleaved over rounds. Each pod's time
//! from first seen to Running comes from the agent's own timeline. The lab's noise is
//! the spread of the export-off arm's own round medians.

use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use super::agent::Agent;
use super::stats::percentile;
use super::{Figure, Outcome};

const PODS: usize = 8;
const ROUNDS: usize = 5;
const NODE: &str = "podlapse-bench-otlp";
use crate::lab::IMAGE_APP as IMAGE;
/// Between arms: time for the runtime's cleanup of the last arm's pods.
const SETTLE: Duration = Duration::from_secs(5);

fn manifest(i: usize) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: otlp-{i}\n  namespace: default\n\
         spec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    \
         image: {IMAGE}\n    command: [\"sleep\", \"3600\"]\n"
    )
}

/// Each pod's first seen → Running, in ms, from the agent's timeline.
fn startups(agent: &Agent) -> anyhow::Result<Vec<f64>> {
    let timeline = agent.query("timeline")?;
    let mut out = Vec::new();
    for pod in timeline["pods"].as_array().into_iter().flatten() {
        let stage = |name: &str| {
            pod["stages"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|s| s["stage"] == name)
                .and_then(|s| s["start_ns"].as_u64())
        };
        if let (Some(seen), Some(running)) = (stage("pod_seen"), stage("running")) {
            out.push(running.saturating_sub(seen) as f64 / 1e6);
        }
    }
    anyhow::ensure!(
        out.len() == PODS,
        "{} of {PODS} pods have a startup",
        out.len()
    );
    Ok(out)
}

fn round(bin: &Path, work: &Path, extra: &[String]) -> anyhow::Result<Vec<f64>> {
    let mut agent = Agent::start(bin, work, NODE, extra)?;
    for i in 0..PODS {
        let path = agent.manifests.join(format!("otlp-{i}.yaml"));
        std::fs::write(&path, manifest(i))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    agent.wait_for("every pod Running", Duration::from_secs(120), |a| {
        let phases = a.phases()?;
        Ok(phases.len() == PODS && phases.iter().all(|p| p == "Running"))
    })?;
    let ms = startups(&agent)?;
    agent.remove_all(Duration::from_secs(120))?;
    agent.stop()?;
    // The runtime goes on cleaning up after the pods are gone (shims exiting, snapshots
    // removed); without a pause that work lands on the next arm's start, and the first
    // arm of a round is the fastest whatever it is.
    std::thread::sleep(SETTLE);
    Ok(ms)
}

/// What benchmark 10 measured: each arm's name and its pods' times to Running, in ms
/// (all rounds, [`PODS`] per round in round order).
struct Measured {
    arms: Vec<&'static str>,
    samples: Vec<Vec<f64>>,
}

pub fn run(bin: &Path, dir: &Path) -> anyhow::Result<Outcome> {
    Ok(render(&measure(bin, dir)?))
}

fn measure(bin: &Path, dir: &Path) -> anyhow::Result<Measured> {
    // A port nothing listens on: connections are refused.
    let refused = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    // A listener that takes connections and never answers.
    let hung = TcpListener::bind("127.0.0.1:0")?;
    let hung_addr = hung.local_addr()?;
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in hung.incoming().flatten() {
            held.push(conn);
        }
    });
    let arms: [(&str, Vec<String>); 3] = [
        ("export off", vec![]),
        (
            "collector stopped (refuses)",
            vec!["--otlp-endpoint".into(), format!("http://{refused}")],
        ),
        (
            "collector hung (never answers)",
            vec!["--otlp-endpoint".into(), format!("http://{hung_addr}")],
        ),
    ];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); arms.len()];
    for r in 0..ROUNDS {
        // The order turns each round, so no arm always follows the same one (the
        // runtime's cleanup of the last arm's pods overlaps the next arm's start).
        for k in 0..arms.len() {
            let i = (r + k) % arms.len();
            let (name, extra) = &arms[i];
            eprintln!("bench: 10. round {} of {ROUNDS}: {name}", r + 1);
            let ms = round(bin, &dir.join("otlp"), extra)?;
            samples[i].extend(ms);
        }
    }
    Ok(Measured {
        arms: arms.iter().map(|(n, _)| *n).collect(),
        samples,
    })
}

fn render(m: &Measured) -> Outcome {
    let (arms, samples) = (&m.arms, &m.samples);
    let base = percentile(&samples[0], 50.0);
    // Each round's median of the export-off arm: how far the same setting moves from
    // round to round on this machine.
    let round_medians =
        |arm: &[f64]| -> Vec<f64> { arm.chunks(PODS).map(|r| percentile(r, 50.0)).collect() };
    let off = round_medians(&samples[0]);
    let noise = (off.iter().copied().fold(f64::MIN, f64::max)
        - off.iter().copied().fold(f64::MAX, f64::min))
        / base;
    let mut figures = Vec::new();
    let mut worst: f64 = 0.0;
    for (i, name) in arms.iter().enumerate() {
        let p50 = percentile(&samples[i], 50.0);
        let p90 = percentile(&samples[i], 90.0);
        let ratio = p50 / base;
        if i > 0 {
            worst = worst.max(ratio);
        }
        let rounds: Vec<String> = round_medians(&samples[i])
            .iter()
            .map(|m| format!("{m:.0}"))
            .collect();
        figures.push(Figure::new(
            &format!("{name}: first seen → Running, p50 / p90"),
            format!(
                "{p50:.0} / {p90:.0} ms ({ratio:.3}× of export off; round medians {} ms)",
                rounds.join(", ")
            ),
        ));
    }
    figures.push(Figure::new(
        "the lab's noise: spread of the export-off round medians",
        format!("{:.1}% of its p50", noise * 100.0),
    ));
    let met = worst - 1.0 <= noise;
    Outcome {
        number: 10,
        title: "OTLP collector away",
        method: format!(
            "{PODS} pods created at once, {ROUNDS} rounds, arms in an order that turns each round: export off, \
             --otlp-endpoint to a port that refuses connections, and to a listener that \
             accepts and never answers (each export waits out its 10 s timeout). Each \
             pod's first seen → Running from the agent's timeline."
        ),
        figures,
        goal: "p50 with the collector away within the lab's noise of the export off".into(),
        verdict: if met {
            format!(
                "met (worst {worst:.3}×, within the noise of {:.1}%)",
                noise * 100.0
            )
        } else {
            format!(
                "NOT met (worst {worst:.3}×, beyond the noise of {:.1}%)",
                noise * 100.0
            )
        },
        samples: json!({
            "arms": arms,
            "startup_ms": samples,
        }),
    }
}
