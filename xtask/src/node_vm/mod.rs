//! `cargo xtask node-vm`: the second node lab, a node of today's shape. Debian trixie in a
//! QEMU guest: cgroup v2 only, systemd as PID 1, containerd 2.x (1.7 beside it for the
//! compatibility suite) with `SystemdCgroup = true`,
//! CNI plugins in /opt/cni/bin, a kernel with BTF. Its registry is the host lab's, reached
//! through ssh's reverse forward of 127.0.0.1:5000 while a command runs.

mod image;
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
    Up,
    /// Stop the guest and remove its run directory; --purge removes the image cache too.
    Down {
        #[arg(long)]
        purge: bool,
    },
    /// Whether the guest runs, its ssh port, image and versions.
    Status,
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
    },
}

pub fn run(cmd: NodeVmCmd) -> anyhow::Result<()> {
    let paths = NodeVmPaths::from_env();
    match cmd {
        NodeVmCmd::Up => up(&paths).map(|_| ()),
        NodeVmCmd::Down { purge } => down(&paths, purge),
        NodeVmCmd::Status => status(&paths),
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
        NodeVmCmd::Test { only } => suite::run(&paths, &only),
    }
}

/// Whether `up` booted the guest, or found it running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Booted {
    Now,
    Already,
}

pub fn up(paths: &NodeVmPaths) -> anyhow::Result<(machine::VmState, Booted)> {
    if let Some(state) = machine::VmState::read(paths)?
        && state.is_running(paths)
    {
        eprintln!(
            "the modern node is already up (ssh port {}, image {})",
            state.ssh_port, state.image
        );
        return Ok((state, Booted::Already));
    }
    require_host_programs()?;
    let step = Step::start(1, 2, "the modern node's image");
    let image = image::ensure(paths, &|s| step.say(s))?;
    step.done(&recipe::hash());
    let step = Step::start(2, 2, "booting the modern node (QEMU, software emulation)");
    let state = machine::start(paths, &image, &recipe::hash())?;
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

/// Runs `command` in the modern node with the host directory `stage` copied in as
/// `/opt/<its name>`, and brings the guest path `result` back into `host_dir`: boots the
/// node for it when it is down and stops it after, and leaves nothing of the stage behind.
pub fn run_staged(
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
    let (state, booted) = up(&paths)?;
    let guest = state.guest(&paths);
    let in_guest = format!("/opt/{}", shlex::try_quote(&name)?);
    let run = || -> anyhow::Result<()> {
        guest.check(&format!("rm -rf {in_guest}"))?;
        guest.copy_in(&[stage.to_path_buf()], "/opt")?;
        // The lab's registry, when it is up, for a command that pulls its images.
        let status = guest.exec(&ssh::join_args(command)?, registry_forward())?;
        if !status.success() {
            bail!(
                "in the modern node, `{}` failed ({status})",
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
    match machine::VmState::read(paths)? {
        Some(state) if state.is_running(paths) => {
            println!("guest      running, QEMU pid {}", state.pid);
            println!("ssh        127.0.0.1:{}", state.ssh_port);
            println!("console    {}", paths.console_log().display());
            println!("booted in  {:.1} s", state.boot_seconds);
        }
        Some(_) => println!("guest      not running (a stale run directory; `down` removes it)"),
        None => println!("guest      down"),
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
