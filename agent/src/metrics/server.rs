//! `/metrics` over HTTP on a TCP address, loopback by default.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::Metrics;

/// kubelet serves metrics on its ports; podlapse defaults to loopback so nothing is
/// exposed off the node unless asked.
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:10255";

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address does not read as one.
    #[error("metrics address {addr:?}: {why}")]
    Addr { addr: String, why: String },
    /// The address could not be bound.
    #[error("metrics address {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// `addr` as a socket address: `IP:PORT`, `[IPv6]:PORT`, or `localhost:PORT` (the
/// loopback address). Host names are refused: what one resolves to is not this flag's
/// to guess, and a scrape endpoint off the node must be asked for by its address.
pub fn parse_addr(addr: &str) -> Result<SocketAddr, MetricsError> {
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(a);
    }
    let why = match addr.rsplit_once(':') {
        Some(("localhost", port)) => match port.parse::<u16>() {
            Ok(port) => return Ok(SocketAddr::from(([127, 0, 0, 1], port))),
            Err(_) => format!("{port:?} is not a port"),
        },
        Some(("", _)) => {
            "give the address to bind, as 127.0.0.1:PORT, or 0.0.0.0:PORT for every interface"
                .to_string()
        }
        Some((host, port)) if port.parse::<u16>().is_ok() => format!(
            "{host:?} is not an IP address (give 127.0.0.1:PORT, or the address of the interface to serve on)"
        ),
        Some((_, port)) => format!("{port:?} is not a port"),
        None => "not IP:PORT".to_string(),
    };
    Err(MetricsError::Addr {
        addr: addr.to_string(),
        why,
    })
}

/// Binds `addr`: done before anything else starts, so a port in use or an address
/// this host does not have stops the command with nothing started.
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, MetricsError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind { addr, source })
}

/// Binds `addr` and serves until the task is dropped. `before` runs before each scrape
/// (to fold in what is computed lazily).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    before: Arc<dyn Fn() + Send + Sync>,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), MetricsError> {
    let listener = bind(addr).await?;
    let local = listener.local_addr().unwrap_or(addr);
    Ok((local, serve_on(listener, metrics, before)))
}

/// Serves `/metrics` on a bound listener until the task is dropped.
pub fn serve_on(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    before: Arc<dyn Fn() + Send + Sync>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (metrics, before) = (metrics.clone(), before.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let (metrics, before) = (metrics.clone(), before.clone());
                    async move {
                        let resp = if req.method() == Method::GET && req.uri().path() == "/metrics"
                        {
                            before();
                            // Scrapers that ask for OpenMetrics get it; others get the
                            // Prometheus text format.
                            let openmetrics = req
                                .headers()
                                .get(hyper::header::ACCEPT)
                                .and_then(|a| a.to_str().ok())
                                .is_some_and(|a| a.contains("application/openmetrics-text"));
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
                            let mut r =
                                Response::new(Full::new(Bytes::from_static(b"try /metrics\n")));
                            *r.status_mut() = StatusCode::NOT_FOUND;
                            r
                        };
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    })
}
