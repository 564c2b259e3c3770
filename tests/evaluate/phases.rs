//! The evaluation's phases: `FORK_TRACE=1` marks them (each teardown ends before the
//! bundle takes its name), and the state snapshot's integrity check, off the critical
//! path, still fails the evaluation.

use super::*;

/// `FORK_TRACE=1 fork evaluate` marks the evaluation's own phases, and the marks show the
/// overlapped teardowns' guarantees: each side's sandbox is gone (its run directory
/// removed) before the next sandbox is prepared, and every teardown is joined before the
/// bundle takes its name (and nothing remains afterwards: `evaluate_with` checks the run
/// root). The task runs on both sides (`baseline = true`), so there are two sandboxes.
#[test]
fn fork_trace_marks_the_evaluation_phases_and_teardowns_end_before_the_bundle() {
    need_default_policy!();
    let env = Env::new("ev-trace");
    let rt = env.runtime(
        "rt",
        "\n[tasks.noop2]\ncommand = [\"true\"]\nbaseline = true\n",
    );
    let trace = OsStr::new("1");
    let e = evaluate_with(
        &env,
        &patch("noop-comment"),
        &rt,
        "trace",
        &["--task", "noop2", "--no-ledger"],
        With {
            vars: &[("FORK_TRACE", trace)],
            require_verdict: true,
            ..With::default()
        },
    );
    let timed = trace_marks(&e.stderr);
    let marks: Vec<&str> = timed.iter().map(|(p, _)| p.as_str()).collect();
    let want = [
        "evaluate: planned, node key loaded",
        "evaluate: gates checked, staging made",
        "evaluate: protected tree copied",
        "evaluate: parent source hashed",
        "evaluate: state and protected tree snapshotted",
        "evaluate: patched side ready, trees hashed",
        "evaluate: tasks run",
        "evaluate: concluded",
        "evaluate: bundle synced",
        "evaluate: teardowns joined",
        "evaluate: bundle written",
        "exit",
    ];
    assert_phases_in_order(&timed, &want, &e.ctx());
    // The parent's source is hashed within the snapshot phase (on the main thread, after
    // the protected tree's copy, while the demo's store, under an excluded directory, is
    // copied on a thread of its own), not after it; the stores' own mark lies within the
    // phase too.
    let at = |m: &str| marks.iter().position(|p| *p == m);
    let stores = at("evaluate: state stores copied");
    assert!(
        at("evaluate: gates checked, staging made") < stores
            && stores < at("evaluate: state and protected tree snapshotted"),
        "the state stores not copied within the snapshot phase:\n{}",
        e.ctx()
    );
    // The staging directory goes on a teardown thread once the bundle has copied the
    // artifacts out of it, beside the bundle's fsyncs: after the conclusion, joined before
    // the bundle takes its name.
    let staging = marks
        .iter()
        .filter(|p| **p == "evaluate: staging removed")
        .count();
    assert_eq!(
        staging,
        1,
        "the staging directory removed once:\n{}",
        e.ctx()
    );
    assert!(
        at("evaluate: concluded") < at("evaluate: staging removed")
            && at("evaluate: staging removed") < at("evaluate: teardowns joined"),
        "the staging directory not removed between the conclusion and the join:\n{}",
        e.ctx()
    );
    // Every teardown succeeded where it ran (the protected copy's tmpfs is detached, not
    // emptied file by file and then found busy).
    assert!(
        !e.stderr.contains("removing") && !e.stderr.contains("WARN"),
        "a teardown warned:\n{}",
        e.ctx()
    );
    // Sandboxes one at a time: each prepared only once the one before is removed.
    one_sandbox_at_a_time(&e, &marks);
}

/// Each sandbox is prepared only once the one before is removed, every teardown ends
/// before the join, and both sides ran in a sandbox of their own.
fn one_sandbox_at_a_time(e: &Eval, marks: &[&str]) {
    let (mut prepared, mut removed) = (0, 0);
    let joined = marks
        .iter()
        .position(|p| *p == "evaluate: teardowns joined");
    for (i, m) in marks.iter().enumerate() {
        match *m {
            "sandbox: prepare" => {
                assert_eq!(
                    prepared,
                    removed,
                    "a sandbox prepared before the last one was removed:\n{}",
                    e.ctx()
                );
                prepared += 1;
            }
            "teardown: run dir removed" => {
                assert!(
                    Some(i) < joined,
                    "a teardown ended after the join:\n{}",
                    e.ctx()
                );
                removed += 1;
            }
            _ => {}
        }
    }
    assert!(
        prepared >= 2,
        "both sides ran in a sandbox of their own:\n{}",
        e.ctx()
    );
    assert_eq!(prepared, removed, "every sandbox removed:\n{}", e.ctx());
}

/// The evaluation's first pair is ordered at random like any other: the patched side
/// prepared where the patch was tried is removed when the baseline is drawn first, and
/// prepared again after it, so sandboxes stay one at a time in either order. Up to 16
/// evaluations until both orders are seen (both unseen by chance: 2 in 65,536).
#[test]
fn the_first_pair_runs_either_side_first_one_sandbox_at_a_time() {
    need_default_policy!();
    let env = Env::new("ev-first-order");
    let rt = env.runtime(
        "rt",
        "\n[tasks.pair]\ncommand = [\"true\"]\nbaseline = true\n",
    );
    let trace = OsStr::new("1");
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..16 {
        let e = evaluate_with(
            &env,
            &patch("noop-comment"),
            &rt,
            &format!("order{i}"),
            &["--task", "pair", "--no-ledger"],
            With {
                vars: &[("FORK_TRACE", trace)],
                require_verdict: true,
                ..With::default()
            },
        );
        assert_eq!(e.code, 0, "{}", e.ctx());
        let timed = trace_marks(&e.stderr);
        let marks: Vec<&str> = timed.iter().map(|(p, _)| p.as_str()).collect();
        one_sandbox_at_a_time(&e, &marks);
        let at = |side: &str| e.stderr.find(&format!("run task pair, {side}"));
        let (b, p) = (at("baseline"), at("patched"));
        assert!(b.is_some() && p.is_some(), "both sides ran:\n{}", e.ctx());
        seen.insert(if b < p {
            "baseline first"
        } else {
            "patched first"
        });
        if seen.len() == 2 {
            return;
        }
    }
    panic!("16 evaluations ran their first pair in one order only: {seen:?}");
}

/// The state snapshot's integrity check runs on a thread of its own beside the sides and
/// the first sandbox, off the evaluation's critical path; a snapshot that fails it still
/// fails the evaluation (exit 65, naming the store and the parent's file to check), with no
/// verdict, whatever the task said, and nothing of the run left. The store here is a demo
/// database whose index no longer matches its table (SQLite opens and reads it; only
/// `PRAGMA integrity_check` sees the damage).
#[test]
fn a_state_snapshot_failing_its_integrity_check_fails_the_evaluation_after_the_task() {
    need_default_policy!();
    let env = Env::new("ev-corrupt-state");
    let rt = env.runtime("rt", "\n[tasks.noop3]\ncommand = [\"true\"]\n");
    let db = rt.join("state/hermes.db");
    {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch(
            "CREATE INDEX m_role ON messages(role);
             PRAGMA writable_schema = ON;
             UPDATE sqlite_schema SET sql = 'CREATE INDEX m_role ON messages(content)'
               WHERE name = 'm_role';
             PRAGMA writable_schema = OFF;",
        )
        .unwrap();
    }
    let e = evaluate_with(
        &env,
        &patch("noop-comment"),
        &rt,
        "corrupt",
        &["--task", "noop3", "--no-ledger"],
        With {
            vars: &[("FORK_TRACE", OsStr::new("1"))],
            ..With::default()
        },
    );
    assert_eq!(e.code, 65, "{}", e.ctx());
    assert!(
        e.stderr.contains("snapshotting state/hermes.db")
            && e.stderr.contains("failed its integrity check")
            && e.stderr.contains(&format!("sqlite3 {}", db.display())),
        "the error names the store and the parent's file: {}",
        e.ctx()
    );
    assert!(!e.out.exists(), "no bundle: {}", e.ctx());
    // The check was answered after the task ran (it did not hold the sandbox back).
    let timed = trace_marks(&e.stderr);
    assert_phases_in_order(
        &timed,
        &[
            "evaluate: state and protected tree snapshotted",
            "sandbox: clone returned",
            "evaluate: tasks run",
            "evaluate: state snapshot checked",
            "evaluate: staging removed",
        ],
        &e.ctx(),
    );
    // The parent's database is as the test left it.
    let c = rusqlite::Connection::open(&db).unwrap();
    let n: i64 = c
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name = 'm_role'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 1);
}
