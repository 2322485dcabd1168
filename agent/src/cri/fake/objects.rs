//! The in-memory runtime's objects, shared by the fake runtime and the replay runtime:
//! sandboxes and containers by ID, indexed by their pod UID label (the selector every
//! per-pod read uses), and the scheduled exits of running containers in time order (a
//! replay's recorded exits), so no call scans every object the runtime has created.
//! Ordered maps throughout: what a list returns comes out in the same order every run.
//! Time is always the caller's: nothing here reads a clock.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tokio::sync::watch;

use crate::cri::api;
use crate::kubelet::labels;
use crate::kubelet::runtime_pod::Nanos;

/// A sandbox as the runtime holds it: the config it was run with and its state.
#[derive(Debug)]
pub(crate) struct Sandbox {
    pub uid: String,
    pub attempt: u32,
    pub config: api::PodSandboxConfig,
    pub ready: bool,
    pub ip: String,
    pub created_at: Nanos,
}

/// A container as the runtime holds it: the config it was created with and its state.
#[derive(Debug)]
pub(crate) struct Container {
    pub uid: String,
    pub sandbox_id: String,
    pub config: api::ContainerConfig,
    pub state: api::ContainerState,
    pub created_at: Nanos,
    pub started_at: Nanos,
    pub finished_at: Nanos,
    pub exit_code: i32,
    pub reason: String,
    pub image_ref: String,
    /// How long it runs after its start before exiting by itself (in a replay: as long
    /// as in the recording), and its exit code.
    pub runs_for: Option<(Nanos, i32)>,
    /// Turns true when the container exits, however it exits (its process, for a watcher).
    pub exited: watch::Sender<bool>,
}

impl Sandbox {
    /// `api::PodSandboxState` as an integer, as CRI carries it.
    pub fn state(&self) -> i32 {
        if self.ready {
            api::PodSandboxState::SandboxReady as i32
        } else {
            api::PodSandboxState::SandboxNotready as i32
        }
    }

    /// As ListPodSandbox lists it.
    pub fn listed(&self, id: &str) -> api::PodSandbox {
        api::PodSandbox {
            id: id.to_string(),
            metadata: self.config.metadata.clone(),
            state: self.state(),
            created_at: self.created_at,
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            runtime_handler: String::new(),
        }
    }

    /// Its CRI status, as PodSandboxStatus answers it.
    pub fn status(&self, id: &str) -> api::PodSandboxStatus {
        api::PodSandboxStatus {
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            ..self.status_reduced(id)
        }
    }

    /// Its CRI status without its labels and annotations.
    pub fn status_reduced(&self, id: &str) -> api::PodSandboxStatus {
        let namespaces = self
            .config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.clone());
        api::PodSandboxStatus {
            id: id.to_string(),
            metadata: self.config.metadata.clone(),
            state: self.state(),
            created_at: self.created_at,
            network: Some(api::PodSandboxNetworkStatus {
                ip: self.ip.clone(),
                additional_ips: vec![],
            }),
            linux: Some(api::LinuxPodSandboxStatus {
                namespaces: Some(api::Namespace {
                    options: namespaces,
                }),
            }),
            ..Default::default()
        }
    }
}

impl Container {
    /// As ListContainers lists it.
    pub fn listed(&self, id: &str) -> api::Container {
        api::Container {
            id: id.to_string(),
            pod_sandbox_id: self.sandbox_id.clone(),
            metadata: self.config.metadata.clone(),
            image: self.config.image.clone(),
            image_ref: self.image_ref.clone(),
            image_id: self.image_ref.clone(),
            state: self.state as i32,
            created_at: self.created_at,
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
        }
    }

    /// When it exits by itself, if it is running and scheduled to.
    pub fn exits_at(&self) -> Option<Nanos> {
        let (ran, _) = self.runs_for?;
        (self.state == api::ContainerState::ContainerRunning).then_some(self.started_at + ran)
    }
}

/// Every object an in-memory runtime holds.
#[derive(Debug, Default)]
pub(crate) struct Objects {
    /// Boxed: a sandbox is about 1.2 KB and a container 1.4 KB (their CRI configs), and a
    /// tree moves the values of a node whenever it inserts or removes one.
    sandboxes: BTreeMap<String, Box<Sandbox>>,
    containers: BTreeMap<String, Box<Container>>,
    /// Pod UID label -> sandbox IDs.
    sandboxes_by_uid: BTreeMap<String, BTreeSet<String>>,
    /// Pod UID label -> container IDs.
    containers_by_uid: BTreeMap<String, BTreeSet<String>>,
    /// (time, container ID) of each running container's scheduled exit.
    exits: BTreeSet<(Nanos, String)>,
}

fn uid_label(labels: &HashMap<String, String>) -> String {
    labels.get(labels::POD_UID).cloned().unwrap_or_default()
}

/// Up to this many labels, an object's are compared one by one rather than looked up.
const LABELS_COMPARED: usize = 8;

fn matches_labels(want: &HashMap<String, String>, have: &HashMap<String, String>) -> bool {
    // An object has a handful of labels, and the relist checks every object against its
    // selector each second: comparing keys (their lengths first) costs less than hashing
    // each wanted key with the map's SipHash.
    if have.len() <= LABELS_COMPARED {
        want.iter()
            .all(|(k, v)| have.iter().any(|(hk, hv)| hk == k && hv == v))
    } else {
        want.iter().all(|(k, v)| have.get(k) == Some(v))
    }
}

/// Objects to look at, by ID, and the selector each must still be checked against, if any.
type Candidates<'a, T> = (
    Box<dyn Iterator<Item = (&'a String, &'a T)> + 'a>,
    Option<&'a HashMap<String, String>>,
);

/// The objects that can match `want`, in ID order: those indexed under its pod UID, or
/// every object (walked where it is held, not looked up again by its ID) without one;
/// and the labels each must still be checked for: none when the UID was all (objects
/// without a UID label are indexed under "", so an empty UID is still checked).
fn candidates<'a, T>(
    want: &'a HashMap<String, String>,
    by_uid: &'a BTreeMap<String, BTreeSet<String>>,
    all: &'a BTreeMap<String, T>,
) -> Candidates<'a, T> {
    match want.get(labels::POD_UID) {
        Some(uid) => (
            Box::new(
                by_uid
                    .get(uid)
                    .into_iter()
                    .flatten()
                    .filter_map(|id| all.get_key_value(id)),
            ),
            (want.len() > 1 || uid.is_empty()).then_some(want),
        ),
        None => (Box::new(all.iter()), (!want.is_empty()).then_some(want)),
    }
}

fn unindex(by_uid: &mut BTreeMap<String, BTreeSet<String>>, uid: &str, id: &str) {
    if let Some(ids) = by_uid.get_mut(uid) {
        ids.remove(id);
        if ids.is_empty() {
            by_uid.remove(uid);
        }
    }
}

impl Objects {
    pub fn sandbox(&self, id: &str) -> Option<&Sandbox> {
        self.sandboxes.get(id).map(|sb| &**sb)
    }

    pub fn container(&self, id: &str) -> Option<&Container> {
        self.containers.get(id).map(|c| &**c)
    }

    /// A sandbox to change in place; its labels stay as they are (they are indexed).
    pub fn sandbox_mut(&mut self, id: &str) -> Option<&mut Sandbox> {
        self.sandboxes.get_mut(id).map(|sb| &mut **sb)
    }

    /// A container to change in place; its labels, state and times stay as they are
    /// (they are indexed, or scheduled from): `start_container` and `stop_container`
    /// change those.
    pub fn container_mut(&mut self, id: &str) -> Option<&mut Container> {
        self.containers.get_mut(id).map(|c| &mut **c)
    }

    pub fn add_sandbox(&mut self, id: String, sb: Sandbox) {
        if let Some(old) = self.sandboxes.remove(&id) {
            unindex(
                &mut self.sandboxes_by_uid,
                &uid_label(&old.config.labels),
                &id,
            );
        }
        self.sandboxes_by_uid
            .entry(uid_label(&sb.config.labels))
            .or_default()
            .insert(id.clone());
        self.sandboxes.insert(id, Box::new(sb));
    }

    pub fn add_container(&mut self, id: String, c: Container) {
        if let Some(old) = self.containers.remove(&id) {
            self.forget_container(&id, &old);
        }
        self.containers_by_uid
            .entry(uid_label(&c.config.labels))
            .or_default()
            .insert(id.clone());
        self.containers.insert(id, Box::new(c));
    }

    fn forget_container(&mut self, id: &str, c: &Container) {
        unindex(
            &mut self.containers_by_uid,
            &uid_label(&c.config.labels),
            id,
        );
        if let Some(at) = c.exits_at() {
            self.exits.remove(&(at, id.to_string()));
        }
    }

    /// Sandboxes whose labels carry every label in `want`, in ID order.
    pub fn sandboxes_matching<'a>(
        &'a self,
        want: &'a HashMap<String, String>,
    ) -> impl Iterator<Item = (&'a String, &'a Sandbox)> + 'a {
        let (found, check) = candidates(want, &self.sandboxes_by_uid, &self.sandboxes);
        found
            .map(|(id, sb)| (id, &**sb))
            .filter(move |(_, sb)| check.is_none_or(|w| matches_labels(w, &sb.config.labels)))
    }

    /// Containers whose labels carry every label in `want`, in ID order.
    pub fn containers_matching<'a>(
        &'a self,
        want: &'a HashMap<String, String>,
    ) -> impl Iterator<Item = (&'a String, &'a Container)> + 'a {
        let (found, check) = candidates(want, &self.containers_by_uid, &self.containers);
        found
            .map(|(id, c)| (id, &**c))
            .filter(move |(_, c)| check.is_none_or(|w| matches_labels(w, &c.config.labels)))
    }

    /// Marks a sandbox not ready and stops its running containers at `now`.
    pub fn stop_sandbox(&mut self, id: &str, now: Nanos) {
        let Some(sb) = self.sandboxes.get_mut(id) else {
            return;
        };
        sb.ready = false;
        let uid = uid_label(&sb.config.labels);
        let ids: Vec<String> = self
            .containers_by_uid
            .get(&uid)
            .into_iter()
            .flatten()
            .filter(|c| {
                let c = &self.containers[*c];
                c.sandbox_id == id && c.state == api::ContainerState::ContainerRunning
            })
            .cloned()
            .collect();
        for c in ids {
            self.stop_container(&c, now, 137, "");
        }
    }

    /// Removes a sandbox and every container in it.
    pub fn remove_sandbox(&mut self, id: &str) {
        let Some(sb) = self.sandboxes.remove(id) else {
            return;
        };
        unindex(
            &mut self.sandboxes_by_uid,
            &uid_label(&sb.config.labels),
            id,
        );
        let ids: Vec<String> = self
            .containers_by_uid
            .get(&uid_label(&sb.config.labels))
            .into_iter()
            .flatten()
            .filter(|c| self.containers[*c].sandbox_id == id)
            .cloned()
            .collect();
        for c in ids {
            self.remove_container(&c);
        }
    }

    /// A created container starts running at `now`.
    pub fn start_container(&mut self, id: &str, now: Nanos) {
        let Some(c) = self.containers.get_mut(id) else {
            return;
        };
        c.state = api::ContainerState::ContainerRunning;
        c.started_at = now;
        if let Some(at) = c.exits_at() {
            self.exits.insert((at, id.to_string()));
        }
    }

    /// A running (or created) container is stopped at `now` with `code`; `reason` is set
    /// when not empty. An exited container keeps how it exited.
    pub fn stop_container(&mut self, id: &str, now: Nanos, code: i32, reason: &str) {
        let Some(c) = self.containers.get_mut(id) else {
            return;
        };
        if c.state == api::ContainerState::ContainerExited {
            return;
        }
        if let Some(at) = c.exits_at() {
            self.exits.remove(&(at, id.to_string()));
        }
        c.state = api::ContainerState::ContainerExited;
        c.finished_at = now;
        c.exit_code = code;
        if !reason.is_empty() {
            c.reason = reason.to_string();
        }
        c.exited.send_replace(true);
    }

    pub fn remove_container(&mut self, id: &str) {
        if let Some(c) = self.containers.remove(id) {
            self.forget_container(id, &c);
        }
    }

    /// Moves containers whose scheduled run has ended by `now` to Exited.
    pub fn advance(&mut self, now: Nanos) {
        while let Some((at, id)) = self.exits.first().cloned() {
            if at > now {
                break;
            }
            self.exits.pop_first();
            let Some(c) = self
                .containers
                .get_mut(&id)
                .filter(|c| c.state == api::ContainerState::ContainerRunning)
            else {
                continue;
            };
            let Some((_, code)) = c.runs_for else {
                continue;
            };
            c.state = api::ContainerState::ContainerExited;
            c.finished_at = at;
            c.exit_code = code;
            c.reason = if code == 0 { "Completed" } else { "Error" }.into();
            c.exited.send_replace(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(uid: &str) -> HashMap<String, String> {
        HashMap::from([
            (labels::POD_UID.to_string(), uid.to_string()),
            (labels::MANAGED_BY.to_string(), "podlapse".to_string()),
        ])
    }

    fn sandbox(uid: &str) -> Sandbox {
        Sandbox {
            uid: uid.into(),
            attempt: 0,
            config: api::PodSandboxConfig {
                labels: labels(uid),
                ..Default::default()
            },
            ready: true,
            ip: String::new(),
            created_at: 0,
        }
    }

    fn container(uid: &str, sandbox_id: &str, runs_for: Option<(Nanos, i32)>) -> Container {
        Container {
            uid: uid.into(),
            sandbox_id: sandbox_id.into(),
            config: api::ContainerConfig {
                labels: labels(uid),
                ..Default::default()
            },
            state: api::ContainerState::ContainerCreated,
            created_at: 0,
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            image_ref: String::new(),
            runs_for,
            exited: watch::Sender::new(false),
        }
    }

    /// Two pods: a with sandbox s1 and containers c1 (exits with 3 after 100 ns) and c2,
    /// b with sandbox s2 and container c3.
    fn node() -> Objects {
        let mut o = Objects::default();
        o.add_sandbox("s1".into(), sandbox("a"));
        o.add_sandbox("s2".into(), sandbox("b"));
        o.add_container("c2".into(), container("a", "s1", None));
        o.add_container("c1".into(), container("a", "s1", Some((100, 3))));
        o.add_container("c3".into(), container("b", "s2", None));
        o
    }

    fn ids<'a, T: 'a>(it: impl Iterator<Item = (&'a String, &'a T)>) -> Vec<&'a str> {
        it.map(|(id, _)| id.as_str()).collect()
    }

    #[test]
    fn lists_by_pod_uid_use_the_index_and_other_selectors_every_object() {
        let o = node();
        let uid = |u: &str| HashMap::from([(labels::POD_UID.to_string(), u.to_string())]);
        assert_eq!(ids(o.containers_matching(&uid("a"))), ["c1", "c2"]);
        assert_eq!(ids(o.containers_matching(&uid("b"))), ["c3"]);
        assert!(ids(o.containers_matching(&uid("z"))).is_empty());
        assert_eq!(ids(o.sandboxes_matching(&uid("b"))), ["s2"]);
        let managed = HashMap::from([(labels::MANAGED_BY.to_string(), "podlapse".to_string())]);
        assert_eq!(ids(o.containers_matching(&managed)), ["c1", "c2", "c3"]);
        let other = HashMap::from([(labels::MANAGED_BY.to_string(), "else".to_string())]);
        assert!(ids(o.containers_matching(&other)).is_empty());
        // A pod UID selector still checks the other labels.
        let mut both = uid("a");
        both.extend(other);
        assert!(ids(o.containers_matching(&both)).is_empty());
        // Objects without a UID label sit in the index under "", but an empty UID selects
        // only those labelled with it.
        let mut o = node();
        let mut bare = container("", "s1", None);
        bare.config.labels.remove(labels::POD_UID);
        o.add_container("c4".into(), bare);
        let mut empty = container("", "s1", None);
        empty
            .config
            .labels
            .insert(labels::POD_UID.into(), String::new());
        o.add_container("c5".into(), empty);
        assert_eq!(ids(o.containers_matching(&uid(""))), ["c5"]);
        // Objects with more labels than are compared one by one are matched the same way.
        let mut many = container("m", "s1", None);
        for i in 0..=LABELS_COMPARED {
            many.config.labels.insert(format!("l{i}"), i.to_string());
        }
        o.add_container("c6".into(), many);
        let mut want = managed.clone();
        want.insert("l3".into(), "3".into());
        assert_eq!(ids(o.containers_matching(&want)), ["c6"]);
        want.insert("l4".into(), "5".into());
        assert!(ids(o.containers_matching(&want)).is_empty());
        assert_eq!(ids(o.containers_matching(&HashMap::new())).len(), 6);
    }

    #[test]
    fn a_scheduled_exit_happens_at_its_time_and_tells_its_watchers() {
        let mut o = node();
        o.start_container("c1", 1_000);
        o.start_container("c2", 1_000);
        let watcher = o.container("c1").unwrap().exited.subscribe();
        o.advance(1_099);
        assert_eq!(
            o.container("c1").unwrap().state,
            api::ContainerState::ContainerRunning
        );
        assert!(!*watcher.borrow());
        o.advance(5_000);
        let c1 = o.container("c1").unwrap();
        assert_eq!(c1.state, api::ContainerState::ContainerExited);
        assert_eq!((c1.finished_at, c1.exit_code), (1_100, 3));
        assert_eq!(c1.reason, "Error");
        assert!(*watcher.borrow());
        assert_eq!(
            o.container("c2").unwrap().state,
            api::ContainerState::ContainerRunning
        );
    }

    #[test]
    fn a_stop_before_the_scheduled_exit_wins() {
        let mut o = node();
        o.start_container("c1", 1_000);
        o.stop_container("c1", 1_050, 137, "Error");
        o.advance(5_000);
        let c1 = o.container("c1").unwrap();
        assert_eq!((c1.finished_at, c1.exit_code), (1_050, 137));
        assert!(*c1.exited.borrow());
    }

    #[test]
    fn stopping_a_sandbox_stops_only_its_running_containers() {
        let mut o = node();
        o.start_container("c1", 1_000);
        o.start_container("c3", 1_000);
        o.stop_sandbox("s1", 1_010);
        assert!(!o.sandbox("s1").unwrap().ready);
        let state = |id: &str| o.container(id).unwrap().state;
        assert_eq!(state("c1"), api::ContainerState::ContainerExited);
        // Created, never started: it stays created, as in the runtime.
        assert_eq!(state("c2"), api::ContainerState::ContainerCreated);
        assert_eq!(state("c3"), api::ContainerState::ContainerRunning);
        assert_eq!(o.container("c1").unwrap().exit_code, 137);
    }

    #[test]
    fn removing_a_sandbox_removes_its_containers_and_their_index() {
        let mut o = node();
        o.start_container("c1", 1_000);
        o.remove_sandbox("s1");
        let uid = HashMap::from([(labels::POD_UID.to_string(), "a".to_string())]);
        assert!(ids(o.containers_matching(&uid)).is_empty());
        assert!(ids(o.sandboxes_matching(&uid)).is_empty());
        assert!(o.container("c1").is_none() && o.sandbox("s1").is_none());
        assert!(o.exits.is_empty() && !o.containers_by_uid.contains_key("a"));
        assert!(o.container("c3").is_some());
    }
}
