//! The pod lifecycle event generator. Event-driven first: every started container's
//! process is watched through a pidfd, so its exit reaches the pod's worker as soon as the
//! kernel reports it. A periodic relist (kubelet's only mechanism) catches anything the
//! watchers cannot see: containers started before the agent, runtime-side changes.

use std::collections::BTreeMap;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use crate::cri::{RuntimeService, api};
use crate::kuberuntime::labels;
use crate::kuberuntime::pod_status::container_pid;

/// A pod whose containers changed state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlegEvent {
    pub uid: String,
    pub container_id: String,
}

/// How long to wait, after the kernel says a container's process exited, for the runtime
/// to report the container as exited (its shim reaps the process and tells containerd).
const EXIT_SETTLE_LIMIT: Duration = Duration::from_secs(2);
const EXIT_SETTLE_POLL: Duration = Duration::from_millis(2);

#[derive(Clone)]
pub struct Pleg {
    tx: mpsc::UnboundedSender<PlegEvent>,
    /// Last relisted state of each container: (pod UID, state).
    seen: Arc<Mutex<BTreeMap<String, (String, i32)>>>,
}

impl Pleg {
    pub fn new() -> (Pleg, mpsc::UnboundedReceiver<PlegEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Pleg {
                tx,
                seen: Arc::new(Mutex::new(BTreeMap::new())),
            },
            rx,
        )
    }

    /// Watches a started container's process and reports its exit.
    pub async fn watch_container<R: RuntimeService + Clone + 'static>(
        &self,
        cri: &R,
        uid: &str,
        container_id: &str,
    ) {
        let Some(pid) = container_pid(cri, container_id).await else {
            return; // already gone, or no pid: the relist will see it
        };
        let (tx, cri) = (self.tx.clone(), cri.clone());
        let event = PlegEvent {
            uid: uid.to_string(),
            container_id: container_id.to_string(),
        };
        tokio::spawn(async move {
            if let Ok(fd) = pidfd_open(pid) {
                wait_readable(fd).await;
            }
            settle(&cri, &event.container_id).await;
            let _ = tx.send(event);
        });
    }

    /// One relist: compares every podtrace container's state with the last relist and
    /// reports the pods whose containers changed.
    pub async fn relist<R: RuntimeService>(&self, cri: &R, node: &str) {
        let filter = api::ContainerFilter {
            label_selector: std::collections::HashMap::from([
                (
                    labels::MANAGED_BY.to_string(),
                    labels::MANAGED_BY_VALUE.to_string(),
                ),
                (labels::NODE.to_string(), node.to_string()),
            ]),
            ..Default::default()
        };
        let Ok(containers) = cri.list_containers(Some(filter)).await else {
            return;
        };
        let now: BTreeMap<String, (String, i32)> = containers
            .into_iter()
            .map(|c| {
                let uid = c.labels.get(labels::POD_UID).cloned().unwrap_or_default();
                (c.id, (uid, c.state))
            })
            .collect();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut changed = Vec::new();
        for (id, (uid, state)) in &now {
            if seen.get(id).is_none_or(|(_, s)| s != state) {
                changed.push(PlegEvent {
                    uid: uid.clone(),
                    container_id: id.clone(),
                });
            }
        }
        for (id, (uid, _)) in seen.iter() {
            if !now.contains_key(id) {
                changed.push(PlegEvent {
                    uid: uid.clone(),
                    container_id: id.clone(),
                });
            }
        }
        *seen = now;
        drop(seen);
        for e in changed {
            let _ = self.tx.send(e);
        }
    }
}

fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A pidfd becomes readable when the process exits.
async fn wait_readable(fd: OwnedFd) {
    // SAFETY: `fd` is an owned pidfd that stays open for as long as `afd` lives.
    if let Ok(afd) = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) } {
        let _ = afd.readable().await;
    }
}

/// Waits, bounded, until the runtime no longer reports the container as running.
async fn settle<R: RuntimeService>(cri: &R, container_id: &str) {
    let deadline = tokio::time::Instant::now() + EXIT_SETTLE_LIMIT;
    while tokio::time::Instant::now() < deadline {
        match cri.container_status(container_id, false).await {
            Ok(r)
                if r.status
                    .as_ref()
                    .is_some_and(|s| s.state == api::ContainerState::ContainerRunning as i32) => {}
            _ => return,
        }
        tokio::time::sleep(EXIT_SETTLE_POLL).await;
    }
}
