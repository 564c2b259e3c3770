//! `fork verify`: checks a verdict bundle (layout in [`crate::verdict::bundle`]).
//!
//! In order: a trusted node key was given; the verdict envelope is a DSSE envelope whose
//! payload is an in-toto Statement v1 with the verdict predicate type, whose payloadType is
//! the one of the verdict's schema version ([`EnvelopeFormat`]:
//! `application/vnd.in-toto+json` from 1.4 on; a mix of formats is refused), and whose
//! signature verifies with the `successor_key` named in its predicate; the statement has
//! the subjects `patch`, `source` and `verdict.json` matching the verdict's
//! `patch_hash`, `source_hash` and verdict.json's sha256; verdict.json is the signed
//! predicate; the verdict passes the schema checks; the endorsement envelope (an
//! endorsement statement, in the same format) is signed by one of the trusted node keys
//! and binds this ephemeral key, run id, patch hash, task hash and statement (its predicate
//! and, from 1.4 on, its subject): the successor key is trusted only because that
//! endorsement names it; both envelopes are byte for byte in the form `fork` writes; every
//! listed artifact is a regular file with the listed size and sha256; and nothing unlisted
//! lies in `artifacts/` or in the bundle. Each failure is its own [`VerifyError`] variant.

use crate::fsx::{self, FsxError};
use crate::identity::PublicKey;
use crate::ioerr::{IoContext, IoError};
use crate::verdict::bundle::{
    ARTIFACTS_DIR, ENDORSEMENT_FILE, VERDICT_ENVELOPE_FILE, VERDICT_FILE, WITHHELD_FILE,
};
use crate::verdict::sign::{
    decode_base64_any, parse_endorsement, parse_statement, Endorsement, Envelope, EnvelopeFormat,
    EnvelopeSignature, SignError, Statement, LEGACY_ENDORSEMENT_PAYLOAD_TYPE,
    LEGACY_VERDICT_PAYLOAD_TYPE, PAYLOAD_TYPE, SUBJECT_PATCH, SUBJECT_SOURCE,
    SUBJECT_VERDICT_DOCUMENT, SUBJECT_VERDICT_STATEMENT, VERDICT_PREDICATE_TYPE,
};
use crate::verdict::{sha256_digest, Verdict};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::fs;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use thiserror::Error;

// The largest JSON file of a bundle that is read: the writer's limit too.
use super::bundle_limit::MAX_JSON_BYTES;

/// A bundle that passed every check.
#[derive(Debug, Clone)]
pub struct VerifiedVerdict {
    /// The bundle directory.
    pub dir: PathBuf,
    /// The verdict (as signed).
    pub verdict: Verdict,
    /// The run's ephemeral key that signed it.
    pub successor_key: PublicKey,
    /// The trusted node key that endorsed the ephemeral key.
    pub node_key: PublicKey,
    /// The endorsement.
    pub endorsement: Endorsement,
    /// `sha256:<hex>` of the signed statement.
    pub statement_sha256: String,
    /// The artifacts were withheld by the node that published the bundle (no `artifacts/`,
    /// an `artifacts.withheld` file): their hashes are signed, their contents unchecked.
    pub artifacts_withheld: bool,
}

/// Why a bundle failed verification. Each names what was wrong.
#[derive(Debug, Error)]
pub enum VerifyError {
    #[error("no trusted node key: pass --trust ed25519:<key> (the key in the signing node's node.pub), or create this node's key with `fork keygen`")]
    NoTrustedKeys,
    #[error("{path} is not a verdict bundle: pass the bundle directory or its {VERDICT_FILE}")]
    NotABundle { path: PathBuf },
    #[error("{path} is missing from the bundle")]
    Missing { path: PathBuf },
    #[error(transparent)]
    Io(IoError),
    #[error("{path} is malformed: {reason}")]
    Malformed { path: PathBuf, reason: String },
    #[error("{path} is not byte for byte as fork wrote it (edited or reformatted?)")]
    NotCanonical { path: PathBuf },
    #[error("{path} has payloadType `{found}`, expected `{expected}`")]
    PayloadType {
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error("{path} has payloadType `{found}`, but a schema {version} verdict's envelopes have `{expected}`: a bundle never mixes the in-toto format (schema 1.4 on) with the earlier one")]
    MixedFormat {
        path: PathBuf,
        found: String,
        expected: &'static str,
        version: String,
    },
    #[error("the verdict's successor_key is not a usable key: {reason}")]
    BadSuccessorKey { reason: String },
    #[error("the verdict envelope's signature does not verify with the successor key {key}: the verdict was altered or signed by another key")]
    VerdictSignature { key: String },
    #[error("the signed statement is not a fork verdict statement: {reason}")]
    Statement { reason: String },
    #[error(
        "the statement's subject `{subject}` has sha256 {signed}, but the verdict says {actual}"
    )]
    SubjectMismatch {
        subject: String,
        signed: String,
        actual: String,
    },
    #[error("{VERDICT_FILE} is not the signed verdict: {reason}")]
    DocumentMismatch { reason: String },
    #[error("the verdict fails the schema checks: {}", .0.join("; "))]
    Schema(Vec<String>),
    #[error("the endorsement is signed by {claimed}, which is not a trusted node key (trusted: {}): add it with --trust if you trust that node", .trusted.join(", "))]
    UntrustedNodeKey {
        claimed: String,
        trusted: Vec<String>,
    },
    #[error("the endorsement is not a fork endorsement statement: {reason}")]
    EndorsementStatement { reason: String },
    #[error("the endorsement's signature does not verify with the node key {key} it names")]
    EndorsementSignature { key: String },
    #[error("the endorsement does not match the verdict: it endorses {field} {endorsed}, the verdict has {actual}")]
    EndorsementMismatch {
        field: &'static str,
        endorsed: String,
        actual: String,
    },
    #[error("artifact {path} is listed in the verdict but missing")]
    ArtifactMissing { path: PathBuf },
    #[error("artifact {path} is not a regular file")]
    ArtifactNotRegular { path: PathBuf },
    #[error("artifact {path} is {actual} bytes, the verdict lists {listed}")]
    ArtifactSize {
        path: PathBuf,
        listed: u64,
        actual: u64,
    },
    #[error("artifact {path} has sha256 {actual}, the verdict lists {listed}")]
    ArtifactHash {
        path: PathBuf,
        listed: String,
        actual: String,
    },
    #[error("{path} is in artifacts/ but not listed in the verdict")]
    UnlistedArtifact { path: PathBuf },
    #[error("{path} does not belong in a verdict bundle")]
    UnexpectedFile { path: PathBuf },
}

/// A file of the bundle that is not there is `Missing` (the bundle is incomplete); any other
/// I/O failure is `Io`.
impl From<IoError> for VerifyError {
    fn from(e: IoError) -> VerifyError {
        if e.kind() == io::ErrorKind::NotFound {
            VerifyError::Missing { path: e.path }
        } else {
            VerifyError::Io(e)
        }
    }
}

fn malformed(path: &Path, reason: impl ToString) -> VerifyError {
    VerifyError::Malformed {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// The raw bytes of an envelope file, the envelope, and its payload bytes (NOT yet verified).
pub type ReadEnvelope = (Vec<u8>, Envelope, Vec<u8>);

/// Reads a DSSE envelope file (bounded) and checks that its payload type is one of
/// `payload_types`; the caller checks the signature (and which of the types it must be).
pub fn read_envelope(path: &Path, payload_types: &[&str]) -> Result<ReadEnvelope, VerifyError> {
    let bytes = read_json_file(path)?;
    let envelope: Envelope = serde_json::from_slice(&bytes).map_err(|e| malformed(path, e))?;
    if !payload_types.contains(&envelope.payload_type.as_str()) {
        return Err(VerifyError::PayloadType {
            path: path.to_path_buf(),
            found: envelope.payload_type,
            expected: payload_types.join("` or `"),
        });
    }
    let payload = envelope.payload_bytes().map_err(|e| malformed(path, e))?;
    Ok((bytes, envelope, payload))
}

/// The endorsement of the bundle in `dir` as it claims itself, NOT verified (call
/// [`verify_bundle`] to check it): for callers that need to know which node to trust before
/// they verify. Reads either format.
pub fn claimed_endorsement(dir: &Path) -> Result<Endorsement, VerifyError> {
    let path = dir.join(ENDORSEMENT_FILE);
    let (_, envelope, payload) =
        read_envelope(&path, &[PAYLOAD_TYPE, LEGACY_ENDORSEMENT_PAYLOAD_TYPE])?;
    let format = if envelope.payload_type == PAYLOAD_TYPE {
        EnvelopeFormat::InToto
    } else {
        EnvelopeFormat::Legacy
    };
    parse_endorsement(&payload, format)
        .map(|(e, _)| e)
        .map_err(|e| malformed(&path, e))
}

/// Requires the envelope at `path` to have the payloadType of `format` for a verdict of
/// schema `version`.
fn check_format(
    path: &Path,
    envelope: &Envelope,
    expected: &'static str,
    version: &str,
) -> Result<(), VerifyError> {
    if envelope.payload_type == expected {
        return Ok(());
    }
    Err(VerifyError::MixedFormat {
        path: path.to_path_buf(),
        found: envelope.payload_type.clone(),
        expected,
        version: version.to_string(),
    })
}

fn statement_reason(e: SignError) -> String {
    match e {
        SignError::Statement { reason, .. } => reason,
        other => other.to_string(),
    }
}

fn read_json_file(path: &Path) -> Result<Vec<u8>, VerifyError> {
    let f = crate::fsx::open_input(path).ctx("open", path)?;
    let mut bytes = Vec::new();
    f.take(MAX_JSON_BYTES + 1)
        .read_to_end(&mut bytes)
        .ctx("read", path)?;
    if bytes.len() as u64 > MAX_JSON_BYTES {
        return Err(malformed(path, "larger than 64 MiB"));
    }
    Ok(bytes)
}

/// The directory holding `path`: "." for a bare file name (`Path::new("verdict.json")
/// .parent()` is `Some("")`, not `None`, and `""` names no directory).
pub fn parent_dir(path: &Path) -> PathBuf {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// The bundle directory a command line names: the path itself, or the directory holding
/// it when it is a file (its verdict.json; see [`parent_dir`]). Looks nothing else up:
/// reading the bundle then says what is wrong with it. For `consensus`, `approve` and
/// `reverify`; [`verify_bundle`] is stricter (a file must be named verdict.json).
pub fn bundle_dir_of(path: &Path) -> PathBuf {
    if path.is_file() {
        parent_dir(path)
    } else {
        path.to_path_buf()
    }
}

/// The bundle directory for `path`: the directory itself, or the parent of its verdict.json.
fn bundle_dir(path: &Path) -> Result<PathBuf, VerifyError> {
    let meta = fs::metadata(path).ctx("open", path)?;
    if meta.is_dir() {
        return Ok(path.to_path_buf());
    }
    if path.file_name().is_some_and(|n| n == VERDICT_FILE) {
        return Ok(parent_dir(path));
    }
    Err(VerifyError::NotABundle {
        path: path.to_path_buf(),
    })
}

/// Requires `bytes` to be exactly the envelope `fork` writes for `env`, signed by `key`:
/// standard padded base64, the key's id as keyid, one signature, pretty JSON + newline.
fn check_canonical(
    path: &Path,
    bytes: &[u8],
    env: &Envelope,
    key: &PublicKey,
) -> Result<(), VerifyError> {
    let not_canonical = || VerifyError::NotCanonical {
        path: path.to_path_buf(),
    };
    if env.signatures.len() != 1 {
        return Err(not_canonical());
    }
    let payload = decode_base64_any(&env.payload).ok_or_else(not_canonical)?;
    let sig = decode_base64_any(&env.signatures[0].sig).ok_or_else(not_canonical)?;
    let canonical = Envelope {
        payload: STANDARD.encode(payload),
        payload_type: env.payload_type.clone(),
        signatures: vec![EnvelopeSignature {
            keyid: Some(key.key_id()),
            sig: STANDARD.encode(sig),
        }],
    };
    let expected = canonical.to_json_pretty().map_err(|e| malformed(path, e))?;
    if expected != bytes {
        return Err(not_canonical());
    }
    Ok(())
}

fn subject_digest(statement: &Statement<Verdict>, name: &str) -> Result<String, VerifyError> {
    let mut found = statement.subject.iter().filter(|s| s.name == name);
    let subject = found.next().ok_or_else(|| VerifyError::Statement {
        reason: format!("no subject named `{name}`"),
    })?;
    if found.next().is_some() {
        return Err(VerifyError::Statement {
            reason: format!("two subjects named `{name}`"),
        });
    }
    let hex = subject
        .digest
        .get("sha256")
        .filter(|h| crate::verdict::is_sha256_hex(h))
        .ok_or_else(|| VerifyError::Statement {
            reason: format!("subject `{name}` has no sha256 digest"),
        })?;
    Ok(format!("sha256:{hex}"))
}

/// Verifies the bundle at `path` (the bundle directory or its verdict.json) against the
/// trusted node keys. See the module docs for every check.
pub fn verify_bundle(path: &Path, trusted: &[PublicKey]) -> Result<VerifiedVerdict, VerifyError> {
    if trusted.is_empty() {
        return Err(VerifyError::NoTrustedKeys);
    }
    let dir = bundle_dir(path)?;

    // 1. The verdict envelope: a verdict statement (checked before anything in it is used,
    //    so an endorsement or an approval is never taken for a verdict), in the envelope
    //    format of its schema version, signed by the successor key its predicate names
    //    (trusted only once the endorsement, checked below, names that key).
    let env_path = dir.join(VERDICT_ENVELOPE_FILE);
    let (env_bytes, envelope, unverified) =
        read_envelope(&env_path, &[PAYLOAD_TYPE, LEGACY_VERDICT_PAYLOAD_TYPE])?;
    let statement: Statement<Verdict> = parse_statement(&unverified, VERDICT_PREDICATE_TYPE)
        .map_err(|e| match e {
            SignError::Statement { reason, .. } if reason.starts_with("its predicate") => {
                malformed(
                    &env_path,
                    format!("its payload is not a verdict statement: {reason}"),
                )
            }
            e => VerifyError::Statement {
                reason: statement_reason(e),
            },
        })?;
    let version = statement.predicate.header.schema.version.clone();
    let format = EnvelopeFormat::of_schema(&version);
    check_format(
        &env_path,
        &envelope,
        format.verdict_payload_type(),
        &version,
    )?;
    let successor_key =
        statement
            .predicate
            .successor_public_key()
            .map_err(|e| VerifyError::BadSuccessorKey {
                reason: e.to_string(),
            })?;
    let payload = envelope
        .verify(format.verdict_payload_type(), &successor_key)
        .map_err(|_| VerifyError::VerdictSignature {
            key: successor_key.to_string(),
        })?;
    check_canonical(&env_path, &env_bytes, &envelope, &successor_key)?;
    let statement_sha256 = sha256_digest(&payload);

    // 2. The statement's subjects.
    if statement.subject.len() != 3 {
        return Err(VerifyError::Statement {
            reason: format!(
                "{} subjects, expected patch, source and verdict.json",
                statement.subject.len()
            ),
        });
    }
    let verdict = &statement.predicate;
    for (name, actual) in [
        (SUBJECT_PATCH, &verdict.patch_hash),
        (SUBJECT_SOURCE, &verdict.source_hash),
    ] {
        let signed = subject_digest(&statement, name)?;
        if &signed != actual {
            return Err(VerifyError::SubjectMismatch {
                subject: name.to_string(),
                signed,
                actual: actual.clone(),
            });
        }
    }

    // 3. verdict.json is the signed document, byte for byte.
    let doc_path = dir.join(VERDICT_FILE);
    let doc_bytes = read_json_file(&doc_path)?;
    let signed_doc = subject_digest(&statement, SUBJECT_VERDICT_DOCUMENT)?;
    let actual_doc = sha256_digest(&doc_bytes);
    if signed_doc != actual_doc {
        return Err(VerifyError::DocumentMismatch {
            reason: format!("its sha256 is {actual_doc}, the signed statement says {signed_doc}"),
        });
    }
    let document = Verdict::from_json(&doc_bytes).map_err(|e| malformed(&doc_path, e))?;
    if &document != verdict {
        return Err(VerifyError::DocumentMismatch {
            reason: "its content differs from the signed predicate".to_string(),
        });
    }

    // 4. The schema.
    verdict.validate().map_err(VerifyError::Schema)?;

    // 5. The endorsement, by a trusted node key, binding this run, in the same format.
    let end_path = dir.join(ENDORSEMENT_FILE);
    let (end_bytes, end_env, end_unverified) =
        read_envelope(&end_path, &[PAYLOAD_TYPE, LEGACY_ENDORSEMENT_PAYLOAD_TYPE])?;
    check_format(
        &end_path,
        &end_env,
        format.endorsement_payload_type(),
        &version,
    )?;
    let (claimed, end_subjects) = parse_endorsement(&end_unverified, format).map_err(|e| {
        VerifyError::EndorsementStatement {
            reason: statement_reason(e),
        }
    })?;
    let node_key = trusted
        .iter()
        .find(|k| end_env.verify(format.endorsement_payload_type(), k).is_ok())
        .copied()
        .ok_or_else(|| {
            if trusted.contains(&claimed.node_key) {
                VerifyError::EndorsementSignature {
                    key: claimed.node_key.to_string(),
                }
            } else {
                VerifyError::UntrustedNodeKey {
                    claimed: claimed.node_key.to_string(),
                    trusted: trusted.iter().map(ToString::to_string).collect(),
                }
            }
        })?;
    check_canonical(&end_path, &end_bytes, &end_env, &node_key)?;
    let endorsement = claimed;
    let bind = |field: &'static str, endorsed: String, actual: String| {
        if endorsed == actual {
            Ok(())
        } else {
            Err(VerifyError::EndorsementMismatch {
                field,
                endorsed,
                actual,
            })
        }
    };
    bind(
        "node_key",
        endorsement.node_key.to_string(),
        node_key.to_string(),
    )?;
    bind(
        "ephemeral_key",
        endorsement.ephemeral_key.to_string(),
        successor_key.to_string(),
    )?;
    bind("run_id", endorsement.run_id.clone(), verdict.run_id.clone())?;
    bind(
        "patch_hash",
        endorsement.patch_hash.clone(),
        verdict.patch_hash.clone(),
    )?;
    bind(
        "task_hash",
        endorsement.task_hash.clone(),
        verdict.task_hash.clone(),
    )?;
    bind(
        "statement_sha256",
        endorsement.statement_sha256.clone(),
        statement_sha256.clone(),
    )?;
    if format == EnvelopeFormat::InToto {
        // Its one subject is the verdict statement this envelope signs.
        match end_subjects.as_slice() {
            [(name, Some(digest))] if name == SUBJECT_VERDICT_STATEMENT => {
                bind("subject", digest.clone(), statement_sha256.clone())?
            }
            _ => {
                return Err(VerifyError::EndorsementStatement {
                    reason: format!(
                        "expected one subject `{SUBJECT_VERDICT_STATEMENT}` with a sha256 digest"
                    ),
                })
            }
        }
    }

    // 6. Artifacts, and nothing else in the bundle.
    let artifacts_withheld = check_artifacts(&dir, verdict)?;

    Ok(VerifiedVerdict {
        dir,
        verdict: statement.predicate,
        successor_key,
        node_key,
        endorsement,
        statement_sha256,
        artifacts_withheld,
    })
}

/// Hashes the artifact `rel` (a listed `artifacts/<name>`) beneath the bundle directory
/// `root`, opened through [`fsx`]: no link followed in any component (so neither the file
/// nor `artifacts/` can be pointed elsewhere), regular files only (a FIFO is never waited
/// on), and never more than one byte past the listed size is read. Returns (bare hex
/// sha256, bytes read).
fn hash_artifact(
    root: &OwnedFd,
    rel: &str,
    listed: u64,
    path: &Path,
) -> Result<(String, u64), VerifyError> {
    let path = || path.to_path_buf();
    let opened = fsx::open_beneath(root, rel, listed).map_err(|e| match e {
        FsxError::Missing { .. } => VerifyError::ArtifactMissing { path: path() },
        FsxError::Symlink { .. } | FsxError::WrongType { .. } => {
            VerifyError::ArtifactNotRegular { path: path() }
        }
        FsxError::TooLarge { size, .. } => VerifyError::ArtifactSize {
            path: path(),
            listed,
            actual: size,
        },
        FsxError::BadPath { reason, .. } => malformed(&path(), reason),
        FsxError::Io { op, source, .. } => VerifyError::Io(IoError::new(op, &path(), source)),
    })?;
    if opened.size != listed {
        return Err(VerifyError::ArtifactSize {
            path: path(),
            listed,
            actual: opened.size,
        });
    }
    let mut f = opened.bounded();
    let mut h = Sha256::new();
    let mut buf = [0u8; crate::fsx::READ_BUF];
    let mut n_total = 0u64;
    loop {
        let n = f.read(&mut buf).ctx("read", &path())?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        n_total += n as u64;
    }
    Ok((hex::encode(h.finalize()), n_total))
}

/// Checks the artifacts; true when they were withheld (no `artifacts/` at all and an
/// `artifacts.withheld` regular file: a mesh node that publishes only its verdict).
fn check_artifacts(dir: &Path, verdict: &Verdict) -> Result<bool, VerifyError> {
    let art_dir = dir.join(ARTIFACTS_DIR);
    let withheld = fs::symlink_metadata(&art_dir).is_err()
        && fs::symlink_metadata(dir.join(WITHHELD_FILE)).is_ok_and(|m| m.is_file());
    // The bundle directory is the one the caller named (following a link to it is fine);
    // nothing beneath it is followed.
    let root = fsx::open_dir(dir, true).map_err(|e| match e {
        FsxError::Missing { .. } => VerifyError::Missing {
            path: dir.to_path_buf(),
        },
        FsxError::Io { op, source, .. } => VerifyError::Io(IoError::new(op, dir, source)),
        _ => VerifyError::NotABundle {
            path: dir.to_path_buf(),
        },
    })?;
    let mut listed = HashSet::new();
    for a in verdict.artifacts.iter().filter(|_| !withheld) {
        let path = dir.join(&a.path);
        listed.insert(path.clone());
        let (sha, bytes) = hash_artifact(&root, &a.path, a.bytes, &path)?;
        if bytes != a.bytes {
            return Err(VerifyError::ArtifactSize {
                path,
                listed: a.bytes,
                actual: bytes,
            });
        }
        if sha != a.sha256 {
            return Err(VerifyError::ArtifactHash {
                path,
                listed: a.sha256.clone(),
                actual: sha,
            });
        }
    }
    match fs::symlink_metadata(&art_dir) {
        Ok(m) if m.is_dir() => {
            for entry in fs::read_dir(&art_dir).ctx("read directory", &art_dir)? {
                let entry = entry.ctx("read directory", &art_dir)?;
                let p = entry.path();
                if !listed.contains(&p) {
                    return Err(VerifyError::UnlistedArtifact { path: p });
                }
            }
        }
        Ok(_) => return Err(VerifyError::UnexpectedFile { path: art_dir }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(IoError::new("stat", &art_dir, e).into()),
    }
    let allowed = [
        VERDICT_FILE,
        VERDICT_ENVELOPE_FILE,
        ENDORSEMENT_FILE,
        ARTIFACTS_DIR,
        WITHHELD_FILE,
    ];
    for entry in fs::read_dir(dir).ctx("read directory", dir)? {
        let entry = entry.ctx("read directory", dir)?;
        let name = entry.file_name();
        if allowed.iter().any(|a| name == *a) {
            continue;
        }
        // A steward's approval (`crate::mesh::approve`), added to the bundle after the run:
        // signed on its own and checked by consensus, so only its name and type matter here.
        let approval = name.to_str().is_some_and(is_steward_approval_name)
            && entry.file_type().is_ok_and(|t| t.is_file());
        if !approval {
            return Err(VerifyError::UnexpectedFile { path: entry.path() });
        }
    }
    Ok(withheld)
}

/// Whether `name` is `steward-<16 lowercase hex>.dsse.json`, a steward approval's file.
fn is_steward_approval_name(name: &str) -> bool {
    name.strip_prefix("steward-")
        .and_then(|rest| rest.strip_suffix(".dsse.json"))
        .is_some_and(|id| {
            id.len() == 16
                && id
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod tests;
