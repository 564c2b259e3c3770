//! The fork module's two error types: [`WorkspaceError`] for its trees (workspaces,
//! copies, hashes, removal) and [`SnapshotError`] for its state snapshots; and what both
//! the snapshot's SQLite side (`sqlite.rs`) and its lock and header reads (`header.rs`)
//! need, so that neither imports the other's.

use crate::ioerr::IoError;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

/// Errors of workspace creation, copies, hashing and removal.
#[derive(Debug, Error)]
pub enum WorkspaceError {
    #[error("workspace {path} already exists: each run needs a fresh workspace (run `fork gc` to reclaim stale ones)")]
    Exists { path: PathBuf },
    #[error("{path} is not empty: a listed copy goes into an empty directory (its listing names only what it wrote)")]
    NotEmpty { path: PathBuf },
    #[error("{path} is not a directory")]
    NotADirectory { path: PathBuf },
    #[error(
        "{path}: {component} is a symbolic link (fork never follows a link in a tree it reads)"
    )]
    Link { path: PathBuf, component: String },
    #[error("{path}: {reason}")]
    Unreadable { path: PathBuf, reason: String },
    #[error("exclude pattern `{pattern}` is not a valid glob: {source}")]
    BadGlob {
        pattern: String,
        #[source]
        source: globset::Error,
    },
    #[error("copying would replace the directory {path} with a file or link: remove it first if that is intended")]
    WouldReplaceDirectory { path: PathBuf },
    #[error("refusing to delete across the mount point {path}: unmount it first (`fork gc` does)")]
    MountPoint { path: PathBuf },
    #[error("{path} no longer names the directory fork was removing (it was moved or replaced meanwhile): that directory was emptied and left where it went, and what is now at {path} was left alone")]
    Moved { path: PathBuf },
    #[error(transparent)]
    Io(#[from] IoError),
}

/// The 16 bytes every SQLite 3 database file starts with.
pub const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// Why a snapshot failed. Each message names the file and what to do.
#[derive(Debug, Error)]
pub enum SnapshotError {
    #[error("state file {path} does not exist: fix [runtime].state in fork.toml")]
    Missing { path: PathBuf },
    #[error(
        "state file {path} is not a regular file: [runtime].state must list SQLite database files"
    )]
    NotAFile { path: PathBuf },
    #[error("state file {path} is reached through a symbolic link (it is one, or a directory above it is): fork opens state stores with no link in any component; list the store's real path in [runtime].state")]
    Linked { path: PathBuf },
    #[error("state file {path} is not an SQLite database (its header is not `SQLite format 3`): [runtime].state must list SQLite database files")]
    NotSqlite { path: PathBuf },
    #[error("snapshot destination {path} already exists: a snapshot never overwrites; remove it or pick a fresh workspace")]
    DestExists { path: PathBuf },
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("SQLite failed to {action} {path}: {source}")]
    Sqlite {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("the snapshot of {path} restarted {restarts} times because the database kept changing: raise max_restarts or let grow_on_restart enlarge the steps")]
    TooManyRestarts { path: PathBuf, restarts: u32 },
    #[error("the snapshot of {path} did not finish within {timeout:?} (the database stayed locked by a writer?): retry, or raise the timeout")]
    Timeout { path: PathBuf, timeout: Duration },
    #[error("the database {path} left rollback-journal mode during the snapshot (header bytes 18-19: {} {}{}), so the snapshot was refused: its committed state may now lie in its `-wal`, which a copy of the file alone would miss; snapshot it again", .version[0], .version[1], wal_named(.version))]
    LeftRollbackMode { path: PathBuf, version: [u8; 2] },
    #[error("the database file {path} was replaced (another file put at its path) during the snapshot, so the file fork checked is not the one SQLite reads; snapshot it again once the parent has stopped replacing it")]
    Replaced { path: PathBuf },
    #[error("the snapshot of {path} failed its integrity check: {report}; the source database may itself be damaged: run `sqlite3 {path} 'PRAGMA integrity_check'`")]
    Corrupt { path: PathBuf, report: String },
}

/// ", WAL" after header bytes 18-19 that name WAL mode.
fn wal_named(version: &[u8; 2]) -> &'static str {
    if version == &[2, 2] {
        ", WAL"
    } else {
        ""
    }
}

/// An I/O error of `action` on `path`, as the snapshot reports it.
pub(super) fn io_err<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> SnapshotError + 'a {
    move |source| SnapshotError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}
