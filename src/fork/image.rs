//! The snapshot's one-image copy (see [`super::snapshot`]): a database of at most
//! [`SnapshotOptions::image_max_bytes`] is read whole inside one read transaction, then
//! written, checked and hashed (a rollback-journal database's image, by default, is copied
//! as the file's bytes: `raw.rs`; a live WAL-mode parent's as its database file and `-wal`,
//! replayed into the copy: `walcopy.rs`).

use super::precopy::RawSource;
use super::sqlite::{
    as_reader, check_and_hash, check_beside, check_copy, io_err, open_source, retry_busy,
    sqlite_err, Parent, SnapshotError, SnapshotMethod, SnapshotOptions, SnapshotStats,
};
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

/// The one-image copy, for a database of at most `opts.image_max_bytes`, inside one read
/// transaction (in WAL mode a fixed snapshot that never blocks a writer; in rollback mode
/// the shared lock, held only while the image is read): a live WAL-mode parent's files
/// copied and replayed (`walcopy.rs`), a rollback-journal database's bytes (`raw.rs`; a
/// large one copied before the lock and made the committed state under it: `precopy.rs`), or
/// else every page of the database as that transaction sees it read by SQLite
/// (`sqlite3_serialize`, through the pager: the WAL's frames included) into memory, then
/// written to `dest` and checked there while another thread hashes it. Returns None
/// (nothing done) for an empty database or one above the bound. `parent`: how SQLite reads
/// it (see `parent.rs`; on the rollback path, each read under the guard of `header.rs`).
pub(super) fn copy_image(
    src: &Path,
    parent: Parent,
    dest: &Path,
    opts: &SnapshotOptions,
    started: Instant,
) -> Result<Option<SnapshotStats>, SnapshotError> {
    if opts.image_max_bytes == 0 {
        return Ok(None);
    }
    let wal = parent.wal();
    // Rollback journal: the file the guard opened before SQLite opened it (a file put in
    // its place afterwards is then seen under the lock as another file), and a large one
    // copied with no lock held (`precopy.rs`).
    let raw = match parent.guard() {
        Some(guard) if opts.raw_copy => Some(super::precopy::open_raw(guard, src, opts)?),
        _ => None,
    };
    let source = open_source(src, parent, opts, started)?;
    let mut raw = match (raw, parent.guard()) {
        (Some(RawSource::Large(file)), Some(guard)) => Some(RawSource::Precopied(Box::new(
            super::precopy::precopy(file, &source, guard, src, dest, opts, started)?,
        ))),
        (other, _) => other,
    };
    // WAL mode, a live parent: the files under the read transaction (`walcopy.rs`),
    // attempt after attempt while the WAL restarts under the copy.
    let live_db = match parent {
        Parent::Live { locked, .. } if opts.wal_file_copy => Some(locked),
        _ => None,
    };
    let mut file_attempts = if live_db.is_some() {
        super::walcopy::MAX_ATTEMPTS
    } else {
        0
    };
    let mut restarts = 0;
    loop {
        source
            .execute_batch("BEGIN DEFERRED")
            .map_err(sqlite_err("begin a read transaction on", src))?;
        // The first read takes the read lock; everything below reads one state of the file.
        let (pages, page_size) = as_reader(src, opts, || {
            retry_busy(src, opts, started, "read", parent.guard(), || {
                source.query_row("SELECT count(*) FROM sqlite_schema", [], |r| {
                    r.get::<_, i64>(0)
                })?;
                let pages: i64 = source.query_row("PRAGMA page_count", [], |r| r.get(0))?;
                let size: i64 = source.query_row("PRAGMA page_size", [], |r| r.get(0))?;
                Ok((pages, size))
            })
        })?;
        let locked = Instant::now();
        let bytes = u64::try_from(pages.saturating_mul(page_size)).unwrap_or(0);
        if bytes == 0 || bytes > opts.image_max_bytes {
            let _ = source.execute_batch("COMMIT");
            if let Some(RawSource::Precopied(p)) = raw.take() {
                p.discard(dest)?;
            }
            return Ok(None);
        }
        let image = super::raw::Image {
            bytes,
            pages: pages as u64,
            started,
            locked,
        };
        if let Some(r) = raw.take() {
            return match r {
                RawSource::Precopied(p) => {
                    super::precopy::copy_precopied(src, source, dest, &image, opts, *p)
                }
                RawSource::Plain(file) | RawSource::Large(file) => {
                    super::raw::copy_raw(src, source, dest, &image, opts, file)
                }
            }
            .map(Some);
        }
        if let (true, Some(live_db)) = (file_attempts > 0, live_db) {
            file_attempts -= 1;
            let max_wal = (bytes / 2).max(super::walcopy::WAL_ALWAYS);
            let attempt = super::walcopy::copy_files(src, live_db, dest, max_wal, opts)?;
            let (held, behind) = match attempt {
                super::walcopy::Attempt::Copied(held, behind) => (held, behind),
                super::walcopy::Attempt::Restarted(held) => {
                    source
                        .execute_batch("COMMIT")
                        .map_err(sqlite_err("end the read transaction on", src))?;
                    drop(held);
                    restarts += 1;
                    tracing::debug!("{}: the WAL restarted under the copy", src.display());
                    continue;
                }
                super::walcopy::Attempt::TooLarge(held) => {
                    tracing::debug!("{}: -wal above the bound, serialized", src.display());
                    let r = serialize(src, source, dest, wal, opts, &image, restarts);
                    drop(held);
                    return r.map(Some);
                }
            };
            source
                .execute_batch("COMMIT")
                .map_err(sqlite_err("end the read transaction on", src))?;
            let held_for = locked.elapsed();
            drop(source);
            drop(held);
            // The thread behind the copy hashes on while this one replays the copied WAL
            // and then checks the copy: the replay rewrites only pages its frames name
            // (read from the copied `-wal` before the replay removes it), whose pieces are
            // hashed again after it, as is every piece from the first one the thread
            // behind read while the replay had cut the file (`pieces.rs`). Dropped
            // unfinished (an error, or a `-wal` that is not one), the thread behind stops.
            let behind = match behind {
                Some((b, len)) => {
                    b.ended(len);
                    super::walcopy::frame_pages(dest)?.map(|dirty| (b, len, dirty))
                }
                None => None,
            };
            let replayed = super::walcopy::replay(dest);
            #[cfg(test)]
            if let Some(g) = super::pieces::tests::BEHIND_GATE.with(|g| g.borrow_mut().take()) {
                g.open();
            }
            let (pages, bytes) = replayed?;
            let copy_elapsed = started.elapsed();
            let mut again = None;
            let (integrity_ok, check_elapsed, digest, hash_elapsed) = match behind {
                Some((b, len, dirty)) => {
                    // The check on this thread; on another, the hash finished beside the
                    // thread behind, then the pieces the replay rewrote hashed again.
                    // Its time: what the hashing threads were busy, not their waits.
                    let mut busy = Duration::ZERO;
                    let (ok, checked, digest, _) = check_beside(dest, opts.check, || {
                        let (pieces, behind) = b.finish(len)?;
                        let t = Instant::now();
                        let (digest, n) = pieces.root_after(dest, bytes, dirty)?;
                        busy = behind + t.elapsed();
                        again = Some(n);
                        Ok(digest)
                    })?;
                    (ok, checked, digest, busy)
                }
                None => check_and_hash(dest, opts.check, opts.digest)?,
            };
            return Ok(Some(SnapshotStats {
                bytes,
                pages,
                steps: 1,
                restarts,
                busy_retries: 0,
                wal,
                method: SnapshotMethod::WalFiles,
                elapsed: started.elapsed(),
                copy_elapsed,
                check_elapsed,
                hash_elapsed,
                longest_step: held_for,
                digest,
                integrity_ok,
                pieces_hashed_again: again,
                recopied_bytes: None,
                compared_bytes: None,
            }));
        }
        if restarts > 0 {
            tracing::debug!(
                "{}: the WAL restarted under {restarts} file copies, serialized",
                src.display()
            );
        }
        return serialize(src, source, dest, wal, opts, &image, restarts).map(Some);
    }
}

/// The image through SQLite's pager (`sqlite3_serialize`) inside `source`'s held read
/// transaction, which it ends; then written, checked and hashed. `restarts`: file copies
/// discarded before (WAL mode).
fn serialize(
    src: &Path,
    source: rusqlite::Connection,
    dest: &Path,
    wal: bool,
    opts: &SnapshotOptions,
    found: &super::raw::Image,
    restarts: u32,
) -> Result<SnapshotStats, SnapshotError> {
    let (bytes, started) = (found.bytes, found.started);
    let image = source
        .serialize(rusqlite::MAIN_DB)
        .map_err(sqlite_err("copy pages from", src))?;
    source
        .execute_batch("COMMIT")
        .map_err(sqlite_err("end the read transaction on", src))?;
    let held = found.locked.elapsed();
    if image.len() as u64 != bytes {
        return Err(SnapshotError::Io {
            action: "copy",
            path: src.to_path_buf(),
            source: io::Error::other(format!(
                "SQLite read {} bytes of a {bytes}-byte database",
                image.len()
            )),
        });
    }
    let copy_elapsed = started.elapsed();
    let image: &[u8] = &image;
    let (written, hash) = std::thread::scope(|s| {
        let hasher = s.spawn(|| {
            let t = Instant::now();
            (opts.digest.of_bytes(image), t.elapsed())
        });
        let written = write_image(dest, image).and_then(|()| {
            let t = Instant::now();
            Ok((check_copy(dest, opts.check)?, t.elapsed()))
        });
        let hash = hasher
            .join()
            .unwrap_or_else(|_| (String::new(), Duration::ZERO));
        (written, hash)
    });
    let (integrity_ok, check_elapsed) = written?;
    if hash.0.is_empty() {
        return Err(SnapshotError::Io {
            action: "hash",
            path: dest.to_path_buf(),
            source: io::Error::other("the hashing thread panicked"),
        });
    }
    Ok(SnapshotStats {
        bytes,
        pages: found.pages,
        steps: 1,
        restarts,
        busy_retries: 0,
        wal,
        method: SnapshotMethod::Serialize,
        elapsed: started.elapsed(),
        copy_elapsed,
        check_elapsed,
        hash_elapsed: hash.1,
        longest_step: held,
        digest: hash.0,
        integrity_ok,
        pieces_hashed_again: None,
        recopied_bytes: None,
        compared_bytes: None,
    })
}

/// Writes the image into the (empty) destination file.
fn write_image(dest: &Path, image: &[u8]) -> Result<(), SnapshotError> {
    use std::io::Write;
    let mut f = super::sqlite::open_emptied(dest)?;
    f.write_all(image).map_err(io_err("write", dest))
}
