//! EnsureImageExists: honour the container's pull policy before it is created, with
//! kubelet's image pull back-off (ErrImagePull, then ImagePullBackOff) and the pull
//! limiter (serialized pulls by default).

use std::sync::Mutex;

use k8s_openapi::api::core::v1::Container;

use super::event::{EventRecorder, PodEvent};
use super::{SyncError, SyncReason};
use crate::cri::{ImageService, api};
use crate::kubelet::backoff::{Backoff, image_key};
use crate::kubelet::runtime_pod::Nanos;

/// kubelet's image puller: one pull at a time by default (serializeImagePulls), or up to
/// a limit in parallel.
#[derive(Debug)]
pub struct PullLimiter {
    permits: Option<tokio::sync::Semaphore>,
}

impl PullLimiter {
    /// `None`: no limit. `Some(1)`: serialized, kubelet's default.
    pub fn new(max_parallel: Option<usize>) -> PullLimiter {
        PullLimiter {
            permits: max_parallel.map(|n| tokio::sync::Semaphore::new(n.max(1))),
        }
    }

    pub fn serialized() -> PullLimiter {
        PullLimiter::new(Some(1))
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

/// Returns the image reference to create the container from, pulling when the policy
/// (or the image's absence) says so. A pull in back-off fails with `ImagePullBackOff`
/// and carries the time the back-off ends.
pub async fn ensure_image_exists<I: ImageService>(
    images: &I,
    c: &Container,
    ctx: &ImagePullContext<'_>,
) -> Result<String, SyncError> {
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
                return Ok(img.id);
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
    let _permit = match &ctx.limiter.permits {
        Some(s) => Some(
            s.acquire()
                .await
                .expect("the pull semaphore is never closed"),
        ),
        None => None,
    };
    ctx.events.record(PodEvent::normal(
        "Pulling",
        format!("Pulling image {image:?}"),
        who.clone(),
    ));
    let started = std::time::Instant::now();
    match images
        .pull_image(spec, ctx.auth.clone(), Some(ctx.sandbox.clone()))
        .await
    {
        Ok(image_ref) => {
            ctx.events.record(PodEvent::normal(
                "Pulled",
                format!(
                    "Successfully pulled image {image:?} in {:?}",
                    started.elapsed()
                ),
                who,
            ));
            Ok(image_ref)
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
