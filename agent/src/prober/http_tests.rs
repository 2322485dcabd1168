//! httpGet against a local server that answers by path: status mapping, the timeout, the
//! request kubelet would send, redirects, named ports and the body limit.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, ContainerPort, HTTPGetAction, HTTPHeader};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::action::{ActionError, MAX_OUTPUT_BYTES};
use super::http::{HttpRequest, PROBE_PURPOSE, probe};
use super::state::ProbeResult;

/// How the test server answers a path: a full HTTP/1.1 response, or `None` to hang.
pub(crate) type Responder = fn(&str) -> Option<String>;

/// A server on 127.0.0.1 that answers each connection by its request path (without the
/// query) and reports
/// each request head it read.
pub(crate) async fn serve(respond: Responder) -> (u16, mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let target = head.split(' ').nth(1).unwrap_or_default();
                let path = target.split('?').next().unwrap_or_default().to_string();
                let _ = tx.send(head);
                match respond(&path) {
                    Some(resp) => {
                        let _ = sock.write_all(resp.as_bytes()).await;
                        let _ = sock.shutdown().await;
                    }
                    // Bounded: the test's runtime ends long before this does.
                    None => tokio::time::sleep(Duration::from_secs(60)).await,
                }
            });
        }
    });
    (port, rx)
}

pub(crate) fn response(status: &str, headers: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{headers}\r\n{body}",
        body.len()
    )
}

fn by_path(path: &str) -> Option<String> {
    match path {
        "/ok" | "/" => Some(response("200 OK", "", "fine")),
        "/fail" => Some(response("500 Internal Server Error", "", "secret detail")),
        "/slow" => None,
        "/to-ok" => Some(response("302 Found", "Location: /ok\r\n", "")),
        "/to-fail" => Some(response("301 Moved Permanently", "Location: fail\r\n", "")),
        "/elsewhere" => Some(response(
            "302 Found",
            "Location: http://127.0.0.2:1/x\r\n",
            "moved",
        )),
        "/loop" => Some(response(
            "307 Temporary Redirect",
            "Location: /loop\r\n",
            "",
        )),
        "/big" => Some(response("200 OK", "", &"x".repeat(MAX_OUTPUT_BYTES * 3))),
        _ => Some(response("404 Not Found", "", "")),
    }
}

fn container(port: u16) -> Container {
    Container {
        name: "web".into(),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: port.into(),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

fn get(path: &str, port: IntOrString) -> HTTPGetAction {
    HTTPGetAction {
        path: Some(path.into()),
        port,
        ..Default::default()
    }
}

async fn probe_path(port: u16, path: &str, timeout: Duration) -> (ProbeResult, String) {
    let action = get(path, IntOrString::Int(port.into()));
    let req = HttpRequest::new(&action, &container(port), "127.0.0.1", PROBE_PURPOSE).unwrap();
    let out = probe(&req, timeout).await;
    (out.result, out.output)
}

#[tokio::test]
async fn status_codes_map_to_results() {
    let (port, _) = serve(by_path).await;
    let t = Duration::from_secs(1);
    assert_eq!(
        probe_path(port, "/ok", t).await,
        (ProbeResult::Success, "fine".into())
    );
    // The failure message leaves the body out: it may carry secrets.
    assert_eq!(
        probe_path(port, "/fail", t).await,
        (
            ProbeResult::Failure,
            "HTTP probe failed with statuscode: 500".into()
        )
    );
    assert_eq!(
        probe_path(port, "/missing", t).await,
        (
            ProbeResult::Failure,
            "HTTP probe failed with statuscode: 404".into()
        )
    );
}

#[tokio::test]
async fn a_server_slower_than_the_timeout_fails_the_probe_in_time() {
    let (port, _) = serve(by_path).await;
    let started = Instant::now();
    let (result, output) = probe_path(port, "/slow", Duration::from_secs(1)).await;
    let took = started.elapsed();
    assert_eq!(result, ProbeResult::Failure);
    assert_eq!(
        output,
        format!(
            "Get \"http://127.0.0.1:{port}/slow\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        )
    );
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[tokio::test]
async fn a_closed_port_fails_with_the_dial_error() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (result, output) = probe_path(closed, "/ok", Duration::from_secs(1)).await;
    assert_eq!(result, ProbeResult::Failure);
    assert!(
        output.starts_with(&format!(
            "Get \"http://127.0.0.1:{closed}/ok\": dial tcp 127.0.0.1:{closed}: "
        )),
        "{output}"
    );
}

#[tokio::test]
async fn the_request_is_what_kubelet_sends_and_named_ports_resolve() {
    let (port, mut heads) = serve(by_path).await;
    let mut action = get("ok?verbose=1", IntOrString::String("http".into()));
    action.http_headers = Some(vec![HTTPHeader {
        name: "X-Probe".into(),
        value: "yes".into(),
    }]);
    // No host: the pod IP is used.
    let req = HttpRequest::new(&action, &container(port), "127.0.0.1", PROBE_PURPOSE).unwrap();
    assert_eq!(req.url, format!("http://127.0.0.1:{port}/ok?verbose=1"));
    let out = probe(&req, Duration::from_secs(1)).await;
    assert_eq!(out.result, ProbeResult::Success);
    let head = heads.recv().await.unwrap().to_ascii_lowercase();
    assert!(head.starts_with("get /ok?verbose=1 http/1.1\r\n"), "{head}");
    for line in [
        format!("host: 127.0.0.1:{port}"),
        "user-agent: kube-probe/1.37".into(),
        "accept: */*".into(),
        "x-probe: yes".into(),
        "connection: close".into(),
    ] {
        assert!(
            head.contains(&format!("{line}\r\n")),
            "no {line:?} in {head}"
        );
    }

    // The action's own Host and User-Agent win; an empty Accept removes it.
    action.http_headers = Some(vec![
        HTTPHeader {
            name: "Host".into(),
            value: "app.example".into(),
        },
        HTTPHeader {
            name: "User-Agent".into(),
            value: "mine".into(),
        },
        HTTPHeader {
            name: "Accept".into(),
            value: String::new(),
        },
    ]);
    let req = HttpRequest::new(&action, &container(port), "127.0.0.1", PROBE_PURPOSE).unwrap();
    probe(&req, Duration::from_secs(1)).await;
    let head = heads.recv().await.unwrap().to_ascii_lowercase();
    assert!(head.contains("host: app.example\r\n"), "{head}");
    assert!(head.contains("user-agent: mine\r\n"), "{head}");
    assert!(!head.contains("accept:"), "{head}");
    assert_eq!(head.matches("host:").count(), 1, "{head}");

    let unknown = get("/", IntOrString::String("admin".into()));
    assert!(matches!(
        HttpRequest::new(&unknown, &container(port), "127.0.0.1", PROBE_PURPOSE),
        Err(ActionError::PortNotFound { .. })
    ));
    assert!(matches!(
        HttpRequest::new(&action, &container(port), "", PROBE_PURPOSE),
        Err(ActionError::NoHost)
    ));
}

#[tokio::test]
async fn redirects_on_the_same_host_are_followed_and_others_are_not() {
    let (port, _) = serve(by_path).await;
    let t = Duration::from_secs(2);
    assert_eq!(
        probe_path(port, "/to-ok", t).await,
        (ProbeResult::Success, "fine".into())
    );
    // A relative Location resolves against the current path.
    assert_eq!(
        probe_path(port, "/to-fail", t).await.0,
        ProbeResult::Failure
    );
    // Off-host: the redirect itself is the answer, a success with a warning.
    assert_eq!(
        probe_path(port, "/elsewhere", t).await,
        (
            ProbeResult::Success,
            "Probe terminated redirects, Response body: moved".into()
        )
    );
    let (result, output) = probe_path(port, "/loop", t).await;
    assert_eq!(result, ProbeResult::Failure);
    assert!(output.ends_with(": stopped after 10 redirects"), "{output}");
}

#[tokio::test]
async fn only_the_first_10_kib_of_a_body_are_kept() {
    let (port, _) = serve(by_path).await;
    let (result, output) = probe_path(port, "/big", Duration::from_secs(2)).await;
    assert_eq!(result, ProbeResult::Success);
    assert_eq!(output.len(), MAX_OUTPUT_BYTES);
}

/// A TLS server on 127.0.0.1 with a fresh self-signed certificate for another name, which
/// answers every request with `resp`.
async fn serve_tls(resp: String) -> u16 {
    use std::sync::Arc;

    let cert =
        rcgen::generate_simple_self_signed(vec!["not-this-host.example".to_string()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert.cert.der().clone()], key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let (acceptor, resp) = (acceptor.clone(), resp.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(sock).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut chunk = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = tls.write_all(resp.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    port
}

fn https_request(port: u16) -> HttpRequest {
    let action = HTTPGetAction {
        scheme: Some("HTTPS".into()),
        path: Some("/healthz".into()),
        port: IntOrString::Int(port.into()),
        ..Default::default()
    };
    HttpRequest::new(&action, &Container::default(), "127.0.0.1", PROBE_PURPOSE).unwrap()
}

#[tokio::test]
async fn https_probes_do_not_verify_the_certificate_as_kubelet() {
    let port = serve_tls(response("200 OK", "", "secure ok")).await;
    let req = https_request(port);
    assert_eq!(req.url, format!("https://127.0.0.1:{port}/healthz"));
    let out = probe(&req, Duration::from_secs(2)).await;
    assert_eq!(
        (out.result, out.output.as_str()),
        (ProbeResult::Success, "secure ok")
    );
    let failing = serve_tls(response("503 Service Unavailable", "", "")).await;
    let out = probe(&https_request(failing), Duration::from_secs(2)).await;
    assert_eq!(
        (out.result, out.output.as_str()),
        (
            ProbeResult::Failure,
            "HTTP probe failed with statuscode: 503"
        )
    );
}

#[tokio::test]
async fn https_to_a_plain_http_server_fails_naming_the_url() {
    let (port, _heads) = serve(|_| Some(response("200 OK", "", "plain"))).await;
    let out = probe(&https_request(port), Duration::from_secs(2)).await;
    assert_eq!(out.result, ProbeResult::Failure);
    assert!(
        out.output
            .starts_with(&format!("Get \"https://127.0.0.1:{port}/healthz\": ")),
        "{}",
        out.output
    );
}
