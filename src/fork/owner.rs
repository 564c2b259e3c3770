//! What a root-run fork reads of a tree another user owns (a runtime, a `--workspace`):
//! only what that user could read itself. A file its owner cannot read has no business in
//! its tree; it can only be there by root's doing, or linked in from elsewhere (a hard link
//! to a root-only file, where `fs.protected_hardlinks` is 0; or the stale inode a link keeps
//! after the original was replaced), and fork would otherwise copy it into a sandbox that
//! runs the owner's code. Decided by the mode bits as the kernel checks them (owner, then
//! group, then others; ACLs are not read, so a file an ACL alone opens to the owner is
//! refused too, named).

use nix::sys::stat::FileStat;
use nix::unistd::{Gid, Uid};

/// The user whose reading fork holds to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    /// The user's groups (primary and supplementary), as the user database has them; empty
    /// when it has no entry for the uid (then only the owner and others bits count).
    pub gids: Vec<u32>,
}

impl Owner {
    /// The owner of the tree whose root `fstat` gave `root`, when fork runs as root and the
    /// tree is another user's; None otherwise (fork reads as itself, or the tree is root's).
    pub fn of(root: &FileStat) -> Option<Owner> {
        Self::of_as(Uid::effective().as_raw(), root.st_uid)
    }

    /// [`Owner::of`] for a given effective uid (the planner; tests).
    pub fn of_as(euid: u32, owner: u32) -> Option<Owner> {
        if euid != 0 || owner == 0 {
            return None;
        }
        let gids = nix::unistd::User::from_uid(Uid::from_raw(owner))
            .ok()
            .flatten()
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
        Some(Owner { uid: owner, gids })
    }

    /// Whether the owner may read a file of this `fstat`.
    pub fn may_read(&self, st: &FileStat) -> bool {
        self.may_read_file(st.st_uid, st.st_gid, st.st_mode)
    }

    /// Whether the owner may read a file of this owner, group and mode.
    pub fn may_read_file(&self, uid: u32, gid: u32, mode: u32) -> bool {
        if uid == self.uid {
            mode & 0o400 != 0
        } else if self.gids.contains(&gid) {
            mode & 0o040 != 0
        } else {
            mode & 0o004 != 0
        }
    }

    /// Why a file of this `fstat` is refused.
    pub fn refusal(&self, st: &FileStat) -> String {
        self.refusal_of(st.st_uid, st.st_gid, st.st_mode)
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_order_owner_then_group_then_others() {
        let o = Owner {
            uid: 1000,
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

    #[test]
    fn only_a_root_fork_reading_another_users_tree_is_held_to_it() {
        assert_eq!(Owner::of_as(1000, 1001), None);
        assert_eq!(Owner::of_as(0, 0), None);
        let o = Owner::of_as(0, 65534).unwrap();
        assert_eq!(o.uid, 65534);
    }
}
