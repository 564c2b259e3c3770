//! The confidence formula: how strongly the evidence supports the verdict, as a number in
//! `[0.5, 1.0]`.
//!
//! # The formula
//! Deterministic rejections (gate, apply error, run error, budget) have confidence **1.0**.
//! Every other verdict combines *evidence strengths* `s ∈ [0, 1)` as independent support,
//! `S = 1 − Π(1 − sᵢ)`, maps it to `c = 0.5 + 0.5·S`, multiplies by penalties, clamps to
//! `[0.5, 0.99]` (tests never prove a patch right or wrong) and rounds to three decimals.
//!
//! For **APPROVE** the strengths are:
//! * exit status 0: `0.4` (alone, c = 0.70: exit-code-only evidence is weak);
//! * `n` tests that passed (including flaky passes): `n / (n + 5)` (1 → 0.17, 10 → 0.67,
//!   312 → 0.98);
//! * metrics compared against a baseline with none regressed: `0.5`.
//!
//! For **NEEDS_REVISION** (or a rules-configured REJECT) the strengths are, per problem:
//! * `f` failing tests: `f / (f + 0.5)` (1 → 0.67, 3 → 0.86, 10 → 0.95);
//! * death by signal: `0.7`; unexplained non-zero exit: `0.6`; exit status not recorded: `0.3`;
//! * results or metrics file missing/unparsable: `0.4`; no test ran: `0.4`;
//!   a metric missing from the patched run, or no metric at all in a declared metrics
//!   file: `0.4`; a baseline run that is no evidence (metrics declared): `0.4`;
//! * a regression by `x` noise bands beyond the band, `x = (|change| − band) / band`:
//!   `0.3 + 0.5 · x / (x + 1)` (just beyond the band → 0.3, far beyond → 0.8; the same 0.8
//!   when the change is unbounded or the band is 0), combined over metrics like the others.
//!
//! Penalties (multiplied, both kinds of verdict; the ones marked *approve* only there):
//! * `0.95` per flaky test (at most 20 counted): flaky tests weaken any test-based conclusion;
//! * *approve*: `1 − 0.25 · skipped / total` for skipped tests;
//! * *approve*: `0.9` when metrics were reported but no baseline was run;
//! * *approve*: `0.95` when metric changes come from single samples (significance unknown);
//! * *approve*: `0.9` when a regression was accepted because `regression_is = APPROVE`;
//! * *approve*: `0.9` when the evidence is self-reported (the task has no judge).
//!
//! Self-reported evidence refused by `[decision] self_reported = "needs_revision"` is a
//! NEEDS_REVISION problem of strength `0.5`.
//!
//! So: more passing tests raise an approval's confidence, more flaky or skipped tests lower it,
//! and more failing tests raise a NEEDS_REVISION's confidence. The seed's example (312 passed,
//! one flaky) comes out at 0.946.

pub(super) const S_EXIT_ZERO: f64 = 0.4;
pub(super) const S_METRICS_OK: f64 = 0.5;
pub(super) const S_SIGNAL: f64 = 0.7;
pub(super) const S_NONZERO_EXIT: f64 = 0.6;
pub(super) const S_NO_EXIT: f64 = 0.3;
pub(super) const S_MISSING_FILE: f64 = 0.4;
pub(super) const S_NO_TESTS_RAN: f64 = 0.4;
pub(super) const S_METRIC_MISSING: f64 = 0.4;
pub(super) const S_BASELINE_FAILED: f64 = 0.4;
/// A metric the evidence could not decide: weak support for NEEDS_REVISION (the patch may
/// well be fine; the data could not show it).
pub(super) const S_INCONCLUSIVE: f64 = 0.2;
const P_FLAKY: f64 = 0.95;
const P_FLAKY_MAX_COUNTED: i32 = 20;
const P_SKIPPED_WEIGHT: f64 = 0.25;
pub(super) const P_NO_BASELINE: f64 = 0.9;
pub(super) const P_SINGLE_SAMPLE: f64 = 0.95;
pub(super) const P_ACCEPTED_REGRESSION: f64 = 0.9;
pub(super) const CONFIDENCE_CAP: f64 = 0.99;
/// *approve*: evidence the code under test produced about itself (no judge).
pub(super) const P_SELF_REPORTED: f64 = 0.9;
/// Self-reported evidence refused by the rules (`self_reported = "needs_revision"`).
pub(super) const S_SELF_REPORTED: f64 = 0.5;

/// Strength of `n` passing tests (flaky passes included).
pub(super) fn s_passing(n: usize) -> f64 {
    let n = n as f64;
    n / (n + 5.0)
}

/// Strength of `f` failing tests.
pub(super) fn s_failing(f: usize) -> f64 {
    let f = f as f64;
    f / (f + 0.5)
}

/// Strength of one regression of relative size `change` beyond a noise band of `band`.
/// `x / (x + 1)` is written `1 − 1 / (x + 1)`, which is 1 (not NaN) when `x` is infinite
/// (a change of 1e307 beyond a 5% band), and an unbounded or non-finite change is the
/// strongest regression.
pub(super) fn s_regression(change: Option<f64>, band: f64) -> f64 {
    match change {
        Some(c) if band > 0.0 && c.is_finite() => {
            let x = ((c.abs() - band) / band).max(0.0);
            0.3 + 0.5 * (1.0 - 1.0 / (x + 1.0))
        }
        _ => 0.8,
    }
}

/// Independent strengths combined: `1 − Π(1 − sᵢ)`. A strength that is not a number
/// supports nothing (it counts as 0, never as certainty).
pub(super) fn combine(strengths: impl IntoIterator<Item = f64>) -> f64 {
    1.0 - strengths
        .into_iter()
        .map(|s| {
            if s.is_nan() {
                1.0
            } else {
                1.0 - s.clamp(0.0, 1.0)
            }
        })
        .product::<f64>()
}

/// The penalty for `flaky` flaky tests: `0.95` each, at most 20 counted.
pub(super) fn p_flaky(flaky: usize) -> f64 {
    let counted = i32::try_from(flaky)
        .unwrap_or(i32::MAX)
        .min(P_FLAKY_MAX_COUNTED);
    P_FLAKY.powi(counted)
}

/// The approval penalty for `skipped` of `total` tests skipped.
pub(super) fn p_skipped(skipped: usize, total: usize) -> f64 {
    1.0 - P_SKIPPED_WEIGHT * skipped as f64 / total as f64
}

/// `0.5 + 0.5·S` times the penalties, clamped to `[0.5, 0.99]`, to three decimals. Never
/// NaN: a result that is not a number (a penalty that is not one) is the floor, 0.5, the
/// least any verdict claims, so it can never raise an approval's confidence.
pub(super) fn confidence(strengths: &[f64], penalties: &[f64]) -> f64 {
    let c = (0.5 + 0.5 * combine(strengths.iter().copied())) * penalties.iter().product::<f64>();
    if c.is_nan() {
        return 0.5;
    }
    (c.clamp(0.5, CONFIDENCE_CAP) * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::decide::tests::{m, ok_run, report, rules};
    use crate::verdict::decide::{decide, Evidence};
    use crate::verdict::kind::VerdictKind;

    #[test]
    fn confidence_is_monotone_in_the_evidence() {
        let approve = |p, fl, sk| {
            let d = decide(&ok_run(Some(report(p, 0, fl, sk))), &rules());
            assert_eq!(d.verdict, VerdictKind::Approve);
            d.confidence
        };
        // more passing tests -> higher approval confidence (until the cap)
        let seq: Vec<f64> = [1, 2, 5, 10, 50]
            .iter()
            .map(|&n| approve(n, 0, 0))
            .collect();
        assert!(seq.windows(2).all(|w| w[0] < w[1]), "{seq:?}");
        assert!(approve(1000, 0, 0) <= CONFIDENCE_CAP);
        // more flaky tests -> lower approval confidence
        let seq: Vec<f64> = [0, 1, 2, 5].iter().map(|&f| approve(100, f, 0)).collect();
        assert!(seq.windows(2).all(|w| w[0] > w[1]), "{seq:?}");
        // more skipped tests -> lower approval confidence
        let seq: Vec<f64> = [0, 5, 20].iter().map(|&s| approve(100, 0, s)).collect();
        assert!(seq.windows(2).all(|w| w[0] > w[1]), "{seq:?}");

        // more failing tests -> higher NEEDS_REVISION confidence
        let needs = |f| {
            let e = Evidence {
                exit_code: Some(1),
                ..ok_run(Some(report(100, f, 0, 0)))
            };
            let d = decide(&e, &rules());
            assert_eq!(d.verdict, VerdictKind::NeedsRevision);
            d.confidence
        };
        let seq: Vec<f64> = [1, 2, 4, 10].iter().map(|&f| needs(f)).collect();
        assert!(seq.windows(2).all(|w| w[0] < w[1]), "{seq:?}");

        // a larger regression -> higher NEEDS_REVISION confidence
        let reg = |patched| {
            let e = Evidence {
                metrics: m(&[("p99_ms", patched)]),
                baseline_metrics: m(&[("p99_ms", 100.0)]),
                ..ok_run(None)
            };
            decide(&e, &rules()).confidence
        };
        let seq: Vec<f64> = [101.5, 103.0, 110.0, 200.0]
            .iter()
            .map(|&p| reg(p))
            .collect();
        assert!(seq.windows(2).all(|w| w[0] < w[1]), "{seq:?}");

        // more independent problems -> higher confidence
        let one = decide(
            &Evidence {
                exit_code: Some(2),
                ..Evidence::default()
            },
            &rules(),
        );
        let two = decide(
            &Evidence {
                exit_code: Some(2),
                metrics_error: Some("missing".into()),
                ..Evidence::default()
            },
            &rules(),
        );
        assert!(two.confidence > one.confidence);
        // every confidence stays in range
        for c in [one.confidence, two.confidence] {
            assert!((0.5..=1.0).contains(&c));
        }
    }

    /// A verdict carrying `d`, as the bundle writer validates it.
    fn validated(d: &crate::verdict::decide::Decision) -> Result<(), Vec<String>> {
        let key = crate::identity::EphemeralKey::generate();
        let mut v = crate::verdict::tests::sample_verdict(&key.public());
        v.verdict = d.verdict;
        v.confidence = d.confidence;
        v.evaluation_summary = d.summary.clone();
        v.caveats = d.caveats.clone();
        v.metrics = d.metrics.clone();
        v.validate()
    }

    /// A huge finite patched value against a small baseline: the relative change overflows
    /// (1.7e308) or its distance beyond the band does (1e307), and neither may leave the
    /// decision without a finite confidence (the bundle writer refused it: no verdict, no
    /// ledger row). Single samples, repeated samples and a sequential assessment alike.
    #[test]
    fn huge_metric_values_still_give_a_recordable_regression() {
        use crate::verdict::decide::Assessed;
        use crate::verdict::sequential::Outcome;
        for patched in [1.7e308, 1e307, f64::MAX] {
            let single = Evidence {
                metrics: m(&[("p99_ms", patched)]),
                baseline_metrics: m(&[("p99_ms", 0.5)]),
                ..ok_run(None)
            };
            let stats = crate::verdict::stats::compare(
                "p99_ms",
                &[0.5, 0.5, 0.6, 0.4, 0.5],
                &[patched; 5],
                &Default::default(),
            );
            let repeated = Evidence {
                metric_stats: [("p99_ms".to_string(), stats)].into(),
                ..single.clone()
            };
            let assessed = Evidence {
                assessments: [(
                    "p99_ms".to_string(),
                    Assessed {
                        outcome: Outcome::Higher,
                        ci: Some((f64::INFINITY, f64::INFINITY)),
                        band: 0.05,
                        alpha: 0.05,
                        stopped: "every metric decided".into(),
                        order_seed: 1,
                    },
                )]
                .into(),
                ..repeated.clone()
            };
            for (what, e) in [
                ("single", single),
                ("repeated", repeated),
                ("assessed", assessed),
            ] {
                let d = decide(&e, &rules());
                assert!(d.confidence.is_finite(), "{patched} {what}: {d:?}");
                assert_eq!(d.verdict, VerdictKind::NeedsRevision, "{patched} {what}");
                assert!(
                    d.summary.contains("p99_ms regressed"),
                    "{patched} {what}: {}",
                    d.summary
                );
                let metric = &d.metrics[0];
                assert!(
                    metric.change.is_none_or(f64::is_finite),
                    "{patched} {what}: {metric:?}"
                );
                validated(&d).unwrap_or_else(|e| panic!("{patched} {what}: {e:?}"));
            }
        }
        // The formula itself: finite and at most the unbounded strength.
        for c in [1e307, 1.7e308, f64::MAX, f64::INFINITY, f64::NAN] {
            let s = s_regression(Some(c), 0.05);
            assert!((0.3..=0.8).contains(&s), "{c}: {s}");
        }
        // A strength or penalty that is not a number never raises a confidence.
        assert_eq!(confidence(&[f64::NAN], &[]), 0.5);
        assert_eq!(confidence(&[0.9], &[f64::NAN]), 0.5);
        assert_eq!(confidence(&[f64::NAN, 0.4], &[]), confidence(&[0.4], &[]));
    }
}
