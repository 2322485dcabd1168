//! The podlapse agent as the benchmarks run it: `podlapse run --manifests DIR` on the node
//! lab (the harness the integration tests use, `xtask::agent_process`), with room for a
//! thousand pods, watched through its local API and stopped with SIGTERM as an operator
//! would.

use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;
use xtask::agent_process::{AgentPlaces, AgentProcess};
use xtask::lab::LabPaths;
use xtask::poll::Poll;

/// How often a wait polls the agent's API. Polling is how an outside observer sees the
/// agent; the figures come from the agent's own timestamps, not from this period.
const POLL: Duration = Duration::from_millis(250);
/// How long the agent may take to load its probes and answer, and to exit on SIGTERM.
const START: Duration = Duration::from_secs(30);
const STOP: Duration = Duration::from_secs(30);

/// The `--max-pods` podlapse runs with in the benchmarks: above any batch of theirs.
pub const MAX_PODS: usize = 1000;

/// `podlapse run`'s flags for a node with room for [`MAX_PODS`] pods and more CPU and memory
/// than they ask for.
pub fn roomy_node(cmd: &mut Command) -> &mut Command {
    cmd.args(["--node-cpu", "1000000", "--node-memory"])
        .arg((1_u64 << 40).to_string())
        .args(["--max-pods", &MAX_PODS.to_string()])
}

pub struct Agent {
    process: AgentProcess,
    pub manifests: std::path::PathBuf,
}

impl Agent {
    /// Starts the agent in `work` (manifests in `work/manifests`, its log in
    /// `work/agent.log`) with `extra` flags, and waits until its API answers.
    pub fn start(bin: &Path, work: &Path, node: &str, extra: &[String]) -> anyhow::Result<Agent> {
        Agent::start_in(
            bin,
            work,
            node,
            extra,
            &LabPaths::from_env().cri_socket(),
            None,
        )
    }

    /// [`Agent::start`] on the runtime at `cri`, the agent's process born in the cgroup
    /// whose `cgroup.procs` is `cgroup` (every thread and child it has charged there),
    /// where one is given.
    pub fn start_in(
        bin: &Path,
        work: &Path,
        node: &str,
        extra: &[String],
        cri: &Path,
        cgroup: Option<std::path::PathBuf>,
    ) -> anyhow::Result<Agent> {
        let _ = std::fs::remove_dir_all(work);
        let places = AgentPlaces {
            node: node.to_string(),
            manifests: work.join("manifests"),
            socket: work.join("api.sock"),
            root_dir: work.join("root"),
            logs_dir: work.join("logs"),
            metrics_addr: "127.0.0.1:0".to_string(),
        };
        std::fs::create_dir_all(&places.manifests)
            .with_context(|| format!("creating {}", places.manifests.display()))?;
        let log = std::fs::File::create(work.join("agent.log"))?;
        let mut cmd = AgentProcess::command(bin, &places);
        if let Some(procs) = cgroup {
            super::accounting::join_in_child(&mut cmd, procs);
        }
        roomy_node(cmd.arg("--cri").arg(cri))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let process = AgentProcess::start(cmd, bin, &places.socket, START)?;
        let mut agent = Agent {
            process,
            manifests: places.manifests,
        };
        // A node name used before may have pods of an earlier run to clean up first.
        agent.wait_for("the agent with no pods", START, |a| {
            a.phases().map(|p| p.is_empty())
        })?;
        Ok(agent)
    }

    /// The agent's exit status, once it has exited.
    pub fn exited(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        self.process.exited()
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// `podlapse <command> -o json` against this agent's API, parsed.
    pub fn query(&self, command: &str) -> anyhow::Result<Value> {
        self.process.query(command)
    }

    /// Phases of the agent's pods, from `podlapse pods -o json`.
    pub fn phases(&self) -> anyhow::Result<Vec<String>> {
        let list = self.query("pods")?;
        let Some(pods) = list["items"].as_array() else {
            bail!("podlapse pods -o json printed no List of Pods");
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
            if let Some(status) = self.process.exited()? {
                bail!("the agent exited ({status}) while waiting for {what}");
            }
            // A query that fails (the agent busy, say) means "not yet".
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
        self.process.stop(STOP)
    }
}
