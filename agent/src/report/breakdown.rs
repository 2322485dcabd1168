//! One pod's startup, pod_seen until Running (or Ready when probes made it later), cut
//! into parts that do not overlap, so their shares add up to the whole.
//!
//! Stages nest and overlap: CNI plugins run inside RunPodSandbox, host-local inside
//! bridge, loopback beside bridge; the shim's start and runc's create, init and start
//! inside RunPodSandbox and StartContainer. Every instant of the startup is given to the
//! most specific stage running then: the one that started last (a nested stage starts
//! after the one around it), ties going to the later pipeline step. What is left of an
//! outer span is its own work: RunPodSandbox less what the kernel timed inside it is the
//! runtime's own sandbox work, bridge less host-local is bridge's own run. Instants no
//! stage covers are the gap, a row of its own: the agent's work between stages, anything
//! unrecorded. Waits the agent decides (a pull queued at the image puller) are parts of
//! their own.
//!
//! The runtime's own spans (`runtime:*` stages, from `--runtime-otlp-listen`) are stages
//! like the kernel's: one inside RunPodSandbox takes its instants from the call's
//! remainder, and a kernel stage that starts inside it (the CNI plugins inside
//! `runtime:network_setup`, the shim and runc inside `runtime:task_create`) takes its
//! instants from it in turn, so nothing is counted twice and the parts still add up.
//!
//! A part is *opaque* when it is the runtime's own time inside a CRI call that no
//! kernel stage or runtime span explains: what is left of RunPodSandbox and
//! StartContainer, and CreateContainer. The report names each pod's largest one, and
//! says which of them the runtime's spans could not break down and why.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::timeline::{PodTimeline, Stage, StageKind, StageName, StageSource};

/// The row for instants no stage covers.
pub const GAP: &str = "gap";

/// One pod's startup, cut into parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Breakdown {
    /// pod_seen to `end`.
    pub total_ns: u64,
    /// `running`, or `ready` when readiness came later.
    pub end: String,
    /// In the order they first took time; the gap last. Their `ns` add up to `total_ns`.
    pub parts: Vec<Part>,
    /// What the breakdown could not name, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Breakdown {
    /// The largest opaque part, if any part is opaque.
    pub fn largest_opaque(&self) -> Option<&Part> {
        self.parts
            .iter()
            .filter(|p| p.opaque)
            .max_by_key(|p| (p.ns, std::cmp::Reverse(p.part.as_str())))
    }

    /// The gap row.
    pub fn gap(&self) -> Option<&Part> {
        self.parts.iter().find(|p| p.part == GAP)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Part {
    /// A stage name, `runtime_sandbox`, or [`GAP`].
    pub part: String,
    /// What the time was spent on.
    pub what: String,
    pub ns: u64,
    /// Percent of `total_ns`.
    pub share: f64,
    /// The runtime's own time inside a CRI call that no kernel stage explains.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub opaque: bool,
}

/// What a part is named after: a stage, or the runtime's own work inside RunPodSandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PartOf {
    Stage(StageName),
    /// `runtime_sandbox`: RunPodSandbox less what the kernel timed in it.
    RuntimeSandbox,
}

impl PartOf {
    /// The part's name in the breakdown.
    fn name(&self) -> String {
        match self {
            PartOf::Stage(s) => s.to_string(),
            PartOf::RuntimeSandbox => "runtime_sandbox".to_string(),
        }
    }

    /// The stage kind the part stands for: the runtime's own sandbox work stands where
    /// RunPodSandbox does.
    fn kind(&self) -> &StageKind {
        match self {
            PartOf::Stage(s) => s.kind(),
            PartOf::RuntimeSandbox => &StageKind::SandboxRequested,
        }
    }

    /// The part's pipeline position. The runtime's steps made of several of its spans
    /// (the sandbox image's pull, the network's setup) hold its other steps: at the same
    /// instant the inner one (the pull's first registry request) is the more specific.
    fn order(&self) -> usize {
        let inner = match self {
            PartOf::Stage(s) if *s.kind() == StageKind::Runtime => s.name().is_some_and(|n| {
                !n.starts_with("sandbox_image_pull") && !n.starts_with("network_setup")
            }),
            _ => false,
        };
        self.kind().rank() * 2 + usize::from(inner)
    }

    /// A CRI call's own time, less what the kernel timed inside it.
    fn opaque(&self) -> bool {
        match self {
            PartOf::RuntimeSandbox => true,
            PartOf::Stage(s) => matches!(
                s.kind(),
                StageKind::ContainerCreate | StageKind::ContainerStart
            ),
        }
    }
}

/// A span some part claims.
struct Claim {
    part: PartOf,
    /// The part's name, as the breakdown lists it.
    name: String,
    what: String,
    start: u64,
    end: u64,
    /// Pipeline position: breaks ties between spans that start together.
    order: usize,
    opaque: bool,
    /// Takes only instants no other claim covers: a wait that overlaps the work it waits
    /// behind (an update held while the pod worker's sync runs its CRI calls).
    background: bool,
}

fn claim(part: PartOf, what: String, start: u64, end: u64) -> Claim {
    Claim {
        order: part.order(),
        opaque: part.opaque(),
        // A pod worker's wait is behind work that has parts of its own.
        background: *part.kind() == StageKind::PodWorkerWait,
        name: part.name(),
        part,
        what,
        start,
        end,
    }
}

/// What each kind of stage contributes; instants (the pause exec) contribute nothing.
fn claims_of(p: &PodTimeline) -> Vec<Claim> {
    let mut out = Vec::new();
    // The runtime owed spans that did not come: its calls' remainders are unrecorded,
    // not the runtime's own work.
    let missing_spans = p.sources.as_ref().is_some_and(|s| s.runtime_missing());
    for s in &p.stages {
        let c = s.container.clone().unwrap_or_default();
        let stage = || PartOf::Stage(s.stage.clone());
        let (part, what) = match s.kind() {
            StageKind::PodCgroupCreated => {
                (stage(), "the agent creating the pod's cgroups".to_string())
            }
            StageKind::SandboxRequested => (
                PartOf::RuntimeSandbox,
                if missing_spans {
                    "RunPodSandbox less what the kernel timed in it: not broken down, the \
                     runtime's spans of it did not arrive"
                } else {
                    "RunPodSandbox less what the kernel timed in it: the runtime's own work"
                }
                .to_string(),
            ),
            StageKind::ShimStart => (stage(), runtime_what("the shim starting", &c)),
            StageKind::ShimCreate => (
                stage(),
                runtime_what("the new shim daemon until it ran runc create", &c),
            ),
            StageKind::RuncCreate => (stage(), runtime_what("runc create", &c)),
            StageKind::RuncInit => (
                stage(),
                runtime_what("runc init setting the container up", &c),
            ),
            StageKind::RuncStart => (stage(), runtime_what("runc start", &c)),
            StageKind::SandboxCgroup => {
                (stage(), "runc creating the sandbox's cgroups".to_string())
            }
            StageKind::ContainerCgroup => (stage(), format!("runc creating {c}'s cgroups")),
            StageKind::NetnsCreated => (stage(), "the pod's network namespace created".to_string()),
            StageKind::CniAdd => (stage(), "CNI ADD between plugin runs".to_string()),
            StageKind::CniPlugin => (stage(), plugin_what(s)),
            StageKind::SandboxReady => (
                stage(),
                "the status read that found the sandbox ready".to_string(),
            ),
            StageKind::SidecarWait | StageKind::InitWait => {
                (stage(), format!("{c} waiting {}", s.detail))
            }
            StageKind::StartupProbeWait => (
                stage(),
                format!("{c} running until its startup probe passed"),
            ),
            StageKind::PodWorkerWait => (stage(), format!("the pod worker busy: {}", s.detail)),
            StageKind::NetworkWait => (stage(), format!("waiting: {}", s.detail)),
            StageKind::BackOffWait => (stage(), format!("in back-off: {}", s.detail)),
            StageKind::InitRun => (
                stage(),
                format!("init container {c} running until it exited"),
            ),
            StageKind::ImagePullerWait => (
                stage(),
                format!("{c} queued at the image puller: {}", s.detail),
            ),
            StageKind::ImagePull => (stage(), format!("pulling {c}'s image")),
            StageKind::ContainerCreate => (stage(), format!("CreateContainer for {c}")),
            StageKind::ContainerStart => {
                out.extend(start_claims(p, s));
                continue;
            }
            StageKind::PostStart => (stage(), format!("{c}'s postStart hook")),
            StageKind::Runtime => (stage(), runtime_span_what(s)),
            _ => continue,
        };
        if s.duration_ns > 0 {
            out.push(claim(part, what, s.start_ns, s.end_ns));
        }
    }
    if let (Some(running), Some(ready)) = (p.stage(StageKind::Running), p.stage(StageKind::Ready))
        && ready.start_ns > running.start_ns
    {
        out.push(claim(
            PartOf::Stage(StageKind::Ready.into()),
            "waiting for readiness probes after Running".into(),
            running.start_ns,
            ready.start_ns,
        ));
    }
    out
}

/// What a stage made of the runtime's own spans was.
fn runtime_span_what(s: &Stage) -> String {
    let step = s.stage.runtime_step().unwrap_or_default();
    let c = s.container.as_deref().unwrap_or_default();
    let what = match step {
        "sandbox_image_pull" => "the runtime pulling the sandbox (pause) image",
        "image_resolve" => "the runtime resolving the image at the registry",
        "image_fetch" => "the runtime fetching image layers",
        "image_unpack" => "the runtime unpacking image layers",
        "network_setup" => "the runtime setting up the pod's network, less the CNI plugins",
        "metadata" => "the runtime writing its metadata store",
        "container_new" => "the runtime creating the container object",
        "task_create" => "the runtime creating the task, less the shim and runc",
        "task_start" => "the runtime starting the task, less runc",
        other => other,
    };
    if c.is_empty() {
        format!("{what} (runtime span)")
    } else {
        format!("{what} for {c} (runtime span)")
    }
}

/// A runtime step, of the sandbox (`c` empty) or of container `c`.
fn runtime_what(step: &str, c: &str) -> String {
    if c.is_empty() {
        format!("{step} (sandbox)")
    } else {
        format!("{step} for {c}")
    }
}

fn plugin_what(s: &Stage) -> String {
    let name = s.stage.cni_plugin().unwrap_or_default();
    if s.detail.contains("delegated by") {
        format!(
            "{name}'s run (IPAM, {})",
            s.detail.trim_start_matches("ADD, ")
        )
    } else {
        format!("{name}'s own run")
    }
}

/// StartContainer: the whole call is its own part, which the kernel's stages inside it
/// (shim start, runc create, init and start, the container's cgroups) take from; the app's
/// first exec, when it came after the call returned, adds the wait for it.
fn start_claims(p: &PodTimeline, start: &Stage) -> Vec<Claim> {
    let c = start.container.clone().unwrap_or_default();
    let exec = p.stages.iter().find(|s| {
        *s.kind() == StageKind::AppFirstExec
            && s.container_id.is_some()
            && s.container_id == start.container_id
    });
    let mut out = vec![claim(
        PartOf::Stage(start.stage.clone()),
        format!("StartContainer for {c} less what the kernel timed in it"),
        start.start_ns,
        start.end_ns,
    )];
    if let Some(e) = exec
        && e.start_ns > start.end_ns
    {
        out.push(claim(
            PartOf::Stage(StageName::of(StageKind::AppFirstExec, &c)),
            format!("from StartContainer's return until {c}'s first exec"),
            start.end_ns,
            e.start_ns,
        ));
    }
    out.retain(|c| c.end > c.start);
    out
}

/// The pod's breakdown, or `None` when it never reached Running (or was seen and
/// running at the same instant).
pub fn breakdown(p: &PodTimeline) -> Option<Breakdown> {
    let seen = p.seen_ns?;
    let running = p.stage(StageKind::Running)?.start_ns;
    let (end, end_name) = match p.stage(StageKind::Ready) {
        Some(r) if r.start_ns > running => (r.start_ns, StageKind::Ready),
        _ => (running, StageKind::Running),
    };
    if end <= seen {
        return None;
    }
    let claims: Vec<Claim> = claims_of(p)
        .into_iter()
        .filter_map(|mut c| {
            c.start = c.start.max(seen);
            c.end = c.end.min(end);
            (c.end > c.start).then_some(c)
        })
        .collect();
    let mut cuts: Vec<u64> = claims
        .iter()
        .flat_map(|c| [c.start, c.end])
        .chain([seen, end])
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    // Part name -> (first instant it took, ns, the claim).
    let mut taken: BTreeMap<&str, (u64, u64, &Claim)> = BTreeMap::new();
    let mut gap = 0;
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        let winner = claims
            .iter()
            .enumerate()
            .filter(|(_, c)| c.start <= a && c.end >= b)
            .max_by_key(|(i, c)| (!c.background, c.start, c.order, *i))
            .map(|(_, c)| c);
        match winner {
            Some(c) => {
                let e = taken.entry(&c.name).or_insert((a, 0, c));
                e.1 += b - a;
            }
            None => gap += b - a,
        }
    }
    let total = end - seen;
    let share = |ns: u64| ns as f64 * 100.0 / total as f64;
    let mut parts: Vec<(u64, &PartOf, Part)> = taken
        .into_iter()
        .map(|(name, (first, ns, c))| {
            (
                first,
                &c.part,
                Part {
                    part: name.to_string(),
                    what: c.what.clone(),
                    ns,
                    share: share(ns),
                    opaque: c.opaque,
                },
            )
        })
        .collect();
    parts.sort_by(|a, b| (a.0, a.1.order(), &a.2.part).cmp(&(b.0, b.1.order(), &b.2.part)));
    let notes = unexplained(p, &parts);
    let mut parts: Vec<Part> = parts.into_iter().map(|(_, _, p)| p).collect();
    parts.push(Part {
        part: GAP.into(),
        what: "time no stage explains: the agent between stages".into(),
        ns: gap,
        share: share(gap),
        opaque: false,
    });
    Some(Breakdown {
        total_ns: total,
        end: end_name.to_string(),
        parts,
        notes,
    })
}

/// The opaque parts the runtime's own spans did not break down, and why: the runtime
/// sent none for the pod at all (no receiver, or a runtime that does not trace), or
/// none inside that call.
fn unexplained(p: &PodTimeline, parts: &[(u64, &PartOf, Part)]) -> Vec<String> {
    let runtime: Vec<&Stage> = p
        .stages
        .iter()
        .filter(|s| s.source == StageSource::Runtime)
        .collect();
    let call_of = |part: &PartOf| -> Option<&Stage> {
        match part {
            PartOf::RuntimeSandbox => p.stage(StageKind::SandboxRequested),
            PartOf::Stage(name) => p.stages.iter().find(|s| s.stage == *name),
        }
    };
    let bare: Vec<&str> = parts
        .iter()
        .filter(|(_, _, x)| x.opaque && x.ns > 0)
        .filter(|(_, part, _)| {
            let Some(call) = call_of(part) else {
                return false;
            };
            !runtime.iter().any(|r| {
                r.start_ns >= call.start_ns
                    && r.end_ns <= call.end_ns
                    && r.container == call.container
            })
        })
        .map(|(_, _, x)| x.part.as_str())
        .collect();
    if bare.is_empty() {
        return Vec::new();
    }
    // The recording's own account of the runtime's spans says why, when it has one.
    let recorded = p
        .sources
        .as_ref()
        .and_then(|s| s.runtime.why())
        .map(str::to_string);
    let why = match recorded {
        Some(why) => why,
        None if runtime.is_empty() => {
            "the runtime sent no spans (no --runtime-otlp-listen, or a runtime without tracing)"
                .to_string()
        }
        None => "the runtime sent no spans inside these calls".to_string(),
    };
    vec![format!("{} not broken down: {why}", bare.join(", "))]
}
