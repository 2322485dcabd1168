//! What only `podlapse observe` serves: the pod-start duration it can see (first sight
//! to every container running, as another client ran the pod) and what the runtime's
//! event stream missed.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::trace::ObservedRecord;

pub(super) struct ObservedFamilies {
    pub(super) pod_start: Histogram,
    stream_missed: Counter,
}

impl ObservedFamilies {
    pub(super) fn new(buckets: &'static [f64]) -> ObservedFamilies {
        ObservedFamilies {
            pod_start: Histogram::new(buckets.iter().copied()),
            stream_missed: Counter::default(),
        }
    }

    pub(super) fn register(&self, podlapse: &mut Registry) {
        podlapse.register(
            "observed_pod_start_duration_seconds",
            "Duration in seconds from the observer's first sight of a pod (the pod's first \
             kernel event, or the runtime's first report of it) until all its containers \
             were running; pods already there when the observer started are left out",
            self.pod_start.clone(),
        );
        podlapse.register(
            "cri_event_stream_missed_changes",
            "Changes the runtime's event stream did not deliver that a relist found (up to \
             a relist late)",
            self.stream_missed.clone(),
        );
    }

    pub(super) fn observed(&self, r: &ObservedRecord) {
        if r.stream_missed {
            self.stream_missed.inc();
        }
    }
}
