//! `cargo xtask node-vm test`: the modern-node suite. The host builds `podtrace` and the
//! integration test binaries; they run inside the guest against its containerd 2.x with the
//! systemd cgroup driver, then a smaller compatibility suite against containerd 1.7, with
//! the host lab's registry forwarded to the guest's 127.0.0.1:5000. Timings inside the
//! emulated guest are functional only.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use xtask::lab::{self, LabPaths, LabState};

use super::machine::VmState;
use super::ssh::Guest;
use super::{Booted, NodeVmPaths, recipe};
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
    // containerd 2.x traces every CRI call here: its spans must continue podtrace's.
    (
        "otel_export",
        &["a_pods_startup_arrives_as_one_trace_and_the_recorded_trace_exports_the_same"],
    ),
];

/// The containerd 1.7 compatibility suite, run after the reference suite in the same boot
/// with the guest's socket served by containerd 1.7: what podtrace reads from the runtime
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

/// The kubelet-like CRI client the observe test drives pods with (`tests/bin`).
const CRI_POD_CLIENT: &str = integration::CRI_POD_CLIENT;

/// The suite's modules `only` names (all of them when it is empty), or which name is not
/// one.
fn selected(only: &[String]) -> anyhow::Result<Vec<(&'static str, &'static [&'static str])>> {
    if let Some(unknown) = only
        .iter()
        .find(|o| !GUEST_TESTS.iter().any(|(t, _)| t == o))
    {
        bail!(
            "--only {unknown}: not a test of the suite (it has {})",
            GUEST_TESTS
                .iter()
                .map(|(t, _)| *t)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(GUEST_TESTS
        .iter()
        .filter(|(t, _)| only.is_empty() || only.iter().any(|o| o == t))
        .copied()
        .collect())
}

/// What runs in the guest: the built test binaries, and the tests of each module chosen
/// from them, for the reference runtime and then the compatibility one.
struct Suite<'a> {
    built: &'a integration::Built,
    reference: Vec<Planned>,
    compat: Vec<Planned>,
}

/// One module's run: its binary and the libtest arguments that choose its tests.
struct Planned {
    module: &'static str,
    binary: &'static str,
    args: Vec<String>,
}

/// The runs of `tests` (module, test names; empty = all of them), from the built binaries'
/// own lists: a name a binary does not have fails here, on the host, before the boot.
fn plan(
    built: &integration::Built,
    tests: &[(&'static str, &'static [&'static str])],
) -> anyhow::Result<Vec<Planned>> {
    let mut listed: Vec<(&'static str, Vec<String>)> = Vec::new();
    let mut planned = Vec::new();
    for (module, names) in tests {
        let binary = integration::binary_of(module)
            .with_context(|| format!("the guest's test {module} is in no test binary"))?
            .name;
        if !listed.iter().any(|(b, _)| *b == binary) {
            listed.push((binary, integration::list(built.executable(binary)?)?));
        }
        let (_, all) = listed
            .iter()
            .find(|(b, _)| *b == binary)
            .expect("listed just above");
        planned.push(Planned {
            module,
            binary,
            args: integration::selection(all, module, names)?,
        });
    }
    Ok(planned)
}

/// Tells the tests in the guest which containerd serves the node: `2` (the reference) or
/// `1.7` (the compatibility runtime).
pub const RUNTIME_ENV: &str = "PODTRACE_NODE_RUNTIME";

/// Where the binaries and examples go in the guest.
const WORK: &str = recipe::GUEST_WORK_DIR;

pub fn run(paths: &NodeVmPaths, only: &[String]) -> anyhow::Result<()> {
    // A name that is not in the suite fails before anything starts.
    selected(only)?;
    // The guest's registry is the host lab's.
    let lab_paths = LabPaths::from_env();
    let lab_was_up = lab_paths.state_file().exists();
    if !lab_was_up {
        eprintln!("starting the host lab (its registry serves the guest)");
        lab::up(&lab_paths, &crate::ui::lab_says)?;
    }
    let result = run_on_lab(paths, &lab_paths, only);
    if !lab_was_up {
        lab::down(&lab_paths, &crate::ui::lab_says)?;
    }
    result
}

/// The suite (or the test targets `only` names), with the host lab up.
pub fn run_on_lab(
    paths: &NodeVmPaths,
    lab_paths: &LabPaths,
    only: &[String],
) -> anyhow::Result<()> {
    let started = Instant::now();
    eprintln!("node-vm [1/4] building podtrace and the test binaries");
    let podtrace = workspace::build_podtrace(true)?;
    let probes = crate::build_ebpf::run()?;
    let tests = selected(only)?;
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
    let compat: Vec<(&'static str, &'static [&'static str])> = COMPAT_TESTS
        .iter()
        .filter(|(t, _)| tests.iter().any(|(m, _)| m == t))
        .copied()
        .collect();
    let compat = plan(&built, &compat)?;
    let suite = Suite {
        built: &built,
        reference,
        compat,
    };
    let report = with_guest(paths, lab_paths, &podtrace, &probes, &suite)?;
    report.print();
    eprintln!(
        "modern-node suite: {} of {} test runs passed in {:.0} s (boot {:.0} s)",
        report.passed(),
        report.runs.len(),
        started.elapsed().as_secs_f64(),
        report.boot_seconds
    );
    if report.passed() != report.runs.len() {
        bail!(
            "the modern-node suite failed; the guest's logs are in {}",
            results_dir().display()
        );
    }
    Ok(())
}

struct Run {
    test: &'static str,
    /// Which containerd served the node: "2" or "1.7".
    runtime: &'static str,
    ok: bool,
    seconds: f64,
}

struct Report {
    runs: Vec<Run>,
    boot_seconds: f64,
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
                "{:<14} {:<10} {:>8.1}  {}",
                r.test,
                r.runtime,
                r.seconds,
                if r.ok { "ok" } else { "FAILED" }
            );
        }
    }
}

fn with_guest(
    paths: &NodeVmPaths,
    lab_paths: &LabPaths,
    podtrace: &Path,
    probes: &Path,
    suite: &Suite,
) -> anyhow::Result<Report> {
    eprintln!("node-vm [2/4] the modern node");
    let (state, booted) = super::up(paths)?;
    let result = in_guest(&state, paths, lab_paths, podtrace, probes, suite);
    if booted == Booted::Now {
        super::down(paths, false)?;
    }
    result
}

fn in_guest(
    state: &VmState,
    paths: &NodeVmPaths,
    lab_paths: &LabPaths,
    podtrace: &Path,
    probes: &Path,
    suite: &Suite,
) -> anyhow::Result<Report> {
    let guest = state.guest(paths);
    eprintln!("node-vm [3/4] copying podtrace, the probes, the tests and the examples in");
    let stage = stage(podtrace, probes, suite.built)?;
    guest.check(&format!("rm -rf {WORK}"))?;
    guest.copy_in(&[stage], "/opt")?;
    install_lab_profile(&guest, lab_paths, recipe::REFERENCE_UNIT)?;

    eprintln!("node-vm [4/4] the suite, in the guest");
    let mut runs = Vec::new();
    run_tests(&guest, &suite.reference, "2", &mut runs)?;
    if !suite.compat.is_empty() {
        eprintln!("--- switching the node's runtime to containerd 1.7 (compatibility suite)");
        // Type=notify: `start` returns once containerd 1.7 serves its socket.
        guest.check(&format!(
            "systemctl stop {ref_unit} && systemctl start {compat_unit}",
            ref_unit = recipe::REFERENCE_UNIT,
            compat_unit = recipe::COMPAT_UNIT
        ))?;
        install_lab_profile(&guest, lab_paths, recipe::COMPAT_UNIT)?;
        let switched = run_tests(&guest, &suite.compat, "1.7", &mut runs);
        // Back to the reference runtime, so a guest left up serves what it booted with.
        guest.check(&format!(
            "systemctl stop {compat_unit} && systemctl start {ref_unit}",
            ref_unit = recipe::REFERENCE_UNIT,
            compat_unit = recipe::COMPAT_UNIT
        ))?;
        install_lab_profile(&guest, lab_paths, recipe::REFERENCE_UNIT)?;
        switched?;
    }
    if runs.iter().any(|r| !r.ok) {
        collect_logs(&guest, paths);
    }
    Ok(Report {
        runs,
        boot_seconds: state.boot_seconds,
    })
}

/// Runs `planned` in the guest against the runtime `runtime` names ([`RUNTIME_ENV`]).
fn run_tests(
    guest: &Guest,
    planned: &[Planned],
    runtime: &'static str,
    runs: &mut Vec<Run>,
) -> anyhow::Result<()> {
    let port = registry_port();
    for p in planned {
        let cmd: Vec<String> = [
            format!("{WORK}/tests/{}", p.binary),
            "--test-threads=1".to_string(),
        ]
        .into_iter()
        .chain(p.args.iter().cloned())
        .collect();
        let script = format!(
            "cd {WORK} && env PODTRACE_BIN={WORK}/bin/podtrace PODTRACE_CRI_POD_CLIENT={WORK}/tests/{CRI_POD_CLIENT} PODTRACE_LAB_DIR={lab} PODTRACE_EXAMPLES={WORK}/examples {RUNTIME_ENV}={runtime} RUST_BACKTRACE=1 {cmd}",
            lab = recipe::GUEST_LAB_DIR,
            cmd = super::ssh::join_args(&cmd)?
        );
        eprintln!(
            "--- {} ({} tests, in the guest, containerd {runtime})",
            p.module,
            p.args.len() - 1
        );
        let t = Instant::now();
        let status = guest.exec(&script, Some(port))?;
        runs.push(Run {
            test: p.module,
            runtime,
            ok: status.success(),
            seconds: t.elapsed().as_secs_f64(),
        });
    }
    Ok(())
}

/// `target/node-vm/podtrace`: what goes to the guest's /opt/podtrace.
fn stage(podtrace: &Path, probes: &Path, built: &integration::Built) -> anyhow::Result<PathBuf> {
    let dir = workspace::target_dir().join("node-vm").join("podtrace");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    for sub in ["bin", "bpf", "tests"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    let place = super::place;
    place(podtrace, dir.join("bin/podtrace"))?;
    // Beside the binary's parent, where the tests look for `--probes` (the copied-alone
    // test uses the embedded object instead).
    place(probes, dir.join("bpf/podtrace-probes.o"))?;
    for (binary, exe) in &built.binaries {
        place(exe, dir.join("tests").join(binary))?;
    }
    place(
        &built.cri_pod_client,
        dir.join("tests").join(CRI_POD_CLIENT),
    )?;
    let examples = workspace::root().join("examples");
    let status = std::process::Command::new("cp")
        .arg("-r")
        .arg(&examples)
        .arg(dir.join("examples"))
        .status()?;
    if !status.success() {
        bail!("copying {}", examples.display());
    }
    Ok(dir)
}

/// The guest's lab profile: the host lab's state, with the guest's runtime in it. The
/// images and the registry are the host lab's; containerd, CNI and the cgroups are the
/// guest's own.
fn install_lab_profile(guest: &Guest, lab_paths: &LabPaths, unit: &str) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(lab_paths.state_file())
        .with_context(|| format!("reading {}", lab_paths.state_file().display()))?;
    let mut state: LabState = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a lab state", lab_paths.state_file().display()))?;
    let containerd_pid: u32 = guest
        .check(&format!("systemctl show -p MainPID --value {unit}"))?
        .trim()
        .parse()
        .context("the guest's containerd has no main pid")?;
    let guest_lab = LabPaths::new(recipe::GUEST_LAB_DIR);
    state.root = guest_lab.root.clone();
    state.containerd_pid = containerd_pid;
    state.registry_pid = 0;
    state.cri_socket = recipe::CONTAINERD_SOCKET.into();
    state.containerd_log = format!("journalctl -u {unit}").into();
    state.registry_log = lab_paths.registry_log();
    state.containerd_config = if unit == recipe::COMPAT_UNIT {
        recipe::COMPAT_CONFIG
    } else {
        recipe::CONTAINERD_CONFIG
    }
    .into();
    state.cni_conflist = Path::new(recipe::CNI_CONF_DIR).join(lab::CNI_CONFLIST);
    guest.write_file(
        &guest_lab.state_file().display().to_string(),
        &(serde_json::to_string_pretty(&state)? + "\n"),
    )
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

/// The guest's containerd journal and unit list, brought back after a failure.
fn collect_logs(guest: &Guest, paths: &NodeVmPaths) {
    let dir = results_dir();
    let _ = std::fs::create_dir_all(&dir);
    let script = "mkdir -p /tmp/node-vm-results && journalctl -b --no-pager -u containerd -u containerd-1.7 > /tmp/node-vm-results/containerd.log 2>&1; systemctl list-units --all --no-pager > /tmp/node-vm-results/units.txt 2>&1; journalctl -b --no-pager -p warning > /tmp/node-vm-results/warnings.log 2>&1; true";
    if guest.check(script).is_ok() {
        let _ = guest.copy_out("/tmp/node-vm-results", &dir);
    }
    let _ = std::fs::copy(paths.console_log(), dir.join("console.log"));
}
