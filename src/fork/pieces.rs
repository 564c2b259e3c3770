//! A file's BLAKE3 kept as the chaining values of its 8 KiB pieces, so that pieces
//! rewritten after they were hashed can be hashed again alone (WAL mode's snapshot: the
//! database file is hashed behind its copy, then SQLite's replay rewrites the pages the
//! copied WAL holds; only their pieces are hashed again, see `walcopy.rs`).
//!
//! The root is the file's ordinary BLAKE3 (what `b3sum` prints): BLAKE3's tree over 1 KiB
//! chunks splits every subtree at [`hazmat::left_subtree_len`], a power of two. A subtree
//! longer than a piece therefore splits at a multiple of the piece (a power of two as
//! well), and a subtree no longer than a piece that starts on a piece boundary is that
//! piece (only the file's last piece can be shorter). The tests compare the root with
//! `blake3::hash` over many lengths and rewrites.

use blake3::hazmat::{self, ChainingValue, HasherExt};
use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The piece: 8 chunks, one pass of BLAKE3's 8-lane SIMD (measured: hashing 100 MiB as
/// 8 KiB pieces took 1.07x one pass; 4 KiB pieces 1.48x).
pub(super) const PIECE: u64 = 8 << 10;

/// The chaining values of a file's first `len` bytes, piece by piece.
pub(super) struct Pieces {
    /// Bytes hashed into `cvs` (whole pieces, then at most one shorter last piece).
    len: u64,
    cvs: Vec<ChainingValue>,
    /// Bytes given to [`push`](Self::push) and not yet a whole piece.
    pending: Vec<u8>,
}

impl Pieces {
    pub fn new() -> Pieces {
        Pieces {
            len: 0,
            cvs: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// How many bytes were given so far.
    #[cfg(test)]
    pub fn len(&self) -> u64 {
        self.len + self.pending.len() as u64
    }

    /// Hashes the bytes that follow the ones given before, whole pieces as they complete.
    pub fn push(&mut self, mut bytes: &[u8]) {
        let piece = PIECE as usize;
        if !self.pending.is_empty() {
            let take = (piece - self.pending.len()).min(bytes.len());
            self.pending.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.pending.len() < piece {
                return;
            }
            let whole = std::mem::take(&mut self.pending);
            self.cvs.push(piece_cv(self.len, &whole));
            self.len += PIECE;
        }
        let whole = bytes.len() / piece * piece;
        for p in bytes[..whole].chunks(piece) {
            self.cvs.push(piece_cv(self.len, p));
            self.len += PIECE;
        }
        self.pending.extend_from_slice(&bytes[whole..]);
    }

    /// Hashes the last, shorter piece given (if any): call once every byte is given.
    fn settle(&mut self) {
        if !self.pending.is_empty() {
            let last = std::mem::take(&mut self.pending);
            self.cvs.push(piece_cv(self.len, &last));
            self.len += last.len() as u64;
        }
    }

    /// The file at `file` now holds `new_len` bytes, and its bytes changed (at most) in
    /// the byte ranges `dirty` (start, end) and wherever it grew or shrank: hashes those
    /// pieces again from `file`. Returns how many pieces were hashed again.
    pub fn rehash(
        &mut self,
        file: &File,
        new_len: u64,
        dirty: impl IntoIterator<Item = (u64, u64)>,
    ) -> io::Result<usize> {
        self.settle();
        let count = new_len.div_ceil(PIECE) as usize;
        let mut again: BTreeSet<usize> = BTreeSet::new();
        // From the piece holding the old or new end on, the pieces changed length or bytes.
        let stable = (self.len.min(new_len) / PIECE) as usize;
        again.extend(stable..count);
        for (start, end) in dirty {
            let end = end.min(new_len);
            if start < end {
                again.extend((start / PIECE) as usize..=((end - 1) / PIECE) as usize);
            }
        }
        self.cvs.truncate(count);
        self.cvs.resize(count, [0; 32]);
        let mut buf = vec![0u8; PIECE as usize];
        for &i in &again {
            let off = i as u64 * PIECE;
            let n = PIECE.min(new_len - off) as usize;
            file.read_exact_at(&mut buf[..n], off)?;
            self.cvs[i] = piece_cv(off, &buf[..n]);
        }
        self.len = new_len;
        Ok(again.len())
    }

    /// `blake3:<hex>` of the bytes hashed, or None when they fit in one piece (then the
    /// root is not made from a chaining value: hash the file in one pass).
    pub fn root(&mut self) -> Option<String> {
        self.settle();
        if self.len <= PIECE {
            return None;
        }
        let left = hazmat::left_subtree_len(self.len);
        let l = self.subtree(0, left);
        let r = self.subtree(left, self.len - left);
        let h = hazmat::merge_subtrees_root(&l, &r, hazmat::Mode::Hash);
        Some(format!("blake3:{}", h.to_hex()))
    }

    /// The chaining value of the subtree of `len` bytes at `off` (a piece boundary).
    fn subtree(&self, off: u64, len: u64) -> ChainingValue {
        if len <= PIECE {
            return self.cvs[(off / PIECE) as usize];
        }
        let left = hazmat::left_subtree_len(len);
        let l = self.subtree(off, left);
        let r = self.subtree(off + left, len - left);
        hazmat::merge_subtrees_non_root(&l, &r, hazmat::Mode::Hash)
    }
}

fn piece_cv(off: u64, bytes: &[u8]) -> ChainingValue {
    blake3::Hasher::new()
        .set_input_offset(off)
        .update(bytes)
        .finalize_non_root()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(len: usize, salt: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ (i >> 13) as u8 ^ salt)
            .collect()
    }

    fn pieces_of(data: &[u8], feed: usize) -> Pieces {
        let mut p = Pieces::new();
        for c in data.chunks(feed) {
            p.push(c);
        }
        p
    }

    #[test]
    fn the_root_is_blake3_of_the_whole_at_every_boundary() {
        let k = PIECE as usize;
        for len in [
            k + 1,
            2 * k - 1,
            2 * k,
            2 * k + 1,
            3 * k,
            5 * k + 17,
            8 * k,
            8 * k + 1024,
            64 * k + 1,
            (1 << 20) + 3 * k + 5,
        ] {
            let data = bytes(len, 1);
            for feed in [k, 4 * k, 1 << 20, 1000, 3 * k + 1] {
                let mut p = pieces_of(&data, feed);
                assert_eq!(p.len(), len as u64);
                let want = format!("blake3:{}", blake3::hash(&data).to_hex());
                assert_eq!(p.root().unwrap(), want, "len {len}, fed {feed}");
            }
        }
        assert!(pieces_of(&bytes(k, 0), k).root().is_none());
    }

    #[test]
    fn pieces_hashed_again_give_the_new_files_blake3() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let k = PIECE as usize;
        let page = 4096usize;
        let old = bytes(300 * k + 100, 1);
        // Rewritten pages (in place), then the file grown, cut, or left as long.
        for new_len in [old.len(), 320 * k + 7, 250 * k, 123 * k + 5, 2 * k + 1] {
            let mut p = pieces_of(&old, 4 * k);
            let mut new = old.clone();
            new.resize(new_len, 0);
            let other = bytes(new_len, 7);
            let pages = [0usize, 1, 2, 77, 300, 599, 600, 601, 640];
            let mut dirty = vec![];
            for pg in pages {
                let (s, e) = (pg * page, ((pg + 1) * page).min(new_len));
                if s < e {
                    new[s..e].copy_from_slice(&other[s..e]);
                }
                dirty.push((s as u64, (s + page) as u64));
            }
            // Bytes past the old end differ from the old file's zero fill.
            if new_len > old.len() {
                new[old.len()..].copy_from_slice(&other[old.len()..]);
            }
            std::fs::write(&path, &new).unwrap();
            let f = File::open(&path).unwrap();
            let n = p.rehash(&f, new_len as u64, dirty).unwrap();
            if new_len > 100 * k {
                assert!(n < new_len.div_ceil(k) / 2, "not every piece: {n}");
            }
            let want = format!("blake3:{}", blake3::hash(&new).to_hex());
            assert_eq!(p.root().unwrap(), want, "new length {new_len}");
        }
    }

    #[test]
    fn a_rewrite_it_is_not_told_of_changes_the_answer() {
        // What `rehash` relies on: the ranges it is given are every change. A change it is
        // not told of gives a root that is not the new file's (so the WAL path must name
        // every page the replay may write; its tests compare with the file's own hash).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let old = bytes(40 * PIECE as usize, 1);
        let mut p = pieces_of(&old, PIECE as usize);
        let mut new = old.clone();
        new[5 * PIECE as usize] ^= 1;
        std::fs::write(&path, &new).unwrap();
        let f = File::open(&path).unwrap();
        p.rehash(&f, new.len() as u64, []).unwrap();
        assert_ne!(
            p.root().unwrap(),
            format!("blake3:{}", blake3::hash(&new).to_hex())
        );
    }
}
