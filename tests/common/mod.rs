//! Helpers shared by the integration tests: they drive the real `fork` binary.
#![allow(dead_code)]

pub mod lifecycle;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub fn fork_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fork"))
}

/// The hostile probe (examples/hostile.rs), built by `cargo test` beside the binary. It
/// runs inside the sandbox as its unprivileged uid: when the target directory is not
/// reachable by others (a checkout under a 0700 home), a copy in [`scratch_base`] is used.
pub fn hostile_bin() -> PathBuf {
    let p = fork_bin()
        .parent()
        .expect("binary dir")
        .join("examples")
        .join("hostile");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build --examples` (scripts/test.sh does)",
        p.display()
    );
    if reachable_by_others(&p) {
        return p;
    }
    static COPY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    COPY.get_or_init(|| {
        let dir = scratch("probe");
        let copy = dir.join("hostile");
        std::fs::copy(&p, &copy).expect("copy the probe where the sandbox can reach it");
        copy
    })
    .clone()
}

/// Whether every directory above `p` is searchable by others (as the sandbox's
/// unprivileged uid needs to reach it).
pub fn reachable_by_others(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.ancestors()
        .skip(1)
        .all(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
}

/// Where scratch directories go: the target directory's tmp (`CARGO_TARGET_TMPDIR`) when
/// this user can write it and the sandbox's unprivileged uid can reach it, else (a checkout
/// under a 0700 home, where plain `cargo test` puts target/)
/// `/var/tmp/fork-tests-<uid>-<hash of that path>`. The
/// tests' run roots (FORK_RUN_ROOT) live there, and fork refuses a run root it cannot
/// reach from inside the sandbox.
pub fn scratch_base() -> PathBuf {
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let writable = std::fs::create_dir_all(&target).is_ok()
        && nix::unistd::access(&target, nix::unistd::AccessFlags::W_OK).is_ok();
    if writable && reachable_by_others(&target.join("x")) {
        return target;
    }
    use sha2::Digest;
    let hash = hex::encode(sha2::Sha256::digest(target.as_os_str().as_encoded_bytes()));
    let base = PathBuf::from(format!(
        "/var/tmp/fork-tests-{}-{}",
        nix::unistd::geteuid(),
        &hash[..12]
    ));
    std::fs::create_dir_all(&base).expect("create the scratch base under /var/tmp");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    base
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A private scratch directory outside /tmp (so the sandbox sees it only read-only), under
/// [`scratch_base`].
pub fn scratch(name: &str) -> PathBuf {
    let d = scratch_base().join(format!(
        "{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether `fork run` works here under the default policy, every layer required: as root,
/// or as a user whose fork gets every layer (a delegated cgroup v2 subtree, user
/// namespaces), as `fork check` (with its trial launch) says. Asked once per test binary.
pub fn default_policy_works() -> bool {
    static WORKS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WORKS.get_or_init(|| {
        is_root()
            || Command::new(fork_bin())
                .arg("check")
                .env("FORK_RUN_ROOT", scratch("check-default"))
                .stdin(Stdio::null())
                .output()
                .is_ok_and(|o| o.status.success())
    })
}

/// The result of one `fork run`.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub report: Value,
    pub run_root: PathBuf,
}

impl Run {
    /// The probe's JSON line (the last line of stdout that parses).
    pub fn probe(&self) -> Value {
        self.stdout
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str::<Value>(l).ok())
            .unwrap_or_else(|| {
                panic!(
                    "no probe output; stdout={} stderr={}",
                    self.stdout, self.stderr
                )
            })
    }
    pub fn budget(&self) -> Option<String> {
        self.report["budget_exceeded"].as_str().map(str::to_string)
    }
}

/// A `fork` command with a private run root (so parallel tests never see each other's runs).
pub fn fork_cmd(run_root: &Path) -> Command {
    let mut c = Command::new(fork_bin());
    c.env("FORK_RUN_ROOT", run_root);
    c.stdin(Stdio::null());
    c
}

/// `fork gc --json` run by `cmd` (a `fork` command with its run roots and environment set,
/// such as [`fork_cmd`]'s or `Env::cmd`'s): its report, exit 0 asserted (with fork's stderr).
pub fn gc_report(mut cmd: Command) -> Value {
    let out = cmd.args(["gc", "--json"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("gc --json: {e}: {stderr}"))
}

/// `fork run [flags] -- cmd...` with a report; asserts nothing is left behind afterwards.
pub fn run(flags: &[&str], cmd: &[&str]) -> Run {
    let run_root = scratch("runs");
    let report = run_root.join("report.json");
    let mut c = fork_cmd(&run_root);
    c.arg("run")
        .args(flags)
        .arg("--report")
        .arg(&report)
        .arg("--")
        .args(cmd);
    let out: Output = c.output().expect("spawn fork");
    let code = out.status.code().unwrap_or(-1);
    let report_v = std::fs::read(&report)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    let r = Run {
        code,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        report: report_v,
        run_root: run_root.clone(),
    };
    if let Some(id) = r.report["run_id"].as_str() {
        assert_nothing_left(&run_root, id);
    }
    r
}

/// Runs the hostile probe in the default sandbox.
pub fn probe(flags: &[&str], args: &[&str]) -> Run {
    let h = hostile_bin();
    let mut cmd = vec![h.to_str().unwrap()];
    cmd.extend_from_slice(args);
    run(flags, &cmd)
}

/// No run directory, mount, cgroup or process of run `id` remains.
pub fn assert_nothing_left(run_root: &Path, id: &str) {
    let dir = run_root.join(format!("fork-{id}"));
    assert!(!dir.exists(), "run directory {} left behind", dir.display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&format!("fork-{id}")),
        "a mount of run {id} is left behind"
    );
    let cgroups = cgroup_dirs(id);
    assert!(cgroups.is_empty(), "cgroups left behind: {cgroups:?}");
    assert!(processes_matching(&format!("fork-{id}")).is_empty());
}

/// cgroup directories named fork-<id> anywhere under /sys/fs/cgroup (bounded walk).
pub fn cgroup_dirs(id: &str) -> Vec<PathBuf> {
    let name = format!("fork-{id}");
    let mut found = Vec::new();
    let mut stack = vec![(PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((d, depth)) = stack.pop() {
        if depth > 6 {
            continue;
        }
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                if e.file_name().to_string_lossy() == name {
                    found.push(e.path());
                }
                stack.push((e.path(), depth + 1));
            }
        }
    }
    found
}

/// Waits at most `within` for every process whose command line starts with `prefix` (a
/// sandbox's command) to be gone, as it must be once its supervisor was killed.
pub fn wait_sandbox_gone(prefix: &str, within: std::time::Duration) {
    let deadline = std::time::Instant::now() + within;
    while !processes_starting(prefix).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the sandbox outlived its supervisor"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Whether a `fork gc --json` report ([`gc_report`]) names the run `id` among those it
/// reclaimed.
pub fn gc_reclaimed(rep: &Value, id: &str) -> bool {
    rep["runs"]
        .as_array()
        .unwrap_or_else(|| panic!("no runs in the gc report: {rep}"))
        .iter()
        .any(|r| r == id)
}

/// Pids whose command line contains `needle`.
pub fn processes_matching(needle: &str) -> Vec<i32> {
    processes_where(|cmdline| cmdline.contains(needle))
}

/// Pids whose command line starts with `prefix`.
pub fn processes_starting(prefix: &str) -> Vec<i32> {
    processes_where(|cmdline| cmdline.starts_with(prefix))
}

fn processes_where(pred: impl Fn(&str) -> bool) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == std::process::id() as i32 {
            continue;
        }
        if let Ok(c) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let s = String::from_utf8_lossy(&c).replace('\0', " ");
            if pred(&s) {
                out.push(pid);
            }
        }
    }
    out
}

pub const EPERM: i64 = 1;
pub const ENOENT: i64 = 2;
pub const EACCES: i64 = 13;
pub const EROFS: i64 = 30;
pub const ENOSYS: i64 = 38;

/// The `FORK_TRACE` marks a command printed (`fork: trace <phase> +<ms>`, one a line), in
/// order: each phase with its time in ms.
#[allow(dead_code)]
pub fn trace_marks(stderr: &str) -> Vec<(String, f64)> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("fork: trace "))
        .map(|l| {
            let (phase, at) = l.rsplit_once(" +").unwrap_or_else(|| panic!("{l}"));
            let at = at.parse().unwrap_or_else(|_| panic!("{l}"));
            (phase.to_string(), at)
        })
        .collect()
}

/// Every phase of `want` is among `marks`, in this order (others may come between).
#[allow(dead_code)]
pub fn assert_phases_in_order(marks: &[(String, f64)], want: &[&str], ctx: &str) {
    let mut at = 0;
    for w in want {
        let i = marks[at..]
            .iter()
            .position(|(p, _)| p == w)
            .unwrap_or_else(|| panic!("phase {w:?} missing or out of order in:\n{ctx}"));
        at += i + 1;
    }
}

/// A verdict bundle at `dir` signed by the node key at `node_key` (through a fresh
/// ephemeral key), claiming APPROVE for the patch `patch_hash` on `plan` (its tasks and
/// their hashes), answering `proposal_id`, without any evaluation: what a dishonest node
/// would publish, or a bundle nobody pinned.
pub fn forge_bundle(
    dir: &Path,
    node_key: &Path,
    patch_hash: &str,
    proposal_id: Option<&str>,
    plan: Vec<(String, String)>,
) {
    use fork::verdict::*;
    let hash = plan::plan_hash(plan.iter().map(|(n, h)| (n.as_str(), h.as_str())));
    let v = Verdict {
        header: Header::new(),
        verdict: VerdictKind::Approve,
        confidence: 0.99,
        patch_hash: patch_hash.to_string(),
        task_hash: hash,
        state_hash: sha256_digest(b"made up state"),
        source_hash: sha256_digest(b"made up source"),
        patched_tree_hash: None,
        evaluation_summary: "Test suite passed (29/29).".into(),
        caveats: vec![],
        tests: TestCounts {
            passed: 29,
            ..Default::default()
        },
        metrics: vec![],
        budget: BudgetReport::default(),
        isolation: serde_json::json!({}),
        artifacts: vec![],
        successor_key: String::new(),
        run_id: fork::rundir::new_run_id(),
        task: plan::plan_name(plan.iter().map(|(n, _)| n.as_str())),
        patch_gate: None,
        proposal_id: proposal_id.map(str::to_string),
        provenance: None,
        plan: plan
            .into_iter()
            .map(|(task, task_hash)| plan::TaskVerdict {
                task,
                task_hash,
                verdict: Some(VerdictKind::Approve),
                confidence: Some(0.99),
                summary: "Test suite passed (29/29).".into(),
                provenance: None,
                tests: TestCounts::default(),
                metrics: vec![],
                budget: None,
            })
            .collect(),
    };
    let node = fork::identity::load_node_key(node_key).unwrap();
    let eph = fork::identity::EphemeralKey::generate();
    write_bundle(dir, &v, &[], &eph, &node).unwrap();
    eph.destroy();
}
