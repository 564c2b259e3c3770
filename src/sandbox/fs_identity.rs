//! A thread that opens files as another user would: its filesystem uid and gid and its
//! supplementary groups set to that user's for the length of one call, then given back.
//! Linux keeps all three per thread (fork's other threads keep root's), and while the
//! filesystem uid is not 0 the kernel leaves the thread none of the capabilities that
//! override file permissions (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, ...). So
//! every open the call makes is decided as for that user (mode bits and ACLs alike), by the
//! open itself: there is no check apart from the use to race. A root-run fork opens another
//! user's state stores this way (SQLite opens them by path).

use super::sys::thread_setgroups;
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
    #[error("could not take uid {uid}'s file identity on this thread ({step}: {errno}); it needs CAP_SETUID and CAP_SETGID: run fork as root")]
    Enter {
        uid: u32,
        step: &'static str,
        errno: Errno,
    },
    #[error("could not give the thread back its own file identity after opening files as uid {uid}; what it did is discarded")]
    Restore { uid: u32 },
}

/// The thread's own identity, given back when dropped (also when the call panics).
struct Own {
    uid: Uid,
    gid: Gid,
    groups: Vec<u32>,
    given_back: bool,
}

impl Own {
    /// Gives the thread its own identity back; whether every part of it is back.
    fn give_back(&mut self) -> bool {
        self.given_back = true;
        setfsuid(self.uid);
        setfsgid(self.gid);
        // setfsuid(2) and setfsgid(2) return the previous value, changed or not: asking
        // again tells whether the first call took.
        setfsuid(self.uid) == self.uid
            && setfsgid(self.gid) == self.gid
            && thread_setgroups(&self.groups).is_ok()
    }
}

impl Drop for Own {
    fn drop(&mut self) {
        if !self.given_back {
            self.give_back();
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
        let mut own = Own {
            uid: setfsuid(Uid::from_raw(u32::MAX)),
            gid: setfsgid(Gid::from_raw(u32::MAX)),
            groups,
            given_back: false,
        };
        // From here on `own` gives everything back however this returns.
        thread_setgroups(&self.groups).map_err(|e| enter("setgroups", e))?;
        let (uid, gid) = (Uid::from_raw(self.uid), Gid::from_raw(self.gid));
        setfsgid(gid);
        if setfsgid(gid) != gid {
            return Err(enter("setfsgid", Errno::EPERM));
        }
        setfsuid(uid);
        if setfsuid(uid) != uid {
            return Err(enter("setfsuid", Errno::EPERM));
        }
        let out = f();
        if own.give_back() {
            Ok(out)
        } else {
            Err(FsIdentityError::Restore { uid: self.uid })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{chown, PermissionsExt};

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
                let r = fs::read(&theirs).is_ok();
                done.send(()).unwrap();
                r
            });
            let here = nobody
                .run(|| {
                    go.send(()).unwrap();
                    finished.recv().unwrap();
                    [&root_only, &root_group, &users_group, &public]
                        .map(|p| fs::File::open(p).map_err(|e| e.kind()))
                        .map(|r| r.is_ok())
                })
                .unwrap();
            (other.join().unwrap(), here)
        });
        assert!(other_thread, "another thread opens as root meanwhile");
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
