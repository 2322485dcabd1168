//! Benchmark 9: how much of each pod's startup podlapse's stages explain. Eight pods of
//! mixed shapes (one container, two containers, an init container, a sidecar, a larger
//! image) are created with none of their images present, first each alone, then all
//! eight at once, a few rounds. `podlapse report` cuts each pod's startup into parts;
//! the figures are the largest `gap` (time no stage covers) and the largest opaque part
//! (the runtime's own time inside one CRI call that no kernel stage explains) across pods.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use xtask::lab::LabPaths;

use super::{Figure, Outcome};

use crate::lab::IMAGE_APP as APP;
use crate::lab::IMAGE_BIG10 as BIG;
/// The sandbox image stays: the runtime pulls it once per node, not per pod.
const PAUSE: &str = "podlapse/pause";
const ROUNDS: usize = 5;
const GOAL_GAP: f64 = 3.0;
const GOAL_OPAQUE: f64 = 10.0;

fn container(name: &str, image: &str, command: &str) -> String {
    format!(
        "  - name: {name}\n    image: {image}\n    command: [\"/bin/sh\", \"-c\", \"{command}\"]\n"
    )
}

/// The eight pods: (name, manifest).
fn pods() -> Vec<(String, String)> {
    let pod = |name: &str, init: &str, containers: &str| {
        let init = if init.is_empty() {
            String::new()
        } else {
            format!("  initContainers:\n{init}")
        };
        (
            name.to_string(),
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n\
                 spec:\n  terminationGracePeriodSeconds: 1\n{init}  containers:\n{containers}"
            ),
        )
    };
    let sleep = "sleep 3600";
    let app = container("app", APP, sleep);
    let pair = app.clone() + &container("helper", APP, sleep);
    let setup = container("setup", APP, "true");
    let sidecar = format!(
        "{}    restartPolicy: Always\n",
        container("proxy", APP, sleep)
    );
    let mut pods = Vec::new();
    for (shape, init, containers) in [
        ("web", "", &app),
        ("pair", "", &pair),
        ("init", &setup, &app),
    ] {
        for n in 1..=2 {
            pods.push(pod(&format!("share-{shape}-{n}"), init, containers));
        }
    }
    pods.push(pod("share-sidecar", &sidecar, &app));
    pods.push(pod("share-big", "", &container("app", BIG, sleep)));
    pods
}

/// Removes every image but the sandbox's from the lab's runtime, so each run pulls.
fn remove_images() -> anyhow::Result<()> {
    let socket = LabPaths::from_env().cri_socket();
    let ctr = |args: &[&str]| {
        Command::new(xtask::lab::ctr_program(&LabPaths::from_env()).unwrap_or_else(|| "ctr".into()))
            .arg("--address")
            .arg(&socket)
            .args(["--namespace", "k8s.io"])
            .args(args)
            .output()
            .context("running ctr (containerd's client, installed with containerd)")
    };
    let out = ctr(&["images", "list", "--quiet"])?;
    if !out.status.success() {
        bail!("ctr images list: {}", String::from_utf8_lossy(&out.stderr));
    }
    let images: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.contains(PAUSE) && !l.starts_with("sha256:"))
        .map(str::to_string)
        .collect();
    if images.is_empty() {
        return Ok(());
    }
    let mut args = vec!["images", "remove", "--sync"];
    args.extend(images.iter().map(String::as_str));
    let out = ctr(&args)?;
    if !out.status.success() {
        bail!(
            "ctr images remove: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// One pod's shares: (pod, gap %, largest opaque part, its %).
#[derive(Debug, Clone)]
struct Shares {
    pod: String,
    gap: f64,
    opaque_part: String,
    opaque: f64,
}

/// Runs `pods` at once with a trace, and returns each pod's shares from the report.
fn run(
    bin: &Path,
    work: &Path,
    tag: &str,
    pods: &[(String, String)],
) -> anyhow::Result<Vec<Shares>> {
    let dir = work.join(tag);
    let _ = std::fs::remove_dir_all(&dir);
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    for (name, m) in pods {
        std::fs::write(manifests.join(format!("{name}.yaml")), m)?;
    }
    remove_images()?;
    let trace = dir.join("run.trace");
    let mut cmd = Command::new(bin);
    cmd.args(["run", "--until-ready", "--cleanup", "--json", "--trace"])
        .arg(&trace);
    // A runtime that traces (containerd 2.x) sends its spans here: they name parts of
    // its own work inside the CRI calls.
    if runtime_traces() {
        cmd.args(["--runtime-otlp-listen", xtask::lab::RUNTIME_OTLP_ADDR]);
    }
    let out = super::on_lab(&mut cmd, &dir, &manifests, "podlapse-bench-shares")
        .output()
        .context("running podlapse run")?;
    std::fs::write(dir.join("stderr.log"), &out.stderr)?;
    let doc: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "podlapse run printed no result ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let listed = doc["pods"].as_array().map_or(0, Vec::len);
    let running = doc["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["phase"] == "Running")
        .count();
    if listed != pods.len() || running != pods.len() {
        bail!(
            "{tag}: {running} of {} pods reached Running: {doc}",
            pods.len()
        );
    }
    let report = Command::new(bin)
        .arg("report")
        .arg(&trace)
        .args(["-o", "json"])
        .output()
        .context("running podlapse report")?;
    if !report.status.success() {
        bail!(
            "podlapse report: {}",
            String::from_utf8_lossy(&report.stderr)
        );
    }
    let report: Value = serde_json::from_slice(&report.stdout).context("parsing the report")?;
    let mut shares = Vec::new();
    for p in report["pods"].as_array().into_iter().flatten() {
        let name = p["name"].as_str().unwrap_or_default().to_string();
        let parts = p["breakdown"]["parts"]
            .as_array()
            .with_context(|| format!("{tag}: {name} has no breakdown"))?;
        let share = |x: &Value| x["share"].as_f64().unwrap_or(0.0);
        let gap = parts.iter().find(|x| x["part"] == "gap").map_or(0.0, share);
        let opaque = parts
            .iter()
            .filter(|x| x["opaque"] == true)
            .max_by(|a, b| share(a).total_cmp(&share(b)));
        shares.push(Shares {
            pod: name,
            gap,
            opaque_part: opaque
                .and_then(|x| x["part"].as_str())
                .unwrap_or("none")
                .to_string(),
            opaque: opaque.map_or(0.0, share),
        });
    }
    if shares.len() != pods.len() {
        bail!(
            "{tag}: the report has {} of {} pods",
            shares.len(),
            pods.len()
        );
    }
    Ok(shares)
}

/// Whether the lab's containerd exports its spans (2.x does, to the lab's runtime OTLP
/// address).
fn runtime_traces() -> bool {
    xtask::lab::containerd_version(&LabPaths::from_env()).is_some_and(|(_, major)| major >= 2)
}

fn worst_gap(s: &[Shares]) -> &Shares {
    s.iter()
        .max_by(|a, b| a.gap.total_cmp(&b.gap))
        .expect("pods")
}

fn worst_opaque(s: &[Shares]) -> &Shares {
    s.iter()
        .max_by(|a, b| a.opaque.total_cmp(&b.opaque))
        .expect("pods")
}

fn describe_gap(s: &Shares) -> String {
    format!("{:.1}% ({})", s.gap, s.pod)
}

fn describe_opaque(s: &Shares) -> String {
    format!("{:.1}% ({} of {})", s.opaque, s.opaque_part, s.pod)
}

fn to_json(s: &[Shares]) -> Value {
    json!(
        s.iter()
            .map(|x| json!({"pod": x.pod, "gap": x.gap, "opaque_part": x.opaque_part, "opaque": x.opaque}))
            .collect::<Vec<_>>()
    )
}

/// What benchmark 9 measured: each pod's shares alone, each round's of eight at once,
/// and the runtime they ran on (whether it exported its spans, and its description).
struct Measured {
    alone: Vec<Shares>,
    rounds: Vec<Vec<Shares>>,
    runtime_traces: bool,
    runtime: String,
}

pub fn run_all(bin: &Path, dir: &Path) -> anyhow::Result<Outcome> {
    Ok(render(&measure(bin, dir)?))
}

fn measure(bin: &Path, dir: &Path) -> anyhow::Result<Measured> {
    let work = dir.join("shares");
    let pods = pods();
    // The runtime pulls its sandbox image inside the first RunPodSandbox on a node; a
    // warm-up pod pays that once, so the figures are of pods on a running node.
    eprintln!("bench: 9. a warm-up pod (the runtime pulls its sandbox image)");
    run(bin, &work, "warm-up", std::slice::from_ref(&pods[0]))?;
    let mut alone = Vec::new();
    for p in &pods {
        eprintln!("bench: 9. {} alone", p.0);
        alone.extend(run(
            bin,
            &work,
            &format!("alone-{}", p.0),
            std::slice::from_ref(p),
        )?);
    }
    let mut rounds = Vec::new();
    for r in 1..=ROUNDS {
        eprintln!("bench: 9. eight at once, round {r} of {ROUNDS}");
        rounds.push(run(bin, &work, &format!("eight-{r}"), &pods)?);
    }
    Ok(Measured {
        alone,
        rounds,
        runtime_traces: runtime_traces(),
        runtime: super::machine::describe().runtime,
    })
}

fn render(m: &Measured) -> Outcome {
    let (alone, rounds) = (&m.alone, &m.rounds);
    let all: Vec<Shares> = rounds.iter().flatten().cloned().collect();
    let (gap8, opaque8) = (worst_gap(&all), worst_opaque(&all));
    let met = gap8.gap <= GOAL_GAP && opaque8.opaque <= GOAL_OPAQUE;
    let mut figures = vec![
        Figure::new("alone: largest gap", describe_gap(worst_gap(alone))),
        Figure::new(
            "alone: largest opaque part",
            describe_opaque(worst_opaque(alone)),
        ),
    ];
    for (i, r) in rounds.iter().enumerate() {
        figures.push(Figure::new(
            &format!("eight at once, round {}: largest gap / opaque part", i + 1),
            format!(
                "{} / {}",
                describe_gap(worst_gap(r)),
                describe_opaque(worst_opaque(r))
            ),
        ));
    }
    let mut worst: Vec<f64> = rounds.iter().map(|r| worst_opaque(r).opaque).collect();
    worst.sort_by(f64::total_cmp);
    figures.push(Figure::new(
        "eight at once: each round's largest opaque part, lowest / median / highest",
        format!(
            "{:.1}% / {:.1}% / {:.1}%",
            worst[0],
            worst[worst.len() / 2],
            worst[worst.len() - 1]
        ),
    ));
    figures.push(Figure::new(
        &format!("eight at once, all {ROUNDS} rounds: largest gap"),
        describe_gap(gap8),
    ));
    figures.push(Figure::new(
        &format!("eight at once, all {ROUNDS} rounds: largest opaque part"),
        describe_opaque(opaque8),
    ));
    Outcome {
        number: 9,
        title: "startup explained",
        method: format!(
            "Eight pods of mixed shapes (one container ×2, two containers ×2, an init \
             container ×2, a sidecar, a 10 MiB image), with every image but the sandbox's \
             removed before each run (after a warm-up pod, for which the runtime pulled its sandbox \
             image): each pod alone, then all eight at once, {ROUNDS} rounds. \
             `podlapse run --trace{receiver}` against {runtime}, then `podlapse report -o json` \
             cuts each pod's startup (pod seen to Running) into parts that add up to it. The \
             gap is the time no stage covers; an opaque part is what is left of one CRI call \
             (RunPodSandbox, CreateContainer, StartContainer) once the kernel's stages inside \
             it (network namespace, CNI plugins, shim start, runc create/init/start, cgroups) \
             and the runtime's own spans (its network setup, metadata writes, task create and \
             start) are taken out. Image pulls are their own stage.",
            receiver = if m.runtime_traces {
                format!(" --runtime-otlp-listen {}", xtask::lab::RUNTIME_OTLP_ADDR)
            } else {
                String::new()
            },
            runtime = m.runtime,
        ),
        figures,
        goal: format!(
            "with eight at once, every pod's gap ≤ {GOAL_GAP:.0}% and largest opaque part ≤ {GOAL_OPAQUE:.0}% of its startup, in every round"
        ),
        verdict: if met { "met" } else { "not met" }.into(),
        samples: json!({
            "alone": to_json(alone),
            "eight_at_once": rounds.iter().map(|r| to_json(r)).collect::<Vec<_>>(),
        }),
    }
}
