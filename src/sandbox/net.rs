//! The network layer: the sandbox has its own network namespace, in which only the
//! loopback interface exists; the init brings it up. Nothing is routed to the host, so
//! host loopback services are unreachable unless a policy forwards one in explicitly.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum NetError {
    #[error("bringing up the loopback interface ({step}): {source}")]
    Loopback {
        step: &'static str,
        source: nix::Error,
    },
    #[error("opening a door into the sandbox ({step}): {detail}")]
    Door { step: &'static str, detail: String },
}

/// Sets `lo` up (SIOCGIFFLAGS / SIOCSIFFLAGS with IFF_UP) in the current network namespace.
pub fn loopback_up() -> Result<(), NetError> {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    use std::os::fd::AsFd;
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|source| NetError::Loopback {
        step: "socket",
        source,
    })?;
    let flags =
        super::sys::interface_flags(sock.as_fd(), "lo").map_err(|source| NetError::Loopback {
            step: "SIOCGIFFLAGS",
            source,
        })?;
    let up = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    super::sys::set_interface_flags(sock.as_fd(), "lo", up).map_err(|source| {
        NetError::Loopback {
            step: "SIOCSIFFLAGS",
            source,
        }
    })?;
    Ok(())
}

/// Creates TCP listeners on `addrs` (loopback addresses) inside the network namespace of
/// process `pid` (the sandbox init), for the supervisor to accept on: the successor's
/// only doors. A short-lived thread enters the namespace (setns affects only the calling
/// thread), brings loopback up there, binds, and leaves; the sockets stay in the sandbox's
/// namespace. Needs CAP_SYS_ADMIN over that namespace (fork runs as root).
pub fn listeners_in_netns(
    pid: i32,
    addrs: &[std::net::SocketAddr],
) -> Result<Vec<std::net::TcpListener>, NetError> {
    if addrs.is_empty() {
        return Ok(Vec::new());
    }
    let addrs = addrs.to_vec();
    let handle = std::thread::spawn(move || -> Result<Vec<std::net::TcpListener>, NetError> {
        super::namespaces::join_netns_of(pid)
            .map_err(|(step, detail)| NetError::Door { step, detail })?;
        loopback_up()?;
        let mut out = Vec::new();
        for a in &addrs {
            let l = std::net::TcpListener::bind(a).map_err(|e| NetError::Door {
                step: "bind a door inside the sandbox",
                detail: format!("{a}: {e}"),
            })?;
            l.set_nonblocking(true).map_err(|e| NetError::Door {
                step: "set a door non-blocking",
                detail: e.to_string(),
            })?;
            out.push(l);
        }
        Ok(out)
    });
    handle.join().map_err(|_| NetError::Door {
        step: "the door thread",
        detail: "panicked".into(),
    })?
}

/// Most connections one forward relays at once; more are refused (closed at once).
pub const MAX_FORWARD_CONNECTIONS: usize = 256;

/// Relays every connection accepted on `listener` (inside the sandbox) to `target` on the
/// host's loopback. Runs on the supervisor's current-thread runtime (a `LocalSet`) until
/// the listener is dropped.
pub async fn relay(listener: tokio::net::TcpListener, target: std::net::SocketAddr) {
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_FORWARD_CONNECTIONS));
    loop {
        let (mut inbound, _) = match listener.accept().await {
            Ok(c) => c,
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        tokio::task::spawn_local(async move {
            let _permit = permit;
            if let Ok(mut out) = tokio::net::TcpStream::connect(target).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
            }
        });
    }
}
