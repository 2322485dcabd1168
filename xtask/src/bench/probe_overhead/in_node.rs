//! Benchmark 4 in the modern node, and benchmark 13 on each other kernel it boots: this
//! xtask binary, podlapse's release build and the host's busybox (the same exec workload
//! on every kernel) go into the guest, `xtask bench-probe-overhead` measures there, and
//! what it measured comes back as JSON for the host to render beside its own.

use std::path::Path;

use anyhow::Context;
use serde::de::DeserializeOwned;

use super::Measured;
use crate::node_vm::kernels::{self, GuestKernel};
use crate::node_vm::place;

/// The staged directory's name: `/opt/<it>` in the guest.
const STAGE: &str = "podlapse-bench";
/// The workload's binary on the host, taken in when it is there.
const BUSYBOX: &str = "/bin/busybox";
const RESULT: &str = "measured.json";
/// The guest's containerd 2.x, as its systemd unit runs it.
use crate::node_vm::recipe::{CONTAINERD_SOCKET as GUEST_CRI, REFERENCE_UNIT};

/// Benchmark 4's measurement in the modern node on its own kernel (booting it for the
/// run when it is down), `cap` capping every series' rounds as on the host.
pub(super) fn measure(bin: &Path, dir: &Path, cap: Option<usize>) -> anyhow::Result<Measured> {
    let kernel = kernels::by_name(kernels::REFERENCE)?;
    let extra = cap
        .map(|cap| vec!["--cap".to_string(), cap.to_string()])
        .unwrap_or_default();
    let mut measured: Measured = run_in_guest(bin, dir, kernel, &extra)?;
    // The modern node boots under QEMU's software emulation (`node_vm::machine`).
    measured.emulated = true;
    Ok(measured)
}

/// `xtask bench-probe-overhead` in the modern node booted on `kernel`, with `extra`
/// arguments and the lines on pods on the guest's own containerd; what it wrote, read as
/// `T`.
pub(super) fn run_in_guest<T: DeserializeOwned>(
    bin: &Path,
    dir: &Path,
    kernel: &GuestKernel,
    extra: &[String],
) -> anyhow::Result<T> {
    let node_dir = dir.join(format!("probe-overhead-node-{}", kernel.name));
    let stage = node_dir.join(STAGE);
    if stage.exists() {
        std::fs::remove_dir_all(&stage).with_context(|| format!("removing {}", stage.display()))?;
    }
    std::fs::create_dir_all(&stage).with_context(|| format!("creating {}", stage.display()))?;
    let xtask = std::env::current_exe().context("finding this xtask binary")?;
    place(&xtask, stage.join("xtask"))?;
    place(bin, stage.join("podlapse"))?;
    let busybox = Path::new(BUSYBOX).is_file();
    if busybox {
        place(Path::new(BUSYBOX), stage.join("busybox"))?;
    }

    let guest = format!("/opt/{STAGE}");
    let mut command: Vec<String> = [
        format!("{guest}/xtask"),
        "bench-probe-overhead".into(),
        "--podlapse".into(),
        format!("{guest}/podlapse"),
        "--dir".into(),
        format!("{guest}/work"),
        "--out".into(),
        format!("{guest}/{RESULT}"),
    ]
    .into();
    if busybox {
        command.extend(["--exec".into(), format!("{guest}/busybox")]);
    }
    command.extend(extra.iter().cloned());
    // The lines on pods, on the guest's own containerd (systemd's service, the lab's
    // registry forwarded for the image).
    command.extend([
        "--pods-cri".into(),
        GUEST_CRI.into(),
        "--pods-runtime-cgroup".into(),
        format!("/system.slice/{REFERENCE_UNIT}"),
    ]);
    let back = node_dir.join("result");
    if back.exists() {
        std::fs::remove_dir_all(&back).with_context(|| format!("removing {}", back.display()))?;
    }
    crate::node_vm::run_staged(
        kernel,
        &stage,
        &command,
        &format!("{guest}/{RESULT}"),
        &back,
    )?;
    let path = back.join(RESULT);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not what the run on kernel {kernel} measures",
            path.display()
        )
    })
}
