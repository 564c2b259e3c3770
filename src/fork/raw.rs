//! The one-image copy of a rollback-journal database as the file's own bytes (see
//! `image.rs`): while the read transaction holds SQLite's SHARED lock no connection
//! can write the database file (a commit needs EXCLUSIVE), so the file's first
//! `page_count * page_size` bytes are exactly the committed state that transaction sees,
//! the same bytes `sqlite3_serialize` would return. (A file of at least
//! `precopy_min_bytes` is copied before the lock instead and made that state under it:
//! `precopy.rs`, which shares this file's lock check, its chunked copy and its end of the
//! read.)
//!
//! They are copied file to file by the kernel (`copy_file_range`, page cache to page
//! cache: no copy through fork's memory and no fresh memory to fault in), in chunks, under
//! the lock; the lock is released as soon as the last chunk is copied, so a committing
//! writer waits at most one kernel copy of the file (about `cp`'s own time). A second
//! thread hashes the copy while it is written, chunk by chunk behind the copier (it reads
//! the copy's finished chunks back from the page cache into one reused buffer), so the
//! hash ends shortly after the copy instead of starting after it. The check then runs on
//! the finished copy (through a memory map) while the hash finishes. A database of one
//! chunk copied without a check (as `fork evaluate` copies, its check running later on a
//! thread of its own) is hashed after the lock goes, by the copying thread (BLAKE3 splits
//! a copy of 1 MiB or more over two threads, as it does any image): there is no copy left
//! for a hasher to run beside.

use super::sqlite::{
    check_copy, io_err, sqlite_err, IntegrityCheck, SnapshotError, SnapshotOptions, SnapshotStats,
};
use rusqlite::Connection;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What the one-image copy's read transaction found: the image's size, and when it started.
pub(super) struct Image {
    pub bytes: u64,
    pub pages: u64,
    pub started: Instant,
    pub locked: Instant,
}

/// What a one-image copy of the file's bytes measured: the lock held, the copy's, the
/// check's and the hash's times.
pub(super) struct FileTimes {
    pub held: Duration,
    pub copy: Duration,
    pub check: Duration,
    pub hash: Duration,
}

impl Image {
    /// The stats of this image copied as the file's bytes (one step, no restarts), by
    /// `method`; the precopy's own fields are added by `precopy.rs`.
    pub(super) fn file_stats(
        &self,
        method: super::sqlite::SnapshotMethod,
        times: FileTimes,
        digest: String,
        integrity_ok: bool,
    ) -> SnapshotStats {
        SnapshotStats {
            bytes: self.bytes,
            pages: self.pages,
            steps: 1,
            restarts: 0,
            busy_retries: 0,
            wal: false,
            method,
            elapsed: self.started.elapsed(),
            copy_elapsed: times.copy,
            check_elapsed: times.check,
            hash_elapsed: times.hash,
            longest_step: times.held,
            digest,
            integrity_ok,
            pieces_hashed_again: None,
            recopied_bytes: None,
            compared_bytes: None,
        }
    }
}

/// The copier's chunk: the hasher starts after the first one, so small enough that it
/// starts at once, large enough that a chunk's system call and hand-over cost nothing next
/// to its copy.
pub(super) const CHUNK: u64 = 4 << 20;

/// The hasher's read buffer, reused for every read (it stays in the CPU's caches).
const HASH_BUF: usize = 1 << 20;

/// Copies `image.bytes` bytes of `src` to `dest` while `source`'s read transaction holds the
/// shared lock, then ends that transaction, checks the copy and returns the statistics.
pub(super) fn copy_raw(
    src: &Path,
    source: Connection,
    dest: &Path,
    image: &Image,
    opts: &SnapshotOptions,
    file: File,
) -> Result<SnapshotStats, SnapshotError> {
    // `file` (opened before SQLite opened the database) is kept open until the read
    // transaction has ended: closing any descriptor of a file drops every POSIX lock the
    // process holds on it, SQLite's SHARED lock included.
    check_locked_file(&file, src, image)?;
    let out = super::sqlite::open_emptied(dest)?;
    let back = File::open(dest).map_err(io_err("open", dest))?;
    let (done_tx, done_rx) = mpsc::channel::<u64>();
    // One chunk and no check: the hasher would only start once the copy is done and have
    // nothing to run beside, so the hash is taken here after the lock goes (a thread's
    // start cost more than it saved on the demo's 380 KB store).
    let behind = image.bytes > CHUNK || opts.check != IntegrityCheck::Skip;
    let (copied, held, copy_elapsed, checked, hash) = std::thread::scope(|s| {
        let back = &back;
        let hasher = behind.then(|| s.spawn(move || hash_behind(back, done_rx, dest, opts.digest)));
        // A closed channel means the hasher failed: its own error is reported.
        let copied = copy_chunks(
            &file,
            &out,
            image.bytes,
            CHUNK,
            |o| {
                // Without a hasher (its receiver dropped unused) the send fails: ignored.
                let _ = done_tx.send(o);
            },
            src,
        )
        .and_then(|n| {
            if n == image.bytes {
                return Ok(());
            }
            Err(SnapshotError::Io {
                action: "copy",
                path: src.to_path_buf(),
                source: io::Error::other(format!(
                    "the file ended at byte {n} of a {}-byte database",
                    image.bytes
                )),
            })
        });
        // The lock goes as soon as the bytes are copied.
        let (ended, held) = end_read(source, file, image, src);
        drop(done_tx);
        let copy_elapsed = image.started.elapsed();
        let copied = copied.and(ended);
        // The check reads the finished copy while the hash finishes.
        let checked = match &copied {
            Ok(()) => {
                let t = Instant::now();
                check_copy(dest, opts.check).map(|ok| (ok, t.elapsed()))
            }
            Err(_) => Ok((false, Duration::ZERO)),
        };
        let hash = match hasher {
            Some(h) => h.join().unwrap_or_else(|_| {
                Err(SnapshotError::Io {
                    action: "hash",
                    path: dest.to_path_buf(),
                    source: io::Error::other("the hashing thread panicked"),
                })
            }),
            None if copied.is_ok() => hash_copy(back, image.bytes, dest, opts.digest),
            // The copy's own error is reported.
            None => Ok((String::new(), 0, Duration::ZERO)),
        };
        (copied, held, copy_elapsed, checked, hash)
    });
    copied?;
    let (integrity_ok, check_elapsed) = checked?;
    let (digest, hashed, hash_elapsed) = hash?;
    if hashed != image.bytes {
        return Err(SnapshotError::Io {
            action: "hash",
            path: dest.to_path_buf(),
            source: io::Error::other(format!(
                "hashed {hashed} bytes of a {}-byte copy",
                image.bytes
            )),
        });
    }
    let times = FileTimes {
        held,
        copy: copy_elapsed,
        check: check_elapsed,
        hash: hash_elapsed,
    };
    Ok(image.file_stats(
        super::sqlite::SnapshotMethod::FileBytes,
        times,
        digest,
        integrity_ok,
    ))
}

/// Under the lock: the file SQLite locked is the one at the path now (a parent does not
/// swap its database file under a live connection; if it did, refuse rather than copy the
/// wrong file), and it holds the whole database.
pub(super) fn check_locked_file(
    file: &File,
    src: &Path,
    image: &Image,
) -> Result<(), SnapshotError> {
    let (ours, at_path) = (
        file.metadata().map_err(io_err("stat", src))?,
        fs::symlink_metadata(src).map_err(io_err("stat", src))?,
    );
    if (ours.dev(), ours.ino()) != (at_path.dev(), at_path.ino()) || ours.len() < image.bytes {
        return Err(SnapshotError::Io {
            action: "copy",
            path: src.to_path_buf(),
            source: io::Error::other(format!(
                "the file changed while it was locked ({} bytes, the database {})",
                ours.len(),
                image.bytes
            )),
        });
    }
    // Bytes 18 and 19 of the header: 1 in rollback-journal mode, 2 in WAL mode. A parent
    // that turned its database to WAL after fork looked (its header, `inspect_source`)
    // has committed state in its `-wal`, which a copy of the file alone would miss. (The
    // guard of `header.rs` has refused such a parent before SQLite's read already: this
    // pread of two bytes costs nothing and keeps the copy's own premise checked.)
    let mut version = [0u8; 2];
    file.read_exact_at(&mut version, 18)
        .map_err(io_err("read", src))?;
    if version != [1, 1] {
        return Err(SnapshotError::LeftRollbackMode {
            path: src.to_path_buf(),
            version,
        });
    }
    Ok(())
}

/// Ends the read transaction (nothing was written), then lets go of the file: the time
/// the lock was held.
pub(super) fn end_read(
    source: Connection,
    file: File,
    image: &Image,
    src: &Path,
) -> (Result<(), SnapshotError>, Duration) {
    let ended = source
        .execute_batch("COMMIT")
        .map_err(sqlite_err("end the read transaction on", src));
    let held = image.locked.elapsed();
    drop(source);
    drop(file);
    (ended, held)
}

/// Copies at most `bytes` bytes of `from` into `to` (each from its descriptor's offset:
/// the start, or where the precopy's growth resumes), `chunk` bytes
/// at a time, telling `progress` how far the copy has come after each chunk; returns how
/// many bytes it copied (fewer only when `from` ended first). `std::io::copy` between two
/// files lets the kernel copy (`copy_file_range`), or reads and writes where the
/// filesystem refuses that.
pub(super) fn copy_chunks(
    from: &File,
    to: &File,
    bytes: u64,
    chunk: u64,
    mut progress: impl FnMut(u64),
    src: &Path,
) -> Result<u64, SnapshotError> {
    let (mut from, mut to) = (from, to);
    let mut off: u64 = 0;
    while off < bytes {
        let want = chunk.min(bytes - off);
        let n =
            io::copy(&mut io::Read::take(&mut from, want), &mut to).map_err(io_err("copy", src))?;
        off += n;
        progress(off);
        if n < want {
            break;
        }
    }
    Ok(off)
}

/// The hasher: reads the copy back up to each offset the copier reports (into one reused
/// buffer, from the page cache), hashing as it goes; returns the hash, how many bytes it
/// hashed, and its time.
fn hash_behind(
    copy: &File,
    done: mpsc::Receiver<u64>,
    dest: &Path,
    digest: super::sqlite::StateDigest,
) -> Result<(String, u64, Duration), SnapshotError> {
    let mut h = digest.hasher();
    let mut buf = vec![0u8; HASH_BUF];
    let mut hashed: u64 = 0;
    let mut busy = Duration::ZERO;
    for upto in done {
        let t = Instant::now();
        while hashed < upto {
            let n = (upto - hashed).min(HASH_BUF as u64) as usize;
            copy.read_exact_at(&mut buf[..n], hashed)
                .map_err(io_err("read", dest))?;
            h.update(&buf[..n]);
            hashed += n as u64;
        }
        busy += t.elapsed();
    }
    Ok((h.finish(), hashed, busy))
}

/// The finished copy's first `bytes` bytes hashed in one pass, on this thread: what
/// [`hash_behind`] returns for a copy made in one chunk.
fn hash_copy(
    copy: &File,
    bytes: u64,
    dest: &Path,
    digest: super::sqlite::StateDigest,
) -> Result<(String, u64, Duration), SnapshotError> {
    let t = Instant::now();
    let hex = digest.of_file(copy, bytes).map_err(io_err("read", dest))?;
    Ok((hex, bytes, t.elapsed()))
}
