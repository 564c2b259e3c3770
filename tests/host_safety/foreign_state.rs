//! A runtime another user owns: its state stores are read only as that user could.

use super::*;

/// Gives `dir` and everything beneath it to `uid` (and its group).
fn chown_tree(dir: &Path, uid: u32) {
    std::os::unix::fs::lchown(dir, Some(uid), Some(uid)).unwrap();
    if std::fs::symlink_metadata(dir).unwrap().is_dir() {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            chown_tree(&e.path(), uid);
        }
    }
}

/// A root-only SQLite database (0600, root's) holding the secret, in journal mode `mode`.
fn root_only_db(path: &Path, mode: &str) {
    let c = rusqlite::Connection::open(path).unwrap();
    c.query_row(&format!("PRAGMA journal_mode = {mode}"), [], |_| Ok(()))
        .unwrap();
    c.execute_batch(&format!(
        "CREATE TABLE sessions (id TEXT); INSERT INTO sessions VALUES ('{SECRET}');"
    ))
    .unwrap();
    drop(c);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// As root on a runtime another user owns, the state stores are opened as that user (by
/// fork and by SQLite): a store that is a hard link to a root-only database (what
/// `fs.protected_hardlinks=0` allows the owner, or the inode such a link keeps) is refused,
/// naming it (exit 65), and its rows reach no sandbox and no bundle; so is a parent-less
/// `-wal` linked the same way. The same runtime with its own database evaluates. Both
/// journal modes.
#[test]
fn a_foreign_runtimes_state_is_read_only_as_its_owner_could() {
    need_root!();
    let env = common::lifecycle::Env::new("hs-store-owner");
    let nobody = 65534;
    let args = ["--task", "quick", "--no-ledger"];
    let patch = common::lifecycle::patch("noop-comment");
    for mode in ["delete", "wal"] {
        let rt = env.runtime(
            &format!("rt-{mode}"),
            "\n[tasks.quick]\ncommand = [\"true\"]\n",
        );
        let db = rt.join("state/hermes.db");
        let c = rusqlite::Connection::open(&db).unwrap();
        c.query_row(&format!("PRAGMA journal_mode = {mode}"), [], |_| Ok(()))
            .unwrap();
        drop(c);
        chown_tree(&rt, nobody);
        let e = common::lifecycle::evaluate(&env, &patch, &rt, &format!("own-{mode}"), &args);
        assert_eq!(e.code, 0, "the owner's own database: {}", e.ctx());
        if mode == "wal" {
            // A live parent (its `-wal` and `-shm` exist, SQLite gave them to the
            // database's owner): read through them, as the owner.
            let live = rusqlite::Connection::open(&db).unwrap();
            live.execute_batch("CREATE TABLE live (n INTEGER); INSERT INTO live VALUES (1);")
                .unwrap();
            for side in ["-wal", "-shm"] {
                let m = std::fs::metadata(rt.join(format!("state/hermes.db{side}"))).unwrap();
                assert_eq!(m.uid(), nobody, "{side}");
            }
            let e = common::lifecycle::evaluate(&env, &patch, &rt, "own-live", &args);
            assert_eq!(e.code, 0, "a live parent of its own: {}", e.ctx());
            drop(live);
        }

        // The store swapped for a hard link to a root-only database.
        let secret_db = env.dir.join(format!("secret-{mode}.db"));
        root_only_db(&secret_db, mode);
        std::fs::rename(&db, rt.join("state/own.db")).unwrap();
        std::fs::hard_link(&secret_db, &db).unwrap();
        let e = common::lifecycle::evaluate(&env, &patch, &rt, &format!("linked-{mode}"), &args);
        assert_eq!(e.code, 65, "{}", e.ctx());
        for want in ["hermes.db", "its owner (uid 65534) may not open it"] {
            assert!(e.stderr.contains(want), "{want}: {}", e.ctx());
        }
        assert!(!e.out.exists(), "no bundle: {}", e.ctx());
        let reject = common::lifecycle::patch("touches-protected");
        let mut linked_reject = None;
        if mode == "delete" {
            // A gate's REJECT hashes the stores as they stand, opened as the snapshot
            // opens them: the linked store is as unreadable as any root-only file (the
            // same state hash as with an empty one), never hashed as root.
            let linked = common::lifecycle::evaluate(&env, &reject, &rt, "reject-linked", &args);
            assert_eq!(linked.code, 1, "{}", linked.ctx());
            std::fs::remove_file(&db).unwrap();
            std::fs::write(&db, "").unwrap();
            std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o600)).unwrap();
            let plain = common::lifecycle::evaluate(&env, &reject, &rt, "reject-plain", &args);
            assert_eq!(plain.code, 1, "{}", plain.ctx());
            assert_eq!(
                linked.verdict["state_hash"],
                plain.verdict["state_hash"],
                "{}",
                linked.ctx()
            );
            linked_reject = Some(linked);
        }
        std::fs::remove_file(&db).unwrap();
        std::fs::rename(rt.join("state/own.db"), &db).unwrap();
        if let Some(linked) = linked_reject {
            // The control: the owner's own store is hashed, not `unreadable` as well.
            let own = common::lifecycle::evaluate(&env, &reject, &rt, "reject-own", &args);
            assert_eq!(own.code, 1, "{}", own.ctx());
            assert_ne!(
                own.verdict["state_hash"],
                linked.verdict["state_hash"],
                "{}",
                own.ctx()
            );
        }
    }

    // A WAL database no parent has open, its `-wal` left behind (no `-shm`): the `-wal`
    // a hard link to a root-only file.
    let rt = env.dir.join("rt-wal");
    let wal = rt.join("state/hermes.db-wal");
    let secret_wal = env.dir.join("secret.db-wal");
    std::fs::write(&secret_wal, SECRET).unwrap();
    std::fs::set_permissions(&secret_wal, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::hard_link(&secret_wal, &wal).unwrap();
    let e = common::lifecycle::evaluate(&env, &patch, &rt, "linked-wal-file", &args);
    assert_eq!(e.code, 65, "{}", e.ctx());
    for want in ["hermes.db-wal", "its owner (uid 65534) may not open it"] {
        assert!(e.stderr.contains(want), "{want}: {}", e.ctx());
    }
    std::fs::remove_file(&wal).unwrap();
    assert!(
        holds_secret(&env.run_root).is_empty(),
        "nothing of the secret in the run root"
    );
}
