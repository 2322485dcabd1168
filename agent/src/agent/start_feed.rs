//! Container starts seen in the kernel, fed to the agent as they happen: the CRI calls
//! say which starts to look for, the probes' events say when each happened, and while
//! one is looked for the ring-buffer reader hurries so the exec reaches the agent within
//! about a millisecond instead of its usual ten (the probes also wake it for the execs
//! and exits of pod work). The exits of the processes those starts were seen in are fed
//! the same way, through the sync loop's [`KernelSeen`].

use std::sync::{Mutex, OnceLock};

use crate::cri::CriCall;
use crate::ebpf::{KernelEvent, ReadPace};
use crate::syncloop::KernelSeen;
use crate::syncloop::start_watch::{Observed, START_LIMIT_NS, StartWatch};

#[derive(Default)]
pub struct StartFeed {
    watch: Mutex<StartWatch>,
    /// Set when the probes run: without kernel events there is nothing to look for.
    pace: OnceLock<ReadPace>,
    /// Where what the kernel shows goes: set when the sync loop runs.
    seen: OnceLock<KernelSeen>,
}

impl StartFeed {
    pub fn set_pace(&self, pace: ReadPace) {
        let _ = self.pace.set(pace);
    }

    pub fn set_target(&self, seen: KernelSeen) {
        let _ = self.seen.set(seen);
    }

    fn active(&self) -> Option<&ReadPace> {
        self.seen.get()?;
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
        let (Some(pace), Some(target)) = (self.active(), self.seen.get()) else {
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
            Some(Observed::Start(start)) => target.start(&start),
            Some(Observed::Exit(exit)) => target.observed_exit(&exit),
            None => {}
        }
    }
}
