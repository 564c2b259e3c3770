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
