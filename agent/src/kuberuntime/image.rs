//! EnsureImageExists: honour the container's pull policy before it is created.

use k8s_openapi::api::core::v1::Container;

use super::event::{EventRecorder, PodEvent};
use super::{SyncError, SyncReason};
use crate::cri::{ImageService, api};

/// Returns the image reference to create the container from, pulling when the policy
/// (or the image's absence) says so.
pub async fn ensure_image_exists<I: ImageService>(
    images: &I,
    c: &Container,
    sandbox: &api::PodSandboxConfig,
    auth: Option<api::AuthConfig>,
    events: &dyn EventRecorder,
) -> Result<String, SyncError> {
    let who = Some(c.name.clone());
    let image = c.image.clone().unwrap_or_default();
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
                events.record(PodEvent::normal(
                    "Pulled",
                    format!("Container image {image:?} already present on machine"),
                    who,
                ));
                return Ok(img.id);
            }
            (None, "Never") => {
                return Err(SyncError::new(
                    SyncReason::ErrImageNeverPull,
                    format!("Container image {image:?} is not present with pull policy of Never"),
                )
                .for_container(&c.name));
            }
            (None, _) => {}
        }
    }
    events.record(PodEvent::normal(
        "Pulling",
        format!("Pulling image {image:?}"),
        who.clone(),
    ));
    let started = std::time::Instant::now();
    let image_ref = images
        .pull_image(spec, auth, Some(sandbox.clone()))
        .await
        .map_err(|e| {
            SyncError::new(
                SyncReason::ErrImagePull,
                format!("Failed to pull image {image:?}: {e}"),
            )
            .for_container(&c.name)
        })?;
    events.record(PodEvent::normal(
        "Pulled",
        format!(
            "Successfully pulled image {image:?} in {:?}",
            started.elapsed()
        ),
        who,
    ));
    Ok(image_ref)
}
