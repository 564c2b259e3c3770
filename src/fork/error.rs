//! The one error type of the fork module's trees: workspaces, copies, hashes, removal.

use crate::ioerr::IoError;
use std::path::PathBuf;
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
