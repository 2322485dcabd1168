//! What `diagnose` concludes: per pod, a verdict naming the stage that failed and the
//! records that show it.

use serde::{Deserialize, Serialize};

use crate::timeline::StageName;

/// Why a pod has no IP or is not Running (or that it is fine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Running, with its IP.
    Healthy,
    /// Running on the host's network: no pod IP by design.
    HostNetwork,
    /// Admission turned the pod away (no CRI call was ever made for it).
    NotAdmitted,
    /// The runtime reported NetworkReady=false (no CNI configuration), so no sandbox
    /// was requested.
    NetworkNotReady,
    /// RunPodSandbox failed before the pod's network namespace was created.
    NetnsNotCreated,
    /// The IPAM plugin found no free address in its range.
    IpamExhausted,
    /// The network names a CNI plugin with no executable in any of the runtime's plugin
    /// directories.
    CniPluginMissing,
    /// Every plugin succeeded, but the result gave the pod's interface no address.
    CniNoAddress,
    /// A CNI plugin exited non-zero during ADD.
    CniPluginFailed,
    /// RunPodSandbox failed for a reason the kernel's view does not narrow down.
    SandboxFailed,
    /// An image could not be pulled.
    ImagePullFailed,
    /// A container keeps exiting and is restarted with back-off.
    CrashLoop,
    /// A sandbox was created again and again, with a different IP each time.
    SandboxRecreated,
    /// A sandbox's CNI ADD ran but no DEL followed when it went away: its IP stays
    /// allocated.
    LeakedIp,
    /// Not Running, and nothing recorded says why: how far it got.
    Pending,
}

impl Cause {
    /// Whether the pod is as it should be (Running; a host-network pod has no IP of its
    /// own by design).
    pub fn is_healthy(self) -> bool {
        matches!(self, Cause::Healthy | Cause::HostNetwork)
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = serde_json::to_value(self).map_err(|_| std::fmt::Error)?;
        f.write_str(v.as_str().unwrap_or_default())
    }
}

/// One conclusion about a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub cause: Cause,
    /// The stage that failed or never happened, in the timeline's names
    /// (`cni_plugin:host-local`, `image_pull:app`, ...).
    pub stage: StageName,
    /// One line for people.
    pub summary: String,
    /// The recorded facts behind it, each with when it happened (ms after pod_seen).
    pub evidence: Vec<String>,
}

/// One pod's diagnosis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodDiagnosis {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// Every container started (the timeline's `running` stage).
    pub running: bool,
    /// Gone: removed from the config, or (another client's pod) every sandbox of it
    /// removed from the runtime. Its verdict is what it was when it went.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
    /// The most important finding; `Healthy` when there is nothing wrong.
    pub verdict: Finding,
    /// Further findings, in order of importance.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<Finding>,
    /// Which sources the verdict had to go on, and why any is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<crate::timeline::PodSources>,
}

impl PodDiagnosis {
    pub fn display_name(&self) -> String {
        if self.name.is_empty() {
            self.uid.clone()
        } else {
            format!("{}/{}", self.namespace, self.name)
        }
    }
}

/// A conclusion about the node rather than one pod: its pod network not ready, the
/// network naming a plugin that is not installed, its address pool full or leaking.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFinding {
    pub cause: Cause,
    pub summary: String,
    pub evidence: Vec<String>,
}

/// Every pod's diagnosis, in the timeline's order (namespace, name, UID).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnosis {
    /// The node's pod network as last recorded, when something is wrong with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node: Vec<NodeFinding>,
    pub pods: Vec<PodDiagnosis>,
    /// What limits the diagnosis (no kernel events, events lost).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Diagnosis {
    /// Only the pods `pod` names: a name, `namespace/name`, or a UID.
    pub fn only(mut self, pod: &str) -> Diagnosis {
        self.pods.retain(|p| {
            p.name == pod || p.uid == pod || format!("{}/{}", p.namespace, p.name) == pod
        });
        self
    }

    /// Every pod healthy, and nothing wrong with the node's network.
    pub fn all_healthy(&self) -> bool {
        self.node.is_empty() && self.pods.iter().all(|p| p.verdict.cause.is_healthy())
    }
}
