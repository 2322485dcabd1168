//! HTTP GET for httpGet probes and hooks: kubelet's `NewRequestForHTTPGetAction` and its
//! probe HTTP client, over hyper's HTTP/1 connection API. kubelet disables keep-alive for
//! probes, so every request gets its own connection, driven inline: nothing is spawned,
//! and dropping the future (on timeout) closes the socket.

use std::pin::pin;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Container, HTTPGetAction};

use super::action::{
    ActionError, MAX_OUTPUT_BYTES, ProbeOutcome, host_or_pod_ip, join_host_port, resolve_port,
};
use super::gofmt;
use super::state::ProbeResult;

/// The Kubernetes minor the API types come from, for kubelet's User-Agent.
pub(crate) const KUBE_VERSION: &str = "1.37";
/// User-Agent purpose of probes (`kube-probe/1.37`).
pub const PROBE_PURPOSE: &str = "probe";
/// User-Agent purpose of lifecycle hooks (`kube-lifecycle/1.37`).
pub const LIFECYCLE_PURPOSE: &str = "lifecycle";
/// Go's http.Client gives up after this many redirects.
const MAX_REQUESTS: usize = 10;

/// A GET to send: where to connect, what to ask for, and the URL for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    pub url: String,
    /// HTTPS: TLS without certificate verification, as kubelet.
    https: bool,
    host: String,
    port: u16,
    /// Origin-form request target: path and query.
    target: String,
    headers: Vec<(HeaderName, HeaderValue)>,
}

/// The part of a response the prober reads: status and up to [`MAX_OUTPUT_BYTES`] of body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    pub status: StatusCode,
    pub body: Vec<u8>,
}

/// A connection HTTP runs over: plain TCP or TLS on it.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// Why no response came back. The messages follow Go's `url.Error`, which kubelet shows.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The TCP connection could not be opened.
    #[error("Get {}: dial tcp {addr}: {source}", gofmt::quote(url.as_bytes()))]
    Connect {
        url: String,
        addr: String,
        #[source]
        source: std::io::Error,
    },

    /// The TLS handshake of an HTTPS request failed.
    #[error("Get {}: {source}", gofmt::quote(url.as_bytes()))]
    Tls {
        url: String,
        #[source]
        source: std::io::Error,
    },

    /// No complete answer within the timeout.
    #[error("Get {}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)", gofmt::quote(url.as_bytes()))]
    Timeout { url: String },

    /// The peer broke HTTP/1.1 or closed the connection early.
    #[error("Get {}: {source}", gofmt::quote(url.as_bytes()))]
    Protocol {
        url: String,
        #[source]
        source: hyper::Error,
    },

    /// The server kept redirecting on its own host.
    #[error("Get {}: stopped after 10 redirects", gofmt::quote(url.as_bytes()))]
    TooManyRedirects { url: String },

    /// A redirect on the same host that podlapse cannot follow.
    #[error("Get {}: cannot follow redirect to {location:?}: {reason}", gofmt::quote(url.as_bytes()))]
    Redirect {
        url: String,
        location: String,
        reason: &'static str,
    },
}

impl HttpRequest {
    /// kubelet's `NewRequestForHTTPGetAction`: host defaults to the pod IP, the port may be
    /// a named container port, and User-Agent and Accept get kubelet's defaults unless the
    /// action's headers set them (an empty Accept removes it).
    pub fn new(
        action: &HTTPGetAction,
        container: &Container,
        pod_ip: &str,
        purpose: &str,
    ) -> Result<HttpRequest, ActionError> {
        let scheme = action
            .scheme
            .as_deref()
            .unwrap_or("HTTP")
            .to_ascii_lowercase();
        let https = match scheme.as_str() {
            "http" => false,
            "https" => true,
            _ => return Err(ActionError::UnsupportedScheme { scheme }),
        };
        let host = host_or_pod_ip(action.host.as_deref(), pod_ip)?.to_string();
        let port = resolve_port(&action.port, container)?;
        let path = action.path.as_deref().unwrap_or_default();
        let path = path.split('#').next().unwrap_or_default();
        let target = match path {
            "" => "/".to_string(),
            p if p.starts_with('/') => escape_target(p),
            p => format!("/{}", escape_target(p)),
        };
        let authority = join_host_port(&host, port);
        let url = if path.is_empty() {
            format!("{scheme}://{authority}")
        } else {
            format!("{scheme}://{authority}{target}")
        };

        let mut headers = Vec::new();
        for h in action.http_headers.iter().flatten() {
            let bad = |reason: String| ActionError::BadHeader {
                name: h.name.clone(),
                reason,
            };
            let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|e| bad(e.to_string()))?;
            let value = HeaderValue::from_str(&h.value).map_err(|e| bad(e.to_string()))?;
            headers.push((name, value));
        }
        let first = |name: &HeaderName| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        // Go sends one Host: the first header value, else the URL's authority.
        let host_header = match first(&header::HOST) {
            Some(v) if !v.is_empty() => v.clone(),
            _ => HeaderValue::from_str(&authority).map_err(|e| ActionError::BadHeader {
                name: "Host".into(),
                reason: e.to_string(),
            })?,
        };
        let user_agent = first(&header::USER_AGENT).is_none();
        let accept = first(&header::ACCEPT).cloned();
        headers.retain(|(n, _)| n != header::HOST);
        match accept {
            None => headers.push((header::ACCEPT, HeaderValue::from_static("*/*"))),
            Some(v) if v.is_empty() => headers.retain(|(n, _)| n != header::ACCEPT),
            Some(_) => {}
        }
        if user_agent {
            let ua = format!("kube-{purpose}/{KUBE_VERSION}");
            let ua = HeaderValue::from_str(&ua).map_err(|e| ActionError::BadHeader {
                name: "User-Agent".into(),
                reason: e.to_string(),
            })?;
            headers.push((header::USER_AGENT, ua));
        }
        headers.insert(0, (header::HOST, host_header));
        headers.push((header::CONNECTION, HeaderValue::from_static("close")));
        Ok(HttpRequest {
            url,
            https,
            host,
            port,
            target,
            headers,
        })
    }

    /// Where a redirect's Location leads, resolved against this request. `origin` is the
    /// host of the first request: kubelet follows redirects only on it.
    fn redirect(&self, location: &str, origin: &str) -> Result<Redirect, HttpError> {
        let location = location.split('#').next().unwrap_or_default();
        let refuse = |reason| HttpError::Redirect {
            url: self.url.clone(),
            location: location.to_string(),
            reason,
        };
        let (https, authority, rest) = if let Some(rest) = location.strip_prefix("http://") {
            let (authority, rest) = split_authority(rest);
            (false, authority, rest)
        } else if let Some(rest) = location.strip_prefix("https://") {
            let (authority, rest) = split_authority(rest);
            (true, authority, rest)
        } else if let Some(rest) = location.strip_prefix("//") {
            let (authority, rest) = split_authority(rest);
            (self.https, authority, rest)
        } else if location.contains("://") {
            return Err(refuse("not an http URL"));
        } else {
            (self.https, "", location)
        };
        let mut next = self.clone();
        if !authority.is_empty() {
            let default_port = if https { 443 } else { 80 };
            let (host, port) =
                parse_authority(authority, default_port).ok_or(refuse("bad host"))?;
            if host != origin {
                return Ok(Redirect::Elsewhere);
            }
            next.host = host;
            next.port = port;
        }
        next.target = if rest.is_empty() {
            "/".to_string()
        } else if rest.starts_with('/') {
            escape_target(rest)
        } else {
            // A relative reference replaces the last segment of the current path.
            let path = self.target.split('?').next().unwrap_or("/");
            let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
            format!("{dir}{}", escape_target(rest))
        };
        next.https = https;
        let authority = join_host_port(&next.host, next.port);
        let scheme = if https { "https" } else { "http" };
        next.url = format!("{scheme}://{authority}{}", next.target);
        // A Host the action set stays; the default one follows the port.
        if let Some(h) = next.headers.iter_mut().find(|(n, _)| n == header::HOST)
            && h.1.as_bytes() == join_host_port(&self.host, self.port).as_bytes()
        {
            h.1 = HeaderValue::from_str(&authority).map_err(|_| refuse("bad host"))?;
        }
        Ok(Redirect::Follow(next))
    }
}

/// What to do with a redirect.
enum Redirect {
    /// Same host: send this request.
    Follow(HttpRequest),
    /// Another host: the redirect response itself is the answer.
    Elsewhere,
}

fn split_authority(s: &str) -> (&str, &str) {
    match s.find(['/', '?']) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    }
}

fn parse_authority(authority: &str, default_port: u16) -> Option<(String, u16)> {
    let authority = authority.rsplit('@').next()?;
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        None | Some("") => default_port,
        Some(p) => p.parse().ok().filter(|p| *p > 0)?,
    };
    (!host.is_empty()).then(|| (host.to_string(), port))
}

/// Percent-encodes what cannot appear in a request target, as Go's URL.String does for a
/// path with spaces or non-ASCII text.
fn escape_target(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_graphic() && !b"\"<>\\^`{|}".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Sends the GET, following redirects on the same host as kubelet's probe client does
/// (a redirect elsewhere ends with the redirect response itself). `timeout` bounds the
/// whole exchange, redirects and body included.
pub async fn get(
    req: &HttpRequest,
    timeout: Duration,
    read_body: bool,
) -> Result<HttpResponse, HttpError> {
    match tokio::time::timeout(timeout, follow(req, read_body)).await {
        Ok(r) => r,
        Err(_) => Err(HttpError::Timeout {
            url: req.url.clone(),
        }),
    }
}

async fn follow(first: &HttpRequest, read_body: bool) -> Result<HttpResponse, HttpError> {
    let mut current = first.clone();
    let mut requests = 0;
    loop {
        requests += 1;
        let (resp, location) = exchange(&current, read_body).await?;
        let Some(location) = location else {
            return Ok(resp);
        };
        let next = match current.redirect(&location, &first.host)? {
            Redirect::Follow(next) => next,
            Redirect::Elsewhere => return Ok(resp),
        };
        if requests >= MAX_REQUESTS {
            return Err(HttpError::TooManyRedirects { url: next.url });
        }
        current = next;
    }
}

/// One request on its own connection. Returns the response and, for a redirect status,
/// its Location.
async fn exchange(
    req: &HttpRequest,
    read_body: bool,
) -> Result<(HttpResponse, Option<String>), HttpError> {
    let addr = join_host_port(&req.host, req.port);
    let stream = super::dialer::dial(&addr)
        .await
        .map_err(|source| HttpError::Connect {
            url: req.url.clone(),
            addr: addr.clone(),
            source,
        })?;
    let protocol = |source| HttpError::Protocol {
        url: req.url.clone(),
        source,
    };
    let stream: Box<dyn Io> = if req.https {
        let tls = |source: std::io::Error| HttpError::Tls {
            url: req.url.clone(),
            source,
        };
        let name = super::tls::server_name(&req.host)
            .map_err(|e| tls(std::io::Error::other(e.to_string())))?;
        Box::new(
            super::tls::probe_connector()
                .connect(name, stream)
                .await
                .map_err(tls)?,
        )
    } else {
        Box::new(stream)
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(protocol)?;
    let mut request = Request::get(req.target.as_str());
    for (name, value) in &req.headers {
        request = request.header(name, value);
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .expect("target and headers were validated when the request was built");
    let exchange = async {
        let resp = sender.send_request(request).await?;
        let status = resp.status();
        let location = matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
            .then(|| resp.headers().get(header::LOCATION))
            .flatten()
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mut body = Vec::new();
        if read_body {
            let mut incoming = resp.into_body();
            while body.len() < MAX_OUTPUT_BYTES {
                let Some(frame) = incoming.frame().await else {
                    break;
                };
                if let Ok(data) = frame?.into_data() {
                    let room = MAX_OUTPUT_BYTES - body.len();
                    body.extend_from_slice(&data[..data.len().min(room)]);
                }
            }
        }
        Ok((HttpResponse { status, body }, location))
    };
    // The connection future does the socket IO and must be polled alongside the request;
    // it may finish first (the server closed after answering) while the answer is still
    // being read from its buffer.
    let mut conn = pin!(conn);
    let mut exchange = pin!(exchange);
    let mut conn_done = false;
    loop {
        tokio::select! {
            r = &mut exchange => return r.map_err(protocol),
            r = &mut conn, if !conn_done => {
                conn_done = true;
                r.map_err(protocol)?;
            }
        }
    }
}

/// An httpGet probe: 2xx is Success, 3xx is Success with a warning (a redirect kubelet did
/// not follow), anything else or no answer is Failure.
pub async fn probe(req: &HttpRequest, timeout: Duration) -> ProbeOutcome {
    match get(req, timeout, true).await {
        Err(e) => ProbeOutcome {
            result: ProbeResult::Failure,
            output: e.to_string(),
        },
        Ok(resp) => probe_result(&resp),
    }
}

/// kubelet's `DoHTTPProbe` verdict on a response.
pub fn probe_result(resp: &HttpResponse) -> ProbeOutcome {
    let body = String::from_utf8_lossy(&resp.body);
    let code = resp.status.as_u16();
    let (result, output) = match code {
        200..=299 => (ProbeResult::Success, body.into_owned()),
        300..=399 => (
            ProbeResult::Success,
            format!("Probe terminated redirects, Response body: {body}"),
        ),
        // kubelet keeps the body out of the failure message: it may hold secrets.
        _ => (
            ProbeResult::Failure,
            format!("HTTP probe failed with statuscode: {code}"),
        ),
    };
    ProbeOutcome { result, output }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    use super::*;

    fn request(path: &str) -> HttpRequest {
        let action = HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(8080),
            ..Default::default()
        };
        HttpRequest::new(&action, &Container::default(), "10.0.0.7", PROBE_PURPOSE).unwrap()
    }

    fn follow_to(from: &str, location: &str) -> Result<String, String> {
        match request(from).redirect(location, "10.0.0.7") {
            Ok(Redirect::Follow(next)) => Ok(next.url),
            Ok(Redirect::Elsewhere) => Err("elsewhere".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn redirects_resolve_like_a_browser_and_stay_on_the_host() {
        let ok = |s: &str| Ok(s.to_string());
        assert_eq!(follow_to("/a/b", "/c"), ok("http://10.0.0.7:8080/c"));
        assert_eq!(
            follow_to("/a/b?x=1", "c?y=2"),
            ok("http://10.0.0.7:8080/a/c?y=2")
        );
        assert_eq!(
            follow_to("/a", "http://10.0.0.7:9090/z"),
            ok("http://10.0.0.7:9090/z")
        );
        assert_eq!(
            follow_to("/a", "//10.0.0.7/z#frag"),
            ok("http://10.0.0.7:80/z")
        );
        assert_eq!(
            follow_to("/a", "/with space"),
            ok("http://10.0.0.7:8080/with%20space")
        );
        assert_eq!(
            follow_to("/a", "http://10.0.0.8/z"),
            Err("elsewhere".into())
        );
        assert_eq!(
            follow_to("/a", "https://other.example/"),
            Err("elsewhere".into())
        );
        // The same host over HTTPS is followed (Go's client changes scheme freely).
        assert_eq!(
            follow_to("/a", "https://10.0.0.7/z"),
            ok("https://10.0.0.7:443/z")
        );
    }

    #[test]
    fn the_default_host_header_follows_a_redirect_and_a_given_one_stays() {
        let host = |r: &HttpRequest| {
            let (_, v) = r.headers.iter().find(|(n, _)| n == header::HOST).unwrap();
            v.to_str().unwrap().to_string()
        };
        let Ok(Redirect::Follow(next)) = request("/").redirect("http://10.0.0.7:81/", "10.0.0.7")
        else {
            panic!("not followed");
        };
        assert_eq!(host(&next), "10.0.0.7:81");
        let mut given = request("/");
        given.headers[0].1 = HeaderValue::from_static("app.example");
        let Ok(Redirect::Follow(next)) = given.redirect("http://10.0.0.7:81/", "10.0.0.7") else {
            panic!("not followed");
        };
        assert_eq!(host(&next), "app.example");
    }
}
