//! Host safety: what a hostile successor leaves behind never reaches the host with more
//! than it should (`fork run --workspace` copy-back). Every case only writes files the test
//! made, in its own scratch directories (and one small tmpfs it mounts and unmounts).

mod common;
use common::lifecycle::need_root;
use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every entry under `dir` (relative path, mode, size, content hash for files).
fn listing(dir: &Path) -> Vec<(PathBuf, u32, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            let rel = e.path().strip_prefix(dir).unwrap().to_path_buf();
            let content = if m.is_file() {
                std::fs::read(e.path()).unwrap()
            } else {
                Vec::new()
            };
            if m.is_dir() {
                stack.push(e.path());
            }
            out.push((rel, m.mode(), m.len(), content));
        }
    }
    out.sort();
    out
}

fn no_staging_left(ws: &Path) {
    for e in std::fs::read_dir(ws).unwrap().flatten() {
        assert!(
            !e.file_name()
                .to_string_lossy()
                .starts_with(".fork-copyback"),
            "staging directory {} left behind",
            e.path().display()
        );
    }
}

#[test]
fn copy_back_refuses_a_sparse_file_over_the_disk_budget() {
    need_root!();
    let ws = scratch("ws-sparse");
    std::fs::write(ws.join("keep.txt"), b"old").unwrap();
    let before = listing(&ws);
    let r = run(
        &[
            "--disk",
            "16MiB",
            "--memory",
            "128MiB",
            "--workspace",
            ws.to_str().unwrap(),
        ],
        &[
            "sh",
            "-c",
            "truncate -s 1G sparse.bin && echo new > keep.txt && echo x > other.txt",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains("over the 16777216-byte disk budget")
            && r.stderr.contains("nothing was copied back"),
        "{}",
        r.stderr
    );
    assert_eq!(listing(&ws), before, "the host workspace changed");
    no_staging_left(&ws);
}

#[test]
fn copy_back_drops_set_id_bits_and_gives_everything_to_the_directory_owner() {
    need_root!();
    let ws = scratch("ws-suid");
    std::os::unix::fs::chown(&ws, Some(65534), Some(65534)).unwrap();
    let r = run(
        &["--workspace", ws.to_str().unwrap()],
        &[
            "sh",
            "-c",
            "printf '\\177ELF-payload-marker' > payload && chmod 6755 payload && \
             mkdir -p d/e && chmod 3777 d && echo in > d/e/f && chmod 2640 d/e/f && \
             ln -s /etc/passwd link && mkfifo fifo",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let m = std::fs::symlink_metadata(ws.join("payload")).unwrap();
    assert!(m.is_file());
    assert_eq!(m.mode() & 0o7777, 0o755, "set-id bits came back");
    assert_eq!(
        (m.uid(), m.gid()),
        (65534, 65534),
        "not the directory owner's"
    );
    assert_eq!(
        std::fs::read(ws.join("payload")).unwrap(),
        b"\x7fELF-payload-marker"
    );
    let d = std::fs::metadata(ws.join("d")).unwrap();
    assert_eq!(
        d.mode() & 0o7777,
        0o777,
        "sticky/set-gid came back on a directory"
    );
    assert_eq!((d.uid(), d.gid()), (65534, 65534));
    let f = std::fs::metadata(ws.join("d/e/f")).unwrap();
    assert_eq!(f.mode() & 0o7777, 0o640);
    assert_eq!((f.uid(), f.gid()), (65534, 65534));
    // A link is never recreated (nor followed), a FIFO never copied: both named in a note.
    assert!(std::fs::symlink_metadata(ws.join("link")).is_err());
    assert!(std::fs::symlink_metadata(ws.join("fifo")).is_err());
    assert!(
        r.stderr
            .contains("symbolic links are not copied back: skipped link"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("skipped fifo"), "{}", r.stderr);
    no_staging_left(&ws);
}

#[test]
fn planted_git_hooks_are_not_copied_back_unless_asked() {
    need_root!();
    let ws = scratch("ws-git");
    std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    std::fs::write(ws.join(".git/config"), b"[core]\n").unwrap();
    std::fs::write(ws.join("README"), b"hi\n").unwrap();
    let plant = "printf '#!/bin/sh\\necho HOOK RAN\\n' > .git/hooks/post-checkout && \
                 chmod 755 .git/hooks/post-checkout && \
                 printf '[core]\\nfsmonitor = /tmp/x\\n' > .git/config && echo changed > README";
    let r = run(&["--workspace", ws.to_str().unwrap()], &["sh", "-c", plant]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        !ws.join(".git/hooks/post-checkout").exists(),
        "a hook came back"
    );
    assert_eq!(std::fs::read(ws.join(".git/config")).unwrap(), b"[core]\n");
    assert_eq!(std::fs::read(ws.join("README")).unwrap(), b"changed\n");
    assert!(
        r.stderr.contains("`.git` internals are not copied back"),
        "{}",
        r.stderr
    );
    // Asked for: it comes back (still owned by the directory's owner, no set-id bits).
    std::os::unix::fs::chown(&ws, Some(65534), Some(65534)).unwrap();
    let r = run(
        &["--workspace", ws.to_str().unwrap(), "--allow-git-internals"],
        &["sh", "-c", plant],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let hook = std::fs::metadata(ws.join(".git/hooks/post-checkout")).unwrap();
    assert_eq!(hook.permissions().mode() & 0o7777, 0o755);
    assert_eq!(hook.uid(), 65534);
    no_staging_left(&ws);
}

/// A small tmpfs mounted on a scratch directory, unmounted on drop.
struct SmallFs(PathBuf);

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_copy_back_that_fails_midway_leaves_the_workspace_as_it_was() {
    need_root!();
    let ws = scratch("ws-full");
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs"])
        .arg(&ws)
        .status()
        .unwrap();
    assert!(st.success(), "mounting a 1 MiB tmpfs on {}", ws.display());
    let _fs = SmallFs(ws.clone());
    std::fs::write(ws.join("keep.txt"), b"old").unwrap();
    std::fs::create_dir(ws.join("sub")).unwrap();
    std::fs::write(ws.join("sub/a"), b"a").unwrap();
    let before = listing(&ws);
    // 3 x 600 KiB: within the disk budget, over the host filesystem's 1 MiB.
    let r = run(
        &["--workspace", ws.to_str().unwrap()],
        &[
            "sh",
            "-c",
            "echo new > keep.txt && echo b > sub/a && for i in 1 2 3; do \
             head -c 614400 /dev/zero > big$i; chmod 4755 big$i; done",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains("No space left on device")
            && r.stderr.contains("nothing was copied back"),
        "{}",
        r.stderr
    );
    assert_eq!(listing(&ws), before, "the host workspace changed");
    no_staging_left(&ws);
}

// ---------------------------------------------------------------------------------------
// The parent: the snapshot creates (and removes) nothing next to its database.
// ---------------------------------------------------------------------------------------

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

const SECRET: &str = "ROOT-ONLY-SECRET-f8";

/// A root-only directory outside the runtime holding a marker secret.
fn root_only(env: &common::lifecycle::Env) -> PathBuf {
    let d = env.dir.join("rootonly");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("secret.txt"), SECRET).unwrap();
    std::fs::set_permissions(d.join("secret.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

/// Whether any file under `dir` (not following links) holds the secret.
fn holds_secret(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file()
                && String::from_utf8_lossy(&std::fs::read(e.path()).unwrap_or_default())
                    .contains(SECRET)
            {
                found.push(e.path());
            }
        }
    }
    found
}

#[test]
fn tools_swapped_for_a_link_mid_evaluation_are_never_followed() {
    need_root!();
    let env = common::lifecycle::Env::new("hs-toctou");
    let secret_dir = root_only(&env);
    // Three runs, 2 s each: the tools are copied for every run.
    let rt = env.runtime(
        "rt-toctou",
        "\n[tasks.inventory]\ncommand = [\"sh\", \"-c\", \
         \"ls -la $FORK_TOOLS > $FORK_REPORTS/inventory.txt; \
         cat $FORK_TOOLS/* >> $FORK_REPORTS/inventory.txt 2>&1; sleep 2\"]\nrepeat = 3\n",
    );
    // The runtime's owner swaps tools/ for a link once the plan has validated the manifest:
    // as soon as the first sandbox's run directory appears (during the first run; a fixed
    // delay of 1 s came before the plan's end under software emulation, where the manifest
    // check then refused the link instead), at most 120 s.
    let (tools, moved, target) = (rt.join("tools"), rt.join("tools.orig"), secret_dir.clone());
    let run_root = env.run_root.clone();
    let swapper = std::thread::spawn(move || {
        let began = std::time::Instant::now();
        let sandbox_seen = || {
            std::fs::read_dir(&run_root).is_ok_and(|rd| {
                rd.flatten().any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with("fork-") && !name.starts_with("fork-eval-")
                })
            })
        };
        while !sandbox_seen() && began.elapsed() < std::time::Duration::from_secs(120) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // One atomic exchange: `tools` is never missing in between.
        std::os::unix::fs::symlink(&target, &moved).unwrap();
        nix::fcntl::renameat2(
            nix::fcntl::AT_FDCWD,
            &moved,
            nix::fcntl::AT_FDCWD,
            &tools,
            nix::fcntl::RenameFlags::RENAME_EXCHANGE,
        )
        .unwrap();
    });
    let e = common::lifecycle::evaluate(
        &env,
        &common::lifecycle::patch("noop-comment"),
        &rt,
        "toctou",
        &["--task", "inventory", "--no-ledger"],
    );
    swapper.join().unwrap();
    // Refused as bad input naming the tools, not the manifest check (which ran before).
    assert_eq!(e.code, 65, "{}", e.ctx());
    // (The copy that meets the link first refuses it: a side's source tree, which holds
    // tools/, or a run's tools. When the swap comes before a side's copy of the source,
    // which copies the link as a link, that copy is not the tree the evaluation began
    // with, and the source check refuses it naming tools/: the sandbox's run directory,
    // the swap's signal, appears before the side's trees are copied.)
    let refused_link = (e.stderr.contains("copying the tools of the runtime")
        || e.stderr.contains("copying the source tree of the runtime"))
        && e.stderr.contains("is a symbolic link");
    let source_moved = e
        .stderr
        .contains("the runtime's source tree changed during the evaluation");
    assert!(
        (refused_link || source_moved) && e.stderr.contains("tools"),
        "{}",
        e.stderr
    );
    // The secret is nowhere but where it was: not in a bundle, the run root, the runtime.
    let found: Vec<PathBuf> = holds_secret(&env.dir)
        .into_iter()
        .filter(|p| !p.starts_with(&secret_dir))
        .collect();
    assert!(found.is_empty(), "the secret was copied to {found:?}");
}

#[test]
fn a_linked_directory_inside_the_source_is_copied_as_a_link_never_followed() {
    need_root!();
    let env = common::lifecycle::Env::new("hs-srclink");
    let secret_dir = root_only(&env);
    let rt = env.runtime(
        "rt-srclink",
        "\n[tasks.peek]\ncommand = [\"sh\", \"-c\", \
         \"ls -la hermes > $FORK_REPORTS/peek.txt; cat hermes/leak/secret.txt >> $FORK_REPORTS/peek.txt 2>&1; true\"]\n",
    );
    std::os::unix::fs::symlink(&secret_dir, rt.join("hermes/leak")).unwrap();
    let e = common::lifecycle::evaluate(
        &env,
        &common::lifecycle::patch("noop-comment"),
        &rt,
        "srclink",
        &["--task", "peek", "--no-ledger"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    let peek = std::fs::read_to_string(e.artifact("report-peek.txt")).unwrap();
    assert!(
        peek.contains("leak ->"),
        "the link was not copied as a link: {peek}"
    );
    let found: Vec<PathBuf> = holds_secret(&env.dir)
        .into_iter()
        .filter(|p| !p.starts_with(&secret_dir))
        .collect();
    assert!(found.is_empty(), "the secret was copied to {found:?}");
}

// ---------------------------------------------------------------------------------------
// Bundles and run directories stay private; the policy's secrets never reach a bundle.
// ---------------------------------------------------------------------------------------

const TOKEN: &str = "tok-s3cr3t-value-8f2c41";

#[test]
fn bundles_are_private_and_policy_secrets_are_scrubbed_from_them() {
    need_root!();
    let env = common::lifecycle::Env::new("hs-private");
    let policy = env.dir.join("secret-policy.toml");
    std::fs::write(
        &policy,
        format!("[environment]\npass = [\"LANG\"]\nset = {{ API_TOKEN = \"{TOKEN}\" }}\n"),
    )
    .unwrap();
    let rt = env.runtime(
        "rt-private",
        "\n[tasks.leak]\ncommand = [\"sh\", \"-c\", \
         \"echo token=$API_TOKEN; echo \\\"{\\\\\\\"t\\\\\\\": \\\\\\\"$API_TOKEN\\\\\\\"}\\\" > $FORK_REPORTS/leak.json; sleep 1\"]\n",
    );
    // Watch the run root while the evaluation runs: every run directory is 0700.
    let run_root = env.run_root.clone();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done2 = done.clone();
    let watcher = std::thread::spawn(move || {
        let mut seen = Vec::new();
        while !done2.load(std::sync::atomic::Ordering::SeqCst) {
            for e in std::fs::read_dir(&run_root).into_iter().flatten().flatten() {
                if let Ok(m) = std::fs::symlink_metadata(e.path()) {
                    if m.is_dir() && e.file_name().to_string_lossy().starts_with("fork-") {
                        seen.push((e.file_name(), m.mode() & 0o7777));
                    }
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        seen
    });
    let e = common::lifecycle::evaluate_with(
        &env,
        &common::lifecycle::patch("noop-comment"),
        &rt,
        "private",
        &[
            "--task",
            "leak",
            "--no-ledger",
            "--policy",
            policy.to_str().unwrap(),
        ],
        common::lifecycle::With {
            pre: &[],
            require_verdict: true,
            ..Default::default()
        },
    );
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = watcher.join().unwrap();
    assert!(!seen.is_empty(), "no run directory seen");
    for (name, mode) in &seen {
        // A sandbox's run directory is 0711 (its unprivileged uid traverses it to its own
        // mount point; nothing is listable), made 0700 and opened to 0711 a moment later
        // (the watcher may see it in between); the evaluation's own is 0700.
        let allowed: &[u32] = if name.to_string_lossy().starts_with("fork-eval-") {
            &[0o700]
        } else {
            &[0o700, 0o711]
        };
        assert!(
            allowed.contains(mode),
            "run directory {name:?} is {mode:o}, expected one of {allowed:?} (octal 700 or 711)"
        );
    }
    // The bundle: 0700 directories, 0600 files.
    let mut stack = vec![e.out.clone()];
    let mut files = 0;
    while let Some(d) = stack.pop() {
        let m = std::fs::symlink_metadata(&d).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o700, "{}", d.display());
        for f in std::fs::read_dir(&d).unwrap().flatten() {
            let m = std::fs::symlink_metadata(f.path()).unwrap();
            if m.is_dir() {
                stack.push(f.path());
            } else {
                files += 1;
                assert_eq!(m.mode() & 0o7777, 0o600, "{}", f.path().display());
                let text = String::from_utf8_lossy(&std::fs::read(f.path()).unwrap()).into_owned();
                assert!(
                    !text.contains(TOKEN),
                    "the token is in {}",
                    f.path().display()
                );
            }
        }
    }
    assert!(files > 4, "{}", e.ctx());
    // The successor did print it: it shows redacted in the output log and its report.
    let log = std::fs::read_to_string(e.artifact("output.log")).unwrap();
    assert!(log.contains("token=[redacted by fork]"), "{log}");
    let report = std::fs::read_to_string(e.artifact("report-leak.json")).unwrap();
    assert!(report.contains("[redacted by fork]"), "{report}");
}

/// A successor whose tests fail is run again in the same sandbox (`[decision] reruns`,
/// default 2), on the disk it wrote. After its first attempt it swaps fork's own
/// directories on that disk for links to host paths: `/tmp/.fork-shm` (the sandbox's
/// /dev/shm, which the root supervisor used to make and chmod 1777 by path before the
/// rerun) and, in a second task, the workspace `/tmp/successor` itself (beneath which the
/// supervisor reads the results and checks the protected tree). Fork never follows either:
/// the links are removed after the run, the host directory they point to (the test's own,
/// 0700, holding a file) keeps its mode and contents and is never read (its file's name
/// appears nowhere in the verdict), and the evaluation still ends in a verdict with
/// nothing of it left: the rerun runs on fork's own /dev/shm again (NEEDS_REVISION, the
/// tests still fail), and a workspace the successor replaced is a protected tree that
/// cannot be checked (REJECT); a link left where the workspace's `home` goes (a third task)
/// refuses the rerun, with a caveat saying why (NEEDS_REVISION).
#[test]
fn a_successor_cannot_turn_its_rerun_workspace_into_links_to_host_paths() {
    need_root!();
    let env = common::lifecycle::Env::new("hs-rerun-links");
    let victim = env.dir.join("victim");
    std::fs::create_dir_all(victim.join("src/tests")).unwrap();
    std::fs::write(victim.join("src/tests/host-file-name-leak.py"), "x = 1\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o700)).unwrap();
    let before = listing(&victim);
    let v = victim.display();
    let failing = "printf '<testsuite name=\\\"s\\\" tests=\\\"1\\\" failures=\\\"1\\\">\
                   <testcase name=\\\"t\\\"><failure>x</failure></testcase></testsuite>' \
                   > $FORK_REPORTS/tests.xml";
    let toml = format!(
        "\n[tasks.plant-shm]\ncommand = [\"sh\", \"-c\", \"if [ ! -e /tmp/.planted ]; then \
         touch /tmp/.planted; mv /tmp/.fork-shm /tmp/.old-shm && ln -s {v} /tmp/.fork-shm; fi; \
         {failing}\"]\nresults = {{ format = \"junit\", path = \"tests.xml\" }}\n\
         \n[tasks.plant-ws]\ncommand = [\"sh\", \"-c\", \"{failing}; cd /; \
         mv /tmp/successor /tmp/old-successor && ln -s {v} /tmp/successor\"]\n\
         results = {{ format = \"junit\", path = \"tests.xml\" }}\n\
         \n[tasks.plant-home]\ncommand = [\"sh\", \"-c\", \"{failing}; \
         mv /tmp/successor/home /tmp/old-home && ln -s {v} /tmp/successor/home\"]\n\
         results = {{ format = \"junit\", path = \"tests.xml\" }}\n"
    );
    let rt = env.runtime("rt", &toml);
    for (task, want) in [
        ("plant-shm", "NEEDS_REVISION"),
        ("plant-ws", "REJECT"),
        ("plant-home", "NEEDS_REVISION"),
    ] {
        let e = common::lifecycle::evaluate_with(
            &env,
            &common::lifecycle::patch("noop-comment"),
            &rt,
            task,
            &["--task", task, "--no-ledger"],
            common::lifecycle::With {
                require_verdict: true,
                ..Default::default()
            },
        );
        assert_eq!(e.verdict["verdict"], want, "{task}: {}", e.ctx());
        let m = std::fs::symlink_metadata(&victim).unwrap();
        assert_eq!(
            m.mode() & 0o7777,
            0o700,
            "{task}: the host directory's mode was changed: {}",
            e.ctx()
        );
        assert_eq!(
            listing(&victim),
            before,
            "{task}: the host directory changed: {}",
            e.ctx()
        );
        assert!(
            !e.verdict.to_string().contains("host-file-name-leak")
                && !e.stdout.contains("host-file-name-leak"),
            "{task}: the host directory was read: {}",
            e.ctx()
        );
        // A link left where the workspace's home goes refuses the rerun, said in a caveat.
        if task == "plant-home" {
            assert!(
                e.caveats()
                    .iter()
                    .any(|c| c.contains("were not rerun") && c.contains("never follows")),
                "{task}: {}",
                e.ctx()
            );
        }
    }
}

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
