//! `cargo xtask record [SCENARIO...]`: record the CI fixtures. Each scenario in
//! `traces/scenarios/<name>.yaml` (pods plus `podlapse run` flags) runs on the node lab
//! with `podlapse run --until-ready --cleanup --trace traces/<name>.jsonl`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde::Deserialize;
use xtask::lab::{self, LabPaths, UpOutcome};

use crate::workspace;

#[derive(Debug, Deserialize)]
struct Scenario {
    description: String,
    #[serde(default)]
    args: Vec<String>,
    pods: Vec<serde_yaml::Value>,
    /// CNI plugins the scenario's lab appends to its conflist (a plugin made to fail).
    #[serde(default)]
    lab_cni_plugins: Vec<serde_json::Value>,
}

pub fn scenarios_dir() -> PathBuf {
    workspace::root().join("traces/scenarios")
}

fn load(path: &Path) -> anyhow::Result<Scenario> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_yaml::from_str(&text).with_context(|| format!("{}: not a scenario", path.display()))
}

pub fn run(names: &[String]) -> anyhow::Result<()> {
    let mut all: Vec<PathBuf> = std::fs::read_dir(scenarios_dir())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    all.sort();
    let chosen: Vec<PathBuf> = if names.is_empty() {
        all
    } else {
        names
            .iter()
            .map(|n| {
                let p = scenarios_dir().join(format!("{n}.yaml"));
                if p.exists() {
                    Ok(p)
                } else {
                    bail!("no scenario {}", p.display())
                }
            })
            .collect::<anyhow::Result<_>>()?
    };
    let bin = workspace::build_podlapse()?;
    crate::build_ebpf::run()?;
    let paths = LabPaths::from_env();
    for path in chosen {
        let name = path
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let scenario = load(&path)?;
        eprintln!("recording {name}: {}", scenario.description);
        // A scenario that needs a different network gets a lab of its own.
        let own_lab = !scenario.lab_cni_plugins.is_empty();
        if own_lab && paths.state_file().exists() {
            lab::down(&paths, &|_| {})?;
        }
        let options = lab::LabOptions {
            extra_cni_plugins: scenario.lab_cni_plugins.clone(),
            ..lab::LabOptions::default()
        };
        let up = lab::up_with(&paths, &options, &|s| eprintln!("  lab: {s}"))?;
        let started_here = matches!(up, UpOutcome::Started(_));
        let result = record_one(&bin, &name, &scenario);
        if own_lab || started_here {
            lab::down(&paths, &|_| {})?;
        }
        result?;
    }
    Ok(())
}

fn record_one(bin: &Path, name: &str, scenario: &Scenario) -> anyhow::Result<()> {
    let work = workspace::target_dir().join("scenarios");
    std::fs::create_dir_all(&work)?;
    // A manifest is one pod, as kubelet reads it: a directory of files, in scenario order.
    let manifest = work.join(name);
    if manifest.exists() {
        std::fs::remove_dir_all(&manifest)
            .with_context(|| format!("removing {}", manifest.display()))?;
    }
    std::fs::create_dir_all(&manifest)?;
    for (i, pod) in scenario.pods.iter().enumerate() {
        std::fs::write(
            manifest.join(format!("{i:02}.yaml")),
            serde_yaml::to_string(pod)?,
        )?;
    }
    let trace = workspace::root()
        .join("traces")
        .join(format!("{name}.jsonl"));
    let out = Command::new(bin)
        .args([
            "run",
            "--until-ready",
            "--cleanup",
            "--node-name",
            "podlapse-lab",
        ])
        .arg("--trace")
        .arg(&trace)
        .args(&scenario.args)
        .arg("--manifests")
        .arg(&manifest)
        .output()
        .context("running podlapse")?;
    eprint!("{}", String::from_utf8_lossy(&out.stdout));
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !stderr.trim().is_empty() {
        eprint!("{stderr}");
    }
    // Scenarios of failures end with pods that are not Running: exit 1 is expected then.
    if out.status.code() == Some(2) || !trace.exists() {
        bail!("recording {name} failed ({})", out.status);
    }
    let size = std::fs::metadata(&trace)?.len();
    eprintln!("  wrote {} ({} KiB)", trace.display(), size / 1024);
    Ok(())
}

/// `cargo xtask replay`: every fixture in traces/, checked.
pub fn replay_all() -> anyhow::Result<()> {
    let bin = workspace::build_podlapse()?;
    let mut traces: Vec<PathBuf> = std::fs::read_dir(workspace::root().join("traces"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    traces.sort();
    if traces.is_empty() {
        bail!("no traces in traces/: record them with `cargo xtask record`");
    }
    let status = Command::new(bin).arg("replay").args(&traces).status()?;
    if !status.success() {
        bail!("replay diverged ({status})");
    }
    Ok(())
}
