//! `podlapse observe` in the background for a test, its API, and the kubelet-like CRI
//! client the observe tests drive pods with.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use crate::podlapse_bin;

/// Loading and verifying the probes on a loaded 2-core machine or an emulated guest: the
/// bound only keeps a hung observer from hanging the suite.
const OBSERVER_UP: Duration = Duration::from_secs(300);

/// How long a pod may take to show in the observer's API once its client reported it: a
/// bound for a hung observer only, long enough for the loaded emulated guest.
pub const API_SHOWS: Duration = Duration::from_secs(300);

/// The observer in the background, started and waited for on its own word.
pub struct Observer {
    child: Child,
    /// Its stderr lines after the start line.
    lines: mpsc::Receiver<String>,
    /// Its API socket, beside the trace.
    socket: PathBuf,
}

impl Observer {
    /// `podlapse observe` with `extra` flags, once it says it is observing. Its API is on
    /// a socket of its own beside the trace.
    pub fn start(trace: &Path, probes: &Path, cri: &str, extra: &[&str]) -> Observer {
        let socket = trace.with_extension("sock");
        let mut child = Command::new(podlapse_bin())
            .args(["observe", "--cri", cri, "--trace"])
            .arg(trace)
            .arg("--api-socket")
            .arg(&socket)
            .args(extra)
            .arg("--probes")
            .arg(probes)
            .arg("--require-ebpf")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("podlapse observe starts");
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
                Ok(line) if line.contains("podlapse: observing ") => break,
                Ok(_) => continue,
                Err(e) => panic!("podlapse observe did not say it was observing: {e}"),
            }
        }
        Observer {
            child,
            lines,
            socket,
        }
    }

    /// `podlapse <args> --api-socket <its socket> -o json` against the running observer.
    pub fn api(&self, args: &[&str]) -> Value {
        let out = Command::new(podlapse_bin())
            .args(args)
            .arg("--api-socket")
            .arg(&self.socket)
            .args(["-o", "json"])
            .output()
            .expect("podlapse runs");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "podlapse {args:?} against the observer printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// Asks the observer's API (`podlapse <args>`) until `done` holds of the answer, then
    /// returns it; panics with the last answer after [`API_SHOWS`].
    pub fn wait_api(&self, args: &[&str], what: &str, done: impl Fn(&Value) -> bool) -> Value {
        // Between two asks, 200 ms: each builds every pod's timeline.
        super::eventually(
            &format!("the observer's API (podlapse {args:?}) to show {what}"),
            API_SHOWS,
            Duration::from_millis(200),
            || {
                let answer = self.api(args);
                if done(&answer) {
                    Ok(answer)
                } else {
                    Err(answer)
                }
            },
        )
    }

    /// SIGTERM, then the exit status and what it printed last.
    pub fn stop(mut self) -> (std::process::ExitStatus, Vec<String>) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().expect("the observer exits");
        (status, self.lines.try_iter().collect())
    }
}

/// An observer the test did not stop (it failed first) is killed: it would hold its
/// ports and watch the next test's pods.
impl Drop for Observer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `cri-pod-client run` in the background: its pods, one JSON line each as it reports
/// them, until it is told to tear them down.
pub struct ClientRun {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl ClientRun {
    /// `cri-pod-client --cri <cri> run <args>`; `built` as for [`cri_pod_client`].
    pub fn spawn(built: &str, cri: &str, args: &[&str]) -> ClientRun {
        let mut child = Command::new(cri_pod_client(built))
            .arg("--cri")
            .arg(cri)
            .arg("run")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("cri-pod-client starts");
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        ClientRun { child, lines }
    }

    /// The first `n` pods it reports, as it reports them (each once its containers run or
    /// it gave up on it). The bound is for a hung client only.
    pub fn pods(&self, n: usize) -> Vec<Value> {
        (0..n)
            .map(|_| {
                let line = self
                    .lines
                    .recv_timeout(API_SHOWS)
                    .unwrap_or_else(|e| panic!("cri-pod-client reported no pod: {e}"));
                serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("cri-pod-client printed {line:?}: {e}"))
            })
            .collect()
    }

    /// SIGKILL, for a client retrying a pod that will never start (it tears nothing
    /// down: `cri-pod-client cleanup` does).
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM (it tears its pods down), then its exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().expect("cri-pod-client exits")
    }
}

/// `cri-pod-client` (tests/bin): staged beside the tests in the modern node's guest, else
/// `built`, where cargo built it for the calling test
/// (`env!("CARGO_BIN_EXE_cri-pod-client")`, which only a test target has).
pub fn cri_pod_client(built: &str) -> PathBuf {
    std::env::var_os("PODLAPSE_CRI_POD_CLIENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| built.into())
}

/// Removes what `cri-pod-client` left of the pods whose names start with `prefix`
/// (`cri-pod-client cleanup`); `built` as for [`cri_pod_client`].
pub fn cleanup_client_pods(built: &str, cri: &str, prefix: &str) {
    let out = Command::new(cri_pod_client(built))
        .args(["--cri", cri, "cleanup", "--prefix", prefix])
        .output()
        .expect("cri-pod-client cleanup runs");
    assert!(out.status.success(), "{}", crate::stderr(&out));
}

/// A client the test did not stop is killed (its pods are `ClientPodsCleanup`'s).
impl Drop for ClientRun {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Removes the client's pods when dropped, the test passed or not: a test that fails
/// while its client's pods run leaves none to the next.
pub struct ClientPodsCleanup {
    built: String,
    cri: String,
    prefix: String,
}

impl ClientPodsCleanup {
    pub fn new(built: &str, cri: &str, prefix: &str) -> ClientPodsCleanup {
        ClientPodsCleanup {
            built: built.into(),
            cri: cri.into(),
            prefix: prefix.into(),
        }
    }
}

impl Drop for ClientPodsCleanup {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // No assertion while unwinding: say what failed, and go on.
            if let Err(e) = Command::new(cri_pod_client(&self.built))
                .args(["--cri", &self.cri, "cleanup", "--prefix", &self.prefix])
                .output()
            {
                eprintln!("cri-pod-client cleanup --prefix {}: {e}", self.prefix);
            }
        } else {
            cleanup_client_pods(&self.built, &self.cri, &self.prefix);
        }
    }
}
