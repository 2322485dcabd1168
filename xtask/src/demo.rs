//! `cargo xtask demo`: the main job end to end on a fresh clone. Setup where missing,
//! build, lab up, create the example pods, show each result, lab down, prove the
//! teardown left nothing behind.

use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use xtask::lab::{self, LabPaths, POD_SUBNET, UpOutcome, ip_in_subnet};

use crate::ui::Step;
use crate::{setup, workspace};

const STEPS: usize = 5;

pub fn run() -> anyhow::Result<()> {
    let step = Step::start(1, STEPS, "checking prerequisites");
    let report = setup::run(true, &|s| step.say(s));
    if !report.ok() {
        step.done("missing prerequisites");
        report.print();
        bail!("setup failed; see the table above");
    }
    step.done("ready");

    let step = Step::start(2, STEPS, "building podtrace");
    let bin = workspace::build_podtrace(true)?;
    step.done("built");

    let paths = LabPaths::from_env();
    let before = lab::snapshot_residue(&paths);
    let step = Step::start(3, STEPS, "starting the node lab");
    let started_here = match lab::up(&paths, &|s| step.say(s))? {
        UpOutcome::Started(_) => {
            step.done("up");
            true
        }
        UpOutcome::AlreadyUp(_) => {
            step.done("already up; it stays up afterwards");
            false
        }
    };

    let step = Step::start(4, STEPS, "creating the example pods");
    let result = run_examples(&bin);
    step.done(if result.is_ok() { "done" } else { "failed" });

    let teardown = if started_here {
        let step = Step::start(5, STEPS, "tearing the lab down");
        let down = lab::down(&paths, &|s| step.say(s));
        let after = lab::snapshot_residue(&paths);
        let left = before.diff(&after);
        step.done(if left.is_empty() {
            "nothing left behind"
        } else {
            "residue found"
        });
        down.map_err(anyhow::Error::from).and_then(|_| {
            if left.is_empty() {
                Ok(())
            } else {
                bail!("the teardown left things behind:\n  {}", left.join("\n  "))
            }
        })
    } else {
        Ok(())
    };

    let pods = result?;
    teardown?;
    let running = pods.iter().filter(|p| p.running).count();
    println!();
    println!(
        "Summary: {running}/{} example pods reached Running with an IP from {POD_SUBNET};",
        pods.len()
    );
    if started_here {
        println!("         the lab was torn down and nothing it made is left.");
    } else {
        println!("         the lab was already up before the demo, so it stays up.");
    }
    if running != pods.len() {
        bail!(
            "{} example pods did not reach Running",
            pods.len() - running
        );
    }
    Ok(())
}

struct PodResult {
    running: bool,
}

fn run_examples(bin: &std::path::Path) -> anyhow::Result<Vec<PodResult>> {
    let examples = workspace::root().join("examples");
    let out = Command::new(bin)
        .args(["run", "--until-ready", "--cleanup", "--json", "--manifests"])
        .arg(&examples)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("podtrace printed no JSON result (exit {})", out.status))?;
    let pods = doc["pods"].as_array().cloned().unwrap_or_default();
    println!();
    println!(
        "{:<28} {:<9} {:<14} {:>8}  containers",
        "POD", "PHASE", "IP", "TIME"
    );
    let mut results = Vec::new();
    for p in &pods {
        let ip = p["ip"].as_str().unwrap_or("-");
        let phase = p["phase"].as_str().unwrap_or("?");
        let in_subnet = ip_in_subnet(ip, POD_SUBNET);
        let started: Vec<&str> = p["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["reason"] == "Started")
            .filter_map(|e| e["container"].as_str())
            .collect();
        println!(
            "{:<28} {:<9} {:<14} {:>7.3}s  {}{}",
            format!(
                "{}/{}",
                p["namespace"].as_str().unwrap_or(""),
                p["name"].as_str().unwrap_or("")
            ),
            phase,
            ip,
            p["seconds"].as_f64().unwrap_or(0.0),
            started.join(","),
            match p["reason"].as_str() {
                Some(r) => format!("  {r}: {}", p["message"].as_str().unwrap_or("")),
                None => String::new(),
            }
        );
        results.push(PodResult {
            running: phase == "Running" && in_subnet,
        });
    }
    for e in doc["manifest_errors"].as_array().into_iter().flatten() {
        println!("manifest error: {}", e.as_str().unwrap_or_default());
    }
    if pods.is_empty() {
        bail!("no pods ran from {}", examples.display());
    }
    Ok(results)
}
