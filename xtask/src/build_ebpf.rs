//! `cargo xtask build-ebpf`: builds the eBPF probes for `bpfel-unknown-none` and copies
//! the object to `<target>/bpf/podlapse-probes.o`, for `--probes` (podlapse embeds its own).
//!
//! The probes are not a workspace member: they need nightly flags (`-Z build-std`,
//! enabled on stable with RUSTC_BOOTSTRAP) and `bpf-linker`, which a plain `cargo test`
//! of the workspace must not.

#[path = "../../agent-ebpf/probes_build.rs"]
mod probes_build;

use std::path::PathBuf;

use anyhow::Context;

use crate::workspace;

pub const OBJECT_NAME: &str = "podlapse-probes.o";

/// Where the built object is copied.
pub fn object_path() -> PathBuf {
    workspace::target_dir().join("bpf").join(OBJECT_NAME)
}

/// Builds the probes and returns the copied object's path.
pub fn run() -> anyhow::Result<PathBuf> {
    let dir = workspace::root().join("agent-ebpf").join("probes");
    let probes_target = probes_build::target_dir(&dir);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = probes_build::command(&cargo, &dir, &probes_target);
    workspace::run(&mut cmd, "cargo build of the eBPF probes")?;
    let built = probes_build::built_object(&probes_target);
    let dest = object_path();
    std::fs::create_dir_all(dest.parent().expect("object path has a parent"))
        .with_context(|| format!("creating {}", dest.parent().unwrap().display()))?;
    std::fs::copy(&built, &dest)
        .with_context(|| format!("copying {} to {}", built.display(), dest.display()))?;
    Ok(dest)
}
