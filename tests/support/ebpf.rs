//! Helpers for the kernel-event tests: a `podlapse kernel-events --json` watcher running
//! in the background, and the parsed events it printed.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;

use crate::{lab, podlapse_bin};

/// How long loading and verifying the probes may take on a loaded 2-core machine.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(120);

/// The probes object `cargo xtask build-ebpf` wrote beside the binary's target dir.
pub fn probes_object() -> PathBuf {
    std::env::var_os("PODLAPSE_PROBES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            podlapse_bin()
                .parent()
                .and_then(|p| p.parent())
                .expect("the binary is in <target>/<profile>")
                .join("bpf/podlapse-probes.o")
        })
}

/// Fails the test with a clear message when the probes were not built.
pub fn require_probes() -> PathBuf {
    let object = probes_object();
    assert!(
        object.exists(),
        "no eBPF probes at {}: run `cargo xtask build-ebpf` (cargo xtask test does)",
        object.display()
    );
    object
}

/// One test at a time loads the probes: a storm of execs from one test would otherwise
/// land in another's ring buffer and timeline.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// `podlapse kernel-events --json` in the background.
pub struct Watcher {
    child: Child,
    stdout: JoinHandle<String>,
    stderr: JoinHandle<String>,
}

/// What a watcher printed.
pub struct Watched {
    pub status: ExitStatus,
    /// Every event line, in order.
    pub events: Vec<Value>,
    /// The final `{"kind":"summary",...}` line.
    pub summary: Value,
    pub stderr: String,
}

impl Watcher {
    /// Starts the watcher and returns once the probes are attached.
    pub fn start(extra: &[&str]) -> Watcher {
        let object = require_probes();
        let mut child = Command::new(podlapse_bin())
            .args(["kernel-events", "--json", "--probes"])
            .arg(&object)
            .args(extra)
            .env("PODLAPSE_LAB_DIR", lab().root)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("running {}: {e}", podlapse_bin().display()));
        let mut out = child.stdout.take().expect("piped stdout");
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let err = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        let stderr = std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(line.clone());
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        let mut seen = String::new();
        loop {
            match rx.recv_timeout(ATTACH_TIMEOUT) {
                Ok(line) if line.contains("watching kernel events") => break,
                Ok(line) => {
                    seen.push_str(&line);
                    seen.push('\n');
                }
                Err(_) => {
                    let _ = child.kill();
                    panic!("the watcher did not attach its probes; stderr:\n{seen}");
                }
            }
        }
        Watcher {
            child,
            stdout,
            stderr,
        }
    }

    /// The perf-event file descriptors the watcher holds, as `/proc` shows them from
    /// outside: one per tracepoint or kprobe a program is attached to, so attaching or
    /// detaching one changes the count.
    pub fn perf_event_fds(&self) -> usize {
        let dir = format!("/proc/{}/fd", self.child.id());
        std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target.as_os_str() == "anon_inode:[perf_event]")
            .count()
    }

    /// Interrupts the watcher (as Ctrl-C would) and collects its output.
    pub fn stop(mut self) -> Watched {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits pid_t");
        // SAFETY: kill(2) on our own child's pid, which has not been reaped yet.
        let rc = unsafe { libc::kill(pid, libc::SIGINT) };
        assert_eq!(rc, 0, "SIGINT to the watcher");
        let status = self.child.wait().expect("waiting for the watcher");
        let stdout = self.stdout.join().expect("stdout reader");
        let stderr = self.stderr.join().expect("stderr reader");
        let mut events: Vec<Value> = stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {l}\nstderr:\n{stderr}"))
            })
            .collect();
        let summary = match events.pop() {
            Some(s) if s["kind"] == "summary" => s,
            other => panic!("the last line is not the summary: {other:?}\nstderr:\n{stderr}"),
        };
        Watched {
            status,
            events,
            summary,
            stderr,
        }
    }
}

impl Watched {
    pub fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.events.iter().filter(move |e| e["kind"] == kind)
    }
}
