//! `cargo xtask demo`: the main job end to end on a fresh clone. Setup where missing,
//! build, lab up, create the example pods while recording a trace, show each result,
//! the stage latency table across the pods and the slowest pod's timeline (what podlapse
//! is for), lab down, prove the teardown left nothing behind.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
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

    let step = Step::start(2, STEPS, "building podlapse");
    let bin = workspace::build_podlapse()?;
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
    show_stages(&bin, &pods)?;
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
    /// `namespace/name`.
    name: String,
    seconds: f64,
    running: bool,
}

/// Where the demo's trace and SVG report go.
fn demo_dir() -> PathBuf {
    workspace::target_dir().join("demo")
}

fn trace_path() -> PathBuf {
    demo_dir().join("demo.trace")
}

fn run_examples(bin: &Path) -> anyhow::Result<Vec<PodResult>> {
    let examples = workspace::root().join("examples");
    std::fs::create_dir_all(demo_dir())
        .with_context(|| format!("creating {}", demo_dir().display()))?;
    match std::fs::remove_file(trace_path()) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing {}", trace_path().display()));
        }
        _ => {}
    }
    let mut cmd = Command::new(bin);
    cmd.args(["run", "--until-ready", "--cleanup", "--json", "--trace"])
        .arg(trace_path())
        .arg("--manifests")
        .arg(&examples);
    // The lab's containerd 2.x sends its own spans to the lab's runtime OTLP address:
    // podlapse receives them there, and they become the runtime's stages.
    if xtask::lab::containerd_version(&xtask::lab::LabPaths::from_env())
        .is_some_and(|(_, major)| major >= 2)
    {
        cmd.args(["--runtime-otlp-listen", xtask::lab::RUNTIME_OTLP_ADDR]);
    }
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("podlapse printed no JSON result (exit {})", out.status))?;
    let pods = doc["pods"].as_array().cloned().unwrap_or_default();
    println!();
    println!(
        "{:<28} {:<9} {:<14} {:>8}  containers",
        "POD", "PHASE", "IP", "TIME"
    );
    let mut results = Vec::new();
    for p in &pods {
        let name = format!(
            "{}/{}",
            p["namespace"].as_str().unwrap_or(""),
            p["name"].as_str().unwrap_or("")
        );
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
            name,
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
            name,
            seconds: p["seconds"].as_f64().unwrap_or(0.0),
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

/// The stage latency table across the demo's pods, the slowest pod's timeline and its
/// waterfall as SVG, all from the trace the run recorded.
fn show_stages(bin: &Path, pods: &[PodResult]) -> anyhow::Result<()> {
    let trace = trace_path();
    println!();
    println!("Stage latencies across the {} pods:", pods.len());
    println!("  (podlapse report {})", trace.display());
    podlapse(bin, &[OsStr::new("report"), trace.as_os_str()])?;
    let Some(slowest) = pods
        .iter()
        .filter(|p| p.running)
        .max_by(|a, b| a.seconds.total_cmp(&b.seconds))
    else {
        return Ok(());
    };
    println!();
    println!(
        "Timeline of the slowest pod, {} ({:.3} s to Running):",
        slowest.name, slowest.seconds
    );
    println!(
        "  (podlapse timeline {} --pod {})",
        trace.display(),
        slowest.name
    );
    let pod = OsStr::new(&slowest.name);
    podlapse(
        bin,
        &[
            OsStr::new("timeline"),
            trace.as_os_str(),
            OsStr::new("--pod"),
            pod,
        ],
    )?;
    let svg = demo_dir().join("report.svg");
    let out = Command::new(bin)
        .args([
            OsStr::new("report"),
            trace.as_os_str(),
            OsStr::new("--svg-pod"),
            pod,
        ])
        .arg("--svg")
        .arg(&svg)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.success() {
        bail!("podlapse report --svg {} failed ({out})", svg.display());
    }
    println!();
    println!(
        "The slowest pod's waterfall over the stage latency distributions of all the pods, as SVG:"
    );
    println!("  {}", svg.display());
    println!("The trace itself: {}", trace.display());
    Ok(())
}

/// Runs `podlapse ARGS`, its output shown indented.
fn podlapse(bin: &Path, args: &[&OsStr]) -> anyhow::Result<()> {
    let out = Command::new(bin)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        println!("  {line}");
    }
    if !out.status.success() {
        bail!(
            "podlapse {} failed ({})",
            xtask::text::list(args, " ", |a| a.to_string_lossy().into()),
            out.status
        );
    }
    Ok(())
}
