//! The one cargo invocation that builds the eBPF probes, shared (through `#[path]`) by
//! `agent/build.rs`, which embeds the object in `podlapse`, and `cargo xtask build-ebpf`,
//! which copies it to `target/bpf`. Both use the same target directory, so either reuses
//! the other's build.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const TARGET: &str = "bpfel-unknown-none";
pub const PACKAGE: &str = "podlapse-probes";

/// Where the probes build: `$CARGO_TARGET_DIR/podlapse-probes` when a target directory is
/// given, else `target/` beside their Cargo.toml.
pub fn target_dir(probes: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(|d| PathBuf::from(d).join(PACKAGE))
        .unwrap_or_else(|| probes.join("target"))
}

/// `cargo build` of the probes (release: the verifier needs optimised code), with
/// `-Z build-std=core` on stable through RUSTC_BOOTSTRAP. The outer build's flags and
/// wrappers (clippy's driver among them) are for the host target and are removed.
pub fn command(cargo: &OsStr, probes: &Path, target_dir: &Path) -> Command {
    let mut cmd = Command::new(cargo);
    cmd.current_dir(probes)
        .env("RUSTC_BOOTSTRAP", "1")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .args([
            "build",
            "--release",
            "--target",
            TARGET,
            "-Z",
            "build-std=core",
        ])
        .arg("--target-dir")
        .arg(target_dir);
    cmd
}

/// The object the build leaves.
pub fn built_object(target_dir: &Path) -> PathBuf {
    target_dir.join(TARGET).join("release").join(PACKAGE)
}
