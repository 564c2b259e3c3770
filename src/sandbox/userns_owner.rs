//! The owner of the sandbox's user namespace: the run's own uid, not root.
//!
//! The kernel charges what a user namespace's processes hold of its per-user counts
//! (inotify instances and watches, fanotify groups and marks, namespaces, queued signals,
//! POSIX message queue bytes, processes) to every level of the chain of user namespaces,
//! and the level above the sandbox's is its namespace's owner in the host's namespace: the
//! effective uid of the thread that cloned it. When fork's root supervisor cloned the init,
//! that was host root, whose counts every root daemon shares, so sandboxes running at once
//! took from root's 128 inotify instances (16 each under [`super::userns_limits`]).
//!
//! As root, the thread that clones the init now takes the run's uid (a random one of its
//! own, `1000000000 +` 28 bits, which no one else holds) as its effective uid for the length
//! of the clone, its capabilities kept: the namespace is owned by that uid, and what the
//! sandbox holds is charged to it and never to root. The real and saved uids stay 0, and
//! every part changed is given back before anything else runs on the thread; a thread
//! that cannot be given root back would go on as another uid, so the process stops there.
//! The owner of a namespace holds every capability in it from the parent namespace; no
//! process but this thread for this moment ever runs with that uid there (the sandbox's
//! own processes run inside the namespace, where the rule does not apply to it).

use caps::{CapSet, CapsHashSet};

use super::sys::thread_seteuid;

/// One switch at a time in the process: the dumpable flag a switch changes is the
/// process's, so two at once would each save what the other set.
static SWITCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What the thread had before: given back when dropped (also when the call panics).
struct Own {
    effective: CapsHashSet,
    dumpable: bool,
}

impl Drop for Own {
    fn drop(&mut self) {
        // Back to euid 0 (the real uid is 0, so this cannot be refused while the thread
        // holds what it held); the kernel then copies the permitted set to the effective
        // one: narrow it again to what it was.
        let back = thread_seteuid(0).is_ok()
            && nix::unistd::geteuid().is_root()
            && caps::set(None, CapSet::Effective, &self.effective).is_ok();
        if !back {
            eprintln!(
                "fork: internal error: the cloning thread could not take root back after making the sandbox's user namespace; stopping"
            );
            std::process::abort();
        }
        // Any change of effective uid makes the process undumpable (suid_dumpable).
        let _ = nix::sys::prctl::set_dumpable(self.dumpable);
    }
}

/// Runs `clone` (the init's clone with `CLONE_NEWUSER`) with this thread's effective uid set
/// to `owner`, the rest of its credentials kept, so the user namespace the clone creates
/// is owned by `owner`. Only for a root supervisor (the real uid must be 0).
pub(super) fn owned_by<R>(owner: u32, clone: impl FnOnce() -> R) -> Result<R, String> {
    let _one = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let effective = caps::read(None, CapSet::Effective)
        .map_err(|e| format!("read this thread's effective capabilities: {e}"))?;
    let permitted = caps::read(None, CapSet::Permitted)
        .map_err(|e| format!("read this thread's permitted capabilities: {e}"))?;
    let dumpable =
        nix::sys::prctl::get_dumpable().map_err(|e| format!("prctl(PR_GET_DUMPABLE): {e}"))?;
    thread_seteuid(owner)
        .map_err(|e| format!("setresuid(-1, {owner}, -1) on the cloning thread: {e}"))?;
    let _own = Own {
        effective: effective.clone(),
        dumpable,
    };
    // Leaving euid 0 took every capability from the effective set (the permitted one is
    // kept while the real uid is 0): the clone needs them again (CLONE_INTO_CGROUP's
    // permission on the cgroup, a host that lets only CAP_SYS_ADMIN make user namespaces).
    caps::set(
        None,
        CapSet::Effective,
        &effective.intersection(&permitted).copied().collect(),
    )
    .map_err(|e| format!("raise the cloning thread's capabilities again: {e}"))?;
    Ok(clone())
}
