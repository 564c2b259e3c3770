//! The mesh's wire format (README, "The mesh: re-verification over NATS"): one NATS bus, namespaced subjects, and a schema header
//! on every message.
//!
//! ```text
//! <prefix>.v1.proposals.<runtime>       Proposal        (a patch to re-verify)
//! <prefix>.v1.verdicts.<proposal_id>    VerdictMessage  (one node's signed verdict bundle)
//!                                       StewardApproval (a steward's approval of one of them,
//!                                                        see crate::mesh::steward)
//! ```
//! `<runtime>` is the runtime's name (fork.toml `[runtime] name`), which must be one subject
//! token ([`crate::mesh::wire::check_runtime_token`]): a node subscribes to its runtime's
//! proposals only. Every message also carries its type and schema in NATS headers
//! ([`crate::mesh::wire`]).
//! The prefix is `fork`, or `fork-staging` for experimental schemas (`--staging`): nodes on
//! one prefix never see the other's messages.
//!
//! Every message starts with the verdict's header (`schema.generation`, `schema.version`,
//! `message_type`, `message_id`, `timestamp`). A message of another schema generation is
//! refused before its body is read, with an error that names both generations; any `1.x`
//! version is read (minor versions only add fields, which this code ignores).
//!
//! Limits: a patch of at most [`MAX_PATCH_BYTES`], a proposal message of at most
//! [`MAX_PROPOSAL_MESSAGE_BYTES`], a verdict message of at most
//! [`MAX_VERDICT_MESSAGE_BYTES`] and [`MAX_BUNDLE_FILES`] files. A received bundle is
//! written to disk only under the names a bundle may hold: `verdict.json`,
//! `verdict.dsse.json`, `endorsement.dsse.json`, steward approvals
//! (`steward-<key id>.dsse.json`, see [`crate::mesh::approve`]) and
//! `artifacts/<plain name>`.

use crate::identity::PublicKey;
use crate::ioerr::{IoContext, IoError};
use crate::mesh::approve::is_approval_file_name;
use crate::verdict::bundle::{
    ARTIFACTS_DIR, ENDORSEMENT_FILE, VERDICT_ENVELOPE_FILE, VERDICT_FILE,
};
use crate::verdict::{now_rfc3339, Header, SchemaId, SCHEMA_GENERATION, SCHEMA_VERSION};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};
use thiserror::Error;

/// `header.message_type` of a proposal.
pub const PROPOSAL_TYPE: &str = "Proposal";
/// `header.message_type` of a verdict message.
pub const VERDICT_MESSAGE_TYPE: &str = "VerdictMessage";
/// The largest patch a proposal may carry (decoded).
pub const MAX_PATCH_BYTES: usize = 1 << 20;
/// The largest proposal message (the base64 patch plus room for the rest).
pub const MAX_PROPOSAL_MESSAGE_BYTES: usize = MAX_PATCH_BYTES / 3 * 4 + (64 << 10);
/// The largest verdict message.
pub const MAX_VERDICT_MESSAGE_BYTES: usize = 8 << 20;
/// The most files a verdict bundle may hold.
pub const MAX_BUNDLE_FILES: usize = 256;
/// The subject prefix of the mesh.
pub const PREFIX: &str = "fork";
/// The subject prefix of the staging mesh (experimental schemas).
pub const STAGING_PREFIX: &str = "fork-staging";

/// Everything that can go wrong in the mesh. Each message names what was wrong and the fix.
#[derive(Debug, Error)]
pub enum MeshError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Input(String),
    #[error("cannot reach the NATS server at {url}: {reason} (is nats-server running with JetStream on, `nats-server -js`?)")]
    Connect { url: String, reason: String },
    #[error("NATS: cannot {action}: {reason}")]
    Nats { action: String, reason: String },
    #[error("{message_type} message of schema generation {generation}: this node reads generation {SCHEMA_GENERATION} only; upgrade fork on this node, or send generation {SCHEMA_GENERATION} messages (experimental schemas belong on the staging prefix, --staging)")]
    UnknownGeneration {
        message_type: String,
        generation: u64,
    },
    #[error("bad message header: {0}")]
    BadHeader(String),
    #[error("NATS header {header} is {}, but the body's header says `{in_body}`: refused (a message says the same in both)", shown(.in_header))]
    HeaderMismatch {
        header: &'static str,
        in_header: Option<String>,
        in_body: String,
    },
    #[error("malformed {what}: {reason}")]
    Malformed { what: &'static str, reason: String },
    #[error("{what} is {size} bytes, more than the limit of {limit} bytes")]
    TooLarge {
        what: String,
        size: usize,
        limit: usize,
    },
    #[error("the patch's sha256 is {actual}, but the proposal claims {claimed}: refused (corrupted or forged proposal)")]
    PatchHash { claimed: String, actual: String },
    #[error("the proposal is for runtime `{proposed}`, this node serves `{local}` (fork.toml [runtime] name)")]
    RuntimeMismatch { proposed: String, local: String },
    #[error("bundle file name `{0}` refused: only verdict.json, verdict.dsse.json, endorsement.dsse.json, steward-<key id>.dsse.json and artifacts/<plain name> may be written")]
    BadFileName(String),
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("evaluation failed: {0}")]
    Evaluate(Box<crate::evaluation::EvaluateError>),
    #[error("{0}")]
    Internal(String),
    #[error("interrupted")]
    Interrupted,
}

fn shown(h: &Option<String>) -> String {
    match h {
        Some(h) => format!("`{h}`"),
        None => "missing".to_string(),
    }
}

impl MeshError {
    /// A `--key` file that could not be loaded, said as `message`: not a regular file is
    /// bad input, anything else the flag's (see
    /// [`crate::identity::IdentityError::is_bad_input`]).
    pub fn key_file(e: &crate::identity::IdentityError, message: String) -> MeshError {
        if e.is_bad_input() {
            MeshError::Input(message)
        } else {
            MeshError::Usage(message)
        }
    }

    /// A failure that may go away by itself (an internal error of the evaluation): the
    /// proposal is delivered again rather than refused.
    pub fn is_transient(&self) -> bool {
        matches!(self, MeshError::Evaluate(e) if matches!(**e, crate::evaluation::EvaluateError::Internal(_)))
    }
}

/// The subjects and streams of one mesh (production or staging).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subjects {
    prefix: &'static str,
}

impl Subjects {
    /// `fork`, or `fork-staging` with `staging`.
    pub fn new(staging: bool) -> Subjects {
        Subjects {
            prefix: if staging { STAGING_PREFIX } else { PREFIX },
        }
    }
    pub fn prefix(&self) -> &str {
        self.prefix
    }
    /// `<prefix>.v1.proposals.<runtime>`: the proposals for one runtime (`runtime` is a
    /// subject token, see [`crate::mesh::wire::check_runtime_token`]).
    pub fn proposals(&self, runtime: &str) -> String {
        format!("{}.v1.proposals.{runtime}", self.prefix)
    }
    /// `<prefix>.v1.proposals.>` (every runtime's proposals: the stream's subject).
    pub fn all_proposals(&self) -> String {
        format!("{}.v1.proposals.>", self.prefix)
    }
    /// `<prefix>.v1.verdicts.<proposal_id>`.
    pub fn verdicts(&self, proposal_id: &str) -> String {
        format!("{}.v1.verdicts.{proposal_id}", self.prefix)
    }
    /// `<prefix>.v1.verdicts.>` (every proposal's verdicts).
    pub fn all_verdicts(&self) -> String {
        format!("{}.v1.verdicts.>", self.prefix)
    }
    /// The JetStream stream of proposals: `FORK_PROPOSALS` (`FORK_STAGING_PROPOSALS`).
    pub fn proposals_stream(&self) -> String {
        format!("{}_PROPOSALS", self.stream_base())
    }
    /// The JetStream stream of verdicts: `FORK_VERDICTS` (`FORK_STAGING_VERDICTS`).
    pub fn verdicts_stream(&self) -> String {
        format!("{}_VERDICTS", self.stream_base())
    }
    fn stream_base(&self) -> String {
        self.prefix.to_ascii_uppercase().replace('-', "_")
    }
}

/// A fresh header of `message_type`: current schema, a v4 UUID, the time now.
pub fn new_header(message_type: &str) -> Header {
    Header {
        schema: SchemaId {
            generation: SCHEMA_GENERATION,
            version: SCHEMA_VERSION.to_string(),
        },
        message_type: message_type.to_string(),
        message_id: uuid::Uuid::new_v4().to_string(),
        timestamp: now_rfc3339(),
    }
}

/// Checks a header: the schema generation this code reads (else
/// [`MeshError::UnknownGeneration`]), a `1.x` version, the expected message type, a UUID
/// message id and an RFC 3339 timestamp.
pub fn check_header(h: &Header, expected_type: &str) -> Result<(), MeshError> {
    if h.schema.generation != SCHEMA_GENERATION {
        return Err(MeshError::UnknownGeneration {
            message_type: h.message_type.clone(),
            generation: u64::from(h.schema.generation),
        });
    }
    let major = SCHEMA_VERSION.split('.').next().unwrap_or("1");
    let ok_version = h.schema.version.split_once('.').is_some_and(|(m, minor)| {
        m == major && !minor.is_empty() && minor.bytes().all(|b| b.is_ascii_digit())
    });
    if !ok_version {
        return Err(MeshError::BadHeader(format!(
            "schema version `{}` is not {major}.x",
            h.schema.version
        )));
    }
    if h.message_type != expected_type {
        return Err(MeshError::BadHeader(format!(
            "message_type is `{}`, expected `{expected_type}`",
            h.message_type
        )));
    }
    if uuid::Uuid::parse_str(&h.message_id).is_err() {
        return Err(MeshError::BadHeader(format!(
            "message_id `{}` is not a UUID",
            h.message_id.chars().take(64).collect::<String>()
        )));
    }
    if humantime::parse_rfc3339_weak(&h.timestamp).is_err() {
        return Err(MeshError::BadHeader(format!(
            "timestamp `{}` is not RFC 3339",
            h.timestamp.chars().take(64).collect::<String>()
        )));
    }
    Ok(())
}

/// Budget overrides a proposer asks for (the `--wall 10m` spellings). Advisory: the
/// node's policy governs what it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProposalBudget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_cost: Option<String>,
}

/// A patch to re-verify, published on `<prefix>.v1.proposals.<runtime>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    pub header: Header,
    /// A v4 UUID; the verdicts come back on `<prefix>.v1.verdicts.<proposal_id>`, and each
    /// verdict signs it.
    pub proposal_id: String,
    /// The patch, standard base64.
    pub patch_b64: String,
    /// `sha256:<hex>` of the decoded patch.
    pub patch_hash: String,
    /// The task to run (default: the runtime's first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// The runtime's name in fork.toml; nodes serving another runtime refuse the proposal.
    pub runtime: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<ProposalBudget>,
    /// After this time (RFC 3339) nobody collects the answers: nodes skip the proposal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

impl Proposal {
    /// A new proposal of `patch` (checked against [`MAX_PATCH_BYTES`]).
    pub fn new(
        patch: &[u8],
        runtime: &str,
        task: Option<String>,
        ttl: Option<Duration>,
    ) -> Result<Proposal, MeshError> {
        if patch.len() > MAX_PATCH_BYTES {
            return Err(MeshError::TooLarge {
                what: "the patch".into(),
                size: patch.len(),
                limit: MAX_PATCH_BYTES,
            });
        }
        Ok(Proposal {
            header: new_header(PROPOSAL_TYPE),
            proposal_id: uuid::Uuid::new_v4().to_string(),
            patch_b64: STANDARD.encode(patch),
            patch_hash: crate::verdict::sha256_digest(patch),
            task,
            runtime: runtime.to_string(),
            budget: None,
            expires_at: ttl
                .map(|t| humantime::format_rfc3339_millis(SystemTime::now() + t).to_string()),
        })
    }

    /// The decoded patch, checked: size limit, base64, and its sha256 equal to `patch_hash`.
    pub fn patch(&self) -> Result<Vec<u8>, MeshError> {
        if self.patch_b64.len() > MAX_PATCH_BYTES.div_ceil(3) * 4 {
            return Err(MeshError::TooLarge {
                what: "the proposal's patch".into(),
                size: self.patch_b64.len() / 4 * 3,
                limit: MAX_PATCH_BYTES,
            });
        }
        let patch = STANDARD
            .decode(&self.patch_b64)
            .map_err(|e| MeshError::Malformed {
                what: "proposal",
                reason: format!("patch_b64 is not standard base64: {e}"),
            })?;
        if patch.len() > MAX_PATCH_BYTES {
            return Err(MeshError::TooLarge {
                what: "the proposal's patch".into(),
                size: patch.len(),
                limit: MAX_PATCH_BYTES,
            });
        }
        let actual = crate::verdict::sha256_digest(&patch);
        if actual != self.patch_hash {
            return Err(MeshError::PatchHash {
                claimed: self.patch_hash.chars().take(80).collect(),
                actual,
            });
        }
        Ok(patch)
    }

    /// Whether the proposal's `expires_at` has passed (an unreadable one counts as passed).
    pub fn expired(&self, now: SystemTime) -> bool {
        match &self.expires_at {
            None => false,
            Some(t) => humantime::parse_rfc3339_weak(t).map_or(true, |t| t < now),
        }
    }

    pub fn to_json(&self) -> Result<Vec<u8>, MeshError> {
        serde_json::to_vec(self)
            .map_err(|e| MeshError::Internal(format!("encoding a proposal: {e}")))
    }
}

/// One node's answer, published on `<prefix>.v1.verdicts.<proposal_id>`: its whole signed
/// verdict bundle, file by file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerdictMessage {
    pub header: Header,
    pub proposal_id: String,
    /// The node key that endorsed the verdict (as the node claims it; the endorsement in
    /// the bundle is what proves it), `ed25519:<base64>`.
    pub node_key: String,
    /// Bundle-relative file name → standard base64 of its bytes.
    pub files: BTreeMap<String, String>,
}

impl VerdictMessage {
    /// The message for the bundle in `dir`.
    /// With `publish` [`Publish::Verdict`](crate::policy::Publish), the artifacts stay
    /// on the node: the message carries the verdict, its envelope, the endorsement (and
    /// steward approvals) and an `artifacts.withheld` note instead.
    pub fn from_bundle(
        proposal_id: &str,
        node_key: &PublicKey,
        dir: &Path,
        publish: crate::policy::Publish,
    ) -> Result<VerdictMessage, MeshError> {
        let mut files = read_bundle_files(dir)?;
        if publish == crate::policy::Publish::Verdict {
            files.retain(|name, _| !name.starts_with("artifacts/"));
            files.insert(
                crate::verdict::bundle::WITHHELD_FILE.to_string(),
                STANDARD.encode(b"artifacts withheld by the publishing node's policy ([mesh] publish = \"verdict\"); their sha256 are in the signed verdict\n"),
            );
        }
        Ok(VerdictMessage {
            header: new_header(VERDICT_MESSAGE_TYPE),
            proposal_id: proposal_id.to_string(),
            node_key: node_key.to_string(),
            files,
        })
    }

    /// Encodes the message, refusing one over [`MAX_VERDICT_MESSAGE_BYTES`].
    pub fn to_json(&self) -> Result<Vec<u8>, MeshError> {
        let bytes = serde_json::to_vec(self)
            .map_err(|e| MeshError::Internal(format!("encoding a verdict message: {e}")))?;
        if bytes.len() > MAX_VERDICT_MESSAGE_BYTES {
            return Err(MeshError::TooLarge {
                what: "the verdict message".into(),
                size: bytes.len(),
                limit: MAX_VERDICT_MESSAGE_BYTES,
            });
        }
        Ok(bytes)
    }

    /// The claimed node key, parsed.
    pub fn node_public_key(&self) -> Result<PublicKey, MeshError> {
        PublicKey::parse(&self.node_key).map_err(|e| MeshError::Malformed {
            what: "verdict message",
            reason: format!("node_key: {e}"),
        })
    }
}

/// Reads the header of a message before anything else, so that a message of another
/// generation is refused as such (its body may not even parse as this generation's).
pub(crate) fn decode_checked<T: for<'de> Deserialize<'de>>(
    bytes: &[u8],
    expected_type: &str,
    what: &'static str,
    limit: usize,
) -> Result<T, MeshError> {
    if bytes.len() > limit {
        return Err(MeshError::TooLarge {
            what: format!("the {what} message"),
            size: bytes.len(),
            limit,
        });
    }
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| MeshError::Malformed {
            what,
            reason: format!("not JSON: {e}"),
        })?;
    let header = value.get("header").ok_or_else(|| MeshError::Malformed {
        what,
        reason: "no `header`".into(),
    })?;
    // The generation first, whatever else the header holds.
    if let Some(g) = header
        .get("schema")
        .and_then(|s| s.get("generation"))
        .and_then(|g| g.as_u64())
    {
        if g != u64::from(SCHEMA_GENERATION) {
            return Err(MeshError::UnknownGeneration {
                message_type: header
                    .get("message_type")
                    .and_then(|t| t.as_str())
                    .unwrap_or(expected_type)
                    .chars()
                    .take(64)
                    .collect(),
                generation: g,
            });
        }
    }
    let h: Header = serde_json::from_value(header.clone()).map_err(|e| MeshError::Malformed {
        what,
        reason: format!("header: {e}"),
    })?;
    check_header(&h, expected_type)?;
    serde_json::from_value(value).map_err(|e| MeshError::Malformed {
        what,
        reason: e.to_string(),
    })
}

/// Parses and checks a proposal message: size, header, ids, hash spelling. (The patch
/// itself is checked by [`Proposal::patch`].)
pub fn decode_proposal(bytes: &[u8]) -> Result<Proposal, MeshError> {
    let p: Proposal = decode_checked(bytes, PROPOSAL_TYPE, "proposal", MAX_PROPOSAL_MESSAGE_BYTES)?;
    check_proposal_id(&p.proposal_id)?;
    if !crate::verdict::is_sha256_digest(&p.patch_hash) {
        return Err(MeshError::Malformed {
            what: "proposal",
            reason: "patch_hash is not sha256:<64 lowercase hex>".into(),
        });
    }
    Ok(p)
}

/// Parses and checks a verdict message: size, header, ids, file names, base64.
pub fn decode_verdict_message(bytes: &[u8]) -> Result<VerdictMessage, MeshError> {
    let m: VerdictMessage = decode_checked(
        bytes,
        VERDICT_MESSAGE_TYPE,
        "verdict",
        MAX_VERDICT_MESSAGE_BYTES,
    )?;
    check_proposal_id(&m.proposal_id)?;
    m.node_public_key()?;
    if m.files.len() > MAX_BUNDLE_FILES {
        return Err(MeshError::TooLarge {
            what: "the bundle's file count".into(),
            size: m.files.len(),
            limit: MAX_BUNDLE_FILES,
        });
    }
    for name in m.files.keys() {
        if !is_valid_bundle_file(name) {
            return Err(MeshError::BadFileName(name.chars().take(128).collect()));
        }
    }
    Ok(m)
}

/// A key given on the command line, or the file holding it.
pub(crate) fn parse_key(flag: &str, s: &str) -> Result<crate::identity::PublicKey, MeshError> {
    crate::identity::public_key_arg(s).map_err(|e| {
        MeshError::Usage(format!(
            "{flag} {}: {e}",
            s.chars().take(80).collect::<String>()
        ))
    })
}

/// A proposal id is a UUID (so it is one safe subject token and one safe directory name).
pub fn check_proposal_id(id: &str) -> Result<(), MeshError> {
    match uuid::Uuid::parse_str(id) {
        Ok(u) if u.hyphenated().to_string() == id => Ok(()),
        _ => Err(MeshError::Malformed {
            what: "message",
            reason: format!(
                "proposal_id `{}` is not a lowercase hyphenated UUID",
                id.chars().take(64).collect::<String>()
            ),
        }),
    }
}

/// Whether `name` may be written in a received bundle: one of the three top files, a
/// steward's approval, or `artifacts/<plain name>` (so never absolute, never `..`, never
/// a nested path).
pub fn is_valid_bundle_file(name: &str) -> bool {
    matches!(
        name,
        VERDICT_FILE | VERDICT_ENVELOPE_FILE | ENDORSEMENT_FILE
    ) || name == crate::verdict::bundle::WITHHELD_FILE
        || is_approval_file_name(name)
        || crate::verdict::is_valid_artifact_path(name)
}

/// Reads a bundle directory into `name → base64`: the three top files, any steward
/// approvals, and every regular file in `artifacts/` (anything else there, or a symlink,
/// is an error).
pub fn read_bundle_files(dir: &Path) -> Result<BTreeMap<String, String>, MeshError> {
    let mut files = BTreeMap::new();
    let mut total = 0usize;
    let mut add = |name: String, path: &Path| -> Result<(), MeshError> {
        let meta = std::fs::symlink_metadata(path).ctx("read", path)?;
        if !meta.is_file() {
            return Err(MeshError::Input(format!(
                "{} is not a regular file: a verdict bundle holds regular files only",
                path.display()
            )));
        }
        let mut bytes = Vec::new();
        // Checked again on the descriptor: a file swapped for a FIFO is never waited on.
        crate::fsx::open_input(path)
            .and_then(|f| {
                f.take(MAX_VERDICT_MESSAGE_BYTES as u64 + 1)
                    .read_to_end(&mut bytes)
            })
            .ctx("read", path)?;
        total += bytes.len();
        if total > MAX_VERDICT_MESSAGE_BYTES {
            return Err(MeshError::TooLarge {
                what: format!("the bundle {}", dir.display()),
                size: total,
                limit: MAX_VERDICT_MESSAGE_BYTES,
            });
        }
        files.insert(name, STANDARD.encode(&bytes));
        Ok(())
    };
    for top in [VERDICT_FILE, VERDICT_ENVELOPE_FILE, ENDORSEMENT_FILE] {
        add(top.to_string(), &dir.join(top))?;
    }
    let mut approvals = Vec::new();
    for e in std::fs::read_dir(dir).ctx("list", dir)? {
        let name = e
            .ctx("list", dir)?
            .file_name()
            .to_string_lossy()
            .into_owned();
        if is_approval_file_name(&name) {
            approvals.push(name);
        }
    }
    approvals.sort();
    for name in approvals {
        let path = dir.join(&name);
        add(name, &path)?;
    }
    // A bundle received from a node that withheld its artifacts keeps saying so.
    let withheld = dir.join(crate::verdict::bundle::WITHHELD_FILE);
    if std::fs::symlink_metadata(&withheld).is_ok() {
        add(crate::verdict::bundle::WITHHELD_FILE.to_string(), &withheld)?;
    }
    let art = dir.join(ARTIFACTS_DIR);
    match std::fs::read_dir(&art) {
        Ok(rd) => {
            let mut names = Vec::new();
            for e in rd {
                let e = e.ctx("list", &art)?;
                names.push(e.file_name().to_string_lossy().into_owned());
            }
            names.sort();
            if names.len() > MAX_BUNDLE_FILES {
                return Err(MeshError::TooLarge {
                    what: format!("the file count of {}", art.display()),
                    size: names.len(),
                    limit: MAX_BUNDLE_FILES,
                });
            }
            for n in names {
                let rel = format!("{ARTIFACTS_DIR}/{n}");
                if !is_valid_bundle_file(&rel) {
                    return Err(MeshError::BadFileName(rel));
                }
                add(rel, &art.join(&n))?;
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(IoError::new("list", &art, e).into()),
    }
    Ok(files)
}

/// Writes a received bundle to `dir`, which must not exist (its parent is created). Every
/// name is checked with [`is_valid_bundle_file`] and every content decoded before anything
/// is written; files are created new, never through an existing path.
pub fn write_bundle_files(dir: &Path, files: &BTreeMap<String, String>) -> Result<(), MeshError> {
    if files.len() > MAX_BUNDLE_FILES {
        return Err(MeshError::TooLarge {
            what: "the bundle's file count".into(),
            size: files.len(),
            limit: MAX_BUNDLE_FILES,
        });
    }
    let mut decoded = Vec::with_capacity(files.len());
    let mut total = 0usize;
    for (name, b64) in files {
        if !is_valid_bundle_file(name) {
            return Err(MeshError::BadFileName(name.chars().take(128).collect()));
        }
        let bytes = STANDARD.decode(b64).map_err(|e| MeshError::Malformed {
            what: "verdict",
            reason: format!("file {name} is not standard base64: {e}"),
        })?;
        total += bytes.len();
        if total > MAX_VERDICT_MESSAGE_BYTES {
            return Err(MeshError::TooLarge {
                what: "the bundle".into(),
                size: total,
                limit: MAX_VERDICT_MESSAGE_BYTES,
            });
        }
        decoded.push((name.as_str(), bytes));
    }
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).ctx("create directory", parent)?;
    }
    // Private to the invoking user (0700/0600, set explicitly whatever the umask).
    let mut builder = std::fs::DirBuilder::new();
    builder.mode(0o700);
    let private_dir = |d: &Path| {
        builder.create(d).ctx("create directory", d)?;
        std::fs::set_permissions(
            d,
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o700),
        )
        .ctx("set permissions on", d)
    };
    private_dir(dir)?;
    if decoded.iter().any(|(n, _)| n.starts_with("artifacts/")) {
        private_dir(&dir.join(ARTIFACTS_DIR))?;
    }
    for (name, bytes) in decoded {
        let path = dir.join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .ctx("create", &path)?;
        f.set_permissions(
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
        )
        .ctx("set permissions on", &path)?;
        f.write_all(&bytes).ctx("write", &path)?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "messages_tests.rs"]
mod tests;
