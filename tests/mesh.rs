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

// Declared after the helpers and their macros, which a module sees only above it.
#[path = "mesh/forgeries.rs"]
mod forgeries;
#[path = "mesh/recovery.rs"]
mod recovery;
#[path = "mesh/routing.rs"]
mod routing;
#[path = "mesh/steward.rs"]
mod steward;
#[path = "mesh/streams.rs"]
mod streams;
#[path = "mesh/votes.rs"]
mod votes;
