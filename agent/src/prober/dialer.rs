//! kubelet's ProbeDialer: every probe connection (TCP, HTTP, gRPC) sets SO_LINGER to one
//! second, so a node that probes thousands of containers does not pile up sockets in
//! TIME-WAIT for the kernel's default minute. One second rather than zero, because a zero
//! linger aborts the connection with a reset instead of closing it with a FIN, and the
//! probed server would log every probe as a broken connection.

use std::io;
use std::time::Duration;

use tokio::net::{TcpSocket, TcpStream};

/// The linger kubelet's probe dialer sets.
pub const PROBE_LINGER: Duration = Duration::from_secs(1);

/// Connects to `addr` (`host:port`, resolved as Go's dialer would, each address tried in
/// turn) with the probe dialer's socket options.
pub async fn dial(addr: &str) -> io::Result<TcpStream> {
    let mut last = None;
    for sa in tokio::net::lookup_host(addr).await? {
        let socket = if sa.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        // Closing a lingering socket can block until its unsent data is acknowledged, at
        // most PROBE_LINGER. A probe has read its answer before it closes, so nothing is
        // left unacknowledged and the close returns at once, as in kubelet.
        socket2::SockRef::from(&socket).set_linger(Some(PROBE_LINGER))?;
        match socket.connect(sa).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, format!("no address for {addr}"))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn probe_connections_linger_one_second() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let stream = dial(&addr).await.unwrap();
        assert_eq!(stream.linger().unwrap(), Some(PROBE_LINGER));
        let refused = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        assert_eq!(
            dial(&refused).await.unwrap_err().kind(),
            io::ErrorKind::ConnectionRefused
        );
    }
}
