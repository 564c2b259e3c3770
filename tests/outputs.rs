//! The paths `fork evaluate` and `fork run` write, end to end with the real binary: an
//! output inside the runtime's source tree is refused unless `exclude` leaves it out (the
//! default `./fork-out` of an evaluation run in the runtime included); a report that can
//! never be written is refused before any work (a file whose directory is not writable, an
//! `--out` with `..`, `fork run --report` in a missing directory); a FIFO nobody reads
//! fails its report at once instead of hanging; an `--out` something else makes during the
//! evaluation is the usage error of an existing `--out`, saying the verdict; a `fork run`
//! report that fails after the command still says how the command ended.

mod common;
use common::lifecycle::*;
use common::*;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A runtime whose source is its own root (`source = "."`), with `runtime_extra` added to
/// its [runtime] table and one task running `task` (a shell command).
fn mini(env: &Env, runtime_extra: &str, task: &str) -> PathBuf {
    let rt = env.dir.join("mini");
    std::fs::create_dir_all(&rt).unwrap();
    std::fs::write(
        rt.join("fork.toml"),
        format!(
            "[runtime]\nname = \"mini\"\nsource = \".\"\nprotected = [\"fork.toml\"]\n{runtime_extra}\n\n\
             [tasks.t]\ncommand = [\"sh\", \"-c\", {task:?}]\n"
        ),
    )
    .unwrap();
    std::fs::write(rt.join("a.txt"), "a\n").unwrap();
    rt
}

/// A patch adding `b.txt`.
fn mini_patch(env: &Env) -> PathBuf {
    let p = env.dir.join("mini.diff");
    std::fs::write(
        &p,
        "diff --git a/b.txt b/b.txt\nnew file mode 100644\n--- /dev/null\n+++ b/b.txt\n@@ -0,0 +1 @@\n+b\n",
    )
    .unwrap();
    p
}

/// `fork evaluate PATCH --runtime RT --policy human-patches [args]` as `env`'s node.
fn evaluate_cmd(env: &Env, patch: &Path, rt: &Path, args: &[&str]) -> Command {
    let mut c = env.cmd();
    c.arg("evaluate")
        .arg(patch)
        .arg("--runtime")
        .arg(rt)
        .arg("--policy")
        .arg(human_policy())
        .args(args);
    c
}

/// Runs `c` to its end, killing it (and failing) after `limit`.
fn output_within(mut c: Command, limit: Duration) -> Output {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fork");
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let ro = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = so.read_to_end(&mut b);
        b
    });
    let re = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = se.read_to_end(&mut b);
        b
    });
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let err = String::from_utf8_lossy(&re.join().unwrap()).into_owned();
            panic!("fork still ran after {limit:?} (killed); stderr:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: ro.join().unwrap(),
        stderr: re.join().unwrap(),
    }
}

const LIMIT: Duration = Duration::from_secs(120);

/// Evaluated from inside a runtime whose source is `.`, the default `--out`
/// (`./fork-out/<run-id>`) lies in the tree every later evaluation copies and hashes: it is
/// refused before anything runs, naming the tree and the fix. With `exclude = ["fork-out"]`
/// the evaluation runs, its bundle verifies against the tree (`--tree .`), and a second
/// evaluation of the same patch is answered from the cache. Before: the bundle landed in
/// the tree, every later evaluation hashed it (no cache hit ever) and `fork verify --tree
/// .` was invalid.
#[test]
fn outputs_in_the_source_tree_are_refused_unless_excluded() {
    need_root!();
    let env = Env::new("out-tree");
    let patch = mini_patch(&env);
    let rt = mini(&env, "", "true");
    let w = Watcher::start(&env.run_root);
    let mut c = evaluate_cmd(&env, &patch, Path::new("."), &["--junit", "j.xml"]);
    c.current_dir(&rt);
    let o = output_within(c, LIMIT);
    assert!(w.finish().is_empty(), "nothing ran: {}", text(&o));
    assert_eq!(o.status.code(), Some(64), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let tree = std::fs::canonicalize(&rt).unwrap();
    for want in [
        "--out fork-out/",
        "--junit j.xml",
        &tree.display().to_string(),
        r#"exclude = ["fork-out", "j.xml"]"#,
        "outside the tree",
    ] {
        assert!(err.contains(want), "missing {want:?}: {}", text(&o));
    }
    assert!(!rt.join("fork-out").exists(), "{}", text(&o));
    assert!(!rt.join("j.xml").exists(), "{}", text(&o));

    // Excluded: it runs, and the next evaluation of the same patch hits the cache.
    let rt = mini(&env, r#"exclude = ["fork-out"]"#, "true");
    let run = |name: &str| {
        let mut c = evaluate_cmd(&env, &patch, Path::new("."), &[]);
        c.current_dir(&rt);
        let o = output_within(c, LIMIT);
        assert_eq!(o.status.code(), Some(0), "{name}: {}", text(&o));
        o
    };
    let first = run("first");
    let bundles: Vec<PathBuf> = std::fs::read_dir(rt.join("fork-out"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(bundles.len(), 1, "{}", text(&first));
    let v = env
        .cmd()
        .arg("verify")
        .arg(&bundles[0])
        .arg("--patch")
        .arg(&patch)
        .args(["--tree", "."])
        .current_dir(&rt)
        .output()
        .unwrap();
    assert_eq!(v.status.code(), Some(0), "verify --tree .: {}", text(&v));
    let second = run("second");
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("reusing the verdict"),
        "the second evaluation is served from the cache: {}",
        text(&second)
    );
}

/// Ways into the tree a plain prefix test missed, each refused before anything runs (64):
/// a `--junit` that is a dangling link into the tree (writing through it creates its
/// target there), a `--ledger` through `missing/..` (the ledger's directories are made
/// first, so it lands in the tree), and any output in the runtime's tools directory (copied
/// into every successor and hashed into the cache's conditions; nothing excludes in it).
#[test]
fn outputs_reaching_the_tree_through_links_dot_dot_or_the_tools_are_refused() {
    need_root!();
    let env = Env::new("out-ways");
    let patch = mini_patch(&env);
    let rt = mini(&env, r#"tools = "tools""#, "true");
    std::fs::create_dir_all(rt.join("tools")).unwrap();
    let ci = env.dir.join("ci");
    std::fs::create_dir_all(&ci).unwrap();
    std::os::unix::fs::symlink(rt.join("junit.xml"), ci.join("j.xml")).unwrap();
    let out = env.out("o");
    let ledger = rt.join("nonexist/../l.db");
    let tools_out = rt.join("tools/o");
    for (args, names) in [
        (
            vec![
                "--no-ledger",
                "--out",
                out.to_str().unwrap(),
                "--junit",
                ci.join("j.xml").to_str().unwrap().to_string().leak(),
            ],
            "--junit",
        ),
        (
            vec![
                "--ledger",
                ledger.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ],
            "the ledger",
        ),
        (
            vec!["--no-ledger", "--out", tools_out.to_str().unwrap()],
            "tools directory",
        ),
    ] {
        let w = Watcher::start(&env.run_root);
        let o = output_within(evaluate_cmd(&env, &patch, &rt, &args), LIMIT);
        assert!(w.finish().is_empty(), "nothing ran: {}", text(&o));
        assert_eq!(o.status.code(), Some(64), "{args:?}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(names),
            "{args:?}: {}",
            text(&o)
        );
    }
    for left in ["junit.xml", "l.db", "nonexist", "tools/o"] {
        assert!(
            !rt.join(left).exists(),
            "{left} was written into the runtime"
        );
    }
}

/// A `--junit` FIFO (or `$GITHUB_STEP_SUMMARY` naming one) that nothing reads: the report
/// fails at once once the verdict is out (exit 73, the verdict printed), instead of
/// `evaluate` waiting for a reader forever.
#[test]
fn a_report_fifo_nobody_reads_fails_at_once() {
    need_root!();
    let env = Env::new("out-fifo");
    let patch = mini_patch(&env);
    let rt = mini(&env, "", "true");
    let fifo = env.dir.join("jf");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    for (i, step_summary) in [false, true].into_iter().enumerate() {
        let out = env.out(&format!("fifo{i}"));
        let mut args = vec!["--no-ledger", "--out", out.to_str().unwrap()];
        if !step_summary {
            args.extend(["--junit", fifo.to_str().unwrap()]);
        }
        let mut c = evaluate_cmd(&env, &patch, &rt, &args);
        if step_summary {
            c.env("GITHUB_STEP_SUMMARY", &fifo);
        }
        let o = output_within(c, LIMIT);
        assert_eq!(o.status.code(), Some(73), "{}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).starts_with("APPROVE"),
            "{}",
            text(&o)
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(fifo.to_str().unwrap()) && err.contains("no reader"),
            "{}",
            text(&o)
        );
        assert!(out.join("verdict.json").is_file(), "{}", text(&o));
    }
}

/// `chattr +i` on a directory for as long as it lives.
struct Immutable(PathBuf);

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

/// An existing report in a directory fork may not write: the report is replaced by a
/// temporary file written beside it, so the evaluation is refused before any work (64,
/// naming the directory), not run for nothing and then failed with the stale file left
/// for CI (before: the whole evaluation, then 73).
#[test]
fn an_existing_report_in_an_unwritable_directory_is_refused_before_any_work() {
    need_root!();
    let env = Env::new("out-imm");
    let patch = mini_patch(&env);
    let rt = mini(&env, "", "true");
    let dir = env.dir.join("imm");
    std::fs::create_dir(&dir).unwrap();
    let junit = dir.join("j.xml");
    std::fs::write(&junit, "old").unwrap();
    // Root writes a 0555 directory anyway: an immutable one it may not.
    let made = Command::new("chattr").arg("+i").arg(&dir).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("fork-test-skip: chattr +i is not available here");
        return;
    }
    let _imm = Immutable(dir.clone());
    for flag in ["--junit", "--summary"] {
        let out = env.out(flag.trim_start_matches('-'));
        let w = Watcher::start(&env.run_root);
        let args = [
            "--no-ledger",
            "--out",
            out.to_str().unwrap(),
            flag,
            junit.to_str().unwrap(),
        ];
        let o = output_within(evaluate_cmd(&env, &patch, &rt, &args), LIMIT);
        assert!(w.finish().is_empty(), "nothing ran: {}", text(&o));
        assert_eq!(o.status.code(), Some(64), "{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(flag) && err.contains(&format!("its directory {}", dir.display())),
            "{}",
            text(&o)
        );
        assert!(!out.exists(), "{}", text(&o));
        assert_eq!(std::fs::read_to_string(&junit).unwrap(), "old");
    }
}

/// `--out newp/..` names no directory of its own (once `newp` is made it names an existing
/// one): refused before any work, nothing made. Before: it passed both checks, the whole
/// evaluation ran, then exit 70 with `newp/` left behind.
#[test]
fn an_out_with_dot_dot_is_refused_before_any_work() {
    need_root!();
    let env = Env::new("out-dotdot");
    let patch = mini_patch(&env);
    let rt = mini(&env, "", "true");
    let newp = env.dir.join("newp");
    let w = Watcher::start(&env.run_root);
    let out = format!("{}/..", newp.display());
    let o = output_within(
        evaluate_cmd(&env, &patch, &rt, &["--no-ledger", "--out", &out]),
        LIMIT,
    );
    assert!(w.finish().is_empty(), "nothing ran: {}", text(&o));
    assert_eq!(o.status.code(), Some(64), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("`..`"),
        "{}",
        text(&o)
    );
    assert!(!newp.exists(), "{}", text(&o));
}

/// `--out` made by something else while the task runs: the bundle is never written over
/// it, and that is the usage error of an existing `--out` (64), whose message says the
/// verdict and that nothing was written or recorded. Before: exit 70, nothing printed.
#[test]
fn an_out_made_during_the_evaluation_is_a_usage_error_that_says_the_verdict() {
    need_root!();
    let env = Env::new("out-race");
    let patch = mini_patch(&env);
    let rt = mini(&env, "", "sleep 3");
    let out = env.out("race");
    let ledger = env.dir.join("ledger.db");
    let mut child = evaluate_cmd(&env, &patch, &rt, &["--out", out.to_str().unwrap()])
        .arg("--ledger")
        .arg(&ledger)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut so = child.stdout.take().unwrap();
    let ro = std::thread::spawn(move || {
        let mut b = String::new();
        let _ = so.read_to_string(&mut b);
        b
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let se = child.stderr.take().unwrap();
    let re = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut all = String::new();
        for line in std::io::BufReader::new(se).lines().map_while(Result::ok) {
            if line.contains("patched: running") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let running = rx.recv_timeout(LIMIT);
    std::fs::create_dir(&out).unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("fork still ran after {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (ro.join().unwrap(), re.join().unwrap());
    let ctx = format!(
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        status.code()
    );
    running.unwrap_or_else(|_| panic!("the task never ran: {ctx}"));
    assert_eq!(status.code(), Some(64), "{ctx}");
    for want in [
        "came to exist",
        "not written",
        "APPROVE",
        "recorded nowhere",
    ] {
        assert!(stderr.contains(want), "missing {want:?}: {ctx}");
    }
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0, "{ctx}");
    let h = env
        .cmd()
        .args(["history", "--json", "--ledger"])
        .arg(&ledger)
        .output()
        .unwrap();
    if h.status.success() {
        let rows: serde_json::Value = serde_json::from_slice(&h.stdout).unwrap();
        assert_eq!(rows, serde_json::json!([]), "no ledger row: {}", text(&h));
    }
}

/// `fork run --report` in a missing directory is refused before the command runs (64:
/// nothing ran, nothing copied back into `--workspace`); a report that fails after the
/// command (`/dev/full`) is exit 73 with the command's own status said on stderr. Before:
/// the command ran and changes were copied back, then exit 70 with its status lost.
#[test]
fn fork_run_checks_its_report_first_and_never_hides_the_status() {
    need_default_policy!();
    let run_root = scratch("out-run");
    let ws = run_root.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let o = fork_cmd(&run_root)
        .args(["run", "--workspace"])
        .arg(&ws)
        .args(["--report", "/nonexistent-dir/r.json", "--"])
        .args(["sh", "-c", "echo ran; touch made; exit 3"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64), "{}", text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("ran"),
        "{}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("/nonexistent-dir"),
        "{}",
        text(&o)
    );
    assert!(
        !ws.join("made").exists(),
        "nothing copied back: {}",
        text(&o)
    );

    let o = fork_cmd(&run_root)
        .args(["run", "--report", "/dev/full", "--"])
        .args(["sh", "-c", "echo ran; exit 3"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(73), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("ran"),
        "{}",
        text(&o)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("/dev/full") && err.contains("status 3"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&run_root);
}
