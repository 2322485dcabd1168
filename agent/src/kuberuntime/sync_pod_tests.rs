//! SyncPod bringing a pod up, table-tested on the fake runtime after kubelet's TestSyncPod,
//! TestSyncPodWithInitContainers and the sidecar cases: the sandbox first, then per
//! container the image (by pull policy), CreateContainer and StartContainer in spec
//! order; init containers one at a time before the app containers; and each failure path
//! with what becomes of the other containers in the same sync.
//!
//! IDs are the fake's: `sandbox-N` and `<container name>-N`, N counting every sandbox
//! and container the case created.

use super::harness::*;
use crate::cri::fake::{FakeCall, Fault, Method};
use crate::kuberuntime::SyncReason;

const ONE: &str = "
containers:
- name: app
  image: app:1
  imagePullPolicy: IfNotPresent";

const TWO: &str = "
containers:
- name: a
  image: a:1
  imagePullPolicy: IfNotPresent
- name: b
  image: b:1
  imagePullPolicy: IfNotPresent";

const INIT: &str = "
initContainers:
- name: init1
  image: i1:1
- name: init2
  image: i2:1
containers:
- name: app
  image: app:1";

const INIT_NEVER: &str = "
restartPolicy: Never
initContainers:
- name: init1
  image: i1:1
containers:
- name: app
  image: app:1";

const SIDECAR: &str = "
initContainers:
- name: sidecar
  image: sc:1
  restartPolicy: Always
containers:
- name: app
  image: app:1";

const SIDECAR_THEN_INIT: &str = "
initContainers:
- name: sidecar
  image: sc:1
  restartPolicy: Always
- name: init2
  image: i2:1
containers:
- name: app
  image: app:1";

const NON_ROOT: &str = "
securityContext:
  runAsNonRoot: true
containers:
- name: app
  image: app:1";

const ONE_ALWAYS: &str = "
containers:
- name: app
  image: app:1
  imagePullPolicy: Always";

const ONE_NEVER: &str = "
containers:
- name: app
  image: app:1
  imagePullPolicy: Never";

/// The sandbox's creation in a new pod: RunPodSandbox, then its status for the pod IP.
fn new_sandbox() -> Vec<FakeCall> {
    vec![run_sandbox(0), sandbox_status("sandbox-1")]
}

#[expect(clippy::too_many_lines, reason = "a table: one entry per case")]
fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "a new pod: sandbox, then pull, create and start each container in spec order",
            pod: TWO,
            calls: [
                new_sandbox(),
                vec![
                    image_status("a:1"),
                    pull("a:1"),
                    // kubelet's getImageUser: the pulled image's user.
                    image_status("a:1"),
                    create("sandbox-1", "a", 0),
                    start("a-2"),
                    image_status("b:1"),
                    pull("b:1"),
                    image_status("b:1"),
                    create("sandbox-1", "b", 0),
                    start("b-3"),
                ],
            ]
            .concat(),
            containers: vec![("a", started("a-2")), ("b", started("b-3"))],
            then: |fake, result| {
                let sb = fake.sandbox("sandbox-1").ok_or("no sandbox-1")?;
                let ok = sb.ready && sb.attempt == 0 && result.sandbox_id == sb.id;
                ok.then_some(()).ok_or(format!("sandbox {sb:?}"))
            },
            ..Case::default()
        },
        Case {
            name: "IfNotPresent with the image present: no pull",
            pod: ONE,
            given: vec![Given::Image("app:1")],
            calls: [
                new_sandbox(),
                vec![
                    image_status("app:1"),
                    create("sandbox-1", "app", 0),
                    start("app-2"),
                ],
            ]
            .concat(),
            containers: vec![("app", started("app-2"))],
            ..Case::default()
        },
        Case {
            name: "Always pulls an image that is present, without looking first",
            pod: ONE_ALWAYS,
            given: vec![Given::Image("app:1")],
            calls: [
                new_sandbox(),
                vec![
                    pull("app:1"),
                    image_status("app:1"),
                    create("sandbox-1", "app", 0),
                    start("app-2"),
                ],
            ]
            .concat(),
            containers: vec![("app", started("app-2"))],
            ..Case::default()
        },
        Case {
            name: "Never with the image absent: ErrImageNeverPull, nothing created",
            pod: ONE_NEVER,
            calls: [new_sandbox(), vec![image_status("app:1")]].concat(),
            containers: vec![("app", Outcome::Failed(SyncReason::ErrImageNeverPull))],
            ..Case::default()
        },
        Case {
            name: "Never with the image present: created from it",
            pod: ONE_NEVER,
            given: vec![Given::Image("app:1")],
            calls: [
                new_sandbox(),
                vec![
                    image_status("app:1"),
                    create("sandbox-1", "app", 0),
                    start("app-2"),
                ],
            ]
            .concat(),
            containers: vec![("app", started("app-2"))],
            ..Case::default()
        },
        Case {
            name: "init containers: only the first starts in a new sandbox",
            pod: INIT,
            given: vec![
                Given::Image("i1:1"),
                Given::Image("i2:1"),
                Given::Image("app:1"),
            ],
            calls: [
                new_sandbox(),
                vec![
                    image_status("i1:1"),
                    create("sandbox-1", "init1", 0),
                    start("init1-2"),
                ],
            ]
            .concat(),
            containers: vec![("init1", started("init1-2"))],
            ..Case::default()
        },
        Case {
            name: "init containers: the next starts once the one before succeeded",
            pod: INIT,
            given: vec![
                Given::Image("i1:1"),
                Given::Image("i2:1"),
                Given::Image("app:1"),
                Given::Sync,
                Given::Exit("init1", 0),
            ],
            calls: vec![
                image_status("i2:1"),
                create("sandbox-1", "init2", 0),
                start("init2-3"),
            ],
            containers: vec![("init2", started("init2-3"))],
            ..Case::default()
        },
        Case {
            name: "init containers: the app containers start once every one succeeded",
            pod: INIT,
            given: vec![
                Given::Image("i1:1"),
                Given::Image("i2:1"),
                Given::Image("app:1"),
                Given::Sync,
                Given::Exit("init1", 0),
                Given::Sync,
                Given::Exit("init2", 0),
            ],
            calls: vec![
                image_status("app:1"),
                create("sandbox-1", "app", 0),
                start("app-4"),
            ],
            containers: vec![("app", started("app-4"))],
            ..Case::default()
        },
        Case {
            name: "a failed init container is restarted (attempt 1) before any app container",
            pod: INIT,
            given: vec![
                Given::Image("i1:1"),
                Given::Image("i2:1"),
                Given::Image("app:1"),
                Given::Sync,
                Given::Exit("init1", 1),
            ],
            calls: vec![
                image_status("i1:1"),
                create("sandbox-1", "init1", 1),
                start("init1-3"),
            ],
            containers: vec![("init1", started("init1-3"))],
            ..Case::default()
        },
        Case {
            name: "a failed init container under restartPolicy Never: the pod is killed",
            pod: INIT_NEVER,
            given: vec![
                Given::Image("i1:1"),
                Given::Image("app:1"),
                Given::Sync,
                Given::Exit("init1", 1),
            ],
            calls: vec![stop_sandbox("sandbox-1")],
            then: |_, result| result.killed.then_some(()).ok_or("not killed".into()),
            ..Case::default()
        },
        Case {
            name: "a sidecar starts alone in a new sandbox",
            pod: SIDECAR,
            given: vec![Given::Image("sc:1"), Given::Image("app:1")],
            calls: [
                new_sandbox(),
                vec![
                    image_status("sc:1"),
                    create("sandbox-1", "sidecar", 0),
                    start("sidecar-2"),
                ],
            ]
            .concat(),
            containers: vec![("sidecar", started("sidecar-2"))],
            ..Case::default()
        },
        Case {
            name: "a running sidecar lets the app containers start",
            pod: SIDECAR,
            given: vec![Given::Image("sc:1"), Given::Image("app:1"), Given::Sync],
            calls: vec![
                image_status("app:1"),
                create("sandbox-1", "app", 0),
                start("app-3"),
            ],
            containers: vec![("app", started("app-3"))],
            ..Case::default()
        },
        Case {
            // kubelet skips a restartable init container that fails to start; an ordinary
            // one would end the sync.
            name: "a sidecar that fails to restart does not hold back the app containers",
            pod: SIDECAR_THEN_INIT,
            given: vec![
                Given::Image("sc:1"),
                Given::Image("i2:1"),
                Given::Image("app:1"),
                Given::Sync,
                Given::Sync,
                Given::Exit("init2", 0),
                Given::Exit("sidecar", 1),
            ],
            faults: vec![Fault::exec_not_found("sidecar", "/bin/sidecar")],
            calls: vec![
                image_status("sc:1"),
                create("sandbox-1", "sidecar", 1),
                start("sidecar-4"),
                image_status("app:1"),
                create("sandbox-1", "app", 0),
                start("app-5"),
            ],
            containers: vec![
                ("sidecar", Outcome::Failed(SyncReason::RunContainerError)),
                ("app", started("app-5")),
            ],
            ..Case::default()
        },
        Case {
            name: "RunPodSandbox fails in CNI: no container is created",
            pod: ONE,
            given: vec![Given::Image("app:1")],
            faults: vec![Fault::cni_failure()],
            calls: vec![run_sandbox(0)],
            pod_error: Some(SyncReason::CreatePodSandboxError),
            then: |fake, _| {
                let left = fake.sandboxes().len() + fake.containers().len();
                (left == 0)
                    .then_some(())
                    .ok_or(format!("{left} objects left"))
            },
            ..Case::default()
        },
        Case {
            name: "PodSandboxStatus fails after RunPodSandbox: no container is created",
            pod: ONE,
            given: vec![Given::Image("app:1")],
            faults: vec![Fault::new(
                Method::PodSandboxStatus,
                tonic::Code::Unavailable,
                "connection error: desc = \"transport: Error while dialing\"",
            )],
            calls: new_sandbox(),
            pod_error: Some(SyncReason::CreatePodSandboxError),
            ..Case::default()
        },
        Case {
            name: "PullImage fails: ErrImagePull for that container, the next one still starts",
            pod: TWO,
            given: vec![Given::Image("b:1")],
            faults: vec![Fault::image_not_found("a:1")],
            calls: [
                new_sandbox(),
                vec![
                    image_status("a:1"),
                    pull("a:1"),
                    image_status("b:1"),
                    create("sandbox-1", "b", 0),
                    start("b-2"),
                ],
            ]
            .concat(),
            containers: vec![
                ("a", Outcome::BackOff(SyncReason::ErrImagePull)),
                ("b", started("b-2")),
            ],
            ..Case::default()
        },
        Case {
            name: "a pull in back-off is not tried again: ImagePullBackOff",
            pod: ONE,
            given: vec![Given::Fault(Fault::image_not_found("app:1")), Given::Sync],
            calls: vec![image_status("app:1")],
            containers: vec![("app", Outcome::BackOff(SyncReason::ImagePullBackOff))],
            ..Case::default()
        },
        Case {
            name: "CreateContainer fails: CreateContainerError for that container, the next one still starts",
            pod: TWO,
            given: vec![Given::Image("a:1"), Given::Image("b:1")],
            faults: vec![Fault::create_failed("a")],
            calls: [
                new_sandbox(),
                vec![
                    image_status("a:1"),
                    create("sandbox-1", "a", 0),
                    image_status("b:1"),
                    create("sandbox-1", "b", 0),
                    start("b-2"),
                ],
            ]
            .concat(),
            containers: vec![
                ("a", Outcome::Failed(SyncReason::CreateContainerError)),
                ("b", started("b-2")),
            ],
            ..Case::default()
        },
        Case {
            name: "StartContainer fails: RunContainerError, the container stays created, the next one still starts",
            pod: TWO,
            given: vec![Given::Image("a:1"), Given::Image("b:1")],
            faults: vec![Fault::exec_not_found("a", "/bin/a")],
            calls: [
                new_sandbox(),
                vec![
                    image_status("a:1"),
                    create("sandbox-1", "a", 0),
                    start("a-2"),
                    image_status("b:1"),
                    create("sandbox-1", "b", 0),
                    start("b-3"),
                ],
            ]
            .concat(),
            containers: vec![
                ("a", Outcome::Failed(SyncReason::RunContainerError)),
                ("b", started("b-3")),
            ],
            then: |fake, _| {
                let a = fake.container("a-2").ok_or("no a-2")?;
                let created = crate::cri::api::ContainerState::ContainerCreated;
                (a.state == created)
                    .then_some(())
                    .ok_or(format!("a-2 is {:?}", a.state))
            },
            ..Case::default()
        },
        Case {
            name: "runAsNonRoot with an image that runs as root: CreateContainerConfigError, nothing created",
            pod: NON_ROOT,
            given: vec![Given::Image("app:1")],
            calls: [new_sandbox(), vec![image_status("app:1")]].concat(),
            containers: vec![(
                "app",
                Outcome::Failed(SyncReason::CreateContainerConfigError),
            )],
            ..Case::default()
        },
        Case {
            name: "runAsNonRoot with an image that runs as a user: created",
            pod: NON_ROOT,
            given: vec![Given::ImageAsUser("app:1", 1000)],
            calls: [
                new_sandbox(),
                vec![
                    image_status("app:1"),
                    create("sandbox-1", "app", 0),
                    start("app-2"),
                ],
            ]
            .concat(),
            containers: vec![("app", started("app-2"))],
            ..Case::default()
        },
        Case {
            name: "runAsNonRoot with an image just pulled: its user is read after the pull",
            pod: NON_ROOT,
            calls: [
                new_sandbox(),
                vec![image_status("app:1"), pull("app:1"), image_status("app:1")],
            ]
            .concat(),
            containers: vec![(
                "app",
                Outcome::Failed(SyncReason::CreateContainerConfigError),
            )],
            ..Case::default()
        },
    ]
}

#[tokio::test(start_paused = true)]
async fn sync_pod_brings_a_pod_up_in_kubelets_order() {
    run_cases(cases()).await;
}
