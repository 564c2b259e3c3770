//! Namespace work around the clone: the init entering its cgroup namespace and naming its
//! host, the supervisor writing the init's uid/gid maps and joining its network namespace
//! from a helper thread. The namespaces themselves are created by the clone (see
//! `sys::clone_init`).

use super::SandboxError;
use crate::ioerr::IoContext;
use nix::sched::CloneFlags;
use std::path::PathBuf;

/// In the init (already moved into the sandbox cgroup): a cgroup namespace rooted there,
/// so the command sees its own cgroup as `/`.
pub fn enter_cgroupns() -> Result<(), String> {
    nix::sched::unshare(CloneFlags::CLONE_NEWCGROUP)
        .map_err(|e| format!("unshare(CLONE_NEWCGROUP): {e}"))
}

/// In the init: the host name of its UTS namespace.
pub fn set_hostname(name: &str) -> Result<(), String> {
    nix::unistd::sethostname(name).map_err(|e| format!("sethostname: {e}"))
}

/// In the supervisor: maps uid and gid 0 of the init's user namespace to `uid` and `gid`
/// on the host. An unprivileged writer (`deny_setgroups`) may only map its gid once
/// setgroups is denied.
pub fn write_id_maps(
    pid: i32,
    uid: u32,
    gid: u32,
    deny_setgroups: bool,
) -> Result<(), SandboxError> {
    if deny_setgroups {
        write_proc(pid, "setgroups", "deny")?;
    }
    write_proc(pid, "uid_map", &format!("0 {uid} 1\n"))?;
    write_proc(pid, "gid_map", &format!("0 {gid} 1\n"))
}

fn write_proc(pid: i32, file: &str, content: &str) -> Result<(), SandboxError> {
    let path = PathBuf::from(format!("/proc/{pid}/{file}"));
    Ok(std::fs::write(&path, content).ctx("write", &path)?)
}

/// Moves the calling thread (only it: setns affects one thread) into the network
/// namespace of process `pid`. On failure: the step that failed and why.
pub fn join_netns_of(pid: i32) -> Result<(), (&'static str, String)> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .map_err(|e| ("open the sandbox's network namespace", e.to_string()))?;
    nix::sched::setns(&ns, CloneFlags::CLONE_NEWNET)
        .map_err(|e| ("setns into the sandbox's network namespace", e.to_string()))
}

/// In the supervisor (as root): runs `f` (the clone of the init) with the calling thread in
/// a private copy of its mount namespace in which every mount at or beneath a `detach`
/// path (only beneath, for the run root), and every mount inside a fork run directory (any run root's: other fork
/// processes' runs too), is detached, then returns the thread to its own namespace and working directory.
/// The init's mount namespace, copied from that one, never holds those mounts (mounts it
/// inherits are locked: it could not detach them itself). The host is never affected: the
/// copy is made private before anything is detached.
pub fn with_private_mounts<R>(detach: &[PathBuf], f: impl FnOnce() -> R) -> Result<R, String> {
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    let own = std::fs::File::open("/proc/thread-self/ns/mnt")
        .map_err(|e| format!("open this thread's mount namespace: {e}"))?;
    let cwd = nix::fcntl::open(
        ".",
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| format!("open the working directory: {e}"))?;
    nix::sched::unshare(CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("unshare(CLONE_NEWNS) in the supervising thread: {e}"))?;
    let inner = (|| -> Result<(), String> {
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .map_err(|e| format!("make the private mount namespace private: {e}"))?;
        let table = std::fs::read_to_string("/proc/thread-self/mountinfo")
            .map_err(|e| format!("read the mount table: {e}"))?;
        let run_root = crate::rundir::base_dir();
        let mut points: Vec<PathBuf> = table
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(super::reclaim::unescape_mountinfo))
            .filter(|p| {
                // At or beneath, except the run root itself: a run root that is itself a
                // mount (a tmpfs, say) holds the sandbox's root directory and stays. (A
                // cgroup2 mount at /sys/fs/cgroup goes: on v2 it is the path itself.)
                detach
                    .iter()
                    .any(|d| p.starts_with(d) && (p != d || *d != run_root))
                    || p.components()
                        .any(|c| crate::rundir::is_run_dir_name(&c.as_os_str().to_string_lossy()))
            })
            .collect();
        points.sort_by_key(|p| p.components().count());
        points.dedup();
        for p in points {
            // Detaching a mount takes those beneath it: later ones may be gone already.
            match umount2(&p, MntFlags::MNT_DETACH) {
                Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => {}
                Err(e) => return Err(format!("detach {}: {e}", p.display())),
            }
        }
        Ok(())
    })();
    let r = inner.map(|()| f());
    // Back to the supervisor's own namespace, whatever happened (setns also moves the
    // thread's root and working directory to that namespace's root: restore the latter).
    nix::sched::setns(&own, CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("return to the supervisor's mount namespace: {e}"))?;
    nix::unistd::fchdir(&cwd).map_err(|e| format!("return to the working directory: {e}"))?;
    r
}
