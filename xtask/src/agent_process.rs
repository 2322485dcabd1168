//! A `podlapse run` agent process as the integration tests and the benchmarks start it:
//! the flags that give it places of its own, a start that waits on evidence (its API
//! answering) and fails at once if it exits, queries through `podlapse <command> -o json`
//! as a user makes them, and a stop by SIGTERM, as an operator's, with a bound.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::poll::Poll;

/// How often a start looks whether the agent's API answers yet.
const START_POLL: Duration = Duration::from_millis(50);
/// How often a stop looks whether the agent has exited.
const STOP_POLL: Duration = Duration::from_millis(50);

/// Where an agent reads its manifests, keeps its state and serves.
pub struct AgentPlaces {
    pub node: String,
    pub manifests: PathBuf,
    pub socket: PathBuf,
    pub root_dir: PathBuf,
    pub logs_dir: PathBuf,
    pub metrics_addr: String,
}

/// A running agent.
pub struct AgentProcess {
    child: Option<Child>,
    bin: PathBuf,
    socket: PathBuf,
}

impl AgentProcess {
    /// `podlapse run` with `places`' flags; the caller adds its own flags, stdio and
    /// environment.
    pub fn command(bin: &Path, places: &AgentPlaces) -> Command {
        let mut cmd = Command::new(bin);
        cmd.args(["run", "--manifests"])
            .arg(&places.manifests)
            .args(["--node-name", &places.node])
            .arg("--api-socket")
            .arg(&places.socket)
            .args(["--metrics-addr", &places.metrics_addr])
            .arg("--root-dir")
            .arg(&places.root_dir)
            .arg("--pod-logs-dir")
            .arg(&places.logs_dir);
        cmd
    }

    /// Spawns `cmd` (made by [`AgentProcess::command`] for an agent serving on `socket`)
    /// and waits until its API answers `podlapse pods`. Before that it loads its probes
    /// and syncs with the runtime, seconds on a quiet host and minutes in an emulated
    /// guest on a busy machine, so no guess of speed bounds the wait: it ends when the
    /// API answers, or fails at once when the agent exits. `hung` only keeps a hung agent
    /// from hanging its caller.
    pub fn start(
        mut cmd: Command,
        bin: &Path,
        socket: &Path,
        hung: Duration,
    ) -> anyhow::Result<AgentProcess> {
        let child = cmd.spawn().context("starting podlapse run")?;
        let mut agent = AgentProcess {
            child: Some(child),
            bin: bin.to_path_buf(),
            socket: socket.to_path_buf(),
        };
        let poll = Poll::new(
            format!("the agent's API on {}", socket.display()),
            hung,
            START_POLL,
        );
        poll.until(|| {
            if let Some(status) = agent.exited()? {
                bail!(
                    "the agent exited ({status}) before its API answered on {}",
                    socket.display()
                );
            }
            // The socket appears a moment after the agent starts: errors mean "not yet".
            Ok((agent.socket.exists() && agent.query("pods").is_ok()).then_some(()))
        })?;
        Ok(agent)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Whether the agent has exited, and how.
    pub fn exited(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(child) => Ok(child.try_wait()?),
            None => bail!("the agent was already stopped"),
        }
    }

    /// `podlapse <command> -o json` against this agent's API, parsed.
    pub fn query(&self, command: &str) -> anyhow::Result<Value> {
        let out = Command::new(&self.bin)
            .args([command, "-o", "json", "--api-socket"])
            .arg(&self.socket)
            .output()
            .with_context(|| format!("running podlapse {command}"))?;
        if !out.status.success() {
            bail!(
                "podlapse {command} exited {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        serde_json::from_slice(&out.stdout).with_context(|| format!("parsing podlapse {command}"))
    }

    /// SIGTERM, then waits for the agent to exit (it finishes its trace first); kills it
    /// if it has not exited `within` that.
    pub fn stop(&mut self, within: Duration) -> anyhow::Result<ExitStatus> {
        let Some(mut child) = self.child.take() else {
            bail!("the agent was already stopped");
        };
        // SAFETY: kill(2) only sends a signal to our own child.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let exit = Poll::new("the agent to exit", within, STOP_POLL);
        if let Some(status) = exit.within(|| child.try_wait())? {
            return Ok(status);
        }
        let _ = child.kill();
        let _ = child.wait();
        bail!("the agent did not exit within {within:?} of SIGTERM; killed it")
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.stop(Duration::from_secs(30));
        }
    }
}
