//! The modern node during one suite: the stage copied in, the lab profile of whichever
//! containerd serves, one module at a time over ssh, and what happens when the guest
//! stops answering.
//!
//! A guest under software emulation on a busy two-core host can stall for minutes. When a
//! module's ssh session breaks (ssh's own exit status, not the test binary's) and the
//! guest does not answer again within a bound, the suite prints the guest's console, keeps
//! it in the results directory, boots a fresh guest (the image is read-only, so it starts
//! from the same disk) and runs that module once more. The report marks such a run; a
//! second loss ends the suite as failed.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::Context;
use xtask::lab::{self, LabPaths, LabState};

use super::kernels::GuestKernel;
use super::machine::{self, VmState};
use super::ssh::{self, Guest};
use super::suite::{Planned, RUNTIME_ENV, Report, Run, Suite, registry_port, results_dir};
use super::{Booted, NodeVmPaths, recipe};
use crate::integration::CRI_POD_CLIENT;

const WORK: &str = recipe::GUEST_WORK_DIR;

/// The runtime the guest boots with, and the one the compatibility runs switch to, as
/// [`RUNTIME_ENV`] names them.
const REFERENCE: &str = "2";
const COMPAT: &str = "1.7";

/// ssh's exit status for a failure of its own: the connection, not the remote command.
const SSH_FAILED: i32 = 255;

/// How long a guest whose session broke gets to answer again before it counts as lost.
/// Each attempt is bounded by ssh's connect timeout; a stall of a few seconds under
/// emulation passes well within this.
const ANSWER_BOUND: Duration = Duration::from_secs(60);

/// Console lines printed when the guest is lost or the suite fails.
const CONSOLE_LINES: usize = 40;

/// Boots (or finds) the guest on `kernel`, runs the suite in it, and stops it again if it
/// booted it.
pub fn with_guest(
    paths: &NodeVmPaths,
    lab_paths: &LabPaths,
    stage: PathBuf,
    suite: &Suite,
    kernel: &'static GuestKernel,
) -> anyhow::Result<Report> {
    let (state, booted) = super::up(paths, kernel)?;
    let mut node = Node {
        paths,
        lab_paths,
        stage,
        kernel,
        state,
        booted,
        runtime: REFERENCE,
        rebooted: false,
    };
    let result = node.run_suite(suite);
    if result.is_err() {
        eprintln!(
            "the guest's console, its last lines:\n{}",
            machine::console_tail(paths, CONSOLE_LINES)
        );
    }
    if node.booted == Booted::Now {
        super::down(paths, false)?;
    }
    result
}

struct Node<'a> {
    paths: &'a NodeVmPaths,
    lab_paths: &'a LabPaths,
    stage: PathBuf,
    kernel: &'static GuestKernel,
    state: VmState,
    booted: Booted,
    /// Which containerd serves the guest's CRI socket now.
    runtime: &'static str,
    rebooted: bool,
}

impl Node<'_> {
    fn guest(&self) -> Guest {
        self.state.guest(self.paths)
    }

    fn run_suite(&mut self, suite: &Suite) -> anyhow::Result<Report> {
        eprintln!("node-vm [3/4] copying podlapse, the probes, the tests and the examples in");
        self.prepare()?;
        eprintln!("node-vm [4/4] the suite, in the guest");
        let steps = (suite.reference.iter().map(|p| (p, REFERENCE)))
            .chain(suite.compat.iter().map(|p| (p, COMPAT)));
        let mut runs = Vec::new();
        for (planned, runtime) in steps {
            if runtime != self.runtime {
                eprintln!("--- switching the node's runtime to containerd {runtime}");
                self.switch_to(runtime)?;
            }
            let (mut run, status) = self.run_module(planned)?;
            if !run.ok && self.lost(status) {
                let module = planned.module;
                self.say_lost(module)?;
                if self.rebooted || self.booted == Booted::Already {
                    runs.push(run);
                    return Ok(self.report(runs, Some(module)));
                }
                self.reboot()?;
                eprintln!("--- {module} again, on a freshly booted guest");
                (run, _) = self.run_module(planned)?;
                run.rerun = true;
            }
            runs.push(run);
        }
        // Back to the reference runtime, so a guest left up serves what it booted with.
        self.switch_to(REFERENCE)?;
        if runs.iter().any(|r| !r.ok) {
            self.collect_logs();
        }
        Ok(self.report(runs, None))
    }

    fn report(&self, runs: Vec<Run>, lost: Option<&'static str>) -> Report {
        Report {
            runs,
            boot_seconds: self.state.boot_seconds,
            lost,
        }
    }

    /// The stage copied in as `/opt/podlapse`, and the lab profile of the reference runtime.
    fn prepare(&mut self) -> anyhow::Result<()> {
        let guest = self.guest();
        guest.check(&format!("rm -rf {WORK}"))?;
        guest.copy_in(std::slice::from_ref(&self.stage), "/opt")?;
        install_lab_profile(&guest, self.lab_paths, recipe::REFERENCE_UNIT)?;
        self.runtime = REFERENCE;
        Ok(())
    }

    fn switch_to(&mut self, runtime: &'static str) -> anyhow::Result<()> {
        if runtime == self.runtime {
            return Ok(());
        }
        let (from, to) = if runtime == COMPAT {
            (recipe::REFERENCE_UNIT, recipe::COMPAT_UNIT)
        } else {
            (recipe::COMPAT_UNIT, recipe::REFERENCE_UNIT)
        };
        let guest = self.guest();
        // Type=notify: `start` returns once the other containerd serves its socket.
        guest.check(&format!("systemctl stop {from} && systemctl start {to}"))?;
        install_lab_profile(&guest, self.lab_paths, to)?;
        self.runtime = runtime;
        Ok(())
    }

    /// Runs one planned module against the runtime that serves now.
    fn run_module(&self, p: &Planned) -> anyhow::Result<(Run, ExitStatus)> {
        let cmd: Vec<String> = [
            format!("{WORK}/tests/{}", p.binary),
            "--test-threads=1".to_string(),
        ]
        .into_iter()
        .chain(p.args.iter().cloned())
        .collect();
        // The podlapse processes the tests start log as the host's shell asks (PODLAPSE_LOG).
        let log = match std::env::var("PODLAPSE_LOG") {
            Ok(filter) => format!("PODLAPSE_LOG={} ", ssh::join_args(&[filter])?),
            Err(_) => String::new(),
        };
        let script = format!(
            "cd {WORK} && env PATH={WORK}/bin:$PATH PODLAPSE_BIN={WORK}/bin/podlapse PODLAPSE_CRI_POD_CLIENT={WORK}/tests/{CRI_POD_CLIENT} PODLAPSE_LAB_DIR={lab} PODLAPSE_EXAMPLES={WORK}/examples PODLAPSE_DEPLOY={WORK}/deploy PODLAPSE_AGENT_IMAGE={image} {RUNTIME_ENV}={runtime} {log}RUST_BACKTRACE=1 {cmd}",
            image = super::suite::AGENT_IMAGE,
            lab = recipe::GUEST_LAB_DIR,
            runtime = self.runtime,
            cmd = ssh::join_args(&cmd)?
        );
        eprintln!(
            "--- {} ({} tests, in the guest, containerd {})",
            p.module,
            p.args.len() - 1,
            self.runtime
        );
        let t = Instant::now();
        let status = self.guest().exec(&script, Some(registry_port()))?;
        let run = Run {
            test: p.module,
            runtime: self.runtime,
            ok: status.success(),
            seconds: t.elapsed().as_secs_f64(),
            rerun: false,
        };
        Ok((run, status))
    }

    /// Whether a failed run lost the guest: ssh itself failed, and the guest does not
    /// answer again within [`ANSWER_BOUND`]. A test that fails is the test binary's
    /// status, and the guest is not asked.
    fn lost(&self, status: ExitStatus) -> bool {
        status.code() == Some(SSH_FAILED)
            && !(self.state.is_running(self.paths) && self.guest().answers(ANSWER_BOUND))
    }

    /// Says the guest is lost, with its console, and keeps the console in the results
    /// directory (a reboot removes the run directory it is in).
    fn say_lost(&self, module: &str) -> anyhow::Result<()> {
        let qemu = if self.state.is_running(self.paths) {
            format!("QEMU still runs, but ssh got no answer for {ANSWER_BOUND:?}")
        } else {
            "QEMU exited".to_string()
        };
        eprintln!(
            "--- the guest stopped answering during {module} ({qemu}); its console's last lines:\n{}",
            machine::console_tail(self.paths, CONSOLE_LINES)
        );
        let dir = results_dir();
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let kept = dir.join(format!("console-lost-during-{module}.log"));
        // The console may be gone with QEMU's run directory; then there is nothing to keep.
        let _ = std::fs::copy(self.paths.console_log(), &kept);
        eprintln!("--- the guest's whole console is in {}", kept.display());
        Ok(())
    }

    /// A fresh guest in the same state the suite left the lost one: the stage copied in
    /// and the same runtime serving.
    fn reboot(&mut self) -> anyhow::Result<()> {
        eprintln!("--- rebooting the modern node");
        let runtime = self.runtime;
        super::down(self.paths, false)?;
        let (state, _) = super::up(self.paths, self.kernel)?;
        self.state = state;
        self.rebooted = true;
        self.prepare()?;
        self.switch_to(runtime)
    }

    /// The guest's containerd journal, unit list and console, brought back after a failure.
    fn collect_logs(&self) {
        let guest = self.guest();
        let dir = results_dir();
        let _ = std::fs::create_dir_all(&dir);
        let script = "mkdir -p /tmp/node-vm-results && journalctl -b --no-pager -u containerd -u containerd-1.7 > /tmp/node-vm-results/containerd.log 2>&1; systemctl list-units --all --no-pager > /tmp/node-vm-results/units.txt 2>&1; journalctl -b --no-pager -p warning > /tmp/node-vm-results/warnings.log 2>&1; cp /tmp/podlapse-failed-* /tmp/node-vm-results/ 2>/dev/null; true";
        if guest.check(script).is_ok() {
            let _ = guest.copy_out("/tmp/node-vm-results", &dir);
        }
        let _ = std::fs::copy(self.paths.console_log(), dir.join("console.log"));
    }
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
