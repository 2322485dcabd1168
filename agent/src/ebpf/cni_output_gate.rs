//! Attaching the write hook that captures CNI plugins' output only while a plugin runs.
//!
//! Both hooks ([`super::WriteHook`]) run on every write(2) of every task on the node while
//! attached, and plugins run a few tens of milliseconds per pod. The hook is loaded and
//! verified at start and attached on demand: around the CRI calls inside which the runtime
//! runs plugins (`podlapse run` takes a [`CniOutputHold`] before the call goes out), and as
//! soon as the reader sees a network namespace created or a CNI plugin exec'd (the probes
//! wake the reader for those; [`CniOutputGate::poke`]), for `observe` and `kernel-events`,
//! which make no CRI calls of their own. It is detached once no hold has been held for
//! [`CNI_OUTPUT_LINGER`], no poke came for [`CNI_OUTPUT_POKE_LINGER`], and no plugin process is alive (the probes' `CNI_PLUGINS`
//! map; one alive for over [`MAX_PLUGIN_RUN`] no longer counts). Each attach, detach and refusal goes into the event stream as a
//! `cni_write_hook` record, so a plugin run can say whether its output could be seen.

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use aya::Ebpf;
use aya::maps::HashMap;
use podlapse_ebpf_common::names;

use super::event::{CniWriteHook, Comm, EventMeta, KernelEvent, WriteHookChange};
use super::reader::EventInjector;
use super::write_hooks::{WriteHook, WriteLink, attach};

/// How long the hook stays attached after the last hold, once no plugin runs.
pub const CNI_OUTPUT_LINGER: Duration = Duration::from_millis(500);
/// How long it stays attached after the last poke, once no plugin runs. A poke comes
/// from the reader, which sees a chain's plugins one exec at a time: the runtime's own
/// work between two plugins (tens of milliseconds on an idle node, hundreds on a busy
/// one) must not detach it, or the next plugin writes before the reader re-attaches.
pub const CNI_OUTPUT_POKE_LINGER: Duration = Duration::from_secs(3);
/// How often an idle gate is checked.
const CHECK_EVERY: Duration = Duration::from_millis(100);
/// A plugin process alive longer than this no longer keeps the hook attached: a plugin
/// that never exits costs the node its writes only this long (its output stays bounded
/// by the probes either way).
pub const MAX_PLUGIN_RUN: Duration = Duration::from_secs(30);

/// Shared by the probes, the reader and whoever makes CRI calls; cloning is cheap.
#[derive(Clone)]
pub struct CniOutputGate {
    state: Arc<Mutex<GateState>>,
}

struct GateState {
    ebpf: Arc<Mutex<Ebpf>>,
    hook: WriteHook,
    inject: EventInjector,
    holders: usize,
    link: Option<WriteLink>,
    /// Until when the last hold's or poke's linger keeps the hook attached.
    wanted_until: Instant,
    attaches: u64,
    failure: Option<String>,
    /// When each live plugin process was first seen alive by the idle check.
    seen: std::collections::HashMap<u32, Instant>,
}

/// Held while a call inside which CNI plugins may run is made.
#[must_use = "the gate is released when the hold is dropped"]
pub struct CniOutputHold {
    gate: CniOutputGate,
}

impl Drop for CniOutputHold {
    fn drop(&mut self) {
        let mut st = self.gate.lock();
        st.holders = st.holders.saturating_sub(1);
        st.wanted_until = st.wanted_until.max(Instant::now() + CNI_OUTPUT_LINGER);
    }
}

impl CniOutputGate {
    /// A gate over `hook`, loaded but not attached; its changes go to `inject`. Starts
    /// the task that detaches it when idle, which ends with the last clone of the gate.
    /// Must run inside a tokio runtime.
    pub(super) fn new(ebpf: Arc<Mutex<Ebpf>>, hook: WriteHook, inject: EventInjector) -> Self {
        let gate = CniOutputGate {
            state: Arc::new(Mutex::new(GateState {
                ebpf,
                hook,
                inject,
                holders: 0,
                link: None,
                wanted_until: Instant::now(),
                attaches: 0,
                failure: None,
                seen: std::collections::HashMap::new(),
            })),
        };
        tokio::spawn(detach_when_idle(Arc::downgrade(&gate.state)));
        gate
    }

    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Attaches the hook if it is not, and keeps it attached until the hold is dropped
    /// (and the linger after). `reason` goes into the attach record.
    pub fn hold(&self, reason: &str) -> CniOutputHold {
        let mut st = self.lock();
        st.holders += 1;
        st.want(reason, CNI_OUTPUT_LINGER);
        CniOutputHold { gate: self.clone() }
    }

    /// Attaches the hook if it is not, for at least the poke's linger from now.
    pub fn poke(&self, reason: &str) {
        self.lock().want(reason, CNI_OUTPUT_POKE_LINGER);
    }

    /// Whether a kernel event calls for the hook: a plugin exec'd, or a network namespace
    /// created (the runtime runs the plugins right after).
    pub fn wanted_for(e: &KernelEvent) -> Option<String> {
        match e {
            KernelEvent::CniExec(c) => Some(format!("{} exec'd (pid {})", c.plugin, c.meta.tgid)),
            KernelEvent::Netns {
                meta,
                syscall: super::NetnsCall::Unshare,
                ret: 0,
                ..
            } => Some(format!(
                "network namespace created by {} (pid {})",
                meta.comm, meta.tgid
            )),
            _ => None,
        }
    }

    /// Detaches the hook now, whatever holds or lingers (the probes are stopping), with
    /// a `detached` record saying `reason`. Nothing when it is not attached.
    pub fn detach(&self, reason: &str) {
        let mut st = self.lock();
        if st.link.take().is_some() {
            st.record(WriteHookChange::Detached, reason.to_string());
        }
    }

    pub fn is_attached(&self) -> bool {
        self.lock().link.is_some()
    }

    /// Times the hook was attached so far.
    pub fn attaches(&self) -> u64 {
        self.lock().attaches
    }

    /// The hook behind the gate.
    pub fn hook(&self) -> WriteHook {
        self.lock().hook.clone()
    }

    /// The last refusal to attach, if any.
    pub fn failure(&self) -> Option<String> {
        self.lock().failure.clone()
    }
}

impl GateState {
    fn want(&mut self, reason: &str, linger: Duration) {
        self.wanted_until = self.wanted_until.max(Instant::now() + linger);
        if self.link.is_some() {
            return;
        }
        let began = Instant::now();
        let attached = {
            let mut ebpf = self.ebpf.lock().unwrap_or_else(|e| e.into_inner());
            attach(&mut ebpf, &self.hook)
        };
        match attached {
            Ok(link) => {
                self.link = Some(link);
                self.attaches += 1;
                tracing::debug!(took = ?began.elapsed(), hook = self.hook.name(), "CNI write hook attached");
                self.record(WriteHookChange::Attached, reason.to_string());
            }
            Err(e) => {
                if self.failure.as_deref() != Some(e.as_str()) {
                    tracing::warn!("CNI plugins' output not captured: {e}");
                    self.record(WriteHookChange::Refused, e.clone());
                }
                self.failure = Some(e);
            }
        }
    }

    fn detach_if_idle(&mut self, now: Instant) {
        if self.link.is_none() || self.holders > 0 || now < self.wanted_until {
            return;
        }
        let live = {
            let ebpf = self.ebpf.lock().unwrap_or_else(|e| e.into_inner());
            live_plugins(&ebpf)
        };
        self.seen.retain(|tgid, _| live.contains(tgid));
        let mut running = false;
        for tgid in live {
            let first = *self.seen.entry(tgid).or_insert(now);
            running |= now.duration_since(first) < MAX_PLUGIN_RUN;
        }
        if running {
            return;
        }
        // Dropping the link detaches the program.
        self.link = None;
        self.record(
            WriteHookChange::Detached,
            "no CNI plugin running and none expected since the last need's linger".to_string(),
        );
    }

    fn record(&self, change: WriteHookChange, reason: String) {
        self.inject
            .inject(KernelEvent::CniWriteHook(Box::new(CniWriteHook {
                meta: own_meta(),
                change,
                hook: self.hook.name().to_string(),
                reason,
            })));
    }
}

/// The agent's own header: this process, on the probes' clock.
fn own_meta() -> EventMeta {
    let pid = std::process::id();
    EventMeta {
        ktime_ns: crate::clock::now_ktime_ns(),
        cpu: 0,
        pid,
        tgid: pid,
        comm: Comm::new("podlapse"),
        cgroup_id: 0,
    }
}

/// Plugin processes the probes follow that are still alive: an entry whose exit was
/// missed (the map is an LRU) names a process that is gone.
fn live_plugins(ebpf: &Ebpf) -> Vec<u32> {
    let Some(map) = ebpf.map(names::CNI_PLUGINS) else {
        return Vec::new();
    };
    let Ok(plugins) = HashMap::<_, u32, [u8; 16]>::try_from(map) else {
        return Vec::new();
    };
    plugins
        .keys()
        .filter_map(Result::ok)
        .filter(|tgid| std::path::Path::new(&format!("/proc/{tgid}")).exists())
        .collect()
}

async fn detach_when_idle(state: Weak<Mutex<GateState>>) {
    let mut every = tokio::time::interval(CHECK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(state) = state.upgrade() else { return };
        state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .detach_if_idle(Instant::now());
    }
}
