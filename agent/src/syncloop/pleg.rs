//! The pod lifecycle event generator. Event-driven first: every started container's
//! process is watched through a pidfd, so its exit reaches the pod's worker as soon as the
//! kernel reports it. A periodic relist (kubelet's only mechanism) catches anything the
//! watchers cannot see: containers started before the agent, runtime-side changes.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::Either;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use crate::queues::{self, Queue, QueueStats};

use crate::cri::{RuntimeService, api};
use crate::kubelet::observed_exit::exit_code_of_wait_status;
use crate::kuberuntime::labels;
use crate::kuberuntime::pod_status::container_pid;

use super::KernelSeen;
use super::pidfd_exit::exit_wait_status;

/// How long to wait, after a container's process exits, for the kernel to have its exit
/// status (from its zombie, or once its parent, the runtime's shim, has reaped it).
const REAP_LIMIT: Duration = Duration::from_millis(20);

/// A pod whose containers changed state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlegEvent {
    pub uid: String,
    pub container_id: String,
}

/// How long to wait, after the kernel says a container's process exited, for the runtime
/// to report the container as exited (its shim reaps the process and tells containerd).
/// The runtime takes tens of milliseconds (containerd 1.6's shim runs runc three times
/// before it publishes the exit), so the polls back off from the first to the last step
/// rather than asking every few milliseconds: a few calls per exit, not dozens, while
/// the node is busy restarting containers.
const EXIT_SETTLE_LIMIT: Duration = Duration::from_secs(2);
const EXIT_SETTLE_FIRST: Duration = Duration::from_millis(4);
const EXIT_SETTLE_MAX_STEP: Duration = Duration::from_millis(32);

#[derive(Clone)]
pub struct Pleg {
    tx: queues::Sender<PlegEvent>,
    /// Last relisted state of each container: (pod UID, state).
    seen: Arc<Mutex<BTreeMap<String, (String, i32)>>>,
    /// Told of a container's exit the moment the kernel reports it; the runtime
    /// confirms it later.
    kernel_seen: Option<KernelSeen>,
}

impl Pleg {
    pub fn new(stats: &Arc<QueueStats>) -> (Pleg, mpsc::Receiver<PlegEvent>) {
        let (tx, rx) = queues::channel(Queue::Pleg, stats);
        (
            Pleg {
                tx,
                seen: Arc::new(Mutex::new(BTreeMap::new())),
                kernel_seen: None,
            },
            rx,
        )
    }

    /// Shows every exit a watched process reports through `seen`.
    pub fn set_kernel_seen(&mut self, seen: KernelSeen) {
        self.kernel_seen = Some(seen);
    }

    /// Watches a started container's process and reports its exit. `pid` is its host
    /// pid when the caller already has it; otherwise the runtime is asked. A runtime with
    /// no process to watch (replay) gives notice of the exit itself.
    pub async fn watch_container<R: RuntimeService + Clone + 'static>(
        &self,
        cri: &R,
        uid: &str,
        container_id: &str,
        pid: Option<u32>,
    ) {
        let pid = match pid {
            Some(pid) => Some(pid),
            None => container_pid(cri, container_id).await,
        };
        let event = PlegEvent {
            uid: uid.to_string(),
            container_id: container_id.to_string(),
        };
        // Resolves once the exit is known (and, from the kernel, shown).
        let exited = match (cri.exit_notice(container_id), pid) {
            (Some(notice), _) => Either::Left(notice),
            (None, Some(pid)) => {
                let (shown, exited) = tokio::sync::oneshot::channel::<()>();
                let (seen, event) = (self.kernel_seen.clone(), event.clone());
                crate::event_thread::spawn(async move {
                    if let (Some(code), Some(seen)) = (wait_exit(pid).await, seen) {
                        seen.exit(&event.uid, &event.container_id, code);
                    }
                    let _ = shown.send(());
                });
                Either::Right(async move {
                    let _ = exited.await;
                })
            }
            // Already gone, or no pid: the relist will see it.
            (None, None) => return,
        };
        let (tx, cri) = (self.tx.clone(), cri.clone());
        tokio::spawn(async move {
            exited.await;
            settle(&cri, &event.container_id).await;
            // A watcher runs on its own: it waits for room rather than lose an exit.
            let _ = tx.send(event).await;
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
        let Ok(containers) = cri
            .list_container_states(Some(filter), labels::POD_UID)
            .await
        else {
            return;
        };
        let now: BTreeMap<String, (String, i32)> = containers
            .into_iter()
            .map(|c| (c.id, (c.label, c.state)))
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
        // The relist runs on the loop that drains the queue, so it cannot wait for room:
        // as kubelet's relist, it discards (and counts) what does not fit, and the pod is
        // synced at its next resync.
        for e in changed {
            self.tx.send_or_discard(e);
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

/// A pidfd becomes readable when the process exits; gives the fd back then.
/// The exit code of `pid` once it exits, from its pidfd; `None` when it cannot be
/// watched or its status is not to be had.
async fn wait_exit(pid: u32) -> Option<i32> {
    let fd = pidfd_open(pid).ok()?;
    let fd = wait_readable(fd).await?;
    let status = exit_wait_status(fd.as_fd(), pid, REAP_LIMIT).await?;
    Some(exit_code_of_wait_status(status))
}

async fn wait_readable(fd: OwnedFd) -> Option<OwnedFd> {
    // SAFETY: `fd` is an owned pidfd that stays open for as long as `afd` lives.
    let afd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.ok()?;
    let _ = afd.readable().await;
    Some(afd.into_inner())
}

/// Waits, bounded, until the runtime no longer reports the container as running.
async fn settle<R: RuntimeService>(cri: &R, container_id: &str) {
    let deadline = tokio::time::Instant::now() + EXIT_SETTLE_LIMIT;
    let mut step = EXIT_SETTLE_FIRST;
    while tokio::time::Instant::now() < deadline {
        match cri.container_status(container_id, false).await {
            Ok(r)
                if r.status
                    .as_ref()
                    .is_some_and(|s| s.state == api::ContainerState::ContainerRunning as i32) => {}
            _ => return,
        }
        tokio::time::sleep(step).await;
        step = (step * 2).min(EXIT_SETTLE_MAX_STEP);
    }
}
