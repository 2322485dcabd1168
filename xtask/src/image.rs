//! `cargo xtask image`: podlapse's OCI image, built offline from the release binary into
//! `target/image/oci` (tagged with the crate's version). `--save FILE` writes it as an OCI
//! archive a user loads into any registry; `--push REF` pushes it to a registry without
//! TLS (the lab's).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use xtask::lab::{build_agent_image, image_epoch, push_agent_image, save_agent_image};

use crate::workspace;

#[derive(Args)]
pub struct ImageArgs {
    /// Also write the image as an OCI archive (a tarball) to FILE.
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,
    /// Also push the image to REF (`host:port/repository:tag`, plain HTTP).
    #[arg(long, value_name = "REF")]
    pub push: Option<String>,
    /// Build the image of the debug binary (faster to build; for the lab).
    #[arg(long)]
    pub debug: bool,
}

/// Where the image's layout is written.
pub fn layout_dir() -> PathBuf {
    workspace::target_dir().join("image").join("oci")
}

pub fn run(args: &ImageArgs) -> anyhow::Result<()> {
    let (mut build, binary) = workspace::build_bin("podlapse", "podlapse", !args.debug);
    workspace::run(&mut build, "cargo build of podlapse")?;
    let epoch = image_epoch(&workspace::root())?;
    let tag = env!("CARGO_PKG_VERSION");
    let image = build_agent_image(&binary, &layout_dir(), tag, epoch)
        .with_context(|| format!("building the image of {}", binary.display()))?;
    println!("image {} in {}", image.digest, image.oci_ref());
    if let Some(file) = &args.save {
        save_agent_image(&image, file)?;
        println!("saved as an OCI archive: {}", file.display());
    }
    if let Some(reference) = &args.push {
        push_agent_image(&image, reference)?;
        println!("pushed to {reference}");
    }
    Ok(())
}
