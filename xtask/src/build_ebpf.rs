//! `cargo xtask build-ebpf`: builds the eBPF probes for `bpfel-unknown-none` and copies
//! the object to `<target>/bpf/podtrace-probes.o`, where `podtrace` looks for it.
//!
//! The probes are not a workspace member: they need nightly flags (`-Z build-std`,
//! enabled on stable with RUSTC_BOOTSTRAP) and `bpf-linker`, which a plain `cargo test`
//! of the workspace must not.

use std::path::PathBuf;

use anyhow::Context;

use crate::workspace;

const TARGET: &str = "bpfel-unknown-none";
const PACKAGE: &str = "podtrace-probes";
pub const OBJECT_NAME: &str = "podtrace-probes.o";

/// Where the built object is copied.
pub fn object_path() -> PathBuf {
    workspace::target_dir().join("bpf").join(OBJECT_NAME)
}

/// Builds the probes (release: the verifier needs optimised code) and returns the
/// object's path.
pub fn run() -> anyhow::Result<PathBuf> {
    let dir = workspace::root().join("agent-ebpf").join("probes");
    // A CARGO_TARGET_DIR given to xtask holds the probes' build too; otherwise they
    // keep their own target/ beside their Cargo.toml.
    let probes_target = std::env::var_os("CARGO_TARGET_DIR")
        .map(|d| PathBuf::from(d).join("podtrace-probes"))
        .unwrap_or_else(|| dir.join("target"));
    let mut cmd = workspace::cargo();
    cmd.current_dir(&dir)
        .env("RUSTC_BOOTSTRAP", "1")
        // The outer cargo's flags are for the host; the probes' own config sets theirs.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .args([
            "build",
            "--release",
            "--target",
            TARGET,
            "-Z",
            "build-std=core",
        ])
        .arg("--target-dir")
        .arg(&probes_target);
    workspace::run(&mut cmd, "cargo build of the eBPF probes")?;
    let built = probes_target.join(TARGET).join("release").join(PACKAGE);
    let dest = object_path();
    std::fs::create_dir_all(dest.parent().expect("object path has a parent"))
        .with_context(|| format!("creating {}", dest.parent().unwrap().display()))?;
    std::fs::copy(&built, &dest)
        .with_context(|| format!("copying {} to {}", built.display(), dest.display()))?;
    Ok(dest)
}
