//! Reading the parent's live SQLite database without creating, changing or removing any
//! file next to it.
//!
//! A plain read-only SQLite connection to a WAL-mode database creates `-wal` and `-shm`
//! when they do not exist (and a root process would leave them there, owned by the
//! database's owner). So, for a WAL-mode source, fork first takes a *shared* lock on the
//! database file itself (an open-file-description lock on SQLite's SHARED byte range, from
//! a descriptor opened read-only and without following links). Held for the whole
//! snapshot, it keeps every other process from taking SQLite's EXCLUSIVE lock, which a
//! parent needs to delete `-wal`/`-shm` (its last connection closing) or to leave WAL mode.
//! It never blocks a WAL-mode writer. Then:
//!
//! * **both `-wal` and `-shm` exist**: SQLite opens the source through the URI
//!   `file:PATH?mode=ro&readonly_shm=1`: it uses the existing files read-only and creates
//!   none; with a live parent it reads the parent's wal-index, otherwise it rebuilds one in
//!   its own memory from the `-wal` file (SQLite's `SQLITE_READONLY_CANTINIT` path). Either
//!   way the read is a consistent snapshot. Checkpoint-on-close is off for that connection.
//! * **otherwise** (no live WAL connection can exist: every one holds both files open),
//!   fork copies the database file (and a `-wal` without its `-shm`, which SQLite then
//!   recovers) byte for byte into its own staging directory, and reads that copy with
//!   SQLite. The copy is consistent unless a parent connected meanwhile: it is checked
//!   afterwards (`-wal` absent, or unchanged, and the database file's size and times
//!   unchanged); if the parent connected, the snapshot starts over (then usually through
//!   the first path).
//!
//! A rollback-journal source (delete, truncate, persist, memory) is read by a read-only
//! SQLite connection, which creates no file in these modes; each of its reads runs under
//! fork's own SHARED lock after the header, read through it, said rollback-journal mode
//! (`header.rs`: a connection that finds WAL mode creates `-wal` and `-shm`). A WAL-mode
//! source's header is read again once the lock below is taken: a parent that left WAL mode
//! after fork looked is read as a rollback-journal one.

use super::owner::{open_as, ReadAs};
use nix::fcntl::{FcntlArg, OFlag};
use nix::sys::stat::{fstat, Mode};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// SQLite's lock bytes: PENDING at 1 GiB, then RESERVED, then the 510-byte SHARED range.
use super::header::{SHARED_FIRST, SHARED_SIZE};

/// The parent's database opened read-only, never through a link, with SQLite's SHARED lock
/// held through it (released when dropped).
pub struct ParentDb {
    fd: OwnedFd,
    path: PathBuf,
    /// Who opens the parent's files (see [`ReadAs`]).
    read_as: Option<ReadAs>,
}

/// How the snapshot reads the parent.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// SQLite opens this URI (read-only, existing side files only).
    Uri(String),
    /// The files were copied into fork's staging: SQLite reads this copy.
    Copied(PathBuf),
}

/// The identity and times of a file, to notice a change.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Seen {
    ino: u64,
    size: i64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

fn seen_fd(fd: &OwnedFd) -> std::io::Result<Seen> {
    let st = fstat(fd)?;
    Ok(Seen {
        ino: st.st_ino,
        size: st.st_size,
        mtime: (st.st_mtime, st.st_mtime_nsec),
        ctime: (st.st_ctime, st.st_ctime_nsec),
    })
}

fn seen_path(p: &Path) -> std::io::Result<Option<Seen>> {
    match std::fs::symlink_metadata(p) {
        Ok(m) => Ok(Some(Seen {
            ino: m.ino(),
            size: m.size() as i64,
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// `PATH` with `suffix` appended to its last component.
pub fn side(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

/// A `file:` URI for `path` (percent-encoding all but unreserved bytes and `/`).
pub(super) fn file_uri(path: &Path, query: &str) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::from("file:");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out.push('?');
    out.push_str(query);
    out
}

#[cfg(test)]
thread_local! {
    /// Tests: run once just before fork opens a parent's file to copy its bytes (on the
    /// snapshot's thread), after SQLite has opened and locked it.
    pub(super) static BEFORE_A_PARENT_FILE_OPENS: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::RefCell::new(None) };
}

/// Opens one of the parent's files (its database, its `-wal`) for reading, with no link in
/// any component of `path` (`openat2(RESOLVE_NO_SYMLINKS)`; where `openat2` is refused,
/// [`open_by_walk`]): SQLite's NOFOLLOW refuses links in any component when it opens the
/// database, and a directory swapped for a link between SQLite's open and this one is
/// refused here too, never read through (the runtime's path is canonical).
pub(super) fn open_no_links(path: &Path) -> std::io::Result<File> {
    #[cfg(test)]
    if let Some(hook) = BEFORE_A_PARENT_FILE_OPENS.with(|h| h.borrow_mut().take()) {
        hook();
    }
    let flags = OFlag::O_RDONLY
        | OFlag::O_NOFOLLOW
        | OFlag::O_NONBLOCK
        | OFlag::O_NOCTTY
        | OFlag::O_CLOEXEC;
    let how = nix::fcntl::OpenHow::new()
        .flags(flags)
        .resolve(nix::fcntl::ResolveFlag::RESOLVE_NO_SYMLINKS);
    match nix::fcntl::openat2(nix::fcntl::AT_FDCWD, path, how) {
        Err(e) if crate::fsx::openat2_unavailable(e) => open_by_walk(path),
        r => Ok(File::from(r?)),
    }
}

/// [`open_no_links`] where `openat2` is refused (kernels before 5.6, some container seccomp
/// profiles): each directory of `path` opened beneath the one before it with `O_NOFOLLOW`
/// (a link in any of them is refused, as `openat2` refuses it), then the file beneath the
/// last, with `O_NOFOLLOW`.
fn open_by_walk(path: &Path) -> std::io::Result<File> {
    let flags = OFlag::O_RDONLY
        | OFlag::O_NOFOLLOW
        | OFlag::O_NONBLOCK
        | OFlag::O_NOCTTY
        | OFlag::O_CLOEXEC;
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        ));
    };
    let dir_fd = super::tree::open_dir_no_links(dir).map_err(|e| {
        use crate::fsx::FsxError;
        // The kinds `openat2` would have given (a missing `-wal` is looked for by kind; a
        // link is ELOOP, as `openat2`'s RESOLVE_NO_SYMLINKS says it, which the snapshot's
        // first look names as a link).
        if let FsxError::Symlink { .. } = &e {
            return std::io::Error::from_raw_os_error(libc::ELOOP);
        }
        let kind = match &e {
            FsxError::Missing { .. } => std::io::ErrorKind::NotFound,
            FsxError::Io { source, .. } => source.kind(),
            FsxError::WrongType { .. } => std::io::ErrorKind::NotADirectory,
            _ => std::io::ErrorKind::InvalidInput,
        };
        std::io::Error::new(kind, format!("{}: {e}", path.display()))
    })?;
    Ok(File::from(nix::fcntl::openat(
        &dir_fd,
        name,
        flags,
        Mode::empty(),
    )?))
}

impl ParentDb {
    /// Takes SQLite's SHARED lock on the database `file` at `path` (opened by the snapshot
    /// with no link in any component, as `read_as` says, when it read the header),
    /// retrying while a writer holds EXCLUSIVE, until `deadline`.
    pub fn lock(
        file: File,
        path: &Path,
        deadline: std::time::Instant,
        read_as: Option<ReadAs>,
    ) -> std::io::Result<ParentDb> {
        let fd = OwnedFd::from(file);
        let lock = libc::flock {
            l_type: libc::F_RDLCK as libc::c_short,
            l_whence: libc::SEEK_SET as libc::c_short,
            l_start: SHARED_FIRST,
            l_len: SHARED_SIZE,
            l_pid: 0,
        };
        loop {
            match nix::fcntl::fcntl(&fd, FcntlArg::F_OFD_SETLK(&lock)) {
                Ok(_) => break,
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES)
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(ParentDb {
            fd,
            path: path.to_path_buf(),
            read_as,
        })
    }

    /// Whether the header, read through the locked descriptor, names WAL mode. Leaving WAL
    /// mode takes SQLite's EXCLUSIVE lock, which the SHARED lock held here keeps off, so
    /// the answer holds as long as this lock does.
    pub fn in_wal_mode(&self) -> std::io::Result<bool> {
        Ok(super::header::mode_of(&self.fd)? == super::header::Mode::Wal)
    }

    /// Whether `file` is the file this lock is held on (the same device and inode).
    pub fn is(&self, file: &File) -> std::io::Result<bool> {
        let (ours, theirs) = (fstat(&self.fd)?, fstat(file)?);
        Ok((ours.st_dev, ours.st_ino) == (theirs.st_dev, theirs.st_ino))
    }

    /// Whether the database's path still names the file this lock is held on.
    pub fn at_path(&self) -> std::io::Result<bool> {
        let (ours, theirs) = (fstat(&self.fd)?, std::fs::symlink_metadata(&self.path)?);
        Ok((ours.st_dev, ours.st_ino) == (theirs.dev(), theirs.ino()))
    }

    /// Lets go of the SHARED lock and gives back the descriptor it was held through.
    pub fn release(self) -> std::io::Result<File> {
        super::header::release_shared(&self.fd)?;
        Ok(File::from(self.fd))
    }

    /// How to read the parent now (see the module docs); `scratch` is a fresh path in
    /// fork's own staging for a copy (its `-wal` goes beside it).
    pub fn route(&self, scratch: &Path) -> std::io::Result<Route> {
        let (wal, shm) = (side(&self.path, "-wal"), side(&self.path, "-shm"));
        for _ in 0..100 {
            let wal_before = seen_path(&wal)?;
            if wal_before.is_some() && seen_path(&shm)?.is_some() {
                return Ok(Route::Uri(file_uri(&self.path, "mode=ro&readonly_shm=1")));
            }
            let db_before = seen_fd(&self.fd)?;
            for p in [scratch.to_path_buf(), side(scratch, "-wal")] {
                match std::fs::remove_file(&p) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
            copy_fd(&self.fd, scratch)?;
            if wal_before.is_some() {
                // No link in any component: a state directory swapped since the lock was
                // taken never lends another database's WAL.
                let f = open_as(self.read_as.as_ref(), || open_no_links(&wal)).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("{}: {e}", wal.display()))
                })?;
                let f = OwnedFd::from(f);
                copy_fd(&f, &side(scratch, "-wal"))?;
            }
            if seen_fd(&self.fd)? == db_before && seen_path(&wal)? == wal_before {
                return Ok(Route::Copied(scratch.to_path_buf()));
            }
            // A parent connected during the copy: look again.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Err(std::io::Error::other(
            "the database kept changing while it was copied",
        ))
    }
}

/// Copies what `fd` holds into the new file `to` (0600).
fn copy_fd(fd: &OwnedFd, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut from = File::from(fd.try_clone()?);
    std::io::Seek::seek(&mut from, std::io::SeekFrom::Start(0))?;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    std::io::copy(&mut from, &mut out)?;
    Ok(())
}

/// `<digest>:<hex>` of the state file `rel` beneath the runtime directory `runtime`, read
/// without following any link (a gate's REJECT hashes the live file as it stands), opened
/// as `read_as` says.
pub fn state_digest(
    runtime: &Path,
    rel: &Path,
    digest: super::digest::StateDigest,
    read_as: Option<&ReadAs>,
) -> std::io::Result<String> {
    let f = open_as(read_as, || {
        let root = crate::fsx::open_dir(runtime, true).map_err(std::io::Error::other)?;
        crate::fsx::open_beneath(&root, &rel.to_string_lossy(), u64::MAX).map_err(|e| match e {
            crate::fsx::FsxError::Io { source, .. } => source,
            e => std::io::Error::other(e),
        })
    })?;
    let mut h = digest.hasher();
    std::io::copy(&mut f.bounded(), &mut h)?;
    Ok(h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The walk used where `openat2` is refused refuses what `openat2` refuses: a link in
    /// any directory of the path, or as the file itself; both opens read the same file.
    #[test]
    fn the_walk_refuses_a_link_in_any_component_as_openat2_does() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        std::fs::create_dir_all(real.join("sub")).unwrap();
        std::fs::write(real.join("sub/db"), "parent").unwrap();
        std::os::unix::fs::symlink(&real, tmp.path().join("alias")).unwrap();
        std::os::unix::fs::symlink("db", real.join("sub/dblink")).unwrap();
        for open in [open_by_walk, open_no_links] {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut open(&real.join("sub/db")).unwrap(), &mut s)
                .unwrap();
            assert_eq!(s, "parent");
            for linked in [tmp.path().join("alias/sub/db"), real.join("sub/dblink")] {
                assert!(open(&linked).is_err(), "{} was opened", linked.display());
            }
            // Missing, in a missing directory or not: NotFound, as a `-wal` is looked for.
            for missing in [real.join("sub/db-wal"), real.join("gone/db-wal")] {
                let e = open(&missing).unwrap_err();
                assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{missing:?}: {e}");
            }
        }
    }
}
