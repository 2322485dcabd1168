//! From a pod's CRI calls, pod events and attributed kernel events to its named stages.
//!
//! Each stage says where its times come from. CRI stages are the recording wrapper's
//! spans; kernel stages come only from events attributed to the pod's own sandbox or
//! container; agent stages from what the agent recorded itself.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod};

use podlapse_core::record::{CriMethod, PodSandboxState};

use super::attribution::{Attribution, Owner, Rule};
use super::cni_capture::{HookHistory, assemble};
use super::cni_reply::CniReply;
use super::ids::{cgroup_ids, is_runtime_helper_exec};
use super::index::{Index, PodInfo};
use super::model::{PodTimeline, Stage, StageSource, Timeline};
use super::runtime_spans;
use super::runtime_stages::{forked_detail, runtime_steps, spawned_at};
use super::stage_kind::StageKind;
use super::stage_name::StageName;
use crate::cri::CriCall;
use crate::ebpf::event::kind_name;
use crate::ebpf::{KernelEvent, NetnsCall};

/// What a wait stage says: whose work went first, and what it waited behind.
fn wait_detail(w: &crate::trace::PodWaitRecord) -> String {
    let behind = if w.wait.behind.is_empty() {
        String::new()
    } else {
        format!("behind {}", w.wait.behind.join(", "))
    };
    [behind.as_str(), w.wait.detail.as_str()]
        .iter()
        .filter(|s| !s.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join("; ")
}

/// A kernel event attributed to the pod being built.
pub(super) type Attributed<'a> = (&'a KernelEvent, &'a Owner);

/// The timeline of the pods `wanted` picks (by UID); the event counts are the run's.
pub(super) fn build(
    index: &Index<'_>,
    attribution: &Attribution,
    wanted: &dyn Fn(&str) -> bool,
) -> Timeline {
    let mut by_pod: BTreeMap<&str, Vec<Attributed<'_>>> = BTreeMap::new();
    let mut node_events = 0;
    let mut other_pod_events = 0;
    for &(i, e) in &index.kernel {
        match attribution.owner(i) {
            Some(o) if index.pods.contains_key(&o.pod_uid) => {
                if wanted(&o.pod_uid) {
                    by_pod.entry(o.pod_uid.as_str()).or_default().push((e, o));
                }
            }
            Some(_) => other_pod_events += 1,
            None => node_events += 1,
        }
    }
    let mut pods: Vec<PodTimeline> = index
        .pods
        .iter()
        .filter(|(uid, _)| wanted(uid))
        .map(|(uid, info)| {
            let kernel = by_pod.get(uid.as_str()).map_or(&[][..], Vec::as_slice);
            PodBuilder::new(index, uid, info, kernel).build()
        })
        .collect();
    pods.sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
    Timeline {
        pods,
        kernel_events: index.kernel.len() as u64,
        node_events,
        other_pod_events,
    }
}

pub(super) struct PodBuilder<'i, 'a> {
    pub(super) index: &'i Index<'a>,
    pub(super) uid: &'i str,
    pub(super) info: &'i PodInfo<'a>,
    pub(super) kernel: &'i [Attributed<'i>],
    pub(super) calls: Vec<&'a CriCall>,
    pub(super) stages: Vec<Stage>,
    pub(super) notes: Vec<String>,
}

impl<'i, 'a: 'i> PodBuilder<'i, 'a> {
    fn new(
        index: &'i Index<'a>,
        uid: &'i str,
        info: &'i PodInfo<'a>,
        kernel: &'i [Attributed<'i>],
    ) -> Self {
        PodBuilder {
            index,
            uid,
            info,
            kernel,
            calls: index.calls_of(uid).collect(),
            stages: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub(super) fn stage(
        &self,
        name: StageName,
        start_ns: u64,
        end_ns: u64,
        source: StageSource,
    ) -> Stage {
        Stage::new(
            self.uid,
            &self.info.namespace,
            &self.info.name,
            name,
            start_ns,
            end_ns,
            source,
        )
    }

    fn cri_stage(&self, name: StageName, call: &CriCall) -> Stage {
        let mut s = self.stage(name, call.start_ns, call.end_ns, StageSource::Cri);
        s.ok = call.ok();
        s.code = Some(call.code);
        s.sandbox_id = non_empty(&call.sandbox_id);
        s.container = non_empty(&call.container);
        s.container_id = non_empty(&call.container_id);
        if !call.ok() {
            s.detail = call.message.clone();
        }
        s
    }

    fn build(mut self) -> PodTimeline {
        self.pod_stages();
        self.pod_waits();
        let observed = self.index.observed_of(self.uid);
        let mut sandboxes = self.sandbox_ids();
        for o in observed {
            if !o.sandbox_id.is_empty() && !sandboxes.contains(&o.sandbox_id) {
                sandboxes.push(o.sandbox_id.clone());
            }
        }
        for call in self.calls_named(CriMethod::RunPodSandbox) {
            let mut s = self.cri_stage(StageKind::SandboxRequested.into(), call);
            if call.attempt > 0 {
                s.detail = format!("attempt {}; {}", call.attempt, s.detail)
                    .trim_end_matches("; ")
                    .to_string();
            }
            self.stages.push(s);
        }
        for id in &sandboxes {
            self.sandbox_stages(id);
        }
        let mut containers = self.container_stages();
        containers.extend(self.observed_stages(observed));
        self.sidecar_waits();
        self.init_waits();
        self.pod_status_stages();
        self.runtime_span_stages();
        self.kubelet_span_stages();
        if self.kernel.is_empty() {
            self.notes
                .push("no kernel event was attributed to this pod: CRI timing only".into());
        }
        let rank = |s: &Stage| s.kind().rank();
        self.stages.sort_by_key(|s| (s.start_ns, rank(s), s.end_ns));
        let mut kernel_events: BTreeMap<String, u64> = BTreeMap::new();
        for (e, _) in self.kernel {
            *kernel_events
                .entry(kind_name(e.kind()).to_string())
                .or_default() += 1;
        }
        let ip = self
            .stages
            .iter()
            .rev()
            .find(|s| s.stage.is(&StageKind::SandboxReady))
            .and_then(|s| s.detail.strip_prefix("ip "))
            .and_then(|rest| rest.split([' ', ';']).next())
            .map(str::to_string);
        let sources = super::sources::of_pod(
            self.index.sources,
            &super::sources::PodRecords {
                calls: &self.calls,
                observed: observed.len() as u64,
                kernel_events: self.kernel.len() as u64,
                runtime_spans: self.index.runtime_spans_of(self.uid),
            },
        );
        PodTimeline {
            uid: self.uid.to_string(),
            namespace: self.info.namespace.clone(),
            name: self.info.name.clone(),
            seen_ns: self
                .stages
                .iter()
                .find(|s| s.stage.is(&StageKind::PodSeen))
                .map(|s| s.start_ns),
            sandbox_ids: sandboxes,
            containers,
            ip,
            stages: self.stages,
            kernel_events,
            notes: self.notes,
            sources,
        }
    }

    fn calls_named(&self, method: CriMethod) -> std::vec::IntoIter<&'a CriCall> {
        let calls: Vec<&'a CriCall> = self
            .calls
            .iter()
            .copied()
            .filter(|c| c.method == method)
            .collect();
        calls.into_iter()
    }

    /// pod_seen, admitted, pod_cgroup_created.
    fn pod_stages(&mut self) {
        let first_call = self.calls.first().copied();
        let seen = match (self.info.seen_ns, first_call) {
            (Some(t), _) => Some((t, StageSource::Agent, "config ADD")),
            (None, Some(c)) => Some((c.start_ns, StageSource::Cri, "first CRI call")),
            (None, None) => None,
        };
        if let Some((t, source, detail)) = seen {
            let mut s = self.stage(StageKind::PodSeen.into(), t, t, source);
            s.detail = detail.into();
            self.stages.push(s);
        }
        match first_call {
            Some(c) => {
                // Only an admitted pod gets a pod worker, and a worker's first act is to
                // read the pod's state from the runtime.
                let mut s = self.stage(
                    StageKind::Admitted.into(),
                    c.start_ns,
                    c.start_ns,
                    StageSource::Cri,
                );
                s.detail = format!("pod worker's first sync ({})", c.method);
                self.stages.push(s);
            }
            None => {
                if let Some(e) = self.index.events_of(self.uid).next() {
                    self.notes.push(format!(
                        "no CRI call for this pod: {}: {}",
                        e.event.reason, e.event.message
                    ));
                }
            }
        }
        let mkdirs: Vec<(&KernelEvent, &crate::ebpf::Cgroup)> = self
            .kernel
            .iter()
            .filter_map(|(e, _)| match e {
                KernelEvent::CgroupMkdir { cgroup, .. }
                    if cgroup_ids(&cgroup.path).is_pod_cgroup() =>
                {
                    Some((*e, cgroup))
                }
                _ => None,
            })
            .collect();
        if let (Some((first, cg)), Some((last, _))) = (mkdirs.first(), mkdirs.last()) {
            let mut s = self.stage(
                StageKind::PodCgroupCreated.into(),
                first.ktime_ns(),
                last.ktime_ns(),
                StageSource::Kernel,
            );
            s.cgroup_id = mkdirs
                .iter()
                .find(|(_, c)| c.hierarchy == 0)
                .map(|(_, c)| c.cgroup_id);
            s.pid = Some(first.meta().tgid);
            s.detail = format!("{} ({} hierarchies)", cg.path, mkdirs.len());
            self.stages.push(s);
        }
    }

    /// Waits of the whole pod (no container): `<kind>_wait`, e.g. `network_wait`,
    /// `pod_worker_wait`, `back_off_wait` when several containers were backing off.
    fn pod_waits(&mut self) {
        let waits: Vec<Stage> = self
            .index
            .waits_of(self.uid)
            .filter(|w| w.wait.container.is_none())
            .map(|w| self.wait_stage(w))
            .collect();
        self.stages.extend(waits);
    }

    /// A wait the agent recorded: `<kind>_wait`, or `<kind>_wait:<c>` when one container
    /// waited.
    fn wait_stage(&self, w: &crate::trace::PodWaitRecord) -> Stage {
        let kind = StageKind::from(w.wait.wait);
        let name = match &w.wait.container {
            Some(c) => StageName::of(kind, c),
            None => StageName::new(kind),
        };
        let mut s = self.stage(name, w.start_ns, w.end_ns, StageSource::Agent);
        s.container = w.wait.container.clone();
        s.detail = wait_detail(w);
        s
    }

    /// The pod's sandboxes in the order they appeared: those CRI created, and those only
    /// the kernel saw (their RunPodSandbox failed, so CRI never returned their ID).
    fn sandbox_ids(&self) -> Vec<String> {
        let mut seen: Vec<(u64, String)> = Vec::new();
        let mut add = |t: u64, id: &str| {
            if !id.is_empty() && !seen.iter().any(|(_, s)| s == id) {
                seen.push((t, id.to_string()));
            }
        };
        for c in &self.calls {
            if !c.sandbox_id.is_empty()
                && self.index.sandboxes.get(c.sandbox_id.as_str()) == Some(&self.uid)
            {
                add(c.start_ns, &c.sandbox_id);
            }
        }
        for (e, o) in self.kernel {
            if let (Some(id), None) = (&o.sandbox_id, &o.container_id) {
                add(e.ktime_ns(), id);
            }
        }
        seen.sort_by_key(|(t, _)| *t);
        seen.into_iter().map(|(_, id)| id).collect()
    }

    /// Events attributed to sandbox `id` itself (not to one of its containers).
    fn of_sandbox<'s>(&'s self, id: &'s str) -> impl Iterator<Item = Attributed<'i>> + 's {
        self.kernel
            .iter()
            .copied()
            .filter(move |(_, o)| o.sandbox_id.as_deref() == Some(id) && o.container_id.is_none())
    }

    fn sandbox_stages(&mut self, id: &str) {
        let with = |mut s: Stage| {
            s.sandbox_id = Some(id.to_string());
            s
        };
        let netns = self.of_sandbox(id).find_map(|(e, o)| match e {
            KernelEvent::Netns {
                meta,
                start_ns,
                netns_inum,
                syscall,
                ..
            } if o.rule == Rule::Netns && *syscall != NetnsCall::Setns => {
                Some((meta, *start_ns, *netns_inum, *syscall))
            }
            _ => None,
        });
        if let Some((meta, start, inum, syscall)) = netns {
            let mut s = with(self.stage(
                StageKind::NetnsCreated.into(),
                start,
                meta.ktime_ns,
                StageSource::Kernel,
            ));
            s.netns_inum = inum;
            s.pid = Some(meta.tgid);
            s.detail = format!("{syscall}(CLONE_NEWNET) by {}", meta.comm);
            self.stages.push(s);
        }
        self.cni_stages(id);
        for s in self.runtime_stages(id, None) {
            self.stages.push(with(s));
        }
        if let Some(s) = self.cgroup_stage(StageKind::SandboxCgroup.into(), id) {
            self.stages.push(with(s));
        }
        if let Some(s) = self.first_exec(StageKind::PauseExec.into(), |o| {
            o.sandbox_id.as_deref() == Some(id) && o.container_id.is_none()
        }) {
            self.stages.push(with(s));
        }
        // Ready with its IP: the first status read after RunPodSandbox returned it.
        let created = self
            .calls_named(CriMethod::RunPodSandbox)
            .find(|c| c.ok() && c.sandbox_id == id);
        if let Some(run) = created {
            let status = self.calls_named(CriMethod::PodSandboxStatus).find(|c| {
                c.sandbox_id == id
                    && c.ok()
                    && c.start_ns >= run.end_ns
                    && c.response.pod_sandbox_state() == Some(PodSandboxState::Ready)
            });
            let s = match status {
                Some(st) => {
                    let mut s = self.cri_stage(StageKind::SandboxReady.into(), st);
                    s.detail = match st.response.pod_ip() {
                        Some(ip) => format!("ip {ip}"),
                        None => "no pod IP (host network)".into(),
                    };
                    s
                }
                None => {
                    let mut s = self.stage(
                        StageKind::SandboxReady.into(),
                        run.end_ns,
                        run.end_ns,
                        StageSource::Cri,
                    );
                    s.detail = "RunPodSandbox returned; no status read".into();
                    s
                }
            };
            self.stages.push(with(s));
        }
    }

    /// cni_add and one cni_plugin:<name> per plugin run, IPAM plugins included.
    fn cni_stages(&mut self, id: &str) {
        let adds: Vec<(&KernelEvent, &String, Option<u64>)> = self
            .of_sandbox(id)
            .filter_map(|(e, _)| match e {
                KernelEvent::CniExec(c) if c.command == "ADD" => Some((e, &c.plugin, c.forked_ns)),
                _ => None,
            })
            .collect();
        if adds.is_empty() {
            return;
        }
        let plugin_pids: BTreeMap<u32, &str> = adds
            .iter()
            .map(|(e, p, _)| (e.meta().tgid, p.as_str()))
            .collect();
        let hooks = HookHistory::new(self.index.kernel.iter().filter_map(|(_, e)| match e {
            KernelEvent::CniWriteHook(h) => Some(h.as_ref()),
            _ => None,
        }));
        let mut plugins = Vec::new();
        for (exec, plugin, forked) in &adds {
            let pid = exec.meta().tgid;
            let at = exec.ktime_ns();
            // The runtime (or the plugin delegating) forked the plugin's process for
            // this run: the run starts there.
            let forked = forked.and_then(|f| spawned_at(f, at));
            let after = |e: &KernelEvent| e.meta().tgid == pid && e.ktime_ns() >= at;
            let exit = self.kernel.iter().find_map(|(e, _)| match e {
                KernelEvent::Exit {
                    exit_code, signal, ..
                } if after(e) => Some((e.ktime_ns(), *exit_code, *signal)),
                _ => None,
            });
            let parent = self.kernel.iter().find_map(|(e, _)| match e {
                KernelEvent::Exec { ppid: Some(p), .. } if after(e) => plugin_pids.get(p).copied(),
                _ => None,
            });
            let mut s = self.stage(
                StageName::of(StageKind::CniPlugin, plugin.as_str()),
                forked.unwrap_or(at),
                exit.map_or(at, |(t, _, _)| t),
                StageSource::Kernel,
            );
            s.sandbox_id = Some(id.to_string());
            s.pid = Some(pid);
            let mut detail = vec!["ADD".to_string()];
            if let Some(p) = parent {
                detail.push(format!("delegated by {p}"));
            }
            if let Some(f) = forked {
                detail.push(forked_detail(f, at));
            }
            match exit {
                Some((_, code, signal)) => {
                    s.exit_code = code;
                    s.signal = signal;
                    s.ok = code == Some(0);
                    if let Some(sig) = signal {
                        detail.push(format!("killed by signal {sig}"));
                    }
                }
                None => {
                    s.ok = false;
                    detail.push("exit not seen".into());
                }
            }
            self.plugin_reply(&mut s, &hooks, at, exit.map(|(t, _, _)| t));
            if let Some(reply @ CniReply::Error { .. }) = &s.reply {
                detail.push(reply.summary());
            }
            s.detail = detail.join(", ");
            plugins.push(s);
        }
        let start = plugins.iter().map(|s| s.start_ns).min().unwrap_or(0);
        let end = plugins.iter().map(|s| s.end_ns).max().unwrap_or(start);
        let mut add = self.stage(StageKind::CniAdd.into(), start, end, StageSource::Kernel);
        add.sandbox_id = Some(id.to_string());
        // A plugin that failed for good names the ADD's failure; else one whose exit has
        // not come yet (still running, or its exit lost) leaves the ADD's outcome pending
        // as its own is: no exit code, no signal. Read as failed, a slow plugin would end
        // the pod's startup in the metrics before it got its IP.
        let failed = plugins
            .iter()
            .find(|s| !s.ok && !s.outcome_pending())
            .or_else(|| plugins.iter().find(|s| !s.ok));
        add.ok = failed.is_none();
        (add.exit_code, add.signal) = match failed {
            Some(f) => (f.exit_code, f.signal),
            None => (Some(0), None),
        };
        add.detail = match failed {
            Some(f) if f.outcome_pending() => format!(
                "{}: exit not seen",
                f.stage.cni_plugin().unwrap_or_default()
            ),
            Some(f) => format!(
                "{} failed{}{}",
                f.stage.cni_plugin().unwrap_or_default(),
                f.exit_code
                    .map(|c| format!(" with exit code {c}"))
                    .unwrap_or_default(),
                f.signal
                    .map(|sig| format!(", killed by signal {sig}"))
                    .unwrap_or_default()
            ),
            None => plugins
                .iter()
                .map(|s| s.stage.cni_plugin().unwrap_or_default())
                .collect::<Vec<_>>()
                .join(", "),
        };
        self.stages.push(add);
        self.stages.extend(plugins);
    }

    /// What the plugin run on `s` (process `s.pid`, exec'd at `at`, exited at `exit`)
    /// printed, from its captured output. Left unset when the recording says nothing of
    /// the capture (a trace from before it).
    fn plugin_reply(&self, s: &mut Stage, hooks: &HookHistory, at: u64, exit: Option<u64>) {
        let pid = s.pid;
        let chunks: Vec<&podlapse_core::record::CniOutput> = self
            .kernel
            .iter()
            .filter_map(|(e, _)| match e {
                KernelEvent::CniOutput(o)
                    if Some(o.meta.tgid) == pid
                        && o.meta.ktime_ns >= at
                        && exit.is_none_or(|t| o.meta.ktime_ns <= t) =>
                {
                    Some(o.as_ref())
                }
                _ => None,
            })
            .collect();
        if chunks.is_empty() && hooks.is_empty() {
            return;
        }
        let (reply, capture) = assemble(&chunks, s.start_ns, exit, hooks);
        s.reply = Some(reply);
        s.capture = capture;
    }

    /// The runtime's own steps for sandbox or container `id` (shim start, runc create,
    /// init and start), named after `container` when they are a container's.
    pub(super) fn runtime_stages(&self, id: &str, container: Option<&str>) -> Vec<Stage> {
        runtime_steps(self.kernel.iter().map(|(e, _)| *e), id)
            .into_iter()
            .map(|step| {
                let end = step.end_ns.unwrap_or(step.start_ns);
                let name = match container {
                    Some(c) => StageName::of(step.kind.clone(), c),
                    None => StageName::new(step.kind.clone()),
                };
                let mut s = self.stage(name, step.start_ns, end, StageSource::Kernel);
                s.pid = Some(step.pid);
                s.exit_code = step.exit_code;
                s.signal = step.signal;
                s.ok = step.end_ns.is_some()
                    && step.signal.is_none()
                    && step.exit_code.is_none_or(|c| c == 0);
                s.detail = step.detail;
                s
            })
            .collect()
    }

    /// The cgroup runc made for sandbox or container `id`, across hierarchies, until the
    /// task was moved in.
    pub(super) fn cgroup_stage(&self, name: StageName, id: &str) -> Option<Stage> {
        let events: Vec<(&KernelEvent, &crate::ebpf::Cgroup)> = self
            .kernel
            .iter()
            .filter_map(|(e, _)| match e {
                KernelEvent::CgroupMkdir { cgroup, .. }
                | KernelEvent::CgroupAttach { cgroup, .. }
                    if cgroup_ids(&cgroup.path).runtime_id == Some(id) =>
                {
                    Some((*e, cgroup))
                }
                _ => None,
            })
            .collect();
        let (first, cg) = events
            .iter()
            .find(|(e, _)| matches!(e, KernelEvent::CgroupMkdir { .. }))?;
        // Until the container's first task was moved in: later attaches are processes
        // `runc exec` adds (hooks, exec probes), not the cgroup's setup.
        let init = events.iter().find_map(|(e, _)| match e {
            KernelEvent::CgroupAttach { target_pid, .. } => Some(*target_pid),
            _ => None,
        });
        let last = events
            .iter()
            .filter(|(e, _)| match e {
                KernelEvent::CgroupAttach { target_pid, .. } => Some(*target_pid) == init,
                _ => true,
            })
            .map(|(e, _)| e.ktime_ns())
            .max()
            .unwrap_or(first.ktime_ns());
        let mut s = self.stage(name, first.ktime_ns(), last, StageSource::Kernel);
        s.pid = Some(first.meta().tgid);
        s.cgroup_id = events
            .iter()
            .find(|(e, c)| matches!(e, KernelEvent::CgroupMkdir { .. }) && c.hierarchy == 0)
            .map(|(_, c)| c.cgroup_id);
        s.detail = cg.path.clone();
        Some(s)
    }

    /// The first program the runtime started inside a cgroup of the pod: the first exec
    /// there that is not runc setting itself up.
    pub(super) fn first_exec(
        &self,
        name: StageName,
        whose: impl Fn(&Owner) -> bool,
    ) -> Option<Stage> {
        let (e, filename) = self.kernel.iter().find_map(|(e, o)| match e {
            KernelEvent::Exec { filename, .. }
                if o.rule == Rule::CgroupId && whose(o) && !is_runtime_helper_exec(filename) =>
            {
                Some((*e, filename))
            }
            _ => None,
        })?;
        let mut s = self.stage(name, e.ktime_ns(), e.ktime_ns(), StageSource::Kernel);
        s.pid = Some(e.meta().tgid);
        s.cgroup_id = Some(e.meta().cgroup_id);
        s.detail = filename.clone();
        Some(s)
    }

    /// The pod's containers, init containers first, as the spec lists them; containers
    /// CRI created that the spec does not name come last.
    fn spec_containers(&self) -> Vec<(String, String, Option<&'a Container>)> {
        let mut out: Vec<(String, String, Option<&'a Container>)> = Vec::new();
        let spec = self.info.pod.and_then(|p: &Pod| p.spec.as_ref());
        if let Some(spec) = spec {
            for c in spec
                .init_containers
                .iter()
                .flatten()
                .chain(spec.containers.iter())
            {
                out.push((c.name.clone(), c.image.clone().unwrap_or_default(), Some(c)));
            }
        }
        for call in self.calls_named(CriMethod::CreateContainer) {
            if !out.iter().any(|(n, _, _)| *n == call.container) {
                out.push((call.container.clone(), call.image.clone(), None));
            }
        }
        out
    }

    /// Per container: image_pull, container_create, container_cgroup, container_start,
    /// app_first_exec, post_start. Returns container ID to name.
    fn container_stages(&mut self) -> BTreeMap<String, String> {
        let mut ids = BTreeMap::new();
        let mut claimed: BTreeSet<*const CriCall> = BTreeSet::new();
        for (name, image, spec) in self.spec_containers() {
            let with = |mut s: Stage| {
                s.container = Some(name.clone());
                s
            };
            let pulls: Vec<&CriCall> = {
                let mut v = Vec::new();
                for c in self.calls_named(CriMethod::PullImage) {
                    if c.image != image || claimed.contains(&std::ptr::from_ref(c)) {
                        continue;
                    }
                    v.push(c);
                    if c.ok() {
                        break;
                    }
                }
                v
            };
            for w in self.index.waits_of(self.uid) {
                if w.wait.container.as_deref() == Some(name.as_str()) {
                    let s = self.wait_stage(w);
                    self.stages.push(s);
                }
            }
            if pulls.is_empty() {
                let present = self.index.events_of(self.uid).find(|e| {
                    e.event.reason == "Pulled" && e.event.container.as_deref() == Some(&name)
                });
                if let Some(e) = present {
                    let mut s = self.stage(
                        StageName::of(StageKind::ImagePull, &name),
                        e.at_ns,
                        e.at_ns,
                        StageSource::Agent,
                    );
                    s.detail = e.event.message.clone();
                    self.stages.push(with(s));
                }
            }
            for c in pulls {
                claimed.insert(std::ptr::from_ref(c));
                let mut s = self.cri_stage(StageName::of(StageKind::ImagePull, &name), c);
                if s.ok {
                    s.detail = image.clone();
                }
                self.stages.push(with(s));
            }
            let creates: Vec<&CriCall> = self
                .calls_named(CriMethod::CreateContainer)
                .filter(|c| c.container == name)
                .collect();
            for create in creates {
                let mut s =
                    self.cri_stage(StageName::of(StageKind::ContainerCreate, &name), create);
                if s.ok {
                    s.detail = create.image.clone();
                }
                self.stages.push(s);
                if !create.ok() || create.container_id.is_empty() {
                    continue;
                }
                let id = create.container_id.as_str();
                ids.insert(id.to_string(), name.clone());
                let with_id = |mut s: Stage| {
                    s.container = Some(name.clone());
                    s.container_id = Some(id.to_string());
                    s.sandbox_id = non_empty(&create.sandbox_id);
                    s
                };
                if let Some(s) =
                    self.cgroup_stage(StageName::of(StageKind::ContainerCgroup, &name), id)
                {
                    self.stages.push(with_id(s));
                }
                let start = self
                    .calls_named(CriMethod::StartContainer)
                    .find(|c| c.container_id == id);
                if let Some(c) = start {
                    let s = self.cri_stage(StageName::of(StageKind::ContainerStart, &name), c);
                    self.stages.push(s);
                }
                for s in self.runtime_stages(id, Some(&name)) {
                    self.stages.push(with_id(s));
                }
                if let Some(s) = self
                    .first_exec(StageName::of(StageKind::AppFirstExec, &name), |o| {
                        o.container_id.as_deref() == Some(id)
                    })
                {
                    self.stages.push(with_id(s));
                }
                if let (Some(c), Some(started)) = (spec, start) {
                    self.post_start(c, id, started);
                }
            }
        }
        ids
    }

    /// An exec postStart hook is the container's first ExecSync after it started: the
    /// hook runs before the sync that started the container ends, and probes only begin
    /// after that. Other hook kinds leave no record but a failure event.
    fn post_start(&mut self, c: &Container, id: &str, started: &CriCall) {
        let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) else {
            return;
        };
        let name = StageName::of(StageKind::PostStart, &c.name);
        if hook.exec.is_some()
            && let Some(call) = self
                .calls_named(CriMethod::ExecSync)
                .find(|x| x.container_id == id && x.start_ns >= started.end_ns)
        {
            let mut s = self.cri_stage(name, call);
            s.exit_code = call.response.exit_code();
            s.ok = call.ok() && s.exit_code == Some(0);
            self.stages.push(s);
            return;
        }
        let failed = self.index.events_of(self.uid).find(|e| {
            e.event.reason == "FailedPostStartHook"
                && e.event.container.as_deref() == Some(c.name.as_str())
                && e.at_ns >= started.start_ns
        });
        match failed {
            Some(e) => {
                let mut s = self.stage(name, e.at_ns, e.at_ns, StageSource::Agent);
                s.ok = false;
                s.container = Some(c.name.clone());
                s.container_id = Some(id.to_string());
                s.detail = e.event.message.clone();
                self.stages.push(s);
            }
            None if hook.exec.is_none() => self.notes.push(format!(
                "post_start:{}: only exec hooks leave a record; this one succeeded or is running",
                c.name
            )),
            None => {}
        }
    }

    /// running (every regular container started) and ready (when no probe gates it).
    fn pod_status_stages(&mut self) {
        let spec = self.info.pod.and_then(|p| p.spec.as_ref());
        let regular: Vec<String> = match spec {
            Some(s) => s.containers.iter().map(|c| c.name.clone()).collect(),
            None => {
                let mut v: Vec<String> = self
                    .calls_named(CriMethod::CreateContainer)
                    .map(|c| c.container.clone())
                    .collect();
                v.dedup();
                v
            }
        };
        if regular.is_empty() {
            return;
        }
        let mut last = 0;
        for name in &regular {
            let started = self
                .calls_named(CriMethod::StartContainer)
                .find(|c| c.ok() && c.container == *name);
            match started {
                Some(c) => last = last.max(c.end_ns),
                None => return,
            }
        }
        let mut s = self.stage(StageKind::Running.into(), last, last, StageSource::Cri);
        s.detail = format!("all {} containers started", regular.len());
        self.stages.push(s);
        let Some(spec) = spec else {
            return;
        };
        // kubelet's Ready: every container ready; one without a readiness or startup
        // probe is ready once running. Probe results are not recorded, but an exec
        // probe's runs are CRI ExecSync calls: when the only exec probe a container has
        // gates readiness, its first success is when the container became ready.
        let mut ready = last;
        let mut gated_by = "no readiness or startup probes: Ready once running";
        for c in &spec.containers {
            let Some(started) = self
                .calls_named(CriMethod::StartContainer)
                .find(|x| x.ok() && x.container == c.name)
            else {
                return;
            };
            let exec = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
                p.as_ref().is_some_and(|p| p.exec.is_some())
            };
            let gates = [&c.readiness_probe, &c.startup_probe];
            if gates.iter().all(|p| p.is_none()) {
                continue;
            }
            let readable = gates.iter().filter(|p| p.is_some()).count() == 1
                && gates.iter().all(|p| p.is_none() || exec(p))
                && !exec(&c.liveness_probe);
            if !readable {
                self.notes.push(format!(
                    "ready: {} has probes whose results are not recorded, so the time the pod became Ready is not shown",
                    c.name
                ));
                return;
            }
            let hook = c
                .lifecycle
                .as_ref()
                .and_then(|l| l.post_start.as_ref())
                .is_some_and(|h| h.exec.is_some());
            let passed = self
                .calls_named(CriMethod::ExecSync)
                .filter(|x| x.container_id == started.container_id && x.start_ns >= started.end_ns)
                .skip(usize::from(hook))
                .find(|x| x.ok() && x.response.exit_code() == Some(0));
            match passed {
                Some(x) => {
                    ready = ready.max(x.end_ns);
                    gated_by = "the last exec readiness probe to pass";
                }
                None => return,
            }
        }
        let mut s = self.stage(StageKind::Ready.into(), ready, ready, StageSource::Cri);
        s.detail = gated_by.into();
        self.stages.push(s);
    }
}

impl<'i, 'a: 'i> PodBuilder<'i, 'a> {
    /// `runtime:<step>` stages from the runtime's spans, inside the call that holds them
    /// (`runtime_spans.rs`); `:<container>` for a container's calls and pulls.
    fn runtime_span_stages(&mut self) {
        let spans = self.index.runtime_spans_of(self.uid);
        if spans.is_empty() {
            return;
        }
        // An observed pod has no call of podlapse's: the runtime's server spans stand in.
        let (servers, server_tied) = if self.calls.is_empty() {
            runtime_spans::server_calls(self.uid, spans)
        } else {
            (Vec::new(), Vec::new())
        };
        let (calls, tied): (Vec<&CriCall>, Vec<Option<usize>>) = if self.calls.is_empty() {
            (servers.iter().collect(), server_tied)
        } else {
            (
                self.calls.clone(),
                runtime_spans::attribute(&self.calls, spans),
            )
        };
        let mut made = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            let mine: Vec<&podlapse_core::record::RuntimeSpan> = spans
                .iter()
                .zip(&tied)
                .filter(|(_, t)| **t == Some(i))
                .map(|(s, _)| *s)
                .collect();
            if mine.is_empty() {
                continue;
            }
            // A pull names no container; its image_pull stage does.
            let container = if call.container.is_empty() && call.method == CriMethod::PullImage {
                self.stages
                    .iter()
                    .find(|s| *s.kind() == StageKind::ImagePull && s.start_ns == call.start_ns)
                    .and_then(|s| s.container.clone())
                    .unwrap_or_default()
            } else if call.container.is_empty() && !call.container_id.is_empty() {
                self.observed_container_name(&call.container_id)
            } else {
                call.container.clone()
            };
            for r in runtime_spans::call_stages(call, &mine) {
                let name = if container.is_empty() {
                    StageName::of(StageKind::Runtime, r.step.name())
                } else {
                    StageName::of(StageKind::Runtime, format!("{}:{container}", r.step.name()))
                };
                let mut s = self.stage(name, r.start_ns, r.end_ns, StageSource::Runtime);
                s.ok = r.ok;
                s.sandbox_id = non_empty(&call.sandbox_id);
                s.container = non_empty(&container);
                s.container_id = non_empty(&call.container_id);
                s.detail = r.detail;
                made.push(s);
            }
        }
        self.stages.extend(made);
    }
}

impl<'i, 'a: 'i> PodBuilder<'i, 'a> {
    /// `kubelet_sync:*` and `kubelet_call:*` stages from the kubelet's own spans, when an
    /// observer received them (`kubelet_spans.rs`).
    fn kubelet_span_stages(&mut self) {
        let spans = self.index.runtime_spans_of(self.uid);
        if spans.is_empty() {
            return;
        }
        let name_of = |id: &str| Some(self.observed_container_name(id)).filter(|n| !n.is_empty());
        let made: Vec<Stage> = super::kubelet_spans::kubelet_stages(spans, &name_of)
            .into_iter()
            .map(|k| {
                let mut s = self.stage(k.name, k.start_ns, k.end_ns, StageSource::Kubelet);
                s.ok = k.ok;
                s.code = k.code;
                s.container = k.container;
                s.sandbox_id = k.sandbox_id;
                s.container_id = k.container_id;
                s.detail = k.detail;
                s
            })
            .collect();
        self.stages.extend(made);
    }
}

impl<'i, 'a: 'i> PodBuilder<'i, 'a> {
    /// The name an observer recorded for a container of this pod; empty if none.
    fn observed_container_name(&self, container_id: &str) -> String {
        self.index
            .observed_of(self.uid)
            .iter()
            .find(|o| o.container_id == container_id && !o.container.is_empty())
            .map(|o| o.container.clone())
            .unwrap_or_default()
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}
