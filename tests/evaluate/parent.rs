//! The parent is never modified, even while a writer keeps writing to its database.

use super::*;

const WRITER: &str = r#"
import os, sqlite3, sys, time
db, ref, ready, stop = sys.argv[1:5]
parent = os.getppid()                # stops with the test, even one killed before it says stop
deadline = time.time() + 7200        # and at worst after two evaluations' default walls (3600 s
                                     # each): under emulation on a loaded host they passed 600 s
conns = [sqlite3.connect(db, timeout=20), sqlite3.connect(ref, timeout=20)]
for c in conns:
    c.execute("CREATE TABLE fork_test_writer (id INTEGER PRIMARY KEY, at REAL NOT NULL, payload TEXT NOT NULL)")
    c.commit()
n, worst = 0, 0.0
while time.time() < deadline and not os.path.exists(stop) and os.getppid() == parent:
    n += 1
    row = (n, time.time(), "row %d %s" % (n, "x" * (n % 97)))
    for c in conns:
        t = time.time()
        c.execute("INSERT INTO fork_test_writer VALUES (?, ?, ?)", row)
        c.commit()
        worst = max(worst, time.time() - t)
    if n == 1:
        open(ready, "w").write("ready")
    time.sleep(0.01)
for c in conns:
    c.close()
print(n, worst)
"#;

/// Every file under `root` (relative path -> sha256), except `skip`.
fn tree_digest(root: &Path, skip: &dyn Fn(&Path) -> bool) -> BTreeMap<String, String> {
    fn walk(
        root: &Path,
        d: &Path,
        skip: &dyn Fn(&Path) -> bool,
        out: &mut BTreeMap<String, String>,
    ) {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if skip(Path::new(&rel)) {
                continue;
            }
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                out.insert(format!("{rel}/"), "dir".into());
                walk(root, &p, skip, out);
            } else if ft.is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.insert(rel, format!("symlink {}", t.display()));
            } else {
                out.insert(rel, sha256_hex(&std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, skip, &mut out);
    out
}

fn is_db_file(rel: &Path) -> bool {
    let s = rel.to_string_lossy();
    ["", "-wal", "-shm", "-journal"]
        .iter()
        .any(|suf| s == format!("state/hermes.db{suf}"))
}

/// Per table: its schema and a digest of all its rows (in rowid order).
fn table_digests(db: &Path) -> BTreeMap<String, String> {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    let tables: Vec<(String, String)> = c
        .prepare("SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut out = BTreeMap::new();
    for (name, sql) in tables {
        let mut h = Sha256::new();
        h.update(sql.as_bytes());
        let mut st = c
            .prepare(&format!("SELECT * FROM \"{name}\" ORDER BY rowid"))
            .unwrap();
        let cols = st.column_count();
        let mut rows = st.query([]).unwrap();
        let mut n = 0u64;
        while let Some(r) = rows.next().unwrap() {
            n += 1;
            for i in 0..cols {
                h.update(format!("{:?}\x1f", r.get_ref(i).unwrap()).as_bytes());
            }
            h.update(b"\x1e");
        }
        out.insert(name, format!("{n} rows {}", hex::encode(h.finalize())));
    }
    out
}

type Row = (i64, f64, String);

fn writer_rows(db: &Path) -> Vec<Row> {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    let mut st = c
        .prepare("SELECT id, at, payload FROM fork_test_writer ORDER BY id")
        .unwrap();
    let rows = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    rows
}

/// Kills the writer if the test fails before stopping it (bounded anyway by its deadline).
struct WriterGuard(Option<Child>);
impl Drop for WriterGuard {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn parent_is_never_modified_while_a_writer_writes() {
    need_default_policy!();
    let env = Env::new("ev-parent");
    let placeholder = "@PARENT_DB@";
    let rt = env.runtime(
        "hermes-demo",
        &format!(
            "\n[tasks.hostile]\ncommand = [\"python3\", \"tests/run.py\"]\n\
             results = {{ format = \"junit\", path = \"tests.xml\" }}\n\
             env = {{ DEMO_PARENT_STATE = \"{placeholder}\" }}\n"
        ),
    );
    // The hostile patch is told where the parent's live db is (the sandbox scrubs the
    // environment, so it goes through the task's env).
    let parent_db = std::fs::canonicalize(rt.join("state/hermes.db")).unwrap();
    let toml = std::fs::read_to_string(rt.join("fork.toml"))
        .unwrap()
        .replace(placeholder, parent_db.to_str().unwrap());
    std::fs::write(rt.join("fork.toml"), toml).unwrap();

    let files_before = tree_digest(&rt, &is_db_file);
    let tables_before = table_digests(&parent_db);
    assert!(tables_before.contains_key("sessions"), "{tables_before:?}");

    // The writer: a row every 10 ms into the parent's db, and the same rows into a reference.
    let reference = env.dir.join("reference.db");
    let ready = env.dir.join("writer.ready");
    let stop = env.dir.join("writer.stop");
    let script = env.dir.join("writer.py");
    std::fs::write(&script, WRITER).unwrap();
    let mut writer = WriterGuard(Some(
        Command::new("python3")
            .arg(&script)
            .args([&parent_db, &reference, &ready, &stop])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    wait_until("the writer is writing", Duration::from_secs(10), || {
        ready.exists()
    });
    std::thread::sleep(Duration::from_millis(100));

    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let mut windows = Vec::new();
    let t0 = now();
    let swap = evaluate_with(
        &env,
        &patch("swap-compressor"),
        &rt,
        "swap",
        &[],
        With {
            pre: &["-v"],
            ..With::default()
        },
    );
    windows.push((t0, now()));
    assert_eq!(swap.code, 0, "{}", swap.ctx());
    let t0 = now();
    let hostile = evaluate(
        &env,
        &patch("hostile-escape"),
        &rt,
        "hostile",
        &["--task", "hostile"],
    );
    windows.push((t0, now()));
    assert_eq!(hostile.code, 0, "{}", hostile.ctx());
    std::thread::sleep(Duration::from_millis(100));

    std::fs::write(&stop, b"stop").unwrap();
    let child = writer.0.take().unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "writer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut it = stdout.split_whitespace();
    let written: usize = it.next().unwrap().parse().unwrap();
    let worst: f64 = it.next().unwrap().parse().unwrap();
    eprintln!("writer: {written} rows, slowest commit {worst:.3} s");

    // Both snapshots were taken (integrity-checked) while the writer wrote.
    for e in [&swap, &hostile] {
        let h = e.verdict["state_hash"].as_str().unwrap();
        assert!(
            h.len() == 71 && h.starts_with("sha256:"),
            "state_hash {h}: {}",
            e.ctx()
        );
    }
    assert!(
        swap.stderr.contains("snapshot state/hermes.db"),
        "{}",
        swap.stderr
    );

    // The parent's db holds exactly the writer's rows: none lost, none added, none changed.
    let rows = writer_rows(&parent_db);
    assert_eq!(rows.len(), written);
    assert_eq!(rows, writer_rows(&reference), "the parent's rows diverged");
    for (a, b) in &windows {
        let during = rows.iter().filter(|r| r.1 >= *a && r.1 <= *b).count();
        assert!(during >= 3, "the writer must write during each evaluation");
    }
    // Every other table is as it was.
    let mut tables_after = table_digests(&parent_db);
    assert!(tables_after.remove("fork_test_writer").is_some());
    assert_eq!(tables_after, tables_before);
    let c = rusqlite::Connection::open(&parent_db).unwrap();
    let ic: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ic, "ok");
    drop(c);

    // No file of the runtime was added, removed or changed, except the db (and journals).
    let files_after = tree_digest(&rt, &is_db_file);
    assert_eq!(files_after, files_before);
    assert!(!rt.join("state/ESCAPED").exists());

    // And the hostile patch really tried, and failed, to reach the parent's db (strict:
    // it targets only that db and the key, so any success is a real escape).
    assert_contained(
        &hostile.artifact_json("report-escape.json"),
        &parent_db,
        true,
    );
}
