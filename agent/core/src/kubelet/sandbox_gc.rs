//! kubelet's sandbox garbage collection (containerGC.evictSandboxes): which of a pod's
//! sandboxes to remove. A sandbox is active while it is ready or still holds containers;
//! only inactive ones are removed. For a pod that still exists its newest sandbox is kept
//! whatever its state; for a pod that is gone every inactive one goes.
//!
//! This is what removes the sandbox a runtime crash left behind once the pod runs in a
//! new one.

/// One sandbox as the collector sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxGcInfo {
    pub id: String,
    /// CRI `created_at`, ns.
    pub created_at: i64,
    pub ready: bool,
    /// Some container (in any state) still names this sandbox.
    pub has_containers: bool,
}

impl SandboxGcInfo {
    fn active(&self) -> bool {
        self.ready || self.has_containers
    }
}

/// The sandboxes of one pod to remove, oldest first.
pub fn evictable_sandboxes(sandboxes: &[SandboxGcInfo], pod_exists: bool) -> Vec<String> {
    let mut by_age: Vec<&SandboxGcInfo> = sandboxes.iter().collect();
    // Newest first; equal times by ID, so the choice is the same every time.
    by_age.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
    let keep = usize::from(pod_exists && !by_age.is_empty());
    by_age
        .iter()
        .skip(keep)
        .rev()
        .filter(|s| !s.active())
        .map(|s| s.id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb(id: &str, created_at: i64, ready: bool, has_containers: bool) -> SandboxGcInfo {
        SandboxGcInfo {
            id: id.into(),
            created_at,
            ready,
            has_containers,
        }
    }

    // kubelet's TestSandboxGC (kuberuntime_gc_test.go), the cases without
    // evictTerminatingPods, under kubelet's descriptions. A case may hold several pods:
    // each is collected on its own. kubelet's `remain` indexes become the IDs removed.
    #[test]
    fn kubelets_sandbox_gc_cases() {
        type Pod = (Vec<SandboxGcInfo>, bool);
        let cases: Vec<(&str, Vec<Pod>, Vec<&str>)> = vec![
            (
                "notready sandboxes without containers for deleted pods should be garbage collected.",
                vec![(vec![sb("deleted-0", 0, false, false)], false)],
                vec!["deleted-0"],
            ),
            (
                "ready sandboxes without containers for deleted pods should not be garbage collected.",
                vec![(vec![sb("deleted-0", 0, true, false)], false)],
                vec![],
            ),
            (
                "sandboxes for existing pods should not be garbage collected.",
                vec![
                    (vec![sb("foo-0", 0, true, false)], true),
                    (vec![sb("bar-0", 0, false, false)], true),
                ],
                vec![],
            ),
            (
                "older exited sandboxes without containers for existing pods should be garbage collected if there are more than one exited sandboxes.",
                vec![(
                    vec![sb("foo-1", 1, false, false), sb("foo-0", 0, false, false)],
                    true,
                )],
                vec!["foo-0"],
            ),
            (
                "older exited sandboxes with containers for existing pods should not be garbage collected even if there are more than one exited sandboxes.",
                vec![(
                    vec![sb("foo-1", 1, false, false), sb("foo-0", 0, false, true)],
                    true,
                )],
                vec![],
            ),
        ];
        for (name, pods, want) in cases {
            let removed: Vec<String> = pods
                .iter()
                .flat_map(|(sandboxes, exists)| evictable_sandboxes(sandboxes, *exists))
                .collect();
            assert_eq!(removed, want, "{name}");
        }
    }

    #[test]
    fn a_sandbox_a_runtime_crash_left_behind_goes_once_the_pod_runs_in_a_new_one() {
        let left = sb("old", 1, false, false);
        let running = sb("new", 2, true, false);
        assert_eq!(evictable_sandboxes(&[running, left], true), ["old"]);
    }

    #[test]
    fn the_newest_is_kept_even_when_not_ready() {
        let older = sb("older", 1, false, false);
        let newest = sb("newest", 5, false, false);
        assert_eq!(evictable_sandboxes(&[newest, older], true), ["older"]);
    }
}
