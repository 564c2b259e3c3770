//! `fork evaluate` end to end (issue 3's proof list): every fixture patch gets its verdict
//! and exit code, the signed bundle verifies and any tampering is caught, the parent runtime
//! is never modified (even while a writer keeps writing to its database), nothing of a run
//! remains afterwards (directories, staging, mounts, cgroups, processes), a killed
//! supervisor's run is reclaimed by `fork gc` and by the next `fork evaluate`, bad input is
//! refused without a trace, a blown budget is a REJECT naming it, and `--json` prints exactly
//! the verdict document.
//!
//! Every test drives the real binary on the bundled demo runtime (or a private copy of it),
//! with a private run root ($FORK_RUN_ROOT) and a private node key ($XDG_CONFIG_HOME), so
//! tests never see each other's runs. They need root (the default policy mounts a capped
//! tmpfs and creates cgroups), as on the project's CI machine.

mod common;
#[path = "evaluate/deploy.rs"]
mod deploy;
#[path = "evaluate/state_digest.rs"]
mod state_digest;
use common::lifecycle::*;
use common::*;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A unique `sleep` argument, so the test can find its own sandboxed process.
fn unique_sleep(seconds: u32) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!(
        "{seconds}.{}{:03}",
        std::process::id() % 100_000,
        N.fetch_add(1, Ordering::SeqCst)
    )
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the evaluation `sup` runs its task (a process whose command line starts with
/// `needle`), for as long as the evaluation runs: it gets there after the snapshot, the
/// copies, the patch and its gates, which took more than 20 s under software emulation on
/// a loaded host (the Debian guest of scripts/vm-test.sh). An evaluation that ends first
/// fails at once; 600 s is the bound of a hung one, not a measure of speed.
fn wait_until_the_task_runs(sup: &mut Child, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while processes_starting(needle).is_empty() {
        if let Some(st) = sup.try_wait().unwrap() {
            panic!("the evaluation ended ({st}) before its task `{needle}` ran");
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting until the task runs"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn gate_violation(e: &Eval) -> String {
    assert_eq!(e.verdict["patch_gate"]["passed"], false, "{}", e.ctx());
    e.verdict["patch_gate"]["violations"][0]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

// ---------------------------------------------------------------------------------------
// 1. Every fixture patch gets its verdict and exit code.
// ---------------------------------------------------------------------------------------

#[test]
fn swap_compressor_is_approved_and_improves_compression() {
    need_default_policy!();
    let env = Env::new("ev-swap");
    let e = evaluate(
        &env,
        &patch("swap-compressor"),
        &demo(),
        "tests",
        &["--task", "tests"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert_eq!(e.verdict["task"], "tests");
    assert!(e.verdict["tests"]["passed"].as_u64().unwrap() > 0);
    assert_eq!(e.verdict["tests"]["failed"], 0);
    assert!(e.artifact("tests.xml").is_file());
    assert_eq!(e.sandboxes.len(), 1, "one side: {:?}", e.sandboxes);

    // The compress task runs a baseline too: two sandboxes, both gone (checked by evaluate).
    let e = evaluate(
        &env,
        &patch("swap-compressor"),
        &demo(),
        "compress",
        &["--task", "compress"],
    );
    // Timing metrics the pairs could not decide make it NEEDS_REVISION, saying so.
    assert!(
        e.code == 0 || (e.code == 2 && e.summary().contains("inconclusive")),
        "{}",
        e.ctx()
    );
    assert_eq!(e.verdict["task"], "compress");
    // repeat = 20 in fork.toml: at most 20 pairs of a patched and a baseline sandbox.
    let pairs = e.verdict["metrics"][0]["samples"].as_u64().unwrap() as usize;
    assert!((3..=20).contains(&pairs), "{}", e.ctx());
    assert_eq!(
        e.sandboxes.len(),
        2 * pairs,
        "{pairs} x (patched + baseline): {:?}",
        e.sandboxes
    );
    let metrics = e.verdict["metrics"].as_array().expect("metrics");
    let cb = metrics
        .iter()
        .find(|m| m["name"] == "compressed_bytes")
        .unwrap_or_else(|| panic!("no compressed_bytes metric: {}", e.ctx()));
    let baseline = cb["baseline"].as_f64().expect("a baseline value");
    let patched = cb["patched"].as_f64().unwrap();
    let change = cb["change"].as_f64().unwrap();
    assert!(baseline > 0.0 && patched < baseline, "{cb}");
    assert!(change < 0.0, "compressed_bytes must shrink: {cb}");
    assert!(
        ((patched - baseline) / baseline - change).abs() < 1e-9,
        "{cb}"
    );
    // The baseline's metrics travel as their own artifact, and match the verdict.
    let bm = e.artifact_json("baseline-metrics.json");
    assert_eq!(bm["compressed_bytes"].as_f64(), Some(baseline));
    let pm = e.artifact_json("metrics.json");
    assert_eq!(pm["compressed_bytes"].as_f64(), Some(patched));
}

#[test]
fn breaks_test_needs_revision() {
    need_default_policy!();
    let env = Env::new("ev-breaks");
    let e = evaluate(
        &env,
        &patch("breaks-test"),
        &demo(),
        "breaks",
        &["--task", "tests"],
    );
    assert_eq!(e.code, 2, "{}", e.ctx());
    assert!(e.verdict["tests"]["failed"].as_u64().unwrap() >= 1);
    assert!(
        e.summary().contains("test_pick_tool_by_triggers"),
        "{}",
        e.ctx()
    );
    assert!(e.stdout.contains("NEEDS_REVISION"), "{}", e.stdout);
}

#[test]
fn does_not_apply_is_rejected_naming_file_and_hunk() {
    need_default_policy!();
    let env = Env::new("ev-noapply");
    let e = evaluate(&env, &patch("does-not-apply"), &demo(), "noapply", &[]);
    assert_eq!(e.code, 1, "{}", e.ctx());
    let s = e.summary();
    assert!(s.contains("hermes/runtime.py"), "{s}");
    assert!(s.contains("hunk 1"), "{s}");
    assert!(s.contains("does not apply"), "{s}");
    // The gates passed; it was the application that failed.
    assert_eq!(e.verdict["patch_gate"]["passed"], true);
}

#[test]
fn gates_reject_before_anything_is_cloned() {
    need_default_policy!();
    let env = Env::new("ev-gates");
    for (name, gate, names) in [
        (
            "touches-protected",
            "protected_path",
            "tests/test_compressor.py",
        ),
        ("path-traversal", "path_escape", "../escaped.txt"),
        ("reads-node-key", "forbidden_content", ".config/fork"),
        ("adds-binary", "binary", "tools/icon.bin"),
    ] {
        let e = evaluate(&env, &patch(name), &demo(), name, &[]);
        assert_eq!(e.code, 1, "{name}: {}", e.ctx());
        let v = gate_violation(&e);
        assert!(v.starts_with(&format!("{gate}:")), "{name}: {v}");
        assert!(v.contains(names), "{name}: {v}");
        assert!(e.summary().contains(gate), "{name}: {}", e.summary());
        // REJECTed at PLAN time: no sandbox was ever started.
        assert_eq!(e.verdict["isolation"]["sandbox_started"], false, "{name}");
        assert!(e.sandboxes.is_empty(), "{name}: {:?}", e.sandboxes);
        assert!(
            e.verdict["state_hash"]
                .as_str()
                .unwrap()
                .starts_with("sha256:"),
            "{name}"
        );
    }
    assert!(!repo().join("fixtures/escaped.txt").exists());
}

#[test]
fn noop_comment_is_approved() {
    need_default_policy!();
    let env = Env::new("ev-noop");
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &demo(),
        "noop",
        &["--task", "tests"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert_eq!(e.verdict["tests"]["failed"], 0);
    assert!(e.verdict["tests"]["passed"].as_u64().unwrap() > 0);
}

/// A user's runtime lives under their home, which is 0700: not searchable by the sandbox's
/// unprivileged uid. The runtime (its state, its source) and the patch under a 0700
/// directory evaluate like anywhere else: fork stages its own copies under its run root.
/// The whole judged plan runs (the judge comes from the unpatched tree), and the directory
/// keeps its mode.
#[test]
fn a_runtime_under_a_0700_directory_is_evaluated() {
    use std::os::unix::fs::PermissionsExt;
    need_root!();
    let env = Env::new("ev-private-home");
    let home = env.dir.join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    let rt = home.join("runtime");
    copy_dir(&demo(), &rt);
    let diff = home.join("swap-compressor.diff");
    std::fs::copy(patch("swap-compressor"), &diff).unwrap();
    let e = evaluate(&env, &diff, &rt, "private-home", &[]);
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert_eq!(e.verdict["verdict"], "APPROVE", "{}", e.ctx());
    let tasks: Vec<&str> = e.verdict["plan"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task"].as_str().unwrap())
        .collect();
    assert_eq!(tasks, ["contract", "bench"], "{}", e.ctx());
    let mode = std::fs::metadata(&home).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
}

/// Checks the hostile patch's escape report: it really ran (it tried the parent's db and the
/// node keys), every write and every key access failed, and nothing touched `parent_db`.
/// With `strict`, no attempt at all succeeded (`escaped` is false). Without it, the only
/// success allowed is `BEGIN IMMEDIATE` on *another* runtime's db that the read-only host
/// filesystem shows (SQLite grants it on a read-only connection; nothing can be written).
fn assert_contained(report: &Value, parent_db: &Path, strict: bool) {
    let attempts = report["attempts"].as_array().expect("attempts");
    let db = parent_db.to_string_lossy();
    for action in ["write_marker", "sqlite_begin_immediate"] {
        assert!(
            attempts
                .iter()
                .any(|a| a["action"] == action && a["target"] == *db),
            "no {action} attempt on {db}: {report}"
        );
    }
    for a in attempts {
        let is_parent = a["target"] == *db;
        let is_write = a["action"] != "sqlite_begin_immediate";
        if strict || is_parent || is_write {
            assert_eq!(a["ok"], false, "contained attempt succeeded: {a}\n{report}");
        }
    }
    assert!(
        attempts.iter().any(|a| a["action"] == "read_key"),
        "{report}"
    );
    if strict {
        assert_eq!(
            report["escaped"], false,
            "an escape attempt succeeded: {report}"
        );
        assert_eq!(report["succeeded"].as_array().map(Vec::len), Some(0));
    }
}

#[test]
fn hostile_escape_is_contained() {
    need_default_policy!();
    let env = Env::new("ev-hostile");
    // A copy of the runtime whose task tells the hostile code where the parent's live
    // state is (as a real successor could guess it), wherever this checkout lives.
    let db = env.dir.join("hermes-demo/state/hermes.db");
    let rt = env.runtime(
        "hermes-demo",
        &format!(
            "\n[tasks.hostile]\ncommand = [\"python3\", \"tests/run.py\"]\n\
             results = {{ format = \"junit\", path = \"tests.xml\" }}\n\
             env = {{ FORK_DEMO_PARENT_STATE = \"{}\" }}\n",
            db.display()
        ),
    );
    let before = std::fs::read(&db).unwrap();
    let marker = rt.join("state/ESCAPED");
    let e = evaluate(
        &env,
        &patch("hostile-escape"),
        &rt,
        "hostile",
        &["--task", "hostile"],
    );
    // It passes the gates on purpose, and the tests pass: APPROVE when contained.
    assert_eq!(e.code, 0, "{}", e.ctx());
    let report = e.artifact_json("report-escape.json");
    // Strict: the fixture targets only the parent it is evaluated against (and the key).
    assert_contained(&report, &db, true);
    assert!(!marker.exists(), "{} appeared", marker.display());
    assert_eq!(
        std::fs::read(&db).unwrap(),
        before,
        "the parent's state changed"
    );
    assert!(!demo().join("state/ESCAPED").exists());
}

// ---------------------------------------------------------------------------------------
// 2. The signature chain.
// ---------------------------------------------------------------------------------------

fn verify_code(env: &Env, bundle: &Path, trust: &[&str]) -> (i32, String) {
    let args: Vec<&str> = trust.iter().flat_map(|t| ["--trust", t]).collect();
    verify_with(env, bundle, &args)
}

/// `fork verify BUNDLE ARGS...`: its exit code and its stdout and stderr together.
fn verify_with<A: AsRef<std::ffi::OsStr>>(env: &Env, bundle: &Path, args: &[A]) -> (i32, String) {
    let mut c = env.cmd();
    c.arg("verify").arg(bundle).args(args);
    let o = c.output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// One way of altering a copy of a bundle.
type Tamper = Box<dyn FnOnce(&Path)>;

/// A copy of the bundle, altered by `f`.
fn tampered(src: &Path, name: &str, f: impl FnOnce(&Path)) -> PathBuf {
    let dst = src.with_file_name(format!("tampered-{name}"));
    copy_dir(src, &dst);
    f(&dst);
    dst
}

fn flip_byte(path: &Path, offset: usize) {
    let mut b = std::fs::read(path).unwrap();
    let i = offset.min(b.len() - 1);
    b[i] ^= 0x01;
    std::fs::write(path, b).unwrap();
}

/// Replaces one character of an envelope's `field` (sig or payload) in place, keeping it
/// valid base64: a single-byte change of the file.
fn flip_envelope_char(path: &Path, field: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let value = if field == "sig" {
        doc["signatures"][0]["sig"].as_str().unwrap().to_string()
    } else {
        doc[field].as_str().unwrap().to_string()
    };
    let start = text.find(&value).unwrap();
    let i = start + value.len() / 2;
    let mut b = text.into_bytes();
    b[i] = if b[i] == b'A' { b'B' } else { b'A' };
    std::fs::write(path, b).unwrap();
}

/// Decodes an envelope's payload, replaces one hex digit of a digest in it, re-encodes:
/// a well-formed envelope whose signed statement was altered.
fn alter_payload_digest(path: &Path) {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut doc: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let payload = b64.decode(doc["payload"].as_str().unwrap()).unwrap();
    let mut text = String::from_utf8(payload).unwrap();
    let i = text.find("sha256").expect("a digest in the statement");
    // The first hex digit after `sha256` and its separator(s).
    let j = text[i + 6..]
        .char_indices()
        .find(|(_, c)| c.is_ascii_hexdigit())
        .map(|(k, _)| i + 6 + k)
        .unwrap();
    let c = text.as_bytes()[j];
    let new = if c == b'0' { "1" } else { "0" };
    text.replace_range(j..j + 1, new);
    doc["payload"] = Value::String(b64.encode(text.as_bytes()));
    std::fs::write(path, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
}

#[test]
fn signature_chain_verifies_and_catches_tampering() {
    need_default_policy!();
    let env = Env::new("ev-sign");
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &demo(),
        "signed",
        &["--task", "tests"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    let node_pub = std::fs::read_to_string(env.node_pub()).unwrap();
    let node_pub = node_pub.trim();
    // Valid: with the local node key, with it named as a file, as a string, and via the
    // verdict.json path.
    for trust in [
        vec![],
        vec![env.node_pub().to_str().unwrap()],
        vec![node_pub],
    ] {
        let (code, msg) = verify_code(&env, &e.out, &trust);
        assert_eq!(code, 0, "{trust:?}: {msg}");
        assert!(msg.contains("valid"), "{msg}");
    }
    let (code, msg) = verify_code(&env, &e.out.join("verdict.json"), &[]);
    assert_eq!(code, 0, "{msg}");

    let v = std::fs::read(e.out.join("verdict.json")).unwrap();
    let summary_at = std::str::from_utf8(&v)
        .unwrap()
        .find("Test suite passed")
        .unwrap();
    let cases: Vec<(&str, Tamper)> = vec![
        (
            "verdict-first-byte",
            Box::new(|d| flip_byte(&d.join("verdict.json"), 0)),
        ),
        (
            "verdict-summary",
            Box::new(move |d| flip_byte(&d.join("verdict.json"), summary_at + 5)),
        ),
        (
            "verdict-middle",
            Box::new(move |d| flip_byte(&d.join("verdict.json"), v.len() / 2)),
        ),
        (
            "artifact-patch",
            Box::new(|d| flip_byte(&d.join("artifacts/patch.diff"), 100)),
        ),
        (
            "artifact-tests-xml",
            Box::new(|d| flip_byte(&d.join("artifacts/tests.xml"), 50)),
        ),
        (
            "artifact-removed",
            Box::new(|d| std::fs::remove_file(d.join("artifacts/output.log")).unwrap()),
        ),
        (
            "artifact-added",
            Box::new(|d| std::fs::write(d.join("artifacts/extra.txt"), b"smuggled").unwrap()),
        ),
        (
            "verdict-envelope-sig",
            Box::new(|d| flip_envelope_char(&d.join("verdict.dsse.json"), "sig")),
        ),
        (
            "endorsement-envelope-sig",
            Box::new(|d| flip_envelope_char(&d.join("endorsement.dsse.json"), "sig")),
        ),
        (
            "verdict-envelope-statement",
            Box::new(|d| alter_payload_digest(&d.join("verdict.dsse.json"))),
        ),
        (
            "endorsement-envelope-statement",
            Box::new(|d| alter_payload_digest(&d.join("endorsement.dsse.json"))),
        ),
    ];
    for (name, f) in cases {
        let t = tampered(&e.out, name, f);
        let (code, msg) = verify_code(&env, &t, &[]);
        assert_eq!(
            code, 1,
            "tampering `{name}` must be invalid (exit 1): {msg}"
        );
        assert!(msg.contains("invalid"), "{name}: {msg}");
    }
    // A raw byte flip anywhere in an envelope never verifies. (One that breaks the JSON
    // itself is "malformed input", exit 65, as src/verdict/verify.rs documents.)
    for f in ["verdict.dsse.json", "endorsement.dsse.json"] {
        let len = std::fs::metadata(e.out.join(f)).unwrap().len() as usize;
        for off in [0, 1, len / 3, len / 2, len - 1] {
            let t = tampered(&e.out, &format!("{f}-{off}"), |d| {
                flip_byte(&d.join(f), off)
            });
            let (code, msg) = verify_code(&env, &t, &[]);
            assert!(
                code == 1 || code == 65,
                "{f} byte {off}: exit {code}: {msg}"
            );
        }
    }
    // An untrusted node key: as a file and as a string.
    let other = env.dir.join("other.key");
    let o = env
        .cmd()
        .args(["keygen", "--out", other.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    let other_pub = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(other_pub.starts_with("ed25519:"), "{other_pub}");
    assert_ne!(other_pub, node_pub);
    let other_file = env.dir.join("other.pub");
    for trust in [other_pub.as_str(), other_file.to_str().unwrap()] {
        let (code, msg) = verify_code(&env, &e.out, &[trust]);
        assert_eq!(code, 1, "{msg}");
        assert!(msg.contains("not a trusted node key"), "{msg}");
    }
}

// ---------------------------------------------------------------------------------------
// 3. The parent is never modified, even while a writer writes.
// ---------------------------------------------------------------------------------------

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
             env = {{ FORK_DEMO_PARENT_STATE = \"{placeholder}\" }}\n"
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

// ---------------------------------------------------------------------------------------
// 5. A killed supervisor's run is reclaimed, by gc and by the next evaluate.
// ---------------------------------------------------------------------------------------

/// Starts an evaluation of a task that sleeps, waits until the sleep runs in the sandbox,
/// SIGKILLs the supervisor; returns the stale run's id and the sleep's command line.
fn kill_supervisor_mid_run(env: &Env, rt: &Path, task: &str, marker: &str) -> String {
    let before: HashSet<_> = std::fs::read_dir(&env.run_root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    let mut sup = env
        .cmd()
        .arg("evaluate")
        .arg(patch("noop-comment"))
        .arg("--runtime")
        .arg(rt)
        .args(["--task", task, "--out"])
        .arg(env.dir.join(format!("out-killed-{task}")))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until_the_task_runs(&mut sup, &format!("sleep {marker}"));
    sup.kill().unwrap(); // SIGKILL: no cleanup code runs in the supervisor.
    sup.wait().unwrap();
    let new: Vec<String> = std::fs::read_dir(&env.run_root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| !before.contains(n))
        .map(|n| n.to_string_lossy().into_owned())
        .filter_map(|n| n.strip_prefix("fork-").map(str::to_string))
        .filter(|id| !id.starts_with("eval-"))
        .collect();
    assert_eq!(new.len(), 1, "one stale sandbox run directory: {new:?}");
    let id = new[0].clone();
    // There is something to reclaim: the directory, its disk mount and its cgroups. (A
    // user's disk was mounted in the dead supervisor's own mount namespace, which went
    // with it: only root's shows here.)
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    if is_root() {
        assert!(mounts.contains(&format!("fork-{id}")), "no mount of {id}");
    }
    assert!(!cgroup_dirs(&id).is_empty(), "no cgroup of {id}");
    assert!(!env.dir.join(format!("out-killed-{task}")).exists());
    id
}

/// The evaluations' staging directories (`fork-eval-<run-id>/stage`) in a run root.
fn stage_dirs(run_root: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(run_root)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("fork-eval-"))
        .map(|e| e.path().join("stage"))
        .filter(|p| p.is_dir())
        .collect()
}

#[test]
fn killed_supervisor_is_reclaimed_by_gc_and_by_the_next_evaluate() {
    need_default_policy!();
    let env = Env::new("ev-kill");
    let (m1, m2) = (unique_sleep(30), unique_sleep(31));
    let rt = env.runtime(
        "hermes-demo",
        &format!(
            "\n[tasks.slow1]\ncommand = [\"sleep\", \"{m1}\"]\n\
             \n[tasks.slow2]\ncommand = [\"sleep\", \"{m2}\"]\n"
        ),
    );

    // fork gc reclaims it.
    let id = kill_supervisor_mid_run(&env, &rt, "slow1", &m1);
    let o = env.cmd().args(["gc", "--json"]).output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let rep: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        rep["runs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == id.as_str()),
        "{rep}"
    );
    assert!(
        rep["cgroups_removed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c.as_str().unwrap().ends_with(&format!("fork-{id}"))),
        "{rep}"
    );
    assert_eq!(rep["errors"].as_array().map(Vec::len), Some(0), "{rep}");
    wait_until("the sandboxed task is gone", Duration::from_secs(5), || {
        processes_starting(&format!("sleep {m1}")).is_empty()
    });
    // gc took the evaluation's staging directory (with its state snapshot) too.
    let leaked = stage_dirs(&env.run_root);
    assert!(leaked.is_empty(), "staging left behind: {leaked:?}");
    assert_run_root_clean(&env.run_root, std::slice::from_ref(&id), &leaked);

    // The next evaluate reclaims stale runs before it starts.
    let id2 = kill_supervisor_mid_run(&env, &rt, "slow2", &m2);
    let leaked = stage_dirs(&env.run_root);
    let e = evaluate_with(
        &env,
        &patch("noop-comment"),
        &rt,
        "after-kill",
        &["--task", "contract"],
        With {
            pre: &["-v"],
            allowed_leftovers: &leaked,
            ..With::default()
        },
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    // The killed sandbox's run directory and the killed evaluation's own.
    assert!(e.stderr.contains("reclaimed 2 stale run"), "{}", e.stderr);
    wait_until("the sandboxed task is gone", Duration::from_secs(5), || {
        processes_starting(&format!("sleep {m2}")).is_empty()
    });
    assert_run_root_clean(&env.run_root, &[id2], &leaked);
}

#[test]
fn killed_supervisor_leaves_no_staging_directory() {
    need_default_policy!();
    let env = Env::new("ev-stage");
    let m = unique_sleep(32);
    let rt = env.runtime(
        "hermes-demo",
        &format!("\n[tasks.slow]\ncommand = [\"sleep\", \"{m}\"]\n"),
    );
    let id = kill_supervisor_mid_run(&env, &rt, "slow", &m);
    let o = env.cmd().args(["gc", "--json"]).output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "after",
        &["--task", "contract"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    // assert_run_root_clean (inside evaluate) already fails on the leftover; say it plainly:
    assert!(stage_dirs(&env.run_root).is_empty());
    assert_run_root_clean(&env.run_root, &[id], &[]);
}

#[test]
fn staging_copy_of_the_state_is_private() {
    use std::os::unix::fs::PermissionsExt;
    need_default_policy!();
    let env = Env::new("ev-private");
    let m = unique_sleep(33);
    let rt = env.runtime(
        "hermes-demo",
        &format!("\n[tasks.slow]\ncommand = [\"sleep\", \"{m}\"]\n"),
    );
    std::fs::set_permissions(
        rt.join("state/hermes.db"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let mut sup = env
        .cmd()
        .arg("evaluate")
        .arg(patch("noop-comment"))
        .arg("--runtime")
        .arg(&rt)
        .args(["--task", "slow", "--wall", "20s", "--out"])
        .arg(env.dir.join("out"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until_the_task_runs(&mut sup, &format!("sleep {m}"));
    let stages = stage_dirs(&env.run_root);
    let modes: Vec<(PathBuf, u32)> = stages
        .iter()
        .flat_map(|s| [s.clone(), s.join("state"), s.join("state/hermes.db")])
        .map(|p| {
            let m = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            (p, m)
        })
        .collect();
    // End the run cleanly (SIGTERM: the supervisor destroys everything), then judge.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sup.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    sup.wait().unwrap();
    assert_eq!(stages.len(), 1);
    for (p, m) in modes {
        assert_eq!(m & 0o077, 0, "{} is mode {m:o}", p.display());
    }
}

// ---------------------------------------------------------------------------------------
// 6. Bad input is refused, without a bundle and without a trace.
// ---------------------------------------------------------------------------------------

#[test]
fn bad_input_is_refused_without_a_trace() {
    need_default_policy!();
    let env = Env::new("ev-bad");
    let d = &env.dir;
    let bad_patch = d.join("malformed.diff");
    std::fs::write(&bad_patch, "this is not a diff\n").unwrap();
    let truncated = d.join("truncated.diff");
    std::fs::write(
        &truncated,
        "--- a/hermes/registry.py\n+++ b/hermes/registry.py\n@@ -1,3 +1,3 @@\n garbage\n",
    )
    .unwrap();
    let no_manifest = d.join("no-manifest-runtime");
    std::fs::create_dir_all(&no_manifest).unwrap();
    let bad_manifest = d.join("bad-manifest-runtime");
    std::fs::create_dir_all(&bad_manifest).unwrap();
    std::fs::write(bad_manifest.join("fork.toml"), "[runtime\nname = \"x\"\n").unwrap();
    let bad_policy = d.join("broken-policy.toml");
    std::fs::write(&bad_policy, "[budget]\nwal = \"1h\"\n").unwrap();
    let existing = d.join("already-there");
    std::fs::create_dir_all(&existing).unwrap();
    std::fs::write(existing.join("keep.txt"), b"mine").unwrap();

    let good = patch("noop-comment");
    let demo = demo();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let cases: Vec<(&str, Vec<String>, i32, Vec<String>)> = vec![
        (
            "missing patch",
            vec![s(&d.join("nope.diff")), "--runtime".into(), s(&demo)],
            65,
            vec!["nope.diff".into()],
        ),
        (
            "malformed patch",
            vec![s(&bad_patch), "--runtime".into(), s(&demo)],
            65,
            vec!["malformed.diff".into(), "malformed".into()],
        ),
        (
            "truncated hunk",
            vec![s(&truncated), "--runtime".into(), s(&demo)],
            65,
            vec!["truncated.diff".into()],
        ),
        (
            "missing fork.toml",
            vec![s(&good), "--runtime".into(), s(&no_manifest)],
            65,
            vec![s(&no_manifest.join("fork.toml"))],
        ),
        (
            "malformed fork.toml",
            vec![s(&good), "--runtime".into(), s(&bad_manifest)],
            65,
            vec![s(&bad_manifest.join("fork.toml"))],
        ),
        (
            "unknown task",
            vec![
                s(&good),
                "--runtime".into(),
                s(&demo),
                "--task".into(),
                "no-such-task".into(),
            ],
            65,
            vec!["no-such-task".into()],
        ),
        (
            "malformed policy",
            vec![
                s(&good),
                "--runtime".into(),
                s(&demo),
                "--policy".into(),
                s(&bad_policy),
            ],
            65,
            vec!["broken-policy.toml".into()],
        ),
        (
            "bad --wall",
            vec![
                s(&good),
                "--runtime".into(),
                s(&demo),
                "--wall".into(),
                "soon".into(),
            ],
            64,
            vec!["soon".into()],
        ),
    ];
    for (i, (what, args, code, names)) in cases.into_iter().enumerate() {
        let out = d.join(format!("out-{i}"));
        let w = Watcher::start(&env.run_root);
        let o = env
            .cmd()
            .arg("evaluate")
            .args(&args)
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        let ids = w.finish();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{what}: {err}");
        for n in names {
            assert!(
                err.contains(&n),
                "{what}: the error should name `{n}`: {err}"
            );
        }
        assert!(o.stdout.is_empty(), "{what}: no result on stdout");
        assert!(!out.exists(), "{what}: a bundle was written");
        assert!(ids.is_empty(), "{what}: a sandbox was made: {ids:?}");
        assert_run_root_clean(&env.run_root, &ids, &[]);
        assert_eq!(
            std::fs::read_dir(&env.run_root).unwrap().count(),
            0,
            "{what}: the run root is not empty"
        );
    }
    // An --out that already exists: refused, and left as it was.
    let o = env
        .cmd()
        .arg("evaluate")
        .arg(&good)
        .arg("--runtime")
        .arg(&demo)
        .arg("--out")
        .arg(&existing)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(err.contains("already-there"), "{err}");
    let entries: Vec<_> = std::fs::read_dir(&existing).unwrap().flatten().collect();
    assert_eq!(entries.len(), 1);
    assert_eq!(std::fs::read(existing.join("keep.txt")).unwrap(), b"mine");
    assert_eq!(std::fs::read_dir(&env.run_root).unwrap().count(), 0);
}

// ---------------------------------------------------------------------------------------
// 7. A blown budget is a REJECT naming it.
// ---------------------------------------------------------------------------------------

#[test]
fn blown_budget_is_a_reject_naming_it() {
    need_default_policy!();
    let env = Env::new("ev-budget");
    let m = unique_sleep(30);
    let rt = env.runtime("hermes-demo", &format!(
            "\n[tasks.slow]\ncommand = [\"sleep\", \"{m}\"]\n\
             \n[tasks.hog]\ncommand = [\"python3\", \"-c\", \"b = b'x' * (256 << 20); print(len(b))\"]\n\
             \n[tasks.quick]\ncommand = [\"true\"]\n"
        ),
    );
    // What an evaluation costs besides its run (measured here, under this machine's load):
    // the bound on the wall-stopped one below is derived from it, not a constant.
    let t = Instant::now();
    let quick = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "quick",
        &["--task", "quick"],
    );
    let fixed = t.elapsed();
    assert_eq!(quick.code, 0, "{}", quick.ctx());
    let t = Instant::now();
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "wall",
        &["--task", "slow", "--wall", "1s"],
    );
    let took = t.elapsed();
    assert_eq!(e.code, 1, "{}", e.ctx());
    assert_eq!(e.verdict["budget"]["exceeded"], "wall", "{}", e.ctx());
    assert!(e.summary().contains("wall"), "{}", e.summary());
    assert_eq!(e.verdict["budget"]["limits"]["wall_s"].as_f64(), Some(1.0));
    let used = e.verdict["budget"]["used"]["wall_s"].as_f64().unwrap();
    assert!((1.0..5.0).contains(&used), "used {used}");
    // The 1 s wall, plus the kill and teardown of the run it stopped (bounded by 2 s), past
    // an evaluation of `true`: far below the 30 s the sleep would take.
    let bound = fixed + Duration::from_secs(1) + Duration::from_secs(2);
    assert!(
        took < bound,
        "took {took:?}, more than {bound:?} ({fixed:?} for `true`)"
    );
    assert!(processes_starting(&format!("sleep {m}")).is_empty());

    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "memory",
        &["--task", "hog", "--memory", "64MiB"],
    );
    assert_eq!(e.code, 1, "{}", e.ctx());
    assert_eq!(e.verdict["budget"]["exceeded"], "memory", "{}", e.ctx());
    assert!(e.summary().contains("memory"), "{}", e.summary());
    let peak = e.verdict["budget"]["used"]["memory_peak_bytes"]
        .as_u64()
        .unwrap();
    assert!(peak <= 65 << 20, "peak {peak}");
}

// ---------------------------------------------------------------------------------------
// 8. --json prints exactly the verdict document.
// ---------------------------------------------------------------------------------------

#[test]
fn json_prints_exactly_the_verdict_document() {
    need_default_policy!();
    let env = Env::new("ev-json");
    for (name, code) in [("noop-comment", 0), ("touches-protected", 1)] {
        // The contract task: the bench's timing may be inconclusive on a loaded machine.
        let e = evaluate(
            &env,
            &patch(name),
            &demo(),
            name,
            &["--json", "--task", "contract"],
        );
        assert_eq!(e.code, code, "{}", e.ctx());
        let printed: Value = serde_json::from_str(&e.stdout)
            .unwrap_or_else(|err| panic!("stdout is not one JSON document ({err}): {}", e.stdout));
        assert_eq!(printed, e.verdict, "stdout differs from verdict.json");
        assert_eq!(printed["run_id"], e.verdict["run_id"]);
        let want = format!(
            "sha256:{}",
            sha256_hex(&std::fs::read(patch(name)).unwrap())
        );
        assert_eq!(printed["patch_hash"], want.as_str());
        assert_eq!(e.verdict["patch_hash"], want.as_str());
    }
}

/// The successor replaces its reports directory, or its whole workspace, with a symlink to a
/// host directory holding a forged all-passing tests.xml and a secret: the supervisor reads
/// the results beneath the capped disk's root without following any link, so the forgery is
/// never read (no APPROVE) and no host file travels into the bundle.
#[test]
fn results_behind_a_symlink_are_never_read() {
    need_default_policy!();
    let env = Env::new("ev-linked-reports");
    let host = env.dir.join("host-side");
    std::fs::create_dir_all(host.join("reports")).unwrap();
    let forged = "<testsuite name=\"x\" tests=\"1\"><testcase classname=\"forged\" name=\"all_good\"/></testsuite>";
    std::fs::write(host.join("tests.xml"), forged).unwrap();
    std::fs::write(host.join("reports/tests.xml"), forged).unwrap();
    std::fs::write(host.join("secret.txt"), "HOST-SECRET").unwrap();
    std::fs::write(host.join("reports/secret.txt"), "HOST-SECRET").unwrap();
    let h = host.display();
    let rt = env.runtime(
        "hermes-demo",
        &format!(
            "\n[tasks.link_reports]\ncommand = [\"sh\", \"-c\", \"rm -rf /tmp/successor/reports && ln -s {h} /tmp/successor/reports\"]\n\
             results = {{ format = \"junit\", path = \"tests.xml\" }}\n\
             \n[tasks.link_workspace]\ncommand = [\"sh\", \"-c\", \"cd / && mv /tmp/successor /tmp/moved && ln -s {h} /tmp/successor\"]\n\
             results = {{ format = \"junit\", path = \"tests.xml\" }}\n"
        ),
    );
    // Replacing the whole workspace also takes the protected tree away from where the
    // post-run check reads it: that check fails closed (REJECT).
    for (task, code) in [("link_reports", 2), ("link_workspace", 1)] {
        let e = evaluate(
            &env,
            &patch("noop-comment"),
            &rt,
            task,
            &["--task", task, "--no-ledger"],
        );
        assert_eq!(
            e.code,
            code,
            "{task}: the forged results must not be read: {}",
            e.ctx()
        );
        assert_eq!(e.verdict["tests"]["passed"], 0, "{task}: {}", e.ctx());
        let bundle = e.out.join("artifacts");
        for entry in std::fs::read_dir(&bundle).unwrap().flatten() {
            let bytes = std::fs::read(entry.path()).unwrap();
            let text = String::from_utf8_lossy(&bytes);
            assert!(
                !text.contains("HOST-SECRET") && !text.contains("forged"),
                "{task}: a host file travelled into {}",
                entry.path().display()
            );
        }
    }
    assert_eq!(
        std::fs::read_to_string(host.join("secret.txt")).unwrap(),
        "HOST-SECRET"
    );
}

/// The evaluation as a whole has a wall budget beside the per-run one: repeats that each
/// fit their own wall are stopped when together they pass the evaluation's, the verdict
/// names `evaluation_wall`, and every limit (cpu_time included) is recorded for replay.
#[test]
fn the_evaluation_wall_bounds_all_runs_together() {
    need_default_policy!();
    let env = Env::new("ev-evalwall");
    let rt = env.runtime(
        "rt",
        "\n[tasks.slow]\ncommand = [\"sh\", \"-c\", \"sleep 2\"]\nrepeat = 4\nbudget = { wall = \"30s\", evaluation_wall = \"3s\", cpu_time = \"10m\" }\n\n[tasks.quick]\ncommand = [\"true\"]\n",
    );
    // What an evaluation costs besides its runs' time (start, copy, patch, one launch,
    // verdict), measured here, in the same run, on the same machine and load: the bound
    // below is derived from it and the wall budget, not a constant that holds on one host.
    let started = Instant::now();
    let quick = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "quick",
        &["--task", "quick", "--no-ledger"],
    );
    let fixed = started.elapsed();
    assert_eq!(quick.code, 0, "{}", quick.ctx());
    let started = Instant::now();
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "slow",
        &["--task", "slow", "--no-ledger"],
    );
    let took = started.elapsed();
    assert_eq!(e.code, 1, "{}", e.ctx());
    assert_eq!(
        e.verdict["budget"]["exceeded"],
        "evaluation_wall",
        "{}",
        e.ctx()
    );
    assert!(
        e.summary().contains("evaluation"),
        "the summary names the evaluation's budget: {}",
        e.ctx()
    );
    let limits = &e.verdict["budget"]["limits"];
    assert_eq!(limits["evaluation_wall_s"], 3.0, "{}", e.ctx());
    assert_eq!(limits["wall_s"], 30.0, "{}", e.ctx());
    assert_eq!(limits["cpu_time_s"], 600.0, "{}", e.ctx());
    assert_eq!(e.verdict["header"]["schema"]["version"], "1.4");
    // Four 2 s runs would take `fixed` + 8 s; the evaluation stops at its 3 s budget. The
    // margin: one more launch (the run the wall cut short) and the kill and teardown of
    // that run (bounded by 2 s), 2 s in all; below the 5 s the uncut runs would add.
    let wall = Duration::from_secs(3);
    let margin = Duration::from_secs(2);
    assert!(
        took < fixed + wall + margin,
        "took {took:?}, more than {fixed:?} (an evaluation of `true`) + {wall:?} (the wall) + {margin:?}: {}",
        e.ctx()
    );

    // The command line raises it back (the announced way to restore the old behaviour).
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "slow-raised",
        &["--task", "slow", "--no-ledger", "--evaluation-wall", "1h"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert_eq!(e.verdict["budget"]["limits"]["evaluation_wall_s"], 3600.0);
}

/// A fork.toml task goes through the same budget checks as a policy: a task asking for a
/// single process is refused at load, naming the task and the field.
#[test]
fn task_budgets_get_the_policy_checks() {
    need_default_policy!();
    let env = Env::new("ev-taskbudget");
    let rt = env.runtime(
        "rt",
        "\n[tasks.tiny]\ncommand = [\"true\"]\nbudget = { pids = 1 }\n",
    );
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "tiny",
        &["--task", "tiny"],
    );
    assert_eq!(e.code, 65, "{}", e.ctx());
    assert!(
        e.stderr.contains("tasks.tiny.budget.pids") && e.stderr.contains("at least 2"),
        "{}",
        e.ctx()
    );
    assert!(!e.out.exists(), "nothing written: {}", e.ctx());
}

/// The hostile leftovers of `what_a_successor_leaves_never_suppresses_its_verdict`, one
/// task each. Each writes only beneath its own reports directory, workspace and /tmp (its
/// private disk), a few kilobytes in all, and ends within a second or two.
const LEFTOVER_TASKS: &str = r#"
[tasks.long_report_name]
command = ["python3", "-c", "import os; r = os.environ['FORK_REPORTS']; open(r + '/' + 'n' * 250, 'w').write('x'); open(r + '/' + 'm' * 250, 'w').write('y'); open(r + '/a b', 'w').write('1'); open(r + '/a_b', 'w').write('2')"]

[tasks.predicted_log]
command = ["python3", "-c", "import os\nfor i in range(4):\n    open('/tmp/.fork-output-%d.log' % i, 'a').close()\nopen(os.environ['FORK_REPORTS'] + '/tests.xml', 'w').write('<testsuite tests=\"1\" failures=\"1\"><testcase name=\"t\"><failure message=\"no\"/></testcase></testsuite>')"]
results = { format = "junit", path = "tests.xml" }

[tasks.deep_tree]
command = ["python3", "-c", "import os\nr = os.environ['FORK_REPORTS']\nopen(r + '/tests.xml', 'w').write('<testsuite tests=\"1\" failures=\"1\"><testcase name=\"t\"><failure message=\"no\"/></testcase></testsuite>')\nfor top in (r, os.environ['HOME']):\n    os.chdir(top)\n    for i in range(2500):\n        os.mkdir('d' * 40)\n        os.chdir('d' * 40)\n"]
results = { format = "junit", path = "tests.xml" }
"#;

/// Whatever the successor leaves, the evaluation ends in a recorded verdict whose bundle
/// verifies: report files with 250-character names (and names that sanitize alike), files
/// at the names fork once used for its output logs on the sandbox's disk, and directory
/// trees nested deeper than PATH_MAX in the reports directory and the workspace, which a
/// rerun of the failing tests must clear and hand back.
#[test]
fn what_a_successor_leaves_never_suppresses_its_verdict() {
    need_default_policy!();
    let env = Env::new("ev-leftovers");
    let rt = env.runtime("rt", LEFTOVER_TASKS);
    let tasks = ["long_report_name", "predicted_log", "deep_tree"];
    for task in tasks {
        let with = With {
            require_verdict: true,
            ..With::default()
        };
        let e = evaluate_with(
            &env,
            &patch("noop-comment"),
            &rt,
            task,
            &["--task", task],
            with,
        );
        match task {
            "long_report_name" => {
                assert_eq!(e.code, 0, "{}", e.ctx());
                let names: Vec<String> = std::fs::read_dir(e.out.join("artifacts"))
                    .unwrap()
                    .flatten()
                    .map(|x| x.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("report-") || n.contains("-report-"))
                    .collect();
                assert_eq!(names.len(), 4, "every report file kept apart: {names:?}");
                assert!(names.iter().all(|n| n.len() <= 100), "{names:?}");
            }
            _ => {
                // The failing test was rerun (reports cleared, workspace handed back).
                assert_eq!(e.code, 2, "{}", e.ctx());
                assert!(e.artifact("retry1-tests.xml").is_file(), "{}", e.ctx());
                assert!(e.artifact("retry1-output.log").is_file(), "{}", e.ctx());
            }
        }
    }
    // Each verdict is recorded in the ledger.
    let o = env.cmd().args(["history", "--json"]).output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    let rows: Value = serde_json::from_slice(&o.stdout).unwrap();
    let recorded: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["task"].as_str().unwrap())
        .collect();
    for task in tasks {
        assert!(
            recorded.contains(&task),
            "{task} not in the ledger: {recorded:?}"
        );
    }
}

/// A patch that is not a regular file is refused at once as bad input naming it (a FIFO
/// never makes `evaluate` wait for a writer); a patch far over the size gate is REJECTed
/// by it without being read whole, and the bundle keeps only a bounded prefix of it.
#[test]
fn patch_files_are_checked_before_they_are_read() {
    need_default_policy!();
    let env = Env::new("ev-patchfile");
    let fifo = env.dir.join("incoming.diff");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let started = Instant::now();
    let e = evaluate(&env, &fifo, &demo(), "fifo", &["--no-ledger"]);
    assert_eq!(e.code, 65, "{}", e.ctx());
    assert!(
        e.stderr.contains("incoming.diff") && e.stderr.contains("FIFO"),
        "{}",
        e.ctx()
    );
    assert!(started.elapsed() < Duration::from_secs(10), "{}", e.ctx());
    assert!(!e.out.exists(), "{}", e.ctx());
    // A sparse 2 GiB patch: the size gate's REJECT, quickly, with a bounded artifact.
    // The bound is derived from a 2 MiB patch over the same gate, measured here under this
    // host's load (a fixed 20 s failed under software emulation): four times that plus
    // 10 s, where reading and hashing 2 GiB whole takes far longer on any host.
    let over = env.dir.join("over.diff");
    std::fs::File::create(&over)
        .unwrap()
        .set_len(2 << 20)
        .unwrap();
    let started = Instant::now();
    let e = evaluate(&env, &over, &demo(), "over", &["--no-ledger"]);
    let small = started.elapsed();
    assert_eq!(e.code, 1, "{}", e.ctx());
    let big = env.dir.join("huge.diff");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    let started = Instant::now();
    let e = evaluate(&env, &big, &demo(), "huge", &["--no-ledger"]);
    assert_eq!(e.code, 1, "{}", e.ctx());
    let bound = small * 4 + Duration::from_secs(10);
    let took = started.elapsed();
    assert!(
        took < bound,
        "took {took:?}, more than {bound:?} ({small:?} for 2 MiB): {}",
        e.ctx()
    );
    let v = gate_violation(&e);
    assert!(
        v.starts_with("size:") && v.contains("2147483648 bytes"),
        "{v}: {}",
        e.ctx()
    );
    let kept = std::fs::metadata(e.artifact("patch.diff")).unwrap().len();
    assert!(
        kept <= (1 << 20) + 1,
        "the bundle keeps {kept} bytes of the patch"
    );

    // `reverify --patch` and `consensus --patch` refuse the FIFO alike, at once.
    let (rt, trust) = (demo(), env.node_pub());
    let commands: [Vec<&OsStr>; 2] = [
        vec![
            "reverify".as_ref(),
            e.out.as_os_str(),
            "--runtime".as_ref(),
            rt.as_os_str(),
            "--patch".as_ref(),
        ],
        vec![
            "consensus".as_ref(),
            e.out.as_os_str(),
            "--trust".as_ref(),
            trust.as_os_str(),
            "--patch".as_ref(),
        ],
    ];
    for args in commands {
        let started = Instant::now();
        let o = env.cmd().args(&args).arg(&fifo).output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(65), "{args:?}: {stderr}");
        assert!(
            stderr.contains("incoming.diff") && stderr.contains("FIFO"),
            "{args:?}: {stderr}"
        );
        assert!(started.elapsed() < Duration::from_secs(10), "{args:?}");
    }
}

/// `FORK_TRACE=1 fork evaluate` marks the evaluation's own phases, and the marks show the
/// overlapped teardowns' guarantees: each side's sandbox is gone (its run directory
/// removed) before the next sandbox is prepared, and every teardown is joined before the
/// bundle takes its name (and nothing remains afterwards: `evaluate_with` checks the run
/// root). The task runs on both sides (`baseline = true`), so there are two sandboxes.
#[test]
fn fork_trace_marks_the_evaluation_phases_and_teardowns_end_before_the_bundle() {
    need_default_policy!();
    let env = Env::new("ev-trace");
    let rt = env.runtime(
        "rt",
        "\n[tasks.noop2]\ncommand = [\"true\"]\nbaseline = true\n",
    );
    let trace = OsStr::new("1");
    let e = evaluate_with(
        &env,
        &patch("noop-comment"),
        &rt,
        "trace",
        &["--task", "noop2", "--no-ledger"],
        With {
            vars: &[("FORK_TRACE", trace)],
            require_verdict: true,
            ..With::default()
        },
    );
    let timed = trace_marks(&e.stderr);
    let marks: Vec<&str> = timed.iter().map(|(p, _)| p.as_str()).collect();
    let want = [
        "evaluate: planned, node key loaded",
        "evaluate: gates checked, staging made",
        "evaluate: state and protected tree snapshotted",
        "evaluate: parent source hashed",
        "evaluate: patched side ready, trees hashed",
        "evaluate: tasks run",
        "evaluate: concluded",
        "evaluate: bundle synced",
        "evaluate: teardowns joined",
        "evaluate: bundle written",
        "evaluate: staging removed",
        "exit",
    ];
    assert_phases_in_order(&timed, &want, &e.ctx());
    // Every teardown succeeded where it ran (the protected copy's tmpfs is detached, not
    // emptied file by file and then found busy).
    assert!(
        !e.stderr.contains("removing") && !e.stderr.contains("WARN"),
        "a teardown warned:\n{}",
        e.ctx()
    );
    // Sandboxes one at a time: each prepared only once the one before is removed.
    let (mut prepared, mut removed) = (0, 0);
    let joined = marks
        .iter()
        .position(|p| *p == "evaluate: teardowns joined");
    for (i, m) in marks.iter().enumerate() {
        match *m {
            "sandbox: prepare" => {
                assert_eq!(
                    prepared,
                    removed,
                    "a sandbox prepared before the last one was removed:\n{}",
                    e.ctx()
                );
                prepared += 1;
            }
            "teardown: run dir removed" => {
                assert!(
                    Some(i) < joined,
                    "a teardown ended after the join:\n{}",
                    e.ctx()
                );
                removed += 1;
            }
            _ => {}
        }
    }
    assert!(
        prepared >= 2,
        "both sides ran in a sandbox of their own:\n{}",
        e.ctx()
    );
    assert_eq!(prepared, removed, "every sandbox removed:\n{}", e.ctx());
}

/// The state snapshot's integrity check runs on a thread of its own beside the sides and
/// the first sandbox, off the evaluation's critical path; a snapshot that fails it still
/// fails the evaluation (exit 65, naming the store and the parent's file to check), with no
/// verdict, whatever the task said, and nothing of the run left. The store here is a demo
/// database whose index no longer matches its table (SQLite opens and reads it; only
/// `PRAGMA integrity_check` sees the damage).
#[test]
fn a_state_snapshot_failing_its_integrity_check_fails_the_evaluation_after_the_task() {
    need_default_policy!();
    let env = Env::new("ev-corrupt-state");
    let rt = env.runtime("rt", "\n[tasks.noop3]\ncommand = [\"true\"]\n");
    let db = rt.join("state/hermes.db");
    {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch(
            "CREATE INDEX m_role ON messages(role);
             PRAGMA writable_schema = ON;
             UPDATE sqlite_schema SET sql = 'CREATE INDEX m_role ON messages(content)'
               WHERE name = 'm_role';
             PRAGMA writable_schema = OFF;",
        )
        .unwrap();
    }
    let e = evaluate_with(
        &env,
        &patch("noop-comment"),
        &rt,
        "corrupt",
        &["--task", "noop3", "--no-ledger"],
        With {
            vars: &[("FORK_TRACE", OsStr::new("1"))],
            ..With::default()
        },
    );
    assert_eq!(e.code, 65, "{}", e.ctx());
    assert!(
        e.stderr.contains("snapshotting state/hermes.db")
            && e.stderr.contains("failed its integrity check")
            && e.stderr.contains(&format!("sqlite3 {}", db.display())),
        "the error names the store and the parent's file: {}",
        e.ctx()
    );
    assert!(!e.out.exists(), "no bundle: {}", e.ctx());
    // The check was answered after the task ran (it did not hold the sandbox back).
    let timed = trace_marks(&e.stderr);
    assert_phases_in_order(
        &timed,
        &[
            "evaluate: state and protected tree snapshotted",
            "sandbox: clone returned",
            "evaluate: tasks run",
            "evaluate: state snapshot checked",
            "evaluate: staging removed",
        ],
        &e.ctx(),
    );
    // The parent's database is as the test left it.
    let c = rusqlite::Connection::open(&db).unwrap();
    let n: i64 = c
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name = 'm_role'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 1);
}
