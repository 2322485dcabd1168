//! Container starts seen in the kernel, fed to the agent as they happen: the CRI calls
//! say which starts to look for, the probes' events say when each happened, and while
//! one is looked for the ring-buffer reader hurries so the exec reaches the agent within
//! about a millisecond instead of its usual ten (the probes also wake it for the execs
//! and exits of pod work). The exits of the processes those starts were seen in are fed
//! the same way.

use std::sync::{Arc, Mutex, OnceLock};

use crate::cri::CriCall;
use crate::ebpf::{KernelEvent, ReadPace};
use crate::syncloop::start_watch::{
    Observed, ObservedExit, ObservedStart, START_LIMIT_NS, StartWatch,
};

/// Told of every container start the kernel shows.
pub type StartObserver = Arc<dyn Fn(&ObservedStart) + Send + Sync>;
/// Told of the exit of every container process whose start the kernel showed.
pub type KernelExitObserver = Arc<dyn Fn(&ObservedExit) + Send + Sync>;

#[derive(Default)]
pub struct StartFeed {
    watch: Mutex<StartWatch>,
    /// Set when the probes run: without kernel events there is nothing to look for.
    pace: OnceLock<ReadPace>,
    observer: OnceLock<StartObserver>,
    exit_observer: OnceLock<KernelExitObserver>,
}

impl StartFeed {
    pub fn set_pace(&self, pace: ReadPace) {
        let _ = self.pace.set(pace);
    }

    pub fn set_observer(&self, observer: StartObserver) {
        let _ = self.observer.set(observer);
    }

    pub fn set_exit_observer(&self, observer: KernelExitObserver) {
        let _ = self.exit_observer.set(observer);
    }

    fn active(&self) -> Option<&ReadPace> {
        self.observer.get()?;
        self.pace.get()
    }

    fn watch(&self) -> std::sync::MutexGuard<'_, StartWatch> {
        self.watch.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn call_began(&self, call: &CriCall) {
        let Some(pace) = self.active() else { return };
        if self.watch().call_began(call) {
            pace.hurry_for(std::time::Duration::from_nanos(START_LIMIT_NS));
        }
    }

    pub fn call_ended(&self, call: &CriCall) {
        let Some(pace) = self.active() else { return };
        let mut watch = self.watch();
        watch.call_ended(call);
        if !watch.is_waiting() {
            pace.relax();
        }
    }

    pub fn kernel_event(&self, e: &KernelEvent) {
        let (Some(pace), Some(observer)) = (self.active(), self.observer.get()) else {
            return;
        };
        let seen = {
            let mut watch = self.watch();
            let seen = watch.offer(e);
            if seen.is_some() && !watch.is_waiting() {
                pace.relax();
            }
            seen
        };
        match seen {
            Some(Observed::Start(start)) => observer(&start),
            Some(Observed::Exit(exit)) => {
                if let Some(observe) = self.exit_observer.get() {
                    observe(&exit);
                }
            }
            None => {}
        }
    }
}
