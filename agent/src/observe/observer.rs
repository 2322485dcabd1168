//! The observer's loop: the runtime's event stream where it is safe to subscribe, with a
//! relist beside it for what the stream missed, or polling where it is not. Everything it
//! learns goes to the sink as [`ObservedRecord`]s; it never calls a mutating CRI method.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use tokio::sync::mpsc;

use super::runtime_view::{RuntimeView, StreamMsg};
use super::watch::Watcher;
use crate::cri::{CriError, api};
use crate::trace::{ObservedRecord, ObservedVia};

/// How the observer learns of changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EventsMode {
    /// The event stream on containerd 2.x, polling elsewhere.
    Auto,
    /// The event stream, falling back to polling if the runtime refuses it.
    Stream,
    /// Lists every poll period.
    Poll,
}

/// Whether to subscribe to `runtime`'s event stream, and why not when not.
pub fn use_stream(
    mode: EventsMode,
    runtime_name: &str,
    runtime_version: &str,
) -> Result<(), String> {
    match mode {
        EventsMode::Stream => Ok(()),
        EventsMode::Poll => Err("--cri-events poll".into()),
        EventsMode::Auto => {
            let major = runtime_version
                .trim_start_matches('v')
                .split('.')
                .next()
                .and_then(|m| m.parse::<u32>().ok());
            match (runtime_name, major) {
                ("containerd", Some(m)) if m >= 2 => Ok(()),
                // containerd 1.x hands each event to one subscriber only: listening would
                // take events away from a kubelet's Evented PLEG.
                ("containerd", _) => Err(format!(
                    "containerd {runtime_version} gives each event to one subscriber only, and \
                     subscribing would take events from the kubelet"
                )),
                _ => Err(format!(
                    "the event stream is used on containerd 2.x only, not {runtime_name} \
                     {runtime_version} (--cri-events stream to use it)"
                )),
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct ObserveConfig {
    /// Between lists when polling.
    pub poll: Duration,
    /// Between lists beside the event stream: for what it missed, and removals.
    pub relist: Duration,
}

/// What the observer did, for its summary.
#[derive(Debug, Clone, Default)]
pub struct ObserveSummary {
    pub records: u64,
    pub pods: BTreeSet<String>,
    /// Why the event stream was not used or stopped being used.
    pub polling_because: Option<String>,
    /// Events the runtime had kept from before the observer started, not recorded.
    pub events_before_start: u64,
    /// The runtime's errors, by message, with how often each came.
    pub runtime_errors: BTreeMap<String, u64>,
    /// Changes the event stream was on for but never delivered: a list found them.
    pub stream_missed: u64,
}

/// Observes until `stop` resolves. `now` is the trace's clock.
pub async fn observe(
    view: &RuntimeView,
    stream: bool,
    config: ObserveConfig,
    watcher: &mut Watcher,
    now: impl Fn() -> u64,
    mut sink: impl FnMut(ObservedRecord),
    stop: impl Future<Output = ()>,
) -> ObserveSummary {
    let mut summary = ObserveSummary::default();
    let mut emit = |r: ObservedRecord, summary: &mut ObserveSummary| {
        summary.records += 1;
        summary.stream_missed += u64::from(r.stream_missed);
        summary.pods.insert(r.pod_key().to_string());
        sink(r);
    };
    let mut events: Option<mpsc::UnboundedReceiver<StreamMsg>> = stream.then(|| view.events());
    let mut pending = BTreeSet::new();
    let mut tick = ticker(if stream { config.relist } else { config.poll });
    let mut looked = false;
    tokio::pin!(stop);
    loop {
        let next = async {
            match events.as_mut() {
                Some(rx) => rx.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = &mut stop => break,
            msg = next => match msg {
                // containerd keeps events for a while when nobody listens, and hands
                // them to the next subscriber: what happened before the observer started
                // is history the initial list already summed up.
                Some(StreamMsg::Event(ev)) if ev.created_at < watcher.started_wall_ns() => {
                    summary.events_before_start += 1;
                }
                Some(StreamMsg::Event(ev)) => {
                    for r in on_event(watcher, now(), &ev) {
                        pending.remove(if r.container_id.is_empty() { &r.sandbox_id } else { &r.container_id });
                        emit(r, &mut summary);
                    }
                }
                Some(StreamMsg::Ended(why)) => {
                    let why = format!("the runtime's event stream ended ({why}); polling every {:?}", config.poll);
                    eprintln!("podlapse: {why}");
                    summary.polling_because = Some(why);
                    events = None;
                    tick = ticker(config.poll);
                }
                None => {
                    events = None;
                    tick = ticker(config.poll);
                }
            },
            _ = tick.tick() => {
                // The first look sums up what is there; from then on, with the stream
                // on, a change is first left for the stream.
                let holding = events.is_some() && looked;
                looked = true;
                match relist(view, watcher, &now, holding.then_some(&mut pending)).await {
                    Ok(records) => records.into_iter().for_each(|r| emit(r, &mut summary)),
                    Err(e) => {
                        let count = summary.runtime_errors.entry(e.to_string()).or_default();
                        if *count == 0 {
                            eprintln!("podlapse: observing the runtime: {e}; trying again");
                        }
                        *count += 1;
                    }
                }
            }
        }
    }
    // What changed since the last look, so the trace ends on the runtime's state.
    if let Ok(records) = relist(view, watcher, &now, None).await {
        records.into_iter().for_each(|r| emit(r, &mut summary));
    }
    summary
}

fn ticker(period: Duration) -> tokio::time::Interval {
    let mut t = tokio::time::interval(period);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

/// The records one event of the runtime's stream gives.
pub fn on_event(
    watcher: &mut Watcher,
    at_ns: u64,
    ev: &api::ContainerEventResponse,
) -> Vec<ObservedRecord> {
    use api::ContainerEventType as T;
    let via = ObservedVia::Events;
    let kind = T::try_from(ev.container_event_type).ok();
    let sandbox = ev.pod_sandbox_status.as_ref();
    let is_sandbox = sandbox.is_some_and(|s| s.id == ev.container_id);
    let mut out = Vec::new();
    match (kind, is_sandbox) {
        (Some(T::ContainerDeletedEvent), true) => {
            out.extend(watcher.sandbox_gone(at_ns, via, &ev.container_id))
        }
        (Some(T::ContainerDeletedEvent), false) => {
            out.extend(watcher.container_gone(at_ns, via, &ev.container_id))
        }
        (_, true) => {
            if let Some(s) = sandbox {
                out.extend(watcher.sandbox(at_ns, via, s, Some(ev.created_at)));
            }
        }
        (_, false) => {
            let Some(s) = sandbox else {
                return out;
            };
            // A sandbox from before the observer started, first seen through its
            // container's event: learn whose it is first.
            if !watcher.knows_sandbox(&s.id) {
                out.extend(watcher.sandbox(at_ns, via, s, None));
            }
            if let Some(c) = ev
                .containers_statuses
                .iter()
                .find(|c| c.id == ev.container_id)
            {
                out.extend(watcher.container(at_ns, via, c, &s.id));
            }
        }
    }
    out
}

/// Marks `records` as changes the event stream missed, when it did.
fn stream_missed(mut records: Vec<ObservedRecord>, missed: bool) -> Vec<ObservedRecord> {
    for r in &mut records {
        r.stream_missed = missed;
    }
    records
}

/// One look at every sandbox and container. With `pending` (the event stream is on), a
/// change is first left for the stream, which carries the runtime's own time for it, and
/// recorded from the list only if it is still unrecorded at the next look.
async fn relist(
    view: &RuntimeView,
    watcher: &mut Watcher,
    now: &impl Fn() -> u64,
    mut pending: Option<&mut BTreeSet<String>>,
) -> Result<Vec<ObservedRecord>, CriError> {
    let via = ObservedVia::Polling;
    let mut out = Vec::new();
    let sandboxes = view.sandboxes().await?;
    // Left for the stream at this look (first seen changed now).
    let hold = |id: &str, pending: &mut Option<&mut BTreeSet<String>>| match pending {
        Some(p) => p.insert(id.to_string()),
        None => false,
    };
    let mut listed_sandboxes = BTreeSet::new();
    for sb in &sandboxes {
        listed_sandboxes.insert(sb.id.clone());
        if !watcher.sandbox_changed(&sb.id, sb.state) || hold(&sb.id, &mut pending) {
            continue;
        }
        // Past the hold with the stream on: the stream had a look's time and missed it.
        let missed = pending.is_some();
        if let Some(st) = view.sandbox_status(&sb.id).await? {
            out.extend(stream_missed(
                watcher.sandbox(now(), via, &st, None),
                missed,
            ));
        }
        if let Some(p) = pending.as_mut() {
            p.remove(&sb.id);
        }
    }
    let containers = view.containers().await?;
    let mut listed_containers = BTreeSet::new();
    for c in &containers {
        listed_containers.insert(c.id.clone());
        if !watcher.container_changed(&c.id, c.state) || hold(&c.id, &mut pending) {
            continue;
        }
        let missed = pending.is_some();
        if !watcher.knows_sandbox(&c.pod_sandbox_id)
            && let Some(st) = view.sandbox_status(&c.pod_sandbox_id).await?
        {
            out.extend(stream_missed(
                watcher.sandbox(now(), via, &st, None),
                missed,
            ));
        }
        if let Some(st) = view.container_status(&c.id).await? {
            let records = watcher.container(now(), via, &st, &c.pod_sandbox_id);
            out.extend(stream_missed(records, missed));
        }
        if let Some(p) = pending.as_mut() {
            p.remove(&c.id);
        }
    }
    if let Some(p) = pending {
        p.retain(|id| listed_sandboxes.contains(id) || listed_containers.contains(id));
    }
    out.extend(watcher.listed(now(), &listed_sandboxes, &listed_containers));
    Ok(out)
}
