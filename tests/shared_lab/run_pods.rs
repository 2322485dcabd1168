//! `podlapse run` creating real pods on the lab's containerd: sandboxes with CNI IPs,
//! images pulled from the local registry, containers created and started, and cleanup
//! that leaves no runtime object behind.

use podlapse_tests::{
    Scratch, examples_dir, ip_in_subnet, pod, require_lab, runtime_objects, stderr,
};
use xtask::lab::{IMAGE_APP, POD_SUBNET, REGISTRY_ADDR};

#[test]
fn example_pods_reach_running_with_lab_ips_and_clean_up() {
    require_lab();
    let scratch = Scratch::new();
    let examples = examples_dir();
    let (out, doc) = scratch.run(&[&examples], &["--cleanup"]);
    assert!(out.status.success(), "{doc:#}\n{}", stderr(&out));
    let pods = doc["pods"].as_array().unwrap();
    assert!(pods.len() >= 3, "{doc:#}");
    let mut ips = Vec::new();
    for p in pods {
        assert_eq!(p["phase"], "Running", "{p:#}");
        let ip = p["ip"].as_str().unwrap_or_default();
        assert!(
            ip_in_subnet(ip, POD_SUBNET),
            "{} got {ip:?}, not in {POD_SUBNET}",
            p["name"]
        );
        ips.push(ip.to_string());
        // Cleanup removed every sandbox and container of the pod from the runtime.
        let (sandboxes, containers) = runtime_objects(p["uid"].as_str().unwrap());
        assert!(
            sandboxes.is_empty() && containers.is_empty(),
            "{} left {sandboxes:?} {containers:?}",
            p["name"]
        );
    }
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), pods.len(), "pod IPs are not unique");
    // The native sidecar started first, then the app.
    let sidecar = pod(&doc, "app-with-sidecar");
    let started: Vec<_> = sidecar["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "Started")
        .map(|e| e["container"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(started, ["tailer", "app"]);
    assert_eq!(doc["cleaned_up"], true);
    assert!(
        !scratch.root_dir().join("pods").exists()
            || std::fs::read_dir(scratch.root_dir().join("pods"))
                .unwrap()
                .next()
                .is_none()
    );
}

#[test]
fn containers_see_their_pod_ip_through_field_refs_and_share_an_empty_dir() {
    require_lab();
    let scratch = Scratch::new();
    let manifest = scratch.manifest(
        "ip.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: reports-ip}}
spec:
  terminationGracePeriodSeconds: 2
  volumes: [{{name: out, emptyDir: {{}}}}]
  containers:
  - name: writer
    image: {IMAGE_APP}
    command: ["/bin/sh", "-c", "echo $(MY_IP) $(MY_NODE) > /out/ip; exec sleep 3600"]
    env:
    - {{name: MY_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}
    - {{name: MY_NODE, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}
    volumeMounts: [{{name: out, mountPath: /out}}]
"#
        ),
    );
    let (out, doc) = scratch.run(&[&manifest], &["--node-name", "lab-node"]);
    assert!(out.status.success(), "{doc:#}\n{}", stderr(&out));
    let p = pod(&doc, "reports-ip");
    let uid = p["uid"].as_str().unwrap();
    let ip = p["ip"].as_str().unwrap();
    let file = scratch
        .root_dir()
        .join("pods")
        .join(uid)
        .join("volumes/kubernetes.io~empty-dir/out/ip");
    // The container writes the file right after it starts; Running is reported once the
    // runtime says it runs, which can be a moment before the shell has written it.
    let text = wait_for_file(&file);
    assert_eq!(text.trim(), format!("{ip} lab-node"));
    cleanup(&scratch, &manifest);
}

fn wait_for_file(path: &std::path::Path) -> String {
    // A shell in the container writes it soon after it starts; the bound is for a broken
    // run, not a guess of how soon (an emulated guest is many times slower).
    podlapse_tests::eventually(
        &format!("{} to be written", path.display()),
        std::time::Duration::from_secs(120),
        std::time::Duration::from_millis(50),
        || match std::fs::read_to_string(path) {
            Ok(t) if !t.is_empty() => Ok(t),
            Ok(_) => Err("empty".to_string()),
            Err(e) => Err(e.to_string()),
        },
    )
}

fn cleanup(scratch: &Scratch, manifest: &std::path::Path) {
    let (out, doc) = scratch.run(&[manifest], &["--cleanup"]);
    assert!(out.status.success(), "{doc:#}");
}

#[test]
fn bad_manifests_are_named_and_the_good_pod_still_runs() {
    require_lab();
    let scratch = Scratch::new();
    let bad_yaml = scratch.manifest(
        "a-bad.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: x\n",
    );
    // Two documents in one file, written as they are: kubelet reads the first only.
    let not_pod = bad_yaml.with_file_name("b-service.yaml");
    std::fs::write(
        &not_pod,
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: good-one}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {IMAGE_APP}, command: [sleep, '3600']}}\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: s}}\n"),
    )
    .unwrap();
    let no_image = scratch.manifest(
        "c-noimage.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: no-image}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {name: c}\n",
    );
    let dir = bad_yaml.parent().unwrap().to_path_buf();
    let (out, doc) = scratch.run(&[&dir], &["--cleanup"]);
    // Bad input makes the run fail, but only after the good pod ran.
    assert_eq!(out.status.code(), Some(1), "{doc:#}");
    assert_eq!(pod(&doc, "good-one")["phase"], "Running");
    let errors: Vec<String> = doc["manifest_errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect();
    assert_eq!(errors.len(), 3, "{errors:#?}");
    let find = |file: &std::path::Path| {
        errors
            .iter()
            .find(|e| e.starts_with(&file.display().to_string()))
            .unwrap_or_else(|| panic!("no error for {}: {errors:#?}", file.display()))
            .clone()
    };
    let e = find(&bad_yaml);
    assert!(e.contains("(document 0): invalid YAML"), "{e}");
    let e = find(&not_pod);
    assert_eq!(
        e,
        format!(
            "{}: document 1 not read: kubelet reads only a manifest's first YAML document \
             (it read document 0, pod default/{}); put each pod in a file of its own",
            not_pod.display(),
            podlapse_tests::static_name("good-one", doc["node"].as_str().unwrap())
        )
    );
    let e = find(&no_image);
    assert!(
        e.contains("(document 0): field spec.containers[0].image: required"),
        "{e}"
    );
    // The same errors reach a person on stderr.
    let err = stderr(&out);
    assert!(
        err.contains("c-noimage.yaml (document 0): field spec.containers[0].image"),
        "{err}"
    );
}

#[test]
fn a_missing_image_fails_that_pod_only() {
    require_lab();
    let scratch = Scratch::new();
    let manifest = scratch.manifest(
        "pods.yaml",
        &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: missing-image}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {REGISTRY_ADDR}/podlapse/does-not-exist:1.0}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: fine}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {IMAGE_APP}, command: [sleep, '3600']}}\n"),
    );
    let (out, doc) = scratch.run(&[&manifest], &["--cleanup"]);
    assert_eq!(out.status.code(), Some(1), "{doc:#}");
    assert_eq!(pod(&doc, "fine")["phase"], "Running");
    let bad = pod(&doc, "missing-image");
    assert_eq!(bad["phase"], "Pending");
    assert_eq!(bad["reason"], "ErrImagePull", "{bad:#}");
    assert!(
        bad["message"].as_str().unwrap().contains("does-not-exist"),
        "{bad:#}"
    );
    for p in doc["pods"].as_array().unwrap() {
        let (sandboxes, containers) = runtime_objects(p["uid"].as_str().unwrap());
        assert!(
            sandboxes.is_empty() && containers.is_empty(),
            "{} left objects",
            p["name"]
        );
    }
}

#[test]
fn a_cni_directory_that_does_not_exist_is_exit_2_and_creates_nothing() {
    require_lab();
    let scratch = Scratch::new();
    let manifest = scratch.manifest(
        "pod.yaml",
        &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: no-cni-dir}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {IMAGE_APP}, command: [sleep, '3600']}}\n"),
    );
    let root = scratch.root_dir().display().to_string();
    let out = podlapse_tests::podlapse(&[
        "run",
        "--until-ready",
        "--root-dir",
        &root,
        "--cni-bin-dir",
        "/nonexistent/cni/bin",
        "--manifests",
        manifest.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0].contains("/nonexistent/cni/bin (from --cni-bin-dir) does not exist")
            && lines[0].contains("the runtime says /"),
        "names the directory, where it came from and what the runtime said: {err}"
    );
    let (sandboxes, containers) = podlapse_tests::runtime_objects_labelled(
        "io.kubernetes.pod.name",
        &podlapse_tests::static_name("no-cni-dir", &podlapse_tests::host_node()),
    );
    assert!(
        sandboxes.is_empty() && containers.is_empty(),
        "{sandboxes:?} {containers:?}"
    );
    assert!(!scratch.root_dir().join("pods").exists());
}
