//! Integration tests that need no lab: podlapse on the recorded fixtures, and pod cgroups
//! on the real kernel. `cargo xtask test` runs each module on its own, while the shared
//! lab is down (`xtask/src/integration.rs`).

/// Pod cgroups on the real kernel: needs root and the host's cgroup mounts, not the lab.
mod cgroups;
/// The manifests in deploy/: typed, no unknown field, consistent with podlapse.
mod deploy;
/// `podlapse report -o perfetto` read back with Perfetto's own Python definitions.
mod perfetto_native;
/// Replays the recorded fixtures.
mod replay;
/// `podlapse report` and `podlapse diagnose` on the recorded fixtures.
mod report;
