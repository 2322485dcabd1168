//! "Why has this pod no IP?": a verdict per pod from the records of a run (a trace file,
//! or what the running agent keeps), naming the stage that failed and the evidence.
//!
//! [`diagnose`] is pure like `timeline::build`: no IO, no clock, so a trace always gives
//! the same verdicts. It builds the pod's timeline, gathers per pod its CRI calls, events
//! and spec, the runtime's Status answers, and every CNI plugin run the kernel saw with
//! its exit code (`facts.rs`), then runs one check per fault in pipeline order
//! (`checks.rs`): not admitted; runtime NetworkReady=false; RunPodSandbox failed (IPAM
//! exhaustion, a CNI plugin that exited non-zero, the netns never created, or otherwise);
//! image pull failure; crash loop; a sandbox recreated with its IP changing; a CNI ADD
//! with no DEL after its sandbox went away (a leaked IP). The node's pod network, as the
//! recorder looked at it (`network.rs`), gives findings of its own and the evidence of
//! the verdicts about addresses and plugins. The first finding is the
//! verdict; with none, a Running pod with an IP is healthy, a host-network pod has no IP
//! by design, and any other pod is pending with how far it got.

mod checks;
mod facts;
mod model;
mod network;
mod render;

#[cfg(test)]
mod tests;

pub use model::{Cause, Diagnosis, Finding, NodeFinding, PodDiagnosis};
pub use render::render;

use crate::timeline::{StageKind, Timeline};
use crate::trace::TraceRecord;
use facts::{Facts, PodFacts};

/// Every pod's diagnosis. `node_ip` is the host's IP for host-network pods when the
/// records do not carry it (a trace's header does).
pub fn diagnose(records: &[TraceRecord], node_ip: Option<&str>) -> Diagnosis {
    diagnose_with(records, &timeline_of(records), node_ip)
}

/// [`diagnose`] with the records' timeline already built (`/metrics` keeps it for the
/// pods' last activity).
pub fn diagnose_with(
    records: &[TraceRecord],
    timeline: &Timeline,
    node_ip: Option<&str>,
) -> Diagnosis {
    let mut facts = Facts::new(records, timeline);
    if facts.host_ip.is_none() {
        facts.host_ip = node_ip.map(str::to_string);
    }
    let mut notes = Vec::new();
    if !facts.kernel {
        notes.push(
            "no kernel events in the records: plugin exit codes, netns creation and CNI DELs cannot be checked"
                .to_string(),
        );
    }
    if facts.lost_events > 0 {
        notes.push(format!(
            "the probes lost {} kernel events while recording",
            facts.lost_events
        ));
    }
    let pods = facts
        .pods
        .iter()
        .map(|p| pod_diagnosis(p, &facts))
        .collect();
    Diagnosis {
        node: network::node_findings(facts.network_last()),
        pods,
        notes,
    }
}

/// What is wrong with the node's pod network, from its last look (`podlapse pods` shows
/// these above the pods).
pub fn node_findings(last: Option<&crate::trace::NodeNetworkRecord>) -> Vec<NodeFinding> {
    network::node_findings(last)
}

/// The timeline of the records (see [`crate::timeline::from_records`]).
fn timeline_of(records: &[TraceRecord]) -> Timeline {
    crate::timeline::from_records(records)
}

fn pod_diagnosis(p: &PodFacts<'_>, f: &Facts<'_>) -> PodDiagnosis {
    let t = p.timeline;
    let mut findings = checks::findings(p, f);
    let verdict = if findings.is_empty() {
        fine_or_pending(p, f)
    } else {
        findings.remove(0)
    };
    PodDiagnosis {
        namespace: t.namespace.clone(),
        name: t.name.clone(),
        uid: t.uid.clone(),
        ip: t.ip.clone(),
        running: t.stage(StageKind::Running).is_some(),
        removed: p.removed_ns.is_some() || p.sandboxes_removed_ns.is_some(),
        verdict,
        also: findings,
        sources: t.sources.clone(),
    }
}

/// A container of the pod was seen started (by the runtime's list or event).
fn already_running(t: &crate::timeline::PodTimeline) -> bool {
    t.stages
        .iter()
        .any(|s| *s.kind() == StageKind::ContainerStarted)
}

/// The verdict for a pod no check found fault with.
fn fine_or_pending(p: &PodFacts<'_>, f: &Facts<'_>) -> Finding {
    let t = p.timeline;
    let removed = p
        .removed_ns
        .map(|r| format!("{} removed from the config", p.at(r)))
        .or_else(|| {
            p.sandboxes_removed_ns
                .map(|r| format!("{} its last sandbox removed from the runtime", p.at(r)))
        });
    match (t.stage(StageKind::Running), &t.ip) {
        (Some(r), _) if p.host_network() => Finding {
            cause: model::Cause::HostNetwork,
            stage: StageKind::SandboxReady.into(),
            summary: format!(
                "hostNetwork: no pod IP by design; the pod uses the host's IP{}",
                f.host_ip
                    .as_ref()
                    .map(|ip| format!(" {ip}"))
                    .unwrap_or_default()
            ),
            evidence: [
                Some(if p.observed_host_network {
                    "its sandbox runs in the node's network namespace (mode NODE)".to_string()
                } else {
                    "spec.hostNetwork: true".to_string()
                }),
                Some(format!("{} Running", p.at(r.start_ns))),
                f.host_ip.as_ref().map(|ip| format!("node IP {ip}")),
                removed,
            ]
            .into_iter()
            .flatten()
            .collect(),
        },
        (Some(r), Some(ip)) => Finding {
            cause: model::Cause::Healthy,
            stage: StageKind::Running.into(),
            summary: format!("Running with IP {ip}"),
            evidence: [
                t.stages
                    .iter()
                    .rev()
                    .find(|s| s.stage.is(&StageKind::SandboxReady))
                    .map(|s| format!("{} sandbox ready, {}", p.at(s.start_ns), s.detail)),
                Some(format!("{} Running ({})", p.at(r.start_ns), r.detail)),
                removed,
            ]
            .into_iter()
            .flatten()
            .collect(),
        },
        // Already running when the observer started: its containers run, though the
        // startup was not seen.
        (None, Some(ip)) if p.before_start && already_running(t) => Finding {
            cause: model::Cause::Healthy,
            stage: StageKind::SandboxReady.into(),
            summary: format!(
                "Running with IP {ip}; already running when podlapse observe started (its startup was not observed)"
            ),
            evidence: removed.into_iter().collect(),
        },
        _ => {
            let last = t.stages.iter().max_by_key(|s| (s.end_ns, s.start_ns));
            Finding {
                cause: model::Cause::Pending,
                stage: last.map_or(StageKind::PodSeen.into(), |s| s.stage.clone()),
                summary: format!(
                    "not Running{}, and no failure was recorded; the last stage reached is {}",
                    if t.ip.is_none() { " and no IP" } else { "" },
                    last.map_or("none".to_string(), |s| s.stage.to_string())
                ),
                evidence: [
                    last.map(|s| format!("{} {} ({})", p.at(s.end_ns), s.stage, s.detail)),
                    removed,
                ]
                .into_iter()
                .flatten()
                .collect(),
            }
        }
    }
}
