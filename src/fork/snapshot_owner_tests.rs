//! Unit tests of the state snapshot read as the runtime's owner ([`ReadAs`]): what SQLite
//! opens of the parent by path, at any read transaction, is opened as the owner too, so a
//! file the owner swaps in between fork's own checks and SQLite's opens is refused rather
//! than read as root. Root only (the owner's identity is taken with setfsuid(2)); each
//! swap is made by a test hook at the one moment that matters.

use super::super::sqlite::BEFORE_THE_PARENT_IS_READ;
use super::*;
use std::os::unix::fs::{chown, PermissionsExt};
use std::path::PathBuf;

const NOBODY: u32 = 65534;
const SECRET: &str = "ROOT-ONLY-ROWS-7c";

/// The owner's identity as far as these tests need it: its filesystem uid and gid (the
/// files the owner must not read are root's, mode 0600, so root's groups lend nothing).
fn as_nobody() -> ReadAs {
    use nix::unistd::{setfsgid, setfsuid, Gid, Uid};
    ReadAs::new(NOBODY, |f| {
        let gid = setfsgid(Gid::from_raw(NOBODY));
        let uid = setfsuid(Uid::from_raw(NOBODY));
        f();
        setfsuid(uid);
        setfsgid(gid);
        Ok(())
    })
}

/// A world the owner can reach: `dir` (0755, root's) holding `state/` (the owner's) with
/// the owner's rollback-journal database `state/db` (one row, `parent`).
fn world() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let state = dir.path().join("state");
    fs::create_dir(&state).unwrap();
    let db = state.join("db");
    let c = Connection::open(&db).unwrap();
    c.execute_batch(
        "PRAGMA journal_mode = DELETE; CREATE TABLE t (v TEXT); INSERT INTO t VALUES ('parent');",
    )
    .unwrap();
    drop(c);
    for p in [&state, &db] {
        chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    (dir, db)
}

/// A root-only database (0600, its side files too) holding the secret rows, in journal mode `mode`; with
/// `keep`, a connection that keeps its `-wal` (every change in it) is returned.
fn root_only(path: &Path, mode: &str, keep: bool) -> Option<Connection> {
    let c = Connection::open(path).unwrap();
    c.execute_batch(&format!(
        "PRAGMA journal_mode = {mode}; PRAGMA wal_autocheckpoint = 0; \
         CREATE TABLE t (v TEXT); INSERT INTO t VALUES ('{SECRET}');"
    ))
    .unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let p = super::super::parent::side(path, suffix);
        if p.exists() {
            fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        }
    }
    keep.then_some(c)
}

/// The backup route (SQLite reads every page), as the owner.
fn opts() -> SnapshotOptions {
    SnapshotOptions {
        image_max_bytes: 0,
        read_as: Some(as_nobody()),
        ..SnapshotOptions::default()
    }
}

fn holds(path: &Path, what: &str) -> bool {
    fs::read(path).is_ok_and(|b| String::from_utf8_lossy(&b).contains(what))
}

/// The owner's own database is read through SQLite as the owner; one swapped for a hard
/// link to a root-only database after fork's own opens, just before SQLite opens it, is
/// refused, not copied.
#[test]
fn sqlite_opens_the_parents_database_as_its_owner() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let (dir, db) = world();
    let dest = dir.path().join("copy");
    snapshot(&db, &dest, &opts()).unwrap();
    assert!(holds(&dest, "parent"));

    let secret = dir.path().join("secret");
    root_only(&secret, "DELETE", false);
    let (db2, secret2) = (db.clone(), secret.clone());
    BEFORE_THE_PARENT_IS_READ.with(|h| {
        h.borrow_mut().push_back(Box::new(move || {
            fs::remove_file(&db2).unwrap();
            fs::hard_link(&secret2, &db2).unwrap();
        }))
    });
    let dest = dir.path().join("copy2");
    let e = snapshot(&db, &dest, &opts()).unwrap_err();
    BEFORE_THE_PARENT_IS_READ.with(|h| h.borrow_mut().clear());
    assert!(!holds(&dest, SECRET), "{e}");
    assert!(e.to_string().contains("unable to open"), "{e}");
}

/// A rollback-journal parent whose `-wal` appears (a hard link to a root-only database's
/// `-wal`) after fork looked for one: SQLite, which looks for a `-wal` at the start of
/// every read transaction and reads the pages it holds, opens it as the owner and is
/// refused; read as root, the copy would hold the root-only rows. At each read of the
/// parent that starts a read transaction: the backup's first read, a backup step (each
/// its own transaction in this mode), the one-image copy's read.
#[test]
fn a_wal_that_appears_later_is_opened_as_the_owner() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let image = SnapshotOptions {
        read_as: Some(as_nobody()),
        ..SnapshotOptions::default()
    };
    // How the copy is made, and how many reads of the parent come before the `-wal`
    // appears (the first: the connection's open and first read, after fork looked for
    // side files).
    for (at, opts, reads_before) in [
        ("the backup's first read", opts(), 1),
        ("a backup step", opts(), 2),
        ("the one-image copy's read", image, 1),
    ] {
        let (dir, db) = world();
        let secret = dir.path().join("secret");
        let _keep = root_only(&secret, "WAL", true);
        let secret_wal = dir.path().join("secret-wal");
        assert!(
            holds(&secret_wal, SECRET),
            "the root-only rows are in its -wal"
        );
        let wal = dir.path().join("state/db-wal");
        BEFORE_THE_PARENT_IS_READ.with(|h| {
            let mut h = h.borrow_mut();
            for _ in 0..reads_before {
                h.push_back(Box::new(|| {}));
            }
            h.push_back(Box::new(move || fs::hard_link(&secret_wal, &wal).unwrap()));
        });
        let dest = dir.path().join("copy");
        let r = snapshot(&db, &dest, &opts);
        let unused = BEFORE_THE_PARENT_IS_READ.with(|h| h.borrow_mut().drain(..).count());
        assert_eq!(unused, 0, "{at}: every hook ran");
        assert!(!holds(&dest, SECRET), "{at}: {r:?}");
        assert!(r.is_err(), "{at}: the -wal is refused: {r:?}");
    }
}
