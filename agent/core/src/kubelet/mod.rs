//! kubelet's decisions with no IO, no clock and no randomness of their own. Time and
//! runtime observations come in as arguments; actions go out as ordered values. The
//! agent's async shell (its `kuberuntime` and `syncloop`) carries the actions out, and
//! replay re-runs them on a paused clock.

pub mod admission;
pub mod apparmor;
pub mod backoff;
pub mod container_hash;
pub mod downward_api;
pub mod expansion;
pub mod init_container_actions;
pub mod labels;
pub mod node_admission;
pub mod observed_exit;
pub mod observed_start;
pub mod pod_actions;
pub mod pod_startup_latency;
pub mod pod_workers;
pub mod probe_results;
pub mod qos;
pub mod quantity;
pub mod resize;
pub mod resize_actions;
pub mod restart_rules;
pub mod runtime_pod;
pub mod sandbox_gc;
pub mod status;
pub mod sync_outcome;

pub use pod_actions::{PodActions, compute_pod_actions};
pub use runtime_pod::RuntimePodStatus;

#[cfg(test)]
mod kubelet_compute_pod_actions_tests;
#[cfg(test)]
mod kubelet_init_containers_tests;
#[cfg(test)]
mod kubelet_pod_resize_tests;
#[cfg(test)]
mod kubelet_restartable_init_tests;
#[cfg(test)]
mod pod_actions_tests;

/// The core's contract, checked on its source: no IO, no clock, no randomness, no
/// unordered maps. The crate's dependencies keep tokio and the agent out; std's IO, clock
/// and hashed maps would still compile, so a change that brings one in fails here,
/// before it can make replay nondeterministic.
#[cfg(test)]
mod purity {
    const FORBIDDEN: &[&str] = &[
        "std::fs",
        "std::net",
        "std::io",
        "std::process",
        "std::env",
        "std::thread",
        "SystemTime",
        "Instant",
        "tokio",
        "rand::",
        "HashMap",
        "HashSet",
    ];

    #[test]
    fn the_core_does_no_io_and_reads_no_clock() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/kubelet");
        let mut checked = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            // Tests may use what they like; this file holds the list itself.
            if name.ends_with("_tests.rs") || name == "mod.rs" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for (i, line) in code.lines().enumerate() {
                let line = line.split("//").next().unwrap_or_default();
                for word in FORBIDDEN {
                    assert!(
                        !line.contains(word),
                        "{name}:{}: the core uses {word}: {line}",
                        i + 1
                    );
                }
            }
            checked += 1;
        }
        assert!(
            checked >= 8,
            "only {checked} core files found in {}",
            dir.display()
        );
    }
}
