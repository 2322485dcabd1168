//! The local image registry (`docker-registry`, distribution 2.8), plain HTTP on loopback,
//! storing blobs under the lab root.

use std::fs;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use super::REGISTRY_ADDR;
use super::error::LabError;
use super::paths::LabPaths;
use super::process;
use crate::poll::Poll;

const PART: &str = "registry";
pub(crate) const PROGRAM: &str = "docker-registry";
const READY_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) fn config_yaml(storage: &Path, addr: &str) -> String {
    format!(
        "version: 0.1\n\
         log:\n  level: info\n  fields:\n    service: podlapse-lab-registry\n\
         storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
         http:\n  addr: {}\n  secret: podlapse-lab\n",
        yaml_quote(&storage.to_string_lossy()),
        yaml_quote(addr),
    )
}

/// A double-quoted YAML scalar, so paths with `:` or `#` read back verbatim.
fn yaml_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            _ => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Fails, naming the holder when it can be found, if the registry's port is taken.
pub(crate) fn check_port_free() -> Result<(), LabError> {
    let addr: SocketAddr = REGISTRY_ADDR
        .parse()
        .expect("REGISTRY_ADDR is a socket address");
    match TcpListener::bind(addr) {
        Ok(listener) => {
            drop(listener);
            Ok(())
        }
        Err(source) => Err(LabError::PortInUse {
            addr: REGISTRY_ADDR.to_owned(),
            holder: process::tcp_listener_holder(addr.port()),
            source,
        }),
    }
}

/// Writes the config, starts the registry detached and waits until `GET /v2/` answers.
pub(crate) fn start(paths: &LabPaths) -> Result<u32, LabError> {
    let program = process::require_program(PART, PROGRAM)?;
    let dir = paths.registry_dir();
    let storage = paths.registry_storage();
    fs::create_dir_all(&storage).map_err(|e| LabError::io(PART, "create", &storage, e))?;
    let config = paths.registry_config();
    fs::write(&config, config_yaml(&storage, REGISTRY_ADDR))
        .map_err(|e| LabError::io(PART, "write", &config, e))?;
    let log = paths.registry_log();
    let pid = process::spawn_daemon(
        PART,
        &program,
        [std::ffi::OsStr::new("serve"), config.as_os_str()],
        &dir,
        &log,
        &[],
    )?;

    let started = Instant::now();
    let mut last = String::new();
    let poll = Poll::new("the registry", READY_TIMEOUT, Duration::from_millis(50)).since(started);
    let ready = poll.within(|| {
        if !process::is_alive(pid) {
            return Err(LabError::DaemonExited {
                part: PART.to_owned(),
                log_tail: process::log_tail(&log, 15),
                log: log.clone(),
            });
        }
        match http_status(REGISTRY_ADDR, "/v2/") {
            Ok(200) => return Ok(Some(())),
            Ok(code) => last = format!("GET /v2/ answered {code}"),
            Err(e) => last = format!("GET /v2/: {e}"),
        }
        Ok(None)
    })?;
    match ready {
        Some(()) => Ok(pid),
        None => Err(not_ready(last, started, &log)),
    }
}

fn not_ready(what: String, started: Instant, log: &Path) -> LabError {
    LabError::NotReady {
        part: PART.to_owned(),
        what,
        waited: started.elapsed(),
        log: log.to_owned(),
        log_tail: process::log_tail(log, 15),
    }
}

/// The status code of a plain HTTP/1.0 GET; enough to probe the registry without an HTTP
/// client dependency.
pub(crate) fn http_status(addr: &str, path: &str) -> io::Result<u16> {
    let addr: SocketAddr = addr
        .parse()
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut head = [0u8; 64];
    let mut n = 0;
    while n < 12 {
        let got = s.read(&mut head[n..])?;
        if got == 0 {
            break;
        }
        n += got;
    }
    parse_status_line(&head[..n]).ok_or_else(|| io::Error::other("not an HTTP response"))
}

fn parse_status_line(head: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(head).ok()?;
    let mut f = text.split_whitespace();
    f.next().filter(|v| v.starts_with("HTTP/"))?;
    f.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_binds_loopback_and_stores_under_root() {
        let y = config_yaml(
            Path::new("/var/lib/podlapse-lab/registry/data"),
            "127.0.0.1:5000",
        );
        assert!(y.contains("rootdirectory: \"/var/lib/podlapse-lab/registry/data\"\n"));
        assert!(y.contains("  addr: \"127.0.0.1:5000\"\n"));
        assert!(y.starts_with("version: 0.1\n"));
    }

    #[test]
    fn status_line() {
        assert_eq!(parse_status_line(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(parse_status_line(b"HTTP/1.0 401 Unauthorized"), Some(401));
        assert_eq!(parse_status_line(b"SSH-2.0-OpenSSH"), None);
    }
}
