//! A WAL-mode parent: the snapshot creates no file beside its database, stays consistent under
//! a live writer, and side files the parent creates later stay invisible to the sandbox.

use super::*;

/// The state directory's entries: name, inode, size, mtime. An entry gone between the
/// listing and its stat (a cycling writer's `-wal`/`-shm`, deleted as its connection
/// closes) is left out.
fn state_listing(dir: &Path) -> Vec<(String, u64, u64, i64, i64)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let m = std::fs::symlink_metadata(e.path()).ok()?;
            Some((
                e.file_name().to_string_lossy().into_owned(),
                m.ino(),
                m.len(),
                m.mtime(),
                m.mtime_nsec(),
            ))
        })
        .collect();
    v.sort();
    v
}

/// A copy of the demo runtime whose state is in WAL mode (no -wal/-shm left), with a
/// `quick` task.
fn wal_runtime(env: &common::lifecycle::Env) -> PathBuf {
    let rt = env.runtime("rt-wal", "\n[tasks.quick]\ncommand = [\"true\"]\n");
    let db = rt.join("state/hermes.db");
    let c = rusqlite::Connection::open(&db).unwrap();
    let mode: String = c
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    c.execute_batch("CREATE TABLE parent_log (n INTEGER PRIMARY KEY, at REAL)")
        .unwrap();
    drop(c);
    // The last connection closed: SQLite removed -wal and -shm.
    assert!(!rt.join("state/hermes.db-wal").exists());
    rt
}

#[test]
fn the_snapshot_of_an_idle_wal_parent_creates_nothing_beside_it() {
    need_root!();
    let env = common::lifecycle::Env::new("hs-wal-idle");
    let rt = wal_runtime(&env);
    let before = state_listing(&rt.join("state"));
    let e = common::lifecycle::evaluate(
        &env,
        &common::lifecycle::patch("noop-comment"),
        &rt,
        "idle",
        &["--task", "quick", "--no-ledger"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert_eq!(
        state_listing(&rt.join("state")),
        before,
        "the parent's state directory changed"
    );
}

/// A writer of the parent's database in another process: `mode` is `held` (one connection
/// for its whole life: -wal and -shm exist throughout) or `cycle` (a connection per commit:
/// -wal and -shm come and go). It commits one row at a time until `stop` exists, then
/// prints its commit count and its failures.
fn spawn_writer(db: &Path, stop: &Path, mode: &str) -> std::process::Child {
    let script = r#"
import os, sqlite3, sys, time
db, stop, mode = sys.argv[1], sys.argv[2], sys.argv[3]
ok = failed = 0
c = sqlite3.connect(db, timeout=5) if mode == "held" else None
t0 = time.time()
while not os.path.exists(stop) and time.time() - t0 < 60:
    conn = c or sqlite3.connect(db, timeout=5)
    try:
        conn.execute("INSERT INTO parent_log (at) VALUES (?)", (time.time(),))
        conn.commit()
        ok += 1
    except sqlite3.Error as e:
        failed += 1
        print("failure:", e, file=sys.stderr)
    if c is None:
        conn.close()
    time.sleep(0.002)
print(ok, failed)
"#;
    Command::new("python3")
        .args(["-c", script])
        .arg(db)
        .arg(stop)
        .arg(mode)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn the_snapshot_of_a_live_wal_parent_is_consistent_and_creates_nothing() {
    need_root!();
    for mode in ["held", "cycle"] {
        let env = common::lifecycle::Env::new(&format!("hs-wal-{mode}"));
        let rt = wal_runtime(&env);
        let state = rt.join("state");
        let db = state.join("hermes.db");
        let stop = env.dir.join("stop");
        let writer = spawn_writer(&db, &stop, mode);
        // Wait for its first commits (and, held, its -wal and -shm).
        let rows = |db: &Path| -> u64 {
            rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .and_then(|c| c.query_row("SELECT count(*) FROM parent_log", [], |r| r.get(0)))
                .unwrap_or(0)
        };
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_secs(20)
            && (mode == "held" && state_listing(&state).len() < 3 || rows(&db) < 5)
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let t_eval = std::time::Instant::now();
        let during = state_listing(&state);
        let e = common::lifecycle::evaluate(
            &env,
            &common::lifecycle::patch("noop-comment"),
            &rt,
            &format!("live-{mode}"),
            &["--task", "quick", "--no-ledger", "-v"],
        );
        let after_eval = state_listing(&state);
        std::fs::write(&stop, b"").unwrap();
        let out = writer.wait_with_output().unwrap();
        let report = String::from_utf8_lossy(&out.stdout);
        assert_eq!(e.code, 0, "{mode}: {}", e.ctx());
        let h = e.verdict["state_hash"].as_str().unwrap_or("");
        assert!(h.starts_with("sha256:"), "{mode}: {}", e.ctx());
        let mut it = report.split_whitespace();
        let ok: u64 = it.next().unwrap().parse().unwrap();
        let failed: u64 = it.next().unwrap().parse().unwrap();
        assert_eq!(
            failed,
            0,
            "{mode}: the parent's writer failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!(
            "{mode}: {ok} commits; the evaluation took {:?}",
            t_eval.elapsed()
        );
        assert!(ok >= 5, "{mode}: the writer hardly wrote ({ok})");
        if mode == "held" {
            // The writer's own -wal and -shm, the same files throughout (no new inode).
            let names = |l: &[(String, u64, u64, i64, i64)]| -> Vec<(String, u64)> {
                l.iter().map(|x| (x.0.clone(), x.1)).collect()
            };
            assert_eq!(names(&during).len(), 3, "{during:?}");
            assert_eq!(
                names(&after_eval),
                names(&during),
                "{mode}: the side files changed"
            );
        }
        // Every row the writer committed is there; the writer's last close removed its
        // side files: nothing of fork's remains.
        let c = rusqlite::Connection::open(&db).unwrap();
        let n: u64 = c
            .query_row("SELECT count(*) FROM parent_log", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, ok, "{mode}: rows lost or added");
        let ic: String = c
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(ic, "ok");
        drop(c);
        let names: Vec<String> = state_listing(&state).into_iter().map(|x| x.0).collect();
        assert_eq!(names, vec!["hermes.db".to_string()], "{mode}");
    }
}

// ---------------------------------------------------------------------------------------
// The parent: its state stores, present or future, are invisible in the sandbox.
// ---------------------------------------------------------------------------------------

/// A task that watches the parent's state directory for 4 s from inside the sandbox: it
/// lists it every 50 ms and takes a read lock on byte 120 (SQLite's WAL write lock) of
/// any `-shm` it can open, then reports to `$FORK_REPORTS/watch.json`.
const WATCH_TASK: &str = r#"
import fcntl, json, os, time
st = os.environ["PARENT_STATE"]
listings, locked, held = [], [], []
t0 = time.time()
while time.time() - t0 < 4:
    try:
        names = sorted(os.listdir(st))
    except OSError as e:
        names = ["<%s>" % type(e).__name__]
    if names not in listings:
        listings.append(names)
    for n in names:
        if n.endswith("-shm") and n not in locked:
            try:
                fd = os.open(os.path.join(st, n), os.O_RDONLY)
                fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 120)
                held.append(fd)
                locked.append(n)
            except OSError:
                pass
    time.sleep(0.05)
with open(os.path.join(os.environ["FORK_REPORTS"], "watch.json"), "w") as f:
    json.dump({"listings": listings, "locked": locked}, f)
"#;

#[test]
fn side_files_a_wal_parent_creates_after_the_sandbox_started_stay_invisible() {
    need_root!();
    let env = common::lifecycle::Env::new("hs-wal-hide");
    let rt = wal_runtime(&env);
    let state = rt.join("state");
    let toml = format!(
        "\n[tasks.watch]\ncommand = [\"python3\", \"-c\", '''{WATCH_TASK}''']\n\
         env = {{ PARENT_STATE = \"{}\" }}\n",
        state.display()
    );
    let mut t = std::fs::read_to_string(rt.join("fork.toml")).unwrap();
    t.push_str(&toml);
    std::fs::write(rt.join("fork.toml"), t).unwrap();
    // No -wal/-shm when the sandbox starts; the parent's writer connects 1.5 s later (its
    // -wal and -shm are new files) and commits with a short busy timeout.
    assert_eq!(state_listing(&state).len(), 1);
    let stop = env.dir.join("stop");
    let (db, stop2) = (state.join("hermes.db"), stop.clone());
    let writer = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(1500));
        spawn_writer(&db, &stop2, "held")
            .wait_with_output()
            .unwrap()
    });
    let e = common::lifecycle::evaluate(
        &env,
        &common::lifecycle::patch("noop-comment"),
        &rt,
        "watch",
        &["--task", "watch", "--no-ledger"],
    );
    std::fs::write(&stop, b"").unwrap();
    let out = writer.join().unwrap();
    let watch: serde_json::Value =
        serde_json::from_slice(&std::fs::read(e.artifact("report-watch.json")).unwrap_or_default())
            .unwrap_or(serde_json::Value::Null);
    assert!(watch["listings"].is_array(), "no watch report: {}", e.ctx());
    // The directory is empty inside the sandbox, before and after the parent connected.
    assert_eq!(
        watch["listings"],
        serde_json::json!([[]]),
        "the parent's state showed: {watch}"
    );
    assert_eq!(watch["locked"], serde_json::json!([]), "{watch}");
    let report = String::from_utf8_lossy(&out.stdout);
    let failed: u64 = report
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX);
    assert_eq!(
        failed,
        0,
        "the parent's writer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------------------------------
// The parent's tree is read beneath its root and never through a link.
// ---------------------------------------------------------------------------------------
