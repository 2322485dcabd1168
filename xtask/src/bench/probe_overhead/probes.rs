//! `podlapse kernel-events` as benchmarks 4 and 13 run it: a child started and waited on
//! until its probes are attached, paused or stopped, and its last line read as the
//! summary of what its programs did (events, losses, each program's run time and hits).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use serde::{Deserialize, Serialize};
use xtask::poll::Poll;

use super::{READY_LINE, READY_TIMEOUT, STOP_TIMEOUT};

/// One program's counters from kernel-events' summary.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub(super) struct ProgramRun {
    pub(super) program: String,
    pub(super) run_time_ns: u64,
    pub(super) run_count: u64,
}

impl ProgramRun {
    pub(super) fn ns_per_hit(&self) -> Option<f64> {
        (self.run_count > 0).then(|| self.run_time_ns as f64 / self.run_count as f64)
    }
}

/// The last line `podlapse kernel-events --json` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Summary {
    pub(super) kind: String,
    pub(super) ebpf: bool,
    pub(super) events: u64,
    pub(super) undecodable: u64,
    pub(super) lost: u64,
    #[serde(default)]
    pub(super) lost_by_kind: BTreeMap<String, u64>,
    #[serde(default)]
    pub(super) programs: Vec<ProgramRun>,
    /// Which hooks the namespace programs took on this kernel (`fentry`, `kprobe`,
    /// `tracepoint`), as kernel-events says.
    #[serde(default)]
    pub(super) netns_hooks: Option<String>,
    /// The CNI output capture's hook and why, or why it is off.
    #[serde(default)]
    pub(super) cni_output: Option<serde_json::Value>,
}

pub(super) fn parse_summary(stdout: &str) -> anyhow::Result<Summary> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or_else(|| anyhow!("podlapse kernel-events printed nothing on stdout"))?;
    let summary: Summary = serde_json::from_str(line)
        .with_context(|| format!("podlapse kernel-events' last line is not its summary: {line}"))?;
    if summary.kind != "summary" {
        bail!(
            "podlapse kernel-events' last line is a {:?}, not the summary: {line}",
            summary.kind
        );
    }
    if !summary.ebpf {
        bail!("podlapse kernel-events ran without its probes: {line}");
    }
    Ok(summary)
}

/// The program with the highest run time per hit, among those that ran.
pub(super) fn worst_per_hit(programs: &[ProgramRun]) -> Option<(&str, f64)> {
    programs
        .iter()
        .filter_map(|p| p.ns_per_hit().map(|ns| (p.program.as_str(), ns)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// A program's hits and run time per hit, with its run time per hit when no reader was
/// woken (the reader paused) in parentheses.
pub(super) fn program_row(p: &ProgramRun, paused: Option<&ProgramRun>) -> String {
    let Some(ns) = p.ns_per_hit() else {
        return "0, -".to_string();
    };
    match paused.and_then(ProgramRun::ns_per_hit) {
        Some(quiet) => format!("{}, {ns:.0} ns ({quiet:.0} ns)", p.run_count),
        None => format!("{}, {ns:.0} ns", p.run_count),
    }
}

/// `podlapse kernel-events --summary-only --json`: the probes attached and their ring
/// buffer drained while it runs.
pub(super) struct Probes {
    child: Child,
    stdout: Option<JoinHandle<std::io::Result<String>>>,
    stderr: mpsc::Receiver<String>,
    log: PathBuf,
}

impl Probes {
    pub(super) fn start(bin: &Path, log: PathBuf, extra: &[&str]) -> anyhow::Result<Probes> {
        let mut child = Command::new(bin)
            .args([
                "kernel-events",
                "--summary-only",
                "--json",
                "--require-ebpf",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {} kernel-events", bin.display()))?;
        let mut out = child.stdout.take().context("kernel-events' stdout")?;
        let err = child.stderr.take().context("kernel-events' stderr")?;
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            out.read_to_string(&mut s).map(|_| s)
        });
        let mut probes = Probes {
            child,
            stdout: Some(stdout),
            stderr: super::super::lines_of(err),
            log,
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut said = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match probes.stderr.recv_timeout(left) {
                Ok(line) => {
                    let ready = line.starts_with(READY_LINE);
                    said.push(line);
                    if ready {
                        break;
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = probes.child.wait()?;
                    bail!(
                        "podlapse kernel-events exited ({status}) before its probes were \
                         attached: {}",
                        said.join(" / ")
                    );
                }
                Err(mpsc::RecvTimeoutError::Timeout) => bail!(
                    "podlapse kernel-events did not attach its probes within {} s: {}",
                    READY_TIMEOUT.as_secs(),
                    said.join(" / ")
                ),
            }
        }
        std::fs::write(&probes.log, said.join("\n") + "\n")
            .with_context(|| format!("writing {}", probes.log.display()))?;
        Ok(probes)
    }

    /// CPU time the process's threads have used so far, in ns (each thread's
    /// /proc/<pid>/task/<tid>/schedstat; threads that already ended are not counted).
    pub(super) fn cpu_ns(&self) -> u64 {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.child.id())) else {
            return 0;
        };
        tasks
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }

    pub(super) fn signal(&self, signal: libc::c_int) {
        // SAFETY: signals our own child, which has not been waited for yet.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, signal);
        }
    }

    /// Stops the process, so nothing reads the ring buffer: the probes still run, and
    /// with no reader waiting they never wake one.
    pub(super) fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGTERM, as an operator stops it; returns its summary and what it said meanwhile
    /// (loss reports).
    pub(super) fn stop(mut self) -> anyhow::Result<(Summary, Vec<String>)> {
        self.signal(libc::SIGCONT);
        self.signal(libc::SIGTERM);
        let exit = Poll::new(
            "podlapse kernel-events to stop",
            STOP_TIMEOUT,
            Duration::from_millis(20),
        );
        let Some(status) = exit.within(|| self.child.try_wait())? else {
            bail!(
                "podlapse kernel-events did not stop within {} s of SIGTERM",
                STOP_TIMEOUT.as_secs()
            );
        };
        let stdout = self
            .stdout
            .take()
            .map(|h| h.join())
            .transpose()
            .map_err(|_| anyhow!("the kernel-events stdout reader panicked"))?
            .transpose()
            .context("reading podlapse kernel-events' stdout")?
            .unwrap_or_default();
        let said: Vec<String> = self.stderr.try_iter().collect();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .and_then(|mut log| {
                std::io::Write::write_all(&mut log, (said.join("\n") + "\n").as_bytes())
            })
            .with_context(|| format!("appending to {}", self.log.display()))?;
        if !status.success() {
            bail!(
                "podlapse kernel-events exited {status}: {}",
                said.join(" / ")
            );
        }
        Ok((parse_summary(&stdout)?, said))
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_line_is_parsed_with_its_programs() {
        let out = "{\"kind\":\"exec\"}\n{\"ebpf\":true,\"events\":12,\"kind\":\"summary\",\
                   \"lost\":3,\"lost_by_kind\":{\"exec\":3},\"undecodable\":0,\"programs\":[\
                   {\"program\":\"sched_process_exec\",\"run_time_ns\":4000,\"run_count\":8},\
                   {\"program\":\"sys_enter_setns\",\"run_time_ns\":0,\"run_count\":0}]}\n\n";
        let s = parse_summary(out).unwrap();
        assert_eq!((s.events, s.lost, s.undecodable), (12, 3, 0));
        assert_eq!(s.lost_by_kind.get("exec"), Some(&3));
        assert_eq!(s.programs.len(), 2);
        assert_eq!(s.programs[0].ns_per_hit(), Some(500.0));
        assert_eq!(s.programs[1].ns_per_hit(), None);
    }

    #[test]
    fn a_summary_without_probes_or_a_summary_line_is_an_error() {
        let off = "{\"ebpf\":false,\"events\":0,\"kind\":\"summary\",\"lost\":0,\
                   \"lost_by_kind\":{},\"undecodable\":0}";
        let e = parse_summary(off).unwrap_err().to_string();
        assert!(e.contains("without its probes"), "{e}");
        let e = parse_summary("").unwrap_err().to_string();
        assert!(e.contains("printed nothing"), "{e}");
        let e = parse_summary(
            "{\"kind\":\"exec\",\"ebpf\":true,\"events\":0,\"undecodable\":0,\"lost\":0}",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("not the summary"), "{e}");
        let e = parse_summary("events: 3, lost events: 0")
            .unwrap_err()
            .to_string();
        assert!(e.contains("events: 3"), "{e}");
    }
}
