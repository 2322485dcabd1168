//! A recording CRI proxy: a unix socket that passes every gRPC call through to the
//! runtime's socket unchanged (HTTP/2 request and response, streams and trailers
//! included) and keeps each call's method. A test points a client at it to see exactly
//! which CRI methods the client called.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hyper::Request;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{UnixListener, UnixStream};

type Calls = Arc<Mutex<Vec<String>>>;

pub struct CriProxy {
    pub socket: PathBuf,
    calls: Calls,
    /// Serves the proxy until the proxy is dropped.
    _runtime: tokio::runtime::Runtime,
}

impl CriProxy {
    /// Listens on `dir/cri-proxy.sock`, forwarding to `upstream`.
    pub fn start(upstream: &Path, dir: &Path) -> CriProxy {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the proxy");
        let socket = dir.join("cri-proxy.sock");
        let listener = {
            let _entered = runtime.enter();
            UnixListener::bind(&socket).expect("the proxy's socket binds")
        };
        let calls = Calls::default();
        runtime.spawn(serve(listener, upstream.to_path_buf(), calls.clone()));
        CriProxy {
            socket,
            calls,
            _runtime: runtime,
        }
    }

    /// The endpoint to give a CRI client.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The CRI methods called through the proxy so far (`RunPodSandbox`, ...).
    pub fn methods(&self) -> BTreeSet<String> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .map(|path| path.rsplit('/').next().unwrap_or(path).to_string())
            .collect()
    }
}

async fn serve(listener: UnixListener, upstream: PathBuf, calls: Calls) {
    while let Ok((conn, _)) = listener.accept().await {
        let upstream = upstream.clone();
        let calls = calls.clone();
        tokio::spawn(async move {
            // One connection to the runtime per client connection, as the client's own.
            let Ok(up) = UnixStream::connect(&upstream).await else {
                return;
            };
            let Ok((sender, up_conn)) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(up)).await
            else {
                return;
            };
            tokio::spawn(up_conn);
            let service = service_fn(move |req: Request<Incoming>| {
                calls.lock().unwrap().push(req.uri().path().to_string());
                let mut sender = sender.clone();
                async move { sender.send_request(req).await }
            });
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(conn), service)
                .await;
        });
    }
}
