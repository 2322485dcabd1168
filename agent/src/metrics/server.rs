//! `/metrics` over HTTP on a TCP address, loopback by default.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::Metrics;

/// kubelet serves metrics on its ports; podtrace defaults to loopback so nothing is
/// exposed off the node unless asked.
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:10255";

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address could not be bound.
    #[error("metrics address {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Binds `addr` and serves until the task is dropped. `before` runs before each scrape
/// (to fold in what is computed lazily).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    before: Arc<dyn Fn() + Send + Sync>,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), MetricsError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind { addr, source })?;
    let local = listener.local_addr().unwrap_or(addr);
    Ok((
        local,
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (metrics, before) = (metrics.clone(), before.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(
                        move |req: Request<hyper::body::Incoming>| {
                            let (metrics, before) = (metrics.clone(), before.clone());
                            async move {
                                let resp = if req.method() == Method::GET
                                    && req.uri().path() == "/metrics"
                                {
                                    before();
                                    // Scrapers that ask for OpenMetrics get it; others get the
                                    // Prometheus text format.
                                    let openmetrics = req
                                        .headers()
                                        .get(hyper::header::ACCEPT)
                                        .and_then(|a| a.to_str().ok())
                                        .is_some_and(|a| {
                                            a.contains("application/openmetrics-text")
                                        });
                                    let (body, kind) = if openmetrics {
                                        (
                                            metrics.encode(),
                                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                                        )
                                    } else {
                                        (
                                            metrics.encode_prometheus(),
                                            "text/plain; version=0.0.4; charset=utf-8",
                                        )
                                    };
                                    let mut r = Response::new(Full::new(Bytes::from(body)));
                                    r.headers_mut().insert(
                                        hyper::header::CONTENT_TYPE,
                                        hyper::header::HeaderValue::from_static(kind),
                                    );
                                    r
                                } else {
                                    let mut r = Response::new(Full::new(Bytes::from_static(
                                        b"try /metrics\n",
                                    )));
                                    *r.status_mut() = StatusCode::NOT_FOUND;
                                    r
                                };
                                Ok::<_, std::convert::Infallible>(resp)
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        }),
    ))
}
