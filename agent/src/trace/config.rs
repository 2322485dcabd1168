//! The settings a trace's header records (its `config`): the agent's for `podlapse run`,
//! the observer's for `podlapse observe`.
//!
//! The header was once built as a `serde_json::Value`, whose objects write their keys
//! sorted. The fields here are declared in that order, and the settings nested in them
//! are written through a `Value` too, so a trace's bytes are what they were.

use podlapse_core::kubelet::admission::NodeAllocatable;
use podlapse_core::kubelet::node_admission::NodeFacts;
use serde::{Deserialize, Serialize, Serializer};

/// A header's `config`, by the command that recorded the trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TraceConfig {
    /// `podlapse observe`: it names its mode.
    Observe(ObservedConfig),
    /// `podlapse run`.
    Run(Box<RunConfig>),
    /// Settings of neither shape (an empty object, a hand-written trace): kept as
    /// written, so the trace writes back unchanged; replay takes its defaults.
    Other(serde_json::Map<String, serde_json::Value>),
}

impl TraceConfig {
    /// No settings: `{}`.
    pub fn empty() -> TraceConfig {
        TraceConfig::Other(serde_json::Map::new())
    }

    /// The agent's settings, when `podlapse run` recorded the trace.
    pub fn run(&self) -> Option<&RunConfig> {
        match self {
            TraceConfig::Run(c) => Some(c.as_ref()),
            _ => None,
        }
    }

    /// The node's IP, when the trace names it (the agent's runs since it was recorded,
    /// or settings of another shape that carry a `node_ip`).
    pub fn node_ip(&self) -> Option<&str> {
        match self {
            TraceConfig::Run(c) => c.node_ip.as_deref(),
            TraceConfig::Other(m) => m.get("node_ip").and_then(|v| v.as_str()),
            TraceConfig::Observe(_) => None,
        }
    }
}

/// `podlapse run`'s settings: the flags and the kubelet settings a replay needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    /// The node's allocatable resources, as admission counted them.
    #[serde(serialize_with = "keys_sorted")]
    pub allocatable: NodeAllocatable,
    pub backoff_initial_ns: u64,
    pub backoff_max_ns: u64,
    /// Root of the pod cgroups; null when the runtime kept them.
    pub cgroup_root: Option<String>,
    pub error_backoff_ns: u64,
    pub housekeeping: bool,
    /// At most this many image pulls at once; null for no limit.
    pub max_parallel_image_pulls: Option<usize>,
    /// What admission knew of the node (its labels, AppArmor, ...); traces recorded
    /// before it was kept have none.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "keys_sorted"
    )]
    pub node: Option<NodeFacts>,
    /// The node's IP, for the diagnosis of host-network pods; traces recorded before it
    /// was kept have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ip: Option<String>,
    pub relist_period_ns: u64,
    pub resync_interval_ns: u64,
    /// `--until-ready`: the run stopped once every pod was ready.
    pub until_ready: bool,
}

/// `podlapse observe`'s settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedConfig {
    /// The runtime's CRI events were followed (else it was polled).
    pub cri_events: bool,
    pub mode: ObserveMode,
    /// The polling period asked for, in milliseconds.
    pub poll_ms: u64,
}

/// The one mode an observer records: it tells its settings from the agent's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ObserveMode {
    Observe,
}

/// Writes `v` with its object keys sorted, as a `serde_json::Value` writes them: the
/// settings nested in the header keep the bytes they had when the header was a `Value`.
fn keys_sorted<T: Serialize, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    serde_json::to_value(v)
        .map_err(serde::ser::Error::custom)?
        .serialize(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As the fixtures' headers hold it: recorded before `node` and `node_ip` were kept.
    const OLD_RUN: &str = r#"{"allocatable":{"max_pods":110,"memory_bytes":25276502016,"milli_cpu":2000},"backoff_initial_ns":10000000000,"backoff_max_ns":300000000000,"cgroup_root":"/podlapse","error_backoff_ns":1000000000,"housekeeping":false,"max_parallel_image_pulls":1,"relist_period_ns":1000000000,"resync_interval_ns":60000000000,"until_ready":true}"#;

    fn round_trip(text: &str) -> TraceConfig {
        let c: TraceConfig = serde_json::from_str(text).unwrap();
        assert_eq!(serde_json::to_string(&c).unwrap(), text);
        c
    }

    #[test]
    fn an_older_run_config_reads_without_the_node_and_writes_back_the_same() {
        let c = round_trip(OLD_RUN);
        let run = c.run().expect("a run's settings");
        assert_eq!(run.node, None);
        assert_eq!(c.node_ip(), None);
        assert_eq!(run.max_parallel_image_pulls, Some(1));
    }

    #[test]
    fn a_run_config_writes_what_the_untyped_header_wrote() {
        let run = RunConfig {
            allocatable: NodeAllocatable {
                milli_cpu: 2000,
                memory_bytes: 1 << 30,
                max_pods: 110,
            },
            backoff_initial_ns: 1,
            backoff_max_ns: 2,
            cgroup_root: None,
            error_backoff_ns: 3,
            housekeeping: true,
            max_parallel_image_pulls: None,
            node: Some(NodeFacts {
                apparmor: true,
                ..NodeFacts::new("n", "x86_64", &Default::default())
            }),
            node_ip: Some("10.0.0.1".into()),
            relist_period_ns: 4,
            resync_interval_ns: 5,
            until_ready: false,
        };
        // What `serde_json::json!` of the same settings writes: its keys sorted.
        let mut untyped = serde_json::json!({
            "until_ready": run.until_ready,
            "resync_interval_ns": run.resync_interval_ns,
            "error_backoff_ns": run.error_backoff_ns,
            "backoff_initial_ns": run.backoff_initial_ns,
            "backoff_max_ns": run.backoff_max_ns,
            "relist_period_ns": run.relist_period_ns,
            "max_parallel_image_pulls": run.max_parallel_image_pulls,
            "allocatable": run.allocatable,
            "node": run.node,
            "cgroup_root": run.cgroup_root,
            "housekeeping": run.housekeeping,
        });
        untyped["node_ip"] = "10.0.0.1".into();
        let typed = TraceConfig::Run(Box::new(run));
        let text = serde_json::to_string(&typed).unwrap();
        assert_eq!(text, untyped.to_string());
        assert_eq!(round_trip(&text), typed);
        assert_eq!(typed.node_ip(), Some("10.0.0.1"));
    }

    #[test]
    fn an_observers_config_and_others_are_kept_as_written() {
        let observed = round_trip(r#"{"cri_events":true,"mode":"observe","poll_ms":200}"#);
        assert!(matches!(observed, TraceConfig::Observe(_)));
        assert_eq!(round_trip("{}"), TraceConfig::empty());
        let other = round_trip(r#"{"node_ip":"10.1.2.3","z":[1]}"#);
        assert!(matches!(other, TraceConfig::Other(_)));
        assert_eq!(other.node_ip(), Some("10.1.2.3"));
        // A run's settings missing one it always writes are of neither shape.
        let partial = OLD_RUN.replace(r#""housekeeping":false,"#, "");
        assert!(matches!(round_trip(&partial), TraceConfig::Other(_)));
    }
}
