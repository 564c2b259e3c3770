//! The hostile suite for `fork run`: each case runs the hostile probe (examples/hostile.rs)
//! through the real binary, in its own sandbox process, and shows it contained. Every
//! probe only touches what it or this test created, on loopback, bounded.
//!
//! These tests need root (the default policy mounts a capped tmpfs and creates cgroups),
//! as on the project's CI machine.

mod common;
use common::lifecycle::{need_default_policy, need_root};
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn assert_denied(args: &[&str], errno: i64) {
    let r = probe(&[], args);
    assert_eq!(r.code, 0, "probe {args:?} exit; stderr={}", r.stderr);
    let p = r.probe();
    assert_eq!(p["succeeded"], false, "{args:?} was NOT contained: {p}");
    assert_eq!(p["errno"].as_i64(), Some(errno), "{args:?}: {p}");
}

fn probe_ok(name: &str) -> serde_json::Value {
    let r = probe(&[], &[name]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    r.probe()
}

// The tests, by subject (each submodule takes the helpers above with `use super::*`).
#[path = "sandbox/budgets.rs"]
mod budgets;
#[path = "sandbox/cgroup_join.rs"]
mod cgroup_join;
#[path = "sandbox/filesystem.rs"]
mod filesystem;
#[path = "sandbox/launch.rs"]
mod launch;
#[path = "sandbox/network.rs"]
mod network;
#[path = "sandbox/privileges.rs"]
mod privileges;
#[path = "sandbox/run_root.rs"]
mod run_root;
#[path = "sandbox/supervisor.rs"]
mod supervisor;
#[path = "sandbox/uids.rs"]
mod uids;
#[path = "sandbox/visibility.rs"]
mod visibility;
