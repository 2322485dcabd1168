//! SyncPod on a pod that already runs, table-tested on the fake runtime after kubelet's
//! TestSyncPod* and TestComputePodActions cases carried out: nothing to do, exited
//! containers under each restart policy, a crash loop held back, a dead sandbox killed
//! and recreated (the kill in kubelet's termination order), a failed liveness probe, a
//! changed spec and an in-place resize.

use super::PodSyncResult;
use super::harness::*;
use crate::cri::fake::{FakeCall, FakeRuntime, Fault, Method};
use crate::kuberuntime::SyncReason;

const ONE: &str = "
containers:
- name: app
  image: app:1";

const ONE_V2: &str = "
containers:
- name: app
  image: app:2";

const ON_FAILURE: &str = "
restartPolicy: OnFailure
containers:
- name: app
  image: app:1";

const NEVER: &str = "
restartPolicy: Never
containers:
- name: app
  image: app:1";

const TWO: &str = "
containers:
- name: a
  image: a:1
- name: b
  image: b:1";

const WITH_SIDECAR: &str = "
initContainers:
- name: init1
  image: i1:1
- name: sidecar
  image: sc:1
  restartPolicy: Always
containers:
- name: a
  image: a:1
- name: b
  image: b:1";

const CPU_100M: &str = "
containers:
- name: app
  image: app:1
  resources:
    requests:
      cpu: 100m";

const CPU_200M: &str = "
containers:
- name: app
  image: app:1
  resources:
    requests:
      cpu: 200m";

const CPU_100M_RESTART: &str = "
containers:
- name: app
  image: app:1
  resizePolicy:
  - resourceName: cpu
    restartPolicy: RestartContainer
  resources:
    requests:
      cpu: 100m";

const CPU_200M_RESTART: &str = "
containers:
- name: app
  image: app:1
  resizePolicy:
  - resourceName: cpu
    restartPolicy: RestartContainer
  resources:
    requests:
      cpu: 200m";

/// The one container of `ONE` created again (attempt 1) in the sandbox it ran in.
fn restart_app(id: &str) -> Vec<FakeCall> {
    vec![
        image_status("app:1"),
        create("sandbox-1", "app", 1),
        start(id),
    ]
}

fn killed(_: &FakeRuntime, result: &PodSyncResult) -> Result<(), String> {
    result
        .killed
        .then_some(())
        .ok_or("nothing was killed".into())
}

#[expect(clippy::too_many_lines, reason = "a table: one entry per case")]
fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "a running pod with nothing to do: no call",
            pod: ONE,
            given: vec![Given::Image("app:1"), Given::Sync],
            then: |_, result| {
                let noop = result.actions.is_noop() && !result.killed;
                noop.then_some(()).ok_or(format!("{:?}", result.actions))
            },
            ..Case::default()
        },
        Case {
            name: "restartPolicy Always: a container that exited 0 is created again (attempt 1)",
            pod: ONE,
            given: vec![Given::Image("app:1"), Given::Sync, Given::Exit("app", 0)],
            calls: restart_app("app-3"),
            containers: vec![("app", started("app-3"))],
            ..Case::default()
        },
        Case {
            name: "restartPolicy OnFailure: a container that failed is created again",
            pod: ON_FAILURE,
            given: vec![Given::Image("app:1"), Given::Sync, Given::Exit("app", 1)],
            calls: restart_app("app-3"),
            containers: vec![("app", started("app-3"))],
            ..Case::default()
        },
        Case {
            name: "restartPolicy OnFailure: a container that succeeded stays down and the sandbox is stopped",
            pod: ON_FAILURE,
            given: vec![Given::Image("app:1"), Given::Sync, Given::Exit("app", 0)],
            calls: vec![stop_sandbox("sandbox-1")],
            then: killed,
            ..Case::default()
        },
        Case {
            name: "restartPolicy Never: a container that failed stays down and the sandbox is stopped",
            pod: NEVER,
            given: vec![Given::Image("app:1"), Given::Sync, Given::Exit("app", 1)],
            calls: vec![stop_sandbox("sandbox-1")],
            then: killed,
            ..Case::default()
        },
        Case {
            name: "a container that failed again within its back-off stays down: CrashLoopBackOff",
            pod: ONE,
            given: vec![
                Given::Image("app:1"),
                Given::Sync,
                Given::Exit("app", 1),
                Given::Sync,
                Given::Exit("app", 1),
            ],
            containers: vec![("app", Outcome::BackOff(SyncReason::CrashLoopBackOff))],
            ..Case::default()
        },
        Case {
            name: "a sandbox that is not ready: the pod is killed, a new sandbox (attempt 1) created and every container in it",
            pod: TWO,
            given: vec![
                Given::Image("a:1"),
                Given::Image("b:1"),
                Given::Sync,
                Given::SandboxNotReady,
            ],
            calls: vec![
                stop("a-2"),
                stop("b-3"),
                stop_sandbox("sandbox-1"),
                run_sandbox(1),
                sandbox_status("sandbox-4"),
                image_status("a:1"),
                create("sandbox-4", "a", 1),
                start("a-5"),
                image_status("b:1"),
                create("sandbox-4", "b", 1),
                start("b-6"),
            ],
            containers: vec![("a", started("a-5")), ("b", started("b-6"))],
            then: |fake, result| {
                let old = fake.sandbox("sandbox-1").ok_or("no sandbox-1")?;
                let new = fake.sandbox("sandbox-4").ok_or("no sandbox-4")?;
                let ok = !old.ready && new.ready && new.attempt == 1 && result.killed;
                ok.then_some(()).ok_or(format!("{old:?} {new:?}"))
            },
            ..Case::default()
        },
        Case {
            name: "a changed sandbox: app containers stop, then the sidecar, then the sandbox; init containers are purged and initialization starts over",
            pod: WITH_SIDECAR,
            given: vec![
                Given::Image("i1:1"),
                Given::Image("sc:1"),
                Given::Image("a:1"),
                Given::Image("b:1"),
                Given::Sync,
                Given::Exit("init1", 0),
                Given::Sync,
                Given::Sync,
                Given::SandboxNotReady,
            ],
            calls: vec![
                stop("a-4"),
                stop("b-5"),
                stop("sidecar-3"),
                stop_sandbox("sandbox-1"),
                remove("init1-2"),
                remove("sidecar-3"),
                run_sandbox(1),
                sandbox_status("sandbox-6"),
                image_status("i1:1"),
                create("sandbox-6", "init1", 1),
                start("init1-7"),
            ],
            containers: vec![("init1", started("init1-7"))],
            ..Case::default()
        },
        Case {
            name: "restartPolicy Never and a dead sandbox after the containers ran: only the pod is killed",
            pod: NEVER,
            given: vec![Given::Image("app:1"), Given::Sync, Given::SandboxNotReady],
            calls: vec![stop("app-2"), stop_sandbox("sandbox-1")],
            then: |fake, _| {
                let one = fake.sandboxes().len() == 1;
                one.then_some(()).ok_or("a sandbox was created".into())
            },
            ..Case::default()
        },
        Case {
            // kubelet's killPodWithSyncResult stops the sandboxes even when a container's
            // StopContainer failed, and only then reports the failure; podlapse's kill_pod
            // returns at the first failed group, leaving the sandbox to the next sync.
            name: "StopContainer fails while the pod is killed: KillContainerError, no new sandbox",
            pod: TWO,
            given: vec![
                Given::Image("a:1"),
                Given::Image("b:1"),
                Given::Sync,
                Given::SandboxNotReady,
            ],
            faults: vec![
                Fault::new(
                    Method::StopContainer,
                    tonic::Code::Unknown,
                    "failed to kill container: context deadline exceeded",
                )
                .for_container("a"),
            ],
            calls: vec![stop("a-2"), stop("b-3")],
            pod_error: Some(SyncReason::KillContainerError),
            then: |_, result| {
                let who = result
                    .pod_error
                    .as_ref()
                    .and_then(|e| e.container.as_deref());
                (who == Some("a"))
                    .then_some(())
                    .ok_or(format!("failed for {who:?}"))
            },
            ..Case::default()
        },
        Case {
            // kubelet stops only running containers when it kills a pod
            // (ConvertPodStatusToRunningPod); podlapse's termination order takes created
            // ones too. containerd answers a stop of a created container with success.
            name: "a container left created by a failed start is stopped too when the pod is killed",
            pod: TWO,
            given: vec![
                Given::Image("a:1"),
                Given::Image("b:1"),
                Given::Fault(Fault::exec_not_found("a", "/bin/a").nth(1)),
                Given::Sync,
                Given::SandboxNotReady,
            ],
            calls: vec![
                stop("a-2"),
                stop("b-3"),
                stop_sandbox("sandbox-1"),
                run_sandbox(1),
                sandbox_status("sandbox-4"),
                image_status("a:1"),
                create("sandbox-4", "a", 1),
                start("a-5"),
                image_status("b:1"),
                create("sandbox-4", "b", 1),
                start("b-6"),
            ],
            containers: vec![("a", started("a-5")), ("b", started("b-6"))],
            ..Case::default()
        },
        Case {
            name: "a failed liveness probe: the container is stopped, then created again",
            pod: ONE,
            given: vec![
                Given::Image("app:1"),
                Given::Sync,
                Given::LivenessFailed("app"),
            ],
            calls: [vec![stop("app-2")], restart_app("app-3")].concat(),
            containers: vec![("app", started("app-3"))],
            then: killed,
            ..Case::default()
        },
        Case {
            name: "a changed image: the container is stopped and created again from the new one",
            pod: ONE_V2,
            given: vec![
                Given::Image("app:1"),
                Given::Image("app:2"),
                Given::SyncAs(ONE),
            ],
            calls: vec![
                stop("app-2"),
                image_status("app:2"),
                create("sandbox-1", "app", 1),
                start("app-3"),
            ],
            containers: vec![("app", started("app-3"))],
            ..Case::default()
        },
        Case {
            name: "a resize of a running container: UpdateContainerResources in place, no restart",
            pod: CPU_200M,
            given: vec![Given::Image("app:1"), Given::SyncAs(CPU_100M)],
            calls: vec![update("app-2")],
            then: |fake, _| {
                let app = fake.container("app-2").ok_or("no app-2")?;
                let shares = app.resources.map(|r| r.cpu_shares);
                // 200m, as kubelet converts it.
                (shares == Some(204))
                    .then_some(())
                    .ok_or(format!("cpu shares {shares:?}"))
            },
            ..Case::default()
        },
        Case {
            name: "a resize the runtime refuses: UpdateContainerResourcesError",
            pod: CPU_200M,
            given: vec![Given::Image("app:1"), Given::SyncAs(CPU_100M)],
            faults: vec![Fault::new(
                Method::UpdateContainerResources,
                tonic::Code::Unknown,
                "failed to update resources: failed to update resources: /usr/bin/runc did not terminate successfully: exit status 1",
            )],
            calls: vec![update("app-2")],
            pod_error: Some(SyncReason::UpdateContainerResourcesError),
            ..Case::default()
        },
        Case {
            name: "a resize whose policy is RestartContainer: the container is stopped and created again",
            pod: CPU_200M_RESTART,
            given: vec![Given::Image("app:1"), Given::SyncAs(CPU_100M_RESTART)],
            calls: [vec![stop("app-2")], restart_app("app-3")].concat(),
            containers: vec![("app", started("app-3"))],
            ..Case::default()
        },
    ]
}

#[tokio::test(start_paused = true)]
async fn sync_pod_carries_out_changes_to_a_running_pod_in_kubelets_order() {
    run_cases(cases()).await;
}
