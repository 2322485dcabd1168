//! The lab's images, built offline from the static busybox with umoci into one OCI layout
//! and pushed to the local registry with skopeo. Building all four takes well under a
//! second here, so nothing is cached between labs.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::error::LabError;
use super::paths::LabPaths;
use super::process::{exec_ok, require_program};
use super::{IMAGE_APP, IMAGE_BIG10, IMAGE_BIG50, IMAGE_PAUSE};

pub(crate) const BUSYBOX: &str = "/bin/busybox";
pub(crate) const UMOCI_TIMEOUT: Duration = Duration::from_secs(120);
pub(crate) const PUSH_TIMEOUT: Duration = Duration::from_secs(180);

/// Applets the lab's workloads rely on; linked even if `busybox --list` were to fail.
const REQUIRED_APPLETS: &[&str] = &[
    "sh", "sleep", "cat", "date", "echo", "wget", "nc", "httpd", "touch", "ls", "true", "false",
    "env", "kill", "mkdir", "rm", "head", "dd",
];

pub(crate) const PATH_ENV: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The sandbox process: exits 0 on TERM or INT, otherwise sleeps forever. The sleep runs in
/// the background so the trap fires at once instead of after the sleep.
pub const PAUSE_SCRIPT: &str =
    "trap 'kill $! 2>/dev/null; exit 0' TERM INT; while :; do sleep 3600 & wait $!; done";

/// How one image is derived inside the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recipe {
    /// busybox with `sleep 3600` as its command.
    App,
    /// busybox with [`PAUSE_SCRIPT`] as its command.
    Pause,
    /// The app image plus one layer holding this many MiB of random bytes.
    AppWithPayload(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ImageSpec {
    pub role: &'static str,
    pub reference: &'static str,
    pub recipe: Recipe,
}

pub(crate) const IMAGES: [ImageSpec; 4] = [
    ImageSpec::new("app", IMAGE_APP, Recipe::App),
    ImageSpec::new("pause", IMAGE_PAUSE, Recipe::Pause),
    ImageSpec::new("big10", IMAGE_BIG10, Recipe::AppWithPayload(10)),
    ImageSpec::new("big50", IMAGE_BIG50, Recipe::AppWithPayload(50)),
];

impl ImageSpec {
    const fn new(role: &'static str, reference: &'static str, recipe: Recipe) -> ImageSpec {
        ImageSpec {
            role,
            reference,
            recipe,
        }
    }

    /// `podlapse/app` of `127.0.0.1:5000/podlapse/app:1.0`: names the part in errors.
    pub(crate) fn repository(&self) -> &'static str {
        let no_tag = self
            .reference
            .rsplit_once(':')
            .map_or(self.reference, |(r, _)| r);
        no_tag.split_once('/').map_or(no_tag, |(_, r)| r)
    }

    fn part(&self) -> String {
        format!("image {}", self.repository())
    }
}

/// Builds every image and pushes it; returns reference by role.
pub(crate) fn build_and_push(
    paths: &LabPaths,
    progress: &dyn Fn(&str),
) -> Result<BTreeMap<String, String>, LabError> {
    let umoci = require_program("images", "umoci")?;
    let skopeo = require_program("images", "skopeo")?;
    let work = paths.image_build_dir();
    let layout = work.join("oci");
    fs::create_dir_all(&work).map_err(|e| LabError::io("images", "create", &work, e))?;

    let base_part = "image podlapse/app";
    umoci_run(base_part, &umoci, &["init", "--layout", &s(&layout)])?;
    let base = format!("{}:base", s(&layout));
    umoci_run(base_part, &umoci, &["new", "--image", &base])?;
    let rootfs = work.join("rootfs");
    stage_busybox_rootfs(&rootfs)
        .map_err(|e| LabError::io(base_part, "stage rootfs in", &rootfs, e))?;
    umoci_run(
        base_part,
        &umoci,
        &["insert", "--image", &base, &s(&rootfs), "/"],
    )?;
    umoci_run(
        base_part,
        &umoci,
        &[
            "config",
            "--image",
            &base,
            "--config.env",
            PATH_ENV,
            "--config.workingdir",
            "/",
        ],
    )?;

    let mut refs = BTreeMap::new();
    for spec in IMAGES {
        let part = spec.part();
        let tag = format!("{}:{}", s(&layout), spec.role);
        // The base image tagged as this role, with `command` as its command.
        let with_command = |command: &[&str]| {
            let mut args = vec!["config", "--image", &base, "--tag", spec.role];
            for word in command {
                args.extend(["--config.cmd", word]);
            }
            umoci_run(&part, &umoci, &args)
        };
        match spec.recipe {
            Recipe::App => with_command(&["sleep", "3600"])?,
            Recipe::Pause => with_command(&["/bin/sh", "-c", PAUSE_SCRIPT])?,
            Recipe::AppWithPayload(mib) => {
                let app = format!("{}:app", s(&layout));
                umoci_run(&part, &umoci, &["tag", "--image", &app, spec.role])?;
                let dir = work.join(format!("payload-{}", spec.role));
                let file = dir.join("payload").join(format!("{}.bin", spec.role));
                write_random(&file, mib).map_err(|e| LabError::io(&part, "write", &file, e))?;
                umoci_run(&part, &umoci, &["insert", "--image", &tag, &s(&dir), "/"])?;
                // The payload now lives in the layout; the staging copy is dead weight.
                let _ = fs::remove_dir_all(&dir);
            }
        }
        progress(&format!("pushing {}", spec.reference));
        let mut cmd = Command::new(&skopeo);
        cmd.args([
            "--insecure-policy",
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
        ])
        .arg(format!("oci:{tag}"))
        .arg(format!("docker://{}", spec.reference));
        exec_ok(&part, cmd, None, PUSH_TIMEOUT)?;
        refs.insert(spec.role.to_owned(), spec.reference.to_owned());
    }
    // The registry holds the images now; the layout would only double the disk use.
    fs::remove_dir_all(&work).map_err(|e| LabError::io("images", "remove", &work, e))?;
    Ok(refs)
}

pub(crate) fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

pub(crate) fn umoci_run(part: &str, umoci: &Path, args: &[&str]) -> Result<(), LabError> {
    let mut cmd = Command::new(umoci);
    cmd.args(args);
    exec_ok(part, cmd, None, UMOCI_TIMEOUT).map(|_| ())
}

/// `/bin/busybox` with every applet linked beside it, `/tmp`, and an `/etc/passwd` so that
/// tools looking up users (httpd, id) work.
pub(crate) fn stage_busybox_rootfs(rootfs: &Path) -> std::io::Result<()> {
    let bin = rootfs.join("bin");
    fs::create_dir_all(&bin)?;
    fs::copy(BUSYBOX, bin.join("busybox"))?;
    fs::set_permissions(bin.join("busybox"), fs::Permissions::from_mode(0o755))?;
    for applet in applets() {
        let link = bin.join(&applet);
        if applet != "busybox" && fs::symlink_metadata(&link).is_err() {
            symlink("busybox", &link)?;
        }
    }
    let etc = rootfs.join("etc");
    fs::create_dir_all(&etc)?;
    fs::write(
        etc.join("passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    )?;
    fs::write(etc.join("group"), "root:x:0:\nnogroup:x:65534:\n")?;
    for (dir, mode) in [("tmp", 0o1777), ("root", 0o700)] {
        let d = rootfs.join(dir);
        fs::create_dir_all(&d)?;
        fs::set_permissions(&d, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Applet names from `busybox --list` (only plain names, so nothing escapes `/bin`), plus
/// the required ones.
fn applets() -> Vec<String> {
    let mut names: Vec<String> = REQUIRED_APPLETS.iter().map(|a| (*a).to_owned()).collect();
    if let Ok(out) = Command::new(BUSYBOX).arg("--list").output() {
        names.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::trim)
                .filter(|a| is_plain_name(a))
                .map(str::to_owned),
        );
    }
    names.sort();
    names.dedup();
    names
}

fn is_plain_name(a: &str) -> bool {
    !a.is_empty() && a != "." && a != ".." && !a.contains('/')
}

/// `mib` MiB from /dev/urandom: incompressible, so the layer really is that big on the wire.
fn write_random(file: &Path, mib: u64) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        fs::create_dir_all(dir)?;
    }
    let mut src = File::open("/dev/urandom")?;
    let mut dst = File::create(file)?;
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..mib {
        src.read_exact(&mut buf)?;
        dst.write_all(&buf)?;
    }
    dst.flush()
}

/// Programs `up` needs for the images, for the pre-flight check.
pub(crate) fn required_programs() -> [&'static str; 3] {
    ["umoci", "skopeo", BUSYBOX]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn repositories_name_the_part() {
        let names: Vec<&str> = IMAGES.iter().map(|i| i.repository()).collect();
        assert_eq!(
            names,
            [
                "podlapse/app",
                "podlapse/pause",
                "podlapse/big10",
                "podlapse/big50"
            ]
        );
        assert_eq!(IMAGES[0].part(), "image podlapse/app");
    }

    #[test]
    fn applet_names_stay_in_bin() {
        assert!(is_plain_name("sh"));
        assert!(is_plain_name("["));
        assert!(!is_plain_name("../etc/passwd"));
        assert!(!is_plain_name(".."));
    }

    #[test]
    fn staged_rootfs_has_required_applets() {
        if !Path::new(BUSYBOX).exists() {
            return;
        }
        let dir = std::env::temp_dir().join(format!("ptlab-rootfs-{}", std::process::id()));
        stage_busybox_rootfs(&dir).unwrap();
        for a in REQUIRED_APPLETS {
            let link = dir.join("bin").join(a);
            assert_eq!(
                fs::read_link(&link).unwrap(),
                PathBuf::from("busybox"),
                "{a}"
            );
        }
        let tmp_mode = fs::metadata(dir.join("tmp")).unwrap().permissions().mode();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(tmp_mode & 0o7777, 0o1777);
    }
}
