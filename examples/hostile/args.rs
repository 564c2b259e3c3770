//! The probes' arguments: paths, capped numbers, loopback addresses; C strings, errno.

use std::ffi::CString;
use std::io;
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::Usage;

pub(crate) fn path_arg(a: &[String], i: usize, name: &str) -> Result<PathBuf, Usage> {
    a.get(i)
        .map(PathBuf::from)
        .ok_or_else(|| Usage(format!("missing {name}")))
}

/// A number in 0..=max; larger values are refused rather than silently clamped.
pub(crate) fn num_arg<T>(a: &[String], i: usize, name: &str, max: T) -> Result<T, Usage>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display,
{
    let raw = a.get(i).ok_or_else(|| Usage(format!("missing {name}")))?;
    let n: T = raw
        .parse()
        .map_err(|_| Usage(format!("{name} must be a number, not `{raw}`")))?;
    if n > max {
        return Err(Usage(format!("{name} is capped at {max}, got {raw}")));
    }
    Ok(n)
}

/// HOST:PORT with a literal loopback address; anything else is refused.
pub(crate) fn loopback_arg(a: &[String], i: usize) -> Result<SocketAddr, Usage> {
    let raw = a.get(i).ok_or_else(|| Usage("missing HOST:PORT".into()))?;
    let raw = raw.replace("localhost:", "127.0.0.1:");
    let addr: SocketAddr = raw
        .parse()
        .map_err(|_| Usage(format!("`{raw}` is not an IP:PORT address")))?;
    if !addr.ip().is_loopback() {
        return Err(Usage(format!("refusing non-loopback address {addr}")));
    }
    Ok(addr)
}

pub(crate) fn cstr(p: &Path) -> CString {
    // A path from argv or read_dir cannot hold a NUL byte; map one to an invalid path.
    CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

pub(crate) fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
