//! The hash chain: each row's hash over its length-prefixed fields and its predecessor's
//! hash, and [`Ledger::verify`], which recomputes the chain and compares its end with both
//! head records.

use std::collections::HashMap;

use rusqlite::{Transaction, TransactionBehavior};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::head::{read_head_file, seq_range, HeadRecord};
use super::schema::GENESIS_HASH;
use super::schema::{read_head_table, row_to_entry, COLUMNS};
use super::{sql_err, Entry, Ledger, LedgerError};

/// Domain separation for row hashes.
const ROW_DOMAIN: &[u8] = b"fork-ledger-row/v1";
/// At most this many problems are listed by `verify`; the rest are counted.
const MAX_PROBLEMS: usize = 200;

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

impl Ledger {
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
}

fn put(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

/// The row hash (module docs): length-prefixed fields, seq and prev_hash included.
pub(super) fn compute_row_hash(e: &Entry) -> String {
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

#[cfg(test)]
mod tests {
    use super::super::head::write_head_file;
    use super::super::schema::insert_row;
    use super::super::test_support::*;
    use super::*;
    use rusqlite::params;
    use std::fs;

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
        let (_d, mut l, entries) = ledger_with(5);
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
        // The next append would overwrite the sidecar, the only evidence left: refused,
        // naming both records, and the sidecar (and so verify's finding) is kept.
        let side_before = fs::read(l.head_path()).unwrap();
        let err = l.append(&new_entry(6)).unwrap_err();
        assert!(matches!(err, LedgerError::Tampered { .. }), "{err}");
        let msg = err.to_string();
        for needle in [
            "refusing to append",
            "head table records 3 rows",
            "records 5 rows",
            "seq 4..5 were deleted",
            "ledger.db.head",
            "aside",
        ] {
            assert!(msg.contains(needle), "{needle}: {msg}");
        }
        assert_eq!(fs::read(l.head_path()).unwrap(), side_before);
        assert_eq!(l.verify().unwrap().rows, 3);
        assert_problem(&l.verify().unwrap(), &[".head", "seq 4..5", "deleted"]);

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
}
