//! A steward approves over the mesh (`fork mesh approve`), and `propose --steward` passes
//! then, and only then.

use super::*;

/// `fork keygen --out` a steward key in `dir`: (key file, public key).
fn steward_key(dir: &Path, any_node: &Node) -> (PathBuf, String) {
    let sk = dir.join("steward/steward.key");
    std::fs::create_dir_all(sk.parent().unwrap()).unwrap();
    let g = any_node
        .cmd()
        .args(["keygen", "--out"])
        .arg(&sk)
        .output()
        .unwrap();
    assert!(g.status.success(), "{g:?}");
    (sk, String::from_utf8_lossy(&g.stdout).trim().to_string())
}

/// `fork mesh approve PATCH` in the background, its bundles in `dir/steward-out` and its
/// stderr in `dir/steward.log`; returns once it listens.
fn steward_approve(
    node: &Node,
    url: &str,
    patch_name: &str,
    key: &Path,
    trust: &[&str],
    dir: &Path,
    timeout: &str,
) -> Child {
    let (out, log) = (dir.join("steward-out"), dir.join("steward.log"));
    let mut c = node.cmd();
    c.args(["mesh", "approve"])
        .arg(patch(patch_name))
        .arg("--key")
        .arg(key)
        .args(["--nats", url, "--timeout", timeout, "--json", "--out"])
        .arg(out);
    for t in trust {
        c.args(["--trust", t]);
    }
    let child = c
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn fork mesh approve");
    wait_file_contains(&log, "waiting up to", Duration::from_secs(20));
    child
}

fn wait_file_contains(path: &Path, needle: &str, within: Duration) {
    let until = Instant::now() + within;
    while !std::fs::read_to_string(path)
        .unwrap_or_default()
        .contains(needle)
    {
        assert!(
            Instant::now() < until,
            "{} never said `{needle}`: {}",
            path.display(),
            std::fs::read_to_string(path).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_steward_approves_over_the_mesh_and_propose_steward_passes() {
    need_root_and_nats!();
    let dir = Dir::new("mesh-steward");
    let nats = Nats::start(&dir.0);
    let mut n1 = Node::new(&dir.0, "n1");
    let mut n2 = Node::new(&dir.0, "n2");
    n1.start(&nats.url());
    n2.start(&nats.url());
    let (sk, steward) = steward_key(&dir.0, &n1);
    let trust = [n1.key.as_str(), n2.key.as_str()];

    // The steward reviewed swap-compressor and waits for the nodes' verdicts on it.
    let approver = steward_approve(
        &n1,
        &nats.url(),
        "swap-compressor",
        &sk,
        &trust,
        &dir.0,
        "90s",
    );

    let out = dir.0.join("out");
    let p = propose(
        &n1,
        &nats.url(),
        "swap-compressor",
        &trust,
        &out,
        &[
            "--min-nodes",
            "2",
            "--timeout",
            "90s",
            "--steward",
            &steward,
        ],
    );
    assert_eq!(p.code, 0, "{}", p.ctx());
    let c = p.consensus();
    assert_eq!(c["approved"], true, "{}", p.ctx());
    assert_eq!(c["approvals"], 2, "{}", p.ctx());
    assert_eq!(c["steward"]["ok"], true, "{}", p.ctx());
    assert_eq!(p.report["timed_out"], false, "{}", p.ctx());
    assert!(
        p.report["steward_approvals"].as_u64().unwrap() >= 1,
        "{}",
        p.ctx()
    );
    // The approval landed in a received bundle, which still verifies.
    let approved = PathBuf::from(c["steward"]["bundle"].as_str().unwrap());
    assert!(approved.starts_with(out.join(p.id())), "{}", p.ctx());
    let v = n1
        .cmd()
        .arg("verify")
        .arg(&approved)
        .args(["--trust", &n1.key, "--trust", &n2.key])
        .output()
        .unwrap();
    assert!(v.status.success(), "{v:?}");

    // The steward approved both nodes' APPROVE verdicts of that proposal and stopped once
    // both had answered.
    let s = wait_proposed(approver, Duration::from_secs(60));
    assert_eq!(s.code, 0, "{}", s.ctx());
    assert_eq!(s.report["proposal_id"], p.id(), "{}", s.ctx());
    assert_eq!(
        s.report["approved"].as_array().unwrap().len(),
        2,
        "{}",
        s.ctx()
    );
    assert_eq!(s.report["timed_out"], false, "{}", s.ctx());
    assert_eq!(s.report["steward_key"], steward.as_str());
}

#[test]
fn without_the_stewards_approval_propose_steward_fails_at_the_timeout() {
    need_root_and_nats!();
    let dir = Dir::new("mesh-no-steward");
    let nats = Nats::start(&dir.0);
    let mut n1 = Node::new(&dir.0, "n1");
    n1.start(&nats.url());
    let (sk, steward) = steward_key(&dir.0, &n1);

    // The steward reviewed another patch: the node's APPROVE of swap-compressor is not what
    // they approve.
    let approver = steward_approve(
        &n1,
        &nats.url(),
        "breaks-test",
        &sk,
        &[&n1.key],
        &dir.0,
        "20s",
    );

    let started = Instant::now();
    let p = propose(
        &n1,
        &nats.url(),
        "swap-compressor",
        &[&n1.key],
        &dir.0.join("out"),
        &[
            "--min-nodes",
            "1",
            "--timeout",
            "15s",
            "--steward",
            &steward,
        ],
    );
    assert!(started.elapsed() >= Duration::from_secs(15));
    assert_eq!(p.code, 1, "{}", p.ctx());
    let c = p.consensus();
    assert_eq!(c["approved"], false, "{}", p.ctx());
    assert_eq!(c["approvals"], 1, "the quorum alone was met: {}", p.ctx());
    assert_eq!(c["steward"]["ok"], false, "{}", p.ctx());
    assert_eq!(p.report["timed_out"], true, "{}", p.ctx());
    assert_eq!(p.report["steward_approvals"], 0, "{}", p.ctx());

    let s = wait_proposed(approver, Duration::from_secs(40));
    assert_eq!(s.code, 1, "{}", s.ctx());
    assert!(
        s.report["approved"].as_array().unwrap().is_empty(),
        "{}",
        s.ctx()
    );
    let reasons = s.report["not_approved"].to_string();
    assert!(reasons.contains("not the reviewed"), "{}", s.ctx());
}
