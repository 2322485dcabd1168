//! The one-shot run's third phase (`--until-ready`): the manifests' pods created, each
//! followed until it settles (every container running, or stuck on something that will
//! not pass by itself) or the time is up; optionally held, then removed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use crate::config::source::PodUpdate;
use crate::config::{ManifestError, load_paths};
use crate::kuberuntime::labels;
use crate::syncloop::StatusStore;

use super::AgentError;
use super::outcome::{PodOutcome, by_name, outcome_of, settled};
use super::start::Started;

/// What the one-shot run is asked to do.
pub struct ReadyOptions {
    pub manifests: Vec<PathBuf>,
    /// A pod not Running after this is given up on (reason `Timeout`).
    pub ready_timeout: Duration,
    /// Once every pod has settled, keep running this long (restarts and back-offs play
    /// out).
    pub hold: Option<Duration>,
    /// Remove the pods before returning.
    pub cleanup: bool,
}

/// How the run went.
pub struct ReadyRun {
    /// Every pod's outcome, by name.
    pub outcomes: Vec<PodOutcome>,
    pub manifest_errors: Vec<ManifestError>,
    /// The cleanup gave up: this many pods were still terminating, with no progress for
    /// this long.
    pub cleanup_stalled: Option<(usize, Duration)>,
}

/// Told of the run's progress as it happens (for a progress bar and lines as pods settle).
pub trait ReadyWatch {
    /// A manifest that could not be read into a pod (the others still run).
    fn manifest_error(&mut self, _error: &ManifestError) {}
    /// How many pods the run creates.
    fn pods(&mut self, _count: usize) {}
    /// What the run is doing now: creating, holding, cleaning up.
    fn doing(&mut self, _what: &str) {}
    /// A pod settled (or was given up on).
    fn settled(&mut self, _outcome: &PodOutcome) {}
}

impl Started {
    /// Creates the manifests' pods and follows them until each settles.
    pub async fn until_ready(
        &self,
        opts: &ReadyOptions,
        watch: &mut dyn ReadyWatch,
    ) -> Result<ReadyRun, AgentError> {
        let (pods, manifest_errors) = load_paths(&opts.manifests, &self.node);
        for e in &manifest_errors {
            watch.manifest_error(e);
        }
        if pods.is_empty() {
            return Err(AgentError::NoPods(opts.manifests.clone()));
        }
        let pods: Vec<Arc<Pod>> = pods.into_iter().map(|p| Arc::new(p.pod)).collect();
        let uids: BTreeSet<String> = pods
            .iter()
            .map(|p| labels::pod_uid(p).to_string())
            .collect();
        let mut changes = self.store.subscribe();
        self.send(PodUpdate::Add(pods.clone())).await?;
        watch.pods(uids.len());
        watch.doing("creating");
        let done = settle(&self.store, &uids, &mut changes, opts.ready_timeout, watch).await;
        if let Some(hold) = opts.hold {
            watch.doing(&format!("holding for {hold:?}"));
            tokio::time::sleep(hold).await;
        }
        let mut cleanup_stalled = None;
        if opts.cleanup {
            watch.doing("cleaning up");
            self.send(PodUpdate::Remove(pods.clone())).await?;
            cleanup_stalled = removed(&self.store, &uids, &mut changes, &pods).await.err();
        }
        let mut outcomes: Vec<PodOutcome> = done.into_values().collect();
        outcomes.sort_by(by_name);
        Ok(ReadyRun {
            outcomes,
            manifest_errors,
            cleanup_stalled,
        })
    }
}

/// Follows the pods until each settles or `timeout` is up; gives each one's outcome.
async fn settle(
    store: &Arc<StatusStore>,
    uids: &BTreeSet<String>,
    changes: &mut tokio::sync::watch::Receiver<u64>,
    timeout: Duration,
    watch: &mut dyn ReadyWatch,
) -> BTreeMap<String, PodOutcome> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut done: BTreeMap<String, PodOutcome> = BTreeMap::new();
    loop {
        // Looked at in place after every change: with hundreds of pods starting, copying
        // each pod's record every time cost the node more CPU than the pods' own syncs.
        let mut settled_now: Vec<(String, PodOutcome)> = Vec::new();
        store.for_each(|rec| {
            if uids.contains(&rec.uid)
                && !done.contains_key(&rec.uid)
                && let Some(outcome) = settled(rec)
            {
                settled_now.push((rec.uid.clone(), outcome));
            }
        });
        settled_now.sort_by(|(_, a), (_, b)| by_name(a, b));
        for (uid, outcome) in settled_now {
            watch.settled(&outcome);
            done.insert(uid, outcome);
        }
        if done.len() == uids.len() {
            return done;
        }
        tokio::select! {
            _ = changes.changed() => {}
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    let mut late: Vec<(String, PodOutcome)> = Vec::new();
    store.for_each(|rec| {
        if uids.contains(&rec.uid) && !done.contains_key(&rec.uid) {
            late.push((rec.uid.clone(), outcome_of(rec)));
        }
    });
    late.sort_by(|(_, a), (_, b)| by_name(a, b));
    for (uid, mut o) in late {
        o.reason.get_or_insert_with(|| "Timeout".into());
        o.message
            .get_or_insert_with(|| format!("not Running after {}s", timeout.as_secs()));
        watch.settled(&o);
        done.insert(uid, o);
    }
    done
}

/// Waits until the store holds none of `uids` (the pods were removed). Gives up on a
/// runtime that made no progress: how many pods were left, and for how long nothing
/// changed.
async fn removed(
    store: &Arc<StatusStore>,
    uids: &BTreeSet<String>,
    changes: &mut tokio::sync::watch::Receiver<u64>,
    pods: &[Arc<Pod>],
) -> Result<(), (usize, Duration)> {
    let grace = pods
        .iter()
        .filter_map(|p| p.spec.as_ref()?.termination_grace_period_seconds)
        .max()
        .unwrap_or(30);
    // The runtime tears pods down at its own pace (a CNI DEL each, serialized on the
    // node's iptables lock), which on a loaded or emulated node is many times a quiet
    // one's, and a status may not change for the whole of a slow StopPodSandbox. So
    // the wait goes on while the pods make progress, and gives up only once nothing
    // about them changed for the grace period and two minutes more: a hung runtime's
    // bound, not a guess of its speed.
    let stall = Duration::from_secs(grace as u64 + 120);
    let mut limit = tokio::time::Instant::now() + stall;
    loop {
        let mut left = 0;
        store.for_each(|r| left += usize::from(uids.contains(&r.uid)));
        if left == 0 {
            return Ok(());
        }
        tokio::select! {
            _ = changes.changed() => limit = tokio::time::Instant::now() + stall,
            _ = tokio::time::sleep_until(limit) => return Err((left, stall)),
        }
    }
}
