//! Tearing down what a sandbox leaves on the host: unmounting and deleting its run
//! directory (shared with `fork gc`), and handing the workspace to the sandbox's uid.

use super::SandboxError;
use crate::ioerr::{IoContext, IoError};
use std::path::{Path, PathBuf};

/// Unmounts anything beneath a run directory and deletes it (shared with `fork gc`).
pub fn reclaim_dir(path: &Path, _id: &str) -> Result<(), SandboxError> {
    unmount_beneath(path)?;
    remove_all(path)
}

/// [`reclaim_dir`] of a run whose cgroups could not be removed: its mounts go (its disk's
/// memory with them) and everything in it but its record ([`crate::rundir::RECORD_FILES`]:
/// the lock, the cgroups it made, its init), which stays for `fork gc` to find the run by
/// and try again.
pub fn reclaim_dir_keeping_record(path: &Path) -> Result<(), SandboxError> {
    unmount_beneath(path)?;
    let entries = match std::fs::read_dir(path) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(IoError::new("list run directory", path, e).into()),
    };
    for e in entries {
        let e = e.ctx("list run directory", path)?;
        if crate::rundir::RECORD_FILES
            .iter()
            .any(|f| e.file_name() == std::ffi::OsStr::new(f))
        {
            continue;
        }
        let p = e.path();
        match e.file_type().ctx("stat", &p)?.is_dir() {
            true => remove_all(&p)?,
            false => std::fs::remove_file(&p).ctx("remove", &p)?,
        }
    }
    Ok(())
}

/// Detaches every mount beneath `path`, deepest first, as listed in our own mount table.
fn unmount_beneath(path: &Path) -> Result<(), SandboxError> {
    use nix::mount::{umount2, MntFlags};
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
    Ok(())
}

/// Deletes the tree at `path` (nothing mounted beneath it any more).
fn remove_all(path: &Path) -> Result<(), SandboxError> {
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

#[cfg(test)]
thread_local! {
    /// Runs once [`chown_tree`] has entered a directory (a test moves it out from under
    /// the walk there).
    static AFTER_ENTERING: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::RefCell::new(None) };
}

/// Hands the tree under `root` (a sandbox's disk) to `uid:gid`. It runs only while nothing
/// runs in the sandbox (before a run: no process of an earlier one is left), and only the
/// supervisor writes the disk then, so the tree holds still: each entry's kind is taken
/// from the directory listing (`d_type`; an `fstatat` where the filesystem gives none) and
/// the walk goes back up by `..` checking only that it came back to the directory it left
/// (one `fstat`; the walk of a tree that may change, `fsx::walk_tree`, checks each entry
/// and each way up more: that cost twice the system calls), failing closed otherwise. It
/// never follows a link (every entry changed with `AT_SYMLINK_NOFOLLOW`, every directory
/// opened `O_NOFOLLOW` beneath its parent) and holds one directory open at a time, so a
/// tree nested deeper than the descriptor limit is walked too.
pub(super) fn chown_tree(root: &Path, uid: u32, gid: u32) -> Result<(), SandboxError> {
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::Mode;
    use nix::unistd::{Gid, Uid};
    let owner = (Uid::from_raw(uid), Gid::from_raw(gid));
    let fail = |op: &'static str, e: nix::Error| -> SandboxError {
        IoError::new(op, root, std::io::Error::from(e)).into()
    };
    std::os::unix::fs::lchown(root, Some(uid), Some(gid)).ctx("chown", root)?;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut cur = openat(nix::fcntl::AT_FDCWD, root, flags, Mode::empty())
        .map_err(|e| fail("open directory", e))?;
    let id = |fd: &std::os::fd::OwnedFd| {
        nix::sys::stat::fstat(fd)
            .map(|st| (st.st_dev, st.st_ino))
            .map_err(|e| fail("stat", e))
    };
    // Per level from the root down: the directory's identity, and its subdirectories
    // still to walk.
    let mut levels = vec![(
        id(&cur)?,
        chown_entries(&cur, owner).map_err(|e| fail("chown", e))?,
    )];
    loop {
        let top = levels
            .last_mut()
            .expect("the root's level is the last to go");
        if let Some(name) = top.1.pop() {
            let dir = openat(&cur, name.as_os_str(), flags, Mode::empty())
                .map_err(|e| fail("open directory", e))?;
            let subdirs = chown_entries(&dir, owner).map_err(|e| fail("chown", e))?;
            levels.push((id(&dir)?, subdirs));
            cur = dir;
            #[cfg(test)]
            if let Some(hook) = AFTER_ENTERING.with(|h| h.borrow_mut().take()) {
                hook();
            }
            continue;
        }
        levels.pop();
        let Some(((dev, ino), _)) = levels.last() else {
            return Ok(());
        };
        cur = openat(&cur, "..", flags, Mode::empty()).map_err(|e| fail("open directory", e))?;
        // Fail closed should the tree move after all: never walk on above the disk.
        if id(&cur)? != (*dev, *ino) {
            return Err(fail("walk", nix::errno::Errno::ESTALE));
        }
    }
}

/// Hands every entry of the directory `dir` to `owner` (never following a link) and
/// returns the names of its subdirectories.
fn chown_entries(
    dir: &std::os::fd::OwnedFd,
    owner: (nix::unistd::Uid, nix::unistd::Gid),
) -> nix::Result<Vec<std::ffi::OsString>> {
    use nix::dir::{Dir, Type};
    use nix::fcntl::{AtFlags, OFlag};
    use nix::sys::stat::{fstatat, Mode, SFlag};
    use std::os::unix::ffi::OsStrExt;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut listing = Dir::openat(dir, ".", flags, Mode::empty())?;
    let mut subdirs = Vec::new();
    for e in listing.iter() {
        let e = e?;
        let name = std::ffi::OsStr::from_bytes(e.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        nix::unistd::fchownat(
            dir,
            name,
            Some(owner.0),
            Some(owner.1),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )?;
        let is_dir = match e.file_type() {
            Some(t) => t == Type::Directory,
            None => {
                let st = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
                st.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFDIR.bits()
            }
        };
        if is_dir {
            subdirs.push(name.to_os_string());
        }
    }
    Ok(subdirs)
}

#[cfg(test)]
mod tests {
    use super::chown_tree;
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// Every entry beneath the root is handed over, at any depth, a link itself and never
    /// what it points to, a directory nobody may read or enter included; nothing outside.
    #[test]
    fn a_disk_is_handed_over_whole_and_nothing_beyond_it() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: chown needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("disk"), dir.path().join("outside"));
        fs::create_dir_all(root.join("a/b/c/d")).unwrap();
        fs::write(root.join("a/b/c/d/deep.txt"), "deep").unwrap();
        fs::write(root.join("top.txt"), "top").unwrap();
        fs::write(&outside, "not ours").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("a/link")).unwrap();
        std::os::unix::fs::symlink(dir.path(), root.join("a/b/dirlink")).unwrap();
        nix::unistd::mkfifo(
            &root.join("a/fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        fs::create_dir(root.join("shut")).unwrap();
        fs::write(root.join("shut/inside.txt"), "x").unwrap();
        fs::set_permissions(root.join("shut"), fs::Permissions::from_mode(0o000)).unwrap();
        let (uid, gid) = (54321, 54322);
        chown_tree(&root, uid, gid).unwrap();
        let mut seen = 0;
        let mut stack = vec![root.clone()];
        while let Some(p) = stack.pop() {
            let m = fs::symlink_metadata(&p).unwrap();
            assert_eq!((m.uid(), m.gid()), (uid, gid), "{}", p.display());
            seen += 1;
            if m.is_dir() {
                stack.extend(fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            }
        }
        assert_eq!(seen, 12, "every entry, the root included");
        let me = nix::unistd::geteuid().as_raw();
        assert_eq!(fs::metadata(&outside).unwrap().uid(), me);
        assert_eq!(fs::symlink_metadata(dir.path()).unwrap().uid(), me);
    }

    /// The tree moved after all (a directory renamed out of the disk while the walk is in
    /// it): going back up by `..` lands elsewhere, and the walk stops there with an error
    /// instead of walking on beside the moved directory, where a directory of the name
    /// the walk would enter next holds a file that is not the disk's.
    #[test]
    fn a_directory_moved_out_from_under_the_walk_stops_it() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: chown needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (root, elsewhere) = (dir.path().join("disk"), dir.path().join("elsewhere"));
        for name in ["a", "b"] {
            fs::create_dir_all(root.join(name)).unwrap();
            fs::write(root.join(name).join("f"), "the disk's").unwrap();
        }
        fs::create_dir(&elsewhere).unwrap();
        let (uid, gid) = (54321, 54322);
        // Once the walk has entered one of them (its file already handed over), that one
        // is moved into `elsewhere`, beside a directory named as the other, not the disk's.
        let (r, e) = (root.clone(), elsewhere.clone());
        super::AFTER_ENTERING.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                let entered = ["a", "b"]
                    .into_iter()
                    .find(|n| fs::metadata(r.join(n).join("f")).unwrap().uid() == uid)
                    .unwrap();
                let other = if entered == "a" { "b" } else { "a" };
                fs::rename(r.join(entered), e.join(entered)).unwrap();
                fs::create_dir(e.join(other)).unwrap();
                fs::write(e.join(other).join("beside.txt"), "not the disk's").unwrap();
            }))
        });
        let err = chown_tree(&root, uid, gid).unwrap_err().to_string();
        assert!(err.contains("walk"), "{err}");
        let me = nix::unistd::geteuid().as_raw();
        for entry in fs::read_dir(&elsewhere).unwrap() {
            let other = entry.unwrap().path();
            if other.join("beside.txt").exists() {
                assert_eq!(fs::metadata(&other).unwrap().uid(), me);
                assert_eq!(fs::metadata(other.join("beside.txt")).unwrap().uid(), me);
            }
        }
    }
}
