//! Hook handlers that need no runtime: httpGet against a local server, sleep, and the
//! handlers kubelet refuses. Exec hooks run against the lab in `tests/shared_lab/probes.rs`.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, ExecAction, HTTPGetAction, LifecycleHandler, Pod, SleepAction, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::handlers::{HandlerError, HookAction, run_http_handler, run_sleep_handler};
use crate::prober::http_tests::{response, serve};

fn pod() -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some("web".into());
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some("u-1".into());
    p
}

fn container() -> Container {
    Container {
        name: "app".into(),
        ..Default::default()
    }
}

fn by_path(path: &str) -> Option<String> {
    match path {
        "/hook" => Some(response("200 OK", "", "")),
        "/broken" => Some(response("500 Internal Server Error", "", "")),
        _ => None,
    }
}

fn get(path: &str, port: u16) -> HTTPGetAction {
    HTTPGetAction {
        path: Some(path.into()),
        port: IntOrString::Int(port.into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn http_hooks_succeed_on_any_answer_and_fail_without_one() {
    let (port, mut heads) = serve(by_path).await;
    let t = Duration::from_secs(1);
    let (p, c) = (pod(), container());
    run_http_handler(&p, &c, "127.0.0.1", &get("/hook", port), t)
        .await
        .unwrap();
    let head = heads.recv().await.unwrap().to_ascii_lowercase();
    assert!(
        head.contains("user-agent: kube-lifecycle/1.37\r\n"),
        "{head}"
    );
    // kubelet does not judge a hook by its status code.
    run_http_handler(&p, &c, "127.0.0.1", &get("/broken", port), t)
        .await
        .unwrap();

    let err = run_http_handler(&p, &c, "127.0.0.1", &get("/hang", port), t)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "HTTP lifecycle hook (/hang) for Container \"app\" in Pod \"web_default(u-1)\" failed - error: Get \"http://127.0.0.1:{port}/hang\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        )
    );
    let named = HTTPGetAction {
        port: IntOrString::String("admin".into()),
        ..get("/x", port)
    };
    let err = run_http_handler(&p, &c, "127.0.0.1", &named, t)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "HTTP lifecycle hook (/x) for Container \"app\" in Pod \"web_default(u-1)\" failed - error: port \"admin\" not found in container \"app\""
    );
}

#[tokio::test]
async fn sleep_hooks_sleep_or_fail_when_the_time_runs_out() {
    let (p, c) = (pod(), container());
    let started = Instant::now();
    run_sleep_handler(&p, &c, 1, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1));

    let started = Instant::now();
    let err = run_sleep_handler(&p, &c, 30, Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        err.to_string(),
        "Sleep lifecycle hook (30) for Container \"app\" in Pod \"web_default(u-1)\" failed - error: container terminated before sleep hook finished"
    );
}

#[test]
fn handlers_kubelet_refuses_are_invalid() {
    let tcp = LifecycleHandler {
        tcp_socket: Some(TCPSocketAction {
            host: None,
            port: IntOrString::Int(80),
        }),
        ..Default::default()
    };
    let empty_exec = LifecycleHandler {
        exec: Some(ExecAction { command: None }),
        ..Default::default()
    };
    let negative_sleep = LifecycleHandler {
        sleep: Some(SleepAction { seconds: -1 }),
        ..Default::default()
    };
    for (handler, text) in [
        (
            tcp,
            "Cannot run handler: invalid handler: tcpSocket is not supported for lifecycle hooks",
        ),
        (
            LifecycleHandler::default(),
            "Cannot run handler: invalid handler: no exec, httpGet or sleep action",
        ),
        (
            empty_exec,
            "Cannot run handler: invalid handler: exec.command is empty",
        ),
        (
            negative_sleep,
            "Cannot run handler: invalid handler: sleep.seconds is negative (-1)",
        ),
    ] {
        let err = HookAction::from_handler(&handler).unwrap_err();
        assert!(matches!(err, HandlerError::Invalid { .. }));
        assert_eq!(err.to_string(), text);
    }
    let exec = LifecycleHandler {
        exec: Some(ExecAction {
            command: Some(vec!["true".into()]),
        }),
        // kubelet takes exec first when a handler has several actions.
        sleep: Some(SleepAction { seconds: 1 }),
        ..Default::default()
    };
    assert_eq!(
        HookAction::from_handler(&exec).unwrap(),
        HookAction::Exec(&["true".to_string()])
    );
}
