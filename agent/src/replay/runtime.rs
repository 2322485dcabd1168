//! The replay runtime: the same CRI traits as the real client, answered from a recording.
//! Calls that change state are matched by what they are for (method, pod UID, container,
//! attempt, image), never by global order, and answer with the recorded outcome after the
//! recorded duration in virtual time. Calls that only read state are answered from a
//! simulated runtime that those outcomes (and the recorded container exits) drive. A call
//! the recording cannot answer is a divergence.
//!
//! The recording is read once, into what answering needs: each call that changes state
//! as its outcome and duration ([`Answer`]), found by a key of numbers (the pod UIDs,
//! container names and images of the recording, interned), and what was served is kept
//! as the recorded call's index and the replayed times. No recorded call is copied.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use foldhash::fast::FixedState;
use serde::Serialize;

use podlapse_core::record::{ContainerState, CriMethod, GrpcCode};

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

/// A call the replay served: which recorded call answered it (its index among the
/// recording's CRI calls, in recorded order) and when it ran in virtual time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    pub call: usize,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// The strings of the recording's keys (pod UIDs, container names, images), each held
/// once and named by its number. A name the recording never used has no number, and no
/// recorded call can be for it.
#[derive(Debug, Default)]
struct Names(HashMap<Box<str>, u32, FixedState>);

impl Names {
    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&n) = self.0.get(name) {
            return n;
        }
        let n = self.0.len() as u32;
        self.0.insert(name.into(), n);
        n
    }

    fn get(&self, name: &str) -> Option<u32> {
        self.0.get(name).copied()
    }
}

/// A matchable call: what it is for, by interned name. Keys are only looked up, never
/// listed, so they are hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    pod_uid: u32,
    method: CriMethod,
    container: u32,
    attempt: u32,
    image: u32,
}

/// What a call asks for, by name, before it is matched with the recording.
#[derive(Debug, Clone, Copy)]
struct Want<'a> {
    method: CriMethod,
    pod_uid: &'a str,
    container: &'a str,
    attempt: u32,
    image: &'a str,
}

impl Want<'_> {
    fn key(&self, names: &Names) -> Option<Key> {
        Some(Key {
            pod_uid: names.get(self.pod_uid)?,
            method: self.method,
            container: names.get(self.container)?,
            attempt: self.attempt,
            // Only pulls are told apart by image.
            image: names.get(self.image_matched())?,
        })
    }

    fn image_matched(&self) -> &str {
        if self.method == CriMethod::PullImage {
            self.image
        } else {
            ""
        }
    }
}

/// A recorded call that changed state, as far as answering it needs.
#[derive(Debug)]
struct Answer {
    /// Its index among the recording's CRI calls.
    call: usize,
    took_ns: u64,
    code: GrpcCode,
    message: String,
    /// The sandbox a RunPodSandbox made, the container a CreateContainer made.
    id: String,
    /// The image reference a PullImage answered.
    image_ref: String,
    /// The exit code an ExecSync answered.
    exit_code: i32,
    /// The next recorded call with the same key, answered after this one.
    next: Option<u32>,
}

impl Answer {
    fn of(call: usize, c: &CriCall) -> Answer {
        let id = match c.method {
            CriMethod::RunPodSandbox => c.sandbox_id.clone(),
            CriMethod::CreateContainer => c.container_id.clone(),
            _ => String::new(),
        };
        let image_ref = match c.method {
            CriMethod::PullImage => c.response.image_ref().unwrap_or_default().to_string(),
            _ => String::new(),
        };
        let exit_code = match c.method {
            CriMethod::ExecSync => c.response.exit_code().unwrap_or(0),
            _ => 0,
        };
        Answer {
            call,
            took_ns: c.end_ns.saturating_sub(c.start_ns),
            code: c.code,
            message: c.message.clone(),
            id,
            image_ref,
            exit_code,
            next: None,
        }
    }
}

/// What a matched call answers with.
struct Answered {
    id: String,
    image_ref: String,
    exit_code: i32,
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

/// Below this many recorded calls the two passes over them run one after the other: a
/// thread costs more than it saves.
const PARALLEL_CALLS: usize = 4096;

impl Facts {
    /// What the recording says of its objects and reads, in one pass.
    fn of(calls: &[&CriCall]) -> Facts {
        let mut facts = Facts {
            network_ready: (true, String::new()),
            ..Facts::default()
        };
        let st = &mut facts;
        let mut network_seen = false;
        let mut started: BTreeMap<String, u64> = BTreeMap::new();
        let mut stopped: BTreeSet<String> = BTreeSet::new();
        let mut image_seen: BTreeSet<String> = BTreeSet::new();
        // Each read-only method's recorded durations, for their median.
        let mut reads: BTreeMap<CriMethod, Vec<u64>> = BTreeMap::new();
        for c in calls {
            if c.is_observation() {
                reads
                    .entry(c.method)
                    .or_default()
                    .push(c.end_ns.saturating_sub(c.start_ns));
            }
            match c.method {
                CriMethod::Status if !network_seen => {
                    network_seen = true;
                    let network = c.response.network_ready();
                    let ready = network.is_none_or(|n| n.status);
                    let message = network.and_then(|n| n.message.as_ref());
                    st.network_ready = (ready, message.unwrap_or(&c.message).clone());
                }
                CriMethod::PodSandboxStatus => {
                    if let Some(ip) = c.response.pod_ip()
                        && !st.sandbox_ip.contains_key(&c.sandbox_id)
                    {
                        st.sandbox_ip.insert(c.sandbox_id.clone(), ip.to_string());
                    }
                }
                CriMethod::StartContainer if c.ok() => {
                    started.insert(c.container_id.clone(), c.end_ns);
                }
                CriMethod::StopContainer => {
                    stopped.insert(c.container_id.clone());
                }
                CriMethod::ContainerStatus => {
                    let exited = c.response.container_state() == Some(ContainerState::Exited);
                    if exited
                        && !stopped.contains(&c.container_id)
                        && !st.runs.contains_key(&c.container_id)
                        && let Some(start) = started.get(&c.container_id)
                    {
                        let code = c.response.exit_code().unwrap_or(0);
                        let ran = c.start_ns.saturating_sub(*start) as i64;
                        st.runs.insert(c.container_id.clone(), (ran, code));
                    }
                }
                // The first look at an image tells whether the node had it before the run.
                CriMethod::ImageStatus if image_seen.insert(c.image.clone()) => {
                    let present = c.response.image_present() == Some(true);
                    if present {
                        st.images_present.insert(c.image.clone());
                    }
                }
                CriMethod::PullImage => {
                    image_seen.insert(c.image.clone());
                }
                _ => {}
            }
        }
        st.read_ns = reads
            .into_iter()
            .map(|(m, mut v)| {
                let mid = v.len() / 2;
                (m, *v.select_nth_unstable(mid).1)
            })
            .collect();
        facts
    }
}

/// The recorded calls that change state, as answering needs them.
struct Index {
    names: Names,
    /// In recorded order.
    answers: Vec<Answer>,
    /// Per key, the first of its recorded calls.
    pending: HashMap<Key, u32, FixedState>,
}

impl Index {
    /// Each state-changing call under its key, chained to the next of the same key.
    fn of(calls: &[&CriCall]) -> Index {
        // Sized up front: grown by doubling, the index rehashed every key several times
        // over a long trace.
        let mutations = calls.iter().filter(|c| c.method.mutates()).count();
        let mut ix = Index {
            names: Names::default(),
            answers: Vec::with_capacity(mutations),
            pending: HashMap::with_capacity_and_hasher(mutations, FixedState::default()),
        };
        ix.names.intern("");
        // The last recorded call of each key, for chaining the next one behind it.
        let mut last: HashMap<Key, u32, FixedState> =
            HashMap::with_capacity_and_hasher(mutations, FixedState::default());
        for (i, c) in calls.iter().enumerate() {
            if !c.method.mutates() {
                continue;
            }
            let key = Key {
                pod_uid: ix.names.intern(&c.pod_uid),
                method: c.method,
                container: ix.names.intern(&c.container),
                attempt: c.attempt,
                image: if c.method == CriMethod::PullImage {
                    ix.names.intern(&c.image)
                } else {
                    0
                },
            };
            let n = ix.answers.len() as u32;
            ix.answers.push(Answer::of(i, c));
            match last.insert(key, n) {
                Some(prev) => ix.answers[prev as usize].next = Some(n),
                None => {
                    ix.pending.insert(key, n);
                }
            }
        }
        ix
    }
}

#[derive(Debug, Default)]
struct State {
    names: Names,
    /// Every recorded call that changed state, in recorded order.
    answers: Vec<Answer>,
    /// Per key, the first of its recorded calls not yet answered (the others follow by
    /// [`Answer::next`]).
    pending: HashMap<Key, u32, FixedState>,
    /// Per (pod UID, container), the last exec answered.
    last_exec: HashMap<(u32, u32), u32, FixedState>,
    facts: Facts,
    objects: Objects,
    images: BTreeSet<String>,
    served: Vec<Served>,
    divergences: Vec<Divergence>,
}

impl State {
    /// What a call for `target` asks for, named from the objects the runtime holds.
    fn want<'a>(&'a self, method: CriMethod, target: &Target<'a>) -> Want<'a> {
        match *target {
            Target::Pod {
                uid,
                attempt,
                image,
            } => Want {
                method,
                pod_uid: uid,
                container: "",
                attempt,
                image,
            },
            Target::Sandbox(id) => {
                let sb = self.objects.sandbox(id);
                Want {
                    method,
                    pod_uid: sb.map_or("", |s| s.uid.as_str()),
                    container: "",
                    attempt: sb.map_or(0, |s| s.attempt),
                    image: "",
                }
            }
            Target::Container(id) => {
                let c = self.objects.container(id);
                let meta = c.and_then(|c| c.config.metadata.as_ref());
                Want {
                    method,
                    pod_uid: c.map_or("", |c| c.uid.as_str()),
                    container: meta.map_or("", |m| m.name.as_str()),
                    attempt: meta.map_or(0, |m| m.attempt),
                    image: "",
                }
            }
            Target::NewContainer {
                sandbox,
                name,
                attempt,
            } => Want {
                method,
                pod_uid: self.objects.sandbox(sandbox).map_or("", |s| s.uid.as_str()),
                container: name,
                attempt,
                image: "",
            },
        }
    }

    /// The next recorded call of `key`, or the last exec of its container.
    fn take_key(&mut self, key: Key) -> Option<u32> {
        if let Some(&first) = self.pending.get(&key) {
            match self.answers[first as usize].next {
                Some(next) => self.pending.insert(key, next),
                None => self.pending.remove(&key),
            };
            if key.method == CriMethod::ExecSync {
                self.last_exec.insert((key.pod_uid, key.container), first);
            }
            return Some(first);
        }
        // Probes run on a period, so their count depends on how long a container lived;
        // past the recorded ones, an exec answers as the last one did.
        if key.method == CriMethod::ExecSync {
            return self.last_exec.get(&(key.pod_uid, key.container)).copied();
        }
        None
    }

    /// Records that the recording has nothing for `want`, and the error the call gets.
    fn diverged(&mut self, want: &Want) -> CriError {
        let why = format!(
            "the recording has no {} for pod {} {}attempt {}{}",
            want.method,
            want.pod_uid,
            if want.container.is_empty() {
                String::new()
            } else {
                format!("container {} ", want.container)
            },
            want.attempt,
            if want.image_matched().is_empty() {
                String::new()
            } else {
                format!(" image {}", want.image_matched())
            },
        );
        self.divergences.push(Divergence {
            at_ns: mono_now(),
            method: want.method,
            pod_uid: want.pod_uid.to_string(),
            container: want.container.to_string(),
            attempt: want.attempt,
            image: want.image_matched().to_string(),
            why: why.clone(),
        });
        CriError::Call {
            method: "Replay",
            code: tonic::Code::Unknown,
            message: format!("replay divergence: {why}"),
        }
    }
}

/// What a call that changes state is for.
enum Target<'a> {
    /// A pod-level call, by the pod's UID (and a pull's image).
    Pod {
        uid: &'a str,
        attempt: u32,
        image: &'a str,
    },
    /// A sandbox-level call, by the sandbox's ID.
    Sandbox(&'a str),
    /// A container-level call, by the container's ID.
    Container(&'a str),
    /// CreateContainer: the container's name and attempt, in a sandbox.
    NewContainer {
        sandbox: &'a str,
        name: &'a str,
        attempt: u32,
    },
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
        // Two passes over the recording that need nothing of each other: on a long one,
        // side by side.
        let (facts, index) = if calls.len() < PARALLEL_CALLS {
            (Facts::of(calls), Index::of(calls))
        } else {
            std::thread::scope(|s| {
                let facts = s.spawn(|| Facts::of(calls));
                let index = Index::of(calls);
                let facts = facts
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                (facts, index)
            })
        };
        let mut st = State {
            names: index.names,
            pending: index.pending,
            served: Vec::with_capacity(index.answers.len()),
            answers: index.answers,
            images: facts.images_present.clone(),
            facts,
            ..State::default()
        };
        st.facts.runtime = (runtime_name.to_string(), runtime_version.to_string());
        ReplayRuntime {
            state: Arc::new(Mutex::new(st)),
            scale: Arc::new(scale),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the calls served so far (which recorded call, and the virtual times) and
    /// what could not be answered.
    pub fn take_results(&self) -> (Vec<Served>, Vec<Divergence>) {
        let mut st = self.lock();
        (
            std::mem::take(&mut st.served),
            std::mem::take(&mut st.divergences),
        )
    }

    /// Matches a call with the recording: the recorded answer's index, or a divergence.
    /// An object the runtime does not hold is for pod "" (as a runtime that lost it).
    fn take(&self, method: CriMethod, target: Target) -> Result<u32, CriError> {
        let mut st = self.lock();
        let key = st.want(method, &target).key(&st.names);
        if let Some(n) = key.and_then(|k| st.take_key(k)) {
            return Ok(n);
        }
        // The rare path: the names are copied out of the objects for the divergence.
        let w = st.want(method, &target);
        let (uid, container, image) = (
            w.pod_uid.to_string(),
            w.container.to_string(),
            w.image.to_string(),
        );
        let attempt = w.attempt;
        Err(st.diverged(&Want {
            method,
            pod_uid: &uid,
            container: &container,
            attempt,
            image: &image,
        }))
    }

    /// Waits the recorded duration (scaled) and returns the recorded outcome.
    async fn answer(&self, method: CriMethod, target: Target<'_>) -> Result<Answered, CriError> {
        let n = self.take(method, target)?;
        let factor = self.scale.get(&method).copied().unwrap_or(1.0);
        let took = {
            let st = self.lock();
            (st.answers[n as usize].took_ns as f64 * factor) as u64
        };
        let start = mono_now();
        tokio::time::sleep(Duration::from_nanos(took)).await;
        let mut st = self.lock();
        let end = mono_now();
        let a = &mut st.answers[n as usize];
        let served = Served {
            call: a.call,
            start_ns: start,
            end_ns: end,
        };
        let outcome = if a.code == GrpcCode::Ok {
            Ok(Answered {
                id: std::mem::take(&mut a.id),
                image_ref: std::mem::take(&mut a.image_ref),
                exit_code: a.exit_code,
            })
        } else {
            Err(CriError::Call {
                method: "Replay",
                code: tonic_code(a.code),
                message: a.message.clone(),
            })
        };
        st.served.push(served);
        outcome
    }

    /// A read takes its method's typical recorded time.
    async fn read_delay(&self, method: CriMethod) {
        let base = self.lock().facts.read_ns.get(&method).copied().unwrap_or(0);
        let factor = self.scale.get(&method).copied().unwrap_or(1.0);
        tokio::time::sleep(Duration::from_nanos((base as f64 * factor) as u64)).await;
    }

    fn uid_of_sandbox(&self, id: &str) -> String {
        self.lock()
            .objects
            .sandbox(id)
            .map(|s| s.uid.clone())
            .unwrap_or_default()
    }

    /// PodSandboxStatus after its read time, the status made by `status`.
    async fn sandbox_status(
        &self,
        id: &str,
        status: fn(&Sandbox, &str) -> api::PodSandboxStatus,
    ) -> CriResult<api::PodSandboxStatusResponse> {
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
            status: Some(status(sb, id)),
            ..Default::default()
        })
    }

    /// ContainerStatus after its read time: whole, or (`Some(annotations)`) without the
    /// container's labels and with only the annotations named.
    async fn container_status_of(
        &self,
        id: &str,
        annotations: Option<&[&str]>,
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
        let (labels, annotations) = match annotations {
            None => (c.config.labels.clone(), c.config.annotations.clone()),
            Some(keep) => (
                HashMap::new(),
                c.config
                    .annotations
                    .iter()
                    .filter(|(k, _)| keep.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            ),
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
                labels,
                annotations,
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    /// Moves containers whose recorded run has ended to Exited.
    fn advance(st: &mut State) {
        st.objects.advance(wall_now());
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
        let target = Target::Pod {
            uid: &meta.uid,
            attempt: meta.attempt,
            image: "",
        };
        let rec = self.answer(CriMethod::RunPodSandbox, target).await?;
        let mut st = self.lock();
        let ip = st
            .facts
            .sandbox_ip
            .get(&rec.id)
            .cloned()
            .unwrap_or_default();
        st.objects.add_sandbox(
            rec.id.clone(),
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
            pod_sandbox_id: rec.id,
        })
    }

    async fn stop_pod_sandbox(&self, id: &str) -> CriResult<()> {
        self.answer(CriMethod::StopPodSandbox, Target::Sandbox(id))
            .await?;
        let mut st = self.lock();
        Self::advance(&mut st);
        st.objects.stop_sandbox(id, wall_now());
        Ok(())
    }

    async fn remove_pod_sandbox(&self, id: &str) -> CriResult<()> {
        self.answer(CriMethod::RemovePodSandbox, Target::Sandbox(id))
            .await?;
        let mut st = self.lock();
        st.objects.remove_sandbox(id);
        Ok(())
    }

    async fn pod_sandbox_status(&self, id: &str) -> CriResult<api::PodSandboxStatusResponse> {
        self.sandbox_status(id, Sandbox::status).await
    }

    async fn pod_sandbox_status_reduced(
        &self,
        id: &str,
    ) -> CriResult<api::PodSandboxStatusResponse> {
        self.sandbox_status(id, Sandbox::status_reduced).await
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

    /// The same sandboxes as `list_pod_sandbox`, after the same read time, visited where
    /// they are held.
    async fn visit_pod_sandboxes<F>(
        &self,
        filter: Option<api::PodSandboxFilter>,
        mut visit: F,
    ) -> CriResult<()>
    where
        F: FnMut(&str, u32) + Send,
    {
        self.read_delay(CriMethod::ListPodSandbox).await;
        let want = filter.map(|f| f.label_selector).unwrap_or_default();
        let st = self.lock();
        for (id, sb) in st.objects.sandboxes_matching(&want) {
            visit(id, sb.config.metadata.as_ref().map_or(0, |m| m.attempt));
        }
        Ok(())
    }

    async fn create_container(&self, req: api::CreateContainerRequest) -> CriResult<String> {
        let config = req.config.unwrap_or_default();
        let meta = config.metadata.clone().unwrap_or_default();
        let target = Target::NewContainer {
            sandbox: &req.pod_sandbox_id,
            name: &meta.name,
            attempt: meta.attempt,
        };
        let uid = self.uid_of_sandbox(&req.pod_sandbox_id);
        let rec = self.answer(CriMethod::CreateContainer, target).await?;
        let mut st = self.lock();
        let runs_for = st.facts.runs.get(&rec.id).copied();
        st.objects.add_container(
            rec.id.clone(),
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
        Ok(rec.id)
    }

    async fn start_container(&self, id: &str) -> CriResult<()> {
        self.answer(CriMethod::StartContainer, Target::Container(id))
            .await?;
        self.lock().objects.start_container(id, wall_now());
        Ok(())
    }

    async fn stop_container(&self, id: &str, _timeout: i64) -> CriResult<()> {
        self.answer(CriMethod::StopContainer, Target::Container(id))
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
        self.answer(CriMethod::UpdateContainerResources, Target::Container(id))
            .await
            .map(|_| ())
    }

    async fn remove_container(&self, id: &str) -> CriResult<()> {
        self.answer(CriMethod::RemoveContainer, Target::Container(id))
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
            .map(|(id, c)| c.listed(id))
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
        self.container_status_of(id, None).await
    }

    async fn container_status_reduced(
        &self,
        id: &str,
        _verbose: bool,
        annotations: &'static [&'static str],
    ) -> CriResult<api::ContainerStatusResponse> {
        self.container_status_of(id, Some(annotations)).await
    }

    async fn exec_sync(
        &self,
        id: &str,
        _cmd: Vec<String>,
        _timeout: i64,
    ) -> CriResult<api::ExecSyncResponse> {
        let rec = self
            .answer(CriMethod::ExecSync, Target::Container(id))
            .await?;
        Ok(api::ExecSyncResponse {
            exit_code: rec.exit_code,
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
        let target = Target::Pod {
            uid: &meta.uid,
            attempt: meta.attempt,
            image: &image.image,
        };
        let rec = self.answer(CriMethod::PullImage, target).await?;
        self.lock().images.insert(image.image.clone());
        Ok(rec.image_ref)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{install_virtual, uninstall_virtual};
    use podlapse_core::record::ContainerStatusFields;

    const MS: u64 = 1_000_000;

    fn call(method: &str, start_ms: u64, end_ms: u64) -> CriCall {
        let container = if method.contains("Sandbox") {
            ""
        } else {
            "app"
        };
        CriCall::new(method.parse().expect("a CRI method"))
            .with_pod_uid("u")
            .with_container(container)
            .with_sandbox_id("s")
            .with_container_id("c")
            .with_times(start_ms * MS, end_ms * MS)
            .with_code(crate::cri::GrpcCode::Ok)
    }

    /// A pod whose container started at 1000 ms and was seen exited (code 1) at 3000 ms.
    fn recording() -> Vec<CriCall> {
        let exited = call("ContainerStatus", 3000, 3001).with_response(ContainerStatusFields {
            state: Some(ContainerState::Exited),
            exit_code: Some(1),
            reason: None,
        });
        vec![
            call("RunPodSandbox", 0, 100),
            // A read: lists of sandboxes take 7 ms.
            call("ListPodSandbox", 100, 107),
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
        start_labelled(rt, HashMap::new(), HashMap::new()).await
    }

    /// `start`, the sandbox and the container with these labels and annotations.
    async fn start_labelled(
        rt: &ReplayRuntime,
        labels: HashMap<String, String>,
        annotations: HashMap<String, String>,
    ) -> String {
        let sandbox = rt
            .run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(api::PodSandboxConfig {
                    metadata: Some(api::PodSandboxMetadata {
                        uid: "u".into(),
                        ..Default::default()
                    }),
                    labels: labels.clone(),
                    annotations: annotations.clone(),
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
                    labels,
                    annotations,
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
    fn visited_sandboxes_are_the_listed_sandboxes_reduced_after_the_same_read_time() {
        in_virtual_time(|| async {
            let rt = runtime();
            start(&rt).await;
            let listing = mono_now();
            let full: Vec<(String, u32)> = rt
                .list_pod_sandbox(None)
                .await
                .unwrap()
                .into_iter()
                .map(|sb| (sb.id, sb.metadata.map_or(0, |m| m.attempt)))
                .collect();
            let listed_in = mono_now() - listing;
            let visiting = mono_now();
            let mut visited = Vec::new();
            rt.visit_pod_sandboxes(None, |id, attempt| visited.push((id.to_string(), attempt)))
                .await
                .unwrap();
            assert_eq!(listed_in, 7 * MS);
            assert_eq!(mono_now() - visiting, listed_in);
            assert_eq!(visited, full);
            assert_eq!(visited.len(), 1);
        });
    }

    #[test]
    fn reduced_statuses_are_the_whole_ones_without_labels_and_unnamed_annotations() {
        in_virtual_time(|| async {
            let rt = runtime();
            let pairs = |kv: &[(&str, &str)]| -> HashMap<String, String> {
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            };
            let id = start_labelled(
                &rt,
                pairs(&[("io.kubernetes.pod.uid", "u")]),
                pairs(&[("hash", "h1"), ("other", "x")]),
            )
            .await;
            let whole = rt.container_status(&id, false).await.unwrap();
            let reduced = rt
                .container_status_reduced(&id, false, &["hash"])
                .await
                .unwrap();
            let mut expected = whole.clone();
            let st = expected.status.as_mut().unwrap();
            assert_eq!(st.labels.len(), 1);
            assert_eq!(st.annotations.len(), 2);
            st.labels.clear();
            st.annotations.remove("other");
            assert_eq!(reduced, expected);

            let sandbox = rt.lock().objects.container(&id).unwrap().sandbox_id.clone();
            let whole = rt.pod_sandbox_status(&sandbox).await.unwrap();
            let reduced = rt.pod_sandbox_status_reduced(&sandbox).await.unwrap();
            let mut expected = whole.clone();
            let st = expected.status.as_mut().unwrap();
            assert_eq!((st.labels.len(), st.annotations.len()), (1, 2));
            st.labels.clear();
            st.annotations.clear();
            assert_eq!(reduced, expected);
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
