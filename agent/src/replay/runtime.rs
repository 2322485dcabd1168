//! The replay runtime: the same CRI traits as the real client, answered from a recording.
//! Calls that change state are matched by what they are for (method, pod UID, container,
//! attempt, image), never by global order, and answer with the recorded outcome after the
//! recorded duration in virtual time. Calls that only read state are answered from a
//! simulated runtime that those outcomes (and the recorded container exits) drive. A call
//! the recording cannot answer is a divergence.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use foldhash::fast::FixedState;
use serde::Serialize;

use podtrace_core::record::CriMethod;

use crate::clock::{instant_at, mono_now, wall_now};
use crate::cri::fake::objects::{Container, Objects, Sandbox};
use crate::cri::service::CriResult;
use crate::cri::{CriCall, CriError, ImageService, RuntimeService, api, tonic_code};

/// What the recording could not answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Divergence {
    /// Virtual monotonic time of the call.
    pub at_ns: u64,
    pub method: CriMethod,
    pub pod_uid: String,
    pub container: String,
    pub attempt: u32,
    pub image: String,
    pub why: String,
}

/// A matchable call: what it is for. Keys are only looked up, never listed, so they
/// are hashed: a lookup among every recorded call costs one hash, not a tree's string
/// comparisons.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    pod_uid: String,
    method: CriMethod,
    container: String,
    attempt: u32,
    image: String,
}

impl Key {
    fn of(c: &CriCall) -> Key {
        Key {
            pod_uid: c.pod_uid.clone(),
            method: c.method,
            container: c.container.clone(),
            attempt: c.attempt,
            // Only pulls are told apart by image.
            image: if c.method == CriMethod::PullImage {
                c.image.clone()
            } else {
                String::new()
            },
        }
    }
}

/// Facts the recording holds about objects, found before replay starts.
#[derive(Debug, Default)]
struct Facts {
    sandbox_ip: BTreeMap<String, String>,
    runs: BTreeMap<String, (i64, i32)>,
    images_present: BTreeSet<String>,
    network_ready: (bool, String),
    runtime: (String, String),
    /// Median recorded duration of each read-only method: reads take time too, and the
    /// reconciler makes several per sync.
    read_ns: BTreeMap<CriMethod, u64>,
}

#[derive(Debug, Default)]
struct State {
    pending: HashMap<Key, VecDeque<CriCall>, FixedState>,
    last_exec: BTreeMap<(String, String), CriCall>,
    facts: Facts,
    objects: Objects,
    images: BTreeSet<String>,
    served: Vec<CriCall>,
    divergences: Vec<Divergence>,
}

/// A recording, served as a container runtime.
#[derive(Clone)]
pub struct ReplayRuntime {
    state: Arc<Mutex<State>>,
    /// Latency factor per CRI method (what-if): 0.5 makes a call twice as fast.
    scale: Arc<BTreeMap<CriMethod, f64>>,
}

impl ReplayRuntime {
    /// Builds the runtime from a run's CRI calls, in recorded order.
    pub fn new(
        calls: &[&CriCall],
        runtime_name: &str,
        runtime_version: &str,
        scale: BTreeMap<CriMethod, f64>,
    ) -> ReplayRuntime {
        let mut st = State::default();
        // Sized up front: grown by doubling, the index rehashed every key several times
        // over a long trace.
        let mutations = calls.iter().filter(|c| c.method.mutates()).count();
        st.pending = HashMap::with_capacity_and_hasher(mutations, FixedState::default());
        st.served = Vec::with_capacity(mutations);
        st.facts.runtime = (runtime_name.to_string(), runtime_version.to_string());
        st.facts.network_ready = (true, String::new());
        let mut network_seen = false;
        let mut started: BTreeMap<String, u64> = BTreeMap::new();
        let mut stopped: BTreeSet<String> = BTreeSet::new();
        let mut image_seen: BTreeSet<String> = BTreeSet::new();
        for c in calls {
            match c.method {
                CriMethod::Status if !network_seen => {
                    network_seen = true;
                    let ready = c.response.get("NetworkReady").is_none_or(|v| v == "true");
                    let message = c.response.get("NetworkReady_message").unwrap_or(&c.message);
                    st.facts.network_ready = (ready, message.clone());
                }
                CriMethod::PodSandboxStatus => {
                    if let Some(ip) = c.response.get("ip").filter(|ip| !ip.is_empty()) {
                        st.facts
                            .sandbox_ip
                            .entry(c.sandbox_id.clone())
                            .or_insert_with(|| ip.clone());
                    }
                }
                CriMethod::StartContainer if c.ok() => {
                    started.insert(c.container_id.clone(), c.end_ns);
                }
                CriMethod::StopContainer => {
                    stopped.insert(c.container_id.clone());
                }
                CriMethod::ContainerStatus => {
                    let exited = c.response.get("state").is_some_and(|s| s == "2");
                    if exited
                        && !stopped.contains(&c.container_id)
                        && !st.facts.runs.contains_key(&c.container_id)
                        && let Some(start) = started.get(&c.container_id)
                    {
                        let code = c
                            .response
                            .get("exit_code")
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                        let ran = c.start_ns.saturating_sub(*start) as i64;
                        st.facts.runs.insert(c.container_id.clone(), (ran, code));
                    }
                }
                // The first look at an image tells whether the node had it before the run.
                CriMethod::ImageStatus if image_seen.insert(c.image.clone()) => {
                    let present = c.response.get("present").is_some_and(|p| p == "true");
                    if present {
                        st.facts.images_present.insert(c.image.clone());
                    }
                }
                CriMethod::PullImage => {
                    image_seen.insert(c.image.clone());
                }
                _ => {}
            }
            if c.method.mutates() {
                // Most keys have one call: no room for more until a second comes.
                st.pending
                    .entry(Key::of(c))
                    .or_insert_with(|| VecDeque::with_capacity(1))
                    .push_back((*c).clone());
            }
        }
        let mut reads: BTreeMap<CriMethod, Vec<u64>> = BTreeMap::new();
        for c in calls.iter().filter(|c| c.is_observation()) {
            reads
                .entry(c.method)
                .or_default()
                .push(c.end_ns.saturating_sub(c.start_ns));
        }
        st.facts.read_ns = reads
            .into_iter()
            .map(|(m, mut v)| {
                v.sort_unstable();
                (m, v[v.len() / 2])
            })
            .collect();
        st.images = st.facts.images_present.clone();
        ReplayRuntime {
            state: Arc::new(Mutex::new(st)),
            scale: Arc::new(scale),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the calls served so far, with virtual times, and what could not be answered.
    pub fn take_results(&self) -> (Vec<CriCall>, Vec<Divergence>) {
        let mut st = self.lock();
        (
            std::mem::take(&mut st.served),
            std::mem::take(&mut st.divergences),
        )
    }

    /// Takes the recorded answer for `key`, or records a divergence.
    fn take(&self, key: &Key) -> Result<CriCall, CriError> {
        let mut st = self.lock();
        if let Some(c) = st.pending.get_mut(key).and_then(|q| q.pop_front()) {
            if key.method == CriMethod::ExecSync {
                st.last_exec
                    .insert((key.pod_uid.clone(), key.container.clone()), c.clone());
            }
            return Ok(c);
        }
        // Probes run on a period, so their count depends on how long a container lived;
        // past the recorded ones, an exec answers as the last one did.
        if key.method == CriMethod::ExecSync
            && let Some(c) = st
                .last_exec
                .get(&(key.pod_uid.clone(), key.container.clone()))
        {
            return Ok(c.clone());
        }
        let why = format!(
            "the recording has no {} for pod {} {}attempt {}{}",
            key.method,
            key.pod_uid,
            if key.container.is_empty() {
                String::new()
            } else {
                format!("container {} ", key.container)
            },
            key.attempt,
            if key.image.is_empty() {
                String::new()
            } else {
                format!(" image {}", key.image)
            },
        );
        st.divergences.push(Divergence {
            at_ns: mono_now(),
            method: key.method,
            pod_uid: key.pod_uid.clone(),
            container: key.container.clone(),
            attempt: key.attempt,
            image: key.image.clone(),
            why: why.clone(),
        });
        Err(CriError::Call {
            method: "Replay",
            code: tonic::Code::Unknown,
            message: format!("replay divergence: {why}"),
        })
    }

    /// Waits the recorded duration (scaled) and returns the recorded outcome.
    async fn answer(&self, key: Key, fill: impl FnOnce(&mut CriCall)) -> Result<CriCall, CriError> {
        let rec = self.take(&key)?;
        let factor = self.scale.get(&key.method).copied().unwrap_or(1.0);
        let took = (rec.end_ns.saturating_sub(rec.start_ns) as f64 * factor) as u64;
        let start = mono_now();
        tokio::time::sleep(Duration::from_nanos(took)).await;
        let mut served = rec.clone();
        served.start_ns = start;
        served.end_ns = mono_now();
        fill(&mut served);
        self.lock().served.push(served);
        if rec.ok() {
            Ok(rec)
        } else {
            Err(CriError::Call {
                method: "Replay",
                code: tonic_code(rec.code),
                message: rec.message.clone(),
            })
        }
    }

    /// A read takes its method's typical recorded time.
    async fn read_delay(&self, method: CriMethod) {
        let base = self.lock().facts.read_ns.get(&method).copied().unwrap_or(0);
        let factor = self.scale.get(&method).copied().unwrap_or(1.0);
        tokio::time::sleep(Duration::from_nanos((base as f64 * factor) as u64)).await;
    }

    fn ids_for_sandbox(&self, id: &str) -> (String, u32) {
        self.lock()
            .objects
            .sandbox(id)
            .map(|s| (s.uid.clone(), s.attempt))
            .unwrap_or_default()
    }

    fn ids_for_container(&self, id: &str) -> (String, String, u32) {
        self.lock()
            .objects
            .container(id)
            .map(|c| {
                let meta = c.config.metadata.as_ref();
                (
                    c.uid.clone(),
                    meta.map(|m| m.name.clone()).unwrap_or_default(),
                    meta.map_or(0, |m| m.attempt),
                )
            })
            .unwrap_or_default()
    }

    /// Moves containers whose recorded run has ended to Exited.
    fn advance(st: &mut State) {
        st.objects.advance(wall_now());
    }
}

fn key(method: CriMethod, pod_uid: &str, container: &str, attempt: u32) -> Key {
    Key {
        method,
        pod_uid: pod_uid.into(),
        container: container.into(),
        attempt,
        image: String::new(),
    }
}

impl RuntimeService for ReplayRuntime {
    async fn version(&self) -> CriResult<api::VersionResponse> {
        self.read_delay(CriMethod::Version).await;
        let (name, version) = self.lock().facts.runtime.clone();
        Ok(api::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: name,
            runtime_version: version,
            runtime_api_version: "v1".into(),
        })
    }

    async fn status(&self, _verbose: bool) -> CriResult<api::StatusResponse> {
        self.read_delay(CriMethod::Status).await;
        let (ready, message) = self.lock().facts.network_ready.clone();
        let cond = |t: &str, status: bool| api::RuntimeCondition {
            r#type: t.into(),
            status,
            reason: if status {
                String::new()
            } else {
                "NetworkPluginNotReady".into()
            },
            message: if status {
                String::new()
            } else {
                message.clone()
            },
        };
        Ok(api::StatusResponse {
            status: Some(api::RuntimeStatus {
                conditions: vec![cond("RuntimeReady", true), cond("NetworkReady", ready)],
            }),
            ..Default::default()
        })
    }

    async fn run_pod_sandbox(
        &self,
        req: api::RunPodSandboxRequest,
    ) -> CriResult<api::RunPodSandboxResponse> {
        let config = req.config.unwrap_or_default();
        let meta = config.metadata.clone().unwrap_or_default();
        let rec = self
            .answer(
                key(CriMethod::RunPodSandbox, &meta.uid, "", meta.attempt),
                |_| {},
            )
            .await?;
        let mut st = self.lock();
        let ip = st
            .facts
            .sandbox_ip
            .get(&rec.sandbox_id)
            .cloned()
            .unwrap_or_default();
        st.objects.add_sandbox(
            rec.sandbox_id.clone(),
            Sandbox {
                uid: meta.uid,
                attempt: meta.attempt,
                config,
                ready: true,
                ip,
                created_at: wall_now(),
            },
        );
        Ok(api::RunPodSandboxResponse {
            pod_sandbox_id: rec.sandbox_id,
        })
    }

    async fn stop_pod_sandbox(&self, id: &str) -> CriResult<()> {
        let (uid, attempt) = self.ids_for_sandbox(id);
        self.answer(key(CriMethod::StopPodSandbox, &uid, "", attempt), |_| {})
            .await?;
        let mut st = self.lock();
        Self::advance(&mut st);
        st.objects.stop_sandbox(id, wall_now());
        Ok(())
    }

    async fn remove_pod_sandbox(&self, id: &str) -> CriResult<()> {
        let (uid, attempt) = self.ids_for_sandbox(id);
        self.answer(key(CriMethod::RemovePodSandbox, &uid, "", attempt), |_| {})
            .await?;
        let mut st = self.lock();
        st.objects.remove_sandbox(id);
        Ok(())
    }

    async fn pod_sandbox_status(&self, id: &str) -> CriResult<api::PodSandboxStatusResponse> {
        self.read_delay(CriMethod::PodSandboxStatus).await;
        let st = self.lock();
        let Some(sb) = st.objects.sandbox(id) else {
            return Err(CriError::Call {
                method: CriMethod::PodSandboxStatus.as_str(),
                code: tonic::Code::NotFound,
                message: format!("sandbox {id} not found"),
            });
        };
        Ok(api::PodSandboxStatusResponse {
            status: Some(sb.status(id)),
            ..Default::default()
        })
    }

    async fn list_pod_sandbox(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> CriResult<Vec<api::PodSandbox>> {
        self.read_delay(CriMethod::ListPodSandbox).await;
        let want = filter.map(|f| f.label_selector).unwrap_or_default();
        let st = self.lock();
        Ok(st
            .objects
            .sandboxes_matching(&want)
            .map(|(id, sb)| sb.listed(id))
            .collect())
    }

    async fn create_container(&self, req: api::CreateContainerRequest) -> CriResult<String> {
        let config = req.config.unwrap_or_default();
        let meta = config.metadata.clone().unwrap_or_default();
        let (uid, _) = self.ids_for_sandbox(&req.pod_sandbox_id);
        let rec = self
            .answer(
                key(CriMethod::CreateContainer, &uid, &meta.name, meta.attempt),
                |_| {},
            )
            .await?;
        let mut st = self.lock();
        let runs_for = st.facts.runs.get(&rec.container_id).copied();
        st.objects.add_container(
            rec.container_id.clone(),
            Container {
                uid,
                sandbox_id: req.pod_sandbox_id,
                image_ref: config
                    .image
                    .as_ref()
                    .map(|i| i.image.clone())
                    .unwrap_or_default(),
                config,
                state: api::ContainerState::ContainerCreated,
                created_at: wall_now(),
                started_at: 0,
                finished_at: 0,
                exit_code: 0,
                reason: String::new(),
                runs_for,
                exited: tokio::sync::watch::Sender::new(false),
            },
        );
        Ok(rec.container_id)
    }

    async fn start_container(&self, id: &str) -> CriResult<()> {
        let (uid, name, attempt) = self.ids_for_container(id);
        self.answer(key(CriMethod::StartContainer, &uid, &name, attempt), |_| {})
            .await?;
        self.lock().objects.start_container(id, wall_now());
        Ok(())
    }

    async fn stop_container(&self, id: &str, _timeout: i64) -> CriResult<()> {
        let (uid, name, attempt) = self.ids_for_container(id);
        self.answer(key(CriMethod::StopContainer, &uid, &name, attempt), |_| {})
            .await?;
        let mut st = self.lock();
        Self::advance(&mut st);
        st.objects.stop_container(id, wall_now(), 137, "Error");
        Ok(())
    }

    async fn update_container_resources(
        &self,
        id: &str,
        _linux: api::LinuxContainerResources,
    ) -> CriResult<()> {
        let (uid, name, attempt) = self.ids_for_container(id);
        self.answer(
            key(CriMethod::UpdateContainerResources, &uid, &name, attempt),
            |_| {},
        )
        .await
        .map(|_| ())
    }

    async fn remove_container(&self, id: &str) -> CriResult<()> {
        let (uid, name, attempt) = self.ids_for_container(id);
        self.answer(
            key(CriMethod::RemoveContainer, &uid, &name, attempt),
            |_| {},
        )
        .await?;
        self.lock().objects.remove_container(id);
        Ok(())
    }

    async fn list_containers(
        &self,
        filter: Option<api::ContainerFilter>,
    ) -> CriResult<Vec<api::Container>> {
        self.read_delay(CriMethod::ListContainers).await;
        let want = filter.map(|f| f.label_selector).unwrap_or_default();
        let mut st = self.lock();
        Self::advance(&mut st);
        Ok(st
            .objects
            .containers_matching(&want)
            .map(|(id, c)| api::Container {
                id: id.clone(),
                pod_sandbox_id: c.sandbox_id.clone(),
                metadata: c.config.metadata.clone(),
                image: c.config.image.clone(),
                image_ref: c.image_ref.clone(),
                image_id: c.image_ref.clone(),
                state: c.state as i32,
                created_at: c.created_at,
                labels: c.config.labels.clone(),
                annotations: c.config.annotations.clone(),
            })
            .collect())
    }

    /// The same containers as `list_containers`, after the same read time, visited where
    /// they are held: nothing is copied.
    async fn visit_container_states<F>(
        &self,
        filter: Option<api::ContainerFilter>,
        label: &str,
        mut visit: F,
    ) -> CriResult<()>
    where
        F: FnMut(&str, &str, i32) + Send,
    {
        self.read_delay(CriMethod::ListContainers).await;
        let want = filter.map(|f| f.label_selector).unwrap_or_default();
        let mut st = self.lock();
        Self::advance(&mut st);
        for (id, c) in st.objects.containers_matching(&want) {
            let value = c.config.labels.get(label).map_or("", String::as_str);
            visit(id, value, c.state as i32);
        }
        Ok(())
    }

    async fn container_status(
        &self,
        id: &str,
        _verbose: bool,
    ) -> CriResult<api::ContainerStatusResponse> {
        self.read_delay(CriMethod::ContainerStatus).await;
        let mut st = self.lock();
        Self::advance(&mut st);
        let Some(c) = st.objects.container(id) else {
            return Err(CriError::Call {
                method: CriMethod::ContainerStatus.as_str(),
                code: tonic::Code::NotFound,
                message: format!("container {id} not found"),
            });
        };
        Ok(api::ContainerStatusResponse {
            status: Some(api::ContainerStatus {
                id: id.to_string(),
                metadata: c.config.metadata.clone(),
                state: c.state as i32,
                created_at: c.created_at,
                started_at: c.started_at,
                finished_at: c.finished_at,
                exit_code: c.exit_code,
                image: c.config.image.clone(),
                image_ref: c.image_ref.clone(),
                reason: c.reason.clone(),
                labels: c.config.labels.clone(),
                annotations: c.config.annotations.clone(),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    async fn exec_sync(
        &self,
        id: &str,
        _cmd: Vec<String>,
        _timeout: i64,
    ) -> CriResult<api::ExecSyncResponse> {
        let (uid, name, attempt) = self.ids_for_container(id);
        let rec = self
            .answer(key(CriMethod::ExecSync, &uid, &name, attempt), |_| {})
            .await?;
        Ok(api::ExecSyncResponse {
            exit_code: rec
                .response
                .get("exit_code")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            ..Default::default()
        })
    }

    /// Resolves when the container exits: at its recorded exit, or when it is stopped or
    /// removed first. The PLEG waits on this where it would watch a process.
    fn exit_notice(
        &self,
        container_id: &str,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let st = self.lock();
        let c = st.objects.container(container_id)?;
        let mut exited = c.exited.subscribe();
        let at = c.exits_at().map(instant_at);
        Some(async move {
            let stopped = exited.wait_for(|e| *e);
            match at {
                Some(at) => {
                    tokio::select! {
                        biased;
                        _ = stopped => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => {
                    let _ = stopped.await;
                }
            }
        })
    }
}

impl ImageService for ReplayRuntime {
    async fn image_status(&self, image: api::ImageSpec) -> CriResult<Option<api::Image>> {
        self.read_delay(CriMethod::ImageStatus).await;
        let present = self.lock().images.contains(&image.image);
        Ok(present.then(|| api::Image {
            id: format!("replay:{}", image.image),
            ..Default::default()
        }))
    }

    async fn pull_image(
        &self,
        image: api::ImageSpec,
        _auth: Option<api::AuthConfig>,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> CriResult<String> {
        let meta = sandbox_config.and_then(|s| s.metadata).unwrap_or_default();
        let k = Key {
            method: CriMethod::PullImage,
            pod_uid: meta.uid,
            container: String::new(),
            attempt: meta.attempt,
            image: image.image.clone(),
        };
        let rec = self.answer(k, |_| {}).await?;
        self.lock().images.insert(image.image.clone());
        Ok(rec.response.get("image_ref").cloned().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{install_virtual, uninstall_virtual};

    const MS: u64 = 1_000_000;

    fn call(method: &str, start_ms: u64, end_ms: u64) -> CriCall {
        CriCall {
            method: method.parse().expect("a CRI method"),
            pod_uid: "u".into(),
            container: if method.contains("Sandbox") {
                String::new()
            } else {
                "app".into()
            },
            attempt: 0,
            sandbox_id: "s".into(),
            container_id: "c".into(),
            image: String::new(),
            start_ns: start_ms * MS,
            end_ns: end_ms * MS,
            code: crate::cri::GrpcCode::Ok,
            message: String::new(),
            response: crate::cri::ResponseFields::new(),
            traced: false,
        }
    }

    /// A pod whose container started at 1000 ms and was seen exited (code 1) at 3000 ms.
    fn recording() -> Vec<CriCall> {
        let mut exited = call("ContainerStatus", 3000, 3001);
        exited.response = crate::cri::ResponseFields::from_iter([
            ("state".to_string(), "2".to_string()),
            ("exit_code".to_string(), "1".to_string()),
        ]);
        vec![
            call("RunPodSandbox", 0, 100),
            call("CreateContainer", 100, 200),
            call("StartContainer", 200, 1000),
            exited,
            call("StopContainer", 500, 600),
        ]
    }

    /// Runs `f` on a paused current-thread runtime with the virtual clock installed.
    fn in_virtual_time<F: std::future::Future<Output = ()>>(f: impl FnOnce() -> F) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            install_virtual(0, 0);
            f().await;
            uninstall_virtual();
        });
    }

    /// Creates and starts the recorded container; returns its ID.
    async fn start(rt: &ReplayRuntime) -> String {
        let sandbox = rt
            .run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(api::PodSandboxConfig {
                    metadata: Some(api::PodSandboxMetadata {
                        uid: "u".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .pod_sandbox_id;
        let id = rt
            .create_container(api::CreateContainerRequest {
                pod_sandbox_id: sandbox,
                config: Some(api::ContainerConfig {
                    metadata: Some(api::ContainerMetadata {
                        name: "app".into(),
                        attempt: 0,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .unwrap();
        rt.start_container(&id).await.unwrap();
        id
    }

    fn runtime() -> ReplayRuntime {
        let calls = recording();
        let refs: Vec<&CriCall> = calls.iter().collect();
        ReplayRuntime::new(&refs, "containerd", "test", BTreeMap::new())
    }

    #[test]
    fn a_recorded_exit_is_announced_when_the_recording_has_it() {
        in_virtual_time(|| async {
            let rt = runtime();
            let id = start(&rt).await;
            let started = mono_now();
            rt.exit_notice(&id).expect("a replayed container").await;
            assert_eq!(mono_now() - started, 2000 * MS);
            let st = rt
                .container_status(&id, false)
                .await
                .unwrap()
                .status
                .unwrap();
            assert_eq!(st.state, api::ContainerState::ContainerExited as i32);
            assert_eq!(st.exit_code, 1);
        });
    }

    #[test]
    fn visited_states_are_the_listed_containers_reduced() {
        in_virtual_time(|| async {
            let rt = runtime();
            start(&rt).await;
            let label = crate::kuberuntime::labels::POD_UID;
            let full: Vec<(String, String, i32)> = rt
                .list_containers(None)
                .await
                .unwrap()
                .into_iter()
                .map(|c| {
                    (
                        c.id,
                        c.labels.get(label).cloned().unwrap_or_default(),
                        c.state,
                    )
                })
                .collect();
            let mut states = Vec::new();
            rt.visit_container_states(None, label, |id, value, state| {
                states.push((id.to_string(), value.to_string(), state));
            })
            .await
            .unwrap();
            assert_eq!(states, full);
            assert_eq!(states.len(), 1);
            assert_eq!(states[0].2, api::ContainerState::ContainerRunning as i32);
        });
    }

    #[test]
    fn a_stop_is_announced_at_once() {
        in_virtual_time(|| async {
            let rt = runtime();
            let id = start(&rt).await;
            let notice = rt.exit_notice(&id).expect("a replayed container");
            rt.stop_container(&id, 30).await.unwrap();
            let stopped = mono_now();
            notice.await;
            assert_eq!(mono_now(), stopped);
            let st = rt
                .container_status(&id, false)
                .await
                .unwrap()
                .status
                .unwrap();
            assert_eq!(st.exit_code, 137);
        });
    }
}
