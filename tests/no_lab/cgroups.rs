//! Pod cgroups on the real kernel, no lab needed: per-QoS placement and limits read back
//! from cgroupfs, orphan listing, removal in every hierarchy, and straggler processes.
//! Each test works under its own root, `/podlapse-test-<pid>-<test>`, and removes it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use podlapse::cm::{CgroupDriver, CgroupLayout, CmError, PodContainerManager, cgroup_dir};
use podlapse::config::load_paths;
use podlapse::kubelet::qos::{QosClass, pod_qos};
use xtask::lab::IMAGE_APP;

fn pods_yaml() -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: guaranteed}}
spec:
  terminationGracePeriodSeconds: 2
  initContainers:
  - name: setup
    image: {IMAGE_APP}
    resources: {{limits: {{cpu: 100m, memory: 32Mi}}}}
  containers:
  - name: app
    image: {IMAGE_APP}
    resources: {{limits: {{cpu: 250m, memory: 64Mi}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: burstable}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: limited
    image: {IMAGE_APP}
    resources:
      requests: {{cpu: 100m}}
      limits: {{cpu: 200m, memory: 128Mi}}
  - name: cpu-unlimited
    image: {IMAGE_APP}
    resources:
      requests: {{cpu: 50m}}
      limits: {{memory: 32Mi}}
---
apiVersion: v1
kind: Pod
metadata: {{name: besteffort}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: {IMAGE_APP}
"#
    )
}

const MI: i64 = 1024 * 1024;

/// A test's own cgroup root, removed with everything below it (processes killed) when
/// the test ends, pass or fail.
struct TestRoot {
    root: String,
    layout: CgroupLayout,
    children: Vec<Child>,
}

impl TestRoot {
    fn new(test: &str) -> TestRoot {
        let layout = CgroupLayout::discover().expect("cgroup mounts");
        TestRoot {
            root: format!("/podlapse-test-{}-{test}", std::process::id()),
            layout,
            children: Vec::new(),
        }
    }

    fn manager(&self) -> PodContainerManager {
        PodContainerManager::new(&self.root, self.layout.clone(), CgroupDriver::Cgroupfs)
            .expect("valid root")
    }

    fn dirs(&self, cgroup: &str) -> Vec<PathBuf> {
        self.layout
            .mountpoints()
            .iter()
            .map(|m| cgroup_dir(m, cgroup))
            .collect()
    }

    /// Starts `sleep` and moves it into `cgroup` in every hierarchy, as runc would.
    fn spawn_into(&mut self, cgroup: &str) -> u32 {
        let child = Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        self.children.push(child);
        for dir in self.dirs(cgroup) {
            std::fs::write(dir.join("cgroup.procs"), pid.to_string())
                .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", dir.display()));
        }
        pid
    }
}

impl Drop for TestRoot {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for top in self.dirs(&self.root) {
            if let Some(freezer) = self.layout.controller_mountpoint("freezer")
                && top.starts_with(freezer)
            {
                for d in walk(&top) {
                    let _ = std::fs::write(d.join("freezer.state"), "THAWED");
                }
            }
            let mut all = walk(&top);
            all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            for d in all {
                let _ = std::fs::remove_dir(&d);
            }
        }
    }
}

/// The node the manifests are read for.
const NODE: &str = "cgroups-test-node";

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(entries) = std::fs::read_dir(&d) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
            out.push(d);
        }
    }
    out
}

fn pods() -> Vec<podlapse::config::StaticPod> {
    let dir = tempfile::tempdir().unwrap();
    for (i, doc) in podlapse_tests::documents(&pods_yaml()).iter().enumerate() {
        std::fs::write(dir.path().join(format!("pod-{i}.yaml")), doc).unwrap();
    }
    let (pods, errors) = load_paths(&[dir.path().to_path_buf()], NODE);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(pods.len(), 3);
    pods
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.join(file).display()))
        .trim()
        .to_string()
}

fn read_i64(dir: &Path, file: &str) -> i64 {
    read(dir, file).parse().unwrap()
}

/// What the kernel holds for one pod cgroup, in v1 terms.
#[derive(Debug, PartialEq)]
struct Limits {
    shares: i64,
    quota: Option<i64>,
    period: i64,
    memory: Option<i64>,
}

fn kernel_limits(layout: &CgroupLayout, cgroup: &str) -> Limits {
    match layout {
        CgroupLayout::V1 { .. } => {
            let cpu = cgroup_dir(layout.controller_mountpoint("cpu").unwrap(), cgroup);
            let mem = cgroup_dir(layout.controller_mountpoint("memory").unwrap(), cgroup);
            let quota = read_i64(&cpu, "cpu.cfs_quota_us");
            // Unlimited memory reads back as the page counter's maximum.
            let memory = read_i64(&mem, "memory.limit_in_bytes");
            Limits {
                shares: read_i64(&cpu, "cpu.shares"),
                quota: (quota >= 0).then_some(quota),
                period: read_i64(&cpu, "cpu.cfs_period_us"),
                memory: (memory < 1 << 62).then_some(memory),
            }
        }
        CgroupLayout::V2 { mountpoint } => {
            let dir = cgroup_dir(mountpoint, cgroup);
            let max = read(&dir, "cpu.max");
            let (quota, period) = max.split_once(' ').unwrap();
            let memory = read(&dir, "memory.max");
            Limits {
                // Compared through the weight: v2 keeps no shares.
                shares: read_i64(&dir, "cpu.weight"),
                quota: quota.parse().ok(),
                period: period.parse().unwrap(),
                memory: memory.parse().ok(),
            }
        }
    }
}

/// `shares` as the kernel reports it: itself on v1, its weight on v2.
fn shares(layout: &CgroupLayout, shares: u64) -> i64 {
    if layout.is_unified() {
        podlapse::cm::cpu_shares_to_weight(shares) as i64
    } else {
        shares as i64
    }
}

#[test]
fn pod_cgroups_per_qos_class() {
    let t = TestRoot::new("qos");
    let m = t.manager();
    m.ensure_qos_cgroups().unwrap();
    m.ensure_qos_cgroups().expect("idempotent");
    for class in [
        QosClass::Guaranteed,
        QosClass::Burstable,
        QosClass::BestEffort,
    ] {
        for dir in t.dirs(&m.qos_cgroup(class)) {
            assert!(dir.is_dir(), "{} missing", dir.display());
        }
    }
    let besteffort = kernel_limits(&t.layout, &m.qos_cgroup(QosClass::BestEffort));
    assert_eq!(besteffort.shares, shares(&t.layout, 2));

    let pods = pods();
    let mut uids = BTreeSet::new();
    let mut names = Vec::new();
    for sp in &pods {
        let uid = sp.pod.metadata.uid.clone().expect("static pods get UIDs");
        let name = m.ensure_pod_cgroup(&sp.pod).unwrap();
        assert_eq!(m.ensure_pod_cgroup(&sp.pod).unwrap(), name, "idempotent");
        let parent = m.qos_cgroup(pod_qos(&sp.pod));
        assert_eq!(name, format!("{parent}/pod{uid}"));
        for dir in t.dirs(&name) {
            assert!(dir.is_dir(), "{} missing", dir.display());
        }
        assert!(m.pod_cgroup_exists(&uid));
        uids.insert(uid);
        names.push((
            sp.pod.metadata.name.clone().unwrap(),
            pod_qos(&sp.pod),
            name,
        ));
    }

    let period = 100_000;
    for (pod, class, name) in &names {
        let got = kernel_limits(&t.layout, name);
        // Static pods are named `<name>-<node>`.
        let want = match pod.strip_suffix(&format!("-{NODE}")).unwrap_or(pod) {
            "guaranteed" => {
                assert_eq!(*class, QosClass::Guaranteed);
                assert!(name.starts_with(&format!("{}/pod", t.root)));
                Limits {
                    shares: shares(&t.layout, 256),
                    quota: Some(25_000),
                    period,
                    memory: Some(64 * MI),
                }
            }
            "burstable" => {
                assert_eq!(*class, QosClass::Burstable);
                assert!(name.starts_with(&format!("{}/burstable/pod", t.root)));
                // One container has no cpu limit: no quota; both limit memory: 160Mi.
                Limits {
                    shares: shares(&t.layout, 153),
                    quota: None,
                    period,
                    memory: Some(160 * MI),
                }
            }
            "besteffort" => {
                assert_eq!(*class, QosClass::BestEffort);
                assert!(name.starts_with(&format!("{}/besteffort/pod", t.root)));
                Limits {
                    shares: shares(&t.layout, 2),
                    quota: None,
                    period,
                    memory: None,
                }
            }
            other => panic!("unexpected pod {other}"),
        };
        assert_eq!(got, want, "{pod} at {name}");
    }

    assert_eq!(m.list_pod_cgroups().unwrap(), uids);
    // The Burstable tier weighs what its one pod requests.
    m.update_qos_cgroups(pods.iter().map(|p| &p.pod)).unwrap();
    assert_eq!(
        kernel_limits(&t.layout, &m.qos_cgroup(QosClass::Burstable)).shares,
        shares(&t.layout, 153),
    );

    for uid in &uids {
        m.destroy_pod_cgroup(uid).unwrap();
        assert!(!m.pod_cgroup_exists(uid));
        m.destroy_pod_cgroup(uid).expect("destroying twice is fine");
    }
    assert!(m.list_pod_cgroups().unwrap().is_empty());
    for (_, _, name) in &names {
        for dir in t.dirs(name) {
            assert!(!dir.exists(), "{} left behind", dir.display());
        }
    }

    for class in [
        QosClass::Burstable,
        QosClass::BestEffort,
        QosClass::Guaranteed,
    ] {
        for dir in t.dirs(&m.qos_cgroup(class)) {
            std::fs::remove_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        }
    }
    for dir in t.dirs(&t.root) {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}

#[test]
fn destroy_kills_stragglers_in_nested_cgroups() {
    let mut t = TestRoot::new("kill");
    let m = t.manager();
    m.ensure_qos_cgroups().unwrap();
    let pods = pods();
    let pod = &pods[2].pod;
    let uid = pod.metadata.uid.clone().unwrap();
    let name = m.ensure_pod_cgroup(pod).unwrap();
    // Where runc would put a container: a child of the pod cgroup.
    let container = format!("{name}/ctr");
    for dir in t.dirs(&container) {
        std::fs::create_dir(&dir).unwrap();
        if dir.join("cpuset.cpus").exists() {
            for f in ["cpuset.cpus", "cpuset.mems"] {
                let v = read(dir.parent().unwrap(), f);
                std::fs::write(dir.join(f), v).unwrap();
            }
        }
    }
    t.spawn_into(&container);
    t.spawn_into(&name);

    m.destroy_pod_cgroup(&uid).unwrap();
    for c in &mut t.children {
        use std::os::unix::process::ExitStatusExt;
        let status = c.wait().unwrap();
        assert_eq!(status.signal(), Some(9), "killed with SIGKILL");
    }
    t.children.clear();
    for dir in t.dirs(&name) {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
    assert!(m.list_pod_cgroups().unwrap().is_empty());
}

#[test]
fn frozen_processes_keep_the_cgroup_busy() {
    let mut t = TestRoot::new("busy");
    let Some(freezer) = t
        .layout
        .controller_mountpoint("freezer")
        .map(Path::to_path_buf)
    else {
        eprintln!("no v1 freezer hierarchy: nothing to test");
        return;
    };
    let m = t.manager();
    m.ensure_qos_cgroups().unwrap();
    let pods = pods();
    let pod = &pods[2].pod;
    let uid = pod.metadata.uid.clone().unwrap();
    let name = m.ensure_pod_cgroup(pod).unwrap();
    let pid = t.spawn_into(&name);
    let frozen = cgroup_dir(&freezer, &name);
    std::fs::write(frozen.join("freezer.state"), "FROZEN").unwrap();

    match m.destroy_pod_cgroup(&uid) {
        Err(CmError::CgroupBusy { path, pids }) => {
            assert!(path.ends_with(format!("pod{uid}")), "{}", path.display());
            assert_eq!(pids, [pid as i32]);
            let text = CmError::CgroupBusy { path, pids }.to_string();
            assert!(text.contains(&format!("pod{uid}")), "{text}");
        }
        other => panic!("expected the frozen cgroup to be busy, got {other:?}"),
    }

    std::fs::write(frozen.join("freezer.state"), "THAWED").unwrap();
    m.destroy_pod_cgroup(&uid).expect("removable once thawed");
    t.children.pop().unwrap().wait().unwrap();
    for dir in t.dirs(&name) {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}
