//! The vote: three nodes approve swap-compressor unanimously (the staging prefix isolated
//! from the production one), and a silent node cannot shrink the vote below --min-nodes.

use super::*;

#[test]
fn three_nodes_approve_unanimously_and_staging_is_separate() {
    need_root_and_nats!();
    let dir = Dir::new("mesh-unanimous");
    let nats = Nats::start(&dir.0);
    let mut nodes: Vec<Node> = (1..=3)
        .map(|i| Node::new(&dir.0, &format!("node{i}")))
        .collect();
    for n in &mut nodes {
        n.start(&nats.url());
    }
    let keys: Vec<&str> = nodes.iter().map(|n| n.key.as_str()).collect();
    let out = dir.0.join("out");
    let p = propose(
        &nodes[0],
        &nats.url(),
        "swap-compressor",
        &keys,
        &out,
        &["--min-nodes", "3", "--timeout", "60s"],
    );
    assert_eq!(p.code, 0, "{}", p.ctx());
    let c = p.consensus();
    assert_eq!(c["approved"], true, "{}", p.ctx());
    assert_eq!(c["approvals"], 3, "{}", p.ctx());
    assert_eq!(c["responders"], 3, "{}", p.ctx());
    assert_eq!(p.report["timed_out"], false, "{}", p.ctx());
    let mut voters: Vec<String> = p.votes().into_iter().map(|(k, _)| k).collect();
    voters.sort();
    let mut want: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    want.sort();
    assert_eq!(voters, want, "one vote per node: {}", p.ctx());
    assert!(p.votes().iter().all(|(_, v)| v == "APPROVE"), "{}", p.ctx());
    assert!(p.refused_reasons().is_empty(), "{}", p.ctx());
    // Every received bundle is a signed bundle: `fork verify` accepts it with its node's
    // key, and it answers this proposal. Under the default policy (`[mesh] publish =
    // "verdict"`) a node publishes its verdict and the artifacts' hashes, never their
    // contents (logs, reports).
    for n in &nodes {
        let b = out.join(p.id()).join(format!("{}-01", n.key_id()));
        assert!(!b.join("artifacts").exists(), "artifacts were published");
        assert!(b.join("artifacts.withheld").is_file());
        let text = n
            .cmd()
            .arg("verify")
            .arg(&b)
            .args(["--trust", &n.key])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&text.stdout).contains("artifacts withheld"),
            "{text:?}"
        );
        let v = n
            .cmd()
            .arg("verify")
            .arg(&b)
            .args(["--trust", &n.key, "--json"])
            .output()
            .unwrap();
        assert!(v.status.success(), "verify {}: {v:?}", b.display());
        let doc: Value =
            serde_json::from_slice(&std::fs::read(b.join("verdict.json")).unwrap()).unwrap();
        assert_eq!(doc["proposal_id"], p.id());
        assert!(n.logs().contains(p.id()), "{}", n.logs());
    }

    // The staging mesh is another namespace: production nodes never see its proposals.
    let s = propose(
        &nodes[0],
        &nats.url(),
        "swap-compressor",
        &keys,
        &out,
        &["--staging", "--min-nodes", "1", "--timeout", "3s"],
    );
    assert_eq!(s.code, 1, "{}", s.ctx());
    assert_eq!(s.report["messages"], 0, "{}", s.ctx());
    assert_eq!(s.report["timed_out"], true, "{}", s.ctx());
    assert_eq!(s.consensus()["responders"], 0, "{}", s.ctx());
    for n in &mut nodes {
        assert!(!n.logs().contains(s.id()), "{}", n.logs());
        assert!(n.alive());
    }
}

#[test]
fn a_silent_node_cannot_shrink_the_vote() {
    need_root_and_nats!();
    let dir = Dir::new("mesh-offline");
    let nats = Nats::start(&dir.0);
    let mut a = Node::new(&dir.0, "a");
    let mut b = Node::new(&dir.0, "b");
    let offline = Node::new(&dir.0, "offline");
    a.start(&nats.url());
    b.start(&nats.url());
    let trust = [a.key.as_str(), b.key.as_str(), offline.key.as_str()];
    let out = dir.0.join("out");

    let started = Instant::now();
    let p = propose(
        &a,
        &nats.url(),
        "swap-compressor",
        &trust,
        &out,
        &["--min-nodes", "3", "--timeout", "8s"],
    );
    assert_eq!(p.code, 1, "{}", p.ctx());
    let c = p.consensus();
    assert_eq!(c["approved"], false, "{}", p.ctx());
    assert_eq!(c["approvals"], 2, "{}", p.ctx());
    assert_eq!(c["responders"], 2, "{}", p.ctx());
    assert_eq!(p.report["timed_out"], true, "{}", p.ctx());
    assert!(started.elapsed() >= Duration::from_secs(8));

    // With a floor of 2, the same two approvals settle it at once: even a third vote
    // against would leave 2 of 3.
    let p = propose(
        &a,
        &nats.url(),
        "swap-compressor",
        &trust,
        &out,
        &["--min-nodes", "2", "--timeout", "60s"],
    );
    assert_eq!(p.code, 0, "{}", p.ctx());
    assert_eq!(p.consensus()["approvals"], 2, "{}", p.ctx());
    assert_eq!(p.report["timed_out"], false, "{}", p.ctx());
}
