//! The fake runtime's image service: ImageStatus answers from the images on the node,
//! PullImage puts the image there (unless a fault fails it).

use super::{FakeCall, FakeRuntime};
use crate::cri::service::CriResult;
use crate::cri::{ImageService, api};

impl ImageService for FakeRuntime {
    async fn image_status(&self, image: api::ImageSpec) -> CriResult<Option<api::Image>> {
        let st = self.enter(FakeCall::ImageStatus {
            image: image.image.clone(),
        })?;
        Ok(st.images.get(&image.image).cloned())
    }

    async fn pull_image(
        &self,
        image: api::ImageSpec,
        _auth: Option<api::AuthConfig>,
        _sandbox_config: Option<api::PodSandboxConfig>,
    ) -> CriResult<String> {
        let mut st = self.enter(FakeCall::PullImage {
            image: image.image.clone(),
        })?;
        if !st.images.contains_key(&image.image) {
            st.add_image(&image.image, None);
        }
        Ok(st.images[&image.image].id.clone())
    }
}
