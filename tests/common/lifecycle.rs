//! The harness for tests that drive whole lifecycles (`fork evaluate`, `reverify`,
//! `consensus`, the mesh): a private world per test (run root, node key, ledger), a watcher
//! that sees the sandboxes' own run ids, and `evaluate` helpers that check afterwards that
//! nothing of the run remains and that a written bundle verifies.
#![allow(dead_code)]

use super::{assert_nothing_left, fork_cmd, repo, scratch};
use serde_json::Value;
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Returns from the test (saying why) unless it runs as root: it asserts what only root's
/// runs have (a uid of their own per run, the host's cgroups, detached mounts) or needs the
/// default policy, whose cgroup layer a user has only in a delegated cgroup. The line it
/// prints starts with `fork-test-skip:`: cargo counts the test as passed, so the VM
/// harness (`scripts/vm-test.sh`, with `--nocapture`) counts these lines as skipped, not
/// passed. (Not every test crate uses it.)
#[allow(unused_macros)]
macro_rules! need_root {
    () => {
        if !$crate::common::is_root() {
            eprintln!(
                "fork-test-skip: {}: needs root (root-only isolation or the default policy's cgroup layer)",
                module_path!()
            );
            return;
        }
    };
}
#[allow(unused_imports)]
pub(crate) use need_root;

/// Returns from the test (saying why, on a `fork-test-skip:` line as [`need_root`] does)
/// unless the default policy works here: as root, or as a user given every layer (a
/// delegated cgroup v2 subtree; the capped disk fork mounts in a namespace of its own).
/// For tests that assert nothing only root's runs have.
#[allow(unused_macros)]
macro_rules! need_default_policy {
    () => {
        if !$crate::common::default_policy_works() {
            eprintln!(
                "fork-test-skip: {}: needs root, or a user's fork with every layer of the default policy (`fork check` fails here)",
                module_path!()
            );
            return;
        }
    };
}
#[allow(unused_imports)]
pub(crate) use need_default_policy;

/// The bundled demo runtime.
pub fn demo() -> PathBuf {
    repo().join("fixtures/hermes-demo")
}

/// A fixture patch, by name.
pub fn patch(name: &str) -> PathBuf {
    repo().join("fixtures/patches").join(format!("{name}.diff"))
}

/// `fork` as a node living in `dir`: run root `dir/runs`, node key under `dir/xdg`, verdict
/// ledger under `dir/data` (so no verdict is ever reused from another test's cache), and
/// never the CI job's own step summary.
pub fn node_cmd(dir: &Path) -> Command {
    let mut c = fork_cmd(&dir.join("runs"));
    c.env("XDG_CONFIG_HOME", dir.join("xdg"));
    c.env("XDG_DATA_HOME", dir.join("data"));
    c.env_remove("GITHUB_STEP_SUMMARY");
    c
}

/// A private world for one test: a run root, a config dir (node key), a data dir (default
/// ledger), room for outputs.
pub struct Env {
    pub dir: PathBuf,
    pub run_root: PathBuf,
    pub xdg: PathBuf,
}

impl Env {
    pub fn new(name: &str) -> Env {
        let dir = scratch(name);
        let run_root = dir.join("runs");
        let xdg = dir.join("xdg");
        std::fs::create_dir_all(&run_root).unwrap();
        std::fs::create_dir_all(&xdg).unwrap();
        Env { dir, run_root, xdg }
    }

    /// `fork` with this test's run root, node key and default ledger (see [`node_cmd`]).
    pub fn cmd(&self) -> Command {
        node_cmd(&self.dir)
    }

    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn default_ledger(&self) -> PathBuf {
        self.data().join("fork/ledger.db")
    }

    pub fn node_pub(&self) -> PathBuf {
        self.xdg.join("fork/node.pub")
    }

    /// A fresh (not yet existing) path for a bundle.
    pub fn out(&self, name: &str) -> PathBuf {
        let p = self.dir.join(format!("out-{name}"));
        assert!(!p.exists());
        p
    }

    /// A private copy of the demo runtime in `dir/name` (so the test owns its database),
    /// with `extra_toml` appended to its fork.toml (extra tasks).
    pub fn runtime(&self, name: &str, extra_toml: &str) -> PathBuf {
        let rt = self.dir.join(name);
        copy_dir(&demo(), &rt);
        let _ = std::fs::remove_file(rt.join("state/ESCAPED"));
        let mut toml = std::fs::read_to_string(rt.join("fork.toml")).unwrap();
        toml.push_str(extra_toml);
        std::fs::write(rt.join("fork.toml"), toml).unwrap();
        rt
    }
}

/// A passing test leaves nothing in the target directory; a failing one keeps its files.
impl Drop for Env {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Copies the regular files and directories of `from` into `to`, recursively.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let ft = e.file_type().unwrap();
        let dest = to.join(e.file_name());
        if ft.is_dir() {
            copy_dir(&e.path(), &dest);
        } else if ft.is_file() {
            std::fs::copy(e.path(), &dest).unwrap();
        }
    }
}

/// Records every sandbox run directory (`fork-<id>`, not the evaluation's own
/// `fork-eval-<id>`) that appears in a run root while it watches (the sandboxes' own ids,
/// which the verdict does not carry): from the kernel's inotify events on the run root,
/// queued however long this thread waits for a core (a directory that lived a few
/// milliseconds while the thread was starved was missed by polling alone, under CI's
/// load), and from a listing every millisecond.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<BTreeSet<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    pub fn start(run_root: &Path) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let (s, n, root) = (stop.clone(), seen.clone(), run_root.to_path_buf());
        // Watching from here on, before the command starts.
        let mut events = inotify::Inotify::init().unwrap();
        events
            .watches()
            .add(
                run_root,
                inotify::WatchMask::CREATE | inotify::WatchMask::MOVED_TO,
            )
            .unwrap();
        let thread = std::thread::spawn(move || {
            let note = |name: &str| {
                if let Some(id) = name
                    .strip_prefix("fork-")
                    .filter(|i| !i.starts_with("eval-"))
                {
                    n.lock().unwrap().insert(id.to_string());
                }
            };
            let mut buf = [0u8; 64 << 10];
            loop {
                let done = s.load(Ordering::SeqCst);
                // Every queued event, whether or not the directory is still there.
                while let Ok(evs) = events.read_events(&mut buf) {
                    let mut any = false;
                    for ev in evs {
                        any = true;
                        if let Some(name) = ev.name {
                            note(&name.to_string_lossy());
                        }
                    }
                    if !any {
                        break;
                    }
                }
                if let Ok(rd) = std::fs::read_dir(&root) {
                    for e in rd.flatten() {
                        note(&e.file_name().to_string_lossy());
                    }
                }
                if done {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        Watcher {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    /// Stops watching; the sandbox run ids seen, sorted.
    pub fn finish(mut self) -> Vec<String> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap();
        let v = self.seen.lock().unwrap().iter().cloned().collect();
        v
    }
}

/// Nothing of any run remains in `run_root`: no run directory, no staging directory (other
/// than `allowed`, known leftovers), no mount under it, and for each sandbox id seen, no
/// cgroup and no process.
pub fn assert_run_root_clean(run_root: &Path, ids: &[String], allowed: &[PathBuf]) {
    for e in std::fs::read_dir(run_root).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if allowed.contains(&e.path()) {
            continue;
        }
        assert!(
            !name.starts_with("fork-") && !name.starts_with(".fork-stage-"),
            "{} left behind in the run root",
            e.path().display()
        );
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = run_root.to_string_lossy();
    for line in mounts.lines() {
        assert!(!line.contains(&*root), "a mount is left behind: {line}");
    }
    for id in ids {
        assert_nothing_left(run_root, id);
    }
}

/// One `fork evaluate` and what it left.
pub struct Eval {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub out: PathBuf,
    /// verdict.json, when a bundle was written (else null).
    pub verdict: Value,
    /// The sandbox run ids seen while it ran.
    pub sandboxes: Vec<String>,
}

impl Eval {
    /// The sandboxes the evaluation's first pair added beyond its two sides: 1 when it drew
    /// its baseline first (the patched side prepared where the patch was tried is removed
    /// unrun and prepared again after the baseline), replayed from the recorded order seed.
    pub fn first_pair_extra(&self) -> usize {
        let seed = self.verdict["metrics"][0]["order_seed"]
            .as_u64()
            .unwrap_or_else(|| panic!("no order_seed recorded: {}", self.ctx()));
        usize::from(fork::verdict::sequential::baseline_first(seed, 0))
    }

    pub fn summary(&self) -> &str {
        self.verdict["evaluation_summary"].as_str().unwrap_or("")
    }
    pub fn run_id(&self) -> &str {
        self.verdict["run_id"].as_str().unwrap()
    }
    pub fn caveats(&self) -> Vec<String> {
        self.verdict["caveats"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_string())
            .collect()
    }
    pub fn metric(&self, name: &str) -> &Value {
        self.verdict["metrics"]
            .as_array()
            .and_then(|m| m.iter().find(|x| x["name"] == name))
            .unwrap_or_else(|| panic!("no metric {name}: {}", self.ctx()))
    }
    pub fn artifact(&self, name: &str) -> PathBuf {
        self.out.join("artifacts").join(name)
    }
    pub fn artifact_json(&self, name: &str) -> Value {
        let p = self.artifact(name);
        let b = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        serde_json::from_slice(&b).unwrap()
    }
    pub fn ctx(&self) -> String {
        format!(
            "exit {}\nstdout:\n{}\nstderr:\n{}\nverdict: {}",
            self.code, self.stdout, self.stderr, self.verdict
        )
    }
}

/// How [`evaluate_with`] runs `fork evaluate`, and what more it demands of the outcome.
#[derive(Default)]
pub struct With<'a> {
    /// Global flags before `evaluate` (e.g. `-v`).
    pub pre: &'a [&'a str],
    /// Extra environment for the command.
    pub vars: &'a [(&'a str, &'a OsStr)],
    /// Known leftovers in the run root (e.g. a killed run's staging), not the evaluation's.
    pub allowed_leftovers: &'a [PathBuf],
    /// The evaluation must come to a verdict (exit 0-2).
    pub require_verdict: bool,
    /// Evaluate under the built-in default policy even when `args` give no `--policy`
    /// (otherwise such evaluations run under `policies/human-patches.toml`).
    pub builtin_policy: bool,
}

/// The shipped policy that accepts self-reported evidence (`[decision] self_reported =
/// "accept"`). The lifecycle tests evaluate unjudged fixture tasks, and what they check
/// (bundles, budgets, cleanup, ...) is not provenance: they run under it unless they give a
/// policy of their own or ask for the built-in one. The default's refusal of self-reported
/// evidence has tests of its own.
pub fn human_policy() -> PathBuf {
    repo().join("policies/human-patches.toml")
}

/// Runs `fork [pre] evaluate PATCH --runtime RUNTIME --out OUT [args]` (with `with.vars`),
/// then checks that nothing of the run remains and, when a verdict was written (exit 0-2),
/// that the bundle is complete, matches the exit code and verifies with the node key.
pub fn evaluate_with(
    env: &Env,
    patch: &Path,
    runtime: &Path,
    name: &str,
    args: &[&str],
    with: With,
) -> Eval {
    let out = env.out(name);
    let w = Watcher::start(&env.run_root);
    let mut c = env.cmd();
    c.args(with.pre)
        .arg("evaluate")
        .arg(patch)
        .arg("--runtime")
        .arg(runtime)
        .arg("--out")
        .arg(&out)
        .args(args);
    if !with.builtin_policy && !args.contains(&"--policy") {
        c.arg("--policy").arg(human_policy());
    }
    for (k, v) in with.vars {
        c.env(k, v);
    }
    let o = c.output().expect("spawn fork");
    let sandboxes = w.finish();
    let e = Eval {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        verdict: std::fs::read(out.join("verdict.json"))
            .ok()
            .map(|b| serde_json::from_slice(&b).unwrap())
            .unwrap_or(Value::Null),
        out,
        sandboxes,
    };
    // Nothing remains after any evaluate.
    assert_run_root_clean(&env.run_root, &e.sandboxes, with.allowed_leftovers);
    if with.require_verdict {
        assert!(matches!(e.code, 0..=2), "no verdict: {}", e.ctx());
    }
    if matches!(e.code, 0..=2) {
        for f in ["verdict.json", "verdict.dsse.json", "endorsement.dsse.json"] {
            assert!(e.out.join(f).is_file(), "{f} missing: {}", e.ctx());
        }
        assert!(e.out.join("artifacts").is_dir(), "{}", e.ctx());
        let expected = ["APPROVE", "REJECT", "NEEDS_REVISION"][e.code as usize];
        assert_eq!(e.verdict["verdict"], expected, "{}", e.ctx());
        let v = env.cmd().arg("verify").arg(&e.out).output().unwrap();
        assert_eq!(
            v.status.code(),
            Some(0),
            "the fresh bundle must verify: {}{}",
            String::from_utf8_lossy(&v.stdout),
            String::from_utf8_lossy(&v.stderr)
        );
    }
    e
}

/// [`evaluate_with`] with nothing more: any exit code is accepted.
pub fn evaluate(env: &Env, patch: &Path, runtime: &Path, name: &str, args: &[&str]) -> Eval {
    evaluate_with(env, patch, runtime, name, args, With::default())
}
