//! Reading a patch from a path the user gave (`fork evaluate PATCH`, `reverify --patch`,
//! `consensus --patch`, `mesh propose PATCH`): checked before anything is read, read
//! bounded. The file must be a regular file, checked on the descriptor opened without
//! blocking (a FIFO is refused at once instead of waiting for a writer; a device is never
//! read), and no more than the gated size plus one byte is ever kept, however large the
//! file claims or turns out to be. The rest is read only to be hashed: the patch's hash is
//! always the whole file's, so that nodes whose size gates differ name the same patch.

use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The largest patch file whose hash is taken (beyond the size gate, the rest of a file is
/// read only to be hashed: 4 GiB is about two seconds of reading, and no patch is that
/// large): a larger file is bad input, not a verdict.
pub const MAX_HASHED_PATCH_BYTES: u64 = 4 << 30;

/// A patch read from a file: at most `limit + 1` of its bytes, its size and its hash.
#[derive(Debug, Clone)]
pub struct PatchFile {
    /// The bytes read: the whole file when it is within the limit, else its first
    /// `limit + 1` bytes.
    pub bytes: Vec<u8>,
    /// The file's size (the larger of what `fstat` said and what was read).
    pub size: u64,
    /// `sha256:<hex>` of every byte of the file, kept or not.
    sha256: String,
}

impl PatchFile {
    /// `sha256:<hex>` of the whole patch file, also when only a prefix of it was kept
    /// (a patch over the size gate: its REJECT names the patch that was given, so that a
    /// node with a smaller gate votes on the same patch as the others).
    pub fn hash(&self) -> String {
        self.sha256.clone()
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
    #[error("patch {path} is larger than {limit} bytes, the most fork hashes: no patch is that large; give the patch itself")]
    TooLargeToHash { path: PathBuf, limit: u64 },
}

/// Reads the patch at `path`: a regular file (opened without blocking), of which at most
/// `limit + 1` bytes are kept; every byte is hashed (up to [`MAX_HASHED_PATCH_BYTES`]).
pub fn read_patch_file(path: &Path, limit: u64) -> Result<PatchFile, PatchFileError> {
    read_capped(path, limit, MAX_HASHED_PATCH_BYTES)
}

/// `sha256:<hex>` of the whole patch file at `path` (a regular file, opened without
/// blocking), streamed: memory stays bounded whatever its size.
pub fn hash_patch_file(path: &Path) -> Result<String, PatchFileError> {
    read_patch_file(path, 0).map(|p| p.hash())
}

/// [`read_patch_file`], hashing at most `cap` bytes.
fn read_capped(path: &Path, limit: u64, cap: u64) -> Result<PatchFile, PatchFileError> {
    let (file, size) = crate::fsx::open_regular(path).map_err(|source| PatchFileError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let read_err = |source| PatchFileError::Read {
        path: path.to_path_buf(),
        source,
    };
    let too_large = || PatchFileError::TooLargeToHash {
        path: path.to_path_buf(),
        limit: cap,
    };
    if size > cap {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size.min(limit)).unwrap_or(0));
    // One more byte than the cap, so a file that grew past it while read is seen.
    let mut file = file.take(cap.saturating_add(1));
    (&mut file)
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    let mut h = Sha256::new();
    h.update(&bytes);
    let rest = std::io::copy(&mut file, &mut h).map_err(read_err)?;
    let read = bytes.len() as u64 + rest;
    if read > cap {
        return Err(too_large());
    }
    Ok(PatchFile {
        size: size.max(read),
        bytes,
        sha256: format!("sha256:{}", hex::encode(h.finalize())),
    })
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
        f.set_len(64 << 20).unwrap(); // sparse
        let got = read_patch_file(&p, 1000).unwrap();
        assert_eq!(got.bytes.len(), 1001);
        assert_eq!(got.size, 64 << 20);
        // The hash is the whole file's, not the kept prefix's: a node whose size gate is
        // smaller names the same patch as the others.
        let zeros = vec![0u8; 1 << 20];
        let mut whole = Sha256::new();
        for _ in 0..64 {
            whole.update(&zeros);
        }
        assert_eq!(
            got.hash(),
            format!("sha256:{}", hex::encode(whole.finalize()))
        );
        assert_eq!(got.hash(), read_patch_file(&p, 1 << 20).unwrap().hash());
        std::fs::write(&p, b"small").unwrap();
        let got = read_patch_file(&p, 1000).unwrap();
        assert_eq!((got.bytes.as_slice(), got.size), (&b"small"[..], 5));
        assert_eq!(got.hash(), hash_patch_file(&p).unwrap());
    }

    #[test]
    fn a_file_beyond_the_hash_cap_is_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("huge.diff");
        std::fs::write(&p, vec![b'x'; 4097]).unwrap();
        let e = read_capped(&p, 100, 4096).unwrap_err();
        assert!(matches!(e, PatchFileError::TooLargeToHash { .. }), "{e}");
        assert!(e.to_string().contains("huge.diff"), "{e}");
        assert!(read_capped(&p, 100, 4097).is_ok());
    }
}
