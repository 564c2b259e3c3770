//! `fork reverify`: this node re-runs the evaluation another verdict describes and reports
//! agreement; a patch with another hash, or a tampered verdict, is refused.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

fn cmd(dir: &Path) -> Command {
    let mut c = fork_cmd(&dir.join("runs"));
    c.env("XDG_CONFIG_HOME", dir.join("xdg"));
    c.env("XDG_DATA_HOME", dir.join("data"));
    c
}

#[test]
fn reverify_agrees_with_an_honest_verdict_and_refuses_others() {
    if !is_root() {
        eprintln!("this test drives the sandbox with the default policy, which needs root");
        return;
    }
    let dir = scratch("reverify");
    std::fs::create_dir_all(dir.join("runs")).unwrap();
    let demo = repo().join("fixtures/hermes-demo");
    let patch = repo().join("fixtures/patches/swap-compressor.diff");
    let theirs = dir.join("theirs");
    let out = cmd(&dir)
        .arg("evaluate")
        .arg(&patch)
        .arg("--runtime")
        .arg(&demo)
        .arg("--out")
        .arg(&theirs)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Another node (its own key) re-verifies it.
    let other = dir.join("other");
    std::fs::create_dir_all(other.join("runs")).unwrap();
    let ours = other.join("ours");
    let out = cmd(&other)
        .arg("reverify")
        .arg(&theirs)
        .arg("--patch")
        .arg(&patch)
        .arg("--runtime")
        .arg(&demo)
        .arg("--out")
        .arg(&ours)
        .arg("--json")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rep["agree"], true, "{rep}");
    assert_eq!(rep["theirs"], "APPROVE");
    assert_eq!(rep["ours"], "APPROVE");
    // Our own signed verdict, for the same patch and task, by another node key.
    let mine: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ours.join("verdict.json")).unwrap()).unwrap();
    let theirs_v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(theirs.join("verdict.json")).unwrap()).unwrap();
    assert_eq!(mine["patch_hash"], theirs_v["patch_hash"]);
    assert_eq!(mine["task_hash"], theirs_v["task_hash"]);
    assert_ne!(mine["run_id"], theirs_v["run_id"]);
    let v = cmd(&other).arg("verify").arg(&ours).output().unwrap();
    assert_eq!(v.status.code(), Some(0));

    // Another patch than the verdict's: refused before anything runs.
    let out = cmd(&other)
        .arg("reverify")
        .arg(&theirs)
        .arg("--patch")
        .arg(repo().join("fixtures/patches/noop-comment.diff"))
        .arg("--runtime")
        .arg(&demo)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(65));
    assert!(String::from_utf8_lossy(&out.stderr).contains("refusing to re-verify another patch"));

    // A tampered verdict: refused.
    let vj = theirs.join("verdict.json");
    let mut bytes = std::fs::read(&vj).unwrap();
    let i = bytes.iter().position(|b| *b == b'0').unwrap();
    bytes[i] = b'1';
    std::fs::write(&vj, bytes).unwrap();
    let out = cmd(&other)
        .arg("reverify")
        .arg(&theirs)
        .arg("--patch")
        .arg(&patch)
        .arg("--runtime")
        .arg(&demo)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(65),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("not valid"));
}
