//! The two JetStream streams fork makes: a refusal a second look can outdate (a node and
//! a proposer creating them at the same moment on a fresh server) is asked again; a
//! lasting one is reported with its fix, never taken for a missing JetStream.

use super::*;

/// Another stream on the server already takes the proposals' subjects: fork asks again
/// (the refusal could have been a race), then stops, naming the subjects and what to do.
/// The foreign stream is left exactly as it was.
#[test]
fn a_foreign_stream_on_the_proposals_subjects_is_named_with_its_fix() {
    need_root_and_nats!();
    let dir = Dir::new("mesh-foreign-stream");
    let nats = Nats::start(&dir.0);
    let foreign = async_nats::jetstream::stream::Config {
        name: "SOMEONE_ELSES".into(),
        subjects: vec!["fork.v1.>".into()],
        ..Default::default()
    };
    runtime().block_on(async {
        let c = async_nats::connect(nats.url()).await.unwrap();
        async_nats::jetstream::new(c)
            .create_stream(foreign.clone())
            .await
            .unwrap();
    });
    let proposer = Node::new(&dir.0, "proposer");
    let started = Instant::now();
    let out = propose_cmd(
        &proposer,
        &nats.url(),
        "swap-compressor",
        &[proposer.key.as_str()],
        &dir.0.join("out"),
        &["--min-nodes", "1", "--timeout", "60s"],
    )
    .output()
    .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("cannot create the stream FORK_PROPOSALS")
            && stderr.contains("subjects overlap")
            && stderr.contains(
                "another stream on this server takes subjects overlapping fork.v1.proposals.>"
            ),
        "{stderr}"
    );
    assert!(!stderr.contains("nats-server -js"), "{stderr}");
    // Asked again with a growing backoff (about 11 s in all) before giving up.
    assert!(
        took >= Duration::from_secs(8),
        "gave up after {took:?}: {stderr}"
    );
    runtime().block_on(async {
        let c = async_nats::connect(nats.url()).await.unwrap();
        let js = async_nats::jetstream::new(c);
        let mut s = js.get_stream("SOMEONE_ELSES").await.unwrap();
        assert_eq!(s.info().await.unwrap().config.subjects, foreign.subjects);
        assert!(js.get_stream("FORK_PROPOSALS").await.is_err());
    });
}

/// A refusal that goes away is asked again and then succeeds: while another stream holds
/// the subjects, a node and a proposer started together keep asking; once it is removed
/// (a second later, as a stream made in a race is found on the next look), both make or
/// find fork's streams and the proposal is approved.
#[test]
fn a_refusal_that_goes_away_is_asked_again_and_the_proposal_goes_through() {
    need_root_and_nats!();
    let dir = Dir::new("mesh-refusal-goes");
    let nats = Nats::start(&dir.0);
    let blocker = async_nats::jetstream::stream::Config {
        name: "IN_THE_WAY".into(),
        subjects: vec!["fork.v1.>".into()],
        ..Default::default()
    };
    runtime().block_on(async {
        let c = async_nats::connect(nats.url()).await.unwrap();
        async_nats::jetstream::new(c)
            .create_stream(blocker)
            .await
            .unwrap();
    });
    let mut node = Node::new(&dir.0, "node");
    node.start(&nats.url());
    let key = node.key.clone();
    let child = propose_in_background(
        &node,
        &nats.url(),
        "swap-compressor",
        &[key.as_str()],
        &dir.0.join("out"),
        &["--min-nodes", "1", "--timeout", "60s"],
    );
    std::thread::sleep(Duration::from_secs(1));
    runtime().block_on(async {
        let c = async_nats::connect(nats.url()).await.unwrap();
        async_nats::jetstream::new(c)
            .delete_stream("IN_THE_WAY")
            .await
            .unwrap();
    });
    let p = wait_proposed(child, Duration::from_secs(90));
    assert_eq!(p.code, 0, "{}", p.ctx());
    assert_eq!(p.consensus()["approvals"], 1, "{}", p.ctx());
    assert!(p.stderr.contains("asking again"), "{}", p.stderr);
    assert!(node.alive(), "{}", node.logs());
}
