//! Waits derived from the stages: what a container waited for after the one before it
//! had started (a sidecar) or exited (an ordinary init container), until its own work
//! began. kubelet starts the next container only once a sync sees the one before it
//! running (and, with a startupProbe, started) or succeeded; with no evented PLEG for
//! starts, that is up to a relist period.

use k8s_openapi::api::core::v1::{Container, Pod};

use super::model::StageSource;
use super::runtime_stages::exit_of;
use super::stage_kind::StageKind;
use super::stage_name::StageName;
use super::stages::PodBuilder;

/// Kinds of stage that begin a container's own work.
const WORK_BEGINS: &[StageKind] = &[
    StageKind::ImagePullerWait,
    StageKind::ImagePull,
    StageKind::ContainerCreate,
];

impl PodBuilder<'_, '_> {
    /// When `next`'s own work began.
    fn work_began(&self, next: &str) -> Option<u64> {
        self.stages
            .iter()
            .filter(|s| s.container.as_deref() == Some(next) && WORK_BEGINS.contains(s.kind()))
            .map(|s| s.start_ns)
            .min()
    }

    /// The container that follows init container `i`: the next init container, or after
    /// the last one the first regular container.
    fn after_init<'p>(
        init: &'p [Container],
        regular: &'p [Container],
        i: usize,
    ) -> Option<&'p Container> {
        init.get(i + 1).or_else(|| regular.first())
    }

    /// kubelet starts what follows a sidecar (the next init container, or after the last
    /// one the regular containers) only once a sync sees the sidecar running and, if it
    /// has a startupProbe, started. The time from the sidecar's StartContainer until the
    /// next container's work began is that wait: `sidecar_wait:<next>`.
    pub(super) fn sidecar_waits(&mut self) {
        let Some(spec) = self.info.pod.and_then(|p: &Pod| p.spec.as_ref()) else {
            return;
        };
        let init = spec.init_containers.as_deref().unwrap_or_default();
        for (i, c) in init.iter().enumerate() {
            if !crate::kubelet::pod_actions::is_restartable_init_container(c) {
                continue;
            }
            let Some(next) = Self::after_init(init, &spec.containers, i) else {
                continue;
            };
            let start_stage = StageName::of(StageKind::ContainerStart, &c.name);
            let probe_stage = StageName::of(StageKind::StartupProbeWait, &c.name);
            let started = self
                .stages
                .iter()
                .filter(|s| s.stage == start_stage && s.ok)
                .map(|s| s.end_ns)
                .min();
            // With a startup probe, the wait for it is a stage of its own; what is left
            // is the time until a sync saw it pass.
            let passed = self
                .stages
                .iter()
                .filter(|s| s.stage == probe_stage)
                .map(|s| s.end_ns)
                .min();
            let started = match (started, passed) {
                (Some(s), Some(p)) => Some(s.max(p)),
                (s, _) => s,
            };
            let next_began = self.work_began(&next.name);
            let (Some(started), Some(began)) = (started, next_began) else {
                continue;
            };
            if began <= started {
                continue;
            }
            let mut s = self.stage(
                StageName::of(StageKind::SidecarWait, &next.name),
                started,
                began,
                StageSource::Agent,
            );
            s.container = Some(next.name.clone());
            s.detail = if passed.is_some() {
                format!(
                    "from sidecar {}'s startup probe passing until a sync saw it",
                    c.name
                )
            } else if c.startup_probe.is_some() {
                format!(
                    "until a sync saw sidecar {} running and its startup probe passed",
                    c.name
                )
            } else {
                format!("until a sync saw sidecar {} running", c.name)
            };
            self.stages.push(s);
        }
    }

    /// An ordinary init container runs to completion before the next container starts:
    /// `init_run:<c>` is its run, from its first exec to that process's exit (kernel),
    /// and `init_wait:<next>` the time from that exit until the next container's work
    /// began (the runtime recording the exit, then a sync seeing it).
    pub(super) fn init_waits(&mut self) {
        let Some(spec) = self.info.pod.and_then(|p: &Pod| p.spec.as_ref()) else {
            return;
        };
        let init = spec.init_containers.as_deref().unwrap_or_default();
        for (i, c) in init.iter().enumerate() {
            if crate::kubelet::pod_actions::is_restartable_init_container(c) {
                continue;
            }
            let exec_stage = StageName::of(StageKind::AppFirstExec, &c.name);
            let Some(exec) = self.stages.iter().find(|s| s.stage == exec_stage) else {
                continue;
            };
            let (Some(pid), at) = (exec.pid, exec.start_ns) else {
                continue;
            };
            let (container_id, sandbox_id) = (exec.container_id.clone(), exec.sandbox_id.clone());
            let exit = exit_of(self.kernel.iter().map(|(e, _)| *e), pid, at);
            let Some((exited, code, signal)) = exit else {
                continue;
            };
            let mut run = self.stage(
                StageName::of(StageKind::InitRun, &c.name),
                at,
                exited,
                StageSource::Kernel,
            );
            run.container = Some(c.name.clone());
            run.container_id = container_id.clone();
            run.sandbox_id = sandbox_id;
            run.pid = Some(pid);
            run.exit_code = code;
            run.signal = signal;
            run.ok = code == Some(0);
            run.detail = match (code, signal) {
                (Some(code), _) => format!("exited with code {code}"),
                (_, Some(sig)) => format!("killed by signal {sig}"),
                _ => "exited".into(),
            };
            self.stages.push(run);
            let Some(next) = Self::after_init(init, &spec.containers, i) else {
                continue;
            };
            // An exit before StartContainer returned waits for the call first: that
            // time is the call's.
            let start_stage = StageName::of(StageKind::ContainerStart, &c.name);
            let returned = self
                .stages
                .iter()
                .find(|s| s.stage == start_stage && s.container_id == container_id)
                .map_or(exited, |s| s.end_ns);
            let from = exited.max(returned);
            let Some(began) = self.work_began(&next.name).filter(|b| *b > from) else {
                continue;
            };
            let mut s = self.stage(
                StageName::of(StageKind::InitWait, &next.name),
                from,
                began,
                StageSource::Agent,
            );
            s.container = Some(next.name.clone());
            s.detail = format!(
                "from init container {}'s exit (and StartContainer's return) until the runtime reported it and a sync saw it succeed",
                c.name
            );
            self.stages.push(s);
        }
    }
}
