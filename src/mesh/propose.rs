//! `fork mesh propose PATCH`: publish a patch to the mesh, collect the nodes' signed
//! verdicts, and decide by consensus ([`crate::mesh::consensus`]).
//!
//! The verdicts are read from the verdicts stream (an ordered consumer on
//! `<prefix>.v1.verdicts.<proposal_id>`, from the first message, so nothing published
//! before the consumer existed or during a reconnect is missed). Each message's header is
//! checked; a message seen before (same message id) is refused; every other one is written
//! into a scratch directory and checked as `fork verify` checks it against the trusted
//! keys. A bundle that verifies and whose signed verdict answers this proposal is kept as
//! `OUT/<proposal_id>/<endorsing key id>-<nn>/` (named after the key that really endorsed
//! it, at most [`ANSWERS_PER_NODE`] per key, a copy of one already kept refused); any other
//! is kept as `x-<the key id its message claims>-<nn>/`, for the report, up to
//! [`REFUSED_KEPT`] of them, and removed past that.
//! The votes are then counted again, with the proposal's id, patch hash and task hash, so
//! that a verdict for another proposal or patch (a replay) never counts. So whatever
//! anyone publishes on the subject, the proposer keeps and re-checks a bounded number of
//! bundles, and no sender chooses where (in the counting's order) a genuine bundle lands. Collecting stops when the outcome can no longer change
//! (every trusted node has a counted vote, approval has become impossible, or it holds
//! even if every silent node votes against) or at the timeout.
//!
//! The proposal goes to `<prefix>.v1.proposals.<runtime name>`. Messages on the verdicts
//! subject are routed by their `Fork-Message-Type` header: with `--steward`, a steward's
//! approval ([`crate::mesh::steward`], published there by `fork mesh approve`) is filed
//! into the received bundle it approves and counted in the steward gate; collecting then
//! goes on, once the votes are settled, until the steward has approved or the timeout.

use crate::identity::PublicKey;
use crate::ioerr::IoContext;
use crate::mesh::consensus::{consensus, ConsensusConfig, ConsensusReport, Quorum};
use crate::mesh::messages::{parse_key, MeshError, Proposal, MAX_PATCH_BYTES};
use crate::mesh::steward::STEWARD_APPROVAL_TYPE;
use crate::mesh::steward::{decode_approval_message, Filed, StewardApprovalMessage};
use crate::mesh::transport::Bus;
use crate::mesh::wire;
use crate::mesh::wire::decode_verdict_message_with;
use async_nats::jetstream::consumer;
use futures_util::StreamExt;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The answers kept from one endorsing node key: a node answers once, and again only when
/// the proposal was delivered to it again (at most `MAX_DELIVER` times).
pub const ANSWERS_PER_NODE: usize = crate::mesh::transport::MAX_DELIVER as usize;

/// The bundles kept that do not verify (shown in the report's `refused`); later ones are
/// removed once refused, listed under `refused_messages` only.
pub const REFUSED_KEPT: usize = 16;

/// `fork mesh propose`.
/// What `fork mesh propose` is asked.
#[derive(Debug, Clone)]
pub struct ProposeOptions {
    /// The patch to propose (a unified diff, at most 1 MiB).
    pub patch: PathBuf,
    /// The NATS server (JetStream on).
    pub nats: String,
    /// The runtime the patch is for (its root, holding fork.toml: its name goes in the
    /// proposal, and nodes serving another runtime refuse it).
    pub runtime: PathBuf,
    /// The task the nodes run (default: the manifest's plan, every `gate = true` task in
    /// file order into one verdict, or the first task when none is marked).
    pub task: Option<String>,
    /// How long to wait for the verdicts, e.g. 60s, 5m.
    pub timeout: Duration,
    /// The fraction of the responding trusted nodes that must approve.
    pub quorum: Quorum,
    /// The absolute floor of approvals, however many nodes answer.
    pub min_nodes: usize,
    /// A trusted node key (ed25519:<base64>), or a file holding one. Repeatable (or
    /// comma-separated); only these nodes' verdicts count.
    pub trust: Vec<String>,
    /// A steward key (or file): an approving verdict must carry this steward's approval.
    pub steward: Option<String>,
    /// Where the received bundles go: OUT/<proposal_id>/<node key id>-<n>/ (default:
    /// ./fork-mesh).
    pub out: Option<PathBuf>,
    /// Print the report as JSON.
    pub json: bool,
    /// Use the staging subjects (fork-staging.*), for experimental schemas.
    pub staging: bool,
}

/// A verdict message that was not written as a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefusedMessage {
    /// Its sequence in the verdicts stream.
    pub sequence: u64,
    /// The node key it claims, when it could be read.
    pub node_key: Option<String>,
    pub reason: String,
}

/// What `fork mesh propose` reports.
#[derive(Debug, Clone, Serialize)]
pub struct ProposeReport {
    pub proposal_id: String,
    pub patch_hash: String,
    pub runtime: String,
    pub task: Option<String>,
    /// Where the proposal was published.
    pub proposal_subject: String,
    /// Where the verdicts were read from.
    pub subject: String,
    /// The directory holding the received bundles.
    #[serde(serialize_with = "crate::text::lossy_path")]
    pub out_dir: PathBuf,
    /// Whether collecting ended at the timeout (rather than when the outcome was settled).
    pub timed_out: bool,
    pub elapsed_s: f64,
    /// Verdict messages received, refused ones included.
    pub messages: usize,
    /// Steward approval messages filed into a received bundle.
    pub steward_approvals: usize,
    pub refused_messages: Vec<RefusedMessage>,
    pub consensus: ConsensusReport,
}

impl ProposeReport {
    /// The report as human text.
    pub fn render(&self) -> String {
        use crate::text::safe_text as t;
        let mut out = format!(
            "proposal {}  patch {}  runtime `{}`  task {}\n  {} verdict message(s) in {:.1}s{}; bundles in {}\n",
            t(&self.proposal_id),
            t(&self.patch_hash),
            t(&self.runtime),
            t(self.task.as_deref().unwrap_or("(default)")),
            self.messages,
            self.elapsed_s,
            if self.timed_out { " (timed out)" } else { "" },
            t(&self.out_dir.to_string_lossy())
        );
        if !self.refused_messages.is_empty() {
            out.push_str(&format!(
                "refused messages ({}):\n",
                self.refused_messages.len()
            ));
            for r in &self.refused_messages {
                out.push_str(&format!(
                    "  #{} {}: {}\n",
                    r.sequence,
                    t(r.node_key.as_deref().unwrap_or("(unknown node)")),
                    t(&r.reason)
                ));
            }
        }
        out.push_str(&self.consensus.render());
        out
    }
}

/// Builds a runtime and runs [`propose`]; returns its report (the CLI prints it and picks
/// the exit code).
pub fn propose_blocking(opts: ProposeOptions) -> Result<ProposeReport, MeshError> {
    super::block_on(propose(opts))
}

/// Whether more votes could still change the outcome.
pub fn settled(r: &ConsensusReport, cfg: &ConsensusConfig) -> bool {
    let voted: HashSet<&str> = r.votes.iter().map(|v| v.node_key.as_str()).collect();
    let remaining = cfg
        .trusted
        .iter()
        .map(PublicKey::to_string)
        .collect::<HashSet<_>>()
        .iter()
        .filter(|k| !voted.contains(k.as_str()))
        .count();
    let quorum_met = r.responders > 0
        && r.approvals >= cfg.quorum.needed(r.responders)
        && r.approvals >= cfg.min_nodes;
    if remaining == 0 {
        // Every vote is in; with a steward, an approval may still come.
        return r.approved || cfg.steward.is_none() || !quorum_met;
    }
    let (a, n) = (r.approvals, r.responders);
    // The best case for approval: every silent trusted node approves. (The margin
    // approvals - needed only grows with each approval, as the quorum is at most 1.)
    let best = a + remaining;
    if best < cfg.quorum.needed(n + remaining) || best < cfg.min_nodes {
        return true;
    }
    // Approved, and it stays so even if every silent node votes against.
    r.approved && a >= cfg.quorum.needed(n + remaining) && a >= cfg.min_nodes
}

/// Proposes the patch and collects the verdicts until the outcome is settled or the
/// timeout passes.
pub async fn propose(opts: ProposeOptions) -> Result<ProposeReport, MeshError> {
    let started = tokio::time::Instant::now();
    let deadline = started + opts.timeout;

    // The patch, the runtime, the keys: all checked before anything is published.
    let read = crate::patch::read_patch_file(&opts.patch, MAX_PATCH_BYTES as u64)
        .map_err(|e| MeshError::Input(e.to_string()))?;
    let patch = read.bytes;
    if read.size > MAX_PATCH_BYTES as u64 {
        return Err(MeshError::TooLarge {
            what: format!("patch {}", opts.patch.display()),
            size: usize::try_from(read.size).unwrap_or(usize::MAX),
            limit: MAX_PATCH_BYTES,
        });
    }
    let manifest =
        crate::manifest::load(&opts.runtime).map_err(|e| MeshError::Input(e.to_string()))?;
    wire::check_runtime_token(&manifest.runtime.name)?;
    manifest
        .task(opts.task.as_deref())
        .map_err(|e| MeshError::Usage(e.to_string()))?;
    // The votes counted are on the plan a node runs for this proposal (its task, or the
    // runtime's default plan), as this runtime defines it: pinned here, so that no vote
    // (the first one read, whoever sent it) decides which task the others must match.
    let task_hash = crate::evaluation::plan::manifest_plan_hash(
        &manifest,
        &opts.task.iter().cloned().collect::<Vec<_>>(),
    )
    .map_err(|e| MeshError::Input(e.to_string()))?;
    let mut trusted = Vec::new();
    for t in &opts.trust {
        let k = parse_key("--trust", t)?;
        if !trusted.contains(&k) {
            trusted.push(k);
        }
    }
    if trusted.is_empty() {
        return Err(MeshError::Usage(
            "no trusted node key: pass --trust ed25519:<key> for each node whose verdict counts"
                .into(),
        ));
    }
    if opts.min_nodes > trusted.len() {
        return Err(MeshError::Usage(format!(
            "--min-nodes {} is more than the {} trusted node key(s): no outcome could ever be approved; trust more nodes or lower --min-nodes",
            opts.min_nodes,
            trusted.len()
        )));
    }
    let steward = opts
        .steward
        .as_deref()
        .map(|s| parse_key("--steward", s))
        .transpose()?;
    let proposal = Proposal::new(
        &patch,
        &manifest.runtime.name,
        opts.task.clone(),
        Some(opts.timeout),
    )?;
    let id = proposal.proposal_id.clone();
    let out_dir = opts
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("fork-mesh"))
        .join(&id);
    std::fs::create_dir_all(&out_dir).ctx("create directory", &out_dir)?;
    let cfg = ConsensusConfig {
        quorum: opts.quorum,
        min_nodes: opts.min_nodes,
        trusted,
        steward,
        patch_hash: Some(proposal.patch_hash.clone()),
        task_hash: Some(task_hash),
        proposal_id: Some(id.clone()),
    };

    let bus = Bus::connect(
        &opts.nats,
        "fork-propose",
        opts.staging,
        Some(opts.timeout.min(crate::mesh::transport::CONNECT_GIVE_UP)),
    )
    .await?;
    let (_, verdicts) = bus.ensure_streams().await?;
    let subject = bus.subjects.verdicts(&id);
    // The verdict consumer exists before the proposal does.
    let mut incoming = verdicts
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: subject.clone(),
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(|e| MeshError::Nats {
            action: format!("read {subject}"),
            reason: e.to_string(),
        })?
        .messages()
        .await
        .map_err(|e| MeshError::Nats {
            action: format!("read {subject}"),
            reason: e.to_string(),
        })?;
    let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
    let proposal_subject = bus.subjects.proposals(&proposal.runtime);
    bus.publish_retrying(
        proposal_subject.clone(),
        proposal.to_json()?,
        &proposal.header,
        &id,
        remaining.max(Duration::from_secs(1)),
    )
    .await?;
    say!(
        "fork mesh: proposed {} ({}) on {}; waiting up to {} for verdicts",
        id,
        proposal.patch_hash,
        proposal_subject,
        humantime::format_duration(opts.timeout)
    );

    let mut bundles: Vec<PathBuf> = Vec::new();
    let mut seen_messages: HashSet<String> = HashSet::new();
    let mut intake = Intake::default();
    let mut refused_messages = Vec::new();
    let mut messages = 0usize;
    let mut steward_approvals = 0usize;
    // Approvals of a bundle that has not arrived (yet).
    let mut pending: Vec<StewardApprovalMessage> = Vec::new();
    let mut report = consensus(&bundles, &cfg);
    let mut timed_out = false;
    loop {
        if settled(&report, &cfg) {
            break;
        }
        let next = match tokio::time::timeout_at(deadline, incoming.next()).await {
            Err(_) => {
                timed_out = true;
                break;
            }
            Ok(None) => {
                return Err(MeshError::Nats {
                    action: format!("read {subject}"),
                    reason: "the consumer ended".into(),
                })
            }
            Ok(Some(Err(e))) => {
                say!("fork mesh: reading verdicts: {e}; going on");
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
            Ok(Some(Ok(m))) => m,
        };
        messages += 1;
        let sequence = next.info().map(|i| i.stream_sequence).unwrap_or(0);
        let mut refuse = |node_key: Option<String>, reason: String| {
            say!("fork mesh: refused verdict message #{sequence}: {reason}");
            refused_messages.push(RefusedMessage {
                sequence,
                node_key,
                reason,
            });
        };
        if wire::message_type(next.headers.as_ref()) == Some(STEWARD_APPROVAL_TYPE) {
            let Some(steward) = &cfg.steward else {
                continue;
            };
            let a = match decode_approval_message(next.headers.as_ref(), &next.payload) {
                Ok(a) if a.proposal_id == id => a,
                Ok(a) => {
                    refuse(
                        Some(a.steward_key.clone()),
                        format!("an approval for proposal {}, not {id}", a.proposal_id),
                    );
                    continue;
                }
                Err(e) => {
                    refuse(None, e.to_string());
                    continue;
                }
            };
            match a.file_into(&bundles, steward) {
                Ok(Filed::Into(dir)) => {
                    steward_approvals += 1;
                    say!(
                        "fork mesh: steward {} approved the verdict in {}",
                        a.steward_key,
                        dir.display()
                    );
                    report = consensus(&bundles, &cfg);
                }
                Ok(Filed::Pending) => pending.push(a),
                Err(reason) => refuse(Some(a.steward_key.clone()), reason),
            }
            continue;
        }
        let m = match decode_verdict_message_with(next.headers.as_ref(), &next.payload) {
            Ok(m) => m,
            Err(e) => {
                refuse(None, e.to_string());
                continue;
            }
        };
        if m.proposal_id != id {
            refuse(
                Some(m.node_key.clone()),
                format!("it answers proposal {}, not {id}", m.proposal_id),
            );
            continue;
        }
        if !seen_messages.insert(m.header.message_id.clone()) {
            refuse(
                Some(m.node_key.clone()),
                format!(
                    "duplicate: message {} was already received",
                    m.header.message_id
                ),
            );
            continue;
        }
        let claimed = match m.node_public_key() {
            Ok(k) => k.key_id(),
            Err(e) => {
                refuse(None, e.to_string());
                continue;
            }
        };
        let dir = match keep(&out_dir, &m.files, &claimed, &cfg, &mut intake) {
            Ok(dir) => dir,
            Err(reason) => {
                refuse(Some(m.node_key.clone()), reason);
                continue;
            }
        };
        bundles.push(dir);
        if let Some(steward) = &cfg.steward {
            let mut still = Vec::new();
            for a in std::mem::take(&mut pending) {
                match a.file_into(&bundles, steward) {
                    Ok(Filed::Into(_)) => steward_approvals += 1,
                    Ok(Filed::Pending) => still.push(a),
                    Err(reason) => refuse(Some(a.steward_key.clone()), reason),
                }
            }
            pending = still;
        }
        report = consensus(&bundles, &cfg);
        say!(
            "fork mesh: verdict from {}: {} approval(s) of {} counted vote(s)",
            m.node_key,
            report.approvals,
            report.responders
        );
    }
    for a in pending {
        refused_messages.push(RefusedMessage {
            sequence: 0,
            node_key: Some(a.steward_key),
            reason: format!(
                "a steward approval of verdict {} (node {}), which was never received or counted",
                a.verdict_sha256, a.node_key
            ),
        });
    }
    Ok(ProposeReport {
        proposal_id: id,
        patch_hash: proposal.patch_hash,
        runtime: proposal.runtime,
        task: proposal.task,
        proposal_subject,
        subject,
        out_dir,
        timed_out,
        elapsed_s: started.elapsed().as_secs_f64(),
        messages,
        steward_approvals,
        refused_messages,
        consensus: report,
    })
}

/// What the proposer has kept of the answers so far.
#[derive(Default)]
struct Intake {
    /// Bundles kept per endorsing node key (those that answer this proposal).
    per_node: BTreeMap<String, usize>,
    /// The sha256 of each kept verified bundle's verdict.json.
    verdicts: HashSet<String>,
    /// Bundles kept that do not count: they do not verify, or they answer another
    /// proposal, patch or task.
    refused: usize,
}

/// Writes an answer's `files` into a scratch directory under `out_dir`, checks it against
/// the trusted keys and this proposal (`cfg`), and keeps it (see the module docs): the
/// directory it now has, or why it was not kept.
///
/// A bundle that verifies and answers this proposal (its signed `proposal_id`, patch and
/// task are this proposal's) is kept as `<endorsing key id>-<nn>`, at most
/// [`ANSWERS_PER_NODE`] per key: a genuine verdict of an earlier proposal, re-sent by
/// anyone under this proposal's id, must not take one of its node's places. Any other
/// bundle is kept as `x-<claimed key id>-<nn>` (sorted after every counted one, numbered
/// apart from them), at most [`REFUSED_KEPT`] in all, for the report.
fn keep(
    out_dir: &Path,
    files: &BTreeMap<String, String>,
    claimed: &str,
    cfg: &ConsensusConfig,
    intake: &mut Intake,
) -> Result<PathBuf, String> {
    let scratch = out_dir.join(".incoming");
    let _ = std::fs::remove_dir_all(&scratch);
    let written = crate::mesh::messages::write_bundle_files(&scratch, files);
    let verified = written.map_err(|e| e.to_string()).and_then(|()| {
        crate::verdict::verify_bundle(&scratch, &cfg.trusted).map_err(|e| e.to_string())
    });
    let counted = match verified {
        Ok(v) => {
            let verdict = &v.verdict;
            let answers = verdict.proposal_id.is_some() && verdict.proposal_id == cfg.proposal_id;
            let ours = |want: &Option<String>, got: &str| want.as_deref().is_none_or(|w| w == got);
            if answers
                && ours(&cfg.patch_hash, &verdict.patch_hash)
                && ours(&cfg.task_hash, &verdict.task_hash)
            {
                Ok(v)
            } else {
                Err("it does not answer this proposal".to_string())
            }
        }
        Err(e) => Err(e),
    };
    let dir = match counted {
        Ok(v) => {
            let key_id = v.node_key.key_id();
            let doc = std::fs::read(scratch.join(crate::verdict::bundle::VERDICT_FILE));
            let doc = doc.map(|d| crate::verdict::sha256_digest(&d));
            let kept = intake.per_node.get(&key_id).copied().unwrap_or(0);
            let refusal = match &doc {
                Err(e) => Some(format!("reading its verdict.json: {e}")),
                Ok(d) if intake.verdicts.contains(d) => {
                    Some(format!("a copy of a verdict of {key_id} already received"))
                }
                Ok(_) if kept >= ANSWERS_PER_NODE => Some(format!(
                    "{key_id} already has {ANSWERS_PER_NODE} answers kept for this proposal"
                )),
                Ok(_) => None,
            };
            if let Some(why) = refusal {
                let _ = std::fs::remove_dir_all(&scratch);
                return Err(why);
            }
            if let Ok(d) = doc {
                intake.verdicts.insert(d);
            }
            intake.per_node.insert(key_id.clone(), kept + 1);
            out_dir.join(format!("{key_id}-{:02}", kept + 1))
        }
        Err(e) if intake.refused >= REFUSED_KEPT || !scratch.is_dir() => {
            let _ = std::fs::remove_dir_all(&scratch);
            return Err(format!(
                "{e} (not kept: {REFUSED_KEPT} bundles that do not count are kept already, or it could not be written)"
            ));
        }
        Err(_) => {
            intake.refused += 1;
            out_dir.join(format!("x-{claimed}-{:02}", intake.refused))
        }
    };
    std::fs::rename(&scratch, &dir).map_err(|e| {
        let _ = std::fs::remove_dir_all(&scratch);
        format!("keeping it as {}: {e}", dir.display())
    })?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::NodeKey;
    use crate::mesh::consensus::Vote;
    use crate::verdict::VerdictKind;

    fn report(votes: &[(PublicKey, bool)], cfg: &ConsensusConfig) -> ConsensusReport {
        // The fields `settled` reads, filled as consensus would for these accepted votes.
        let approvals = votes.iter().filter(|(_, a)| *a).count();
        let responders = votes.len();
        let needed = cfg.quorum.needed(responders);
        ConsensusReport {
            approved: responders > 0 && approvals >= needed && approvals >= cfg.min_nodes,
            approvals,
            responders,
            needed,
            min_nodes: cfg.min_nodes,
            quorum: cfg.quorum.to_string(),
            votes: votes
                .iter()
                .map(|(k, a)| Vote {
                    bundle: PathBuf::from("b"),
                    node_key: k.to_string(),
                    verdict: if *a {
                        VerdictKind::Approve
                    } else {
                        VerdictKind::NeedsRevision
                    },
                    confidence: 0.9,
                    run_id: "r".into(),
                })
                .collect(),
            refused: vec![],
            steward: None,
            patch_hash: None,
            task_hash: None,
            summary: String::new(),
        }
    }

    #[test]
    fn settled_when_no_vote_can_change_the_outcome() {
        let keys: Vec<PublicKey> = (0..4).map(|_| NodeKey::generate().public()).collect();
        let cfg = |min_nodes| ConsensusConfig {
            quorum: "2/3".parse().unwrap(),
            min_nodes,
            trusted: keys[..3].to_vec(),
            steward: None,
            patch_hash: None,
            task_hash: None,
            proposal_id: None,
        };
        let c = cfg(2);
        // Nobody answered yet.
        assert!(!settled(&report(&[], &c), &c));
        // One approval of three: the others could still go either way.
        assert!(!settled(&report(&[(keys[0], true)], &c), &c));
        // Two approvals: even a third rejection leaves 2 >= ceil(2/3 * 3).
        assert!(settled(
            &report(&[(keys[0], true), (keys[1], true)], &c),
            &c
        ));
        // Two rejections: one more approval cannot reach 2 of 3.
        assert!(settled(
            &report(&[(keys[0], false), (keys[1], false)], &c),
            &c
        ));
        // One of each: the third decides.
        assert!(!settled(
            &report(&[(keys[0], true), (keys[1], false)], &c),
            &c
        ));
        // A floor of 3 needs every node to approve: two approvals are not enough yet.
        let c3 = cfg(3);
        assert!(!settled(
            &report(&[(keys[0], true), (keys[1], true)], &c3),
            &c3
        ));
        assert!(settled(
            &report(&[(keys[0], true), (keys[1], false)], &c3),
            &c3
        ));
        // Everyone answered.
        let all = [(keys[0], true), (keys[1], true), (keys[2], true)];
        assert!(settled(&report(&all, &c3), &c3));

        // With a steward: the quorum met by every vote still waits for the steward's
        // approval; a quorum that failed does not.
        let mut cs = cfg(2);
        cs.steward = Some(keys[3]);
        let mut r = report(&all, &cs);
        r.approved = false;
        assert!(!settled(&r, &cs));
        r.approved = true;
        assert!(settled(&r, &cs));
        let none = [(keys[0], false), (keys[1], false), (keys[2], false)];
        assert!(settled(&report(&none, &cs), &cs));
        // Two approvals of three with one silent node: not settled without the steward.
        let mut r = report(&[(keys[0], true), (keys[1], true)], &cs);
        r.approved = false;
        assert!(!settled(&r, &cs));
    }
}
