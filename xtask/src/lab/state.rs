//! `lab.json` and the reports `up`, `down` and `status` return.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::error::LabError;
use super::paths::LabPaths;
use super::process;

/// What `up` started, as recorded in `lab.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabState {
    pub root: PathBuf,
    pub containerd_pid: u32,
    pub registry_pid: u32,
    pub cri_socket: PathBuf,
    /// `host:port` of the plain-HTTP registry.
    pub registry_addr: String,
    pub pod_subnet: String,
    pub bridge: String,
    pub cni_network: String,
    /// Image references by role: `pause`, `app`, `big10`, `big50`.
    pub images: BTreeMap<String, String>,
    pub containerd_log: PathBuf,
    pub registry_log: PathBuf,
    pub containerd_config: PathBuf,
    pub cni_conflist: PathBuf,
    /// RFC 3339, UTC.
    pub started_at: String,
}

impl LabState {
    pub(crate) fn read(paths: &LabPaths) -> Result<Option<LabState>, LabError> {
        let path = paths.state_file();
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(LabError::io("state", "read", &path, e)),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|source| LabError::State { path, source })
    }

    /// Written through a temporary file and a rename, so a reader never sees half a file
    /// and the state file appears only once everything is up.
    pub(crate) fn write(&self, paths: &LabPaths) -> Result<(), LabError> {
        let path = paths.state_file();
        let tmp = path.with_extension("json.tmp");
        let json = serde_json::to_string_pretty(self).map_err(|source| LabError::State {
            path: path.clone(),
            source,
        })?;
        fs::write(&tmp, json + "\n").map_err(|e| LabError::io("state", "write", &tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| LabError::io("state", "write", &path, e))
    }

    /// Whether both daemons recorded here still run, and are still the lab's (a recycled
    /// pid would run something else).
    pub fn is_running(&self) -> bool {
        let paths = LabPaths::new(&self.root);
        daemon_alive(
            self.containerd_pid,
            &paths.containerd_config().to_string_lossy(),
        ) && daemon_alive(
            self.registry_pid,
            &paths.registry_config().to_string_lossy(),
        )
    }
}

pub(crate) fn daemon_alive(pid: u32, config: &str) -> bool {
    process::is_alive(pid) && process::cmdline(pid).contains(config)
}

/// The outcome of `up`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpOutcome {
    /// This call started the lab.
    Started(LabState),
    /// The lab was already running; nothing was changed.
    AlreadyUp(LabState),
}

/// Everything `down` removed, by kind. Empty when nothing of the lab was there.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DownReport {
    /// Containers and sandboxes removed through containerd.
    pub containers: Vec<String>,
    pub processes: Vec<String>,
    pub mounts: Vec<String>,
    pub netns: Vec<String>,
    pub links: Vec<String>,
    pub iptables_rules: Vec<String>,
    pub iptables_chains: Vec<String>,
    /// nftables tables, sysctls and other host settings put back.
    pub host_settings: Vec<String>,
    /// Files and directories outside the root, cgroups, and the root itself.
    pub paths: Vec<String>,
}

impl DownReport {
    pub fn is_empty(&self) -> bool {
        self.sections().iter().all(|(_, items)| items.is_empty())
    }

    fn sections(&self) -> [(&'static str, &Vec<String>); 9] {
        [
            ("containers", &self.containers),
            ("processes", &self.processes),
            ("mounts", &self.mounts),
            ("netns", &self.netns),
            ("links", &self.links),
            ("iptables rules", &self.iptables_rules),
            ("iptables chains", &self.iptables_chains),
            ("host settings", &self.host_settings),
            ("paths", &self.paths),
        ]
    }
}

impl fmt::Display for DownReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return writeln!(f, "nothing of the lab was left to remove");
        }
        for (name, items) in self.sections() {
            if items.is_empty() {
                continue;
            }
            writeln!(f, "removed {} {name}:", items.len())?;
            for item in items {
                writeln!(f, "  {item}")?;
            }
        }
        Ok(())
    }
}

/// One daemon of the lab, as `status` sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartStatus {
    pub name: &'static str,
    pub running: bool,
    pub pid: Option<u32>,
    /// Label and value pairs, e.g. `("socket", path)`.
    pub details: Vec<(&'static str, String)>,
}

/// The lab as `status` sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LabStatus {
    pub root: PathBuf,
    /// `lab.json`, when present.
    pub state: Option<LabState>,
    pub parts: Vec<PartStatus>,
}

impl LabStatus {
    /// Up means `lab.json` exists and every part runs.
    pub fn is_up(&self) -> bool {
        self.state.is_some() && self.parts.iter().all(|p| p.running)
    }
}

impl fmt::Display for LabStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = match (&self.state, self.is_up()) {
            (Some(_), true) => "up",
            (Some(_), false) => "degraded (lab.json present, a part is not running)",
            (None, _) if self.parts.iter().any(|p| p.running) => {
                "not up, but lab processes are running (run `lab down`)"
            }
            (None, _) => "down",
        };
        writeln!(f, "lab {}: {verdict}", self.root.display())?;
        if let Some(s) = &self.state {
            writeln!(f, "  started at {}", s.started_at)?;
        }
        for p in &self.parts {
            let run = if p.running { "running" } else { "stopped" };
            match p.pid {
                Some(pid) => writeln!(f, "  {:<11} {run:<8} pid {pid}", p.name)?,
                None => writeln!(f, "  {:<11} {run}", p.name)?,
            }
            for (label, value) in &p.details {
                writeln!(f, "  {:<11}   {label}: {value}", "")?;
            }
        }
        Ok(())
    }
}

/// Now as RFC 3339 UTC, e.g. `2025-11-22T07:30:00Z`.
pub(crate) fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(secs)
}

fn rfc3339(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_763_796_645), "2025-11-22T07:30:45Z");
    }

    #[test]
    fn state_roundtrip() {
        let dir = std::env::temp_dir().join(format!("ptlab-state-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let paths = LabPaths::new(&dir);
        assert_eq!(LabState::read(&paths).unwrap(), None);
        let s = LabState {
            root: dir.clone(),
            containerd_pid: 1,
            registry_pid: 2,
            cri_socket: paths.cri_socket(),
            registry_addr: "127.0.0.1:5000".into(),
            pod_subnet: "10.244.77.0/24".into(),
            bridge: "ptlab0".into(),
            cni_network: "podlapse-lab".into(),
            images: BTreeMap::from([("app".into(), "x".into())]),
            containerd_log: paths.containerd_log(),
            registry_log: paths.registry_log(),
            containerd_config: paths.containerd_config(),
            cni_conflist: paths.cni_conflist(),
            started_at: now_rfc3339(),
        };
        s.write(&paths).unwrap();
        let back = LabState::read(&paths).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(back, Some(s));
    }

    #[test]
    fn empty_report_says_so() {
        let r = DownReport::default();
        assert!(r.is_empty());
        assert!(r.to_string().contains("nothing"));
        let r = DownReport {
            links: vec!["ptlab0".into()],
            ..DownReport::default()
        };
        assert!(r.to_string().contains("removed 1 links:\n  ptlab0"));
    }
}
