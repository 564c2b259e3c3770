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
}

/// Sets `lo` up (SIOCGIFFLAGS / SIOCSIFFLAGS with IFF_UP) in the current network namespace.
pub fn loopback_up() -> Result<(), NetError> {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    use std::os::fd::AsRawFd;
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
    // SAFETY: ifreq is plain old data; an all-zero value is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo".iter().enumerate() {
        req.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: the socket fd is valid for the call and `req` is a properly initialised ifreq
    // that SIOCGIFFLAGS fills in place.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) };
    if r != 0 {
        return Err(NetError::Loopback {
            step: "SIOCGIFFLAGS",
            source: nix::Error::last(),
        });
    }
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union; we only read and set it.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: as above; SIOCSIFFLAGS reads `req`.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) };
    if r != 0 {
        return Err(NetError::Loopback {
            step: "SIOCSIFFLAGS",
            source: nix::Error::last(),
        });
    }
    Ok(())
}
