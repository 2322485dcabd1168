//! EnsureImageExists: honour the container's pull policy before it is created, with
//! kubelet's image pull back-off (ErrImagePull, then ImagePullBackOff) and the pull
//! limiter (serialized pulls by default).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Container;

use super::event::{EventRecorder, PodEvent, PodWait, WaitKind};
use super::security_context::ImageUser;
use super::{SyncError, SyncReason};
use crate::cri::{ImageService, api};
use crate::kubelet::backoff::{Backoff, image_key};
use crate::kubelet::runtime_pod::Nanos;

/// Pull starts remembered to name the pulls a queued one waited behind: more than can
/// queue on any node (kubelet's max-pods is 110, a pod's pulls are one per container).
const RECENT_PULLS: usize = 1024;

/// kubelet's image puller: one pull at a time by default (serializeImagePulls), or up to
/// a limit in parallel. It knows whose pulls run, so a pull that had to queue can say
/// whose it waited behind.
#[derive(Debug)]
pub struct PullLimiter {
    permits: Option<tokio::sync::Semaphore>,
    max_parallel: Option<usize>,
    pulls: Mutex<PullLog>,
}

/// Pulls the limiter let through: those running and the latest starts, by sequence.
#[derive(Debug, Default)]
struct PullLog {
    next: u64,
    running: BTreeMap<u64, String>,
    recent: VecDeque<(u64, String)>,
}

/// A pull the limiter let through; the next queued one goes when this is dropped.
pub struct PullSlot<'a> {
    _permit: Option<tokio::sync::SemaphorePermit<'a>>,
    limiter: &'a PullLimiter,
    seq: u64,
}

impl Drop for PullSlot<'_> {
    fn drop(&mut self) {
        lock(&self.limiter.pulls).running.remove(&self.seq);
    }
}

/// What a pull that had to queue waited behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    /// `namespace/name` of the pods whose pulls ran before this one got its turn,
    /// in the order they started (a pod pulling twice is named once).
    pub behind: Vec<String>,
    pub waited: std::time::Duration,
}

impl PullLimiter {
    /// `None`: no limit. `Some(1)`: serialized, kubelet's default.
    pub fn new(max_parallel: Option<usize>) -> PullLimiter {
        let max_parallel = max_parallel.map(|n| n.max(1));
        PullLimiter {
            permits: max_parallel.map(tokio::sync::Semaphore::new),
            max_parallel,
            pulls: Mutex::new(PullLog::default()),
        }
    }

    pub fn serialized() -> PullLimiter {
        PullLimiter::new(Some(1))
    }

    /// Waits for `pod`'s turn to pull. The slot is held until the pull ends; `Queued`
    /// says what it waited behind when it had to.
    pub async fn acquire(&self, pod: &str) -> (PullSlot<'_>, Option<Queued>) {
        let (permit, queued) = match &self.permits {
            None => (None, None),
            Some(s) => match s.try_acquire() {
                Ok(p) => (Some(p), None),
                Err(_) => {
                    let began = tokio::time::Instant::now();
                    let (first_seq, running) = {
                        let log = lock(&self.pulls);
                        (log.next, log.running.clone())
                    };
                    let p = s
                        .acquire()
                        .await
                        .expect("the pull semaphore is never closed");
                    let log = lock(&self.pulls);
                    // Those pulling when it queued, then those let through while it waited.
                    let mut behind: Vec<String> = running.into_values().collect();
                    for (seq, who) in &log.recent {
                        if *seq >= first_seq && !behind.contains(who) {
                            behind.push(who.clone());
                        }
                    }
                    (
                        Some(p),
                        Some(Queued {
                            behind,
                            waited: began.elapsed(),
                        }),
                    )
                }
            },
        };
        let mut log = lock(&self.pulls);
        let seq = log.next;
        log.next += 1;
        log.running.insert(seq, pod.to_string());
        log.recent.push_back((seq, pod.to_string()));
        while log.recent.len() > RECENT_PULLS {
            log.recent.pop_front();
        }
        drop(log);
        (
            PullSlot {
                _permit: permit,
                limiter: self,
                seq,
            },
            queued,
        )
    }

    /// What a queued pull waited behind, said once: the limit.
    fn limit_detail(&self) -> String {
        match self.max_parallel {
            Some(1) => "serialized image pulls".to_string(),
            Some(n) => format!("at most {n} image pulls at once"),
            None => String::new(),
        }
    }
}

/// The inputs EnsureImageExists needs beyond the container.
pub struct ImagePullContext<'a> {
    pub pod_uid: &'a str,
    pub sandbox: &'a api::PodSandboxConfig,
    pub auth: Option<api::AuthConfig>,
    pub backoff: &'a Mutex<Backoff>,
    pub limiter: &'a PullLimiter,
    pub now: &'a (dyn Fn() -> Nanos + Send + Sync),
    pub events: &'a dyn EventRecorder,
}

/// The image a container is created from: its reference, and the user it runs as when
/// the runtime's ImageStatus already said (it did unless the image was just pulled).
#[derive(Debug, Clone)]
pub struct EnsuredImage {
    pub image_ref: String,
    pub user: Option<ImageUser>,
}

/// Returns the image to create the container from, pulling when the policy (or the
/// image's absence) says so. A pull in back-off fails with `ImagePullBackOff` and
/// carries the time the back-off ends.
pub async fn ensure_image_exists<I: ImageService>(
    images: &I,
    c: &Container,
    ctx: &ImagePullContext<'_>,
) -> Result<EnsuredImage, SyncError> {
    let image = c.image.clone().unwrap_or_default();
    let who = Some(c.name.clone());
    let spec = api::ImageSpec {
        image: image.clone(),
        ..Default::default()
    };
    let policy = c.image_pull_policy.as_deref().unwrap_or("IfNotPresent");
    if policy != "Always" {
        let present = images
            .image_status(spec.clone())
            .await
            .map_err(|e| SyncError::cri(SyncReason::ImageInspectError, e).for_container(&c.name))?;
        match (present, policy) {
            (Some(img), _) => {
                ctx.events.record(PodEvent::normal(
                    "Pulled",
                    format!("Container image {image:?} already present on machine"),
                    who,
                ));
                return Ok(EnsuredImage {
                    user: Some(ImageUser::of(&img)),
                    image_ref: img.id,
                });
            }
            (None, "Never") => {
                let message =
                    format!("Container image {image:?} is not present with pull policy of Never");
                return Err(
                    SyncError::new(SyncReason::ErrImageNeverPull, message).for_container(&c.name)
                );
            }
            (None, _) => {}
        }
    }
    let key = image_key(ctx.pod_uid, &image);
    let until = lock(ctx.backoff).in_backoff_since_update(&key, (ctx.now)());
    if let Some(until) = until {
        let message = format!("Back-off pulling image {image:?}");
        ctx.events
            .record(PodEvent::normal("BackOff", message.clone(), who));
        let mut e = SyncError::new(SyncReason::ImagePullBackOff, message).for_container(&c.name);
        e.retry_at = Some(until);
        return Err(e);
    }
    let pod = match &ctx.sandbox.metadata {
        Some(m) => format!("{}/{}", m.namespace, m.name),
        None => ctx.pod_uid.to_string(),
    };
    let (_slot, queued) = ctx.limiter.acquire(&pod).await;
    if let Some(q) = queued {
        ctx.events.waited(
            PodWait {
                wait: WaitKind::ImagePuller,
                container: Some(c.name.clone()),
                behind: q.behind,
                detail: ctx.limiter.limit_detail(),
            },
            u64::try_from(q.waited.as_nanos()).unwrap_or(u64::MAX),
        );
    }
    ctx.events.record(PodEvent::normal(
        "Pulling",
        format!("Pulling image {image:?}"),
        who.clone(),
    ));
    let started = std::time::Instant::now();
    // Boxed: the call carries the pod's sandbox config (about 9 KB inline), which would
    // otherwise sit in every pod's sync future for the whole sync (see `sync_pod`).
    match Box::pin(images.pull_image(spec, ctx.auth.clone(), Some(ctx.sandbox.clone()))).await {
        Ok(image_ref) => {
            ctx.events.record(PodEvent::normal(
                "Pulled",
                format!(
                    "Successfully pulled image {image:?} in {:?}",
                    started.elapsed()
                ),
                who,
            ));
            Ok(EnsuredImage {
                image_ref,
                user: None,
            })
        }
        Err(e) => {
            let now = (ctx.now)();
            let mut backoff = lock(ctx.backoff);
            backoff.next(&key, now);
            let mut err = SyncError::new(
                SyncReason::ErrImagePull,
                format!("Failed to pull image {image:?}: {e}"),
            )
            .for_container(&c.name);
            err.retry_at = backoff.until(&key, now);
            Err(err)
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_queued_pull_names_the_pulls_that_went_before_it() {
        let limiter = PullLimiter::serialized();
        let (a, queued) = limiter.acquire("default/a").await;
        assert_eq!(queued, None, "the first pull does not queue");
        // b queues behind a; c queues behind a, then b.
        let b = limiter.acquire("default/b");
        let c = limiter.acquire("default/c");
        tokio::pin!(b, c);
        assert!(futures::poll!(&mut b).is_pending());
        assert!(futures::poll!(&mut c).is_pending());
        drop(a);
        let (b_slot, b_queued) = b.await;
        assert_eq!(b_queued.unwrap().behind, ["default/a"]);
        assert!(futures::poll!(&mut c).is_pending(), "b holds the puller");
        drop(b_slot);
        let (_c_slot, c_queued) = c.await;
        assert_eq!(c_queued.unwrap().behind, ["default/a", "default/b"]);
        assert_eq!(limiter.limit_detail(), "serialized image pulls");
    }

    #[tokio::test]
    async fn without_a_limit_no_pull_queues() {
        let limiter = PullLimiter::new(None);
        let (_a, qa) = limiter.acquire("default/a").await;
        let (_b, qb) = limiter.acquire("default/b").await;
        assert_eq!((qa, qb), (None, None));
        let two = PullLimiter::new(Some(2));
        let (_a, _) = two.acquire("default/a").await;
        let (_b, qb) = two.acquire("default/b").await;
        assert_eq!(qb, None);
        assert_eq!(two.limit_detail(), "at most 2 image pulls at once");
    }
}
