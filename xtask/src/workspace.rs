//! Paths in the workspace and running cargo from xtask.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};

/// The package of the integration tests, which run on the node lab (and of the test
/// clients the benchmarks build).
pub const TESTS_PACKAGE: &str = "podlapse-tests";

/// The workspace root (xtask lives one level below it).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the workspace")
        .to_path_buf()
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// `cargo` as invoked by the user, run from the workspace root.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// `name` in cargo's `bin` directory: under `$CARGO_HOME`, else `$HOME/.cargo`, else
/// `home_default` when neither is set.
pub fn cargo_bin(name: &str, home_default: &str) -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from(home_default))
        .join("bin")
        .join(name)
}

/// The target triple of this machine, as `rustc -vV` says (`host: ...`).
pub fn host_triple() -> anyhow::Result<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(&rustc)
        .arg("-vV")
        .output()
        .context("running rustc -vV")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_string)
        .context("rustc -vV printed no `host:` line")
}

/// Runs a command, failing with its name when it does not succeed.
pub fn run(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("starting {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// Runs a command for its output: fails with `running {what}` when it cannot start, and
/// with `{what}: ` and its stderr when it does not succeed.
pub fn output_of(cmd: &mut Command, what: &str) -> anyhow::Result<std::process::Output> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!("{what}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(out)
}

/// `cargo build --bin {bin}` (of `package` when `release`, else of the workspace), with
/// `--release` when `release`, and the path of the binary it builds.
pub fn build_bin(package: &str, bin: &str, release: bool) -> (Command, PathBuf) {
    let mut cmd = cargo();
    cmd.arg("build");
    if release {
        cmd.args(["--release", "--package", package, "--bin", bin]);
    } else {
        // A debug build is the tests' build: resolved over the whole workspace, as the
        // unit and integration test builds are, its crates are the ones those built (the
        // test package's dependencies add features, serde_json's float_roundtrip among
        // them, so the package alone would compile the agent a second time). A release
        // build is the shipped agent's, with its own package's features only.
        cmd.args(["--workspace", "--bin", bin]);
    }
    let profile = if release { "release" } else { "debug" };
    (cmd, target_dir().join(profile).join(bin))
}

/// Builds the `podlapse` binary and returns its path.
pub fn build_podlapse() -> anyhow::Result<PathBuf> {
    let (mut cmd, path) = build_bin("podlapse", "podlapse", false);
    let out = cmd.output().context("starting cargo build")?;
    if !out.status.success() {
        bail!(
            "cargo build --workspace --bin podlapse failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(path)
}
