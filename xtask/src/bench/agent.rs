//! The podtrace agent as the benchmarks run it: `podtrace run --manifests DIR` on the node
//! lab, watched through its local API and stopped with SIGTERM as an operator would.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;
use xtask::lab::LabPaths;
use xtask::poll::Poll;

use crate::workspace;

/// How often a wait polls the agent's API. Polling is how an outside observer sees the
/// agent; the figures come from the agent's own timestamps, not from this period.
const POLL: Duration = Duration::from_millis(250);
/// How often [`Agent::stop`] looks whether the agent has exited.
const STOP_POLL: Duration = Duration::from_millis(50);

pub struct Agent {
    child: Option<Child>,
    bin: PathBuf,
    socket: PathBuf,
    pub manifests: PathBuf,
}

impl Agent {
    /// Starts the agent in `work` (manifests in `work/manifests`, its log in
    /// `work/agent.log`) with `extra` flags, and waits until its API answers.
    pub fn start(bin: &Path, work: &Path, node: &str, extra: &[String]) -> anyhow::Result<Agent> {
        let _ = std::fs::remove_dir_all(work);
        let manifests = work.join("manifests");
        std::fs::create_dir_all(&manifests)
            .with_context(|| format!("creating {}", manifests.display()))?;
        let socket = work.join("api.sock");
        let log = std::fs::File::create(work.join("agent.log"))?;
        let child = Command::new(bin)
            .arg("run")
            .arg("--manifests")
            .arg(&manifests)
            .args(["--metrics-addr", "127.0.0.1:0", "--node-name", node])
            .arg("--api-socket")
            .arg(&socket)
            .arg("--root-dir")
            .arg(work.join("root"))
            .arg("--pod-logs-dir")
            .arg(work.join("logs"))
            .arg("--cri")
            .arg(LabPaths::from_env().cri_socket())
            .args(["--node-cpu", "1000000", "--node-memory"])
            .arg((1_u64 << 40).to_string())
            .args(["--max-pods", "1000"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting podtrace run")?;
        let mut agent = Agent {
            child: Some(child),
            bin: bin.to_path_buf(),
            socket,
            manifests,
        };
        agent.wait_for("the agent's API", Duration::from_secs(30), |a| {
            a.phases().map(|p| p.is_empty())
        })?;
        Ok(agent)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// `podtrace <command> -o json` against this agent's API, parsed.
    pub fn query(&self, command: &str) -> anyhow::Result<Value> {
        let out = workspace::output_of(
            Command::new(&self.bin)
                .args([command, "-o", "json", "--api-socket"])
                .arg(&self.socket),
            &format!("podtrace {command}"),
        )?;
        serde_json::from_slice(&out.stdout).with_context(|| format!("parsing podtrace {command}"))
    }

    /// Phases of the agent's pods, from `podtrace pods -o json`.
    pub fn phases(&self) -> anyhow::Result<Vec<String>> {
        let list = self.query("pods")?;
        let Some(pods) = list["items"].as_array() else {
            bail!("podtrace pods -o json printed no List of Pods");
        };
        Ok(pods
            .iter()
            .map(|p| p["status"]["phase"].as_str().unwrap_or("").to_string())
            .collect())
    }

    /// Polls `done` until it holds; fails if the agent exits or `timeout` passes.
    pub fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&Agent) -> anyhow::Result<bool>,
    ) -> anyhow::Result<Duration> {
        let poll = Poll::new(what, timeout, POLL);
        poll.until(|| {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("the agent exited ({status}) while waiting for {what}");
            }
            // The API socket appears a moment after the agent starts: errors mean "not yet".
            Ok(done(self).unwrap_or(false).then(|| poll.elapsed()))
        })
    }

    /// Removes every manifest and waits until the agent has cleaned up all its pods.
    pub fn remove_all(&mut self, timeout: Duration) -> anyhow::Result<Duration> {
        for entry in std::fs::read_dir(&self.manifests)? {
            std::fs::remove_file(entry?.path())?;
        }
        self.wait_for("the pods' removal", timeout, |a| Ok(a.phases()?.is_empty()))
    }

    /// SIGTERM, then waits for the agent to exit (it finishes its trace first).
    pub fn stop(&mut self) -> anyhow::Result<ExitStatus> {
        let Some(mut child) = self.child.take() else {
            bail!("the agent was already stopped");
        };
        // SAFETY: kill only sends a signal to our own child.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let exit = Poll::new("the agent to exit", Duration::from_secs(30), STOP_POLL);
        if let Some(status) = exit.within(|| child.try_wait())? {
            return Ok(status);
        }
        let _ = child.kill();
        let _ = child.wait();
        bail!("the agent did not exit within 30 s of SIGTERM; killed it")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.stop();
        }
    }
}
