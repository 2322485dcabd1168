//! Where the shell records pod events and waits (the records themselves are the core's):
//! a recorder stamps and keeps them.

pub use podlapse_core::record::{EventType, PodEvent, PodWait, WaitKind};

/// Where SyncPod sends events. Implementations stamp the time and keep or print them.
pub trait EventRecorder: Send + Sync {
    fn record(&self, event: PodEvent);

    /// The pod waited `waited_ns` until now. Only the agent's recorder keeps waits (for
    /// its timeline and the trace).
    fn waited(&self, _wait: PodWait, _waited_ns: u64) {}
}

/// Keeps events in memory, in the order they were recorded.
#[derive(Debug, Default)]
pub struct EventLog {
    events: std::sync::Mutex<Vec<PodEvent>>,
}

impl EventLog {
    pub fn take(&self) -> Vec<PodEvent> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl EventRecorder for EventLog {
    fn record(&self, event: PodEvent) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event);
    }
}
