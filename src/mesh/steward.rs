//! The steward's approval over the mesh: `fork mesh approve PATCH --key STEWARD_KEY`.
//!
//! A steward reviews a patch, then runs `fork mesh approve` with it. The command reads the
//! nodes' verdict messages on `<prefix>.v1.verdicts.<proposal_id>` (one proposal given
//! with `--proposal`, or the first proposal of this patch it sees), writes each bundle
//! under `OUT/<proposal_id>/<node key id>-<n>/`, and approves (with
//! [`crate::mesh::approve::approve`], the same countersignature as `fork approve`) every
//! bundle that verifies against the steward's trusted node keys (as `fork verify` checks
//! it), says APPROVE, is about the reviewed patch and answers that proposal. Each approval
//! is published on the same subject as a [`StewardApprovalMessage`]; the proposer
//! (`fork mesh propose --steward KEY`) files it into the bundle it approves and counts it
//! in the steward gate. The command stops when every trusted node has answered the
//! proposal, or at `--timeout`.

use crate::identity::{NodeKey, PublicKey};
use crate::ioerr::IoContext;
use crate::mesh::approve::{approval_file_name, approve, check_approval};
use crate::mesh::messages::{
    check_proposal_id, decode_checked, new_header, parse_key, MeshError, MAX_PATCH_BYTES,
    VERDICT_MESSAGE_TYPE,
};
use crate::mesh::transport::Bus;
use crate::mesh::wire;
use crate::mesh::wire::decode_verdict_message_with;
use crate::verdict::bundle::VERDICT_FILE;
use crate::verdict::{sha256_digest, verify_bundle, Header, VerdictKind};
use async_nats::jetstream::consumer;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `header.message_type` of a steward's approval.
pub const STEWARD_APPROVAL_TYPE: &str = "StewardApproval";
/// The largest approval message.
pub const MAX_APPROVAL_MESSAGE_BYTES: usize = 256 << 10;

/// A steward's approval of one node's verdict bundle, published on
/// `<prefix>.v1.verdicts.<proposal_id>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StewardApprovalMessage {
    pub header: Header,
    pub proposal_id: String,
    /// The steward key that signed the approval, `ed25519:<base64>`.
    pub steward_key: String,
    /// The node whose bundle is approved (as the steward verified it).
    pub node_key: String,
    /// `sha256:<hex>` of that bundle's verdict.json: the bytes the approval binds.
    pub verdict_sha256: String,
    /// The approval file (`steward-<key id>.dsse.json`), standard base64.
    pub approval_b64: String,
}

/// Parses and checks an approval message received with NATS `headers`.
pub fn decode_approval_message(
    headers: Option<&async_nats::HeaderMap>,
    bytes: &[u8],
) -> Result<StewardApprovalMessage, MeshError> {
    wire::check_generation_header(headers)?;
    let m: StewardApprovalMessage = decode_checked(
        bytes,
        STEWARD_APPROVAL_TYPE,
        "steward approval",
        MAX_APPROVAL_MESSAGE_BYTES,
    )?;
    wire::check_headers(headers, &m.header)?;
    check_proposal_id(&m.proposal_id)?;
    let bad = |reason: String| MeshError::Malformed {
        what: "steward approval",
        reason,
    };
    for (field, k) in [("steward_key", &m.steward_key), ("node_key", &m.node_key)] {
        PublicKey::parse(k).map_err(|e| bad(format!("{field}: {e}")))?;
    }
    if !crate::verdict::is_sha256_digest(&m.verdict_sha256) {
        return Err(bad("verdict_sha256 is not sha256:<64 lowercase hex>".into()));
    }
    m.approval()?;
    Ok(m)
}

/// What became of a received approval ([`StewardApprovalMessage::file_into`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Filed {
    /// Written into this bundle, and it checks.
    Into(PathBuf),
    /// No received bundle has that verdict yet: try again when one arrives.
    Pending,
}

impl StewardApprovalMessage {
    /// The approval file's bytes.
    pub fn approval(&self) -> Result<Vec<u8>, MeshError> {
        STANDARD
            .decode(&self.approval_b64)
            .map_err(|e| MeshError::Malformed {
                what: "steward approval",
                reason: format!("approval_b64 is not standard base64: {e}"),
            })
    }

    /// Files the approval into the received bundle it approves (among `bundles`, the one
    /// whose verdict.json has `verdict_sha256`), as `steward-<key id>.dsse.json`, then
    /// checks it there with [`check_approval`]; one that does not check is removed again
    /// and refused with the reason. Only `steward`'s approvals are filed.
    pub fn file_into(&self, bundles: &[PathBuf], steward: &PublicKey) -> Result<Filed, String> {
        if self.steward_key != steward.to_string() {
            return Err(format!(
                "an approval by steward {}, not by the steward given with --steward ({steward}): ignored",
                self.steward_key
            ));
        }
        let bytes = self.approval().map_err(|e| e.to_string())?;
        let Some(dir) = bundles.iter().find(|b| {
            std::fs::read(b.join(VERDICT_FILE))
                .is_ok_and(|doc| sha256_digest(&doc) == self.verdict_sha256)
        }) else {
            return Ok(Filed::Pending);
        };
        let path = dir.join(approval_file_name(steward));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(&bytes));
        if let Err(e) = written {
            return Err(if e.kind() == std::io::ErrorKind::AlreadyExists {
                format!("duplicate: {} already holds an approval", path.display())
            } else {
                format!("cannot write {}: {e}", path.display())
            });
        }
        match check_approval(dir, steward) {
            Ok(c) if c.ok => Ok(Filed::Into(dir.clone())),
            other => {
                let _ = std::fs::remove_file(&path);
                Err(match other {
                    Ok(c) => c.detail,
                    Err(e) => e.to_string(),
                })
            }
        }
    }
}

/// What `fork mesh approve` is asked.
#[derive(Debug, Clone)]
pub struct StewardOptions {
    /// The patch the steward reviewed: only verdicts about it are approved.
    pub patch: PathBuf,
    /// The steward's private key (made with `fork keygen --out`).
    pub key: PathBuf,
    /// Node keys (or files) whose verdicts may be approved.
    pub trust: Vec<String>,
    /// The NATS server.
    pub nats: String,
    /// The proposal whose verdicts to approve (default: the first of this patch seen
    /// from now on).
    pub proposal: Option<String>,
    /// How long to wait for the verdicts.
    pub timeout: Duration,
    /// Where the received bundles (with the approvals) go (default: ./fork-mesh-approvals).
    pub out: Option<PathBuf>,
    /// Use the staging subjects.
    pub staging: bool,
}

/// One verdict message the steward did not approve.
#[derive(Debug, Clone, Serialize)]
pub struct NotApproved {
    pub sequence: u64,
    pub node_key: Option<String>,
    pub reason: String,
}

/// One approval the steward published.
#[derive(Debug, Clone, Serialize)]
pub struct Approved {
    pub node_key: String,
    #[serde(serialize_with = "crate::text::lossy_path")]
    pub bundle: PathBuf,
    pub verdict_sha256: String,
}

/// What `fork mesh approve` reports.
#[derive(Debug, Clone, Serialize)]
pub struct StewardReport {
    pub steward_key: String,
    pub patch_hash: String,
    pub proposal_id: Option<String>,
    pub approved: Vec<Approved>,
    pub not_approved: Vec<NotApproved>,
    pub timed_out: bool,
    pub elapsed_s: f64,
}

impl StewardReport {
    /// The report as human text, every field made safe for a terminal (a reason quotes
    /// what came over the bus).
    pub fn render(&self) -> String {
        use crate::text::safe_text as t;
        let mut out = format!(
            "steward {}  patch {}  proposal {}\n",
            t(&self.steward_key),
            t(&self.patch_hash),
            t(self.proposal_id.as_deref().unwrap_or("(none seen)"))
        );
        for a in &self.approved {
            out.push_str(&format!(
                "  approved the verdict of {} ({})\n",
                t(&a.node_key),
                t(&a.bundle.to_string_lossy())
            ));
        }
        for n in &self.not_approved {
            out.push_str(&format!(
                "  not approved #{} {}: {}\n",
                n.sequence,
                t(n.node_key.as_deref().unwrap_or("(unknown node)")),
                t(&n.reason)
            ));
        }
        out.push_str(&format!(
            "{} approval(s) published in {:.1}s{}\n",
            self.approved.len(),
            self.elapsed_s,
            if self.timed_out { " (timed out)" } else { "" }
        ));
        out
    }
}

/// Builds a runtime and runs [`approve_over_mesh`].
pub fn approve_blocking(opts: StewardOptions) -> Result<StewardReport, MeshError> {
    super::block_on(approve_over_mesh(opts))
}

/// The patch hash a verdict message's verdict.json claims (unverified: only to skip other
/// patches' verdicts early).
fn claimed_patch(files: &BTreeMap<String, String>) -> Option<String> {
    let doc = STANDARD.decode(files.get(VERDICT_FILE)?).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&doc).ok()?;
    Some(v.get("patch_hash")?.as_str()?.chars().take(80).collect())
}

/// Checks one received bundle and, when the steward may approve it, approves it.
fn approve_one(
    dir: &Path,
    steward: &NodeKey,
    trusted: &[PublicKey],
    patch_hash: &str,
    proposal_id: &str,
) -> Result<(PublicKey, String, Vec<u8>), String> {
    let verified = verify_bundle(dir, trusted).map_err(|e| format!("does not verify: {e}"))?;
    let v = &verified.verdict;
    if v.patch_hash != patch_hash {
        return Err(format!(
            "the verdict is about patch {}, not the reviewed {patch_hash}",
            v.patch_hash
        ));
    }
    if v.proposal_id.as_deref() != Some(proposal_id) {
        return Err(format!(
            "the verdict does not answer proposal {proposal_id} (a replay)"
        ));
    }
    if v.verdict != VerdictKind::Approve {
        return Err(format!(
            "its verdict is {}: a steward approves APPROVE verdicts only",
            v.verdict
        ));
    }
    let path = approve(dir, steward, trusted).map_err(|e| e.to_string())?;
    let file = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let doc = std::fs::read(dir.join(VERDICT_FILE)).map_err(|e| e.to_string())?;
    Ok((verified.node_key, sha256_digest(&doc), file))
}

/// Reads the nodes' verdicts, approves what the steward may, publishes each approval.
pub async fn approve_over_mesh(opts: StewardOptions) -> Result<StewardReport, MeshError> {
    let started = tokio::time::Instant::now();
    let deadline = started + opts.timeout;
    let read = crate::patch::read_patch_file(&opts.patch, MAX_PATCH_BYTES as u64)
        .map_err(|e| MeshError::Input(e.to_string()))?;
    if read.size > MAX_PATCH_BYTES as u64 {
        return Err(MeshError::TooLarge {
            what: format!("patch {}", opts.patch.display()),
            size: usize::try_from(read.size).unwrap_or(usize::MAX),
            limit: MAX_PATCH_BYTES,
        });
    }
    let patch_hash = sha256_digest(&read.bytes);
    let steward = crate::identity::load_node_key(&opts.key)
        .map_err(|e| MeshError::key_file(&e, format!("--key {}: {e}", opts.key.display())))?;
    let mut trusted = Vec::new();
    for t in &opts.trust {
        let k = parse_key("--trust", t)?;
        if !trusted.contains(&k) {
            trusted.push(k);
        }
    }
    if trusted.is_empty() {
        return Err(MeshError::Usage(
            "no trusted node key: pass --trust ed25519:<key> for each node whose verdict the steward may approve".into(),
        ));
    }
    if let Some(id) = &opts.proposal {
        check_proposal_id(id).map_err(|e| MeshError::Usage(format!("--proposal: {e}")))?;
    }
    let out = opts
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("fork-mesh-approvals"));

    let bus = Bus::connect(
        &opts.nats,
        "fork-steward",
        opts.staging,
        Some(opts.timeout.min(crate::mesh::transport::CONNECT_GIVE_UP)),
    )
    .await?;
    let (_, verdicts) = bus.ensure_streams().await?;
    let (subject, deliver) = match &opts.proposal {
        Some(id) => (bus.subjects.verdicts(id), consumer::DeliverPolicy::All),
        None => (bus.subjects.all_verdicts(), consumer::DeliverPolicy::New),
    };
    let nats_err = |e: String| MeshError::Nats {
        action: format!("read {subject}"),
        reason: e,
    };
    let mut incoming = verdicts
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: subject.clone(),
            deliver_policy: deliver,
            ..Default::default()
        })
        .await
        .map_err(|e| nats_err(e.to_string()))?
        .messages()
        .await
        .map_err(|e| nats_err(e.to_string()))?;
    say!(
        "fork mesh: steward {} waiting up to {} for verdicts on {subject}",
        steward.public(),
        humantime::format_duration(opts.timeout)
    );

    let mut target = opts.proposal.clone();
    let mut answered: HashSet<PublicKey> = HashSet::new();
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    let mut approved = Vec::new();
    let mut not_approved = Vec::new();
    let mut timed_out = false;
    while target.is_none() || !trusted.iter().all(|k| answered.contains(k)) {
        let next = match tokio::time::timeout_at(deadline, incoming.next()).await {
            Err(_) => {
                timed_out = true;
                break;
            }
            Ok(None) => return Err(nats_err("the consumer ended".into())),
            Ok(Some(Err(e))) => {
                say!("fork mesh: reading verdicts: {e}; going on");
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
            Ok(Some(Ok(m))) => m,
        };
        // Routed by header: approvals (this steward's own among them) are not verdicts.
        let kind = wire::message_type(next.headers.as_ref());
        if kind.is_some_and(|k| k != VERDICT_MESSAGE_TYPE) {
            continue;
        }
        let sequence = next.info().map(|i| i.stream_sequence).unwrap_or(0);
        let mut refuse = |node_key: Option<String>, reason: String| {
            say!("fork mesh: not approved: verdict message #{sequence}: {reason}");
            not_approved.push(NotApproved {
                sequence,
                node_key,
                reason,
            });
        };
        let m = match decode_verdict_message_with(next.headers.as_ref(), &next.payload) {
            Ok(m) => m,
            Err(e) => {
                refuse(None, e.to_string());
                continue;
            }
        };
        if target.as_ref().is_some_and(|t| *t != m.proposal_id) {
            continue;
        }
        let Ok(node) = m.node_public_key() else {
            continue;
        };
        // Another patch's verdict (another proposer's, on the shared subject) is not even
        // written down.
        if let Some(other) = claimed_patch(&m.files).filter(|h| *h != patch_hash) {
            refuse(
                Some(m.node_key.clone()),
                format!("the verdict is about patch {other}, not the reviewed {patch_hash}"),
            );
            continue;
        }
        let n = per_node
            .entry(m.proposal_id.clone() + &node.key_id())
            .or_insert(0);
        *n += 1;
        let dir = out
            .join(&m.proposal_id)
            .join(format!("{}-{n}", node.key_id()));
        if let Err(e) = crate::mesh::messages::write_bundle_files(&dir, &m.files) {
            refuse(Some(m.node_key.clone()), e.to_string());
            continue;
        }
        let (node_key, verdict_sha256, file) =
            match approve_one(&dir, &steward, &trusted, &patch_hash, &m.proposal_id) {
                Ok(x) => x,
                Err(reason) => {
                    if target.is_some() && trusted.contains(&node) {
                        answered.insert(node);
                    }
                    refuse(Some(m.node_key.clone()), reason);
                    continue;
                }
            };
        // The first approved verdict fixes the proposal, when none was given.
        target.get_or_insert_with(|| m.proposal_id.clone());
        answered.insert(node_key);
        let msg = StewardApprovalMessage {
            header: new_header(STEWARD_APPROVAL_TYPE),
            proposal_id: m.proposal_id.clone(),
            steward_key: steward.public().to_string(),
            node_key: node_key.to_string(),
            verdict_sha256: verdict_sha256.clone(),
            approval_b64: STANDARD.encode(&file),
        };
        let bytes = serde_json::to_vec(&msg)
            .map_err(|e| MeshError::Internal(format!("encoding an approval: {e}")))?;
        let scope = format!(
            "{}-steward-{}-{}",
            m.proposal_id,
            steward.public().key_id(),
            &verdict_sha256["sha256:".len().."sha256:".len() + 16]
        );
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        bus.publish_retrying(
            bus.subjects.verdicts(&m.proposal_id),
            bytes,
            &msg.header,
            &scope,
            remaining.max(Duration::from_secs(5)),
        )
        .await?;
        say!(
            "fork mesh: approved the verdict of {node_key} on proposal {}",
            m.proposal_id
        );
        approved.push(Approved {
            node_key: node_key.to_string(),
            bundle: dir,
            verdict_sha256,
        });
    }
    std::fs::create_dir_all(&out).ctx("create directory", &out)?;
    Ok(StewardReport {
        steward_key: steward.public().to_string(),
        patch_hash,
        proposal_id: target,
        approved,
        not_approved,
        timed_out,
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::approve::tests::{bundle, verdict};

    fn message(dir: &Path, steward: &NodeKey, node: &NodeKey) -> StewardApprovalMessage {
        let path = approve(dir, steward, &[node.public()]).unwrap();
        let file = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        StewardApprovalMessage {
            header: new_header(STEWARD_APPROVAL_TYPE),
            proposal_id: uuid::Uuid::new_v4().to_string(),
            steward_key: steward.public().to_string(),
            node_key: node.public().to_string(),
            verdict_sha256: sha256_digest(&std::fs::read(dir.join(VERDICT_FILE)).unwrap()),
            approval_b64: STANDARD.encode(file),
        }
    }

    #[test]
    fn approvals_are_filed_into_the_bundle_they_approve_and_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let node = NodeKey::generate();
        let steward = NodeKey::generate();
        let a = bundle(
            tmp.path(),
            "a",
            &verdict(VerdictKind::Approve, "run-a", "p", "t"),
            &node,
        );
        let b = bundle(
            tmp.path(),
            "b",
            &verdict(VerdictKind::Approve, "run-b", "p", "t"),
            &node,
        );
        let m = message(&a, &steward, &node);
        let bytes = serde_json::to_vec(&m).unwrap();
        let h = wire::headers(&m.header, "x");
        assert_eq!(decode_approval_message(Some(&h), &bytes).unwrap(), m);
        // Headers that disagree with the body are refused by name.
        let mut wrong = h.clone();
        wrong.insert(wire::MESSAGE_TYPE_HEADER, VERDICT_MESSAGE_TYPE);
        let e = decode_approval_message(Some(&wrong), &bytes).unwrap_err();
        assert!(matches!(e, MeshError::HeaderMismatch { .. }), "{e}");

        // Before its bundle arrived: pending; another steward's: refused.
        assert_eq!(
            m.file_into(std::slice::from_ref(&b), &steward.public()),
            Ok(Filed::Pending)
        );
        let other = NodeKey::generate();
        assert!(m
            .file_into(std::slice::from_ref(&a), &other.public())
            .is_err());
        let both = [b.clone(), a.clone()];
        assert_eq!(
            m.file_into(&both, &steward.public()),
            Ok(Filed::Into(a.clone()))
        );
        assert!(check_approval(&a, &steward.public()).unwrap().ok);
        let again = m.file_into(&both, &steward.public()).unwrap_err();
        assert!(again.contains("duplicate"), "{again}");

        // An approval of bundle a claimed for bundle b: refused, and nothing left behind.
        let mut moved = m.clone();
        moved.verdict_sha256 = sha256_digest(&std::fs::read(b.join(VERDICT_FILE)).unwrap());
        let e = moved.file_into(&both, &steward.public()).unwrap_err();
        assert!(e.contains("verdict_sha256"), "{e}");
        assert!(!b.join(approval_file_name(&steward.public())).exists());
    }
}
