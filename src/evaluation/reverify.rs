//! `fork reverify VERDICT --patch PATCH`: re-runs on this node the evaluation another
//! verdict describes (its task, its budgets), emits this node's own signed verdict, and
//! reports whether the two agree: the same verdict, and every metric within its noise band.

use super::{evaluate, EvaluateError, Evaluation, LedgerChoice, Request};
use crate::budget::BudgetOverrides;
use crate::identity::PublicKey;
use crate::verdict::verify::VerifyError;
use crate::verdict::{Verdict, VerdictKind};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

/// What `fork reverify` is asked: the verdict to re-run, its patch, and this node's own
/// runtime copy, policy, key and output directory.
#[derive(Debug, Clone)]
pub struct ReverifyRequest {
    /// A bundle directory or its verdict.json.
    pub verdict: PathBuf,
    /// The patch it is about; its hash must be the verdict's.
    pub patch: PathBuf,
    pub runtime: PathBuf,
    pub policy: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub out: Option<PathBuf>,
    /// Node keys trusted to have endorsed the verdict (empty: its own endorser, which then
    /// only proves the bundle is intact, not who made it).
    pub trust: Vec<PublicKey>,
}

/// Why a re-verification could not answer.
#[derive(Debug, Error)]
pub enum ReverifyError {
    /// The verdict to re-verify does not verify (or its endorser cannot be read).
    #[error("the verdict to re-verify is not valid: {0}")]
    Invalid(#[source] VerifyError),
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Evaluate(#[from] EvaluateError),
}

/// One metric compared between the two verdicts.
#[derive(Debug, Serialize)]
pub struct MetricAgreement {
    pub name: String,
    pub theirs: f64,
    pub ours: Option<f64>,
    /// How far apart the two are: the relative changes' difference with baselines, else
    /// the values' relative difference.
    pub relative_difference: Option<f64>,
    /// The noise band this metric is held to (the policy's band for its kind, see
    /// [`crate::verdict::decide::DecisionRules::band_for`]).
    pub band: f64,
    /// Whether that difference is within that band (nothing else).
    pub within_band: bool,
    /// Whether the two measurements agree, and why (see [`Agreed`]); `None`: they do not.
    pub agreed: Option<Agreed>,
}

/// Why two measurements of one metric agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Agreed {
    /// Their difference is within the noise band.
    WithinBand,
    /// Both found the same significant change (same direction), or both found none.
    SameConclusion,
    /// Their confidence intervals overlap.
    OverlappingIntervals,
}

impl Agreed {
    /// How the command line says it.
    pub fn describe(self) -> &'static str {
        match self {
            Agreed::WithinBand => "within the noise band",
            Agreed::SameConclusion => "the same conclusion (significance and direction)",
            Agreed::OverlappingIntervals => "overlapping confidence intervals",
        }
    }
}

/// The agreement report.
#[derive(Debug, Serialize)]
pub struct Agreement {
    pub agree: bool,
    pub theirs: VerdictKind,
    pub ours: VerdictKind,
    pub their_node: String,
    pub their_node_trusted: bool,
    /// The policy's band for metrics no per-kind band matches (each metric's own is in
    /// [`MetricAgreement::band`]).
    pub noise_band: f64,
    pub metrics: Vec<MetricAgreement>,
    #[serde(serialize_with = "crate::text::lossy_path")]
    pub our_bundle: PathBuf,
    pub our_run_id: String,
}

/// The node key that endorsed a bundle, as the endorsement claims it (checked afterwards
/// by `verify_bundle`).
fn claimed_endorser(dir: &Path) -> Result<PublicKey, String> {
    crate::verdict::verify::claimed_endorsement(dir)
        .map(|e| e.node_key)
        .map_err(|e| e.to_string())
}

/// The budget that reproduces a verdict's limits, typed: no round trip through text.
fn budgets_of(l: &crate::verdict::BudgetLimits) -> BudgetOverrides {
    let secs = |s: Option<f64>| {
        s.filter(|s| s.is_finite() && *s > 0.0)
            .map(Duration::from_secs_f64)
    };
    BudgetOverrides {
        wall: secs(l.wall_s),
        cpu_percent: l.cpu_percent,
        memory_bytes: l.memory_bytes,
        pids: l.pids,
        disk_bytes: l.disk_bytes,
        api_cost_usd: l.api_cost_usd,
        cpu_time: secs(l.cpu_time_s),
        evaluation_wall: secs(l.evaluation_wall_s),
    }
}

/// Whether our measurement of one metric agrees with theirs. Absolute values differ between
/// machines, so with a baseline the comparison is on the relative change each node measured
/// against its own baseline: the same significance (and direction), changes within the noise
/// band of each other, or overlapping confidence intervals. Without a baseline, the values
/// themselves must be within the band.
fn metric_agrees(
    t: &crate::verdict::Metric,
    o: &crate::verdict::Metric,
    band: f64,
) -> (Option<Agreed>, f64) {
    match (t.change, o.change) {
        (Some(tc), Some(oc)) => {
            let diff = (oc - tc).abs();
            let same_conclusion = match (t.significant, o.significant) {
                (Some(false), Some(false)) => true,
                (Some(true), Some(true)) => tc.signum() == oc.signum(),
                _ => false,
            };
            let overlap = match (t.ci_low, t.ci_high, o.ci_low, o.ci_high) {
                (Some(a), Some(b), Some(c), Some(d)) => a <= d && c <= b,
                _ => false,
            };
            let why = if diff <= band {
                Some(Agreed::WithinBand)
            } else if same_conclusion {
                Some(Agreed::SameConclusion)
            } else if overlap {
                Some(Agreed::OverlappingIntervals)
            } else {
                None
            };
            (why, diff)
        }
        _ => {
            let rel = if t.patched == 0.0 {
                if o.patched == 0.0 {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else {
                (o.patched - t.patched).abs() / t.patched.abs()
            };
            ((rel <= band).then_some(Agreed::WithinBand), rel)
        }
    }
}

/// Compares two verdicts: the same answer, and every metric of theirs agreeing with ours,
/// each metric held to the band `rules` give its kind.
pub fn compare(
    theirs: &Verdict,
    ours: &Verdict,
    rules: &crate::verdict::decide::DecisionRules,
) -> (bool, Vec<MetricAgreement>) {
    let mut metrics = Vec::new();
    let mut all = true;
    for m in &theirs.metrics {
        let band = rules.band_for(&m.name);
        let o = ours.metrics.iter().find(|x| x.name == m.name);
        let (agreed, rel) = match o {
            Some(o) => {
                let (why, rel) = metric_agrees(m, o, band);
                (why, Some(rel))
            }
            None => (None, None),
        };
        all &= agreed.is_some();
        metrics.push(MetricAgreement {
            name: m.name.clone(),
            theirs: m.patched,
            ours: o.map(|o| o.patched),
            relative_difference: rel,
            band,
            within_band: rel.is_some_and(|r| r <= band),
            agreed,
        });
    }
    (theirs.verdict == ours.verdict && all, metrics)
}

/// Re-runs the evaluation a verdict describes on this node (its task, its exact budget,
/// never from the cache), signs this node's own verdict, and compares the two.
pub fn reverify(a: &ReverifyRequest) -> Result<(Agreement, Evaluation), ReverifyError> {
    let dir = crate::verdict::verify::bundle_dir_of(&a.verdict);
    // 1. The verdict must be intact (and, with trusted keys, endorsed by one of them).
    let mut trusted = a.trust.clone();
    let their_node_trusted = !trusted.is_empty();
    if trusted.is_empty() {
        trusted.push(claimed_endorser(&dir).map_err(ReverifyError::Input)?);
    }
    let theirs = crate::verdict::verify_bundle(&dir, &trusted).map_err(ReverifyError::Invalid)?;
    // 2. The patch must be the one the verdict is about.
    // Hashed whole, as `evaluate` hashes it, so the hashes compare.
    let max = crate::policy::Policy::load(a.policy.as_deref())
        .map(|p| p.gates.max_patch_bytes)
        .map_err(|e| ReverifyError::Input(e.to_string()))?;
    let hash = crate::patch::read_patch_file(&a.patch, max)
        .map_err(|e| ReverifyError::Input(e.to_string()))?
        .hash();
    if hash != theirs.verdict.patch_hash {
        return Err(ReverifyError::Input(format!(
            "patch {} has hash {hash}, but the verdict is about {}: refusing to re-verify another patch",
            a.patch.display(),
            theirs.verdict.patch_hash
        )));
    }
    // 3. This node's own evaluation: the same task and budgets, never from the cache.
    let mut req = Request::new(a.patch.clone(), a.runtime.clone());
    // The plan they ran (a verdict before plans names its one task), each task with the
    // exact budget it had.
    let v = &theirs.verdict;
    req.tasks = if v.plan.is_empty() {
        vec![v.task.clone()]
    } else {
        v.plan.iter().map(|t| t.task.clone()).collect()
    };
    req.task_budgets = v
        .plan
        .iter()
        .filter_map(|t| Some((t.task.clone(), budgets_of(&t.budget.as_ref()?.limits))))
        .collect();
    req.policy = a.policy.clone();
    req.out = a.out.clone();
    req.key = a.key.clone();
    req.budget = budgets_of(&theirs.verdict.budget.limits);
    req.use_cache = false;
    req.ledger = LedgerChoice::Default;
    // This node's verdict answers their proposal only when a trusted key endorsed theirs:
    // a bundle checked against its own claimed endorser alone may name any live proposal,
    // and this node's signature must not carry that claim into its vote count.
    req.proposal = if their_node_trusted {
        theirs.verdict.proposal_id.clone()
    } else {
        None
    };
    let ours = evaluate(&req)?;
    let rules = crate::policy::Policy::load(a.policy.as_deref())
        .map(|p| p.decision)
        .unwrap_or_default();
    let (agree, metrics) = compare(&theirs.verdict, &ours.verdict, &rules);
    let report = Agreement {
        agree,
        theirs: theirs.verdict.verdict,
        ours: ours.verdict.verdict,
        their_node: theirs.node_key.to_string(),
        their_node_trusted,
        noise_band: rules.noise_band,
        metrics,
        our_bundle: ours.out_dir.clone(),
        our_run_id: ours.verdict.run_id.clone(),
    };
    Ok((report, ours))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::decide::DecisionRules;
    use crate::verdict::Metric;

    /// Rules with one band for every metric.
    fn flat(band: f64) -> DecisionRules {
        DecisionRules {
            noise_band: band,
            bands: Default::default(),
            ..DecisionRules::default()
        }
    }

    #[test]
    fn each_metric_is_held_to_the_band_of_its_kind() {
        // The default policy: timing percentiles 10%, byte counts exact.
        let rules = DecisionRules::default();
        let a = verdict_with(
            VerdictKind::Approve,
            &[("p99_ms", 100.0), ("out_bytes", 1000.0)],
        );
        let b = verdict_with(
            VerdictKind::Approve,
            &[("p99_ms", 106.0), ("out_bytes", 1005.0)],
        );
        let (agree, m) = compare(&a, &b, &rules);
        assert!(!agree, "0.5% apart on an exact metric is a disagreement");
        assert!(m[0].within_band && m[0].band > 0.05, "{:?}", m[0]);
        assert!(!m[1].within_band && m[1].band == 0.0, "{:?}", m[1]);
        // With one flat 1% band the same p99 disagrees and the bytes agree.
        let (_, m) = compare(&a, &b, &flat(0.01));
        assert!(!m[0].within_band && m[1].within_band);
    }

    fn verdict_with(kind: VerdictKind, metrics: &[(&str, f64)]) -> Verdict {
        let mut v: Verdict = serde_json::from_value(serde_json::json!({
            "header": {"schema": {"generation": 1, "version": "1.0"}, "message_type": "Verdict",
                       "message_id": "00000000-0000-4000-8000-000000000000", "timestamp": "2026-01-01T00:00:00Z"},
            "verdict": "APPROVE", "confidence": 0.9,
            "patch_hash": format!("sha256:{}", "0".repeat(64)), "task_hash": format!("sha256:{}", "1".repeat(64)),
            "state_hash": format!("sha256:{}", "2".repeat(64)), "source_hash": format!("sha256:{}", "3".repeat(64)),
            "evaluation_summary": "s", "caveats": [], "tests": {"passed": 1, "failed": 0, "flaky": 0},
            "metrics": [], "budget": {"limits": {}, "used": {"wall_s": 0.0, "cpu_s": 0.0, "memory_peak_bytes": 0,
            "disk_bytes": 0, "pids_peak": 0, "api_cost_usd": 0.0}}, "isolation": {}, "artifacts": [],
            "successor_key": "ed25519:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", "run_id": "r", "task": "t"
        }))
        .unwrap();
        v.verdict = kind;
        v.metrics = metrics
            .iter()
            .map(|(n, x)| Metric {
                name: n.to_string(),
                patched: *x,
                ..Default::default()
            })
            .collect();
        v
    }

    #[test]
    fn agreement_needs_the_same_answer_and_metrics_within_the_band() {
        let a = verdict_with(VerdictKind::Approve, &[("p99_ms", 100.0), ("bytes", 0.0)]);
        let b = verdict_with(VerdictKind::Approve, &[("p99_ms", 100.5), ("bytes", 0.0)]);
        assert!(compare(&a, &b, &flat(0.01)).0);
        let c = verdict_with(VerdictKind::Approve, &[("p99_ms", 103.0), ("bytes", 0.0)]);
        let (agree, m) = compare(&a, &c, &flat(0.01));
        assert!(!agree);
        assert!(!m[0].within_band);
        let d = verdict_with(
            VerdictKind::NeedsRevision,
            &[("p99_ms", 100.0), ("bytes", 0.0)],
        );
        assert!(!compare(&a, &d, &flat(0.01)).0);
        let e = verdict_with(VerdictKind::Approve, &[("p99_ms", 100.0)]);
        assert!(
            !compare(&a, &e, &flat(0.01)).0,
            "a metric missing from ours is a disagreement"
        );
    }

    #[test]
    fn with_baselines_the_relative_changes_are_compared() {
        // Different machines: absolute values far apart, the same significant 40% gain.
        let mut a = verdict_with(VerdictKind::Approve, &[("p99_ms", 10.0)]);
        let mut b = verdict_with(VerdictKind::Approve, &[("p99_ms", 20.0)]);
        for (v, c) in [(&mut a, -0.40), (&mut b, -0.38)] {
            v.metrics[0].baseline = Some(1.0);
            v.metrics[0].change = Some(c);
            v.metrics[0].significant = Some(true);
        }
        assert!(compare(&a, &b, &flat(0.01)).0);
        // One node saw a significant gain, the other a significant loss: disagreement.
        b.metrics[0].change = Some(0.30);
        assert!(!compare(&a, &b, &flat(0.01)).0);
        // Neither significant: agreement whatever the noise.
        a.metrics[0].significant = Some(false);
        b.metrics[0].significant = Some(false);
        let (agree, m) = compare(&a, &b, &flat(0.01));
        assert!(agree);
        // 2 points apart, beyond the 1% band: they agree, but not "within the band".
        assert!(!m[0].within_band);
        assert_eq!(m[0].agreed, Some(Agreed::SameConclusion));
    }

    #[test]
    fn budgets_are_carried_over() {
        let mut v = verdict_with(VerdictKind::Approve, &[]);
        v.budget.limits.wall_s = Some(600.0);
        v.budget.limits.memory_bytes = Some(1 << 30);
        v.budget.limits.pids = Some(64);
        v.budget.limits.cpu_time_s = Some(90.0);
        let b = budgets_of(&v.budget.limits);
        assert_eq!(b.wall, Some(Duration::from_secs(600)));
        assert_eq!(b.memory_bytes, Some(1 << 30));
        assert_eq!(b.pids, Some(64));
        assert_eq!(b.cpu_time, Some(Duration::from_secs(90)));
        // The budget a verdict records is the budget a replay gets, exactly.
        let mut replay = crate::budget::Budgets::default();
        replay.apply(&b).unwrap();
        assert_eq!(replay.wall, Duration::from_secs(600));
        assert_eq!(replay.cpu_time, Some(Duration::from_secs(90)));
    }
}
