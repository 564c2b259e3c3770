//! The one-image copy of a rollback-journal database as the file's own bytes (see
//! `image.rs`): while the read transaction holds SQLite's SHARED lock no connection
//! can write the database file (a commit needs EXCLUSIVE), so the file's first
//! `page_count * page_size` bytes are exactly the committed state that transaction sees,
//! the same bytes `sqlite3_serialize` would return. They are read in chunks; each chunk
//! goes at once to a thread that hashes it and to one that writes it to the copy, so the
//! hash is taken while the bytes are read and the lock is held only as long as the read.
//! The check then runs on the written copy while the hash finishes.

use super::sqlite::{check_copy, sqlite_err, SnapshotError, SnapshotOptions, SnapshotStats};
use rusqlite::Connection;
use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the one-image copy's read transaction found: the image's size, and when it started.
pub(super) struct Image {
    pub bytes: u64,
    pub pages: u64,
    pub started: Instant,
    pub locked: Instant,
}

/// The pipeline's chunk: large enough that a chunk's hand-over costs nothing next to its
/// hashing, small enough that the hash and the write start at once.
const CHUNK: u64 = 4 << 20;

fn io_err<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> SnapshotError + 'a {
    move |source| SnapshotError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Copies `image.bytes` bytes of `src` to `dest` while `source`'s read transaction holds the
/// shared lock, then ends that transaction, checks the copy and returns the statistics.
pub(super) fn copy_raw(
    src: &Path,
    source: Connection,
    dest: &Path,
    image: &Image,
    opts: &SnapshotOptions,
) -> Result<SnapshotStats, SnapshotError> {
    // Kept open until the read transaction has ended: closing any descriptor of a file
    // drops every POSIX lock the process holds on it, SQLite's SHARED lock included.
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(src)
        .map_err(io_err("open", src))?;
    // The file SQLite locked is the one at the path now (a parent does not swap its
    // database file under a live connection; if it did, refuse rather than copy the
    // wrong file).
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
    // The first chunk (a small database's whole image) is read before any thread is
    // started, so that starting them never lengthens the time the lock is held.
    let first = read_chunk(&file, 0, CHUNK.min(image.bytes), src)?;
    let (mut held_open, mut ended) = (Some((source, file)), None);
    if image.bytes <= CHUNK {
        ended = held_open.take().map(|(c, f)| end_read(c, f, image, src));
    }
    let (hash_tx, hash_rx) = mpsc::channel::<Arc<Vec<u8>>>();
    let (write_tx, write_rx) = mpsc::channel::<Arc<Vec<u8>>>();
    let (read, held, written, copy_elapsed, checked, hash) = std::thread::scope(|s| {
        let hasher = s.spawn(move || {
            let t = Instant::now();
            let mut h = Sha256::new();
            for chunk in hash_rx {
                h.update(&chunk[..]);
            }
            (format!("sha256:{}", hex::encode(h.finalize())), t.elapsed())
        });
        let writer = s.spawn(move || -> Result<(), SnapshotError> {
            let mut out = fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(dest)
                .map_err(io_err("open", dest))?;
            for chunk in write_rx {
                out.write_all(&chunk).map_err(io_err("write", dest))?;
            }
            Ok(())
        });
        let first = Arc::new(first);
        // A closed channel means that thread failed: its own error is reported.
        let _ = hash_tx.send(first.clone());
        let _ = write_tx.send(first);
        let read = match held_open.take() {
            Some((source, file)) => {
                let read = read_rest(&file, image.bytes, src, &hash_tx, &write_tx);
                ended = Some(end_read(source, file, image, src));
                read
            }
            None => Ok(()),
        };
        drop((hash_tx, write_tx));
        let (ended, held) = ended.unwrap_or((Ok(()), Duration::ZERO));
        let written = writer.join().unwrap_or_else(|_| {
            Err(SnapshotError::Io {
                action: "write",
                path: dest.to_path_buf(),
                source: io::Error::other("the writing thread panicked"),
            })
        });
        let copy_elapsed = image.started.elapsed();
        let read = read.and(ended);
        // The check reads the finished copy while the hash finishes.
        let checked = match (&read, &written) {
            (Ok(()), Ok(())) => {
                let t = Instant::now();
                check_copy(dest, opts.check).map(|ok| (ok, t.elapsed()))
            }
            _ => Ok((false, Duration::ZERO)),
        };
        let hash = hasher.join().ok();
        (read, held, written, copy_elapsed, checked, hash)
    });
    read?;
    written?;
    let (integrity_ok, check_elapsed) = checked?;
    let Some((sha256, hash_elapsed)) = hash else {
        return Err(SnapshotError::Io {
            action: "hash",
            path: dest.to_path_buf(),
            source: io::Error::other("the hashing thread panicked"),
        });
    };
    Ok(SnapshotStats {
        bytes: image.bytes,
        pages: image.pages,
        steps: 1,
        restarts: 0,
        busy_retries: 0,
        wal: false,
        elapsed: image.started.elapsed(),
        copy_elapsed,
        check_elapsed,
        hash_elapsed,
        longest_step: held,
        sha256,
        integrity_ok,
    })
}

/// Ends the read transaction (nothing was written), then lets go of the file: the time
/// the lock was held.
fn end_read(
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

/// `len` bytes of `file` at `off`.
fn read_chunk(file: &File, off: u64, len: u64, src: &Path) -> Result<Vec<u8>, SnapshotError> {
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, off)
        .map_err(io_err("read", src))?;
    Ok(buf)
}

/// Reads the bytes of `file` after the first chunk up to `bytes`, chunk by chunk, handing
/// each to both threads.
fn read_rest(
    file: &File,
    bytes: u64,
    src: &Path,
    hash_tx: &mpsc::Sender<Arc<Vec<u8>>>,
    write_tx: &mpsc::Sender<Arc<Vec<u8>>>,
) -> Result<(), SnapshotError> {
    let mut off = CHUNK;
    while off < bytes {
        let n = CHUNK.min(bytes - off);
        let chunk = Arc::new(read_chunk(file, off, n, src)?);
        let _ = hash_tx.send(chunk.clone());
        let _ = write_tx.send(chunk);
        off += n;
    }
    Ok(())
}
