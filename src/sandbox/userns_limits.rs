//! The limits of the sandbox's own user namespace on what the kernel counts per user
//! (`/proc/sys/user/max_*`: inotify instances and watches, fanotify groups and marks,
//! namespaces of each kind), written by the init right after it mounts the sandbox's
//! `/proc`, before `/proc/sys` is made read-only and before anything of the command runs.
//!
//! Why: the kernel charges what a user namespace's processes use of these counts to every
//! level of the chain of user namespaces, each level checked against its own namespace's
//! limit: the sandbox's level, then its owner's. As root the owner is the run's own uid
//! (see [`super::userns_owner`]; it was host root, whose counts every root daemon shares),
//! without root the user; a fresh user namespace's own limits are 2^31 - 1, so without
//! these a successor could take all of its owner's inotify instances (128 by default) for
//! its whole wall budget. Lowered here (the namespace's root may: it holds
//! CAP_SYS_RESOURCE there, and the kernel looks the files up in the writer's own user
//! namespace, whichever procfs they are on), the sandbox's level stops the sandbox at
//! these numbers, so it takes at most that many of root's. The command holds no capability
//! and sees `/proc/sys` read-only, so it cannot raise them again.
//!
//! These are fixed, not budgets a policy sets, like the per-process limits of
//! [`super::rlimits`]. They are per sandbox: without root, sandboxes running at once take
//! that much each of the user's.

use std::path::Path;

/// Inotify instances the sandbox may hold at once (root's default is 128). One per
/// watching program is usual (a test runner's file watcher, an event loop).
pub const INOTIFY_INSTANCES: u64 = 16;
/// Inotify watches the sandbox may hold at once (root's default is in the hundreds of
/// thousands on this project's machines: about 4% of the memory divided by a watch's size).
pub const INOTIFY_WATCHES: u64 = 8192;
/// Namespaces of each kind the sandbox may hold, its own included (the default seccomp
/// profile refuses creating any; this bound holds under any profile).
pub const NAMESPACES: u64 = 16;

/// Each limit: its file under `/proc/sys/user`, and the value written there.
pub const LIMITS: [(&str, u64); 12] = [
    ("max_inotify_instances", INOTIFY_INSTANCES),
    ("max_inotify_watches", INOTIFY_WATCHES),
    ("max_fanotify_groups", INOTIFY_INSTANCES),
    ("max_fanotify_marks", INOTIFY_WATCHES),
    ("max_user_namespaces", NAMESPACES),
    ("max_pid_namespaces", NAMESPACES),
    ("max_uts_namespaces", NAMESPACES),
    ("max_ipc_namespaces", NAMESPACES),
    ("max_net_namespaces", NAMESPACES),
    ("max_mnt_namespaces", NAMESPACES),
    ("max_cgroup_namespaces", NAMESPACES),
    ("max_time_namespaces", NAMESPACES),
];

/// What to do when the limits cannot be set (the user namespace layer's fix).
pub const FIX: &str = "let the sandbox's init (root of its own user namespace) write /proc/sys/user/max_* in that namespace: a security module denying sysctl writes there must allow them";

/// In the init, root of the sandbox's user namespace: writes every limit of [`LIMITS`]
/// that the kernel has under `/proc/sys/user` of the procfs at `proc` (a file the kernel
/// lacks is skipped: it counts nothing then). Each file is opened relative to that
/// directory and written once: the kernel refuses (EINVAL) a value outside a limit's range,
/// so a write that succeeded is in force (the tests read them from inside). Refuses to
/// write anything from the host's own user namespace, whose limits these files would be.
/// On failure: the file and why.
pub fn apply(proc: &Path) -> Result<(), String> {
    use nix::errno::Errno;
    use nix::fcntl::{open, openat, OFlag};
    use nix::sys::stat::Mode;
    let map = proc.join("self/uid_map");
    let uid_map =
        std::fs::read_to_string(&map).map_err(|e| format!("reading {}: {e}", map.display()))?;
    if is_initial_uid_map(&uid_map) {
        return Err("refusing to lower the limits of the host's own user namespace".into());
    }
    let sys_user = proc.join("sys/user");
    let dir = open(
        &sys_user,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::ENOENT => format!(
            "{} is missing (a kernel without per-user-namespace limits)",
            sys_user.display()
        ),
        e => format!("opening {}: {e}", sys_user.display()),
    })?;
    for (name, value) in LIMITS {
        let shown = || sys_user.join(name).display().to_string();
        let f = match openat(
            &dir,
            name,
            OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(f) => f,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(format!("opening {}: {e}", shown())),
        };
        let text = format!("{value}\n");
        match nix::unistd::write(&f, text.as_bytes()) {
            Ok(n) if n == text.len() => {}
            Ok(n) => return Err(format!("writing {value} to {}: {n} bytes written", shown())),
            Err(e) => return Err(format!("writing {value} to {}: {e}", shown())),
        }
    }
    Ok(())
}

/// Whether a `uid_map` is the initial user namespace's: all 2^32 - 1 ids mapped to
/// themselves.
fn is_initial_uid_map(uid_map: &str) -> bool {
    let fields: Vec<&str> = uid_map.split_whitespace().collect();
    fields == ["0", "0", "4294967295"]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_own_namespace_is_recognised() {
        assert!(is_initial_uid_map("         0          0 4294967295\n"));
        assert!(!is_initial_uid_map("         0     123456          1\n"));
        assert!(!is_initial_uid_map("         0          0          1\n"));
        // This test process runs in the host's namespace: nothing is written there.
        if std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|m| is_initial_uid_map(&m)) {
            let before = std::fs::read_to_string("/proc/sys/user/max_inotify_instances");
            assert!(apply(Path::new("/proc")).is_err());
            assert_eq!(
                std::fs::read_to_string("/proc/sys/user/max_inotify_instances").ok(),
                before.ok()
            );
        }
    }
}
