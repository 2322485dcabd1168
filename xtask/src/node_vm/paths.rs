//! Where the modern node keeps its files on the host. The image cache survives `down`
//! (`down --purge` removes it too); everything a running guest needs is under `run/`, which
//! `down` removes.

use std::path::PathBuf;

pub const DIR_ENV: &str = "PODLAPSE_NODE_VM_DIR";
pub const DEFAULT_DIR: &str = "/var/lib/podlapse-node-vm";

#[derive(Debug, Clone)]
pub struct NodeVmPaths {
    pub root: PathBuf,
}

impl NodeVmPaths {
    pub fn from_env() -> NodeVmPaths {
        let root = std::env::var_os(DIR_ENV)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
        NodeVmPaths {
            root: std::path::absolute(&root).unwrap_or(root),
        }
    }

    pub fn images_dir(&self) -> PathBuf {
        self.root.join("images")
    }

    pub fn image(&self, hash: &str) -> ImagePaths {
        ImagePaths::at(self.images_dir().join(hash))
    }

    /// The running guest's directory: its state, console log and QEMU's files.
    pub fn run_dir(&self) -> PathBuf {
        self.root.join("run")
    }

    pub fn state_file(&self) -> PathBuf {
        self.run_dir().join("state.json")
    }

    pub fn pid_file(&self) -> PathBuf {
        self.run_dir().join("qemu.pid")
    }

    pub fn console_log(&self) -> PathBuf {
        self.run_dir().join("console.log")
    }

    pub fn qemu_log(&self) -> PathBuf {
        self.run_dir().join("qemu.log")
    }
}

/// One built image.
#[derive(Debug, Clone)]
pub struct ImagePaths {
    pub dir: PathBuf,
}

impl ImagePaths {
    pub fn at(dir: PathBuf) -> ImagePaths {
        ImagePaths { dir }
    }

    /// Written last: the image is complete.
    pub fn ready_marker(&self) -> PathBuf {
        self.dir.join("ready")
    }

    pub fn disk(&self) -> PathBuf {
        self.dir.join("node.img")
    }

    /// The kernel QEMU boots for the matrix's kernel `name` (`6.12`, ...).
    pub fn kernel(&self, name: &str) -> PathBuf {
        self.dir.join(format!("vmlinuz-{name}"))
    }

    pub fn initrd(&self, name: &str) -> PathBuf {
        self.dir.join(format!("initrd.img-{name}"))
    }

    /// The matrix's kernels the image lacks, a line each: name, a tab, and why (a package
    /// the registry did not serve when the image was built).
    pub fn missing_kernels(&self) -> PathBuf {
        self.dir.join("missing-kernels.txt")
    }

    pub fn ssh_key(&self) -> PathBuf {
        self.dir.join("id_ed25519")
    }

    pub fn known_hosts(&self) -> PathBuf {
        self.dir.join("known_hosts")
    }

    /// The versions of containerd, runc, systemd, the CNI plugins and the kernel inside.
    pub fn versions(&self) -> PathBuf {
        self.dir.join("versions.txt")
    }
}
