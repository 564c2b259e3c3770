//! Unit tests of a parent that changes its journal mode while fork snapshots it: whatever
//! the moment, SQLite never reads the parent in a mode fork has not seen in its header
//! under a lock (`header.rs`), so nothing is created beside the parent's database, and a
//! rollback-journal parent's commits are never held for the copy. A hook makes each change
//! at the one moment that matters.

use super::tests::make_db;
use super::*;
use crate::fork::precopy::AFTER_THE_PRECOPY;
use crate::fork::sqlite::BEFORE_THE_PARENT_IS_READ;

/// What runs `sql` on the parent's database in a connection of its own, closed at once (a
/// WAL-mode parent's last close removes its `-wal` and `-shm`).
fn on(src: &Path, sql: &'static str) -> impl FnOnce() {
    let src = src.to_path_buf();
    move || Connection::open(&src).unwrap().execute_batch(sql).unwrap()
}

/// Where the change is made.
#[derive(Debug, Clone, Copy)]
enum At {
    /// Right after fork read the header, before anything opened the database.
    TheLook,
    /// Before the read of the parent after `n` others (`sqlite::as_reader`).
    Read(usize),
    /// Between the unlocked copy and the read transaction that locks (`precopy.rs`).
    ThePrecopy,
}

fn at(when: At, change: Box<dyn FnOnce()>) {
    match when {
        At::TheLook => AFTER_THE_LOOK.with(|h| *h.borrow_mut() = Some(change)),
        At::ThePrecopy => AFTER_THE_PRECOPY.with(|h| *h.borrow_mut() = Some(change)),
        At::Read(n) => BEFORE_THE_PARENT_IS_READ.with(|h| {
            let mut h = h.borrow_mut();
            for _ in 0..n {
                h.push_back(Box::new(|| {}));
            }
            h.push_back(change);
        }),
    }
}

/// Every hook cleared (one left unused would run in the next test on this thread).
fn clear_hooks() {
    AFTER_THE_LOOK.with(|h| h.borrow_mut().take());
    AFTER_THE_PRECOPY.with(|h| h.borrow_mut().take());
    BEFORE_THE_PARENT_IS_READ.with(|h| h.borrow_mut().clear());
}

/// A rollback-journal database turned to WAL (and its connection closed: no `-wal` or
/// `-shm` left) at each moment between fork's look at its header and SQLite's reads, on
/// every route a rollback-journal database takes: the snapshot is refused, naming the
/// cause, and fork's SQLite connection never read it in WAL mode, which would have created
/// `-wal` and `-shm` beside the parent's database (SQLite opens both read-write, creating
/// them, whatever the connection's flags).
#[test]
fn a_database_turned_to_wal_is_refused_before_sqlite_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let precopied = SnapshotOptions {
        precopy_min_bytes: 1 << 20,
        ..SnapshotOptions::default()
    };
    let serialized = SnapshotOptions {
        raw_copy: false,
        ..SnapshotOptions::default()
    };
    let pages = SnapshotOptions {
        image_max_bytes: 0,
        pages_per_step: 64,
        ..SnapshotOptions::default()
    };
    let cases = [
        (
            "before SQLite opens it",
            At::TheLook,
            SnapshotOptions::default(),
        ),
        (
            "before the copy under the lock",
            At::Read(0),
            SnapshotOptions::default(),
        ),
        (
            "before the short read that reads its stamps",
            At::Read(0),
            precopied.clone(),
        ),
        (
            "after the copy made before the lock",
            At::ThePrecopy,
            precopied,
        ),
        (
            "before the serialized image's read",
            At::Read(0),
            serialized,
        ),
        ("before the backup's first read", At::Read(0), pages.clone()),
        ("before a later backup step", At::Read(2), pages),
    ];
    // Every case is tried, and what went wrong in each is told at the end.
    let mut wrong = Vec::new();
    for (i, (what, when, opts)) in cases.into_iter().enumerate() {
        let src = dir.path().join(format!("s{i}.db"));
        make_db(&src, false, 1500);
        let dest = dir.path().join(format!("c{i}.db"));
        at(
            when,
            Box::new(on(
                &src,
                "PRAGMA journal_mode = WAL; UPDATE meta SET n = n + 1;",
            )),
        );
        let r = snapshot(&src, &dest, &opts);
        clear_hooks();
        let header = fs::read(&src).unwrap()[18..20].to_vec();
        assert_eq!(header, [2, 2], "{what}: the parent is in WAL mode");
        for side in ["-wal", "-shm"] {
            let p = super::super::parent::side(&src, side);
            if p.exists() {
                wrong.push(format!("{what}: fork created {}", p.display()));
            }
        }
        match r {
            Ok(st) => wrong.push(format!("{what}: copied in the wrong mode: {st:?}")),
            Err(e) => {
                let err = e.to_string();
                let named = err.contains(&src.display().to_string());
                if !err.contains("left rollback-journal mode") || !named {
                    wrong.push(format!("{what}: {err}"));
                }
                if dest.exists() {
                    wrong.push(format!("{what}: the refused copy was left"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A WAL-mode database turned to rollback-journal mode between fork's look at its header
/// and its lock: the snapshot reads it as the rollback-journal database it now is, so the
/// lock a WAL parent is read under (harmless to a WAL writer) is not held through the copy,
/// its check and its hash, where it would keep every commit of the parent waiting. A
/// commit made as the copy's read begins goes through at once, and is in the copy.
#[test]
fn a_database_turned_to_rollback_mode_before_the_lock_is_read_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("s.db");
    make_db(&src, true, 1500);
    let dest = dir.path().join("c.db");
    at(
        At::TheLook,
        Box::new(on(&src, "PRAGMA journal_mode = DELETE;")),
    );
    let committed = std::rc::Rc::new(std::cell::RefCell::new(None));
    let (c, s) = (committed.clone(), src.clone());
    at(
        At::Read(0),
        Box::new(move || {
            let parent = Connection::open(&s).unwrap();
            parent.busy_timeout(Duration::ZERO).unwrap();
            *c.borrow_mut() = Some(
                parent
                    .execute_batch("UPDATE meta SET n = n + 1")
                    .map_err(|e| e.to_string()),
            );
        }),
    );
    let r = snapshot(&src, &dest, &SnapshotOptions::default());
    clear_hooks();
    let committed = committed.borrow_mut().take();
    assert_eq!(committed, Some(Ok(())), "the parent's commit was held");
    let st = r.unwrap();
    assert!(!st.wal, "{st:?}");
    assert_eq!(st.method, SnapshotMethod::FileBytes, "{st:?}");
    let n: i64 = Connection::open(&dest)
        .unwrap()
        .query_row("SELECT n FROM meta", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1501, "the commit made before the read is in the copy");
}
