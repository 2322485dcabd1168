//! `cargo xtask node-vm`: the second node lab, a node of today's shape. Debian trixie in a
//! QEMU guest: cgroup v2 only, systemd as PID 1, containerd 2.x (1.7 beside it for the
//! compatibility suite) with `SystemdCgroup = true`,
//! CNI plugins in /opt/cni/bin, a kernel with BTF: 6.12, or another of the kernels fleets
//! run (`--kernel`). Its registry is the host lab's, reached through ssh's reverse forward
//! of 127.0.0.1:5000 while a command runs.

mod image;
pub mod kernel_btf;
pub mod kernels;
mod machine;
mod paths;
pub(crate) mod recipe;
mod session;
mod ssh;
pub mod suite;

use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::ui::Step;
pub use paths::NodeVmPaths;

#[derive(Debug, clap::Subcommand)]
pub enum NodeVmCmd {
    /// Build the image if its recipe changed, boot the guest, wait for containerd.
    Up {
        /// The kernel to boot: 5.10, 6.1, 6.12 (the modern node's own) or 7.2.
        #[arg(long, default_value = kernels::REFERENCE)]
        kernel: String,
    },
    /// Stop the guest and remove its run directory; --purge removes the image cache too.
    Down {
        #[arg(long)]
        purge: bool,
    },
    /// Whether the guest runs, its kernel, ssh port, image and versions.
    Status,
    /// The kernels the modern node boots: each one's packages, whether they are cached,
    /// and the BTF the agent reads from it (`--btf` extracts it from the package).
    Kernels {
        #[arg(long)]
        btf: bool,
    },
    /// Run a command in the guest (as root, with the host lab's registry on 127.0.0.1:5000).
    Exec {
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Copy files: `cp HOST... :GUEST_DIR` into the guest, `cp :GUEST_PATH HOST_DIR` out.
    Cp {
        #[arg(required = true, num_args = 2..)]
        paths: Vec<String>,
    },
    /// Boot the guest (if down), run the modern-node suite in it, bring back its results.
    Test {
        /// Run only these test targets of the suite (`timeline`, `modern_node`, ...).
        #[arg(long = "only", value_name = "TEST")]
        only: Vec<String>,
        /// The kernel to boot: on 6.12 the full suite runs, on 5.10, 6.1 and 7.2 the
        /// kernel suite (the probes, the kernel's stages of pods, `observe`).
        #[arg(long, default_value = kernels::REFERENCE)]
        kernel: String,
    },
}

pub fn run(cmd: NodeVmCmd) -> anyhow::Result<()> {
    let paths = NodeVmPaths::from_env();
    match cmd {
        NodeVmCmd::Up { kernel } => up(&paths, kernels::by_name(&kernel)?).map(|_| ()),
        NodeVmCmd::Down { purge } => down(&paths, purge),
        NodeVmCmd::Status => status(&paths),
        NodeVmCmd::Kernels { btf } => list_kernels(&paths, btf),
        NodeVmCmd::Exec { command } => {
            let state = require_running(&paths)?;
            let script = ssh::join_args(&command)?;
            let status = state.guest(&paths).exec(&script, registry_forward())?;
            if !status.success() {
                std::process::exit(status.code().unwrap_or(1));
            }
            Ok(())
        }
        NodeVmCmd::Cp { paths: args } => copy(&paths, &args),
        NodeVmCmd::Test { only, kernel } => suite::run(&paths, &only, kernels::by_name(&kernel)?),
    }
}

/// Whether `up` booted the guest, or found it running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Booted {
    Now,
    Already,
}

/// Boots the modern node on `kernel`, or finds it running on that kernel.
pub fn up(
    paths: &NodeVmPaths,
    kernel: &kernels::GuestKernel,
) -> anyhow::Result<(machine::VmState, Booted)> {
    if let Some(state) = machine::VmState::read(paths)?
        && state.is_running(paths)
    {
        if state.kernel != kernel.name {
            bail!(
                "the modern node is up on kernel {}, not {}: `cargo xtask node-vm down` first",
                state.kernel,
                kernel.name
            );
        }
        eprintln!(
            "the modern node is already up (kernel {}, ssh port {}, image {})",
            state.kernel, state.ssh_port, state.image
        );
        return Ok((state, Booted::Already));
    }
    require_host_programs()?;
    let step = Step::start(1, 2, "the modern node's image");
    let image = image::ensure(paths, &|s| step.say(s))?;
    step.done(&recipe::hash());
    let step = Step::start(
        2,
        2,
        &format!("booting the modern node on kernel {kernel} (QEMU, software emulation)"),
    );
    let state = machine::start(paths, &image, &recipe::hash(), kernel)?;
    step.done(&format!(
        "up in {:.0} s, ssh on 127.0.0.1:{}",
        state.boot_seconds, state.ssh_port
    ));
    Ok((state, Booted::Now))
}

/// Puts `from` at `to` for staging into the guest: a hard link where the file system
/// allows (the binaries are large), else a copy.
pub fn place(from: &std::path::Path, to: PathBuf) -> anyhow::Result<()> {
    std::fs::hard_link(from, &to)
        .or_else(|_| std::fs::copy(from, &to).map(|_| ()))
        .with_context(|| format!("staging {} as {}", from.display(), to.display()))
}

/// Runs `command` in the modern node booted on `kernel`, with the host directory `stage`
/// copied in as `/opt/<its name>`, and brings the guest path `result` back into
/// `host_dir`: boots the node for it when it is down and stops it after, and leaves
/// nothing of the stage behind.
pub fn run_staged(
    kernel: &kernels::GuestKernel,
    stage: &std::path::Path,
    command: &[String],
    result: &str,
    host_dir: &std::path::Path,
) -> anyhow::Result<()> {
    let name = stage
        .file_name()
        .with_context(|| format!("{}: not a directory to stage", stage.display()))?
        .to_string_lossy()
        .into_owned();
    let paths = NodeVmPaths::from_env();
    let (state, booted) = up(&paths, kernel)?;
    let guest = state.guest(&paths);
    let in_guest = format!("/opt/{}", shlex::try_quote(&name)?);
    let run = || -> anyhow::Result<()> {
        guest.check(&format!("rm -rf {in_guest}"))?;
        guest.copy_in(&[stage.to_path_buf()], "/opt")?;
        // The lab's registry, when it is up, for a command that pulls its images.
        let status = guest.exec(&ssh::join_args(command)?, registry_forward())?;
        if !status.success() {
            bail!(
                "in the modern node on kernel {kernel}, `{}` failed ({status})",
                command.join(" ")
            );
        }
        guest.copy_out(result, host_dir)
    };
    let ran = run();
    let cleaned = guest.check(&format!("rm -rf {in_guest}"));
    if booted == Booted::Now {
        down(&paths, false)?;
    }
    ran?;
    cleaned.map(|_| ())
}

pub fn down(paths: &NodeVmPaths, purge: bool) -> anyhow::Result<()> {
    let was = machine::stop(paths)?;
    let left = machine::leftover_qemus(paths);
    if !left.is_empty() {
        bail!("QEMU processes of the modern node are still running: {left:?}");
    }
    if purge && paths.root.exists() {
        std::fs::remove_dir_all(&paths.root)
            .with_context(|| format!("removing {}", paths.root.display()))?;
    }
    eprintln!(
        "{}{}",
        if was {
            "the modern node stopped; its run directory is removed"
        } else {
            "the modern node was not running; nothing of a run is left"
        },
        if purge { ", and the image cache" } else { "" }
    );
    Ok(())
}

fn status(paths: &NodeVmPaths) -> anyhow::Result<()> {
    let hash = recipe::hash();
    let image = paths.image(&hash);
    println!(
        "image      {} ({})",
        hash,
        if image.ready_marker().exists() {
            "built"
        } else {
            "not built; `up` builds it"
        }
    );
    if let Ok(v) = std::fs::read_to_string(image.versions()) {
        for line in v.lines() {
            println!("           {line}");
        }
    }
    for (name, why) in image::missing_kernels(&image) {
        println!("           kernel {name} not in the image: {why}");
    }
    match machine::VmState::read(paths)? {
        Some(state) if state.is_running(paths) => {
            println!("guest      running, QEMU pid {}", state.pid);
            println!("kernel     {}", state.kernel);
            println!("ssh        127.0.0.1:{}", state.ssh_port);
            println!("console    {}", paths.console_log().display());
            println!("booted in  {:.1} s", state.boot_seconds);
        }
        Some(_) => println!("guest      not running (a stale run directory; `down` removes it)"),
        None => println!("guest      down"),
    }
    Ok(())
}

fn list_kernels(paths: &NodeVmPaths, btf: bool) -> anyhow::Result<()> {
    let image = paths.image(&recipe::hash());
    let missing = image::missing_kernels(&image);
    for k in kernels::KERNELS {
        let debs: Vec<&xtask::debs::Deb> = k.debs().collect();
        let cached = xtask::debs::cached(&debs.iter().map(|d| **d).collect::<Vec<_>>());
        println!(
            "{:<5} {:<28} {}{}",
            k.name,
            k.release,
            k.fleets,
            if k.is_reference() {
                " (the modern node's own: the full suite)"
            } else {
                ""
            }
        );
        for d in &debs {
            println!("      {} from {}", d.spec(), d.suite);
        }
        println!(
            "      packages {}; image {}",
            if cached { "cached" } else { "not cached" },
            if image.kernel(k.name).is_file() {
                "has it".to_string()
            } else if let Some((_, why)) = missing.iter().find(|(n, _)| n == k.name) {
                format!("lacks it: {why}")
            } else {
                "not built".to_string()
            }
        );
        if btf {
            let path = kernel_btf::vmlinux_btf(k, &|s| eprintln!("kernel {}: {s}", k.name))?;
            let data = std::fs::read(&path)?;
            let hdr_len = data
                .get(4..8)
                .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            println!(
                "      BTF {} ({} bytes, a {hdr_len}-byte header)",
                path.display(),
                data.len()
            );
        }
    }
    Ok(())
}

fn require_running(paths: &NodeVmPaths) -> anyhow::Result<machine::VmState> {
    match machine::VmState::read(paths)? {
        Some(state) if state.is_running(paths) => Ok(state),
        _ => bail!("the modern node is not up: run `cargo xtask node-vm up`"),
    }
}

/// The host lab's registry port, forwarded into the guest when the lab is up.
fn registry_forward() -> Option<u16> {
    let lab = xtask::lab::LabPaths::from_env();
    lab.state_file().exists().then(suite::registry_port)
}

fn copy(paths: &NodeVmPaths, args: &[String]) -> anyhow::Result<()> {
    let state = require_running(paths)?;
    let guest = state.guest(paths);
    let (sources, dest) = args.split_at(args.len() - 1);
    let dest = &dest[0];
    match (dest.strip_prefix(':'), sources) {
        (Some(guest_dir), _) => {
            if let Some(bad) = sources.iter().find(|s| s.starts_with(':')) {
                bail!("cp {bad} {dest}: copy between two guest paths with exec, not cp");
            }
            let sources: Vec<PathBuf> = sources.iter().map(PathBuf::from).collect();
            guest.copy_in(&sources, guest_dir)
        }
        (None, [one]) if one.starts_with(':') => guest.copy_out(&one[1..], &PathBuf::from(dest)),
        (None, _) => bail!(
            "cp: mark the guest side with a leading ':' (cp HOST... :GUEST_DIR, or cp :GUEST_PATH HOST_DIR)"
        ),
    }
}

fn require_host_programs() -> anyhow::Result<()> {
    let missing: Vec<&str> = [
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("debootstrap", "debootstrap"),
        ("mkfs.ext4", "e2fsprogs"),
        ("ssh", "openssh-client"),
        ("ssh-keygen", "openssh-client"),
    ]
    .iter()
    .filter(|(prog, _)| xtask::lab::find_program(prog).is_none())
    .map(|(_, pkg)| *pkg)
    .collect();
    if !missing.is_empty() {
        bail!(
            "the modern node needs the packages {}: run `cargo xtask setup`",
            missing.join(", ")
        );
    }
    Ok(())
}
