//! An in-memory CRI runtime for unit tests of the runtime shell, kubelet's
//! `FakeRuntimeService` and `FakeImageService` in one: sandboxes, containers and images
//! held in memory ([`objects`], the model the replay runtime uses too), a log of every
//! call in order ([`FakeCall`]) and error injection ([`Fault`]). Deterministic: ordered
//! maps, IDs from a counter, no clock of its own (the test sets the time), no randomness,
//! no IO.
//!
//! It shows which calls the shell makes and in what order, and how the shell handles a
//! runtime's failures. It knows nothing of what containerd, runc or CNI do beyond their
//! answers, so it never stands in for a test against a real runtime.

mod calls;
mod entry;
mod faults;
mod images;
pub(crate) mod objects;
mod runtime;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

pub use calls::{FakeCall, Method};
pub use faults::Fault;

use super::api;
use crate::kubelet::runtime_pod::Nanos;
use faults::Armed;
use objects::Objects;

/// Called with each call as it is made, inside the call (so it sees the caller's
/// task-local context, such as the trace context a recording layer sets).
pub type CallObserver = Arc<dyn Fn(&FakeCall) + Send + Sync>;

/// Everything the fake holds.
#[derive(Debug)]
struct State {
    objects: Objects,
    /// Images on the node by the name they were pulled or added as.
    images: BTreeMap<String, api::Image>,
    calls: Vec<FakeCall>,
    faults: Vec<Armed>,
    /// The time the test set: objects are created, started and stopped at it.
    now: Nanos,
    /// The last ID handed out (sandboxes and containers share the counter).
    last_id: u64,
    /// The last pod IP handed out.
    last_ip: u32,
    /// The runtime's NetworkReady condition and its message.
    network: (bool, String),
    /// Containers created from now on with this name exit by themselves this long after
    /// their start, with this code.
    runs: BTreeMap<String, (Nanos, i32)>,
}

/// An in-memory runtime implementing [`RuntimeService`](super::RuntimeService) and
/// [`ImageService`](super::ImageService). Clones share one runtime.
#[derive(Clone)]
pub struct FakeRuntime {
    state: Arc<Mutex<State>>,
    observer: Option<CallObserver>,
}

impl Default for FakeRuntime {
    fn default() -> Self {
        FakeRuntime::new()
    }
}

/// A sandbox as the fake holds it, for a test to look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeSandbox {
    pub id: String,
    pub pod_uid: String,
    pub attempt: u32,
    pub ready: bool,
    pub ip: String,
}

/// A container as the fake holds it, for a test to look at.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeContainer {
    pub id: String,
    pub sandbox_id: String,
    /// The name and attempt from its config's metadata.
    pub name: String,
    pub attempt: u32,
    pub state: api::ContainerState,
    pub exit_code: i32,
    /// The resources it was created with, or last updated to.
    pub resources: Option<api::LinuxContainerResources>,
}

impl FakeRuntime {
    /// An empty runtime: no sandboxes, containers or images, the network ready, time 0.
    pub fn new() -> FakeRuntime {
        FakeRuntime {
            state: Arc::new(Mutex::new(State {
                objects: Objects::default(),
                images: BTreeMap::new(),
                calls: Vec::new(),
                faults: Vec::new(),
                now: 0,
                last_id: 0,
                last_ip: 0,
                network: (true, String::new()),
                runs: BTreeMap::new(),
            })),
            observer: None,
        }
    }

    /// The same runtime, calling `observe` with each call as it is made.
    pub fn with_observer(mut self, observe: impl Fn(&FakeCall) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observe));
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every call made so far, in order.
    pub fn calls(&self) -> Vec<FakeCall> {
        self.lock().calls.clone()
    }

    /// Every call made so far, in order, leaving the log empty.
    pub fn take_calls(&self) -> Vec<FakeCall> {
        std::mem::take(&mut self.lock().calls)
    }

    /// Makes the calls `fault` matches fail, from now on. Faults are tried in the order
    /// they were injected; the first that matches a call and fires decides its error.
    pub fn inject(&self, fault: Fault) {
        self.lock().faults.push(Armed { fault, seen: 0 });
    }

    /// Removes every injected fault.
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// The current time, as the test last set it.
    pub fn now(&self) -> Nanos {
        self.lock().now
    }

    /// Moves time to `now`: containers scheduled to exit by then exit (see
    /// [`FakeRuntime::exit_after_start`]). Time never goes back.
    pub fn set_time(&self, now: Nanos) {
        let mut st = self.lock();
        st.now = st.now.max(now);
        let now = st.now;
        st.objects.advance(now);
    }

    /// Containers created from now on with this name exit by themselves `ran` after their
    /// start, with `exit_code`, once time reaches it.
    pub fn exit_after_start(&self, name: &str, ran: Nanos, exit_code: i32) {
        self.lock().runs.insert(name.to_string(), (ran, exit_code));
    }

    /// Puts an image on the node, running as its default user (root).
    pub fn add_image(&self, image: &str) {
        self.lock().add_image(image, None);
    }

    /// Puts an image on the node whose config runs as the user ID `uid`.
    pub fn add_image_as_user(&self, image: &str, uid: i64) {
        self.lock().add_image(image, Some(uid));
    }

    /// True when the image is on the node.
    pub fn has_image(&self, image: &str) -> bool {
        self.lock().images.contains_key(image)
    }

    /// Sets the runtime's NetworkReady condition as Status reports it.
    pub fn set_network_ready(&self, ready: bool, message: &str) {
        self.lock().network = (ready, message.to_string());
    }

    /// Turns a sandbox ready or not ready without a call, as when its pause container
    /// dies; its containers are left as they are.
    pub fn set_sandbox_ready(&self, id: &str, ready: bool) {
        if let Some(sb) = self.lock().objects.sandbox_mut(id) {
            sb.ready = ready;
        }
    }

    /// Changes a sandbox's pod IP (empty: the sandbox has none).
    pub fn set_sandbox_ip(&self, id: &str, ip: &str) {
        if let Some(sb) = self.lock().objects.sandbox_mut(id) {
            sb.ip = ip.to_string();
        }
    }

    /// A running container's process exits by itself with `exit_code`, now.
    pub fn exit_container(&self, id: &str, exit_code: i32) {
        let mut st = self.lock();
        let now = st.now;
        let reason = if exit_code == 0 { "Completed" } else { "Error" };
        st.objects.stop_container(id, now, exit_code, reason);
    }

    /// A sandbox, if the fake has it.
    pub fn sandbox(&self, id: &str) -> Option<FakeSandbox> {
        let st = self.lock();
        let sb = st.objects.sandbox(id)?;
        Some(FakeSandbox {
            id: id.to_string(),
            pod_uid: sb.uid.clone(),
            attempt: sb.attempt,
            ready: sb.ready,
            ip: sb.ip.clone(),
        })
    }

    /// Every sandbox, in ID order.
    pub fn sandboxes(&self) -> Vec<FakeSandbox> {
        let ids: Vec<String> = {
            let st = self.lock();
            let all = Default::default();
            st.objects
                .sandboxes_matching(&all)
                .map(|(id, _)| id.clone())
                .collect()
        };
        ids.iter().filter_map(|id| self.sandbox(id)).collect()
    }

    /// A container, if the fake has it.
    pub fn container(&self, id: &str) -> Option<FakeContainer> {
        let st = self.lock();
        let c = st.objects.container(id)?;
        let meta = c.config.metadata.clone().unwrap_or_default();
        Some(FakeContainer {
            id: id.to_string(),
            sandbox_id: c.sandbox_id.clone(),
            name: meta.name,
            attempt: meta.attempt,
            state: c.state,
            exit_code: c.exit_code,
            resources: c.config.linux.as_ref().and_then(|l| l.resources.clone()),
        })
    }

    /// Every container, in ID order.
    pub fn containers(&self) -> Vec<FakeContainer> {
        let ids: Vec<String> = {
            let st = self.lock();
            let all = Default::default();
            st.objects
                .containers_matching(&all)
                .map(|(id, _)| id.clone())
                .collect()
        };
        ids.iter().filter_map(|id| self.container(id)).collect()
    }
}

impl State {
    fn add_image(&mut self, image: &str, uid: Option<i64>) {
        self.images.insert(
            image.to_string(),
            api::Image {
                id: image_id(image),
                repo_tags: vec![image.to_string()],
                size: 1 << 20,
                uid: uid.map(|value| api::Int64Value { value }),
                spec: Some(api::ImageSpec {
                    image: image.to_string(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
    }

    /// The next ID: `prefix-N`, N counting every object the fake has made.
    fn next_id(&mut self, prefix: &str) -> String {
        self.last_id += 1;
        format!("{prefix}-{}", self.last_id)
    }

    /// The next pod IP from the fake's range, 10.88.0.0/16 (containerd's default).
    fn next_ip(&mut self) -> String {
        self.last_ip += 1;
        format!("10.88.{}.{}", self.last_ip / 254, self.last_ip % 254 + 1)
    }
}

/// A stable image ID for an image name: the same name always has the same ID.
fn image_id(image: &str) -> String {
    // FNV-1a: no randomness, and a different ID for each name a test uses.
    let hash = image.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("sha256:{hash:064x}")
}
