//! The BTF of each kernel of the matrix, as Debian built it, taken from the kernel's cached
//! package without booting it: the bzImage's compressed vmlinux is found by its
//! compressor's magic (as the kernel's own `extract-vmlinux` does), decompressed by that
//! compressor's program, and its `.BTF` section copied out. The agent's BTF reader is
//! tested against these (`cargo xtask test`), so a kernel whose BTF it cannot read fails
//! on the host before any guest boots.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use super::kernels::GuestKernel;

/// The compressors a bzImage's payload may use: the magic that starts their stream, and
/// the program (and arguments) that writes it decompressed to stdout.
const COMPRESSORS: &[(&str, &[u8], &[&str])] = &[
    ("zstd", &[0x28, 0xb5, 0x2f, 0xfd], &["zstd", "-dcq"]),
    ("lz4", &[0x02, 0x21, 0x4c, 0x18], &["lz4", "-dcq"]),
    ("xz", &[0xfd, b'7', b'z', b'X', b'Z', 0x00], &["xz", "-dcq"]),
    ("gzip", &[0x1f, 0x8b, 0x08], &["gzip", "-dcq"]),
];

const ELF_MAGIC: &[u8] = b"\x7fELF";
const BTF_MAGIC: [u8; 2] = [0x9f, 0xeb];

/// `kernel`'s vmlinux BTF, extracted into the package cache the first time.
pub fn vmlinux_btf(kernel: &GuestKernel, say: &dyn Fn(&str)) -> anyhow::Result<PathBuf> {
    let dir = xtask::debs::cache_dir().join("btf");
    let out = dir.join(format!("{}.btf", kernel.release));
    if out.is_file() {
        return Ok(out);
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (_, packages) = kernel.fetch(say)?;
    let work = tempfile::tempdir_in(&dir).context("a scratch directory for the kernel")?;
    let vmlinuz = extract_vmlinuz(&packages, work.path())
        .with_context(|| format!("kernel {kernel}: its vmlinuz"))?;
    let elf = work.path().join("vmlinux");
    decompress(&fs::read(&vmlinuz)?, &elf).with_context(|| {
        format!(
            "kernel {kernel}: decompressing {} into an ELF vmlinux",
            vmlinuz.display()
        )
    })?;
    let partial = dir.join(format!("{}.btf.partial", kernel.release));
    let status = Command::new("objcopy")
        .args(["-O", "binary", "--only-section=.BTF"])
        .arg(&elf)
        .arg(&partial)
        .stdin(Stdio::null())
        .status()
        .context("running objcopy (binutils)")?;
    let btf = fs::read(&partial).unwrap_or_default();
    if !status.success() || btf.len() < 24 || btf[..2] != BTF_MAGIC {
        let _ = fs::remove_file(&partial);
        bail!(
            "kernel {kernel}: its vmlinux has no .BTF section ({} bytes from objcopy, {status})",
            btf.len()
        );
    }
    fs::rename(&partial, &out).with_context(|| format!("moving {}", out.display()))?;
    Ok(out)
}

/// The kernel image from whichever of `packages` holds it (`/boot/vmlinuz-*`, or sid's
/// `/usr/lib/modules/*/vmlinuz`), extracted alone into `into`.
fn extract_vmlinuz(packages: &[PathBuf], into: &Path) -> anyhow::Result<PathBuf> {
    for deb in packages {
        let mut listing = Command::new("dpkg-deb")
            .arg("--fsys-tarfile")
            .arg(deb)
            .stdout(Stdio::piped())
            .spawn()
            .context("running dpkg-deb")?;
        let out = Command::new("tar")
            .arg("-x")
            .arg("-C")
            .arg(into)
            .args(["--wildcards", "*vmlinuz*"])
            .stdin(listing.stdout.take().context("dpkg-deb's output")?)
            .stderr(Stdio::null())
            .status()
            .context("running tar")?;
        // Reaped whatever tar made of its output.
        let _ = listing.wait();
        if !out.success() {
            continue;
        }
        if let Some(found) = find_vmlinuz(into) {
            return Ok(found);
        }
    }
    bail!(
        "none of {} holds a vmlinuz",
        packages
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn find_vmlinuz(dir: &Path) -> Option<PathBuf> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).ok()?.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz"))
            {
                return Some(p);
            }
        }
    }
    None
}

/// Where each compressor's stream may start in `image`, in the order they appear.
fn candidates(image: &[u8]) -> Vec<(usize, &'static str, &'static [&'static str])> {
    let mut found = Vec::new();
    for &(name, magic, program) in COMPRESSORS {
        if let Some(at) = image.windows(magic.len()).position(|w| w == magic) {
            found.push((at, name, program));
        }
    }
    found.sort_by_key(|(at, _, _)| *at);
    found
}

/// Decompresses the payload of `image` into `elf`: the first candidate whose output is an
/// ELF file. A stream followed by the rest of the bzImage ends with an error about
/// trailing data, which is why the output, not the exit status, decides.
fn decompress(image: &[u8], elf: &Path) -> anyhow::Result<()> {
    let mut tried = Vec::new();
    for (at, name, program) in candidates(image) {
        let mut child = Command::new(program[0])
            .args(&program[1..])
            .stdin(Stdio::piped())
            .stdout(fs::File::create(elf)?)
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("running {} (for a {name} kernel)", program[0]))?;
        let mut stdin = child.stdin.take().context("the decompressor's stdin")?;
        let payload = image[at..].to_vec();
        let writer = std::thread::spawn(move || {
            // A decompressor that stops early closes its input: not an error here.
            let _ = stdin.write_all(&payload);
        });
        let _ = child.wait()?;
        let _ = writer.join();
        let head = fs::read(elf)
            .map(|b| b.get(..4).map(<[u8]>::to_vec))
            .unwrap_or_default();
        if head.as_deref() == Some(ELF_MAGIC) {
            return Ok(());
        }
        tried.push(format!("{name} at byte {at}"));
    }
    bail!(
        "no compressed ELF found (tried {})",
        if tried.is_empty() {
            "nothing: no known compressor's magic".to_string()
        } else {
            tried.join(", ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_found_in_the_order_they_appear() {
        let mut image = vec![0u8; 64];
        image.extend([0x1f, 0x8b, 0x08]);
        image.extend([0u8; 16]);
        image.extend([0x28, 0xb5, 0x2f, 0xfd]);
        let c: Vec<(usize, &str)> = candidates(&image)
            .into_iter()
            .map(|(at, n, _)| (at, n))
            .collect();
        assert_eq!(c, [(64, "gzip"), (83, "zstd")]);
    }

    #[test]
    fn a_gzip_payload_after_a_boot_stub_decompresses_to_its_elf() {
        let dir = tempfile::tempdir().unwrap();
        let elf = b"\x7fELF and the rest of a kernel".to_vec();
        let mut gz = Command::new("gzip")
            .arg("-c")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        gz.stdin.take().unwrap().write_all(&elf).unwrap();
        let compressed = gz.wait_with_output().unwrap().stdout;
        let mut image = b"MZ boot stub".to_vec();
        image.extend(&compressed);
        image.extend(b"trailing setup data");
        let out = dir.path().join("vmlinux");
        decompress(&image, &out).unwrap();
        assert_eq!(fs::read(&out).unwrap(), elf);
        let e = decompress(b"no kernel here", &out).unwrap_err().to_string();
        assert!(e.contains("no known compressor"), "{e}");
    }
}
