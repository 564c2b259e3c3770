//! `fork mesh serve`: a mesh node. It reads its runtime's proposals (subject
//! `<prefix>.v1.proposals.<runtime name>`) from its durable consumer, one at a time, re-verifies each patch with the whole lifecycle (`fork evaluate`, on its own copy
//! of the runtime, signed with its own node key) and publishes its verdict bundle.
//!
//! For each proposal: the NATS headers against the body's header, the header (schema
//! generation, type, ids), the size, the base64, the
//! patch hash (`sha256(patch)` must equal `patch_hash`), the runtime's name and the
//! proposal's expiry are checked; a proposal that fails a check is acknowledged and logged,
//! never retried. Otherwise the patch is evaluated (no verdict cache: a cached verdict
//! would answer another proposal), the bundle is kept under
//! `$XDG_DATA_HOME/fork/mesh/<prefix>/<proposal_id>`, published on
//! `<prefix>.v1.verdicts.<proposal_id>`, and only then is the proposal acknowledged. A node
//! that crashes before acknowledging gets the proposal again, and republishes the bundle it
//! already signed rather than evaluating twice.
//!
//! The node outlives NATS restarts: the client reconnects with backoff, and the streams
//! and the consumer are looked up again after any error. SIGINT/SIGTERM stop it between
//! two steps (an evaluation in progress is destroyed and its proposal left to redelivery).
//! Logs go to stderr.

use crate::evaluation::{EvaluateError, LedgerChoice, Request};
use crate::identity::{NodeKey, PublicKey};
use crate::ioerr::IoContext;
use crate::mesh::messages::{MeshError, Proposal, VerdictMessage, MAX_PROPOSAL_MESSAGE_BYTES};
use crate::mesh::transport::{backoff, consumer_name, Bus, PROGRESS_EVERY};
use crate::mesh::wire::decode_proposal_message;
use crate::sandbox::signals::interrupted;
use async_nats::jetstream::{self, consumer::PullConsumer, AckKind};
use futures_util::StreamExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// What `fork mesh serve` is asked.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The NATS server (JetStream on).
    pub nats: String,
    /// The runtime this node evaluates patches for (its root, holding fork.toml).
    pub runtime: PathBuf,
    /// Policy file (default: the built-in policies/default.toml).
    pub policy: Option<PathBuf>,
    /// The node key that endorses this node's verdicts (default:
    /// $XDG_CONFIG_HOME/fork/node.key, created on first use).
    pub key: Option<PathBuf>,
    /// Use the staging subjects (fork-staging.*), for experimental schemas.
    pub staging: bool,
    /// Stop after handling N proposals (answered, or refused as invalid).
    pub max_proposals: Option<u64>,
    /// Answer the proposals pending now, then stop.
    pub once: bool,
}

/// Builds a runtime and runs [`serve`] on it.
pub fn serve_blocking(opts: ServeOptions) -> Result<(), MeshError> {
    super::block_on(serve(opts))
}

/// What the node knows about itself.
struct Node {
    opts: ServeOptions,
    key_path: PathBuf,
    public: PublicKey,
    runtime_name: String,
    /// Where this node keeps the bundles it signed.
    bundles: PathBuf,
    /// What of a bundle this node publishes (its policy's `[mesh] publish`).
    publish: crate::policy::Publish,
}

enum Flow {
    /// The proposal was answered or refused; go on.
    Done,
    /// Interrupted: stop serving.
    Stop,
}

fn log(msg: impl AsRef<str>) {
    say!("fork mesh: {}", msg.as_ref());
}

/// The node key at `path` (or the default one, created when missing).
fn node_key(path: Option<&Path>) -> Result<(PathBuf, NodeKey), MeshError> {
    let path = match path {
        Some(p) => p.to_path_buf(),
        None => {
            let p = crate::identity::default_node_key_path();
            if !p.exists() {
                let public = crate::identity::generate_node_key(&p, false).map_err(|e| {
                    MeshError::Internal(format!("creating the node key {}: {e}", p.display()))
                })?;
                log(format!(
                    "no node key yet: created {} ({public})",
                    p.display()
                ));
            }
            p
        }
    };
    let key = crate::identity::load_node_key(&path)
        .map_err(|e| MeshError::key_file(&e, e.to_string()))?;
    Ok((path, key))
}

/// Serves proposals until interrupted (or `--max-proposals`, or `--once`).
pub async fn serve(opts: ServeOptions) -> Result<(), MeshError> {
    crate::sandbox::signals::install_interrupt_flag();
    let (key_path, key) = node_key(opts.key.as_deref())?;
    let public = key.public();
    drop(key);
    let manifest =
        crate::manifest::load(&opts.runtime).map_err(|e| MeshError::Input(e.to_string()))?;
    crate::mesh::wire::check_runtime_token(&manifest.runtime.name)?;
    let publish = crate::policy::Policy::load(opts.policy.as_deref())
        .map_err(|e| MeshError::Input(e.to_string()))?
        .mesh
        .publish;
    let subjects = crate::mesh::messages::Subjects::new(opts.staging);
    let bundles = crate::ledger::Ledger::default_path()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
        .join("mesh")
        .join(subjects.prefix());
    std::fs::create_dir_all(&bundles).ctx("create directory", &bundles)?;
    let node = Node {
        runtime_name: manifest.runtime.name.clone(),
        opts,
        key_path,
        public,
        bundles,
        publish,
    };

    // A long-lived node waits for its server; `--once` answers what is pending now, so
    // it gives up as `mesh propose` does (exit 69), never waiting without end.
    let bus = Bus::connect(
        &node.opts.nats,
        &consumer_name(&node.public, &node.runtime_name),
        node.opts.staging,
        node.opts
            .once
            .then_some(crate::mesh::transport::CONNECT_GIVE_UP),
    )
    .await?;
    log(format!(
        "node {} serving runtime `{}` ({}) on {} at {}",
        node.public,
        node.runtime_name,
        node.opts.runtime.display(),
        bus.subjects.proposals(&node.runtime_name),
        bus.url
    ));

    let mut answered = 0u64;
    let mut consumer: Option<PullConsumer> = None;
    let mut failures = 0usize;
    loop {
        if interrupted() {
            log("interrupted: stopping");
            return Ok(());
        }
        if node.opts.max_proposals.is_some_and(|m| answered >= m) {
            log(format!("answered {answered} proposal(s): stopping"));
            return Ok(());
        }
        let c = match &consumer {
            Some(c) => c.clone(),
            None => match setup(&bus, &node.public, &node.runtime_name).await {
                Ok(c) => {
                    if failures > 0 {
                        log("the bus is back: serving again");
                    }
                    failures = 0;
                    consumer = Some(c.clone());
                    c
                }
                Err(e) => {
                    failures += 1;
                    if failures == 1 || failures % 10 == 0 {
                        log(format!("{e}; retrying"));
                    }
                    tokio::time::sleep(backoff(failures)).await;
                    continue;
                }
            },
        };
        // No pull request while disconnected: the client would queue it, and the server
        // could later deliver a proposal to a request nobody listens to any more.
        if bus.client.connection_state() != async_nats::connection::State::Connected {
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        match next_message(&c, node.opts.once).await {
            Ok(Some(msg)) => match handle(&bus, &node, msg).await {
                Flow::Done => answered += 1,
                Flow::Stop => return Ok(()),
            },
            Ok(None) => {
                if node.opts.once {
                    log(format!(
                        "no proposal pending: stopping (answered {answered})"
                    ));
                    return Ok(());
                }
            }
            Err(e) => {
                failures += 1;
                if failures == 1 || failures % 10 == 0 {
                    log(format!("{e}; reconnecting"));
                }
                consumer = None;
                tokio::time::sleep(backoff(failures)).await;
            }
        }
    }
}

/// The streams and the node's consumer (looked up again after any error).
async fn setup(bus: &Bus, node: &PublicKey, runtime: &str) -> Result<PullConsumer, MeshError> {
    let (proposals, _verdicts) = bus.ensure_streams().await?;
    bus.node_consumer(&proposals, node, runtime).await
}

/// The next proposal: waits up to 2 s (or not at all with `no_wait`).
async fn next_message(
    c: &PullConsumer,
    no_wait: bool,
) -> Result<Option<jetstream::Message>, MeshError> {
    let fail = |e: String| MeshError::Nats {
        action: "fetch a proposal".into(),
        reason: e,
    };
    let mut batch = if no_wait {
        c.fetch()
            .max_messages(1)
            .expires(Duration::from_secs(2))
            .messages()
            .await
    } else {
        c.batch()
            .max_messages(1)
            .expires(Duration::from_secs(2))
            .messages()
            .await
    }
    .map_err(|e| fail(e.to_string()))?;
    match tokio::time::timeout(Duration::from_secs(10), batch.next()).await {
        Ok(Some(Ok(m))) => Ok(Some(m)),
        Ok(Some(Err(e))) => Err(fail(e.to_string())),
        Ok(None) => Ok(None),
        Err(_) => Err(fail("no answer from the server in 10 s".into())),
    }
}

/// Acknowledges, retrying a little: the server may be restarting.
async fn ack(msg: &jetstream::Message, kind: AckKind) {
    for attempt in 1..=20usize {
        match msg.double_ack_with(kind).await {
            Ok(()) => return,
            Err(e) => {
                if attempt == 1 {
                    log(format!(
                        "cannot acknowledge the proposal yet ({e}); retrying"
                    ));
                }
                tokio::time::sleep(backoff(attempt).max(Duration::from_millis(500))).await;
            }
        }
    }
    log("gave up acknowledging the proposal: it will be delivered again");
}

/// A proposal refused without an answer: logged and acknowledged (never retried).
async fn refuse(msg: &jetstream::Message, what: &str, e: &MeshError) -> Flow {
    log(format!("refused {what}: {e}"));
    ack(msg, AckKind::Term).await;
    Flow::Done
}

async fn handle(bus: &Bus, node: &Node, msg: jetstream::Message) -> Flow {
    let (seq, delivered) = msg
        .info()
        .map(|i| (i.stream_sequence, i.delivered))
        .unwrap_or((0, 0));
    let what = format!("proposal #{seq}");
    if msg.payload.len() > MAX_PROPOSAL_MESSAGE_BYTES {
        let e = MeshError::TooLarge {
            what: "the proposal message".into(),
            size: msg.payload.len(),
            limit: MAX_PROPOSAL_MESSAGE_BYTES,
        };
        return refuse(&msg, &what, &e).await;
    }
    let p = match decode_proposal_message(msg.headers.as_ref(), &msg.payload) {
        Ok(p) => p,
        Err(e) => return refuse(&msg, &what, &e).await,
    };
    let what = format!("proposal {} (#{seq})", p.proposal_id);
    if p.runtime != node.runtime_name {
        let e = MeshError::RuntimeMismatch {
            proposed: p.runtime.chars().take(128).collect(),
            local: node.runtime_name.clone(),
        };
        return refuse(&msg, &what, &e).await;
    }
    if p.expired(SystemTime::now()) {
        let e = MeshError::Input(format!(
            "it expired at {} (nobody collects its answers any more)",
            p.expires_at.as_deref().unwrap_or("?")
        ));
        return refuse(&msg, &what, &e).await;
    }
    let patch = match p.patch() {
        Ok(b) => b,
        Err(e) => return refuse(&msg, &what, &e).await,
    };
    if p.budget.is_some() {
        log(format!(
            "{what}: the proposer's budget request is advisory: this node's policy governs"
        ));
    }
    log(format!(
        "{what}: evaluating patch {} (task {}, delivery {delivered})",
        p.patch_hash,
        p.task.as_deref().unwrap_or("default")
    ));
    let started = Instant::now();
    let bundle = match existing_bundle(node, &p) {
        Some(dir) => {
            log(format!(
                "{what}: already evaluated ({}): publishing that verdict again",
                dir.display()
            ));
            dir
        }
        None => match evaluate(node, &p, patch, &msg).await {
            Ok(dir) => dir,
            Err(MeshError::Interrupted) => {
                log(format!(
                    "{what}: interrupted: the evaluation was destroyed; the proposal will be delivered again"
                ));
                let _ = msg.ack_with(AckKind::Nak(None)).await;
                return Flow::Stop;
            }
            Err(e @ MeshError::Evaluate(_)) if e.is_transient() => {
                log(format!("{what}: {e}; it will be delivered again"));
                let _ = msg
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(5))))
                    .await;
                return Flow::Done;
            }
            Err(e) => return refuse(&msg, &what, &e).await,
        },
    };
    let sent = async {
        let m = VerdictMessage::from_bundle(&p.proposal_id, &node.public, &bundle, node.publish)?;
        let bytes = m.to_json()?;
        // A retry of this answer is dropped as a duplicate (its id hashes these bytes).
        let scope = format!("{}-{}", p.proposal_id, node.public.key_id());
        bus.publish_retrying(
            bus.subjects.verdicts(&p.proposal_id),
            bytes,
            &m.header,
            &scope,
            Duration::from_secs(600),
        )
        .await
    }
    .await;
    match sent {
        Ok(_) => {
            ack(&msg, AckKind::Ack).await;
            let verdict = crate::verdict::verify_bundle(&bundle, &[node.public])
                .map(|v| format!("{} ({:.2})", v.verdict.verdict, v.verdict.confidence))
                .unwrap_or_else(|e| format!("a bundle that does not verify: {e}"));
            log(format!(
                "{what}: answered {verdict} in {:.1}s",
                started.elapsed().as_secs_f64()
            ));
            Flow::Done
        }
        Err(e) => {
            log(format!(
                "{what}: cannot publish the verdict ({e}); the proposal will be delivered again"
            ));
            let _ = msg
                .ack_with(AckKind::Nak(Some(Duration::from_secs(5))))
                .await;
            Flow::Done
        }
    }
}

/// The bundle this node already signed for `p` (a redelivery after a crash), if it still
/// verifies with this node's key and answers this proposal.
fn existing_bundle(node: &Node, p: &Proposal) -> Option<PathBuf> {
    let dir = node.bundles.join(&p.proposal_id);
    let v = crate::verdict::verify_bundle(&dir, &[node.public]).ok()?;
    (v.verdict.proposal_id.as_deref() == Some(p.proposal_id.as_str())
        && v.verdict.patch_hash == p.patch_hash)
        .then_some(dir)
}

/// Runs the lifecycle on a thread of its own (it starts its own runtimes, which must never
/// run inside this one), telling the server every [`PROGRESS_EVERY`] that the proposal is
/// still being worked on. Returns the bundle directory.
async fn evaluate(
    node: &Node,
    p: &Proposal,
    patch: Vec<u8>,
    msg: &jetstream::Message,
) -> Result<PathBuf, MeshError> {
    let out = node.bundles.join(&p.proposal_id);
    if std::fs::symlink_metadata(&out).is_ok() {
        // A bundle that does not verify (a crash while writing, or tampering): set aside.
        let aside = node.bundles.join(format!(
            ".{}.stale-{}",
            p.proposal_id,
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::rename(&out, &aside).ctx("set aside", &out)?;
        log(format!(
            "an unusable earlier bundle for this proposal was moved to {}",
            aside.display()
        ));
    }
    let patch_file = tempfile::Builder::new()
        .prefix(&format!(".{}.", p.proposal_id))
        .suffix(".diff")
        .tempfile_in(&node.bundles)
        .ctx("create a patch file in", &node.bundles)?;
    std::fs::write(patch_file.path(), &patch).ctx("write", patch_file.path())?;
    let mut args = Request::new(patch_file.path().to_path_buf(), node.opts.runtime.clone());
    args.tasks = p.task.iter().cloned().collect();
    args.policy = node.opts.policy.clone();
    args.out = Some(out.clone());
    args.key = Some(node.key_path.clone());
    // A cached verdict would answer another proposal.
    args.use_cache = false;
    args.ledger = LedgerChoice::Default;
    args.proposal = Some(p.proposal_id.clone());
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    let worker = std::thread::Builder::new()
        .name("fork-evaluate".into())
        .spawn(move || {
            let _ = tx.send(crate::evaluation::evaluate(&args));
        })
        .map_err(|e| MeshError::Internal(format!("cannot start the evaluation thread: {e}")))?;
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.tick().await;
    let result = loop {
        tokio::select! {
            r = &mut rx => break r,
            _ = tick.tick() => {
                let _ = msg.ack_with(AckKind::Progress).await;
            }
        }
    };
    let _ = worker.join();
    drop(patch_file);
    match result {
        Ok(Ok(ev)) => Ok(ev.out_dir),
        Ok(Err(EvaluateError::Interrupted)) => Err(MeshError::Interrupted),
        Ok(Err(e)) => Err(MeshError::Evaluate(Box::new(e))),
        Err(_) => Err(MeshError::Evaluate(Box::new(EvaluateError::Internal(
            "the evaluation thread ended without a result".into(),
        )))),
    }
}
