//! The mesh end to end (issue 6): real `fork mesh serve` nodes and a real
//! `fork mesh propose` over a real nats-server (JetStream on, file storage, loopback, a
//! free port, killed at the end).
//!
//! Each node is a separate `fork mesh serve` process with its own node key
//! ($XDG_CONFIG_HOME, made with `fork keygen`), ledger ($XDG_DATA_HOME), run root
//! ($FORK_RUN_ROOT) and copy of fixtures/hermes-demo. Proved here: three nodes approve
//! swap-compressor unanimously; a silent node cannot shrink the vote below --min-nodes;
//! a dishonest trusted node (a test-side publisher that signs APPROVE without evaluating)
//! is outvoted by honest NEEDS_REVISION votes; an untrusted key, a duplicated message, a
//! path-escaping bundle and replayed verdicts are refused; a node started after the
//! proposal still receives and answers it; a node survives a NATS restart and refuses a
//! message of an unknown schema generation, a proposal for another runtime and one whose
//! patch does not match its hash, without dying. The staging prefix is
//! isolated from the production one. Every message carries its type and schema in NATS
//! headers, and a header that disagrees with the body is refused; a node receives only its
//! runtime's proposals; a steward approves over the mesh (`fork mesh approve`), and
//! `propose --steward` passes then, and only then.
//!
//! They need root (the nodes evaluate with the default policy) and nats-server on PATH.

mod common;
use common::lifecycle::{demo, node_cmd, patch};
use common::*;
use fork::mesh::messages::{decode_proposal, Proposal, Subjects, VerdictMessage};
use fork::mesh::wire;
use serde_json::Value;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

macro_rules! need_root_and_nats {
    () => {
        if !is_root() {
            eprintln!("the mesh nodes evaluate with the default policy, which needs root");
            return;
        }
        if nats_server_bin().is_none() {
            eprintln!("nats-server is not on PATH: install it (apt install nats-server)");
            return;
        }
    };
}

fn nats_server_bin() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/bin")])
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
}

/// A scratch directory removed when the test passes (kept when it fails, for the logs).
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        Dir(scratch(name))
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn terminate(child: &mut Child, grace: Duration) {
    if child.try_wait().ok().flatten().is_some() {
        return;
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let until = Instant::now() + grace;
    while Instant::now() < until {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A nats-server on 127.0.0.1, JetStream on, its store in the test's directory.
struct Nats {
    port: u16,
    conf: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Nats {
    fn start(dir: &Path) -> Nats {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let store = dir.join("jetstream");
        std::fs::create_dir_all(&store).unwrap();
        let conf = dir.join("nats.conf");
        std::fs::write(
            &conf,
            format!(
                "listen: 127.0.0.1:{port}\nmax_payload: 8MB\njetstream {{\n  store_dir: \"{}\"\n}}\n",
                store.display()
            ),
        )
        .unwrap();
        let mut n = Nats {
            port,
            conf,
            log: dir.join("nats.log"),
            child: None,
        };
        n.spawn();
        n
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(nats_server_bin().unwrap())
            .arg("-c")
            .arg(&self.conf)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn nats-server");
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(15);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < until,
                "nats-server did not listen on port {}: {}",
                self.port,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL: no goodbye to the clients) and starts it again on the
    /// same port and store.
    fn crash_and_restart(&mut self, down_for: Duration) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        std::thread::sleep(down_for);
        self.spawn();
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            terminate(&mut c, Duration::from_secs(5));
        }
    }
}

/// A mesh node: its own key, ledger, run root and runtime copy; `fork mesh serve` while
/// started.
struct Node {
    dir: PathBuf,
    key: String,
    log: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn new(root: &Path, name: &str) -> Node {
        let dir = root.join(name);
        for d in ["xdg", "data", "runs"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let st = Command::new("cp")
            .arg("-a")
            .arg(demo())
            .arg(dir.join("demo"))
            .status()
            .unwrap();
        assert!(st.success());
        let mut node = Node {
            log: dir.join("serve.log"),
            dir,
            key: String::new(),
            child: None,
        };
        let out = node.cmd().arg("keygen").output().unwrap();
        assert!(out.status.success(), "keygen: {out:?}");
        node.key = String::from_utf8(out.stdout).unwrap().trim().to_string();
        assert!(node.key.starts_with("ed25519:"), "{}", node.key);
        node
    }

    fn cmd(&self) -> Command {
        node_cmd(&self.dir)
    }

    fn key_file(&self) -> PathBuf {
        self.dir.join("xdg/fork/node.key")
    }

    fn key_id(&self) -> String {
        fork::identity::PublicKey::parse(&self.key)
            .unwrap()
            .key_id()
    }

    fn start(&mut self, url: &str) {
        self.start_with(url, &[]);
    }

    fn start_with(&mut self, url: &str, extra: &[&str]) {
        assert!(self.child.is_none());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = self
            .cmd()
            .args(["mesh", "serve", "--nats", url, "--runtime"])
            .arg(self.dir.join("demo"))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn fork mesh serve");
        self.child = Some(child);
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            terminate(&mut c, Duration::from_secs(10));
        }
    }

    fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the node's log contains `needle`.
    fn wait_log(&self, needle: &str, within: Duration) {
        let until = Instant::now() + within;
        while !self.logs().contains(needle) {
            assert!(
                Instant::now() < until,
                "node {} never logged `{needle}`:\n{}",
                self.key,
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The outcome of one `fork mesh propose --json`.
struct Proposed {
    code: i32,
    report: Value,
    stderr: String,
}

impl Proposed {
    fn id(&self) -> &str {
        self.report["proposal_id"].as_str().unwrap()
    }
    fn consensus(&self) -> &Value {
        &self.report["consensus"]
    }
    fn votes(&self) -> Vec<(String, String)> {
        self.consensus()["votes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    v["node_key"].as_str().unwrap().to_string(),
                    v["verdict"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }
    fn refused_reasons(&self) -> Vec<String> {
        self.consensus()["refused"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["reason"].as_str().unwrap().to_string())
            .collect()
    }
    fn refused_messages(&self) -> Vec<String> {
        self.report["refused_messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["reason"].as_str().unwrap().to_string())
            .collect()
    }
    fn ctx(&self) -> String {
        format!(
            "exit {}\nreport {}\nstderr {}",
            self.code,
            serde_json::to_string_pretty(&self.report).unwrap(),
            self.stderr
        )
    }
}

fn propose_cmd(
    proposer: &Node,
    url: &str,
    patch_name: &str,
    trust: &[&str],
    out: &Path,
    extra: &[&str],
) -> Command {
    let mut c = proposer.cmd();
    c.args(["mesh", "propose"])
        .arg(patch(patch_name))
        .args(["--nats", url, "--runtime"])
        .arg(demo())
        .arg("--out")
        .arg(out)
        .arg("--json")
        // The demo's judged contract: deterministic evidence (its plan's benchmark measures
        // latency, which three nodes evaluating at once on two cores make noisy; these tests
        // are about the votes, not the statistics).
        .args(["--task", MESH_TASK]);
    for t in trust {
        c.args(["--trust", t]);
    }
    c.args(extra);
    c
}

fn finish(out: std::process::Output) -> Proposed {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("propose printed no JSON report ({e}): {stdout}\n{stderr}"));
    Proposed {
        code: out.status.code().unwrap_or(-1),
        report,
        stderr,
    }
}

fn propose(
    proposer: &Node,
    url: &str,
    patch_name: &str,
    trust: &[&str],
    out: &Path,
    extra: &[&str],
) -> Proposed {
    finish(
        propose_cmd(proposer, url, patch_name, trust, out, extra)
            .output()
            .expect("spawn fork mesh propose"),
    )
}

fn propose_in_background(
    proposer: &Node,
    url: &str,
    patch_name: &str,
    trust: &[&str],
    out: &Path,
    extra: &[&str],
) -> Child {
    propose_cmd(proposer, url, patch_name, trust, out, extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fork mesh propose")
}

/// Waits for a background proposer (at most `within`).
fn wait_proposed(mut child: Child, within: Duration) -> Proposed {
    let until = Instant::now() + within;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            panic!(
                "fork mesh propose did not finish in {within:?}: {:?}",
                child.wait_with_output()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    finish(child.wait_with_output().unwrap())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Publishes raw bytes on a subject (core NATS: no JetStream dedup header), with NATS
/// `headers` when given.
fn publish_raw_with(
    url: &str,
    subject: &str,
    headers: Option<async_nats::HeaderMap>,
    payload: Vec<u8>,
) {
    runtime().block_on(async {
        let c = async_nats::connect(url).await.unwrap();
        match headers {
            Some(h) => c
                .publish_with_headers(subject.to_string(), h, payload.into())
                .await
                .unwrap(),
            None => c
                .publish(subject.to_string(), payload.into())
                .await
                .unwrap(),
        }
        c.flush().await.unwrap();
    });
}

/// Publishes raw bytes without any header.
fn publish_raw(url: &str, subject: &str, payload: Vec<u8>) {
    publish_raw_with(url, subject, None, payload)
}

/// The NATS headers fork puts on a message with this JSON body.
fn headers_of(payload: &[u8]) -> async_nats::HeaderMap {
    let body: Value = serde_json::from_slice(payload).unwrap();
    let h: fork::verdict::Header = serde_json::from_value(body["header"].clone()).unwrap();
    wire::headers(&h, &uuid::Uuid::new_v4().to_string())
}

/// The runtime of the demo fixture, by its fork.toml name.
const DEMO_RUNTIME: &str = "hermes-demo";

/// The task every proposal here names.
const MESH_TASK: &str = "contract";

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
    use fork::verdict::*;
    let v = Verdict {
        header: Header::new(),
        verdict: VerdictKind::Approve,
        confidence: 0.99,
        patch_hash: p.patch_hash.clone(),
        task_hash: task_hash(),
        state_hash: sha256_digest(b"made up state"),
        source_hash: sha256_digest(b"made up source"),
        patched_tree_hash: None,
        evaluation_summary: "Test suite passed (29/29).".into(),
        caveats: vec![],
        tests: TestCounts {
            passed: 29,
            ..Default::default()
        },
        metrics: vec![],
        budget: BudgetReport::default(),
        isolation: serde_json::json!({}),
        artifacts: vec![],
        successor_key: String::new(),
        run_id: fork::rundir::new_run_id(),
        task: plan::plan_name(demo_plan().iter().map(|(n, _)| n.as_str())),
        patch_gate: None,
        proposal_id: Some(p.proposal_id.clone()),
        provenance: None,
        plan: demo_plan()
            .into_iter()
            .map(|(task, task_hash)| plan::TaskVerdict {
                task,
                task_hash,
                verdict: Some(VerdictKind::Approve),
                confidence: Some(0.99),
                summary: "Test suite passed (29/29).".into(),
                provenance: None,
                tests: TestCounts::default(),
                metrics: vec![],
                budget: None,
            })
            .collect(),
    };
    let node = fork::identity::load_node_key(node_key).unwrap();
    let eph = fork::identity::EphemeralKey::generate();
    write_bundle(dir, &v, &[], &eph, &node).unwrap();
    eph.destroy();
}

fn message_for(proposal_id: &str, node_key: &Path, bundle: &Path) -> Vec<u8> {
    let public = fork::identity::load_node_key(node_key).unwrap().public();
    VerdictMessage::from_bundle(proposal_id, &public, bundle, fork::policy::Publish::Bundle)
        .unwrap()
        .to_json()
        .unwrap()
}

/// A test-side publisher listening to proposals: for each one, `answer` returns the
/// messages to publish on its verdict subject; each answered proposal is reported on the
/// returned channel (after its messages are flushed).
struct FakeNode {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    answered: mpsc::Receiver<String>,
}

impl FakeNode {
    fn start(
        url: &str,
        mut answer: impl FnMut(&Proposal) -> Vec<Vec<u8>> + Send + 'static,
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
                    for payload in answer(&p) {
                        let h = headers_of(&payload);
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
        let b = out.join(p.id()).join(format!("{}-1", n.key_id()));
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
    // trusted liar (twice: a duplicate), one from an untrusted key, and a bundle with a
    // path-escaping file name; the second gets replays of the first's verdicts.
    let first: Arc<Mutex<Option<(String, PathBuf)>>> = Arc::new(Mutex::new(None));
    let honest1_bundle: Arc<Mutex<Option<PathBuf>>> = Arc::new(Mutex::new(None));
    let (liar_key, stranger_key) = (liar.key_file(), stranger.key_file());
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
                vec![
                    lie_msg.clone(),
                    lie_msg,
                    message_for(&p.proposal_id, &stranger_key, &strange),
                    serde_json::to_vec(&escaping).unwrap(),
                ]
            }
            Some((first_id, lie)) => {
                let h1_old = hb.lock().unwrap().clone().expect("honest bundle known");
                vec![
                    // The liar's old bundle, re-sent as an answer to this proposal.
                    message_for(&p.proposal_id, &liar_key, lie),
                    // An honest node's old bundle, re-sent likewise.
                    message_for(&p.proposal_id, &liar_key, &h1_old),
                    // The old message as it was, on this proposal's subject.
                    message_for(first_id, &liar_key, &h1_old),
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
    assert_eq!(refused.len(), 2, "{}", p.ctx());
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
    *honest1_bundle.lock().unwrap() = Some(out.join(&id1).join(format!("{}-1", h1.key_id())));
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

// Declared after the helpers and their macros, which a module sees only above it.
#[path = "mesh/streams.rs"]
mod streams;
