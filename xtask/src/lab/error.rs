//! The lab's error type. Every variant names the part of the lab it concerns ("registry",
//! "containerd", "image podlapse/app", ...) so a failed `up` says where it broke.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use super::state::DownReport;

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A program the lab needs is not installed.
    #[error("{part}: required program `{program}` not found (searched {searched})")]
    MissingProgram {
        part: String,
        program: String,
        searched: String,
    },

    /// The registry's TCP port is already taken by someone else.
    #[error("registry: port {addr} is already in use{}", holder_suffix(holder))]
    PortInUse {
        addr: String,
        holder: Option<String>,
        #[source]
        source: io::Error,
    },

    /// The CRI socket path already answers connections: some other server owns it.
    #[error("containerd: socket {} is already served by another process", path.display())]
    SocketInUse { path: PathBuf },

    /// A socket path is longer than a unix socket address can hold.
    #[error("{part}: socket path {} is {len} bytes, over the {max}-byte limit of unix sockets", path.display())]
    SocketPathTooLong {
        part: String,
        path: PathBuf,
        len: usize,
        max: usize,
    },

    /// Reading, writing or removing a file or directory failed.
    #[error("{part}: cannot {action} {}", path.display())]
    Io {
        part: String,
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// A value given to the lab (an environment variable, a file it reads) is not what it
    /// must be.
    #[error("{part}: {problem}")]
    BadInput { part: String, problem: String },

    /// The pinned runtime packages could not be downloaded or unpacked.
    #[error("containerd: cannot get the pinned containerd package")]
    RuntimePackages {
        #[source]
        source: crate::debs::DebError,
    },

    /// A helper program could not be started at all.
    #[error("{part}: cannot run `{command}`")]
    Spawn {
        part: String,
        command: String,
        #[source]
        source: io::Error,
    },

    /// A helper program ran but reported failure.
    #[error("{part}: `{command}` failed ({status}): {stderr}")]
    CommandFailed {
        part: String,
        command: String,
        status: String,
        stderr: String,
    },

    /// A helper program ran longer than it is ever expected to and was killed.
    #[error("{part}: `{command}` did not finish within {timeout:?}")]
    CommandTimedOut {
        part: String,
        command: String,
        timeout: Duration,
    },

    /// A daemon started but did not become ready in time.
    #[error("{part}: not ready after {waited:?}: {what}\nlast lines of {}:\n{log_tail}", log.display())]
    NotReady {
        part: String,
        what: String,
        waited: Duration,
        log: PathBuf,
        log_tail: String,
    },

    /// A daemon exited while the lab was waiting for it to become ready.
    #[error("{part}: exited during startup\nlast lines of {}:\n{log_tail}", log.display())]
    DaemonExited {
        part: String,
        log: PathBuf,
        log_tail: String,
    },

    /// The lab root holds files but none of the lab's markers: refusing to treat someone
    /// else's directory as the lab's and tear it down.
    #[error("lab: {} exists and is not a lab directory (no baseline/ or lab.json); refusing to use or remove it", path.display())]
    NotALabRoot { path: PathBuf },

    /// `lab.json` could not be written or read back as lab state.
    #[error("state: {} does not hold valid lab state", path.display())]
    State {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// Another `up` or `down` on the same lab could not be waited for.
    #[error("lock: cannot lock {}", path.display())]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// `up` failed, and undoing what it had started failed too.
    #[error("{cause}\nand undoing the partial start failed too: {cleanup}")]
    UpAndCleanupFailed {
        #[source]
        cause: Box<LabError>,
        cleanup: Box<LabError>,
    },

    /// `down` ran every step but could not remove some of what the lab left.
    #[error("down: could not remove everything:\n  {}", problems.join("\n  "))]
    TeardownIncomplete {
        problems: Vec<String>,
        report: Box<DownReport>,
    },
}

fn holder_suffix(holder: &Option<String>) -> String {
    match holder {
        Some(h) => format!(" by {h}"),
        None => String::new(),
    }
}

impl LabError {
    pub(crate) fn io(
        part: impl Into<String>,
        action: &'static str,
        path: impl Into<PathBuf>,
        source: io::Error,
    ) -> LabError {
        LabError::Io {
            part: part.into(),
            action,
            path: path.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_in_use_names_port_and_holder() {
        let e = LabError::PortInUse {
            addr: "127.0.0.1:5000".into(),
            holder: Some("pid 42 (python3 -m http.server 5000)".into()),
            source: io::Error::from(io::ErrorKind::AddrInUse),
        };
        let text = e.to_string();
        assert!(text.contains("127.0.0.1:5000"), "{text}");
        assert!(text.contains("pid 42"), "{text}");
    }
}
