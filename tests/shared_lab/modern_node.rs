//! The modern node: cgroup v2, systemd as PID 1, containerd 2.x (or, in the compatibility
//! suite, 1.7) with `SystemdCgroup = true` and CNI plugins in /opt/cni/bin. These tests run inside the QEMU guest that
//! `cargo xtask node-vm test` boots; on another node they fail at the first check, naming
//! what the node is instead.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use podlapse_tests::{
    Scratch, ip_in_subnet, pod, podlapse, require_lab, runtime_objects, runtime_objects_labelled,
    stderr, stdout,
};
use xtask::lab::{IMAGE_APP, POD_SUBNET};

const CGROUP_FS: &str = "/sys/fs/cgroup";
/// Where containerd (without `netns_mounts_under_state_dir`) mounts pod namespaces.
const NETNS_DIR: &str = "/var/run/netns";

/// Fails unless this is a node of the modern shape.
fn require_modern_node() {
    require_lab();
    let fs = Command::new("stat")
        .args(["-fc", "%T", CGROUP_FS])
        .output()
        .expect("stat");
    let comm = std::fs::read_to_string("/proc/1/comm").unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&fs.stdout).trim() == "cgroup2fs" && comm.trim() == "systemd",
        "not the modern node (cgroup fs {:?}, PID 1 {:?}): run these with `cargo xtask node-vm test`",
        String::from_utf8_lossy(&fs.stdout).trim(),
        comm.trim()
    );
}

/// Which containerd the suite says serves the node (`cargo xtask node-vm test` sets it):
/// the reference 2.x unless it says `1.7`.
fn expected_runtime() -> (u32, u32) {
    match std::env::var("PODLAPSE_NODE_RUNTIME").as_deref() {
        Ok("1.7") => (1, 7),
        _ => (2, 0),
    }
}

#[test]
fn cri_info_shows_the_runtime_the_systemd_driver_opt_cni_bin_and_cgroup_v2() {
    require_modern_node();
    let out = podlapse(&["cri", "info"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("runtime:        containerd "))
        .unwrap_or_else(|| panic!("no containerd runtime line: {text}"));
    let mut parts = version.split(['.', '~', '-', '+']);
    let (major, minor): (u32, u32) = (
        parts.next().unwrap().parse().unwrap(),
        parts.next().unwrap().parse().unwrap(),
    );
    let expected = expected_runtime();
    if expected.0 >= 2 {
        // containerd 2.x: the driver from CRI RuntimeConfig, the plugins from `binDirs`.
        assert!(major >= 2, "containerd {version}, not 2.x: {text}");
        assert!(
            text.contains("cgroup driver:  systemd (from CRI RuntimeConfig)"),
            "{text}"
        );
        assert!(
            text.contains("CNI plugins:    /opt/cni/bin (from runtime status info cni.binDirs)\n"),
            "{text}"
        );
        assert!(
            text.contains("ContainerdHasNoDeprecationWarnings"),
            "2.x's deprecation condition is shown: {text}"
        );
    } else {
        // containerd 1.7 answers no RuntimeConfig: its status info says both.
        assert_eq!((major, minor), expected, "containerd {version}: {text}");
        assert!(
            text.contains("cgroup driver:  systemd (from runtime status info (SystemdCgroup))"),
            "{text}"
        );
        assert!(
            text.contains("CNI plugins:    /opt/cni/bin (from runtime status info cni.binDir)\n"),
            "{text}"
        );
    }
    assert!(
        text.contains("CNI config:     /etc/cni/net.d (from runtime status info cni.confDir)\n"),
        "{text}"
    );
    assert!(text.contains("cgroups:        v2 (unified)"), "{text}");
    // Debian's kernel has kprobes: the namespace probes are kernel functions here.
    assert!(
        text.contains("netns probes:   kprobes on the kernel functions"),
        "{text}"
    );
    assert!(text.contains("NetworkReady    true"), "{text}");
}

/// A pod of each QoS class. The figures below follow from kubelet's cgroup v2 mapping:
/// shares = milliCPU * 1024 / 1000 (at least 2); cpu.weight from shares by the curve
/// kubelet and runc use now, ceil(10^((l^2 + 125 l) / 612 - 7/34)) with l = log2(shares),
/// so 1024 shares is weight 100 (256 -> 35, 102 -> 17, 2 -> 1); cpu.max quota = milliCPU *
/// 100 per 100 ms period; memory.max = the sum of the limits.
fn qos_pods() -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: qos-guaranteed}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    image: {IMAGE_APP}
    command: [sleep, "3600"]
    resources:
      requests: {{cpu: 250m, memory: 64Mi}}
      limits: {{cpu: 250m, memory: 64Mi}}
---
apiVersion: v1
kind: Pod
metadata: {{name: qos-burstable}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    image: {IMAGE_APP}
    command: [sleep, "3600"]
    resources:
      requests: {{cpu: 100m}}
      limits: {{memory: 128Mi}}
---
apiVersion: v1
kind: Pod
metadata: {{name: qos-besteffort}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - {{name: c, image: "{IMAGE_APP}", command: [sleep, "3600"]}}
"#
    )
}

/// (pod, QoS slice below the root, cpu.weight, cpu.max, memory.max)
const EXPECTED: [(&str, Option<&str>, &str, &str, &str); 3] = [
    ("qos-guaranteed", None, "35", "25000 100000", "67108864"),
    (
        "qos-burstable",
        Some("burstable"),
        "17",
        "max 100000",
        "134217728",
    ),
    (
        "qos-besteffort",
        Some("besteffort"),
        "1",
        "max 100000",
        "max",
    ),
];

/// The pod's slice as kubelet's systemd cgroup driver names it: `<root>.slice`, then
/// `<root>-<qos>.slice`, then `<root>-<qos>-pod<uid with _ for ->.slice`.
fn pod_slice(root: &str, qos: Option<&str>, uid: &str) -> PathBuf {
    let uid = uid.replace('-', "_");
    let mut p = PathBuf::from(CGROUP_FS).join(format!("{root}.slice"));
    let prefix = match qos {
        Some(q) => {
            p.push(format!("{root}-{q}.slice"));
            format!("{root}-{q}")
        }
        None => root.to_string(),
    };
    p.push(format!("{prefix}-pod{uid}.slice"));
    p
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

fn netns_entries() -> BTreeSet<String> {
    std::fs::read_dir(NETNS_DIR)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn ipam_reservations() -> BTreeSet<String> {
    let dir = podlapse_tests::lab()
        .ipam_dir()
        .join(xtask::lab::CNI_NETWORK);
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.parse::<std::net::Ipv4Addr>().is_ok())
                .collect()
        })
        .unwrap_or_default()
}

/// systemd's units whose names hold the pod's UID (slices and scopes alike).
fn units_of(uid: &str) -> Vec<String> {
    let out = Command::new("systemctl")
        .args([
            "list-units",
            "--all",
            "--plain",
            "--no-legend",
            "--no-pager",
        ])
        .output()
        .expect("systemctl");
    let escaped = uid.replace('-', "_");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&escaped))
        .map(|l| l.split_whitespace().next().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn qos_pods_get_kubelets_slices_and_limits_and_leave_nothing_behind() {
    require_modern_node();
    let scratch = Scratch::new();
    let manifest = scratch.manifest("qos.yaml", &qos_pods());
    let netns_before = netns_entries();
    // A root of the test's own, so other pods' slices do not count.
    let root = "ptqos";
    let cgroup_root = format!("/{root}");
    let (out, doc) = scratch.run(&[&manifest], &["--cgroup-root", &cgroup_root]);
    assert!(out.status.success(), "{doc:#}\n{}", stderr(&out));

    let mut uids = Vec::new();
    let mut ips = Vec::new();
    for (name, qos, weight, cpu_max, memory_max) in EXPECTED {
        let p = pod(&doc, name);
        assert_eq!(p["phase"], "Running", "{p:#}");
        let ip = p["ip"].as_str().unwrap_or_default().to_string();
        assert!(ip_in_subnet(&ip, POD_SUBNET), "{name} got {ip:?}");
        let uid = p["uid"].as_str().unwrap().to_string();
        let slice = pod_slice(root, qos, &uid);
        assert!(slice.is_dir(), "{name}: no slice {}", slice.display());
        assert_eq!(read(&slice.join("cpu.weight")), weight, "{name} cpu.weight");
        assert_eq!(read(&slice.join("cpu.max")), cpu_max, "{name} cpu.max");
        assert_eq!(
            read(&slice.join("memory.max")),
            memory_max,
            "{name} memory.max"
        );
        // Every container of the pod, the sandbox's among them, is a runc scope in the
        // pod's slice.
        let (sandboxes, containers) = runtime_objects(&uid);
        assert_eq!(sandboxes.len(), 1, "{name}: {sandboxes:?}");
        for id in sandboxes.iter().chain(&containers) {
            let scope = slice.join(format!("cri-containerd-{id}.scope"));
            assert!(scope.is_dir(), "{name}: no scope {}", scope.display());
            assert_ne!(
                read(&scope.join("cgroup.procs")),
                "",
                "{name}: empty scope {id}"
            );
        }
        assert!(
            ipam_reservations().contains(&ip),
            "{name}: no IPAM reservation for {ip}"
        );
        uids.push((name, uid, slice));
        ips.push(ip);
    }
    let netns_during = netns_entries();
    assert!(
        netns_during.difference(&netns_before).count() >= 3,
        "three new pod netns in {NETNS_DIR}: before {netns_before:?}, during {netns_during:?}"
    );

    let (out, doc) = scratch.run(&[&manifest], &["--cleanup", "--cgroup-root", &cgroup_root]);
    assert!(out.status.success(), "{doc:#}\n{}", stderr(&out));
    assert_eq!(doc["cleaned_up"], true, "{doc:#}");
    for (name, uid, slice) in &uids {
        assert!(!slice.exists(), "{name}: {} is left", slice.display());
        assert_eq!(
            units_of(uid),
            Vec::<String>::new(),
            "{name}: systemd units left"
        );
        let (sandboxes, containers) = runtime_objects(uid);
        assert!(
            sandboxes.is_empty() && containers.is_empty(),
            "{name} left {sandboxes:?} {containers:?}"
        );
    }
    assert_eq!(
        netns_entries(),
        netns_before,
        "pod netns left in {NETNS_DIR}"
    );
    let held = ipam_reservations();
    for ip in &ips {
        assert!(!held.contains(ip), "IPAM still holds {ip}");
    }
}

/// A slice systemd refuses (masked, as an administrator might): one line naming it, exit 2,
/// and no sandbox made.
#[test]
fn a_slice_systemd_refuses_is_exit_2_and_creates_nothing() {
    require_modern_node();
    let root = "ptrefused";
    let unit = format!("{root}.slice");
    let mask = Command::new("systemctl")
        .args(["mask", "--runtime", &unit])
        .status()
        .unwrap();
    assert!(mask.success());
    struct Unmask(String);
    impl Drop for Unmask {
        fn drop(&mut self) {
            let _ = Command::new("systemctl")
                .args(["unmask", "--runtime", &self.0])
                .status();
        }
    }
    let _unmask = Unmask(unit.clone());
    let scratch = Scratch::new();
    let manifest = scratch.manifest(
        "pod.yaml",
        &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: refused-slice}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {IMAGE_APP}, command: [sleep, '3600']}}\n"),
    );
    let root_dir = scratch.root_dir().display().to_string();
    let out = podlapse(&[
        "run",
        "--until-ready",
        "--root-dir",
        &root_dir,
        "--cgroup-root",
        &format!("/{root}"),
        "--manifests",
        manifest.to_str().unwrap(),
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0].contains(&unit) && lines[0].contains("systemd"),
        "names the slice and systemd: {err}"
    );
    let (sandboxes, containers) = runtime_objects_labelled(
        "io.kubernetes.pod.name",
        &podlapse_tests::static_name("refused-slice", &podlapse_tests::host_node()),
    );
    assert!(
        sandboxes.is_empty() && containers.is_empty(),
        "{sandboxes:?} {containers:?}"
    );
    assert!(!Path::new(CGROUP_FS).join(&unit).exists());
}
