//! Network probes (loopback only): TCP connect and bind, a UDP send, MPTCP bind and
//! connect.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::io::{AsRawFd, FromRawFd, OwnedFd};
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

/// IPPROTO_MPTCP: Multipath TCP, a protocol of its own to the kernel (and to Landlock,
/// whose TCP rules cover only IPPROTO_TCP).
const IPPROTO_MPTCP: libc::c_int = 262;

/// An MPTCP stream socket of `addr`'s family, with 2 s send and receive timeouts (which also
/// bound a connect).
fn mptcp_socket(addr: &SocketAddr) -> Result<OwnedFd, io::Error> {
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: no pointers.
    let fd = unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            IPPROTO_MPTCP,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor socket just returned, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let tv = libc::timeval {
        tv_sec: 2,
        tv_usec: 0,
    };
    for opt in [libc::SO_SNDTIMEO, libc::SO_RCVTIMEO] {
        // SAFETY: the kernel reads a live timeval of the size given.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
    }
    Ok(fd)
}

/// `addr` as a sockaddr the kernel reads, with its length.
fn sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all zeroes is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than, and aligned for, sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: 0,
            };
            // SAFETY: sockaddr_storage is larger than, and aligned for, sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// `socket(AF_INET, SOCK_SEQPACKET, 0)`: protocol 0 takes the first protocol registered for
/// the type, SCTP where its module is loaded (whose bind and connect Landlock's TCP rules do
/// not see). Without SCTP the kernel answers EPROTONOSUPPORT or ESOCKTNOSUPPORT itself.
pub(crate) fn seqpacket_probe() -> Outcome {
    // SAFETY: no pointers.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Outcome::io(
            &io::Error::last_os_error(),
            "socket(AF_INET, SOCK_SEQPACKET, 0)",
        );
    }
    // SAFETY: a descriptor socket just returned, owned by nothing else.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    Outcome::ok("an inet SOCK_SEQPACKET socket was made".to_string())
}

/// bind (and listen) or connect an MPTCP socket: what Landlock's TCP rules refuse for TCP.
pub(crate) fn mptcp_probe(addr: SocketAddr, connect: bool) -> Outcome {
    let what = if connect { "connect" } else { "bind" };
    let fd = match mptcp_socket(&addr) {
        Ok(fd) => fd,
        Err(e) => return Outcome::io(&e, "socket(IPPROTO_MPTCP)"),
    };
    let (ss, len) = sockaddr(&addr);
    let sa = (&ss as *const libc::sockaddr_storage).cast::<libc::sockaddr>();
    // SAFETY: the kernel reads `len` bytes of a live sockaddr_storage.
    let rc = unsafe {
        if connect {
            libc::connect(fd.as_raw_fd(), sa, len)
        } else {
            libc::bind(fd.as_raw_fd(), sa, len)
        }
    };
    if rc < 0 {
        return Outcome::io(&io::Error::last_os_error(), &format!("MPTCP {what} {addr}"));
    }
    if connect {
        // SAFETY: sends MARK from a live buffer on the probe's own connected socket.
        let _ = unsafe { libc::send(fd.as_raw_fd(), MARK.as_ptr().cast(), MARK.len(), 0) };
        return Outcome::ok(format!("MPTCP connected to {addr}"));
    }
    // SAFETY: no pointers.
    if unsafe { libc::listen(fd.as_raw_fd(), 1) } < 0 {
        return Outcome::io(&io::Error::last_os_error(), &format!("MPTCP listen {addr}"));
    }
    Outcome::ok(format!("MPTCP listening on {addr}"))
}
