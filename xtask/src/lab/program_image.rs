//! An image of the lab's busybox base plus one host program and the shared libraries it
//! loads, pushed to the lab registry: how tests put a server of their own (a gRPC health
//! server, say) into a pod without building a static binary.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::error::LabError;
use super::images::{PATH_ENV, PUSH_TIMEOUT, s, stage_busybox_rootfs, umoci_run};
use super::process::{exec_ok, require_program};

/// Builds `reference` in `work` (created, and removed afterwards) with `program` at
/// `/usr/local/bin/<its file name>` and `cmd` as the image's command, and pushes it.
pub fn push_program_image(
    work: &Path,
    reference: &str,
    program: &Path,
    cmd: &[&str],
) -> Result<(), LabError> {
    let part = format!("image {reference}");
    let umoci = require_program(&part, "umoci")?;
    let skopeo = require_program(&part, "skopeo")?;
    let layout = work.join("oci");
    let rootfs = work.join("rootfs");
    fs::create_dir_all(work).map_err(|e| LabError::io(&part, "create", work, e))?;
    stage_busybox_rootfs(&rootfs)
        .map_err(|e| LabError::io(&part, "stage rootfs in", &rootfs, e))?;
    let name = program.file_name().ok_or_else(|| {
        LabError::io(
            &part,
            "name",
            program,
            std::io::Error::other("the program path has no file name"),
        )
    })?;
    let bin = rootfs.join("usr/local/bin");
    copy_into(&part, program, &bin.join(name))?;
    for lib in shared_libraries(&part, program)? {
        let dest = rootfs.join(lib.strip_prefix("/").unwrap_or(&lib));
        copy_into(&part, &lib, &dest)?;
    }
    let image = format!("{}:img", s(&layout));
    umoci_run(&part, &umoci, &["init", "--layout", &s(&layout)])?;
    umoci_run(&part, &umoci, &["new", "--image", &image])?;
    umoci_run(
        &part,
        &umoci,
        &["insert", "--image", &image, &s(&rootfs), "/"],
    )?;
    let mut config = vec!["config", "--image", &image, "--config.env", PATH_ENV];
    for arg in cmd {
        config.extend(["--config.cmd", arg]);
    }
    umoci_run(&part, &umoci, &config)?;
    let mut push = Command::new(&skopeo);
    push.args([
        "--insecure-policy",
        "copy",
        "--quiet",
        "--dest-tls-verify=false",
    ])
    .arg(format!("oci:{image}"))
    .arg(format!("docker://{reference}"));
    exec_ok(&part, push, None, PUSH_TIMEOUT)?;
    fs::remove_dir_all(work).map_err(|e| LabError::io(&part, "remove", work, e))
}

pub(crate) fn copy_into(part: &str, from: &Path, to: &Path) -> Result<(), LabError> {
    if let Some(dir) = to.parent() {
        fs::create_dir_all(dir).map_err(|e| LabError::io(part, "create", dir, e))?;
    }
    fs::copy(from, to).map_err(|e| LabError::io(part, "copy", from, e))?;
    Ok(())
}

/// The shared objects `program` loads, by absolute path, from `ldd`: the `=> /path` of
/// each library and the dynamic loader's own line.
pub(crate) fn shared_libraries(part: &str, program: &Path) -> Result<Vec<PathBuf>, LabError> {
    let ldd = require_program(part, "ldd")?;
    let mut cmd = Command::new(ldd);
    cmd.arg(program);
    let out = exec_ok(part, cmd, None, std::time::Duration::from_secs(30))?;
    Ok(parse_ldd(&String::from_utf8_lossy(&out.stdout)))
}

fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.trim(),
                None => line,
            };
            let path = path.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lines_give_libraries_and_the_loader() {
        let text = "\tlinux-vdso.so.1 (0x00007ffc)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f01)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f02)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f03)\n";
        assert_eq!(
            parse_ldd(text),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
    }
}
