//! Deciding the verdict from the evidence of one evaluation, the step after the patched
//! (and, when asked for, the baseline) runs have ended and their results were collected.
//!
//! Pure functions, no I/O: the supervisor gathers an [`Evidence`] (gates, patch application,
//! the run's end, parsed results and metrics) and [`decide`] turns it into a [`Decision`]:
//! the verdict, a confidence, a one- or two-sentence summary in the seed's style
//! ("Test suite passed (312/312). compressed_bytes improved 41.2%."), caveats, and the
//! metric comparisons.
//!
//! The parts: `evidence` holds the input ([`Evidence`]), `rules` the policy's tunable
//! [`DecisionRules`], `confidence` the confidence formula (documented there), and `wording`
//! every sentence the decision says; this module decides.
//!
//! # Rules, in order
//! 1. **REJECT** (deterministic) when a policy gate stopped the patch, the patch did not
//!    apply, a run changed, added or removed a file of the protected tree, the task could
//!    not run, or a budget was exceeded. The summary names the first of
//!    these (a budget by name, quoting the usage summary); any others become caveats.
//! 2. Otherwise every *problem* found is listed:
//!    * the declared results file is missing or unparsable (never an approval: the successor
//!      may simply have skipped writing it), or the declared metrics file is;
//!    * failing tests (`Failed` or `Error` cases), or a report in which no test ran;
//!    * a death by signal, or a non-zero exit status that no failing test explains, or an
//!      exit status that was not recorded;
//!    * a declared metrics file in which the patched runs reported no metric at all (they
//!      wrote `{}`): never an approval, whatever `regression_is` says, and REJECT when the
//!      baseline reported metrics and `regression_is` is REJECT (at least as strict as the
//!      missing metrics it stands for);
//!    * a baseline run that is no evidence (it blew a budget, could not start, or its report
//!      or judge failed) in a task that declares metrics: its samples are left out and the
//!      comparison is incomplete;
//!    * a metric that regressed beyond the noise band, or one the baseline reported and the
//!      patched run did not. These take the verdict [`DecisionRules::regression_is`]
//!      (NEEDS_REVISION by default; APPROVE there turns them into caveats).
//!
//!    The verdict is the most severe problem's (REJECT > NEEDS_REVISION); with no problem it
//!    is **APPROVE**, which therefore means: exit status 0, every executed test passed (flaky
//!    passes count, as caveats), and no metric regressed.
//!
//! A metric's `change` is relative, `(patched - baseline) / |baseline|` (negative means it went
//! down), `None` without a baseline, and `None` (unbounded) when the baseline is 0 and the
//! patched value is not or the change is too large to be a finite number. It
//! regressed when it moved in the bad direction by more than `noise_band` (strictly); the bad
//! direction is up for names matching [`DecisionRules::lower_is_better`], down otherwise.
//! With single samples (the task's `repeat = 1`) `significant` is `None` and a caveat says the
//! changes were not tested for significance.
//!
//! Deterministic rejections have confidence 1.0; every other verdict's confidence comes from
//! the strengths of its evidence (see the `confidence` module for the formula).

pub mod combine;
mod confidence;
mod evidence;
mod rules;
pub(in crate::verdict) mod wording;

use serde::Serialize;
use std::collections::BTreeMap;

use crate::verdict::kind::VerdictKind;

use confidence::{
    combine, confidence, p_flaky, p_skipped, s_failing, s_passing, s_regression,
    P_ACCEPTED_REGRESSION, P_NO_BASELINE, P_SELF_REPORTED, P_SINGLE_SAMPLE, S_BASELINE_FAILED,
    S_EXIT_ZERO, S_INCONCLUSIVE, S_METRICS_OK, S_METRIC_MISSING, S_MISSING_FILE, S_NONZERO_EXIT,
    S_NO_EXIT, S_NO_TESTS_RAN, S_SELF_REPORTED, S_SIGNAL,
};
pub use evidence::{Assessed, ChangeKind, Evidence, ProtectedChange};
pub(in crate::verdict) use rules::MetricClass;
pub use rules::{AlphaScope, ConstantChanges, DecisionRules, RulesError, SelfReported};

/// One metric, as reported in the verdict's `metrics` array (the verdict's own type).
pub use crate::verdict::Metric as MetricChange;

/// The outcome of [`decide`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// APPROVE, REJECT or NEEDS_REVISION.
    pub verdict: VerdictKind,
    /// In `[0.5, 1.0]`; see the `confidence` module for the formula.
    pub confidence: f64,
    /// One or two sentences with exact numbers.
    pub summary: String,
    /// Qualifications: flaky or skipped tests, missing baselines, unknown significance, …
    pub caveats: Vec<String>,
    /// Every metric the patched run reported, in name order.
    pub metrics: Vec<MetricChange>,
}

fn severity(v: VerdictKind) -> u8 {
    match v {
        VerdictKind::Approve => 0,
        VerdictKind::NeedsRevision => 1,
        VerdictKind::Reject => 2,
    }
}

/// One thing wrong with the evaluation: its sentence, how strongly it supports its verdict,
/// and that verdict.
struct Problem {
    sentence: String,
    strength: f64,
    verdict: VerdictKind,
}

/// Every metric the patched run reported, in name order, compared with the baseline (and
/// with the repeated samples' statistics, when there are any).
fn compare_metrics(e: &Evidence, rules: &DecisionRules) -> Vec<MetricChange> {
    let empty = BTreeMap::new();
    let patched = e.metrics.as_ref().unwrap_or(&empty);
    patched
        .iter()
        .map(|(name, &value)| {
            let base = e
                .baseline_metrics
                .as_ref()
                .and_then(|b| b.get(name))
                .copied();
            let stats = e.metric_stats.get(name);
            // `None` when unbounded: a baseline of 0, or a change too large to be finite.
            let change = match (stats, base) {
                (Some(st), _) => st.change.filter(|c| c.is_finite()),
                (None, Some(b)) => crate::verdict::stats::relative_change(b, value),
                (None, None) => None,
            };
            let finite = |x: Option<f64>| x.filter(|x| x.is_finite());
            let mut m = MetricChange {
                name: name.clone(),
                baseline: base,
                patched: value,
                change,
                significant: stats.and_then(|st| st.significant),
                ci_low: finite(stats.and_then(|st| st.ci_low)),
                ci_high: finite(stats.and_then(|st| st.ci_high)),
                p_value: finite(stats.and_then(|st| st.p_value)),
                samples: Some(stats.map(|st| st.n_patched.min(st.n_baseline)).unwrap_or(1)),
                ..MetricChange::default()
            };
            if let (Some(a), Some(_)) = (e.assessments.get(name), base) {
                use crate::verdict::sequential::Outcome;
                use crate::verdict::MetricVerdict;
                let lower_better = rules.is_lower_better(name);
                let class = match a.outcome {
                    Outcome::Equivalent => MetricVerdict::Equivalent,
                    Outcome::Inconclusive => MetricVerdict::Inconclusive,
                    Outcome::Higher if lower_better => MetricVerdict::Regressed,
                    Outcome::Lower if !lower_better => MetricVerdict::Regressed,
                    Outcome::Higher | Outcome::Lower => MetricVerdict::Improved,
                };
                m.significant = Some(matches!(
                    class,
                    MetricVerdict::Improved | MetricVerdict::Regressed
                ));
                // An interval is recorded only with both ends finite numbers.
                let ci = a.ci.filter(|c| c.0.is_finite() && c.1.is_finite());
                (m.ci_low, m.ci_high) = (ci.map(|c| c.0), ci.map(|c| c.1));
                m.class = Some(class);
                m.band = Some(a.band);
                m.alpha = Some(a.alpha);
                m.stopped = Some(a.stopped.clone());
                m.order_seed = Some(a.order_seed);
            } else if base.is_some() {
                m.band = Some(rules.band_for(name));
            }
            m
        })
        .collect()
}

/// What the patched side left out of its declared metrics.
enum Absent {
    /// It reported no metric at all; the names the baseline reported (maybe none).
    All(Vec<String>),
    /// It reported some, but not these, which the baseline reported.
    Some(Vec<String>),
}

/// What the patched side left out of its declared metrics, when its metrics file was
/// usable (an unusable one is a problem of its own).
fn absent_metrics(e: &Evidence) -> Option<Absent> {
    let patched = e.metrics.as_ref().filter(|_| e.metrics_error.is_none())?;
    let base: Vec<String> = e
        .baseline_metrics
        .iter()
        .flat_map(|b| b.keys())
        .cloned()
        .collect();
    if patched.is_empty() {
        return Some(Absent::All(base));
    }
    let missing: Vec<String> = base
        .into_iter()
        .filter(|k| !patched.contains_key(k))
        .collect();
    (!missing.is_empty()).then_some(Absent::Some(missing))
}

/// The deterministic rejections, in order: gate, patch application, protected tree, run,
/// budget.
fn rejections(e: &Evidence) -> Vec<String> {
    let mut rejections = Vec::new();
    if let Some((gate, reason)) = &e.gate {
        rejections.push(wording::gate_rejected(gate, reason));
    }
    if let Some(err) = &e.apply_error {
        rejections.push(wording::not_applied(err));
    }
    if !e.protected_changes.is_empty() {
        rejections.push(wording::protected_changed(&e.protected_changes));
    }
    if let Some(err) = &e.run_error {
        rejections.push(wording::could_not_run(err));
    }
    if let Some(budget) = e.budget_exceeded {
        rejections.push(wording::budget_exceeded(budget, e.usage_summary.as_deref()));
    }
    rejections
}

/// Decide the verdict for one evaluation. See the module documentation for the rules and the
/// `confidence` module for the confidence formula.
pub fn decide(e: &Evidence, rules: &DecisionRules) -> Decision {
    let band = rules.band();
    let mut caveats: Vec<String> = Vec::new();

    // ---- Metrics are computed first: they are reported on every path. ----
    let metrics = compare_metrics(e, rules);
    let classes: Vec<MetricClass> = metrics.iter().map(|m| rules.classify(m)).collect();

    // ---- 1. Deterministic rejections. ----
    let mut rejections = rejections(e);
    if !rejections.is_empty() {
        let summary = rejections.remove(0);
        caveats.extend(rejections.iter().map(|r| wording::also(r)));
        if let Some(t) = &e.tests {
            caveats.push(wording::tests_before_stop(t));
        }
        return Decision {
            verdict: VerdictKind::Reject,
            confidence: 1.0,
            summary,
            caveats,
            metrics,
        };
    }

    // ---- 2. Evidence-based decision. ----
    let mut problems: Vec<Problem> = Vec::new();
    let mut notes: Vec<String> = Vec::new(); // positive sentences
    let mut support: Vec<f64> = Vec::new(); // approval strengths
    let mut penalties: Vec<f64> = Vec::new(); // apply to any verdict
    let mut approve_penalties: Vec<f64> = Vec::new();
    let needs = VerdictKind::NeedsRevision;

    // Tests.
    let mut tests_explain_exit = false;
    let mut passed_count = 0usize;
    if let Some(err) = &e.results_error {
        problems.push(Problem {
            sentence: wording::results_unusable(err),
            strength: S_MISSING_FILE,
            verdict: needs,
        });
        caveats.push(wording::RESULTS_MISSING.into());
    } else if let Some(t) = &e.tests {
        let (passed, failed, skipped, flaky) = (t.passed(), t.failed(), t.skipped(), t.flaky());
        let executed = passed + failed + flaky;
        passed_count = passed + flaky;
        if failed > 0 {
            tests_explain_exit = true;
            problems.push(Problem {
                sentence: wording::tests_failed(t, failed, executed, skipped),
                strength: s_failing(failed),
                verdict: needs,
            });
        } else if executed == 0 {
            problems.push(Problem {
                sentence: wording::no_tests_ran(t),
                strength: S_NO_TESTS_RAN,
                verdict: needs,
            });
        } else {
            notes.push(wording::tests_passed(passed_count, executed, skipped));
            support.push(s_passing(passed_count));
        }
        if flaky > 0 {
            caveats.push(wording::flaky(t, flaky));
            penalties.push(p_flaky(flaky));
        }
        if skipped > 0 && executed > 0 {
            caveats.push(wording::skipped(t, skipped));
            approve_penalties.push(p_skipped(skipped, t.cases.len()));
        }
    }

    // The task's end.
    match (e.exit_code, e.signal) {
        (_, Some(sig)) => problems.push(Problem {
            sentence: wording::killed_by(sig),
            strength: S_SIGNAL,
            verdict: needs,
        }),
        (Some(0), None) => support.push(S_EXIT_ZERO),
        (Some(code), None) if !tests_explain_exit => {
            let although_tests_passed = passed_count > 0 && e.results_error.is_none();
            problems.push(Problem {
                sentence: wording::exited(code, although_tests_passed),
                strength: S_NONZERO_EXIT,
                verdict: needs,
            });
            caveats.extend(wording::exit_status_hint(code));
        }
        (Some(_), None) => {}
        (None, None) => problems.push(Problem {
            sentence: wording::EXIT_NOT_RECORDED.into(),
            strength: S_NO_EXIT,
            verdict: needs,
        }),
    }

    // Metrics.
    if let Some(why) = &e.baseline_error {
        problems.push(Problem {
            sentence: wording::baseline_failed(why),
            strength: S_BASELINE_FAILED,
            verdict: needs,
        });
    }
    if let Some(err) = &e.metrics_error {
        problems.push(Problem {
            sentence: wording::metrics_unusable(err),
            strength: S_MISSING_FILE,
            verdict: needs,
        });
        caveats.push(wording::METRICS_MISSING.into());
    }
    let of_class = |class: MetricClass| -> Vec<&MetricChange> {
        metrics
            .iter()
            .zip(&classes)
            .filter(|(_, c)| **c == class)
            .map(|(m, _)| m)
            .collect()
    };
    let regressed = of_class(MetricClass::Regressed);
    let improved = of_class(MetricClass::Improved);
    let noise = of_class(MetricClass::Noise);
    let no_baseline = of_class(MetricClass::NoBaseline);
    // Metrics the baseline reported but the patched run did not, or none at all.
    match absent_metrics(e) {
        None => {}
        Some(Absent::All(base)) => {
            // Never weaker than the missing metrics it stands for (REJECT when they are),
            // never an approval: writing `{}` is no better than writing no file.
            let verdict = if !base.is_empty() && severity(rules.regression_is) > severity(needs) {
                rules.regression_is
            } else {
                needs
            };
            problems.push(Problem {
                sentence: wording::no_metric_reported(&base),
                strength: S_METRIC_MISSING,
                verdict,
            });
        }
        Some(Absent::Some(missing)) => {
            let sentence = wording::missing_from_patched(&missing);
            if rules.regression_is == VerdictKind::Approve {
                caveats.push(sentence);
                approve_penalties.push(P_ACCEPTED_REGRESSION);
            } else {
                problems.push(Problem {
                    sentence,
                    strength: S_METRIC_MISSING,
                    verdict: rules.regression_is,
                });
            }
        }
    }
    // Informational metrics are reported but never decide the verdict.
    let (info_regressed, regressed): (Vec<&MetricChange>, Vec<&MetricChange>) = regressed
        .into_iter()
        .partition(|m| rules.is_informational(&m.name));
    let (info_inconclusive, inconclusive): (Vec<&MetricChange>, Vec<&MetricChange>) =
        of_class(MetricClass::Inconclusive)
            .into_iter()
            .partition(|m| rules.is_informational(&m.name));
    if !info_regressed.is_empty() {
        caveats.push(wording::informational(&wording::regressions(
            &info_regressed,
            band,
        )));
    }
    if !info_inconclusive.is_empty() {
        caveats.push(wording::informational(&wording::inconclusive(
            &info_inconclusive,
            band,
        )));
    }
    if !regressed.is_empty() {
        let sentence = wording::regressions(&regressed, band);
        if rules.regression_is == VerdictKind::Approve {
            caveats.push(wording::accepted_regressions(&sentence));
            approve_penalties.push(P_ACCEPTED_REGRESSION);
        } else {
            problems.push(Problem {
                sentence,
                strength: combine(
                    regressed
                        .iter()
                        .map(|m| s_regression(m.change, m.band.unwrap_or(band))),
                ),
                verdict: rules.regression_is,
            });
        }
    }
    // Not significant is not unchanged: a metric whose interval reaches beyond its band
    // after the last look is no evidence either way, and the verdict says so.
    if !inconclusive.is_empty() {
        problems.push(Problem {
            sentence: wording::inconclusive(&inconclusive, band),
            strength: S_INCONCLUSIVE,
            verdict: needs,
        });
    }
    let compared = metrics.iter().filter(|m| m.baseline.is_some()).count();
    if !improved.is_empty() {
        notes.push(wording::improvements(&improved, &noise, band));
    } else if !noise.is_empty() && regressed.is_empty() && inconclusive.is_empty() {
        notes.push(wording::unchanged(&noise, band));
    }
    if compared > 0 && regressed.is_empty() && inconclusive.is_empty() {
        support.push(S_METRICS_OK);
    }
    let untested: Vec<&MetricChange> = metrics
        .iter()
        .filter(|m| m.baseline.is_some() && m.significant.is_none())
        .collect();
    for st in e.metric_stats.values() {
        if let Some(c) = &st.caveat {
            caveats.push(c.clone());
        }
    }
    if compared > 0 && !untested.is_empty() {
        caveats.push(wording::significance_untested(
            &untested,
            !e.metric_stats.is_empty(),
            band,
        ));
        approve_penalties.push(P_SINGLE_SAMPLE);
    }
    if !no_baseline.is_empty() {
        caveats.push(wording::without_baseline(
            &no_baseline,
            e.baseline_metrics.is_some(),
        ));
        approve_penalties.push(P_NO_BASELINE);
        if compared == 0 {
            notes.push(wording::reported_without_baseline(no_baseline.len()));
        }
    }
    // Said only of a task that declares neither (`metrics` is `Some`, maybe empty, when
    // it declares a metrics file).
    if e.tests.is_none()
        && e.results_error.is_none()
        && e.metrics.is_none()
        && e.metrics_error.is_none()
    {
        caveats.push(wording::EXIT_STATUS_ONLY.into());
    }

    // Evidence the code under test produced about itself (no judge) can be forged by it.
    if e.provenance == Some(crate::verdict::Provenance::SelfReported) {
        match rules.self_reported {
            rules::SelfReported::Accept => {
                caveats.push(wording::SELF_REPORTED.into());
                approve_penalties.push(P_SELF_REPORTED);
            }
            rules::SelfReported::NeedsRevision => problems.push(Problem {
                sentence: wording::SELF_REPORTED_REFUSED.into(),
                strength: S_SELF_REPORTED,
                verdict: needs,
            }),
        }
    }

    // ---- The verdict. ----
    if problems.is_empty() {
        let mut sentences = notes;
        if sentences.is_empty() {
            sentences.push(wording::EXITED_ZERO.into());
        }
        sentences.truncate(2);
        let all: Vec<f64> = penalties
            .iter()
            .chain(&approve_penalties)
            .copied()
            .collect();
        return Decision {
            verdict: VerdictKind::Approve,
            confidence: confidence(&support, &all),
            summary: sentences.join(" "),
            caveats,
            metrics,
        };
    }
    let verdict = problems
        .iter()
        .map(|p| p.verdict)
        .max_by_key(|v| severity(*v))
        .unwrap_or(needs);
    let strengths: Vec<f64> = problems.iter().map(|p| p.strength).collect();
    let mut sentences: Vec<String> = problems.into_iter().map(|p| p.sentence).collect();
    let extra: Vec<String> = sentences.split_off(sentences.len().min(2));
    caveats.splice(0..0, extra.iter().map(|s| wording::also(s)));
    sentences.extend(notes);
    sentences.truncate(2);
    Decision {
        verdict,
        confidence: confidence(&strengths, &penalties),
        summary: sentences.join(" "),
        caveats,
        metrics,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::budget::Exceeded;
    use crate::sandbox::BudgetKind;
    use crate::task::results::{TestCase, TestOutcome, TestReport};

    fn case(name: &str, outcome: TestOutcome) -> TestCase {
        TestCase {
            name: name.into(),
            classname: None,
            outcome,
            time_s: Some(0.01),
            message: None,
        }
    }

    pub(super) fn report(passed: usize, failed: usize, flaky: usize, skipped: usize) -> TestReport {
        let mut cases = Vec::new();
        cases.extend((0..passed).map(|i| case(&format!("tests.test_ok_{i}"), TestOutcome::Passed)));
        cases
            .extend((0..failed).map(|i| case(&format!("tests.test_bad_{i}"), TestOutcome::Failed)));
        cases.extend((0..flaky).map(|i| TestCase {
            message: Some("passed after 2 failed attempts".into()),
            ..case(&format!("tests.test_flaky_{i}"), TestOutcome::Flaky)
        }));
        cases.extend(
            (0..skipped).map(|i| case(&format!("tests.test_skip_{i}"), TestOutcome::Skipped)),
        );
        TestReport { cases }
    }

    pub(super) fn ok_run(tests: Option<TestReport>) -> Evidence {
        Evidence {
            exit_code: Some(0),
            tests,
            ..Evidence::default()
        }
    }

    pub(super) fn m(pairs: &[(&str, f64)]) -> Option<BTreeMap<String, f64>> {
        Some(pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect())
    }

    /// The default rules with one noise band for every metric (no per-kind bands), as
    /// these tests of the single-sample rules were written.
    pub(crate) fn rules() -> DecisionRules {
        DecisionRules {
            bands: BTreeMap::new(),
            ..DecisionRules::default()
        }
    }

    // ---- REJECT paths ----

    #[test]
    fn gate_apply_run_and_budget_reject_with_certainty() {
        let gate = Evidence {
            gate: Some((
                "protected".into(),
                "the patch touches tests/test_x.py".into(),
            )),
            apply_error: Some("src/a.py hunk 2".into()),
            ..Evidence::default()
        };
        let d = decide(&gate, &rules());
        assert_eq!(d.verdict, VerdictKind::Reject);
        assert_eq!(d.confidence, 1.0);
        assert_eq!(
            d.summary,
            "Rejected by the `protected` policy gate: the patch touches tests/test_x.py."
        );
        assert_eq!(
            d.caveats,
            vec!["Also: The patch did not apply: src/a.py hunk 2."]
        );

        let apply = Evidence {
            apply_error: Some("hunk 3 of src/hermes/gateway.py does not match at line 88".into()),
            ..Evidence::default()
        };
        let d = decide(&apply, &rules());
        assert_eq!(d.verdict, VerdictKind::Reject);
        assert_eq!(
            d.summary,
            "The patch did not apply: hunk 3 of src/hermes/gateway.py does not match at line 88."
        );

        let run = Evidence {
            run_error: Some("command `python3` not found (exit 127)".into()),
            exit_code: Some(127),
            ..Evidence::default()
        };
        let d = decide(&run, &rules());
        assert_eq!((d.verdict, d.confidence), (VerdictKind::Reject, 1.0));
        assert!(d
            .summary
            .starts_with("The task could not run: command `python3` not found"));

        let budget = Evidence {
            budget_exceeded: Some(Exceeded::Run(BudgetKind::Wall)),
            usage_summary: Some("wall 2.0 s of 2 s".into()),
            signal: Some(9),
            tests: Some(report(3, 0, 0, 0)),
            ..Evidence::default()
        };
        let d = decide(&budget, &rules());
        assert_eq!((d.verdict, d.confidence), (VerdictKind::Reject, 1.0));
        assert_eq!(
            d.summary,
            "The wall-clock time budget (`wall`) was exceeded: wall 2.0 s of 2 s."
        );
        assert!(
            d.caveats[0].contains("3 passed, 0 failed"),
            "{:?}",
            d.caveats
        );

        let mem = Evidence {
            budget_exceeded: Some(Exceeded::Run(BudgetKind::Memory)),
            ..Evidence::default()
        };
        assert_eq!(
            decide(&mem, &rules()).summary,
            "The memory budget (`memory`) was exceeded."
        );
    }

    // ---- APPROVE paths ----

    #[test]
    fn approve_with_tests_and_improved_metric_in_seed_style() {
        let e = Evidence {
            metrics: m(&[("compressed_bytes", 58_800.0)]),
            baseline_metrics: m(&[("compressed_bytes", 100_000.0)]),
            ..ok_run(Some(report(312, 0, 0, 0)))
        };
        let d = decide(&e, &rules());
        assert_eq!(d.verdict, VerdictKind::Approve);
        assert_eq!(
            d.summary,
            "Test suite passed (312/312). compressed_bytes improved 41.2%."
        );
        assert_eq!(d.metrics.len(), 1);
        let mc = &d.metrics[0];
        assert_eq!(mc.baseline, Some(100_000.0));
        assert!((mc.change.unwrap() + 0.412).abs() < 1e-12);
        assert_eq!(mc.significant, None);
        assert!(d
            .caveats
            .iter()
            .any(|c| c.contains("not tested for significance")));
        assert!(
            d.confidence > 0.9 && d.confidence <= 0.99,
            "{}",
            d.confidence
        );
    }

    #[test]
    fn seed_example_flaky_caveat_and_confidence() {
        let d = decide(&ok_run(Some(report(311, 0, 1, 0))), &rules());
        assert_eq!(d.verdict, VerdictKind::Approve);
        assert_eq!(d.summary, "Test suite passed (312/312).");
        assert_eq!(
            d.caveats,
            vec!["1 flaky test passed only after retrying: tests.test_flaky_0 (passed after 2 failed attempts)."]
        );
        // exit 0 (0.4) and 312 passing tests (312/317), one flaky penalty (0.95)
        let support: f64 = 1.0 - (1.0 - 0.4) * (1.0 - 312.0 / 317.0);
        let expected = ((0.5 + 0.5 * support) * 0.95 * 1000.0).round() / 1000.0;
        assert_eq!(d.confidence, expected);
        assert_eq!(d.confidence, 0.946);
    }

    #[test]
    fn exit_code_only_approval_is_weak_and_says_so() {
        let d = decide(&ok_run(None), &rules());
        assert_eq!(d.verdict, VerdictKind::Approve);
        assert_eq!(d.summary, "The task exited with status 0.");
        assert_eq!(d.confidence, 0.7);
        assert!(d.caveats[0].starts_with("Only the exit status was checked"));
        let with_tests = decide(&ok_run(Some(report(1, 0, 0, 0))), &rules());
        assert!(with_tests.confidence > d.confidence);
    }

    #[test]
    fn skipped_tests_are_counted_named_and_lower_confidence() {
        let clean = decide(&ok_run(Some(report(10, 0, 0, 0))), &rules());
        let d = decide(&ok_run(Some(report(10, 0, 0, 2))), &rules());
        assert_eq!(d.verdict, VerdictKind::Approve);
        assert_eq!(d.summary, "Test suite passed (10/10; 2 skipped).");
        assert_eq!(
            d.caveats,
            vec!["2 tests skipped: tests.test_skip_0 and tests.test_skip_1."]
        );
        assert!(d.confidence < clean.confidence);
    }

    #[test]
    fn metrics_within_noise_and_direction() {
        let r = rules();
        assert!(r.is_lower_better("p99_ms"));
        assert!(r.is_lower_better("P99_MS"));
        assert!(r.is_lower_better("compressed_bytes"));
        assert!(r.is_lower_better("peak_memory"));
        assert!(r.is_lower_better("p50_latency"));
        assert!(!r.is_lower_better("throughput"));
        assert!(!r.is_lower_better("accuracy"));

        let e = Evidence {
            metrics: m(&[("throughput", 1004.0)]),
            baseline_metrics: m(&[("throughput", 1000.0)]),
            ..ok_run(Some(report(5, 0, 0, 0)))
        };
        let d = decide(&e, &r);
        assert_eq!(d.verdict, VerdictKind::Approve);
        assert_eq!(
            d.summary,
            "Test suite passed (5/5). throughput within the 1.0% noise band (not tested for equivalence)."
        );
        // exactly at the band is still noise; just past it is a change
        let at_band = Evidence {
            metrics: m(&[("throughput", 990.0)]),
            baseline_metrics: m(&[("throughput", 1000.0)]),
            ..ok_run(None)
        };
        assert_eq!(decide(&at_band, &r).verdict, VerdictKind::Approve);
        let past = Evidence {
            metrics: m(&[("throughput", 989.0)]),
            ..at_band.clone()
        };
        assert_eq!(decide(&past, &r).verdict, VerdictKind::NeedsRevision);
        // higher latency is worse, higher throughput is better
        let mixed = Evidence {
            metrics: m(&[("p99_ms", 45.92), ("throughput", 1200.0), ("qps", 10.0)]),
            baseline_metrics: m(&[("p99_ms", 41.0), ("throughput", 1000.0), ("qps", 10.0)]),
            ..ok_run(Some(report(5, 0, 0, 0)))
        };
        let d = decide(&mixed, &r);
        assert_eq!(d.verdict, VerdictKind::NeedsRevision);
        assert_eq!(
            d.summary,
            "p99_ms regressed 12.0% (41 → 45.92), beyond the 1.0% noise band. Test suite passed (5/5)."
        );
    }

    // ---- NEEDS_REVISION paths ----

    #[test]
    fn failing_tests_need_revision_and_are_named() {
        let e = Evidence {
            exit_code: Some(1),
            ..ok_run(Some(report(309, 3, 0, 0)))
        };
        let d = decide(&e, &rules());
        assert_eq!(d.verdict, VerdictKind::NeedsRevision);
        assert_eq!(
            d.summary,
            "Test suite failed (3 of 312 failed: tests.test_bad_0, tests.test_bad_1 and tests.test_bad_2)."
        );
        let e5 = Evidence {
            exit_code: Some(1),
            ..ok_run(Some(report(10, 5, 0, 0)))
        };
        assert_eq!(
            decide(&e5, &rules()).summary,
            "Test suite failed (5 of 15 failed: tests.test_bad_0, tests.test_bad_1, tests.test_bad_2 and 2 more)."
        );
        // errors count as failures
        let mut r = report(1, 0, 0, 0);
        r.cases.push(case("tests.test_err", TestOutcome::Error));
        let d = decide(&ok_run(Some(r)), &rules());
        assert_eq!(d.verdict, VerdictKind::NeedsRevision);
        assert!(d.summary.contains("1 of 2 failed: tests.test_err"));
    }

    #[test]
    fn unexplained_nonzero_exit_and_signals() {
        let e = Evidence {
            exit_code: Some(3),
            ..ok_run(Some(report(4, 0, 0, 0)))
        };
        let d = decide(&e, &rules());
        assert_eq!(d.verdict, VerdictKind::NeedsRevision);
        assert_eq!(
            d.summary,
            "The task exited with status 3 although every test that ran passed. Test suite passed (4/4)."
        );
        let no_tests = Evidence {
            exit_code: Some(127),
            ..Evidence::default()
        };
        let d = decide(&no_tests, &rules());
        assert_eq!(d.summary, "The task exited with status 127.");
        assert!(d.caveats.iter().any(|c| c.contains("was not found")));
        let seg = Evidence {
            signal: Some(11),
            ..Evidence::default()
        };
        let d = decide(&seg, &rules());
        assert_eq!(d.verdict, VerdictKind::NeedsRevision);
        assert_eq!(d.summary, "The task was killed by signal 11 (SIGSEGV).");
        let unknown = decide(&Evidence::default(), &rules());
        assert_eq!(unknown.verdict, VerdictKind::NeedsRevision);
        assert_eq!(unknown.summary, "The task's exit status was not recorded.");
        assert!(unknown.confidence < d.confidence);
    }

    #[test]
    fn missing_results_file_is_not_an_approval() {
        let e = Evidence {
            results_error: Some("report `/tmp/r/tests.xml` does not exist".into()),
            ..ok_run(None)
        };
        let d = decide(&e, &rules());
        assert_eq!(d.verdict, VerdictKind::NeedsRevision);
        assert_eq!(
            d.summary,
            "The declared test results could not be used: report `/tmp/r/tests.xml` does not exist."
        );
        assert!(d.caveats[0].contains("may have skipped writing it"));
        let metrics_missing = Evidence {
            metrics_error: Some("metrics JSON: key `p99`: a string is not a number".into()),
            ..ok_run(Some(report(2, 0, 0, 0)))
        };
        let d = decide(&metrics_missing, &rules());
        assert_eq!(d.verdict, VerdictKind::NeedsRevision);
        assert!(d
            .summary
            .starts_with("The declared metrics could not be used: metrics JSON: key `p99`"));
    }

    #[test]
    fn a_report_where_nothing_ran_is_not_an_approval() {
        let d = decide(&ok_run(Some(report(0, 0, 0, 0))), &rules());
        assert_eq!(d.verdict, VerdictKind::NeedsRevision);
        assert_eq!(
            d.summary,
            "No tests ran: the test report contains no test cases."
        );
        let d = decide(&ok_run(Some(report(0, 0, 0, 4))), &rules());
        assert_eq!(d.summary, "No tests ran: all 4 skipped.");
    }

    #[test]
    fn metric_missing_from_patched_run_and_zero_baselines() {
        let e = Evidence {
            metrics: m(&[("p99_ms", 40.0)]),
            baseline_metrics: m(&[("p99_ms", 40.0), ("compressed_bytes", 10.0)]),
            ..ok_run(None)
        };
        let d = decide(&e, &rules());
        assert_eq!(d.verdict, VerdictKind::NeedsRevision);
        assert!(d.summary.starts_with(
            "The patched run did not report a metric that the baseline reported: compressed_bytes."
        ));
        let zero = Evidence {
            metrics: m(&[("errors", 3.0), ("hits", 5.0), ("drops_ms", 0.0)]),
            baseline_metrics: m(&[("errors", 0.0), ("hits", 0.0), ("drops_ms", 0.0)]),
            ..ok_run(None)
        };
        let d = decide(&zero, &rules());
        assert_eq!(d.verdict, VerdictKind::NeedsRevision);
        assert!(
            d.summary
                .starts_with("errors regressed from 0 to 3, beyond the 1.0% noise band."),
            "{}",
            d.summary
        );
        assert!(
            d.summary.contains("hits improved from 0 to 5"),
            "{}",
            d.summary
        );
        let by = |n: &str| d.metrics.iter().find(|m| m.name == n).unwrap().change;
        assert_eq!(
            (by("errors"), by("hits"), by("drops_ms")),
            (None, None, Some(0.0))
        );
    }

    #[test]
    fn metrics_without_baseline_are_reported_with_a_caveat() {
        let with_base = Evidence {
            metrics: m(&[("p99_ms", 41.0)]),
            baseline_metrics: m(&[("p99_ms", 41.0)]),
            ..ok_run(Some(report(20, 0, 0, 0)))
        };
        let without = Evidence {
            baseline_metrics: None,
            ..with_base.clone()
        };
        let d = decide(&without, &rules());
        assert_eq!(d.verdict, VerdictKind::Approve);
        assert_eq!(
            d.summary,
            "Test suite passed (20/20). 1 metric reported without a baseline."
        );
        assert_eq!(
            d.caveats,
            vec!["No baseline was run, so metric changes are unknown; measured: p99_ms = 41."]
        );
        assert_eq!(d.metrics[0].baseline, None);
        assert_eq!(d.metrics[0].change, None);
        assert!(d.confidence < decide(&with_base, &rules()).confidence);
    }

    #[test]
    fn regression_verdict_follows_the_rules() {
        let e = Evidence {
            metrics: m(&[("p99_ms", 60.0)]),
            baseline_metrics: m(&[("p99_ms", 40.0)]),
            ..ok_run(Some(report(10, 0, 0, 0)))
        };
        let reject = DecisionRules {
            regression_is: VerdictKind::Reject,
            ..rules()
        };
        let d = decide(&e, &reject);
        assert_eq!(d.verdict, VerdictKind::Reject);
        assert!(d.confidence < 1.0, "evidence-based, not deterministic");
        let lenient = DecisionRules {
            regression_is: VerdictKind::Approve,
            ..rules()
        };
        let d = decide(&e, &lenient);
        assert_eq!(d.verdict, VerdictKind::Approve);
        assert!(d
            .caveats
            .iter()
            .any(|c| c.contains("p99_ms regressed 50.0% (40 → 60)")));
        // a wider band absorbs the change
        let wide = DecisionRules {
            noise_band: 0.6,
            ..rules()
        };
        assert_eq!(decide(&e, &wide).verdict, VerdictKind::Approve);
        // custom direction: a metric named in lower_is_better
        let custom = DecisionRules {
            lower_is_better: vec!["queue_depth".into()],
            ..rules()
        };
        let q = Evidence {
            metrics: m(&[("queue_depth", 5.0), ("p99_ms", 60.0)]),
            baseline_metrics: m(&[("queue_depth", 10.0), ("p99_ms", 40.0)]),
            ..ok_run(None)
        };
        let d = decide(&q, &custom);
        // p99_ms is no longer lower-is-better under these rules: it improved
        assert_eq!(d.verdict, VerdictKind::Approve);
        assert_eq!(
            d.summary,
            "p99_ms improved 50.0% and queue_depth improved 50.0%."
        );
    }

    fn assessed(
        outcome: crate::verdict::sequential::Outcome,
        ci: (f64, f64),
        band: f64,
    ) -> Assessed {
        Assessed {
            outcome,
            ci: Some(ci),
            band,
            alpha: 0.01,
            stopped: "the run cap of 20 pairs".into(),
            order_seed: 7,
        }
    }

    /// An interval wholly beyond the band that the test could not yet back (a constant
    /// ratio in 3 pairs) is inconclusive for too few pairs, not "across the band".
    #[test]
    fn an_untested_interval_beyond_the_band_says_too_few_pairs() {
        use crate::verdict::sequential::Outcome;
        let mut e = Evidence {
            metrics: m(&[("ratio", 0.49)]),
            baseline_metrics: m(&[("ratio", 0.86)]),
            ..ok_run(Some(report(5, 0, 0, 0)))
        };
        e.assessments.insert(
            "ratio".into(),
            assessed(Outcome::Inconclusive, (-0.428, -0.428), 0.01),
        );
        let d = decide(&e, &DecisionRules::default());
        assert_eq!(d.verdict, VerdictKind::NeedsRevision);
        assert!(
            d.summary
                .contains("band ±1.0%: too few pairs for the test to reach its level)"),
            "{}",
            d.summary
        );
        assert!(!d.summary.contains("across"), "{}", d.summary);
    }

    #[test]
    fn not_significant_is_inconclusive_not_unchanged() {
        use crate::verdict::sequential::Outcome;
        let mut e = Evidence {
            metrics: m(&[("p99_ms", 1.90), ("compressed_bytes", 100.0)]),
            baseline_metrics: m(&[("p99_ms", 1.40), ("compressed_bytes", 100.0)]),
            ..ok_run(Some(report(5, 0, 0, 0)))
        };
        e.assessments.insert(
            "p99_ms".into(),
            assessed(Outcome::Inconclusive, (0.008, 1.07), 0.10),
        );
        e.assessments.insert(
            "compressed_bytes".into(),
            assessed(Outcome::Equivalent, (0.0, 0.0), 0.0),
        );
        let d = decide(&e, &DecisionRules::default());
        assert_eq!(d.verdict, VerdictKind::NeedsRevision);
        assert!(
            d.summary.starts_with("The evidence was inconclusive for p99_ms (change +35.7%, interval +0.8% to +107.0%, 1 pair, band ±10.0%: the interval reaches across an edge of the band)"),
            "{}",
            d.summary
        );
        assert!(d.summary.contains("+0.8% to +107.0%"), "{}", d.summary);
        assert!(!d.summary.contains("unchanged"), "{}", d.summary);
        assert!(d.confidence < 0.7, "{}", d.confidence);
        let p99 = d.metrics.iter().find(|m| m.name == "p99_ms").unwrap();
        assert_eq!(p99.class, Some(crate::verdict::MetricVerdict::Inconclusive));
        assert_eq!(p99.significant, Some(false));
        assert_eq!((p99.ci_low, p99.ci_high), (Some(0.008), Some(1.07)));
        assert_eq!(p99.band, Some(0.10));
        assert_eq!(p99.order_seed, Some(7));

        // Informational: reported as a caveat, the verdict is not held back.
        let info = DecisionRules {
            informational: vec!["p99*".into()],
            ..DecisionRules::default()
        };
        let d = decide(&e, &info);
        assert_eq!(d.verdict, VerdictKind::Approve, "{}", d.summary);
        assert!(
            d.caveats
                .iter()
                .any(|c| c.contains("inconclusive for p99_ms") && c.contains("informational")),
            "{:?}",
            d.caveats
        );

        // Equivalent within the band: "unchanged", with each metric's own band.
        e.assessments.insert(
            "p99_ms".into(),
            assessed(Outcome::Equivalent, (-0.04, 0.06), 0.10),
        );
        let d = decide(&e, &DecisionRules::default());
        assert_eq!(d.verdict, VerdictKind::Approve);
        assert!(
            d.summary.contains("All 2 metrics unchanged within their noise bands (compressed_bytes 0.0%, p99_ms 10.0%)"),
            "{}",
            d.summary
        );
        // Higher on a lower-is-better metric: a regression.
        e.assessments
            .insert("p99_ms".into(), assessed(Outcome::Higher, (0.2, 0.5), 0.10));
        let d = decide(&e, &DecisionRules::default());
        assert_eq!(d.verdict, VerdictKind::NeedsRevision);
        assert!(d.summary.starts_with("p99_ms regressed"), "{}", d.summary);
    }

    #[test]
    fn bands_per_metric_kind() {
        let r = DecisionRules::default();
        assert_eq!(r.band_for("compressed_bytes"), 0.0);
        assert_eq!(r.band_for("ratio"), 0.01);
        assert_eq!(r.band_for("p50_ms"), 0.05);
        assert_eq!(r.band_for("p99_ms"), 0.10, "the widest matching band");
        assert_eq!(r.band_for("peak_memory_kb"), 0.05);
        assert_eq!(r.band_for("peak_memory_bytes"), 0.05);
        assert_eq!(r.band_for("accuracy"), 0.01, "no pattern: noise_band");
        let exact = DecisionRules {
            bands: [("p99_ms".to_string(), 0.2), ("*_ms".to_string(), 0.3)].into(),
            ..DecisionRules::default()
        };
        assert_eq!(exact.band_for("P99_MS"), 0.2, "an exact name wins");
        assert_eq!(exact.band_for("p50_ms"), 0.3);
        assert!(r.validate().is_ok());
        let bad = DecisionRules {
            bands: [("*_ms".to_string(), -0.1)].into(),
            ..DecisionRules::default()
        };
        assert!(matches!(bad.validate(), Err(RulesError::Band(..))));
        let bad = DecisionRules {
            min_pairs: 1,
            ..DecisionRules::default()
        };
        assert_eq!(bad.validate(), Err(RulesError::Pairs(1, 20)));
        let r: DecisionRules = toml::from_str(
            "max_pairs = 8\ninformational = [\"p99_ms\"]\n[bands]\n\"*_ms\" = 0.2\n",
        )
        .unwrap();
        assert_eq!((r.min_pairs, r.max_pairs, r.sequential), (3, 8, true));
        assert_eq!(r.band_for("p99_ms"), 0.2);
        assert!(r.is_informational("p99_ms") && !r.is_informational("p50_ms"));
    }

    #[test]
    fn too_many_problems_spill_into_caveats() {
        let e = Evidence {
            signal: Some(6),
            results_error: Some("tests.xml missing".into()),
            metrics_error: Some("metrics.json missing".into()),
            ..Evidence::default()
        };
        let d = decide(&e, &rules());
        assert_eq!(
            d.summary,
            "The declared test results could not be used: tests.xml missing. The task was killed by signal 6 (SIGABRT)."
        );
        assert_eq!(
            d.caveats[0],
            "Also: The declared metrics could not be used: metrics.json missing."
        );
    }
}
