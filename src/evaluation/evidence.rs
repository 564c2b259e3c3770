//! The evidence of one task's runs: the run that speaks for each replica, the metric
//! medians and their statistics against the baseline. Read by the task's decision
//! ([`super::task_run`]); nothing here decides.

use super::collect::RunResult;
use super::plan::TaskPlan;
use crate::budget::Exceeded;
use crate::verdict::decide::Evidence;

/// Metric samples across runs: name -> values. Every name of every run is kept: the runs
/// were admitted through [`MetricNames`], so there are at most
/// [`MAX_METRICS`](crate::task::results::MAX_METRICS) of them.
pub fn samples(runs: &[RunResult]) -> std::collections::BTreeMap<String, Vec<f64>> {
    samples_of(runs)
}

fn samples_of<'a>(
    runs: impl IntoIterator<Item = &'a RunResult>,
) -> std::collections::BTreeMap<String, Vec<f64>> {
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

/// Why a baseline run is no evidence, or None when it is: it blew a budget, could not
/// start, or its test report (or its judge) failed. Such a run gives no metric samples
/// ([`baseline_samples`]), and a task that declares metrics is not approved on what is left
/// (the decision names the failure).
pub fn baseline_failure(r: &RunResult) -> Option<String> {
    if let Some(b) = r.outcome.budget_exceeded {
        return Some(if r.over_evaluation_wall {
            "the evaluation's wall budget ran out during it".into()
        } else {
            format!("it exceeded its {} budget", b.as_str())
        });
    }
    if let Some(e) = &r.outcome.exec_error {
        return Some(format!("it could not start: {e}"));
    }
    r.results_error.clone()
}

/// The baseline's metric samples: those of its runs that are evidence ([`baseline_failure`]).
pub fn baseline_samples(baseline: &[RunResult]) -> std::collections::BTreeMap<String, Vec<f64>> {
    samples_of(baseline.iter().filter(|r| baseline_failure(r).is_none()))
}

/// The distinct metric names one side of a task reported so far (the patched side over
/// every replica, or the baseline), capped at [`MAX_METRICS`](crate::task::results::MAX_METRICS)
/// across its runs as one metrics file is within itself: names that change from run to
/// run (a run id in the name) would otherwise add up without bound, in memory and in the
/// verdict. A run whose new names would pass the cap has its metrics refused whole, as an
/// unusable metrics file (never a truncated set: a decision on some of the names could
/// approve what the others would not).
#[derive(Debug, Default)]
pub struct MetricNames {
    names: std::collections::BTreeSet<String>,
    /// The first refusal, for the baseline's side (its runs' metrics errors are not the
    /// patched side's evidence otherwise).
    pub refused: Option<String>,
}

impl MetricNames {
    /// Admits `run`'s metrics, or refuses them (see [`MetricNames`]); `file` is the task's
    /// declared metrics file and `side` names the side in the message.
    pub fn admit(&mut self, run: &mut RunResult, file: &str, side: &str) {
        use crate::task::results::MAX_METRICS;
        let Some(metrics) = &run.metrics else {
            return;
        };
        let new = metrics.keys().filter(|k| !self.names.contains(*k)).count();
        if self.names.len() + new <= MAX_METRICS {
            self.names.extend(metrics.keys().cloned());
            return;
        }
        let why = format!(
            "{file}: this {side} run reported {new} metric names that no earlier run of the task \
             did, beyond the {MAX_METRICS} distinct names a task may report across its runs and \
             replicas ({} already); its metrics were not used. Report the same names in every \
             run: a run id or a time belongs in a value or a log, not in a metric's name",
            self.names.len()
        );
        run.metrics = None;
        run.metrics_error = Some(why.clone());
        self.refused.get_or_insert(why);
    }
}

/// The run that speaks for a replica's runs: the first that blew a budget or could not
/// start (a REJECT), else the first whose test report was missing or unparsable (so that the
/// evidence's results and their error come from one run), else the first whose report ran
/// no test (none, or all skipped: alone, "No tests ran"; never outvoted by another run's
/// passing report), else the first with failing tests, else the first that exited non-zero,
/// else the first.
fn speaking_run(runs: &[RunResult]) -> usize {
    runs.iter()
        .position(|r| r.outcome.budget_exceeded.is_some() || r.outcome.exec_error.is_some())
        .or_else(|| runs.iter().position(|r| r.results_error.is_some()))
        .or_else(|| {
            runs.iter()
                .position(|r| r.tests.as_ref().is_some_and(|t| t.executed() == 0))
        })
        .or_else(|| {
            runs.iter()
                .position(|r| r.tests.as_ref().is_some_and(|t| t.failed() > 0))
        })
        .or_else(|| runs.iter().position(|r| r.outcome.exit_code != 0))
        .unwrap_or(0)
}

/// The evidence of one replica's runs: the run that speaks ([`speaking_run`]), metric
/// medians and their statistics. `baseline_samples` are [`baseline_samples`]'s.
pub fn evidence_for(
    t: &TaskPlan,
    runs: &[RunResult],
    baseline: &[RunResult],
    baseline_samples: &std::collections::BTreeMap<String, Vec<f64>>,
    rules: &crate::verdict::decide::DecisionRules,
    seed: u64,
) -> (Evidence, usize) {
    let chosen = speaking_run(runs);
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
        // Any run's unusable report counts, as any run's unusable metrics do: a run whose
        // report is missing is never outvoted by another's passing one. (The speaking run is
        // that run unless a budget or a failed start speaks, which rejects anyway.)
        results_error: r
            .results_error
            .clone()
            .or_else(|| runs.iter().find_map(|r| r.results_error.clone())),
        metrics_error: runs.iter().find_map(|r| r.metrics_error.clone()),
        protected_changes: runs
            .iter()
            .flat_map(|r| r.protected_changes.iter().cloned())
            .collect(),
        // The metrics are compared with the baseline's: a baseline run that is no evidence
        // leaves that comparison incomplete, whatever the others gave.
        baseline_error: baseline
            .iter()
            .find_map(baseline_failure)
            .filter(|_| t.spec.metrics.is_some()),
        ..Default::default()
    };
    let patched_samples = samples(runs);
    let med = |m: &std::collections::BTreeMap<String, Vec<f64>>| {
        m.iter()
            .filter_map(|(k, v)| crate::verdict::stats::median(v).map(|x| (k.clone(), x)))
            .collect::<std::collections::BTreeMap<String, f64>>()
    };
    // A declared metrics file always gives the patched side its metrics, none reported
    // included: a patched side that writes `{}` has reported no metric, which the decision
    // must see as such (not as a task that declares none).
    if t.spec.metrics.is_some() {
        e.metrics = Some(med(&patched_samples));
    }
    // The baseline's metrics whenever a baseline ran, whatever the patched side reported:
    // what the baseline reported and the patched side did not is what the decision names
    // as missing.
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
    (e, chosen)
}

/// Runs and a task to read evidence from, for the tests of this module and its callers.
#[cfg(test)]
pub(super) mod testing {
    use super::super::collect::RunResult;
    use super::super::plan::TaskPlan;
    use crate::task::results::{TestCase, TestOutcome, TestReport};
    use std::collections::BTreeMap;

    /// A task of the demo's kind: `extra` adds to `command = ["true"]`.
    pub fn task(extra: &str) -> TaskPlan {
        let spec: crate::manifest::TaskSpec =
            toml::from_str(&format!("command = [\"true\"]\n{extra}")).unwrap();
        TaskPlan {
            name: "t".into(),
            spec,
            hash: String::new(),
            budgets: crate::budget::Budgets::default(),
            sandbox: crate::policy::Policy::builtin().unwrap().sandbox_spec(),
            forwards: Vec::new(),
            prefix: String::new(),
        }
    }

    /// A run that exited 0 and left nothing.
    pub fn run() -> RunResult {
        RunResult {
            outcome: crate::sandbox::Outcome {
                exit_code: 0,
                signal: None,
                budget_exceeded: None,
                usage: Default::default(),
                isolation: Default::default(),
                interrupted: false,
                cancelled: false,
                exec_error: None,
            },
            over_evaluation_wall: false,
            tests: None,
            results_error: None,
            metrics: None,
            metrics_error: None,
            artifacts: Vec::new(),
            notes: Vec::new(),
            protected_changes: Vec::new(),
        }
    }

    /// A run that reported `metrics`.
    pub fn with_metrics(metrics: &[(&str, f64)]) -> RunResult {
        RunResult {
            metrics: Some(
                metrics
                    .iter()
                    .map(|(k, v)| (k.to_string(), *v))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..run()
        }
    }

    /// A report with these cases.
    pub fn report(cases: &[(&str, TestOutcome)]) -> TestReport {
        TestReport {
            cases: cases
                .iter()
                .map(|(name, outcome)| TestCase {
                    name: name.to_string(),
                    classname: None,
                    outcome: *outcome,
                    time_s: None,
                    message: None,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{report, run, task, with_metrics};
    use super::*;
    use crate::task::results::TestOutcome;
    use crate::verdict::decide::{decide, DecisionRules, SelfReported};
    use crate::verdict::VerdictKind;

    const DEMO: [(&str, f64); 4] = [
        ("compressed_bytes", 296_000.0),
        ("p99_ms", 0.61),
        ("peak_memory_kb", 16_000.0),
        ("ratio", 0.86),
    ];

    fn human() -> DecisionRules {
        DecisionRules {
            self_reported: SelfReported::Accept,
            ..DecisionRules::default()
        }
    }

    /// The patched side writes `{}` to the declared metrics file: the baseline's metrics are
    /// still carried, the patched side reported none, and the decision is no approval.
    #[test]
    fn the_baselines_metrics_are_carried_when_the_patched_side_reports_none() {
        let t = task("metrics = \"metrics.json\"\nbaseline = true\nrepeat = 3\n");
        let patched: Vec<RunResult> = (0..3).map(|_| with_metrics(&[])).collect();
        let baseline: Vec<RunResult> = (0..3).map(|_| with_metrics(&DEMO)).collect();
        let rules = human();
        let (e, _) = evidence_for(&t, &patched, &baseline, &samples(&baseline), &rules, 0);
        let base = e.baseline_metrics.as_ref().expect("the baseline's metrics");
        assert_eq!(
            base.keys().map(String::as_str).collect::<Vec<_>>(),
            ["compressed_bytes", "p99_ms", "peak_memory_kb", "ratio"]
        );
        assert_eq!(
            e.metrics,
            Some(Default::default()),
            "declared, none reported"
        );
        let d = decide(&e, &rules);
        assert_eq!(d.verdict, VerdictKind::NeedsRevision, "{d:?}");
        assert!(
            !d.caveats.iter().any(|c| c.contains("declares no")),
            "{d:?}"
        );
        // One patched run of three reported: the others' silence is no metric either, and
        // the baseline's are compared with what was reported.
        let mut some = patched;
        some[1] = with_metrics(&DEMO);
        let (e, _) = evidence_for(&t, &some, &baseline, &samples(&baseline), &rules, 0);
        assert_eq!(e.metrics.as_ref().map(|m| m.len()), Some(4));
        assert_eq!(e.baseline_metrics.as_ref().map(|m| m.len()), Some(4));
    }

    /// A baseline run that is no evidence (its judge failed after writing metrics, it blew
    /// a budget, it could not start) gives no samples, and a task that declares metrics is
    /// not approved on what is left: NEEDS_REVISION naming the baseline's failure. A task
    /// that declares none compares nothing with the baseline: its failure decides nothing.
    #[test]
    fn a_failed_baseline_run_gives_no_samples_and_no_approval() {
        use crate::sandbox::BudgetKind;
        let t = task("metrics = \"metrics.json\"\nbaseline = true\n");
        let patched = [with_metrics(&DEMO)];
        let failed = |results_error: Option<&str>, budget, exec_error: Option<&str>| {
            let mut r = with_metrics(&DEMO);
            r.results_error = results_error.map(str::to_string);
            r.outcome.budget_exceeded = budget;
            r.outcome.exec_error = exec_error.map(str::to_string);
            r
        };
        let judge = "the judge failed: it exceeded its wall budget; its reports are not evidence";
        let cases = [
            (failed(Some(judge), None, None), "the judge failed"),
            (
                failed(None, Some(BudgetKind::Wall), None),
                "it exceeded its wall budget",
            ),
            (
                failed(None, None, Some("exec: sh")),
                "it could not start: exec: sh",
            ),
        ];
        for (b, said) in cases {
            // A good baseline run beside it does not make up for it.
            let baseline = [b, with_metrics(&DEMO)];
            let bs = baseline_samples(&baseline);
            assert!(bs.values().all(|v| v.len() == 1), "{bs:?}");
            let (e, _) = evidence_for(&t, &patched, &baseline, &bs, &human(), 0);
            let d = decide(&e, &human());
            assert_eq!(d.verdict, VerdictKind::NeedsRevision, "{d:?}");
            assert!(
                d.summary
                    .starts_with("The baseline (unpatched) run is no evidence")
                    && d.summary.contains(said),
                "{}",
                d.summary
            );
            assert!(baseline_samples(&baseline[..1]).is_empty());
        }
        // The control: a baseline that is evidence approves the same patched run.
        let good = [with_metrics(&DEMO)];
        let (e, _) = evidence_for(&t, &patched, &good, &baseline_samples(&good), &human(), 0);
        assert_eq!(decide(&e, &human()).verdict, VerdictKind::Approve);
        // No metrics declared: the baseline's failure decides nothing.
        let t = task("baseline = true\n");
        let baseline = [failed(Some(judge), None, None)];
        let (e, _) = evidence_for(&t, &[run()], &baseline, &Default::default(), &human(), 0);
        assert_eq!(e.baseline_error, None);
        assert_eq!(decide(&e, &human()).verdict, VerdictKind::Approve);
    }

    /// A task that declares no metrics has none in its evidence, and no baseline metrics to
    /// speak of when the baseline reported none either.
    #[test]
    fn undeclared_metrics_stay_absent() {
        let t = task("baseline = true\n");
        let (e, _) = evidence_for(&t, &[run()], &[run()], &Default::default(), &human(), 0);
        assert_eq!(e.metrics, None);
        let d = decide(&e, &human());
        assert_eq!(d.verdict, VerdictKind::Approve, "{d:?}");
        assert!(d
            .caveats
            .iter()
            .any(|c| c.starts_with("Only the exit status")));
    }

    /// With repeats, a run whose test report was missing or unparsable counts even when
    /// another run's report failed a test or passed: it speaks for the replica.
    #[test]
    fn a_results_error_in_any_run_counts_and_that_run_speaks() {
        let t = task("results = { format = \"junit\", path = \"tests.xml\" }\nrepeat = 3\n");
        let passing = || RunResult {
            tests: Some(report(&[("a", TestOutcome::Passed)])),
            ..run()
        };
        let missing = RunResult {
            results_error: Some("tests.xml: report `tests.xml` does not exist".into()),
            ..run()
        };
        let failing = RunResult {
            tests: Some(report(&[("a", TestOutcome::Failed)])),
            ..run()
        };
        let runs = vec![passing(), missing, passing()];
        let (e, chosen) = evidence_for(&t, &runs, &[], &Default::default(), &human(), 0);
        assert_eq!(chosen, 1);
        assert!(e.results_error.is_some(), "{e:?}");
        assert_eq!(e.tests, None, "the speaking run's own report");
        let d = decide(&e, &human());
        assert_eq!(d.verdict, VerdictKind::NeedsRevision, "{d:?}");
        assert!(d.summary.contains("does not exist"), "{}", d.summary);
        // Before a failing test: the run whose report is unusable speaks.
        let mut runs = runs;
        runs[0] = failing;
        let (e, chosen) = evidence_for(&t, &runs, &[], &Default::default(), &human(), 0);
        assert_eq!((chosen, e.results_error.is_some()), (1, true));
    }

    /// With repeats, a run whose report ran no test (none at all, or all skipped) is never
    /// outvoted by another run's passing report: it speaks, and the verdict is the one it
    /// would get alone ("No tests ran"). A judged task's runs likewise.
    #[test]
    fn a_run_that_ran_no_test_speaks_over_passing_runs() {
        let with = |cases: &[(&str, TestOutcome)]| RunResult {
            tests: Some(report(cases)),
            ..run()
        };
        let passing = || with(&[("a", TestOutcome::Passed), ("b", TestOutcome::Passed)]);
        let missing = || RunResult {
            results_error: Some("tests.xml: report `tests.xml` does not exist".into()),
            ..run()
        };
        for extra in ["", "judge = [\"j\"]\n"] {
            let t = task(&format!(
                "results = {{ format = \"junit\", path = \"tests.xml\" }}\nrepeat = 3\n{extra}"
            ));
            let speaks =
                |runs: &[RunResult]| evidence_for(&t, runs, &[], &Default::default(), &human(), 0);
            for (nothing, said) in [
                (
                    &[][..],
                    "No tests ran: the test report contains no test cases.",
                ),
                (
                    &[("a", TestOutcome::Skipped)][..],
                    "No tests ran: all 1 skipped.",
                ),
            ] {
                let (e, chosen) = speaks(&[passing(), with(nothing), passing()]);
                assert_eq!(chosen, 1, "{extra}");
                assert_eq!(e.tests, Some(report(nothing)));
                let d = decide(&e, &human());
                assert_eq!(d.verdict, VerdictKind::NeedsRevision, "{d:?}");
                assert_eq!(d.summary, said);
            }
            // A missing report still speaks first; a failing one speaks after an empty one.
            assert_eq!(speaks(&[with(&[]), missing(), passing()]).1, 1);
            let failing = with(&[("a", TestOutcome::Failed)]);
            assert_eq!(speaks(&[failing, passing(), with(&[])]).1, 2);
        }
    }
}
