//! Real-world-shaped manifests run as kubelet runs them: what the runtime applied, read
//! from inside each container (its own `/proc/self/status` and PID 1), and what kubelet
//! refuses, with kubelet's reason and message.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use podtrace::cri::{CriClient, Endpoint, EndpointSource, RuntimeService, Timeouts, api};
use podtrace_tests::{Scratch, lab, pod, require_lab, runtime_objects, stderr};

const IMAGE: &str = "127.0.0.1:5000/podtrace/app:1.0";

/// The `run --until-ready` of some manifests, cleaned up however the test ends.
struct Running {
    scratch: Scratch,
    manifests: Vec<PathBuf>,
    doc: serde_json::Value,
}

impl Running {
    fn start(files: &[(&str, String)]) -> Running {
        require_lab();
        let scratch = Scratch::new();
        let manifests: Vec<PathBuf> = files
            .iter()
            .map(|(name, text)| scratch.manifest(name, text))
            .collect();
        let paths: Vec<&std::path::Path> = manifests.iter().map(PathBuf::as_path).collect();
        let (out, doc) = scratch.run(&paths, &[]);
        let running = Running {
            scratch,
            manifests,
            doc,
        };
        assert!(
            out.status.success() || running.doc["pods"].is_array(),
            "{:#}\n{}",
            running.doc,
            stderr(&out)
        );
        running
    }

    fn uid(&self, name: &str) -> String {
        pod(&self.doc, name)["uid"].as_str().unwrap().to_string()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let paths: Vec<&std::path::Path> = self.manifests.iter().map(PathBuf::as_path).collect();
        let (out, doc) = self.scratch.run(&paths, &["--cleanup"]);
        if !out.status.success() && doc["cleaned_up"] != true {
            eprintln!("cleanup failed: {doc:#}\n{}", stderr(&out));
        }
    }
}

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

async fn connect() -> CriClient {
    let sock = lab().cri_socket();
    let ep = Endpoint {
        given: sock.display().to_string(),
        path: sock,
        source: EndpointSource::Flag,
    };
    CriClient::connect(ep, Timeouts::default())
        .await
        .expect("lab CRI")
}

/// Runs `cmd` in the pod's running container `container` (CRI ExecSync: the exec'd process
/// gets the container's user, capabilities, no_new_privs and seccomp) and returns stdout.
fn exec(uid: &str, container: &str, cmd: &[&str]) -> String {
    block_on(async {
        let cri = connect().await;
        let running = cri
            .list_containers(Some(api::ContainerFilter {
                state: Some(api::ContainerStateValue {
                    state: api::ContainerState::ContainerRunning.into(),
                }),
                label_selector: HashMap::from([
                    ("io.kubernetes.pod.uid".to_string(), uid.to_string()),
                    (
                        "io.kubernetes.container.name".to_string(),
                        container.to_string(),
                    ),
                ]),
                ..Default::default()
            }))
            .await
            .expect("ListContainers");
        assert_eq!(running.len(), 1, "{container}: {running:#?}");
        let out = cri
            .exec_sync(
                &running[0].id,
                cmd.iter().map(|s| s.to_string()).collect(),
                30,
            )
            .await
            .unwrap_or_else(|e| panic!("exec {cmd:?} in {container}: {e}"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
}

/// The fields of `/proc/self/status` as the container's own process sees them.
fn status(uid: &str, container: &str) -> BTreeMap<String, String> {
    exec(uid, container, &["cat", "/proc/self/status"])
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

/// `Uid:`/`Gid:` hold real, effective, saved and filesystem ids: all must be `id`.
fn ids(status: &BTreeMap<String, String>, key: &str) -> Vec<String> {
    status[key].split_whitespace().map(str::to_string).collect()
}

fn groups(status: &BTreeMap<String, String>) -> BTreeSet<u32> {
    status["Groups"]
        .split_whitespace()
        .map(|g| g.parse().unwrap())
        .collect()
}

fn pid1(uid: &str, container: &str) -> String {
    exec(uid, container, &["cat", "/proc/1/cmdline"]).replace('\0', " ")
}

/// The restricted profile's container beside one that overrides the pod's user back to
/// root: each gets what it asked for, and nothing more.
fn secure_pod() -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: security-context-demo
spec:
  terminationGracePeriodSeconds: 2
  securityContext:
    runAsUser: 1000
    runAsGroup: 3000
    fsGroup: 2000
    supplementalGroups: [4000]
  containers:
  - name: restricted
    image: {IMAGE}
    command: [sleep, "3600"]
    securityContext:
      allowPrivilegeEscalation: false
      capabilities:
        drop: [ALL]
        add: [NET_BIND_SERVICE]
      seccompProfile:
        type: RuntimeDefault
  - name: root-readonly
    image: {IMAGE}
    command: [sleep, "3600"]
    securityContext:
      runAsUser: 0
      runAsGroup: 0
      readOnlyRootFilesystem: true
"#
    )
}

#[test]
fn each_container_runs_with_the_user_groups_capabilities_and_seccomp_it_asked_for() {
    let run = Running::start(&[("secure.yaml", secure_pod())]);
    let p = pod(&run.doc, "security-context-demo");
    assert_eq!(p["phase"], "Running", "{:#}", run.doc);
    let uid = run.uid("security-context-demo");

    let restricted = status(&uid, "restricted");
    assert_eq!(ids(&restricted, "Uid"), ["1000"; 4], "{restricted:#?}");
    assert_eq!(ids(&restricted, "Gid"), ["3000"; 4], "{restricted:#?}");
    let g = groups(&restricted);
    assert!(
        g.contains(&2000) && g.contains(&4000),
        "fsGroup and supplementalGroups: {g:?}"
    );
    // Every capability dropped but the one added (CAP_NET_BIND_SERVICE, bit 10) bounds
    // the process; a non-root user holds none of them in effect.
    assert_eq!(restricted["CapBnd"], "0000000000000400", "{restricted:#?}");
    assert_eq!(restricted["CapEff"], "0000000000000000", "{restricted:#?}");
    assert_eq!(
        restricted["NoNewPrivs"], "1",
        "allowPrivilegeEscalation: false"
    );
    assert_eq!(
        restricted["Seccomp"], "2",
        "RuntimeDefault is a seccomp filter"
    );

    let root = status(&uid, "root-readonly");
    assert_eq!(ids(&root, "Uid"), ["0"; 4], "{root:#?}");
    assert_eq!(ids(&root, "Gid"), ["0"; 4], "{root:#?}");
    let g = groups(&root);
    assert!(g.contains(&2000) && g.contains(&4000), "{g:?}");
    // The runtime's default set, not everything: no CAP_SYS_ADMIN (bit 21).
    let cap_eff = u64::from_str_radix(&root["CapEff"], 16).unwrap();
    assert!(cap_eff != 0 && cap_eff & (1 << 21) == 0, "{root:#?}");
    assert_eq!(root["NoNewPrivs"], "0", "{root:#?}");
    assert_eq!(root["Seccomp"], "0", "no profile asked for: Unconfined");
    let touch = exec(
        &uid,
        "root-readonly",
        &["sh", "-c", "touch /written 2>&1; echo rc=$?"],
    );
    assert!(
        touch.contains("Read-only file system") && touch.contains("rc=1"),
        "{touch}"
    );

    // Each container is PID 1 of its own PID namespace.
    for c in ["restricted", "root-readonly"] {
        let first = pid1(&uid, c);
        assert!(first.starts_with("sleep 3600"), "{c}'s PID 1 is {first:?}");
    }
}

#[test]
fn a_pod_that_shares_its_process_namespace_sees_the_sandboxs_process_as_pid_1() {
    let text = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: shared-pid
spec:
  terminationGracePeriodSeconds: 2
  shareProcessNamespace: true
  containers:
  - name: app
    image: {IMAGE}
    command: [sleep, "3600"]
  - name: shell
    image: {IMAGE}
    command: [sleep, "3601"]
"#
    );
    let run = Running::start(&[("shared.yaml", text)]);
    assert_eq!(
        pod(&run.doc, "shared-pid")["phase"],
        "Running",
        "{:#}",
        run.doc
    );
    let uid = run.uid("shared-pid");
    // PID 1 of both is the sandbox's process (the pause container's), neither's own.
    let first = pid1(&uid, "shell");
    assert_eq!(first, pid1(&uid, "app"));
    assert!(!first.starts_with("sleep"), "PID 1 is {first:?}");
    // Each container sees the other's process.
    let ps = exec(
        &uid,
        "shell",
        &["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"],
    );
    assert!(
        ps.contains("sleep 3600") && ps.contains("sleep 3601"),
        "{ps}"
    );
}

#[test]
fn run_as_non_root_against_a_root_image_is_refused_before_the_container_is_created() {
    let text = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: nonroot
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: {IMAGE}
    command: [sleep, "3600"]
    securityContext:
      runAsNonRoot: true
"#
    );
    let run = Running::start(&[("nonroot.yaml", text)]);
    let p = pod(&run.doc, "nonroot");
    let uid = run.uid("nonroot");
    assert_ne!(p["phase"], "Running", "{p:#}");
    assert_eq!(p["reason"], "CreateContainerConfigError", "{p:#}");
    assert_eq!(
        p["message"].as_str().unwrap(),
        format!(
            "container has runAsNonRoot and image will run as root (pod: \"nonroot_default({uid})\", container: app)"
        ),
        "{p:#}"
    );
    let (sandboxes, containers) = runtime_objects(&uid);
    assert_eq!(
        sandboxes.len(),
        1,
        "the sandbox is made first, as kubelet does"
    );
    assert!(
        containers.is_empty(),
        "no container was created: {containers:?}"
    );
}
