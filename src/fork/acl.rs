//! A file's POSIX access ACL (acl(5)) as the kernel stores it, in the extended attribute
//! `system.posix_acl_access`, and the kernel's check of read access against it: what a
//! root-run fork holds another user's tree to ([`super::owner::Owner`]), where a file's
//! mode bits alone would say otherwise (a named user's or group's entry opening it, or a
//! mask closing it).

use std::fs::File;
use xattr::FileExt;

/// The extended attribute that holds a file's access ACL.
const ACCESS: &str = "system.posix_acl_access";
/// `POSIX_ACL_XATTR_VERSION`: the only layout the kernel writes.
const VERSION: u32 = 2;

const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
/// Read and search (execute) permission, in an entry's bits (tests; the callers of
/// [`allows`] say what they want in a mode's bits, which an entry's share).
#[cfg(test)]
const READ: u16 = 0x04;
#[cfg(test)]
const SEARCH: u16 = 0x01;

/// One entry: its tag, its permission bits (read 4, write 2, execute 1) and its
/// qualifier (a uid for `USER`, a gid for `GROUP`; unused by the others).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub tag: u16,
    pub perm: u16,
    pub id: u32,
}

/// What a file's access ACL is.
#[derive(Debug, PartialEq, Eq)]
pub enum Acl {
    /// None: the mode bits decide (so does a filesystem without extended attributes).
    None,
    /// Its entries.
    Entries(Vec<Entry>),
    /// Present but not in the kernel's layout (or unreadable): nothing may be read by it.
    Unreadable(String),
}

/// The access ACL of the file open at `file`.
pub fn of(file: &File) -> Acl {
    match file.get_xattr(ACCESS) {
        Ok(None) => Acl::None,
        Ok(Some(bytes)) => parse(&bytes).map_or_else(
            || {
                Acl::Unreadable(format!(
                    "an access ACL of {} bytes not in the kernel's layout",
                    bytes.len()
                ))
            },
            Acl::Entries,
        ),
        // A filesystem that keeps no extended attributes keeps no ACL either.
        Err(e) if e.raw_os_error() == Some(nix::errno::Errno::EOPNOTSUPP as i32) => Acl::None,
        Err(e) => Acl::Unreadable(format!("its access ACL could not be read: {e}")),
    }
}

/// The entries of an ACL in the kernel's layout: a little-endian version (2), then
/// entries of 8 bytes (tag and permissions, 16 bits each; qualifier, 32 bits).
pub fn parse(bytes: &[u8]) -> Option<Vec<Entry>> {
    let (version, rest) = bytes.split_first_chunk::<4>()?;
    if u32::from_le_bytes(*version) != VERSION || rest.len() % 8 != 0 {
        return None;
    }
    Some(
        rest.chunks_exact(8)
            .map(|e| Entry {
                tag: u16::from_le_bytes([e[0], e[1]]),
                perm: u16::from_le_bytes([e[2], e[3]]),
                id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            })
            .collect(),
    )
}

/// The bytes of `entries` in the kernel's layout (tests set ACLs with it).
#[cfg(test)]
pub fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut out = VERSION.to_le_bytes().to_vec();
    for e in entries {
        out.extend(e.tag.to_le_bytes());
        out.extend(e.perm.to_le_bytes());
        out.extend(e.id.to_le_bytes());
    }
    out
}

/// Whether a user (`uid`, its groups `gids`) may access a file owned by `file_uid` and
/// `file_gid` whose access ACL is `acl`, for every permission bit of `want` (read 4,
/// write 2, execute or search 1): acl(5)'s access check algorithm, as the kernel runs it
/// (`posix_acl_permission`). The owner gets the owner's entry; a named user its entry
/// under the mask; a member of the file's group or of a named group is granted when one
/// of those entries grants all of `want` under the mask, and denied otherwise (the others'
/// entry is not consulted); anyone else gets the others' entry. An entry that should be
/// there and is not denies. (The kernel consults the ACL only for someone other than the
/// file's owner, and only while the group bits, the mask, are not all clear:
/// [`super::owner::Owner::check_read`].)
pub fn allows(
    acl: &[Entry],
    want: u16,
    uid: u32,
    gids: &[u32],
    file_uid: u32,
    file_gid: u32,
) -> bool {
    let find = |tag: u16| acl.iter().find(|e| e.tag == tag);
    let mask = find(MASK).map_or(u16::MAX, |e| e.perm);
    let grants = |perm: u16| perm & want == want;
    if uid == file_uid {
        return find(USER_OBJ).is_some_and(|e| grants(e.perm));
    }
    if let Some(e) = acl.iter().find(|e| e.tag == USER && e.id == uid) {
        return grants(e.perm & mask);
    }
    let groups: Vec<&Entry> = acl
        .iter()
        .filter(|e| {
            (e.tag == GROUP_OBJ && gids.contains(&file_gid))
                || (e.tag == GROUP && gids.contains(&e.id))
        })
        .collect();
    if !groups.is_empty() {
        return groups.iter().any(|e| grants(e.perm & mask));
    }
    find(OTHER).is_some_and(|e| grants(e.perm))
}

/// Builders of entries, for tests.
#[cfg(test)]
pub mod entry {
    use super::*;
    pub fn user_obj(perm: u16) -> Entry {
        Entry {
            tag: USER_OBJ,
            perm,
            id: u32::MAX,
        }
    }
    pub fn user(id: u32, perm: u16) -> Entry {
        Entry {
            tag: USER,
            perm,
            id,
        }
    }
    pub fn group_obj(perm: u16) -> Entry {
        Entry {
            tag: GROUP_OBJ,
            perm,
            id: u32::MAX,
        }
    }
    pub fn group(id: u32, perm: u16) -> Entry {
        Entry {
            tag: GROUP,
            perm,
            id,
        }
    }
    pub fn mask(perm: u16) -> Entry {
        Entry {
            tag: MASK,
            perm,
            id: u32::MAX,
        }
    }
    pub fn other(perm: u16) -> Entry {
        Entry {
            tag: OTHER,
            perm,
            id: u32::MAX,
        }
    }
}

/// Sets `entries` as the access ACL of the file at `path` (tests): false, saying so as a
/// skipped test, where the filesystem keeps no ACLs; any other failure panics.
#[cfg(test)]
pub fn set_or_skip(path: &std::path::Path, entries: &[Entry]) -> bool {
    match File::open(path)
        .unwrap()
        .set_xattr(ACCESS, &encode(entries))
    {
        Ok(()) => true,
        Err(e) if e.raw_os_error() == Some(nix::errno::Errno::EOPNOTSUPP as i32) => {
            eprintln!("fork-test-skip: the temp dir's filesystem keeps no ACLs ({e})");
            false
        }
        Err(e) => panic!("setting an ACL on {}: {e}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::entry::*;
    use super::*;

    /// acl(5)'s algorithm, case by case, for uid 1000 in groups 1000 and 27.
    #[test]
    fn read_access_follows_the_acl_check_algorithm() {
        let me = |acl: &[Entry], file_uid, file_gid| {
            allows(acl, READ, 1000, &[1000, 27], file_uid, file_gid)
        };
        // The owner: its own entry, whatever the others say.
        assert!(me(&[user_obj(4), group_obj(0), other(0)], 1000, 0));
        assert!(!me(&[user_obj(0), user(1000, 4), other(4)], 1000, 0));
        // A named user: its entry, under the mask.
        let named = [user_obj(6), user(1000, 4), group_obj(0), mask(4), other(0)];
        assert!(
            me(&named, 0, 0),
            "a root-only file opened to uid 1000 by name"
        );
        let masked = [user_obj(6), user(1000, 4), group_obj(0), mask(0), other(4)];
        assert!(
            !me(&masked, 0, 0),
            "the mask closes a named entry; others do not apply"
        );
        let closed = [user_obj(6), user(1000, 0), group_obj(4), mask(4), other(4)];
        assert!(
            !me(&closed, 0, 0),
            "a named entry without read closes what others open"
        );
        // Groups: the file's group or a named one, under the mask; matched and none grants:
        // denied, the others' entry not consulted.
        assert!(me(
            &[user_obj(6), group_obj(0), group(27, 4), mask(4), other(0)],
            0,
            0
        ));
        assert!(me(&[user_obj(6), group_obj(4), mask(4), other(0)], 0, 1000));
        assert!(!me(
            &[user_obj(6), group_obj(4), mask(0), other(4)],
            0,
            1000
        ));
        assert!(!me(
            &[user_obj(6), group_obj(0), group(27, 0), mask(4), other(4)],
            0,
            0
        ));
        // Anyone else: the others' entry (not masked).
        assert!(me(&[user_obj(6), group_obj(0), mask(0), other(4)], 0, 0));
        assert!(!me(&[user_obj(6), group_obj(4), other(0)], 0, 0));
        // An entry that should be there and is not: denied.
        assert!(!me(&[group_obj(4)], 1000, 0));
        assert!(!me(&[user_obj(4)], 0, 0));
    }

    /// A directory listed wants read and search (r-x): every bit, under the mask, from
    /// the one entry the algorithm picks.
    #[test]
    fn several_bits_are_all_wanted() {
        let rx = READ | SEARCH;
        let me = |acl: &[Entry], file_uid, file_gid| {
            allows(acl, rx, 1000, &[1000, 27], file_uid, file_gid)
        };
        assert!(me(
            &[user_obj(7), user(1000, 5), group_obj(0), mask(5), other(0)],
            0,
            0
        ));
        assert!(!me(
            &[user_obj(7), user(1000, 1), group_obj(0), mask(5), other(5)],
            0,
            0
        ));
        assert!(!me(
            &[user_obj(7), user(1000, 5), group_obj(0), mask(4), other(5)],
            0,
            0
        ));
        assert!(!me(
            &[user_obj(7), user(1000, 4), group_obj(0), mask(5), other(5)],
            0,
            0
        ));
        // Groups: one entry granting both (not one each).
        assert!(me(
            &[user_obj(7), group_obj(5), group(27, 0), mask(5), other(0)],
            0,
            1000
        ));
        assert!(!me(
            &[user_obj(7), group_obj(4), group(27, 1), mask(7), other(5)],
            0,
            1000
        ));
        assert!(me(&[user_obj(7), group_obj(0), mask(0), other(5)], 0, 0));
        assert!(!me(&[user_obj(1), user(1000, 7), other(7)], 1000, 0));
    }

    #[test]
    fn the_kernels_layout_is_read_and_written() {
        let acl = [user_obj(6), user(1000, 4), group_obj(4), mask(4), other(0)];
        let bytes = encode(&acl);
        assert_eq!(bytes.len(), 4 + 8 * acl.len());
        assert_eq!(&bytes[..4], &[2, 0, 0, 0]);
        assert_eq!(parse(&bytes).unwrap(), acl);
        assert_eq!(parse(&bytes[..bytes.len() - 1]), None, "a cut entry");
        assert_eq!(parse(&[1, 0, 0, 0]), None, "another version");
        assert_eq!(parse(&[2, 0]), None, "no version");
    }
}
