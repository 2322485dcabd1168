//! `cargo xtask fuzz [TARGET] [--seconds N]`: coverage-guided fuzzing (cargo-fuzz,
//! libFuzzer with AddressSanitizer) of podlapse's readers of untrusted input, the targets
//! in `agent/fuzz/fuzz_targets/`. Each run starts from the committed seeds
//! (`agent/fuzz/seeds/<target>/`) and the inputs earlier runs found
//! (`agent/fuzz/corpus/<target>/`, not committed). A crash leaves its input in
//! `agent/fuzz/artifacts/<target>/` and fails the command; turn it into a regression test
//! before fixing it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};

use crate::workspace;

pub const TARGETS: [&str; 4] = [
    "manifest_reader",
    "trace_reader",
    "api_request",
    "ebpf_event",
];
/// cargo-fuzz's version, pinned so every machine fuzzes the same way.
const CARGO_FUZZ_VERSION: &str = "0.13.2";
/// libFuzzer's per-input limit: an input slower than this is reported as a hang.
const INPUT_TIMEOUT_S: u32 = 10;
/// Seeds cut from the committed traces are at most this long: libFuzzer's inputs grow
/// from its seeds, and megabyte inputs would make each execution slow.
const TRACE_SEED_BYTES: usize = 24 * 1024;

#[derive(Debug, Clone, clap::Args)]
pub struct FuzzArgs {
    /// One target (default: all): manifest_reader, trace_reader, api_request, ebpf_event.
    pub target: Option<String>,
    /// How long each target runs (0: fuzz nothing, e.g. with --refresh-seeds).
    #[arg(long, default_value_t = 60, value_name = "N")]
    pub seconds: u64,
    /// Rewrite the committed seeds from examples/, traces/ and the traces' kernel records,
    /// then fuzz.
    #[arg(long)]
    pub refresh_seeds: bool,
}

/// What one target's run did.
#[derive(Debug, Clone)]
pub struct FuzzRun {
    pub target: String,
    pub executions: u64,
    pub seconds: f64,
    /// Inputs in the working corpus at the end.
    pub corpus: usize,
    /// The input that crashed it, if one did.
    pub crash: Option<PathBuf>,
    pub log: PathBuf,
}

pub fn run(args: &FuzzArgs) -> anyhow::Result<()> {
    if args.refresh_seeds {
        refresh_seeds()?;
    }
    let targets = select(args.target.as_deref())?;
    if args.seconds == 0 {
        return Ok(());
    }
    ensure_cargo_fuzz()?;
    if targets.len() > 1 {
        build_all()?;
    }
    let mut crashed = Vec::new();
    for target in targets {
        let r = fuzz(target, args.seconds, Build::IfChanged)?;
        println!("{}", summary(&r));
        if let Some(input) = &r.crash {
            crashed.push(format!("{target} ({})", input.display()));
        }
    }
    if !crashed.is_empty() {
        bail!(
            "crashed: {}; reproduce with `RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir agent/fuzz TARGET INPUT`",
            crashed.join(", ")
        );
    }
    Ok(())
}

pub fn summary(r: &FuzzRun) -> String {
    format!(
        "fuzz: {}: {} executions in {:.0} s ({:.0}/s), corpus {}, {}",
        r.target,
        r.executions,
        r.seconds,
        r.executions as f64 / r.seconds.max(0.001),
        r.corpus,
        match &r.crash {
            Some(input) => format!("CRASHED on {} (log {})", input.display(), r.log.display()),
            None => "0 crashes".to_string(),
        }
    )
}

/// The targets `name` picks; an unknown name is an error that lists the known ones.
pub fn select(name: Option<&str>) -> anyhow::Result<Vec<&'static str>> {
    match name {
        None => Ok(TARGETS.to_vec()),
        Some(n) => match TARGETS.iter().find(|t| **t == n) {
            Some(t) => Ok(vec![*t]),
            None => bail!(
                "no fuzz target {n:?}; the targets are {}",
                TARGETS.join(", ")
            ),
        },
    }
}

fn fuzz_dir() -> PathBuf {
    workspace::root().join("agent").join("fuzz")
}

fn cargo_fuzz_bin() -> PathBuf {
    workspace::cargo_bin("cargo-fuzz", "/root/.cargo")
}

/// Installs cargo-fuzz (the pinned version) unless it is there.
pub fn ensure_cargo_fuzz() -> anyhow::Result<()> {
    let has = Command::new(cargo_fuzz_bin())
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(CARGO_FUZZ_VERSION));
    if has {
        return Ok(());
    }
    eprintln!("fuzz: installing cargo-fuzz {CARGO_FUZZ_VERSION}");
    let mut cmd = Command::new("cargo");
    cmd.args([
        "install",
        "cargo-fuzz",
        "--locked",
        "--version",
        CARGO_FUZZ_VERSION,
    ])
    .stdin(Stdio::null());
    workspace::run(&mut cmd, "cargo install cargo-fuzz")
}

/// Builds every target once, with the flags `fuzz` runs them with, so the runs that
/// follow start at once and all fuzz the same build of the code. The first build
/// instruments every dependency and is long (tens of minutes on two cores); later ones
/// rebuild only what changed.
pub fn build_all() -> anyhow::Result<()> {
    ensure_cargo_fuzz()?;
    eprintln!("fuzz: building every target (sanitizer and coverage instrumentation)");
    let mut cmd = Command::new(cargo_fuzz_bin());
    cmd.args(["fuzz", "build", "--fuzz-dir"])
        .arg(fuzz_dir())
        .args(["-O", "--debug-assertions"])
        .current_dir(workspace::root())
        .env("RUSTC_BOOTSTRAP", "1")
        .stdin(Stdio::null());
    workspace::run(&mut cmd, "cargo fuzz build")
}

/// Whether a run builds its target first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// `cargo fuzz run`: rebuilt first if the sources changed.
    IfChanged,
    /// The binary [`build_all`] built, run as it is: the benchmark fuzzes the build it
    /// made before its timer started, whatever happens to the working tree meanwhile.
    Prebuilt,
}

/// Where [`build_all`] puts `target`'s binary.
fn built_binary(target: &str) -> PathBuf {
    fuzz_dir()
        .join("target")
        .join(format!("{}-unknown-linux-gnu", std::env::consts::ARCH))
        .join("release")
        .join(target)
}

/// Runs `target` for `seconds` and reads libFuzzer's final stats.
pub fn fuzz(target: &str, seconds: u64, build: Build) -> anyhow::Result<FuzzRun> {
    let dir = fuzz_dir();
    let corpus = dir.join("corpus").join(target);
    let seeds = dir.join("seeds").join(target);
    let artifacts = dir.join("artifacts").join(target);
    for d in [&corpus, &artifacts] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    if !seeds.is_dir() {
        bail!(
            "{}: no seeds for {target} (run `cargo xtask fuzz --refresh-seeds`)",
            seeds.display()
        );
    }
    let logs = workspace::target_dir().join("fuzz");
    std::fs::create_dir_all(&logs)?;
    let log = logs.join(format!("{target}.log"));
    let mut cmd = match build {
        Build::IfChanged => {
            eprintln!(
                "fuzz: {target}: building, then {seconds} s (log: {})",
                log.display()
            );
            let mut cmd = Command::new(cargo_fuzz_bin());
            cmd.args(["fuzz", "run", "--fuzz-dir"])
                .arg(&dir)
                .args(["-O", "--debug-assertions", target])
                .arg(&corpus)
                .arg(&seeds)
                .arg("--");
            cmd
        }
        Build::Prebuilt => {
            let binary = built_binary(target);
            if !binary.is_file() {
                bail!(
                    "{}: {target} is not built (`cargo xtask fuzz` builds every target)",
                    binary.display()
                );
            }
            eprintln!(
                "fuzz: {target}: {seconds} s of the build made before (log: {})",
                log.display()
            );
            let mut cmd = Command::new(binary);
            cmd.arg(&corpus).arg(&seeds);
            cmd
        }
    };
    let started = Instant::now();
    let out = cmd
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_S}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg("-print_final_stats=1")
        .current_dir(workspace::root())
        // cargo-fuzz's sanitizer flags are nightly-only; the stable toolchain takes them
        // with RUSTC_BOOTSTRAP, as the probes' build does.
        .env("RUSTC_BOOTSTRAP", "1")
        .stdin(Stdio::null())
        .output()
        .context("running cargo fuzz")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&log, &text).with_context(|| format!("writing {}", log.display()))?;
    let stat = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let crash = text
        .lines()
        .find_map(|l| l.split_once("Test unit written to "))
        .map(|(_, path)| PathBuf::from(path.trim()));
    let Some(executions) = stat("stat::number_of_executed_units:") else {
        if crash.is_none() {
            bail!(
                "cargo fuzz run {target} ended ({}) without libFuzzer's stats; see {}",
                out.status,
                log.display()
            );
        }
        return Ok(FuzzRun {
            target: target.to_string(),
            executions: 0,
            seconds: started.elapsed().as_secs_f64(),
            corpus: count(&corpus),
            crash,
            log,
        });
    };
    let fuzz_seconds = stat("stat::average_exec_per_sec:")
        .filter(|r| *r > 0)
        .map_or(seconds as f64, |rate| executions as f64 / rate as f64);
    if !out.status.success() && crash.is_none() {
        bail!(
            "cargo fuzz run {target} failed ({}) with no crashing input; see {}",
            out.status,
            log.display()
        );
    }
    Ok(FuzzRun {
        target: target.to_string(),
        executions,
        seconds: fuzz_seconds,
        corpus: count(&corpus),
        crash,
        log,
    })
}

fn count(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

/// Rewrites the committed seeds: manifests from examples/ and the scenarios' pods (as
/// YAML and as JSON), traces from traces/ (whole when small, else their beginning, which
/// reads as an incomplete trace), the requests podlapse's own commands send the API, and
/// the traces' kernel records in the probes' layout (written by the agent's seed test).
fn refresh_seeds() -> anyhow::Result<()> {
    let root = workspace::root();
    let seeds = fuzz_dir().join("seeds");
    let fresh = |name: &str| -> anyhow::Result<PathBuf> {
        let d = seeds.join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        Ok(d)
    };
    let manifests = fresh("manifest_reader")?;
    for path in files(&root.join("examples"), "yaml")? {
        std::fs::copy(&path, manifests.join(file_name(&path)))?;
    }
    for path in files(&root.join("traces").join("scenarios"), "yaml")? {
        let text = std::fs::read_to_string(&path)?;
        let doc: serde_yaml::Value =
            serde_yaml::from_str(&text).with_context(|| format!("{}: not YAML", path.display()))?;
        let stem = path.file_stem().unwrap_or_default().to_string_lossy();
        for (i, pod) in doc["pods"].as_sequence().into_iter().flatten().enumerate() {
            let json = serde_json::to_string_pretty(pod)?;
            std::fs::write(manifests.join(format!("{stem}-{i}.json")), json)?;
        }
    }
    let traces = fresh("trace_reader")?;
    for path in files(&root.join("traces"), "jsonl")? {
        let text = std::fs::read_to_string(&path)?;
        let mut cut = String::new();
        for line in text.lines() {
            if cut.len() + line.len() + 1 > TRACE_SEED_BYTES {
                break;
            }
            cut.push_str(line);
            cut.push('\n');
        }
        std::fs::write(traces.join(file_name(&path)), cut)?;
    }
    let api = fresh("api_request")?;
    for (name, request) in [
        ("pods", "GET /pods HTTP/1.1\r\nhost: podlapse\r\n\r\n"),
        ("events", "GET /events HTTP/1.1\r\nhost: podlapse\r\n\r\n"),
        (
            "timeline",
            "GET /timeline HTTP/1.1\r\nhost: podlapse\r\n\r\n",
        ),
        (
            "diagnose",
            "GET /diagnose HTTP/1.1\r\nhost: podlapse\r\n\r\n",
        ),
        (
            "two",
            "GET /pods HTTP/1.1\r\nhost: podlapse\r\n\r\nGET /nothing?x=1 HTTP/1.1\r\nhost: podlapse\r\nconnection: close\r\n\r\n",
        ),
        (
            "post",
            "POST /pods HTTP/1.1\r\nhost: podlapse\r\ncontent-length: 4\r\n\r\n{}\r\n",
        ),
        (
            "chunked",
            "PUT /timeline HTTP/1.1\r\nhost: podlapse\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        ),
    ] {
        std::fs::write(api.join(name), request)?;
    }
    let mut cmd = workspace::cargo();
    cmd.args(["test", "--package", "podlapse", "--lib", "ebpf::fuzz_seeds"])
        .env("PODLAPSE_WRITE_FUZZ_SEEDS", "1");
    workspace::run(&mut cmd, "writing the eBPF decoder's seeds")?;
    eprintln!("fuzz: seeds rewritten in {}", seeds.display());
    Ok(())
}

fn files(dir: &Path, ext: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    out.sort();
    Ok(out)
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each package's versions in a Cargo.lock.
    fn locked(text: &str) -> std::collections::BTreeMap<String, Vec<String>> {
        let mut packages: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        let mut name = None;
        for line in text.lines() {
            if let Some(n) = line.strip_prefix("name = ") {
                name = Some(n.trim_matches('"').to_string());
            } else if let (Some(v), Some(n)) = (line.strip_prefix("version = "), name.take()) {
                packages
                    .entry(n)
                    .or_default()
                    .push(v.trim_matches('"').to_string());
            }
        }
        packages
    }

    /// `cargo xtask test` lints the fuzzers in the workspace's target directory, reusing
    /// what it checked for the workspace: only where both locks agree (and the features,
    /// which agent/fuzz/Cargo.toml repeats). A lock that drifts costs every run a second
    /// check of most dependencies.
    #[test]
    fn the_fuzzers_lock_holds_the_workspaces_versions() {
        let root = workspace::root();
        let ws = locked(&std::fs::read_to_string(root.join("Cargo.lock")).unwrap());
        let fuzz = locked(&std::fs::read_to_string(fuzz_dir().join("Cargo.lock")).unwrap());
        let drifted: Vec<String> = fuzz
            .iter()
            .filter_map(|(name, versions)| {
                let theirs = ws.get(name)?;
                versions
                    .iter()
                    .any(|v| !theirs.contains(v))
                    .then(|| format!("{name} {versions:?} (workspace {theirs:?})"))
            })
            .collect();
        assert!(
            drifted.is_empty(),
            "agent/fuzz/Cargo.lock differs from Cargo.lock in {}: copy the workspace's lock \
             over it (`cp Cargo.lock agent/fuzz/Cargo.lock`) and let cargo add the fuzzers' \
             own packages (`cargo metadata --manifest-path agent/fuzz/Cargo.toml`)",
            drifted.join(", ")
        );
        assert!(fuzz.contains_key("libfuzzer-sys"), "{fuzz:?}");
    }

    #[test]
    fn an_unknown_target_is_named_with_the_known_ones() {
        let e = select(Some("yaml")).unwrap_err().to_string();
        assert!(e.contains("\"yaml\"") && e.contains("trace_reader"), "{e}");
        assert_eq!(select(None).unwrap().len(), TARGETS.len());
        assert_eq!(select(Some("ebpf_event")).unwrap(), ["ebpf_event"]);
    }

    #[test]
    fn every_target_has_committed_seeds_and_a_source_file() {
        for t in TARGETS {
            let seeds = fuzz_dir().join("seeds").join(t);
            assert!(count(&seeds) > 0, "{} is empty", seeds.display());
            let src = fuzz_dir().join("fuzz_targets").join(format!("{t}.rs"));
            assert!(src.is_file(), "{}", src.display());
        }
    }
}
