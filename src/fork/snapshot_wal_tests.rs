//! WAL mode's file copy (`walcopy.rs`) against a hostile parent: a writer committing
//! continuously (a 2 ms breath every 100 commits, in which checkpoints catch up and a
//! snapshot may start on read-lock 0) and a second connection running every kind of checkpoint in a loop
//! (PASSIVE, FULL, RESTART, TRUNCATE: backfills, WAL restarts and cuts under the copy), in
//! another process (as a real parent: fork then reads its wal-index read-only and cannot
//! set a read mark) and in this one (fork's connection then shares SQLite's wal-index and
//! sets marks). Every snapshot must be one committed state: the integrity check passes,
//! the transfers keep the balances' sum, the sequence has no gap and the ledger counts it.

use super::snapshot::{snapshot, SnapshotMethod, SnapshotOptions, StateDigest};
use rusqlite::{Connection, OpenFlags};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ACCOUNTS: i64 = 50;
const BALANCE: i64 = 1000;
/// The child's (or threads') own bound, whatever the test does (the test stops them when
/// its snapshots are done: about 10 s on a quiet machine).
const CHAOS_LIMIT: Duration = Duration::from_secs(90);
const SNAPSHOTS: usize = 50;
/// The sequence keeps its last RING rows (about 3 MiB): the database stays that size.
const RING: i64 = 2000;

fn make_db(path: &Path) {
    let c = Connection::open(path).unwrap();
    c.execute_batch(&format!(
        "PRAGMA journal_mode = WAL;
         CREATE TABLE acct (id INTEGER PRIMARY KEY, bal INTEGER NOT NULL);
         CREATE INDEX acct_bal ON acct(bal);
         CREATE TABLE seq (n INTEGER PRIMARY KEY, pad BLOB NOT NULL);
         CREATE TABLE ledger (k TEXT PRIMARY KEY, n INTEGER NOT NULL);
         INSERT INTO ledger VALUES ('transfers', 0);
         WITH RECURSIVE i(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM i WHERE x < {ACCOUNTS})
         INSERT INTO acct SELECT x, {BALANCE} FROM i;"
    ))
    .unwrap();
}

/// One transfer: two balances, a sequence row, the ledger, in one transaction.
fn transfer(c: &Connection, x: &mut u64) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    let a = (*x % ACCOUNTS as u64) as i64 + 1;
    let b = ((*x >> 20) % ACCOUNTS as u64) as i64 + 1;
    let amount = ((*x >> 40) % 50) as i64;
    c.execute_batch(&format!(
        "BEGIN IMMEDIATE;
         UPDATE acct SET bal = bal - {amount} WHERE id = {a};
         UPDATE acct SET bal = bal + {amount} WHERE id = {b};
         INSERT INTO seq VALUES ((SELECT coalesce(max(n), 0) + 1 FROM seq), randomblob(1500));
         DELETE FROM seq WHERE n <= (SELECT max(n) FROM seq) - {RING};
         UPDATE ledger SET n = n + 1;
         COMMIT;"
    ))
    .unwrap();
}

/// The writer and the checkpointer, on two threads, until `stop` or the bound.
fn chaos(db: PathBuf, stop: Arc<AtomicBool>, ready: impl FnOnce() + Send + 'static) {
    let began = Instant::now();
    let (db2, stop2) = (db.clone(), stop.clone());
    let checkpointer = std::thread::spawn(move || {
        let c = Connection::open(&db2).unwrap();
        c.busy_timeout(Duration::from_millis(5)).unwrap();
        let mut n = 0u64;
        while !stop2.load(Ordering::SeqCst) && began.elapsed() < CHAOS_LIMIT {
            let mode = ["PASSIVE", "FULL", "RESTART", "TRUNCATE"][(n % 4) as usize];
            // Busy answers (a reader or the writer in the way) are part of the game.
            let _ = c.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |_| Ok(()));
            n += 1;
            std::thread::sleep(Duration::from_micros(300));
        }
    });
    let c = Connection::open(&db).unwrap();
    c.busy_timeout(Duration::from_secs(10)).unwrap();
    c.execute_batch("PRAGMA synchronous = OFF").unwrap();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    // A few MiB first, so that a copy takes a while.
    for _ in 0..RING {
        transfer(&c, &mut x);
    }
    ready();
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) && began.elapsed() < CHAOS_LIMIT {
        transfer(&c, &mut x);
        n += 1;
        // Now and then a breath, in which a checkpoint backfills the whole WAL: a snapshot
        // starting then reads on read-lock 0, where a restart or a cut of the WAL (the
        // next TRUNCATE, the writer starting over) may come under its copy.
        if n % 100 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    checkpointer.join().unwrap();
}

/// The child process's side (run by `hostile_parent_in_another_process`, ignored
/// otherwise): chaos on FORK_TEST_WAL_CHAOS until stdin closes.
#[test]
#[ignore]
fn wal_chaos_child() {
    let Some(db) = std::env::var_os("FORK_TEST_WAL_CHAOS") else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        s.store(true, Ordering::SeqCst);
    });
    chaos(PathBuf::from(db), stop, || {
        println!("fork-test-chaos-ready")
    });
}

/// Checks one snapshot's invariants, read without creating anything beside it.
fn check_invariants(copy: &Path) -> i64 {
    let c = Connection::open_with_flags(
        super::parent::file_uri(copy, "mode=ro&immutable=1"),
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
    )
    .unwrap();
    let sum: i64 = c
        .query_row("SELECT sum(bal) FROM acct", [], |r| r.get(0))
        .unwrap();
    let (count, min, max): (i64, i64, i64) = c
        .query_row(
            "SELECT count(*), coalesce(min(n), 1), coalesce(max(n), 0) FROM seq",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    let ledger: i64 = c
        .query_row("SELECT n FROM ledger", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        sum,
        ACCOUNTS * BALANCE,
        "{}: the transfers' sum",
        copy.display()
    );
    assert_eq!(
        count,
        max - min + 1,
        "{}: a gap in the sequence",
        copy.display()
    );
    assert_eq!(
        (count.min(RING), ledger),
        (count, max),
        "{}: the ledger",
        copy.display()
    );
    max
}

fn hostile_parent(other_process: bool) {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let snaps = dir.path().join("snaps");
    std::fs::create_dir_all(&live).unwrap();
    std::fs::create_dir_all(&snaps).unwrap();
    let db = live.join("live.db");
    make_db(&db);
    let stop = Arc::new(AtomicBool::new(false));
    let mut child = None;
    let mut threads = None;
    if other_process {
        let mut c = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "fork::snapshot_wal_tests::wal_chaos_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("FORK_TEST_WAL_CHAOS", &db)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(c.stdout.take().unwrap()).lines();
        let ready = lines.any(|l| l.is_ok_and(|l| l.contains("chaos-ready")));
        assert!(ready, "the chaos child did not start");
        // The rest of its output (the test harness's), read until it ends.
        std::thread::spawn(move || lines.for_each(drop));
        child = Some(c);
    } else {
        let (tx, rx) = std::sync::mpsc::channel();
        let (d, s) = (db.clone(), stop.clone());
        threads = Some(std::thread::spawn(move || {
            chaos(d, s, move || tx.send(()).unwrap())
        }));
        rx.recv_timeout(CHAOS_LIMIT).unwrap();
    }
    let mut methods = vec![];
    let mut restarts = 0;
    let mut last = 0;
    for i in 0..SNAPSHOTS {
        let dest = snaps.join(format!("copy-{i}.db"));
        let st = snapshot(&db, &dest, &SnapshotOptions::default()).unwrap();
        assert!(st.integrity_ok && st.wal, "{st:?}");
        // The digest is the copy's own (hashed behind the copy, its pieces the replay
        // rewrote hashed again), whatever the checkpoints did to the file meanwhile.
        assert_eq!(
            st.digest,
            StateDigest::Blake3.of_path(&dest).unwrap(),
            "{st:?}"
        );
        methods.push(st.method);
        restarts += st.restarts;
        let n = check_invariants(&dest);
        assert!(n >= last, "snapshot {i} went back in time: {n} < {last}");
        last = n;
        std::fs::remove_file(&dest).unwrap();
        // Nothing fork made beside the parent's database, nothing left beside the copy.
        for d in [&live, &snaps] {
            for e in std::fs::read_dir(d).unwrap() {
                let name = e.unwrap().file_name().into_string().unwrap();
                assert!(
                    d == &live && ["live.db", "live.db-wal", "live.db-shm"].contains(&&*name),
                    "{} gained {name}",
                    d.display()
                );
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    if let Some(mut c) = child {
        drop(c.stdin.take());
        let st = c.wait().unwrap();
        assert!(st.success(), "the chaos child failed: {st}");
    }
    if let Some(t) = threads {
        t.join().unwrap();
    }
    let files = methods
        .iter()
        .filter(|m| **m == SnapshotMethod::WalFiles)
        .count();
    eprintln!(
        "{SNAPSHOTS} snapshots (other process: {other_process}): {files} by file copy, \
         {restarts} copies discarded (WAL restarted), last sequence {last}"
    );
    // The rest (a -wal grown past 4 MiB and half the database) went through the pager.
    assert!(files >= SNAPSHOTS / 5, "by file copy: {methods:?}");
}

#[test]
fn hostile_parent_in_another_process() {
    hostile_parent(true);
}

#[test]
fn hostile_parent_in_this_process() {
    hostile_parent(false);
}

/// The child of `a_wal_index_being_rebuilt_is_waited_for` (ignored otherwise): a parent
/// connection that has read its database once (its wal-index mapped, its shared memory
/// vouched for by its lock), then idles until stdin closes.
#[test]
#[ignore]
fn idle_parent_child() {
    let Some(db) = std::env::var_os("FORK_TEST_IDLE_PARENT") else {
        return;
    };
    let c = Connection::open(db).unwrap();
    c.query_row("SELECT count(*) FROM acct", [], |r| r.get::<_, i64>(0))
        .unwrap();
    println!("fork-test-idle-ready");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// A live parent's wal-index header found invalid (as while another of its connections
/// rebuilds it after a crash): fork's `readonly_shm` reader may not rebuild it and SQLite
/// refuses the read (`SQLITE_READONLY_RECOVERY`). The snapshot waits, as for a busy
/// parent, and copies the committed state once the header is whole again; it failed at
/// once before. The parent is another process, as a real one is (in this one, fork's
/// connection would share SQLite's writable wal-index and rebuild it itself).
#[test]
fn a_wal_index_being_rebuilt_is_waited_for() {
    use std::os::unix::fs::FileExt;
    const HELD: Duration = Duration::from_millis(300);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("live.db");
    make_db(&db);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "fork::snapshot_wal_tests::idle_parent_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FORK_TEST_IDLE_PARENT", &db)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.contains("idle-ready"))),
        "the parent child did not start"
    );
    std::thread::spawn(move || lines.for_each(drop));
    // Commits left in the WAL (the child's connection keeps it from being checkpointed
    // away when this one closes): the copy has frames to replay.
    {
        let c = Connection::open(&db).unwrap();
        c.execute_batch("PRAGMA wal_autocheckpoint = 0").unwrap();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..50 {
            transfer(&c, &mut x);
        }
    }
    // Both copies of the wal-index header (its first 96 bytes) zeroed, then put back.
    let shm = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.path().join("live.db-shm"))
        .unwrap();
    let mut header = [0u8; 96];
    shm.read_exact_at(&mut header, 0).unwrap();
    assert_ne!(header, [0u8; 96], "the wal-index has a header");
    shm.write_all_at(&[0u8; 96], 0).unwrap();
    let began = Instant::now();
    let restorer = std::thread::spawn(move || {
        std::thread::sleep(HELD);
        shm.write_all_at(&header, 0).unwrap();
    });
    let dest = dir.path().join("copy.db");
    let st = snapshot(&db, &dest, &SnapshotOptions::default());
    let waited = began.elapsed();
    restorer.join().unwrap();
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success(), "the parent child failed");
    let st = st.expect("the snapshot waits for the wal-index to be whole");
    assert!(st.integrity_ok && st.wal, "{st:?}");
    assert!(
        waited >= HELD,
        "the snapshot ended after {waited:?}, before the header was back"
    );
    assert_eq!(
        st.digest,
        StateDigest::Blake3.of_path(&dest).unwrap(),
        "{st:?}"
    );
    // Every commit of the WAL is in the copy.
    assert_eq!(check_invariants(&dest), 50);
}

/// On a quiet parent whose WAL holds frames not yet checkpointed, the file copy replayed
/// is byte for byte the image SQLite's pager serializes (the replay is needed: the
/// database file alone lacks the WAL's commits).
#[test]
fn wal_files_equal_the_serialized_image() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("q.db");
    make_db(&db);
    // A parent connection kept open, so `-wal` and `-shm` exist; its commits stay in the
    // WAL (no automatic checkpoint).
    let parent = Connection::open(&db).unwrap();
    parent
        .execute_batch("PRAGMA wal_autocheckpoint = 0")
        .unwrap();
    let mut x = 7u64;
    for _ in 0..150 {
        transfer(&parent, &mut x);
    }
    let files = dir.path().join("files.db");
    let ser = dir.path().join("ser.db");
    let a = snapshot(&db, &files, &SnapshotOptions::default()).unwrap();
    let b = snapshot(
        &db,
        &ser,
        &SnapshotOptions {
            wal_file_copy: false,
            ..SnapshotOptions::default()
        },
    )
    .unwrap();
    assert_eq!(
        (a.method, b.method),
        (SnapshotMethod::WalFiles, SnapshotMethod::Serialize)
    );
    assert_eq!(std::fs::read(&files).unwrap(), std::fs::read(&ser).unwrap());
    assert_eq!(a.digest, b.digest);
    assert_eq!((a.bytes, a.pages), (b.bytes, b.pages));
    assert_eq!(check_invariants(&files), 150);
    let wal_len = std::fs::metadata(super::parent::side(&db, "-wal"))
        .unwrap()
        .len();
    assert!(
        wal_len > 150 * 1500,
        "the commits are in the WAL: {wal_len}"
    );
    for s in ["-wal", "-shm", "-journal"] {
        assert!(!super::parent::side(&files, s).exists());
    }
}

/// The hazard the header check is for, made to happen: the snapshot reads on read-lock 0
/// (the WAL wholly backfilled, not yet cut), and between two chunks of its `-wal` copy the
/// parent cuts the WAL (TRUNCATE) and starts it over with new commits. The copy then holds
/// the old header and only a prefix of the old frames, older than what the database file
/// holds: replayed, it would mix states (without the check this test fails: the invariants
/// or the integrity check). The attempt is discarded and the next one copies the new WAL.
#[test]
fn a_wal_cut_under_the_copy_is_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cut.db");
    make_db(&db);
    let parent = Connection::open(&db).unwrap();
    parent
        .execute_batch("PRAGMA wal_autocheckpoint = 0; PRAGMA synchronous = OFF")
        .unwrap();
    let mut x = 11u64;
    for _ in 0..200 {
        transfer(&parent, &mut x);
    }
    let (busy, log, done): (i64, i64, i64) = parent
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert_eq!((busy, log), (0, done), "the WAL is wholly backfilled");
    let wal = super::parent::side(&db, "-wal");
    assert!(
        std::fs::metadata(&wal).unwrap().len() > 2 << 20,
        "several chunks"
    );
    let cutter = Connection::open(&db).unwrap();
    super::walcopy::AFTER_A_WAL_CHUNK.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || {
            let busy: i64 = cutter
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
                .unwrap();
            assert_eq!(busy, 0, "the WAL was cut under the copy");
            let mut y = 13u64;
            for _ in 0..10 {
                transfer(&cutter, &mut y);
            }
        }))
    });
    let dest = dir.path().join("copy.db");
    let st = snapshot(&db, &dest, &SnapshotOptions::default()).unwrap();
    assert!(
        super::walcopy::AFTER_A_WAL_CHUNK.with(|h| h.borrow().is_none()),
        "the cut was made"
    );
    assert!(st.integrity_ok);
    // The state as of the second attempt's read transaction: all 210 transfers (replaying
    // the cut prefix gives an older state, mixed with the file's later pages).
    assert_eq!(check_invariants(&dest), 210, "{st:?}");
    assert_eq!(st.method, SnapshotMethod::WalFiles, "{st:?}");
    assert_eq!(st.restarts, 1, "the first copy was discarded: {st:?}");
}

/// The database file is hashed behind its copy and only the pieces the WAL's replay may
/// rewrite are hashed again: the digest must still be the replayed copy's own, whether the
/// WAL's commits rewrote pages in place, grew the database or shrank it (VACUUM), and
/// SHA-256 (hashed whole after the replay) must name the same bytes.
#[test]
fn the_replayed_copy_is_named_by_its_own_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("g.db");
    make_db(&db);
    let parent = Connection::open(&db).unwrap();
    // About 3 MiB in the database file itself, then commits left in the WAL.
    let mut x = 5u64;
    for _ in 0..RING {
        transfer(&parent, &mut x);
    }
    parent
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE); PRAGMA wal_autocheckpoint = 0")
        .unwrap();
    let shapes: [(&str, &str); 3] = [
        (
            "in place",
            "UPDATE seq SET pad = randomblob(1500) WHERE n % 50 = 0",
        ),
        (
            "grown",
            "CREATE TABLE extra (k INTEGER PRIMARY KEY, b BLOB NOT NULL);
             WITH RECURSIVE i(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM i WHERE x < 600)
             INSERT INTO extra SELECT x, randomblob(3000) FROM i",
        ),
        (
            "shrunk",
            "DELETE FROM seq WHERE n < (SELECT max(n) FROM seq) - 300; DROP TABLE extra; VACUUM",
        ),
    ];
    let mut size = std::fs::metadata(&db).unwrap().len();
    for (i, (shape, sql)) in shapes.into_iter().enumerate() {
        // Each shape's commits alone in the WAL (below the file copy's 4 MiB bound).
        parent
            .execute_batch(&format!("PRAGMA wal_checkpoint(TRUNCATE); {sql}"))
            .unwrap();
        for _ in 0..40 {
            transfer(&parent, &mut x);
        }
        let dest = dir.path().join(format!("c{i}.db"));
        let st = snapshot(&db, &dest, &SnapshotOptions::default()).unwrap();
        assert_eq!(st.method, SnapshotMethod::WalFiles, "{shape}: {st:?}");
        let again = st.pieces_hashed_again.expect("hashed behind the copy");
        let pieces = st.bytes.div_ceil(super::pieces::PIECE) as usize;
        assert!(again > 0, "{shape}: the replay rewrote pages");
        assert_eq!(
            st.digest,
            StateDigest::Blake3.of_path(&dest).unwrap(),
            "{shape}"
        );
        match shape {
            "in place" => assert!(again < pieces / 2, "{shape}: {again} of {pieces}"),
            "grown" => assert!(st.bytes > size, "{shape}: {} <= {size}", st.bytes),
            _ => assert!(st.bytes < size / 2, "{shape}: {} of {size}", st.bytes),
        }
        size = st.bytes;
        let sha = dir.path().join(format!("s{i}.db"));
        let opts = SnapshotOptions {
            digest: StateDigest::Sha256,
            ..SnapshotOptions::default()
        };
        let b = snapshot(&db, &sha, &opts).unwrap();
        assert_eq!(b.pieces_hashed_again, None);
        assert_eq!(std::fs::read(&dest).unwrap(), std::fs::read(&sha).unwrap());
        assert_eq!(b.digest, StateDigest::Sha256.of_path(&dest).unwrap());
        check_invariants(&dest);
    }
}

/// The thread behind the copy hashes while the replay runs, and the replay may cut the
/// copy (the parent's file was longer than its state: here the WAL's commits include a
/// `VACUUM`). Held until the replay has cut it, that thread reads past the new end: the
/// snapshot still succeeds and is named by the copy's own bytes. (With reads that must
/// fill the block, as before the replay overlapped the hash, it failed with an early end
/// of file.)
#[test]
fn a_copy_cut_by_the_replay_under_the_hasher_is_named_by_its_own_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v.db");
    make_db(&db);
    let parent = Connection::open(&db).unwrap();
    let mut x = 9u64;
    for _ in 0..RING {
        transfer(&parent, &mut x);
    }
    parent
        .execute_batch(
            "PRAGMA wal_checkpoint(TRUNCATE); PRAGMA wal_autocheckpoint = 0;
             DELETE FROM seq WHERE n < (SELECT max(n) FROM seq) - 200; VACUUM",
        )
        .unwrap();
    for _ in 0..20 {
        transfer(&parent, &mut x);
    }
    let file = std::fs::metadata(&db).unwrap().len();
    let gate = std::sync::Arc::new(super::pieces::tests::Gate::default());
    super::pieces::tests::BEHIND_GATE.with(|g| *g.borrow_mut() = Some(gate.clone()));
    let dest = dir.path().join("c.db");
    let st = snapshot(&db, &dest, &SnapshotOptions::default()).unwrap();
    super::pieces::tests::BEHIND_GATE.with(|g| *g.borrow_mut() = None);
    assert_eq!(st.method, SnapshotMethod::WalFiles, "{st:?}");
    assert!(
        !gate.timed_out.load(std::sync::atomic::Ordering::Relaxed),
        "the gate was opened by the replay, not by its timeout"
    );
    assert!(
        gate.short_reads.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "the thread behind read past the cut"
    );
    assert!(
        st.bytes < file / 2,
        "the replay cut the copy: {} of {file} bytes",
        st.bytes
    );
    assert!(st.pieces_hashed_again.is_some(), "hashed behind the copy");
    assert_eq!(st.digest, StateDigest::Blake3.of_path(&dest).unwrap());
    check_invariants(&dest);
}

/// At SQLite's smallest and largest page sizes (512 B: 32 pages to a piece; 64 KiB: 4
/// pieces to a page) the replayed copy is still named by its own bytes, holds what the
/// parent committed, and only pieces the frames name are hashed again.
#[test]
fn the_replayed_copy_is_named_by_its_own_bytes_at_every_page_size_bound() {
    for page in [512u32, 65536] {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("p.db");
        let parent = Connection::open(&db).unwrap();
        parent
            .execute_batch(&format!(
                "PRAGMA page_size = {page}; PRAGMA journal_mode = WAL;
                 CREATE TABLE t (k INTEGER PRIMARY KEY, b BLOB NOT NULL);
                 WITH RECURSIVE i(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM i WHERE x < 3000)
                 INSERT INTO t SELECT x, randomblob(700) FROM i;
                 PRAGMA wal_checkpoint(TRUNCATE); PRAGMA wal_autocheckpoint = 0;"
            ))
            .unwrap();
        let got: u32 = parent
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .unwrap();
        assert_eq!(got, page);
        // Commits left in the WAL: three rows rewritten at a time here and there (a few
        // frames each, so that even at 64 KiB the WAL stays below the copy's bound).
        for round in 0..20 {
            parent
                .execute(
                    "UPDATE t SET b = randomblob(701 + ?2) WHERE k BETWEEN ?1 AND ?1 + 2",
                    [round * 150 + 1, round],
                )
                .unwrap();
        }
        let want: (i64, i64) = parent
            .query_row("SELECT count(*), sum(length(b)) FROM t", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        let wal = std::fs::metadata(dir.path().join("p.db-wal"))
            .unwrap()
            .len();
        assert!(wal > 0, "{page}: commits left in the WAL");
        let dest = dir.path().join("c.db");
        let st = snapshot(&db, &dest, &SnapshotOptions::default()).unwrap();
        assert_eq!(st.method, SnapshotMethod::WalFiles, "{page}: {st:?}");
        let pieces = st.bytes.div_ceil(super::pieces::PIECE) as usize;
        let again = st.pieces_hashed_again.expect("hashed behind the copy");
        assert!(again > 0 && again < pieces, "{page}: {again} of {pieces}");
        assert_eq!(
            st.digest,
            StateDigest::Blake3.of_path(&dest).unwrap(),
            "{page}"
        );
        let c = Connection::open_with_flags(
            super::parent::file_uri(&dest, "mode=ro&immutable=1"),
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
        )
        .unwrap();
        let copied: (i64, i64) = c
            .query_row("SELECT count(*), sum(length(b)) FROM t", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!(copied, want, "{page}");
        let ok: String = c
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(ok, "ok", "{page}");
    }
}

/// The pages the replay may write, read from the copied `-wal`'s frame headers: every
/// frame (valid or not) at any page size; no `-wal` or one shorter than a header names
/// none; a header that is not a WAL header gives None (then the copy is hashed whole).
#[test]
fn frame_pages_names_every_frames_page() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("c.db");
    let wal = super::parent::side(&dest, "-wal");
    assert_eq!(super::walcopy::frame_pages(&dest).unwrap(), Some(vec![]));
    for page in [512u64, 4096, 65536] {
        let mut w = vec![0u8; 32];
        w[..4].copy_from_slice(&0x377f_0682u32.to_be_bytes());
        w[8..12].copy_from_slice(&(page as u32).to_be_bytes());
        for n in [3u32, 1, 0, 70_000] {
            let mut frame = vec![0xA5u8; 24 + page as usize];
            frame[..4].copy_from_slice(&n.to_be_bytes());
            w.extend_from_slice(&frame);
        }
        // A torn last frame: its header alone.
        w.extend_from_slice(&7u32.to_be_bytes());
        w.extend_from_slice(&[0u8; 20]);
        std::fs::write(&wal, &w).unwrap();
        let want: Vec<(u64, u64)> = [3u64, 1, 70_000, 7]
            .iter()
            .map(|n| ((n - 1) * page, n * page))
            .collect();
        assert_eq!(
            super::walcopy::frame_pages(&dest).unwrap(),
            Some(want),
            "{page}"
        );
    }
    std::fs::write(&wal, [0u8; 20]).unwrap();
    assert_eq!(super::walcopy::frame_pages(&dest).unwrap(), Some(vec![]));
    let mut bad = vec![0u8; 32 + 4120];
    bad[..4].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    std::fs::write(&wal, &bad).unwrap();
    assert_eq!(super::walcopy::frame_pages(&dest).unwrap(), None);
    bad[..4].copy_from_slice(&0x377f_0683u32.to_be_bytes());
    bad[8..12].copy_from_slice(&1000u32.to_be_bytes());
    std::fs::write(&wal, &bad).unwrap();
    assert_eq!(
        super::walcopy::frame_pages(&dest).unwrap(),
        None,
        "not a power of two"
    );
}

/// A WAL database of one piece or less (16 KiB: up to four 4 KiB pages) copied as files: its
/// BLAKE3 is not made from a chaining value, so the replayed copy is hashed in one pass.
#[test]
fn a_wal_database_of_one_piece_is_hashed_in_one_pass() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tiny.db");
    let parent = Connection::open(&db).unwrap();
    parent
        .execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0;
             CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1), (2);",
        )
        .unwrap();
    let dest = dir.path().join("copy.db");
    let st = snapshot(&db, &dest, &SnapshotOptions::default()).unwrap();
    assert_eq!(st.method, SnapshotMethod::WalFiles, "{st:?}");
    assert!(st.bytes <= super::pieces::PIECE, "{st:?}");
    assert!(st.pieces_hashed_again.is_some(), "{st:?}");
    assert_eq!(st.digest, StateDigest::Blake3.of_path(&dest).unwrap());
}
