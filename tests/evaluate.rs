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

fn gate_violation(e: &Eval) -> String {
    assert_eq!(e.verdict["patch_gate"]["passed"], false, "{}", e.ctx());
    e.verdict["patch_gate"]["violations"][0]
        .as_str()
        .unwrap_or_default()
        .to_string()
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

// The tests, by subject (declared after the helpers, as in tests/mesh.rs).
#[path = "evaluate/bad_input.rs"]
mod bad_input;
#[path = "evaluate/budgets.rs"]
mod budgets;
#[path = "evaluate/deploy.rs"]
mod deploy;
#[path = "evaluate/parent.rs"]
mod parent;
#[path = "evaluate/patches.rs"]
mod patches;
#[path = "evaluate/phases.rs"]
mod phases;
#[path = "evaluate/reclaim.rs"]
mod reclaim;
#[path = "evaluate/results.rs"]
mod results;
#[path = "evaluate/signature.rs"]
mod signature;
#[path = "evaluate/state_digest.rs"]
mod state_digest;
#[path = "evaluate/verify_inputs.rs"]
mod verify_inputs;
