//! Reaching the guest: OpenSSH to QEMU's forwarded port on 127.0.0.1, with the key made for
//! the image and the guest's host key pinned. Files go in and out as tar streams.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};

use anyhow::{Context, bail};
use xtask::poll::Poll;

/// The name the guest's host key is pinned under (its port changes from boot to boot).
pub const HOST_KEY_ALIAS: &str = "podlapse-node-vm";

/// ssh's options besides the key, its host key and the port, each given with `-o`.
const SSH_OPTIONS: &[&str] = &[
    "StrictHostKeyChecking=yes",
    "BatchMode=yes",
    "IdentitiesOnly=yes",
    "ConnectTimeout=10",
    "ServerAliveInterval=15",
    "ServerAliveCountMax=8",
    "LogLevel=ERROR",
    "ExitOnForwardFailure=no",
];

/// The guest as ssh sees it.
#[derive(Debug, Clone)]
pub struct Guest {
    pub port: u16,
    pub key: PathBuf,
    pub known_hosts: PathBuf,
}

impl Guest {
    /// `ssh` with every option; the caller adds the remote command.
    pub fn ssh(&self) -> Command {
        let mut cmd = Command::new("ssh");
        cmd.arg("-p")
            .arg(self.port.to_string())
            .arg("-i")
            .arg(&self.key)
            .arg("-o")
            .arg(format!("UserKnownHostsFile={}", self.known_hosts.display()))
            .args(["-o", &format!("HostKeyAlias={HOST_KEY_ALIAS}")]);
        for option in SSH_OPTIONS {
            cmd.args(["-o", option]);
        }
        cmd
    }

    /// `ssh ... root@127.0.0.1 -- <script>`; `forward` gives the guest the host's port
    /// (the lab registry) on its own loopback while the command runs.
    pub fn command(&self, script: &str, forward: Option<u16>) -> Command {
        let mut cmd = self.ssh();
        if let Some(port) = forward {
            cmd.arg("-R").arg(format!("{port}:127.0.0.1:{port}"));
        }
        cmd.arg("root@127.0.0.1").arg("--").arg(script);
        cmd
    }

    /// Runs a shell command in the guest with its output on this terminal.
    pub fn exec(&self, script: &str, forward: Option<u16>) -> anyhow::Result<ExitStatus> {
        self.command(script, forward)
            .stdin(Stdio::null())
            .status()
            .context("running ssh (package openssh-client)")
    }

    /// Runs a shell command in the guest and returns what it printed.
    pub fn output(&self, script: &str) -> anyhow::Result<Output> {
        self.command(script, None)
            .stdin(Stdio::null())
            .output()
            .context("running ssh (package openssh-client)")
    }

    /// Whether the guest runs a command over ssh within `bound`. A guest busy under
    /// emulation can miss one connect timeout and still be alive, so this tries again
    /// until the bound has passed.
    pub fn answers(&self, bound: std::time::Duration) -> bool {
        Poll::new(
            "the guest to answer",
            bound,
            std::time::Duration::from_secs(2),
        )
        .holds(|| self.output("true").is_ok_and(|o| o.status.success()))
    }

    /// Like [`Guest::output`], failing unless the command succeeds; returns its stdout.
    pub fn check(&self, script: &str) -> anyhow::Result<String> {
        let out = self.output(script)?;
        if !out.status.success() {
            bail!(
                "in the guest, `{script}` failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Writes `text` to `path` in the guest.
    pub fn write_file(&self, path: &str, text: &str) -> anyhow::Result<()> {
        use std::io::Write;
        let dir = Path::new(path)
            .parent()
            .map(|d| d.display().to_string())
            .unwrap_or_else(|| "/".into());
        let script = format!(
            "mkdir -p {} && cat > {}",
            shlex::try_quote(&dir)?,
            shlex::try_quote(path)?
        );
        let mut child = self
            .command(&script, None)
            .stdin(Stdio::piped())
            .spawn()
            .context("running ssh")?;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(text.as_bytes())?;
        let status = child.wait()?;
        if !status.success() {
            bail!("writing {path} in the guest failed ({status})");
        }
        Ok(())
    }

    /// Copies host files or directories into a guest directory (made if missing).
    pub fn copy_in(&self, sources: &[PathBuf], guest_dir: &str) -> anyhow::Result<()> {
        for src in sources {
            let src = &std::path::absolute(src)
                .with_context(|| format!("resolving {}", src.display()))?;
            let (Some(parent), Some(name)) = (src.parent(), src.file_name()) else {
                bail!(
                    "cannot copy {}: not a file or directory path",
                    src.display()
                );
            };
            if !src.exists() {
                bail!(
                    "cannot copy {} into the guest: it does not exist",
                    src.display()
                );
            }
            let mut tar = Command::new("tar")
                .arg("-C")
                .arg(parent)
                .arg("-cf")
                .arg("-")
                .arg("--dereference")
                .arg(name)
                .stdout(Stdio::piped())
                .spawn()
                .context("running tar")?;
            let script = format!(
                "mkdir -p {d} && tar -C {d} -xf -",
                d = shlex::try_quote(guest_dir)?
            );
            let status = self
                .command(&script, None)
                .stdin(Stdio::from(tar.stdout.take().expect("piped")))
                .status()
                .context("running ssh")?;
            let tar_status = tar.wait()?;
            if !status.success() || !tar_status.success() {
                bail!(
                    "copying {} to {guest_dir} in the guest failed (ssh {status}, tar {tar_status})",
                    src.display()
                );
            }
        }
        Ok(())
    }

    /// Copies a guest file or directory into a host directory (made if missing).
    pub fn copy_out(&self, guest_path: &str, host_dir: &Path) -> anyhow::Result<()> {
        let p = Path::new(guest_path);
        let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
            bail!("cannot copy {guest_path} out of the guest: not a file or directory path");
        };
        std::fs::create_dir_all(host_dir)
            .with_context(|| format!("creating {}", host_dir.display()))?;
        let script = format!(
            "tar -C {} -cf - {}",
            shlex::try_quote(&parent.display().to_string())?,
            shlex::try_quote(&name.to_string_lossy())?
        );
        let mut ssh = self
            .command(&script, None)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .context("running ssh")?;
        let status = Command::new("tar")
            .arg("-C")
            .arg(host_dir)
            .arg("-xf")
            .arg("-")
            .stdin(Stdio::from(ssh.stdout.take().expect("piped")))
            .status()
            .context("running tar")?;
        let ssh_status = ssh.wait()?;
        if !status.success() || !ssh_status.success() {
            bail!("copying {guest_path} out of the guest failed (ssh {ssh_status}, tar {status})");
        }
        Ok(())
    }
}

/// The argument vector as one shell command line for the guest's shell.
pub fn join_args(args: &[String]) -> anyhow::Result<String> {
    shlex::try_join(args.iter().map(String::as_str))
        .context("an argument holds a NUL byte and cannot be passed to the guest's shell")
}
