//! The state snapshot: a consistent copy of a live SQLite database, taken with SQLite's
//! online backup API while the parent keeps running and writing.
//!
//! How the parent's writers are kept moving depends on the source's journal mode, read
//! from the database header:
//!
//! * **WAL** (`journal_mode=wal`, header bytes 18/19 = 2): the snapshot opens one read
//!   transaction on the source and copies every page inside it. In WAL mode a reader never
//!   blocks a writer, so the parent's writers are not blocked at all; the copy is exactly
//!   the database as of the moment that read transaction started; and the backup never
//!   restarts (SQLite only restarts a backup when the source changes under it, which a
//!   held read snapshot prevents). The only cost to the parent is that checkpoints cannot
//!   move past the snapshot until the copy ends, so its WAL file may grow meanwhile.
//! * **Rollback journal** (delete, truncate, persist, memory): a reader's shared lock
//!   blocks commits, so the copy goes `pages_per_step` pages at a time and sleeps `pause`
//!   between steps, never holding the lock longer than one step. When the parent commits
//!   between two steps SQLite restarts the backup from page 1; each restart doubles the
//!   step (when `grow_on_restart`), so the copy converges even against a writer that never
//!   stops: after at most log2(pages / pages_per_step) restarts one step covers the whole
//!   database (and then holds the lock for that one step: a writer that commits all the
//!   time may wait about one full copy, ~100 ms for 100 MiB; WAL mode avoids this). More
//!   than `max_restarts` restarts is an error.
//!
//! A database of at most [`SnapshotOptions::image_max_bytes`] (128 MiB by default) is not
//! copied step by step but as one image, in one read transaction, so it never restarts:
//!
//! * WAL, a live parent ([`SnapshotOptions::wal_file_copy`], the default): while that read
//!   transaction is held the kernel copies the database file and then its `-wal` into
//!   fork's staging (`copy_file_range`); the transaction ends, and SQLite's own recovery
//!   replays the copied WAL into the copy (`PRAGMA wal_checkpoint(TRUNCATE)` on the copy),
//!   which then holds one committed state at or after the transaction's (`walcopy.rs`
//!   gives the argument, read-lock by read-lock; a WAL restarted or cut under the copy is
//!   seen by its header and the attempt made again). The check and the hash then run on
//!   the copy side by side.
//! * WAL otherwise (a parent copied into staging first, a `-wal` larger than half the
//!   image and than 4 MiB, a WAL restarted under three attempts, or `wal_file_copy` off):
//!   in the same fixed snapshot SQLite reads every page as that transaction sees it into
//!   memory (`sqlite3_serialize`, through the pager, so the WAL's frames are included);
//!   the image is then written to the copy and checked there while another thread hashes
//!   it.
//! * Rollback journal ([`SnapshotOptions::raw_copy`], the default): under the shared lock
//!   the read transaction holds (no commit can pass it) the file's own bytes are the
//!   committed state; the kernel copies them file to file (`copy_file_range`) and the lock
//!   is released at once, so a committing writer waits at most that copy (about `cp`'s
//!   time; for a large file, see the end of this item). A second thread hashes the copy while it is written, and the check runs on the
//!   finished copy while the hash finishes (one chunk copied without a check is hashed
//!   once the lock is gone instead: `raw.rs`). A file of at least
//!   [`SnapshotOptions::precopy_min_bytes`] is copied first with no lock held, and under
//!   the lock the copy is compared with the live file and what differs copied again, so
//!   that a writer waits one reading of the files instead of one copy (`precopy.rs`).
//!
//! The check reads the copy through a memory map (`mmap_size`), which reads each page in
//! place rather than through a read() into SQLite's cache.
//!
//! The source is opened read-only, and nothing is ever created or removed next to it, in
//! any journal mode: a WAL-mode source is read as [`super::parent`] describes, and every
//! read of a rollback-journal source runs under fork's own SHARED lock, once the header
//! read through it still says rollback-journal mode (`header.rs`: SQLite reading a
//! database that turned to WAL would create its `-wal` and `-shm`). After the copy, `PRAGMA integrity_check` (or
//! `quick_check`) runs on the copy and must answer `ok`, and the copy's digest is taken
//! (BLAKE3 by default: `digest.rs`).

use super::owner::{open_as, ReadAs};
use rusqlite::backup::{Backup, StepResult};
use rusqlite::{Connection, OpenFlags};
use std::fs;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use super::sqlite::{as_reader, check_and_hash, open_source, retry_busy, sqlite_err, Parent};
pub use super::sqlite::{
    check_copy, IntegrityCheck, SnapshotError, SnapshotMethod, SnapshotOptions, SnapshotStats,
    StateDigest, IMAGE_MAX_BYTES, PRECOPY_MIN_BYTES, SQLITE_MAGIC,
};

/// The piece a BLAKE3-named copy is hashed in when its pieces can be hashed again alone
/// (what [`SnapshotStats::pieces_hashed_again`] counts).
pub const PIECE_BYTES: u64 = super::pieces::PIECE;

/// Opens `src` the way every later open of the store is made (no link in any component:
/// `openat2(RESOLVE_NO_SYMLINKS)`; non-blocking, so that a FIFO put there never holds the
/// snapshot; as `read_as` says), checks on that descriptor that it is a regular file and an
/// SQLite database, and tells whether its header says WAL mode. A zero-length file is an
/// empty database for SQLite and is accepted. The descriptor is the one the snapshot then
/// locks (WAL mode) or guards (rollback-journal mode), so the file looked at is the file
/// read.
fn inspect_source(src: &Path, read_as: Option<&ReadAs>) -> Result<(fs::File, bool), SnapshotError> {
    let path = || src.to_path_buf();
    let file = open_as(read_as, || super::parent::open_no_links(src)).map_err(|source| {
        if source.kind() == io::ErrorKind::NotFound {
            SnapshotError::Missing { path: path() }
        } else if source.raw_os_error() == Some(libc::ELOOP) {
            SnapshotError::Linked { path: path() }
        } else {
            SnapshotError::Io {
                action: "open",
                path: path(),
                source,
            }
        }
    })?;
    let meta = file.metadata().map_err(|source| SnapshotError::Io {
        action: "stat",
        path: path(),
        source,
    })?;
    if !meta.is_file() {
        return Err(SnapshotError::NotAFile { path: path() });
    }
    if meta.len() == 0 {
        return Ok((file, false));
    }
    let mode = super::header::mode_of(&file).map_err(|source| SnapshotError::Io {
        action: "read",
        path: path(),
        source,
    })?;
    match mode {
        super::header::Mode::NotSqlite => Err(SnapshotError::NotSqlite { path: path() }),
        mode => Ok((file, mode == super::header::Mode::Wal)),
    }
}

#[cfg(test)]
thread_local! {
    /// Tests: run once right after fork has read the source's header (its journal mode),
    /// before anything else opens or locks it.
    pub(super) static AFTER_THE_LOOK: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::RefCell::new(None) };
}

/// Copies the live SQLite database `src` to the new file `dest` (which must not exist)
/// with the online backup API, checks the copy and hashes it. See the module docs for how
/// writers are kept moving. The copy is made in a private directory beside `dest` and
/// moved to `dest` once finished: no other name in `dest`'s directory is created, replaced
/// or removed, and on any error nothing is left.
pub fn snapshot(
    src: &Path,
    dest: &Path,
    opts: &SnapshotOptions,
) -> Result<SnapshotStats, SnapshotError> {
    let started = Instant::now();
    let (file, wal) = inspect_source(src, opts.read_as.as_ref())?;
    #[cfg(test)]
    if let Some(hook) = AFTER_THE_LOOK.with(|h| h.borrow_mut().take()) {
        hook();
    }
    // Never overwrite: a destination that exists is refused now, and the finished copy is
    // moved there only if nothing has appeared there since (`move_into_place`).
    match fs::symlink_metadata(dest) {
        Ok(_) => {
            return Err(SnapshotError::DestExists {
                path: dest.to_path_buf(),
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(SnapshotError::Io {
                action: "stat",
                path: dest.to_path_buf(),
                source,
            })
        }
    }
    // The copy is made in a directory of its own beside `dest`, with every file fork or
    // SQLite puts beside it while it is made (the copy's `-wal`, `-shm` and `-journal`; a
    // parent-less WAL store's copy and its side files): the directory `dest` is in may hold
    // other stores' copies under any name, which no snapshot may create, replace or remove.
    // The directory and whatever is left in it go when `work` is dropped.
    let create_err = |source| SnapshotError::Io {
        action: "create",
        path: dest.to_path_buf(),
        source,
    };
    let beside = dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let work = tempfile::Builder::new()
        .prefix(".fork-snapshot-")
        .tempdir_in(beside)
        .map_err(create_err)?;
    let copy = work
        .path()
        .join(dest.file_name().unwrap_or(std::ffi::OsStr::new("copy")));
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&copy)
        .map_err(create_err)?;
    // Named after the copy, so that the two (and their side files) never share a name.
    let scratch = super::parent::side(&copy, ".parent");
    #[cfg(test)]
    THE_COPY.with(|c| *c.borrow_mut() = Some(copy.clone()));
    let stats = copy_parent(src, file, &copy, &scratch, wal, opts, started);
    #[cfg(test)]
    THE_COPY.with(|c| c.borrow_mut().take());
    let stats = stats.map_err(|e| match e {
        // Named as the caller knows the copy (it is gone either way).
        SnapshotError::Corrupt { report, .. } => SnapshotError::Corrupt {
            path: dest.to_path_buf(),
            report,
        },
        e => e,
    })?;
    move_into_place(&copy, dest)?;
    Ok(stats)
}

#[cfg(test)]
thread_local! {
    /// Tests: the copy `snapshot` is making on this thread, in its private directory.
    static THE_COPY: std::cell::RefCell<Option<std::path::PathBuf>> =
        const { std::cell::RefCell::new(None) };
}

/// Tests: the copy the snapshot running on this thread is making (for a hook to change it).
#[cfg(test)]
pub(super) fn the_copy() -> std::path::PathBuf {
    THE_COPY
        .with(|c| c.borrow().clone())
        .expect("no snapshot is running on this thread")
}

/// Moves the finished copy to `dest`, unless something is there by now. Not by renaming
/// over a file made there beforehand: ext4 (`auto_da_alloc`) writes out a file renamed over
/// another at once, which would put the copy's writeback in front of the parent's next
/// `fsync` (see `sqlite::open_emptied`).
fn move_into_place(copy: &Path, dest: &Path) -> Result<(), SnapshotError> {
    use nix::errno::Errno;
    use nix::fcntl::{renameat2, RenameFlags, AT_FDCWD};
    let exists = || SnapshotError::DestExists {
        path: dest.to_path_buf(),
    };
    let move_err = |source| SnapshotError::Io {
        action: "move the copy to",
        path: dest.to_path_buf(),
        source,
    };
    match renameat2(
        AT_FDCWD,
        copy,
        AT_FDCWD,
        dest,
        RenameFlags::RENAME_NOREPLACE,
    ) {
        Ok(()) => Ok(()),
        Err(Errno::EEXIST) => Err(exists()),
        // A filesystem without RENAME_NOREPLACE: a hard link refuses an existing name just
        // as atomically (the private name goes with its directory).
        Err(Errno::EINVAL) => match fs::hard_link(copy, dest) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(exists()),
            Err(e) => Err(move_err(e)),
        },
        Err(e) => Err(move_err(e.into())),
    }
}

/// The snapshot proper, into the new, empty `dest`: `file` is the database file fork
/// looked at, and `wal` what its header said then; `scratch` is a fresh path in fork's
/// private directory for a parent-less WAL store's copy (`parent.rs`).
fn copy_parent(
    src: &Path,
    file: fs::File,
    dest: &Path,
    scratch: &Path,
    wal: bool,
    opts: &SnapshotOptions,
    started: Instant,
) -> Result<SnapshotStats, SnapshotError> {
    use super::parent::{ParentDb, Route};
    let read_err = |source| SnapshotError::Io {
        action: "read",
        path: src.to_path_buf(),
        source,
    };
    let file = if wal {
        // Nothing may be created next to the parent's database: see `parent`.
        let db = ParentDb::lock(file, src, started + opts.timeout, opts.read_as.clone())
            .map_err(read_err)?;
        // Leaving WAL mode takes SQLite's EXCLUSIVE lock, which the lock just taken keeps
        // off: the header read through it names the mode for the whole snapshot. A parent
        // that left WAL mode after fork looked is read as the rollback-journal database it
        // now is: the WAL route holds this lock through the copy, its check and its hash,
        // which in rollback-journal mode would keep every commit waiting.
        if db.in_wal_mode().map_err(read_err)? {
            let r = db
                .route(scratch)
                .map_err(read_err)
                .and_then(|route| match route {
                    Route::Uri(uri) => {
                        let live = Parent::Live {
                            uri: &uri,
                            locked: &db,
                        };
                        copy_check_hash(src, live, dest, opts, started)
                    }
                    // fork's own copy of the parent's files, read as fork itself.
                    Route::Copied(copy) => {
                        let own = SnapshotOptions {
                            read_as: None,
                            ..opts.clone()
                        };
                        copy_check_hash(&copy, Parent::Copy, dest, &own, started)
                    }
                });
            // The lock is held until SQLite's reads of the parent are done.
            drop(db);
            return r;
        }
        db.release().map_err(read_err)?
    } else {
        file
    };
    // Rollback-journal mode: every read SQLite makes of the parent runs under the guard,
    // which refuses a database that left the mode (`header.rs`). Its descriptor stays open
    // until SQLite's connection is closed (closing it would drop SQLite's locks).
    let guard = super::header::RollbackGuard::new(file, src);
    copy_check_hash(src, Parent::Rollback(&guard), dest, opts, started)
}

struct CopyOutcome {
    pages: u64,
    steps: u64,
    restarts: u32,
    busy_retries: u64,
    longest_step: Duration,
}

fn copy_check_hash(
    src: &Path,
    parent: Parent,
    dest: &Path,
    opts: &SnapshotOptions,
    started: Instant,
) -> Result<SnapshotStats, SnapshotError> {
    if let Some(stats) = super::image::copy_image(src, parent, dest, opts, started)? {
        return Ok(stats);
    }
    let wal = parent.wal();
    let copy = copy_pages(src, parent, dest, opts, started)?;
    let copy_elapsed = started.elapsed();

    // The check and the hash both only read the copy: run them side by side.
    let (integrity_ok, check_elapsed, digest, hash_elapsed) =
        check_and_hash(dest, opts.check, opts.digest)?;
    let bytes = fs::metadata(dest)
        .map_err(|source| SnapshotError::Io {
            action: "stat",
            path: dest.to_path_buf(),
            source,
        })?
        .len();
    Ok(SnapshotStats {
        bytes,
        pages: copy.pages,
        steps: copy.steps,
        restarts: copy.restarts,
        busy_retries: copy.busy_retries,
        wal,
        method: SnapshotMethod::Pages,
        elapsed: started.elapsed(),
        copy_elapsed,
        check_elapsed,
        hash_elapsed,
        longest_step: copy.longest_step,
        digest,
        integrity_ok,
        pieces_hashed_again: None,
        recopied_bytes: None,
        compared_bytes: None,
    })
}

fn copy_pages(
    src: &Path,
    parent: Parent,
    dest: &Path,
    opts: &SnapshotOptions,
    started: Instant,
) -> Result<CopyOutcome, SnapshotError> {
    let wal = parent.wal();
    let source = open_source(src, parent, opts, started)?;
    if wal {
        // One read transaction for the whole copy: a fixed snapshot, writers unblocked.
        source
            .execute_batch("BEGIN DEFERRED")
            .map_err(sqlite_err("begin a read transaction on", src))?;
    }
    // Starts that read transaction (WAL); in any mode, fails early and clearly on a file
    // SQLite cannot read.
    as_reader(src, opts, || {
        retry_busy(src, opts, started, "read", parent.guard(), || {
            source.query_row("SELECT count(*) FROM sqlite_schema", [], |r| {
                r.get::<_, i64>(0)
            })
        })
    })?;

    let mut target = Connection::open_with_flags(
        dest,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sqlite_err("open", dest))?;
    // The copy is fresh and private: if we crash it is thrown away, so no journal and no
    // fsync while filling it.
    target
        .execute_batch("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;")
        .map_err(sqlite_err("configure", dest))?;

    let mut out = CopyOutcome {
        pages: 0,
        steps: 0,
        restarts: 0,
        busy_retries: 0,
        longest_step: Duration::ZERO,
    };
    {
        let backup =
            Backup::new(&source, &mut target).map_err(sqlite_err("start a backup of", src))?;
        let mut step_pages = if opts.pages_per_step <= 0 {
            -1
        } else {
            opts.pages_per_step
        };
        let mut prev_done: i64 = -1;
        loop {
            if started.elapsed() > opts.timeout {
                return Err(SnapshotError::Timeout {
                    path: src.to_path_buf(),
                    timeout: opts.timeout,
                });
            }
            let t = Instant::now();
            // In rollback mode each step is a read transaction of its own, run under the
            // guard; a step its lock is refused for waits as a busy step does.
            let r = as_reader(src, opts, || {
                let step = || {
                    backup
                        .step(step_pages)
                        .map_err(sqlite_err("copy pages from", src))
                };
                match parent.guard() {
                    Some(g) => Ok(g.read(step)?.transpose()?.unwrap_or(StepResult::Busy)),
                    None => step(),
                }
            })?;
            out.longest_step = out.longest_step.max(t.elapsed());
            out.steps += 1;
            let p = backup.progress();
            match r {
                StepResult::Done => {
                    out.pages = u64::try_from(p.pagecount).unwrap_or(0);
                    break;
                }
                StepResult::More => {
                    let done = i64::from(p.pagecount) - i64::from(p.remaining);
                    // A step always moves forward unless SQLite restarted from page 1.
                    if prev_done >= 0 && done <= prev_done {
                        out.restarts += 1;
                        if out.restarts > opts.max_restarts {
                            return Err(SnapshotError::TooManyRestarts {
                                path: src.to_path_buf(),
                                restarts: out.restarts,
                            });
                        }
                        if opts.grow_on_restart && step_pages > 0 {
                            step_pages = step_pages.saturating_mul(2);
                        }
                    }
                    prev_done = done;
                    if !wal && !opts.pause.is_zero() {
                        std::thread::sleep(opts.pause);
                    }
                }
                // Busy/Locked (and any future variant): a writer holds the lock; wait.
                _ => {
                    out.busy_retries += 1;
                    std::thread::sleep(opts.pause.max(Duration::from_millis(1)));
                }
            }
        }
    }
    if wal {
        // Ends the read transaction (nothing was written).
        source
            .execute_batch("COMMIT")
            .map_err(sqlite_err("end the read transaction on", src))?;
    }
    drop(source);
    target
        .close()
        .map_err(|(_, e)| sqlite_err("close", dest)(e))?;
    Ok(out)
}

#[cfg(test)]
#[path = "snapshot_dir_tests.rs"]
mod dir_tests;

#[cfg(test)]
#[path = "snapshot_link_tests.rs"]
mod link_tests;

#[cfg(test)]
#[path = "snapshot_mode_tests.rs"]
mod mode_tests;

#[cfg(test)]
#[path = "snapshot_owner_tests.rs"]
mod owner_tests;

#[cfg(test)]
#[path = "snapshot_precopy_tests.rs"]
mod precopy_tests;

#[cfg(test)]
#[path = "snapshot_writer_tests.rs"]
mod writer_tests;

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const PAYLOAD: usize = 3000;

    pub(super) fn make_db(path: &Path, wal: bool, rows: u64) {
        let c = Connection::open(path).unwrap();
        let mode = if wal { "WAL" } else { "DELETE" };
        c.execute_batch(&format!(
            "PRAGMA journal_mode = {mode};
             CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL);
             CREATE INDEX t_body ON t(body);
             CREATE TABLE meta (k TEXT PRIMARY KEY, n INTEGER NOT NULL);
             INSERT INTO meta VALUES ('rows', 0);"
        ))
        .unwrap();
        let tx = c.unchecked_transaction().unwrap();
        for i in 0..rows {
            tx.execute(
                "INSERT INTO t (id, body) VALUES (?1, randomblob(?2))",
                rusqlite::params![i as i64 + 1, PAYLOAD as i64],
            )
            .unwrap();
        }
        tx.execute("UPDATE meta SET n = ?1", [rows as i64]).unwrap();
        tx.commit().unwrap();
    }

    /// A database above the image bound goes page by page; at or below it, as one image.
    #[test]
    fn image_bound_picks_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("s.db");
        make_db(&src, true, 200);
        let size = fs::metadata(&src).unwrap().len();
        for (bound, steps_one) in [(size, true), (size - 4096, false)] {
            let dest = dir.path().join(format!("c{bound}.db"));
            let opts = SnapshotOptions {
                pages_per_step: 16,
                image_max_bytes: bound,
                ..SnapshotOptions::default()
            };
            let st = snapshot(&src, &dest, &opts).unwrap();
            assert_eq!(st.steps == 1, steps_one, "bound {bound} of {size}: {st:?}");
            assert_eq!(st.digest, StateDigest::Blake3.of_path(&dest).unwrap());
            assert_eq!(st.bytes, size);
            assert!(st.integrity_ok);
        }
    }

    /// Every way of copying names the copy by the digest asked for, computed over the
    /// copy's final bytes (the WAL replayed, the tail cut): BLAKE3 by default, SHA-256
    /// when the options say so.
    #[test]
    fn every_copy_method_names_the_copy_by_the_digest_asked() {
        let dir = tempfile::tempdir().unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for wal in [true, false] {
            let src = dir.path().join(format!("s{wal}.db"));
            make_db(&src, wal, 1000);
            // A live parent with frames in its WAL (the file copy and replay path).
            let parent = Connection::open(&src).unwrap();
            parent
                .execute_batch("PRAGMA wal_autocheckpoint = 0; UPDATE meta SET n = n + 1;")
                .unwrap();
            let shapes = [
                (true, IMAGE_MAX_BYTES, u64::MAX),
                (true, IMAGE_MAX_BYTES, 1 << 20),
                (false, IMAGE_MAX_BYTES, u64::MAX),
                (true, 0, u64::MAX),
            ];
            for (i, (fast, bound, precopy)) in shapes.into_iter().enumerate() {
                for digest in [StateDigest::Blake3, StateDigest::Sha256] {
                    let dest = dir.path().join(format!("c{wal}{i}{digest:?}.db"));
                    let opts = SnapshotOptions {
                        raw_copy: fast,
                        wal_file_copy: fast,
                        image_max_bytes: bound,
                        precopy_min_bytes: precopy,
                        digest,
                        ..SnapshotOptions::default()
                    };
                    let st = snapshot(&src, &dest, &opts).unwrap();
                    assert!(st.bytes > 2 << 20, "large enough to be split: {st:?}");
                    assert!(st.digest.starts_with(&format!("{}:", digest.name())));
                    assert_eq!(st.digest, digest.of_path(&dest).unwrap(), "{st:?}");
                    // BLAKE3 over a WAL file copy or a precopy: hashed behind the copy, then
                    // in part.
                    let pieces = [SnapshotMethod::WalFiles, SnapshotMethod::FileBytesPrecopied];
                    let behind = pieces.contains(&st.method) && digest.name() == "blake3";
                    assert_eq!(st.pieces_hashed_again.is_some(), behind, "{st:?}");
                    seen.insert(format!("{:?}", st.method));
                }
            }
            drop(parent);
        }
        let want = [
            "FileBytes",
            "FileBytesPrecopied",
            "Pages",
            "Serialize",
            "WalFiles",
        ];
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), want);
    }

    /// The check runs on the written copy of the image: a database whose index disagrees
    /// with its table is refused, and no copy is left.
    #[test]
    fn image_snapshot_refuses_a_corrupt_database() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("bad.db");
        make_db(&src, false, 50);
        {
            let c = Connection::open(&src).unwrap();
            // Rewrite the rows behind the index's back: the index then lists bodies the
            // table no longer holds (what integrity_check reports as a missing entry).
            c.execute_batch(
                "PRAGMA writable_schema = ON;
                 UPDATE sqlite_schema SET sql = 'CREATE INDEX t_body ON t(id)' WHERE name = 't_body';
                 PRAGMA writable_schema = OFF;",
            )
            .unwrap();
        }
        let dest = dir.path().join("copy.db");
        let err = snapshot(&src, &dest, &SnapshotOptions::default()).unwrap_err();
        assert!(matches!(err, SnapshotError::Corrupt { .. }), "{err}");
        assert!(!dest.exists());
        // quick_check does not look inside indexes: this is why the default stays the
        // full integrity_check.
        let quick = SnapshotOptions {
            check: IntegrityCheck::Quick,
            ..SnapshotOptions::default()
        };
        let st = snapshot(&src, &dest, &quick).unwrap();
        assert!(st.integrity_ok);
    }

    /// A rollback-journal database's image copied as the file's bytes under the shared lock
    /// (`raw_copy`) is byte for byte what SQLite's pager serializes, and its hash (taken
    /// while the bytes are copied, chunk by chunk: this database spans two chunks and a
    /// part) is the copy's.
    #[test]
    fn raw_image_equals_the_serialized_image() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("s.db");
        make_db(&src, false, 1500);
        assert!(fs::metadata(&src).unwrap().len() > 8 << 20);
        let raw = dir.path().join("raw.db");
        let ser = dir.path().join("ser.db");
        let raw_opts = SnapshotOptions {
            raw_copy: true,
            ..SnapshotOptions::default()
        };
        let a = snapshot(&src, &raw, &raw_opts).unwrap();
        let b = snapshot(
            &src,
            &ser,
            &SnapshotOptions {
                raw_copy: false,
                ..SnapshotOptions::default()
            },
        )
        .unwrap();
        assert_eq!(fs::read(&raw).unwrap(), fs::read(&ser).unwrap());
        assert_eq!(a.digest, b.digest);
        assert_eq!(a.digest, StateDigest::Blake3.of_path(&raw).unwrap());
        assert_eq!((a.bytes, a.pages, a.steps), (b.bytes, b.pages, 1));
        assert!(a.integrity_ok && !a.wal);
    }

    /// A rollback-journal database of one chunk copied without a check (as `fork evaluate`
    /// copies it) is hashed on the copying thread once the lock is gone; with a check, on
    /// a thread behind the copy. Both ways, and in both digests, the digest is the copy's.
    #[test]
    fn a_one_chunk_raw_copy_is_hashed_the_same_with_or_without_its_check() {
        let dir = tempfile::tempdir().unwrap();
        // 50 rows: one thread hashes; 250 (over 1 MiB, under the 4 MiB chunk): BLAKE3
        // splits the in-line hash over two threads.
        for rows in [50, 250] {
            let src = dir.path().join(format!("s{rows}.db"));
            make_db(&src, false, rows);
            let len = fs::metadata(&src).unwrap().len();
            assert!(rows == 50 || (len > 1 << 20 && len < 4 << 20), "{len}");
            for digest in [StateDigest::Blake3, StateDigest::Sha256] {
                let mut got = Vec::new();
                for check in [IntegrityCheck::Skip, IntegrityCheck::Full] {
                    let dest = dir
                        .path()
                        .join(format!("{rows}-{}-{check:?}.db", digest.name()));
                    let opts = SnapshotOptions {
                        raw_copy: true,
                        check,
                        digest,
                        ..SnapshotOptions::default()
                    };
                    let stats = snapshot(&src, &dest, &opts).unwrap();
                    assert_eq!(stats.method, SnapshotMethod::FileBytes);
                    assert_eq!(stats.bytes, fs::metadata(&dest).unwrap().len());
                    assert_eq!(stats.digest, digest.of_path(&dest).unwrap());
                    assert_eq!(stats.integrity_ok, check == IntegrityCheck::Full);
                    got.push((stats.digest, fs::read(&dest).unwrap()));
                }
                assert_eq!(got[0], got[1], "{}", digest.name());
            }
        }
    }

    #[test]
    fn snapshot_leaves_the_source_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("s.db");
        make_db(&src, false, 50);
        let before = StateDigest::Blake3.of_path(&src).unwrap();
        let dest = dir.path().join("c.db");
        let stats = snapshot(&src, &dest, &SnapshotOptions::default()).unwrap();
        assert_eq!(StateDigest::Blake3.of_path(&src).unwrap(), before);
        assert_eq!(stats.restarts, 0);
        assert!(stats.integrity_ok);
        let c = Connection::open(&dest).unwrap();
        let rows: i64 = c
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 50);
    }

    #[test]
    fn clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent.db");
        let dest = dir.path().join("out.db");
        let err = snapshot(&missing, &dest, &SnapshotOptions::default()).unwrap_err();
        assert!(matches!(err, SnapshotError::Missing { .. }));
        assert!(err.to_string().contains("absent.db"), "{err}");
        assert!(!dest.exists());

        let text = dir.path().join("notes.txt");
        fs::write(
            &text,
            "this is not a database, it is a text file of some length\n".repeat(4),
        )
        .unwrap();
        let err = snapshot(&text, &dest, &SnapshotOptions::default()).unwrap_err();
        assert!(matches!(err, SnapshotError::NotSqlite { .. }), "{err}");
        assert!(err.to_string().contains("notes.txt"), "{err}");
        assert!(!dest.exists());

        // A valid header over garbage: SQLite itself refuses; the copy is cleaned up.
        let fake = dir.path().join("fake.db");
        let mut bytes = SQLITE_MAGIC.to_vec();
        bytes.resize(8192, 0xA5);
        fs::write(&fake, bytes).unwrap();
        let err = snapshot(&fake, &dest, &SnapshotOptions::default()).unwrap_err();
        assert!(err.to_string().contains("fake.db"), "{err}");
        assert!(!dest.exists());

        let err = snapshot(dir.path(), &dest, &SnapshotOptions::default()).unwrap_err();
        assert!(matches!(err, SnapshotError::NotAFile { .. }), "{err}");

        let src = dir.path().join("ok.db");
        make_db(&src, true, 5);
        fs::write(&dest, b"precious").unwrap();
        let err = snapshot(&src, &dest, &SnapshotOptions::default()).unwrap_err();
        assert!(matches!(err, SnapshotError::DestExists { .. }), "{err}");
        assert_eq!(fs::read(&dest).unwrap(), b"precious");
    }
}
