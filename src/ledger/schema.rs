//! The SQLite side of the ledger: the schema and its version ids, creating it in a new
//! database, checking an existing one, and converting rows to and from [`Entry`].

use std::path::Path;

use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use super::head::{read_head_file, write_head_file, HeadRecord};
use super::{sql_err, Entry, LedgerError};
use crate::ioerr::IoContext;

/// `prev_hash` of row 1, and the head hash of an empty ledger.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The schema version this code writes and reads (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 1;
/// `PRAGMA application_id` of a ledger: "fork" in ASCII.
pub const APPLICATION_ID: i64 = 0x666f_726b;

/// The columns of `entries`, in the order [`row_to_entry`] reads them.
pub(super) const COLUMNS: &str = "seq, run_id, timestamp, verdict, confidence, task, patch_hash, \
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

pub(super) fn read_ids(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
    let app_id: i64 = conn.query_row("PRAGMA application_id", [], |r| r.get(0))?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    Ok((app_id, version))
}

pub(super) fn check_ids(path: &Path, app_id: i64, version: i64) -> Result<(), LedgerError> {
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
pub(super) fn init_schema(
    conn: &Connection,
    path: &Path,
    head_path: &Path,
) -> Result<(), LedgerError> {
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
    // A sidecar that cannot be read, or of another version, is refused, never overwritten.
    match read_head_file(head_path) {
        Ok(Some(rec)) if rec.count > 0 => {
            return Err(LedgerError::Missing {
                path: path.to_path_buf(),
                head_path: head_path.to_path_buf(),
                count: rec.count,
            });
        }
        Ok(_) => {}
        Err(e) => return Err(super::head::unreadable(path, head_path, e)),
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
    write_head_file(head_path, &genesis).ctx("write the head record", head_path)?;
    tx.commit()
        .map_err(|s| sql_err(path, "commit the new schema", s))
}

pub(super) fn read_head_table(conn: &Connection) -> rusqlite::Result<Option<HeadRecord>> {
    conn.query_row("SELECT count, head_hash FROM head WHERE id = 1", [], |r| {
        Ok(HeadRecord {
            count: r.get(0)?,
            head_hash: r.get(1)?,
        })
    })
    .optional()
}

pub(super) fn insert_row(conn: &Connection, e: &Entry) -> rusqlite::Result<()> {
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

pub(super) fn row_to_entry(r: &rusqlite::Row<'_>) -> rusqlite::Result<Entry> {
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

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

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
}
