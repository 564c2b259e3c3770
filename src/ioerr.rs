//! The one I/O error of the crate: an [`io::Error`] with what was being done and to which
//! path, so that every message names both (`cannot read /x/verdict.json: Permission denied`).
//!
//! Modules wrap it in their own error enum (`#[error(transparent)] Io(#[from] IoError)`, or
//! their own wording built from its fields) and write `.ctx("read", &path)?`.

use std::borrow::Cow;
use std::io;
use std::path::{Path, PathBuf};

/// An I/O failure, with the action that failed and the path it failed on.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {path}: {source}")]
pub struct IoError {
    /// What was being done, as a verb phrase (`read`, `create directory`).
    pub action: Cow<'static, str>,
    /// The file or directory.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

impl IoError {
    pub fn new(action: impl Into<Cow<'static, str>>, path: &Path, source: io::Error) -> IoError {
        IoError {
            action: action.into(),
            path: path.to_path_buf(),
            source,
        }
    }

    /// The kind of the OS error.
    pub fn kind(&self) -> io::ErrorKind {
        self.source.kind()
    }
}

/// Adds the action and the path to an I/O result: `fs::read(&p).ctx("read", &p)?`.
pub trait IoContext<T> {
    fn ctx(self, action: impl Into<Cow<'static, str>>, path: &Path) -> Result<T, IoError>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, action: impl Into<Cow<'static, str>>, path: &Path) -> Result<T, IoError> {
        self.map_err(|source| IoError::new(action, path, source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_action_and_the_path() {
        let e = Err::<(), _>(io::Error::from(io::ErrorKind::NotFound))
            .ctx("read", Path::new("/x/verdict.json"))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert_eq!(
            e.to_string(),
            format!("cannot read /x/verdict.json: {}", e.source)
        );
        let source = std::error::Error::source(&e).expect("the OS error is the source");
        assert!(source.downcast_ref::<io::Error>().is_some());
    }

    /// The modules that had their own wording keep it.
    #[test]
    fn wrappers_keep_their_wording() {
        let e = || IoError::new("reading", Path::new("/p"), io::Error::other("boom"));
        let cases = [
            (
                crate::verdict::verify::VerifyError::from(e()).to_string(),
                "cannot reading /p: boom",
            ),
            (
                crate::sandbox::cgroup::CgroupError::from(e()).to_string(),
                "cgroup: reading \"/p\" failed: boom",
            ),
            (
                crate::sandbox::SandboxError::from(e()).to_string(),
                "reading /p: boom",
            ),
            (
                crate::sandbox::mounts::MountError::from(e()).to_string(),
                "reading /p: boom",
            ),
            (
                crate::ledger::LedgerError::from(e()).to_string(),
                "ledger /p: cannot reading: boom",
            ),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
    }
}
