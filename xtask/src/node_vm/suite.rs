//! `cargo xtask node-vm test`: the modern-node suite. The host builds `podlapse` and the
//! integration test binaries; they run inside the guest against its containerd 2.x with the
//! systemd cgroup driver, then a smaller compatibility suite against containerd 1.7, with
//! the host lab's registry forwarded to the guest's 127.0.0.1:5000. On the matrix's other
//! kernels (`--kernel`), the kernel suite runs instead: the probes and the kernel's stages
//! of pods. Timings inside the emulated guest are functional only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use xtask::lab::{self, LabPaths};
use xtask::text::list;

use super::kernels::GuestKernel;
use super::{NodeVmPaths, session};
use crate::{integration, workspace};

/// The tests run in the guest: (module of a test binary, test names; empty = all of them).
pub const GUEST_TESTS: &[(&str, &[&str])] = &[
    ("modern_node", &[]),
    (
        "kernel_events",
        &[
            "the_binary_copied_alone_loads_its_embedded_probes",
            "a_sandbox_is_seen_from_the_kernel",
            "namespace_creation_and_entry_report_the_netns_from_kernel_functions_or_tracepoints",
        ],
    ),
    (
        "run_pods",
        &[
            "example_pods_reach_running_with_lab_ips_and_clean_up",
            "a_cni_directory_that_does_not_exist_is_exit_2_and_creates_nothing",
        ],
    ),
    (
        "timeline",
        &["five_pods_at_once_each_get_their_own_kernel_stages_in_runtime_order"],
    ),
    // What the runtime applies and what it can do (security context, PID and user
    // namespaces, admission against its features); the reading of manifests is the
    // same on every node and runs on the host lab.
    (
        "conformance",
        &[
            "each_container_runs_with_the_user_groups_capabilities_and_seccomp_it_asked_for",
            "a_pod_that_shares_its_process_namespace_sees_the_sandboxs_process_as_pid_1",
            "run_as_non_root_against_a_root_image_is_refused_before_the_container_is_created",
            "admission_matches_the_nodes_labels_and_what_the_host_and_runtime_can_enforce",
            "a_pod_without_host_users_gets_a_user_namespace_where_the_runtime_has_them",
            "a_static_pod_is_named_after_its_node_and_bound_to_it",
        ],
    ),
    (
        "pipeline",
        &[
            "init_containers_run_one_at_a_time_in_order",
            "a_failing_init_container_with_restart_policy_never_fails_the_pod",
        ],
    ),
    // What the runtime does when the agent restarts, stops and adopts; back-off timing
    // and readiness are the agent's own rules and run on the host lab.
    (
        "agent",
        &[
            "a_liveness_failure_restarts_the_container",
            "a_deleted_manifest_leaves_no_runtime_object_within_the_grace_period",
            "an_agent_killed_mid_creation_adopts_its_pod_without_a_second_sandbox",
        ],
    ),
    (
        "probes",
        &[
            "exec_probes_and_hooks_run_in_the_container",
            "http_tcp_and_sleep_reach_the_pod_ip",
        ],
    ),
    // The sidecar rules are kubelet's and run on the host lab; here, what the runtime
    // does with a sidecar's probes, restarts and stop order.
    (
        "sidecars",
        &["a_sidecar_with_a_startup_probe_gates_the_app_restarts_and_stops_last"],
    ),
    // Beside two other CRI clients, with the runtime's event stream.
    (
        "observe",
        &["the_observer_times_the_pods_of_two_other_clients_each_on_its_own_and_changes_nothing"],
    ),
    // "Why has this pod no IP?" on the reference node's own CNI configuration.
    ("no_ip", &[]),
    // What the observer sees leaves the node: the kubelet's own spans joined with
    // containerd 2.x's and the kernel's stages, its metrics and its OTLP export (the
    // kubelet's spans in the recorded timeline too; `observe_kubelet`, which asserts
    // little more of them, runs on the host lab).
    (
        "observe_outputs",
        &["the_observers_metrics_and_otlp_carry_every_pods_stages_inside_the_kubelets_traces"],
    ),
    // The DaemonSet's own pod, from podlapse's image pushed to the host lab's registry,
    // observing the node's pods for the staged Prometheus and leaving nothing on SIGTERM.
    ("daemonset", &[]),
    // containerd 2.x traces every CRI call here: its spans must continue podlapse's.
    (
        "otel_export",
        &["a_pods_startup_arrives_as_one_trace_and_the_recorded_trace_exports_the_same"],
    ),
    // Every output carries the kernel's and the runtime's stages, or says why not: the
    // flag matrix and the spans that never come (the host lab runs the rest).
    (
        "sources",
        &[
            "every_combination_of_output_flags_gives_the_same_kernel_stages",
            "runtime_spans_that_never_come_end_the_run_at_the_bound_and_are_said_on_the_pod",
        ],
    ),
];

/// The kernel suite, run on each kernel of the matrix but the modern node's own (which runs
/// all of [`GUEST_TESTS`]): the probes load from the binary alone and say which hooks they
/// chose and why, a sandbox's cgroup, netns and CNI plugins with their exit codes are seen
/// from the kernel, five pods get their own kernel stages (shim, runc create, init and
/// start among them), and the observer times other clients' pods from the runtime's event
/// stream with the kernel's stages.
pub const KERNEL_TESTS: &[(&str, &[&str])] = &[
    (
        "modern_node",
        &["cri_info_shows_the_runtime_the_systemd_driver_opt_cni_bin_and_cgroup_v2"],
    ),
    (
        "kernel_events",
        &[
            "the_binary_copied_alone_loads_its_embedded_probes",
            "a_sandbox_is_seen_from_the_kernel",
            "namespace_creation_and_entry_report_the_netns_from_kernel_functions_or_tracepoints",
        ],
    ),
    (
        "timeline",
        &["five_pods_at_once_each_get_their_own_kernel_stages_in_runtime_order"],
    ),
    (
        "observe",
        &["the_observer_times_the_pods_of_two_other_clients_each_on_its_own_and_changes_nothing"],
    ),
];

/// The containerd 1.7 compatibility suite, run after the reference suite in the same boot
/// with the guest's socket served by containerd 1.7: what podlapse reads from the runtime
/// (cri info), the example pods, the five-pod timeline, and OTLP export without runtime
/// spans from the CRI calls. (The observer's polling, what it does on 1.x, is tested on
/// the host lab: `tests/shared_lab/observe.rs`.)
pub const COMPAT_TESTS: &[(&str, &[&str])] = &[
    (
        "modern_node",
        &["cri_info_shows_the_runtime_the_systemd_driver_opt_cni_bin_and_cgroup_v2"],
    ),
    (
        "run_pods",
        &["example_pods_reach_running_with_lab_ips_and_clean_up"],
    ),
    (
        "timeline",
        &["five_pods_at_once_each_get_their_own_kernel_stages_in_runtime_order"],
    ),
    (
        "otel_export",
        &["a_pods_startup_arrives_as_one_trace_and_the_recorded_trace_exports_the_same"],
    ),
];

/// podlapse's image in the host lab's registry, for the guest's DaemonSet test
/// (`PODLAPSE_AGENT_IMAGE` there).
pub const AGENT_IMAGE: &str = "127.0.0.1:5000/podlapse/podlapse:node-vm";

/// The kubelet-like CRI client the observe test drives pods with (`tests/bin`).
const CRI_POD_CLIENT: &str = integration::CRI_POD_CLIENT;

/// The suite a kernel runs: the full one on the modern node's own, else the kernel suite.
pub fn tests_for(kernel: &GuestKernel) -> &'static [(&'static str, &'static [&'static str])] {
    if kernel.is_reference() {
        GUEST_TESTS
    } else {
        KERNEL_TESTS
    }
}

/// The modules of `suite` that `only` names (all of them when it is empty), or which name
/// is not one.
fn selected(
    suite: &'static [(&'static str, &'static [&'static str])],
    only: &[String],
) -> anyhow::Result<Vec<(&'static str, &'static [&'static str])>> {
    if let Some(unknown) = only.iter().find(|o| !suite.iter().any(|(t, _)| t == o)) {
        bail!(
            "--only {unknown}: not a test of the suite (it has {})",
            list(suite, ", ", |(t, _)| t.to_string())
        );
    }
    Ok(suite
        .iter()
        .filter(|(t, _)| only.is_empty() || only.iter().any(|o| o == t))
        .copied()
        .collect())
}

/// What runs in the guest: the tests of each module, chosen from the built binaries, for
/// the reference runtime and then the compatibility one.
pub struct Suite {
    pub reference: Vec<Planned>,
    pub compat: Vec<Planned>,
}

/// One module's run: its binary and the libtest arguments that choose its tests.
pub struct Planned {
    pub module: &'static str,
    pub binary: &'static str,
    pub args: Vec<String>,
}

/// The runs of `tests` (module, test names; empty = all of them), from the built binaries'
/// own lists: a name a binary does not have fails here, on the host, before the boot.
fn plan(
    built: &integration::Built,
    tests: &[(&'static str, &'static [&'static str])],
) -> anyhow::Result<Vec<Planned>> {
    let mut listed: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    let mut planned = Vec::new();
    for (module, names) in tests {
        let binary = integration::binary_of(module)
            .with_context(|| format!("the guest's test {module} is in no test binary"))?
            .name;
        if !listed.contains_key(binary) {
            listed.insert(binary, integration::list(built.executable(binary)?)?);
        }
        planned.push(Planned {
            module,
            binary,
            args: integration::selection(&listed[binary], module, names)?,
        });
    }
    Ok(planned)
}

/// Tells the tests in the guest which containerd serves the node: `2` (the reference) or
/// `1.7` (the compatibility runtime).
pub const RUNTIME_ENV: &str = "PODLAPSE_NODE_RUNTIME";

pub fn run(
    paths: &NodeVmPaths,
    only: &[String],
    kernel: &'static GuestKernel,
) -> anyhow::Result<()> {
    // A name that is not in the suite fails before anything starts.
    selected(tests_for(kernel), only)?;
    // The guest's registry is the host lab's.
    let lab_paths = LabPaths::from_env();
    let lab_was_up = lab_paths.state_file().exists();
    if !lab_was_up {
        eprintln!("starting the host lab (its registry serves the guest)");
        lab::up(&lab_paths, &crate::ui::lab_says)?;
    }
    let result = run_on_lab(paths, &lab_paths, only, kernel);
    if !lab_was_up {
        lab::down(&lab_paths, &crate::ui::lab_says)?;
    }
    result
}

/// The suite of `kernel` (or the test targets `only` names), with the host lab up.
pub fn run_on_lab(
    paths: &NodeVmPaths,
    lab_paths: &LabPaths,
    only: &[String],
    kernel: &'static GuestKernel,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let tests = selected(tests_for(kernel), only)?;
    eprintln!("node-vm [1/4] building podlapse and the test binaries");
    let podlapse = workspace::build_podlapse()?;
    let probes = crate::build_ebpf::run()?;
    let mut needed: Vec<&'static str> = Vec::new();
    for (module, _) in &tests {
        let binary = integration::binary_of(module)
            .with_context(|| format!("the guest's test {module} is in no test binary"))?;
        if !needed.contains(&binary.name) {
            needed.push(binary.name);
        }
    }
    let built = integration::build(&needed)?;
    let reference = plan(&built, &tests)?;
    // containerd 1.7 is the runtime's compatibility, checked on the modern node's kernel.
    let compat: Vec<(&'static str, &'static [&'static str])> = COMPAT_TESTS
        .iter()
        .filter(|(t, _)| kernel.is_reference() && tests.iter().any(|(m, _)| m == t))
        .copied()
        .collect();
    let compat = plan(&built, &compat)?;
    let suite = Suite { reference, compat };
    let stage = stage(&podlapse, &probes, &built)?;
    if tests.iter().any(|(m, _)| *m == "daemonset") {
        // The DaemonSet's pod runs from podlapse's image of the binary the guest tests,
        // served by the host lab's registry as the guest's other images are.
        let layout = workspace::target_dir().join("node-vm").join("agent-image");
        let image = lab::build_agent_image(&podlapse, &layout, "node-vm", 1)?;
        lab::push_agent_image(&image, AGENT_IMAGE)?;
    }
    eprintln!("node-vm [2/4] the modern node, on kernel {kernel}");
    let report = session::with_guest(paths, lab_paths, stage, &suite, kernel)?;
    report.print();
    let which = if kernel.is_reference() {
        "modern-node suite".to_string()
    } else {
        format!("kernel suite on {kernel}")
    };
    eprintln!(
        "{which}: {} of {} test runs passed in {:.0} s (boot {:.0} s)",
        report.passed(),
        report.runs.len(),
        started.elapsed().as_secs_f64(),
        report.boot_seconds
    );
    if let Some(lost) = &report.lost {
        bail!(
            "the {which} stopped: the guest stopped answering during {lost}, after a reboot too; its console is in {}",
            results_dir().display()
        );
    }
    if report.passed() != report.runs.len() {
        bail!(
            "the {which} failed; the guest's logs are in {}",
            results_dir().display()
        );
    }
    Ok(())
}

pub struct Run {
    pub test: &'static str,
    pub runtime: &'static str,
    pub ok: bool,
    pub seconds: f64,
    /// Set when the test ran a second time on a freshly booted guest.
    pub rerun: bool,
}

pub struct Report {
    pub runs: Vec<Run>,
    pub boot_seconds: f64,
    /// The module during which the guest stopped answering for good, if it did.
    pub lost: Option<&'static str>,
}

impl Report {
    fn passed(&self) -> usize {
        self.runs.iter().filter(|r| r.ok).count()
    }

    fn print(&self) {
        eprintln!(
            "{:<14} {:<10} {:>8}  result",
            "test", "containerd", "seconds"
        );
        for r in &self.runs {
            eprintln!(
                "{:<14} {:<10} {:>8.1}  {}{}",
                r.test,
                r.runtime,
                r.seconds,
                if r.ok { "ok" } else { "FAILED" },
                if r.rerun {
                    " (run again on a fresh boot: the guest stopped answering the first time)"
                } else {
                    ""
                }
            );
        }
    }
}

/// `target/node-vm/podlapse`: what goes to the guest's /opt/podlapse.
fn stage(podlapse: &Path, probes: &Path, built: &integration::Built) -> anyhow::Result<PathBuf> {
    let dir = workspace::target_dir().join("node-vm").join("podlapse");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    for sub in ["bin", "bpf", "tests"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    let place = super::place;
    place_stripped(podlapse, &dir.join("bin/podlapse"))?;
    // The host's promtool (a static Go program but for libc, which trixie's is newer
    // than): the metrics tests check their scrape with it, and the guest image has no
    // Prometheus, which as a package would start a server at every boot.
    place(&on_path("promtool")?, dir.join("bin/promtool"))?;
    // The Prometheus server the DaemonSet test scrapes the observer's pod with: the
    // host's, for the same reason.
    place(&on_path("prometheus")?, dir.join("bin/prometheus"))?;
    // Beside the binary's parent, where the tests look for `--probes` (the copied-alone
    // test uses the embedded object instead).
    place(probes, dir.join("bpf/podlapse-probes.o"))?;
    for (binary, exe) in &built.binaries {
        place_stripped(exe, &dir.join("tests").join(binary))?;
    }
    place_stripped(
        &built.cri_pod_client,
        &dir.join("tests").join(CRI_POD_CLIENT),
    )?;
    // The example pods, and deploy/ (the DaemonSet test runs its pod template).
    for tree in ["examples", "deploy"] {
        let from = workspace::root().join(tree);
        let status = std::process::Command::new("cp")
            .arg("-r")
            .arg(&from)
            .arg(dir.join(tree))
            .status()?;
        if !status.success() {
            bail!("copying {}", from.display());
        }
    }
    Ok(dir)
}

/// `from` staged as `to` without its debug information (the symbols stay, for
/// backtraces): the copy into the emulated guest goes through ssh at a few MiB/s, and
/// the line tables are 40% of the debug binaries (podlapse 127 -> 86 MB, the shared-lab
/// tests 102 -> 52 MB). A panic's location does not come from them.
fn place_stripped(from: &Path, to: &Path) -> anyhow::Result<()> {
    let status = std::process::Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(to)
        .arg(from)
        .status()
        .context("running strip (binutils, which gcc brings)")?;
    if !status.success() {
        bail!("strip --strip-debug {} ({status})", from.display());
    }
    Ok(())
}

/// `program` on the host's PATH: promtool and prometheus, which `cargo xtask setup`
/// installs (Debian's package prometheus).
fn on_path(program: &str) -> anyhow::Result<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "{program} is not on PATH (Debian package prometheus; `cargo xtask setup` installs it)"
            )
        })
}

pub fn registry_port() -> u16 {
    lab::REGISTRY_ADDR
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("the registry address has a port")
}

pub fn results_dir() -> PathBuf {
    workspace::target_dir().join("node-vm").join("results")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_selects_the_named_modules_and_refuses_a_name_that_is_not_one() {
        let all: Vec<&str> = selected(GUEST_TESTS, &[])
            .unwrap()
            .iter()
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(all.len(), GUEST_TESTS.len());
        assert!(all.contains(&"daemonset"), "{all:?}");
        let named = selected(GUEST_TESTS, &["daemonset".to_string(), "no_ip".to_string()]).unwrap();
        assert_eq!(
            named.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            ["no_ip", "daemonset"],
            "in the suite's order"
        );
        let err = selected(GUEST_TESTS, &["nosuch".to_string()])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--only nosuch") && err.contains("daemonset"),
            "{err}"
        );
    }

    #[test]
    fn the_other_kernels_run_the_kernel_suite_which_the_full_suite_covers() {
        use super::super::kernels::{KERNELS, by_name};
        assert_eq!(tests_for(by_name("6.12").unwrap()), GUEST_TESTS);
        for k in KERNELS.iter().filter(|k| !k.is_reference()) {
            assert_eq!(tests_for(k), KERNEL_TESTS, "{k}");
        }
        // What the kernel suite runs on the others, the full suite runs on 6.12.
        for (module, names) in KERNEL_TESTS {
            let (_, full) = GUEST_TESTS
                .iter()
                .find(|(m, _)| m == module)
                .unwrap_or_else(|| panic!("{module} is not in the full suite"));
            for n in *names {
                assert!(full.is_empty() || full.contains(n), "{module}::{n}");
            }
        }
        let err = selected(KERNEL_TESTS, &["daemonset".to_string()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("kernel_events"), "{err}");
    }
}
