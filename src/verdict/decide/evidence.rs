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
    /// Metrics of the patched run.
    pub metrics: Option<BTreeMap<String, f64>>,
    /// Metrics of the baseline (unpatched) run, when the task asks for one.
    pub baseline_metrics: Option<BTreeMap<String, f64>>,
    /// The declared metrics file was missing or unparsable.
    pub metrics_error: Option<String>,
    /// Usage to quote when a budget blew, e.g. `"wall 2.0 s of 2 s"`.
    pub usage_summary: Option<String>,
    /// Per-metric statistics over repeated runs (baseline vs patched samples), when the
    /// task ran more than once per side. With them, a change counts only when significant.
    pub metric_stats: BTreeMap<String, crate::verdict::stats::Comparison>,
}
