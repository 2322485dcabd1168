//! Where every observed record goes: the trace, the collector the API answers from, and
//! the metrics when they are served.

use std::sync::Arc;

use crate::metrics::Metrics;
use crate::timeline::{Collector, KernelFilter};
use crate::trace::{TraceRecord, TraceSink};

#[derive(Clone)]
pub(super) struct Outputs {
    pub(super) sink: TraceSink,
    pub(super) collector: Arc<Collector>,
    pub(super) metrics: Option<Arc<Metrics>>,
}

impl Outputs {
    pub(super) fn send(&self, record: TraceRecord) {
        self.collector.push(&record);
        if let (Some(m), TraceRecord::Observed(o)) = (&self.metrics, &record) {
            m.observe_observed(o);
        }
        self.sink.send(record);
    }

    /// Hands the probes' events on, past the filter `run` uses, on the event thread;
    /// ends when the probes stop.
    pub(super) fn forward_kernel_events(
        &self,
        mut events: crate::ebpf::EventReceiver,
    ) -> tokio::task::JoinHandle<()> {
        let out = self.clone();
        crate::event_thread::spawn(async move {
            let mut filter = KernelFilter::new();
            let mut keep = Vec::new();
            while let Some(e) = events.recv().await {
                filter.offer(e, &mut keep);
                for e in keep.drain(..) {
                    out.send(TraceRecord::Kernel(e));
                }
            }
        })
    }
}
