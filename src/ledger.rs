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
//! A crash between the sidecar's rename and the commit leaves the sidecar one row ahead of
//! the database; `verify` then reports the sidecar as disagreeing (naming the row), which
//! is indistinguishable from a deleted last row, and says so.

use rusqlite::types::Value;
use rusqlite::{
    params, Connection, OpenFlags, OptionalExtension, Transaction, TransactionBehavior,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The schema version this code writes and reads (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 1;
/// `PRAGMA application_id` of a ledger: "fork" in ASCII.
pub const APPLICATION_ID: i64 = 0x666f_726b;
/// `prev_hash` of row 1, and the head hash of an empty ledger.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// How long an append waits for another appender's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);
/// Domain separation for row hashes.
const ROW_DOMAIN: &[u8] = b"fork-ledger-row/v1";
/// First line of the sidecar head record.
const HEAD_MAGIC: &str = "fork-ledger-head v1";
/// At most this many problems are listed by `verify`; the rest are counted.
const MAX_PROBLEMS: usize = 200;

const COLUMNS: &str = "seq, run_id, timestamp, verdict, confidence, task, patch_hash, \
     state_hash, source_hash, task_hash, policy_hash, bundle_dir, verdict_sha256, prev_hash, row_hash";

const SCHEMA: &str = "
CREATE TABLE entries (
    seq            INTEGER PRIMARY KEY,
    run_id         TEXT NOT NULL,
    timestamp      TEXT NOT NULL,
    verdict        TEXT NOT NULL,
    confidence     REAL NOT NULL,
    task           TEXT NOT NULL,
    patch_hash     TEXT NOT NULL,
    state_hash     TEXT NOT NULL,
    source_hash    TEXT NOT NULL,
    task_hash      TEXT NOT NULL,
    policy_hash    TEXT NOT NULL,
    bundle_dir     TEXT NOT NULL,
    verdict_sha256 TEXT NOT NULL,
    prev_hash      TEXT NOT NULL,
    row_hash       TEXT NOT NULL
) STRICT;
CREATE INDEX entries_cache_key
    ON entries (patch_hash, state_hash, source_hash, task_hash, policy_hash, seq);
CREATE TABLE head (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    count     INTEGER NOT NULL,
    head_hash TEXT NOT NULL
) STRICT;
CREATE TRIGGER entries_no_update BEFORE UPDATE ON entries
    BEGIN SELECT RAISE(ABORT, 'fork ledger entries are append-only'); END;
CREATE TRIGGER entries_no_delete BEFORE DELETE ON entries
    BEGIN SELECT RAISE(ABORT, 'fork ledger entries are append-only'); END;
";

/// One ledger row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub seq: i64,
    pub run_id: String,
    /// RFC 3339 (the verdict's `header.timestamp`).
    pub timestamp: String,
    /// `APPROVE`, `REJECT` or `NEEDS_REVISION`.
    pub verdict: String,
    pub confidence: f64,
    pub task: String,
    pub patch_hash: String,
    pub state_hash: String,
    pub source_hash: String,
    pub task_hash: String,
    pub policy_hash: String,
    /// The run's bundle directory (`out/<run-id>`).
    pub bundle_dir: String,
    /// Bare lowercase hex sha256 of the `verdict.json` bytes.
    pub verdict_sha256: String,
    /// The previous row's `row_hash` ([`GENESIS_HASH`] for seq 1), bare hex.
    pub prev_hash: String,
    /// This row's hash (see the module docs), bare hex.
    pub row_hash: String,
}

/// What a caller appends: an [`Entry`] without `seq`, `prev_hash` and `row_hash`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewEntry {
    pub run_id: String,
    pub timestamp: String,
    pub verdict: String,
    pub confidence: f64,
    pub task: String,
    pub patch_hash: String,
    pub state_hash: String,
    pub source_hash: String,
    pub task_hash: String,
    pub policy_hash: String,
    pub bundle_dir: String,
    pub verdict_sha256: String,
}

/// The cache key: an evaluation is the same evaluation only if all five hashes match.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CacheKey {
    pub patch_hash: String,
    pub state_hash: String,
    pub source_hash: String,
    pub task_hash: String,
    pub policy_hash: String,
}

impl Entry {
    /// This entry's cache key.
    pub fn cache_key(&self) -> CacheKey {
        CacheKey {
            patch_hash: self.patch_hash.clone(),
            state_hash: self.state_hash.clone(),
            source_hash: self.source_hash.clone(),
            task_hash: self.task_hash.clone(),
            policy_hash: self.policy_hash.clone(),
        }
    }
}

impl NewEntry {
    /// This entry's cache key.
    pub fn cache_key(&self) -> CacheKey {
        CacheKey {
            patch_hash: self.patch_hash.clone(),
            state_hash: self.state_hash.clone(),
            source_hash: self.source_hash.clone(),
            task_hash: self.task_hash.clone(),
            policy_hash: self.policy_hash.clone(),
        }
    }
}

/// The outcome of [`Ledger::verify`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// Rows in the table.
    pub rows: usize,
    /// No problem found.
    pub ok: bool,
    /// One line per problem, naming the seq and what is wrong.
    pub problems: Vec<String>,
}

/// Ledger errors; each names the file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger {}: {action}: {source}", path.display())]
    Io {
        path: PathBuf,
        action: String,
        #[source]
        source: io::Error,
    },
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
    #[error("ledger entry: `{field}` {reason}")]
    InvalidEntry { field: &'static str, reason: String },
    #[error("ledger {}: {detail}; run `fork ledger verify` to see what changed", path.display())]
    Tampered { path: PathBuf, detail: String },
}

/// The head record: how many rows were appended and the last one's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HeadRecord {
    count: i64,
    head_hash: String,
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
    /// history` and `fork ledger verify`, which should not create one).
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
            Err(e) => return Err(io_err(&path, "cannot inspect the database file", e)),
        };
        if !exists {
            if let Some(rec) = read_head_file(&head_path).ok().flatten() {
                if rec.count > 0 {
                    return Err(LedgerError::Missing {
                        path,
                        head_path,
                        count: rec.count,
                    });
                }
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
                        io_err(
                            &path,
                            &format!(
                                "cannot create its directory {} (check permissions, or set XDG_DATA_HOME)",
                                dir.display()
                            ),
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
                    return Err(io_err(
                        &path,
                        "cannot create the database file (check the directory's permissions)",
                        e,
                    ))
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
    /// transaction: read the head, check it against the last row, insert, update the head,
    /// rewrite the sidecar, commit. Refuses ([`LedgerError::Tampered`]) when the head table
    /// and the last row disagree (a tail deletion): appending would bury the evidence.
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
        // Written while the write lock is held, so sidecar updates happen in commit order.
        if let Err(err) = write_head_file(&head_path, &new_head) {
            // The rename may have happened before a failing directory fsync: put it back.
            let _ = write_head_file(&head_path, &head);
            return Err(io_err(&head_path, "cannot write the head record", err));
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

    /// Recomputes the whole chain and compares its end with the head table and the
    /// sidecar. Every edited, deleted, reordered or inserted row is reported by seq.
    pub fn verify(&self) -> Result<VerifyReport, LedgerError> {
        let path = &self.path;
        // The write lock: no append is between its sidecar write and its commit.
        let tx = Transaction::new_unchecked(&self.conn, TransactionBehavior::Immediate).map_err(
            |s| {
                sql_err(
                    path,
                    "begin verification (is another fork holding the ledger?)",
                    s,
                )
            },
        )?;
        let rows: Vec<Entry> = {
            let mut stmt = tx
                .prepare(&format!("SELECT {COLUMNS} FROM entries ORDER BY seq ASC"))
                .map_err(|s| sql_err(path, "read the rows", s))?;
            let it = stmt
                .query_map([], row_to_entry)
                .map_err(|s| sql_err(path, "read the rows", s))?;
            it.collect::<Result<_, _>>()
                .map_err(|s| sql_err(path, "read the rows", s))?
        };
        let head_table =
            read_head_table(&tx).map_err(|s| sql_err(path, "read the head table", s))?;
        let sidecar = read_head_file(&self.head_path);
        drop(tx); // read only: rolls back

        let mut problems = Vec::new();
        let (last_seq, last_hash) = check_chain(&rows, &mut problems);
        match head_table {
            Some(h) => {
                if let Some(p) = compare_head("the head table", &h, last_seq, &last_hash) {
                    problems.push(p);
                }
            }
            None => problems.push(
                "the head table is empty: its record of the newest row was deleted".to_string(),
            ),
        }
        let side_name = format!("the head record {}", self.head_path.display());
        match sidecar {
            Ok(Some(h)) => {
                if let Some(p) = compare_head(&side_name, &h, last_seq, &last_hash) {
                    let crash_like = h.count == last_seq + 1;
                    problems.push(if crash_like {
                        format!(
                            "{p}; an append that crashed between writing the head record \
                             and committing looks the same"
                        )
                    } else {
                        p
                    });
                }
            }
            Ok(None) => problems.push(format!(
                "{side_name} is missing: the anchor outside the database was deleted"
            )),
            Err(why) => problems.push(format!("{side_name} is unreadable: {why}")),
        }
        if problems.len() > MAX_PROBLEMS {
            let more = problems.len() - MAX_PROBLEMS;
            problems.truncate(MAX_PROBLEMS);
            problems.push(format!("... and {more} more problems"));
        }
        Ok(VerifyReport {
            rows: rows.len(),
            ok: problems.is_empty(),
            problems,
        })
    }

    /// The newest entry whose five hashes all equal `key`'s, after checking that row's own
    /// hash and its link to the next row (or to the head table).
    pub fn lookup(&self, key: &CacheKey) -> Result<Option<Entry>, LedgerError> {
        for (field, value) in [
            ("patch_hash", &key.patch_hash),
            ("state_hash", &key.state_hash),
            ("source_hash", &key.source_hash),
            ("task_hash", &key.task_hash),
            ("policy_hash", &key.policy_hash),
        ] {
            check_digest(field, value)?;
        }
        let path = &self.path;
        let tx = Transaction::new_unchecked(&self.conn, TransactionBehavior::Deferred)
            .map_err(|s| sql_err(path, "begin a cache lookup", s))?;
        let found = tx
            .query_row(
                &format!(
                    "SELECT {COLUMNS} FROM entries WHERE patch_hash = ?1 AND state_hash = ?2 \
                     AND source_hash = ?3 AND task_hash = ?4 AND policy_hash = ?5 \
                     ORDER BY seq DESC LIMIT 1"
                ),
                params![
                    key.patch_hash,
                    key.state_hash,
                    key.source_hash,
                    key.task_hash,
                    key.policy_hash
                ],
                row_to_entry,
            )
            .optional()
            .map_err(|s| sql_err(path, "look up the cache", s))?;
        let Some(entry) = found else {
            return Ok(None);
        };
        if compute_row_hash(&entry) != entry.row_hash {
            return Err(LedgerError::Tampered {
                path: path.clone(),
                detail: format!(
                    "the cached entry seq {} does not match its row_hash (edited)",
                    entry.seq
                ),
            });
        }
        let next_prev: Option<String> = tx
            .query_row(
                "SELECT prev_hash FROM entries WHERE seq = ?1",
                [entry.seq + 1],
                |r| r.get(0),
            )
            .optional()
            .map_err(|s| sql_err(path, "look up the cache", s))?;
        let anchor = match next_prev {
            Some(p) => Some(p),
            None => read_head_table(&tx)
                .map_err(|s| sql_err(path, "read the head table", s))?
                .filter(|h| h.count == entry.seq)
                .map(|h| h.head_hash),
        };
        if anchor.as_deref() != Some(entry.row_hash.as_str()) {
            return Err(LedgerError::Tampered {
                path: path.clone(),
                detail: format!(
                    "the cached entry seq {} is not linked into the chain (rewritten, or a neighbour deleted)",
                    entry.seq
                ),
            });
        }
        Ok(Some(entry))
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

fn io_err(path: &Path, action: &str, source: io::Error) -> LedgerError {
    LedgerError::Io {
        path: path.to_path_buf(),
        action: action.to_string(),
        source,
    }
}

fn sql_err(path: &Path, action: &'static str, source: rusqlite::Error) -> LedgerError {
    LedgerError::Sql {
        path: path.to_path_buf(),
        action,
        source,
    }
}

fn read_ids(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
    let app_id: i64 = conn.query_row("PRAGMA application_id", [], |r| r.get(0))?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    Ok((app_id, version))
}

fn check_ids(path: &Path, app_id: i64, version: i64) -> Result<(), LedgerError> {
    if app_id != APPLICATION_ID {
        return Err(LedgerError::NotALedger {
            path: path.to_path_buf(),
            detail: format!("application_id is {app_id:#x}, a ledger's is {APPLICATION_ID:#x}"),
        });
    }
    if version != SCHEMA_VERSION {
        return Err(LedgerError::SchemaVersion {
            path: path.to_path_buf(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(())
}

/// Creates the schema in an empty database (racing openers: the first one wins, the
/// others see the ids set).
fn init_schema(conn: &Connection, path: &Path, head_path: &Path) -> Result<(), LedgerError> {
    let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)
        .map_err(|s| sql_err(path, "begin creating the schema", s))?;
    let (app_id, version) = read_ids(&tx).map_err(|s| sql_err(path, "read the schema ids", s))?;
    if app_id != 0 || version != 0 {
        return check_ids(path, app_id, version);
    }
    let tables: i64 = tx
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(|s| sql_err(path, "read the schema", s))?;
    if tables != 0 {
        return Err(LedgerError::NotALedger {
            path: path.to_path_buf(),
            detail: format!("it holds {tables} other schema objects and no ledger ids"),
        });
    }
    if let Ok(Some(rec)) = read_head_file(head_path) {
        if rec.count > 0 {
            return Err(LedgerError::Missing {
                path: path.to_path_buf(),
                head_path: head_path.to_path_buf(),
                count: rec.count,
            });
        }
    }
    tx.execute_batch(SCHEMA)
        .map_err(|s| sql_err(path, "create the schema", s))?;
    tx.execute(
        "INSERT INTO head (id, count, head_hash) VALUES (1, 0, ?1)",
        [GENESIS_HASH],
    )
    .map_err(|s| sql_err(path, "create the head table", s))?;
    tx.pragma_update(None, "application_id", APPLICATION_ID)
        .map_err(|s| sql_err(path, "set the application id", s))?;
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(|s| sql_err(path, "set the schema version", s))?;
    let genesis = HeadRecord {
        count: 0,
        head_hash: GENESIS_HASH.to_string(),
    };
    write_head_file(head_path, &genesis)
        .map_err(|e| io_err(head_path, "cannot write the head record", e))?;
    tx.commit()
        .map_err(|s| sql_err(path, "commit the new schema", s))
}

fn read_head_table(conn: &Connection) -> rusqlite::Result<Option<HeadRecord>> {
    conn.query_row("SELECT count, head_hash FROM head WHERE id = 1", [], |r| {
        Ok(HeadRecord {
            count: r.get(0)?,
            head_hash: r.get(1)?,
        })
    })
    .optional()
}

fn insert_row(conn: &Connection, e: &Entry) -> rusqlite::Result<()> {
    conn.execute(
        &format!(
            "INSERT INTO entries ({COLUMNS}) VALUES \
             (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
        ),
        params![
            e.seq,
            e.run_id,
            e.timestamp,
            e.verdict,
            e.confidence,
            e.task,
            e.patch_hash,
            e.state_hash,
            e.source_hash,
            e.task_hash,
            e.policy_hash,
            e.bundle_dir,
            e.verdict_sha256,
            e.prev_hash,
            e.row_hash
        ],
    )
    .map(|_| ())
}

fn row_to_entry(r: &rusqlite::Row<'_>) -> rusqlite::Result<Entry> {
    // STRICT tables keep the types; REAL is read as Value to accept an integral REAL
    // whatever way the driver hands it back.
    let confidence = match r.get::<_, Value>(4)? {
        Value::Real(f) => f,
        Value::Integer(i) => i as f64,
        other => {
            return Err(rusqlite::Error::InvalidColumnType(
                4,
                "confidence".to_string(),
                other.data_type(),
            ))
        }
    };
    Ok(Entry {
        seq: r.get(0)?,
        run_id: r.get(1)?,
        timestamp: r.get(2)?,
        verdict: r.get(3)?,
        confidence,
        task: r.get(5)?,
        patch_hash: r.get(6)?,
        state_hash: r.get(7)?,
        source_hash: r.get(8)?,
        task_hash: r.get(9)?,
        policy_hash: r.get(10)?,
        bundle_dir: r.get(11)?,
        verdict_sha256: r.get(12)?,
        prev_hash: r.get(13)?,
        row_hash: r.get(14)?,
    })
}

fn put(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

/// The row hash (module docs): length-prefixed fields, seq and prev_hash included.
fn compute_row_hash(e: &Entry) -> String {
    let mut h = Sha256::new();
    put(&mut h, ROW_DOMAIN);
    put(&mut h, e.prev_hash.as_bytes());
    put(&mut h, &e.seq.to_be_bytes());
    put(&mut h, e.run_id.as_bytes());
    put(&mut h, e.timestamp.as_bytes());
    put(&mut h, e.verdict.as_bytes());
    put(&mut h, &e.confidence.to_bits().to_be_bytes());
    put(&mut h, e.task.as_bytes());
    put(&mut h, e.patch_hash.as_bytes());
    put(&mut h, e.state_hash.as_bytes());
    put(&mut h, e.source_hash.as_bytes());
    put(&mut h, e.task_hash.as_bytes());
    put(&mut h, e.policy_hash.as_bytes());
    put(&mut h, e.bundle_dir.as_bytes());
    put(&mut h, e.verdict_sha256.as_bytes());
    hex::encode(h.finalize())
}

fn seq_range(from: i64, to: i64) -> String {
    if from == to {
        format!("seq {from}")
    } else {
        format!("seq {from}..{to}")
    }
}

/// Walks the rows in seq order, pushes one problem per anomaly, and returns the chain's
/// end as stored (last seq and its row_hash; 0 and genesis when empty).
fn check_chain(rows: &[Entry], problems: &mut Vec<String>) -> (i64, String) {
    let by_hash: HashMap<&str, i64> = rows.iter().map(|r| (r.row_hash.as_str(), r.seq)).collect();
    let mut expect_seq = 1i64;
    let mut expect_prev = GENESIS_HASH.to_string();
    let mut prev_flagged = false;
    let mut end = (0i64, GENESIS_HASH.to_string());
    for r in rows {
        let recomputed = compute_row_hash(r);
        let self_ok = recomputed == r.row_hash;
        if r.seq < expect_seq {
            // Only a seq below 1 can get here (seqs are unique and sorted).
            problems.push(format!(
                "seq {}: outside the chain (seqs start at 1): a row was inserted outside an append",
                r.seq
            ));
            continue;
        }
        let mut flagged = false;
        if r.seq > expect_seq {
            problems.push(format!(
                "{} missing: deleted (or renumbered) rows before seq {}",
                seq_range(expect_seq, r.seq - 1),
                r.seq
            ));
            flagged = true;
        } else if self_ok && r.prev_hash != expect_prev && !prev_flagged {
            problems.push(format!(
                "seq {}: rewritten with its row_hash recomputed (seq {}'s prev_hash no longer matches it)",
                r.seq - 1,
                r.seq
            ));
            flagged = true;
        }
        if !self_ok {
            let origin = if r.prev_hash == GENESIS_HASH {
                Some(1)
            } else {
                by_hash.get(r.prev_hash.as_str()).map(|s| s + 1)
            };
            let moved_from = origin.filter(|&o| {
                o != r.seq && {
                    let mut probe = r.clone();
                    probe.seq = o;
                    compute_row_hash(&probe) == r.row_hash
                }
            });
            problems.push(match moved_from {
                Some(o) => format!(
                    "seq {}: holds the row appended as seq {o} (rows reordered or renumbered)",
                    r.seq
                ),
                None => format!(
                    "seq {}: edited (its fields no longer hash to its row_hash)",
                    r.seq
                ),
            });
            flagged = true;
        }
        prev_flagged = flagged;
        expect_seq = r.seq + 1;
        expect_prev = r.row_hash.clone();
        end = (r.seq, r.row_hash.clone());
    }
    end
}

/// `None` when the head record `h` matches the chain's end; else what disagrees.
fn compare_head(name: &str, h: &HeadRecord, last_seq: i64, last_hash: &str) -> Option<String> {
    if h.count > last_seq {
        Some(format!(
            "{name} records {} rows but the table ends at seq {last_seq}: {} deleted (or it was edited)",
            h.count,
            seq_range(last_seq + 1, h.count)
        ))
    } else if h.count < last_seq {
        Some(format!(
            "{name} records {} rows but the table goes up to seq {last_seq}: {} added outside an append (or it was rolled back)",
            h.count,
            seq_range(h.count + 1, last_seq)
        ))
    } else if h.head_hash != last_hash {
        Some(format!(
            "{name}'s head hash does not match seq {last_seq}'s row_hash: seq {last_seq} was rewritten (or it was edited)"
        ))
    } else {
        None
    }
}

fn render_head(h: &HeadRecord) -> String {
    format!("{HEAD_MAGIC}\ncount {}\nhead {}\n", h.count, h.head_hash)
}

/// `Ok(None)` when the file does not exist; `Err(why)` when it is unreadable or malformed.
fn read_head_file(path: &Path) -> Result<Option<HeadRecord>, String> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut lines = text.lines();
    if lines.next() != Some(HEAD_MAGIC) {
        return Err(format!("the first line is not `{HEAD_MAGIC}`"));
    }
    let count = lines
        .next()
        .and_then(|l| l.strip_prefix("count "))
        .and_then(|c| c.parse::<i64>().ok())
        .filter(|&c| c >= 0)
        .ok_or("the second line is not `count <rows>`")?;
    let head_hash = lines
        .next()
        .and_then(|l| l.strip_prefix("head "))
        .filter(|h| is_hex64(h))
        .ok_or("the third line is not `head <64 hex digits>`")?
        .to_string();
    if lines.next().is_some() {
        return Err("it has extra lines".to_string());
    }
    Ok(Some(HeadRecord { count, head_hash }))
}

/// Atomically replaces the sidecar: unique temporary file (0600), fsync, rename, fsync
/// of the directory.
fn write_head_file(path: &Path, h: &HeadRecord) -> io::Result<()> {
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => d.to_path_buf(),
        None => PathBuf::from("."),
    };
    let mut tmp_name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| OsString::from("ledger.head"));
    tmp_name.push(format!(
        ".tmp.{}.{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(render_head(h).as_bytes())?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        fs::File::open(&dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn check_digest(field: &'static str, value: &str) -> Result<(), LedgerError> {
    if value.strip_prefix("sha256:").is_some_and(is_hex64) {
        Ok(())
    } else {
        Err(LedgerError::InvalidEntry {
            field,
            reason: format!("`{value}` is not sha256:<64 lowercase hex digits>"),
        })
    }
}

fn validate_entry(e: &NewEntry) -> Result<(), LedgerError> {
    let invalid = |field, reason: &str| LedgerError::InvalidEntry {
        field,
        reason: reason.to_string(),
    };
    for (field, value) in [
        ("run_id", &e.run_id),
        ("timestamp", &e.timestamp),
        ("task", &e.task),
        ("bundle_dir", &e.bundle_dir),
    ] {
        if value.trim().is_empty() {
            return Err(invalid(field, "is empty"));
        }
    }
    if !matches!(e.verdict.as_str(), "APPROVE" | "REJECT" | "NEEDS_REVISION") {
        return Err(LedgerError::InvalidEntry {
            field: "verdict",
            reason: format!("`{}` is not APPROVE, REJECT or NEEDS_REVISION", e.verdict),
        });
    }
    if !(e.confidence.is_finite() && (0.0..=1.0).contains(&e.confidence)) {
        return Err(LedgerError::InvalidEntry {
            field: "confidence",
            reason: format!("{} is not in [0, 1]", e.confidence),
        });
    }
    for (field, value) in [
        ("patch_hash", &e.patch_hash),
        ("state_hash", &e.state_hash),
        ("source_hash", &e.source_hash),
        ("task_hash", &e.task_hash),
        ("policy_hash", &e.policy_hash),
    ] {
        check_digest(field, value)?;
    }
    if !is_hex64(&e.verdict_sha256) {
        return Err(LedgerError::InvalidEntry {
            field: "verdict_sha256",
            reason: format!("`{}` is not 64 lowercase hex digits", e.verdict_sha256),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn digest(tag: &str) -> String {
        format!("sha256:{}", hex::encode(Sha256::digest(tag.as_bytes())))
    }

    fn new_entry(i: usize) -> NewEntry {
        NewEntry {
            run_id: format!("run-{i}"),
            timestamp: format!("2025-01-31T12:00:{:02}.000Z", i % 60),
            verdict: ["APPROVE", "REJECT", "NEEDS_REVISION"][i % 3].to_string(),
            confidence: (i % 10) as f64 / 10.0 + 0.05,
            task: "tests".to_string(),
            patch_hash: digest(&format!("patch-{i}")),
            state_hash: digest("state"),
            source_hash: digest("source"),
            task_hash: digest("task"),
            policy_hash: digest("policy"),
            bundle_dir: format!("/out/run-{i}"),
            verdict_sha256: hex::encode(Sha256::digest(format!("verdict-{i}").as_bytes())),
        }
    }

    fn ledger_with(n: usize) -> (tempfile::TempDir, Ledger, Vec<Entry>) {
        let dir = tempfile::tempdir().unwrap();
        let mut l = Ledger::open(&dir.path().join("fork").join("ledger.db")).unwrap();
        let entries = (1..=n).map(|i| l.append(&new_entry(i)).unwrap()).collect();
        (dir, l, entries)
    }

    /// A raw connection with the append-only triggers dropped (the tamperer's view).
    fn raw(l: &Ledger) -> Connection {
        let c = Connection::open(l.path()).unwrap();
        c.execute_batch(
            "DROP TRIGGER IF EXISTS entries_no_update; DROP TRIGGER IF EXISTS entries_no_delete;",
        )
        .unwrap();
        c
    }

    fn assert_problem(report: &VerifyReport, needles: &[&str]) {
        assert!(!report.ok, "expected a problem, got {report:?}");
        assert!(
            report
                .problems
                .iter()
                .any(|p| needles.iter().all(|n| p.contains(n))),
            "no problem mentions all of {needles:?}: {:#?}",
            report.problems
        );
    }

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
            .filter(|n| n.contains(".tmp."))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn chain_verifies() {
        let (_d, l, _) = ledger_with(0);
        let r = l.verify().unwrap();
        assert!(r.ok && r.rows == 0 && r.problems.is_empty(), "{r:?}");
        let (_d, l, _) = ledger_with(7);
        let r = l.verify().unwrap();
        assert!(r.ok, "{r:?}");
        assert_eq!(r.rows, 7);
    }

    #[test]
    fn triggers_refuse_update_and_delete() {
        let (_d, l, _) = ledger_with(2);
        let c = Connection::open(l.path()).unwrap();
        assert!(c
            .execute("UPDATE entries SET verdict = 'APPROVE'", [])
            .is_err());
        assert!(c.execute("DELETE FROM entries WHERE seq = 2", []).is_err());
        assert!(l.verify().unwrap().ok);
    }

    #[test]
    fn editing_any_field_of_any_row_is_detected() {
        let (_d, l, entries) = ledger_with(4);
        let c = raw(&l);
        let text_columns = [
            "run_id",
            "timestamp",
            "verdict",
            "task",
            "patch_hash",
            "state_hash",
            "source_hash",
            "task_hash",
            "policy_hash",
            "bundle_dir",
            "verdict_sha256",
            "prev_hash",
            "row_hash",
        ];
        for e in &entries {
            let seq = e.seq;
            for col in text_columns {
                let original: String = c
                    .query_row(
                        &format!("SELECT {col} FROM entries WHERE seq = ?1"),
                        [seq],
                        |r| r.get(0),
                    )
                    .unwrap();
                // Flip the last character, keeping the length.
                let mut edited = original.clone();
                let last = edited.pop().unwrap();
                edited.push(if last == '0' { '1' } else { '0' });
                c.execute(
                    &format!("UPDATE entries SET {col} = ?1 WHERE seq = ?2"),
                    params![edited, seq],
                )
                .unwrap();
                let report = l.verify().unwrap();
                assert_problem(&report, &[&format!("seq {seq}")]);
                c.execute(
                    &format!("UPDATE entries SET {col} = ?1 WHERE seq = ?2"),
                    params![original, seq],
                )
                .unwrap();
                assert!(l.verify().unwrap().ok, "restoring {col} of seq {seq}");
            }
            c.execute(
                "UPDATE entries SET confidence = confidence + 0.01 WHERE seq = ?1",
                [seq],
            )
            .unwrap();
            assert_problem(&l.verify().unwrap(), &[&format!("seq {seq}"), "edited"]);
            c.execute(
                "UPDATE entries SET confidence = ?1 WHERE seq = ?2",
                params![e.confidence, seq],
            )
            .unwrap();
            assert!(l.verify().unwrap().ok);

            // seq itself: renumbered out of place.
            c.execute("UPDATE entries SET seq = 1000 WHERE seq = ?1", [seq])
                .unwrap();
            assert_problem(&l.verify().unwrap(), &[&format!("seq {seq}")]);
            c.execute("UPDATE entries SET seq = ?1 WHERE seq = 1000", [seq])
                .unwrap();
            assert!(l.verify().unwrap().ok);
        }
    }

    #[test]
    fn rewrite_with_recomputed_hash_is_detected() {
        let (_d, l, entries) = ledger_with(4);
        let c = raw(&l);
        // A middle row: the next row's prev_hash betrays it.
        let mut forged = entries[1].clone();
        forged.verdict = "APPROVE".to_string();
        forged.confidence = 0.99;
        forged.row_hash = compute_row_hash(&forged);
        c.execute(
            "UPDATE entries SET verdict = ?1, confidence = ?2, row_hash = ?3 WHERE seq = 2",
            params![forged.verdict, forged.confidence, forged.row_hash],
        )
        .unwrap();
        assert_problem(&l.verify().unwrap(), &["seq 2", "rewritten"]);
        c.execute(
            "UPDATE entries SET verdict = ?1, confidence = ?2, row_hash = ?3 WHERE seq = 2",
            params![
                entries[1].verdict,
                entries[1].confidence,
                entries[1].row_hash
            ],
        )
        .unwrap();
        assert!(l.verify().unwrap().ok);

        // The last row: both head records betray it.
        let mut forged = entries[3].clone();
        forged.task = "other".to_string();
        forged.row_hash = compute_row_hash(&forged);
        c.execute(
            "UPDATE entries SET task = ?1, row_hash = ?2 WHERE seq = 4",
            params![forged.task, forged.row_hash],
        )
        .unwrap();
        let r = l.verify().unwrap();
        assert_problem(&r, &["the head table", "seq 4", "rewritten"]);
        assert_problem(&r, &[".head", "seq 4", "rewritten"]);
    }

    #[test]
    fn deleted_middle_row_is_detected() {
        let (_d, l, _) = ledger_with(5);
        raw(&l)
            .execute("DELETE FROM entries WHERE seq = 3", [])
            .unwrap();
        let r = l.verify().unwrap();
        assert_problem(&r, &["seq 3", "deleted"]);
        assert_eq!(r.rows, 4);
    }

    #[test]
    fn deleted_last_row_is_detected_by_both_anchors() {
        let (_d, mut l, _) = ledger_with(5);
        raw(&l)
            .execute("DELETE FROM entries WHERE seq = 5", [])
            .unwrap();
        let r = l.verify().unwrap();
        assert_problem(&r, &["the head table", "seq 5", "deleted"]);
        assert_problem(&r, &[".head", "seq 5", "deleted"]);
        // Appending onto the truncated chain would bury the evidence: refused.
        let err = l.append(&new_entry(6)).unwrap_err();
        assert!(matches!(err, LedgerError::Tampered { .. }), "{err}");
        assert!(err.to_string().contains("fork ledger verify"), "{err}");
    }

    #[test]
    fn deleted_last_two_rows_with_one_anchor_edited() {
        // Head table edited to match, sidecar not.
        let (_d, l, entries) = ledger_with(5);
        let c = raw(&l);
        c.execute("DELETE FROM entries WHERE seq >= 4", []).unwrap();
        c.execute(
            "UPDATE head SET count = 3, head_hash = ?1",
            [&entries[2].row_hash],
        )
        .unwrap();
        let r = l.verify().unwrap();
        assert_problem(&r, &[".head", "records 5 rows", "seq 4..5", "deleted"]);
        assert!(
            !r.problems.iter().any(|p| p.contains("the head table")),
            "{:?}",
            r.problems
        );

        // Sidecar rewritten to match, head table not.
        let (_d, l, entries) = ledger_with(5);
        raw(&l)
            .execute("DELETE FROM entries WHERE seq >= 4", [])
            .unwrap();
        write_head_file(
            l.head_path(),
            &HeadRecord {
                count: 3,
                head_hash: entries[2].row_hash.clone(),
            },
        )
        .unwrap();
        let r = l.verify().unwrap();
        assert_problem(
            &r,
            &["the head table", "records 5 rows", "seq 4..5", "deleted"],
        );
        assert!(
            !r.problems.iter().any(|p| p.contains(".head")),
            "{:?}",
            r.problems
        );
    }

    #[test]
    fn missing_or_corrupt_sidecar_is_reported() {
        let (_d, l, _) = ledger_with(2);
        fs::write(l.head_path(), "garbage\n").unwrap();
        assert_problem(&l.verify().unwrap(), &[".head", "unreadable"]);
        fs::remove_file(l.head_path()).unwrap();
        assert_problem(&l.verify().unwrap(), &[".head", "missing"]);
    }

    #[test]
    fn reordered_rows_are_detected() {
        let (_d, l, _) = ledger_with(5);
        let c = raw(&l);
        c.execute_batch(
            "UPDATE entries SET seq = -1 WHERE seq = 2;
             UPDATE entries SET seq = 2 WHERE seq = 4;
             UPDATE entries SET seq = 4 WHERE seq = -1;",
        )
        .unwrap();
        let r = l.verify().unwrap();
        assert_problem(&r, &["seq 2", "appended as seq 4", "reordered"]);
        assert_problem(&r, &["seq 4", "appended as seq 2", "reordered"]);
    }

    #[test]
    fn inserted_rows_are_detected() {
        // At the end, with a correctly computed hash: only the anchors can tell.
        let (_d, l, entries) = ledger_with(3);
        let c = raw(&l);
        let mut extra = entries[2].clone();
        extra.seq = 4;
        extra.run_id = "forged".to_string();
        extra.prev_hash = entries[2].row_hash.clone();
        extra.row_hash = compute_row_hash(&extra);
        insert_row(&c, &extra).unwrap();
        let r = l.verify().unwrap();
        assert_problem(&r, &["the head table", "seq 4", "added outside an append"]);
        assert_problem(&r, &[".head", "seq 4", "added outside an append"]);

        // Before the first row.
        let (_d, l, entries) = ledger_with(2);
        let mut extra = entries[0].clone();
        extra.seq = 0;
        extra.row_hash = compute_row_hash(&extra);
        insert_row(&raw(&l), &extra).unwrap();
        assert_problem(&l.verify().unwrap(), &["seq 0", "inserted"]);
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
    fn lookup_needs_all_five_hashes() {
        let (_d, mut l, entries) = ledger_with(2);
        let key = entries[0].cache_key();
        assert_eq!(l.lookup(&key).unwrap().as_ref(), Some(&entries[0]));
        type Field = fn(&mut CacheKey) -> &mut String;
        let fields: [(&str, Field); 5] = [
            ("patch", |k| &mut k.patch_hash),
            ("state", |k| &mut k.state_hash),
            ("source", |k| &mut k.source_hash),
            ("task", |k| &mut k.task_hash),
            ("policy", |k| &mut k.policy_hash),
        ];
        for (name, field) in fields {
            let mut other = key.clone();
            *field(&mut other) = digest(&format!("another {name}"));
            assert_eq!(l.lookup(&other).unwrap(), None, "{name} differs");
        }
        // Entry 2 differs from entry 1 by its patch only: each finds itself only.
        assert_eq!(l.lookup(&entries[1].cache_key()).unwrap().unwrap().seq, 2);
        // A newer entry with the same key wins.
        let mut again = new_entry(1);
        again.run_id = "run-1-again".to_string();
        let newer = l.append(&again).unwrap();
        assert_eq!(l.lookup(&key).unwrap(), Some(newer));
        // A blank hash is refused, never matched.
        let mut blank = key.clone();
        blank.policy_hash = String::new();
        assert!(matches!(
            l.lookup(&blank),
            Err(LedgerError::InvalidEntry {
                field: "policy_hash",
                ..
            })
        ));
    }

    #[test]
    fn lookup_refuses_a_tampered_entry() {
        let (_d, l, entries) = ledger_with(3);
        raw(&l)
            .execute(
                "UPDATE entries SET verdict = 'APPROVE', confidence = 1.0 WHERE seq = 2",
                [],
            )
            .unwrap();
        let err = l.lookup(&entries[1].cache_key()).unwrap_err();
        assert!(err.to_string().contains("seq 2"), "{err}");
        // The untouched rows still serve.
        assert_eq!(l.lookup(&entries[2].cache_key()).unwrap().unwrap().seq, 3);
    }

    #[test]
    fn invalid_entries_are_refused() {
        let (_d, mut l, _) = ledger_with(0);
        let mut e = new_entry(1);
        e.patch_hash = "abc".to_string();
        let err = l.append(&e).unwrap_err();
        assert!(err.to_string().contains("patch_hash"), "{err}");
        let mut e = new_entry(1);
        e.confidence = f64::NAN;
        assert!(matches!(
            l.append(&e),
            Err(LedgerError::InvalidEntry {
                field: "confidence",
                ..
            })
        ));
        let mut e = new_entry(1);
        e.verdict = "MAYBE".to_string();
        assert!(l.append(&e).is_err());
        assert!(l.history(None).unwrap().is_empty());
    }

    #[test]
    fn field_boundaries_cannot_shift() {
        let (_d, _l, entries) = ledger_with(1);
        let mut a = entries[0].clone();
        a.run_id = "ab".to_string();
        a.timestamp = "c".to_string();
        let mut b = a.clone();
        b.run_id = "a".to_string();
        b.timestamp = "bc".to_string();
        assert_ne!(compute_row_hash(&a), compute_row_hash(&b));
        assert_eq!(compute_row_hash(&a), compute_row_hash(&a.clone()));
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
