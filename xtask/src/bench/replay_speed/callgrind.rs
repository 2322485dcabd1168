//! The replay's cost in instructions: the whole `podlapse replay` process under
//! callgrind, every thread's instructions counted (its `Collected` total), which the
//! machine's speed of the day does not move the way it moves the wall clock.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

/// The instructions b0be392 took for the 10,000-pod replay (its commit message): the
/// figure the redesign's goal halves.
pub const BASELINE_G: f64 = 7.046;
pub const BASELINE_AT: &str = "b0be392";

/// One replay under callgrind.
pub struct Counted {
    /// Instructions executed by the whole process.
    pub instructions: u64,
    /// The replay's output, and its sha256.
    pub output: Vec<u8>,
    pub sha256: String,
    /// How long the run under callgrind took, in seconds (callgrind's own slowdown).
    pub wall_s: f64,
    /// callgrind's profile, for `callgrind_annotate`.
    pub profile: PathBuf,
}

/// Replays `trace` with `bin` under callgrind; the output goes to `out`.
pub fn count(bin: &Path, trace: &Path, out: &Path) -> anyhow::Result<Counted> {
    let profile = out.with_extension("callgrind.out");
    let log = out.with_extension("callgrind.log");
    let started = std::time::Instant::now();
    let status = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", profile.display()))
        .arg(format!("--log-file={}", log.display()))
        .arg(bin)
        .arg("replay")
        .arg(trace)
        .args(["-o", "json"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?)
        .stderr(Stdio::null())
        .status()
        .context("running valgrind (installed by `cargo xtask setup`)")?;
    let wall_s = started.elapsed().as_secs_f64();
    let said =
        std::fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
    // 0 is a match and 1 a divergence: both a finished replay whose count stands.
    if !matches!(status.code(), Some(0 | 1)) {
        bail!(
            "podlapse replay under callgrind failed ({status}): {}",
            said.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
        );
    }
    let instructions = collected(&said).with_context(|| {
        format!(
            "no `Collected :` total in callgrind's log {}",
            log.display()
        )
    })?;
    let output = std::fs::read(out).with_context(|| format!("reading {}", out.display()))?;
    Ok(Counted {
        instructions,
        sha256: sha256(&output),
        output,
        wall_s,
        profile,
    })
}

/// callgrind's total of executed instructions: its `==PID== Collected : N` line.
fn collected(log: &str) -> Option<u64> {
    log.lines()
        .find_map(|l| l.split_once("Collected :").map(|(_, n)| n.trim()))
        .and_then(|n| n.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

pub fn sha256(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_total_is_callgrinds_collected_line() {
        let log = "==4242== Callgrind, a call-graph generating cache profiler\n\
                   ==4242== Events    : Ir\n\
                   ==4242== Collected : 7046123456\n\
                   ==4242== I   refs:      7,046,123,456\n";
        assert_eq!(collected(log), Some(7_046_123_456));
        assert_eq!(collected("==1== Events : Ir\n"), None);
    }

    #[test]
    fn the_digest_is_sha256_in_hex() {
        assert_eq!(
            sha256(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
