//! The human gate: a positive verdict never deploys by itself (a human steward countersigns it). A
//! steward, a person holding their own long-term key, approves one verified APPROVE bundle
//! with [`approve`], which writes `<bundle>/steward-<keyid>.dsse.json`: a DSSE envelope
//! (payloadType [`APPROVAL_PAYLOAD_TYPE`], the in-toto one) over an in-toto Statement v1
//! whose `predicateType` is [`APPROVAL_PREDICATE_TYPE`], whose one subject is the bundle's
//! `verdict.json` (its sha256) and whose predicate is an [`Approval`], signed by the steward
//! key. Approvals written before schema 1.4 ([`LEGACY_APPROVAL_PAYLOAD_TYPE`] over a bare
//! [`LegacyApproval`]) are still checked, on bundles of before 1.4 only.
//!
//! The approval binds the exact bytes of the bundle's `verdict.json` (`verdict_sha256`),
//! and through them the run, patch, task and proposal; [`check_approval`] checks the
//! signature, that binding, and that the patch, task and run it names are the verdict's.
//! An approval is written once: an existing one is never replaced.
//!
//! `verify_bundle` accepts these files at the top of a bundle (their names only: it does
//! not check them; consensus does).

use crate::identity::{NodeKey, PublicKey};
use crate::ioerr::{IoContext, IoError};
use crate::verdict::bundle::VERDICT_FILE;
use crate::verdict::sign::{
    parse_statement, Envelope, EnvelopeFormat, SignError, Statement, Subject, PAYLOAD_TYPE,
    STATEMENT_TYPE,
};
use crate::verdict::{sha256_digest, verify_bundle, Verdict, VerdictKind, VerifyError};
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// payloadType of a steward approval envelope: the in-toto one, as for every envelope.
pub const APPROVAL_PAYLOAD_TYPE: &str = PAYLOAD_TYPE;
/// `predicateType` of an approval statement.
pub const APPROVAL_PREDICATE_TYPE: &str = "https://fork.dev/approval/v1";
/// Subject name, in an approval statement, of the bundle's verdict.json.
pub const SUBJECT_VERDICT_DOCUMENT: &str = crate::verdict::sign::SUBJECT_VERDICT_DOCUMENT;
/// payloadType of an approval written before schema 1.4 (still checked).
pub const LEGACY_APPROVAL_PAYLOAD_TYPE: &str = "application/vnd.fork.approval+json";
/// `_type` of a [`LegacyApproval`].
pub const LEGACY_APPROVAL_TYPE: &str = "fork.approval/v1";
/// Prefix of an approval's file name (`steward-<keyid>.dsse.json`).
pub const APPROVAL_FILE_PREFIX: &str = "steward-";
/// Suffix of an approval's file name.
pub const APPROVAL_FILE_SUFFIX: &str = ".dsse.json";

/// Largest approval or verdict.json read.
const MAX_READ_BYTES: u64 = 64 << 20;

/// What a steward signs: the predicate of an approval statement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    pub patch_hash: String,
    pub task_hash: String,
    pub run_id: String,
    /// `sha256:<hex>` of the bundle's verdict.json bytes.
    pub verdict_sha256: String,
    /// The approving steward's key.
    pub steward_key: PublicKey,
    /// RFC 3339, UTC.
    pub timestamp: String,
}

/// An approval as written before schema 1.4: a bare document with a `_type`, in an envelope
/// of [`LEGACY_APPROVAL_PAYLOAD_TYPE`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LegacyApproval {
    /// [`LEGACY_APPROVAL_TYPE`].
    #[serde(rename = "_type")]
    pub approval_type: String,
    pub patch_hash: String,
    pub task_hash: String,
    pub run_id: String,
    pub verdict_sha256: String,
    pub steward_key: PublicKey,
    pub timestamp: String,
}

/// The approval statement of `approval` (its subject: verdict.json's digest).
pub fn approval_statement(approval: &Approval) -> Statement<Approval> {
    let hex = approval
        .verdict_sha256
        .strip_prefix("sha256:")
        .unwrap_or(&approval.verdict_sha256);
    Statement {
        statement_type: STATEMENT_TYPE.to_string(),
        subject: vec![Subject::sha256(SUBJECT_VERDICT_DOCUMENT, hex)],
        predicate_type: APPROVAL_PREDICATE_TYPE.to_string(),
        predicate: approval.clone(),
    }
}

/// The outcome of checking a steward's approval of one bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StewardCheck {
    /// The steward key, `ed25519:<base64>`.
    pub steward_key: String,
    /// The bundle checked (none when consensus had no approving bundle to check).
    #[serde(serialize_with = "crate::text::lossy_opt_path")]
    pub bundle: Option<PathBuf>,
    /// Whether a valid approval by that key binds that bundle.
    pub ok: bool,
    /// What was found, or why the approval does not count.
    pub detail: String,
}

/// Why an approval could not be written or checked.
#[derive(Debug, Error)]
pub enum ApproveError {
    #[error("cannot approve {path}: the bundle does not verify: {source}")]
    Verify {
        path: PathBuf,
        #[source]
        source: VerifyError,
    },
    #[error(
        "cannot approve {path}: its verdict is {verdict}; a steward approves APPROVE verdicts only"
    )]
    NotApprove { path: PathBuf, verdict: VerdictKind },
    #[error(
        "{path} already exists: an approval is never overwritten (remove it first if it is wrong)"
    )]
    Exists { path: PathBuf },
    #[error("cannot sign the approval: {0}")]
    Sign(#[from] SignError),
    #[error(transparent)]
    Io(#[from] IoError),
}

/// `steward-<keyid>.dsse.json`, the file name of `steward`'s approval.
pub fn approval_file_name(steward: &PublicKey) -> String {
    format!(
        "{APPROVAL_FILE_PREFIX}{}{APPROVAL_FILE_SUFFIX}",
        steward.key_id()
    )
}

/// Whether `name` is an approval's file name: `steward-<16 lowercase hex>.dsse.json`.
pub fn is_approval_file_name(name: &str) -> bool {
    name.strip_prefix(APPROVAL_FILE_PREFIX)
        .and_then(|rest| rest.strip_suffix(APPROVAL_FILE_SUFFIX))
        .is_some_and(|id| {
            id.len() == 16
                && id
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

/// The bundle directory for `path` (the directory, or the parent of its verdict.json).
fn bundle_dir(path: &Path) -> PathBuf {
    if path.file_name().is_some_and(|n| n == VERDICT_FILE) && !path.is_dir() {
        match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        }
    } else {
        path.to_path_buf()
    }
}

/// Reads at most [`MAX_READ_BYTES`] of `path` (a regular file, opened without blocking:
/// a FIFO is refused, never waited on); `Ok(None)` when it does not exist.
fn read_limited(path: &Path) -> Result<Option<Vec<u8>>, ApproveError> {
    let f = match crate::fsx::open_input(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(IoError::new("open", path, e).into()),
    };
    let mut bytes = Vec::new();
    f.take(MAX_READ_BYTES + 1)
        .read_to_end(&mut bytes)
        .ctx("read", path)?;
    if bytes.len() as u64 > MAX_READ_BYTES {
        return Err(IoError::new(
            "read",
            path,
            io::Error::new(io::ErrorKind::InvalidData, "larger than 64 MiB"),
        )
        .into());
    }
    Ok(Some(bytes))
}

/// The steward's approval of the bundle at `bundle` (its directory or verdict.json).
///
/// The bundle must verify against `trusted_nodes` and say APPROVE. Writes
/// `<bundle>/steward-<keyid>.dsse.json` (never replacing an existing file: it is written
/// aside and hard-linked into place) and returns its path.
pub fn approve(
    bundle: &Path,
    steward: &NodeKey,
    trusted_nodes: &[PublicKey],
) -> Result<PathBuf, ApproveError> {
    let verified = verify_bundle(bundle, trusted_nodes).map_err(|source| ApproveError::Verify {
        path: bundle.to_path_buf(),
        source,
    })?;
    let v = &verified.verdict;
    if v.verdict != VerdictKind::Approve {
        return Err(ApproveError::NotApprove {
            path: bundle.to_path_buf(),
            verdict: v.verdict,
        });
    }
    let dir = verified.dir.clone();
    let key = steward.public();
    let dest = dir.join(approval_file_name(&key));
    if fs::symlink_metadata(&dest).is_ok() {
        return Err(ApproveError::Exists { path: dest });
    }
    // verify_bundle checked these bytes; it is the file the approval binds.
    let doc_path = dir.join(VERDICT_FILE);
    let document = read_limited(&doc_path)?
        .ok_or_else(|| IoError::new("read", &doc_path, io::Error::from(io::ErrorKind::NotFound)))?;
    if Verdict::from_json(&document).ok().as_ref() != Some(v) {
        // Changed between verification and now: approve nothing.
        return Err(ApproveError::Verify {
            path: bundle.to_path_buf(),
            source: VerifyError::DocumentMismatch {
                reason: "verdict.json changed while it was being approved".to_string(),
            },
        });
    }
    let approval = Approval {
        patch_hash: v.patch_hash.clone(),
        task_hash: v.task_hash.clone(),
        run_id: v.run_id.clone(),
        verdict_sha256: sha256_digest(&document),
        steward_key: key,
        timestamp: crate::verdict::now_rfc3339(),
    };
    let payload = serde_json::to_vec(&approval_statement(&approval)).map_err(|source| {
        SignError::Serialize {
            what: "approval",
            source,
        }
    })?;
    let envelope = Envelope::sign(APPROVAL_PAYLOAD_TYPE, &payload, steward);
    let bytes = envelope.to_json_pretty()?;

    let mut tmp = tempfile::Builder::new()
        .prefix(".steward-")
        .suffix(".partial")
        .tempfile_in(&dir)
        .ctx("create a temporary file in", &dir)?;
    tmp.write_all(&bytes)
        .and_then(|_| {
            tmp.as_file()
                .set_permissions(fs::Permissions::from_mode(0o600))
        })
        .and_then(|_| tmp.as_file().sync_all())
        .ctx("write", tmp.path())?;
    match tmp.persist_noclobber(&dest) {
        Ok(_) => {}
        Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => {
            return Err(ApproveError::Exists { path: dest })
        }
        Err(e) => return Err(IoError::new("write", &dest, e.error).into()),
    }
    fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .ctx("sync directory", &dir)?;
    Ok(dest)
}

/// Checks `steward`'s approval of the bundle at `bundle` (its directory or verdict.json):
/// the file `steward-<keyid>.dsse.json` exists, is a DSSE envelope of
/// [`APPROVAL_PAYLOAD_TYPE`] signed by `steward`, names `steward`, and binds this bundle's
/// verdict.json bytes, run, patch and task.
///
/// Does not verify the bundle itself: call `verify_bundle` first (consensus does). A
/// missing or invalid approval is `Ok` with `ok: false` and the reason; `Err` is an I/O
/// failure or a bundle without a readable verdict.json.
pub fn check_approval(bundle: &Path, steward: &PublicKey) -> Result<StewardCheck, ApproveError> {
    let dir = bundle_dir(bundle);
    let path = dir.join(approval_file_name(steward));
    let check = |ok: bool, detail: String| StewardCheck {
        steward_key: steward.to_string(),
        bundle: Some(dir.clone()),
        ok,
        detail,
    };
    let doc_path = dir.join(VERDICT_FILE);
    let document = read_limited(&doc_path)?
        .ok_or_else(|| IoError::new("read", &doc_path, io::Error::from(io::ErrorKind::NotFound)))?;
    let meta = match fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(check(
                false,
                format!(
                    "no approval by steward {steward}: {} is missing (the steward runs the approve command on this bundle)",
                    path.display()
                ),
            ))
        }
        Err(e) => return Err(IoError::new("stat", &path, e).into()),
    };
    if !meta.file_type().is_file() {
        return Ok(check(
            false,
            format!("{} is not a regular file", path.display()),
        ));
    }
    let Some(bytes) = read_limited(&path)? else {
        return Ok(check(false, format!("{} vanished", path.display())));
    };
    let envelope: Envelope = match serde_json::from_slice(&bytes) {
        Ok(e) => e,
        Err(e) => {
            return Ok(check(
                false,
                format!("{} is not a DSSE envelope: {e}", path.display()),
            ))
        }
    };
    let legacy = match envelope.payload_type.as_str() {
        APPROVAL_PAYLOAD_TYPE => false,
        LEGACY_APPROVAL_PAYLOAD_TYPE => true,
        other => {
            return Ok(check(
                false,
                format!(
                    "{} has payloadType `{other}`, expected `{APPROVAL_PAYLOAD_TYPE}`",
                    path.display()
                ),
            ))
        }
    };
    let payload = match envelope.verify(&envelope.payload_type, steward) {
        Ok(p) => p,
        Err(e) => {
            return Ok(check(
                false,
                format!("{}: {e} (forged, or signed by another key)", path.display()),
            ))
        }
    };
    let verdict = match Verdict::from_json(&document) {
        Ok(v) => v,
        Err(e) => {
            return Ok(check(
                false,
                format!("{} is not a verdict: {e}", doc_path.display()),
            ))
        }
    };
    let parsed = if legacy {
        read_legacy(&payload, &verdict)
    } else {
        read_statement(&payload)
    };
    let (approval, subject) = match parsed {
        Ok(a) => a,
        Err(why) => return Ok(check(false, format!("{}: {why}", path.display()))),
    };
    let digest = sha256_digest(&document);
    let mismatches: Vec<String> = [
        ("subject verdict.json", subject.as_str(), &digest),
        (
            "steward_key",
            &approval.steward_key.to_string(),
            &steward.to_string(),
        ),
        ("verdict_sha256", &approval.verdict_sha256, &digest),
        ("run_id", &approval.run_id, &verdict.run_id),
        ("patch_hash", &approval.patch_hash, &verdict.patch_hash),
        ("task_hash", &approval.task_hash, &verdict.task_hash),
    ]
    .into_iter()
    .filter(|(_, signed, actual)| signed != actual)
    .map(|(field, signed, actual)| format!("it approves {field} {signed}, the bundle has {actual}"))
    .collect();
    if !mismatches.is_empty() {
        return Ok(check(
            false,
            format!(
                "{} is not an approval of this bundle: {}",
                path.display(),
                mismatches.join("; ")
            ),
        ));
    }
    Ok(check(
        true,
        format!(
            "approved by steward {steward} at {} (run {}, patch {})",
            approval.timestamp, approval.run_id, approval.patch_hash
        ),
    ))
}

/// An approval statement's approval and its subject's digest (`sha256:<hex>`).
fn read_statement(payload: &[u8]) -> Result<(Approval, String), String> {
    let st: Statement<Approval> = parse_statement(payload, APPROVAL_PREDICATE_TYPE)
        .map_err(|e| format!("not a steward approval: {e}"))?;
    match st.subject.as_slice() {
        [s] if s.name == SUBJECT_VERDICT_DOCUMENT => match s.digest.get("sha256") {
            Some(hex) => Ok((st.predicate, format!("sha256:{hex}"))),
            None => Err("its subject has no sha256 digest".to_string()),
        },
        _ => Err(format!(
            "not a steward approval: expected one subject `{SUBJECT_VERDICT_DOCUMENT}`"
        )),
    }
}

/// An approval of before schema 1.4, for a verdict of before 1.4 only (a bundle never mixes
/// formats).
fn read_legacy(payload: &[u8], verdict: &Verdict) -> Result<(Approval, String), String> {
    let version = &verdict.header.schema.version;
    if EnvelopeFormat::of_schema(version) != EnvelopeFormat::Legacy {
        return Err(format!(
            "payloadType `{LEGACY_APPROVAL_PAYLOAD_TYPE}` (the format of before schema 1.4) on a schema {version} verdict: a bundle never mixes formats"
        ));
    }
    let a: LegacyApproval =
        serde_json::from_slice(payload).map_err(|e| format!("does not carry an approval: {e}"))?;
    if a.approval_type != LEGACY_APPROVAL_TYPE {
        return Err(format!(
            "its _type is `{}`, expected `{LEGACY_APPROVAL_TYPE}`",
            a.approval_type
        ));
    }
    let subject = a.verdict_sha256.clone();
    Ok((
        Approval {
            patch_hash: a.patch_hash,
            task_hash: a.task_hash,
            run_id: a.run_id,
            verdict_sha256: a.verdict_sha256,
            steward_key: a.steward_key,
            timestamp: a.timestamp,
        },
        subject,
    ))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::identity::EphemeralKey;
    use crate::verdict::bundle::write_bundle;
    use crate::verdict::{BudgetReport, BudgetUsed, Header, TestCounts, Verdict, VerdictKind};

    /// A valid verdict of `kind` for `patch` and `task`, run `run_id`.
    pub(crate) fn verdict(kind: VerdictKind, run_id: &str, patch: &str, task: &str) -> Verdict {
        Verdict {
            header: Header::new(),
            verdict: kind,
            confidence: 0.9,
            patch_hash: sha256_digest(patch.as_bytes()),
            task_hash: sha256_digest(task.as_bytes()),
            state_hash: sha256_digest(b"state"),
            source_hash: sha256_digest(b"source"),
            patched_tree_hash: None,
            evaluation_summary: format!("{kind} from {run_id}"),
            caveats: vec![],
            tests: TestCounts {
                passed: 3,
                failed: u64::from(kind != VerdictKind::Approve),
                flaky: 0,
                skipped: 0,
            },
            metrics: vec![],
            budget: BudgetReport {
                limits: Default::default(),
                used: BudgetUsed::default(),
                exceeded: None,
            },
            isolation: serde_json::json!({"userns": true}),
            artifacts: vec![],
            successor_key: String::new(),
            run_id: run_id.to_string(),
            task: "tests".to_string(),
            patch_gate: None,
            proposal_id: None,
            provenance: None,
            plan: vec![crate::verdict::plan::TaskVerdict {
                task: "tests".to_string(),
                task_hash: sha256_digest(task.as_bytes()),
                verdict: Some(kind),
                confidence: Some(0.9),
                summary: format!("{kind} from {run_id}"),
                provenance: None,
                tests: TestCounts::default(),
                metrics: vec![],
                budget: None,
            }],
        }
    }

    /// Writes a signed bundle of `v` endorsed by `node` at `dir/<name>` (one artifact).
    pub(crate) fn bundle(dir: &Path, name: &str, v: &Verdict, node: &NodeKey) -> PathBuf {
        let out = dir.join(name);
        let report = dir.join(format!("{name}-tests.xml"));
        fs::write(&report, format!("<testsuite name=\"{name}\"/>\n")).unwrap();
        let eph = EphemeralKey::generate();
        write_bundle(
            &out,
            v,
            &[(crate::verdict::ArtifactType::TestReport, report)],
            &eph,
            node,
        )
        .unwrap();
        eph.destroy();
        out
    }

    #[test]
    fn approve_then_check_and_the_bundle_still_verifies() {
        let tmp = tempfile::tempdir().unwrap();
        let node = NodeKey::generate();
        let steward = NodeKey::generate();
        let b = bundle(
            tmp.path(),
            "run-a",
            &verdict(VerdictKind::Approve, "run-a", "p", "t"),
            &node,
        );
        let before = check_approval(&b, &steward.public()).unwrap();
        assert!(!before.ok);
        assert!(before.detail.contains("missing"), "{}", before.detail);

        let path = approve(&b.join(VERDICT_FILE), &steward, &[node.public()]).unwrap();
        assert_eq!(path, b.join(approval_file_name(&steward.public())));
        assert!(is_approval_file_name(
            path.file_name().unwrap().to_str().unwrap()
        ));
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // No temporary file left behind.
        let names: Vec<String> = fs::read_dir(&b)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 5, "{names:?}");
        // The approval is a file at the top of the bundle; verify_bundle still accepts it.
        let verified = verify_bundle(&b, &[node.public()]).unwrap();
        assert_eq!(verified.verdict.run_id, "run-a");

        let ok = check_approval(&b, &steward.public()).unwrap();
        assert!(ok.ok, "{}", ok.detail);
        assert_eq!(ok.bundle.as_deref(), Some(b.as_path()));
        // The envelope is what the docs say.
        let env: Envelope = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(env.payload_type, APPROVAL_PAYLOAD_TYPE);
        let st: Statement<Approval> = serde_json::from_slice(
            &env.verify(APPROVAL_PAYLOAD_TYPE, &steward.public())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(st.statement_type, STATEMENT_TYPE);
        assert_eq!(st.predicate_type, APPROVAL_PREDICATE_TYPE);
        assert_eq!(st.subject.len(), 1);
        assert_eq!(st.subject[0].name, "verdict.json");
        let a = st.predicate;
        assert_eq!(
            format!("sha256:{}", st.subject[0].digest["sha256"]),
            a.verdict_sha256
        );
        assert_eq!(
            a.verdict_sha256,
            sha256_digest(&fs::read(b.join(VERDICT_FILE)).unwrap())
        );
        assert_eq!(a.patch_hash, verified.verdict.patch_hash);
        assert_eq!(a.task_hash, verified.verdict.task_hash);

        // Another key's check does not see it.
        let other = NodeKey::generate();
        assert!(!check_approval(&b, &other.public()).unwrap().ok);
        // Never overwritten.
        let saved = fs::read(&path).unwrap();
        let err = approve(&b, &steward, &[node.public()]).unwrap_err();
        assert!(matches!(err, ApproveError::Exists { .. }), "{err}");
        assert_eq!(fs::read(&path).unwrap(), saved);
        // A second steward can approve too, and the bundle still verifies.
        approve(&b, &other, &[node.public()]).unwrap();
        verify_bundle(&b, &[node.public()]).unwrap();
        assert!(check_approval(&b, &other.public()).unwrap().ok);
    }

    #[test]
    fn approve_refuses_what_it_must() {
        let tmp = tempfile::tempdir().unwrap();
        let node = NodeKey::generate();
        let steward = NodeKey::generate();
        let nr = bundle(
            tmp.path(),
            "run-nr",
            &verdict(VerdictKind::NeedsRevision, "run-nr", "p", "t"),
            &node,
        );
        let err = approve(&nr, &steward, &[node.public()]).unwrap_err();
        assert!(matches!(err, ApproveError::NotApprove { .. }), "{err}");
        assert!(err.to_string().contains("NEEDS_REVISION"), "{err}");

        let ok = bundle(
            tmp.path(),
            "run-ok",
            &verdict(VerdictKind::Approve, "run-ok", "p", "t"),
            &node,
        );
        // Untrusted node: refused.
        let err = approve(&ok, &steward, &[steward.public()]).unwrap_err();
        assert!(
            matches!(
                err,
                ApproveError::Verify {
                    source: VerifyError::UntrustedNodeKey { .. },
                    ..
                }
            ),
            "{err}"
        );
        // Tampered: refused, and nothing written.
        let doc = ok.join(VERDICT_FILE);
        let original = fs::read(&doc).unwrap();
        let mut bytes = original.clone();
        let i = bytes.len() / 2;
        bytes[i] ^= 0x01;
        fs::write(&doc, &bytes).unwrap();
        let err = approve(&ok, &steward, &[node.public()]).unwrap_err();
        assert!(matches!(err, ApproveError::Verify { .. }), "{err}");
        assert!(!ok.join(approval_file_name(&steward.public())).exists());
        fs::write(&doc, &original).unwrap();
        approve(&ok, &steward, &[node.public()]).unwrap();
    }

    #[test]
    fn forged_or_moved_approvals_fail_the_check() {
        let tmp = tempfile::tempdir().unwrap();
        let node = NodeKey::generate();
        let steward = NodeKey::generate();
        let a = bundle(
            tmp.path(),
            "run-a",
            &verdict(VerdictKind::Approve, "run-a", "p", "t"),
            &node,
        );
        let b = bundle(
            tmp.path(),
            "run-b",
            &verdict(VerdictKind::Approve, "run-b", "p", "t"),
            &node,
        );
        let name = approval_file_name(&steward.public());

        // Signed by another key but filed under the steward's name.
        let forger = NodeKey::generate();
        let forged = approve(&a, &forger, &[node.public()]).unwrap();
        fs::rename(&forged, a.join(&name)).unwrap();
        let c = check_approval(&a, &steward.public()).unwrap();
        assert!(!c.ok);
        assert!(c.detail.contains("forged"), "{}", c.detail);
        fs::remove_file(a.join(&name)).unwrap();

        // The steward's real approval of bundle b, copied into bundle a.
        approve(&b, &steward, &[node.public()]).unwrap();
        assert!(check_approval(&b, &steward.public()).unwrap().ok);
        fs::copy(b.join(&name), a.join(&name)).unwrap();
        let c = check_approval(&a, &steward.public()).unwrap();
        assert!(!c.ok);
        assert!(c.detail.contains("verdict_sha256"), "{}", c.detail);
        assert!(c.detail.contains("run_id"), "{}", c.detail);

        // A re-encoded payload with a changed field: the signature no longer verifies.
        let mut env: Envelope = serde_json::from_slice(&fs::read(b.join(&name)).unwrap()).unwrap();
        let mut approval: Statement<Approval> =
            serde_json::from_slice(&env.payload_bytes().unwrap()).unwrap();
        approval.predicate.run_id = "run-a".into();
        use base64::Engine as _;
        env.payload = base64::engine::general_purpose::STANDARD
            .encode(serde_json::to_vec(&approval).unwrap());
        fs::write(a.join(&name), env.to_json_pretty().unwrap()).unwrap();
        assert!(!check_approval(&a, &steward.public()).unwrap().ok);

        // Garbage and a directory are refusals, not errors.
        fs::write(a.join(&name), b"{not json").unwrap();
        assert!(!check_approval(&a, &steward.public()).unwrap().ok);
        fs::remove_file(a.join(&name)).unwrap();
        fs::create_dir(a.join(&name)).unwrap();
        assert!(!check_approval(&a, &steward.public()).unwrap().ok);
    }

    /// Writes `payload` signed by `steward` as `payload_type` where its approval goes.
    fn write_signed(b: &Path, steward: &NodeKey, payload_type: &str, payload: &[u8]) {
        let env = Envelope::sign(payload_type, payload, steward);
        fs::write(
            b.join(approval_file_name(&steward.public())),
            env.to_json_pretty().unwrap(),
        )
        .unwrap();
    }

    fn legacy_approval(b: &Path, steward: &NodeKey) -> Vec<u8> {
        let doc = fs::read(b.join(VERDICT_FILE)).unwrap();
        let v = Verdict::from_json(&doc).unwrap();
        serde_json::to_vec(&LegacyApproval {
            approval_type: LEGACY_APPROVAL_TYPE.into(),
            patch_hash: v.patch_hash,
            task_hash: v.task_hash,
            run_id: v.run_id,
            verdict_sha256: sha256_digest(&doc),
            steward_key: steward.public(),
            timestamp: crate::verdict::now_rfc3339(),
        })
        .unwrap()
    }

    #[test]
    fn approvals_of_before_1_4_count_on_bundles_of_before_1_4_only() {
        let tmp = tempfile::tempdir().unwrap();
        let node = NodeKey::generate();
        let steward = NodeKey::generate();
        let mut old = verdict(VerdictKind::Approve, "run-old", "p", "t");
        old.header.schema.version = "1.3".into();
        let b_old = bundle(tmp.path(), "run-old", &old, &node);
        let b_new = bundle(
            tmp.path(),
            "run-new",
            &verdict(VerdictKind::Approve, "run-new", "p", "t"),
            &node,
        );
        // The earlier format on an earlier bundle: counted.
        let payload = legacy_approval(&b_old, &steward);
        write_signed(&b_old, &steward, LEGACY_APPROVAL_PAYLOAD_TYPE, &payload);
        let c = check_approval(&b_old, &steward.public()).unwrap();
        assert!(c.ok, "{}", c.detail);
        verify_bundle(&b_old, &[node.public()]).unwrap();
        // The earlier format on a 1.4 bundle: a mix, refused by name.
        let payload = legacy_approval(&b_new, &steward);
        write_signed(&b_new, &steward, LEGACY_APPROVAL_PAYLOAD_TYPE, &payload);
        let c = check_approval(&b_new, &steward.public()).unwrap();
        assert!(!c.ok);
        assert!(c.detail.contains("never mixes formats"), "{}", c.detail);
        // The earlier body under the in-toto payloadType: not a statement, refused.
        write_signed(&b_new, &steward, APPROVAL_PAYLOAD_TYPE, &payload);
        let c = check_approval(&b_new, &steward.public()).unwrap();
        assert!(!c.ok);
        assert!(c.detail.contains("Statement"), "{}", c.detail);
        // A statement of another kind signed by the steward key (its endorsement, were it
        // also a node key) is not an approval.
        let end_env: Envelope =
            serde_json::from_slice(&fs::read(b_new.join("endorsement.dsse.json")).unwrap())
                .unwrap();
        write_signed(
            &b_new,
            &steward,
            APPROVAL_PAYLOAD_TYPE,
            &end_env.payload_bytes().unwrap(),
        );
        let c = check_approval(&b_new, &steward.public()).unwrap();
        assert!(!c.ok);
        assert!(
            c.detail
                .contains("predicateType is `https://fork.dev/endorsement/v1`"),
            "{}",
            c.detail
        );
        // And the new format on the 1.4 bundle: counted.
        fs::remove_file(b_new.join(approval_file_name(&steward.public()))).unwrap();
        approve(&b_new, &steward, &[node.public()]).unwrap();
        assert!(check_approval(&b_new, &steward.public()).unwrap().ok);
    }

    #[test]
    fn file_names() {
        let k = NodeKey::generate();
        let name = approval_file_name(&k.public());
        assert!(is_approval_file_name(&name));
        assert!(name.starts_with("steward-") && name.ends_with(".dsse.json"));
        assert!(!is_approval_file_name("steward-.dsse.json"));
        assert!(!is_approval_file_name("steward-0123456789ABCDEF.dsse.json"));
        assert!(!is_approval_file_name("steward-0123456789abcdef.json"));
        assert!(!is_approval_file_name(
            "steward-0123456789abcdef0.dsse.json"
        ));
        assert!(is_approval_file_name("steward-0123456789abcdef.dsse.json"));
    }
}
