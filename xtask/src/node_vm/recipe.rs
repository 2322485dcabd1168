//! What the modern node is made of: the Debian packages, and every file podlapse writes
//! into its root file system. The image is rebuilt whenever any of it changes: its cache key
//! is a hash of this recipe.

use sha2::{Digest, Sha256};

use xtask::lab::{self, LabPaths};

/// Debian's release for the guest's userland: systemd 257, and containerd 1.7, which the
/// pinned containerd 2.x and runc 1.3 from sid ([`xtask::debs`]) replace (1.7 is kept
/// aside for the compatibility suite). Its kernels, 6.12 among them, are pinned apart
/// ([`super::kernels`]): Debian's cloud flavour, which boots fast and has BTF (but no 9p).
pub const SUITE: &str = "trixie";
pub const MIRROR: &str = "http://deb.debian.org/debian";

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
/// containerd's registry host configs: `<registry>/hosts.toml` for each registry.
pub const CERTS_DIR: &str = "/etc/containerd/certs.d";
/// The guest's address on QEMU's user network.
pub const GUEST_ADDR: &str = "10.0.2.15/24";
/// The lab profile's root in the guest: what `PODLAPSE_LAB_DIR` points at there.
pub const GUEST_LAB_DIR: &str = lab::DEFAULT_LAB_DIR;
/// Where `node-vm test` puts the binaries and examples.
pub const GUEST_WORK_DIR: &str = "/opt/podlapse";

/// The kernel command line: cgroup v2 only, eth0 for the one NIC, the console on the first
/// serial port.
pub const KERNEL_CMDLINE: &str =
    "root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 net.ifnames=0 quiet";

/// containerd 1.7, kept for the compatibility suite beside the reference 2.x: its
/// binaries (copied out of trixie's package before 2.x replaces it), config and unit.
/// The unit conflicts with `containerd.service`: one runtime serves the node's socket at a
/// time, and the suite switches between them.
pub const COMPAT_DIR: &str = "/opt/containerd-1.7";
pub const COMPAT_CONFIG: &str = "/etc/containerd-1.7/config.toml";
pub const COMPAT_UNIT: &str = "containerd-1.7.service";
/// The runtime unit serving the node's socket by default.
pub const REFERENCE_UNIT: &str = "containerd.service";

const CRI_V1: &str = "plugins.\"io.containerd.grpc.v1.cri\"";
const CRI_IMAGES: &str = "plugins.'io.containerd.cri.v1.images'";
const CRI_RUNTIME: &str = "plugins.'io.containerd.cri.v1.runtime'";

/// Edits to the config containerd 2.x's `containerd config default` writes (version 3,
/// table headers in single quotes): (table, key, value). Each must match a line of its
/// table, or the build fails rather than booting a node of the wrong shape.
pub fn containerd_edits() -> Vec<(String, &'static str, String)> {
    vec![
        (
            format!("{CRI_RUNTIME}.containerd.runtimes.runc.options"),
            "SystemdCgroup",
            "true".into(),
        ),
        (
            format!("{CRI_RUNTIME}.cni"),
            "bin_dirs",
            format!("[{}]", quote(CNI_BIN_DIR)),
        ),
        (
            format!("{CRI_RUNTIME}.cni"),
            "conf_dir",
            quote(CNI_CONF_DIR),
        ),
        (
            format!("{CRI_IMAGES}.pinned_images"),
            "sandbox",
            quote(lab::IMAGE_PAUSE),
        ),
        (
            format!("{CRI_IMAGES}.registry"),
            "config_path",
            quote(CERTS_DIR),
        ),
    ]
}

/// Edits to containerd 1.7's default config (version 2) for the compatibility runtime:
/// the same node shape, with a root and state of its own so the two runtimes never share
/// their stores.
pub fn compat_containerd_edits() -> Vec<(String, &'static str, String)> {
    vec![
        (String::new(), "root", quote("/var/lib/containerd-1.7")),
        (String::new(), "state", quote("/run/containerd-1.7")),
        (
            format!("{CRI_V1}.containerd.runtimes.runc.options"),
            "SystemdCgroup",
            "true".into(),
        ),
        (format!("{CRI_V1}.cni"), "bin_dir", quote(CNI_BIN_DIR)),
        (format!("{CRI_V1}.cni"), "conf_dir", quote(CNI_CONF_DIR)),
        (CRI_V1.to_string(), "sandbox_image", quote(lab::IMAGE_PAUSE)),
        (
            format!("{CRI_V1}.registry"),
            "config_path",
            quote(CERTS_DIR),
        ),
    ]
}

fn quote(s: &str) -> String {
    format!("\"{s}\"")
}

/// Applies `edits` ([`containerd_edits`], [`compat_containerd_edits`]) to a default
/// config; names each key that matched no line. The table `""` is the top level.
pub fn edit_containerd_config(
    default: &str,
    edits: &[(String, &'static str, String)],
) -> Result<String, Vec<&'static str>> {
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
        ("/etc/hostname".into(), 0o644, "podlapse-node\n".into()),
        (
            "/etc/hosts".into(),
            0o644,
            "127.0.0.1 localhost\n127.0.1.1 podlapse-node\n".into(),
        ),
        (
            "/etc/fstab".into(),
            0o644,
            "/dev/vda / ext4 rw,errors=remount-ro 0 1\n".into(),
        ),
        (
            format!("{CNI_CONF_DIR}/{}", lab::CNI_CONFLIST),
            0o644,
            conflist + "\n",
        ),
        (
            format!("{CERTS_DIR}/{}/hosts.toml", lab::REGISTRY_ADDR),
            0o644,
            lab::registry_hosts_toml(),
        ),
        // The host reaches the guest only through QEMU's forwarded port, with this key.
        ("/root/.ssh/authorized_keys".into(), 0o600, authorized_key.to_string()),
        (
            "/etc/ssh/sshd_config.d/podlapse.conf".into(),
            0o644,
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUseDNS no\nAllowTcpForwarding yes\n".into(),
        ),
        (
            "/etc/systemd/system/podlapse-net.service".into(),
            0o644,
            format!(
                "[Unit]\nDescription=the guest's address on QEMU's user network\nBindsTo=sys-subsystem-net-devices-eth0.device\nAfter=sys-subsystem-net-devices-eth0.device\nBefore=ssh.service network.target\nWants=network.target\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=ip link set lo up\nExecStart=ip link set eth0 up\nExecStart=ip addr replace {GUEST_ADDR} dev eth0\n\n[Install]\nWantedBy=multi-user.target\n"
            ),
        ),
        // containerd's tracing (OTLP over gRPC), to the lab's runtime collector address,
        // where podlapse's runtime-span receiver or a test's collector listens. 2.x
        // traces only calls whose parent is sampled: podlapse samples the calls it
        // exports, so nothing else starts a trace.
        (
            "/etc/systemd/system/containerd.service.d/podlapse-otel.conf".into(),
            0o644,
            otel_dropin("parentbased_always_off"),
        ),
        // 1.7 reads no traceparent: its own spans (an image pull's) start traces of their
        // own, which the compatibility suite checks stay out of podlapse's.
        (
            format!("/etc/systemd/system/{COMPAT_UNIT}.d/podlapse-otel.conf"),
            0o644,
            otel_dropin("parentbased_always_on"),
        ),
        (
            format!("/etc/systemd/system/{COMPAT_UNIT}"),
            0o644,
            format!(
                "[Unit]\nDescription=containerd 1.7 (podlapse's compatibility runtime)\nAfter=network.target local-fs.target\nConflicts={REFERENCE_UNIT}\n\n[Service]\nEnvironment=PATH={COMPAT_DIR}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nExecStartPre=-/sbin/modprobe overlay\nExecStart={COMPAT_DIR}/bin/containerd --config {COMPAT_CONFIG}\nType=notify\nDelegate=yes\nKillMode=process\nRestart=always\nRestartSec=5\nLimitNPROC=infinity\nLimitCORE=infinity\nTasksMax=infinity\nOOMScoreAdjust=-999\n"
            ),
        ),
        // Only what mounts a virtio-blk ext4 root: a small initramfs, built in seconds.
        (
            "/etc/initramfs-tools/conf.d/podlapse.conf".into(),
            0o644,
            "MODULES=list\nCOMPRESS=zstd\n".into(),
        ),
        (
            "/etc/initramfs-tools/modules".into(),
            0o644,
            "virtio_pci\nvirtio_blk\next4\n".into(),
        ),
        // The lab profile: podlapse and its tests find the runtime's socket here.
        (
            format!("{GUEST_LAB_DIR}/README"),
            0o644,
            "The podlapse lab profile of this node: lab.json and containerd/containerd.sock (a link to the system containerd's socket).\n".into(),
        ),
    ]
}

fn otel_dropin(sampler: &str) -> String {
    format!(
        "[Service]\nEnvironment=OTEL_EXPORTER_OTLP_ENDPOINT=http://{}\nEnvironment=OTEL_EXPORTER_OTLP_PROTOCOL=grpc\nEnvironment=OTEL_EXPORTER_OTLP_INSECURE=true\nEnvironment=OTEL_SERVICE_NAME=containerd\nEnvironment=OTEL_TRACES_SAMPLER={sampler}\n",
        lab::RUNTIME_OTLP_ADDR
    )
}

/// Units enabled in the guest.
pub const ENABLE_UNITS: &[&str] = &["podlapse-net.service", "ssh.service", "containerd.service"];

/// The cache key: every input of the image, and the image layout's version.
pub fn hash() -> String {
    const LAYOUT_VERSION: &str = "3";
    let mut h = Sha256::new();
    for part in [LAYOUT_VERSION, SUITE, MIRROR, KERNEL_CMDLINE] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    for p in PACKAGES {
        h.update(p.as_bytes());
        h.update([0]);
    }
    for (t, k, v) in containerd_edits()
        .into_iter()
        .chain(compat_containerd_edits())
    {
        h.update(format!("{t}.{k}={v}\0").as_bytes());
    }
    // The pinned runtime packages installed over trixie's, and the kernels.
    let kernels = super::kernels::KERNELS.iter().flat_map(|k| k.debs());
    for deb in [&xtask::debs::CONTAINERD, &xtask::debs::RUNC]
        .into_iter()
        .chain(kernels)
    {
        h.update(format!("{}\0{}\0", deb.spec(), deb.suite).as_bytes());
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

    const DEFAULT_17: &str = r#"version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
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

    /// The lines that matter of containerd 2.1.9's `containerd config default`.
    const DEFAULT_2: &str = r#"version = 3
root = '/var/lib/containerd'
state = '/run/containerd'
[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = 'registry.k8s.io/pause:3.10'
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = ''
  [plugins.'io.containerd.cri.v1.runtime']
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dir = ''
      bin_dirs = ['/usr/lib/cni', '/opt/cni/bin']
      conf_dir = '/etc/cni/net.d'
  [plugins.'io.containerd.transfer.v1.local']
    config_path = ''
"#;

    #[test]
    fn containerd_2_gets_the_systemd_driver_opt_cni_bin_and_the_lab_registry() {
        let out = edit_containerd_config(DEFAULT_2, &containerd_edits()).unwrap();
        assert!(out.contains("            SystemdCgroup = true\n"), "{out}");
        assert!(
            out.contains("      bin_dirs = [\"/opt/cni/bin\"]\n"),
            "{out}"
        );
        // 2.x refuses both keys set: the deprecated one stays empty.
        assert!(out.contains("      bin_dir = ''\n"), "{out}");
        assert!(out.contains("sandbox = \"127.0.0.1:5000/podlapse/pause:3.10\""));
        assert!(out.contains("      config_path = \"/etc/containerd/certs.d\"\n"));
        assert!(
            out.contains("    config_path = ''\n"),
            "only the CRI registry's: {out}"
        );
        assert!(out.contains("root = '/var/lib/containerd'\n"), "{out}");
        assert!(out.starts_with("version = 3\n"));
    }

    #[test]
    fn containerd_1_7_keeps_its_stores_apart_with_the_same_node_shape() {
        let out = edit_containerd_config(DEFAULT_17, &compat_containerd_edits()).unwrap();
        assert!(
            out.contains("root = \"/var/lib/containerd-1.7\"\n"),
            "{out}"
        );
        assert!(out.contains("state = \"/run/containerd-1.7\"\n"), "{out}");
        assert!(out.contains("            SystemdCgroup = true\n"), "{out}");
        assert!(out.contains("      bin_dir = \"/opt/cni/bin\"\n"), "{out}");
        assert!(out.contains("sandbox_image = \"127.0.0.1:5000/podlapse/pause:3.10\""));
        assert!(out.starts_with("version = 2\n"));
    }

    #[test]
    fn a_default_config_without_a_line_to_edit_names_the_key() {
        let missed = edit_containerd_config(DEFAULT_17, &containerd_edits()).unwrap_err();
        assert!(
            missed.contains(&"bin_dirs") && missed.contains(&"sandbox"),
            "{missed:?}"
        );
    }

    #[test]
    fn a_config_without_a_key_is_refused_naming_it() {
        let without = DEFAULT_2.replace("            SystemdCgroup = false\n", "");
        assert_eq!(
            edit_containerd_config(&without, &containerd_edits()),
            Err(vec!["SystemdCgroup"])
        );
    }

    #[test]
    fn the_hash_is_stable_and_short() {
        assert_eq!(hash(), hash());
        assert_eq!(hash().len(), 16);
    }
}
