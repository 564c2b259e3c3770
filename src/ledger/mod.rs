//! The verdict ledger: every verdict `fork` emits is appended to a SQLite database, each
//! row hash-chained to the one before it. `fork history` lists the rows, `fork ledger
//! verify` recomputes the chain, and an evaluation whose patch, state, source, task and
//! policy hashes all match an entry may reuse that entry's verdict (the cache).
//!
//! # Where
//! [`Ledger::default_path`]: `$XDG_DATA_HOME/fork/ledger.db` when `XDG_DATA_HOME` is set
//! to an absolute path, else `~/.local/share/fork/ledger.db`. A directory the ledger
//! creates is mode 0700, the database file 0600 (SQLite gives its `-wal` and `-shm` files
//! the database's mode). Next to the database lives its head record, `<ledger>.head`
//! (see below).
//!
//! # The chain
//! Rows are numbered `seq` = 1, 2, 3, ... Each row stores the previous row's `row_hash`
//! as its `prev_hash` (row 1 stores [`GENESIS_HASH`]) and its own
//! `row_hash = sha256(enc("fork-ledger-row/v1") || enc(prev_hash) || enc(seq) || enc(run_id)
//! || enc(timestamp) || enc(verdict) || enc(confidence) || enc(task) || enc(patch_hash)
//! || enc(state_hash) || enc(source_hash) || enc(task_hash) || enc(policy_hash)
//! || enc(bundle_dir) || enc(verdict_sha256))`, where `enc(x)` is the 8-byte big-endian
//! length of `x` followed by `x` (strings as UTF-8, `seq` as 8 bytes big-endian,
//! `confidence` as the 8 big-endian bytes of its IEEE 754 bits). Length prefixes mean no
//! byte can move from one field to its neighbour without changing the hash.
//!
//! A hash chain alone cannot show that its newest rows were deleted: the shorter chain is
//! still a valid chain. So the head (row count and last `row_hash`) is anchored twice
//! outside the rows: in a one-row `head` table, updated in the same transaction as the
//! insert, and in the sidecar file `<ledger>.head`, rewritten atomically (temporary file,
//! fsync, rename) while the append still holds the database's write lock, so that the
//! sidecar's order of updates is the commits' order. [`Ledger::verify`] compares both with
//! the recomputed chain and says which one disagrees.
//!
//! # Threat model (honestly)
//! * Detected: any edit of any field of any row (including `seq`, `prev_hash` and
//!   `row_hash`), a deleted row (in the middle or at the end), reordered or renumbered
//!   rows, a row inserted outside an append, and a row rewritten with its `row_hash`
//!   recomputed (the next row's `prev_hash`, or the head, no longer matches). Also
//!   accidental damage: a restored old copy of the database, a truncated file, a lost
//!   sidecar.
//! * Not detected: someone who can write both the database and the sidecar and rewrites
//!   them consistently (recomputing every hash from the edit onwards, and both head
//!   records) forges history undetectably. The chain makes accidental and partial edits
//!   evident; it is not a signature. The next step would be to sign the head (count + head
//!   hash) with the node's long-term key after each append, or to publish it elsewhere.
//! * `UPDATE` and `DELETE` on the rows are refused by triggers, which stops accidents, not
//!   an attacker (who can drop the triggers).
//!
//! # The cache
//! [`Ledger::lookup`] returns the newest entry whose five hashes (patch, state, source,
//! task, policy) ALL equal the key's, so a different patch can never hit another patch's
//! entry (the SWE-bench harness's cache was keyed without the patch). Every hash must be
//! spelled `sha256:<64 lowercase hex>`, for appends and lookups alike, so a blank or
//! missing hash cannot match another blank one. Before returning an entry, `lookup`
//! checks that row's own hash and its link to the next row (or to the head). The caller
//! still verifies the bundle in `bundle_dir` (signature, `verdict_sha256`) before reusing
//! it, and decides which verdicts are worth reusing.
//!
//! # Concurrency
//! Each process (or thread) opens its own [`Ledger`]. An append runs in one `BEGIN
//! IMMEDIATE` transaction (read the head, insert, update the head, write the sidecar,
//! commit) with a busy timeout, so concurrent appenders queue and never fork the chain.
//! The database is in WAL mode with `synchronous=FULL`. `verify` also takes the write
//! lock (briefly blocking appenders) so that the database and the sidecar it reads are
//! from the same moment.
//!
//! Before it writes anything, an append reads the sidecar (under the write lock) and
//! refuses ([`LedgerError::Tampered`]) unless it agrees with the head table: a sidecar that
//! records more rows than the database (rows deleted from the end, head table edited to
//! match), fewer, another head hash, or none at all is evidence the append would erase by
//! rewriting it. An unreadable sidecar, or one of another format version (written by a
//! newer fork), is refused by name and never overwritten, by an append and by an open alike.
//!
//! The sidecar is written before the commit. So a crash between the sidecar's rename and
//! the commit leaves the sidecar one row ahead of the database, which is exactly what
//! deleting the newest row (and editing the head table to match) leaves: nothing tells the
//! two apart, so it is never repaired automatically (that would let anyone who can write
//! the database delete its newest row). `verify` reports it (naming the row and the
//! crash); the next append refuses and names the repair: re-anchor the sidecar by hand
//! (the error gives the exact command) if the user knows an evaluation was killed while
//! recording, else restore a backup or move both files aside.

mod cache;
mod chain;
mod entry;
mod head;
mod schema;

#[cfg(test)]
mod test_support;

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::ioerr::IoError;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};

pub use chain::VerifyReport;
pub use entry::{CacheKey, Entry, NewEntry};
pub use schema::GENESIS_HASH;
pub use schema::{APPLICATION_ID, SCHEMA_VERSION};

use chain::compute_row_hash;
use entry::validate_entry;
use head::{read_head_file, write_head_file, HeadRecord};
use schema::{
    check_ids, init_schema, insert_row, read_head_table, read_ids, row_to_entry, COLUMNS,
};

/// How long an append waits for another appender's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Ledger errors; each names the file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger {}: cannot {}: {}", .0.path.display(), .0.action, .0.source)]
    Io(#[from] IoError),
    #[error(
        "ledger {} is not a readable SQLite database ({source}); if it is corrupt, move it \
         aside together with its head record {}.head (keep both for inspection) and fork \
         starts a new ledger",
        path.display(),
        path.display()
    )]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "{} is a SQLite database but not a fork ledger ({detail}); point fork at another \
         file (XDG_DATA_HOME) or move this one aside",
        path.display()
    )]
    NotALedger { path: PathBuf, detail: String },
    #[error(
        "ledger {} has schema version {found}, this fork reads version {supported} only: {}",
        path.display(),
        if found > supported { "upgrade fork" } else { "move the file aside to start a new ledger" }
    )]
    SchemaVersion {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error(
        "ledger {} is missing or empty, but its head record {} says it held {count} rows: \
         the ledger was deleted, moved or emptied; restore it, or remove the head record to \
         start a new ledger",
        path.display(),
        head_path.display()
    )]
    Missing {
        path: PathBuf,
        head_path: PathBuf,
        count: i64,
    },
    #[error(
        "no ledger at {}: nothing was recorded yet (check XDG_DATA_HOME, or run an evaluation first)",
        path.display()
    )]
    NotFound { path: PathBuf },
    #[error("ledger {}: {action}: {source}", path.display())]
    Sql {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "ledger head record {} (the anchor of {} outside the database) cannot be read: {why}; \
         fix it (its permissions, its type), restore it from a backup, or move it aside \
         together with the database (keep both for inspection) to start a new ledger",
        head_path.display(),
        path.display()
    )]
    HeadUnreadable {
        path: PathBuf,
        head_path: PathBuf,
        why: String,
    },
    #[error(
        "ledger head record {} (beside {}) starts `{line}`, a format this fork does not read \
         (it reads `fork-ledger-head v1`): it was written by a newer fork; upgrade fork, or \
         point this one at another ledger (--ledger FILE); the record is left as it is",
        head_path.display(),
        path.display()
    )]
    HeadVersion {
        path: PathBuf,
        head_path: PathBuf,
        line: String,
    },
    #[error("ledger entry: `{field}` {reason}")]
    InvalidEntry { field: &'static str, reason: String },
    #[error("ledger {}: {detail}; run `fork ledger verify` to see what changed", path.display())]
    Tampered { path: PathBuf, detail: String },
}

/// An open ledger (one SQLite connection). Open one per thread or process.
#[derive(Debug)]
pub struct Ledger {
    conn: Connection,
    path: PathBuf,
    head_path: PathBuf,
}

impl Ledger {
    /// `$XDG_DATA_HOME/fork/ledger.db` (when `XDG_DATA_HOME` is an absolute path), else
    /// `$HOME/.local/share/fork/ledger.db` (the home from the password database when
    /// `HOME` is unset).
    pub fn default_path() -> PathBuf {
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                nix::unistd::User::from_uid(nix::unistd::getuid())
                    .ok()
                    .flatten()
                    .map(|u| u.dir)
            });
        default_path_from(std::env::var_os("XDG_DATA_HOME"), home)
    }

    /// The sidecar head record of the ledger at `path`: `<path>.head`.
    pub fn head_path_for(path: &Path) -> PathBuf {
        let mut name = path.as_os_str().to_os_string();
        name.push(".head");
        PathBuf::from(name)
    }

    /// Opens the ledger at `path`, creating it (directory 0700, file 0600, schema, WAL,
    /// head record) when it does not exist. Refuses to create a new ledger where a head
    /// record says an old one held rows ([`LedgerError::Missing`]).
    pub fn open(path: &Path) -> Result<Ledger, LedgerError> {
        Ledger::open_inner(path, true)
    }

    /// Opens an existing ledger; [`LedgerError::NotFound`] when there is none (for `fork
    /// history` and `fork ledger verify`, which should not create one). A database without
    /// fork's ids (an empty file) is refused ([`LedgerError::NotALedger`]) and left as it
    /// is: no schema, no WAL, no head record.
    pub fn open_existing(path: &Path) -> Result<Ledger, LedgerError> {
        Ledger::open_inner(path, false)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The sidecar head record (`<ledger>.head`).
    pub fn head_path(&self) -> &Path {
        &self.head_path
    }

    fn open_inner(path: &Path, create: bool) -> Result<Ledger, LedgerError> {
        let path = path.to_path_buf();
        let head_path = Ledger::head_path_for(&path);
        let exists = match fs::symlink_metadata(&path) {
            Ok(_) => true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(IoError::new("inspect the database file", &path, e).into()),
        };
        if !exists {
            match read_head_file(&head_path) {
                Ok(Some(rec)) if rec.count > 0 => {
                    return Err(LedgerError::Missing {
                        path,
                        head_path,
                        count: rec.count,
                    });
                }
                Ok(_) => {}
                Err(e) => return Err(head::unreadable(&path, &head_path, e)),
            }
            if !create {
                return Err(LedgerError::NotFound { path });
            }
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(|e| {
                        IoError::new(
                            format!(
                                "create its directory {} (check permissions, or set XDG_DATA_HOME)",
                                dir.display()
                            ),
                            &path,
                            e,
                        )
                    })?;
            }
            match fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(_) => {}
                // Another process created it first: fine, it is initialised below.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(IoError::new(
                        "create the database file (check the directory's permissions)",
                        &path,
                        e,
                    )
                    .into())
                }
            }
        }

        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn =
            Connection::open_with_flags(&path, flags).map_err(|source| LedgerError::Open {
                path: path.clone(),
                source,
            })?;
        let open_err = |source| LedgerError::Open {
            path: path.clone(),
            source,
        };
        conn.busy_timeout(BUSY_TIMEOUT).map_err(open_err)?;
        // The first read of the file: garbage fails here with "file is not a database".
        let (app_id, version) = read_ids(&conn).map_err(open_err)?;
        if app_id == 0 && version == 0 {
            if !create {
                // `fork history` and `ledger verify` never turn a file into a ledger.
                return Err(not_created(path, head_path));
            }
            init_schema(&conn, &path, &head_path)?;
        } else {
            check_ids(&path, app_id, version)?;
        }
        let _: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
            .map_err(|source| sql_err(&path, "switch to WAL mode", source))?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(|source| sql_err(&path, "set synchronous=FULL", source))?;
        Ok(Ledger {
            conn,
            path,
            head_path,
        })
    }

    /// Appends `e` as the next row and returns it with its seq and hashes. One IMMEDIATE
    /// transaction: read the head, check it against the last row and the sidecar, insert,
    /// update the head, rewrite the sidecar, commit. Refuses ([`LedgerError::Tampered`])
    /// when the head table disagrees with the last row or with the sidecar (a tail
    /// deletion, or a crash between the sidecar's rename and the commit, see the module
    /// docs), or the sidecar is missing: appending would bury the evidence.
    pub fn append(&mut self, e: &NewEntry) -> Result<Entry, LedgerError> {
        validate_entry(e)?;
        let path = self.path.clone();
        let head_path = self.head_path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|s| {
                sql_err(
                    &path,
                    "begin an append (is another fork holding the ledger?)",
                    s,
                )
            })?;
        let head = read_head_table(&tx)
            .map_err(|s| sql_err(&path, "read the head table", s))?
            .ok_or_else(|| LedgerError::Tampered {
                path: path.clone(),
                detail: "the head table is empty".to_string(),
            })?;
        let last: Option<(i64, String)> = tx
            .query_row(
                "SELECT seq, row_hash FROM entries ORDER BY seq DESC LIMIT 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(|s| sql_err(&path, "read the last row", s))?;
        let (last_seq, last_hash) = last.unwrap_or((0, GENESIS_HASH.to_string()));
        if last_seq != head.count || last_hash != head.head_hash {
            return Err(LedgerError::Tampered {
                path,
                detail: format!(
                    "refusing to append: the head table records {} rows, the last row is seq {last_seq}{}",
                    head.count,
                    if last_seq == head.count { " but its row_hash differs from the head hash" } else { "" }
                ),
            });
        }
        head::check_sidecar(&path, &head_path, &head)?;
        let mut entry = Entry {
            seq: head.count + 1,
            run_id: e.run_id.clone(),
            timestamp: e.timestamp.clone(),
            verdict: e.verdict.clone(),
            // -0.0 would come back as 0.0 (SQLite stores integral REALs as integers).
            confidence: e.confidence + 0.0,
            task: e.task.clone(),
            patch_hash: e.patch_hash.clone(),
            state_hash: e.state_hash.clone(),
            source_hash: e.source_hash.clone(),
            task_hash: e.task_hash.clone(),
            policy_hash: e.policy_hash.clone(),
            bundle_dir: e.bundle_dir.clone(),
            verdict_sha256: e.verdict_sha256.clone(),
            prev_hash: head.head_hash.clone(),
            row_hash: String::new(),
        };
        entry.row_hash = compute_row_hash(&entry);
        insert_row(&tx, &entry).map_err(|s| sql_err(&path, "insert the row", s))?;
        tx.execute(
            "UPDATE head SET count = ?1, head_hash = ?2 WHERE id = 1",
            params![entry.seq, entry.row_hash],
        )
        .map_err(|s| sql_err(&path, "update the head table", s))?;
        let new_head = HeadRecord {
            count: entry.seq,
            head_hash: entry.row_hash.clone(),
        };
        // Written while the write lock is held, so sidecar updates happen in commit order;
        // and never cut apart from the commit by an interrupt (the head would then say a
        // row more than the table holds: a deleted row, to `verify`).
        let _whole = crate::critical::enter();
        if let Err(err) = write_head_file(&head_path, &new_head) {
            // The rename may have happened before a failing directory fsync: put it back.
            let _ = write_head_file(&head_path, &head);
            return Err(IoError::new("write the head record", &head_path, err).into());
        }
        if let Err(s) = tx.commit() {
            // Best effort: the sidecar must not run ahead of the database.
            let _ = write_head_file(&head_path, &head);
            return Err(sql_err(&path, "commit the append", s));
        }
        Ok(entry)
    }

    /// The rows, newest first; at most `limit` of them.
    pub fn history(&self, limit: Option<usize>) -> Result<Vec<Entry>, LedgerError> {
        let limit = limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {COLUMNS} FROM entries ORDER BY seq DESC LIMIT ?1"
            ))
            .map_err(|s| sql_err(&self.path, "read the history", s))?;
        let rows = stmt
            .query_map([limit], row_to_entry)
            .map_err(|s| sql_err(&self.path, "read the history", s))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|s| sql_err(&self.path, "read the history", s))
    }
}

/// [`Ledger::default_path`] from explicit values (testable without touching the
/// environment).
fn default_path_from(xdg_data_home: Option<OsString>, home: Option<PathBuf>) -> PathBuf {
    let base = match xdg_data_home.map(PathBuf::from).filter(|p| p.is_absolute()) {
        Some(dir) => dir,
        // No home at all: a relative path (the current directory); never /tmp.
        None => home.unwrap_or_default().join(".local").join("share"),
    };
    base.join("fork").join("ledger.db")
}

/// [`Ledger::open_existing`] on a database without fork's ids (an empty file, or a ledger
/// being created at this moment): left as it is, and said so.
fn not_created(path: PathBuf, head_path: PathBuf) -> LedgerError {
    match read_head_file(&head_path) {
        Ok(Some(rec)) if rec.count > 0 => LedgerError::Missing {
            path,
            head_path,
            count: rec.count,
        },
        Err(e) => head::unreadable(&path, &head_path, e),
        Ok(_) => LedgerError::NotALedger {
            path,
            detail: "it has no fork ledger ids (application_id and user_version are 0: an \
                     empty file, or a ledger being created right now), and reading it never \
                     makes it one; left as it is"
                .to_string(),
        },
    }
}

pub(super) fn sql_err(path: &Path, action: &'static str, source: rusqlite::Error) -> LedgerError {
    LedgerError::Sql {
        path: path.to_path_buf(),
        action,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn append_history_round_trip() {
        let (_d, l, appended) = ledger_with(3);
        assert_eq!(
            appended.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert_eq!(appended[0].prev_hash, GENESIS_HASH);
        assert_eq!(appended[1].prev_hash, appended[0].row_hash);
        assert_eq!(appended[2].prev_hash, appended[1].row_hash);
        let e = new_entry(2);
        assert_eq!(appended[1].run_id, e.run_id);
        assert_eq!(appended[1].confidence, e.confidence);
        assert_eq!(appended[1].verdict_sha256, e.verdict_sha256);

        let all = l.history(None).unwrap();
        let mut newest_first = appended.clone();
        newest_first.reverse();
        assert_eq!(all, newest_first);
        assert_eq!(l.history(Some(2)).unwrap(), newest_first[..2].to_vec());
        assert!(l.history(Some(0)).unwrap().is_empty());

        // Reopening sees the same rows; confidence 0 and 1 survive SQLite's integer storage.
        let path = l.path().to_path_buf();
        drop(l);
        let mut l = Ledger::open(&path).unwrap();
        assert_eq!(l.history(None).unwrap(), newest_first);
        for c in [0.0, -0.0, 1.0] {
            let mut e = new_entry(9);
            e.confidence = c;
            l.append(&e).unwrap();
        }
        let report = l.verify().unwrap();
        assert!(report.ok, "{report:?}");
        assert_eq!(report.rows, 6);
    }

    #[test]
    fn created_with_private_modes_and_sidecar() {
        let (d, l, _) = ledger_with(1);
        let dir_mode = fs::metadata(d.path().join("fork"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        let file_mode = fs::metadata(l.path()).unwrap().permissions().mode();
        assert_eq!(file_mode & 0o777, 0o600);
        let side_mode = fs::metadata(l.head_path()).unwrap().permissions().mode();
        assert_eq!(side_mode & 0o777, 0o600);
        let head = read_head_file(l.head_path()).unwrap().unwrap();
        assert_eq!(head.count, 1);
        assert_eq!(head.head_hash, l.history(None).unwrap()[0].row_hash);
        let journal: String = l
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(journal, "wal");
        // No temporary sidecar is left behind.
        let leftovers: Vec<_> = fs::read_dir(d.path().join("fork"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    /// An interrupt ends the process only outside a [`crate::critical`] section: whenever
    /// no section is held, the head record and the table agree (cut between its head record
    /// and its commit, an append left the head a row ahead: a deleted row, to `verify`).
    /// Looked at 200 times while another thread appends.
    #[test]
    fn outside_a_critical_section_the_head_and_the_table_agree() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        drop(Ledger::open(&path).unwrap());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let appender = {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut l = Ledger::open(&path).unwrap();
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    l.append(&new_entry(i)).unwrap();
                    i += 1;
                }
                i
            })
        };
        let reader = Ledger::open(&path).unwrap();
        let head_path = reader.head_path().to_path_buf();
        let mut apart = 0;
        for _ in 0..200 {
            crate::critical::end_outside(|| {
                let head = read_head_file(&head_path).unwrap().map_or(0, |h| h.count);
                let rows: i64 = reader
                    .conn
                    .query_row("SELECT COUNT(*) FROM entries", [], |r| r.get(0))
                    .unwrap();
                if head != rows {
                    apart += 1;
                }
            });
            std::thread::sleep(std::time::Duration::from_micros(300));
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let appended = appender.join().unwrap();
        assert!(appended > 0);
        assert_eq!(
            apart, 0,
            "the head and the table disagreed outside a section"
        );
    }

    #[test]
    fn concurrent_appenders_keep_one_chain() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        drop(Ledger::open(&path).unwrap());
        let handles: Vec<_> = (0..2)
            .map(|t| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut l = Ledger::open(&path).unwrap();
                    for i in 0..50 {
                        let mut e = new_entry(t * 100 + i);
                        e.run_id = format!("thread{t}-{i}");
                        l.append(&e).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let l = Ledger::open(&path).unwrap();
        let r = l.verify().unwrap();
        assert!(r.ok, "{r:?}");
        assert_eq!(r.rows, 100);
        let hist = l.history(None).unwrap();
        let seqs: Vec<i64> = hist.iter().rev().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=100).collect::<Vec<_>>());
        for t in 0..2 {
            let mine: Vec<_> = hist
                .iter()
                .rev()
                .filter(|e| e.run_id.starts_with(&format!("thread{t}-")))
                .map(|e| e.run_id.clone())
                .collect();
            let expected: Vec<_> = (0..50).map(|i| format!("thread{t}-{i}")).collect();
            assert_eq!(mine, expected, "thread {t}'s rows in its own order");
        }
        assert_eq!(read_head_file(l.head_path()).unwrap().unwrap().count, 100);
    }

    /// Helper for `concurrent_processes_keep_one_chain`: run only in a child process.
    #[test]
    #[ignore = "child process of concurrent_processes_keep_one_chain"]
    fn child_appender() {
        let path = std::env::var_os("FORK_LEDGER_TEST_DB").expect("run by the parent test");
        let tag = std::env::var("FORK_LEDGER_TEST_TAG").unwrap();
        let mut l = Ledger::open(Path::new(&path)).unwrap();
        for i in 0..50 {
            let mut e = new_entry(i);
            e.run_id = format!("{tag}-{i}");
            l.append(&e).unwrap();
        }
    }

    #[test]
    fn concurrent_processes_keep_one_chain() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        drop(Ledger::open(&path).unwrap());
        let exe = std::env::current_exe().unwrap();
        let children: Vec<_> = ["procA", "procB"]
            .iter()
            .map(|tag| {
                std::process::Command::new(&exe)
                    .args([
                        "--exact",
                        "ledger::tests::child_appender",
                        "--ignored",
                        "--test-threads=1",
                    ])
                    .env("FORK_LEDGER_TEST_DB", &path)
                    .env("FORK_LEDGER_TEST_TAG", tag)
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for mut c in children {
            assert!(c.wait().unwrap().success());
        }
        let l = Ledger::open(&path).unwrap();
        let r = l.verify().unwrap();
        assert!(r.ok, "{r:?}");
        assert_eq!(r.rows, 100);
        let hist = l.history(None).unwrap();
        for tag in ["procA", "procB"] {
            let n = hist.iter().filter(|e| e.run_id.starts_with(tag)).count();
            assert_eq!(n, 50, "{tag}");
        }
    }

    #[test]
    fn corrupt_missing_and_foreign_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.db");
        fs::write(&bad, vec![0x42u8; 8192]).unwrap();
        let err = Ledger::open(&bad).unwrap_err();
        assert!(matches!(err, LedgerError::Open { .. }), "{err}");
        assert!(
            err.to_string().contains(&bad.display().to_string()),
            "{err}"
        );

        let absent = dir.path().join("absent.db");
        let err = Ledger::open_existing(&absent).unwrap_err();
        assert!(matches!(err, LedgerError::NotFound { .. }), "{err}");
        assert!(err.to_string().contains(&absent.display().to_string()));
        assert!(!absent.exists());

        // The database deleted but its head record kept: refuse to start over silently.
        let (_d, l, _) = ledger_with(2);
        let path = l.path().to_path_buf();
        drop(l);
        for suffix in ["", "-wal", "-shm"] {
            let mut p = path.as_os_str().to_os_string();
            p.push(suffix);
            let _ = fs::remove_file(PathBuf::from(p));
        }
        let err = Ledger::open(&path).unwrap_err();
        assert!(
            matches!(err, LedgerError::Missing { count: 2, .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        assert!(!path.exists());

        // An empty file is not made a ledger by reading it (history, ledger verify).
        let empty = dir.path().join("empty.db");
        fs::write(&empty, b"").unwrap();
        let err = Ledger::open_existing(&empty).unwrap_err();
        assert!(matches!(err, LedgerError::NotALedger { .. }), "{err}");
        assert!(
            err.to_string().contains(&empty.display().to_string()),
            "{err}"
        );
        assert_eq!(fs::metadata(&empty).unwrap().len(), 0);
        let beside: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("empty.db"))
            .collect();
        assert_eq!(beside, ["empty.db"]);

        let foreign = dir.path().join("foreign.db");
        Connection::open(&foreign)
            .unwrap()
            .execute_batch("CREATE TABLE t (x)")
            .unwrap();
        let err = Ledger::open(&foreign).unwrap_err();
        assert!(matches!(err, LedgerError::NotALedger { .. }), "{err}");

        let (_d, l, _) = ledger_with(1);
        l.conn.pragma_update(None, "user_version", 7).unwrap();
        let path = l.path().to_path_buf();
        drop(l);
        let err = Ledger::open(&path).unwrap_err();
        assert!(
            matches!(
                err,
                LedgerError::SchemaVersion {
                    found: 7,
                    supported: 1,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("upgrade fork"), "{err}");
    }

    #[test]
    fn default_path_follows_xdg() {
        assert_eq!(
            default_path_from(Some("/data".into()), Some("/home/u".into())),
            PathBuf::from("/data/fork/ledger.db")
        );
        // Relative XDG_DATA_HOME is ignored (XDG base directory spec).
        assert_eq!(
            default_path_from(Some("rel".into()), Some("/home/u".into())),
            PathBuf::from("/home/u/.local/share/fork/ledger.db")
        );
        assert_eq!(
            default_path_from(None, Some("/home/u".into())),
            PathBuf::from("/home/u/.local/share/fork/ledger.db")
        );
        assert!(Ledger::default_path().ends_with("fork/ledger.db"));
        assert_eq!(
            Ledger::head_path_for(Path::new("/x/ledger.db")),
            PathBuf::from("/x/ledger.db.head")
        );
    }
}
