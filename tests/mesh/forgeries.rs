//! A dishonest trusted node (a test-side publisher that signs APPROVE without evaluating)
//! is outvoted by honest NEEDS_REVISION votes; an untrusted key, a duplicated message, a
//! path-escaping bundle and replayed verdicts are refused.

use super::*;
use fork::mesh::propose::{ANSWERS_PER_NODE, REFUSED_KEPT};

/// The proposals' plan (the one task they name), each task with its hash, as `fork
/// evaluate` computes them.
fn demo_plan() -> Vec<(String, String)> {
    let m = fork::manifest::load(&demo()).unwrap();
    m.plan(&[MESH_TASK.to_string()])
        .unwrap()
        .into_iter()
        .map(|(name, spec)| {
            let doc = serde_json::to_vec(&(&name.to_string(), spec)).unwrap();
            (name.to_string(), fork::verdict::sha256_digest(&doc))
        })
        .collect()
}

/// The hash of the proposals' plan, as `fork evaluate` computes it.
fn task_hash() -> String {
    let plan = demo_plan();
    fork::verdict::plan::plan_hash(plan.iter().map(|(n, h)| (n.as_str(), h.as_str())))
}

/// A verdict bundle signed by `node_key` (through a fresh ephemeral key), claiming APPROVE
/// for `p`, without any evaluation: what a dishonest node would publish.
fn forge_bundle(dir: &Path, node_key: &Path, p: &Proposal) {
    forge_bundle_of(dir, node_key, p, demo_plan());
}

/// [`forge_bundle`], claiming to have run `plan` (tasks and their hashes).
fn forge_bundle_of(dir: &Path, node_key: &Path, p: &Proposal, plan: Vec<(String, String)>) {
    common::forge_bundle(dir, node_key, &p.patch_hash, Some(&p.proposal_id), plan);
}

fn message_for(proposal_id: &str, node_key: &Path, bundle: &Path) -> Vec<u8> {
    let public = fork::identity::load_node_key(node_key).unwrap().public();
    VerdictMessage::from_bundle(proposal_id, &public, bundle, fork::policy::Publish::Bundle)
        .unwrap()
        .to_json()
        .unwrap()
}

/// A test-side publisher listening to proposals: for each one, `answer` returns the
/// messages to publish on its verdict subject, each with the `Nats-Msg-Id` to send it
/// under (None: a fresh one, and the body's header copied into the NATS headers; Some:
/// that id alone); each answered proposal is reported on the returned channel (after its
/// messages are flushed).
struct FakeNode {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    answered: mpsc::Receiver<String>,
}

impl FakeNode {
    fn start(
        url: &str,
        mut answer: impl FnMut(&Proposal) -> Vec<(Vec<u8>, Option<String>)> + Send + 'static,
    ) -> FakeNode {
        use futures_util::StreamExt;
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let (tx, answered) = mpsc::channel();
        let (s, url) = (stop.clone(), url.to_string());
        let thread = std::thread::spawn(move || {
            runtime().block_on(async move {
                let subjects = Subjects::new(false);
                let c = async_nats::connect(url).await.unwrap();
                let mut sub = c.subscribe(subjects.proposals(DEMO_RUNTIME)).await.unwrap();
                c.flush().await.unwrap();
                ready_tx.send(()).unwrap();
                while !s.load(Ordering::SeqCst) {
                    let Ok(Some(m)) =
                        tokio::time::timeout(Duration::from_millis(200), sub.next()).await
                    else {
                        continue;
                    };
                    let p = decode_proposal(&m.payload).unwrap();
                    for (payload, id) in answer(&p) {
                        let h = match id {
                            None => headers_of(&payload),
                            Some(id) => {
                                let mut h = async_nats::HeaderMap::new();
                                h.insert("Nats-Msg-Id", id.as_str());
                                h
                            }
                        };
                        c.publish_with_headers(
                            subjects.verdicts(&p.proposal_id),
                            h,
                            payload.into(),
                        )
                        .await
                        .unwrap();
                    }
                    c.flush().await.unwrap();
                    let _ = tx.send(p.proposal_id.clone());
                }
            })
        });
        ready_rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the fake node subscribed");
        FakeNode {
            stop,
            thread: Some(thread),
            answered,
        }
    }

    fn wait_answered(&self) -> String {
        self.answered
            .recv_timeout(Duration::from_secs(30))
            .expect("the fake node answered a proposal")
    }
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn a_dishonest_node_is_outvoted_and_forgeries_are_refused() {
    need_root_and_nats!();
    let dir = Dir::new("mesh-dishonest");
    let nats = Nats::start(&dir.0);
    let mut h1 = Node::new(&dir.0, "honest1");
    let mut h2 = Node::new(&dir.0, "honest2");
    let liar = Node::new(&dir.0, "liar");
    let stranger = Node::new(&dir.0, "stranger");
    let out = dir.0.join("out");
    let forged = dir.0.join("forged");
    std::fs::create_dir_all(&forged).unwrap();

    // What the fake publisher does, per proposal: the first gets a forged APPROVE from the
    // trusted liar (twice: a duplicate), one from an untrusted key, a bundle with a
    // path-escaping file name, and junk under each honest node's message id as an earlier
    // release computed it (`<proposal>-<key id>`, known to anyone: the stream dropped the
    // node's real verdict as a duplicate of it); the second gets replays of the first's
    // verdicts.
    let first: Arc<Mutex<Option<(String, PathBuf)>>> = Arc::new(Mutex::new(None));
    let honest1_bundle: Arc<Mutex<Option<PathBuf>>> = Arc::new(Mutex::new(None));
    let (liar_key, stranger_key) = (liar.key_file(), stranger.key_file());
    let squatted = [h1.key_id(), h2.key_id()];
    let (f, hb, fdir) = (first.clone(), honest1_bundle.clone(), forged.clone());
    let fake = FakeNode::start(&nats.url(), move |p| {
        let mut first = f.lock().unwrap();
        match first.as_ref() {
            None => {
                let lie = fdir.join("liar");
                forge_bundle(&lie, &liar_key, p);
                let strange = fdir.join("stranger");
                forge_bundle(&strange, &stranger_key, p);
                *first = Some((p.proposal_id.clone(), lie.clone()));
                let lie_msg = message_for(&p.proposal_id, &liar_key, &lie);
                let mut escaping: Value = serde_json::from_slice(&lie_msg).unwrap();
                escaping["header"]["message_id"] = uuid::Uuid::new_v4().to_string().into();
                escaping["files"]["../../escaped.txt"] = "eA==".into();
                let mut out: Vec<(Vec<u8>, Option<String>)> = vec![
                    (lie_msg.clone(), None),
                    (lie_msg, None),
                    (message_for(&p.proposal_id, &stranger_key, &strange), None),
                    (serde_json::to_vec(&escaping).unwrap(), None),
                ];
                for k in &squatted {
                    let id = format!("{}-{k}", p.proposal_id);
                    out.push((br#"{"junk":true}"#.to_vec(), Some(id)));
                }
                out
            }
            Some((first_id, lie)) => {
                let h1_old = hb.lock().unwrap().clone().expect("honest bundle known");
                vec![
                    // The liar's old bundle, re-sent as an answer to this proposal.
                    (message_for(&p.proposal_id, &liar_key, lie), None),
                    // An honest node's old bundle, re-sent likewise.
                    (message_for(&p.proposal_id, &liar_key, &h1_old), None),
                    // The old message as it was, on this proposal's subject.
                    (message_for(first_id, &liar_key, &h1_old), None),
                ]
            }
        }
    });

    let keys = [h1.key.clone(), h2.key.clone(), liar.key.clone()];
    let trust = [keys[0].as_str(), keys[1].as_str(), keys[2].as_str()];
    // The honest nodes start after the forgeries are on the bus (they still get the
    // proposal: it waits in their durable consumers), so every message is counted.
    let child = propose_in_background(
        &h1,
        &nats.url(),
        "breaks-test",
        &trust,
        &out,
        &["--timeout", "60s"],
    );
    let id1 = fake.wait_answered();
    h1.start(&nats.url());
    h2.start(&nats.url());
    let p = wait_proposed(child, Duration::from_secs(70));
    assert_eq!(p.id(), id1);
    assert_eq!(p.code, 1, "{}", p.ctx());
    let c = p.consensus();
    assert_eq!(c["approved"], false, "{}", p.ctx());
    // The honest nodes' verdicts count, though junk went out first under the ids an
    // earlier release gave them.
    assert_eq!(c["responders"], 3, "{}", p.ctx());
    assert_eq!(
        c["approvals"],
        1,
        "the liar's vote counts, once: {}",
        p.ctx()
    );
    let votes = p.votes();
    assert!(
        votes.contains(&(liar.key.clone(), "APPROVE".into())),
        "{}",
        p.ctx()
    );
    for h in [&h1, &h2] {
        assert!(
            votes.contains(&(h.key.clone(), "NEEDS_REVISION".into())),
            "{}",
            p.ctx()
        );
    }
    assert_eq!(p.refused_reasons(), vec!["untrusted"], "{}", p.ctx());
    let refused = p.refused_messages();
    assert_eq!(refused.len(), 4, "{}", p.ctx());
    assert_eq!(
        refused.iter().filter(|r| r.contains("malformed")).count(),
        2,
        "the junk: {}",
        p.ctx()
    );
    assert!(
        refused.iter().any(|r| r.contains("duplicate")),
        "{}",
        p.ctx()
    );
    assert!(
        refused.iter().any(|r| r.contains("escaped.txt")),
        "{}",
        p.ctx()
    );
    assert!(!out.join("escaped.txt").exists() && !dir.0.join("escaped.txt").exists());

    // Replays: the second proposal's only answers from the liar are its old bundle and an
    // honest node's old bundle; neither counts.
    *honest1_bundle.lock().unwrap() = Some(out.join(&id1).join(format!("{}-01", h1.key_id())));
    h1.stop();
    h2.stop();
    let child = propose_in_background(
        &h1,
        &nats.url(),
        "breaks-test",
        &trust,
        &out,
        &["--timeout", "60s"],
    );
    let id2 = fake.wait_answered();
    assert_ne!(id1, id2);
    h1.start(&nats.url());
    h2.start(&nats.url());
    let p = wait_proposed(child, Duration::from_secs(70));
    assert_eq!(p.code, 1, "{}", p.ctx());
    let c = p.consensus();
    assert_eq!(c["approvals"], 0, "{}", p.ctx());
    assert_eq!(c["responders"], 2, "{}", p.ctx());
    assert_eq!(
        p.refused_reasons(),
        vec!["replayed", "replayed"],
        "{}",
        p.ctx()
    );
    let refused = p.refused_messages();
    assert_eq!(refused.len(), 1, "{}", p.ctx());
    assert!(refused[0].contains(&id1), "{}", p.ctx());
}

/// The proposer counts votes on the plan its own runtime gives the proposal's task: a
/// trusted node's vote on another task is refused as `foreign_task`, never taken as the
/// task the others must match (as the first vote read once was). And what it keeps is
/// bounded, whoever sends: a trusted node's genuine verdicts of earlier proposals, re-sent
/// under this proposal's id before its real answer, do not take its places; a copy of a
/// kept verdict is refused; past a bound, bundles that do not count are not kept.
#[test]
fn the_proposer_pins_the_task_its_runtime_defines() {
    need_root_and_nats!();
    let dir = Dir::new("mesh-task-pin");
    let nats = Nats::start(&dir.0);
    let proposer = Node::new(&dir.0, "proposer");
    let liar = Node::new(&dir.0, "liar");
    let steady = Node::new(&dir.0, "steady");
    let out = dir.0.join("out");
    let forged = dir.0.join("forged");
    std::fs::create_dir_all(&forged).unwrap();
    let (liar_key, steady_key) = (liar.key_file(), steady.key_file());
    let weak = vec![(
        "weak".to_string(),
        fork::verdict::sha256_digest(b"a task that checks nothing"),
    )];
    let strangers: Vec<PathBuf> = (0..REFUSED_KEPT)
        .map(|i| {
            let k = dir.0.join(format!("stranger{i}.key"));
            fork::identity::generate_node_key(&k, false).unwrap();
            k
        })
        .collect();
    let fake = FakeNode::start(&nats.url(), move |p| {
        let mut out = Vec::new();
        // The liar: a vote on another task.
        let lie = forged.join("weak");
        forge_bundle_of(&lie, &liar_key, p, weak.clone());
        out.push((message_for(&p.proposal_id, &liar_key, &lie), None));
        // The steady node's genuine verdicts of four earlier proposals, re-sent as answers
        // to this one (by anyone: they are on the stream), then its real answer.
        for i in 0..ANSWERS_PER_NODE {
            let mut old = p.clone();
            old.proposal_id = format!("earlier-{i}");
            let b = forged.join(format!("steady-old{i}"));
            forge_bundle(&b, &steady_key, &old);
            out.push((message_for(&p.proposal_id, &steady_key, &b), None));
        }
        let real = forged.join("steady");
        forge_bundle(&real, &steady_key, p);
        out.push((message_for(&p.proposal_id, &steady_key, &real), None));
        // A stranger re-sends that real answer as its own; then each sends one of its own.
        out.push((message_for(&p.proposal_id, &strangers[0], &real), None));
        for (i, k) in strangers.iter().enumerate() {
            let b = forged.join(format!("stranger{i}"));
            forge_bundle(&b, k, p);
            out.push((message_for(&p.proposal_id, k, &b), None));
        }
        out
    });
    let trust = [liar.key.as_str(), steady.key.as_str()];
    let child = propose_in_background(
        &proposer,
        &nats.url(),
        "breaks-test",
        &trust,
        &out,
        &["--timeout", "8s", "--min-nodes", "1"],
    );
    fake.wait_answered();
    let p = wait_proposed(child, Duration::from_secs(40));
    let c = p.consensus();
    // The steady node's real vote counts (1 approval of 1 responder); the liar's does not.
    assert_eq!(c["responders"], 1, "{}", p.ctx());
    assert_eq!(c["approved"], true, "{}", p.ctx());
    assert_eq!(p.code, 0, "{}", p.ctx());
    assert_eq!(c["task_hash"], task_hash().as_str(), "{}", p.ctx());
    // Kept besides it: the liar's bundle, the four re-sent ones and the first strangers',
    // REFUSED_KEPT in all, each refused by the count; the rest refused without being kept.
    let mut reasons = p.refused_reasons();
    reasons.sort();
    let strangers_kept = REFUSED_KEPT - 1 - ANSWERS_PER_NODE;
    let mut want = vec!["foreign_task"];
    want.extend(vec!["replayed"; ANSWERS_PER_NODE]);
    want.extend(vec!["untrusted"; strangers_kept]);
    assert_eq!(reasons, want, "{}", p.ctx());
    let messages = p.refused_messages();
    assert_eq!(
        messages.iter().filter(|m| m.contains("not kept")).count(),
        REFUSED_KEPT - strangers_kept,
        "{}",
        p.ctx()
    );
    assert!(
        messages.iter().any(|m| m.contains("a copy of a verdict")),
        "{}",
        p.ctx()
    );
    let kept = std::fs::read_dir(out.join(p.id())).unwrap().count();
    assert_eq!(kept, REFUSED_KEPT + 1, "{}", p.ctx());
    assert!(
        out.join(p.id())
            .join(format!("{}-01", steady.key_id()))
            .is_dir(),
        "{}",
        p.ctx()
    );
}
