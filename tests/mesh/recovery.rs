//! A node started after the proposal still receives and answers it; a node survives a
//! NATS restart and refuses a message of an unknown schema generation, a proposal for
//! another runtime and one whose patch does not match its hash, without dying.

use super::*;

#[test]
fn a_node_started_late_still_answers() {
    need_root_and_nats!();
    let dir = Dir::new("mesh-late");
    let nats = Nats::start(&dir.0);
    let mut early = Node::new(&dir.0, "early");
    let mut late = Node::new(&dir.0, "late");
    early.start(&nats.url());
    let out = dir.0.join("out");
    let child = propose_in_background(
        &early,
        &nats.url(),
        "swap-compressor",
        &[&early.key, &late.key],
        &out,
        &["--min-nodes", "2", "--timeout", "60s"],
    );
    // The early node has answered (and the proposal was published well before) when the
    // late one starts: its brand-new durable consumer still delivers the proposal. With
    // --once, the late node answers what is pending and stops by itself.
    // Waited for here rather than with `wait_log`, so that a proposer which ended early
    // (it waits for two answers: it should not) is reported with its own output.
    let mut child = child;
    let until = Instant::now() + Duration::from_secs(40);
    while !early.logs().contains("answered APPROVE") {
        if child.try_wait().unwrap().is_some() || Instant::now() > until {
            let _ = child.kill();
            panic!(
                "the early node never answered:\n{}\nthe proposer: {:?}",
                early.logs(),
                child.wait_with_output()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    late.start_with(&nats.url(), &["--once"]);
    let p = wait_proposed(child, Duration::from_secs(70));
    let mut once = late.child.take().unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = once.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < until,
            "--once did not stop: {}",
            late.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status:?}: {}", late.logs());
    assert!(
        late.logs().contains("no proposal pending"),
        "{}",
        late.logs()
    );
    assert_eq!(p.code, 0, "{}", p.ctx());
    assert_eq!(p.consensus()["approvals"], 2, "{}", p.ctx());
    assert!(
        p.votes().contains(&(late.key.clone(), "APPROVE".into())),
        "{}",
        p.ctx()
    );
    assert!(late.logs().contains(p.id()), "{}", late.logs());
}

#[test]
fn a_node_survives_a_nats_restart_and_refuses_unknown_generations() {
    need_root_and_nats!();
    let dir = Dir::new("mesh-restart");
    let mut nats = Nats::start(&dir.0);
    let mut node = Node::new(&dir.0, "node");
    node.start(&nats.url());
    let out = dir.0.join("out");
    let key = node.key.clone();
    let trust = [key.as_str()];
    let args = ["--min-nodes", "1", "--timeout", "60s"];
    let p = propose(&node, &nats.url(), "swap-compressor", &trust, &out, &args);
    assert_eq!(p.code, 0, "{}", p.ctx());

    nats.crash_and_restart(Duration::from_secs(1));
    // The client reconnects by itself (a second "connected to"), the node keeps serving.
    let until = Instant::now() + Duration::from_secs(30);
    while node.logs().matches("connected to").count() < 2 {
        assert!(Instant::now() < until, "no reconnection: {}", node.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(node.alive(), "{}", node.logs());

    // A message of schema generation 2 (whose body this generation could not even read)
    // is refused by name, and acknowledged (not redelivered).
    let mut future: Value = serde_json::from_slice(
        &Proposal::new(b"--- a\n", "hermes-demo", None, None)
            .unwrap()
            .to_json()
            .unwrap(),
    )
    .unwrap();
    future["header"]["schema"]["generation"] = 2.into();
    future["patch_b64"] = serde_json::json!({"chunks": ["..."]});
    publish_raw(
        &nats.url(),
        &Subjects::new(false).proposals(DEMO_RUNTIME),
        serde_json::to_vec(&future).unwrap(),
    );

    // A proposal for another runtime, and one whose patch is not the one its hash names.
    let other = Proposal::new(b"--- a\n", "another-runtime", None, None).unwrap();
    let mut forged = Proposal::new(b"--- a\n", "hermes-demo", None, None).unwrap();
    forged.patch_b64 = "LS0tIGIK".into();
    for bad in [other, forged] {
        let body = bad.to_json().unwrap();
        publish_raw_with(
            &nats.url(),
            &Subjects::new(false).proposals(DEMO_RUNTIME),
            Some(headers_of(&body)),
            body,
        );
    }

    let p = propose(&node, &nats.url(), "breaks-test", &trust, &out, &args);
    assert_eq!(p.code, 1, "{}", p.ctx());
    assert_eq!(
        p.votes(),
        vec![(node.key.clone(), "NEEDS_REVISION".to_string())],
        "{}",
        p.ctx()
    );
    assert!(node.alive(), "{}", node.logs());
    let logs = node.logs();
    assert_eq!(
        logs.matches("schema generation 2").count(),
        1,
        "refused once, not retried: {logs}"
    );
    assert!(logs.contains("disconnected"), "{logs}");
    assert!(
        logs.contains("is for runtime `another-runtime`, this node serves `hermes-demo`"),
        "{logs}"
    );
    assert!(logs.contains("but the proposal claims"), "{logs}");
}
