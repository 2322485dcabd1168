//! The modern-node suite beside the host's own checks. Under software emulation the guest
//! takes about 1.2 of this machine's two cores for most of `cargo xtask test`, and the
//! host's lints, unit tests and lab suite fit in what is left. So `cargo xtask test`
//! prepares the suite first (every build done, the stage written), then runs it in a
//! child (`xtask node-vm run-prepared`) whose output goes to a log file, and prints that
//! log, from its start and as it grows, once the host's work is done. The child builds
//! nothing: it never waits on cargo's lock while the host's checks build.

use std::fs::File;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::NodeVmPaths;
use super::suite::{Suite, results_dir};
use crate::workspace;

/// How often the log is read again while the suite runs (as `tail -f` does): what it
/// costs is one read of a file, and the output is at most this late.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

pub struct Background {
    child: Child,
    log: PathBuf,
    started: Instant,
}

impl Background {
    /// Starts the prepared suite in the guest; the host lab must be up.
    pub fn start(suite: &Suite) -> anyhow::Result<Background> {
        let dir = workspace::target_dir().join("node-vm");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let suite_file = dir.join("suite.json");
        suite.save(&suite_file)?;
        let log = dir.join("suite.log");
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let exe = std::env::current_exe().context("finding xtask's own executable")?;
        let child = Command::new(exe)
            .args(["node-vm", "run-prepared", "--suite"])
            .arg(&suite_file)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting the modern-node suite (xtask node-vm run-prepared)")?;
        eprintln!(
            "the modern-node suite runs in the QEMU guest beside the host's checks; its output \
             follows when they are done, and is in {}",
            log.display()
        );
        Ok(Background {
            child,
            log,
            started: Instant::now(),
        })
    }

    /// Prints the suite's output from its start, as it comes, until the suite ends; how
    /// long it ran, and whether it passed.
    pub fn follow(mut self) -> anyhow::Result<(Duration, anyhow::Result<()>)> {
        let mut log = File::open(&self.log)
            .with_context(|| format!("reading the suite's log {}", self.log.display()))?;
        let status = loop {
            let ended = self.child.try_wait()?;
            copy_new(&mut log)?;
            if let Some(status) = ended {
                // Everything it wrote before it ended was read after it ended.
                break status;
            }
            std::thread::sleep(FOLLOW_EVERY);
        };
        Ok((self.started.elapsed(), verdict(status)))
    }

    /// Stops the suite when the host's checks failed: the child first, then the guest it
    /// booted (whose ssh sessions end with it); prints what the suite had said.
    pub fn cancel(mut self, paths: &NodeVmPaths) -> anyhow::Result<()> {
        eprintln!("the host's checks failed: stopping the modern-node suite; what it said:");
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Ok(mut log) = File::open(&self.log) {
            copy_new(&mut log)?;
        }
        super::down(paths, false)
    }
}

/// Writes what `log` holds past its read position to stderr, where the rest of the
/// test's output goes.
fn copy_new(log: &mut File) -> anyhow::Result<()> {
    let mut buf = Vec::new();
    log.read_to_end(&mut buf)?;
    if !buf.is_empty() {
        let mut err = std::io::stderr().lock();
        err.write_all(&buf)?;
        err.flush()?;
    }
    // read_to_end leaves the position at the end: a later call goes on from there.
    Ok(())
}

fn verdict(status: ExitStatus) -> anyhow::Result<()> {
    if status.success() {
        return Ok(());
    }
    bail!(
        "the modern-node suite failed ({status}); its output is above, the guest's logs in {}",
        results_dir().display()
    )
}
