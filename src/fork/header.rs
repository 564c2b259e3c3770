//! The parent's journal mode, read from its database header through a descriptor that
//! holds SQLite's SHARED lock (an open-file-description lock, as `parent.rs` takes it).
//!
//! Why it is read under a lock, and again before each of SQLite's reads on the rollback
//! path: SQLite decides at the start of every read transaction, from bytes 18 and 19 of
//! page 1, whether the database is in WAL mode, and a connection that finds WAL mode opens
//! the `-wal` and the `-shm` read-write, creating them when they are missing, however the
//! connection was opened (`sqlite3WalOpen` asks for `SQLITE_OPEN_CREATE` whatever the
//! connection's flags; the `readonly_shm` URI parameter spares the `-shm` only, and
//! `immutable`, which spares both, also drops every lock: wrong for a live database; no
//! pragma or file control stops it, short of a VFS of one's own). A parent may turn its
//! database to WAL whenever no one holds a lock on it, so fork's look at the header before
//! the snapshot says nothing of the mode SQLite will find.
//!
//! So on the rollback path every call that makes SQLite read the parent runs under
//! [`RollbackGuard::read`]: fork takes SQLite's SHARED lock itself, the way SQLite takes it
//! (the PENDING byte first, so that a writer waiting for EXCLUSIVE is not kept waiting by
//! a new reader), reads the header through that descriptor, refuses if it does not say
//! rollback-journal mode, and only then lets SQLite read. Turning a database to WAL writes
//! the header under SQLite's EXCLUSIVE lock, which fork's SHARED lock keeps off until
//! SQLite's read holds a SHARED lock of its own; fork's is let go as soon as the call
//! returns (the lock SQLite's read transaction holds stays SQLite's), so a committing
//! writer waits no longer than it would for SQLite's read alone, plus one read of the
//! header.

use super::error::{io_err, SnapshotError, SQLITE_MAGIC};
use nix::errno::Errno;
use nix::fcntl::FcntlArg;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// SQLite's PENDING lock byte (at 1 GiB); RESERVED follows it, then the SHARED range.
const PENDING_BYTE: i64 = 0x4000_0000;
/// The first byte of SQLite's SHARED range, and its length.
pub(super) const SHARED_FIRST: i64 = PENDING_BYTE + 2;
pub(super) const SHARED_SIZE: i64 = 510;

/// The journal mode a database header names (bytes 18 and 19: the file format's write and
/// read versions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// An empty file: an empty database to SQLite, in rollback-journal mode.
    Empty,
    /// Both bytes 1.
    Rollback,
    /// Both bytes 2.
    Wal,
    /// Any other pair (SQLite reads a database whose byte 19 is 2 in WAL mode).
    Other([u8; 2]),
    /// Shorter than a header, or without SQLite's magic.
    NotSqlite,
}

/// The mode the header of the file open at `fd` names (one `pread` of its 100 bytes).
pub(super) fn mode_of(fd: impl AsFd) -> io::Result<Mode> {
    let mut header = [0u8; 100];
    let mut n = 0;
    while n < header.len() {
        match nix::sys::uio::pread(fd.as_fd(), &mut header[n..], n as i64) {
            Ok(0) => break,
            Ok(got) => n += got,
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(if n == 0 {
        Mode::Empty
    } else if n < header.len() || &header[..16] != SQLITE_MAGIC {
        Mode::NotSqlite
    } else {
        match [header[18], header[19]] {
            [1, 1] => Mode::Rollback,
            [2, 2] => Mode::Wal,
            other => Mode::Other(other),
        }
    })
}

/// An open-file-description lock (or unlock, `F_UNLCK`) of `len` bytes from `start`,
/// without waiting.
fn ofd_lock(fd: impl AsFd, kind: libc::c_int, start: i64, len: i64) -> nix::Result<()> {
    let lock = libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: len,
        l_pid: 0,
    };
    nix::fcntl::fcntl(fd, FcntlArg::F_OFD_SETLK(&lock)).map(drop)
}

/// Takes SQLite's SHARED lock on the file open at `fd` as SQLite takes it: a read lock on
/// the PENDING byte first (a writer waiting for EXCLUSIVE holds it, and then no new reader
/// may come in ahead of it), then the SHARED range, then the PENDING byte let go. False,
/// with no lock held: a writer holds EXCLUSIVE or waits for it.
fn try_shared(fd: &File) -> io::Result<bool> {
    let busy = |e: Errno| matches!(e, Errno::EAGAIN | Errno::EACCES);
    match ofd_lock(fd, libc::F_RDLCK, PENDING_BYTE, 1) {
        Ok(()) => {}
        Err(e) if busy(e) => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    let shared = ofd_lock(fd, libc::F_RDLCK, SHARED_FIRST, SHARED_SIZE);
    let pending = ofd_lock(fd, libc::F_UNLCK, PENDING_BYTE, 1);
    match (shared, pending) {
        (Ok(()), Ok(())) => Ok(true),
        (Err(e), Ok(())) if busy(e) => Ok(false),
        (Err(e), _) | (Ok(()), Err(e)) => {
            // Nothing of this lock is kept on a failure (PENDING through the SHARED range).
            let _ = ofd_lock(fd, libc::F_UNLCK, PENDING_BYTE, SHARED_SIZE + 2);
            Err(e.into())
        }
    }
}

/// Lets go of the SHARED lock [`try_shared`] took through `fd` (an open-file-description
/// lock: the process's own POSIX locks on the file, SQLite's, are not touched).
pub(super) fn release_shared(fd: impl AsFd) -> io::Result<()> {
    ofd_lock(fd, libc::F_UNLCK, SHARED_FIRST, SHARED_SIZE).map_err(io::Error::from)
}

/// The rollback-journal parent's database file, opened by fork before SQLite opens it and
/// kept open until SQLite's connection is closed (closing any descriptor of a file drops
/// every POSIX lock the process holds on it, SQLite's included): see the module docs.
pub(super) struct RollbackGuard {
    file: File,
    path: PathBuf,
}

impl RollbackGuard {
    pub fn new(file: File, path: &Path) -> RollbackGuard {
        RollbackGuard {
            file,
            path: path.to_path_buf(),
        }
    }

    /// The guarded file (the copy of a rollback-journal database reads its bytes).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Once SQLite has opened the database by its path: that path still names the file
    /// fork opened, so the header fork reads is the one SQLite reads. (A parent does not
    /// replace its database file under a live connection; if it did, refuse.)
    pub fn check_same_file(&self) -> Result<(), SnapshotError> {
        let ours = self.file.metadata().map_err(io_err("stat", &self.path))?;
        let at_path = std::fs::symlink_metadata(&self.path).map_err(io_err("stat", &self.path))?;
        if (ours.dev(), ours.ino()) == (at_path.dev(), at_path.ino()) {
            return Ok(());
        }
        Err(SnapshotError::Replaced {
            path: self.path.clone(),
        })
    }

    /// One try of `read`, a call that makes SQLite read the parent, under fork's SHARED
    /// lock and only once the header read through it says rollback-journal mode (or the
    /// file is empty). Ok(None): a writer holds or waits for EXCLUSIVE and nothing ran: try
    /// again, as after SQLite's busy answer.
    pub fn read<T>(&self, read: impl FnOnce() -> T) -> Result<Option<T>, SnapshotError> {
        if !try_shared(&self.file).map_err(io_err("lock", &self.path))? {
            return Ok(None);
        }
        let out = self.check_header().map(|()| read());
        let released = release_shared(&self.file).map_err(io_err("unlock", &self.path));
        let out = out?;
        released?;
        Ok(Some(out))
    }

    /// The header, read under the lock, says rollback-journal mode.
    fn check_header(&self) -> Result<(), SnapshotError> {
        let path = self.path.clone();
        match mode_of(&self.file).map_err(io_err("read", &self.path))? {
            Mode::Rollback | Mode::Empty => Ok(()),
            Mode::NotSqlite => Err(SnapshotError::NotSqlite { path }),
            Mode::Wal => Err(SnapshotError::LeftRollbackMode {
                path,
                version: [2, 2],
            }),
            Mode::Other(version) => Err(SnapshotError::LeftRollbackMode { path, version }),
        }
    }
}
