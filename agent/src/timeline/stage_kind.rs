//! The kinds of stage a timeline has, as a type: the part of a stage's name before `:`
//! (`cni_plugin` in `cni_plugin:bridge`, `runtime` in every `runtime:<step>`).

use std::fmt;

/// Declares [`StageKind`] from one list of variants and their names, in pipeline order,
/// so the enum, [`StageKind::PIPELINE`] and the names cannot drift apart.
macro_rules! stage_kinds {
    ($($(#[doc = $doc:expr])* $variant:ident => $name:literal,)*) => {
        /// A stage kind. The known kinds are declared in the order the pipeline performs
        /// them (see [`StageKind::rank`]); a kind this podlapse does not know (a trace
        /// from a newer one) is kept, by its name, as [`StageKind::Unknown`].
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum StageKind {
            $($(#[doc = $doc])* $variant,)*
            /// A kind this podlapse does not know, as the trace names it: it reads,
            /// prints and writes back unchanged, and ranks after every known kind.
            Unknown(String),
        }

        impl StageKind {
            /// The known kinds in the order the pipeline performs them.
            pub const PIPELINE: &'static [StageKind] = &[$(StageKind::$variant,)*];

            /// The kind's name as stage names and traces spell it.
            pub fn as_str(&self) -> &str {
                match self {
                    $(StageKind::$variant => $name,)*
                    StageKind::Unknown(name) => name,
                }
            }

            /// The kind `name` spells; a name no known kind has is [`StageKind::Unknown`].
            pub fn parse(name: &str) -> StageKind {
                match name {
                    $($name => StageKind::$variant,)*
                    other => StageKind::Unknown(other.to_string()),
                }
            }
        }
    };
}

stage_kinds! {
    /// The agent first saw the pod (its config ADD, or its first CRI call).
    PodSeen => "pod_seen",
    /// The kubelet's own span of a pod sync (observed, with its tracing on):
    /// `kubelet_sync:<update type>`, `kubelet_sync:terminating`, `kubelet_sync:terminated`.
    KubeletSync => "kubelet_sync",
    /// An update waited for the pod worker's earlier work.
    PodWorkerWait => "pod_worker_wait",
    /// The runtime's network was not ready.
    NetworkWait => "network_wait",
    /// A back-off kubelet decided held the next sync.
    BackOffWait => "back_off_wait",
    /// The pod worker's first sync.
    Admitted => "admitted",
    /// The kernel saw the pod's cgroup made.
    PodCgroupCreated => "pod_cgroup_created",
    /// RunPodSandbox.
    SandboxRequested => "sandbox_requested",
    /// The sandbox's network namespace made.
    NetnsCreated => "netns_created",
    /// CNI ADD, across its plugin runs.
    CniAdd => "cni_add",
    /// One CNI plugin's run: `cni_plugin:<plugin>`.
    CniPlugin => "cni_plugin",
    /// The sandbox ready, with its IP.
    SandboxReady => "sandbox_ready",
    /// A container's startup probe had not passed.
    StartupProbeWait => "startup_probe_wait",
    /// A container waited for the sidecar before it: `sidecar_wait:<container>`.
    SidecarWait => "sidecar_wait",
    /// A container waited for the init container before it: `init_wait:<container>`.
    InitWait => "init_wait",
    /// A pull waited for the image puller.
    ImagePullerWait => "image_puller_wait",
    /// PullImage, or the image found present: `image_pull:<container>`.
    ImagePull => "image_pull",
    /// CreateContainer: `container_create:<container>`.
    ContainerCreate => "container_create",
    /// An observer saw the container created: `container_created:<container>`.
    ContainerCreated => "container_created",
    /// StartContainer: `container_start:<container>`.
    ContainerStart => "container_start",
    /// An observer saw the container started: `container_started:<container>`.
    ContainerStarted => "container_started",
    /// A CRI call as the kubelet saw it, from its client span (observed):
    /// `kubelet_call:<Method>` or `kubelet_call:<Method>:<container>`.
    KubeletCall => "kubelet_call",
    /// The runtime's own span: `runtime:<step>` or `runtime:<step>:<container>`.
    Runtime => "runtime",
    /// The shim's start command.
    ShimStart => "shim_start",
    /// The shim daemon, until it ran `runc create`.
    ShimCreate => "shim_create",
    /// `runc create`.
    RuncCreate => "runc_create",
    /// `runc init`, the container's first process.
    RuncInit => "runc_init",
    /// The sandbox's cgroup, made by runc.
    SandboxCgroup => "sandbox_cgroup",
    /// A container's cgroup, made by runc: `container_cgroup:<container>`.
    ContainerCgroup => "container_cgroup",
    /// `runc start`.
    RuncStart => "runc_start",
    /// The sandbox's pause process exec'd.
    PauseExec => "pause_exec",
    /// A container's first program exec'd: `app_first_exec:<container>`.
    AppFirstExec => "app_first_exec",
    /// An init container's run, from its exec to its exit: `init_run:<container>`.
    InitRun => "init_run",
    /// A container's postStart hook: `post_start:<container>`.
    PostStart => "post_start",
    /// Every regular container started.
    Running => "running",
    /// The pod Ready.
    Ready => "ready",
}

impl StageKind {
    /// Where the kind stands in [`StageKind::PIPELINE`]; every unknown kind ranks the
    /// same, after the known ones. It breaks ties wherever stages are ordered: on a
    /// timeline (a point and the span it opens list in pipeline order), in a breakdown (a
    /// later step is the more specific when spans start together; the runtime's steps
    /// come after the CRI calls they run inside) and in the report's stage table.
    pub fn rank(&self) -> usize {
        StageKind::PIPELINE
            .iter()
            .position(|k| k == self)
            .unwrap_or(StageKind::PIPELINE.len())
    }
}

impl StageKind {
    /// A wait: time the pod or a container spent queued rather than working. An unknown
    /// kind is one when its name says so (`<what>_wait`), as the known ones' do.
    pub fn is_wait(&self) -> bool {
        match self {
            StageKind::PodWorkerWait
            | StageKind::NetworkWait
            | StageKind::BackOffWait
            | StageKind::StartupProbeWait
            | StageKind::SidecarWait
            | StageKind::InitWait
            | StageKind::ImagePullerWait => true,
            StageKind::Unknown(name) => name.ends_with("_wait"),
            _ => false,
        }
    }
}

impl fmt::Display for StageKind {
    /// The kind's name; honours width and alignment, as a string would.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl From<podlapse_core::record::WaitKind> for StageKind {
    /// The stage of a wait the agent recorded (`image_puller` waits are
    /// `image_puller_wait` stages).
    fn from(wait: podlapse_core::record::WaitKind) -> StageKind {
        use podlapse_core::record::WaitKind;
        match wait {
            WaitKind::ImagePuller => StageKind::ImagePullerWait,
            WaitKind::PodWorker => StageKind::PodWorkerWait,
            WaitKind::BackOff => StageKind::BackOffWait,
            WaitKind::Network => StageKind::NetworkWait,
            WaitKind::StartupProbe => StageKind::StartupProbeWait,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podlapse_core::record::WaitKind;

    #[test]
    fn every_known_kind_reads_back_from_its_name_and_ranks_by_its_place() {
        for (i, k) in StageKind::PIPELINE.iter().enumerate() {
            assert_eq!(StageKind::parse(k.as_str()), *k);
            assert_eq!(k.rank(), i);
        }
        assert_eq!(StageKind::PIPELINE.len(), 36);
    }

    #[test]
    fn the_waits_are_the_kinds_named_so() {
        for k in StageKind::PIPELINE {
            assert_eq!(k.is_wait(), k.as_str().ends_with("_wait"), "{k}");
        }
        assert!(StageKind::parse("hologram_wait").is_wait());
        assert!(!StageKind::parse("hologram").is_wait());
    }

    #[test]
    fn an_unknown_kind_keeps_its_name_and_ranks_last() {
        let k = StageKind::parse("hologram_wait");
        assert_eq!(k, StageKind::Unknown("hologram_wait".into()));
        assert_eq!(k.as_str(), "hologram_wait");
        assert_eq!(k.rank(), StageKind::PIPELINE.len());
        assert_eq!(format!("[{k:<15}]"), "[hologram_wait  ]");
    }

    #[test]
    fn a_wait_names_its_stage_as_the_recorder_spells_it() {
        for w in [
            WaitKind::ImagePuller,
            WaitKind::PodWorker,
            WaitKind::BackOff,
            WaitKind::Network,
            WaitKind::StartupProbe,
        ] {
            assert_eq!(StageKind::from(w).as_str(), format!("{}_wait", w.name()));
        }
    }
}
