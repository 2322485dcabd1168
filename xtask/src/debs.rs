//! Debian packages the labs take at pinned versions: the reference runtime (containerd 2.x
//! and runc 1.3, from `sid`) and the guest kernels of the modern node (from the suite of
//! each). They are downloaded once into a cache (apt's ordinary client, with a sources
//! list, lists and cache of podlapse's own, so the system's apt sources stay as they are)
//! and unpacked where a lab needs them: the host lab unpacks containerd into its own
//! directory, the modern node installs them into its guest image. Nothing is installed
//! system-wide.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::lab::describe;

/// Overrides where the downloaded packages are kept.
pub const CACHE_ENV: &str = "PODLAPSE_DEB_CACHE";
/// The cache when [`CACHE_ENV`] is not set: it outlives the labs, so a lab's `down` and
/// `up` do not download again.
pub const DEFAULT_CACHE: &str = "/var/cache/podlapse/debs";

/// The suite the runtime comes from; `sid` moves, so every package is pinned.
pub const SID: &str = "sid";
pub const MIRROR: &str = "http://deb.debian.org/debian";

/// One pinned Debian package, and the suite that serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deb {
    pub package: &'static str,
    pub version: &'static str,
    pub suite: &'static str,
}

/// containerd 2.x: the runtime of the node kubelet 1.37 supports.
pub const CONTAINERD: Deb = Deb {
    package: "containerd",
    version: "2.1.9+ds1-5",
    suite: SID,
};
/// runc 1.3. Built against glibc 2.38, so it runs on trixie (the modern node) but not on
/// bookworm (the host lab keeps bookworm's runc).
pub const RUNC: Deb = Deb {
    package: "runc",
    version: "1.3.6+ds1-1",
    suite: SID,
};

#[derive(Debug, thiserror::Error)]
pub enum DebError {
    #[error("Debian packages: cannot {action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Debian packages: `{command}` failed: {why}")]
    Command { command: String, why: String },
    /// The registry no longer has the pinned version (suites move; Debian keeps only the
    /// newest of each package in a suite).
    #[error("{package} {version} is not served by {mirror} {suite} any more")]
    NotServed {
        package: &'static str,
        version: &'static str,
        suite: &'static str,
        mirror: &'static str,
    },
    #[error(
        "Debian packages: {} is {found}, not the pinned {wanted} (remove it to download again)",
        path.display()
    )]
    WrongVersion {
        path: PathBuf,
        found: String,
        wanted: String,
    },
}

impl Deb {
    /// `containerd=2.1.9+ds1-5`, as apt takes it.
    pub fn spec(&self) -> String {
        format!("{}={}", self.package, self.version)
    }

    /// The file apt downloads it as (an epoch's colon is escaped as `%3a`).
    pub fn file_name(&self, arch: &str) -> String {
        format!(
            "{}_{}_{arch}.deb",
            self.package,
            self.version.replace(':', "%3a")
        )
    }
}

/// The package cache: `$PODLAPSE_DEB_CACHE`, else [`DEFAULT_CACHE`].
pub fn cache_dir() -> PathBuf {
    match std::env::var_os(CACHE_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(DEFAULT_CACHE),
    }
}

/// dpkg's architecture name for this machine.
pub fn architecture() -> Result<String, DebError> {
    let out = run(Command::new("dpkg").arg("--print-architecture"))?;
    Ok(out.trim().to_owned())
}

/// The cached file of `deb`, whether or not it has been downloaded: the machine's
/// architecture's, or the architecture-independent one (`_all`) where that is cached.
pub fn cached_path(deb: &Deb) -> Result<PathBuf, DebError> {
    Ok(in_cache(&cache_dir(), deb, &architecture()?))
}

fn in_cache(dir: &Path, deb: &Deb, arch: &str) -> PathBuf {
    let all = dir.join(deb.file_name("all"));
    if all.is_file() {
        all
    } else {
        dir.join(deb.file_name(arch))
    }
}

/// Whether every package is in the cache, at its pinned version.
pub fn cached(debs: &[Deb]) -> bool {
    debs.iter()
        .all(|d| cached_path(d).is_ok_and(|p| version_of(&p).is_ok_and(|v| v == d.version)))
}

/// Downloads whichever of `debs` the cache lacks and returns their files, in order. The
/// cached files are checked against their pinned versions.
pub fn fetch(debs: &[Deb], progress: &dyn Fn(&str)) -> Result<Vec<PathBuf>, DebError> {
    let dir = cache_dir();
    fs::create_dir_all(&dir).map_err(|e| io("create", &dir, e))?;
    let arch = architecture()?;
    let missing: Vec<&Deb> = debs
        .iter()
        .filter(|d| !in_cache(&dir, d, &arch).is_file())
        .collect();
    if !missing.is_empty() {
        let specs: Vec<String> = missing.iter().map(|d| d.spec()).collect();
        let mut suites: Vec<&str> = missing.iter().map(|d| d.suite).collect();
        suites.sort_unstable();
        suites.dedup();
        progress(&format!(
            "downloading {} from Debian {} into {}",
            specs.join(" "),
            suites.join(", "),
            dir.display()
        ));
        download(&dir, &missing)?;
    }
    debs.iter()
        .map(|d| {
            let path = in_cache(&dir, d, &arch);
            let found = version_of(&path)?;
            if found != d.version {
                return Err(DebError::WrongVersion {
                    path,
                    found,
                    wanted: d.version.to_owned(),
                });
            }
            Ok(path)
        })
        .collect()
}

/// Unpacks a package's files under `into` (`dpkg-deb -x`: no maintainer scripts run).
pub fn unpack(deb: &Path, into: &Path) -> Result<(), DebError> {
    fs::create_dir_all(into).map_err(|e| io("create", into, e))?;
    run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(into)).map(drop)
}

/// The version in a package file's control data.
pub fn version_of(deb: &Path) -> Result<String, DebError> {
    if !deb.is_file() {
        return Err(io(
            "read",
            deb,
            std::io::Error::from(std::io::ErrorKind::NotFound),
        ));
    }
    Ok(run(Command::new("dpkg-deb")
        .args(["-f"])
        .arg(deb)
        .arg("Version"))?
    .trim()
    .to_owned())
}

/// `apt-get download` with a sources list (the packages' suites), lists and cache under
/// `dir/apt`, run in `dir`. A pinned version the registry no longer serves is named.
fn download(dir: &Path, debs: &[&Deb]) -> Result<(), DebError> {
    let apt = dir.join("apt");
    for d in [
        apt.join("lists/partial"),
        apt.join("cache/archives/partial"),
    ] {
        fs::create_dir_all(&d).map_err(|e| io("create", &d, e))?;
    }
    let list = apt.join("sources.list");
    let mut sources = String::new();
    for d in debs {
        let line = format!("deb {MIRROR} {} main\n", d.suite);
        if !sources.contains(&line) {
            sources.push_str(&line);
        }
    }
    fs::write(&list, sources).map_err(|e| io("write", &list, e))?;
    let options = [
        format!("Dir::Etc::SourceList={}", list.display()),
        "Dir::Etc::SourceParts=/dev/null".to_owned(),
        format!("Dir::State::Lists={}", apt.join("lists").display()),
        format!("Dir::Cache={}", apt.join("cache").display()),
        // apt's `_apt` user may not write into a root-only cache.
        "APT::Sandbox::User=root".to_owned(),
    ];
    let apt_get = |args: &[&str]| {
        let mut cmd = Command::new("apt-get");
        for o in &options {
            cmd.arg("-o").arg(o);
        }
        cmd.args(["-q"]).args(args).current_dir(dir);
        cmd
    };
    run(&mut apt_get(&["update"]))?;
    let mut get = apt_get(&["download"]);
    get.args(debs.iter().map(|d| d.spec()));
    run(&mut get).map(drop).map_err(|failed| {
        // Which one: the first the registry does not list at its pinned version.
        let show = |d: &Deb| {
            let mut cmd = apt_get(&[]);
            cmd.args(["--print-uris", "download", &d.spec()]);
            run(&mut cmd).is_ok()
        };
        match debs.iter().find(|d| !show(d)) {
            Some(d) => DebError::NotServed {
                package: d.package,
                version: d.version,
                suite: d.suite,
                mirror: MIRROR,
            },
            None => failed,
        }
    })
}

fn run(cmd: &mut Command) -> Result<String, DebError> {
    let command = describe(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .map_err(|e| DebError::Command {
            command: command.clone(),
            why: e.to_string(),
        })?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let why = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no output")
        .trim()
        .to_owned();
    Err(DebError::Command { command, why })
}

fn io(action: &'static str, path: &Path, source: std::io::Error) -> DebError {
    DebError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_apts_download_names() {
        assert_eq!(CONTAINERD.spec(), "containerd=2.1.9+ds1-5");
        assert_eq!(
            CONTAINERD.file_name("amd64"),
            "containerd_2.1.9+ds1-5_amd64.deb"
        );
        let epoch = Deb {
            package: "x",
            version: "1:2.0-1",
            suite: SID,
        };
        assert_eq!(epoch.file_name("arm64"), "x_1%3a2.0-1_arm64.deb");
    }

    #[test]
    fn a_missing_package_file_is_named_in_the_error() {
        let err = version_of(Path::new("/nonexistent/containerd.deb")).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/containerd.deb"),
            "{err}"
        );
    }
}
