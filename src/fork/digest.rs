//! The state stores' digest: what names one snapshot image in `state_hash`.
//!
//! BLAKE3 by default (`blake3:<hex>`, the same value as `b3sum`): on this project's
//! benchmark CPU it hashes about twice as fast as SHA-256 on one core, and its tree can be
//! split across cores, so the snapshot's hash no longer takes longer than the copy. The
//! policy's `[state] digest = "sha256"` gives the previous releases' `sha256:<hex>`.
//!
//! A whole file or image is hashed in two halves on two threads once it is large enough:
//! BLAKE3's tree splits at [`hazmat::left_subtree_len`] into two subtrees whose chaining
//! values merge into the same root hash as one pass (the tests compare against
//! `blake3::hash` at every boundary length).

use blake3::hazmat::{self, HasherExt};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Which digest names a state store's snapshot (`[state] digest` in the policy).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StateDigest {
    /// BLAKE3, 256 bits: `blake3:<64 hex>`.
    #[default]
    Blake3,
    /// SHA-256: `sha256:<64 hex>` (the releases before BLAKE3 became the default).
    Sha256,
}

impl StateDigest {
    /// The digest's prefix in `<name>:<hex>`.
    pub fn name(self) -> &'static str {
        match self {
            StateDigest::Blake3 => "blake3",
            StateDigest::Sha256 => "sha256",
        }
    }

    /// A streaming hasher of this digest.
    pub fn hasher(self) -> StateHasher {
        match self {
            StateDigest::Blake3 => StateHasher::Blake3(Box::default()),
            StateDigest::Sha256 => StateHasher::Sha256(Sha256::new()),
        }
    }

    /// `<name>:<hex>` of `bytes`, split over two threads when that pays.
    pub fn of_bytes(self, bytes: &[u8]) -> String {
        match self {
            StateDigest::Blake3 if bytes.len() as u64 >= SPLIT_MIN => {
                let left = hazmat::left_subtree_len(bytes.len() as u64) as usize;
                let (l, r) = std::thread::scope(|s| {
                    let l = s.spawn(|| {
                        blake3::Hasher::new()
                            .update(&bytes[..left])
                            .finalize_non_root()
                    });
                    let r = blake3::Hasher::new()
                        .set_input_offset(left as u64)
                        .update(&bytes[left..])
                        .finalize_non_root();
                    (l.join(), r)
                });
                match l {
                    Ok(l) => blake3_hex(hazmat::merge_subtrees_root(&l, &r, hazmat::Mode::Hash)),
                    // Only a bug panics in a hasher; hash in one pass rather than unwind.
                    Err(_) => blake3_hex(blake3::hash(bytes)),
                }
            }
            _ => {
                let mut h = self.hasher();
                h.update(bytes);
                h.finish()
            }
        }
    }

    /// `<name>:<hex>` of the first `len` bytes of `file` (read with `pread`, so the file's
    /// offset is untouched), split over two threads when that pays.
    pub fn of_file(self, file: &File, len: u64) -> io::Result<String> {
        if self == StateDigest::Blake3 && len >= SPLIT_MIN {
            let left = hazmat::left_subtree_len(len);
            let (l, r) = std::thread::scope(|s| {
                let l = s.spawn(|| subtree(file, 0, left));
                let r = subtree(file, left, len - left);
                (l.join(), r)
            });
            let l = l.map_err(|_| io::Error::other("the hashing thread panicked"))??;
            return Ok(blake3_hex(hazmat::merge_subtrees_root(
                &l,
                &r?,
                hazmat::Mode::Hash,
            )));
        }
        let mut h = self.hasher();
        read_range(file, 0, len, |b| h.update(b))?;
        Ok(h.finish())
    }

    /// `<name>:<hex>` of the file at `path`, whole.
    pub fn of_path(self, path: &std::path::Path) -> io::Result<String> {
        let f = File::open(path)?;
        let len = f.metadata()?.len();
        self.of_file(&f, len)
    }
}

/// Below this many bytes one thread hashes the whole input: a thread's start costs more
/// than it saves.
const SPLIT_MIN: u64 = 1 << 20;

/// The read buffer: large enough for BLAKE3's many-chunk SIMD path, small enough to stay
/// in the CPU's caches.
const BUF: u64 = 1 << 20;

/// The chaining value of the BLAKE3 subtree of `file`'s bytes `off..off + len`.
fn subtree(file: &File, off: u64, len: u64) -> io::Result<hazmat::ChainingValue> {
    let mut h = blake3::Hasher::new();
    h.set_input_offset(off);
    read_range(file, off, len, |b| {
        h.update(b);
    })?;
    Ok(h.finalize_non_root())
}

/// Feeds `file`'s bytes `off..off + len` to `f`, a buffer at a time; a file shorter than
/// that is an error.
fn read_range(file: &File, off: u64, len: u64, mut f: impl FnMut(&[u8])) -> io::Result<()> {
    let mut buf = vec![0u8; BUF.min(len.max(1)) as usize];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(BUF) as usize;
        file.read_exact_at(&mut buf[..n], off + done)?;
        f(&buf[..n]);
        done += n as u64;
    }
    Ok(())
}

fn blake3_hex(h: blake3::Hash) -> String {
    format!("blake3:{}", h.to_hex())
}

/// A streaming hasher of a [`StateDigest`].
pub enum StateHasher {
    Blake3(Box<blake3::Hasher>),
    Sha256(Sha256),
}

impl StateHasher {
    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            StateHasher::Blake3(h) => {
                h.update(bytes);
            }
            StateHasher::Sha256(h) => h.update(bytes),
        }
    }

    /// `<name>:<hex>` of everything given to [`update`](Self::update).
    pub fn finish(self) -> String {
        match self {
            StateHasher::Blake3(h) => blake3_hex(h.finalize()),
            StateHasher::Sha256(h) => format!("sha256:{}", hex::encode(h.finalize())),
        }
    }
}

impl io::Write for StateHasher {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn data(len: usize) -> Vec<u8> {
        // Not all one byte: a wrong split or offset must change the answer.
        (0..len).map(|i| (i * 7 + i / 1031) as u8).collect()
    }

    #[test]
    fn known_values() {
        assert_eq!(
            StateDigest::Sha256.of_bytes(b"abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        // The BLAKE3 paper's test vector for "abc" (b3sum gives the same).
        assert_eq!(
            StateDigest::Blake3.of_bytes(b"abc"),
            "blake3:6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
        );
    }

    #[test]
    fn the_split_hash_is_the_one_pass_hash_at_every_boundary() {
        let mb = 1usize << 20;
        let mut lens = vec![0, 1, 1023, 1024, 1025, mb - 1, mb, mb + 1, mb + 1024];
        for k in [2usize, 3, 4, 5, 8] {
            lens.extend([k * mb - 1, k * mb, k * mb + 1, k * mb + 1024 + 1]);
        }
        let dir = tempfile::tempdir().unwrap();
        let all = data(8 * mb + 1026);
        let longer = dir.path().join("all");
        std::fs::write(&longer, &all).unwrap();
        for len in lens {
            let bytes = &all[..len];
            let want = format!("blake3:{}", blake3::hash(bytes).to_hex());
            assert_eq!(StateDigest::Blake3.of_bytes(bytes), want, "bytes, {len}");
            let p = dir.path().join(format!("f{len}"));
            std::fs::write(&p, bytes).unwrap();
            assert_eq!(
                StateDigest::Blake3.of_path(&p).unwrap(),
                want,
                "file, {len}"
            );
            // The first `len` bytes of a longer file.
            let f = File::open(&longer).unwrap();
            assert_eq!(StateDigest::Blake3.of_file(&f, len as u64).unwrap(), want);
            let sha = format!("sha256:{}", hex::encode(Sha256::digest(bytes)));
            assert_eq!(StateDigest::Sha256.of_file(&f, len as u64).unwrap(), sha);
            let mut h = StateDigest::Blake3.hasher();
            for piece in bytes.chunks(70_001) {
                h.write_all(piece).unwrap();
            }
            assert_eq!(h.finish(), want, "streamed, {len}");
            let sha = format!("sha256:{}", hex::encode(Sha256::digest(bytes)));
            assert_eq!(StateDigest::Sha256.of_bytes(bytes), sha);
            assert_eq!(StateDigest::Sha256.of_path(&p).unwrap(), sha);
        }
    }

    #[test]
    fn a_file_shorter_than_asked_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("short");
        std::fs::write(&p, data(3 << 20)).unwrap();
        let f = File::open(&p).unwrap();
        for d in [StateDigest::Blake3, StateDigest::Sha256] {
            let e = d.of_file(&f, 4 << 20).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{d:?}");
        }
    }

    #[test]
    fn the_policy_spells_them_in_lowercase() {
        #[derive(Deserialize)]
        struct T {
            d: StateDigest,
        }
        let t: T = toml::from_str("d = \"sha256\"").unwrap();
        assert_eq!(t.d, StateDigest::Sha256);
        assert!(toml::from_str::<T>("d = \"md5\"").is_err());
    }
}
