//! `podtrace observe` in the background for a test, and the kubelet-like CRI client the
//! observe tests drive pods with.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::podtrace_bin;

/// Loading and verifying the probes on a loaded 2-core machine or an emulated guest: the
/// bound only keeps a hung observer from hanging the suite.
const OBSERVER_UP: Duration = Duration::from_secs(300);

/// The observer in the background, started and waited for on its own word.
pub struct Observer {
    child: Child,
    /// Its stderr lines after the start line.
    lines: mpsc::Receiver<String>,
}

impl Observer {
    /// `podtrace observe` with `extra` flags, once it says it is observing.
    pub fn start(trace: &Path, probes: &Path, cri: &str, extra: &[&str]) -> Observer {
        let mut child = Command::new(podtrace_bin())
            .args(["observe", "--cri", cri, "--trace"])
            .arg(trace)
            .args(extra)
            .arg("--probes")
            .arg(probes)
            .arg("--require-ebpf")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("podtrace observe starts");
        let (tx, lines) = mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("observer: {line}");
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        // Evidence it records: the line it prints once the probes and the runtime's view
        // are both up.
        loop {
            match lines.recv_timeout(OBSERVER_UP) {
                Ok(line) if line.contains("podtrace: observing ") => break,
                Ok(_) => continue,
                Err(e) => panic!("podtrace observe did not say it was observing: {e}"),
            }
        }
        Observer { child, lines }
    }

    /// SIGTERM, then the exit status and what it printed last.
    pub fn stop(mut self) -> (std::process::ExitStatus, Vec<String>) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().expect("the observer exits");
        (status, self.lines.try_iter().collect())
    }
}

/// `cri-pod-client` (tests/bin): staged beside the tests in the modern node's guest, else
/// `built`, where cargo built it for the calling test
/// (`env!("CARGO_BIN_EXE_cri-pod-client")`, which only a test target has).
pub fn cri_pod_client(built: &str) -> PathBuf {
    std::env::var_os("PODTRACE_CRI_POD_CLIENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| built.into())
}
