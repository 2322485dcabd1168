use std::path::PathBuf;

/// What went wrong managing pod cgroups, with the cgroup directory or file involved.
#[derive(Debug, thiserror::Error)]
pub enum CmError {
    /// mountinfo lists neither a cgroup v1 hierarchy with a controller nor a v2 mount.
    #[error("no cgroup hierarchy is mounted (read {})", mountinfo.display())]
    NoCgroupMounts { mountinfo: PathBuf },

    /// The cgroup root given to the manager is not an absolute, plain cgroup path.
    #[error("cgroup root {root:?} must be absolute with no empty, `.` or `..` parts")]
    InvalidCgroupRoot { root: String },

    /// A pod UID that cannot name a directory (`pod<uid>`) safely.
    #[error("pod UID {uid:?} cannot name a pod cgroup")]
    InvalidPodUid { uid: String },

    /// The pod has no `metadata.uid`, so its cgroup has no name.
    #[error("pod {pod} has no UID")]
    MissingPodUid { pod: String },

    /// Reading a cgroup file or directory failed.
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Creating a cgroup directory failed.
    #[error("creating cgroup {}: {source}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The kernel refused a value written to a cgroup file.
    #[error("writing {value:?} to {}: {source}", path.display())]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },

    /// Processes of the pod cgroup survived SIGKILL (a frozen cgroup, a process in
    /// uninterruptible sleep), so the cgroup cannot be removed yet.
    #[error("cgroup {} still has live processes {pids:?}", path.display())]
    CgroupBusy { path: PathBuf, pids: Vec<i32> },

    /// Sending SIGKILL to a process of the pod cgroup failed for a reason other than
    /// the process being gone already.
    #[error("killing process {pid} in cgroup {}: {source}", path.display())]
    Kill {
        path: PathBuf,
        pid: i32,
        #[source]
        source: nix::Error,
    },

    /// Removing an empty cgroup directory failed.
    #[error("removing cgroup {}: {source}", path.display())]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// systemd (the systemd cgroup driver) refused or did not finish a unit operation.
    #[error("systemd: {action} {unit}: {message}")]
    Systemd {
        unit: String,
        action: &'static str,
        message: String,
    },

    /// The task removing a pod's cgroups ended before finishing (it panicked, or the
    /// agent is shutting down).
    #[error("removing the cgroups of pod {uid} was interrupted: {reason}")]
    Interrupted { uid: String, reason: String },
}
