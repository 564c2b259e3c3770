//! The snapshot's vocabulary and the SQLite steps both copies share (see
//! [`super::snapshot`] for how a snapshot is taken, [`super::image`] for the one-image
//! copy): options, statistics, errors, opening the source read-only, retrying while it is
//! busy, checking the copy and hashing it.

pub use super::digest::StateDigest;
pub(super) use super::error::io_err;
pub use super::error::{SnapshotError, SQLITE_MAGIC};
use super::header::RollbackGuard;
use super::owner::{open_as, ReadAs};
use rusqlite::{Connection, OpenFlags};
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

/// The default bound of a one-image copy: 128 MiB. Measured with `benches/snapshot.rs`, a
/// 100 MiB database takes 25-40 ms to read as one image; in rollback-journal mode the
/// source's shared lock is held that long, so a bigger bound would stall the parent's
/// writers longer than the 50 ms the snapshot promises them.
pub const IMAGE_MAX_BYTES: u64 = 128 << 20;

/// The default [`SnapshotOptions::precopy_min_bytes`].
pub const PRECOPY_MIN_BYTES: u64 = 32 << 20;

/// Which check runs on the copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntegrityCheck {
    /// `PRAGMA integrity_check`: every page, every index entry.
    Full,
    /// `PRAGMA quick_check`: like `integrity_check` without checking index contents.
    Quick,
    /// No check (then `SnapshotStats::integrity_ok` is false).
    Skip,
}

/// How the snapshot paces itself.
#[derive(Debug, Clone)]
pub struct SnapshotOptions {
    /// Pages copied per backup step (a negative number: all pages in one step).
    pub pages_per_step: i32,
    /// Sleep between two steps in rollback-journal mode, so that writers can commit.
    /// (In WAL mode writers are never blocked, and there is no pause.)
    pub pause: Duration,
    /// How many backup restarts (the source changed between two steps) are tolerated.
    pub max_restarts: u32,
    /// Double the step after each restart so that the copy converges under a busy writer.
    pub grow_on_restart: bool,
    /// Give up after this long (error `Timeout`).
    pub timeout: Duration,
    /// The check run on the copy.
    pub check: IntegrityCheck,
    /// A database of at most this many bytes is copied as one image inside one read
    /// transaction (see [`snapshot`]); a larger one, or 0 here, goes `pages_per_step` pages
    /// at a time.
    pub image_max_bytes: u64,
    /// Rollback-journal mode only: copy the one image as the database file's own bytes
    /// (under the shared lock the read transaction holds, which no commit can pass), file
    /// to file by the kernel, hashed while it is copied, instead of through SQLite's pager
    /// (`sqlite3_serialize` into memory, then written and hashed). Same bytes; the lock is
    /// held only while the kernel copies the file (for a file of at least
    /// [`precopy_min_bytes`](Self::precopy_min_bytes), copied before the lock, only while
    /// the copy is compared with it). (WAL mode always goes through the
    /// pager: the state is the file plus the WAL's frames.) On by default: measured faster
    /// with `benches/snapshot.rs` (see the README's Benchmarks).
    pub raw_copy: bool,
    /// Rollback-journal mode, `raw_copy`: a database file of at least this many bytes is
    /// first copied with no lock held, then made the committed state under the shared lock
    /// (compared with the live file block by block, every 4 KiB that differs copied again:
    /// `precopy.rs`), so that a committing writer waits one reading of the two files
    /// instead of the kernel's copy of the file (measured on 100 MiB under a writer
    /// committing 380 times a second: the lock held a median 21.6 ms instead of 43.7; the
    /// whole snapshot about 1.5x as long, 89.4 against 58.7 ms). `u64::MAX`: always copy
    /// under the lock (as before this option). Default 32 MiB: below it the lock's copy of
    /// the file takes about 15-19 ms at most even on a slow day, not worth the longer
    /// snapshot.
    pub precopy_min_bytes: u64,
    /// WAL mode, a live parent only: copy the one image as the database file and its
    /// `-wal`, by the kernel, under a held read transaction, then let SQLite's recovery
    /// replay the copied WAL into the copy (`walcopy.rs` says why that is one committed
    /// state), instead of `sqlite3_serialize`. A `-wal` larger than half the database (and
    /// than 4 MiB), or a WAL restarted under each of a few attempts, falls back to
    /// `sqlite3_serialize`.
    pub wal_file_copy: bool,
    /// The digest that names the copy ([`SnapshotStats::digest`]): BLAKE3 by default.
    pub digest: StateDigest,
    /// How the parent's own files are opened (by fork, and by SQLite): as fork itself
    /// (None, the default), or as the runtime's owner (a root-run fork on another user's
    /// runtime; see [`ReadAs`]).
    pub read_as: Option<ReadAs>,
}

/// How a snapshot copied the database (`SnapshotStats::method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotMethod {
    /// The online backup API, `pages_per_step` pages at a time.
    Pages,
    /// One image read through SQLite's pager (`sqlite3_serialize`), then written.
    Serialize,
    /// Rollback journal: the file's bytes copied by the kernel under the shared lock.
    FileBytes,
    /// Rollback journal, a large database: the file's bytes copied by the kernel with no
    /// lock held, then compared under the shared lock with the live file and every 4 KiB
    /// that differed copied again (see [`SnapshotOptions::precopy_min_bytes`]).
    FileBytesPrecopied,
    /// WAL: the database file and its `-wal` copied by the kernel under a held read
    /// transaction, then the WAL replayed into the copy by SQLite's recovery.
    WalFiles,
}

impl Default for SnapshotOptions {
    /// Defaults measured with `benches/snapshot.rs` on a 100 MiB database (25 600 pages of
    /// 4 KiB) under a writer rewriting a random row per transaction:
    /// * WAL: the step size hardly matters (64 to all pages: 103-127 ms, no restarts, the
    ///   writer never waits on the copy), 1024 pages keeps each step near 5 ms.
    /// * Rollback journal: with ~200 commits/s every pass is cut by a commit until one step
    ///   covers the whole database, whatever the initial step (64 → 9 restarts, 1024 → 5,
    ///   all pages → 0), and the writer then waits about one full copy (~100 ms). With a
    ///   sparser writer, 1024-page steps (~4 ms each) let the copy finish between commits
    ///   while a committing writer waits at most one step. A 2 ms pause lets a writer that
    ///   found the lock taken in (it holds SQLite's PENDING lock, which makes our next step
    ///   return busy until it has committed).
    fn default() -> Self {
        SnapshotOptions {
            pages_per_step: 1024,
            pause: Duration::from_millis(2),
            max_restarts: 64,
            grow_on_restart: true,
            timeout: Duration::from_secs(600),
            check: IntegrityCheck::Full,
            image_max_bytes: IMAGE_MAX_BYTES,
            raw_copy: true,
            precopy_min_bytes: PRECOPY_MIN_BYTES,
            wal_file_copy: true,
            digest: StateDigest::Blake3,
            read_as: None,
        }
    }
}

/// What a snapshot did.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotStats {
    /// Size of the copy in bytes.
    pub bytes: u64,
    /// Pages in the copy.
    pub pages: u64,
    /// Backup steps taken (including steps that found the source busy).
    pub steps: u64,
    /// Times the backup restarted because the source changed between two steps (WAL
    /// mode's file copy: attempts discarded because the WAL restarted under them).
    pub restarts: u32,
    /// Steps that found the source locked by a writer and were retried.
    pub busy_retries: u64,
    /// Whether the source was in WAL mode (copied inside one read transaction).
    pub wal: bool,
    /// How the copy was made.
    pub method: SnapshotMethod,
    /// Total time, copy + check + hash.
    pub elapsed: Duration,
    /// Time spent copying pages (the backup itself).
    pub copy_elapsed: Duration,
    /// Time spent in the integrity check.
    pub check_elapsed: Duration,
    /// Time spent hashing the copy: the busy time of every hashing thread, summed (two
    /// threads hashing side by side count twice), waits not included.
    pub hash_elapsed: Duration,
    /// The longest single step. In rollback-journal mode a step holds the source's shared
    /// lock throughout, so this is the longest a committing writer could have waited on us.
    pub longest_step: Duration,
    /// `<digest>:<hex>` of the copy's bytes (`blake3:` or `sha256:`, see
    /// [`SnapshotOptions::digest`]).
    pub digest: String,
    /// True when the integrity check ran and answered `ok` (false only with `Skip`).
    pub integrity_ok: bool,
    /// WAL mode's file copy with BLAKE3: the copy's pieces (of
    /// [`PIECE_BYTES`](super::snapshot::PIECE_BYTES)) hashed again after the WAL's
    /// replay (the rest were hashed behind the copy); a rollback-journal database copied
    /// before its lock ([`SnapshotMethod::FileBytesPrecopied`]): those hashed again after
    /// the comparison under the lock. None: hashed whole, or while copied.
    pub pieces_hashed_again: Option<usize>,
    /// [`SnapshotMethod::FileBytesPrecopied`]: the bytes copied again under the lock (the
    /// 4 KiB units that differed from the committed state, and what the file grew by
    /// after the unlocked copy). None for the other methods.
    pub recopied_bytes: Option<u64>,
    /// [`SnapshotMethod::FileBytesPrecopied`]: the bytes of the live file compared with
    /// the copy under the lock; 0 when the file's change time proved it untouched since a
    /// first, short read transaction before the unlocked copy (`precopy.rs`). None for
    /// the other methods.
    pub compared_bytes: Option<u64>,
}

/// How the snapshot reads the parent's database, decided in `snapshot` from its header
/// (read under a lock) and its side files.
#[derive(Clone, Copy)]
pub(super) enum Parent<'a> {
    /// Rollback-journal mode: SQLite opens the path, and each of its reads of the parent
    /// runs under this guard (`header.rs`).
    Rollback(&'a RollbackGuard),
    /// WAL mode, a live parent: SQLite opens `uri` (`parent.rs`); `locked` is the file fork
    /// holds SQLite's SHARED lock on, the one whose bytes may be copied.
    Live {
        uri: &'a str,
        locked: &'a super::parent::ParentDb,
    },
    /// WAL mode, fork's own copy of the parent's files, in fork's staging: SQLite opens
    /// the path.
    Copy,
}

impl<'a> Parent<'a> {
    /// Whether the database is read in WAL mode (in one read transaction).
    pub fn wal(self) -> bool {
        !matches!(self, Parent::Rollback(_))
    }

    pub fn uri(self) -> Option<&'a str> {
        match self {
            Parent::Live { uri, .. } => Some(uri),
            _ => None,
        }
    }

    pub fn guard(self) -> Option<&'a RollbackGuard> {
        match self {
            Parent::Rollback(g) => Some(g),
            _ => None,
        }
    }
}

pub(super) fn sqlite_err<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(rusqlite::Error) -> SnapshotError + 'a {
    move |source| {
        if source.sqlite_error_code() == Some(rusqlite::ErrorCode::NotADatabase) {
            SnapshotError::NotSqlite {
                path: path.to_path_buf(),
            }
        } else {
            SnapshotError::Sqlite {
                action,
                path: path.to_path_buf(),
                source,
            }
        }
    }
}

/// Opens the source read-only, never following a link, through `uri` when given.
/// The parent's database opened read-only. As its owner (`opts.read_as`): the database and
/// whichever of its `-wal`, `-shm` and `-journal` exist are first opened by fork as the
/// owner (a refusal names the file), then SQLite opens them, as the owner too, and reads
/// once so that every file it reads the parent through is open before the owner's
/// identity is given back (a read connection keeps them open until it closes).
///
/// SQLite's open is checked to have opened the file fork guards (rollback path) or locked
/// (a live WAL parent); on the rollback path its reads run under the guard (`header.rs`).
pub(super) fn open_source(
    src: &Path,
    parent: Parent,
    opts: &SnapshotOptions,
    started: Instant,
) -> Result<Connection, SnapshotError> {
    let open = || {
        let source = open_source_here(src, parent.uri())?;
        // The file SQLite opened is the one fork checked (and, in WAL mode, locked): a
        // file put at the path before SQLite's open is refused before SQLite reads it.
        match parent {
            Parent::Rollback(guard) => guard.check_same_file()?,
            Parent::Live { locked, .. } => {
                if !locked.at_path().map_err(io_err("stat", src))? {
                    return Err(SnapshotError::Replaced {
                        path: src.to_path_buf(),
                    });
                }
            }
            Parent::Copy => {}
        }
        Ok(source)
    };
    let Some(read_as) = &opts.read_as else {
        return open();
    };
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let path = super::parent::side(src, suffix);
        match open_as(Some(read_as), || super::parent::open_no_links(&path)) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound && !suffix.is_empty() => {}
            Err(e) => return Err(io_err("open", &path)(e)),
        }
    }
    as_reader(src, opts, || {
        let source = open()?;
        retry_busy(src, opts, started, "read", parent.guard(), || {
            source.query_row("SELECT count(*) FROM sqlite_schema", [], |r| {
                r.get::<_, i64>(0)
            })
        })?;
        Ok(source)
    })
}

/// Runs `f`, a call on the parent's connection that may make SQLite open one of the
/// parent's files (the connection's open; the start of each read transaction, when SQLite
/// looks for a `-wal` or a hot `-journal` beside a rollback-journal database and opens
/// what it finds; each step of a backup, its own read transaction in that mode), as
/// `opts.read_as` says.
pub(super) fn as_reader<T>(
    src: &Path,
    opts: &SnapshotOptions,
    f: impl FnOnce() -> Result<T, SnapshotError>,
) -> Result<T, SnapshotError> {
    #[cfg(test)]
    if let Some(hook) = BEFORE_THE_PARENT_IS_READ.with(|h| h.borrow_mut().pop_front()) {
        hook();
    }
    match &opts.read_as {
        None => f(),
        Some(r) => r.run(f).map_err(io_err("open", src))?,
    }
}

#[cfg(test)]
thread_local! {
    /// Test hooks: each call of [`as_reader`] on this thread first runs the next one.
    pub(super) static BEFORE_THE_PARENT_IS_READ: std::cell::RefCell<
        std::collections::VecDeque<Box<dyn FnOnce()>>,
    > = const { std::cell::RefCell::new(std::collections::VecDeque::new()) };
}

fn open_source_here(src: &Path, uri: Option<&str>) -> Result<Connection, SnapshotError> {
    let ro = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_NOFOLLOW;
    let source = match uri {
        Some(u) => Connection::open_with_flags(u, ro | OpenFlags::SQLITE_OPEN_URI),
        None => Connection::open_with_flags(src, ro),
    }
    .map_err(sqlite_err("open", src))?;
    // Never checkpoint (nor delete the parent's -wal) when this connection closes.
    source
        .set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .map_err(sqlite_err("configure", src))?;
    // No busy handler: a read that finds a writer holding the lock returns Busy at once
    // and the caller sleeps and retries, so that a step's duration is the time the
    // source's lock was held, and the timeout bounds the wait.
    source
        .busy_timeout(Duration::ZERO)
        .map_err(sqlite_err("configure", src))?;
    // Reads through a memory map: no read() per page.
    source
        .execute_batch("PRAGMA mmap_size = 1073741824")
        .map_err(sqlite_err("configure", src))?;
    Ok(source)
}

/// Whether a failed read of the parent is worth trying again: SQLITE_BUSY or SQLITE_LOCKED
/// (a writer holds the lock), and the two answers a read-only wal-index connection
/// (`readonly_shm=1`, see `parent`) gives while another connection is rebuilding or
/// initialising the parent's `-shm`, which it may not do itself: SQLITE_READONLY_RECOVERY
/// and SQLITE_READONLY_CANTINIT (seen while a parent checkpoints and restarts its WAL
/// without pause: `hostile_parent_in_another_process`).
fn transient(e: &rusqlite::Error) -> bool {
    match e {
        rusqlite::Error::SqliteFailure(f, _) => {
            matches!(
                f.code,
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
            ) || matches!(
                f.extended_code,
                rusqlite::ffi::SQLITE_READONLY_RECOVERY | rusqlite::ffi::SQLITE_READONLY_CANTINIT
            )
        }
        _ => false,
    }
}

/// Runs `f` until it stops failing with a [`transient`] error, sleeping `opts.pause` (at
/// least 1 ms) between tries, until `opts.timeout`. With a `guard` (the rollback path),
/// each try runs under it (`header.rs`), and a try the guard's lock is refused for is
/// waited for as a busy answer is.
pub(super) fn retry_busy<T>(
    src: &Path,
    opts: &SnapshotOptions,
    started: Instant,
    action: &'static str,
    guard: Option<&RollbackGuard>,
    mut f: impl FnMut() -> rusqlite::Result<T>,
) -> Result<T, SnapshotError> {
    loop {
        let tried = match guard {
            Some(g) => g.read(&mut f)?,
            None => Some(f()),
        };
        match tried {
            Some(Ok(v)) => return Ok(v),
            Some(Err(e)) if !transient(&e) => return Err(sqlite_err(action, src)(e)),
            _ => {
                if started.elapsed() > opts.timeout {
                    return Err(SnapshotError::Timeout {
                        path: src.to_path_buf(),
                        timeout: opts.timeout,
                    });
                }
                std::thread::sleep(opts.pause.max(Duration::from_millis(1)));
            }
        }
    }
}

/// Runs the check on the copy; returns whether a check ran (and passed). The copy is
/// opened read-only and immutable: the check takes no lock and creates nothing beside it
/// (a WAL-mode copy opened for writing would grow a `-wal` and a `-shm`), so it may run
/// while others copy the snapshot's directory (see `fork evaluate`'s staging).
pub fn check_copy(dest: &Path, check: IntegrityCheck) -> Result<bool, SnapshotError> {
    let pragma = match check {
        IntegrityCheck::Full => "PRAGMA integrity_check",
        IntegrityCheck::Quick => "PRAGMA quick_check",
        IntegrityCheck::Skip => return Ok(false),
    };
    let conn = Connection::open_with_flags(
        super::parent::file_uri(dest, "mode=ro&immutable=1"),
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sqlite_err("open", dest))?;
    // The check reads every page: through a memory map it reads them in place, where
    // read() per page copies each into SQLite's cache (measured: a 100 MiB copy's full
    // check took about 85 ms through read() and 35 ms through the map).
    conn.execute_batch("PRAGMA mmap_size = 1073741824")
        .map_err(sqlite_err("configure", dest))?;
    let lines: Vec<String> = {
        let mut stmt = conn.prepare(pragma).map_err(sqlite_err("check", dest))?;
        let rows = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(sqlite_err("check", dest))?;
        rows.take(20)
            .collect::<Result<_, _>>()
            .map_err(sqlite_err("check", dest))?
    };
    conn.close()
        .map_err(|(_, e)| sqlite_err("close", dest)(e))?;
    if lines.len() == 1 && lines[0] == "ok" {
        Ok(true)
    } else {
        Err(SnapshotError::Corrupt {
            path: dest.to_path_buf(),
            report: lines.join("; "),
        })
    }
}

/// The check and the hash of the finished copy, side by side (both only read it):
/// `(integrity_ok, check time, digest, hash time)`.
pub(super) fn check_and_hash(
    dest: &Path,
    check: IntegrityCheck,
    digest: StateDigest,
) -> Result<(bool, Duration, String, Duration), SnapshotError> {
    check_beside(dest, check, || digest.of_path(dest))
}

/// Opens the snapshot's copy `dest` to read and write, empty: created empty by
/// [`snapshot`](super::snapshot::snapshot), so it is cut only when an earlier attempt
/// wrote into it. Never opened with `O_TRUNC`: on ext4 a file truncated to zero is marked
/// to have its delayed blocks allocated and written out when it is next closed
/// (`auto_da_alloc`), which put the copy's whole writeback (100 MiB on the benchmark's
/// database) in front of the parent's next commit, whose `fsync` then waited 30-50 ms
/// behind it (measured with `benches/snapshot.rs`).
///
/// A copy an earlier attempt wrote into is cut through a descriptor of its own, closed at
/// once: the close that follows the cut writes out the (now empty) file and clears the
/// mark, so that the descriptor returned does not carry it.
pub(super) fn open_emptied(dest: &Path) -> Result<std::fs::File, SnapshotError> {
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dest)
            .map_err(io_err("open", dest))
    };
    let f = open()?;
    if f.metadata().map_err(io_err("stat", dest))?.len() == 0 {
        return Ok(f);
    }
    drop(f);
    let cut = open()?;
    cut.set_len(0).map_err(io_err("truncate", dest))?;
    drop(cut);
    open()
}

/// The check of the finished copy on this thread while `hash` runs on another:
/// `(integrity_ok, check time, digest, hash time)`.
pub(super) fn check_beside(
    dest: &Path,
    check: IntegrityCheck,
    hash: impl FnOnce() -> io::Result<String> + Send,
) -> Result<(bool, Duration, String, Duration), SnapshotError> {
    let (check, hash) = std::thread::scope(|s| {
        let hasher = s.spawn(|| {
            let t = Instant::now();
            (hash(), t.elapsed())
        });
        let t = Instant::now();
        let check = (check_copy(dest, check), t.elapsed());
        // A panic in the hashing thread is a bug (hashing does not panic); report it
        // as an I/O error rather than unwinding through the caller.
        let hash = hasher.join().unwrap_or_else(|_| {
            (
                Err(io::Error::other("the hashing thread panicked")),
                Duration::ZERO,
            )
        });
        (check, hash)
    });
    let (integrity_ok, check_elapsed) = (check.0?, check.1);
    let digest = hash.0.map_err(|source| SnapshotError::Io {
        action: "hash",
        path: dest.to_path_buf(),
        source,
    })?;
    Ok((integrity_ok, check_elapsed, digest, hash.1))
}

#[cfg(test)]
mod retry_tests {
    use super::*;

    fn failure(extended_code: i32) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(extended_code), None)
    }

    /// A read the parent's wal-index state refuses for a moment (another connection
    /// rebuilding or initialising its `-shm`, which a `readonly_shm` reader may not do) is
    /// tried again, as a busy one is; a read-only refusal of another kind, or any other
    /// error, is the snapshot's error at once.
    #[test]
    fn a_wal_index_being_rebuilt_is_waited_for_and_other_refusals_are_not() {
        let src = Path::new("/parent/live.db");
        let opts = SnapshotOptions {
            pause: Duration::from_millis(1),
            ..SnapshotOptions::default()
        };
        for transient_code in [
            rusqlite::ffi::SQLITE_BUSY,
            rusqlite::ffi::SQLITE_LOCKED,
            rusqlite::ffi::SQLITE_READONLY_RECOVERY,
            rusqlite::ffi::SQLITE_READONLY_CANTINIT,
        ] {
            let mut tries = 0;
            let got = retry_busy(src, &opts, Instant::now(), "read", None, || {
                tries += 1;
                if tries < 3 {
                    Err(failure(transient_code))
                } else {
                    Ok(tries)
                }
            });
            assert_eq!(got.unwrap(), 3, "code {transient_code}");
        }
        for final_code in [
            rusqlite::ffi::SQLITE_READONLY,
            rusqlite::ffi::SQLITE_READONLY_DBMOVED,
            rusqlite::ffi::SQLITE_CORRUPT,
        ] {
            let mut tries = 0;
            let got: Result<(), _> = retry_busy(src, &opts, Instant::now(), "read", None, || {
                tries += 1;
                Err(failure(final_code))
            });
            assert!(
                matches!(got, Err(SnapshotError::Sqlite { .. })),
                "code {final_code}: {got:?}"
            );
            assert_eq!(tries, 1, "code {final_code} is not tried again");
        }
        // A transient refusal that lasts is a timeout, named.
        let short = SnapshotOptions {
            timeout: Duration::from_millis(20),
            ..opts.clone()
        };
        let got: Result<(), _> = retry_busy(src, &short, Instant::now(), "read", None, || {
            Err(failure(rusqlite::ffi::SQLITE_READONLY_CANTINIT))
        });
        assert!(matches!(got, Err(SnapshotError::Timeout { .. })), "{got:?}");
    }
}

#[cfg(test)]
mod open_tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::MetadataExt;

    /// The copy is opened empty to read and write, the very file `snapshot` created (never
    /// replaced by another); a copy an earlier attempt wrote into is emptied; a missing
    /// one is an error naming it.
    #[test]
    fn the_copy_is_opened_empty_and_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        for earlier in [&b""[..], &b"an earlier attempt's bytes"[..]] {
            let dest = dir.path().join(format!("c{}.db", earlier.len()));
            std::fs::write(&dest, earlier).unwrap();
            let ino = std::fs::metadata(&dest).unwrap().ino();
            let mut f = open_emptied(&dest).unwrap();
            assert_eq!(f.metadata().unwrap().len(), 0, "{}", earlier.len());
            assert_eq!(std::fs::metadata(&dest).unwrap().ino(), ino);
            f.write_all(b"new").unwrap();
            f.rewind().unwrap();
            let mut back = String::new();
            f.read_to_string(&mut back).unwrap();
            assert_eq!(back, "new");
        }
        let missing = dir.path().join("missing.db");
        let err = open_emptied(&missing).unwrap_err().to_string();
        assert!(err.contains("missing.db"), "{err}");
    }
}
