//! Fixtures shared by the ledger's tests: entries, ledgers holding some, the tamperer's
//! raw connection, and a check on `verify`'s report.

use rusqlite::Connection;
use sha2::{Digest, Sha256};

use super::{Entry, Ledger, NewEntry, VerifyReport};

pub(super) fn digest(tag: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(tag.as_bytes())))
}

pub(super) fn new_entry(i: usize) -> NewEntry {
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

pub(super) fn ledger_with(n: usize) -> (tempfile::TempDir, Ledger, Vec<Entry>) {
    let dir = tempfile::tempdir().unwrap();
    let mut l = Ledger::open(&dir.path().join("fork").join("ledger.db")).unwrap();
    let entries = (1..=n).map(|i| l.append(&new_entry(i)).unwrap()).collect();
    (dir, l, entries)
}

/// A raw connection with the append-only triggers dropped (the tamperer's view).
pub(super) fn raw(l: &Ledger) -> Connection {
    let c = Connection::open(l.path()).unwrap();
    c.execute_batch(
        "DROP TRIGGER IF EXISTS entries_no_update; DROP TRIGGER IF EXISTS entries_no_delete;",
    )
    .unwrap();
    c
}

pub(super) fn assert_problem(report: &VerifyReport, needles: &[&str]) {
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
