//! Pod manifests the benchmarks write for the agent.

use crate::lab::IMAGE_APP;

/// A one-container pod named `name` that sleeps for an hour in the lab's app image
/// (present on the node: `IfNotPresent`), stopped within a second.
pub fn sleep_pod(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n\
         spec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    \
         image: {IMAGE_APP}\n    imagePullPolicy: IfNotPresent\n    command: [\"sleep\", \"3600\"]\n"
    )
}
