//! What a ledger row holds ([`Entry`], [`NewEntry`], the five-hash [`CacheKey`]) and
//! what makes an entry valid to append or a key valid to look up.

use serde::{Deserialize, Serialize};

use super::LedgerError;

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
    /// The parent's source tree, the tree the patch applies to (an input, like the other
    /// hashes of the cache key). Not the verdict's `source_hash`, which is the patched
    /// tree the successor ran; the column keeps its name so rows stay readable.
    pub source_hash: String,
    pub task_hash: String,
    pub policy_hash: String,
    /// The run's bundle directory (`out/<run-id>`).
    pub bundle_dir: String,
    /// Bare lowercase hex sha256 of the `verdict.json` bytes.
    pub verdict_sha256: String,
    /// The previous row's `row_hash` ([`GENESIS_HASH`](super::GENESIS_HASH) for seq 1), bare hex.
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
    /// The parent's source tree (see [`Entry::source_hash`]).
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

impl CacheKey {
    fn of(patch: &str, state: &str, source: &str, task: &str, policy: &str) -> CacheKey {
        CacheKey {
            patch_hash: patch.to_string(),
            state_hash: state.to_string(),
            source_hash: source.to_string(),
            task_hash: task.to_string(),
            policy_hash: policy.to_string(),
        }
    }

    /// Refuses ([`LedgerError::InvalidEntry`], naming the field) any hash not spelled
    /// `sha256:<64 lowercase hex>`, so that a blank hash can never match another.
    pub(super) fn check(&self) -> Result<(), LedgerError> {
        for (field, value) in [
            ("patch_hash", &self.patch_hash),
            ("state_hash", &self.state_hash),
            ("source_hash", &self.source_hash),
            ("task_hash", &self.task_hash),
            ("policy_hash", &self.policy_hash),
        ] {
            check_digest(field, value)?;
        }
        Ok(())
    }
}

impl Entry {
    /// This entry's cache key.
    pub fn cache_key(&self) -> CacheKey {
        CacheKey::of(
            &self.patch_hash,
            &self.state_hash,
            &self.source_hash,
            &self.task_hash,
            &self.policy_hash,
        )
    }
}

impl NewEntry {
    /// This entry's cache key.
    pub fn cache_key(&self) -> CacheKey {
        CacheKey::of(
            &self.patch_hash,
            &self.state_hash,
            &self.source_hash,
            &self.task_hash,
            &self.policy_hash,
        )
    }
}

pub(super) fn is_hex64(s: &str) -> bool {
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

pub(super) fn validate_entry(e: &NewEntry) -> Result<(), LedgerError> {
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
    e.cache_key().check()?;
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
    use super::super::test_support::*;
    use super::*;

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
}
