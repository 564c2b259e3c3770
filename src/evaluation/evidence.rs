//! The evidence of one task's runs: the run that speaks for each replica, the metric
//! medians and their statistics against the baseline. Read by the task's decision
//! ([`super::task_run`]); nothing here decides.

use super::collect::RunResult;
use super::plan::TaskPlan;
use crate::budget::Exceeded;
use crate::verdict::decide::Evidence;

/// Metric samples across runs: name -> values.
pub fn samples(runs: &[RunResult]) -> std::collections::BTreeMap<String, Vec<f64>> {
    let mut out: std::collections::BTreeMap<String, Vec<f64>> = std::collections::BTreeMap::new();
    for r in runs {
        if let Some(m) = &r.metrics {
            for (k, v) in m {
                out.entry(k.clone()).or_default().push(*v);
            }
        }
    }
    out
}

/// The evidence of one replica's runs: the run that speaks (a blown budget, a failed
/// start, failing tests, else the first), metric medians and their statistics.
pub fn evidence_for(
    t: &TaskPlan,
    runs: &[RunResult],
    baseline: &[RunResult],
    baseline_samples: &std::collections::BTreeMap<String, Vec<f64>>,
    rules: &crate::verdict::decide::DecisionRules,
    seed: u64,
) -> (Evidence, usize) {
    let chosen = runs
        .iter()
        .position(|r| r.outcome.budget_exceeded.is_some() || r.outcome.exec_error.is_some())
        .or_else(|| {
            runs.iter()
                .position(|r| r.tests.as_ref().is_some_and(|t| t.failed() > 0))
        })
        .or_else(|| runs.iter().position(|r| r.outcome.exit_code != 0))
        .unwrap_or(0);
    let r = &runs[chosen];
    let o = &r.outcome;
    let mut e = Evidence {
        exit_code: if o.signal.is_none() {
            Some(o.exit_code)
        } else {
            None
        },
        signal: o.signal,
        budget_exceeded: o.budget_exceeded.map(|b| {
            if r.over_evaluation_wall {
                Exceeded::EvaluationWall
            } else {
                Exceeded::Run(b)
            }
        }),
        usage_summary: o.budget_exceeded.map(|b| {
            if r.over_evaluation_wall {
                format!(
                    "evaluation_wall: the evaluation's runs together reached its {:.1} s wall budget",
                    t.budgets.evaluation_wall.as_secs_f64()
                )
            } else {
                crate::budget::describe(b, &t.budgets, &o.usage)
            }
        }),
        run_error: o.exec_error.clone(),
        provenance: Some(t.provenance()),
        tests: r.tests.clone(),
        results_error: r.results_error.clone(),
        metrics_error: runs.iter().find_map(|r| r.metrics_error.clone()),
        protected_changes: runs
            .iter()
            .flat_map(|r| r.protected_changes.iter().cloned())
            .collect(),
        ..Default::default()
    };
    let patched_samples = samples(runs);
    if !patched_samples.is_empty() {
        let med = |m: &std::collections::BTreeMap<String, Vec<f64>>| {
            m.iter()
                .filter_map(|(k, v)| crate::verdict::stats::median(v).map(|x| (k.clone(), x)))
                .collect::<std::collections::BTreeMap<String, f64>>()
        };
        e.metrics = Some(med(&patched_samples));
        if !baseline.is_empty() {
            e.baseline_metrics = Some(med(baseline_samples));
        }
        // Statistics need repeated samples; single runs are judged on the noise band.
        if !baseline.is_empty() && runs.len() > 1 && baseline.len() > 1 {
            let cfg = crate::verdict::stats::CompareConfig {
                method: rules.method,
                alpha: rules.alpha,
                noise_band: rules.noise_band,
                seed: 0x666f_726b ^ seed,
                ..Default::default()
            };
            for (name, ps) in &patched_samples {
                if let Some(bs) = baseline_samples.get(name) {
                    e.metric_stats.insert(
                        name.clone(),
                        crate::verdict::stats::compare(name, bs, ps, &cfg),
                    );
                }
            }
        }
    }
    (e, chosen)
}
