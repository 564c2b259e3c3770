//! Rootless: without root, the supervisor first enters a user and a mount namespace of its
//! own, as rootless container engines do, so that it may mount the size-capped tmpfs of
//! each run (the `disk` layer) and keep reading the results from it after the sandbox ends.
//!
//! The user namespace maps the user's own uid and gid to themselves (one id each): fork
//! keeps its identity (files it writes are the user's, `geteuid` is unchanged, so every
//! other path of the code runs as it does for a user), and gains capabilities over its new
//! mount namespace only. Those mounts are not seen on the host (the namespace is less
//! privileged, so nothing propagates back) and go with the supervisor: after a crash,
//! `fork gc` only has directories to remove. The sandbox's own namespaces nest beneath.
//!
//! It must happen while the process has a single thread (unshare(2) refuses a user
//! namespace to a threaded process): [`enter`] is called first thing by the command line.

use std::sync::OnceLock;

/// What [`enter`] did: `Ok` when the supervisor is in its own namespaces, else why not.
static STATE: OnceLock<Result<(), String>> = OnceLock::new();

/// Without root, enters a user namespace (the user's uid and gid mapped to themselves) and a
/// mount namespace of this process; as root, does nothing. Once per process; the outcome
/// is kept for [`entered`] and [`why_not`]. Call it before any thread is started.
pub fn enter() {
    if nix::unistd::geteuid().is_root() {
        return;
    }
    STATE.get_or_init(try_enter);
}

fn try_enter() -> Result<(), String> {
    use nix::sched::{unshare, CloneFlags};
    if super::probe::apparmor_confines_us() {
        return Err(format!(
            "AppArmor would give fork's own user namespace no capabilities; fix: {}",
            super::probe::APPARMOR_USERNS_FIX
        ));
    }
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("unshare(CLONE_NEWUSER | CLONE_NEWNS) for the supervisor: {e}"))?;
    for (file, text) in [
        ("/proc/self/setgroups", "deny".to_string()),
        ("/proc/self/uid_map", format!("{uid} {uid} 1")),
        ("/proc/self/gid_map", format!("{gid} {gid} 1")),
    ] {
        std::fs::write(file, &text).map_err(|e| format!("writing {text:?} to {file}: {e}"))?;
    }
    Ok(())
}

/// Whether this process is in a user and mount namespace of its own (see [`enter`]).
pub fn entered() -> bool {
    matches!(STATE.get(), Some(Ok(())))
}

/// Why [`enter`] could not enter them, when it tried and failed.
pub fn why_not() -> Option<&'static str> {
    match STATE.get() {
        Some(Err(e)) => Some(e.as_str()),
        _ => None,
    }
}

/// The fix when a user's fork has no namespace of its own to mount the capped disk in.
pub const DISK_ROOTLESS_FIX: &str = "allow unprivileged user namespaces (see the `userns` line of `fork check` for the step), or set [layers] disk = \"optional\" in the policy (then /tmp is capped inside the sandbox but the workspace is not)";

/// Why a user's fork cannot mount the capped disk.
pub fn disk_unavailable_reason() -> String {
    format!(
        "capping the workspace needs a tmpfs that fork mounts in a user and mount namespace of its own: {}",
        why_not().unwrap_or("fork did not enter one")
    )
}
