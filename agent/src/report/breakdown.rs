//! One pod's startup, pod_seen until Running (or Ready when probes made it later), cut
//! into parts that do not overlap, so their shares add up to the whole.
//!
//! Stages nest and overlap: CNI plugins run inside RunPodSandbox, host-local inside
//! bridge, loopback beside bridge. Every instant of the startup is given to the most
//! specific stage running then: the one that started last (a nested stage starts after
//! the one around it), ties going to the later pipeline step. What is left of an outer
//! span is its own work: RunPodSandbox less netns and CNI is the runtime's sandbox work,
//! bridge less host-local is bridge's own run. Instants no stage covers are the gap, a
//! row of its own: the agent's work between stages, back-off waits, anything unrecorded.
//! Waits the agent decides (a pull queued at the image puller) are parts of their own.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::timeline::{PodTimeline, Stage};

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
}

/// A span some part claims.
struct Claim {
    part: String,
    what: String,
    start: u64,
    end: u64,
    /// Pipeline position: breaks ties between spans that start together.
    order: usize,
}

/// Parts by pipeline position; a later one is the more specific when spans start together.
const ORDER: &[&str] = &[
    "pod_cgroup_created",
    "runtime_sandbox",
    "netns_created",
    "cni_add",
    "cni_plugin",
    "sandbox_ready",
    "sidecar_wait",
    "image_puller_wait",
    "image_pull",
    "container_create",
    "container_start",
    "app_first_exec",
    "post_start",
    "ready",
];

fn order(part: &str) -> usize {
    let kind = part.split_once(':').map_or(part, |(k, _)| k);
    ORDER.iter().position(|k| *k == kind).unwrap_or(ORDER.len())
}

fn claim(part: String, what: String, start: u64, end: u64) -> Claim {
    Claim {
        order: order(&part),
        part,
        what,
        start,
        end,
    }
}

/// What each kind of stage contributes; stages inside CRI calls that the call's own
/// part already stands for (runc's cgroups, the pause exec) contribute nothing.
fn claims_of(p: &PodTimeline) -> Vec<Claim> {
    let mut out = Vec::new();
    for s in &p.stages {
        let c = s.container.clone().unwrap_or_default();
        let (part, what) = match s.kind() {
            "pod_cgroup_created" => (
                s.stage.clone(),
                "the agent creating the pod's cgroups".to_string(),
            ),
            "sandbox_requested" => (
                "runtime_sandbox".to_string(),
                "RunPodSandbox less netns and CNI: the runtime's own sandbox work".to_string(),
            ),
            "netns_created" => (
                s.stage.clone(),
                "the pod's network namespace created".to_string(),
            ),
            "cni_add" => (s.stage.clone(), "CNI ADD between plugin runs".to_string()),
            "cni_plugin" => (s.stage.clone(), plugin_what(s)),
            "sandbox_ready" => (
                s.stage.clone(),
                "the status read that found the sandbox ready".to_string(),
            ),
            "sidecar_wait" => (s.stage.clone(), format!("{c} waiting {}", s.detail)),
            "image_puller_wait" => (
                s.stage.clone(),
                format!("{c} queued at the image puller: {}", s.detail),
            ),
            "image_pull" => (s.stage.clone(), format!("pulling {c}'s image")),
            "container_create" => (s.stage.clone(), format!("CreateContainer for {c}")),
            "container_start" => {
                out.extend(start_claims(p, s));
                continue;
            }
            "post_start" => (s.stage.clone(), format!("{c}'s postStart hook")),
            _ => continue,
        };
        if s.duration_ns > 0 {
            out.push(claim(part, what, s.start_ns, s.end_ns));
        }
    }
    if let (Some(running), Some(ready)) = (p.stage("running"), p.stage("ready"))
        && ready.start_ns > running.start_ns
    {
        out.push(claim(
            "ready".into(),
            "waiting for readiness probes after Running".into(),
            running.start_ns,
            ready.start_ns,
        ));
    }
    out
}

fn plugin_what(s: &Stage) -> String {
    let name = s.stage.trim_start_matches("cni_plugin:");
    if s.detail.contains("delegated by") {
        format!(
            "{name}'s run (IPAM, {})",
            s.detail.trim_start_matches("ADD, ")
        )
    } else {
        format!("{name}'s own run")
    }
}

/// StartContainer, split at the app's first exec: the runtime until the app runs, then
/// the rest of the call (or the wait for the exec, if the call returned first).
fn start_claims(p: &PodTimeline, start: &Stage) -> Vec<Claim> {
    let c = start.container.clone().unwrap_or_default();
    let exec = p.stages.iter().find(|s| {
        s.kind() == "app_first_exec"
            && s.container_id.is_some()
            && s.container_id == start.container_id
    });
    let name = format!("app_first_exec:{c}");
    let mut out = Vec::new();
    match exec {
        Some(e) if e.start_ns >= start.start_ns && e.start_ns <= start.end_ns => {
            out.push(claim(
                start.stage.clone(),
                format!("StartContainer for {c} until its first exec"),
                start.start_ns,
                e.start_ns,
            ));
            out.push(claim(
                name,
                format!("from {c}'s first exec until StartContainer returned"),
                e.start_ns,
                start.end_ns,
            ));
        }
        Some(e) if e.start_ns > start.end_ns => {
            out.push(claim(
                start.stage.clone(),
                format!("StartContainer for {c}"),
                start.start_ns,
                start.end_ns,
            ));
            out.push(claim(
                name,
                format!("from StartContainer's return until {c}'s first exec"),
                start.end_ns,
                e.start_ns,
            ));
        }
        _ => out.push(claim(
            start.stage.clone(),
            format!("StartContainer for {c}"),
            start.start_ns,
            start.end_ns,
        )),
    }
    out.retain(|c| c.end > c.start);
    out
}

/// The pod's breakdown, or `None` when it never reached Running (or was seen and
/// running at the same instant).
pub fn breakdown(p: &PodTimeline) -> Option<Breakdown> {
    let seen = p.seen_ns?;
    let running = p.stage("running")?.start_ns;
    let (end, end_name) = match p.stage("ready") {
        Some(r) if r.start_ns > running => (r.start_ns, "ready"),
        _ => (running, "running"),
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
    // Part name -> (first instant it took, ns, what).
    let mut taken: BTreeMap<&str, (u64, u64, &str)> = BTreeMap::new();
    let mut gap = 0;
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        let winner = claims
            .iter()
            .enumerate()
            .filter(|(_, c)| c.start <= a && c.end >= b)
            .max_by_key(|(i, c)| (c.start, c.order, *i))
            .map(|(_, c)| c);
        match winner {
            Some(c) => {
                let e = taken.entry(&c.part).or_insert((a, 0, &c.what));
                e.1 += b - a;
            }
            None => gap += b - a,
        }
    }
    let total = end - seen;
    let share = |ns: u64| ns as f64 * 100.0 / total as f64;
    let mut parts: Vec<(u64, Part)> = taken
        .into_iter()
        .map(|(part, (first, ns, what))| {
            (
                first,
                Part {
                    part: part.to_string(),
                    what: what.to_string(),
                    ns,
                    share: share(ns),
                },
            )
        })
        .collect();
    parts.sort_by(|a, b| {
        (a.0, order(&a.1.part), &a.1.part).cmp(&(b.0, order(&b.1.part), &b.1.part))
    });
    let mut parts: Vec<Part> = parts.into_iter().map(|(_, p)| p).collect();
    parts.push(Part {
        part: GAP.into(),
        what: "time no stage explains: the agent between stages, back-off waits".into(),
        ns: gap,
        share: share(gap),
    });
    Some(Breakdown {
        total_ns: total,
        end: end_name.into(),
        parts,
    })
}
