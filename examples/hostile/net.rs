//! Network probes (loopback only): TCP connect and bind, a UDP send.

use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

use crate::{Outcome, MARK};

pub(crate) fn connect_tcp_probe(addr: SocketAddr) -> Outcome {
    Outcome::from_result(
        TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .map(|_| format!("connected to {addr}")),
        &format!("connect {addr}"),
    )
}

pub(crate) fn bind_tcp_probe(port: u16) -> Outcome {
    match TcpListener::bind(("127.0.0.1", port)) {
        Ok(l) => {
            let local = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
            Outcome::ok(format!("listening on {local}")).with("addr", local)
        }
        Err(e) => Outcome::io(&e, &format!("bind 127.0.0.1:{port}")),
    }
}

pub(crate) fn udp_send_probe(addr: SocketAddr) -> Outcome {
    let local: SocketAddr = if addr.is_ipv4() {
        ([127, 0, 0, 1], 0).into()
    } else {
        (std::net::Ipv6Addr::LOCALHOST, 0).into()
    };
    let sent = UdpSocket::bind(local).and_then(|s| s.send_to(MARK, addr));
    match sent {
        Ok(n) => Outcome::ok(format!("sent {n} bytes to {addr}")).with("bytes", n),
        Err(e) => Outcome::io(&e, &format!("send to {addr}")),
    }
}
