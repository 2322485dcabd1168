//! Per-pod stage timelines: where the time between a pod being seen and Running went.
//!
//! [`build`] takes the records of a run (pod changes, CRI calls, pod events, kernel
//! events: a trace's records, or what the live agent's [`Collector`] kept) and returns,
//! per pod, its named stages on one monotonic clock. It does no IO and reads no clock:
//! the same records always give the same timeline, so a trace can be rebuilt, replayed
//! and compared.
//!
//! Two steps. [`attribute`] ties kernel events to pods by identities the kernel reports
//! (see `attribution.rs`); events with none stay node-level. Then `stages.rs` derives each
//! pod's stages from its CRI calls, its events and the kernel events attributed to it.
//!
//! [`KernelFilter`] decides, as events arrive, which kernel events a trace or the agent
//! keeps at all: everything attributable, and node-level events only around pod work.

mod attribution;
mod chunks;
mod cni_capture;
mod cni_reply;
mod collector;
mod filter;
mod forget;
mod ids;
mod index;
mod kubelet_spans;
mod model;
mod observed;
mod runtime_args;
mod runtime_spans;
mod runtime_stages;
mod seeing;
mod sources;
mod stage_kind;
mod stage_name;
mod stages;
mod waits;

#[cfg(test)]
pub(crate) mod tests;

pub use attribution::{Attribution, Owner, Rule};
pub use cni_reply::{CniCapture, CniIp, CniReply};
pub use collector::{Collector, CollectorStats, Forgotten};
pub use filter::KernelFilter;
pub use ids::{CgroupIds, cgroup_ids, is_runtime_helper_exec};
pub use kubelet_spans::{is_kubelet_call, is_kubelet_sync, kubelet_call_method};
pub use model::{PodTimeline, Stage, StageSource, Timeline};
pub use runtime_spans::{Step as RuntimeStep, step_of as runtime_step_of};
pub use seeing::{Change, Seeing, SeenSample, seen_latencies};
pub use sources::{PodSources, SourceState};
pub use stage_kind::StageKind;
pub use stage_name::StageName;

use crate::trace::TraceRecord;

/// The timeline of every pod in `records`.
pub fn build(records: &[TraceRecord]) -> Timeline {
    build_index(&index::Index::new(records), &|_| true)
}

/// The timeline of a trace's records: rebuilt from what it was recorded from (pod changes
/// and CRI calls; an observed trace's changes and kernel events), or, for records that
/// kept only their stages, from those.
pub fn from_records(records: &[TraceRecord]) -> Timeline {
    let has_inputs = records.iter().any(|r| match r {
        TraceRecord::Pod(_) | TraceRecord::Cri(_) | TraceRecord::Observed(_) => true,
        TraceRecord::Header(h) => h.observed.is_some(),
        _ => false,
    });
    if has_inputs {
        let mut timeline = build(records);
        note_losses(&mut timeline, records);
        return timeline;
    }
    Timeline::from_stages(records.iter().filter_map(|r| match r {
        TraceRecord::Stage(v) => serde_json::from_value::<Stage>(v.clone()).ok(),
        _ => None,
    }))
}

/// Says on every pod what the recording lost: kernel events the probes dropped (any
/// pod's stage may be among them: the loss names no pod).
fn note_losses(timeline: &mut Timeline, records: &[TraceRecord]) {
    let lost = records.iter().rev().find_map(|r| match r {
        TraceRecord::Footer(f) => Some(f.lost_events),
        _ => None,
    });
    if let Some(lost @ 1..) = lost {
        for p in &mut timeline.pods {
            p.notes.push(format!(
                "the probes lost {lost} kernel events in this recording: a kernel stage of \
                 this pod may be missing"
            ));
        }
    }
}

/// The timeline of the pods `wanted` picks by UID: attribution walks every event, but
/// only those pods' stages are built.
fn build_index(index: &index::Index<'_>, wanted: &dyn Fn(&str) -> bool) -> Timeline {
    let attribution = attribution::attribute(index);
    stages::build(index, &attribution, wanted)
}

/// Which pod each kernel event in `records` belongs to, by the event's index.
pub fn attribute(records: &[TraceRecord]) -> Attribution {
    attribution::attribute(&index::Index::new(records))
}
