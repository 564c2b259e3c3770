//! Consensus over re-verified verdicts: `fork consensus VERDICT...`.
//!
//! Every mesh node re-verifies a patch and signs its own verdict bundle; a patch is
//! approved when a quorum of the trusted nodes that answered approve it, at least
//! `min_nodes` of them do (an absolute floor, so that nodes that stay silent cannot shrink
//! the vote), and, with a steward configured, the steward approved one of the approving
//! bundles ([`crate::mesh::approve`]). As in-toto thresholds do it, a vote is a unique
//! trusted key: the node key that endorsed the run's ephemeral key (as `verify_bundle`
//! reports it), never the bundle or its ephemeral key.
//!
//! The inputs are sorted by path first, so the outcome does not depend on their order on
//! the command line, and "first" below means first in that order. Each input is then
//! accepted as a vote or refused with one [`RefusalReason`], checked in this order:
//! 1. `verify_bundle` against the trusted keys: a key not trusted is `untrusted`; a verdict
//!    of a schema generation other than 1 is `unknown_generation`; any other failure
//!    (forged, tampered, malformed, missing file) is `invalid`;
//! 2. `replayed`: a run id or header message id already seen in an earlier input, or,
//!    when the config names a proposal, a verdict answering another (or no) proposal;
//! 3. `foreign_patch` / `foreign_task`: another patch or task than the config's; when the
//!    config does not give them, the first vote that gets here defines them (the report
//!    says which were used; the CLI should pass them, from `--patch FILE`);
//! 4. `duplicate`: a node key that already has an accepted vote (the first counts).
//!
//! `responders` is the number of accepted votes, `approvals` those that say APPROVE,
//! `needed = ceil(num / den × responders)`; approved ⇔ responders > 0, approvals ≥
//! needed, approvals ≥ min_nodes, and (steward configured ⇒ a valid steward approval of
//! an accepted APPROVE vote).

use crate::identity::PublicKey;
use crate::mesh::approve::{check_approval, StewardCheck};
use crate::verdict::bundle::VERDICT_FILE;
use crate::verdict::{verify_bundle, VerdictKind, VerifyError, SCHEMA_GENERATION};
use serde::Serialize;
use std::collections::HashSet;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use thiserror::Error;

/// A fraction of the responders that must approve, `num/den` (e.g. `2/3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quorum {
    pub num: u32,
    pub den: u32,
}

impl Quorum {
    /// Approvals needed among `responders`: `ceil(num × responders / den)`.
    pub fn needed(&self, responders: usize) -> usize {
        let den = u128::from(self.den.max(1));
        let n = (u128::from(self.num) * responders as u128).div_ceil(den);
        usize::try_from(n).unwrap_or(usize::MAX)
    }
}

impl Default for Quorum {
    /// `2/3`, the CLI's default.
    fn default() -> Self {
        Quorum { num: 2, den: 3 }
    }
}

impl fmt::Display for Quorum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.num, self.den)
    }
}

/// Why a quorum did not parse.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QuorumError {
    #[error("quorum `{0}` is not NUM/DEN (e.g. --quorum 2/3)")]
    Syntax(String),
    #[error("quorum `{0}` has a zero denominator: use e.g. 2/3")]
    ZeroDenominator(String),
    #[error("quorum `{0}` needs no approval at all: the numerator must be at least 1")]
    ZeroNumerator(String),
    #[error("quorum `{0}` is more than all the responders: the numerator must not exceed the denominator")]
    OverOne(String),
}

impl FromStr for Quorum {
    type Err = QuorumError;
    fn from_str(s: &str) -> Result<Quorum, QuorumError> {
        let t = s.trim();
        let syntax = || QuorumError::Syntax(s.to_string());
        let (n, d) = t.split_once('/').ok_or_else(syntax)?;
        let digits = |x: &str| !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit());
        if !digits(n) || !digits(d) {
            return Err(syntax());
        }
        let num: u32 = n.parse().map_err(|_| syntax())?;
        let den: u32 = d.parse().map_err(|_| syntax())?;
        if den == 0 {
            return Err(QuorumError::ZeroDenominator(s.to_string()));
        }
        if num == 0 {
            return Err(QuorumError::ZeroNumerator(s.to_string()));
        }
        if num > den {
            return Err(QuorumError::OverOne(s.to_string()));
        }
        Ok(Quorum { num, den })
    }
}

/// What consensus requires.
#[derive(Debug, Clone)]
pub struct ConsensusConfig {
    pub quorum: Quorum,
    /// The absolute floor of approvals, whatever the number of responders.
    pub min_nodes: usize,
    /// The node keys whose votes count.
    pub trusted: Vec<PublicKey>,
    /// When set, one accepted APPROVE vote must carry this steward's valid approval.
    pub steward: Option<PublicKey>,
    /// The patch voted on (`sha256:<hex>`); when unset, the first vote's.
    pub patch_hash: Option<String>,
    /// The task voted on (`sha256:<hex>`); when unset, the first vote's.
    pub task_hash: Option<String>,
    /// The mesh proposal answered; when set, a verdict answering another is a replay.
    pub proposal_id: Option<String>,
}

/// An accepted vote.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Vote {
    #[serde(serialize_with = "crate::text::lossy_path")]
    pub bundle: PathBuf,
    /// The trusted node key that endorsed the run, `ed25519:<base64>`.
    pub node_key: String,
    pub verdict: VerdictKind,
    pub confidence: f64,
    pub run_id: String,
}

/// Why an input is not a vote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalReason {
    /// It does not verify: a bad signature, a changed byte, a schema error.
    Invalid,
    /// Endorsed by a key that is not trusted.
    Untrusted,
    /// A second vote from a node key that already voted.
    Duplicate,
    /// A bundle seen before (same run id or message id), or answering another proposal.
    Replayed,
    /// A verdict on another patch.
    ForeignPatch,
    /// A verdict of another task.
    ForeignTask,
    /// A verdict of a schema generation this fork does not read.
    UnknownGeneration,
}

impl RefusalReason {
    /// The snake_case spelling (as in JSON).
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Invalid => "invalid",
            RefusalReason::Untrusted => "untrusted",
            RefusalReason::Duplicate => "duplicate",
            RefusalReason::Replayed => "replayed",
            RefusalReason::ForeignPatch => "foreign_patch",
            RefusalReason::ForeignTask => "foreign_task",
            RefusalReason::UnknownGeneration => "unknown_generation",
        }
    }
}

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refused {
    #[serde(serialize_with = "crate::text::lossy_path")]
    pub bundle: PathBuf,
    pub reason: RefusalReason,
    pub detail: String,
}

/// The outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConsensusReport {
    pub approved: bool,
    /// Accepted APPROVE votes.
    pub approvals: usize,
    /// Accepted votes.
    pub responders: usize,
    /// Approvals the quorum needs among the responders.
    pub needed: usize,
    pub min_nodes: usize,
    /// `num/den`.
    pub quorum: String,
    pub votes: Vec<Vote>,
    pub refused: Vec<Refused>,
    /// The steward gate, when a steward is configured.
    pub steward: Option<StewardCheck>,
    /// The patch and task voted on (given, or the first vote's).
    pub patch_hash: Option<String>,
    pub task_hash: Option<String>,
    /// One line: the decision and why.
    pub summary: String,
}

/// The schema generation `verdict.json` in `dir` claims, if it can be read.
fn claimed_generation(bundle: &Path) -> Option<u64> {
    let doc = if bundle.is_dir() {
        bundle.join(VERDICT_FILE)
    } else {
        bundle.to_path_buf()
    };
    let mut bytes = Vec::new();
    // Opened without blocking, regular files only: a FIFO is never waited on.
    crate::fsx::open_input(&doc)
        .ok()?
        .take(64 << 20)
        .read_to_end(&mut bytes)
        .ok()?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    value
        .get("header")?
        .get("schema")?
        .get("generation")?
        .as_u64()
}

/// Counts the votes in `bundles` (bundle directories or their verdict.json) under `cfg`.
/// See the module docs for the rules.
pub fn consensus(bundles: &[PathBuf], cfg: &ConsensusConfig) -> ConsensusReport {
    let mut inputs: Vec<&PathBuf> = bundles.iter().collect();
    inputs.sort();

    let mut votes = Vec::new();
    let mut refused = Vec::new();
    let mut run_ids = HashSet::new();
    let mut message_ids = HashSet::new();
    let mut voters: HashSet<PublicKey> = HashSet::new();
    let mut patch_hash = cfg.patch_hash.clone();
    let mut task_hash = cfg.task_hash.clone();
    // Accepted APPROVE votes' bundle directories, for the steward gate.
    let mut approving_dirs = Vec::new();

    for path in inputs {
        let mut refuse = |reason: RefusalReason, detail: String| {
            refused.push(Refused {
                bundle: path.clone(),
                reason,
                detail,
            })
        };
        let verified = match verify_bundle(path, &cfg.trusted) {
            Ok(v) => v,
            Err(e @ (VerifyError::UntrustedNodeKey { .. } | VerifyError::NoTrustedKeys)) => {
                refuse(RefusalReason::Untrusted, e.to_string());
                continue;
            }
            Err(e) => {
                match claimed_generation(path) {
                    Some(g) if g != u64::from(SCHEMA_GENERATION) => refuse(
                        RefusalReason::UnknownGeneration,
                        format!(
                            "schema generation {g}: this fork reads generation {SCHEMA_GENERATION} only (upgrade fork); {e}"
                        ),
                    ),
                    _ => refuse(RefusalReason::Invalid, e.to_string()),
                }
                continue;
            }
        };
        let v = &verified.verdict;

        // 2. Replays: every verified bundle's ids are remembered, counted or not.
        let new_run = run_ids.insert(v.run_id.clone());
        let new_message = message_ids.insert(v.header.message_id.clone());
        if !new_run || !new_message {
            let what = if !new_run {
                format!("run {}", v.run_id)
            } else {
                format!("message {}", v.header.message_id)
            };
            refuse(
                RefusalReason::Replayed,
                format!("{what} was already counted from an earlier input (a copy or a replay)"),
            );
            continue;
        }
        if let Some(want) = &cfg.proposal_id {
            if v.proposal_id.as_ref() != Some(want) {
                let found = v
                    .proposal_id
                    .as_deref()
                    .map_or("no proposal".to_string(), |p| format!("proposal {p}"));
                refuse(
                    RefusalReason::Replayed,
                    format!("the verdict answers {found}, not proposal {want}"),
                );
                continue;
            }
        }

        // 3. The patch and task voted on.
        let patch = patch_hash.get_or_insert_with(|| v.patch_hash.clone());
        if &v.patch_hash != patch {
            refuse(
                RefusalReason::ForeignPatch,
                format!(
                    "the verdict is about patch {}, the vote is on {patch}",
                    v.patch_hash
                ),
            );
            continue;
        }
        let task = task_hash.get_or_insert_with(|| v.task_hash.clone());
        if &v.task_hash != task {
            refuse(
                RefusalReason::ForeignTask,
                format!(
                    "the verdict is of task {} ({}), the vote is on {task}",
                    v.task_hash, v.task
                ),
            );
            continue;
        }

        // 4. One vote per node.
        if !voters.insert(verified.node_key) {
            refuse(
                RefusalReason::Duplicate,
                format!(
                    "node {} already voted (only its first bundle counts)",
                    verified.node_key
                ),
            );
            continue;
        }

        if v.verdict == VerdictKind::Approve {
            approving_dirs.push((path.clone(), verified.dir.clone()));
        }
        votes.push(Vote {
            bundle: path.clone(),
            node_key: verified.node_key.to_string(),
            verdict: v.verdict,
            confidence: v.confidence,
            run_id: v.run_id.clone(),
        });
    }

    let responders = votes.len();
    let approvals = approving_dirs.len();
    let needed = cfg.quorum.needed(responders);
    let steward = cfg
        .steward
        .as_ref()
        .map(|key| steward_gate(key, &approving_dirs));

    let mut reasons = Vec::new();
    if responders == 0 {
        reasons.push(format!(
            "no accepted vote ({} input(s) refused)",
            refused.len()
        ));
    } else {
        if approvals < needed {
            reasons.push(format!(
                "{approvals} of {responders} accepted votes approve, quorum {} needs {needed}",
                cfg.quorum
            ));
        }
        if approvals < cfg.min_nodes {
            reasons.push(format!(
                "{approvals} approval(s), fewer than the floor of {} node(s) (min_nodes)",
                cfg.min_nodes
            ));
        }
    }
    if let Some(s) = &steward {
        if !s.ok {
            reasons.push(format!("steward gate: {}", s.detail));
        }
    }
    let approved = reasons.is_empty();
    let summary = if approved {
        let gate = if steward.is_some() {
            ", steward approved"
        } else {
            ""
        };
        format!(
            "approved: {approvals} of {responders} accepted votes approve (quorum {} needs {needed}, floor {}){gate}",
            cfg.quorum, cfg.min_nodes
        )
    } else {
        format!("not approved: {}", reasons.join("; "))
    };

    ConsensusReport {
        approved,
        approvals,
        responders,
        needed,
        min_nodes: cfg.min_nodes,
        quorum: cfg.quorum.to_string(),
        votes,
        refused,
        steward,
        patch_hash,
        task_hash,
        summary,
    }
}

/// The first valid approval by `key` among the approving bundles, or why there is none.
fn steward_gate(key: &PublicKey, approving: &[(PathBuf, PathBuf)]) -> StewardCheck {
    let mut failures = Vec::new();
    for (input, dir) in approving {
        match check_approval(dir, key) {
            Ok(c) if c.ok => return c,
            Ok(c) => failures.push(c.detail),
            Err(e) => failures.push(format!("{}: {e}", input.display())),
        }
    }
    let detail = if approving.is_empty() {
        format!("no accepted APPROVE vote for steward {key} to approve")
    } else {
        format!(
            "no valid approval by steward {key} of any accepted APPROVE vote: {}",
            failures.join("; ")
        )
    };
    StewardCheck {
        steward_key: key.to_string(),
        bundle: None,
        ok: false,
        detail,
    }
}

impl ConsensusReport {
    /// The report as human text (several lines, ending with a newline). Every field is
    /// made safe for a terminal ([`crate::text::safe_text`]): a refusal's detail quotes a bundle.
    pub fn render(&self) -> String {
        use crate::text::safe_text as t;
        let mut out = String::new();
        let decision = if self.approved {
            "APPROVED"
        } else {
            "NOT APPROVED"
        };
        out.push_str(&format!("consensus: {decision}\n"));
        out.push_str(&format!("  {}\n", t(&self.summary)));
        out.push_str(&format!(
            "  quorum {} of {} responder(s) needs {}; floor {}; approvals {}\n",
            self.quorum, self.responders, self.needed, self.min_nodes, self.approvals
        ));
        let unset = "(none)";
        out.push_str(&format!(
            "  patch {}\n  task  {}\n",
            t(self.patch_hash.as_deref().unwrap_or(unset)),
            t(self.task_hash.as_deref().unwrap_or(unset))
        ));
        out.push_str(&format!("votes ({}):\n", self.votes.len()));
        for v in &self.votes {
            out.push_str(&format!(
                "  {:<14} {:.2}  node {}  run {}  {}\n",
                v.verdict.as_str(),
                v.confidence,
                t(&v.node_key),
                t(&v.run_id),
                t(&v.bundle.to_string_lossy())
            ));
        }
        if !self.refused.is_empty() {
            out.push_str(&format!("refused ({}):\n", self.refused.len()));
            for r in &self.refused {
                out.push_str(&format!(
                    "  {:<18} {}: {}\n",
                    r.reason.as_str(),
                    t(&r.bundle.to_string_lossy()),
                    t(&r.detail)
                ));
            }
        }
        if let Some(s) = &self.steward {
            let state = if s.ok { "ok" } else { "MISSING" };
            out.push_str(&format!(
                "steward {}: {state}: {}\n",
                t(&s.steward_key),
                t(&s.detail)
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{EphemeralKey, NodeKey};
    use crate::mesh::approve::tests::{bundle, verdict};
    use crate::mesh::approve::{approval_file_name, approve};
    use crate::verdict::bundle::{ENDORSEMENT_FILE, VERDICT_ENVELOPE_FILE};
    use crate::verdict::{sha256_digest, sign, Verdict};
    use std::fs;

    const PATCH: &str = "the patch";
    const TASK: &str = "the task";

    struct Mesh {
        tmp: tempfile::TempDir,
        nodes: Vec<NodeKey>,
    }

    impl Mesh {
        fn new(n: usize) -> Mesh {
            Mesh {
                tmp: tempfile::tempdir().unwrap(),
                nodes: (0..n).map(|_| NodeKey::generate()).collect(),
            }
        }
        fn trusted(&self) -> Vec<PublicKey> {
            self.nodes.iter().map(NodeKey::public).collect()
        }
        fn cfg(&self, quorum: &str, min_nodes: usize) -> ConsensusConfig {
            ConsensusConfig {
                quorum: quorum.parse().unwrap(),
                min_nodes,
                trusted: self.trusted(),
                steward: None,
                patch_hash: Some(sha256_digest(PATCH.as_bytes())),
                task_hash: Some(sha256_digest(TASK.as_bytes())),
                proposal_id: None,
            }
        }
        /// Node `i`'s bundle `name` saying `kind` about the patch and task.
        fn vote(&self, i: usize, name: &str, kind: VerdictKind) -> PathBuf {
            self.vote_with(i, name, verdict(kind, name, PATCH, TASK))
        }
        fn vote_with(&self, i: usize, name: &str, v: Verdict) -> PathBuf {
            bundle(self.tmp.path(), name, &v, &self.nodes[i])
        }
    }

    fn reasons(r: &ConsensusReport) -> Vec<(String, RefusalReason)> {
        r.refused
            .iter()
            .map(|x| {
                (
                    x.bundle.file_name().unwrap().to_string_lossy().into_owned(),
                    x.reason,
                )
            })
            .collect()
    }

    #[test]
    fn quorum_parses_and_refuses() {
        let q: Quorum = "2/3".parse().unwrap();
        assert_eq!(q, Quorum { num: 2, den: 3 });
        assert_eq!(q.to_string(), "2/3");
        assert_eq!(Quorum::default(), q);
        assert_eq!(" 1/1 ".parse::<Quorum>().unwrap().to_string(), "1/1");
        for (s, want) in [
            ("0/3", QuorumError::ZeroNumerator("0/3".into())),
            ("4/3", QuorumError::OverOne("4/3".into())),
            ("1/0", QuorumError::ZeroDenominator("1/0".into())),
            ("0/0", QuorumError::ZeroDenominator("0/0".into())),
            ("2", QuorumError::Syntax("2".into())),
            ("-1/3", QuorumError::Syntax("-1/3".into())),
            ("1/3/4", QuorumError::Syntax("1/3/4".into())),
            ("a/b", QuorumError::Syntax("a/b".into())),
            ("99999999999/1", QuorumError::Syntax("99999999999/1".into())),
        ] {
            assert_eq!(s.parse::<Quorum>().unwrap_err(), want, "{s}");
        }
        assert!(QuorumError::Syntax("x".into()).to_string().contains("2/3"));
        // ceil(num × responders / den).
        assert_eq!(q.needed(0), 0);
        assert_eq!(q.needed(1), 1);
        assert_eq!(q.needed(3), 2);
        assert_eq!(q.needed(4), 3);
        assert_eq!("1/2".parse::<Quorum>().unwrap().needed(4), 2);
        assert_eq!("1/1".parse::<Quorum>().unwrap().needed(5), 5);
        let big = Quorum {
            num: u32::MAX,
            den: u32::MAX,
        };
        assert_eq!(big.needed(usize::MAX), usize::MAX);
    }

    #[test]
    fn unanimous_approve() {
        let m = Mesh::new(3);
        let b: Vec<_> = (0..3)
            .map(|i| m.vote(i, &format!("run-{i}"), VerdictKind::Approve))
            .collect();
        let r = consensus(&b, &m.cfg("2/3", 3));
        assert!(r.approved, "{}", r.render());
        assert_eq!((r.approvals, r.responders, r.needed), (3, 3, 2));
        assert!(r.refused.is_empty());
        assert!(r.summary.starts_with("approved"), "{}", r.summary);
        // Each vote is its endorsing node's key.
        let keys: HashSet<String> = r.votes.iter().map(|v| v.node_key.clone()).collect();
        let want: HashSet<String> = m.trusted().iter().map(ToString::to_string).collect();
        assert_eq!(keys, want);
        // Input order does not matter.
        let mut rev = b.clone();
        rev.reverse();
        assert_eq!(consensus(&rev, &m.cfg("2/3", 3)), r);
        // JSON and text.
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["approved"], true);
        assert_eq!(json["votes"][0]["verdict"], "APPROVE");
        assert_eq!(json["quorum"], "2/3");
        let text = r.render();
        assert!(text.starts_with("consensus: APPROVED"), "{text}");
        assert_eq!(text.matches("APPROVE ").count(), 3, "{text}");
    }

    #[test]
    fn absent_node_and_the_floor() {
        // 4 trusted nodes, 3 answer: 2 approve, 1 needs revision. 2/3 of 3 = 2.
        let m = Mesh::new(4);
        let b = vec![
            m.vote(0, "run-0", VerdictKind::Approve),
            m.vote(1, "run-1", VerdictKind::Approve),
            m.vote(2, "run-2", VerdictKind::NeedsRevision),
        ];
        let r = consensus(&b, &m.cfg("2/3", 2));
        assert!(r.approved, "{}", r.render());
        assert_eq!((r.approvals, r.responders, r.needed), (2, 3, 2));
        // 3/4 of the responders: 3 needed, 2 approve.
        let r = consensus(&b, &m.cfg("3/4", 2));
        assert!(!r.approved);
        assert_eq!(r.needed, 3);
        assert!(r.summary.contains("needs 3"), "{}", r.summary);

        // Only two nodes answer, both approve: the quorum is met (2 of 2), but the floor
        // of 3 is not; silence cannot shrink the vote.
        let r = consensus(&b[..2], &m.cfg("2/3", 3));
        assert!(!r.approved, "{}", r.render());
        assert_eq!((r.approvals, r.responders, r.needed), (2, 2, 2));
        assert!(r.summary.contains("min_nodes"), "{}", r.summary);
        let r = consensus(&b[..2], &m.cfg("2/3", 2));
        assert!(r.approved);

        // Nobody: not approved.
        let r = consensus(&[], &m.cfg("2/3", 0));
        assert!(!r.approved);
        assert_eq!(r.responders, 0);
        assert!(r.summary.contains("no accepted vote"), "{}", r.summary);
    }

    #[test]
    fn dishonest_node_is_outvoted() {
        let m = Mesh::new(3);
        let b = vec![
            m.vote(0, "run-liar", VerdictKind::Approve),
            m.vote(1, "run-h1", VerdictKind::NeedsRevision),
            m.vote(2, "run-h2", VerdictKind::NeedsRevision),
        ];
        let r = consensus(&b, &m.cfg("2/3", 1));
        assert!(!r.approved);
        assert_eq!((r.approvals, r.responders, r.needed), (1, 3, 2));
        // Even at 1/3 the floor of 2 keeps one liar from deciding alone.
        let r = consensus(&b, &m.cfg("1/3", 2));
        assert!(!r.approved, "{}", r.render());
        assert_eq!(r.needed, 1);
    }

    #[test]
    fn untrusted_and_tampered_are_refused() {
        let m = Mesh::new(3);
        let stranger = NodeKey::generate();
        let ok0 = m.vote(0, "run-0", VerdictKind::Approve);
        let ok1 = m.vote(1, "run-1", VerdictKind::Approve);
        let foreign = bundle(
            m.tmp.path(),
            "run-x",
            &verdict(VerdictKind::Approve, "run-x", PATCH, TASK),
            &stranger,
        );
        let tampered = m.vote(2, "run-2", VerdictKind::NeedsRevision);
        let doc = tampered.join(VERDICT_FILE);
        let text = fs::read_to_string(&doc).unwrap();
        // The tamperer turns a NEEDS_REVISION into an APPROVE without the keys.
        fs::write(&doc, text.replace("NEEDS_REVISION", "APPROVE")).unwrap();
        let r = consensus(&[ok0, ok1, foreign, tampered], &m.cfg("2/3", 2));
        assert_eq!(
            reasons(&r),
            [
                ("run-2".to_string(), RefusalReason::Invalid),
                ("run-x".to_string(), RefusalReason::Untrusted),
            ]
        );
        assert_eq!((r.approvals, r.responders), (2, 2));
        assert!(r.approved);
        assert!(r.refused[1].detail.contains(&stranger.public().to_string()));

        // A single flipped byte in an artifact is caught too.
        let m2 = Mesh::new(1);
        let b = m2.vote(0, "run-f", VerdictKind::Approve);
        let art = fs::read_dir(b.join("artifacts"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let mut bytes = fs::read(&art).unwrap();
        bytes[3] ^= 0x01;
        fs::write(&art, bytes).unwrap();
        let r = consensus(&[b], &m2.cfg("1/1", 1));
        assert!(!r.approved);
        assert_eq!(r.refused[0].reason, RefusalReason::Invalid);
        assert!(
            r.refused[0].detail.contains("sha256"),
            "{}",
            r.refused[0].detail
        );

        // No trusted key at all: nothing counts.
        let mut cfg = m.cfg("2/3", 1);
        cfg.trusted.clear();
        let r = consensus(&[m.tmp.path().join("run-0")], &cfg);
        assert_eq!(r.refused[0].reason, RefusalReason::Untrusted);
        assert!(!r.approved);
    }

    #[test]
    fn duplicate_node_votes_once() {
        let m = Mesh::new(3);
        let b = vec![
            m.vote(0, "run-a", VerdictKind::NeedsRevision),
            // The same node again, with a fresh run that approves: refused.
            m.vote(0, "run-b", VerdictKind::Approve),
            m.vote(0, "run-c", VerdictKind::Approve),
            m.vote(1, "run-d", VerdictKind::Approve),
        ];
        let r = consensus(&b, &m.cfg("1/2", 1));
        assert_eq!(
            reasons(&r),
            [
                ("run-b".to_string(), RefusalReason::Duplicate),
                ("run-c".to_string(), RefusalReason::Duplicate),
            ]
        );
        assert_eq!((r.approvals, r.responders), (1, 2));
        assert_eq!(r.votes[0].run_id, "run-a");
        assert!(r.approved);
        let r = consensus(&b, &m.cfg("2/3", 1));
        assert!(!r.approved);
    }

    fn copy_dir(from: &Path, to: &Path) {
        fs::create_dir(to).unwrap();
        for e in fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                copy_dir(&e.path(), &to.join(e.file_name()));
            } else {
                fs::copy(e.path(), to.join(e.file_name())).unwrap();
            }
        }
    }

    #[test]
    fn replays_are_refused() {
        let m = Mesh::new(3);
        let a = m.vote(0, "run-a", VerdictKind::Approve);
        // The same bundle twice, through another spelling and as a copy.
        let copy = m.tmp.path().join("zz-copy");
        copy_dir(&a, &copy);
        let b = vec![a.clone(), a.join(VERDICT_FILE), copy];
        let r = consensus(&b, &m.cfg("1/1", 1));
        assert_eq!(r.responders, 1);
        assert_eq!(r.refused.len(), 2);
        assert!(r
            .refused
            .iter()
            .all(|x| x.reason == RefusalReason::Replayed));
        assert!(
            r.refused[0].detail.contains("run-a"),
            "{}",
            r.refused[0].detail
        );

        // Another run id but the same message id: a replay too.
        let first = verdict(VerdictKind::Approve, "run-m1", PATCH, TASK);
        let mut second = verdict(VerdictKind::Approve, "run-m2", PATCH, TASK);
        second.header.message_id = first.header.message_id.clone();
        let b = vec![
            m.vote_with(1, "run-m1", first),
            m.vote_with(2, "run-m2", second),
        ];
        let r = consensus(&b, &m.cfg("1/1", 1));
        assert_eq!(
            reasons(&r),
            [("run-m2".to_string(), RefusalReason::Replayed)]
        );
        assert!(
            r.refused[0].detail.contains("message"),
            "{}",
            r.refused[0].detail
        );

        // Answers to another proposal (or none) when the config names one.
        let m = Mesh::new(3);
        let mut mine = verdict(VerdictKind::Approve, "run-p1", PATCH, TASK);
        mine.proposal_id = Some("prop-1".into());
        let mut other = verdict(VerdictKind::Approve, "run-p2", PATCH, TASK);
        other.proposal_id = Some("prop-0".into());
        let none = verdict(VerdictKind::Approve, "run-p3", PATCH, TASK);
        let b = vec![
            m.vote_with(0, "run-p1", mine),
            m.vote_with(1, "run-p2", other),
            m.vote_with(2, "run-p3", none),
        ];
        let mut cfg = m.cfg("2/3", 1);
        cfg.proposal_id = Some("prop-1".into());
        let r = consensus(&b, &cfg);
        assert_eq!(
            reasons(&r),
            [
                ("run-p2".to_string(), RefusalReason::Replayed),
                ("run-p3".to_string(), RefusalReason::Replayed),
            ]
        );
        assert!(
            r.refused[0].detail.contains("prop-0"),
            "{}",
            r.refused[0].detail
        );
        assert_eq!(r.responders, 1);
        assert!(r.approved);
        // Without a proposal in the config, all three count.
        cfg.proposal_id = None;
        assert_eq!(consensus(&b, &cfg).responders, 3);
    }

    #[test]
    fn foreign_patch_and_task_are_refused() {
        let m = Mesh::new(3);
        let b = vec![
            m.vote(0, "run-a", VerdictKind::Approve),
            m.vote_with(
                1,
                "run-b",
                verdict(VerdictKind::Approve, "run-b", "another patch", TASK),
            ),
            m.vote_with(
                2,
                "run-c",
                verdict(VerdictKind::Approve, "run-c", PATCH, "another task"),
            ),
        ];
        let r = consensus(&b, &m.cfg("1/1", 1));
        assert_eq!(
            reasons(&r),
            [
                ("run-b".to_string(), RefusalReason::ForeignPatch),
                ("run-c".to_string(), RefusalReason::ForeignTask),
            ]
        );
        assert_eq!(r.responders, 1);
        assert!(r.approved);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["refused"][0]["reason"], "foreign_patch");
        assert_eq!(json["refused"][1]["reason"], "foreign_task");

        // A config for another patch: every vote is foreign.
        let mut cfg = m.cfg("1/1", 1);
        cfg.patch_hash = Some(sha256_digest(b"what the proposer sent"));
        let r = consensus(&b, &cfg);
        assert_eq!(r.responders, 0);
        assert!(!r.approved);
        assert!(r
            .refused
            .iter()
            .all(|x| x.reason == RefusalReason::ForeignPatch));

        // Unset: the first vote (by path) defines them, and the report says so.
        cfg.patch_hash = None;
        cfg.task_hash = None;
        let r = consensus(&b, &cfg);
        assert_eq!(r.patch_hash, Some(sha256_digest(PATCH.as_bytes())));
        assert_eq!(r.task_hash, Some(sha256_digest(TASK.as_bytes())));
        assert_eq!(r.responders, 1);
    }

    /// Writes a bundle of a verdict `write_bundle` would refuse (it validates), signed and
    /// endorsed exactly as it would be.
    fn raw_bundle(dir: &Path, name: &str, mut v: Verdict, node: &NodeKey) -> PathBuf {
        let out = dir.join(name);
        fs::create_dir(&out).unwrap();
        let eph = EphemeralKey::generate();
        v.successor_key = eph.public().to_string();
        let doc = v.to_json_pretty().unwrap();
        let (env, payload) = sign::sign_verdict(&v, &doc, &eph).unwrap();
        let (_, end) = sign::endorse(&v, &payload, &eph.public(), node).unwrap();
        fs::write(out.join(VERDICT_FILE), &doc).unwrap();
        fs::write(
            out.join(VERDICT_ENVELOPE_FILE),
            env.to_json_pretty().unwrap(),
        )
        .unwrap();
        fs::write(out.join(ENDORSEMENT_FILE), end.to_json_pretty().unwrap()).unwrap();
        out
    }

    #[test]
    fn unknown_generation_is_refused() {
        let m = Mesh::new(2);
        let ok = m.vote(0, "run-a", VerdictKind::Approve);
        // The raw writer makes valid bundles of generation 1...
        let same = raw_bundle(
            m.tmp.path(),
            "run-g1",
            verdict(VerdictKind::Approve, "run-g1", PATCH, TASK),
            &m.nodes[1],
        );
        verify_bundle(&same, &m.trusted()).unwrap();
        fs::remove_dir_all(&same).unwrap();
        // ...and one of generation 2, properly signed by a trusted node.
        let mut v = verdict(VerdictKind::Approve, "run-g2", PATCH, TASK);
        v.header.schema.generation = 2;
        let future = raw_bundle(m.tmp.path(), "run-g2", v, &m.nodes[1]);
        let r = consensus(&[ok, future], &m.cfg("1/1", 1));
        assert_eq!(
            reasons(&r),
            [("run-g2".to_string(), RefusalReason::UnknownGeneration)]
        );
        assert!(
            r.refused[0].detail.contains("generation 2"),
            "{}",
            r.refused[0].detail
        );
        assert_eq!(r.responders, 1);
        assert!(r.approved);
        assert_eq!(
            serde_json::to_value(&r.refused[0]).unwrap()["reason"],
            "unknown_generation"
        );
    }

    #[test]
    fn steward_gate() {
        let m = Mesh::new(3);
        let steward = NodeKey::generate();
        let b = vec![
            m.vote(0, "run-a", VerdictKind::Approve),
            m.vote(1, "run-b", VerdictKind::Approve),
            m.vote(2, "run-c", VerdictKind::NeedsRevision),
        ];
        let mut cfg = m.cfg("2/3", 2);
        assert!(consensus(&b, &cfg).approved);
        cfg.steward = Some(steward.public());

        // The quorum approves, but no steward approval yet.
        let r = consensus(&b, &cfg);
        assert!(!r.approved);
        assert_eq!(r.approvals, 2);
        assert!(r.summary.contains("steward"), "{}", r.summary);
        assert!(!r.steward.as_ref().unwrap().ok);

        // The steward's approval of a NEEDS_REVISION bundle is refused at the source, and
        // one forged into that bundle would not count: only APPROVE votes are looked at.
        assert!(approve(&b[2], &steward, &m.trusted()).is_err());

        // A forged approval: signed by another key, filed under the steward's name.
        let name = approval_file_name(&steward.public());
        let forger = NodeKey::generate();
        let forged = approve(&b[0], &forger, &m.trusted()).unwrap();
        fs::rename(&forged, b[0].join(&name)).unwrap();
        let r = consensus(&b, &cfg);
        assert!(!r.approved, "{}", r.render());
        assert_eq!(
            r.responders, 3,
            "the approval file must not break verification"
        );
        fs::remove_file(b[0].join(&name)).unwrap();

        // An approval of another bundle (same patch), copied in.
        let elsewhere = m.vote(0, "run-other", VerdictKind::Approve);
        approve(&elsewhere, &steward, &m.trusted()).unwrap();
        fs::copy(elsewhere.join(&name), b[1].join(&name)).unwrap();
        let r = consensus(&b, &cfg);
        assert!(!r.approved, "{}", r.render());
        assert!(r.summary.contains("verdict_sha256"), "{}", r.summary);
        fs::remove_file(b[1].join(&name)).unwrap();

        // The real thing.
        let path = approve(&b[1], &steward, &m.trusted()).unwrap();
        let r = consensus(&b, &cfg);
        assert!(r.approved, "{}", r.render());
        assert_eq!(r.responders, 3);
        let s = r.steward.as_ref().unwrap();
        assert!(s.ok);
        assert_eq!(s.bundle.as_deref(), Some(b[1].as_path()));
        assert!(r.render().contains("steward"), "{}", r.render());

        // A steward approval does not replace the quorum.
        let r = consensus(&b[1..], &cfg);
        assert!(!r.approved, "{}", r.render());

        // And it does not carry over to a bundle refused for another reason.
        let mut cfg2 = cfg.clone();
        cfg2.patch_hash = Some(sha256_digest(b"another patch"));
        assert!(!consensus(&b, &cfg2).approved);
        assert!(path.exists());
    }
}
