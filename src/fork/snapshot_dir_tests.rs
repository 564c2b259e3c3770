//! Unit tests of snapshots sharing one directory, as `fork evaluate` makes them (every
//! store's copy under its file name in one snapshot directory): no snapshot creates,
//! replaces or removes any other name there, whatever names the other stores have.

use super::tests::make_db;
use super::*;

/// The names fork's scratch files and SQLite's side files were given beside a copy `NAME`
/// (`NAME.parent` and its own side files, `NAME-wal`, `NAME-shm`, `NAME-journal`).
const SIDE_NAMES: [&str; 6] = [
    ".parent",
    ".parent-wal",
    ".parent-shm",
    "-wal",
    "-shm",
    "-journal",
];

/// Makes `path` a database whose index disagrees with its table (the integrity check
/// refuses it; `image_snapshot_refuses_a_corrupt_database`).
fn corrupt(path: &Path) {
    make_db(path, false, 50);
    Connection::open(path)
        .unwrap()
        .execute_batch(
            "PRAGMA writable_schema = ON;
             UPDATE sqlite_schema SET sql = 'CREATE INDEX t_body ON t(id)' WHERE name = 't_body';
             PRAGMA writable_schema = OFF;",
        )
        .unwrap();
}

/// Stores named as another store's side files (`hermes.db.parent`, `hermes.db-wal`, ...,
/// from another directory of the runtime) are snapshotted first; then `hermes.db`, by each
/// route its snapshot can take: every other copy is left as it was, and `hermes.db`'s own
/// copy is its committed state (or, refused, gone).
#[test]
fn a_snapshot_never_touches_another_stores_copy_in_the_same_directory() {
    // (route, WAL mode, a live parent, the store refused by its check)
    let routes = [
        ("rollback journal", false, false, false),
        ("rollback journal, refused", false, false, true),
        ("WAL, a live parent", true, true, false),
        ("WAL, no parent (copied into staging)", true, false, false),
    ];
    let mut wrong = Vec::new();
    for (route, wal, live, refused) in routes {
        let dir = tempfile::tempdir().unwrap();
        let (state, other, snap) = (
            dir.path().join("state"),
            dir.path().join("other"),
            dir.path().join("snap"),
        );
        for d in [&state, &other, &snap] {
            fs::create_dir_all(d).unwrap();
        }
        let src = state.join("hermes.db");
        if refused {
            corrupt(&src);
        } else {
            make_db(&src, wal, 50);
        }
        // A live parent with a commit in its `-wal` (the WAL file copy and replay).
        let _parent = live.then(|| {
            let c = Connection::open(&src).unwrap();
            c.execute_batch("PRAGMA wal_autocheckpoint = 0; UPDATE meta SET n = n + 1;")
                .unwrap();
            c
        });
        let mut copies = Vec::new();
        for side in SIDE_NAMES {
            let name = format!("hermes.db{side}");
            make_db(&other.join(&name), false, 3);
            let copy = snap.join(&name);
            snapshot(&other.join(&name), &copy, &SnapshotOptions::default()).unwrap();
            copies.push((copy.clone(), fs::read(&copy).unwrap()));
        }
        let dest = snap.join("hermes.db");
        let r = snapshot(&src, &dest, &SnapshotOptions::default());
        for (copy, bytes) in &copies {
            match fs::read(copy) {
                Ok(now) if &now == bytes => {}
                Ok(_) => wrong.push(format!("{route}: {} was rewritten", copy.display())),
                Err(e) => wrong.push(format!("{route}: {}: {e}", copy.display())),
            }
        }
        let mut names: Vec<String> = fs::read_dir(&snap)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut want: Vec<String> = SIDE_NAMES
            .iter()
            .map(|s| format!("hermes.db{s}"))
            .chain((!refused).then(|| "hermes.db".to_string()))
            .collect();
        want.sort();
        if names != want {
            wrong.push(format!("{route}: the directory holds {names:?}"));
        }
        match (r, refused) {
            (Ok(st), false) => {
                let n: i64 = Connection::open(&dest)
                    .unwrap()
                    .query_row("SELECT n FROM meta", [], |r| r.get(0))
                    .unwrap();
                let expect = if live { 51 } else { 50 };
                if n != expect || st.digest != StateDigest::Blake3.of_path(&dest).unwrap() {
                    wrong.push(format!("{route}: the copy holds {n}: {st:?}"));
                }
            }
            (Err(SnapshotError::Corrupt { .. }), true) => {}
            (r, _) => wrong.push(format!("{route}: {:?}", r.map(|_| ()))),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
