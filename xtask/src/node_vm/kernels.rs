//! The kernels the modern node boots: the ones fleets run, each Debian's cloud kernel for
//! the same QEMU guest, pinned and cached like the runtime's packages. All of them are
//! installed into the one image (trixie's userland), each with its own initramfs; `up
//! --kernel` chooses which one QEMU boots.

use std::fmt;
use std::path::PathBuf;

use xtask::debs::{self, Deb, DebError, SID};

/// One guest kernel: its name on the command line, `uname -r` once booted, where it comes
/// from, and its packages in the order dpkg installs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestKernel {
    /// `5.10`, `6.1`, `6.12`, `7.2`.
    pub name: &'static str,
    /// The kernel's release, as `uname -r` and `/boot` name it.
    pub release: &'static str,
    /// Who runs it: the distributions whose nodes have this kernel.
    pub fleets: &'static str,
    /// Installed first, on their own: what the kernel's packages pre-depend on.
    pub before: &'static [Deb],
    pub packages: &'static [Deb],
}

impl fmt::Display for GuestKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.release)
    }
}

/// The modern node's own kernel, which the full suite runs on.
pub const REFERENCE: &str = "6.12";

const fn deb(package: &'static str, version: &'static str, suite: &'static str) -> Deb {
    Deb {
        package,
        version,
        suite,
    }
}

/// Oldest first. Versions are pinned: suites move, and each keeps only its newest build.
pub const KERNELS: &[GuestKernel] = &[
    GuestKernel {
        name: "5.10",
        release: "5.10.0-32-cloud-amd64",
        fleets: "Amazon Linux 2, Debian 11, older Ubuntu nodes",
        before: &[],
        packages: &[deb(
            "linux-image-5.10.0-32-cloud-amd64",
            "5.10.223-1",
            "bullseye",
        )],
    },
    GuestKernel {
        name: "6.1",
        release: "6.1.0-50-cloud-amd64",
        fleets: "Debian 12, Amazon Linux 2023",
        before: &[],
        packages: &[deb(
            "linux-image-6.1.0-50-cloud-amd64",
            "6.1.176-1",
            "bookworm",
        )],
    },
    GuestKernel {
        name: "6.12",
        release: "6.12.117+deb13-cloud-amd64",
        fleets: "Debian 13, current Bottlerocket and COS",
        before: &[],
        packages: &[deb(
            "linux-image-6.12.117+deb13-cloud-amd64",
            "6.12.117-1",
            "trixie",
        )],
    },
    GuestKernel {
        name: "7.2",
        release: "7.2.13+deb14-cloud-amd64",
        fleets: "the newest release",
        // sid's kernel packages run their hooks through linux-base 4.17.
        before: &[deb("linux-base", "4.17", SID)],
        packages: &[
            deb("linux-base-7.2.13+deb14-cloud-amd64", "7.2.13-1", SID),
            deb("linux-binary-7.2.13+deb14-cloud-amd64", "7.2.13-1", SID),
            deb("linux-modules-7.2.13+deb14-cloud-amd64", "7.2.13-1", SID),
            deb("linux-image-7.2.13+deb14-cloud-amd64", "7.2.13-1", SID),
        ],
    },
];

/// The kernel named `name`, or an error listing the ones there are.
pub fn by_name(name: &str) -> anyhow::Result<&'static GuestKernel> {
    KERNELS.iter().find(|k| k.name == name).ok_or_else(|| {
        anyhow::anyhow!(
            "--kernel {name}: not a kernel of the modern node (it boots {})",
            KERNELS
                .iter()
                .map(|k| k.name)
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

impl GuestKernel {
    /// Every package, in install order.
    pub fn debs(&self) -> impl Iterator<Item = &'static Deb> {
        self.before.iter().chain(self.packages.iter())
    }

    /// Its packages from the cache, downloaded first where missing: `before`'s files,
    /// then the rest's.
    pub fn fetch(&self, progress: &dyn Fn(&str)) -> Result<(Vec<PathBuf>, Vec<PathBuf>), DebError> {
        Ok((
            debs::fetch(self.before, progress)?,
            debs::fetch(self.packages, progress)?,
        ))
    }

    /// The reference kernel runs the full suite; the others run the kernel suite.
    pub fn is_reference(&self) -> bool {
        self.name == REFERENCE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_matrix_is_oldest_first_with_the_reference_in_it() {
        let names: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
        assert_eq!(names, ["5.10", "6.1", "6.12", "7.2"]);
        assert!(by_name(REFERENCE).unwrap().is_reference());
        for k in KERNELS {
            let image = k.packages.last().unwrap();
            assert!(
                image.package.starts_with("linux-image-") && image.package.ends_with(k.release),
                "{k}: the last package is the kernel's image: {image:?}"
            );
            assert!(
                k.release.starts_with(k.name),
                "{k}: the release is of the named kernel"
            );
        }
    }

    #[test]
    fn an_unknown_kernel_is_refused_naming_the_ones_there_are() {
        let err = by_name("4.19").unwrap_err().to_string();
        assert!(
            err.contains("--kernel 4.19") && err.contains("5.10, 6.1, 6.12, 7.2"),
            "{err}"
        );
    }
}
