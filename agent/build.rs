//! Builds the eBPF probes and leaves the object in OUT_DIR, where `src/ebpf/object.rs`
//! embeds it: a `podlapse` binary copied alone to a node carries its probes.
//!
//! The probes build for `bpfel-unknown-none` with `-Z build-std=core` (RUSTC_BOOTSTRAP on
//! stable) and link with bpf-linker (`cargo xtask setup` installs it). They build into the
//! same target directory `cargo xtask build-ebpf` uses, not into OUT_DIR, so the debug,
//! release and clippy builds of podlapse share one probes build.
//!
//! `PODLAPSE_PROBES_OBJECT=<path>` embeds a prebuilt object instead (a packager's build
//! with no bpf-linker).

#[path = "../agent-ebpf/probes_build.rs"]
mod probes_build;

use std::env;
use std::path::{Path, PathBuf};

const OBJECT_NAME: &str = "podlapse-probes.o";
const PREBUILT_ENV: &str = "PODLAPSE_PROBES_OBJECT";

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join(OBJECT_NAME);
    println!("cargo:rerun-if-env-changed={PREBUILT_ENV}");
    if let Some(prebuilt) = env::var_os(PREBUILT_ENV).filter(|p| !p.is_empty()) {
        let prebuilt = PathBuf::from(prebuilt);
        println!("cargo:rerun-if-changed={}", prebuilt.display());
        if let Err(e) = std::fs::copy(&prebuilt, &out) {
            fail(&format!(
                "{PREBUILT_ENV}={}: cannot read the prebuilt probes object: {e}",
                prebuilt.display()
            ));
        }
        return;
    }

    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let ebpf = manifest.join("..").join("agent-ebpf");
    let probes = ebpf.join("probes");
    for input in [
        probes.join("src"),
        probes.join("Cargo.toml"),
        probes.join("Cargo.lock"),
        probes.join(".cargo").join("config.toml"),
        ebpf.join("common").join("src"),
        ebpf.join("common").join("Cargo.toml"),
    ] {
        println!("cargo:rerun-if-changed={}", input.display());
    }
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");
    println!(
        "cargo:rerun-if-changed={}",
        ebpf.join("probes_build.rs").display()
    );

    let linker = find_bpf_linker();
    let Some(linker) = linker else {
        fail(
            "bpf-linker is not on PATH nor in $CARGO_HOME/bin: the eBPF probes, which podlapse \
             embeds, cannot be linked. Install it with `cargo xtask setup`, or set \
             PODLAPSE_PROBES_OBJECT to a prebuilt podlapse-probes.o",
        );
    };
    // Shared with `cargo xtask build-ebpf`.
    let target_dir = probes_build::target_dir(&probes);
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = probes_build::command(&cargo, &probes, &target_dir);
    cmd.env("CARGO_TARGET_BPFEL_UNKNOWN_NONE_LINKER", linker.as_os_str());
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!(
            "building the eBPF probes in {} failed ({s}); the compiler's messages are above",
            probes.display()
        )),
        Err(e) => fail(&format!("running cargo for the eBPF probes: {e}")),
    }
    let built = probes_build::built_object(&target_dir);
    if let Err(e) = std::fs::copy(&built, &out) {
        fail(&format!(
            "copying {} to {}: {e}",
            built.display(),
            out.display()
        ));
    }
}

fn find_bpf_linker() -> Option<PathBuf> {
    let on_path = env::var_os("PATH")
        .map(|p| env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")));
    on_path
        .into_iter()
        .chain(cargo_home.map(|h| h.join("bin")))
        .map(|dir| dir.join("bpf-linker"))
        .find(|p| p.is_file())
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1);
}
