//! Gauges from the live diagnosis: the pods that are not Running with an IP, by cause,
//! and the node's pod network, as of the last scrape. Label values are the diagnosis's
//! causes: bounded, never a pod's name or UID.

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::diagnose::{Cause, Diagnosis, PodDiagnosis};
use crate::timeline::{Collector, PodTimeline, StageKind, Timeline};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabel {
    cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    /// The runtime's reason for a false condition (`NetworkPluginNotReady`); empty when
    /// true.
    reason: String,
}

/// A pod the runtime holds no sandbox of (each RunPodSandbox failed) is counted while
/// its client keeps trying: kubelet retries a failed sync within seconds (its pod
/// worker's back-off is 10 s, a container's at most 5 min), so one with no new stage
/// for longer is taken as given up (deleted before it ever ran).
pub const GIVEN_UP_NS: u64 = 6 * 60 * 1_000_000_000;

/// How often the diagnosis is made again with no new record: what ages out
/// ([`GIVEN_UP_NS`]) changes with time alone.
const AGAIN_NS: u64 = 30 * 1_000_000_000;

/// The gauges, and when they were last worked out.
pub(super) struct DiagnosisGauges {
    pods: Family<CauseLabel, Gauge>,
    node_ready: Family<ReasonLabel, Gauge>,
    node_findings: Family<CauseLabel, Gauge>,
    last: Mutex<Option<(u64, u64)>>,
}

impl DiagnosisGauges {
    pub(super) fn new() -> DiagnosisGauges {
        DiagnosisGauges {
            pods: Family::default(),
            node_ready: Family::default(),
            node_findings: Family::default(),
            last: Mutex::new(None),
        }
    }

    pub(super) fn register(&self, podlapse: &mut Registry) {
        podlapse.register(
            "unhealthy_pods",
            "Pods not Running with an IP, by the live diagnosis's cause (podlapse diagnose \
             --live): ipam_exhausted, cni_plugin_missing, cni_no_address, cni_plugin_failed, \
             network_not_ready, leaked_ip, pending, ...; pods removed, and pods with no \
             sandbox and no new stage for 6 minutes, are not counted",
            self.pods.clone(),
        );
        podlapse.register(
            "node_network_ready",
            "1 when the runtime's NetworkReady condition is true, 0 when false with the \
             runtime's reason, as last looked at; absent until a look said",
            self.node_ready.clone(),
        );
        podlapse.register(
            "node_network_findings",
            "1 for each cause the node's pod network has, as last looked at: \
             network_not_ready, cni_plugin_missing, ipam_exhausted, leaked_ip",
            self.node_findings.clone(),
        );
    }

    /// Works the gauges out again from what `collector` keeps, when it kept anything
    /// since the last time or [`AGAIN_NS`] passed.
    pub(super) fn refresh(&self, collector: &Collector, now_ns: u64) {
        let generation = collector.generation();
        {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((g, at)) = *last
                && g == generation
                && now_ns.saturating_sub(at) < AGAIN_NS
            {
                return;
            }
            *last = Some((generation, now_ns));
        }
        let records = collector.records();
        let timeline = crate::timeline::from_records(&records);
        let diagnosis = crate::diagnose::diagnose_with(&records, &timeline, None);
        self.set(&diagnosis, &timeline, collector, now_ns);
    }

    fn set(&self, diagnosis: &Diagnosis, timeline: &Timeline, collector: &Collector, now_ns: u64) {
        let counts = unhealthy_by_cause(diagnosis, timeline, now_ns);
        // Causes gone since the last time read 0 rather than their last count.
        for cause in ALL_CAUSES {
            let n = counts.get(cause).copied().unwrap_or(0);
            let label = CauseLabel {
                cause: cause.to_string(),
            };
            if n > 0 {
                self.pods.get_or_create(&label).set(n);
            } else if self.pods.get(&label).is_some() {
                self.pods.get_or_create(&label).set(0);
            }
        }
        let network = collector.last_network();
        self.node_ready.clear();
        if let Some(ready) = network.as_ref().and_then(|n| n.ready.as_ref()) {
            let reason = if ready.status {
                String::new()
            } else {
                ready.reason.clone()
            };
            self.node_ready
                .get_or_create(&ReasonLabel { reason })
                .set(i64::from(ready.status));
        }
        self.node_findings.clear();
        for f in crate::diagnose::node_findings(network.as_ref()) {
            self.node_findings
                .get_or_create(&CauseLabel {
                    cause: f.cause.to_string(),
                })
                .set(1);
        }
    }
}

/// Every cause a pod can be counted under.
const ALL_CAUSES: &[Cause] = &[
    Cause::NotAdmitted,
    Cause::NetworkNotReady,
    Cause::NetnsNotCreated,
    Cause::IpamExhausted,
    Cause::CniPluginMissing,
    Cause::CniNoAddress,
    Cause::CniPluginFailed,
    Cause::SandboxFailed,
    Cause::ImagePullFailed,
    Cause::CrashLoop,
    Cause::SandboxRecreated,
    Cause::LeakedIp,
    Cause::Pending,
];

/// The pods not Running with an IP that are still there, by cause.
pub fn unhealthy_by_cause(
    diagnosis: &Diagnosis,
    timeline: &Timeline,
    now_ns: u64,
) -> BTreeMap<Cause, i64> {
    let by_uid: BTreeMap<&str, &PodTimeline> =
        timeline.pods.iter().map(|p| (p.uid.as_str(), p)).collect();
    let mut counts = BTreeMap::new();
    for p in &diagnosis.pods {
        if counted(p, by_uid.get(p.uid.as_str()).copied(), now_ns) {
            *counts.entry(p.verdict.cause).or_insert(0) += 1;
        }
    }
    counts
}

fn counted(p: &PodDiagnosis, timeline: Option<&PodTimeline>, now_ns: u64) -> bool {
    if p.verdict.cause.is_healthy() || p.removed {
        return false;
    }
    let Some(t) = timeline else {
        return true;
    };
    let has_sandbox = t.stage(StageKind::SandboxReady).is_some();
    let last = t.stages.iter().map(|s| s.end_ns.max(s.start_ns)).max();
    has_sandbox || last.is_none_or(|l| now_ns.saturating_sub(l) < GIVEN_UP_NS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::Finding;
    use crate::timeline::{Stage, StageSource};

    const S: u64 = 1_000_000_000;

    fn pod(uid: &str, cause: Cause, removed: bool) -> PodDiagnosis {
        PodDiagnosis {
            namespace: "default".into(),
            name: uid.into(),
            uid: uid.into(),
            ip: None,
            running: false,
            removed,
            verdict: Finding {
                cause,
                stage: StageKind::CniAdd.into(),
                summary: String::new(),
                evidence: Vec::new(),
            },
            also: Vec::new(),
            sources: None,
        }
    }

    fn timeline_of(uid: &str, stages: &[(StageKind, u64)]) -> PodTimeline {
        PodTimeline {
            uid: uid.into(),
            namespace: "default".into(),
            name: uid.into(),
            seen_ns: Some(0),
            sandbox_ids: Vec::new(),
            containers: BTreeMap::new(),
            ip: None,
            stages: stages
                .iter()
                .map(|(k, at)| {
                    Stage::new(
                        uid,
                        "default",
                        uid,
                        k.clone().into(),
                        *at,
                        *at,
                        StageSource::Kernel,
                    )
                })
                .collect(),
            kernel_events: BTreeMap::new(),
            notes: Vec::new(),
            sources: None,
        }
    }

    #[test]
    fn pods_are_counted_by_cause_until_removed_or_given_up() {
        let diagnosis = Diagnosis {
            pods: vec![
                pod("full", Cause::IpamExhausted, false),
                pod("full-too", Cause::IpamExhausted, false),
                pod("fine", Cause::Healthy, false),
                pod("host", Cause::HostNetwork, false),
                pod("gone", Cause::CniPluginFailed, true),
                pod("stuck", Cause::Pending, false),
                pod("abandoned", Cause::CniPluginMissing, false),
            ],
            ..Diagnosis::default()
        };
        let now = 1_000 * S;
        let timeline = Timeline {
            pods: vec![
                timeline_of("full", &[(StageKind::CniAdd, now - 5 * S)]),
                timeline_of("full-too", &[(StageKind::CniAdd, now - 300 * S)]),
                // The runtime holds its sandbox: still there however old its stages.
                timeline_of("stuck", &[(StageKind::SandboxReady, now - 900 * S)]),
                timeline_of("abandoned", &[(StageKind::CniAdd, now - 400 * S)]),
            ],
            ..Timeline::default()
        };
        let counts = unhealthy_by_cause(&diagnosis, &timeline, now);
        assert_eq!(
            counts,
            BTreeMap::from([(Cause::IpamExhausted, 2), (Cause::Pending, 1)])
        );
    }

    #[test]
    fn a_cause_that_went_reads_zero_and_the_node_gauges_follow_the_last_look() {
        use crate::trace::{NetworkCondition, NodeNetworkRecord, TraceRecord};
        let gauges = DiagnosisGauges::new();
        let mut registry = Registry::default();
        gauges.register(registry.sub_registry_with_prefix("podlapse"));
        let text = || {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
            out
        };
        let collector = Collector::new();
        let timeline = Timeline {
            pods: vec![timeline_of("full", &[(StageKind::CniAdd, 10 * S)])],
            ..Timeline::default()
        };
        let mut diagnosis = Diagnosis {
            pods: vec![pod("full", Cause::IpamExhausted, false)],
            ..Diagnosis::default()
        };
        gauges.set(&diagnosis, &timeline, &collector, 20 * S);
        assert!(
            text().contains("podlapse_unhealthy_pods{cause=\"ipam_exhausted\"} 1"),
            "{}",
            text()
        );
        assert!(
            !text().contains("podlapse_node_network_ready{"),
            "{}",
            text()
        );
        diagnosis.pods[0].removed = true;
        collector.push(&TraceRecord::Network(Box::new(NodeNetworkRecord {
            at_ns: 15 * S,
            ready: Some(NetworkCondition {
                status: false,
                reason: "NetworkPluginNotReady".into(),
                message: "cni plugin not initialized".into(),
            }),
            load_status: String::new(),
            conf_dir: "/etc/cni/net.d".into(),
            bin_dirs: vec!["/opt/cni/bin".into()],
            files: Vec::new(),
            conf_dir_error: String::new(),
            used: String::new(),
            missing_plugins: Vec::new(),
            ipam: None,
        })));
        gauges.set(&diagnosis, &timeline, &collector, 30 * S);
        let out = text();
        assert!(
            out.contains("podlapse_unhealthy_pods{cause=\"ipam_exhausted\"} 0"),
            "{out}"
        );
        assert!(
            out.contains("podlapse_node_network_ready{reason=\"NetworkPluginNotReady\"} 0"),
            "{out}"
        );
        assert!(
            out.contains("podlapse_node_network_findings{cause=\"network_not_ready\"} 1"),
            "{out}"
        );
    }
}
