//! Pod events kubelet would record (Pulling, Pulled, Created, Started, Killing, BackOff,
//! FailedCreatePodSandBox, ...). The shell records them; a recorder stamps and keeps them.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    Normal,
    Warning,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodEvent {
    pub kind: EventType,
    pub reason: String,
    pub message: String,
    /// The container the event is about, if any.
    pub container: Option<String>,
}

impl PodEvent {
    pub fn normal(
        reason: impl Into<String>,
        message: impl Into<String>,
        container: Option<String>,
    ) -> Self {
        PodEvent {
            kind: EventType::Normal,
            reason: reason.into(),
            message: message.into(),
            container,
        }
    }

    pub fn warning(
        reason: impl Into<String>,
        message: impl Into<String>,
        container: Option<String>,
    ) -> Self {
        PodEvent {
            kind: EventType::Warning,
            reason: reason.into(),
            message: message.into(),
            container,
        }
    }
}

/// Where SyncPod sends events. Implementations stamp the time and keep or print them.
pub trait EventRecorder: Send + Sync {
    fn record(&self, event: PodEvent);
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
