//! The verdict: its schema (this file), the decision (`decide`), the signature (`sign`),
//! the bundle on disk (`bundle`) and its verification (`verify`).
//!
//! The document is the seed's verdict format (README, "The verdict bundle"), kept field for field,
//! plus what a verifier needs (`run_id`, `task`, and, for gate rejections, `patch_gate`).
//! Loading is strict (`deny_unknown_fields`), and [`Verdict::validate`] checks what the
//! types cannot (ranges, hash spellings, the schema generation, ...).
//!
//! Spellings:
//! * `patch_hash`, `task_hash`, `state_hash`, `source_hash`: `sha256:<64 lowercase hex>`;
//! * `artifacts[].sha256`: the bare 64 lowercase hex (the field name says the algorithm);
//! * `successor_key`: `ed25519:<base64>` (see [`crate::identity::PublicKey`]);
//! * `header.timestamp`: RFC 3339 in UTC, `2025-01-31T12:00:00.123Z`.

pub mod bundle;
pub mod bundle_error;
pub mod bundle_limit;
pub mod decide;
pub mod deployed;
pub mod kind;
pub mod plan;
pub mod ranks;
pub mod report;
pub mod sequential;
pub mod sign;
pub mod stats;
pub mod verify;

pub use bundle::{write_bundle, write_bundle_then, BundleError, WrittenBundle};
pub use kind::VerdictKind;
pub use verify::{verify_bundle, VerifiedVerdict, VerifyError};

use crate::identity::PublicKey;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::time::SystemTime;

/// The schema generation this code writes and the only one it reads.
pub const SCHEMA_GENERATION: u32 = 1;
/// The schema version this code writes; any `1.x` is read. 1.4: every envelope of the
/// bundle is an in-toto one (payloadType `application/vnd.in-toto+json` over a Statement
/// v1, the endorsement included); bundles of 1.0-1.3 keep their own payloadTypes and still
/// verify (see [`sign::EnvelopeFormat`]); a metric may carry its sequential classification
/// (`class`, `band`, `alpha`, `stopped`, `order_seed`), refused in a verdict older than 1.4.
pub const SCHEMA_VERSION: &str = "1.4";
/// `header.message_type` of a verdict.
pub const MESSAGE_TYPE: &str = "Verdict";

/// `header.schema`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaId {
    pub generation: u32,
    pub version: String,
}

/// `header`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    pub schema: SchemaId,
    pub message_type: String,
    /// A UUID (v4 when written by `fork`).
    pub message_id: String,
    /// RFC 3339, UTC.
    pub timestamp: String,
}

impl Header {
    /// A header for a new verdict: current schema, fresh UUID, the time now.
    pub fn new() -> Header {
        Header {
            schema: SchemaId {
                generation: SCHEMA_GENERATION,
                version: SCHEMA_VERSION.to_string(),
            },
            message_type: MESSAGE_TYPE.to_string(),
            message_id: uuid::Uuid::new_v4().to_string(),
            timestamp: now_rfc3339(),
        }
    }
}

impl Default for Header {
    fn default() -> Self {
        Header::new()
    }
}

/// The time now, RFC 3339 in UTC with milliseconds.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// `tests`: counts from the task's results.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestCounts {
    pub passed: u64,
    pub failed: u64,
    pub flaky: u64,
    #[serde(default)]
    pub skipped: u64,
}

/// One entry of `metrics`.
#[derive(Default, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metric {
    pub name: String,
    /// The unpatched clone's value, when the task ran a baseline.
    pub baseline: Option<f64>,
    pub patched: f64,
    /// Relative change `(patched - baseline) / baseline`, when there is a baseline.
    pub change: Option<f64>,
    /// Whether the change is statistically significant, when it could be tested.
    pub significant: Option<bool>,
    /// The confidence interval of the relative change, with repeats (with pairs, the rank
    /// interval of [`sequential`]; otherwise a bootstrap interval).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_low: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_high: Option<f64>,
    /// The Mann-Whitney p-value, when that method is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p_value: Option<f64>,
    /// Samples per side behind the comparison (with a baseline: the pairs run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<usize>,
    /// How the change was decided over repeated pairs (schema 1.4): improved, regressed,
    /// equivalent (inside the band) or inconclusive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<MetricVerdict>,
    /// The noise band the metric was judged against (schema 1.4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub band: Option<f64>,
    /// The error level of the look that decided it, or of the last look (schema 1.4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alpha: Option<f64>,
    /// Why its task stopped running pairs (schema 1.4), e.g. `every metric decided at look 2 of 5 (6 pairs)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// The seed of its task's randomised side order within each pair (schema 1.4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_seed: Option<u64>,
}

/// A metric's class over repeated pairs (`metrics[].class`, schema 1.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricVerdict {
    Improved,
    Regressed,
    Equivalent,
    Inconclusive,
}

impl MetricVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            MetricVerdict::Improved => "improved",
            MetricVerdict::Regressed => "regressed",
            MetricVerdict::Equivalent => "equivalent",
            MetricVerdict::Inconclusive => "inconclusive",
        }
    }
}

/// `budget.limits`: what the policy allowed (absent = unlimited).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_s: Option<f64>,
    /// CPU share in percent of one core (200 = two cores).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_percent: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_cost_usd: Option<f64>,
    /// Total CPU time of each run, when limited (schema 1.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_time_s: Option<f64>,
    /// The whole evaluation's wall-clock budget (schema 1.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation_wall_s: Option<f64>,
}

/// `budget.used`: what the run consumed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetUsed {
    pub wall_s: f64,
    pub cpu_s: f64,
    pub memory_peak_bytes: u64,
    pub disk_bytes: u64,
    #[serde(default)]
    pub pids_peak: u64,
    pub api_cost_usd: f64,
}

/// `budget`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetReport {
    pub limits: BudgetLimits,
    pub used: BudgetUsed,
    /// The budget that was blown (`wall`, `memory`, `cpu`, `disk`, `pids`, `api_cost`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exceeded: Option<String>,
}

/// What an artifact is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArtifactType {
    /// The task's test results (JUnit XML, libtest JSON, TAP).
    TestReport,
    /// The baseline run's test results.
    BaselineTestReport,
    /// The task's metrics file.
    Metrics,
    /// The baseline run's metrics file.
    BaselineMetrics,
    /// The patch that was evaluated.
    Patch,
    /// Output or logs of the run.
    Log,
    /// Anything else the task reported.
    Other,
}

impl ArtifactType {
    /// The snake_case spelling used in the document.
    pub fn as_str(self) -> &'static str {
        match self {
            ArtifactType::TestReport => "test_report",
            ArtifactType::BaselineTestReport => "baseline_test_report",
            ArtifactType::Metrics => "metrics",
            ArtifactType::BaselineMetrics => "baseline_metrics",
            ArtifactType::Patch => "patch",
            ArtifactType::Log => "log",
            ArtifactType::Other => "other",
        }
    }
}

/// One entry of `artifacts`: a file in the bundle's `artifacts/` directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    #[serde(rename = "type")]
    pub kind: ArtifactType,
    /// `artifacts/<file name>`, relative to the bundle directory.
    pub path: String,
    /// Bare lowercase hex sha256 of the file.
    pub sha256: String,
    pub bytes: u64,
}

/// `patch_gate`: the policy gates' outcome, when a gate decided the verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateReport {
    pub passed: bool,
    /// One line per violated gate, naming the gate and the offending path.
    #[serde(default)]
    pub violations: Vec<String>,
}

/// The verdict document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verdict {
    pub header: Header,
    pub verdict: VerdictKind,
    /// In [0, 1].
    pub confidence: f64,
    pub patch_hash: String,
    pub task_hash: String,
    pub state_hash: String,
    pub source_hash: String,
    /// The hash of the tree the successor ran: the patched source as fork copied it,
    /// minus the manifest's `exclude` ([`crate::fork::deploy_tree_hash`]), taken after the
    /// patch applied and before the task ran. Absent when no patched tree ran (a gate
    /// stopped the patch, or it did not apply) and in bundles before schema 1.2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patched_tree_hash: Option<String>,
    pub evaluation_summary: String,
    #[serde(default)]
    pub caveats: Vec<String>,
    pub tests: TestCounts,
    #[serde(default)]
    pub metrics: Vec<Metric>,
    pub budget: BudgetReport,
    /// What isolation was really in force (filled by the sandbox); a JSON object.
    pub isolation: serde_json::Value,
    #[serde(default)]
    pub artifacts: Vec<Artifact>,
    /// The ephemeral key that signs this verdict, `ed25519:<base64>`.
    pub successor_key: String,
    /// The run's id (the name of its bundle directory).
    pub run_id: String,
    /// The task's name in fork.toml.
    pub task: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_gate: Option<GateReport>,
    /// The mesh proposal this verdict answers (signed with the rest, so a verdict cannot be
    /// replayed as the answer to another proposal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposal_id: Option<String>,
    /// Who produced the tests and metrics: a judge outside the successor, or the code
    /// under test itself (schema 1.2; absent in older verdicts: self-reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
    /// The evaluation plan: every task planned, in order, and what each decided; the
    /// verdict combines them (schema 1.3; absent before, when `task` was the one task).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plan: Vec<plan::TaskVerdict>,
}

/// Who produced a verdict's evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provenance {
    /// A judge in a sandbox of its own, from the parent's unpatched tree, talking to the
    /// subject only over a pipe pair: the subject cannot touch what it reports.
    Judge,
    /// The task itself, in the successor's process: it can forge what it reports.
    SelfReported,
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Whether `s` is 64 lowercase hex digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `s` is `sha256:` followed by 64 lowercase hex digits.
pub fn is_sha256_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(is_sha256_hex)
}

/// Whether `s` can name a run (and so a directory): 1 to 128 of `[A-Za-z0-9._-]`, not
/// starting with a dot.
pub fn is_valid_run_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Whether `path` is `artifacts/<name>` with a plain file name (no `/`, not hidden).
pub fn is_valid_artifact_path(path: &str) -> bool {
    path.strip_prefix("artifacts/").is_some_and(|name| {
        !name.is_empty()
            && name.len() <= 255
            && !name.starts_with('.')
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    })
}

impl Verdict {
    /// Parses a verdict document strictly (unknown fields are errors). Call
    /// [`Verdict::validate`] next.
    pub fn from_json(bytes: &[u8]) -> Result<Verdict, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// The document as pretty JSON with a final newline (how `verdict.json` is written
    /// and how `--json` prints it).
    pub fn to_json_pretty(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut out = serde_json::to_vec_pretty(self)?;
        out.push(b'\n');
        Ok(out)
    }

    /// The successor key, parsed.
    pub fn successor_public_key(&self) -> Result<PublicKey, crate::identity::IdentityError> {
        PublicKey::parse(&self.successor_key)
    }

    /// The schema checks the types cannot express. Returns every problem found, each
    /// naming its field.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut errs = Vec::new();
        let h = &self.header;
        if h.schema.generation != SCHEMA_GENERATION {
            errs.push(format!(
                "header.schema.generation is {}, this fork reads generation {SCHEMA_GENERATION} only: upgrade fork",
                h.schema.generation
            ));
        }
        let major = h.schema.version.split('.').next().unwrap_or("");
        let version_ok = h.schema.version.split('.').count() == 2
            && h.schema
                .version
                .split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if !version_ok || major != "1" {
            errs.push(format!(
                "header.schema.version `{}` is not 1.x",
                h.schema.version
            ));
        }
        // Schema 1.3 lists the plan; before, `task` was the one task and no plan was written.
        let minor: u32 = h
            .schema
            .version
            .split('.')
            .nth(1)
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        if version_ok && minor >= 3 {
            errs.extend(plan::check_plan(&self.plan, &self.task, &self.task_hash));
        } else if !self.plan.is_empty() {
            errs.push(format!(
                "plan is written by schema 1.3 and later, but header.schema.version is `{}`",
                h.schema.version
            ));
        }
        // Schema 1.4 records how each metric was decided over sequential pairs.
        if version_ok && minor < 4 {
            if let Some(m) = self.metrics.iter().find(|m| {
                m.class.is_some()
                    || m.band.is_some()
                    || m.alpha.is_some()
                    || m.stopped.is_some()
                    || m.order_seed.is_some()
            }) {
                errs.push(format!(
                    "metrics.{}: class, band, alpha, stopped and order_seed are written by schema 1.4 and later, but header.schema.version is `{}`",
                    m.name, h.schema.version
                ));
            }
        }
        if h.message_type != MESSAGE_TYPE {
            errs.push(format!(
                "header.message_type is `{}`, expected `{MESSAGE_TYPE}`",
                h.message_type
            ));
        }
        if uuid::Uuid::parse_str(&h.message_id).is_err() {
            errs.push(format!(
                "header.message_id `{}` is not a UUID",
                h.message_id
            ));
        }
        if humantime::parse_rfc3339(&h.timestamp).is_err() {
            errs.push(format!(
                "header.timestamp `{}` is not an RFC 3339 UTC time like 2025-01-31T12:00:00Z",
                h.timestamp
            ));
        }
        if !(self.confidence.is_finite() && (0.0..=1.0).contains(&self.confidence)) {
            errs.push(format!("confidence {} is not in [0, 1]", self.confidence));
        }
        for (name, value) in [
            ("patch_hash", &self.patch_hash),
            ("task_hash", &self.task_hash),
            ("state_hash", &self.state_hash),
            ("source_hash", &self.source_hash),
        ] {
            if !is_sha256_digest(value) {
                errs.push(format!(
                    "{name} `{value}` is not sha256:<64 lowercase hex digits>"
                ));
            }
        }
        if let Some(h) = self
            .patched_tree_hash
            .as_deref()
            .filter(|h| !is_sha256_digest(h))
        {
            errs.push(format!(
                "patched_tree_hash `{h}` is not sha256:<64 lowercase hex digits>"
            ));
        }
        if self.evaluation_summary.trim().is_empty() {
            errs.push("evaluation_summary is empty".to_string());
        }
        let mut names = HashSet::new();
        for (i, m) in self.metrics.iter().enumerate() {
            if m.name.trim().is_empty() {
                errs.push(format!("metrics[{i}].name is empty"));
            }
            if !names.insert(m.name.as_str()) {
                errs.push(format!("metrics[{i}].name `{}` appears twice", m.name));
            }
            for (field, v) in [
                ("baseline", m.baseline),
                ("patched", Some(m.patched)),
                ("change", m.change),
            ] {
                if let Some(v) = v {
                    if !v.is_finite() {
                        errs.push(format!("metrics[{i}].{field} is not a finite number"));
                    }
                }
            }
        }
        let l = &self.budget.limits;
        let u = &self.budget.used;
        for (field, v) in [
            ("budget.limits.wall_s", l.wall_s),
            ("budget.limits.api_cost_usd", l.api_cost_usd),
            ("budget.used.wall_s", Some(u.wall_s)),
            ("budget.used.cpu_s", Some(u.cpu_s)),
            ("budget.used.api_cost_usd", Some(u.api_cost_usd)),
        ] {
            if let Some(v) = v {
                if !(v.is_finite() && v >= 0.0) {
                    errs.push(format!("{field} {v} is not a finite number >= 0"));
                }
            }
        }
        if !self.isolation.is_object() {
            errs.push("isolation is not a JSON object".to_string());
        }
        let mut paths = HashSet::new();
        for (i, a) in self.artifacts.iter().enumerate() {
            if !is_valid_artifact_path(&a.path) {
                errs.push(format!(
                    "artifacts[{i}].path `{}` is not artifacts/<file name> (letters, digits, . _ -)",
                    a.path
                ));
            }
            if !paths.insert(a.path.as_str()) {
                errs.push(format!("artifacts[{i}].path `{}` appears twice", a.path));
            }
            if !is_sha256_hex(&a.sha256) {
                errs.push(format!(
                    "artifacts[{i}].sha256 `{}` is not 64 lowercase hex digits",
                    a.sha256
                ));
            }
        }
        if let Err(e) = self.successor_public_key() {
            errs.push(format!("successor_key: {e}"));
        }
        if !is_valid_run_id(&self.run_id) {
            errs.push(format!(
                "run_id `{}` is not 1-128 of [A-Za-z0-9._-] (not starting with a dot)",
                self.run_id
            ));
        }
        if self.task.trim().is_empty() {
            errs.push("task is empty".to_string());
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs)
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::identity::EphemeralKey;

    /// A complete, valid verdict for tests.
    pub(crate) fn sample_verdict(key: &PublicKey) -> Verdict {
        Verdict {
            header: Header::new(),
            verdict: VerdictKind::Approve,
            confidence: 0.94,
            patch_hash: sha256_digest(b"patch"),
            task_hash: sha256_digest(b"task"),
            state_hash: sha256_digest(b"state"),
            source_hash: sha256_digest(b"source"),
            patched_tree_hash: None,
            evaluation_summary: "Test suite passed (312/312). p99 latency improved 18%."
                .to_string(),
            caveats: vec!["One flaky test (test_gateway_reconnect) required 3 retries.".into()],
            tests: TestCounts {
                passed: 312,
                failed: 0,
                flaky: 1,
                skipped: 0,
            },
            metrics: vec![Metric {
                ci_low: None,
                ci_high: None,
                p_value: None,
                samples: None,
                name: "p99_ms".into(),
                baseline: Some(41.0),
                patched: 33.6,
                change: Some((33.6 - 41.0) / 41.0),
                significant: Some(true),
                ..Metric::default()
            }],
            budget: BudgetReport {
                limits: BudgetLimits {
                    wall_s: Some(600.0),
                    memory_bytes: Some(1 << 30),
                    ..Default::default()
                },
                used: BudgetUsed {
                    wall_s: 12.3,
                    cpu_s: 20.1,
                    memory_peak_bytes: 123_456_789,
                    disk_bytes: 4096,
                    pids_peak: 7,
                    api_cost_usd: 0.0,
                },
                exceeded: None,
            },
            isolation: serde_json::json!({"userns": true, "pidns": true, "netns": true,
                "mountns": true, "landlock_abi": 6, "seccomp": "default", "cgroup": "v1"}),
            artifacts: vec![],
            successor_key: key.to_string(),
            run_id: "run-20250131-abcdef".into(),
            task: "tests".into(),
            patch_gate: None,
            proposal_id: None,
            provenance: None,
            plan: vec![plan::TaskVerdict {
                task: "tests".into(),
                task_hash: sha256_digest(b"task"),
                verdict: Some(VerdictKind::Approve),
                confidence: Some(0.94),
                summary: "Test suite passed (312/312). p99 latency improved 18%.".into(),
                provenance: None,
                tests: TestCounts {
                    passed: 312,
                    failed: 0,
                    flaky: 1,
                    skipped: 0,
                },
                metrics: vec![],
                budget: None,
            }],
        }
    }

    #[test]
    fn sample_is_valid_and_round_trips() {
        let k = EphemeralKey::generate();
        let v = sample_verdict(&k.public());
        v.validate().unwrap();
        let json = v.to_json_pretty().unwrap();
        let back = Verdict::from_json(&json).unwrap();
        assert_eq!(back, v);
        // The seed's fields are all there, spelled as in the README.
        let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
        for f in [
            "header",
            "verdict",
            "confidence",
            "patch_hash",
            "task_hash",
            "state_hash",
            "source_hash",
            "evaluation_summary",
            "caveats",
            "tests",
            "metrics",
            "budget",
            "isolation",
            "artifacts",
            "successor_key",
        ] {
            assert!(value.get(f).is_some(), "{f} missing");
        }
        assert_eq!(value["header"]["schema"]["generation"], 1);
        assert_eq!(value["header"]["message_type"], "Verdict");
        assert_eq!(value["verdict"], "APPROVE");
        assert!(value["budget"]["used"]["memory_peak_bytes"].is_u64());
    }

    #[test]
    fn seed_example_parses() {
        let k = EphemeralKey::generate();
        let doc = serde_json::json!({
          "header": {"schema": {"generation": 1, "version": "1.0"}, "message_type": "Verdict",
                     "message_id": "0b7d7cf4-3d55-4b0e-9a43-8a8d0e1e1f00",
                     "timestamp": "2025-01-31T12:00:00Z"},
          "verdict": "APPROVE", "confidence": 0.94,
          "patch_hash": sha256_digest(b"p"), "task_hash": sha256_digest(b"t"),
          "state_hash": sha256_digest(b"s"), "source_hash": sha256_digest(b"src"),
          "evaluation_summary": "Test suite passed (312/312). p99 latency improved 18%.",
          "caveats": ["One flaky test (test_gateway_reconnect) required 3 retries."],
          "tests": {"passed": 312, "failed": 0, "flaky": 1},
          "metrics": [{"name": "p99_ms", "baseline": 41.0, "patched": 33.6, "change": -0.18,
                       "significant": true}],
          "budget": {"limits": {}, "used": {"wall_s": 12.3, "cpu_s": 20.1,
                     "memory_peak_bytes": 1000, "disk_bytes": 10, "api_cost_usd": 0.0}},
          "isolation": {"userns": true},
          "artifacts": [{"type": "test_report", "path": "artifacts/tests.xml",
                         "sha256": hex::encode([7u8; 32]), "bytes": 1234}],
          "successor_key": k.public().to_string(),
          "run_id": "r1", "task": "tests"
        });
        let v: Verdict = serde_json::from_value(doc.clone()).unwrap();
        v.validate().unwrap();
        assert_eq!(v.tests.skipped, 0);

        let mut extra = doc;
        extra["surprise"] = serde_json::json!(1);
        let err = serde_json::from_value::<Verdict>(extra).unwrap_err();
        assert!(err.to_string().contains("surprise"), "{err}");
    }

    #[test]
    fn a_1_2_verdict_reads_without_a_plan_and_a_1_3_verdict_needs_one() {
        let k = EphemeralKey::generate();
        let mut v = sample_verdict(&k.public());
        v.validate().unwrap();
        // What fork wrote before plans: schema 1.2, `task` the one task, no plan.
        v.header.schema.version = "1.2".into();
        v.plan.clear();
        v.validate().unwrap();
        let doc = serde_json::to_value(&v).unwrap();
        assert!(doc.get("plan").is_none());
        // A 1.3 verdict lists its plan, and it must match `task` and `task_hash`.
        v.header.schema.version = "1.3".into();
        let errs = v.validate().unwrap_err();
        assert!(errs.iter().any(|e| e.contains("plan is empty")), "{errs:?}");
        let mut v = sample_verdict(&k.public());
        v.task = "other".into();
        let errs = v.validate().unwrap_err();
        assert!(errs.iter().any(|e| e.contains("joined by `+`")), "{errs:?}");
        // A plan in a document that says it is older is refused by name.
        let mut v = sample_verdict(&k.public());
        v.header.schema.version = "1.2".into();
        let errs = v.validate().unwrap_err();
        assert!(errs.iter().any(|e| e.contains("schema 1.3")), "{errs:?}");
    }

    #[test]
    fn metric_classes_are_schema_1_4() {
        let k = EphemeralKey::generate();
        let mut v = sample_verdict(&k.public());
        v.metrics[0].class = Some(MetricVerdict::Inconclusive);
        v.metrics[0].band = Some(0.1);
        v.metrics[0].stopped = Some("the run cap of 20 pairs".into());
        v.metrics[0].order_seed = Some(u64::MAX);
        v.validate().unwrap();
        let doc = serde_json::to_value(&v).unwrap();
        assert_eq!(doc["metrics"][0]["class"], "inconclusive");
        assert_eq!(serde_json::from_value::<Verdict>(doc).unwrap(), v);
        // A 1.3 verdict has no such fields: it still reads; one that carries them is refused.
        v.header.schema.version = "1.3".into();
        let errs = v.validate().unwrap_err();
        assert!(errs.iter().any(|e| e.contains("schema 1.4")), "{errs:?}");
        v.metrics[0].class = None;
        v.metrics[0].band = None;
        v.metrics[0].stopped = None;
        v.metrics[0].order_seed = None;
        v.validate().unwrap();
    }

    #[test]
    fn patched_tree_hash_is_optional_and_checked() {
        let k = EphemeralKey::generate();
        let mut v = sample_verdict(&k.public());
        assert_eq!(v.header.schema.version, "1.4");
        // absent: not written, still valid (1.0 and 1.1 documents have none)
        let doc = serde_json::to_value(&v).unwrap();
        assert!(doc.get("patched_tree_hash").is_none());
        assert!(v.validate().is_ok());
        v.patched_tree_hash = Some(sha256_digest(b"tree"));
        let doc = serde_json::to_value(&v).unwrap();
        assert_eq!(doc["patched_tree_hash"], sha256_digest(b"tree").as_str());
        assert_eq!(serde_json::from_value::<Verdict>(doc).unwrap(), v);
        assert!(v.validate().is_ok());
        v.patched_tree_hash = Some("sha256:nothex".into());
        let errs = v.validate().unwrap_err();
        assert!(
            errs.iter().any(|e| e.contains("patched_tree_hash")),
            "{errs:?}"
        );
    }

    #[test]
    fn validate_names_each_problem() {
        let k = EphemeralKey::generate();
        let mut v = sample_verdict(&k.public());
        v.header.schema.generation = 2;
        v.header.schema.version = "2.0".into();
        v.header.message_type = "Proposal".into();
        v.header.message_id = "not-a-uuid".into();
        v.header.timestamp = "yesterday".into();
        v.confidence = 1.5;
        v.patch_hash = "sha256:XYZ".into();
        v.task_hash = "md5:00".into();
        v.state_hash = format!("sha256:{}", "A".repeat(64));
        v.source_hash = String::new();
        v.evaluation_summary = " ".into();
        v.metrics.push(v.metrics[0].clone());
        v.metrics[0].patched = f64::NAN;
        v.budget.used.cpu_s = -1.0;
        v.isolation = serde_json::json!([1]);
        v.artifacts = vec![
            Artifact {
                kind: ArtifactType::Log,
                path: "artifacts/../etc/passwd".into(),
                sha256: "00".into(),
                bytes: 1,
            },
            Artifact {
                kind: ArtifactType::Log,
                path: "artifacts/../etc/passwd".into(),
                sha256: hex::encode([0u8; 32]),
                bytes: 1,
            },
        ];
        v.successor_key = "ed25519:???".into();
        v.run_id = "../x".into();
        v.task = String::new();
        let errs = v.validate().unwrap_err();
        let all = errs.join("\n");
        for needle in [
            "generation",
            "version",
            "message_type",
            "message_id",
            "timestamp",
            "confidence",
            "patch_hash",
            "task_hash",
            "state_hash",
            "source_hash",
            "evaluation_summary",
            "appears twice",
            "metrics[0].patched",
            "budget.used.cpu_s",
            "isolation",
            "artifacts[0].path",
            "artifacts[0].sha256",
            "artifacts[1].path",
            "successor_key",
            "run_id",
            "task is empty",
        ] {
            assert!(all.contains(needle), "no error about {needle}:\n{all}");
        }
    }

    #[test]
    fn helpers() {
        assert!(is_sha256_digest(&sha256_digest(b"")));
        assert_eq!(
            sha256_digest(b"abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(!is_sha256_digest("sha256:"));
        assert!(is_valid_run_id("2025-01-31_ab.c"));
        assert!(!is_valid_run_id(".."));
        assert!(!is_valid_run_id("a/b"));
        assert!(is_valid_artifact_path("artifacts/tests.xml"));
        assert!(!is_valid_artifact_path("artifacts/.hidden"));
        assert!(!is_valid_artifact_path("artifacts/a/b"));
        assert!(!is_valid_artifact_path("tests.xml"));
    }
}
