//! The agent's local API: HTTP/1 on a unix socket that only root can open. `GET /pods`
//! gives every pod's record (API status, first seen, events); `GET /events` every pod's
//! events; `GET /timeline` every pod's stage timeline; `GET /diagnose` every pod's
//! verdict. `podlapse pods`, `podlapse events`, `podlapse timeline` and `podlapse
//! diagnose` read it. `podlapse observe` serves the same, of the pods it observes.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::UnixListener;

use super::StatusStore;
use crate::timeline::Collector;

/// Where the agent serves its API unless told otherwise.
pub const DEFAULT_API_SOCKET: &str = "/run/podlapse/podlapse.sock";

/// Why the API could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Another agent is already answering on the socket.
    #[error("API socket {}: another podlapse agent is already serving it", path.display())]
    InUse { path: PathBuf },
    /// Creating the socket or its directory failed.
    #[error("API socket {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What the API answers from.
#[derive(Clone)]
pub struct ApiState {
    pub store: Arc<StatusStore>,
    pub timeline: Arc<Collector>,
}

impl ApiState {
    pub fn new(store: Arc<StatusStore>, timeline: Arc<Collector>) -> ApiState {
        ApiState { store, timeline }
    }
}

/// Binds the socket (root-only) and serves until the task is dropped.
pub fn serve(path: &Path, state: ApiState) -> Result<tokio::task::JoinHandle<()>, ApiError> {
    let io = |source| ApiError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ApiError::InUse {
                path: path.to_path_buf(),
            });
        }
        std::fs::remove_file(path).map_err(io)?;
    }
    let listener = UnixListener::bind(path).map_err(io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    let owned = path.to_path_buf();
    Ok(tokio::spawn(async move {
        let _cleanup = RemoveOnDrop(owned);
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(serve_connection(stream, state.clone()));
        }
    }))
}

/// Answers the requests of one connection until the client closes it or sends what is
/// not HTTP/1.
pub async fn serve_connection<IO>(io: IO, state: ApiState)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let response = handle(&state, req.method(), req.uri().path());
        async move { Ok::<_, std::convert::Infallible>(response) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn json(status: StatusCode, body: serde_json::Value) -> Response<Full<Bytes>> {
    bytes_response(status, body.to_string().into_bytes())
}

/// `body` written straight to JSON: no `serde_json::Value` tree of it on the way, which
/// for a hundred pods or a busy timeline is several times the size of the text, and
/// would be allocated on every request a watcher makes while pods start.
fn json_of<T: serde::Serialize + ?Sized>(body: &T) -> Response<Full<Bytes>> {
    match serde_json::to_vec(body) {
        Ok(bytes) => bytes_response(StatusCode::OK, bytes),
        Err(e) => json(
            StatusCode::INTERNAL_SERVER_ERROR,
            serde_json::json!({ "error": e.to_string() }),
        ),
    }
}

fn bytes_response(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// `GET /pods`.
#[derive(serde::Serialize)]
struct PodsBody<'a> {
    pods: &'a [&'a super::status_store::PodRecord],
    /// What is wrong with the node's pod network, as last looked at.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    node: Vec<crate::diagnose::NodeFinding>,
}

fn handle(state: &ApiState, method: &Method, path: &str) -> Response<Full<Bytes>> {
    let (store, timeline) = (&state.store, &state.timeline);
    match (method, path) {
        // Serialized in place, under the store's lock: a watcher polling a node with a
        // hundred pods would otherwise copy every record (spec, status, events) on each
        // request, megabytes of short-lived heap while the pods start.
        (&Method::GET, "/pods") => {
            let node = crate::diagnose::node_findings(timeline.last_network().as_ref());
            store.with_sorted(|pods| json_of(&PodsBody { pods, node }))
        }
        (&Method::GET, "/events") => {
            let events: Vec<serde_json::Value> = store
                .list()
                .into_iter()
                .flat_map(|p| {
                    let (ns, name) = (p.namespace.clone(), p.name.clone());
                    p.events.into_iter().map(move |e| {
                        let mut v = serde_json::to_value(&e).unwrap_or_default();
                        v["namespace"] = ns.clone().into();
                        v["pod"] = name.clone().into();
                        v
                    })
                })
                .collect();
            json(StatusCode::OK, serde_json::json!({ "events": events }))
        }
        (&Method::GET, "/diagnose") => {
            let node_ip = store.list().into_iter().find_map(|p| p.status.host_ip);
            let diagnosis = crate::diagnose::diagnose(&timeline.records(), node_ip.as_deref());
            json_of(&diagnosis)
        }
        (&Method::GET, "/timeline") => json_of(&timeline.timeline()),
        (_, path) => json(
            StatusCode::NOT_FOUND,
            serde_json::json!({ "error": format!("no such resource {path:?}; try /pods, /events, /timeline or /diagnose") }),
        ),
    }
}

/// A client call: `GET path` on the agent's socket, the JSON body back.
pub async fn get(socket: &Path, path: &str) -> Result<serde_json::Value, String> {
    use http_body_util::BodyExt;
    let stream = tokio::net::UnixStream::connect(socket).await.map_err(|e| {
        format!(
            "agent API {}: {e} (is `podlapse run` or `podlapse observe` running?)",
            socket.display()
        )
    })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("agent API {}: {e}", socket.display()))?;
    tokio::spawn(conn);
    let req = Request::get(path)
        .header(hyper::header::HOST, "podlapse")
        .body(http_body_util::Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("agent API {}: {e}", socket.display()))?;
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("agent API {}: {e}", socket.display()))?
        .to_bytes();
    serde_json::from_slice(&body)
        .map_err(|e| format!("agent API {}: bad answer: {e}", socket.display()))
}
