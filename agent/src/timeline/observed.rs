//! Stages of a pod another CRI client ran, from what `podlapse observe` recorded: the
//! runtime's own times for its sandbox and containers, and the kernel stages attributed
//! by identity as for any pod. What only the client knows (admission, its pod worker's
//! waits, its CRI calls' starts) has no stage: it is absent, not guessed.

use std::collections::BTreeMap;

use super::model::{Stage, StageSource};
use super::stage_kind::StageKind;
use super::stage_name::StageName;
use super::stages::PodBuilder;
use crate::trace::{Observation, ObservedRecord, ObservedVia};

/// What the timeline says of an observed time.
fn via_detail(o: &ObservedRecord) -> &'static str {
    match (o.via, o.runtime_ns.is_some()) {
        (ObservedVia::Events, _) => "the runtime's event",
        (ObservedVia::Polling, true) => "the runtime's status",
        (ObservedVia::Polling, false) => "seen in the runtime's list (up to a poll late)",
    }
}

impl<'i, 'a: 'i> PodBuilder<'i, 'a> {
    /// pod_seen, sandbox_ready, and per container container_created, container_started
    /// with its kernel stages, then running. Returns container ID to name.
    pub(super) fn observed_stages(
        &mut self,
        observed: &[&'a ObservedRecord],
    ) -> BTreeMap<String, String> {
        let mut ids = BTreeMap::new();
        if observed.is_empty() {
            // A pod only the kernel saw (an observed trace names such pods by their CNI
            // arguments): the runtime kept none of its sandboxes.
            if self.calls.is_empty() && self.info.seen_ns.is_none() && !self.kernel.is_empty() {
                self.observed_seen(observed);
                self.notes.push(
                    "the runtime kept no sandbox of this pod: only the kernel saw it (each RunPodSandbox failed, or is still running)".into(),
                );
            }
            return ids;
        }
        let missed = observed.iter().filter(|o| o.stream_missed).count();
        if missed > 0 {
            self.notes.push(format!(
                "the runtime's event stream missed {missed} of its changes: a list found them, \
                 up to a relist late"
            ));
        }
        // A pod the observer found already there: its startup happened unseen, so it has
        // no pod_seen and no running, only what the runtime and kernel still report.
        let before_start = observed
            .iter()
            .any(|o| o.before_start && o.what == Observation::SandboxReady);
        if before_start {
            self.notes.push(
                "already there when podlapse observe started: its startup was not observed".into(),
            );
        } else {
            self.observed_seen(observed);
        }
        for o in observed {
            if o.what == Observation::SandboxReady {
                let t = o.happened_ns();
                let mut s = self.stage(StageKind::SandboxReady.into(), t, t, StageSource::Runtime);
                s.sandbox_id = Some(o.sandbox_id.clone());
                s.detail = match o.ip.as_str() {
                    "" => format!("no pod IP (host network); {}", via_detail(o)),
                    ip => format!("ip {ip}; {}", via_detail(o)),
                };
                self.stages.push(s);
            }
        }
        // Each container once, by ID, in the order they were created.
        let mut containers: Vec<(&str, &str, &str)> = Vec::new();
        for o in observed {
            if !o.container_id.is_empty()
                && !containers.iter().any(|(id, _, _)| *id == o.container_id)
            {
                containers.push((&o.container_id, &o.container, &o.sandbox_id));
            }
        }
        let mut started: Vec<(u64, &str, bool)> = Vec::new();
        for (id, name, sandbox) in containers {
            ids.insert(id.to_string(), name.to_string());
            let of = |what| {
                observed
                    .iter()
                    .find(|o| o.container_id == id && o.what == what)
            };
            let with = |mut s: Stage| {
                s.container = Some(name.to_string());
                s.container_id = Some(id.to_string());
                s.sandbox_id = Some(sandbox.to_string());
                s
            };
            for (what, kind) in [
                (Observation::ContainerCreated, StageKind::ContainerCreated),
                (Observation::ContainerStarted, StageKind::ContainerStarted),
            ] {
                if let Some(o) = of(what) {
                    let t = o.happened_ns();
                    let mut s = self.stage(StageName::of(kind, name), t, t, StageSource::Runtime);
                    s.detail = via_detail(o).into();
                    self.stages.push(with(s));
                }
            }
            if let Some(s) = self.cgroup_stage(StageName::of(StageKind::ContainerCgroup, name), id)
            {
                self.stages.push(with(s));
            }
            for s in self.runtime_stages(id, Some(name)) {
                self.stages.push(with(s));
            }
            if let Some(s) = self.first_exec(StageName::of(StageKind::AppFirstExec, name), |o| {
                o.container_id.as_deref() == Some(id)
            }) {
                self.stages.push(with(s));
            }
            if let Some(o) = of(Observation::ContainerStarted) {
                let exited = of(Observation::ContainerExited).is_some();
                started.push((o.happened_ns(), name, exited));
            }
        }
        if !before_start {
            self.observed_running(&started);
        }
        ids
    }

    /// pod_seen: the first sign of the pod anything recorded, the kernel's (its pod
    /// cgroup, made before the client asks for a sandbox) or the runtime's.
    fn observed_seen(&mut self, observed: &[&'a ObservedRecord]) {
        if self.stages.iter().any(|s| s.stage.is(&StageKind::PodSeen)) {
            return;
        }
        let kernel = self.kernel.first().map(|(e, _)| e.ktime_ns());
        let runtime = observed.iter().map(|o| o.happened_ns()).min();
        let (t, detail) = match (kernel, runtime) {
            (Some(k), Some(r)) if k <= r => (k, "first kernel event of the pod"),
            (_, Some(r)) => (r, "first report of the runtime about the pod"),
            (Some(k), None) => (k, "first kernel event of the pod"),
            (None, None) => return,
        };
        let source = if Some(t) == kernel {
            StageSource::Kernel
        } else {
            StageSource::Runtime
        };
        let mut s = self.stage(StageKind::PodSeen.into(), t, t, source);
        s.detail = detail.into();
        self.stages.push(s);
    }

    /// running: every container the runtime showed started and still running at the last
    /// start (an init container that ran to completion before is not one of them).
    fn observed_running(&mut self, started: &[(u64, &str, bool)]) {
        let Some(last) = started.iter().map(|(t, _, _)| *t).max() else {
            return;
        };
        let running: Vec<&str> = started
            .iter()
            .filter(|(t, _, exited)| !exited || *t == last)
            .map(|(_, n, _)| *n)
            .collect();
        let mut s = self.stage(StageKind::Running.into(), last, last, StageSource::Runtime);
        s.detail = format!(
            "all {} containers the runtime showed started ({})",
            running.len(),
            running.join(", ")
        );
        self.stages.push(s);
    }
}
