//! The prober and the lifecycle hook handlers against a real container in the lab: exec
//! through containerd's ExecSync (exit 0, exit 1, timeout), httpGet and tcpSocket to the
//! pod IP, and the probe manager reporting result changes as the container changes.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    ExecAction, HTTPGetAction, LifecycleHandler, Pod, Probe, SleepAction, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use podlapse::cri::{RuntimeService, api};
use podlapse::lifecycle::{HandlerError, run_handler};
use podlapse::prober::action::{ExecError, probe_exec, probe_tcp};
use podlapse::prober::{
    ProbeKind, ProbeManager, ProbeOutcome, ProbeResult, ProbeSpec, ProbeUpdate, now_ns, run_probe,
};
use podlapse::queues::{self, Queue, QueueStats};
use podlapse_tests::{Scratch, lab_cri, pod, require_lab, stderr};
use tokio::sync::mpsc;
use xtask::lab::IMAGE_APP;

/// busybox httpd serving /tmp on a named port, plus a literal env var for `$(VAR)`.
/// JSON, which is YAML for podlapse and parses straight into a `Pod` here.
fn manifest(name: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 2, "containers": [{
            "name": "app",
            "image": IMAGE_APP,
            "command": ["/bin/sh", "-c",
                "echo hi > /tmp/index.html && exec httpd -f -p 8080 -h /tmp"],
            "env": [{"name": "GREETING", "value": "hello"}],
            "ports": [{"name": "http", "containerPort": 8080}],
        }]},
    })
    .to_string()
}

/// Removes the pod through `podlapse run --cleanup` however the test ends.
struct Cleanup {
    scratch: Scratch,
    manifest: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (out, doc) = self.scratch.run(&[&self.manifest], &["--cleanup"]);
        if !out.status.success() {
            let msg = format!("cleanup failed: {doc:#}\n{}", stderr(&out));
            if std::thread::panicking() {
                eprintln!("{msg}");
            } else {
                panic!("{msg}");
            }
        }
    }
}

/// A running pod of [`manifest`]: the pod as the prober sees it, its IP, and the running
/// container's ID.
struct Target {
    pod: Pod,
    ip: String,
    container_id: String,
    _cleanup: Cleanup,
}

impl Target {
    fn start(name: &str) -> Target {
        require_lab();
        let scratch = Scratch::new();
        let text = manifest(name);
        let path = scratch.manifest(&format!("{name}.yaml"), &text);
        let cleanup = Cleanup {
            scratch,
            manifest: path.clone(),
        };
        let (out, doc) = cleanup.scratch.run(&[&path], &[]);
        assert!(out.status.success(), "{doc:#}\n{}", stderr(&out));
        let p = pod(&doc, name);
        let mut pod: Pod = serde_json::from_str(&text).unwrap();
        pod.metadata.uid = p["uid"].as_str().map(str::to_string);
        pod.metadata.namespace = p["namespace"].as_str().map(str::to_string);
        let ip = p["ip"].as_str().expect("pod IP").to_string();
        let uid = pod.metadata.uid.clone().unwrap();
        let container_id = block_on(async {
            let running = lab_cri()
                .await
                .list_containers(Some(api::ContainerFilter {
                    state: Some(api::ContainerStateValue {
                        state: api::ContainerState::ContainerRunning.into(),
                    }),
                    label_selector: HashMap::from([
                        ("io.kubernetes.pod.uid".to_string(), uid),
                        (
                            "io.kubernetes.container.name".to_string(),
                            "app".to_string(),
                        ),
                    ]),
                    ..Default::default()
                }))
                .await
                .expect("ListContainers");
            assert_eq!(running.len(), 1, "{running:#?}");
            running[0].id.clone()
        });
        Target {
            pod,
            ip,
            container_id,
            _cleanup: cleanup,
        }
    }

    fn container(&self) -> &k8s_openapi::api::core::v1::Container {
        &self.pod.spec.as_ref().unwrap().containers[0]
    }

    fn uid(&self) -> &str {
        self.pod.metadata.uid.as_deref().unwrap()
    }
}

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn sh(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn exec_hook(command: Vec<String>) -> LifecycleHandler {
    LifecycleHandler {
        exec: Some(ExecAction {
            command: Some(command),
        }),
        ..Default::default()
    }
}

fn exec_probe(command: Vec<String>, failure_threshold: i32) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(command),
        }),
        period_seconds: Some(1),
        failure_threshold: Some(failure_threshold),
        ..Default::default()
    }
}

#[test]
fn exec_probes_and_hooks_run_in_the_container() {
    let t = Target::start("probe-exec");
    let id = t.container_id.as_str();
    block_on(async {
        let cri = lab_cri().await;

        let ok = probe_exec(&cri, id, sh("echo ready"), secs(2))
            .await
            .unwrap();
        assert_eq!(
            ok,
            ProbeOutcome {
                result: ProbeResult::Success,
                output: "ready\n".into()
            }
        );
        let bad = probe_exec(&cri, id, sh("echo not yet; exit 1"), secs(2))
            .await
            .unwrap();
        assert_eq!(
            (bad.result, bad.output.as_str()),
            (ProbeResult::Failure, "not yet\n")
        );
        let started = Instant::now();
        let slow = probe_exec(&cri, id, vec!["sleep".into(), "20".into()], secs(1))
            .await
            .unwrap();
        assert_eq!(
            (slow.result, slow.output.as_str()),
            (ProbeResult::Failure, "command \"sleep 20\" timed out")
        );
        assert!(started.elapsed() < secs(10), "{:?}", started.elapsed());

        // Exec probes expand $(VAR) from the container's literal env.
        let probe = exec_probe(sh("test \"$(GREETING)\" = hello"), 3);
        let spec = ProbeSpec::from_probe(ProbeKind::Liveness, &probe).unwrap();
        let out = run_probe(&cri, &spec, t.container(), id, &t.ip)
            .await
            .unwrap();
        assert_eq!(out.result, ProbeResult::Success, "{}", out.output);

        run_handler(
            &cri,
            &t.pod,
            t.container(),
            id,
            &t.ip,
            &exec_hook(sh("echo started > /tmp/post-start")),
            secs(10),
        )
        .await
        .unwrap();
        let wrote = probe_exec(
            &cri,
            id,
            vec!["cat".into(), "/tmp/post-start".into()],
            secs(2),
        )
        .await
        .unwrap();
        assert_eq!(wrote.output, "started\n");

        let err = run_handler(
            &cri,
            &t.pod,
            t.container(),
            id,
            &t.ip,
            &exec_hook(sh("echo oops >&2; exit 3")),
            secs(10),
        )
        .await
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "Exec lifecycle hook ([sh -c echo oops >&2; exit 3]) for Container \"app\" in Pod \"probe-exec_default({})\" failed - error: command 'sh -c echo oops >&2; exit 3' exited with 3: oops\n, message: \"oops\\n\"",
                t.uid()
            )
        );

        let started = Instant::now();
        let err = run_handler(
            &cri,
            &t.pod,
            t.container(),
            id,
            &t.ip,
            &exec_hook(vec!["sleep".into(), "30".into()]),
            secs(2),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&err, HandlerError::Exec { source, .. }
                if matches!(**source, ExecError::TimedOut { .. })),
            "{err}"
        );
        assert!(started.elapsed() < secs(10), "{:?}", started.elapsed());
        // The runtime killed the hook's command rather than leaving it running.
        let mut left = String::new();
        for _ in 0..50 {
            left = probe_exec(&cri, id, vec!["ps".into()], secs(2))
                .await
                .unwrap()
                .output;
            if !left.contains("sleep 30") {
                break;
            }
            // Bounded: 50 checks, 100 ms apart.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!left.contains("sleep 30"), "{left}");
    });
}

#[test]
fn http_tcp_and_sleep_reach_the_pod_ip() {
    let t = Target::start("probe-net");
    let id = t.container_id.as_str();
    block_on(async {
        let cri = lab_cri().await;
        let tcp = |port: IntOrString| TCPSocketAction { host: None, port };
        // Running means the runtime started the shell; httpd listens a moment later.
        let mut open = None;
        for _ in 0..50 {
            let out = probe_tcp(
                &tcp(IntOrString::String("http".into())),
                t.container(),
                &t.ip,
                secs(2),
            )
            .await
            .unwrap();
            if out.result == ProbeResult::Success {
                open = Some(out);
                break;
            }
            // Bounded: 50 tries, 100 ms apart.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(open.is_some(), "httpd never listened on {}:8080", t.ip);
        let closed = probe_tcp(&tcp(IntOrString::Int(8081)), t.container(), &t.ip, secs(2))
            .await
            .unwrap();
        assert_eq!(closed.result, ProbeResult::Failure);

        let get = |path: &str, port: IntOrString| LifecycleHandler {
            http_get: Some(HTTPGetAction {
                path: Some(path.into()),
                port,
                ..Default::default()
            }),
            ..Default::default()
        };
        let run = |h: LifecycleHandler, timeout| {
            let cri = cri.clone();
            let (pod, c, ip) = (t.pod.clone(), t.container().clone(), t.ip.clone());
            async move { run_handler(&cri, &pod, &c, id, &ip, &h, timeout).await }
        };
        run(
            get("/index.html", IntOrString::String("http".into())),
            secs(5),
        )
        .await
        .unwrap();
        let err = run(get("/index.html", IntOrString::Int(8081)), secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, HandlerError::Http { .. }), "{err}");
        assert!(
            err.to_string().contains(&format!("dial tcp {}:8081", t.ip)),
            "{err}"
        );

        let sleep = |seconds| LifecycleHandler {
            sleep: Some(SleepAction { seconds }),
            ..Default::default()
        };
        run(sleep(1), secs(5)).await.unwrap();
        let err = run(sleep(10), Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(matches!(err, HandlerError::Sleep { .. }), "{err}");
        let tcp_hook = LifecycleHandler {
            tcp_socket: Some(tcp(IntOrString::Int(8080))),
            ..Default::default()
        };
        assert!(matches!(
            run(tcp_hook, secs(5)).await.unwrap_err(),
            HandlerError::Invalid { .. }
        ));
    });
}

/// The next update within `within`, or a failure naming what was awaited.
async fn next(rx: &mut mpsc::Receiver<ProbeUpdate>, within: Duration, what: &str) -> ProbeUpdate {
    match tokio::time::timeout(within, rx.recv()).await {
        Ok(Some(u)) => u,
        Ok(None) => panic!("update channel closed while waiting for {what}"),
        Err(_) => panic!("no update within {within:?} while waiting for {what}"),
    }
}

#[test]
fn the_probe_manager_reports_changes_of_real_probes() {
    let t = Target::start("probe-manager");
    let id = t.container_id.clone();
    block_on(async {
        let cri = Arc::new(lab_cri().await);
        let stats = Arc::new(QueueStats::default());
        let (tx, mut rx) = queues::channel(Queue::ProbeResults, &stats);
        let manager = ProbeManager::new(cri.clone(), tx);
        let mut pod = t.pod.clone();
        let c = &mut pod.spec.as_mut().unwrap().containers[0];
        c.startup_probe = Some(exec_probe(
            vec!["test".into(), "-f".into(), "/tmp/started".into()],
            60,
        ));
        c.liveness_probe = Some(exec_probe(vec!["cat".into(), "/tmp/alive".into()], 2));
        c.readiness_probe = Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/index.html".into()),
                port: IntOrString::String("http".into()),
                ..Default::default()
            }),
            period_seconds: Some(1),
            ..Default::default()
        });
        manager
            .add_container(&pod, "app", &id, &t.ip, now_ns())
            .unwrap();

        let mut initial = BTreeSet::new();
        for _ in 0..3 {
            let u = next(&mut rx, secs(1), "initial results").await;
            assert_eq!(
                (u.pod_uid.as_str(), u.container_id.as_str()),
                (t.uid(), id.as_str())
            );
            initial.insert((u.kind, u.result));
        }
        assert_eq!(
            initial,
            BTreeSet::from([
                (ProbeKind::Liveness, ProbeResult::Success),
                (ProbeKind::Readiness, ProbeResult::Failure),
                (ProbeKind::Startup, ProbeResult::Unknown),
            ])
        );
        // Adding the same container again changes nothing.
        manager
            .add_container(&pod, "app", &id, &t.ip, now_ns())
            .unwrap();
        // While the startup probe fails (below its threshold) nothing is published, and
        // liveness and readiness are held back.
        assert!(
            tokio::time::timeout(secs(3), rx.recv()).await.is_err(),
            "an update before the container started"
        );

        let touch = sh("touch /tmp/alive /tmp/started");
        probe_exec(&*cri, &id, touch, secs(2)).await.unwrap();
        let u = next(&mut rx, secs(5), "startup success").await;
        assert_eq!(
            (u.kind, u.result),
            (ProbeKind::Startup, ProbeResult::Success)
        );
        // Readiness runs as soon as the container has started, over HTTP to the pod IP.
        let u = next(&mut rx, secs(3), "readiness success").await;
        assert_eq!(
            (u.kind, u.result),
            (ProbeKind::Readiness, ProbeResult::Success),
            "{u:?}"
        );
        assert_eq!(
            manager.result(t.uid(), "app", ProbeKind::Readiness),
            Some(ProbeResult::Success)
        );

        probe_exec(&*cri, &id, sh("rm /tmp/alive"), secs(2))
            .await
            .unwrap();
        let u = next(&mut rx, secs(8), "liveness failure").await;
        assert_eq!(
            (u.kind, u.result),
            (ProbeKind::Liveness, ProbeResult::Failure),
            "{u:?}"
        );
        assert!(u.output.contains("/tmp/alive"), "{u:?}");

        manager.remove_pod(t.uid());
        assert_eq!(manager.result(t.uid(), "app", ProbeKind::Readiness), None);
        probe_exec(&*cri, &id, sh("rm /tmp/index.html"), secs(2))
            .await
            .unwrap();
        // A removed pod's readiness worker no longer probes, so the missing page goes
        // unreported.
        assert!(
            tokio::time::timeout(secs(5), rx.recv()).await.is_err(),
            "an update after the pod was removed"
        );
    });
}
