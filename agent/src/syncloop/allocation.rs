//! kubelet's allocation manager in the sync loop: a pod update whose container resources
//! change is allocated only when the node can hold it (`kubelet::resize::admit_resize`).
//! Until then the pod's worker keeps the old allocation, the pod shows PodResizePending,
//! and the resize is tried again whenever a pod leaves or changes.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::cri::{ImageService, RuntimeService};
use crate::kubelet::pod_workers::UpdateType;
use crate::kubelet::resize::{ResizeVerdict, admit_resize, with_allocated_resources};
use crate::kuberuntime::event::{EventRecorder, PodEvent};
use crate::kuberuntime::labels;

use super::Kubelet;
use super::shared::lock;

impl<R: RuntimeService + ImageService + Clone + 'static> Kubelet<R> {
    /// The pod to hand its worker for an update: `desired`, or `desired` with its current
    /// allocation while its resize is pending.
    pub(super) fn allocate(&mut self, desired: Arc<Pod>) -> Arc<Pod> {
        let uid = labels::pod_uid(&desired).to_string();
        let Some(current) = self.pod_manager.get(&uid).cloned() else {
            return desired;
        };
        let others: Vec<&Pod> = self
            .admitted()
            .filter(|(u, _)| *u != uid)
            .map(|(_, p)| p)
            .collect();
        let verdict = admit_resize(
            &desired,
            &current,
            &others,
            &self.shared.settings.allocatable,
        );
        if verdict == ResizeVerdict::Accepted {
            self.shared.store.recorder(&uid).record(PodEvent::normal(
                "ResizeStarted",
                "Pod resize started",
                None,
            ));
        }
        match verdict {
            ResizeVerdict::Unchanged | ResizeVerdict::Accepted => {
                self.pending_resizes.remove(&uid);
                lock(&self.shared.resize_pending).remove(&uid);
                desired
            }
            ResizeVerdict::Pending { reason, message } => {
                let before = lock(&self.shared.resize_pending)
                    .insert(uid.clone(), (reason.clone(), message.clone()));
                if before.as_ref() != Some(&(reason.clone(), message.clone())) {
                    self.shared.store.recorder(&uid).record(PodEvent::warning(
                        format!("Resize{reason}"),
                        message,
                        None,
                    ));
                }
                let allocated = with_allocated_resources(&desired, &current);
                self.pending_resizes.insert(uid, desired);
                Arc::new(allocated)
            }
        }
    }

    /// Tries every pending resize again (a pod left or changed, so room may have freed).
    pub(super) fn retry_pending_resizes(&mut self) {
        let pending: Vec<Arc<Pod>> = self.pending_resizes.values().cloned().collect();
        for desired in pending {
            let uid = labels::pod_uid(&desired).to_string();
            if !self.pod_manager.contains_key(&uid) {
                self.pending_resizes.remove(&uid);
                lock(&self.shared.resize_pending).remove(&uid);
                continue;
            }
            let pod = self.allocate(desired);
            if self.pending_resizes.contains_key(&uid) {
                continue;
            }
            self.pod_manager.insert(uid, pod.clone());
            let work = self.workers.update_pod(UpdateType::Update, pod);
            self.dispatch_opt(work);
        }
    }
}
