//! A file's BLAKE3 kept as the chaining values of its 16 KiB pieces, so that pieces
//! rewritten after they were hashed can be hashed again alone (WAL mode's snapshot: the
//! database file is hashed behind its copy, and SQLite's replay rewrites the pages the
//! copied WAL holds, meanwhile or after; only their pieces are hashed again, see
//! `walcopy.rs`; a large rollback-journal database copied before its lock, whose
//! comparison under the lock rewrites what changed meanwhile: `precopy.rs`).
//!
//! A piece read while the file was shorter than it (the replay may cut the file to its
//! page count while the thread behind reads) is not trusted: every piece from the first
//! such one on is hashed again by [`Pieces::rehash`], and until then the pieces give no
//! root.
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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The piece: 16 chunks, one pass of BLAKE3's widest SIMD (AVX-512 hashes 16 chunks at
/// once, AVX2 8). Measured on 100 MiB with AVX-512, against one pass (22 ms on one core):
/// 8 KiB pieces 1.27x, 16 KiB 1.07x, 64 KiB 1.02x (an earlier machine: 8 KiB 1.07x,
/// 4 KiB 1.48x).
pub(super) const PIECE: u64 = 16 << 10;

/// The chaining values of a file's first `len` bytes, piece by piece (made by
/// [`Hashing`]).
pub(super) struct Pieces {
    len: u64,
    cvs: Vec<ChainingValue>,
    /// Bytes from here on were not all there when their pieces were read (`len` when
    /// every piece was read whole).
    unread_from: u64,
}

impl Pieces {
    /// The file at `file` now holds `new_len` bytes, and its bytes changed (at most) in
    /// the byte ranges `dirty` (start, end) and wherever it grew or shrank: hashes those
    /// pieces again from `file`, and every piece from the first one read short on.
    /// Returns how many pieces were hashed again.
    ///
    /// Sound when, from the first read of the pieces on, the file only grew and was then
    /// cut at most once, to `new_len`: then no length it had was below the shorter of the
    /// two, and a piece read whole below that changed only inside `dirty`. SQLite's replay
    /// of a copied WAL is such a change: it writes frames' pages (all in `dirty`), growing
    /// the file where they lie past its end, and cuts it to its page count last; so is the
    /// precopy's comparison (it rewrites units in place, all in `dirty`, then either
    /// copies what the file grew by or cuts the copy once). Pieces
    /// read short are read again whatever followed; a file cut and then grown back over
    /// pieces read whole before the cut is not covered: their old bytes would stand.
    pub fn rehash(
        &mut self,
        file: &File,
        new_len: u64,
        dirty: impl IntoIterator<Item = (u64, u64)>,
    ) -> io::Result<usize> {
        let count = new_len.div_ceil(PIECE) as usize;
        let mut again: BTreeSet<usize> = BTreeSet::new();
        // From the piece holding the old or new end on, the pieces changed length or bytes;
        // from the first piece read short on, they were never hashed whole. A last piece
        // read whole at a length the file has again changed only inside `dirty`.
        let stable = if new_len == self.len && self.unread_from >= self.len {
            count
        } else {
            (self.len.min(new_len).min(self.unread_from) / PIECE) as usize
        };
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
        self.unread_from = new_len;
        Ok(again.len())
    }

    /// The BLAKE3 of the copy `dest`, now `bytes` long, from these pieces hashed behind
    /// its copy: those in the `dirty` ranges (the pages of the copied WAL's frames,
    /// replayed; or the units the precopy's comparison under the lock copied again) and
    /// those past the shorter of the two lengths hashed again ([`rehash`](Self::rehash)),
    /// the rest as they were; and how many pieces were hashed again.
    pub fn root_after(
        mut self,
        dest: &std::path::Path,
        bytes: u64,
        dirty: Vec<(u64, u64)>,
    ) -> io::Result<(String, usize)> {
        let f = File::open(dest)?;
        let again = self.rehash(&f, bytes, dirty)?;
        match self.root() {
            Some(root) => Ok((root, again)),
            // One piece or less: its hash is not made from a chaining value.
            None => Ok((
                super::digest::StateDigest::Blake3.of_file(&f, bytes)?,
                again,
            )),
        }
    }

    /// `blake3:<hex>` of the bytes hashed, or None when they fit in one piece (then the
    /// root is not made from a chaining value) or a piece was read short and not hashed
    /// again since: hash the file in one pass.
    pub fn root(&self) -> Option<String> {
        if self.len <= PIECE || self.unread_from < self.len {
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

/// The pieces of a file while it is copied, hashed by whoever is free: a thread behind the
/// copier from the start, and the thread that calls [`Behind::finish`] too (in WAL mode,
/// once the copy is replayed, beside its check: reading a finished chunk back and hashing
/// it takes longer than the kernel's copy of it, so one hasher alone is still hashing
/// when the copy ends). The file is claimed a block at a time; a block is hashed once the
/// copy has passed its end (or the copy has ended).
struct Hashing {
    /// How far the copy has come, and whether it has ended.
    copied: Mutex<(u64, bool)>,
    moved: Condvar,
    /// The next block to claim.
    next: AtomicU64,
    /// The lowest offset at which a read found the file ended (u64::MAX: none did).
    unread: AtomicU64,
    /// The hashing was dropped unfinished: claim no more blocks.
    stop: AtomicBool,
    /// Blocks hashed so far (tests wait on it: [`Behind::settle`]).
    #[cfg(test)]
    hashed: AtomicU64,
    /// Claim no block until resumed (the caller holds a lock a writer waits for, and
    /// wants the cores and the memory bandwidth meanwhile).
    paused: AtomicBool,
    #[cfg(test)]
    gate: Option<Arc<tests::Gate>>,
}

/// A claim: 1 MiB of pieces, read in one `pread`.
const BLOCK: u64 = 64 * PIECE;

/// One worker's blocks (block index, its pieces' chaining values) and its busy time.
type Blocks = (Vec<(u64, Vec<ChainingValue>)>, Duration);

impl Hashing {
    fn set(&self, f: impl FnOnce(&mut (u64, bool))) {
        let mut c = self.copied.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut c);
        self.moved.notify_all();
    }

    /// Hashes claimed blocks of `file` as the copy passes them, until every block up to
    /// the copy's end is claimed; returns this worker's blocks.
    fn work(&self, file: &File) -> io::Result<Blocks> {
        let mut mine = Vec::new();
        let mut busy = Duration::ZERO;
        let mut buf = vec![0u8; BLOCK as usize];
        loop {
            if self.paused.load(Ordering::Relaxed) {
                let mut c = self.copied.lock().unwrap_or_else(|e| e.into_inner());
                while self.paused.load(Ordering::Relaxed) && !self.stop.load(Ordering::Relaxed) {
                    c = self.moved.wait(c).unwrap_or_else(|e| e.into_inner());
                }
            }
            if self.stop.load(Ordering::Relaxed) {
                return Ok((mine, busy));
            }
            let b = self.next.fetch_add(1, Ordering::Relaxed);
            let start = b * BLOCK;
            // Wait until the copy has passed the block's end, or has ended.
            let end = {
                let mut c = self.copied.lock().unwrap_or_else(|e| e.into_inner());
                while c.0 < start + BLOCK && !c.1 {
                    c = self.moved.wait(c).unwrap_or_else(|e| e.into_inner());
                }
                c.0.min(start + BLOCK)
            };
            if end <= start {
                return Ok((mine, busy));
            }
            let t = Instant::now();
            let bytes = &mut buf[..(end - start) as usize];
            let got = read_upto(file, bytes, start)?;
            if got < bytes.len() {
                // Cut under the read (the replay's doing): zeros stand in, and the pieces
                // from here on are hashed again (see `Pieces::rehash`).
                bytes[got..].fill(0);
                self.unread.fetch_min(start + got as u64, Ordering::Relaxed);
                #[cfg(test)]
                if let Some(g) = &self.gate {
                    g.short_reads.fetch_add(1, Ordering::Relaxed);
                }
            }
            let cvs = bytes
                .chunks(PIECE as usize)
                .enumerate()
                .map(|(i, p)| piece_cv(start + i as u64 * PIECE, p))
                .collect();
            mine.push((b, cvs));
            busy += t.elapsed();
            #[cfg(test)]
            self.hashed.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The hashing of a copy under way (see [`Hashing`]): told how far the copy has come,
/// then finished by a thread that hashes beside the thread behind it. Dropped unfinished
/// (an error on the way, or a copy to be hashed whole), it stops that thread after the
/// block it is hashing and joins it.
pub(super) struct Behind {
    hashing: Arc<Hashing>,
    copy: Arc<File>,
    thread: Option<std::thread::JoinHandle<io::Result<Blocks>>>,
}

impl Behind {
    /// Starts hashing `copy` (opened for reading) behind its copier. Without a thread to
    /// be had, [`finish`](Self::finish) hashes it all.
    pub fn start(copy: File) -> Behind {
        #[cfg(test)]
        let gate = tests::BEHIND_GATE.with(|g| g.borrow().clone());
        let hashing = Arc::new(Hashing {
            copied: Mutex::new((0, false)),
            moved: Condvar::new(),
            next: AtomicU64::new(0),
            unread: AtomicU64::new(u64::MAX),
            stop: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            #[cfg(test)]
            hashed: AtomicU64::new(0),
            #[cfg(test)]
            gate: gate.clone(),
        });
        let copy = Arc::new(copy);
        let (h, f) = (Arc::clone(&hashing), Arc::clone(&copy));
        let thread = std::thread::Builder::new()
            .name("fork-hash-behind".into())
            .spawn(move || {
                #[cfg(test)]
                if let Some(g) = gate {
                    g.wait();
                }
                h.work(&f)
            })
            .ok();
        Behind {
            hashing,
            copy,
            thread,
        }
    }

    /// The copier: the copy has reached `upto` bytes.
    pub fn copied(&self, upto: u64) {
        self.hashing.set(|c| c.0 = upto);
    }

    /// The copier: the copy has ended at `len` bytes (the thread behind may hash its last
    /// block before [`finish`](Self::finish)).
    pub fn ended(&self, len: u64) {
        self.hashing.set(|c| *c = (len, true));
    }

    /// The thread behind claims no further block until [`resume`](Self::resume) or
    /// [`finish`](Self::finish) (the block it is hashing, at most 1 MiB, it finishes).
    pub fn pause(&self) {
        self.hashing
            .set(|_| self.hashing.paused.store(true, Ordering::Relaxed));
    }

    /// Tests: waits (at most 60 s, then panics) until the thread behind has hashed every
    /// block of the `len` bytes copied, so that what the test changes next was hashed
    /// before.
    #[cfg(test)]
    pub fn settle(&self, len: u64) {
        let t = Instant::now();
        while self.thread.is_some()
            && self.hashing.hashed.load(Ordering::SeqCst) < len.div_ceil(BLOCK)
        {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "the thread behind did not hash the copy within 60 s"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Undoes [`pause`](Self::pause).
    pub fn resume(&self) {
        self.hashing
            .set(|_| self.hashing.paused.store(false, Ordering::Relaxed));
    }

    /// The copier, once the copy of `len` bytes has ended: hashes what is left beside the
    /// thread behind it, joins it, and returns the pieces and the time both were busy.
    pub fn finish(mut self, len: u64) -> io::Result<(Pieces, Duration)> {
        self.resume();
        self.ended(len);
        let mine = self.hashing.work(&self.copy);
        let theirs = match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| io::Error::other("the hashing thread panicked"))??,
            None => (Vec::new(), Duration::ZERO),
        };
        let mine = mine?;
        let mut blocks: Vec<_> = theirs.0.into_iter().chain(mine.0).collect();
        blocks.sort_unstable_by_key(|(b, _)| *b);
        if blocks.iter().enumerate().any(|(i, (b, _))| *b != i as u64) {
            return Err(io::Error::other("a block of the copy was not hashed"));
        }
        let cvs: Vec<ChainingValue> = blocks.into_iter().flat_map(|(_, c)| c).collect();
        if cvs.len() as u64 != len.div_ceil(PIECE) {
            return Err(io::Error::other(format!(
                "hashed {} pieces of a {len}-byte copy",
                cvs.len()
            )));
        }
        let unread_from = self.hashing.unread.load(Ordering::Relaxed).min(len);
        Ok((
            Pieces {
                len,
                cvs,
                unread_from,
            },
            theirs.1 + mine.1,
        ))
    }
}

impl Drop for Behind {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.hashing.stop.store(true, Ordering::Relaxed);
            #[cfg(test)]
            if let Some(g) = &self.hashing.gate {
                g.open();
            }
            self.hashing.set(|c| c.1 = true);
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Pieces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pieces({} bytes, {} pieces)", self.len, self.cvs.len())
    }
}

/// Reads into `buf` from `off` until it is full or the file ends; returns how many bytes
/// were read.
fn read_upto(file: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

fn piece_cv(off: u64, bytes: &[u8]) -> ChainingValue {
    blake3::Hasher::new()
        .set_input_offset(off)
        .update(bytes)
        .finalize_non_root()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::os::unix::fs::FileExt;

    thread_local! {
        /// Set on the copier's thread: the thread behind its next copy hashes nothing
        /// until the gate opens (or 20 s pass: a test that forgets it does not hang).
        pub(in crate::fork) static BEHIND_GATE: RefCell<Option<Arc<Gate>>> =
            const { RefCell::new(None) };
    }

    #[derive(Default)]
    pub(in crate::fork) struct Gate {
        open: Mutex<bool>,
        moved: Condvar,
        /// Reads the thread behind found cut short.
        pub(in crate::fork) short_reads: AtomicU64,
        /// The thread behind went on after 20 s without the gate opening.
        pub(in crate::fork) timed_out: AtomicBool,
    }

    impl Gate {
        pub(in crate::fork) fn open(&self) {
            *self.open.lock().unwrap() = true;
            self.moved.notify_all();
        }

        pub(in crate::fork) fn wait(&self) {
            let open = self.open.lock().unwrap();
            let (_open, waited) = self
                .moved
                .wait_timeout_while(open, Duration::from_secs(20), |o| !*o)
                .unwrap();
            if waited.timed_out() {
                self.timed_out.store(true, Ordering::Relaxed);
            }
        }
    }

    fn bytes(len: usize, salt: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ (i >> 13) as u8 ^ salt)
            .collect()
    }

    fn pieces_of(data: &[u8]) -> Pieces {
        let cvs = data
            .chunks(PIECE as usize)
            .enumerate()
            .map(|(i, p)| piece_cv(i as u64 * PIECE, p))
            .collect();
        Pieces {
            len: data.len() as u64,
            cvs,
            unread_from: data.len() as u64,
        }
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
            let want = format!("blake3:{}", blake3::hash(&data).to_hex());
            assert_eq!(pieces_of(&data).root().unwrap(), want, "len {len}");
        }
        assert!(pieces_of(&bytes(k, 0)).root().is_none());
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
            let mut p = pieces_of(&old);
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
    fn two_workers_behind_a_copy_hash_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let k = PIECE as usize;
        for len in [0usize, 100, BLOCK as usize, 3 * BLOCK as usize + 5 * k + 3] {
            let data = bytes(len, 3);
            let path = dir.path().join(format!("f{len}"));
            let out = File::create(&path).unwrap();
            let behind = Behind::start(File::open(&path).unwrap());
            // The copy made while the thread behind waits for it, in steps that are not
            // blocks, each written before it is told.
            let mut at = 0;
            while at < len {
                let to = (at + 300_000).min(len);
                out.write_all_at(&data[at..to], at as u64).unwrap();
                behind.copied(to as u64);
                at = to;
                std::thread::sleep(Duration::from_millis(2));
            }
            let (p, _) = behind.finish(len as u64).unwrap();
            match p.root() {
                Some(root) => assert_eq!(root, format!("blake3:{}", blake3::hash(&data).to_hex())),
                None => assert!(len <= k),
            }
        }
    }

    #[test]
    fn a_copy_shorter_than_said_or_dropped_is_no_hash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data = bytes(BLOCK as usize, 1);
        std::fs::write(&path, &data).unwrap();
        // Said to have copied two blocks where the file holds one: no root from the
        // pieces, and hashed again to the length said, an error, not a hash.
        let behind = Behind::start(File::open(&path).unwrap());
        behind.copied(BLOCK);
        let (mut p, _) = behind.finish(2 * BLOCK).unwrap();
        assert!(p.root().is_none());
        let f = File::open(&path).unwrap();
        let e = p.rehash(&f, 2 * BLOCK, []).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
        // Dropped before the copy ended (an error on the way): the thread is told and
        // joined, nothing hangs.
        let behind = Behind::start(File::open(&path).unwrap());
        behind.copied(BLOCK / 2);
        drop(behind);
    }

    #[test]
    fn a_file_cut_under_the_hasher_is_hashed_again_from_the_cut() {
        // The replay may cut the copy while the thread behind reads it (here cut, and in
        // the second round grown part of the way back, before the thread reads): the
        // pieces read short give no root, and hashed again they give the file's own
        // BLAKE3, with no dirty range named for the cut.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let full = 3 * BLOCK as usize;
        let cut = BLOCK as usize + BLOCK as usize / 2 + 100;
        for regrow in [0usize, BLOCK as usize / 2] {
            std::fs::write(&path, bytes(full, 2)).unwrap();
            let behind = Behind::start(File::open(&path).unwrap());
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.set_len(cut as u64).unwrap();
            if regrow > 0 {
                f.write_all_at(&bytes(regrow, 9), cut as u64).unwrap();
            }
            behind.copied(full as u64);
            let (mut p, _) = behind.finish(full as u64).unwrap();
            assert!(p.root().is_none(), "a piece read short gave a root");
            let now = std::fs::read(&path).unwrap();
            assert_eq!(now.len(), cut + regrow);
            p.rehash(&File::open(&path).unwrap(), now.len() as u64, [])
                .unwrap();
            assert_eq!(
                p.root().unwrap(),
                format!("blake3:{}", blake3::hash(&now).to_hex()),
                "regrown by {regrow}"
            );
        }
    }

    #[test]
    fn pieces_read_short_are_hashed_again_though_the_file_grew_back_over_them() {
        // Read while the file was cut, then the file grown back to its old length with
        // other bytes and no dirty range named: only the record of the short reads makes
        // `rehash` read those pieces again (the lengths alone say nothing changed).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let full = 3 * BLOCK as usize;
        let cut = BLOCK as usize + BLOCK as usize / 2 + 100;
        std::fs::write(&path, bytes(full, 2)).unwrap();
        let behind = Behind::start(File::open(&path).unwrap());
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(cut as u64).unwrap();
        behind.copied(full as u64);
        let (mut p, _) = behind.finish(full as u64).unwrap();
        let back = bytes(full - cut, 5);
        f.write_all_at(&back, cut as u64).unwrap();
        let now = std::fs::read(&path).unwrap();
        assert_eq!(now.len(), full);
        let again = p
            .rehash(&File::open(&path).unwrap(), full as u64, [])
            .unwrap();
        assert!(again >= (full - cut) / PIECE as usize, "{again} pieces");
        assert_eq!(
            p.root().unwrap(),
            format!("blake3:{}", blake3::hash(&now).to_hex())
        );
    }

    #[test]
    fn a_rewrite_it_is_not_told_of_changes_the_answer() {
        // What `rehash` relies on: the ranges it is given are every change. A change it is
        // not told of gives a root that is not the new file's (so the WAL path must name
        // every page the replay may write; its tests compare with the file's own hash).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let old = bytes(40 * PIECE as usize, 1);
        let mut p = pieces_of(&old);
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
