//! Latency reports over recorded traces: what `podlapse report` prints.
//!
//! Everything here is computed from the stage records of the timeline (rebuilt from a
//! trace's records by `timeline::build`, or read as they were written): no IO, no clock,
//! so the same traces always give the same report, byte for byte.
//!
//! - `stats.rs`: per stage, count, failures, p50, p90, p99 and max across pods and traces.
//! - `breakdown.rs`: each pod's startup cut into non-overlapping parts with their shares,
//!   and the gap no stage explains as a row of its own.
//! - `render.rs`: the table and markdown forms.
//! - `pftrace/`: Perfetto's native protobuf trace (tracks per pod and container, flows,
//!   counters).
//! - `chrome_json.rs`: the Chrome trace-event JSON that Perfetto's UI, chrome://tracing
//!   and speedscope read.
//! - `lanes.rs`: stages split over tracks so each track's slices nest.
//! - `svg.rs`: a pod's waterfall and the per-stage latency distributions as an SVG.

mod breakdown;
mod chrome_json;
mod lanes;
mod pftrace;
mod render;
mod stats;
mod svg;

#[cfg(test)]
mod tests;

pub use breakdown::{Breakdown, GAP, Part, breakdown};
pub use chrome_json::chrome_trace;
pub use pftrace::perfetto_trace;
pub use render::{markdown, table};
pub use stats::{STARTUP, StageStats, TO_READY, percentile, stage_stats};
pub use svg::svg;

use serde::{Deserialize, Serialize};

use crate::timeline::{PodTimeline, Timeline};
use crate::trace::TraceRecord;

/// One trace, as the report reads it.
#[derive(Debug, Clone)]
pub struct TraceInput {
    /// How the report names the trace (its file name).
    pub name: String,
    /// Its records: the kernel events for the Perfetto export come from here.
    pub records: Vec<TraceRecord>,
    pub timeline: Timeline,
}

/// The whole report: the stage table, then every pod's breakdown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub traces: Vec<String>,
    pub stages: Vec<StageStats>,
    pub pods: Vec<PodReport>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodReport {
    pub trace: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Absent when the pod never reached Running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<Breakdown>,
    /// For a pod without a breakdown: how far it got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// Which sources the breakdown had, and why any is absent; None for a trace that
    /// did not record them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<crate::timeline::PodSources>,
}

impl PodReport {
    pub fn display_name(&self) -> String {
        if self.name.is_empty() {
            self.uid.clone()
        } else {
            format!("{}/{}", self.namespace, self.name)
        }
    }
}

/// The report over `inputs`, in the order given; pods in each trace's timeline order.
pub fn build(inputs: &[TraceInput]) -> Report {
    let pods: Vec<&PodTimeline> = inputs.iter().flat_map(|t| &t.timeline.pods).collect();
    Report {
        traces: inputs.iter().map(|t| t.name.clone()).collect(),
        stages: stage_stats(pods.iter().copied()),
        pods: inputs
            .iter()
            .flat_map(|t| t.timeline.pods.iter().map(|p| pod_report(&t.name, p)))
            .collect(),
    }
}

fn pod_report(trace: &str, p: &PodTimeline) -> PodReport {
    let breakdown = breakdown(p);
    let outcome = breakdown.is_none().then(|| outcome(p));
    PodReport {
        trace: trace.to_string(),
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        uid: p.uid.clone(),
        breakdown,
        outcome,
        sources: p.sources.clone(),
    }
}

/// How far a pod that never ran got: its last stage, and the first failure if any.
fn outcome(p: &PodTimeline) -> String {
    let last = p
        .stages
        .iter()
        .max_by_key(|s| s.end_ns)
        .map_or("no stage".to_string(), |s| s.stage.to_string());
    match p.failures().next() {
        Some(f) => format!(
            "did not reach Running; last stage {last}; first failure {}",
            f.stage
        ),
        None => format!("did not reach Running; last stage {last}"),
    }
}
