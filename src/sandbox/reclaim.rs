//! Tearing down what a sandbox leaves on the host: unmounting and deleting its run
//! directory (shared with `fork gc`), and handing the workspace to the sandbox's uid.

use super::SandboxError;
use crate::ioerr::{IoContext, IoError};
use std::path::{Path, PathBuf};

/// Unmounts anything beneath a run directory and deletes it (shared with `fork gc`).
pub fn reclaim_dir(path: &Path, _id: &str) -> Result<(), SandboxError> {
    use nix::mount::{umount2, MntFlags};
    // Unmount deepest first, as listed in our own mount table.
    let mut points: Vec<PathBuf> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(unescape_mountinfo))
        .filter(|p| p.starts_with(path))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        if let Err(e) = umount2(&p, MntFlags::MNT_DETACH) {
            if e != nix::Error::EINVAL && e != nix::Error::ENOENT {
                return Err(IoError::new("unmount", &p, std::io::Error::from(e)).into());
            }
        }
    }
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        // What a successor left may defeat it (nesting deeper than descriptors or
        // PATH_MAX allow): remove the rest one directory descriptor at a time.
        Err(first) => crate::fork::remove_tree(path).map_err(|e| {
            IoError::new(
                "remove run directory",
                path,
                std::io::Error::other(format!("{first}; then: {e}")),
            )
            .into()
        }),
    }
}

pub(super) fn unescape_mountinfo(s: &str) -> PathBuf {
    // mountinfo escapes space, tab, newline and backslash as \ooo.
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            if let Ok(v) =
                u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 4]).unwrap_or("x"), 8)
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
}

/// Hands the tree under `root` to `uid:gid`, never following a link, relative to each
/// directory's own descriptor (fsx::walk_tree): the successor's nesting cannot make a path
/// too long for the walk.
pub(super) fn chown_tree(root: &Path, uid: u32, gid: u32) -> Result<(), SandboxError> {
    use nix::fcntl::AtFlags;
    use nix::unistd::{fchownat, Gid, Uid};
    let (uid, gid) = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
    std::os::unix::fs::lchown(root, uid.map(|u| u.as_raw()), gid.map(|g| g.as_raw()))
        .ctx("chown", root)?;
    crate::fsx::walk_tree(
        root,
        |dir, name, st| {
            fchownat(dir, name, uid, gid, AtFlags::AT_SYMLINK_NOFOLLOW)?;
            Ok(crate::fsx::is_directory(st))
        },
        |_, _| Ok(()),
    )
    .map_err(|e| IoError::new("chown", root, std::io::Error::other(e.to_string())).into())
}
