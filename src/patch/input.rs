//! Reading a patch from a path the user gave (`fork evaluate PATCH`, `reverify --patch`,
//! `consensus --patch`, `mesh propose PATCH`): checked before anything is read, read
//! bounded. The file must be a regular file, checked on the descriptor opened without
//! blocking (a FIFO is refused at once instead of waiting for a writer; a device is never
//! read), and no more than the gated size plus one byte is ever read, however large the
//! file claims or turns out to be.

use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// A patch read from a file: at most `limit + 1` of its bytes, and its size.
#[derive(Debug, Clone)]
pub struct PatchFile {
    /// The bytes read: the whole file when it is within the limit, else its first
    /// `limit + 1` bytes.
    pub bytes: Vec<u8>,
    /// The file's size (the larger of what `fstat` said and what was read).
    pub size: u64,
}

impl PatchFile {
    /// `sha256:<hex>` of the bytes read (the whole patch when it is within the limit).
    pub fn hash(&self) -> String {
        format!("sha256:{}", hex::encode(Sha256::digest(&self.bytes)))
    }
}

/// Why a patch file could not be read.
#[derive(Debug, Error)]
pub enum PatchFileError {
    #[error("cannot read patch {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: crate::fsx::FsxError,
    },
    #[error("cannot read patch {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Reads the patch at `path`: a regular file (opened without blocking), of which at most
/// `limit + 1` bytes are read.
pub fn read_patch_file(path: &Path, limit: u64) -> Result<PatchFile, PatchFileError> {
    let (file, size) = crate::fsx::open_regular(path).map_err(|source| PatchFileError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let mut bytes = Vec::with_capacity(usize::try_from(size.min(limit)).unwrap_or(0));
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| PatchFileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(PatchFile {
        size: size.max(bytes.len() as u64),
        bytes,
    })
}

/// `sha256:<hex>` of the whole patch file at `path` (a regular file, opened without
/// blocking), streamed: memory stays bounded whatever its size.
pub fn hash_patch_file(path: &Path) -> Result<String, PatchFileError> {
    let (mut file, _) = crate::fsx::open_regular(path).map_err(|source| PatchFileError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let mut h = Sha256::new();
    std::io::copy(&mut file, &mut h).map_err(|source| PatchFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(format!("sha256:{}", hex::encode(h.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_refused_without_waiting() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("p.diff");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = read_patch_file(&fifo, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        assert!(e.to_string().contains("p.diff"), "{e}");
        assert!(hash_patch_file(&fifo).is_err());
        assert!(
            read_patch_file(d.path(), 10).is_err(),
            "a directory is refused"
        );
    }

    #[test]
    fn a_large_file_is_read_only_to_the_limit() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("big.diff");
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(1 << 30).unwrap(); // sparse
        let got = read_patch_file(&p, 1000).unwrap();
        assert_eq!(got.bytes.len(), 1001);
        assert_eq!(got.size, 1 << 30);
        std::fs::write(&p, b"small").unwrap();
        let got = read_patch_file(&p, 1000).unwrap();
        assert_eq!((got.bytes.as_slice(), got.size), (&b"small"[..], 5));
        assert_eq!(got.hash(), hash_patch_file(&p).unwrap());
    }
}
