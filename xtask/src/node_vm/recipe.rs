//! What the modern node is made of: the Debian packages, and every file podtrace writes
//! into its root file system. The image is rebuilt whenever any of it changes: its cache key
//! is a hash of this recipe.

use sha2::{Digest, Sha256};

use xtask::lab::{self, LabPaths};

/// Debian's release for the guest: kernel 6.12 with BTF, systemd 257, containerd 1.7.
pub const SUITE: &str = "trixie";
pub const MIRROR: &str = "http://deb.debian.org/debian";
/// The kernel flavour: the cloud kernel boots fast and has BTF (but no 9p).
pub const KERNEL_PACKAGE: &str = "linux-image-cloud-amd64";

/// debootstrap `--include`, by real name (debootstrap does not resolve virtual packages).
pub const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "udev",
    "dbus",
    "kmod",
    "procps",
    "iproute2",
    "iptables",
    "ca-certificates",
    "containerd",
    "runc",
    "containernetworking-plugins",
    KERNEL_PACKAGE,
    "initramfs-tools",
    "zstd",
    "openssh-server",
];

/// Where Debian installs the CNI plugins, and where today's nodes have them.
pub const DEBIAN_CNI_DIR: &str = "/usr/lib/cni";
pub const CNI_BIN_DIR: &str = "/opt/cni/bin";
pub const CNI_CONF_DIR: &str = "/etc/cni/net.d";
pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
/// The guest's address on QEMU's user network.
pub const GUEST_ADDR: &str = "10.0.2.15/24";
/// The lab profile's root in the guest: what `PODTRACE_LAB_DIR` points at there.
pub const GUEST_LAB_DIR: &str = "/var/lib/podtrace-lab";
/// Where `node-vm test` puts the binaries and examples.
pub const GUEST_WORK_DIR: &str = "/opt/podtrace";

/// The kernel command line: cgroup v2 only, eth0 for the one NIC, the console on the first
/// serial port.
pub const KERNEL_CMDLINE: &str =
    "root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 net.ifnames=0 quiet";

const CRI: &str = "plugins.\"io.containerd.grpc.v1.cri\"";

/// Edits to the config `containerd config default` writes: (table, key, value). Each must
/// match a line of its table, or the build fails rather than booting a node of the wrong
/// shape.
pub fn containerd_edits() -> Vec<(String, &'static str, String)> {
    vec![
        (
            format!("{CRI}.containerd.runtimes.runc.options"),
            "SystemdCgroup",
            "true".into(),
        ),
        (format!("{CRI}.cni"), "bin_dir", quote(CNI_BIN_DIR)),
        (format!("{CRI}.cni"), "conf_dir", quote(CNI_CONF_DIR)),
        (CRI.to_string(), "sandbox_image", quote(lab::IMAGE_PAUSE)),
        (
            format!("{CRI}.registry"),
            "config_path",
            quote("/etc/containerd/certs.d"),
        ),
    ]
}

fn quote(s: &str) -> String {
    format!("\"{s}\"")
}

/// Applies [`containerd_edits`] to a default config; names each key that matched no line.
pub fn edit_containerd_config(default: &str) -> Result<String, Vec<&'static str>> {
    let edits = containerd_edits();
    let mut hit = vec![false; edits.len()];
    let mut out = String::with_capacity(default.len());
    let mut table = String::new();
    for line in default.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if let Some(header) = trimmed
            .strip_prefix('[')
            .and_then(|h| h.trim_end().strip_suffix(']'))
        {
            table = header.to_string();
        }
        let edit = edits.iter().enumerate().find(|(_, (t, key, _))| {
            *t == table
                && trimmed
                    .strip_prefix(key)
                    .is_some_and(|rest| rest.trim_start().starts_with('='))
        });
        match edit {
            Some((i, (_, key, value))) => {
                hit[i] = true;
                out.push_str(&format!("{indent}{key} = {value}\n"));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    let missed: Vec<&'static str> = edits
        .iter()
        .zip(&hit)
        .filter(|(_, h)| !**h)
        .map(|((_, k, _), _)| *k)
        .collect();
    if missed.is_empty() {
        Ok(out)
    } else {
        Err(missed)
    }
}

/// Files written into the root file system: (path, mode, contents).
pub fn files(authorized_key: &str) -> Vec<(String, u32, String)> {
    let guest_lab = LabPaths::new(GUEST_LAB_DIR);
    let conflist =
        serde_json::to_string_pretty(&lab::conflist(&guest_lab)).expect("a JSON value serialises");
    vec![
        ("/etc/hostname".into(), 0o644, "podtrace-node\n".into()),
        (
            "/etc/hosts".into(),
            0o644,
            "127.0.0.1 localhost\n127.0.1.1 podtrace-node\n".into(),
        ),
        (
            "/etc/fstab".into(),
            0o644,
            "/dev/vda / ext4 rw,errors=remount-ro 0 1\n".into(),
        ),
        (
            format!("{CNI_CONF_DIR}/10-podtrace-lab.conflist"),
            0o644,
            conflist + "\n",
        ),
        (
            "/etc/containerd/certs.d/127.0.0.1:5000/hosts.toml".into(),
            0o644,
            lab::registry_hosts_toml(),
        ),
        // The host reaches the guest only through QEMU's forwarded port, with this key.
        ("/root/.ssh/authorized_keys".into(), 0o600, authorized_key.to_string()),
        (
            "/etc/ssh/sshd_config.d/podtrace.conf".into(),
            0o644,
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUseDNS no\nAllowTcpForwarding yes\n".into(),
        ),
        (
            "/etc/systemd/system/podtrace-net.service".into(),
            0o644,
            format!(
                "[Unit]\nDescription=the guest's address on QEMU's user network\nBindsTo=sys-subsystem-net-devices-eth0.device\nAfter=sys-subsystem-net-devices-eth0.device\nBefore=ssh.service network.target\nWants=network.target\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=ip link set lo up\nExecStart=ip link set eth0 up\nExecStart=ip addr replace {GUEST_ADDR} dev eth0\n\n[Install]\nWantedBy=multi-user.target\n"
            ),
        ),
        // containerd's tracing (OTLP over gRPC, every span of a sampled parent), to the
        // lab's runtime collector address, where a test's receiver listens.
        (
            "/etc/systemd/system/containerd.service.d/podtrace-otel.conf".into(),
            0o644,
            format!(
                "[Service]\nEnvironment=OTEL_EXPORTER_OTLP_ENDPOINT=http://{}\nEnvironment=OTEL_EXPORTER_OTLP_PROTOCOL=grpc\nEnvironment=OTEL_EXPORTER_OTLP_INSECURE=true\nEnvironment=OTEL_SERVICE_NAME=containerd\nEnvironment=OTEL_TRACES_SAMPLER=parentbased_always_on\n",
                lab::RUNTIME_OTLP_ADDR
            ),
        ),
        // Only what mounts a virtio-blk ext4 root: a small initramfs, built in seconds.
        (
            "/etc/initramfs-tools/conf.d/podtrace.conf".into(),
            0o644,
            "MODULES=list\nCOMPRESS=zstd\n".into(),
        ),
        (
            "/etc/initramfs-tools/modules".into(),
            0o644,
            "virtio_pci\nvirtio_blk\next4\n".into(),
        ),
        // The lab profile: podtrace and its tests find the runtime's socket here.
        (
            format!("{GUEST_LAB_DIR}/README"),
            0o644,
            "The podtrace lab profile of this node: lab.json and containerd/containerd.sock (a link to the system containerd's socket).\n".into(),
        ),
    ]
}

/// Units enabled in the guest.
pub const ENABLE_UNITS: &[&str] = &["podtrace-net.service", "ssh.service", "containerd.service"];

/// The cache key: every input of the image, and the image layout's version.
pub fn hash() -> String {
    const LAYOUT_VERSION: &str = "1";
    let mut h = Sha256::new();
    for part in [LAYOUT_VERSION, SUITE, MIRROR, KERNEL_CMDLINE] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    for p in PACKAGES {
        h.update(p.as_bytes());
        h.update([0]);
    }
    for (t, k, v) in containerd_edits() {
        h.update(format!("{t}.{k}={v}\0").as_bytes());
    }
    // The key differs per image, so it is not part of the recipe.
    for (path, mode, text) in files("") {
        h.update(format!("{path}\0{mode:o}\0{text}\0").as_bytes());
    }
    for u in ENABLE_UNITS {
        h.update(u.as_bytes());
        h.update([0]);
    }
    h.finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: &str = r#"version = 2
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.8"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = ""
  [plugins."io.containerd.transfer.v1.local"]
    config_path = ""
"#;

    #[test]
    fn the_default_config_gets_the_systemd_driver_opt_cni_bin_and_the_lab_registry() {
        let out = edit_containerd_config(DEFAULT).unwrap();
        assert!(out.contains("            SystemdCgroup = true\n"), "{out}");
        assert!(out.contains("      bin_dir = \"/opt/cni/bin\"\n"), "{out}");
        assert!(out.contains("sandbox_image = \"127.0.0.1:5000/podtrace/pause:3.10\""));
        assert!(out.contains("      config_path = \"/etc/containerd/certs.d\"\n"));
        assert!(
            out.contains("    config_path = \"\"\n"),
            "only the CRI registry's: {out}"
        );
        assert!(out.starts_with("version = 2\n"));
    }

    #[test]
    fn a_config_without_a_key_is_refused_naming_it() {
        let without = DEFAULT.replace("            SystemdCgroup = false\n", "");
        assert_eq!(edit_containerd_config(&without), Err(vec!["SystemdCgroup"]));
    }

    #[test]
    fn the_hash_is_stable_and_short() {
        assert_eq!(hash(), hash());
        assert_eq!(hash().len(), 16);
    }
}
