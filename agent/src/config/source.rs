//! kubelet's file source and pod config: watch manifest files and directories, and turn
//! each change into ADD / UPDATE / REMOVE for the sync loop.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use notify::Watcher;
use tokio::sync::mpsc;

use super::{ManifestError, StaticPod, load_paths};

/// What changed in the desired pods (kubelet's PodUpdate operations).
#[derive(Debug, Clone)]
pub enum PodUpdate {
    Add(Vec<Arc<Pod>>),
    Update(Vec<Arc<Pod>>),
    Remove(Vec<Arc<Pod>>),
    /// Manifests that could not be read this time, with why.
    Invalid(Vec<InvalidManifest>),
    /// Every source has delivered its first snapshot (kubelet's sourcesReady): only now
    /// may housekeeping treat runtime pods missing from the config as orphans.
    SourcesReady,
}

/// A manifest (or one document of it) that could not become a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidManifest {
    /// Where: the file and document.
    pub location: String,
    /// The pod the document names, if it names one.
    pub pod: Option<(String, String)>,
    pub message: String,
}

impl InvalidManifest {
    fn of(e: &ManifestError) -> InvalidManifest {
        InvalidManifest {
            location: e.location(),
            pod: e.pod().cloned(),
            message: e.to_string(),
        }
    }
}

/// kubelet re-reads static pod manifests every 20 s even with inotify; podlapse does the
/// same so a missed notification only delays a change.
pub const RESCAN_PERIOD: Duration = Duration::from_secs(20);

/// Desired pods by UID, diffed against the next snapshot.
#[derive(Debug, Default)]
pub struct PodConfig {
    pods: BTreeMap<String, Arc<Pod>>,
    last_errors: Vec<InvalidManifest>,
}

impl PodConfig {
    /// Turns a fresh snapshot into the updates that take the old one to it. Pods keep the
    /// snapshot's order within each update.
    pub fn apply(&mut self, snapshot: Vec<StaticPod>, errors: &[ManifestError]) -> Vec<PodUpdate> {
        let mut adds = Vec::new();
        let mut updates = Vec::new();
        let mut next = BTreeMap::new();
        for sp in snapshot {
            let uid = sp.pod.metadata.uid.clone().unwrap_or_default();
            let pod = match self.pods.get(&uid) {
                None => {
                    let pod = Arc::new(sp.pod);
                    adds.push(pod.clone());
                    pod
                }
                Some(old) if **old != sp.pod => {
                    let pod = Arc::new(sp.pod);
                    updates.push(pod.clone());
                    pod
                }
                Some(old) => old.clone(),
            };
            next.insert(uid, pod);
        }
        let removes: Vec<Arc<Pod>> = self
            .pods
            .iter()
            .filter(|(uid, _)| !next.contains_key(*uid))
            .map(|(_, p)| p.clone())
            .collect();
        self.pods = next;
        let errors: Vec<InvalidManifest> = errors.iter().map(InvalidManifest::of).collect();
        let mut out = Vec::new();
        // Sent whenever the set changes, including to empty: fixed manifests clear.
        if errors != self.last_errors {
            out.push(PodUpdate::Invalid(errors.clone()));
        }
        self.last_errors = errors;
        if !removes.is_empty() {
            out.push(PodUpdate::Remove(removes));
        }
        if !adds.is_empty() {
            out.push(PodUpdate::Add(adds));
        }
        if !updates.is_empty() {
            out.push(PodUpdate::Update(updates));
        }
        out
    }
}

/// Watches `paths` and sends updates until the receiver is dropped, the first snapshot
/// first. The queue holds as many updates as the sync loop's (each update carries every
/// pod a change touched, so a few per change): a reader that falls behind makes the
/// watcher wait, and the waits are counted where it forwards them to the sync loop.
pub fn watch(
    paths: Vec<PathBuf>,
    node_name: String,
) -> Result<mpsc::Receiver<PodUpdate>, notify::Error> {
    let (tx, rx) = mpsc::channel(crate::queues::Queue::PodUpdates.capacity());
    // File events only say "look again": any number of them is one stored wakeup.
    let kick = Arc::new(tokio::sync::Notify::new());
    let kicker = kick.clone();
    let mut watcher = notify::recommended_watcher(move |_res: notify::Result<notify::Event>| {
        kicker.notify_one();
    })?;
    // A directory that is removed loses its watch: its parent is watched too, so its
    // re-creation is seen, and the directory is watched again after every load.
    let dirs: Vec<PathBuf> = paths.iter().filter(|p| p.is_dir()).cloned().collect();
    for p in &paths {
        // Watch the directory holding a file too, so editors that replace the file are seen.
        let target = if p.is_dir() {
            p.clone()
        } else {
            p.parent()
                .map(|d| d.to_path_buf())
                .unwrap_or_else(|| p.clone())
        };
        watcher.watch(&target, notify::RecursiveMode::NonRecursive)?;
    }
    for d in &dirs {
        if let Some(parent) = d.parent().filter(|p| p.is_dir()) {
            watcher.watch(parent, notify::RecursiveMode::NonRecursive)?;
        }
    }
    let mut config = PodConfig::default();
    tokio::spawn(async move {
        let mut watcher = watcher; // dropping it stops the notifications
        let (pods, errors) = load_paths(&paths, &node_name);
        for u in config
            .apply(pods, &errors)
            .into_iter()
            .chain([PodUpdate::SourcesReady])
        {
            if tx.send(u).await.is_err() {
                return;
            }
        }
        loop {
            tokio::select! {
                () = kick.notified() => {
                    // Coalesce a burst of notifications (an editor's write, rename, chmod):
                    // one taken after this pause stands for all of them.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let _ = tokio::time::timeout(Duration::ZERO, kick.notified()).await;
                }
                _ = tokio::time::sleep(RESCAN_PERIOD) => {}
                () = tx.closed() => return,
            }
            for d in dirs.iter().filter(|d| d.is_dir()) {
                // Adding a watch that exists is a no-op; a re-created directory gets one.
                let _ = watcher.watch(d, notify::RecursiveMode::NonRecursive);
            }
            let (pods, errors) = load_paths(&paths, &node_name);
            for u in config.apply(pods, &errors) {
                if tx.send(u).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PodSource;

    fn sp(uid: &str, image: &str) -> StaticPod {
        let mut pod: Pod = serde_yaml::from_str(&format!(
            "metadata: {{name: p{uid}, uid: '{uid}'}}\nspec: {{containers: [{{name: c, image: {image}}}]}}"
        ))
        .unwrap();
        pod.metadata.uid = Some(uid.into());
        StaticPod {
            pod,
            source: PodSource {
                file: "x.yaml".into(),
                document: 0,
            },
        }
    }

    fn kinds(us: &[PodUpdate]) -> Vec<String> {
        us.iter()
            .map(|u| match u {
                PodUpdate::Add(p) => format!("ADD {}", p.len()),
                PodUpdate::Update(p) => format!("UPDATE {}", p.len()),
                PodUpdate::Remove(p) => format!("REMOVE {}", p.len()),
                PodUpdate::Invalid(e) => format!("INVALID {}", e.len()),
                PodUpdate::SourcesReady => "READY".to_string(),
            })
            .collect()
    }

    #[test]
    fn add_update_remove() {
        let mut c = PodConfig::default();
        assert_eq!(
            kinds(&c.apply(vec![sp("a", "i:1"), sp("b", "i:1")], &[])),
            ["ADD 2"]
        );
        assert!(
            c.apply(vec![sp("a", "i:1"), sp("b", "i:1")], &[])
                .is_empty()
        );
        assert_eq!(
            kinds(&c.apply(vec![sp("a", "i:2")], &[])),
            ["REMOVE 1", "UPDATE 1"]
        );
    }
}
