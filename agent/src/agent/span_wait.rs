//! The runtime's spans a run is owed: each CRI call that went out sampled should come
//! back as the runtime's server span under the call's own. A run that ends waits for
//! them ([`SpanWait::wait`]): until every one came, or the runtime sent a span that ended
//! after the last sampled call had (its batches go out in the order spans end, so what
//! came before it and is still owed is not coming), or the bound.
//!
//! When a batch arrives says nothing of when it was made: a runtime exporter that was
//! reconnecting delivers a batch made before the calls ended long after. Only the spans'
//! own end times do.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use podlapse_core::record::ids;
use tokio::sync::Notify;

use crate::cri::CriCall;
use crate::otel::RuntimeSpan;
use crate::trace::SpanWaitEnd;

/// How much later than the last sampled call a span's end must be to show the runtime's
/// batches had moved past the calls: room for the two clocks (the runtime's wall time is
/// placed on the kernel's through the run's anchor).
const AFTER_CALLS: u64 = 50_000_000;

#[derive(Debug, Default)]
struct Owed {
    /// Span IDs (hex) of sampled calls whose server span has not come, with when each
    /// call ended.
    calls: HashMap<String, u64>,
    /// Server spans that came before their call was recorded (the call is recorded when
    /// it returns; the runtime may export first).
    early: HashSet<String>,
    last_call_end_ns: u64,
    /// The latest end of a span the runtime sent (of the pods the run knows).
    last_span_end_ns: u64,
}

/// Shared by the record sink (which feeds it) and the run's end (which waits on it).
#[derive(Debug, Default)]
pub struct SpanWait {
    owed: Mutex<Owed>,
    changed: Notify,
}

/// How the wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waited {
    pub end: SpanWaitEnd,
    pub waited: Duration,
    pub missing: u64,
}

impl SpanWait {
    fn owed(&self) -> std::sync::MutexGuard<'_, Owed> {
        self.owed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A call was recorded: a sampled call of a pod is owed its server span.
    pub fn call(&self, call: &CriCall) {
        if !call.traced || call.pod_uid.is_empty() {
            return;
        }
        let id = ids::hex(&ids::call_span_id(call));
        let end = call.end_ns.max(call.start_ns);
        let mut owed = self.owed();
        owed.last_call_end_ns = owed.last_call_end_ns.max(end);
        if !owed.early.remove(&id) {
            owed.calls.insert(id, end);
        }
    }

    /// A batch of the runtime's spans arrived (`spans`: those of it kept).
    pub fn batch(&self, spans: &[RuntimeSpan]) {
        {
            let mut owed = self.owed();
            let latest = spans.iter().map(|s| s.end_ns).max().unwrap_or(0);
            owed.last_span_end_ns = owed.last_span_end_ns.max(latest);
            for s in spans.iter().filter(|s| s.kind == "server") {
                if owed.calls.remove(&s.parent_span_id).is_none() {
                    owed.early.insert(s.parent_span_id.clone());
                }
            }
        }
        self.changed.notify_waiters();
    }

    fn settled(&self) -> Option<SpanWaitEnd> {
        let owed = self.owed();
        if owed.calls.is_empty() {
            return Some(SpanWaitEnd::AllArrived);
        }
        (owed.last_span_end_ns > owed.last_call_end_ns.saturating_add(AFTER_CALLS))
            .then_some(SpanWaitEnd::BatchAfterCalls)
    }

    /// Waits, at most `bound`, until what is owed came or will not come.
    pub async fn wait(&self, bound: Duration) -> Waited {
        let started = tokio::time::Instant::now();
        let deadline = started + bound;
        let end = loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the check, so a batch between the two is not missed.
            changed.as_mut().enable();
            if let Some(end) = self.settled() {
                break end;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                break self.settled().unwrap_or(SpanWaitEnd::Bound);
            }
        };
        let owed = self.owed();
        Waited {
            end,
            waited: started.elapsed(),
            missing: owed.calls.len() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podlapse_core::record::{CriMethod, GrpcCode};

    fn call(start_ns: u64, traced: bool) -> CriCall {
        CriCall::new(CriMethod::RunPodSandbox)
            .with_pod_uid("uid-1")
            .with_times(start_ns, start_ns + 1_000)
            .with_code(GrpcCode::Ok)
            .with_traced(traced)
    }

    fn server_span(of: &CriCall) -> RuntimeSpan {
        RuntimeSpan {
            pod_uid: of.pod_uid.clone(),
            trace_id: ids::hex(&ids::trace_id(&of.pod_uid)),
            span_id: "00000000000000aa".into(),
            parent_span_id: ids::hex(&ids::call_span_id(of)),
            name: "runtime.v1.RuntimeService/RunPodSandbox".into(),
            kind: "server".into(),
            start_ns: of.start_ns,
            end_ns: of.end_ns,
            attributes: Default::default(),
            events: Vec::new(),
            status: "unset".into(),
            status_message: String::new(),
            scope: String::new(),
            scope_version: String::new(),
            resource: Default::default(),
        }
    }

    #[tokio::test]
    async fn nothing_owed_ends_the_wait_at_once() {
        let w = SpanWait::default();
        w.call(&call(1, false));
        let waited = w.wait(Duration::from_secs(30)).await;
        assert_eq!(waited.end, SpanWaitEnd::AllArrived);
        assert_eq!(waited.missing, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_ends_when_the_owed_span_arrives() {
        let w = std::sync::Arc::new(SpanWait::default());
        let c = call(1, true);
        w.call(&c);
        let feeder = {
            let w = w.clone();
            let span = server_span(&c);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(3)).await;
                w.batch(&[span]);
            })
        };
        let waited = w.wait(Duration::from_secs(30)).await;
        feeder.await.unwrap();
        assert_eq!(waited.end, SpanWaitEnd::AllArrived);
        assert_eq!(waited.waited, Duration::from_secs(3));
    }

    #[tokio::test]
    async fn a_span_before_its_call_is_recorded_is_not_owed() {
        let w = SpanWait::default();
        let c = call(1, true);
        w.batch(&[server_span(&c)]);
        w.call(&c);
        assert_eq!(w.wait(Duration::ZERO).await.end, SpanWaitEnd::AllArrived);
    }

    #[tokio::test]
    async fn a_span_that_ended_after_the_last_call_settles_what_came_before_it() {
        let w = SpanWait::default();
        let owed = call(1_000, true);
        w.call(&owed);
        // Another call's span, ended well after the owed one's call.
        let mut later = server_span(&call(1_000 + AFTER_CALLS + 10_000, true));
        later.parent_span_id = "00000000000000bb".into();
        w.batch(&[later]);
        let waited = w.wait(Duration::from_secs(30)).await;
        assert_eq!(waited.end, SpanWaitEnd::BatchAfterCalls);
        assert_eq!(waited.missing, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn spans_that_never_come_end_the_wait_at_the_bound() {
        let w = SpanWait::default();
        let owed = call(5_000, true);
        w.call(&owed);
        // A batch that arrives late but holds only what ended before the call did (an
        // exporter that was reconnecting) settles nothing.
        let mut early = server_span(&call(1, true));
        early.parent_span_id = "00000000000000cc".into();
        w.batch(&[early]);
        let waited = w.wait(Duration::from_secs(8)).await;
        assert_eq!(waited.end, SpanWaitEnd::Bound);
        assert_eq!(waited.waited, Duration::from_secs(8));
        assert_eq!(waited.missing, 1);
    }
}
