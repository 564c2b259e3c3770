//! Environment and process probes: variables, signals, fork and memory and disk budgets,
//! orphans, identity, hostname, interfaces, mounts, devices.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use serde_json::{Map, Value};

use crate::args::{errno, num_arg};
use crate::files::sorted_names;
use crate::helpers::wait_exit_code;
use crate::{Outcome, ProbeResult, Usage, MIB};

pub(crate) fn env_probe() -> Outcome {
    let env: Map<String, Value> = std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                Value::from(v.to_string_lossy().into_owned()),
            )
        })
        .collect();
    Outcome::ok(format!("{} variables", env.len())).with("env", env)
}

pub(crate) fn proc1_environ_probe() -> Outcome {
    let read = || -> io::Result<Vec<u8>> {
        let mut buf = Vec::new();
        File::open("/proc/1/environ")?
            .take(64 * 1024)
            .read_to_end(&mut buf)?;
        Ok(buf)
    };
    match read() {
        Ok(buf) => {
            let vars: Vec<String> = buf
                .split(|b| *b == 0)
                .filter(|v| !v.is_empty())
                .map(|v| OsStr::from_bytes(v).to_string_lossy().into_owned())
                .collect();
            Outcome::ok(format!("{} variables in /proc/1/environ", vars.len()))
                .with("environ", vars)
        }
        Err(e) => Outcome::io(&e, "read /proc/1/environ"),
    }
}

pub(crate) fn kill_probe(a: &[String]) -> ProbeResult {
    let pid: libc::pid_t = num_arg(a, 0, "PID", libc::pid_t::MAX)?;
    let sig: libc::c_int = num_arg(a, 1, "SIG", 64)?;
    if pid <= 0 {
        return Err(Usage(format!(
            "PID must be a single process (> 0), not {pid}"
        )));
    }
    if pid == 1 && sig != 0 {
        return Err(Usage(
            "refusing to signal pid 1 (only SIG 0 is allowed)".into(),
        ));
    }
    // SAFETY: kill takes no pointers; the pid is one process chosen by the caller.
    let rc = unsafe { libc::kill(pid, sig) };
    Ok(Outcome::sys(rc.into(), &format!("kill({pid}, {sig})")))
}

pub(crate) fn fork_many_probe(n: u32, secs: u32) -> Outcome {
    let mut pids = Vec::new();
    let mut stopped = None;
    for _ in 0..n {
        // SAFETY: single-threaded program; the child only sleeps and exits.
        match unsafe { libc::fork() } {
            -1 => {
                stopped = Some(errno());
                break;
            }
            0 => {
                // SAFETY: sleep and _exit have no preconditions.
                unsafe {
                    libc::sleep(secs);
                    libc::_exit(0)
                }
            }
            pid => pids.push(pid),
        }
    }
    for pid in &pids {
        let _ = wait_exit_code(*pid);
    }
    let forked = pids.len();
    let detail = format!("forked {forked} of {n} children (each slept {secs} s), all reaped");
    Outcome {
        succeeded: forked == n as usize,
        errno: stopped,
        detail,
        extra: Map::new(),
    }
    .with("forked", forked)
    .with("requested", n)
}

pub(crate) fn alloc_probe(mib: usize) -> Outcome {
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    for _ in 0..mib {
        let mut chunk = Vec::new();
        if chunk.try_reserve_exact(MIB).is_err() {
            return Outcome::failed(
                Some(libc::ENOMEM),
                format!("allocation failed after {} MiB", chunks.len()),
            )
            .with("allocated_mib", chunks.len());
        }
        chunk.resize(MIB, 0x5a); // writes every byte, so every page is touched
        chunks.push(chunk);
    }
    Outcome::ok(format!("allocated and touched {mib} MiB")).with("allocated_mib", chunks.len())
}

pub(crate) fn write_bytes_probe(path: &Path, mib: usize) -> Outcome {
    // Past RLIMIT_FSIZE the kernel sends SIGXFSZ; ignoring it turns that into EFBIG.
    // SAFETY: installs the SIG_IGN disposition, no handler code.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let mut file = match File::create(path) {
        Ok(f) => f,
        Err(e) => return Outcome::io(&e, &format!("create {}", path.display())),
    };
    let chunk = vec![0x5au8; MIB];
    let mut written = 0usize;
    let mut stopped = None;
    'outer: for _ in 0..mib {
        let mut rest = &chunk[..];
        while !rest.is_empty() {
            match file.write(rest) {
                Ok(0) => {
                    stopped = Some(io::Error::from_raw_os_error(libc::ENOSPC));
                    break 'outer;
                }
                Ok(n) => {
                    written += n;
                    rest = &rest[n..];
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    stopped = Some(e);
                    break 'outer;
                }
            }
        }
    }
    if stopped.is_none() {
        stopped = file.sync_all().err();
    }
    let out = match stopped {
        None => Outcome::ok(format!("wrote {written} bytes to {}", path.display())),
        Some(e) => Outcome::io(
            &e,
            &format!("write {} after {written} bytes", path.display()),
        ),
    };
    out.with("bytes_written", written)
}

pub(crate) fn orphans_probe(n: u32, secs: u32) -> Outcome {
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into the live array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Outcome::sys(-1, "pipe");
    }
    let (rd, wr) = (fds[0], fds[1]);
    // SAFETY: single-threaded program; the intermediate child forks sleepers and exits.
    let mid = unsafe { libc::fork() };
    if mid < 0 {
        return Outcome::sys(-1, "fork");
    }
    if mid == 0 {
        // SAFETY: in the intermediate child: only fork, sleep, write and _exit.
        unsafe {
            libc::close(rd);
            for _ in 0..n {
                let pid = libc::fork();
                if pid == 0 {
                    libc::close(wr);
                    libc::sleep(secs);
                    libc::_exit(0);
                }
                if pid < 0 {
                    break;
                }
                libc::write(wr, (&pid as *const libc::pid_t).cast(), 4);
            }
            libc::_exit(0);
        }
    }
    // SAFETY: closes our copy of the write end, so the read below ends.
    unsafe { libc::close(wr) };
    let _ = wait_exit_code(mid);
    let mut bytes = Vec::new();
    // SAFETY: `rd` is the pipe's read end, owned from here on by the File.
    let mut reader = unsafe { <File as std::os::unix::io::FromRawFd>::from_raw_fd(rd) };
    let _ = reader.read_to_end(&mut bytes);
    let pids: Vec<i32> = bytes
        .chunks_exact(4)
        .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let spawned = pids.len();
    Outcome {
        succeeded: spawned == n as usize,
        errno: None,
        detail: format!("{spawned} of {n} orphans sleeping {secs} s, re-parented away"),
        extra: Map::new(),
    }
    .with("pids", pids)
    .with("secs", secs)
}

pub(crate) fn getuid_probe() -> Outcome {
    // SAFETY: these getters have no preconditions.
    let (uid, euid, gid, egid) = unsafe {
        (
            libc::getuid(),
            libc::geteuid(),
            libc::getgid(),
            libc::getegid(),
        )
    };
    let mut status = Map::new();
    let text = fs::read_to_string("/proc/self/status").unwrap_or_default();
    for line in text.lines() {
        if let Some((key, value)) = line.split_once(':') {
            if matches!(
                key,
                "CapInh"
                    | "CapPrm"
                    | "CapEff"
                    | "CapBnd"
                    | "CapAmb"
                    | "NoNewPrivs"
                    | "Seccomp"
                    | "Seccomp_filters"
            ) {
                status.insert(key.to_string(), Value::from(value.trim()));
            }
        }
    }
    Outcome::ok(format!("uid {uid} euid {euid} gid {gid} egid {egid}"))
        .with("uid", uid)
        .with("euid", euid)
        .with("gid", gid)
        .with("egid", egid)
        .with("status", status)
        .with("userns_owner", userns_owner())
}

/// The owner of this process's user namespace, as this namespace sees it (the
/// NS_GET_OWNER_UID ioctl; an owner unmapped here reads as the overflow uid, 65534), or
/// the errno when it cannot be read.
fn userns_owner() -> Value {
    /// `_IO(0xb7, 0x4)`, linux/nsfs.h.
    const NS_GET_OWNER_UID: libc::c_ulong = 0xb704;
    let f = match File::open("/proc/self/ns/user") {
        Ok(f) => f,
        Err(e) => return Value::from(format!("open /proc/self/ns/user: {e}")),
    };
    let mut uid: libc::uid_t = libc::uid_t::MAX;
    // SAFETY: the ioctl writes one uid_t through the pointer to a live local.
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            NS_GET_OWNER_UID as _,
            &mut uid as *mut libc::uid_t,
        )
    };
    if rc != 0 {
        return Value::from(format!("NS_GET_OWNER_UID: errno {}", errno()));
    }
    Value::from(uid)
}

pub(crate) fn hostname_probe() -> Outcome {
    // SAFETY: utsname is plain bytes, so all-zero is a valid value.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: uname fills the live struct.
    if unsafe { libc::uname(&mut u) } != 0 {
        return Outcome::sys(-1, "uname");
    }
    // SAFETY: the kernel NUL-terminates nodename within the array.
    let name = unsafe { std::ffi::CStr::from_ptr(u.nodename.as_ptr()) };
    let name = name.to_string_lossy().into_owned();
    Outcome::ok(format!("hostname {name}")).with("hostname", name)
}

pub(crate) fn ifaces_probe() -> Outcome {
    match nix::ifaddrs::getifaddrs() {
        Ok(addrs) => {
            let mut names: Vec<String> = addrs.map(|a| a.interface_name).collect();
            names.sort();
            names.dedup();
            Outcome::ok(format!("{} interfaces", names.len())).with("ifaces", names)
        }
        Err(e) => Outcome::failed(Some(e as i32), format!("getifaddrs: {e}")),
    }
}

pub(crate) fn mounts_probe() -> Outcome {
    match fs::read_to_string("/proc/self/mountinfo") {
        Ok(text) => {
            // Fields: id parent major:minor root mount-point options ...
            let root_rw = text.lines().any(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                f.len() > 5 && f[4] == "/" && f[5].split(',').any(|o| o == "rw")
            });
            let lines = text.lines().count();
            Outcome::ok(format!("{lines} mounts, / read-write: {root_rw}"))
                .with("lines", lines)
                .with("root_rw", root_rw)
        }
        Err(e) => Outcome::io(&e, "read /proc/self/mountinfo"),
    }
}

pub(crate) fn devices_probe() -> Outcome {
    match sorted_names(Path::new("/dev"), 1024) {
        Ok((names, total)) => Outcome::ok(format!("{total} entries in /dev"))
            .with("count", total)
            .with("devices", names),
        Err(e) => Outcome::io(&e, "list /dev"),
    }
}
