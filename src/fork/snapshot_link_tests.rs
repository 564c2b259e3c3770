//! Unit tests of the state snapshot against a state directory swapped for a link while
//! fork reads it (races only the runtime's owner can make; a test hook makes each swap at
//! the one moment that matters).

use super::tests::make_db;
use super::*;

/// What the hook runs: `state` exchanged with a link `alt` to `other`, in one step (the
/// owner's swap: `state` is then the link).
fn swapper(state: PathBuf, other: PathBuf, alt: PathBuf) -> impl FnOnce() {
    std::os::unix::fs::symlink(&other, &alt).unwrap();
    move || {
        nix::fcntl::renameat2(
            nix::fcntl::AT_FDCWD,
            &state,
            nix::fcntl::AT_FDCWD,
            &alt,
            nix::fcntl::RenameFlags::RENAME_EXCHANGE,
        )
        .unwrap()
    }
}

/// The state's directory swapped for a link to another database's after SQLite has
/// opened and locked the parent's, just before fork opens the file to copy its bytes
/// (a swapped-entry race on the state; only the runtime's owner can make it): the snapshot is
/// refused, or (WAL mode, whose SQLite connection was opened before the swap) it holds
/// the parent's rows, never the database the link points at. Both journal modes.
#[test]
fn a_state_directory_swapped_for_a_link_is_never_read_through() {
    use super::super::parent::BEFORE_A_PARENT_FILE_OPENS as HOOK;
    let marker = |p: &Path| -> i64 {
        Connection::open(p)
            .unwrap()
            .query_row("SELECT n FROM meta WHERE k = 'rows'", [], |r| r.get(0))
            .unwrap()
    };
    for wal in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (state, other) = (dir.path().join("state"), dir.path().join("other"));
        fs::create_dir_all(&state).unwrap();
        fs::create_dir_all(&other).unwrap();
        let src = state.join("s.db");
        make_db(&src, wal, 5);
        // The same shape and size, another marker: only the marker tells them apart.
        make_db(&other.join("s.db"), wal, 5);
        Connection::open(other.join("s.db"))
            .unwrap()
            .execute_batch("UPDATE meta SET n = 999")
            .unwrap();
        // Live connections keep a WAL database's `-wal` and `-shm`.
        let _live: Vec<Connection> = if wal {
            [&src, &other.join("s.db")]
                .iter()
                .map(|p| {
                    let c = Connection::open(p).unwrap();
                    c.execute_batch("UPDATE meta SET n = n").unwrap();
                    c
                })
                .collect()
        } else {
            Vec::new()
        };
        let swap = swapper(state, other, dir.path().join("alt"));
        // In WAL mode fork's first open is its lock, before SQLite's: swap at the next.
        let hook: Box<dyn FnOnce()> = if wal {
            Box::new(move || HOOK.with(|h| *h.borrow_mut() = Some(Box::new(swap))))
        } else {
            Box::new(swap)
        };
        HOOK.with(|h| *h.borrow_mut() = Some(hook));
        let dest = dir.path().join("copy.db");
        let r = snapshot(&src, &dest, &SnapshotOptions::default());
        let unused = HOOK.with(|h| h.borrow_mut().take()).is_some();
        assert!(!unused, "wal={wal}: fork never opened the file to copy it");
        match r {
            Err(e) => assert!(!dest.exists(), "wal={wal}: {e}"),
            Ok(_) => assert_eq!(marker(&dest), 5, "wal={wal}: read through the link"),
        }
    }
}

/// A WAL store no parent has open (a `-wal` left, no `-shm`) is copied, database and
/// `-wal`, before SQLite reads it: a state directory swapped for a link between fork's
/// lock and its open of the `-wal` must not lend another database's WAL (the frames of
/// any WAL of the same page size replay onto the copy).
#[test]
fn a_parentless_wal_is_never_read_through_a_swapped_directory() {
    use super::super::parent::BEFORE_A_PARENT_FILE_OPENS as HOOK;
    let dir = tempfile::tempdir().unwrap();
    // A database whose last change (the marker) lies only in its `-wal`, copied out
    // while a connection holds it: what a parent that died leaves.
    let leave = |name: &str, marker: i64| -> PathBuf {
        let live = dir.path().join(format!("live-{name}"));
        fs::create_dir_all(&live).unwrap();
        make_db(&live.join("s.db"), true, 5);
        let c = Connection::open(live.join("s.db")).unwrap();
        c.execute_batch(&format!(
            "PRAGMA wal_autocheckpoint = 0; UPDATE meta SET n = {marker}"
        ))
        .unwrap();
        let left = dir.path().join(name);
        fs::create_dir_all(&left).unwrap();
        for f in ["s.db", "s.db-wal"] {
            fs::copy(live.join(f), left.join(f)).unwrap();
        }
        drop(c);
        left
    };
    let state = leave("state", 5);
    let other = leave("other", 999);
    assert!(!state.join("s.db-shm").exists());
    let swap = swapper(state, other, dir.path().join("alt"));
    // fork's first open is its lock on the database; the swap comes at the next, the
    // `-wal`'s.
    let hook: Box<dyn FnOnce()> =
        Box::new(move || HOOK.with(|h| *h.borrow_mut() = Some(Box::new(swap))));
    HOOK.with(|h| *h.borrow_mut() = Some(hook));
    let dest = dir.path().join("copy.db");
    let r = snapshot(
        &dir.path().join("state/s.db"),
        &dest,
        &SnapshotOptions::default(),
    );
    let unused = HOOK.with(|h| h.borrow_mut().take()).is_some();
    assert!(!unused, "fork never opened the -wal");
    match r {
        Err(e) => assert!(!dest.exists(), "{e}"),
        Ok(_) => {
            let n: i64 = Connection::open(&dest)
                .unwrap()
                .query_row("SELECT n FROM meta WHERE k = 'rows'", [], |r| r.get(0))
                .unwrap();
            assert_eq!(n, 5, "the other database's WAL was read through the link");
        }
    }
}

/// A live WAL-mode parent's database replaced (another database renamed over its path)
/// after fork locked it and SQLite opened it, just before fork opens the file to copy its
/// bytes: SQLite's read transaction holds the file fork locked, not the one now at the
/// path, so the snapshot is refused, never a copy of the other database (the new file and
/// whatever `-wal` is at the path would replay into a state the parent never had).
#[test]
fn a_wal_database_replaced_after_its_lock_is_never_copied() {
    use super::super::parent::BEFORE_A_PARENT_FILE_OPENS as HOOK;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("s.db");
    make_db(&src, true, 5);
    // A live parent, its `-wal` checkpointed and cut to nothing: the copy's state is then
    // the database file's.
    let parent = Connection::open(&src).unwrap();
    parent
        .execute_batch("UPDATE meta SET n = n; PRAGMA wal_checkpoint(TRUNCATE);")
        .unwrap();
    let other = dir.path().join("other.db");
    make_db(&other, true, 5);
    Connection::open(&other)
        .unwrap()
        .execute_batch("UPDATE meta SET n = 999")
        .unwrap();
    // fork's first open of the parent's database is the one it locks; the rename comes
    // at the next, the open that copies its bytes.
    let (from, to) = (other.clone(), src.clone());
    let rename: Box<dyn FnOnce()> = Box::new(move || fs::rename(from, to).unwrap());
    let hook: Box<dyn FnOnce()> = Box::new(move || HOOK.with(|h| *h.borrow_mut() = Some(rename)));
    HOOK.with(|h| *h.borrow_mut() = Some(hook));
    let dest = dir.path().join("copy.db");
    let r = snapshot(&src, &dest, &SnapshotOptions::default());
    let unused = HOOK.with(|h| h.borrow_mut().take()).is_some();
    assert!(!unused, "fork never opened the file to copy it");
    match r {
        Ok(st) => {
            let n: i64 = Connection::open(&dest)
                .unwrap()
                .query_row("SELECT n FROM meta", [], |r| r.get(0))
                .unwrap();
            panic!("the replaced file was copied (marker {n}): {st:?}");
        }
        Err(e) => {
            assert!(e.to_string().contains("was replaced"), "{e}");
            assert!(!dest.exists(), "{e}");
        }
    }
    drop(parent);
}
