//! The pod lifecycle event generator. Event-driven first: every started container's
//! process is watched through a pidfd, so its exit reaches the pod's worker as soon as the
//! kernel reports it. A periodic relist (kubelet's only mechanism) catches anything the
//! watchers cannot see: containers started before the agent, runtime-side changes.

use std::collections::HashMap;
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

/// A container as a relist saw it.
#[derive(Debug)]
struct Seen {
    uid: String,
    state: i32,
    /// Listed by the relist under way; what is not, by its end, is gone.
    listed: bool,
}

/// Containers by ID, looked up once per listed container in every relist (each second,
/// every container on the node) and never iterated in an order that reaches an output:
/// hashed, with a fixed hasher (the IDs are the runtime's).
type SeenById = HashMap<String, Seen, foldhash::fast::FixedState>;

#[derive(Clone)]
pub struct Pleg {
    tx: queues::Sender<PlegEvent>,
    /// Each container as the last relist saw it, by container ID.
    seen: Arc<Mutex<SeenById>>,
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
                seen: Arc::default(),
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

    /// One relist: compares every podlapse container's state with the last relist and
    /// reports the pods whose containers changed: those that appeared or changed state,
    /// in container ID order, then those that are gone, in container ID order. What the
    /// last relist saw is updated in place, so a container whose state did not change
    /// costs no copy.
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
        // Taken out for the listing (a relist runs on one task at a time), so nothing is
        // locked across it; put back whatever the listing's outcome.
        let mut seen = std::mem::take(&mut *self.lock_seen());
        let mut changed = Vec::new();
        let listed = cri
            .visit_container_states(Some(filter), labels::POD_UID, |id, uid, state| {
                match seen.get_mut(id) {
                    Some(s) => {
                        s.listed = true;
                        if s.state != state {
                            s.state = state;
                            changed.push(PlegEvent::new(uid, id));
                        }
                    }
                    None => {
                        let uid = uid.to_string();
                        changed.push(PlegEvent::new(&uid, id));
                        let s = Seen {
                            uid,
                            state,
                            listed: true,
                        };
                        seen.insert(id.to_string(), s);
                    }
                }
            })
            .await;
        if listed.is_err() {
            // An error comes before any visit: what the last relist saw stands.
            *self.lock_seen() = seen;
            return;
        }
        // A runtime lists in an order of its own, and `seen` has none: events for what
        // changed, then for what is gone, each in container ID order.
        changed.sort_by(|a, b| a.container_id.cmp(&b.container_id));
        let mut gone = Vec::new();
        seen.retain(|id, s| {
            let listed = std::mem::replace(&mut s.listed, false);
            if !listed {
                gone.push(PlegEvent::new(&s.uid, id));
            }
            listed
        });
        gone.sort_by(|a, b| a.container_id.cmp(&b.container_id));
        changed.append(&mut gone);
        *self.lock_seen() = seen;
        // The relist runs on the loop that drains the queue, so it cannot wait for room:
        // as kubelet's relist, it discards (and counts) what does not fit, and the pod is
        // synced at its next resync.
        for e in changed {
            self.tx.send_or_discard(e);
        }
    }

    fn lock_seen(&self) -> std::sync::MutexGuard<'_, SeenById> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl PlegEvent {
    fn new(uid: &str, container_id: &str) -> PlegEvent {
        PlegEvent {
            uid: uid.to_string(),
            container_id: container_id.to_string(),
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
        match cri.container_status_reduced(container_id, false, &[]).await {
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::cri::fake::FakeRuntime;

    const NODE: &str = "n1";

    fn labels(uid: &str, node: &str) -> HashMap<String, String> {
        HashMap::from([
            (labels::POD_UID.to_string(), uid.to_string()),
            (
                labels::MANAGED_BY.to_string(),
                labels::MANAGED_BY_VALUE.to_string(),
            ),
            (labels::NODE.to_string(), node.to_string()),
        ])
    }

    /// A sandbox for `uid` with one started container `name`; returns the container's ID.
    async fn started(cri: &FakeRuntime, uid: &str, name: &str, node: &str) -> String {
        let sandbox = cri
            .run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(api::PodSandboxConfig {
                    metadata: Some(api::PodSandboxMetadata {
                        uid: uid.into(),
                        name: uid.into(),
                        ..Default::default()
                    }),
                    labels: labels(uid, node),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .expect("the fake runs a sandbox")
            .pod_sandbox_id;
        let id = cri
            .create_container(api::CreateContainerRequest {
                pod_sandbox_id: sandbox,
                config: Some(api::ContainerConfig {
                    metadata: Some(api::ContainerMetadata {
                        name: name.into(),
                        attempt: 0,
                    }),
                    labels: labels(uid, node),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .expect("the fake creates a container");
        cri.start_container(&id)
            .await
            .expect("the fake starts a container");
        id
    }

    /// What one relist reports, as (pod UID, container ID).
    async fn relist(
        pleg: &Pleg,
        rx: &mut mpsc::Receiver<PlegEvent>,
        cri: &FakeRuntime,
    ) -> Vec<(String, String)> {
        pleg.relist(cri, NODE).await;
        let mut events = Vec::new();
        while let Ok(e) = rx.try_recv() {
            events.push((e.uid, e.container_id));
        }
        events
    }

    fn event(uid: &str, id: &str) -> (String, String) {
        (uid.to_string(), id.to_string())
    }

    #[tokio::test]
    async fn a_relist_reports_what_appeared_changed_or_went_since_the_last_and_nothing_else() {
        let cri = FakeRuntime::new();
        let (pleg, mut rx) = Pleg::new(&Arc::new(QueueStats::default()));
        let a = started(&cri, "pod-a", "app", NODE).await;
        let b = started(&cri, "pod-b", "app", NODE).await;
        // Another node's container (the runtime is shared) is not this PLEG's.
        started(&cri, "pod-x", "app", "other-node").await;
        let mut first = vec![event("pod-a", &a), event("pod-b", &b)];
        first.sort_by(|x, y| x.1.cmp(&y.1));
        assert_eq!(relist(&pleg, &mut rx, &cri).await, first);
        assert!(
            relist(&pleg, &mut rx, &cri).await.is_empty(),
            "nothing changed, nothing to report"
        );
        cri.exit_container(&b, 1);
        let c = started(&cri, "pod-c", "app", NODE).await;
        assert_eq!(
            relist(&pleg, &mut rx, &cri).await,
            [event("pod-b", &b), event("pod-c", &c)],
            "an exit and a new container, in container ID order"
        );
        cri.remove_container(&a).await.expect("the fake removes");
        cri.exit_container(&c, 0);
        assert_eq!(
            relist(&pleg, &mut rx, &cri).await,
            [event("pod-c", &c), event("pod-a", &a)],
            "changes first, then what is gone"
        );
        assert!(relist(&pleg, &mut rx, &cri).await.is_empty());
    }

    #[tokio::test]
    async fn a_failed_listing_keeps_what_the_last_relist_saw() {
        let cri = FakeRuntime::new();
        let (pleg, mut rx) = Pleg::new(&Arc::new(QueueStats::default()));
        let a = started(&cri, "pod-a", "app", NODE).await;
        assert_eq!(relist(&pleg, &mut rx, &cri).await, [event("pod-a", &a)]);
        cri.inject(crate::cri::fake::Fault::new(
            crate::cri::fake::Method::ListContainers,
            tonic::Code::Unavailable,
            "runtime restarting",
        ));
        assert!(relist(&pleg, &mut rx, &cri).await.is_empty());
        cri.clear_faults();
        // Still seen as running: no event for a container that did not change.
        assert!(relist(&pleg, &mut rx, &cri).await.is_empty());
        cri.exit_container(&a, 0);
        assert_eq!(relist(&pleg, &mut rx, &cri).await, [event("pod-a", &a)]);
    }
}
