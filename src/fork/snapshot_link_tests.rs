//! Unit tests of the state snapshot against a state directory swapped for a link while
//! fork reads it (races only the runtime's owner can make; a test hook makes each swap at
//! the one moment that matters).

use super::tests::make_db;
use super::*;
use std::path::PathBuf;

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

/// The state's directory swapped for a link to another database's (a swapped-entry race on
/// the state; only the runtime's owner can make it) after fork's first open of the
/// parent's database: in WAL mode after SQLite has opened and locked it too, just before
/// fork opens the file to copy its bytes; in rollback-journal mode, where that first open
/// is the descriptor the file's bytes are copied from, just before SQLite opens it. The
/// snapshot is refused, or (WAL mode, whose SQLite connection was opened before the swap)
/// it holds the parent's rows, never the database the link points at.
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
        // fork's first open is the one it reads the header through (and, in WAL mode,
        // locks): in WAL mode the swap comes at the next, before the bytes are copied; in
        // rollback-journal mode right after the look, before SQLite opens the path.
        if wal {
            let hook: Box<dyn FnOnce()> =
                Box::new(move || HOOK.with(|h| *h.borrow_mut() = Some(Box::new(swap))));
            HOOK.with(|h| *h.borrow_mut() = Some(hook));
        } else {
            AFTER_THE_LOOK.with(|h| *h.borrow_mut() = Some(Box::new(swap)));
        }
        let dest = dir.path().join("copy.db");
        let r = snapshot(&src, &dest, &SnapshotOptions::default());
        let unused = HOOK.with(|h| h.borrow_mut().take()).is_some()
            || AFTER_THE_LOOK.with(|h| h.borrow_mut().take()).is_some();
        assert!(!unused, "wal={wal}: the swap never came");
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

/// A state file reached through a symbolic link (the file itself a link, or a directory
/// above it) is refused, naming the path, before fork opens what the link points at, in
/// both journal modes: the header is read through a descriptor opened with no link in any
/// component, as every later open of the store is.
#[test]
fn a_state_file_reached_through_a_link_is_refused_unopened() {
    for wal in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        fs::create_dir_all(&real).unwrap();
        let db = real.join("s.db");
        make_db(&db, wal, 5);
        let file_link = dir.path().join("file-link.db");
        std::os::unix::fs::symlink(&db, &file_link).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("dir-link")).unwrap();
        let mut opens = inotify::Inotify::init().unwrap();
        opens.watches().add(&db, inotify::WatchMask::OPEN).unwrap();
        let mut buf = [0u8; 4096];
        for (i, linked) in [file_link, dir.path().join("dir-link/s.db")]
            .into_iter()
            .enumerate()
        {
            let dest = dir.path().join(format!("copy{i}.db"));
            let r = snapshot(&linked, &dest, &SnapshotOptions::default());
            let opened = opens.read_events(&mut buf).map_or(0, |evs| evs.count());
            assert_eq!(opened, 0, "wal={wal}: {} was opened", db.display());
            let err = r.unwrap_err().to_string();
            assert!(err.contains("through a symbolic link"), "wal={wal}: {err}");
            assert!(err.contains(&linked.display().to_string()), "{err}");
            assert!(!dest.exists(), "wal={wal}");
        }
    }
}

/// The state file swapped for a FIFO between fork's look at what it is and its open (a
/// swap only the runtime's owner can make; made here where the owner's identity is taken
/// for the open): fork's open does not wait for a writer that never comes, and the store
/// is refused as not a regular file.
#[test]
fn a_state_file_swapped_for_a_fifo_never_blocks_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("s.db");
    make_db(&src, false, 5);
    let swap = std::sync::Mutex::new(Some(src.clone()));
    let read_as = crate::fork::owner::ReadAs::new(0, move |f| {
        if let Some(p) = swap.lock().unwrap().take() {
            fs::remove_file(&p).unwrap();
            nix::unistd::mkfifo(&p, nix::sys::stat::Mode::S_IRWXU).unwrap();
        }
        f();
        Ok(())
    });
    let opts = SnapshotOptions {
        read_as: Some(read_as),
        ..SnapshotOptions::default()
    };
    let (done_tx, done) = std::sync::mpsc::channel();
    let (s, dest) = (src.clone(), dir.path().join("copy.db"));
    let snapshotting = std::thread::spawn(move || {
        let _ = done_tx.send(
            snapshot(&s, &dest, &opts)
                .map(|_| ())
                .map_err(|e| e.to_string()),
        );
    });
    let got = done.recv_timeout(Duration::from_secs(10));
    if got.is_err() {
        // The open waits for a writer: be it, so that the thread ends, and fail.
        drop(fs::OpenOptions::new().write(true).open(&src).unwrap());
        snapshotting.join().unwrap();
        panic!("the snapshot blocked opening a FIFO");
    }
    snapshotting.join().unwrap();
    let err = got.unwrap().unwrap_err();
    assert!(err.contains("is not a regular file"), "{err}");
}
