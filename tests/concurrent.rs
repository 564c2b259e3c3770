//! Several evaluations at once on one host (a mesh node and a CI job): four `fork evaluate`
//! of the demo share a run root, a node key (created by whichever comes first) and a ledger,
//! while `fork gc` runs beside them. Each comes to its own verdict, the ledger gets four
//! rows in one unbroken chain, gc touches no live run, and nothing remains.

mod common;
use common::gc_report;
use common::lifecycle::*;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

#[test]
fn four_evaluations_at_once_with_gc_beside_them() {
    need_root!();
    let env = Env::new("concurrent");
    let w = Watcher::start(&env.run_root);
    let outs: Vec<_> = (0..4).map(|i| env.out(&format!("c{i}"))).collect();
    let children: Vec<_> = outs
        .iter()
        .map(|out| {
            env.cmd()
                .arg("evaluate")
                .arg(patch("swap-compressor"))
                .arg("--runtime")
                .arg(demo())
                .args(["--no-cache", "--out"])
                .arg(out)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn fork evaluate")
        })
        .collect();
    // fork gc, again and again while they run: it must leave every live run alone.
    let mut gcs = 0;
    let t = Instant::now();
    while gcs < 5 || (t.elapsed() < Duration::from_secs(2)) {
        let rep = gc_report(env.cmd());
        assert_eq!(
            rep["runs"],
            serde_json::json!([]),
            "gc reclaimed a live run: {rep}"
        );
        assert_eq!(rep["cgroups_removed"], serde_json::json!([]), "{rep}");
        gcs += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut run_ids = Vec::new();
    for (child, out) in children.into_iter().zip(&outs) {
        let o = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "not an APPROVE: {stderr}");
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("verdict.json")).unwrap()).unwrap();
        assert_eq!(v["verdict"], "APPROVE", "{v}");
        let vo = env.cmd().arg("verify").arg(out).output().unwrap();
        assert_eq!(
            vo.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&vo.stderr)
        );
        run_ids.push(v["run_id"].as_str().unwrap().to_string());
    }
    let ids = w.finish();
    run_ids.sort();
    run_ids.dedup();
    assert_eq!(run_ids.len(), 4, "four distinct runs: {run_ids:?}");
    // Four rows, one chain.
    let h = env
        .cmd()
        .args(["history", "--json", "-n", "10"])
        .output()
        .unwrap();
    assert_eq!(
        h.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&h.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&h.stdout).unwrap();
    let rows = rows.as_array().expect("history rows");
    assert_eq!(rows.len(), 4, "{rows:?}");
    let lv = env.cmd().args(["ledger", "verify"]).output().unwrap();
    assert_eq!(
        lv.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&lv.stdout)
    );
    // One node key, made once.
    assert!(env.xdg.join("fork/node.key").is_file());
    assert_run_root_clean(&env.run_root, &ids, &[]);
}

/// `fork keygen --force` twice at once, ten rounds: the node key and `node.pub` left are
/// always one pair (the two renames of each run interleaved: 14 of 30 rounds mismatched).
/// And `keygen --out DIR/node.steward --force` beside the node key never replaces the
/// node's `node.pub` (it did: the public path is the key's name with `.pub`).
#[test]
fn forced_keygens_at_once_leave_one_pair_and_no_other_keys_public_half() {
    let env = Env::new("concurrent-keygen");
    let key = env.xdg.join("fork/node.key");
    let o = env.cmd().arg("keygen").output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    for round in 0..10 {
        let runs: Vec<_> = (0..2)
            .map(|_| {
                env.cmd()
                    .args(["keygen", "--force"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for r in runs {
            let o = r.wait_with_output().unwrap();
            assert!(o.status.success(), "round {round}: {}", text(&o));
        }
        let secret = fork::identity::load_node_key(&key).unwrap().public();
        let public = fork::identity::read_public_key(&env.node_pub()).unwrap();
        assert_eq!(
            secret, public,
            "round {round}: node.key and node.pub differ"
        );
    }

    let node_pub = std::fs::read(env.node_pub()).unwrap();
    let steward = env.xdg.join("fork/node.steward");
    let o = env
        .cmd()
        .args(["keygen", "--force", "--out"])
        .arg(&steward)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("node.pub") && err.contains("node.steward") && err.contains("another name"),
        "{}",
        text(&o)
    );
    assert_eq!(std::fs::read(env.node_pub()).unwrap(), node_pub);
    assert!(!steward.exists());
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
