//! SyncPod: carry out computePodActions' decisions over CRI, in kubelet's order: kill what
//! must go, create the sandbox, start the next init container, then the containers to
//! start, each held back while its crash loop or image pull is in back-off.

use std::collections::BTreeMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::config::RuntimeConfig;
use super::container::{PodRuntimeFacts, start_container};
use super::event::{EventRecorder, PodEvent};
use super::image::{PullLimiter, lock};
use super::kill::kill_pod;
use super::resources::linux_container_resources;
use super::sandbox::{create_pod_sandbox, generate_pod_sandbox_config};
use super::userns::user_namespace;
use super::volumes::mount_pod_volumes;
use super::{SyncError, SyncReason, labels};
use crate::cri::{ImageService, RuntimeService, api};
use crate::kubelet::backoff::{Backoff, do_backoff};
use crate::kubelet::container_hash::container_hash;
use crate::kubelet::pod_actions::{PodActions, compute_pod_actions, is_restartable_init_container};
use crate::kubelet::probe_results::ProbeResults;
use crate::kubelet::resize_actions::desired_resources;
use crate::kubelet::runtime_pod::ContainerResources;
use crate::kubelet::runtime_pod::{ContainerState, Nanos, RuntimePodStatus};
use crate::kubelet::sync_outcome::SyncSummary;

/// Everything SyncPod reads besides the pod and its runtime status.
pub struct SyncContext<'a> {
    pub cfg: &'a RuntimeConfig,
    pub events: &'a dyn EventRecorder,
    pub probes: &'a ProbeResults,
    pub backoff: &'a Mutex<Backoff>,
    pub limiter: &'a PullLimiter,
    /// The wall clock in ns (the runtime's clock), or virtual time in replay.
    pub now: &'a (dyn Fn() -> Nanos + Send + Sync),
    /// The pod cgroup the sandbox goes under (empty: the runtime's default).
    pub cgroup_parent: &'a str,
    /// Registry credentials for an image, from the pod's pull secrets.
    pub auth: &'a (dyn Fn(&str) -> Option<api::AuthConfig> + Send + Sync),
    /// Records the resources the runtime applied to a container (name, ID): kubelet's
    /// actuated resources, which the next resize compares against.
    pub actuated: &'a (dyn Fn(&str, &str, ContainerResources) + Send + Sync),
}

/// How starting one container went.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum ContainerOutcome {
    Started {
        container_id: String,
    },
    /// Not started: waiting for a back-off (CrashLoopBackOff, ImagePullBackOff) to end.
    BackOff {
        reason: SyncReason,
        message: String,
        until: Nanos,
    },
    Failed {
        reason: SyncReason,
        message: String,
    },
}

/// What one SyncPod did.
#[derive(Debug)]
pub struct PodSyncResult {
    pub actions: PodActions,
    /// A pod-level step (kill, sandbox) that failed; nothing after it ran.
    pub pod_error: Option<SyncError>,
    /// Per container name, what happened to the containers SyncPod tried to start.
    pub containers: BTreeMap<String, ContainerOutcome>,
    /// The sandbox the pod runs in after this sync (new or kept).
    pub sandbox_id: String,
    /// The status of the sandbox this sync created, as read right after creation.
    pub new_sandbox: Option<api::PodSandboxStatus>,
    /// True when this sync stopped anything: the pod (a sandbox existed to kill) or some
    /// of its containers.
    pub killed: bool,
}

impl PodSyncResult {
    /// The earliest time something is waiting for, if anything is.
    pub fn retry_at(&self) -> Option<Nanos> {
        let from_pod = self.pod_error.as_ref().and_then(|e| e.retry_at);
        self.containers
            .values()
            .filter_map(|o| match o {
                ContainerOutcome::BackOff { until, .. } => Some(*until),
                ContainerOutcome::Failed { .. } | ContainerOutcome::Started { .. } => None,
            })
            .chain(from_pod)
            .min()
    }

    /// The containers this sync started, when starting them (and creating the sandbox
    /// they run in) is all it changed: nothing killed, nothing failed part-way. `None`
    /// when it changed anything else, which only a full read of the pod reflects.
    pub fn only_started(&self) -> Option<Vec<&str>> {
        // kubelet's actions kill the pod whenever they create a sandbox; only a kill that
        // found something to stop changed the pod.
        if self.pod_error.is_some()
            || self.killed
            || (self.actions.create_sandbox && self.new_sandbox.is_none())
        {
            return None;
        }
        let mut started = Vec::new();
        for outcome in self.containers.values() {
            match outcome {
                ContainerOutcome::Started { container_id } => started.push(container_id.as_str()),
                // Nothing was created: the wait happens before CreateContainer.
                ContainerOutcome::BackOff { .. } => {}
                // It may have left a created container behind.
                ContainerOutcome::Failed { .. } => return None,
            }
        }
        Some(started)
    }

    /// What the pod worker's next step depends on.
    pub fn summary(&self) -> SyncSummary {
        SyncSummary {
            image_pull_failed: self.containers.values().any(|o| {
                matches!(o, ContainerOutcome::BackOff { reason, .. } if *reason == SyncReason::ErrImagePull)
            }),
            failed: self.failed(),
            retry_at: self.retry_at(),
        }
    }

    /// True when a step failed outright (not a back-off wait).
    pub fn failed(&self) -> bool {
        self.pod_error
            .as_ref()
            .is_some_and(|e| e.retry_at.is_none())
            || self
                .containers
                .values()
                .any(|o| matches!(o, ContainerOutcome::Failed { .. }))
    }
}

fn grace_period(pod: &Pod) -> i64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30)
}

pub async fn sync_pod<R: RuntimeService + ImageService>(
    cri: &R,
    ctx: &SyncContext<'_>,
    pod: &Pod,
    status: &RuntimePodStatus,
) -> PodSyncResult {
    let actions = compute_pod_actions(pod, status, ctx.probes);
    let mut result = PodSyncResult {
        sandbox_id: actions.sandbox_id.clone(),
        actions,
        pod_error: None,
        containers: BTreeMap::new(),
        new_sandbox: None,
        killed: false,
    };
    if let Err(e) = execute(cri, ctx, pod, status, &mut result).await {
        ctx.events.record(PodEvent::warning(
            e.reason.event_reason().to_string(),
            e.reason.event_message(&e.message),
            e.container.clone(),
        ));
        result.pod_error = Some(e);
    }
    result
}

async fn execute<R: RuntimeService + ImageService>(
    cri: &R,
    ctx: &SyncContext<'_>,
    pod: &Pod,
    status: &RuntimePodStatus,
    result: &mut PodSyncResult,
) -> Result<(), SyncError> {
    let actions = result.actions.clone();
    let grace = grace_period(pod);
    if actions.kill_pod {
        if !status.sandboxes.is_empty() {
            if actions.create_sandbox && !actions.sandbox_id.is_empty() {
                ctx.events.record(PodEvent::normal(
                    "SandboxChanged",
                    "Pod sandbox changed, it will be killed and re-created.",
                    None,
                ));
            }
            result.killed = true;
            kill_pod(cri, pod, status, grace).await?;
            if actions.create_sandbox {
                // Initialization starts over in the new sandbox: the old init containers
                // must not count as done.
                purge_init_containers(cri, pod, status).await?;
            }
        }
    } else {
        for (id, why) in &actions.containers_to_kill {
            result.killed = true;
            ctx.events.record(PodEvent::normal(
                "Killing",
                format!("Stopping container {}: {}", why.name, why.message),
                Some(why.name.clone()),
            ));
            cri.stop_container(id, grace).await.map_err(|e| {
                SyncError::cri(SyncReason::KillContainerError, e).for_container(&why.name)
            })?;
        }
    }

    let mut facts = PodRuntimeFacts::default();
    if actions.create_sandbox {
        if ctx.cfg.touch_host {
            mount_pod_volumes(pod, ctx.cfg)?;
        }
        let mut config = Box::new(generate_pod_sandbox_config(pod, actions.attempt, ctx.cfg));
        set_cgroup_parent(&mut config, ctx.cgroup_parent);
        let handler = runtime_handler(pod, ctx.cfg)?;
        set_user_namespace(&mut config, user_namespace(pod, ctx.cfg, &handler)?);
        let id = create_pod_sandbox(cri, config, &handler, ctx.cfg.touch_host).await?;
        result.sandbox_id = id.clone();
        let st = cri
            .pod_sandbox_status_reduced(&id)
            .await
            .map_err(|e| SyncError::cri(SyncReason::CreatePodSandboxError, e))?;
        result.new_sandbox = st.status.clone();
        if let Some(net) = st.status.and_then(|s| s.network) {
            facts.pod_ip = net.ip.clone();
            facts.pod_ips = std::iter::once(net.ip)
                .chain(net.additional_ips.into_iter().map(|i| i.ip))
                .filter(|ip| !ip.is_empty())
                .collect();
        }
    } else if let Some(sb) = status.newest_sandbox() {
        facts.pod_ip = sb.ip.clone();
        facts.pod_ips = std::iter::once(sb.ip.clone())
            .chain(sb.additional_ips.iter().cloned())
            .filter(|ip| !ip.is_empty())
            .collect();
    }
    if actions.init_containers_to_start.is_empty()
        && actions.containers_to_start.is_empty()
        && actions.containers_to_update.is_empty()
    {
        return Ok(());
    }
    if result.sandbox_id.is_empty() {
        return Err(SyncError::new(
            SyncReason::CreatePodSandboxError,
            "no sandbox to start containers in",
        ));
    }

    // A pod's sync future lives, at its largest size, for the whole sync, and a burst
    // of pods holds one each: the sandbox config (a prost struct of about 9 KB inline)
    // is boxed, and the calls that carry it are boxed where they are made.
    let mut sandbox_config = Box::new(generate_pod_sandbox_config(pod, actions.attempt, ctx.cfg));
    set_cgroup_parent(&mut sandbox_config, ctx.cgroup_parent);
    let handler = runtime_handler(pod, ctx.cfg)?;
    set_user_namespace(&mut sandbox_config, user_namespace(pod, ctx.cfg, &handler)?);
    let spec = pod.spec.as_ref().expect("validated pods have a spec");
    let starter = Starter {
        cri,
        ctx,
        pod,
        status,
        sandbox_id: &result.sandbox_id,
        sandbox_config: &sandbox_config,
        facts: &facts,
    };

    // Resizes come before any start (kubelet 1.37's order).
    if !actions.containers_to_update.is_empty() {
        resize_containers(cri, ctx, pod, &actions).await?;
    }

    // Init containers in spec order: the next ordinary one and any sidecars. A sidecar
    // that cannot start does not hold back the others; an ordinary init container that
    // cannot start ends the sync.
    for &i in &actions.init_containers_to_start {
        let Some(c) = spec.init_containers.iter().flatten().nth(i) else {
            continue;
        };
        let outcome = starter.start(c).await;
        let blocked = !is_restartable_init_container(c)
            && !matches!(outcome, ContainerOutcome::Started { .. });
        result.containers.insert(c.name.clone(), outcome);
        if blocked {
            return Ok(());
        }
    }

    for &i in &actions.containers_to_start {
        let c = &spec.containers[i];
        let outcome = starter.start(c).await;
        result.containers.insert(c.name.clone(), outcome);
    }
    Ok(())
}

/// kubelet's purge of init containers when the sandbox is recreated: every instance of
/// every init container is removed, so initialization runs again from the first.
async fn purge_init_containers<R: RuntimeService>(
    cri: &R,
    pod: &Pod,
    status: &RuntimePodStatus,
) -> Result<(), SyncError> {
    let names: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .map(|c| c.name.as_str())
        .collect();
    for c in status
        .containers
        .iter()
        .filter(|c| names.contains(&c.name.as_str()))
    {
        cri.remove_container(&c.id)
            .await
            .or_else(|e| if e.is_not_found() { Ok(()) } else { Err(e) })
            .map_err(|e| {
                SyncError::cri(SyncReason::KillContainerError, e).for_container(&c.name)
            })?;
    }
    Ok(())
}

/// Starts one container of the pod in its sandbox, unless its back-off holds it.
struct Starter<'a, R> {
    cri: &'a R,
    ctx: &'a SyncContext<'a>,
    pod: &'a Pod,
    status: &'a RuntimePodStatus,
    sandbox_id: &'a str,
    sandbox_config: &'a api::PodSandboxConfig,
    facts: &'a PodRuntimeFacts,
}

impl<R: RuntimeService + ImageService> Starter<'_, R> {
    async fn start(&self, c: &Container) -> ContainerOutcome {
        let ctx = self.ctx;
        let last_exit = self
            .status
            .containers
            .iter()
            .find(|s| s.name == c.name && s.state == ContainerState::Exited)
            .map(|s| s.finished_at);
        let held = do_backoff(
            &mut lock(ctx.backoff),
            labels::pod_uid(self.pod),
            labels::pod_name(self.pod),
            &c.name,
            &container_hash(c),
            last_exit,
            (ctx.now)(),
        );
        if let Some((message, until)) = held {
            ctx.events.record(PodEvent::warning(
                "BackOff",
                message.clone(),
                Some(c.name.clone()),
            ));
            return ContainerOutcome::BackOff {
                reason: SyncReason::CrashLoopBackOff,
                message,
                until,
            };
        }
        let restart_count = self
            .status
            .container(&c.name)
            .map(|s| s.restart_count + 1)
            .unwrap_or(0);
        match start_container(
            self.cri,
            ctx,
            self.pod,
            c,
            self.sandbox_id,
            self.sandbox_config,
            restart_count,
            self.facts,
        )
        .await
        {
            Ok(started) => {
                (ctx.actuated)(&c.name, &started.container_id, desired_resources(c));
                ContainerOutcome::Started {
                    container_id: started.container_id,
                }
            }
            Err(e) => {
                if e.reason != SyncReason::ImagePullBackOff {
                    ctx.events.record(PodEvent::warning(
                        "Failed",
                        format!("Error: {}: {}", e.reason, e.message),
                        Some(c.name.clone()),
                    ));
                }
                match e.retry_at {
                    Some(until) => ContainerOutcome::BackOff {
                        reason: e.reason,
                        message: e.message,
                        until,
                    },
                    None => ContainerOutcome::Failed {
                        reason: e.reason,
                        message: e.message,
                    },
                }
            }
        }
    }
}

/// kubelet's doPodResizeAction for the containers: UpdateContainerResources for each
/// container resized in place, memory before CPU and decreases before increases (the
/// pod cgroup was sized for the allocation before this sync).
async fn resize_containers<R: RuntimeService>(
    cri: &R,
    ctx: &SyncContext<'_>,
    pod: &Pod,
    actions: &PodActions,
) -> Result<(), SyncError> {
    let spec = pod.spec.as_ref().expect("validated pods have a spec");
    let mut done = std::collections::BTreeSet::new();
    for update in actions.containers_to_update.values().flatten() {
        if !done.insert(update.container_id.clone()) {
            continue;
        }
        let c = if update.init {
            spec.init_containers.iter().flatten().nth(update.index)
        } else {
            spec.containers.get(update.index)
        };
        let Some(c) = c else { continue };
        cri.update_container_resources(&update.container_id, linux_container_resources(c))
            .await
            .map_err(|e| {
                SyncError::cri(SyncReason::UpdateContainerResourcesError, e).for_container(&c.name)
            })?;
        (ctx.actuated)(&c.name, &update.container_id, update.desired);
    }
    Ok(())
}

/// The CRI runtime handler of the pod's RuntimeClass (`""`: the runtime's default).
fn runtime_handler(pod: &Pod, cfg: &RuntimeConfig) -> Result<String, SyncError> {
    Ok(pod
        .spec
        .as_ref()
        .and_then(|s| s.runtime_class_name.clone())
        .map(|class| cfg.runtime_handler(&class))
        .transpose()?
        .unwrap_or_default())
}

/// The pod's user namespace, on the sandbox; its containers take it from there.
fn set_user_namespace(config: &mut api::PodSandboxConfig, userns: api::UserNamespace) {
    if let Some(ns) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        ns.userns_options = Some(userns);
    }
}

fn set_cgroup_parent(config: &mut api::PodSandboxConfig, parent: &str) {
    if parent.is_empty() {
        return;
    }
    if let Some(linux) = config.linux.as_mut() {
        linux.cgroup_parent = parent.to_string();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::pod_actions::KillReason;

    fn result(actions: PodActions, outcomes: &[(&str, ContainerOutcome)]) -> PodSyncResult {
        PodSyncResult {
            sandbox_id: "sb".into(),
            new_sandbox: actions.create_sandbox.then(|| api::PodSandboxStatus {
                id: "sb".into(),
                ..Default::default()
            }),
            killed: false,
            actions,
            pod_error: None,
            containers: outcomes
                .iter()
                .map(|(n, o)| (n.to_string(), o.clone()))
                .collect(),
        }
    }

    fn started(id: &str) -> ContainerOutcome {
        ContainerOutcome::Started {
            container_id: id.into(),
        }
    }

    #[test]
    fn a_first_start_reads_only_what_it_started() {
        let actions = PodActions {
            // As kubelet computes it for a new pod: nothing to kill, though.
            kill_pod: true,
            create_sandbox: true,
            containers_to_start: vec![0, 1],
            ..Default::default()
        };
        let backoff = ContainerOutcome::BackOff {
            reason: SyncReason::ImagePullBackOff,
            message: "back-off".into(),
            until: 5,
        };
        let r = result(actions, &[("a", started("c1")), ("b", backoff)]);
        assert_eq!(r.only_started(), Some(vec!["c1"]));
    }

    #[test]
    fn kills_failures_and_unread_sandboxes_need_a_full_read() {
        let kill = PodActions {
            containers_to_kill: BTreeMap::from([(
                "old".to_string(),
                KillReason {
                    name: "a".into(),
                    message: "unhealthy".into(),
                },
            )]),
            containers_to_start: vec![0],
            ..Default::default()
        };
        let mut killed = result(kill, &[("a", started("c1"))]);
        killed.killed = true;
        assert_eq!(killed.only_started(), None);

        let restart = PodActions {
            kill_pod: true,
            create_sandbox: true,
            ..Default::default()
        };
        let mut restarted = result(restart, &[]);
        restarted.killed = true;
        assert_eq!(
            restarted.only_started(),
            None,
            "the old sandbox was stopped"
        );

        let failed = ContainerOutcome::Failed {
            reason: SyncReason::RunContainerError,
            message: "exec failed".into(),
        };
        let start = PodActions {
            containers_to_start: vec![0, 1],
            ..Default::default()
        };
        assert_eq!(
            result(start.clone(), &[("a", started("c1")), ("b", failed)]).only_started(),
            None
        );

        let mut unread = result(
            PodActions {
                create_sandbox: true,
                ..start
            },
            &[("a", started("c1"))],
        );
        unread.new_sandbox = None;
        assert_eq!(
            unread.only_started(),
            None,
            "the new sandbox was never read"
        );

        let mut errored = result(PodActions::default(), &[]);
        errored.pod_error = Some(SyncError::new(SyncReason::CreatePodSandboxError, "no"));
        assert_eq!(errored.only_started(), None);
    }
}

#[cfg(test)]
#[path = "sync_pod_harness.rs"]
mod harness;
#[cfg(test)]
#[path = "sync_pod_restart_tests.rs"]
mod restart_tests;
#[cfg(test)]
#[path = "sync_pod_tests.rs"]
mod start_tests;
