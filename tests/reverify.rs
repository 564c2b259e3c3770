//! `fork reverify`: this node re-runs the evaluation another verdict describes and reports
//! agreement; a patch with another hash, or a tampered verdict, is refused.

mod common;
use common::lifecycle::{demo, need_root, node_cmd, patch};
use common::*;

#[test]
fn reverify_agrees_with_an_honest_verdict_and_refuses_others() {
    need_root!();
    let dir = scratch("reverify");
    std::fs::create_dir_all(dir.join("runs")).unwrap();
    let demo = demo();
    let patch = patch("swap-compressor");
    let theirs = dir.join("theirs");
    let out = node_cmd(&dir)
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
    let out = node_cmd(&other)
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
    // The demo's plan, replayed whole: the same tasks, each with the budget it had.
    assert_eq!(theirs_v["task"], "contract+bench");
    assert_eq!(mine["task"], theirs_v["task"]);
    for (m, t) in mine["plan"]
        .as_array()
        .unwrap()
        .iter()
        .zip(theirs_v["plan"].as_array().unwrap())
    {
        assert_eq!(m["task"], t["task"]);
        assert_eq!(m["task_hash"], t["task_hash"]);
        assert_eq!(m["budget"]["limits"], t["budget"]["limits"]);
    }
    assert_ne!(mine["run_id"], theirs_v["run_id"]);
    let v = node_cmd(&other).arg("verify").arg(&ours).output().unwrap();
    assert_eq!(v.status.code(), Some(0));

    // Another patch than the verdict's: refused before anything runs.
    let out = node_cmd(&other)
        .arg("reverify")
        .arg(&theirs)
        .arg("--patch")
        .arg(common::lifecycle::patch("noop-comment"))
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
    let out = node_cmd(&other)
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

/// A verdict that names a mesh proposal, endorsed by a node key nobody pinned (here a
/// bundle made without any evaluation): this node's re-verification names no proposal,
/// so its signed verdict cannot be counted in that proposal's vote; with `--trust` of the
/// endorsing key it answers the same proposal.
#[test]
fn reverify_names_the_proposal_only_of_a_trusted_verdict() {
    use fork::verdict::sha256_digest;
    need_root!();
    let dir = scratch("reverify-proposal");
    std::fs::create_dir_all(dir.join("runs")).unwrap();
    let demo = demo();
    let patch = patch("swap-compressor");
    let m = fork::manifest::load(&demo).unwrap();
    let (name, spec) = m.task(Some("contract")).unwrap();
    let task_hash = sha256_digest(&serde_json::to_vec(&(&name.to_string(), spec)).unwrap());
    let key_path = dir.join("theirs.key");
    let public = fork::identity::generate_node_key(&key_path, false).unwrap();
    let theirs = dir.join("theirs");
    forge_bundle(
        &theirs,
        &key_path,
        &sha256_digest(&std::fs::read(&patch).unwrap()),
        Some("proposal-of-someone-else"),
        vec![("contract".to_string(), task_hash)],
    );
    let public = public.to_string();
    for (trust, expect) in [
        (None, serde_json::Value::Null),
        (Some(public.as_str()), "proposal-of-someone-else".into()),
    ] {
        let ours = dir.join(if trust.is_some() {
            "trusted"
        } else {
            "unpinned"
        });
        let mut c = node_cmd(&dir);
        c.arg("reverify")
            .arg(&theirs)
            .arg("--patch")
            .arg(&patch)
            .arg("--runtime")
            .arg(&demo)
            .arg("--out")
            .arg(&ours);
        if let Some(k) = trust {
            c.args(["--trust", k]);
        }
        let out = c.output().unwrap();
        assert!(
            matches!(out.status.code(), Some(0) | Some(1)),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mine: serde_json::Value =
            serde_json::from_slice(&std::fs::read(ours.join("verdict.json")).unwrap()).unwrap();
        let got = mine.get("proposal_id").cloned().unwrap_or_default();
        assert_eq!(got, expect, "trust {trust:?}: {mine}");
    }
}
