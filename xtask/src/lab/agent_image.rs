//! podlapse's own image: the `podlapse` binary and the shared objects it loads, nothing
//! else, built offline with umoci into an OCI layout as the lab builds its images.
//!
//! The same binary gives the same image digest: every file of the root filesystem is
//! stamped with one time (`SOURCE_DATE_EPOCH`, else the commit's time), the config's
//! `created` is that time, no history entry is written, and the layout is garbage-collected
//! so it holds only the image's blobs.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use super::error::LabError;
use super::images::{PUSH_TIMEOUT, s, umoci_run};
use super::process::{exec_ok, require_program};
use super::program_image::{copy_into, shared_libraries};

/// Where the binary lives in the image; the image's entrypoint.
pub const AGENT_IMAGE_BINARY: &str = "/usr/local/bin/podlapse";
/// The image's command when the pod gives none: the node agent's mode.
const DEFAULT_CMD: &str = "observe";
/// The environment variable that fixes the image's time (reproducible-builds.org).
pub const SOURCE_DATE_EPOCH: &str = "SOURCE_DATE_EPOCH";

/// A built image: its layout, its tag in the layout and its manifest digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentImage {
    pub layout: PathBuf,
    pub tag: String,
    /// `sha256:…` of the image manifest: what a registry and containerd call the image.
    pub digest: String,
}

impl AgentImage {
    /// The layout's image as skopeo and umoci name it: `<layout>:<tag>`.
    pub fn oci_ref(&self) -> String {
        format!("oci:{}:{}", s(&self.layout), self.tag)
    }
}

/// Builds the image of `binary` into the OCI layout `layout` (replaced), tagged `tag`,
/// with every time in it set to `epoch` (seconds since 1970).
pub fn build_agent_image(
    binary: &Path,
    layout: &Path,
    tag: &str,
    epoch: u64,
) -> Result<AgentImage, LabError> {
    let part = "image podlapse";
    let umoci = require_program(part, "umoci")?;
    let work = layout.with_extension("rootfs");
    for dir in [layout, work.as_path()] {
        if dir.exists() {
            fs::remove_dir_all(dir).map_err(|e| LabError::io(part, "remove", dir, e))?;
        }
    }
    stage_rootfs(part, binary, &work)?;
    let when = SystemTime::UNIX_EPOCH + Duration::from_secs(epoch);
    stamp_tree(part, &work, when)?;
    let created = rfc3339(epoch);
    let image = format!("{}:{tag}", s(layout));
    umoci_run(part, &umoci, &["init", "--layout", &s(layout)])?;
    umoci_run(part, &umoci, &["new", "--image", &image])?;
    umoci_run(
        part,
        &umoci,
        &["insert", "--image", &image, "--no-history", &s(&work), "/"],
    )?;
    umoci_run(
        part,
        &umoci,
        &[
            "config",
            "--image",
            &image,
            "--no-history",
            "--created",
            &created,
            "--config.entrypoint",
            AGENT_IMAGE_BINARY,
            "--config.cmd",
            DEFAULT_CMD,
            "--config.workingdir",
            "/",
            "--config.env",
            "PATH=/usr/local/bin:/usr/bin:/bin",
            "--config.label",
            &format!(
                "org.opencontainers.image.version={}",
                env!("CARGO_PKG_VERSION")
            ),
            "--config.label",
            "org.opencontainers.image.title=podlapse",
        ],
    )?;
    umoci_run(part, &umoci, &["gc", "--layout", &s(layout)])?;
    fs::remove_dir_all(&work).map_err(|e| LabError::io(part, "remove", &work, e))?;
    let digest = manifest_digest(part, layout, tag)?;
    Ok(AgentImage {
        layout: layout.to_path_buf(),
        tag: tag.to_string(),
        digest,
    })
}

/// Writes the image as an OCI archive (a tarball of its layout) that `skopeo copy
/// oci-archive:FILE docker://…`, `ctr images import` and `docker load` take.
pub fn save_agent_image(image: &AgentImage, file: &Path) -> Result<(), LabError> {
    let part = "image podlapse";
    let skopeo = require_program(part, "skopeo")?;
    if file.exists() {
        fs::remove_file(file).map_err(|e| LabError::io(part, "replace", file, e))?;
    }
    let mut cmd = Command::new(skopeo);
    cmd.args(["--insecure-policy", "copy", "--quiet"])
        .arg(image.oci_ref())
        .arg(format!("oci-archive:{}:{}", s(file), image.tag));
    exec_ok(part, cmd, None, PUSH_TIMEOUT).map(drop)
}

/// Pushes the image to `reference` (`host:port/repo:tag`) in a registry without TLS, such
/// as the lab's.
pub fn push_agent_image(image: &AgentImage, reference: &str) -> Result<(), LabError> {
    let part = "image podlapse";
    let skopeo = require_program(part, "skopeo")?;
    let mut cmd = Command::new(skopeo);
    cmd.args([
        "--insecure-policy",
        "copy",
        "--quiet",
        "--dest-tls-verify=false",
    ])
    .arg(image.oci_ref())
    .arg(format!("docker://{reference}"));
    exec_ok(part, cmd, None, PUSH_TIMEOUT).map(drop)
}

/// The image's time: `SOURCE_DATE_EPOCH` when set, else the time of the commit `repo` is
/// at, else 0.
pub fn image_epoch(repo: &Path) -> Result<u64, LabError> {
    if let Some(v) = std::env::var_os(SOURCE_DATE_EPOCH) {
        let text = v.to_string_lossy();
        return text.trim().parse().map_err(|_| LabError::BadInput {
            part: "image podlapse".into(),
            problem: format!("{SOURCE_DATE_EPOCH}={text:?} is not a number of seconds"),
        });
    }
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["log", "-1", "--format=%ct"])
        .output();
    Ok(out
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(0))
}

/// The root filesystem: the binary at [`AGENT_IMAGE_BINARY`], the shared objects it loads
/// at their host paths, and an empty `/tmp` (the observer's scratch).
fn stage_rootfs(part: &str, binary: &Path, root: &Path) -> Result<(), LabError> {
    copy_into(
        part,
        binary,
        &root.join(AGENT_IMAGE_BINARY.trim_start_matches('/')),
    )?;
    for lib in shared_libraries(part, binary)? {
        copy_into(
            part,
            &lib,
            &root.join(lib.strip_prefix("/").unwrap_or(&lib)),
        )?;
    }
    let tmp = root.join("tmp");
    fs::create_dir_all(&tmp).map_err(|e| LabError::io(part, "create", &tmp, e))?;
    Ok(())
}

/// Sets the modification time of every file and directory under `root`, and of `root`.
fn stamp_tree(part: &str, root: &Path, when: SystemTime) -> Result<(), LabError> {
    for entry in fs::read_dir(root).map_err(|e| LabError::io(part, "read", root, e))? {
        let path = entry
            .map_err(|e| LabError::io(part, "read", root, e))?
            .path();
        if path.is_dir() {
            stamp_tree(part, &path, when)?;
        } else {
            stamp(part, &path, when)?;
        }
    }
    stamp(part, root, when)
}

fn stamp(part: &str, path: &Path, when: SystemTime) -> Result<(), LabError> {
    fs::File::open(path)
        .and_then(|f| f.set_modified(when))
        .map_err(|e| LabError::io(part, "set the time of", path, e))
}

/// The digest of the manifest `tag` names in the layout's index.
fn manifest_digest(part: &str, layout: &Path, tag: &str) -> Result<String, LabError> {
    let index = layout.join("index.json");
    let text = fs::read_to_string(&index).map_err(|e| LabError::io(part, "read", &index, e))?;
    let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| LabError::BadInput {
        part: part.into(),
        problem: format!("{}: {e}", index.display()),
    })?;
    doc["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .and_then(|m| m["digest"].as_str())
        .map(str::to_string)
        .ok_or_else(|| LabError::BadInput {
            part: part.into(),
            problem: format!("{} names no image tagged {tag}", index.display()),
        })
}

/// `epoch` as RFC 3339 UTC (`1970-01-01T00:00:00Z`), the form an image config's
/// `created` takes.
fn rfc3339(epoch: u64) -> String {
    humantime::format_rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(epoch)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
