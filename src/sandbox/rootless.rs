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
//!
//! Where the user has subordinate id ranges and the `newuidmap`/`newgidmap` helpers (see
//! `subids`), the namespace maps those ranges too, and each sandbox then gets a uid and gid
//! of its own drawn from them ([`distinct_ids`]), as each gets one as root. Otherwise, or
//! when the helpers fail, the sandboxes share the user's uid: every run records it
//! (`isolation.uid_shared`) and `fork check` says why ([`uids_report`]).

use super::subids;
use std::sync::OnceLock;

/// What [`enter`] did: `Ok` when the supervisor is in its own namespaces (with the
/// subordinate ranges it mapped, or why none), else why not.
static STATE: OnceLock<Result<Ids, String>> = OnceLock::new();

/// The ids fork's own user namespace maps beyond the user's own.
struct Ids {
    /// The subordinate ranges, or why the sandboxes share the user's uid.
    ranges: Result<subids::Ranges, String>,
}

/// Without root, enters a user namespace (the user's uid and gid mapped to themselves) and a
/// mount namespace of this process; as root, does nothing. Once per process; the outcome
/// is kept for [`entered`] and [`why_not`]. Call it before any thread is started.
pub fn enter() {
    if nix::unistd::geteuid().is_root() {
        return;
    }
    STATE.get_or_init(try_enter);
}

fn try_enter() -> Result<Ids, String> {
    use nix::sched::{unshare, CloneFlags};
    if super::probe::apparmor_confines_us() {
        return Err(format!(
            "AppArmor would give fork's own user namespace no capabilities; fix: {}",
            super::probe::APPARMOR_USERNS_FIX
        ));
    }
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    // The helpers are forked first (they must stay outside the namespace), then released.
    let helpers = subids::lookup(uid, gid).and_then(|(r, [newuidmap, newgidmap])| {
        let me = std::process::id().to_string();
        let args = |own: u32, range: subids::Range| {
            [&me, &own.to_string(), &own.to_string(), "1"]
                .into_iter()
                .map(String::from)
                .chain([range.start, range.start, range.count].map(|n| n.to_string()))
                .collect::<Vec<_>>()
        };
        let u = subids::Helper::spawn(&newuidmap, &args(uid, r.uid))?;
        let g = subids::Helper::spawn(&newgidmap, &args(gid, r.gid))?;
        Ok((r, u, g))
    });
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("unshare(CLONE_NEWUSER | CLONE_NEWNS) for the supervisor: {e}"))?;
    // Dropping an unreleased helper closes its pipe: it exits without running.
    let ranges = helpers.and_then(|(r, u, g)| {
        u.release()?;
        g.release()?;
        Ok(r)
    });
    // Without them (or when a helper failed): the user's own ids, whichever map is unset.
    let unset = |file: &str| std::fs::read_to_string(file).is_ok_and(|t| t.trim().is_empty());
    let mut writes = Vec::new();
    if unset("/proc/self/uid_map") {
        writes.push(("/proc/self/uid_map", format!("{uid} {uid} 1")));
    }
    if unset("/proc/self/gid_map") {
        writes.push(("/proc/self/setgroups", "deny".to_string()));
        writes.push(("/proc/self/gid_map", format!("{gid} {gid} 1")));
    }
    for (file, text) in writes {
        std::fs::write(file, &text).map_err(|e| format!("writing {text:?} to {file}: {e}"))?;
    }
    Ok(Ids { ranges })
}

/// A uid and gid of its own for one sandbox, drawn at random from the subordinate ranges
/// fork's namespace maps; `None` when the sandboxes share the user's (as root: `None`).
pub fn distinct_ids() -> Option<(u32, u32)> {
    match STATE.get() {
        Some(Ok(Ids { ranges: Ok(r) })) => Some(r.draw()),
        _ => None,
    }
}

/// Whether each sandbox of this (non-root) process gets a uid of its own.
pub fn distinct_uids() -> bool {
    matches!(STATE.get(), Some(Ok(Ids { ranges: Ok(_) })))
}

/// For `fork check`: whether each sandbox gets a uid of its own, the detail, and the fix
/// when they share one.
pub fn uids_report() -> (bool, String, String) {
    let uid = nix::unistd::geteuid().as_raw();
    if uid == 0 {
        return (
            true,
            "as root each sandbox gets a uid of its own (random per run)".into(),
            String::new(),
        );
    }
    let fix = subids::fix(&subids::user_name(uid));
    match STATE.get() {
        Some(Ok(Ids { ranges: Ok(r) })) => (
            true,
            format!(
                "each sandbox gets a uid and gid of its own from the subordinate ranges {}-{} and {}-{} (newuidmap, newgidmap)",
                r.uid.start,
                u64::from(r.uid.start) + u64::from(r.uid.count) - 1,
                r.gid.start,
                u64::from(r.gid.start) + u64::from(r.gid.count) - 1
            ),
            String::new(),
        ),
        Some(Ok(Ids { ranges: Err(why) })) => (
            false,
            format!("the sandboxes (judge and subject too) share your uid: {why}"),
            fix,
        ),
        Some(Err(why)) => (
            false,
            format!("the sandboxes (judge and subject too) share your uid: {why}"),
            fix,
        ),
        None => (
            false,
            "the sandboxes (judge and subject too) share your uid".into(),
            fix,
        ),
    }
}

/// Whether this process is in a user and mount namespace of its own (see [`enter`]).
pub fn entered() -> bool {
    matches!(STATE.get(), Some(Ok(_)))
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
