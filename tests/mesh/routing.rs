//! Every message carries its type and schema in NATS headers, and a header that disagrees
//! with the body is refused; a node receives only its runtime's proposals.

use super::*;

impl Node {
    /// Renames this node's copy of the runtime (fork.toml `[runtime] name`).
    fn rename_runtime(&self, name: &str) {
        let toml = self.dir.join("demo/fork.toml");
        let text = std::fs::read_to_string(&toml).unwrap();
        let renamed = text.replacen(
            &format!("name = \"{DEMO_RUNTIME}\""),
            &format!("name = \"{name}\""),
            1,
        );
        assert_ne!(renamed, text);
        std::fs::write(&toml, renamed).unwrap();
    }
}

/// The delivery state of a node's durable consumer: (messages delivered, pending).
fn consumer_state(url: &str, node_key: &str, runtime_name: &str) -> (u64, u64) {
    let key = fork::identity::PublicKey::parse(node_key).unwrap();
    let name = fork::mesh::transport::consumer_name(&key, runtime_name);
    runtime().block_on(async {
        let c = async_nats::connect(url).await.unwrap();
        let js = async_nats::jetstream::new(c);
        let stream = js
            .get_stream(Subjects::new(false).proposals_stream())
            .await
            .unwrap();
        let mut consumer: async_nats::jetstream::consumer::PullConsumer =
            stream.get_consumer(&name).await.unwrap();
        let info = consumer.info().await.unwrap();
        (info.delivered.consumer_sequence, info.num_pending)
    })
}

/// Every message on `fork.>` while `f` runs: (subject, headers, payload).
type Seen = Vec<(String, Option<async_nats::HeaderMap>, Vec<u8>)>;

fn watch_bus<T>(url: &str, f: impl FnOnce() -> T) -> (T, Seen) {
    use futures_util::StreamExt;
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (s, out, url) = (stop.clone(), seen.clone(), url.to_string());
    let thread = std::thread::spawn(move || {
        runtime().block_on(async move {
            let c = async_nats::connect(url).await.unwrap();
            let mut sub = c.subscribe("fork.>").await.unwrap();
            c.flush().await.unwrap();
            ready_tx.send(()).unwrap();
            while !s.load(Ordering::SeqCst) {
                if let Ok(Some(m)) =
                    tokio::time::timeout(Duration::from_millis(200), sub.next()).await
                {
                    // Only the mesh's own messages (not JetStream's API traffic).
                    if m.subject.starts_with("fork.v1.") {
                        out.lock().unwrap().push((
                            m.subject.to_string(),
                            m.headers.clone(),
                            m.payload.to_vec(),
                        ));
                    }
                }
            }
        })
    });
    ready_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    let r = f();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    thread.join().unwrap();
    let seen = seen.lock().unwrap().clone();
    (r, seen)
}

fn header<'a>(h: &'a Option<async_nats::HeaderMap>, name: &str) -> Option<&'a str> {
    h.as_ref()
        .and_then(|h| h.get(name))
        .map(<_ as AsRef<str>>::as_ref)
}

#[test]
fn headers_route_messages_and_a_node_receives_only_its_runtime() {
    need_root_and_nats!();
    let dir = Dir::new("mesh-routing");
    let nats = Nats::start(&dir.0);
    // A proposals stream as an earlier fork made it, on `fork.v1.proposals` alone: the
    // per-runtime subjects are added to it.
    let stream_subjects = || {
        runtime().block_on(async {
            let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
            let mut s = js
                .get_or_create_stream(async_nats::jetstream::stream::Config {
                    name: Subjects::new(false).proposals_stream(),
                    subjects: vec!["fork.v1.proposals".into()],
                    ..Default::default()
                })
                .await
                .unwrap();
            s.info().await.unwrap().config.subjects.clone()
        })
    };
    assert_eq!(stream_subjects(), ["fork.v1.proposals"]);
    let mut a = Node::new(&dir.0, "a");
    let mut b = Node::new(&dir.0, "b");
    b.rename_runtime("other_runtime");
    a.start(&nats.url());
    b.start(&nats.url());
    b.wait_log("serving runtime `other_runtime`", Duration::from_secs(20));
    b.wait_log("fork.v1.proposals.other_runtime", Duration::from_secs(1));
    let out = dir.0.join("out");

    // A proposal for hermes-demo: node a answers it; b, serving another runtime, never
    // receives it (its consumer delivered nothing and has nothing pending).
    let (p, seen) = watch_bus(&nats.url(), || {
        propose(
            &a,
            &nats.url(),
            "swap-compressor",
            &[&a.key],
            &out,
            &["--min-nodes", "1", "--timeout", "60s"],
        )
    });
    assert_eq!(p.code, 0, "{}", p.ctx());
    assert_eq!(
        p.report["proposal_subject"],
        "fork.v1.proposals.hermes-demo",
        "{}",
        p.ctx()
    );
    assert_eq!(consumer_state(&nats.url(), &b.key, "other_runtime"), (0, 0));
    assert!(!b.logs().contains(p.id()), "{}", b.logs());
    assert_eq!(consumer_state(&nats.url(), &a.key, DEMO_RUNTIME).1, 0);
    assert_eq!(
        stream_subjects(),
        ["fork.v1.proposals", "fork.v1.proposals.>"]
    );

    // Every message carries its type and schema in headers that match its body.
    let kinds: Vec<(&str, &str)> = seen
        .iter()
        .map(|(subject, h, payload)| {
            let body: Value = serde_json::from_slice(payload).unwrap();
            let kind = header(h, "Fork-Message-Type").expect("Fork-Message-Type");
            assert_eq!(body["header"]["message_type"], kind, "{subject}");
            assert_eq!(
                header(h, "Fork-Schema-Generation").unwrap(),
                body["header"]["schema"]["generation"].to_string(),
                "{subject}"
            );
            assert_eq!(
                header(h, "Fork-Schema-Version").unwrap(),
                body["header"]["schema"]["version"].as_str().unwrap(),
                "{subject}"
            );
            assert!(header(h, "Nats-Msg-Id").is_some(), "{subject}");
            (subject.as_str(), kind)
        })
        .collect();
    let verdicts = format!("fork.v1.verdicts.{}", p.id());
    assert_eq!(
        kinds,
        [
            ("fork.v1.proposals.hermes-demo", "Proposal"),
            (verdicts.as_str(), "VerdictMessage")
        ],
        "{}",
        p.ctx()
    );

    // A header that disagrees with its body, and a message without headers, are refused by
    // name (and acknowledged, not retried); the node lives on.
    let subject = Subjects::new(false).proposals(DEMO_RUNTIME);
    let lying = Proposal::new(b"--- a\n", DEMO_RUNTIME, None, None).unwrap();
    let body = lying.to_json().unwrap();
    let mut h = headers_of(&body);
    h.insert("Fork-Message-Type", "VerdictMessage");
    publish_raw_with(&nats.url(), &subject, Some(h), body);
    let bare = Proposal::new(b"--- a\n", DEMO_RUNTIME, None, None).unwrap();
    publish_raw(&nats.url(), &subject, bare.to_json().unwrap());
    a.wait_log(
        "NATS header Fork-Message-Type is `VerdictMessage`, but the body's header says `Proposal`",
        Duration::from_secs(30),
    );
    a.wait_log(
        "NATS header Fork-Message-Type is missing",
        Duration::from_secs(30),
    );
    assert!(a.alive() && b.alive());
    assert_eq!(consumer_state(&nats.url(), &b.key, "other_runtime"), (0, 0));

    // A runtime whose name cannot be a subject token is refused, by name, on both sides.
    let bad = Node::new(&dir.0, "bad");
    bad.rename_runtime("bad.name");
    let serve = bad
        .cmd()
        .args(["mesh", "serve", "--nats", &nats.url(), "--runtime"])
        .arg(bad.dir.join("demo"))
        .output()
        .unwrap();
    assert_eq!(serve.status.code(), Some(65), "{serve:?}");
    assert!(
        String::from_utf8_lossy(&serve.stderr).contains("`bad.name`"),
        "{serve:?}"
    );
    let prop = bad
        .cmd()
        .args(["mesh", "propose"])
        .arg(patch("swap-compressor"))
        .args(["--nats", &nats.url(), "--trust", &a.key, "--runtime"])
        .arg(bad.dir.join("demo"))
        .output()
        .unwrap();
    assert_eq!(prop.status.code(), Some(65), "{prop:?}");
    assert!(
        String::from_utf8_lossy(&prop.stderr).contains("subject token"),
        "{prop:?}"
    );
}
