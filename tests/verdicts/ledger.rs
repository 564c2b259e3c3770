//! The ledger: it lists the verdicts, and `fork ledger verify` catches an edited and a
//! deleted row. Item 6 of the proof list in tests/verdicts.rs.

use super::*;

/// Runs python3's sqlite3 on the ledger: `drop` first drops every trigger on `entries`
/// (read from sqlite_master), then `sql` runs and commits.
fn sql(ledger: &Path, drop: bool, sql: &str) -> Output {
    const SCRIPT: &str = r#"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
if sys.argv[2] == "1":
    names = [r[0] for r in db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'entries'")]
    assert names, "the ledger has no triggers"
    for n in names:
        db.execute('DROP TRIGGER "%s"' % n.replace('"', '""'))
db.execute("BEGIN")
db.execute(sys.argv[3])
db.execute("COMMIT")
db.close()
"#;
    Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(ledger)
        .arg(if drop { "1" } else { "0" })
        .arg(sql)
        .output()
        .expect("python3")
}

fn ledger_verify(env: &Env, ledger: &Path) -> (Output, Value) {
    let o = env
        .cmd()
        .args(["ledger", "verify", "--json", "--ledger"])
        .arg(ledger)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o, v)
}

#[test]
fn ledger_lists_verdicts_and_catches_tampering() {
    need_root!();
    let env = Env::new("vd-ledger");
    let ledger = env.dir.join("ledger/verdicts.db");
    let l = ledger.to_str().unwrap();
    let cases = [
        ("swap-compressor", "APPROVE", 0),
        ("breaks-test", "NEEDS_REVISION", 2),
        ("touches-protected", "REJECT", 1),
    ];
    let mut evals = Vec::new();
    for (name, verdict, code) in cases {
        let e = evaluate(
            &env,
            &patch(name),
            &demo(),
            name,
            &["--task", "tests", "--ledger", l],
        );
        assert_eq!(e.code, code, "{}", e.ctx());
        assert_eq!(e.verdict["verdict"], verdict);
        evals.push(e);
    }
    // --no-ledger records nothing anywhere.
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &demo(),
        "noop",
        &["--task", "tests", "--no-ledger"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert!(
        !env.default_ledger().exists(),
        "only the --ledger file is written"
    );

    // History, newest first.
    let o = env
        .cmd()
        .args(["history", "--json", "--ledger", l])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let h: Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = h.as_array().unwrap();
    assert_eq!(rows.len(), 3, "{h}");
    for (row, ((name, verdict, _), e)) in rows.iter().zip(cases.iter().zip(&evals).rev()) {
        assert_eq!(row["verdict"], *verdict, "{row}");
        assert_eq!(row["patch_hash"], patch_hash(&patch(name)), "{row}");
        assert_eq!(row["patch_hash"], e.verdict["patch_hash"], "{row}");
        assert_eq!(row["run_id"], e.verdict["run_id"], "{row}");
        assert_eq!(row["task"], "tests", "{row}");
        assert_eq!(
            row["bundle_dir"],
            std::fs::canonicalize(&e.out).unwrap().to_str().unwrap(),
            "{row}"
        );
        let vj = std::fs::read(e.out.join("verdict.json")).unwrap();
        assert_eq!(row["verdict_sha256"], hex::encode(Sha256::digest(&vj)));
    }
    let seqs: Vec<i64> = rows.iter().map(|r| r["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, [3, 2, 1]);
    let o = env
        .cmd()
        .args(["history", "--json", "-n", "2", "--ledger", l])
        .output()
        .unwrap();
    let h2: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(h2.as_array().unwrap()[..], rows[..2]);

    let (o, rep) = ledger_verify(&env, &ledger);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(rep["ok"], true);
    assert_eq!(rep["rows"], 3);

    // The triggers refuse an edit as long as they are there.
    let refused = sql(
        &ledger,
        false,
        "UPDATE entries SET verdict = 'APPROVE' WHERE seq = 2",
    );
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("append-only"),
        "{}",
        text(&refused)
    );

    // Edit row 2 (a NEEDS_REVISION turned APPROVE): named.
    let o = sql(
        &ledger,
        true,
        "UPDATE entries SET verdict = 'APPROVE' WHERE seq = 2",
    );
    assert!(o.status.success(), "{}", text(&o));
    let (o, rep) = ledger_verify(&env, &ledger);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(rep["ok"], false);
    let problems = rep["problems"].to_string();
    assert!(problems.contains("seq 2"), "{problems}");
    assert!(
        !problems.contains("seq 1") && !problems.contains("seq 3"),
        "{problems}"
    );
    // The text form names it too.
    let o = env
        .cmd()
        .args(["ledger", "verify", "--ledger", l])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("TAMPERED") && out.contains("seq 2"), "{out}");

    // Put it back exactly: the chain is intact again.
    let o = sql(
        &ledger,
        false,
        "UPDATE entries SET verdict = 'NEEDS_REVISION' WHERE seq = 2",
    );
    assert!(o.status.success(), "{}", text(&o));
    let (o, rep) = ledger_verify(&env, &ledger);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(rep["ok"], true);

    // Delete the newest row: the chain alone is still valid, the head records are not.
    let o = sql(&ledger, false, "DELETE FROM entries WHERE seq = 3");
    assert!(o.status.success(), "{}", text(&o));
    let (o, rep) = ledger_verify(&env, &ledger);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(rep["ok"], false);
    assert_eq!(rep["rows"], 2);
    let problems = rep["problems"].to_string();
    assert!(
        problems.contains("seq 3") && problems.contains("deleted"),
        "{problems}"
    );

    // Edit the head table to match as well: only the sidecar still shows the deletion, and
    // the next evaluation must not overwrite it (it did: `ledger verify` then said ok).
    let o = sql(
        &ledger,
        false,
        "UPDATE head SET count = 2, head_hash = (SELECT row_hash FROM entries WHERE seq = 2)",
    );
    assert!(o.status.success(), "{}", text(&o));
    let (o, rep) = ledger_verify(&env, &ledger);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(rep["problems"].to_string().contains(".head"), "{rep}");
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &demo(),
        "after-deletion",
        &["--task", "tests", "--ledger", l],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert!(
        e.stderr.contains("not recorded in the ledger") && e.stderr.contains("refusing to append"),
        "{}",
        e.ctx()
    );
    let (o, rep) = ledger_verify(&env, &ledger);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(rep["rows"], 2);
    let problems = rep["problems"].to_string();
    assert!(
        problems.contains(".head") && problems.contains("seq 3") && problems.contains("deleted"),
        "{problems}"
    );
}

/// `fork history` and `fork ledger verify` read a ledger; an empty file at the path is
/// refused and left as it was (they made it a ledger: schema, WAL, a `.head` beside it).
#[test]
fn reading_commands_never_make_an_empty_file_a_ledger() {
    let env = Env::new("vd-ledger-empty");
    let ledger = env.dir.join("empty.db");
    std::fs::write(&ledger, b"").unwrap();
    for args in [&["history"][..], &["ledger", "verify"]] {
        let o = env
            .cmd()
            .args(args)
            .arg("--ledger")
            .arg(&ledger)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(65), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("empty.db") && err.contains("no fork ledger ids"),
            "{args:?}: {err}"
        );
        assert_eq!(std::fs::metadata(&ledger).unwrap().len(), 0, "{args:?}");
        let beside: Vec<_> = std::fs::read_dir(&env.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("empty.db"))
            .collect();
        assert_eq!(beside, ["empty.db"], "{args:?}");
    }
}

/// A FIFO at `<ledger>.head` made `fork ledger verify` wait for a writer forever, holding the
/// ledger's write lock meanwhile (evaluations then waited and dropped their rows). It is
/// refused at once, by name.
#[test]
fn a_fifo_head_record_is_refused_at_once() {
    let env = Env::new("vd-ledger-fifo");
    let ledger = env.dir.join("fifo.db");
    drop(fork::ledger::Ledger::open(&ledger).unwrap());
    let head = env.dir.join("fifo.db.head");
    std::fs::remove_file(&head).unwrap();
    let made = Command::new("mkfifo").arg(&head).status().unwrap();
    assert!(made.success());
    let mut child = env
        .cmd()
        .args(["ledger", "verify", "--ledger"])
        .arg(&ledger)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("`fork ledger verify` hung on a FIFO head record");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("fifo.db.head") && out.contains("not a regular file"),
        "{}",
        text(&o)
    );
}
