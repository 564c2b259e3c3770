//! What a root-run fork reads of a tree another user owns (a runtime, a `--workspace`):
//! only what that user could read itself. A file its owner cannot read has no business in
//! its tree; it can only be there by root's doing, or linked in from elsewhere (a hard link
//! to a root-only file, where `fs.protected_hardlinks` is 0; or the stale inode a link keeps
//! after the original was replaced), and fork would otherwise copy it into a sandbox that
//! runs the owner's code. The same holds for directories: fork lists, looks into and opens
//! what is in a directory only if its owner could list and search it (read and search
//! permission, `r-x`), and passes through a directory on the way to a tree only if the
//! owner could search it: a root-only directory in the tree would otherwise hand the
//! sandbox whatever it holds, however readable its files. Decided as the kernel checks an
//! access: by the file's POSIX access ACL when it has one (`acl.rs`: a named user's or
//! group's entry, the mask), else by its mode bits (owner, then group, then others).

use nix::sys::stat::FileStat;
use nix::unistd::{Gid, Uid};

/// The user whose reading fork holds to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    /// The user's primary group; [`NO_GROUP`] when the user database has no entry for
    /// the uid.
    pub gid: u32,
    /// The user's groups (primary and supplementary), as the user database has them; empty
    /// when it has no entry for the uid (then only the owner and others bits count).
    pub gids: Vec<u32>,
}

/// The group of a user the user database does not know: a gid no file should carry
/// (`(gid_t) -2`; -1 means "unchanged" to the kernel), so only the owner and others bits
/// count for it, as for [`Owner::may_read_file`].
pub const NO_GROUP: u32 = u32::MAX - 1;

impl Owner {
    /// The owner of the tree whose root `fstat` gave `root`, when fork runs as root and the
    /// tree is another user's; None otherwise (fork reads as itself, or the tree is root's).
    pub fn of(root: &FileStat) -> Option<Owner> {
        Self::of_as(Uid::effective().as_raw(), root.st_uid)
    }

    /// [`Owner::of`] of the directory open at `dir` (a runtime, a `--workspace`).
    pub fn of_dir(dir: &impl std::os::fd::AsFd) -> nix::Result<Option<Owner>> {
        nix::sys::stat::fstat(dir).map(|st| Self::of(&st))
    }

    /// [`Owner::of`] for a given effective uid (the planner; tests).
    pub fn of_as(euid: u32, owner: u32) -> Option<Owner> {
        if euid != 0 || owner == 0 {
            return None;
        }
        let user = nix::unistd::User::from_uid(Uid::from_raw(owner))
            .ok()
            .flatten();
        let gid = user.as_ref().map_or(NO_GROUP, |u| u.gid.as_raw());
        let gids = user
            .and_then(|u| {
                let name = std::ffi::CString::new(u.name).ok()?;
                nix::unistd::getgrouplist(&name, u.gid)
                    .ok()
                    .or(Some(vec![u.gid]))
            })
            .unwrap_or_default()
            .into_iter()
            .map(Gid::as_raw)
            .collect();
        Some(Owner {
            uid: owner,
            gid,
            gids,
        })
    }

    /// Whether the owner may read a file of this `fstat`.
    pub fn may_read(&self, st: &FileStat) -> bool {
        self.may(st, READ)
    }

    /// Whether the owner may access a file of this `fstat` for `want` (read 4, write 2,
    /// execute or search 1, all of them), by its mode bits.
    pub fn may(&self, st: &FileStat, want: u32) -> bool {
        self.may_access_file(st.st_uid, st.st_gid, st.st_mode, want)
    }

    /// Whether the owner may read a file of this owner, group and mode.
    pub fn may_read_file(&self, uid: u32, gid: u32, mode: u32) -> bool {
        self.may_access_file(uid, gid, mode, READ)
    }

    /// Whether the owner may access a file of this owner, group and mode for every bit of
    /// `want`, as the kernel decides by mode bits: the owner's bits for its owner, the
    /// group's for a member of its group, the others' for anyone else.
    pub fn may_access_file(&self, uid: u32, gid: u32, mode: u32, want: u32) -> bool {
        let bits = if uid == self.uid {
            mode >> 6
        } else if self.gids.contains(&gid) {
            mode >> 3
        } else {
            mode
        };
        bits & want & 0o7 == want & 0o7
    }

    /// Whether the owner may read the file open at `file` (its `fstat`: `st`), as the
    /// kernel decides (`acl_permission_check`): the file's owner by the owner's bits; anyone
    /// else by the file's access ACL when it has one and the group bits (the ACL's mask)
    /// are not all clear, else by the mode bits. Err says why not, for the caller's
    /// refusal. An ACL that cannot be read or is not in the kernel's layout refuses the
    /// file.
    pub fn check_read(&self, file: &std::fs::File, st: &FileStat) -> Result<(), String> {
        self.check(st, What::File, || super::acl::of(file))
    }

    /// Whether the owner may enter the directory open at `dir` (its `fstat`: `st`) as
    /// `access` says, decided as [`Owner::check_read`] decides a read: a root fork lists,
    /// stats and opens what is in another user's directory only where that user could
    /// have (a root-only directory in the tree hides whatever it holds, however readable
    /// its files). Err says why not, naming the fix.
    pub fn check_dir(
        &self,
        dir: std::os::fd::BorrowedFd<'_>,
        st: &FileStat,
        access: DirAccess,
    ) -> Result<(), String> {
        self.check(st, What::Dir(access), || {
            // The ACL is read through a descriptor of its own (xattr reads a `File`).
            match dir.try_clone_to_owned() {
                Ok(fd) => super::acl::of(&std::fs::File::from(fd)),
                Err(e) => {
                    super::acl::Acl::Unreadable(format!("its access ACL could not be read: {e}"))
                }
            }
        })
    }

    /// The kernel's check of `what`'s access for the owner (see [`Owner::check_read`]).
    fn check(
        &self,
        st: &FileStat,
        what: What,
        acl: impl FnOnce() -> super::acl::Acl,
    ) -> Result<(), String> {
        let want = what.bits();
        // The kernel consults the ACL only for someone other than the file's owner, and
        // only while the group bits (the mask) are not all clear.
        let acl = if st.st_uid == self.uid || st.st_mode & 0o070 == 0 {
            super::acl::Acl::None
        } else {
            acl()
        };
        match acl {
            super::acl::Acl::None if self.may(st, want) => Ok(()),
            super::acl::Acl::None => Err(self.refusal_for(st, what)),
            super::acl::Acl::Entries(acl) => {
                // `want` is at most 0o7: the cast keeps it.
                let want = want as u16;
                if super::acl::allows(&acl, want, self.uid, &self.gids, st.st_uid, st.st_gid) {
                    Ok(())
                } else {
                    Err(format!(
                        "{} (by its access ACL, `getfacl` shows it)",
                        self.refusal_for(st, what)
                    ))
                }
            }
            super::acl::Acl::Unreadable(why) => Err(match what {
                What::File => format!(
                    "{why}, and fork, running as root, copies only what the tree's owner \
                     (uid {}) could read itself: remove the ACL (`setfacl -b`) or the file",
                    self.uid
                ),
                What::Dir(_) => format!(
                    "{why}, and fork, running as root, enters only the directories the \
                     tree's owner (uid {}) could enter itself: remove the ACL (`setfacl -b`) \
                     or the directory",
                    self.uid
                ),
            }),
        }
    }

    /// Why a file of this `fstat` is refused.
    pub fn refusal(&self, st: &FileStat) -> String {
        self.refusal_of(st.st_uid, st.st_gid, st.st_mode)
    }

    fn refusal_for(&self, st: &FileStat, what: What) -> String {
        match what {
            What::File => self.refusal(st),
            What::Dir(access) => self.dir_refusal_of(st.st_uid, st.st_gid, st.st_mode, access),
        }
    }

    fn refusal_of(&self, uid: u32, gid: u32, mode: u32) -> String {
        format!(
            "its owner (uid {}) cannot read it (uid {}, gid {}, mode {:04o}), and fork, running \
             as root, copies only what the tree's owner could read itself (a file linked in \
             from elsewhere?): make it readable by uid {}, or remove it",
            self.uid,
            uid,
            gid,
            mode & 0o7777,
            self.uid
        )
    }

    fn dir_refusal_of(&self, uid: u32, gid: u32, mode: u32, access: DirAccess) -> String {
        let (verb, made, acl) = match access {
            DirAccess::List => ("list and search", "readable and searchable", "rx"),
            DirAccess::Search => ("search", "searchable", "x"),
        };
        format!(
            "its owner (uid {owner}) cannot {verb} this directory (uid {uid}, gid {gid}, mode \
             {mode:04o}), and fork, running as root, enters only the directories the tree's \
             owner could enter itself: make it {made} by uid {owner} (`chmod`, or `setfacl -m \
             u:{owner}:{acl}`), or remove it (a runtime's manifest can also `exclude` it)",
            owner = self.uid,
            mode = mode & 0o7777,
        )
    }
}

/// Read permission, in a mode's bits (each class) and an ACL entry's.
const READ: u32 = 0o4;

/// How a directory is entered, and what that takes of its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirAccess {
    /// Its entries listed, looked at and opened: read and search (`r-x`). Listing takes
    /// read, and a directory its owner may search but not list (`--x`) is refused: fork
    /// would list for the owner names the owner could only guess.
    List,
    /// Passed through on the way to the tree (a component of a nested path): search (`--x`).
    Search,
}

/// What [`Owner::check`] checks.
#[derive(Debug, Clone, Copy)]
enum What {
    File,
    Dir(DirAccess),
}

impl What {
    /// The permission bits it takes (rwx, as in one class of a mode).
    fn bits(self) -> u32 {
        match self {
            What::File => READ,
            What::Dir(DirAccess::List) => 0o5,
            What::Dir(DirAccess::Search) => 0o1,
        }
    }
}

/// How a snapshot opens the parent's own files (a state store and its `-wal`, `-shm` and
/// `-journal`): as fork itself (no `ReadAs`), or, for a root-run fork on another user's
/// runtime, as that user. The opens are made with the calling thread's filesystem identity
/// set to the owner's, so the kernel decides each one (mode bits and ACLs) as it opens the
/// file: what SQLite opens by path is held to the owner as fork's own opens are. How the
/// identity is taken is the caller's (`sandbox::fs_identity`), handed in as `enter`.
#[derive(Clone)]
pub struct ReadAs {
    uid: u32,
    enter: std::sync::Arc<Enter>,
}

/// Runs the closure it is given once as the owner, or fails without running it.
type Enter = dyn Fn(&mut dyn FnMut()) -> std::io::Result<()> + Send + Sync;

impl std::fmt::Debug for ReadAs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReadAs(uid {})", self.uid)
    }
}

/// A parent's file its owner may not open.
#[derive(Debug, thiserror::Error)]
#[error(
    "its owner (uid {uid}) may not open it ({source}); fork, running as root, opens another \
     user's state stores as that user, so a file linked in from elsewhere is never read: make \
     it readable by uid {uid} (and the directories above it searchable), or remove it"
)]
pub struct NotTheOwners {
    pub uid: u32,
    pub source: std::io::Error,
}

impl ReadAs {
    /// `enter` runs the closure it is given once, with the calling thread's opens decided
    /// as uid `uid`'s, or fails without running it.
    pub fn new(
        uid: u32,
        enter: impl Fn(&mut dyn FnMut()) -> std::io::Result<()> + Send + Sync + 'static,
    ) -> ReadAs {
        ReadAs {
            uid,
            enter: std::sync::Arc::new(enter),
        }
    }

    /// Runs `f` as the owner; an error only when the identity could not be taken or given
    /// back (then what `f` did is discarded).
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> std::io::Result<T> {
        let mut f = Some(f);
        let mut out = None;
        (self.enter)(&mut || {
            if let Some(f) = f.take() {
                out = Some(f());
            }
        })?;
        out.ok_or_else(|| std::io::Error::other("the owner's identity was never taken"))
    }
}

/// `open` made as `read_as` says (as fork itself without one); the owner's refusal is
/// [`NotTheOwners`].
pub fn open_as<T>(
    read_as: Option<&ReadAs>,
    open: impl FnOnce() -> std::io::Result<T>,
) -> std::io::Result<T> {
    let Some(r) = read_as else {
        return open();
    };
    match r.run(open)? {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            NotTheOwners {
                uid: r.uid,
                source: e,
            },
        )),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_order_owner_then_group_then_others() {
        let o = Owner {
            uid: 1000,
            gid: 1000,
            gids: vec![1000, 27],
        };
        assert!(o.may_read_file(1000, 1000, 0o600));
        assert!(
            !o.may_read_file(1000, 1000, 0o044),
            "owner bits decide for the owner"
        );
        assert!(o.may_read_file(0, 27, 0o640));
        assert!(
            !o.may_read_file(0, 27, 0o604),
            "group bits decide for a member"
        );
        assert!(o.may_read_file(0, 0, 0o644));
        assert!(!o.may_read_file(0, 0, 0o600), "a root-only file");
        assert!(o.refusal_of(0, 0, 0o600).contains("uid 1000"));
    }

    /// A directory is listed with read and search (r-x) and passed through with search:
    /// each bit counts, by the same class the kernel picks.
    #[test]
    fn a_directory_takes_every_bit_wanted_of_one_class() {
        let o = Owner {
            uid: 1000,
            gid: 1000,
            gids: vec![1000, 27],
        };
        assert!(o.may_access_file(1000, 1000, 0o700, 0o5));
        assert!(!o.may_access_file(1000, 1000, 0o300, 0o5), "owner: no read");
        assert!(
            !o.may_access_file(1000, 1000, 0o600, 0o5),
            "owner: no search"
        );
        assert!(o.may_access_file(0, 27, 0o750, 0o5));
        assert!(
            !o.may_access_file(0, 27, 0o715, 0o5),
            "the group's bits, not the others'"
        );
        assert!(
            o.may_access_file(0, 0, 0o711, 0o1),
            "search only: passed through"
        );
        assert!(
            !o.may_access_file(0, 0, 0o711, 0o5),
            "search only: not listed"
        );
        assert!(
            !o.may_access_file(0, 0, 0o744, 0o5),
            "list only: not entered"
        );
        let why = o.dir_refusal_of(0, 0, 0o711, DirAccess::List);
        assert!(
            why.contains("list and search") && why.contains("u:1000:rx"),
            "{why}"
        );
    }

    #[test]
    fn only_a_root_fork_reading_another_users_tree_is_held_to_it() {
        assert_eq!(Owner::of_as(1000, 1001), None);
        assert_eq!(Owner::of_as(0, 0), None);
        let o = Owner::of_as(0, 65534).unwrap();
        assert_eq!(o.uid, 65534);
    }
}
