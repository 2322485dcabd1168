//! `cargo xtask setup`: check every prerequisite, install what is missing (as root on
//! Debian), and check the kernel features podlapse uses. Idempotent; seconds when ready.

use std::fmt;
use std::path::Path;
use std::process::{Command, Stdio};

use xtask::{PERFETTO_PYTHON_DIR, PERFETTO_PYTHON_PACKAGES};

use crate::workspace;

/// Debian packages, with what each is for.
pub const PACKAGES: &[(&str, &str)] = &[
    ("containerd", "CRI runtime"),
    ("runc", "OCI runtime"),
    ("containernetworking-plugins", "CNI plugins in /usr/lib/cni"),
    ("docker-registry", "local image registry"),
    ("busybox-static", "the lab's images"),
    ("umoci", "building OCI images offline"),
    ("skopeo", "pushing images to the registry"),
    ("protobuf-compiler", "protoc for the CRI protos"),
    ("iproute2", "lab network teardown"),
    ("iptables", "CNI bridge and portmap rules"),
    ("libcap2-bin", "capsh: the eBPF test without BPF privileges"),
    ("nftables", "removing the nat table CNI leaves behind"),
    ("prometheus", "promtool checks the /metrics exposition"),
    ("llvm-22-dev", "bpf-linker"),
    ("libpolly-22-dev", "bpf-linker"),
    ("libzstd-dev", "bpf-linker"),
    ("libxml2-dev", "bpf-linker"),
    ("qemu-system-x86", "the modern node's guest (node-vm)"),
    ("debootstrap", "the modern node's root file system"),
    ("e2fsprogs", "the modern node's disk (mkfs.ext4 -d)"),
    ("openssh-client", "reaching the modern node's guest"),
    (
        "valgrind",
        "benchmark 5 counts the replay's instructions (callgrind)",
    ),
];

/// Debian bookworm's QEMU (7.2) would replace the machine's qemu-utils from
/// bookworm-backports (10.0): where that is installed, QEMU (and debootstrap, for trixie)
/// comes from backports too. `-t` makes apt take their dependencies from there as well.
const BACKPORTS: &str = "bookworm-backports";
const BACKPORTS_SOURCE: &str = "deb http://deb.debian.org/debian bookworm-backports main\n";

/// bpf-linker's version, pinned so every machine links the probes the same way.
const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

/// Tracepoints the probes attach to (group, event).
pub const TRACEPOINTS: &[(&str, &str)] = &[
    ("sched", "sched_process_exec"),
    ("sched", "sched_process_exit"),
    ("cgroup", "cgroup_mkdir"),
    ("cgroup", "cgroup_rmdir"),
    ("cgroup", "cgroup_attach_task"),
    ("syscalls", "sys_enter_unshare"),
    ("syscalls", "sys_exit_unshare"),
    ("syscalls", "sys_enter_setns"),
    ("syscalls", "sys_exit_setns"),
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Present,
    InstalledNow,
    Failed(String),
    Missing(String),
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            State::Present => f.write_str("present"),
            State::InstalledNow => f.write_str("installed now"),
            State::Failed(why) => write!(f, "FAILED: {why}"),
            State::Missing(why) => write!(f, "MISSING: {why}"),
        }
    }
}

pub struct Row {
    pub kind: &'static str,
    pub name: String,
    pub purpose: String,
    pub state: State,
}

pub struct Report {
    pub rows: Vec<Row>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.rows
            .iter()
            .all(|r| matches!(r.state, State::Present | State::InstalledNow))
    }

    pub fn print(&self) {
        let w = self.rows.iter().map(|r| r.name.len()).max().unwrap_or(10);
        println!("{:<10} {:<w$}  {:<42} state", "kind", "prerequisite", "for");
        for r in &self.rows {
            println!(
                "{:<10} {:<w$}  {:<42} {}",
                r.kind, r.name, r.purpose, r.state
            );
        }
    }
}

fn run_ok(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn output(cmd: &mut Command) -> Result<String, String> {
    match cmd.output() {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).into_owned()),
        Ok(o) => Err(last_line(&String::from_utf8_lossy(&o.stderr))),
        Err(e) => Err(e.to_string()),
    }
}

fn last_line(s: &str) -> String {
    s.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no output")
        .trim()
        .to_string()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn is_debian() -> bool {
    Path::new("/etc/debian_version").exists() && Path::new("/usr/bin/apt-get").exists()
}

fn package_installed(name: &str) -> bool {
    output(Command::new("dpkg-query").args(["-W", "-f=${Status}", name]))
        .is_ok_and(|s| s.trim() == "install ok installed")
}

/// Checks everything; installs what is missing when `install` and able to.
pub fn run(install: bool, progress: &dyn Fn(&str)) -> Report {
    let can_install = install && is_root() && is_debian();
    let cannot_why = if !is_root() {
        "not root, cannot install"
    } else if !is_debian() {
        "not a Debian system, cannot install"
    } else {
        "install with: cargo xtask setup"
    };
    let mut rows = Vec::new();

    let missing: Vec<&str> = PACKAGES
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| !package_installed(p))
        .collect();
    let mut apt_error = None;
    if !missing.is_empty() && can_install {
        progress(&format!("installing {}", missing.join(" ")));
        apt_error = apt_install(&missing).err();
    }
    for (pkg, purpose) in PACKAGES {
        let state = if !missing.contains(pkg) {
            State::Present
        } else if !can_install {
            State::Missing(format!("apt-get install {pkg} ({cannot_why})"))
        } else if package_installed(pkg) {
            State::InstalledNow
        } else {
            State::Failed(
                apt_error
                    .clone()
                    .unwrap_or_else(|| "apt-get did not install it".into()),
            )
        };
        rows.push(Row {
            kind: "package",
            name: (*pkg).to_string(),
            purpose: (*purpose).to_string(),
            state,
        });
    }

    rows.push(Row {
        kind: "rust",
        name: "rust-src".into(),
        purpose: "building the probes (-Z build-std)".into(),
        state: rust_src(can_install, cannot_why, progress),
    });
    rows.push(Row {
        kind: "rust",
        name: format!("bpf-linker {BPF_LINKER_VERSION}"),
        purpose: "linking the probes (LLVM 22)".into(),
        state: bpf_linker(can_install, cannot_why, progress),
    });
    rows.push(Row {
        kind: "runtime",
        name: format!(
            "{} {}",
            xtask::debs::CONTAINERD.spec(),
            xtask::debs::RUNC.spec()
        ),
        purpose: "the labs' containerd 2.x and runc 1.3 (Debian sid)".into(),
        state: debs(can_install, cannot_why, progress),
    });
    rows.push(Row {
        kind: "tool",
        name: "protoc".into(),
        purpose: "CRI protos (k8s-cri build)".into(),
        state: match output(Command::new("protoc").arg("--version")) {
            Ok(_) => State::Present,
            Err(e) => State::Missing(format!("protoc --version: {e}")),
        },
    });
    rows.push(Row {
        kind: "python",
        name: PERFETTO_PYTHON_PACKAGES.join(" "),
        purpose: "Perfetto's trace definitions (.pftrace test)".into(),
        state: perfetto_python(install, progress),
    });
    rows.extend(kernel_features(can_install));
    Report { rows }
}

/// Perfetto's Python definitions, in a folder of the workspace's own (any user can
/// install there, so this needs neither root nor Debian).
fn perfetto_python(install: bool, progress: &dyn Fn(&str)) -> State {
    let dir = crate::workspace::root().join(PERFETTO_PYTHON_DIR);
    let import = || {
        run_ok(
            Command::new("python3")
                .args([
                    "-c",
                    "from perfetto.protos.perfetto.trace import perfetto_trace_pb2",
                ])
                .env("PYTHONPATH", &dir),
        )
    };
    let pinned = || {
        PERFETTO_PYTHON_PACKAGES.iter().all(|p| {
            let (name, version) = p.split_once("==").unwrap_or((p, ""));
            dir.join(format!("{name}-{version}.dist-info")).is_dir()
        })
    };
    if pinned() && import() {
        return State::Present;
    }
    if !install {
        return State::Missing(format!(
            "python3 -m pip install --target {} {}",
            dir.display(),
            PERFETTO_PYTHON_PACKAGES.join(" ")
        ));
    }
    progress("installing Perfetto's Python trace definitions from PyPI");
    // A fresh folder each time, so no other version is left beside the pinned ones.
    let _ = std::fs::remove_dir_all(&dir);
    let installed = output(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(["--no-input", "--target"])
            .arg(&dir)
            .args(PERFETTO_PYTHON_PACKAGES)
            .env("PIP_ROOT_USER_ACTION", "ignore")
            .stdin(Stdio::null()),
    );
    match installed {
        Ok(_) if pinned() && import() => State::InstalledNow,
        Ok(_) => State::Failed(format!(
            "pip installed into {} but the definitions do not import",
            dir.display()
        )),
        Err(e) => State::Failed(format!("pip install: {e}")),
    }
}

fn apt_install(pkgs: &[&str]) -> Result<(), String> {
    let from_backports = package_version("qemu-utils").is_some_and(|v| v.contains("~bpo12"));
    // debootstrap too, so that trixie is bootstrapped by the version checked here.
    let (qemu, rest): (Vec<&str>, Vec<&str>) = pkgs
        .iter()
        .partition(|p| from_backports && (p.starts_with("qemu-") || **p == "debootstrap"));
    if !rest.is_empty() {
        apt(&[], &rest)?;
    }
    if !qemu.is_empty() {
        // A sources list of its own for this one install; the system's stays as it is.
        let list = std::env::temp_dir().join("podlapse-backports.list");
        std::fs::write(&list, BACKPORTS_SOURCE)
            .map_err(|e| format!("writing {}: {e}", list.display()))?;
        let source = format!("Dir::Etc::SourceList={}", list.display());
        let result = apt(
            &[
                "-o",
                &source,
                "-o",
                "APT::Sandbox::User=root",
                "-t",
                BACKPORTS,
            ],
            &qemu,
        );
        let _ = std::fs::remove_file(&list);
        result?;
    }
    Ok(())
}

fn package_version(name: &str) -> Option<String> {
    output(Command::new("dpkg-query").args(["-W", "-f=${Version}", name]))
        .ok()
        .filter(|v| !v.trim().is_empty())
}

fn apt(options: &[&str], pkgs: &[&str]) -> Result<(), String> {
    let env = [("DEBIAN_FRONTEND", "noninteractive")];
    let update = Command::new("apt-get")
        .args(options)
        .args(["update", "-q"])
        .envs(env)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("apt-get update: {e}"))?;
    if !update.status.success() {
        return Err(format!(
            "apt-get update: {}",
            last_line(&String::from_utf8_lossy(&update.stderr))
        ));
    }
    let out = Command::new("apt-get")
        .args(options)
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(pkgs)
        .envs(env)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("apt-get install: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "apt-get install {}: {}",
            pkgs.join(" "),
            last_line(&String::from_utf8_lossy(&out.stderr))
        ))
    }
}

/// The pinned runtime packages, downloaded into podlapse's package cache (not installed:
/// the labs unpack them where they run).
fn debs(can_install: bool, cannot_why: &str, progress: &dyn Fn(&str)) -> State {
    use xtask::debs::{CONTAINERD, RUNC, cache_dir, cached, fetch};
    let debs = [CONTAINERD, RUNC];
    if cached(&debs) {
        return State::Present;
    }
    if !can_install {
        return State::Missing(format!(
            "download into {} ({cannot_why})",
            cache_dir().display()
        ));
    }
    match fetch(&debs, progress) {
        Ok(_) => State::InstalledNow,
        Err(e) => State::Failed(e.to_string()),
    }
}

fn rust_src(can_install: bool, cannot_why: &str, progress: &dyn Fn(&str)) -> State {
    let has = || {
        output(Command::new("rustup").args(["component", "list", "--installed"]))
            .is_ok_and(|s| s.lines().any(|l| l.starts_with("rust-src")))
    };
    if has() {
        return State::Present;
    }
    if !can_install {
        return State::Missing(format!("rustup component add rust-src ({cannot_why})"));
    }
    progress("rustup component add rust-src");
    match output(Command::new("rustup").args(["component", "add", "rust-src"])) {
        Ok(_) if has() => State::InstalledNow,
        Ok(_) => State::Failed("rustup did not add rust-src".into()),
        Err(e) => State::Failed(e),
    }
}

fn bpf_linker(can_install: bool, cannot_why: &str, progress: &dyn Fn(&str)) -> State {
    let bin = workspace::cargo_bin("bpf-linker", ".cargo");
    let version_ok = || {
        output(Command::new(&bin).arg("--version")).is_ok_and(|v| v.contains(BPF_LINKER_VERSION))
    };
    if version_ok() {
        return State::Present;
    }
    if !can_install {
        return State::Missing(format!(
            "LLVM_PREFIX={LLVM_PREFIX} cargo install bpf-linker --version {BPF_LINKER_VERSION} --no-default-features --features llvm-22 ({cannot_why})"
        ));
    }
    progress("building bpf-linker against LLVM 22 (a few minutes)");
    let out = Command::new("cargo")
        .args([
            "install",
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
            "--no-default-features",
            "--features",
            "llvm-22",
        ])
        .env("LLVM_PREFIX", LLVM_PREFIX)
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() && version_ok() => State::InstalledNow,
        Ok(o) => State::Failed(last_line(&String::from_utf8_lossy(&o.stderr))),
        Err(e) => State::Failed(format!("cargo install: {e}")),
    }
}

const TRACEFS: &str = "/sys/kernel/tracing";

fn kernel_features(install: bool) -> Vec<Row> {
    let mut rows = Vec::new();
    let row = |name: String, purpose: &str, state: State| Row {
        kind: "kernel",
        name,
        purpose: purpose.to_string(),
        state,
    };
    rows.push(row(
        "bpf syscall".into(),
        "loading the probes",
        bpf_syscall(),
    ));
    let tracefs = tracefs(install);
    let tracefs_ok = matches!(tracefs, State::Present | State::InstalledNow);
    rows.push(row(TRACEFS.into(), "tracepoint ids and formats", tracefs));
    rows.push(row(
        "BTF".into(),
        "kernel struct offsets",
        if Path::new("/sys/kernel/btf/vmlinux").is_file() {
            State::Present
        } else {
            State::Missing("/sys/kernel/btf/vmlinux is absent (kernel built without BTF)".into())
        },
    ));
    for (group, event) in TRACEPOINTS {
        let id = Path::new(TRACEFS)
            .join("events")
            .join(group)
            .join(event)
            .join("id");
        let state = if !tracefs_ok {
            State::Missing("tracefs is not mounted".into())
        } else if id.is_file() {
            State::Present
        } else {
            State::Missing(format!("{} does not exist", id.display()))
        };
        rows.push(row(format!("{group}:{event}"), "tracepoint", state));
    }
    rows
}

/// Creates and closes a one-entry array map: proof the bpf syscall is allowed.
fn bpf_syscall() -> State {
    #[repr(C)]
    struct MapCreate {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
    }
    const BPF_MAP_CREATE: libc::c_long = 0;
    const BPF_MAP_TYPE_ARRAY: u32 = 2;
    let mut attr = [0u8; 128];
    let head = MapCreate {
        map_type: BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: 4,
        max_entries: 1,
    };
    // SAFETY: `attr` is a zeroed buffer larger than the header; the copy stays within it.
    unsafe {
        std::ptr::copy_nonoverlapping(
            &head as *const MapCreate as *const u8,
            attr.as_mut_ptr(),
            std::mem::size_of::<MapCreate>(),
        );
    }
    // SAFETY: bpf(2) with a valid attr pointer and its size; the returned fd is closed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            attr.as_ptr(),
            attr.len() as libc::c_uint,
        )
    };
    if fd >= 0 {
        // SAFETY: fd was just returned by the kernel and is owned here.
        unsafe { libc::close(fd as libc::c_int) };
        State::Present
    } else {
        State::Missing(format!(
            "bpf(BPF_MAP_CREATE): {}",
            std::io::Error::last_os_error()
        ))
    }
}

/// tracefs, mounted now if the kernel has it but nobody mounted it.
fn tracefs(mount: bool) -> State {
    let events = Path::new(TRACEFS).join("events");
    if events.is_dir() {
        return State::Present;
    }
    if mount
        && run_ok(Command::new("mount").args(["-t", "tracefs", "tracefs", TRACEFS]))
        && events.is_dir()
    {
        return State::InstalledNow;
    }
    State::Missing(format!(
        "{TRACEFS} is not mounted (mount -t tracefs tracefs {TRACEFS})"
    ))
}
