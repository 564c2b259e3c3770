//! Why a verdict bundle could not be written (its own file, so that the bundle's writer
//! and the size limit it signs within both use it without importing each other).

use crate::ioerr::IoError;
use crate::verdict::sign::SignError;
use std::path::PathBuf;
use thiserror::Error;

/// Why a bundle could not be written.
#[derive(Debug, Error)]
pub enum BundleError {
    #[error("{path} already exists: a verdict bundle is never overwritten; pick another --out or remove it")]
    Exists { path: PathBuf },
    #[error("artifact {path} is not a regular file (symlinks, directories and special files are never bundled)")]
    ArtifactNotRegular { path: PathBuf },
    #[error("the verdict is not valid: {}", .0.join("; "))]
    Invalid(Vec<String>),
    #[error("cannot sign the verdict: {0}")]
    Sign(#[from] SignError),
    #[error("cannot serialize the verdict: {0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("the verdict's signed files would be {bytes} bytes, and {without_metrics} bytes with its metrics left out, over the {limit} bytes `fork verify` reads from a bundle: nothing was written; report fewer metrics, with shorter names")]
    TooLarge {
        bytes: u64,
        without_metrics: u64,
        limit: u64,
    },
}
