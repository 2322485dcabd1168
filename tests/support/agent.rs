//! A running `podlapse run` agent for a test: its own node name, API socket, root dir,
//! cgroup root and manifests directory, so agents of parallel tests never touch each
//! other's pods. Dropping it removes its manifests, waits for its pods to go, and stops it.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use xtask::agent_process::{AgentPlaces, AgentProcess};

use super::{Scratch, lab, podlapse_bin, static_name};

pub struct Agent {
    pub scratch: Scratch,
    pub node: String,
    pub socket: PathBuf,
    /// Where the agent serves `/metrics`.
    pub metrics_addr: String,
    process: Option<AgentProcess>,
    extra: Vec<String>,
}

impl Agent {
    /// Starts an agent named `node` with extra `podlapse run` flags.
    pub fn start(node: &str, extra: &[&str]) -> Agent {
        let scratch = Scratch::new();
        std::fs::create_dir_all(scratch.path().join("manifests")).unwrap();
        let mut agent = Agent {
            socket: scratch.path().join("api.sock"),
            metrics_addr: free_loopback_addr(),
            scratch,
            node: node.to_string(),
            process: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        agent.spawn();
        agent
    }

    /// The extra `podlapse run` flags the next [`Agent::spawn`] uses.
    pub fn set_extra(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| s.to_string()).collect();
    }

    pub fn manifests(&self) -> PathBuf {
        self.scratch.path().join("manifests")
    }

    /// (Re)starts the agent process over the same directories, and waits until its API
    /// answers (failing at once if it exits first).
    pub fn spawn(&mut self) {
        /// Only keeps a hung agent from hanging the suite: the wait ends on evidence.
        const HUNG: Duration = Duration::from_secs(600);
        let places = AgentPlaces {
            node: self.node.clone(),
            manifests: self.manifests(),
            socket: self.socket.clone(),
            root_dir: self.scratch.root_dir(),
            logs_dir: self.scratch.logs_dir(),
            metrics_addr: self.metrics_addr.clone(),
        };
        let bin = podlapse_bin();
        let mut cmd = AgentProcess::command(&bin, &places);
        cmd.args(["--cgroup-root", &format!("/podlapse-test-{}", self.node)])
            .args(&self.extra)
            .env("PODLAPSE_LAB_DIR", lab().root)
            .env_remove("PODLAPSE_CRI")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let process =
            AgentProcess::start(cmd, &bin, &self.socket, HUNG).unwrap_or_else(|e| panic!("{e:#}"));
        self.process = Some(process);
    }

    /// SIGKILL, as a crash would.
    pub fn kill9(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }

    /// Writes a manifest into the agent's directory. Text holding several YAML documents
    /// becomes a file per document (kubelet reads one pod per file), `<stem>-<n>.yaml`.
    pub fn write(&self, file: &str, yaml: &str) {
        let docs = super::documents(yaml);
        if docs.len() <= 1 {
            self.write_one(file, yaml);
            return;
        }
        let stem = stem(file);
        for (i, doc) in docs.iter().enumerate() {
            self.write_one(&super::document_file(stem, i), doc);
        }
    }

    fn write_one(&self, file: &str, yaml: &str) {
        // Write then rename, so the agent never reads a half-written manifest.
        let tmp = self.scratch.path().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, self.manifests().join(file)).unwrap();
    }

    /// Removes what [`Agent::write`] wrote as `file`.
    pub fn remove(&self, file: &str) {
        let one = self.manifests().join(file);
        if one.exists() {
            std::fs::remove_file(one).unwrap();
            return;
        }
        let stem = stem(file);
        let mut removed = 0;
        for i in 0.. {
            let part = self.manifests().join(super::document_file(stem, i));
            if std::fs::remove_file(&part).is_err() {
                break;
            }
            removed += 1;
        }
        assert!(removed > 0, "no manifest {file} to remove");
    }

    fn api(&self, what: &str) -> Option<Value> {
        self.process.as_ref()?.query(what).ok()
    }

    /// The agent's timeline of every pod (`podlapse timeline -o json`).
    pub fn timeline(&self) -> Value {
        self.api("timeline").expect("the agent serves its timeline")
    }

    /// The agent's `/metrics` exposition.
    pub fn metrics(&self) -> String {
        scrape(&self.metrics_addr)
    }

    /// The `/metrics` exposition once `done` holds for it, polled every 100 ms (metrics
    /// are observed on the agent's own schedule), or as it is after `timeout`.
    pub fn metrics_when(&self, timeout: Duration, done: impl Fn(&str) -> bool) -> String {
        let every = Duration::from_millis(100);
        let poll = xtask::poll::Poll::new("the metrics", timeout, every);
        let mut text = String::new();
        let _ = poll.holds(|| {
            text = self.metrics();
            done(&text)
        });
        text
    }

    /// Every pod the agent serves (`podlapse pods -o json`, a List of Pods), each as the
    /// Pod object with `name`, `namespace` and `uid` lifted to the top and its events
    /// (`podlapse events -o json`) attached as `events`, which is what the tests look at.
    pub fn pods(&self) -> Vec<Value> {
        self.records().unwrap_or_default()
    }

    fn records(&self) -> Option<Vec<Value>> {
        let list = self.api("pods")?;
        assert_eq!(list["kind"], "List", "pods -o json is a List: {list}");
        let events = self.api("events")?;
        let events = events.as_array()?;
        let items = list["items"].as_array()?;
        Some(
            items
                .iter()
                .map(|item| {
                    let mut rec = item.clone();
                    let meta = &item["metadata"];
                    for key in ["name", "namespace", "uid"] {
                        rec[key] = meta[key].clone();
                    }
                    rec["events"] = events
                        .iter()
                        .filter(|e| e["pod"] == meta["name"] && e["namespace"] == meta["namespace"])
                        .cloned()
                        .collect();
                    rec
                })
                .collect(),
        )
    }

    /// The name this agent's node gives the pod a manifest names `name`.
    pub fn name(&self, name: &str) -> String {
        static_name(name, &self.node)
    }

    /// The pod of the manifest that names it `name`.
    pub fn pod(&self, name: &str) -> Option<Value> {
        let full = self.name(name);
        self.pods().into_iter().find(|p| p["name"] == full.as_str())
    }

    /// The columns of the row in `podlapse pods` (the table, as kubectl prints it) of the
    /// pod of the manifest that names it `name`.
    pub fn table_row(&self, name: &str) -> Vec<String> {
        let name = self.name(name);
        let out = Command::new(podlapse_bin())
            .args(["pods", "--api-socket"])
            .arg(&self.socket)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.lines()
            .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .find(|cols| {
                cols.first()
                    .is_some_and(|c| c.ends_with(&format!("/{name}")))
            })
            .unwrap_or_else(|| panic!("no row for {name} in podlapse pods:\n{text}"))
    }

    /// The events of the pod of the manifest that names it `pod`.
    pub fn events(&self, pod: &str) -> Vec<Value> {
        let pod = self.name(pod);
        self.api("events")
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e["pod"] == pod.as_str())
            .collect()
    }

    /// Polls the agent's pods until `check` holds. Polling is bounded by `limit`; each
    /// look is one API call, 50 ms apart, so the wait ends soon after the state is reached.
    pub fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        check: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        super::eventually(what, limit, Duration::from_millis(50), || {
            match self.records() {
                Some(v) if check(&v) => Ok(v),
                Some(v) => Err(Value::Array(v)),
                None => Err(Value::String("no answer from the agent's API".into())),
            }
        })
    }

    /// Waits until the pod of the manifest that names it `name` satisfies `check`, and
    /// returns its record.
    pub fn wait_pod(
        &self,
        name: &str,
        what: &str,
        limit: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        let name = self.name(name);
        let pods = self.wait_for(&format!("{name}: {what}"), limit, |pods| {
            pods.iter().any(|p| p["name"] == name.as_str() && check(p))
        });
        pods.into_iter()
            .find(|p| p["name"] == name.as_str())
            .unwrap()
    }
}

impl Agent {
    /// Removes the manifests, waits (a minute at most) for the pods to go, and stops the
    /// agent with SIGTERM, so it finishes its trace.
    pub fn stop(&mut self) {
        if self.process.is_none() {
            return;
        }
        if let Ok(entries) = std::fs::read_dir(self.manifests()) {
            for e in entries.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        // Best effort: a test that left pods behind still stops its agent.
        let gone = xtask::poll::Poll::new(
            "the pods' removal",
            Duration::from_secs(60),
            Duration::from_millis(100),
        );
        let _ = gone.holds(|| self.pods().is_empty());
        if let Some(mut p) = self.process.take()
            && let Err(e) = p.stop(Duration::from_secs(60))
        {
            eprintln!("{e:#}");
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The value of the unlabelled sample `name` in a `/metrics` exposition.
/// Fails unless `promtool check metrics` takes `text` (an exposition) as clean.
pub fn promtool_check_metrics(text: &str) {
    use std::io::Write;
    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; cargo xtask setup installs it)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `/metrics` exposition served at `addr` (an agent's or an observer's).
pub fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).expect("metrics endpoint");
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: podlapse\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).unwrap();
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Phase of a pod record.
pub fn phase(p: &Value) -> &str {
    p["status"]["phase"].as_str().unwrap_or("")
}

/// The status of one container in a pod record.
pub fn container<'a>(p: &'a Value, name: &str) -> &'a Value {
    p["status"]["containerStatuses"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or(&Value::Null)
}

/// The status of one init container (sidecars included) in a pod record.
pub fn init_container<'a>(p: &'a Value, name: &str) -> &'a Value {
    p["status"]["initContainerStatuses"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or(&Value::Null)
}

/// A pod condition's status ("True" / "False"), if the pod has that condition.
pub fn condition<'a>(p: &'a Value, kind: &str) -> Option<&'a str> {
    p["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)?["status"]
        .as_str()
}

/// The host pids of every process in a container, found through the cgroups the kernel
/// lists for each process (the container's cgroup is named after its ID).
pub fn container_pids(api_container_id: &str) -> Vec<i32> {
    let id = api_container_id
        .split_once("://")
        .map_or(api_container_id, |(_, id)| id);
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cgroups) = std::fs::read_to_string(entry.path().join("cgroup")) else {
            continue;
        };
        if cgroups.lines().any(|l| l.contains(id)) {
            pids.push(pid);
        }
    }
    pids
}

/// A container's waiting reason, if it is waiting.
pub fn waiting_reason<'a>(p: &'a Value, name: &str) -> Option<&'a str> {
    container(p, name)["state"]["waiting"]["reason"].as_str()
}

/// A loopback address with a port nothing listens on right now (the agent binds it).
pub fn free_loopback_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().unwrap().to_string()
}

fn stem(file: &str) -> &str {
    std::path::Path::new(file)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or(file)
}
