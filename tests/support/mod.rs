//! Shared helpers for the integration tests: the `podlapse` binary, the lab, scratch
//! manifests, and a CRI client to check what the runtime really holds.

pub mod agent;
pub mod cni_conf;
pub mod cri_proxy;
pub mod ebpf;
pub mod observer;
pub mod otlp;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use podlapse::cri::{CriClient, Endpoint, EndpointSource, RuntimeService, Timeouts, api};
use xtask::lab::LabPaths;

/// `podlapse run --until-ready`'s cap on a pod's wait in the tests, in seconds.
pub const READY_CAP_SECS: &str = "900";
/// The pod worker's retry delay after a failed sync in `Scratch::run` (kubelet's is 10 s).
pub const ERROR_BACKOFF: &str = "2s";

/// The tests' one bounded wait: looks every `every` until `probe` gives `Ok`, and once
/// `bound` has passed without it, panics naming `what` and showing what the last look
/// saw (`probe`'s last `Err`, with `{:#}`). Waits end on evidence; the bound only keeps a
/// broken run from hanging the suite.
pub fn eventually<T, S: std::fmt::Display>(
    what: &str,
    bound: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Result<T, S>,
) -> T {
    let mut last = None;
    let got = xtask::poll::Poll::new(what, bound, every).within(|| {
        Ok::<_, std::convert::Infallible>(match probe() {
            Ok(value) => Some(value),
            Err(seen) => {
                last = Some(seen);
                None
            }
        })
    });
    match got {
        Ok(Some(value)) => value,
        Ok(None) | Err(_) => match last {
            Some(seen) => {
                panic!("timed out after {bound:?} waiting for {what}; last seen: {seen:#}")
            }
            None => panic!("timed out after {bound:?} waiting for {what}"),
        },
    }
}

/// The `podlapse` binary `cargo xtask test` built (or the default debug build).
pub fn podlapse_bin() -> PathBuf {
    std::env::var_os("PODLAPSE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/debug/podlapse"))
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_path_buf()
}

/// The recorded fixtures in traces/ (`*.jsonl`), sorted.
pub fn fixtures() -> Vec<PathBuf> {
    let mut all: Vec<PathBuf> = std::fs::read_dir(workspace_root().join("traces"))
        .expect("traces/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    all.sort();
    assert!(
        all.len() >= 6,
        "expected the recorded fixtures in traces/, found {all:?}"
    );
    all
}

pub fn examples_dir() -> PathBuf {
    std::env::var_os("PODLAPSE_EXAMPLES")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("examples"))
}

/// deploy/: the workspace's, or the copy staged in the modern node's guest
/// (`PODLAPSE_DEPLOY`).
pub fn deploy_dir() -> PathBuf {
    std::env::var_os("PODLAPSE_DEPLOY")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("deploy"))
}

pub fn lab() -> LabPaths {
    LabPaths::from_env()
}

/// Fails the test with a clear message when the lab is not up.
pub fn require_lab() -> LabPaths {
    let lab = lab();
    assert!(
        lab.state_file().exists(),
        "the node lab is not up at {}: run these tests with `cargo xtask test`",
        lab.root.display()
    );
    lab
}

/// Runs `podlapse` with the given arguments against the lab.
pub fn podlapse(args: &[&str]) -> Output {
    podlapse_with_env(args, &[])
}

pub fn podlapse_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(podlapse_bin())
        .args(args)
        .env("PODLAPSE_LAB_DIR", lab().root)
        .env_remove("PODLAPSE_CRI")
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", podlapse_bin().display()))
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A scratch node: its own root and log directories, so tests do not share pod state.
pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a manifest and returns its path. kubelet reads one pod per file, its first
    /// YAML document: text holding several is written as a directory (named `name` less
    /// its extension) with a file per document, `<stem>-<n>.yaml`, in their order.
    pub fn manifest(&self, name: &str, text: &str) -> PathBuf {
        let dir = self.path().join("manifests");
        std::fs::create_dir_all(&dir).unwrap();
        let docs = documents(text);
        if docs.len() <= 1 {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            return p;
        }
        let stem = Path::new(name).file_stem().unwrap().to_str().unwrap();
        let p = dir.join(stem);
        std::fs::create_dir_all(&p).unwrap();
        for (i, doc) in docs.iter().enumerate() {
            std::fs::write(p.join(document_file(stem, i)), doc).unwrap();
        }
        p
    }

    pub fn root_dir(&self) -> PathBuf {
        self.path().join("root")
    }

    pub fn logs_dir(&self) -> PathBuf {
        self.path().join("logs")
    }

    /// `podlapse run --until-ready --json` with this scratch node's directories (and a
    /// [`READY_CAP_SECS`] cap on each pod's wait, unless `extra` sets one).
    pub fn run(&self, manifests: &[&Path], extra: &[&str]) -> (Output, serde_json::Value) {
        let root = self.root_dir().display().to_string();
        let logs = self.logs_dir().display().to_string();
        let mut args = vec![
            "run",
            "--until-ready",
            "--json",
            "--root-dir",
            &root,
            "--pod-logs-dir",
            &logs,
        ];
        // The run ends as soon as every pod settles; the cap is only for a pod that never
        // does. It is wide because in the emulated guest, on a busy host, a 50 MiB pull
        // through the forwarded registry port has taken well over the default 120 s.
        if !extra.contains(&"--ready-timeout") {
            args.extend(["--ready-timeout", READY_CAP_SECS]);
        }
        // A pod whose sandbox fails settles once the pod worker's retry failed too; the
        // retry waits kubelet's 10 s back-off, which a test shortens.
        if !extra.contains(&"--error-backoff") {
            args.extend(["--error-backoff", ERROR_BACKOFF]);
        }
        args.extend_from_slice(extra);
        args.push("--manifests");
        let paths: Vec<String> = manifests.iter().map(|p| p.display().to_string()).collect();
        args.extend(paths.iter().map(String::as_str));
        let out = podlapse(&args);
        let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("podlapse printed no JSON ({e}); stderr:\n{}", stderr(&out))
        });
        (out, doc)
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch::new()
    }
}

/// The name kubelet gives the static pod a manifest names `name`, on node `node` (a
/// node name is in lower case): `<name>-<node>`.
pub fn static_name(name: &str, node: &str) -> String {
    format!("{name}-{node}")
}

/// The node name `podlapse run` takes when given none: the host's name, in lower case.
pub fn host_node() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("the host name")
        .trim()
        .to_lowercase()
}

/// The pod of the manifest that names it `name`, in a `podlapse run --json` document,
/// which names the node (so the pod is `<name>-<node>`).
pub fn pod<'a>(doc: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    let node = doc["node"]
        .as_str()
        .unwrap_or_else(|| panic!("no node in {doc:#}"));
    let full = static_name(name, node);
    doc["pods"]
        .as_array()
        .and_then(|pods| pods.iter().find(|p| p["name"] == full.as_str()))
        .unwrap_or_else(|| panic!("no pod {full} (manifest name {name}) in {doc:#}"))
}

pub use xtask::lab::ip_in_subnet;

/// What the lab's runtime holds for a pod UID: (sandbox IDs, container IDs).
pub fn runtime_objects(uid: &str) -> (Vec<String>, Vec<String>) {
    runtime_objects_labelled("io.kubernetes.pod.uid", uid)
}

/// A CRI client of the lab's runtime.
pub async fn lab_cri() -> CriClient {
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

/// What the lab's runtime holds with a label: (sandbox IDs, container IDs).
pub fn runtime_objects_labelled(label: &str, value: &str) -> (Vec<String>, Vec<String>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cri = lab_cri().await;
        let sel = std::collections::HashMap::from([(label.to_string(), value.to_string())]);
        let sandboxes = cri
            .list_pod_sandbox(Some(api::PodSandboxFilter {
                label_selector: sel.clone(),
                ..Default::default()
            }))
            .await
            .expect("ListPodSandbox");
        let containers = cri
            .list_containers(Some(api::ContainerFilter {
                label_selector: sel,
                ..Default::default()
            }))
            .await
            .expect("ListContainers");
        (
            sandboxes.into_iter().map(|s| s.id).collect(),
            containers.into_iter().map(|c| c.id).collect(),
        )
    })
}

/// The YAML documents of `text` that hold something, split at `---` lines.
pub fn documents(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in text.split_inclusive('\n') {
        if line.trim_end() == "---" {
            docs.push(String::new());
        } else {
            docs.last_mut().unwrap().push_str(line);
        }
    }
    docs.retain(|d| {
        d.lines()
            .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
    });
    docs
}

/// The file the `n`th document of a manifest named `stem` is written to.
pub fn document_file(stem: &str, n: usize) -> String {
    format!("{stem}-{n:02}.yaml")
}

/// The runtime's version as `cri info` reports it (`1.7.24~ds1`: 1, 7).
pub fn runtime_version() -> (u32, u32) {
    let out = podlapse(&["cri", "info"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let version = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("runtime:"))
        .unwrap_or_default()
        .to_string();
    let numbers: Vec<u32> = version
        .split_whitespace()
        .last()
        .unwrap_or_default()
        .split(|c: char| !c.is_ascii_digit())
        .take(2)
        .filter_map(|n| n.parse().ok())
        .collect();
    eprintln!("runtime: {version:?}");
    match numbers.as_slice() {
        [major, minor, ..] => (*major, *minor),
        [major] => (*major, 0),
        [] => (0, 0),
    }
}
