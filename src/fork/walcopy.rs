//! WAL mode's one-image copy as files (see [`super::snapshot`]): the database file and its
//! `-wal` copied by the kernel while a read transaction on the parent is held, then the
//! copied WAL replayed into the copy by SQLite's own recovery.
//!
//! The steps:
//!
//! 1. On the source connection (read-only, as [`super::parent`] opens it) a read
//!    transaction is begun and read: SQLite takes a read lock in the wal-index, read-lock
//!    0 when the WAL was wholly backfilled into the database file (the reader then reads
//!    the file alone), otherwise a read-lock `i >= 1` whose read mark `M` is at most the
//!    transaction's last frame `S` (a `readonly_shm` reader cannot write a mark: it picks
//!    the existing mark nearest below `S`, possibly 0).
//! 2. While it is held, the database file is opened (it must be the file fork locked
//!    before SQLite opened the path, `parent.rs`: a file renamed over it since is
//!    refused) and copied by the kernel (`copy_file_range`) to
//!    the copy, then the `-wal` to the copy's `-wal` (in fork's staging, never next to the
//!    parent's database), each as far as it reached when fork opened it (after the
//!    transaction began), and the live `-wal`'s 32-byte header is read again.
//! 3. The read transaction ends (a WAL writer was never blocked by it).
//! 4. The copy is opened read-write: SQLite's recovery rebuilds a wal-index from the copied
//!    `-wal`, accepting frames while their salts match the header and their cumulative
//!    checksums hold, up to the last commit frame `C` among them;
//!    `PRAGMA wal_checkpoint(TRUNCATE)` writes each page's latest frame up to `C` into the
//!    copy, and the copy's last connection closing removes its `-wal` and `-shm`. The copy
//!    is cut to its page count (a file longer than its pages keeps no stale tail).
//!
//! Why the result is the committed state at `C` (SQLite's WAL rules, as `wal.c` documents
//! and enforces them):
//!
//! * **A read-lock `i >= 1` held (mark `M <= S`)**: a checkpoint backfills only frames up
//!   to the smallest mark of a held read-lock, so at most up to `M`; a WAL restart (a
//!   writer starting the WAL over, or a RESTART / TRUNCATE checkpoint) needs every
//!   read-lock `1..N` exclusively, so it cannot happen: the frames `1..S` stay in the
//!   `-wal`, unchanged (committed frames are never rewritten in place; a writer only
//!   appends after the last commit, and rewrites frames of its own uncommitted
//!   transaction). Frames `1..S` were whole before the transaction began, so the copied
//!   `-wal` holds them all and its valid chain ends at a commit `C >= S >= M` (a frame being
//!   appended during the copy may be torn: its checksum stops the chain there, as after a
//!   crash). The database file may be changed during its copy only by a checkpoint writing
//!   frames `<= M` (or cutting the file to the page count of the state at such a frame):
//!   every page it may have written, even half-copied, has a frame `<= M <= C`, so the
//!   replay overwrites it with its latest version up to `C`; a page with no frame up to `C`
//!   was written by no checkpoint since the WAL began, so the file's bytes are its version
//!   at `C`; a page beyond the copied file's end is in the state at `C` only by a frame.
//!   The copy thus holds each page as of `C`: one committed state, at or after the read
//!   transaction's.
//! * **Read-lock 0 held** (the WAL wholly backfilled when the transaction began, or empty):
//!   a checkpoint needs read-lock 0 exclusively to write into the database file, so the
//!   file does not change during the copy: it is the state `S`. A WAL that keeps its
//!   generation holds frames `1..S` (all backfilled: replaying them rewrites what the file
//!   holds) and any commits appended after `S`, which a writer built on the state `S`:
//!   replayed up to `C` they give the state at `C`. But a WAL restart *is* possible: a
//!   writer starting the WAL over, or a TRUNCATE checkpoint cutting it to 0 bytes, during
//!   the copy. The copied `-wal` could then hold the old header and only a prefix of the
//!   old frames (the file cut under the copy, or overtaken by the new frames), and
//!   replaying an old prefix over a file that holds later versions would mix states. A
//!   restart always rewrites the header (new salts; the first salt counts up, so two
//!   restarts never give the same header; the header is written before the generation's
//!   first frame): so step 2 compares the live header, read after the copy, with the
//!   copied one. Equal, no new frame was written over the copied generation during the copy
//!   and the copied chain is whole; different (or the live `-wal` now shorter than a
//!   header), the attempt is discarded and made again in a new read transaction (after a
//!   few, the snapshot reads the image through SQLite's pager instead). A copied header
//!   of the *new* generation followed by old frames stops at the first old frame (its
//!   salts differ): the new frames up to there are commits built on `S`. A copied `-wal`
//!   shorter than a header replays nothing: the file alone, which is `S`.
//! * **SQLite's "unreliable shm" read** (`readonly_shm` with no parent connection holding
//!   the wal-index: SQLite rebuilds one in its own memory from the `-wal`): the reader
//!   holds read-lock 0 (a real lock on the parent's `-shm`), so no checkpoint writes the
//!   database file; a restart can only follow a complete backfill, which that lock
//!   prevents while frames remain, so the frames stay; the header check covers the rest.
//!
//! The descriptors fork opens on the parent's files stay open until the read transaction
//! has ended and the source connection is closed: closing any descriptor of a file drops
//! every POSIX lock the process holds on it (SQLite's own included).

use super::owner::{open_as, ReadAs};
use super::parent::ParentDb;
use super::pieces::Behind;
use super::sqlite::{io_err, sqlite_err, SnapshotError, SnapshotOptions, StateDigest};
use rusqlite::{Connection, OpenFlags};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// The WAL file's header: magic, format, page size, checkpoint sequence, salts, checksum.
const WAL_HEADER: usize = 32;

/// The `-wal` is copied in chunks of this size (the kernel copies each).
const WAL_CHUNK: u64 = 1 << 20;

#[cfg(test)]
thread_local! {
    /// Tests: run once between two chunks of the `-wal`'s copy (on the snapshot's thread).
    pub(super) static AFTER_A_WAL_CHUNK: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::RefCell::new(None) };
}

/// Attempts discarded because the WAL restarted under the copy, before the snapshot reads
/// the image through SQLite's pager instead.
pub(super) const MAX_ATTEMPTS: u32 = 3;

/// What one attempt under a held read transaction gave.
pub(super) enum Attempt {
    /// Both files copied; the descriptors to close once the read transaction has ended,
    /// and (BLAKE3) the database file's copy being hashed piece by piece, with its length
    /// (finished by the caller after the read transaction).
    Copied(Held, Option<(Behind, u64)>),
    /// The WAL was restarted or cut during the copy: the copy was discarded.
    Restarted(Held),
    /// The `-wal` is larger than the bound: copy the image through the pager instead.
    TooLarge(Held),
}

/// The parent's files, open until the read transaction has ended (see the module docs).
pub(super) struct Held {
    _db: File,
    _wal: Option<File>,
}

fn open_parent(path: &Path, read_as: Option<&ReadAs>) -> io::Result<File> {
    open_as(read_as, || super::parent::open_no_links(path))
}

/// Removes the copy's side files (a previous attempt's, or SQLite's after the replay).
fn remove_sides(dest: &Path) -> Result<(), SnapshotError> {
    for suffix in ["-wal", "-shm"] {
        let p = super::parent::side(dest, suffix);
        match fs::remove_file(&p) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(io_err("remove", &p)(e));
            }
            _ => {}
        }
    }
    Ok(())
}

/// A `-wal` of at most this size is always copied: SQLite's default automatic checkpoint
/// (1000 pages) keeps a WAL near 4 MiB.
pub(super) const WAL_ALWAYS: u64 = 4 << 20;

/// Step 2, under the caller's held read transaction on the live database `src`: copies
/// the database file into the (existing) `dest`, then `src-wal` into `dest-wal`, unless the
/// `-wal` is larger than `max_wal` bytes (the caller passes half the database's image, at
/// least [`WAL_ALWAYS`]: measured with `benches/snapshot.rs`, a 100 MiB database's copy and
/// replay took about as long as `sqlite3_serialize` with a 54 MiB `-wal` and grew past it,
/// while with a 4 MiB one they took 1.2-1.3x `cp` against `sqlite3_serialize`'s 1.4-1.6x).
pub(super) fn copy_files(
    src: &Path,
    locked: &ParentDb,
    dest: &Path,
    max_wal: u64,
    opts: &SnapshotOptions,
) -> Result<Attempt, SnapshotError> {
    let (digest, read_as) = (opts.digest, opts.read_as.as_ref());
    let wal_path = super::parent::side(src, "-wal");
    let dest_wal = super::parent::side(dest, "-wal");
    remove_sides(dest)?;
    let db = open_parent(src, read_as).map_err(io_err("open", src))?;
    // The file opened here is the one fork locked before SQLite opened the path, whose
    // state the read transaction holds; a file put at the path since (with whatever
    // `-wal` is beside it) is refused rather than copied.
    if !locked.is(&db).map_err(io_err("stat", src))? {
        return Err(SnapshotError::Replaced {
            path: src.to_path_buf(),
        });
    }
    let ours = db.metadata().map_err(io_err("stat", src))?;
    let wal = match open_parent(&wal_path, read_as) {
        Ok(f) => f,
        // The parent's connections keep their `-wal`: gone, something else removed it.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Attempt::Restarted(Held {
                _db: db,
                _wal: None,
            }))
        }
        Err(e) => return Err(io_err("open", &wal_path)(e)),
    };
    let wal_len = wal.metadata().map_err(io_err("stat", &wal_path))?.len();
    if wal_len > max_wal {
        return Ok(Attempt::TooLarge(Held {
            _db: db,
            _wal: Some(wal),
        }));
    }
    let out = super::sqlite::open_emptied(dest)?;
    // `io::copy` between two files lets the kernel copy (`copy_file_range`). Each file is
    // copied as far as it reached when it was opened, after the read transaction began:
    // the WAL's frames up to that transaction's last are in that much, and whatever a
    // checkpoint writes into the database file beyond it comes from those frames.
    let pieces = copy_db(&db, &out, ours.len(), src, dest, digest)?;
    let mut wal_out = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&dest_wal)
        .map_err(io_err("create", &dest_wal))?;
    let mut wal_bytes = 0;
    while wal_bytes < wal_len {
        let want = WAL_CHUNK.min(wal_len - wal_bytes);
        let n = io::copy(&mut io::Read::take(&wal, want), &mut wal_out)
            .map_err(io_err("copy", &wal_path))?;
        wal_bytes += n;
        if n < want {
            // Cut under the copy: the header check below sees it.
            break;
        }
        #[cfg(test)]
        if let Some(hook) = AFTER_A_WAL_CHUNK.with(|h| h.borrow_mut().take()) {
            hook();
        }
    }
    drop(wal_out);
    if wal_bytes >= WAL_HEADER as u64 {
        let (mut copied, mut live) = ([0u8; WAL_HEADER], [0u8; WAL_HEADER]);
        File::open(&dest_wal)
            .and_then(|f| f.read_exact_at(&mut copied, 0))
            .map_err(io_err("read", &dest_wal))?;
        let same = match wal.read_exact_at(&mut live, 0) {
            Ok(()) => live == copied,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => false,
            Err(e) => return Err(io_err("read", &wal_path)(e)),
        };
        if !same {
            remove_sides(dest)?;
            return Ok(Attempt::Restarted(Held {
                _db: db,
                _wal: Some(wal),
            }));
        }
    }
    Ok(Attempt::Copied(
        Held {
            _db: db,
            _wal: Some(wal),
        },
        pieces,
    ))
}

/// The database file's copy goes this far before the hasher behind it is told.
const DB_CHUNK: u64 = 2 << 20;

/// Copies the database file `db` into `out` (as far as `len`, or its end if a checkpoint
/// cut it shorter meanwhile), chunk by chunk by the kernel. With BLAKE3 a second thread
/// reads back each finished chunk and hashes it piece by piece (`pieces.rs`), so that
/// once the WAL is replayed only the pieces the replay rewrote are hashed again; returns
/// that hashing, under way, and the bytes copied. The caller finishes it once the read
/// transaction has ended and the WAL is replayed (see `image.rs`).
fn copy_db(
    db: &File,
    out: &File,
    len: u64,
    src: &Path,
    dest: &Path,
    digest: StateDigest,
) -> Result<Option<(Behind, u64)>, SnapshotError> {
    if digest != StateDigest::Blake3 {
        super::raw::copy_chunks(db, out, len, DB_CHUNK, |_| {}, src)?;
        return Ok(None);
    }
    let behind = Behind::start(File::open(dest).map_err(io_err("open", dest))?);
    let copied = super::raw::copy_chunks(db, out, len, DB_CHUNK, |o| behind.copied(o), src)?;
    Ok(Some((behind, copied)))
}

/// The byte ranges of the database file that the replay of the copied `dest-wal` may
/// write: every page any frame of it names, whether or not the frame is valid (SQLite's
/// recovery writes only pages of frames in its checksummed chain, a subset). None when
/// the `-wal`'s header is not a WAL header: then the copy is hashed whole after the
/// replay. Read before the replay, whose last close removes the `-wal`.
pub(super) fn frame_pages(dest: &Path) -> Result<Option<Vec<(u64, u64)>>, SnapshotError> {
    use std::io::{BufReader, Read};
    let path = super::parent::side(dest, "-wal");
    let f = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Some(Vec::new())),
        Err(e) => return Err(io_err("open", &path)(e)),
    };
    let len = f.metadata().map_err(io_err("stat", &path))?.len();
    let mut r = BufReader::with_capacity(1 << 20, f);
    let mut header = [0u8; WAL_HEADER];
    match r.read_exact(&mut header) {
        Ok(()) => {}
        // Shorter than a header: SQLite replays nothing.
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(Some(Vec::new())),
        Err(e) => return Err(io_err("read", &path)(e)),
    }
    let magic = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    let page = u64::from(u32::from_be_bytes([
        header[8], header[9], header[10], header[11],
    ]));
    if !matches!(magic, 0x377f_0682 | 0x377f_0683)
        || !page.is_power_of_two()
        || !(512..=65536).contains(&page)
    {
        return Ok(None);
    }
    let frame = 24 + page;
    let mut ranges = Vec::new();
    let mut at = WAL_HEADER as u64;
    while at + 24 <= len {
        let mut number = [0u8; 4];
        r.read_exact(&mut number).map_err(io_err("read", &path))?;
        let n = u64::from(u32::from_be_bytes(number));
        if n > 0 {
            ranges.push(((n - 1) * page, n * page));
        }
        at += frame;
        if at + 24 <= len {
            r.seek_relative(frame as i64 - 4)
                .map_err(io_err("read", &path))?;
        }
    }
    Ok(Some(ranges))
}

/// Step 4: SQLite's recovery replays the copied `-wal` into `dest`, which then holds the
/// whole state alone (no side file left). Returns the copy's pages and bytes.
pub(super) fn replay(dest: &Path) -> Result<(u64, u64), SnapshotError> {
    let conn = Connection::open_with_flags(
        dest,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_NOFOLLOW
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sqlite_err("open", dest))?;
    // A private copy: no fsync while the frames are written into it.
    conn.execute_batch("PRAGMA synchronous = OFF")
        .map_err(sqlite_err("configure", dest))?;
    let (busy, log, done): (i64, i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .map_err(sqlite_err("replay the copied WAL into", dest))?;
    if busy != 0 || log != done {
        return Err(SnapshotError::Io {
            action: "replay the copied WAL into",
            path: dest.to_path_buf(),
            source: io::Error::other(format!(
                "the checkpoint wrote {done} of {log} frames (busy {busy})"
            )),
        });
    }
    let pages: i64 = conn
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .map_err(sqlite_err("read", dest))?;
    let size: i64 = conn
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .map_err(sqlite_err("read", dest))?;
    conn.close()
        .map_err(|(_, e)| sqlite_err("close", dest)(e))?;
    // The last connection's close removed `-wal` and `-shm`; make sure nothing is left.
    remove_sides(dest)?;
    let bytes = u64::try_from(pages.saturating_mul(size)).unwrap_or(0);
    let f = fs::OpenOptions::new()
        .write(true)
        .open(dest)
        .map_err(io_err("open", dest))?;
    let len = f.metadata().map_err(io_err("stat", dest))?.len();
    if len < bytes {
        return Err(SnapshotError::Io {
            action: "replay the copied WAL into",
            path: dest.to_path_buf(),
            source: io::Error::other(format!(
                "the copy holds {len} bytes of a {bytes}-byte database"
            )),
        });
    }
    if len > bytes {
        f.set_len(bytes).map_err(io_err("truncate", dest))?;
    }
    Ok((pages as u64, bytes))
}
