//! Building the modern node's disk image: debootstrap of Debian trixie, the recipe's files,
//! the matrix's kernels, an ext4 image made straight from the directory (`mkfs.ext4 -d`),
//! and each kernel with its initramfs to boot it with. Cached under `images/<recipe
//! hash>`; a changed recipe builds a new image and removes the old ones. A kernel whose
//! packages the registry does not serve is left out and named in the image; the image is
//! built again once the registry serves them.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};

use super::kernels::{self, GuestKernel};
use super::paths::{ImagePaths, NodeVmPaths};
use super::recipe;
use xtask::lab::LabPaths;
use xtask::text::last_lines;

/// The cached image for the current recipe, built first if it is not there.
pub fn ensure(paths: &NodeVmPaths, say: &dyn Fn(&str)) -> anyhow::Result<ImagePaths> {
    let hash = recipe::hash();
    let image = paths.image(&hash);
    if image.ready_marker().exists() {
        let missing = missing_kernels(&image);
        if missing.is_empty() {
            return Ok(image);
        }
        let served: Vec<&str> = missing
            .iter()
            .filter_map(|(name, _)| kernels::by_name(name).ok())
            .filter(|k| k.fetch(say).is_ok())
            .map(|k| k.name)
            .collect();
        if served.is_empty() {
            return Ok(image);
        }
        say(&format!(
            "the registry serves kernel {} now: building the image again with it",
            served.join(", ")
        ));
    }
    let started = Instant::now();
    let partial = paths.images_dir().join(format!("{hash}.partial"));
    if partial.exists() {
        fs::remove_dir_all(&partial)
            .with_context(|| format!("removing the unfinished build {}", partial.display()))?;
    }
    fs::create_dir_all(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let building = ImagePaths::at(partial.clone());
    build(&building, say)?;
    if image.dir.exists() {
        fs::remove_dir_all(&image.dir)?;
    }
    fs::rename(&partial, &image.dir)
        .with_context(|| format!("moving {} into place", partial.display()))?;
    fs::write(image.ready_marker(), format!("{hash}\n"))?;
    remove_other_images(paths, &hash, say);
    say(&format!(
        "image {hash} built in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    Ok(image)
}

/// The matrix's kernels `image` lacks: (name, why).
pub fn missing_kernels(image: &ImagePaths) -> Vec<(String, String)> {
    fs::read_to_string(image.missing_kernels())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(name, why)| (name.to_string(), why.to_string()))
        .collect()
}

/// A kernel of the matrix with its package files: those installed first, then the rest.
type Fetched = (&'static GuestKernel, (Vec<PathBuf>, Vec<PathBuf>));

fn build(image: &ImagePaths, say: &dyn Fn(&str)) -> anyhow::Result<()> {
    // The kernels first: one the registry no longer serves is named and left out, and
    // the others' suites still run.
    let mut fetched: Vec<Fetched> = Vec::new();
    let mut missing = String::new();
    for k in kernels::KERNELS {
        match k.fetch(say) {
            Ok(files) => fetched.push((k, files)),
            Err(e) => {
                say(&format!("kernel {k} left out: {e}"));
                missing.push_str(&format!("{}\t{e}\n", k.name));
            }
        }
    }
    fs::write(image.missing_kernels(), &missing)?;
    let rootfs = image.dir.join("rootfs");
    say(&format!(
        "debootstrap {} ({} packages) from {}",
        recipe::SUITE,
        recipe::PACKAGES.len(),
        recipe::MIRROR
    ));
    let log = image.dir.join("debootstrap.log");
    let status = Command::new("debootstrap")
        .arg("--variant=minbase")
        .arg(format!("--include={}", recipe::PACKAGES.join(",")))
        .args([recipe::SUITE])
        .arg(&rootfs)
        .arg(recipe::MIRROR)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&log)?)
        .stderr(fs::File::create(image.dir.join("debootstrap.err"))?)
        .status()
        .context("running debootstrap (package debootstrap; `cargo xtask setup` installs it)")?;
    if !status.success() {
        let err = fs::read_to_string(image.dir.join("debootstrap.err")).unwrap_or_default();
        let tail = last_lines(&fs::read_to_string(&log).unwrap_or_default(), 15).join("\n");
        bail!(
            "debootstrap of {} failed ({status}):\n{err}{tail}",
            recipe::SUITE
        );
    }
    say(
        "configuring the node: containerd 2.x (and 1.7 aside) with the systemd driver, CNI in /opt/cni/bin, sshd",
    );
    configure(image, &rootfs)?;
    say(&format!(
        "installing kernels {}",
        fetched
            .iter()
            .map(|(k, _)| k.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    install_kernels(&rootfs, &fetched)?;
    write_versions(image, &rootfs, &fetched)?;
    clean_caches(&rootfs)?;
    say("making the ext4 image");
    make_image(image, &rootfs, &fetched)?;
    fs::remove_dir_all(&rootfs).with_context(|| format!("removing {}", rootfs.display()))?;
    Ok(())
}

fn configure(image: &ImagePaths, rootfs: &Path) -> anyhow::Result<()> {
    // trixie's containerd 1.7, kept aside for the compatibility suite, with its own
    // default config edited to the same node shape.
    keep_compat_containerd(rootfs)?;
    // The reference runtime: the pinned containerd 2.x and runc 1.3 over trixie's.
    install_debs(rootfs)?;
    // containerd 2.x: its own default config, edited to today's node shape.
    let default = chroot_output(rootfs, &["containerd", "config", "default"])?;
    let config = edit_config(&default, &recipe::containerd_edits(), "containerd 2.x")?;
    write(rootfs, recipe::CONTAINERD_CONFIG, 0o644, &config)?;

    // Debian's CNI plugins, where today's nodes have them.
    let cni = rootfs.join(recipe::CNI_BIN_DIR.trim_start_matches('/'));
    fs::create_dir_all(&cni)?;
    let debian_cni = rootfs.join(recipe::DEBIAN_CNI_DIR.trim_start_matches('/'));
    for entry in
        fs::read_dir(&debian_cni).with_context(|| format!("listing {}", debian_cni.display()))?
    {
        let name = entry?.file_name();
        let target = Path::new(recipe::DEBIAN_CNI_DIR).join(&name);
        let link = cni.join(&name);
        let _ = fs::remove_file(&link);
        symlink(&target, &link).with_context(|| format!("linking {}", link.display()))?;
    }

    // The key the host logs in with, and the guest's host key the host checks.
    let key = image.ssh_key();
    let _ = fs::remove_file(&key);
    let _ = fs::remove_file(key.with_extension("pub"));
    run(
        Command::new("ssh-keygen")
            .args([
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "podlapse-node-vm",
                "-f",
            ])
            .arg(&key),
        "ssh-keygen",
    )?;
    let authorized = fs::read_to_string(key.with_extension("pub"))?;
    for (path, mode, text) in recipe::files(&authorized) {
        write(rootfs, &path, mode, &text)?;
    }
    let host_key = rootfs.join("etc/ssh/ssh_host_ed25519_key.pub");
    if !host_key.exists() {
        chroot_output(rootfs, &["ssh-keygen", "-A"])?;
    }
    let host_key =
        fs::read_to_string(&host_key).with_context(|| format!("reading {}", host_key.display()))?;
    let mut fields = host_key.split_whitespace();
    let (Some(kind), Some(b64)) = (fields.next(), fields.next()) else {
        bail!("unexpected host key: {host_key}");
    };
    fs::write(
        image.known_hosts(),
        format!("{} {kind} {b64}\n", super::ssh::HOST_KEY_ALIAS),
    )?;

    // The lab profile's socket: the system containerd's.
    let guest_lab = LabPaths::new(recipe::GUEST_LAB_DIR);
    let sock = rootfs.join(guest_lab.cri_socket().strip_prefix("/").expect("absolute"));
    fs::create_dir_all(sock.parent().expect("has a parent"))?;
    let _ = fs::remove_file(&sock);
    symlink(recipe::CONTAINERD_SOCKET, &sock)?;

    let mut enable = vec!["enable"];
    enable.extend_from_slice(recipe::ENABLE_UNITS);
    let mut args = vec!["systemctl"];
    args.extend(enable);
    chroot_output(rootfs, &args)?;
    Ok(())
}

/// Each kernel's packages, with dpkg inside the root file system; their hooks build each
/// one's initramfs with the recipe's configuration (written before).
fn install_kernels(rootfs: &Path, kernels: &[Fetched]) -> anyhow::Result<()> {
    for (k, (before, packages)) in kernels {
        for group in [before, packages] {
            if !group.is_empty() {
                dpkg_install(rootfs, group).with_context(|| format!("installing kernel {k}"))?;
            }
        }
        let initrd = rootfs.join(format!("boot/initrd.img-{}", k.release));
        if !initrd.exists() {
            chroot_output(rootfs, &["update-initramfs", "-c", "-k", k.release])
                .with_context(|| format!("the initramfs of kernel {k}"))?;
        }
    }
    Ok(())
}

fn write_versions(image: &ImagePaths, rootfs: &Path, kernels: &[Fetched]) -> anyhow::Result<()> {
    let mut query = vec![
        "dpkg-query",
        "-W",
        "-f",
        "${Package} ${Version}\\n",
        "containerd",
        "runc",
        "systemd",
        "containernetworking-plugins",
    ];
    for (k, _) in kernels {
        if let Some(image) = k.packages.last() {
            query.push(image.package);
        }
    }
    let versions = chroot_output(rootfs, &query)?;
    let compat = chroot_output(
        rootfs,
        &[
            &format!("{}/bin/containerd", recipe::COMPAT_DIR),
            "--version",
        ],
    )?;
    let compat = compat.split_whitespace().nth(2).unwrap_or("unknown");
    fs::write(
        image.versions(),
        format!(
            "{versions}containerd (compatibility, {}) {compat}\n",
            recipe::COMPAT_DIR
        ),
    )?;
    Ok(())
}

fn clean_caches(rootfs: &Path) -> anyhow::Result<()> {
    for dir in [
        "var/cache/apt/archives",
        "var/lib/apt/lists",
        "usr/share/doc",
        "usr/share/man",
    ] {
        let d = rootfs.join(dir);
        if d.exists() {
            for e in fs::read_dir(&d)? {
                let p = e?.path();
                if p.is_dir() {
                    let _ = fs::remove_dir_all(&p);
                } else {
                    let _ = fs::remove_file(&p);
                }
            }
        }
    }
    Ok(())
}

fn edit_config(
    default: &str,
    edits: &[(String, &'static str, String)],
    which: &str,
) -> anyhow::Result<String> {
    recipe::edit_containerd_config(default, edits).map_err(|missed| {
        anyhow::anyhow!(
            "{which}'s default config in the {} image has no line for {}",
            recipe::SUITE,
            missed.join(", ")
        )
    })
}

/// Copies trixie's containerd 1.7 (daemon, shim, ctr) to [`recipe::COMPAT_DIR`] and writes
/// its config, before the reference runtime's package replaces it.
fn keep_compat_containerd(rootfs: &Path) -> anyhow::Result<()> {
    let bin = rootfs
        .join(recipe::COMPAT_DIR.trim_start_matches('/'))
        .join("bin");
    fs::create_dir_all(&bin)?;
    for program in ["containerd", "containerd-shim-runc-v2", "ctr"] {
        let from = rootfs.join("usr/bin").join(program);
        fs::copy(&from, bin.join(program))
            .with_context(|| format!("keeping containerd 1.7's {}", from.display()))?;
    }
    let default = chroot_output(rootfs, &["containerd", "config", "default"])?;
    let config = edit_config(
        &default,
        &recipe::compat_containerd_edits(),
        "containerd 1.7",
    )?;
    write(rootfs, recipe::COMPAT_CONFIG, 0o644, &config)
}

/// Installs the pinned containerd 2.x and runc 1.3 (downloaded into the package cache
/// first if needed) over the root file system's, with dpkg inside it.
fn install_debs(rootfs: &Path) -> anyhow::Result<()> {
    let debs = xtask::debs::fetch(&[xtask::debs::CONTAINERD, xtask::debs::RUNC], &|s| {
        eprintln!("node-vm: {s}")
    })?;
    dpkg_install(rootfs, &debs)
}

/// `dpkg -i` of `debs` in one call inside the root file system.
fn dpkg_install(rootfs: &Path, debs: &[PathBuf]) -> anyhow::Result<()> {
    let mut args = vec!["dpkg".to_string(), "--force-confnew".into(), "-i".into()];
    let staged = rootfs.join("tmp");
    for deb in debs {
        let name = deb.file_name().context("a package file has a name")?;
        fs::copy(deb, staged.join(name))
            .with_context(|| format!("copying {} into the image", deb.display()))?;
        args.push(format!("/tmp/{}", name.to_string_lossy()));
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = chroot_output(rootfs, &refs);
    for deb in debs {
        if let Some(name) = deb.file_name() {
            let _ = fs::remove_file(staged.join(name));
        }
    }
    result.map(drop)
}

/// Room beside the root file system for images, containers and the test binaries.
const HEADROOM_MIB: u64 = 3072;

fn make_image(image: &ImagePaths, rootfs: &Path, kernels: &[Fetched]) -> anyhow::Result<()> {
    let used = dir_mib(rootfs)?;
    let size = used + HEADROOM_MIB;
    let img = image.disk();
    let _ = fs::remove_file(&img);
    run(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "podlapse-node", "-d"])
            .arg(rootfs)
            .arg(&img)
            .arg(format!("{size}M")),
        "mkfs.ext4",
    )?;
    for (k, _) in kernels {
        // sid's packages keep the kernel under /usr/lib/modules and link it from /boot.
        let kernel = [
            rootfs.join(format!("boot/vmlinuz-{}", k.release)),
            rootfs.join(format!("usr/lib/modules/{}/vmlinuz", k.release)),
        ]
        .into_iter()
        .find(|p| p.is_file())
        .with_context(|| format!("kernel {k}: no vmlinuz in the root file system"))?;
        let initrd = rootfs.join(format!("boot/initrd.img-{}", k.release));
        fs::copy(&kernel, image.kernel(k.name))
            .with_context(|| format!("copying {}", kernel.display()))?;
        fs::copy(&initrd, image.initrd(k.name))
            .with_context(|| format!("copying {}", initrd.display()))?;
    }
    Ok(())
}

fn dir_mib(dir: &Path) -> anyhow::Result<u64> {
    let out = Command::new("du")
        .args(["-sm", "-x"])
        .arg(dir)
        .output()
        .context("du")?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("du -sm {}", dir.display()))
}

fn write(rootfs: &Path, path: &str, mode: u32, text: &str) -> anyhow::Result<()> {
    let p = rootfs.join(path.trim_start_matches('/'));
    if let Some(dir) = p.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    fs::set_permissions(&p, fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn chroot_output(rootfs: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("chroot")
        .arg(rootfs)
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("chroot {} {}", rootfs.display(), args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "in the node's root file system, `{}` failed ({}): {}",
            args.join(" "),
            out.status,
            last_lines(&String::from_utf8_lossy(&out.stderr), 10).join("\n")
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn run(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            last_lines(&String::from_utf8_lossy(&out.stderr), 10).join("\n")
        );
    }
    Ok(())
}

fn remove_other_images(paths: &NodeVmPaths, keep: &str, say: &dyn Fn(&str)) {
    let Ok(entries) = fs::read_dir(paths.images_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name != keep && !name.ends_with(".partial") {
            say(&format!("removing the image of an older recipe ({name})"));
            let _ = fs::remove_dir_all(e.path());
        }
    }
}
