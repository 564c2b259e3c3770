//! What the supervisor learned about one evaluation: the input of the decision.

use std::collections::BTreeMap;

use crate::task::results::TestReport;

/// Everything the supervisor learned about one evaluation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evidence {
    /// `(gate, reason)` if a policy gate stopped the patch.
    pub gate: Option<(String, String)>,
    /// The patch did not apply (names the file and hunk).
    pub apply_error: Option<String>,
    /// The task could not run at all (sandbox setup failed, command not found: exit 127/126).
    pub run_error: Option<String>,
    /// Who produced the tests and metrics (None: not said, as in unit tests).
    pub provenance: Option<crate::verdict::Provenance>,
    /// The budget that was blown.
    pub budget_exceeded: Option<crate::budget::Exceeded>,
    /// The task's exit status, if it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed the task, if one did.
    pub signal: Option<i32>,
    /// Parsed test results, if the task declares them.
    pub tests: Option<TestReport>,
    /// The declared results file was missing or unparsable.
    pub results_error: Option<String>,
    /// Metrics of the patched run (medians over its runs): `None` when the task declares no
    /// metrics file; `Some` when it does, empty when the patched side reported no metric
    /// (or none usable: then `metrics_error` says why).
    pub metrics: Option<BTreeMap<String, f64>>,
    /// Metrics of the baseline (unpatched) runs, whenever a baseline ran (whatever the
    /// patched side reported): what it reported and the patched side did not is missing.
    pub baseline_metrics: Option<BTreeMap<String, f64>>,
    /// The declared metrics file was missing or unparsable.
    pub metrics_error: Option<String>,
    /// Why a baseline run is no evidence (it blew a budget, could not start, or its report
    /// or its judge failed), when the task declares metrics: its samples were left out, so
    /// the comparison is incomplete and the task is not approved.
    pub baseline_error: Option<String>,
    /// Usage to quote when a budget blew, e.g. `"wall 2.0 s of 2 s"`.
    pub usage_summary: Option<String>,
    /// Per-metric statistics over repeated runs (baseline vs patched samples), when the
    /// task ran more than once per side. With them, a change counts only when significant.
    pub metric_stats: BTreeMap<String, crate::verdict::stats::Comparison>,
    /// Per-metric sequential assessments over baseline/patched pairs (see
    /// [`crate::verdict::sequential`]); when present they decide the metric's class.
    pub assessments: BTreeMap<String, Assessed>,
    /// Files of the protected tree (the manifest's `protected` paths) that differ, after a
    /// run, from the parent's snapshot: what the run changed, added or removed there (or
    /// could not be checked). Any entry is a REJECT.
    pub protected_changes: Vec<ProtectedChange>,
}

/// One metric's sequential assessment, as the evaluation recorded it.
#[derive(Debug, Clone, PartialEq)]
pub struct Assessed {
    /// Equivalent, higher, lower or inconclusive (direction-free).
    pub outcome: crate::verdict::sequential::Outcome,
    /// The interval the outcome was read from (`1 − alpha`).
    pub ci: Option<(f64, f64)>,
    /// The band it was judged against.
    pub band: f64,
    /// The error level of the deciding (or last) look.
    pub alpha: f64,
    /// Why the task stopped running pairs.
    pub stopped: String,
    /// The seed of the side order.
    pub order_seed: u64,
}

/// How a protected path differs from the parent's snapshot after a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ChangeKind {
    /// Its content, kind, mode or link target changed.
    Modified,
    /// It is new (it matches a protected pattern and was not in the parent's tree).
    Added,
    /// It is gone.
    Removed,
    /// It could not be read back to be checked (fork fails closed: a REJECT).
    Unchecked,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Modified => "modified",
            ChangeKind::Added => "added",
            ChangeKind::Removed => "removed",
            ChangeKind::Unchecked => "could not be checked",
        }
    }
}

/// One protected path that differs from the parent's snapshot after a run.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ProtectedChange {
    /// Relative to the runtime's source tree (as the manifest's patterns are); `.` is the
    /// tree itself (e.g. the successor replaced its workspace).
    pub path: String,
    pub change: ChangeKind,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::decide::{decide, DecisionRules};
    use crate::verdict::kind::VerdictKind;

    #[test]
    fn a_changed_protected_tree_is_a_reject_naming_each_file() {
        let mut e = Evidence {
            exit_code: Some(0),
            tests: Some(crate::verdict::decide::tests::report(3, 0, 0, 0)),
            ..Default::default()
        };
        assert_eq!(
            decide(&e, &DecisionRules::default()).verdict,
            VerdictKind::Approve
        );
        e.protected_changes = vec![
            ProtectedChange {
                path: "tests/test_a.py".into(),
                change: ChangeKind::Modified,
            },
            ProtectedChange {
                path: "tests/conftest.py".into(),
                change: ChangeKind::Added,
            },
            ProtectedChange {
                path: "tests/test_b.py".into(),
                change: ChangeKind::Removed,
            },
        ];
        let d = decide(&e, &DecisionRules::default());
        assert_eq!(d.verdict, VerdictKind::Reject);
        assert_eq!(d.confidence, 1.0);
        for want in [
            "tests/test_a.py modified",
            "tests/conftest.py added",
            "tests/test_b.py removed",
        ] {
            assert!(d.summary.contains(want), "{want}: {}", d.summary);
        }
    }

    /// A task that declares a metrics file whose patched side reported none (it wrote `{}`)
    /// is never approved, whatever the policy does with regressions, and with a baseline
    /// it is at least as strict as a metric missing from the patched side; no caveat says
    /// the task declares no metrics.
    #[test]
    fn a_declared_metrics_file_with_no_metric_is_never_approved() {
        use crate::verdict::decide::tests::m;
        let human = DecisionRules {
            self_reported: crate::verdict::decide::SelfReported::Accept,
            ..DecisionRules::default()
        };
        let lenient = DecisionRules {
            regression_is: VerdictKind::Approve,
            ..human.clone()
        };
        let strict = DecisionRules {
            regression_is: VerdictKind::Reject,
            ..human.clone()
        };
        let none = Evidence {
            exit_code: Some(0),
            provenance: Some(crate::verdict::Provenance::SelfReported),
            metrics: Some(BTreeMap::new()),
            ..Default::default()
        };
        let with_baseline = Evidence {
            baseline_metrics: m(&[
                ("compressed_bytes", 296_000.0),
                ("p99_ms", 0.61),
                ("peak_memory_kb", 16_000.0),
                ("ratio", 0.86),
            ]),
            ..none.clone()
        };
        for (e, rules, want) in [
            (&none, &human, VerdictKind::NeedsRevision),
            (&none, &lenient, VerdictKind::NeedsRevision),
            (&none, &strict, VerdictKind::NeedsRevision),
            (&with_baseline, &human, VerdictKind::NeedsRevision),
            (&with_baseline, &lenient, VerdictKind::NeedsRevision),
            (&with_baseline, &strict, VerdictKind::Reject),
        ] {
            let d = decide(e, rules);
            let ctx = format!(
                "{:?} / {:?}: {d:?}",
                e.baseline_metrics, rules.regression_is
            );
            assert_eq!(d.verdict, want, "{ctx}");
            assert!(
                d.summary.starts_with(
                    "The patched run reported no metrics, although the task declares them"
                ),
                "{ctx}"
            );
            assert!(
                !d.caveats.iter().any(|c| c.contains("declares no")),
                "a false caveat: {ctx}"
            );
            if e.baseline_metrics.is_some() {
                assert!(
                    d.summary
                        .contains("compressed_bytes, p99_ms, peak_memory_kb and ratio"),
                    "{ctx}"
                );
            }
        }
    }
}
