//! Real-world-shaped manifests run as kubelet runs them: what the runtime applied, read
//! from inside each container (its own `/proc/self/status` and PID 1), and what kubelet
//! refuses, with kubelet's reason and message.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use podlapse::cri::{RuntimeService, api};
use podlapse_tests::{Scratch, lab_cri, pod, require_lab, runtime_objects, stderr};

use xtask::lab::IMAGE_APP as IMAGE;

/// The `run --until-ready` of some manifests, cleaned up however the test ends.
struct Running {
    scratch: Scratch,
    manifests: Vec<PathBuf>,
    /// The flags of every run (the start and the cleanup): the node's name, if given.
    extra: Vec<String>,
    doc: serde_json::Value,
}

impl Running {
    fn start(files: &[(&str, String)]) -> Running {
        Running::start_with(files, &[])
    }

    fn start_with(files: &[(&str, String)], extra: &[&str]) -> Running {
        require_lab();
        let scratch = Scratch::new();
        let manifests: Vec<PathBuf> = files
            .iter()
            .map(|(name, text)| scratch.manifest(name, text))
            .collect();
        let paths: Vec<&std::path::Path> = manifests.iter().map(PathBuf::as_path).collect();
        let (out, doc) = scratch.run(&paths, extra);
        let running = Running {
            scratch,
            manifests,
            extra: extra.iter().map(|s| s.to_string()).collect(),
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
        let mut extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        extra.push("--cleanup");
        let (out, doc) = self.scratch.run(&paths, &extra);
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

/// Runs `cmd` in the pod's running container `container` (CRI ExecSync: the exec'd process
/// gets the container's user, capabilities, no_new_privs and seccomp) and returns stdout.
fn exec(uid: &str, container: &str, cmd: &[&str]) -> String {
    block_on(async {
        let cri = lab_cri().await;
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
            "container has runAsNonRoot and image will run as root (pod: \"{}_default({uid})\", container: app)",
            p["name"].as_str().unwrap()
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

#[test]
fn a_pod_with_a_container_that_never_starts_is_shown_and_counted_as_not_running() {
    let text = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: half-started
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: {IMAGE}
    command: [sleep, "3600"]
  - name: broken
    image: {IMAGE}
    command: [/no/such/binary]
"#
    );
    require_lab();
    let scratch = Scratch::new();
    let manifest = scratch.manifest("half.yaml", &text);
    let (out, doc) = scratch.run(&[&manifest], &["--cleanup"]);
    assert_eq!(out.status.code(), Some(1), "{doc:#}\n{}", stderr(&out));
    let p = pod(&doc, "half-started");
    let not_running = p["not_running"].as_array().unwrap();
    assert_eq!(not_running.len(), 1, "{p:#}");
    assert_eq!(not_running[0]["container"], "broken");
    let reason = not_running[0]["reason"].as_str().unwrap_or_default();
    assert!(
        ["RunContainerError", "CrashLoopBackOff", "StartError"].contains(&reason),
        "{p:#}"
    );
    // Without --json: the summary counts it out, and the container's line says why.
    let scratch = Scratch::new();
    let manifest = scratch.manifest("half.yaml", &text);
    let root = scratch.root_dir().display().to_string();
    let logs = scratch.logs_dir().display().to_string();
    let out = podlapse_tests::podlapse(&[
        "run",
        "--until-ready",
        "--cleanup",
        "--root-dir",
        &root,
        "--pod-logs-dir",
        &logs,
        "--manifests",
        manifest.to_str().unwrap(),
    ]);
    let text = podlapse_tests::stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("0/1 pods Running with every container running"),
        "{text}"
    );
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("container broken"))
        .unwrap_or_else(|| panic!("no line for the container: {text}"));
    assert!(
        ["RunContainerError", "CrashLoopBackOff", "StartError"]
            .iter()
            .any(|r| line.contains(r)),
        "{line}"
    );
}

/// What the lab's runtime says it can do: (Strict supplemental groups, user namespaces
/// for the default handler).
fn runtime_features() -> (bool, bool) {
    block_on(async {
        let status = lab_cri().await.status(false).await.expect("Status");
        let strict = status
            .features
            .as_ref()
            .is_some_and(|f| f.supplemental_groups_policy);
        let userns = status
            .runtime_handlers
            .iter()
            .any(|h| h.name.is_empty() && h.features.as_ref().is_some_and(|f| f.user_namespaces));
        (strict, userns)
    })
}

/// kubelet's `apparmor.IsEnabled`: securityfs has it and the module is enabled.
fn host_has_apparmor() -> bool {
    std::path::Path::new("/sys/kernel/security/apparmor").is_dir()
        && std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
            .is_ok_and(|v| v.trim() == "Y")
}

fn one_pod(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 2\n{spec}  containers:\n  - {{name: app, image: {IMAGE}, command: [sleep, '3600']}}\n"
    )
}

#[test]
fn admission_matches_the_nodes_labels_and_what_the_host_and_runtime_can_enforce() {
    let (strict_ok, _) = runtime_features();
    let apparmor_ok = host_has_apparmor();
    require_lab();
    let scratch = Scratch::new();
    let files = [
        (
            "a-selected.yaml",
            one_pod(
                "selected",
                "  nodeSelector: {disktype: ssd, kubernetes.io/os: linux}\n",
            ),
        ),
        (
            "b-elsewhere.yaml",
            one_pod("elsewhere", "  nodeSelector: {disktype: hdd}\n"),
        ),
        (
            "c-affinity.yaml",
            one_pod(
                "affinity",
                "  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n        nodeSelectorTerms:\n        - matchExpressions: [{key: kubernetes.io/arch, operator: NotIn, values: [amd64, arm64]}]\n",
            ),
        ),
        (
            "d-strict.yaml",
            one_pod(
                "strict",
                "  securityContext: {supplementalGroupsPolicy: Strict, supplementalGroups: [4000]}\n",
            ),
        ),
        (
            "e-apparmor.yaml",
            one_pod(
                "apparmor",
                "  securityContext: {appArmorProfile: {type: RuntimeDefault}}\n",
            ),
        ),
        (
            "f-windows.yaml",
            one_pod("windows", "  os: {name: windows}\n"),
        ),
        // Fails node affinity and resources: kubelet checks resources first.
        (
            "g-order.yaml",
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: order}}\nspec:\n  terminationGracePeriodSeconds: 2\n  nodeSelector: {{disktype: hdd}}\n  containers:\n  - {{name: app, image: {IMAGE}, command: [sleep, '3600'], resources: {{requests: {{cpu: '100000'}}}}}}\n"
            ),
        ),
    ];
    let paths: Vec<PathBuf> = files.iter().map(|(f, t)| scratch.manifest(f, t)).collect();
    let dir = paths[0].parent().unwrap().to_path_buf();
    let (out, doc) = scratch.run(
        &[&dir],
        &["--cleanup", "--node-labels", "disktype=ssd,zone=lab"],
    );
    assert_eq!(out.status.code(), Some(1), "{doc:#}\n{}", stderr(&out));
    assert_eq!(pod(&doc, "selected")["phase"], "Running", "{doc:#}");
    let rejected = |name: &str, reason: &str, message: &str| {
        let p = pod(&doc, name);
        assert_eq!(p["phase"], "Failed", "{p:#}");
        assert_eq!(p["reason"], reason, "{p:#}");
        assert_eq!(
            p["message"],
            format!("Pod was rejected: {message}"),
            "{p:#}"
        );
        let (sandboxes, _) = runtime_objects(p["uid"].as_str().unwrap());
        assert!(sandboxes.is_empty(), "{name}: a rejected pod got a sandbox");
    };
    let affinity =
        "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector";
    rejected("elsewhere", "NodeAffinity", affinity);
    rejected("affinity", "NodeAffinity", affinity);
    if strict_ok {
        assert_eq!(pod(&doc, "strict")["phase"], "Running", "{doc:#}");
    } else {
        rejected(
            "strict",
            "SupplementalGroupsPolicyNotSupported",
            "SupplementalGroupsPolicy=Strict is not supported in this node",
        );
    }
    rejected(
        "windows",
        "PodOSNotSupported",
        "Failed to admit pod as the OS field doesn't match node OS",
    );
    let order = pod(&doc, "order");
    assert_eq!(order["reason"], "OutOfcpu", "{order:#}");
    assert!(
        order["message"].as_str().is_some_and(|m| m.starts_with(
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 100000000,"
        )),
        "{order:#}"
    );
    if apparmor_ok {
        // Admitted, as kubelet admits it. The runtime has the last word: containerd also
        // wants apparmor_parser, and without it fails CreateContainer, as under kubelet.
        let p = pod(&doc, "apparmor");
        let refused_by_runtime = p["reason"] == "CreateContainerError"
            && p["message"]
                .as_str()
                .is_some_and(|m| m.contains("apparmor"));
        assert!(p["phase"] == "Running" || refused_by_runtime, "{p:#}");
    } else {
        rejected(
            "apparmor",
            "AppArmor",
            "Cannot enforce AppArmor: AppArmor is not enabled on the host",
        );
    }
}

#[test]
fn a_pod_without_host_users_gets_a_user_namespace_where_the_runtime_has_them() {
    let (_, userns_ok) = runtime_features();
    eprintln!("the runtime's default handler has user namespaces: {userns_ok}");
    let text = one_pod("userns", "  hostUsers: false\n");
    if userns_ok {
        let run = Running::start(&[("userns.yaml", text)]);
        assert_eq!(pod(&run.doc, "userns")["phase"], "Running", "{:#}", run.doc);
        let uid = run.uid("userns");
        let map = exec(&uid, "app", &["cat", "/proc/self/uid_map"]);
        let fields: Vec<u64> = map.split_whitespace().map(|f| f.parse().unwrap()).collect();
        assert_eq!(fields.len(), 3, "{map}");
        assert_eq!((fields[0], fields[2]), (0, 65536), "{map}");
        assert!(fields[1] >= 65536, "the node's own IDs stay out: {map}");
    } else {
        require_lab();
        let scratch = Scratch::new();
        let manifest = scratch.manifest("userns.yaml", &text);
        let (out, doc) = scratch.run(&[&manifest], &["--cleanup"]);
        assert_eq!(out.status.code(), Some(1), "{doc:#}");
        let p = pod(&doc, "userns");
        assert_eq!(p["reason"], "FailedCreatePodSandBox", "{p:#}");
        assert!(
            p["message"]
                .as_str()
                .unwrap()
                .contains("RuntimeClass handler \"\" does not support user namespaces"),
            "{p:#}"
        );
        let (sandboxes, _) = runtime_objects(p["uid"].as_str().unwrap());
        assert!(sandboxes.is_empty(), "{sandboxes:?}");
    }
}

#[test]
fn a_static_pod_that_references_api_objects_is_refused_at_decode_with_kubelets_reason() {
    require_lab();
    let scratch = Scratch::new();
    let cases = [
        (
            "envfrom.yaml",
            "  containers:\n  - name: app\n    image: IMAGE\n    envFrom: [{configMapRef: {name: settings}}]\n",
            "field spec.containers[0].envFrom[0].configMapRef: static pods may not reference configmaps",
        ),
        (
            "pull-secret.yaml",
            "  imagePullSecrets: [{name: regcred}]\n  containers:\n  - {name: app, image: IMAGE}\n",
            "field spec.imagePullSecrets: static pods may not reference secrets",
        ),
        (
            "account.yaml",
            "  serviceAccountName: builder\n  containers:\n  - {name: app, image: IMAGE}\n",
            "field spec.serviceAccountName: static pods may not reference serviceaccounts",
        ),
        (
            "claim.yaml",
            "  volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]\n  containers:\n  - {name: app, image: IMAGE}\n",
            "field spec.volumes[0].persistentVolumeClaim: static pods may not reference persistentvolumeclaims",
        ),
        (
            "token.yaml",
            "  volumes: [{name: t, projected: {sources: [{serviceAccountToken: {path: token}}]}}]\n  containers:\n  - {name: app, image: IMAGE}\n",
            "field spec.volumes[0].projected.sources[0]: static pods may not reference serviceaccounts (via projected volumes)",
        ),
    ];
    let mut paths = Vec::new();
    for (file, spec, _) in &cases {
        let name = file.trim_end_matches(".yaml");
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n{}",
            spec.replace("IMAGE", IMAGE)
        );
        paths.push(scratch.manifest(file, &text));
    }
    let dir = paths[0].parent().unwrap().to_path_buf();
    let out = podlapse_tests::podlapse(&[
        "run",
        "--until-ready",
        "--json",
        "--root-dir",
        scratch.root_dir().to_str().unwrap(),
        "--pod-logs-dir",
        scratch.logs_dir().to_str().unwrap(),
        "--manifests",
        dir.to_str().unwrap(),
    ]);
    // Nothing valid to run: bad input, and nothing made in the runtime.
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    for ((_, _, want), path) in cases.iter().zip(&paths) {
        let line = format!("{} (document 0): {want}", path.display());
        assert!(err.contains(&line), "missing {line:?} in:\n{err}");
        let name = path.file_stem().unwrap().to_str().unwrap();
        let (sandboxes, containers) = podlapse_tests::runtime_objects_labelled(
            "io.kubernetes.pod.name",
            &podlapse_tests::static_name(name, &podlapse_tests::host_node()),
        );
        assert!(sandboxes.is_empty() && containers.is_empty(), "{name}");
    }
}

#[test]
fn downward_api_files_and_env_hold_the_pods_fields_and_rounded_resources() {
    let text = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: podinfo
  labels: {{app: shop, tier: "front end"}}
  annotations: {{build: "42"}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: {IMAGE}
    command: [sleep, "3600"]
    resources:
      requests: {{cpu: 250m, memory: 100M}}
      limits: {{cpu: 500m, memory: 200Mi}}
    env:
    - name: CPU_REQUEST
      valueFrom: {{resourceFieldRef: {{resource: requests.cpu}}}}
    - name: MEMORY_LIMIT_MI
      valueFrom: {{resourceFieldRef: {{resource: limits.memory, divisor: 1Mi}}}}
    - name: TIER
      valueFrom: {{fieldRef: {{fieldPath: "metadata.labels['tier']"}}}}
    volumeMounts:
    - {{name: podinfo, mountPath: /etc/podinfo}}
  volumes:
  - name: podinfo
    downwardAPI:
      defaultMode: 288
      items:
      - {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}
      - {{path: annotations, fieldRef: {{fieldPath: metadata.annotations}}}}
      - {{path: name, fieldRef: {{fieldPath: metadata.name}}}}
      - path: cpu_limit_millis
        mode: 256
        resourceFieldRef: {{containerName: app, resource: limits.cpu, divisor: 1m}}
      - path: mem/request_mi
        resourceFieldRef: {{containerName: app, resource: requests.memory, divisor: 1Mi}}
"#
    );
    let run = Running::start(&[("podinfo.yaml", text)]);
    assert_eq!(
        pod(&run.doc, "podinfo")["phase"],
        "Running",
        "{:#}",
        run.doc
    );
    let uid = run.uid("podinfo");
    let cat = |file: &str| exec(&uid, "app", &["cat", &format!("/etc/podinfo/{file}")]);
    assert_eq!(cat("labels"), "app=\"shop\"\ntier=\"front end\"");
    // With the annotations kubelet's file source adds to a static pod.
    assert_eq!(
        cat("annotations"),
        format!(
            "build=\"42\"\nkubernetes.io/config.hash=\"{uid}\"\nkubernetes.io/config.source=\"file\""
        )
    );
    assert_eq!(
        cat("name"),
        podlapse_tests::static_name("podinfo", run.doc["node"].as_str().unwrap())
    );
    assert_eq!(cat("cpu_limit_millis"), "500");
    // 100M is 95.4 MiB: rounded up.
    assert_eq!(cat("mem/request_mi"), "96");
    let mode = |file: &str| {
        let ls = exec(&uid, "app", &["ls", "-lL", &format!("/etc/podinfo/{file}")]);
        ls.split_whitespace().next().unwrap_or_default().to_string()
    };
    assert_eq!(mode("labels"), "-r--r-----", "defaultMode 0440");
    assert_eq!(
        mode("cpu_limit_millis"),
        "-r--------",
        "the item's mode 0400"
    );
    let env = exec(
        &uid,
        "app",
        &["sh", "-c", "echo $CPU_REQUEST $MEMORY_LIMIT_MI \"$TIER\""],
    );
    // 250m with the default divisor of 1 is rounded up to one CPU.
    assert_eq!(env.trim(), "1 200 front end");
}

#[test]
fn yaml_is_read_as_kubelet_reads_it_octal_modes_and_the_quote_escape() {
    // Written as real manifests write them: an octal mode, and `\'` in a double-quoted
    // string, both YAML 1.1 that kubelet's reader accepts.
    let text = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: yaml-one-one
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: {IMAGE}
    command: [sleep, "3600"]
    env:
    - name: GREETING
      value: "it\'s here"
    volumeMounts:
    - {{name: info, mountPath: /etc/info}}
  volumes:
  - name: info
    downwardAPI:
      defaultMode: 0440
      items:
      - {{path: name, fieldRef: {{fieldPath: metadata.name}}}}
"#
    );
    let run = Running::start(&[("yaml11.yaml", text)]);
    assert_eq!(
        pod(&run.doc, "yaml-one-one")["phase"],
        "Running",
        "{:#}",
        run.doc
    );
    let uid = run.uid("yaml-one-one");
    let ls = exec(&uid, "app", &["ls", "-lL", "/etc/info/name"]);
    assert!(ls.starts_with("-r--r-----"), "0440 is octal: {ls}");
    let env = exec(&uid, "app", &["sh", "-c", "echo \"$GREETING\""]);
    assert_eq!(env.trim(), "it's here");
}

#[test]
fn a_static_pod_is_named_after_its_node_and_bound_to_it() {
    // As kubelet runs a manifest: the pod is `<name>-<node>` with the node's name in
    // lower case, spec.nodeName is the node whatever the file says, and the container
    // sees both (its hostname, the downward API). A hostname is cut to 63 characters,
    // never ending in a dash.
    let pod_text = |name: &str| {
        format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  nodeName: some-other-node
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: {IMAGE}
    command: [sleep, "3600"]
    env:
    - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
    - {{name: NODE_NAME, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}
"#
        )
    };
    // 62 characters, so `<name>-` is 63: the cut falls on the dash.
    let long = format!("long-{}", "n".repeat(57));
    let run = Running::start_with(
        &[
            ("named.yaml", pod_text("named")),
            ("long.yaml", pod_text(&long)),
        ],
        &["--node-name", "Conformance-Node"],
    );
    assert_eq!(run.doc["node"], "conformance-node", "{:#}", run.doc);
    for (name, hostname) in [
        ("named", "named-conformance-node".to_string()),
        (long.as_str(), long.clone()),
    ] {
        let p = pod(&run.doc, name);
        assert_eq!(p["phase"], "Running", "{p:#}");
        let full = format!("{name}-conformance-node");
        assert_eq!(p["name"], full.as_str());
        let uid = run.uid(name);
        let seen = exec(
            &uid,
            "app",
            &[
                "sh",
                "-c",
                "echo \"$(cat /proc/sys/kernel/hostname) $POD_NAME $NODE_NAME\"",
            ],
        );
        assert_eq!(
            seen.trim(),
            format!("{hostname} {full} conformance-node"),
            "hostname, metadata.name and spec.nodeName inside the container"
        );
        // The runtime's sandbox carries the same name.
        let (sandboxes, _) =
            podlapse_tests::runtime_objects_labelled("io.kubernetes.pod.name", &full);
        assert_eq!(sandboxes.len(), 1, "{full}: {sandboxes:?}");
    }
}
