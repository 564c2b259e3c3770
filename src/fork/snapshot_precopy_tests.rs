//! Unit tests of the rollback journal's copy made before its lock (`precopy.rs`): whatever
//! changed between the unlocked copy and the lock (the parent's commits rewriting pages in
//! place, growing the file, shrinking it; or the copy itself scribbled on), the snapshot
//! is byte for byte the committed state SQLite's pager serializes under the lock, and its
//! digest is the copy's. A hook runs each change at the one moment that matters.

use super::tests::make_db;
use super::*;
use crate::fork::precopy::AFTER_THE_PRECOPY;
use crate::fork::snapshot::the_copy;
use std::os::unix::fs::FileExt;

/// Copies of at least 1 MiB go through the precopy (the databases here are about 9 MiB).
fn precopying(digest: StateDigest) -> SnapshotOptions {
    SnapshotOptions {
        precopy_min_bytes: 1 << 20,
        digest,
        ..SnapshotOptions::default()
    }
}

/// The database's committed state as SQLite's pager reads it, through the other one-image
/// copy (`sqlite3_serialize`).
fn serialized(src: &Path, dest: &Path) -> Vec<u8> {
    let opts = SnapshotOptions {
        raw_copy: false,
        ..SnapshotOptions::default()
    };
    let st = snapshot(src, dest, &opts).unwrap();
    assert_eq!(st.method, SnapshotMethod::Serialize);
    fs::read(dest).unwrap()
}

/// Turns four bytes of `dest` (the first, the last and two between) into their
/// complements: always a change.
fn scribble(dest: &Path) {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dest)
        .unwrap();
    let len = f.metadata().unwrap().len();
    for at in [0, 4096 * 3 + 17, len / 2, len - 1] {
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[!b[0]], at).unwrap();
    }
}

/// Waits out the clock tick of `path`'s last write (its second, on a filesystem stamping
/// whole seconds): a file untouched since an earlier tick can be proven untouched by its
/// change time, and a write after it changes that time (`precopy.rs`).
fn settle_stamps(path: &Path) {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path).unwrap();
    let wait = if m.ctime_nsec() == 0 || m.mtime_nsec() == 0 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        std::time::Duration::from_nanos(1_000_000_000 - u64::from(now.subsec_nanos()))
            + std::time::Duration::from_millis(25)
    } else {
        std::time::Duration::from_millis(25)
    };
    std::thread::sleep(wait);
}

fn on(src: &Path, sql: &'static str) -> impl FnOnce() {
    let src = src.to_path_buf();
    move || Connection::open(&src).unwrap().execute_batch(sql).unwrap()
}

#[test]
fn a_precopy_is_made_the_committed_state_under_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    // What happens between the unlocked copy and the lock, and the least the lock's
    // comparison must copy again.
    type Change = fn(&Path, &Path) -> Box<dyn FnOnce()>;
    let changes: [(&str, Change, u64); 5] = [
        ("nothing", |_, _| Box::new(|| {}), 0),
        (
            "rows rewritten in place",
            |src, _| {
                Box::new(on(
                    src,
                    "UPDATE t SET body = randomblob(3000) WHERE id % 7 = 0",
                ))
            },
            1 << 20,
        ),
        (
            "the file grown",
            |src, _| {
                Box::new(on(
                    src,
                    "INSERT INTO t (body) SELECT randomblob(3000) FROM t WHERE id <= 300;
                     UPDATE meta SET n = (SELECT count(*) FROM t);",
                ))
            },
            1 << 20,
        ),
        (
            "the file shrunk",
            |src, _| {
                Box::new(on(
                    src,
                    "DELETE FROM t WHERE id > 500; UPDATE meta SET n = 500; VACUUM;",
                ))
            },
            1 << 20,
        ),
        (
            // Once the parent has committed, the unlocked copy is trusted for nothing:
            // every byte is compared (the commit rewrites one row, in place).
            "the copy scribbled on",
            |src, _| {
                let commit = on(src, "UPDATE meta SET n = n + 1");
                Box::new(move || {
                    scribble(&the_copy());
                    commit();
                })
            },
            4 * 4096,
        ),
    ];
    for (i, (what, change, least)) in changes.into_iter().enumerate() {
        for digest in [StateDigest::Blake3, StateDigest::Sha256] {
            let src = dir.path().join(format!("s{i}{}.db", digest.name()));
            make_db(&src, false, 1500);
            settle_stamps(&src);
            let before = fs::metadata(&src).unwrap().len();
            let dest = dir.path().join(format!("c{i}{}.db", digest.name()));
            let hook = change(&src, &dest);
            AFTER_THE_PRECOPY.with(|h| *h.borrow_mut() = Some(hook));
            let st = snapshot(&src, &dest, &precopying(digest)).unwrap();
            AFTER_THE_PRECOPY.with(|h| h.borrow_mut().take());
            let want = serialized(&src, &dir.path().join(format!("w{i}{}.db", digest.name())));
            let got = fs::read(&dest).unwrap();
            assert!(got == want, "{what}: the copy is not the committed state");
            assert_eq!(st.method, SnapshotMethod::FileBytesPrecopied, "{what}");
            assert_eq!(st.bytes, want.len() as u64, "{what}");
            assert_eq!(st.digest, digest.of_path(&dest).unwrap(), "{what}");
            assert!(st.integrity_ok, "{what}");
            let recopied = st.recopied_bytes.unwrap();
            assert!(recopied >= least, "{what}: {recopied} bytes copied again");
            // An untouched parent is proven so by its stamps and not read again; once it
            // committed, every byte the copy and the database share is compared.
            let compared = st.compared_bytes.unwrap();
            // (Elsewhere than on a filesystem whose stamps prove it, it is compared.)
            let proven = crate::fork::precopy::stamping(&fs::File::open(&src).unwrap());
            if least == 0 && proven {
                assert_eq!(recopied, 0, "{what}");
                assert_eq!(compared, 0, "{what}");
            } else if least == 0 {
                assert_eq!((recopied, compared), (0, before), "{what}");
            } else {
                assert_eq!(compared, before.min(st.bytes), "{what}");
            }
            match what {
                "the file grown" => assert!(st.bytes > before, "{what}"),
                "the file shrunk" => assert!(st.bytes < before, "{what}"),
                "nothing" | "the copy scribbled on" => assert_eq!(st.bytes, before, "{what}"),
                _ => {}
            }
            // BLAKE3: only the pieces the comparison rewrote (or past a length change)
            // are hashed again.
            let again = st.pieces_hashed_again;
            assert_eq!(again.is_some(), digest == StateDigest::Blake3, "{what}");
            if let Some(n) = again {
                // Every piece was hashed before the change (the hook waits for it): the
                // changed ones are hashed again, and only those.
                let pieces = st.bytes.div_ceil(PIECE_BYTES) as usize;
                assert!(
                    n < pieces || what == "the file shrunk",
                    "{what}: {n} of {pieces}"
                );
                if least == 0 {
                    assert_eq!(n, 0, "{what}");
                } else {
                    assert!(n >= 1, "{what}");
                }
            }
        }
    }
}

/// A database below `precopy_min_bytes` is copied under the lock as before.
#[test]
fn a_small_database_is_copied_under_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("s.db");
    make_db(&src, false, 1500);
    let len = fs::metadata(&src).unwrap().len();
    for (min, method) in [
        (len + 1, SnapshotMethod::FileBytes),
        (len, SnapshotMethod::FileBytesPrecopied),
    ] {
        let dest = dir.path().join(format!("c{min}.db"));
        let opts = SnapshotOptions {
            precopy_min_bytes: min,
            ..SnapshotOptions::default()
        };
        let st = snapshot(&src, &dest, &opts).unwrap();
        assert_eq!(st.method, method);
        assert_eq!(st.digest, StateDigest::Blake3.of_path(&dest).unwrap());
    }
}

/// The database grew past the image bound between the unlocked copy and the lock: the
/// copy is dropped and the online backup API copies it page by page, into an emptied
/// file.
#[test]
fn a_precopy_of_a_database_grown_past_the_bound_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("s.db");
    make_db(&src, false, 1500);
    let len = fs::metadata(&src).unwrap().len();
    let dest = dir.path().join("c.db");
    // The copy's header scribbled on too: unless the dropped copy is emptied, the online
    // backup API opens it as a database and fails.
    let grow = on(
        &src,
        "INSERT INTO t (body) SELECT randomblob(3000) FROM t WHERE id <= 300;",
    );
    AFTER_THE_PRECOPY.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || {
            grow();
            let f = fs::OpenOptions::new().write(true).open(the_copy()).unwrap();
            f.write_all_at(&[0x5a; 100], 0).unwrap();
        }))
    });
    let opts = SnapshotOptions {
        image_max_bytes: len,
        ..precopying(StateDigest::Blake3)
    };
    let st = snapshot(&src, &dest, &opts).unwrap();
    assert_eq!(st.method, SnapshotMethod::Pages, "{st:?}");
    assert!(st.bytes > len);
    assert!(st.integrity_ok);
    assert_eq!(st.bytes, fs::metadata(&dest).unwrap().len());
    let rows: i64 = Connection::open(&dest)
        .unwrap()
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 1800);
    assert_eq!(st.digest, StateDigest::Blake3.of_path(&dest).unwrap());
}

/// The database file replaced between the unlocked copy and the lock (another file
/// renamed over it): the file copied is not the file SQLite locked, so the snapshot is
/// refused and its copy removed.
#[test]
fn a_database_replaced_after_its_precopy_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("s.db");
    make_db(&src, false, 1500);
    let other = dir.path().join("other.db");
    make_db(&other, false, 1600);
    let dest = dir.path().join("c.db");
    let (from, to) = (other.clone(), src.clone());
    AFTER_THE_PRECOPY
        .with(|h| *h.borrow_mut() = Some(Box::new(move || fs::rename(from, to).unwrap())));
    let err = snapshot(&src, &dest, &precopying(StateDigest::Blake3)).unwrap_err();
    assert!(
        err.to_string().contains("changed while it was locked"),
        "{err}"
    );
    assert!(!dest.exists());
}

/// The stamps, not the bytes, decide whether the comparison is skipped: a parent whose
/// file is written with the very bytes it holds (no commit, nothing changed) is compared
/// all the same; fork's copy written after the precopy (the parent quiet) is compared and
/// mended too. Each snapshot is the committed state.
#[test]
fn a_changed_stamp_on_either_file_means_every_byte_is_compared() {
    let dir = tempfile::tempdir().unwrap();
    type Touch = fn(&Path, &Path);
    let touches: [(&str, Touch); 2] = [
        ("the parent's page 2 written as it is", |src, _| {
            let f = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(src)
                .unwrap();
            let mut page = vec![0u8; 4096];
            f.read_exact_at(&mut page, 4096).unwrap();
            f.write_all_at(&page, 4096).unwrap();
        }),
        ("fork's copy scribbled on", |_, dest| scribble(dest)),
    ];
    if !crate::fork::precopy::stamping(&fs::File::open(dir.path()).unwrap()) {
        eprintln!("fork-test-skip: the temp dir's filesystem has no stamps to prove with");
        return;
    }
    for (i, (what, touch)) in touches.into_iter().enumerate() {
        let src = dir.path().join(format!("s{i}.db"));
        make_db(&src, false, 1500);
        settle_stamps(&src);
        let dest = dir.path().join(format!("c{i}.db"));
        let s = src.clone();
        AFTER_THE_PRECOPY.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                // Past the tick of fork's own last write to its copy.
                let d = the_copy();
                settle_stamps(&d);
                touch(&s, &d);
            }))
        });
        let st = snapshot(&src, &dest, &precopying(StateDigest::Blake3)).unwrap();
        let want = serialized(&src, &dir.path().join(format!("w{i}.db")));
        assert!(
            fs::read(&dest).unwrap() == want,
            "{what}: not the committed state"
        );
        assert_eq!(st.compared_bytes, Some(want.len() as u64), "{what}: {st:?}");
        assert_eq!(
            st.digest,
            StateDigest::Blake3.of_path(&dest).unwrap(),
            "{what}"
        );
    }
}

/// The database turned to WAL between the unlocked copy and the lock: its committed state
/// may now lie in its `-wal`, which no copy of the file alone holds, so the snapshot is
/// refused, naming the cause, whether copied before the lock or under it.
#[test]
fn a_database_turned_to_wal_during_its_snapshot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (i, min) in [1u64 << 20, u64::MAX].into_iter().enumerate() {
        let src = dir.path().join(format!("s{i}.db"));
        make_db(&src, false, 1500);
        let dest = dir.path().join(format!("c{i}.db"));
        let turn = on(
            &src,
            "PRAGMA journal_mode = WAL; UPDATE meta SET n = n + 1;",
        );
        if min == u64::MAX {
            // Copied under the lock: the change comes just before the read transaction.
            crate::fork::sqlite::BEFORE_THE_PARENT_IS_READ
                .with(|h| h.borrow_mut().push_back(Box::new(turn)));
        } else {
            AFTER_THE_PRECOPY.with(|h| *h.borrow_mut() = Some(Box::new(turn)));
        }
        let opts = SnapshotOptions {
            precopy_min_bytes: min,
            ..SnapshotOptions::default()
        };
        let err = snapshot(&src, &dest, &opts);
        AFTER_THE_PRECOPY.with(|h| h.borrow_mut().take());
        crate::fork::sqlite::BEFORE_THE_PARENT_IS_READ.with(|h| h.borrow_mut().clear());
        let err = err.unwrap_err().to_string();
        assert!(err.contains("left rollback-journal mode"), "{min}: {err}");
        assert!(!dest.exists(), "{min}");
    }
}
