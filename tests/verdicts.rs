//! Verdicts with statistics, flaky tests, replicas, the verdict cache, the ledger and the
//! CI outputs, end to end (issue 5's proof list), with the real binary:
//!
//! 1. the compress benchmark (baseline, repeat = 5) finds swap-compressor's gains
//!    significant, with bootstrap intervals entirely below 0 and 5 samples per side;
//! 2. a no-op patch is APPROVEd with no significant metric ("unchanged");
//! 3. a patch that slows the compressor is NEEDS_REVISION for a significant p99_ms regression;
//! 4. a test that fails once and passes on the rerun is reported flaky, with the retry's
//!    evidence in the bundle;
//! 5. the cache reuses a verdict only for the same inputs and an intact bundle;
//! 6. the ledger lists the verdicts and `fork ledger verify` catches an edited and a deleted
//!    row;
//! 7. `--junit` and `--summary` (and `$GITHUB_STEP_SUMMARY`) render the verdict for CI;
//! 8. `--replicas 3` runs three patched successors that agree; replicas share `alpha`.
//!
//! Every test has a private run root, node key ($XDG_CONFIG_HOME) and ledger
//! ($XDG_DATA_HOME), and checks that nothing of its runs remains. They need root (the
//! default policy mounts a capped tmpfs and creates cgroups).

mod common;
use common::lifecycle::*;
use common::*;
use fork::task::results::{parse_junit, TestOutcome, TestReport};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn flaky_demo() -> PathBuf {
    repo().join("fixtures/flaky-demo")
}

fn patch_hash(p: &Path) -> String {
    format!(
        "sha256:{}",
        hex::encode(Sha256::digest(std::fs::read(p).unwrap()))
    )
}

impl Eval {
    /// Did this evaluation reuse a cached verdict?
    fn reused(&self) -> bool {
        self.stderr.contains("reusing the verdict")
    }
}

/// The shared `evaluate_with`, demanding a verdict (exit 0-2): every evaluation here comes
/// to one. `vars` go into its environment.
fn evaluate_env(
    env: &Env,
    patch: &Path,
    runtime: &Path,
    name: &str,
    args: &[&str],
    vars: &[(&str, &OsStr)],
) -> Eval {
    let with = With {
        vars,
        require_verdict: true,
        ..With::default()
    };
    evaluate_with(env, patch, runtime, name, args, with)
}

/// Shadows the shared `evaluate`: here a verdict is required.
fn evaluate(env: &Env, patch: &Path, runtime: &Path, name: &str, args: &[&str]) -> Eval {
    evaluate_env(env, patch, runtime, name, args, &[])
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

// The tests, by subject (declared after the helpers, as in tests/evaluate.rs).
#[path = "verdicts/cache.rs"]
mod cache;
#[path = "verdicts/ci_outputs.rs"]
mod ci_outputs;
#[path = "verdicts/flaky.rs"]
mod flaky;
#[path = "verdicts/ledger.rs"]
mod ledger;
#[path = "verdicts/metrics.rs"]
mod metrics;
#[path = "verdicts/replicas.rs"]
mod replicas;
