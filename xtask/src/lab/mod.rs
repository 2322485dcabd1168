//! The node lab: a private containerd (CRI) with runc, CNI bridge networking and a local
//! registry holding busybox-based images, all under one root directory, so the agent has a
//! real node to drive and tests can bring one up and tear it down without residue.
//!
//! `up` records what the host looked like first (`<root>/baseline/`); `down` removes what
//! differs from that, then the root.

mod agent_image;
mod baseline;
mod containerd;
mod error;
mod images;
mod mounts;
mod network;
mod paths;
mod process;
mod program_image;
mod registry;
mod residue;
mod state;
mod teardown;

use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub use agent_image::{
    AGENT_IMAGE_BINARY, AgentImage, build_agent_image, image_epoch, push_agent_image,
    save_agent_image,
};
pub use containerd::PROGRAM_ENV as CONTAINERD_ENV;
pub use containerd::hosts_toml as registry_hosts_toml;
pub use containerd::{
    Runtime, ctr_program, program as containerd_program, version as containerd_version,
};
pub use error::LabError;
pub use network::conflist;
pub use paths::{DEFAULT_LAB_DIR, LAB_DIR_ENV, LabPaths};
pub(crate) use process::describe;
pub use process::{all_pids, cmdline, find_program, is_alive, signal};
pub use program_image::push_program_image;
pub use residue::{ResidueSnapshot, snapshot_residue};
pub use state::{DownReport, LabState, LabStatus, PartStatus, UpOutcome};

use baseline::Baseline;
use state::daemon_alive;

/// Sandbox image: busybox whose shell exits 0 on TERM/INT and otherwise sleeps.
pub const IMAGE_PAUSE: &str = "127.0.0.1:5000/podlapse/pause:3.10";
/// busybox with the common applets in `/bin`; default command `sleep 3600`.
pub const IMAGE_APP: &str = "127.0.0.1:5000/podlapse/app:1.0";
/// The app image plus a ~10 MiB incompressible layer.
pub const IMAGE_BIG10: &str = "127.0.0.1:5000/podlapse/big10:1.0";
/// The app image plus a ~50 MiB incompressible layer.
pub const IMAGE_BIG50: &str = "127.0.0.1:5000/podlapse/big50:1.0";
pub const POD_SUBNET: &str = "10.244.77.0/24";
pub const BRIDGE: &str = "ptlab0";
pub const CNI_NETWORK: &str = "podlapse-lab";
/// The lab network's CNI config file, in the lab's `cni/net.d` and in a node's CNI config
/// directory.
pub const CNI_CONFLIST: &str = "10-podlapse-lab.conflist";
pub const REGISTRY_ADDR: &str = "127.0.0.1:5000";
/// Where a runtime with tracing sends its spans on a lab node: a test's OTLP receiver
/// listens here. The modern node's containerd is configured for it; the host lab's
/// (Debian's 1.6 build) has no tracing plugin.
pub const RUNTIME_OTLP_ADDR: &str = "127.0.0.1:14317";

/// Programs `up` needs, checked before anything starts. CNI plugins are checked by path.
const REQUIRED_PROGRAMS: &[(&str, &str)] = &[
    ("containerd", "runc"),
    ("registry", registry::PROGRAM),
    ("network", "ip"),
    ("network", "iptables"),
    ("network", "iptables-save"),
    ("network", "iptables-restore"),
];
const CNI_PLUGINS: &[&str] = &["bridge", "host-local", "portmap", "loopback"];

/// True when `ip` is an IPv4 address inside `cidr`.
pub fn ip_in_subnet(ip: &str, cidr: &str) -> bool {
    let Some((net, bits)) = cidr.split_once('/') else {
        return false;
    };
    let (Ok(ip), Ok(net), Ok(bits)) = (
        ip.parse::<std::net::Ipv4Addr>(),
        net.parse::<std::net::Ipv4Addr>(),
        bits.parse::<u32>(),
    ) else {
        return false;
    };
    let mask = if bits == 0 {
        0
    } else {
        u32::MAX << (32 - bits)
    };
    u32::from(ip) & mask == u32::from(net) & mask
}

/// Variations of the lab for tests that need a node unlike the usual one.
#[derive(Debug, Clone, Default)]
pub struct LabOptions {
    /// CNI plugin configurations appended to the conflist's chain, after portmap (a
    /// plugin made to fail, for instance).
    pub extra_cni_plugins: Vec<serde_json::Value>,
    /// At most this many pod IPs: host-local's range ends after them, so a test can use
    /// the pool up. `None` leaves it the whole subnet.
    pub max_pod_ips: Option<u8>,
}

/// Starts the lab, or reports that it already runs. A stale lab (state file present but a
/// daemon gone) or leftovers of one are removed first. On any failure everything this call
/// started is torn down again before the error is returned.
pub fn up(paths: &LabPaths, progress: &dyn Fn(&str)) -> Result<UpOutcome, LabError> {
    up_with(paths, &LabOptions::default(), progress)
}

/// Starts the lab's containerd again after it died (a fault test SIGKILLs it), with the
/// same configuration and state, and records its new pid in `lab.json`. Fails if the lab
/// is not up, or its containerd still runs.
pub fn restart_containerd(paths: &LabPaths) -> Result<u32, LabError> {
    let _lock = LabLock::acquire(paths)?;
    let path = paths.state_file();
    let Some(mut state) = LabState::read(paths)? else {
        return Err(LabError::io(
            "containerd",
            "read",
            &path,
            io::Error::new(io::ErrorKind::NotFound, "the lab is not up"),
        ));
    };
    if daemon_alive(
        state.containerd_pid,
        &paths.containerd_config().to_string_lossy(),
    ) {
        return Err(LabError::SocketInUse {
            path: paths.cri_socket(),
        });
    }
    let pid = containerd::start(paths, &|_| {})?;
    state.containerd_pid = pid;
    state.write(paths)?;
    Ok(pid)
}

/// [`up`] with `options`. A lab that already runs is left as it is, options or not.
pub fn up_with(
    paths: &LabPaths,
    options: &LabOptions,
    progress: &dyn Fn(&str),
) -> Result<UpOutcome, LabError> {
    let _lock = LabLock::acquire(paths)?;
    check_root(paths)?;
    match LabState::read(paths) {
        Ok(Some(state)) if state.is_running() => return Ok(UpOutcome::AlreadyUp(state)),
        Ok(Some(_)) | Err(_) => {
            progress("a previous lab is no longer running; removing it first");
            teardown::down_locked(paths, progress)?;
        }
        Ok(None) if has_leftovers(paths) => {
            progress("found leftovers of an earlier lab; removing them first");
            teardown::down_locked(paths, progress)?;
        }
        Ok(None) => {}
    }

    preflight(paths, progress)?;
    let started = Instant::now();
    match start(paths, options, progress) {
        Ok(state) => {
            progress(&format!(
                "lab up in {:.1} s",
                started.elapsed().as_secs_f64()
            ));
            Ok(UpOutcome::Started(state))
        }
        Err(cause) => {
            progress(&format!("up failed ({cause}); removing what it started"));
            match teardown::down_locked(paths, &|_| {}) {
                Ok(_) => Err(cause),
                Err(cleanup) => Err(LabError::UpAndCleanupFailed {
                    cause: Box::new(cause),
                    cleanup: Box::new(cleanup),
                }),
            }
        }
    }
}

/// Stops everything the lab runs and removes everything it made, the root included. Safe to
/// run when nothing is up.
pub fn down(paths: &LabPaths, progress: &dyn Fn(&str)) -> Result<DownReport, LabError> {
    let _lock = LabLock::acquire(paths)?;
    check_root(paths)?;
    teardown::down_locked(paths, progress)
}

/// What runs and where its files are. Looks at the processes themselves, so it also shows
/// a lab whose state file is gone.
pub fn status(paths: &LabPaths) -> Result<LabStatus, LabError> {
    let state = LabState::read(paths)?;
    let containerd_config = paths.containerd_config();
    let registry_config = paths.registry_config();
    let find = |recorded: Option<u32>, config: &Path| -> Option<u32> {
        let config = config.to_string_lossy();
        recorded
            .filter(|&p| daemon_alive(p, &config))
            .or_else(|| find_daemon(&config))
    };

    let registry_pid = find(state.as_ref().map(|s| s.registry_pid), &registry_config);
    let registry_answers = registry_pid.is_some()
        && registry::http_status(REGISTRY_ADDR, "/v2/").is_ok_and(|c| c == 200);
    let registry = PartStatus {
        name: "registry",
        running: registry_pid.is_some(),
        pid: registry_pid,
        details: vec![
            (
                "address",
                format!("http://{REGISTRY_ADDR} ({})", answers(registry_answers)),
            ),
            ("config", registry_config.display().to_string()),
            ("storage", paths.registry_storage().display().to_string()),
            ("log", paths.registry_log().display().to_string()),
        ],
    };

    let containerd_pid = find(state.as_ref().map(|s| s.containerd_pid), &containerd_config);
    let cri_answers = containerd_pid.is_some() && containerd::responsive(paths);
    let shims = process::all_pids()
        .into_iter()
        .filter(|&p| {
            process::proc_stat(p).is_some_and(|s| s.comm.starts_with("containerd-shim"))
                && paths.mentions_root(&process::cmdline(p))
        })
        .count();
    let containerd = PartStatus {
        name: "containerd",
        running: containerd_pid.is_some(),
        pid: containerd_pid,
        details: vec![
            (
                "socket",
                format!(
                    "{} ({})",
                    paths.cri_socket().display(),
                    answers(cri_answers)
                ),
            ),
            ("shims", shims.to_string()),
            ("config", containerd_config.display().to_string()),
            ("log", paths.containerd_log().display().to_string()),
        ],
    };

    let conflist = paths.cni_conflist();
    let bridge_up = network::link_names(&[]).iter().any(|l| l == BRIDGE);
    let reservations = network::ipam_reservations(paths).len();
    let cni = PartStatus {
        name: "cni",
        running: conflist.exists(),
        pid: None,
        details: vec![
            ("conflist", conflist.display().to_string()),
            ("network", format!("{CNI_NETWORK} {POD_SUBNET}")),
            (
                "bridge",
                format!(
                    "{BRIDGE} ({})",
                    if bridge_up {
                        "present"
                    } else {
                        "not created yet"
                    }
                ),
            ),
            ("pod IPs held", reservations.to_string()),
        ],
    };

    Ok(LabStatus {
        root: paths.root.clone(),
        state,
        parts: vec![registry, containerd, cni],
    })
}

fn answers(yes: bool) -> &'static str {
    if yes { "answering" } else { "not answering" }
}

/// A running daemon whose command line names `config`.
fn find_daemon(config: &str) -> Option<u32> {
    process::all_pids()
        .into_iter()
        .find(|&p| process::is_alive(p) && process::cmdline(p).contains(config))
}

/// `down` unmounts and deletes everything below the root, so a root that was set to some
/// existing directory by mistake must be refused. A lab root is absent, empty, or carries
/// the baseline or state file that `up` writes first.
fn check_root(paths: &LabPaths) -> Result<(), LabError> {
    let Ok(mut entries) = fs::read_dir(&paths.root) else {
        return Ok(());
    };
    let is_lab = paths.baseline_dir().is_dir() || paths.state_file().is_file();
    if is_lab || entries.next().is_none() {
        Ok(())
    } else {
        Err(LabError::NotALabRoot {
            path: paths.root.clone(),
        })
    }
}

/// Anything an earlier lab may have left: its root, its bridge, or its processes.
fn has_leftovers(paths: &LabPaths) -> bool {
    paths.root.exists()
        || network::link_names(&[]).iter().any(|l| l == BRIDGE)
        || process::all_pids().into_iter().any(|p| {
            process::proc_stat(p).is_some_and(|s| {
                s.comm == containerd::PROGRAM
                    || s.comm == registry::PROGRAM
                    || s.comm.starts_with("containerd-shim")
            }) && paths.mentions_root(&process::cmdline(p))
        })
}

/// Checks everything that can be checked before starting anything, so a doomed `up` leaves
/// no trace at all.
fn preflight(paths: &LabPaths, progress: &dyn Fn(&str)) -> Result<(), LabError> {
    containerd::preflight(progress)?;
    for (part, program) in REQUIRED_PROGRAMS {
        process::require_program(part, program)?;
    }
    for program in images::required_programs() {
        process::require_program("images", program)?;
    }
    for plugin in CNI_PLUGINS {
        let path = PathBuf::from(containerd::CNI_BIN_DIR).join(plugin);
        process::require_program("cni", &path.to_string_lossy())?;
    }
    registry::check_port_free()?;
    containerd::check_socket_free(paths)?;
    Ok(())
}

fn start(
    paths: &LabPaths,
    options: &LabOptions,
    progress: &dyn Fn(&str),
) -> Result<LabState, LabError> {
    fs::create_dir_all(&paths.root).map_err(|e| LabError::io("lab", "create", &paths.root, e))?;
    progress("recording the host baseline");
    Baseline::capture()?.save(paths)?;

    progress(&format!("starting the registry on {REGISTRY_ADDR}"));
    let registry_pid = registry::start(paths)?;

    progress("building and pushing images");
    let images = images::build_and_push(paths, progress)?;

    network::write_conflist(paths, &options.extra_cni_plugins, options.max_pod_ips)?;
    progress("starting containerd");
    let containerd_pid = containerd::start(paths, progress)?;

    let state = LabState {
        root: paths.root.clone(),
        containerd_pid,
        registry_pid,
        cri_socket: paths.cri_socket(),
        registry_addr: REGISTRY_ADDR.to_owned(),
        pod_subnet: POD_SUBNET.to_owned(),
        bridge: BRIDGE.to_owned(),
        cni_network: CNI_NETWORK.to_owned(),
        images,
        containerd_log: paths.containerd_log(),
        registry_log: paths.registry_log(),
        containerd_config: paths.containerd_config(),
        cni_conflist: paths.cni_conflist(),
        started_at: state::now_rfc3339(),
    };
    state.write(paths)?;
    Ok(state)
}

/// Serializes `up` and `down` on one lab across processes. The lock is an flock on the
/// root's parent directory, so it leaves no lock file behind and dies with its holder.
struct LabLock {
    _dir: File,
}

impl LabLock {
    fn acquire(paths: &LabPaths) -> Result<LabLock, LabError> {
        let parent = paths.root.parent().unwrap_or(Path::new("/")).to_owned();
        let lock_err = |source| LabError::Lock {
            path: parent.clone(),
            source,
        };
        fs::create_dir_all(&parent).map_err(lock_err)?;
        let dir = File::open(&parent).map_err(lock_err)?;
        loop {
            // SAFETY: flock on a descriptor this function owns.
            if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(LabLock { _dir: dir });
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(lock_err(err));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_refs_point_at_the_local_registry() {
        for r in [IMAGE_PAUSE, IMAGE_APP, IMAGE_BIG10, IMAGE_BIG50] {
            assert!(r.starts_with(&format!("{REGISTRY_ADDR}/podlapse/")), "{r}");
        }
    }

    #[test]
    fn status_of_an_absent_lab_is_down() {
        let paths = LabPaths::new("/nonexistent/podlapse-lab-status-test");
        let s = status(&paths).unwrap();
        assert!(!s.is_up());
        assert!(s.to_string().contains(": down"), "{s}");
    }

    #[test]
    fn refuses_a_foreign_directory_as_root() {
        let dir = std::env::temp_dir().join(format!("ptlab-foreign-{}", std::process::id()));
        fs::create_dir_all(dir.join("precious")).unwrap();
        let paths = LabPaths::new(&dir);
        let err = down(&paths, &|_| {}).unwrap_err();
        let still_there = dir.join("precious").is_dir();
        fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(err, LabError::NotALabRoot { .. }), "{err}");
        assert!(still_there);
    }

    /// The host's shared lab resources (bridge, firewall rules, CNI cache) are only this
    /// lab's to remove when no other lab holds them; a crashed lab's are swept by any `down`
    /// on a machine with no lab root, so only what is under this root is asserted here.
    #[test]
    fn down_of_an_absent_lab_removes_nothing_of_its_own_and_creates_nothing() {
        let dir = std::env::temp_dir().join(format!("ptlab-down-{}", std::process::id()));
        let paths = LabPaths::new(&dir);
        let report = down(&paths, &|_| {}).unwrap();
        let text = report.to_string();
        assert!(!text.contains(&*dir.to_string_lossy()), "{report}");
        assert!(!dir.exists(), "down created {}", dir.display());
    }

    #[test]
    fn down_of_one_lab_leaves_the_shared_resources_to_another_lab_root_that_exists() {
        let base = std::env::temp_dir().join(format!("ptlab-two-{}", std::process::id()));
        let other = base.join("other");
        fs::create_dir_all(other.join(paths::BASELINE_DIR)).unwrap();
        let mine = LabPaths::new(base.join("mine"));
        let found = teardown::other_lab_among(&mine, std::slice::from_ref(&other)).map(|o| o.root);
        let none = teardown::other_lab_among(&mine, &[mine.root.clone(), base.join("absent")]);
        fs::remove_dir_all(&base).unwrap();
        assert_eq!(found, Some(other));
        assert!(none.is_none());
    }
}
