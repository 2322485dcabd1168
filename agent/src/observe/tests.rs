//! The watcher and the event handling on statuses as containerd reports them.

use std::collections::{BTreeSet, HashMap};

use super::*;
use crate::cri::api;
use crate::trace::{Observation, ObservedVia};

const UID: &str = "0a1b2c3d-0000-4000-8000-000000000001";
const SANDBOX: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";
const CONTAINER: &str = "c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0";
const MS: i64 = 1_000_000;
/// The wall clock at the trace's monotonic zero + 1 s.
const WALL0: i64 = 1_800_000_000_000 * MS;

fn watcher() -> Watcher {
    Watcher::new(WALL0, 1_000 * MS as u64)
}

fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn sandbox(id: &str, uid: &str, ready: bool) -> api::PodSandboxStatus {
    api::PodSandboxStatus {
        id: id.into(),
        metadata: Some(api::PodSandboxMetadata {
            name: "web".into(),
            uid: uid.into(),
            namespace: "default".into(),
            attempt: 1,
        }),
        state: if ready {
            api::PodSandboxState::SandboxReady
        } else {
            api::PodSandboxState::SandboxNotready
        } as i32,
        created_at: WALL0 + 10 * MS,
        network: Some(api::PodSandboxNetworkStatus {
            ip: "10.88.0.7".into(),
            ..Default::default()
        }),
        labels: if uid.is_empty() {
            HashMap::new()
        } else {
            labels(&[
                (watch::POD_UID_LABEL, uid),
                (watch::POD_NAME_LABEL, "web"),
                (watch::POD_NAMESPACE_LABEL, "default"),
            ])
        },
        ..Default::default()
    }
}

fn container(
    state: api::ContainerState,
    started_ms: i64,
    finished_ms: i64,
) -> api::ContainerStatus {
    api::ContainerStatus {
        id: CONTAINER.into(),
        metadata: Some(api::ContainerMetadata {
            name: "app-meta".into(),
            attempt: 0,
        }),
        state: state as i32,
        created_at: WALL0 + 50 * MS,
        started_at: if started_ms > 0 {
            WALL0 + started_ms * MS
        } else {
            0
        },
        finished_at: if finished_ms > 0 {
            WALL0 + finished_ms * MS
        } else {
            0
        },
        exit_code: 3,
        labels: labels(&[(watch::CONTAINER_NAME_LABEL, "app")]),
        ..Default::default()
    }
}

fn event(
    kind: api::ContainerEventType,
    id: &str,
    at_ms: i64,
    containers: Vec<api::ContainerStatus>,
) -> api::ContainerEventResponse {
    api::ContainerEventResponse {
        container_id: id.into(),
        container_event_type: kind as i32,
        created_at: WALL0 + at_ms * MS,
        pod_sandbox_status: Some(sandbox(SANDBOX, UID, true)),
        containers_statuses: containers,
    }
}

fn whats(records: &[crate::trace::ObservedRecord]) -> Vec<Observation> {
    records.iter().map(|r| r.what).collect()
}

#[test]
fn the_event_stream_gives_each_change_once_on_the_trace_clock() {
    use api::ContainerEventType as T;
    let mut w = watcher();
    // containerd sends a sandbox's CREATED and STARTED together as RunPodSandbox ends.
    let created = on_event(
        &mut w,
        2_000,
        &event(T::ContainerCreatedEvent, SANDBOX, 40, vec![]),
    );
    let started = on_event(
        &mut w,
        2_001,
        &event(T::ContainerStartedEvent, SANDBOX, 40, vec![]),
    );
    assert_eq!(whats(&created), [Observation::SandboxReady]);
    assert!(
        started.is_empty(),
        "the second sandbox event said nothing new"
    );
    let r = &created[0];
    assert_eq!(
        r.runtime_ns,
        Some(1_040 * MS as u64),
        "the event's time, placed on the trace's clock"
    );
    assert_eq!(
        (r.pod_uid.as_str(), r.name.as_str(), r.ip.as_str()),
        (UID, "web", "10.88.0.7")
    );
    assert_eq!((r.via, r.attempt), (ObservedVia::Events, 1));

    let made = container(api::ContainerState::ContainerCreated, 0, 0);
    let c = on_event(
        &mut w,
        2_002,
        &event(T::ContainerCreatedEvent, CONTAINER, 51, vec![made]),
    );
    assert_eq!(whats(&c), [Observation::ContainerCreated]);
    assert_eq!(
        c[0].runtime_ns,
        Some(1_050 * MS as u64),
        "the status's created_at"
    );
    assert_eq!(
        c[0].container, "app",
        "kubelet's label before the CRI metadata"
    );
    let running = container(api::ContainerState::ContainerRunning, 70, 0);
    let s = on_event(
        &mut w,
        2_003,
        &event(
            T::ContainerStartedEvent,
            CONTAINER,
            71,
            vec![running.clone()],
        ),
    );
    assert_eq!(whats(&s), [Observation::ContainerStarted]);
    assert_eq!(
        s[0].runtime_ns,
        Some(1_070 * MS as u64),
        "the status's started_at"
    );
    // The relist beside the stream finds nothing new.
    assert!(
        w.container(2_004, ObservedVia::Polling, &running, SANDBOX)
            .is_empty()
    );
    assert!(!w.container_changed(CONTAINER, api::ContainerState::ContainerRunning as i32));

    let exited = container(api::ContainerState::ContainerExited, 70, 90);
    let x = on_event(
        &mut w,
        2_005,
        &event(T::ContainerStoppedEvent, CONTAINER, 91, vec![exited]),
    );
    assert_eq!(whats(&x), [Observation::ContainerExited]);
    assert_eq!(
        (x[0].exit_code, x[0].runtime_ns),
        (Some(3), Some(1_090 * MS as u64))
    );
    let gone = on_event(
        &mut w,
        2_006,
        &event(T::ContainerDeletedEvent, CONTAINER, 95, vec![]),
    );
    assert_eq!(whats(&gone), [Observation::ContainerRemoved]);
    let mut stopped = event(T::ContainerStoppedEvent, SANDBOX, 96, vec![]);
    stopped.pod_sandbox_status = Some(sandbox(SANDBOX, UID, false));
    assert_eq!(
        whats(&on_event(&mut w, 2_007, &stopped)),
        [Observation::SandboxNotReady]
    );
    let deleted = on_event(
        &mut w,
        2_008,
        &event(T::ContainerDeletedEvent, SANDBOX, 97, vec![]),
    );
    assert_eq!(whats(&deleted), [Observation::SandboxRemoved]);
    assert!(!w.knows_sandbox(SANDBOX));
}

#[test]
fn a_container_that_ran_and_exited_between_two_lists_is_created_started_and_exited() {
    let mut w = watcher();
    w.sandbox(
        2_000,
        ObservedVia::Polling,
        &sandbox(SANDBOX, UID, true),
        None,
    );
    let st = container(api::ContainerState::ContainerExited, 70, 90);
    let r = w.container(2_100, ObservedVia::Polling, &st, SANDBOX);
    assert_eq!(
        whats(&r),
        [
            Observation::ContainerCreated,
            Observation::ContainerStarted,
            Observation::ContainerExited
        ]
    );
    assert!(
        r.iter()
            .all(|r| r.pod_uid == UID && r.sandbox_id == SANDBOX)
    );
    // A polled sandbox has no time of the runtime's for becoming ready.
    let mut w = watcher();
    let s = w.sandbox(
        2_000,
        ObservedVia::Polling,
        &sandbox(SANDBOX, UID, true),
        None,
    );
    assert_eq!((s[0].runtime_ns, s[0].happened_ns()), (None, 2_000));
}

#[test]
fn what_a_list_no_longer_shows_went_away_containers_first() {
    let mut w = watcher();
    w.sandbox(
        2_000,
        ObservedVia::Polling,
        &sandbox(SANDBOX, UID, true),
        None,
    );
    let st = container(api::ContainerState::ContainerRunning, 70, 0);
    w.container(2_000, ObservedVia::Polling, &st, SANDBOX);
    let still: BTreeSet<String> = [SANDBOX.to_string()].into();
    assert!(
        w.listed(2_100, &still, &[CONTAINER.to_string()].into())
            .is_empty()
    );
    let r = w.listed(2_200, &BTreeSet::new(), &BTreeSet::new());
    assert_eq!(
        whats(&r),
        [Observation::ContainerRemoved, Observation::SandboxRemoved]
    );
    assert_eq!(
        (r[0].container.as_str(), r[0].pod_uid.as_str()),
        ("app", UID)
    );
}

#[test]
fn a_sandbox_without_a_pod_uid_label_is_known_by_its_id_with_a_note() {
    let mut w = watcher();
    let r = w.sandbox(
        2_000,
        ObservedVia::Polling,
        &sandbox(SANDBOX, "", true),
        None,
    );
    assert_eq!(r[0].pod_uid, "");
    assert_eq!(r[0].pod_key(), SANDBOX);
    assert!(r[0].note.contains("io.kubernetes.pod.uid"), "{}", r[0].note);
    let mut bad = sandbox(CONTAINER, UID, true);
    bad.labels
        .insert(watch::POD_UID_LABEL.into(), "not-a-uid".into());
    let r = w.sandbox(2_000, ObservedVia::Polling, &bad, None);
    assert_eq!(
        r[0].pod_key(),
        CONTAINER,
        "a malformed UID is not merged into another pod"
    );
    assert!(r[0].note.contains("\"not-a-uid\""), "{}", r[0].note);
}

#[test]
fn the_event_stream_is_used_only_where_every_subscriber_gets_every_event() {
    assert_eq!(use_stream(EventsMode::Auto, "containerd", "v2.1.9"), Ok(()));
    assert_eq!(use_stream(EventsMode::Auto, "containerd", "2.0.0"), Ok(()));
    let old = use_stream(EventsMode::Auto, "containerd", "v1.7.28").unwrap_err();
    assert!(old.contains("one subscriber"), "{old}");
    assert!(use_stream(EventsMode::Auto, "cri-o", "1.31.0").is_err());
    assert_eq!(
        use_stream(EventsMode::Stream, "containerd", "v1.7.28"),
        Ok(())
    );
    assert!(use_stream(EventsMode::Poll, "containerd", "v2.1.9").is_err());
}

#[test]
fn what_was_there_before_the_observer_started_is_marked_so_no_startup_is_made_up() {
    let mut w = watcher();
    let mut old = sandbox(SANDBOX, UID, true);
    old.created_at = WALL0 - 60_000 * MS;
    let r = w.sandbox(2_000, ObservedVia::Polling, &old, None);
    assert!(r[0].before_start);
    let mut c = container(api::ContainerState::ContainerRunning, 70, 0);
    c.created_at = WALL0 - 59_000 * MS;
    let r = w.container(2_000, ObservedVia::Polling, &c, SANDBOX);
    assert!(r[0].before_start && !r[1].before_start, "{r:#?}");
    let fresh = Watcher::new(WALL0, 1_000 * MS as u64).sandbox(
        2_000,
        ObservedVia::Polling,
        &sandbox(SANDBOX, UID, true),
        None,
    );
    assert!(!fresh[0].before_start);
}
