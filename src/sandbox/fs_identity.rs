//! A thread that opens files as another user would: its filesystem uid and gid and its
//! supplementary groups set to that user's for the length of one call, then given back.
//! Linux keeps all three per thread (fork's other threads keep root's). While the
//! filesystem uid is not 0 the kernel takes from the thread's effective set the
//! capabilities that override file permissions; where it keeps them (the securebit
//! `SECURE_NO_SETUID_FIXUP`), they are dropped here for the call and raised again after it.
//! So every open the call makes is decided as for that user (mode bits and ACLs alike), by
//! the open itself: there is no check apart from the use to race. A root-run fork opens
//! another user's state stores this way (SQLite opens them by path).

use super::sys::thread_setgroups;
use caps::{CapSet, Capability};
use nix::errno::Errno;
use nix::unistd::{getgroups, setfsgid, setfsuid, Gid, Uid};

/// Who a thread opens files as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsIdentity {
    pub uid: u32,
    /// The filesystem gid (the user's primary group).
    pub gid: u32,
    /// The supplementary groups (the user's groups, primary included, or none).
    pub groups: Vec<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum FsIdentityError {
    #[error("could not take uid {uid}'s file identity on this thread ({step}: {errno}): it needs CAP_SETUID and CAP_SETGID, and the owner's uid and gid mapped in fork's user namespace; run fork as the runtime's owner instead")]
    Enter {
        uid: u32,
        step: &'static str,
        errno: Errno,
    },
}

/// The capabilities the kernel takes from a thread whose filesystem uid leaves 0 (those
/// that override file permissions, capabilities(7)): none may stay effective while the
/// thread opens files as another user.
const FILE_CAPS: [Capability; 8] = [
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_DAC_READ_SEARCH,
    Capability::CAP_FOWNER,
    Capability::CAP_FSETID,
    Capability::CAP_LINUX_IMMUTABLE,
    Capability::CAP_MAC_OVERRIDE,
    Capability::CAP_MKNOD,
];

/// The thread's own identity, given back when dropped (also when the call panics or an
/// early step fails).
struct Own {
    uid: Uid,
    gid: Gid,
    /// The thread's own groups, once they have been replaced (before that there is
    /// nothing to give back, and setgroups(2) may be refused: fork without CAP_SETGID).
    groups: Option<Vec<u32>>,
    /// File capabilities dropped here (the kernel kept them): raised again.
    dropped: Vec<Capability>,
}

impl Drop for Own {
    /// Every part changed is given back, each whatever became of the others (the
    /// filesystem uid and gid can always return to the real ones, root's). A thread that
    /// cannot be given its own identity back would go on creating files as another user,
    /// with no one to tell: the process stops there (it cannot happen while fork keeps
    /// CAP_SETGID, which replacing the groups took).
    fn drop(&mut self) {
        setfsuid(self.uid);
        setfsgid(self.gid);
        // setfsuid(2) and setfsgid(2) return the previous value, changed or not: asking
        // again tells whether the first call took.
        let uid_back = setfsuid(self.uid) == self.uid;
        let gid_back = setfsgid(self.gid) == self.gid;
        let groups_back = self
            .groups
            .as_ref()
            .is_none_or(|g| thread_setgroups(g).is_ok());
        let caps_back = self
            .dropped
            .iter()
            .all(|c| caps::raise(None, CapSet::Effective, *c).is_ok());
        if !(uid_back && gid_back && groups_back && caps_back) {
            tracing::error!(
                "a thread could not be given back its own file identity (uid {uid_back}, gid \
                 {gid_back}, groups {groups_back}, capabilities {caps_back}): stopping"
            );
            std::process::abort();
        }
    }
}

impl FsIdentity {
    /// Runs `f` with the calling thread's file identity set to this one, then gives the
    /// thread its own back. Nothing runs when the identity cannot be taken.
    pub fn run<R>(&self, f: impl FnOnce() -> R) -> Result<R, FsIdentityError> {
        let enter = |step, errno| FsIdentityError::Enter {
            uid: self.uid,
            step,
            errno,
        };
        let groups = getgroups()
            .map_err(|e| enter("getgroups", e))?
            .into_iter()
            .map(Gid::as_raw)
            .collect();
        // setfsuid(-1) and setfsgid(-1) change nothing and return the current values.
        let mut own = Own {
            uid: setfsuid(Uid::from_raw(u32::MAX)),
            gid: setfsgid(Gid::from_raw(u32::MAX)),
            groups: None,
            dropped: Vec::new(),
        };
        // From here on `own` gives back whatever was changed, however this returns.
        thread_setgroups(&self.groups).map_err(|e| enter("setgroups", e))?;
        own.groups = Some(groups);
        let (uid, gid) = (Uid::from_raw(self.uid), Gid::from_raw(self.gid));
        setfsgid(gid);
        if setfsgid(gid) != gid {
            return Err(enter("setfsgid", Errno::EPERM));
        }
        setfsuid(uid);
        if setfsuid(uid) != uid {
            return Err(enter("setfsuid", Errno::EPERM));
        }
        // One read of the effective set (the kernel has usually taken them already); a
        // second only after dropping what it kept.
        let effective = || {
            caps::read(None, CapSet::Effective)
                .map_err(|_| enter("read the capabilities", Errno::EPERM))
        };
        let mut eff = effective()?;
        let kept: Vec<Capability> = FILE_CAPS.into_iter().filter(|c| eff.contains(c)).collect();
        if !kept.is_empty() {
            for c in &kept {
                eff.remove(c);
            }
            own.dropped = kept;
            caps::set(None, CapSet::Effective, &eff)
                .map_err(|_| enter("drop the file capabilities", Errno::EPERM))?;
            let after = effective()?;
            if FILE_CAPS.iter().any(|c| after.contains(c)) {
                return Err(enter("drop the file capabilities", Errno::EPERM));
            }
        }
        let out = f();
        drop(own);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{chown, PermissionsExt};

    /// Without CAP_SETGID (a thread that dropped it from its effective set) the identity
    /// cannot be taken: an error naming the fix, nothing run, the thread's own identity
    /// untouched, and no abort (there was nothing to give back).
    #[test]
    fn an_identity_fork_cannot_take_is_an_error() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        std::thread::spawn(|| {
            caps::drop(None, CapSet::Effective, Capability::CAP_SETGID).unwrap();
            let id = nobody();
            let mut ran = false;
            let e = id.run(|| ran = true).unwrap_err();
            assert!(!ran);
            assert!(
                matches!(
                    e,
                    FsIdentityError::Enter {
                        step: "setgroups",
                        ..
                    }
                ),
                "{e}"
            );
            assert!(e.to_string().contains("CAP_SETGID"), "{e}");
            assert_eq!(setfsuid(Uid::from_raw(u32::MAX)), Uid::from_raw(0));
        })
        .join()
        .unwrap();
    }

    /// Where the kernel keeps the file capabilities across the filesystem uid's change
    /// (the securebit SECURE_NO_SETUID_FIXUP, set here on a thread of its own), they are
    /// dropped for the call: a root-only file is refused inside, and they are back after.
    #[test]
    fn file_capabilities_the_kernel_keeps_are_dropped_for_the_call() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let root_only = file(dir.path(), "root-only", 0, 0o600);
        std::thread::spawn(move || {
            // SECBIT_NO_SETUID_FIXUP (1 << 2), for this thread only.
            crate::sandbox::sys::set_securebits(1 << 2).unwrap();
            let id = nobody();
            let inside = id.run(|| fs::File::open(&root_only).is_ok()).unwrap();
            assert!(
                !inside,
                "refused inside although the kernel kept the capabilities"
            );
            assert!(
                caps::has_cap(None, CapSet::Effective, Capability::CAP_DAC_OVERRIDE).unwrap(),
                "raised again after"
            );
            assert!(fs::File::open(&root_only).is_ok());
        })
        .join()
        .unwrap();
    }

    /// `nobody`, in its own group only.
    fn nobody() -> FsIdentity {
        FsIdentity {
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
        }
    }

    /// The calling thread's supplementary groups, as the kernel lists them.
    fn groups_line() -> String {
        fs::read_to_string("/proc/thread-self/status")
            .unwrap()
            .lines()
            .find(|l| l.starts_with("Groups:"))
            .unwrap()
            .to_string()
    }

    fn file(dir: &std::path::Path, name: &str, gid: u32, mode: u32) -> std::path::PathBuf {
        let p = dir.join(name);
        fs::write(&p, name).unwrap();
        chown(&p, Some(0), Some(gid)).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    /// As root: opens made inside `run` are the user's (root's own groups lend nothing),
    /// only on the calling thread, and root's come back after it.
    #[test]
    fn opens_inside_are_the_users_and_only_the_calling_threads() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        // Under /tmp, which any user may search.
        let dir = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let root_only = file(dir.path(), "root-only", 0, 0o600);
        let root_group = file(dir.path(), "root-group", 0, 0o640);
        let users_group = file(dir.path(), "users-group", 4242, 0o640);
        let public = file(dir.path(), "public", 0, 0o644);
        let nobody = FsIdentity {
            uid: 65534,
            gid: 65534,
            groups: vec![65534, 4242],
        };
        let (other_thread, here) = std::thread::scope(|s| {
            let (go, wait) = std::sync::mpsc::channel::<()>();
            let (done, finished) = std::sync::mpsc::channel::<()>();
            let theirs = root_only.clone();
            let other = s.spawn(move || {
                wait.recv().unwrap();
                let r = (fs::read(&theirs).is_ok(), groups_line());
                done.send(()).unwrap();
                r
            });
            let here = nobody
                .run(|| {
                    assert!(groups_line().contains("4242"), "the user's groups inside");
                    go.send(()).unwrap();
                    finished.recv().unwrap();
                    [&root_only, &root_group, &users_group, &public]
                        .map(|p| fs::File::open(p).map_err(|e| e.kind()))
                        .map(|r| r.is_ok())
                })
                .unwrap();
            (other.join().unwrap(), here)
        });
        let own_groups = groups_line();
        assert!(other_thread.0, "another thread opens as root meanwhile");
        assert_eq!(
            other_thread.1, own_groups,
            "another thread keeps its groups meanwhile"
        );
        assert!(!own_groups.contains("4242"), "{own_groups}");
        assert!(
            caps::has_cap(None, CapSet::Effective, Capability::CAP_DAC_OVERRIDE).unwrap(),
            "the thread's file capabilities are back"
        );
        assert_eq!(
            here,
            [false, false, true, true],
            "the owner's bits, then the group's for a group of the user's only, then others'"
        );
        assert!(
            fs::read(dir.path().join("root-only")).is_ok(),
            "root's identity is back"
        );
        let panicked = std::panic::catch_unwind(|| nobody.run(|| panic!("in the call")));
        assert!(panicked.is_err());
        assert!(
            fs::read(dir.path().join("root-only")).is_ok(),
            "given back after a panic too"
        );
    }
}
