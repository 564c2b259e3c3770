//! The verdict cache: [`Ledger::lookup`] finds the newest entry whose five hashes (patch,
//! state, source, task, policy) all equal a key's, and serves it only if its row still
//! hashes to its `row_hash` and is linked into the chain.

use rusqlite::{params, OptionalExtension, Transaction, TransactionBehavior};

use super::chain::compute_row_hash;
use super::schema::{read_head_table, row_to_entry, COLUMNS};
use super::{sql_err, CacheKey, Entry, Ledger, LedgerError};

impl Ledger {
    /// The newest entry whose five hashes all equal `key`'s, after checking that row's own
    /// hash and its link to the next row (or to the head table).
    pub fn lookup(&self, key: &CacheKey) -> Result<Option<Entry>, LedgerError> {
        key.check()?;
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

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

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
}
