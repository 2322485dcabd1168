//! The running guest: QEMU under software emulation (KVM on this host runs only PVM guest
//! kernels), the image as a read-only base with writes discarded at exit, the console on a
//! file, and one NIC on QEMU's restricted user network, whose only way in is the forwarded
//! ssh port on the host's loopback.

use std::fs;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use xtask::lab;
use xtask::poll::Poll;
use xtask::text::last_lines;

use super::kernels::{self, GuestKernel};
use super::paths::{ImagePaths, NodeVmPaths};
use super::recipe;
use super::ssh::Guest;

/// The guest's size: as many vCPUs as this 2-core host has, and room for containerd, the
/// test binaries and a handful of pods.
const MEMORY_MIB: u32 = 3072;
const VCPUS: u32 = 2;
/// Boot to containerd answering takes ~20 s under emulation; this allows for a loaded host.
const BOOT_TIMEOUT: Duration = Duration::from_secs(300);
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// What `up` started, in `run/state.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmState {
    pub pid: u32,
    pub ssh_port: u16,
    pub image: String,
    /// The matrix's kernel it booted (`6.12`, ...).
    #[serde(default = "reference_kernel")]
    pub kernel: String,
    /// Seconds from starting QEMU to containerd answering in the guest.
    pub boot_seconds: f64,
}

fn reference_kernel() -> String {
    kernels::REFERENCE.to_string()
}

impl VmState {
    pub fn read(paths: &NodeVmPaths) -> anyhow::Result<Option<VmState>> {
        let p = paths.state_file();
        match fs::read_to_string(&p) {
            Ok(t) => serde_json::from_str(&t)
                .map(Some)
                .with_context(|| format!("{}: not a node-vm state file", p.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", p.display())),
        }
    }

    pub fn guest(&self, paths: &NodeVmPaths) -> Guest {
        let image = paths.image(&self.image);
        Guest {
            port: self.ssh_port,
            key: image.ssh_key(),
            known_hosts: image.known_hosts(),
        }
    }

    /// QEMU still runs, and is this node's (a recycled pid would run something else).
    pub fn is_running(&self, paths: &NodeVmPaths) -> bool {
        is_our_qemu(self.pid, paths)
    }
}

fn is_our_qemu(pid: u32, paths: &NodeVmPaths) -> bool {
    lab::is_alive(pid) && lab::cmdline(pid).contains(&paths.console_log().display().to_string())
}

/// Boots the guest from `image` on `kernel` and waits until its containerd answers over
/// ssh.
pub fn start(
    paths: &NodeVmPaths,
    image: &ImagePaths,
    hash: &str,
    kernel: &GuestKernel,
) -> anyhow::Result<VmState> {
    if !image.kernel(kernel.name).is_file() {
        let why = super::image::missing_kernels(image)
            .into_iter()
            .find(|(name, _)| name == kernel.name)
            .map_or_else(
                || format!("{} is not there", image.kernel(kernel.name).display()),
                |(_, why)| why,
            );
        bail!("kernel {kernel} is not in the modern node's image: {why}");
    }
    let run = paths.run_dir();
    if run.exists() {
        fs::remove_dir_all(&run).with_context(|| format!("removing {}", run.display()))?;
    }
    fs::create_dir_all(&run).with_context(|| format!("creating {}", run.display()))?;
    let port = free_port()?;
    let started = Instant::now();
    let status = Command::new("qemu-system-x86_64")
        .args(["-name", "podlapse-node-vm"])
        .args(["-accel", "tcg,thread=multi", "-cpu", "max"])
        .args(["-m", &MEMORY_MIB.to_string(), "-smp", &VCPUS.to_string()])
        .args(["-display", "none", "-no-reboot"])
        .arg("-serial")
        .arg(format!("file:{}", paths.console_log().display()))
        .args(["-monitor", "none"])
        .arg("-nic")
        .arg(format!(
            "user,model=virtio-net-pci,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:22"
        ))
        .arg("-kernel")
        .arg(image.kernel(kernel.name))
        .arg("-initrd")
        .arg(image.initrd(kernel.name))
        .args(["-append", recipe::KERNEL_CMDLINE])
        .arg("-drive")
        .arg(format!(
            "file={},format=raw,if=virtio,snapshot=on,cache=unsafe",
            image.disk().display()
        ))
        .arg("-daemonize")
        .arg("-pidfile")
        .arg(paths.pid_file())
        // The snapshot's scratch file: QEMU unlinks it at once, and it lives in run/.
        .env("TMPDIR", &run)
        .stdin(Stdio::null())
        .stdout(fs::File::create(paths.qemu_log())?)
        .stderr(fs::File::create(paths.qemu_log().with_extension("err"))?)
        .status()
        .context(
            "running qemu-system-x86_64 (package qemu-system-x86; `cargo xtask setup` installs it)",
        )?;
    if !status.success() {
        let err = fs::read_to_string(paths.qemu_log().with_extension("err")).unwrap_or_default();
        bail!("QEMU did not start ({status}): {}", err.trim());
    }
    let pid: u32 = fs::read_to_string(paths.pid_file())
        .context("QEMU wrote no pid file")?
        .trim()
        .parse()
        .context("QEMU's pid file holds no pid")?;
    let mut state = VmState {
        pid,
        ssh_port: port,
        image: hash.to_string(),
        kernel: kernel.name.to_string(),
        boot_seconds: 0.0,
    };
    let guest = state.guest(paths);
    if let Err(e) = wait_ready(paths, &state, &guest, started) {
        let _ = stop(paths);
        return Err(e);
    }
    state.boot_seconds = started.elapsed().as_secs_f64();
    fs::write(
        paths.state_file(),
        serde_json::to_string_pretty(&state)? + "\n",
    )?;
    Ok(state)
}

/// Polls over ssh (each attempt bounded by ssh's connect timeout) until containerd's socket
/// answers, QEMU exits, or the boot timeout passes.
fn wait_ready(
    paths: &NodeVmPaths,
    state: &VmState,
    guest: &Guest,
    started: Instant,
) -> anyhow::Result<()> {
    let check = format!(
        "systemctl is-active --quiet containerd && test -S {}",
        recipe::CONTAINERD_SOCKET
    );
    // ssh fails at once while the port is not yet forwarded to a listening sshd.
    let boot = Poll::new(
        "the node to answer with containerd up",
        BOOT_TIMEOUT,
        Duration::from_millis(500),
    )
    .since(started);
    let ready = boot.within(|| {
        if !state.is_running(paths) {
            bail!(
                "QEMU exited while the node booted on kernel {}; its console:\n{}",
                state.kernel,
                console_tail(paths, 30)
            );
        }
        // A kernel that cannot boot says so on the console: no need to wait out the bound.
        if let Some(line) = boot_failure(&console_tail(paths, 200)) {
            bail!(
                "the node did not boot on kernel {} ({line}); its console:\n{}",
                state.kernel,
                console_tail(paths, 30)
            );
        }
        Ok(guest
            .output(&check)
            .is_ok_and(|o| o.status.success())
            .then_some(()))
    })?;
    if ready.is_none() {
        bail!(
            "the node did not answer with containerd up within {} s on kernel {}; its console:\n{}",
            BOOT_TIMEOUT.as_secs(),
            state.kernel,
            console_tail(paths, 30)
        );
    }
    Ok(())
}

/// The console line that says the boot failed for good: a kernel panic, or an initramfs
/// that dropped to its emergency shell (no root file system).
fn boot_failure(console: &str) -> Option<&str> {
    console.lines().map(str::trim).find(|l| {
        l.contains("Kernel panic - not syncing")
            || l.contains("Dropping to a shell")
            || l.contains("Gave up waiting for root")
    })
}

/// The last lines of the guest's console.
pub fn console_tail(paths: &NodeVmPaths, n: usize) -> String {
    let text = fs::read(paths.console_log())
        .map(|b| String::from_utf8_lossy(&b).replace('\r', ""))
        .unwrap_or_default();
    last_lines(&text, n).join("\n")
}

/// Stops QEMU (TERM, then KILL) and removes `run/`. Returns whether a guest was running.
pub fn stop(paths: &NodeVmPaths) -> anyhow::Result<bool> {
    let pid = fs::read_to_string(paths.pid_file())
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok());
    let mut was_running = false;
    if let Some(pid) = pid.filter(|&p| is_our_qemu(p, paths)) {
        was_running = true;
        lab::signal(pid, libc::SIGTERM);
        let exited = || {
            Poll::new("QEMU to exit", STOP_TIMEOUT, Duration::from_millis(100))
                .holds(|| !is_our_qemu(pid, paths))
        };
        exited();
        if is_our_qemu(pid, paths) {
            lab::signal(pid, libc::SIGKILL);
            exited();
        }
        if is_our_qemu(pid, paths) {
            bail!("QEMU (pid {pid}) did not exit after SIGKILL");
        }
    }
    let run = paths.run_dir();
    if run.exists() {
        fs::remove_dir_all(&run).with_context(|| format!("removing {}", run.display()))?;
    }
    Ok(was_running)
}

fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free port for ssh")?;
    Ok(l.local_addr()?.port())
}

/// Any QEMU of this node's still running (for `down`'s check that nothing is left).
pub fn leftover_qemus(paths: &NodeVmPaths) -> Vec<u32> {
    lab::all_pids()
        .into_iter()
        .filter(|&pid| is_our_qemu(pid, paths))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_or_an_initramfs_shell_on_the_console_is_a_failed_boot() {
        let panic = "[    1.2] VFS: Unable to mount root fs\n[    1.3] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)\n";
        assert_eq!(
            boot_failure(panic),
            Some(
                "[    1.3] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)"
            )
        );
        let shell = "Gave up waiting for root file system device.\nALERT!  /dev/vda does not exist.  Dropping to a shell!\n";
        assert!(boot_failure(shell).is_some());
        assert_eq!(boot_failure("[  OK  ] Started containerd.service\n"), None);
    }
}
