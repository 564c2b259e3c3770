//! Deciding a metric only when the data can, and running pairs only until it can.
//!
//! [`assess`] classifies one metric's baseline and patched samples against its noise band
//! `band` at an error level `a`:
//! * **equivalent**: the change lies inside `[−band, +band]`, by two one-sided tests (TOST):
//!   the `1 − a` percentile-bootstrap interval of the relative change of medians lies inside
//!   the band, *and* both one-sided exact Mann-Whitney tests against the baseline shifted by
//!   `±band·|median(baseline)|` reject at `a/2`;
//! * **higher** / **lower**: the whole interval lies beyond `+band` (`−band`), *and* the
//!   one-sided Mann-Whitney test against the baseline shifted by `+band` (`−band`) rejects
//!   at `a/2`, on either side alike: a change whose interval reaches back inside the band
//!   stays inconclusive, a gain too (an identical patch measured on a shared machine must
//!   never be called a gain: a systematic difference between the sides of a few percent is
//!   "significant" but not beyond the band);
//! * **inconclusive**: anything else (the interval reaches across a band edge, or the rank
//!   test cannot yet reach `a/2` with so few samples).
//!
//! The interval is what the verdict reports; the rank test (exact, distribution-free) is
//! what keeps the stated error rate with few, heavy-tailed samples, where the percentile
//! bootstrap alone is liberal. A false decision needs a false rank-test rejection, so each
//! look errs with probability at most `a` per metric.
//!
//! **Zero variance.** When both sides are constant (at least 2 samples each, every value
//! equal), the change is exact: equivalent when `|change| ≤ band`, else higher or lower. No
//! error can be made, so such metrics spend no error budget.
//!
//! **Multiplicity and looks.** The verdict's stated error rate `alpha` is spent over the
//! looks of the group-sequential design ([`looks`]) by the linear spending function
//! `alpha · t` (Lan-DeMets; `t` = pairs / cap), and each look's share is split evenly
//! (Bonferroni) over the statistically tested metrics ([`look_alpha`]). By the union bound,
//! the chance that *any* metric is falsely decided at *any* look is at most `alpha`,
//! whatever the correlation between metrics and looks.

use serde::{Deserialize, Serialize};

use super::stats::{bootstrap_ci, mann_whitney_u, median, relative_change, MIN_BOOTSTRAP_SAMPLES};

/// Each look's pair count is at least this factor times the previous one's.
pub const LOOK_GROWTH: f64 = 2.0;

/// How a metric's change compares with its noise band, before its direction is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The change lies inside the band (an equivalence test, or exactly).
    Equivalent,
    /// The change lies beyond `+band`.
    Higher,
    /// The change lies beyond `−band`.
    Lower,
    /// The data cannot tell yet.
    Inconclusive,
}

/// What [`assess`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    pub outcome: Outcome,
    /// The `1 − a` interval of the relative change (`(c, c)` when exact).
    pub ci: Option<(f64, f64)>,
    /// Both sides were constant: decided exactly, no error budget spent.
    pub exact: bool,
}

/// The pair counts at which the data are looked at: `min_pairs`, then each at least
/// [`LOOK_GROWTH`] times the previous (rounded up), ending at `max_pairs`. With 3 and 20:
/// 3, 6, 12, 20 (from the second look on, the exact rank test can reach the level of a
/// look for up to 4 noisy metrics at alpha 0.05). `min_pairs` above `max_pairs` gives the one look `max_pairs`.
pub fn looks(min_pairs: usize, max_pairs: usize) -> Vec<usize> {
    let max = max_pairs.max(1);
    let mut n = min_pairs.clamp(1, max);
    let mut v = vec![n];
    while n < max {
        n = ((n as f64 * LOOK_GROWTH).ceil() as usize)
            .max(n + 1)
            .min(max);
        v.push(n);
    }
    v
}

/// The error level of one metric at look `look` (0-based) of `schedule` ([`looks`]): the
/// look's share of `alpha` under linear alpha spending, `alpha · (n_j − n_{j−1}) / n_K`
/// (`n_0 = 0`), split evenly over the `tested` metrics. The shares sum to `alpha`.
pub fn look_alpha(alpha: f64, schedule: &[usize], look: usize, tested: usize) -> f64 {
    let Some(&last) = schedule.last() else {
        return alpha / tested.max(1) as f64;
    };
    let n = schedule.get(look).copied().unwrap_or(last);
    let prev = if look == 0 { 0 } else { schedule[look - 1] };
    alpha * (n.saturating_sub(prev)) as f64 / last.max(1) as f64 / tested.max(1) as f64
}

/// Whether `xs` holds at least 2 values, all finite and equal.
pub fn is_constant(xs: &[f64]) -> bool {
    xs.len() >= 2 && xs.iter().all(|x| x.is_finite() && *x == xs[0])
}

/// One-sided exact (or, with ties, normal-approximation) Mann-Whitney p value of "`x`
/// tends to be larger than `y`".
fn p_greater(x: &[f64], y: &[f64]) -> f64 {
    let (u, p2) = mann_whitney_u(x, y);
    let half = (x.len() * y.len()) as f64 / 2.0;
    if u > half {
        p2 / 2.0
    } else {
        1.0 - p2 / 2.0
    }
}

fn shifted(xs: &[f64], by: f64) -> Vec<f64> {
    xs.iter().map(|x| x + by).collect()
}

/// Classify one metric (see the module documentation). `a` is this metric's error level at
/// this look ([`look_alpha`]); the bootstrap draws `resamples` times from `seed`.
pub fn assess(
    baseline: &[f64],
    patched: &[f64],
    band: f64,
    a: f64,
    resamples: usize,
    seed: u64,
) -> Assessment {
    let inconclusive = |ci| Assessment {
        outcome: Outcome::Inconclusive,
        ci,
        exact: false,
    };
    let b: Vec<f64> = baseline.iter().copied().filter(|x| x.is_finite()).collect();
    let p: Vec<f64> = patched.iter().copied().filter(|x| x.is_finite()).collect();
    if b.is_empty() || p.is_empty() || !(a > 0.0 && a < 1.0) {
        return inconclusive(None);
    }
    let band = if band.is_finite() && band >= 0.0 {
        band
    } else {
        0.0
    };
    if is_constant(&b) && is_constant(&p) && b.len() == baseline.len() && p.len() == patched.len() {
        let outcome = match relative_change(b[0], p[0]) {
            Some(c) if c.abs() <= band => Outcome::Equivalent,
            Some(c) if c > 0.0 => Outcome::Higher,
            Some(_) => Outcome::Lower,
            None if p[0] > 0.0 => Outcome::Higher,
            None => Outcome::Lower,
        };
        let c = relative_change(b[0], p[0]);
        return Assessment {
            outcome,
            ci: c.map(|c| (c, c)),
            exact: true,
        };
    }
    if b.len() < MIN_BOOTSTRAP_SAMPLES || p.len() < MIN_BOOTSTRAP_SAMPLES {
        return inconclusive(None);
    }
    let Some(mb) = median(&b) else {
        return inconclusive(None);
    };
    let Some((lo, hi)) = bootstrap_ci(&b, &p, a, resamples, seed) else {
        return inconclusive(None);
    };
    let shift = band * mb.abs();
    let level = a / 2.0;
    let outcome = if lo >= -band && hi <= band {
        // TOST: patched below baseline + band, and above baseline − band.
        let below_upper = p_greater(&shifted(&b, shift), &p) < level;
        let above_lower = p_greater(&p, &shifted(&b, -shift)) < level;
        if below_upper && above_lower {
            Outcome::Equivalent
        } else {
            Outcome::Inconclusive
        }
    } else if lo > band && p_greater(&p, &shifted(&b, shift)) < level {
        Outcome::Higher
    } else if hi < -band && p_greater(&shifted(&b, -shift), &p) < level {
        Outcome::Lower
    } else {
        Outcome::Inconclusive
    };
    Assessment {
        outcome,
        ci: Some((lo, hi)),
        exact: false,
    }
}

/// The sign of the pair's order: `true` when the baseline runs first in pair `pair`, drawn
/// from `seed` (SplitMix64 over `seed + pair`), so a recorded seed replays the order.
pub fn baseline_first(seed: u64, pair: usize) -> bool {
    let mut r = super::stats::SplitMix64(seed.wrapping_add(pair as u64));
    r.next_u64() >> 63 == 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::stats::SplitMix64;

    fn normal(rng: &mut SplitMix64) -> f64 {
        let u1 = ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let u2 = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// A timing-like sample: log-normal with `sd` on the log scale, and (with `outliers`)
    /// one run in five slowed by up to 3x, as the first run of a cold machine is.
    fn timing(rng: &mut SplitMix64, n: usize, centre: f64, sd: f64, outliers: bool) -> Vec<f64> {
        (0..n)
            .map(|_| {
                let mut x = centre * (sd * normal(rng)).exp();
                if outliers && rng.below(5) == 0 {
                    x *= 1.0 + 2.0 * (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                }
                x
            })
            .collect()
    }

    #[test]
    fn the_look_schedule() {
        assert_eq!(looks(3, 20), vec![3, 6, 12, 20]);
        assert_eq!(looks(3, 5), vec![3, 5]);
        assert_eq!(looks(5, 5), vec![5]);
        assert_eq!(looks(8, 3), vec![3]);
        assert_eq!(looks(1, 3), vec![1, 2, 3]);
        let s = looks(3, 20);
        let shares: Vec<f64> = (0..4).map(|j| look_alpha(0.05, &s, j, 1)).collect();
        let want = [0.0075, 0.0075, 0.015, 0.02];
        for (got, want) in shares.iter().zip(want) {
            assert!((got - want).abs() < 1e-12, "{shares:?}");
        }
        assert!((shares.iter().sum::<f64>() - 0.05).abs() < 1e-12);
        assert!((look_alpha(0.05, &s, 3, 2) - 0.01).abs() < 1e-12);
        assert_eq!(look_alpha(0.05, &[], 0, 0), 0.05);
        assert_eq!(look_alpha(0.05, &[5], 0, 1), 0.05);
    }

    #[test]
    fn zero_variance_is_decided_exactly() {
        let a = 0.001;
        let same = assess(&[500.0; 3], &[500.0; 3], 0.0, a, 1000, 1);
        assert_eq!(
            (same.outcome, same.ci, same.exact),
            (Outcome::Equivalent, Some((0.0, 0.0)), true)
        );
        let down = assess(&[500.0; 2], &[300.0; 2], 0.0, a, 1000, 1);
        assert_eq!(
            (down.outcome, down.ci),
            (Outcome::Lower, Some((-0.4, -0.4)))
        );
        let up = assess(&[500.0; 3], &[505.0; 3], 0.0, a, 1000, 1);
        assert_eq!(up.outcome, Outcome::Higher);
        // Within a 1% band, exactly.
        let small = assess(&[500.0; 3], &[504.0; 3], 0.01, a, 1000, 1);
        assert_eq!(small.outcome, Outcome::Equivalent);
        // From zero: a change without a relative size.
        let from0 = assess(&[0.0; 3], &[2.0; 3], 0.01, a, 1000, 1);
        assert_eq!((from0.outcome, from0.ci), (Outcome::Higher, None));
        // One sample per side is no evidence of zero variance.
        let one = assess(&[500.0], &[500.0], 0.01, a, 1000, 1);
        assert_eq!(one.outcome, Outcome::Inconclusive);
    }

    #[test]
    fn not_significant_is_not_unchanged() {
        // The busy wait: p99 up by about a third, with an interval that reaches
        // from about 0 to +100%: neither a regression proven beyond 10% nor equivalence.
        let b = [1.40, 1.81, 1.44, 1.40, 1.38];
        let p = [1.90, 2.50, 1.45, 1.43, 2.28];
        let r = assess(&b, &p, 0.10, 0.005, 10_000, 7);
        assert_eq!(r.outcome, Outcome::Inconclusive, "{r:?}");
        let (lo, hi) = r.ci.unwrap();
        assert!(lo < 0.10 && hi > 0.10, "{r:?}");
        // Tight, equal samples inside a 5% band are equivalent once the rank tests can
        // reach the level, and not before.
        let b = [100.0, 100.4, 99.7, 100.2, 99.9, 100.1, 99.8, 100.3];
        let p = [100.1, 99.8, 100.2, 99.9, 100.3, 100.0, 99.6, 100.2];
        assert_eq!(
            assess(&b, &p, 0.05, 0.005, 5000, 3).outcome,
            Outcome::Equivalent
        );
        assert_eq!(
            assess(&b[..3], &p[..3], 0.05, 0.005, 5000, 3).outcome,
            Outcome::Inconclusive
        );
        // A clear 40% drop: lower.
        let p2: Vec<f64> = b.iter().map(|x| x * 0.6).collect();
        let r = assess(&b, &p2, 0.05, 0.005, 5000, 3);
        assert_eq!(r.outcome, Outcome::Lower, "{r:?}");
        // A gain of uncertain size (the interval reaches back inside the band, though not
        // past 0) is inconclusive, like a regression of uncertain size: more pairs decide.
        let b = [1.0, 1.3, 0.9, 1.6, 1.1, 2.4, 1.2, 1.0];
        let p = [0.5, 0.55, 0.4, 0.9, 0.45, 0.6, 0.42, 0.48];
        let r = assess(&b, &p, 0.50, 0.005, 5000, 3);
        let (_, hi) = r.ci.unwrap();
        assert!(hi < 0.0 && hi > -0.50, "{r:?}");
        assert_eq!(r.outcome, Outcome::Inconclusive, "{r:?}");
        let worse = assess(&p, &b, 0.50, 0.005, 5000, 3);
        assert_eq!(worse.outcome, Outcome::Inconclusive, "{worse:?}");
    }

    /// Run the sequential design on one synthetic metric pair generator: returns the
    /// outcomes per metric and the pairs used.
    fn run_design(
        rng: &mut SplitMix64,
        metrics: &[(f64, f64, bool, f64)], // (sd, true change, outliers, band)
        alpha: f64,
        cap: usize,
        seed: u64,
    ) -> (Vec<Outcome>, usize) {
        let schedule = looks(3, cap);
        let mut b: Vec<Vec<f64>> = vec![Vec::new(); metrics.len()];
        let mut p: Vec<Vec<f64>> = vec![Vec::new(); metrics.len()];
        let mut out = vec![Outcome::Inconclusive; metrics.len()];
        for (j, &n) in schedule.iter().enumerate() {
            for (i, &(sd, change, outl, _)) in metrics.iter().enumerate() {
                while b[i].len() < n {
                    b[i].extend(timing(rng, 1, 100.0, sd, outl));
                    p[i].extend(timing(rng, 1, 100.0 * (1.0 + change), sd, outl));
                }
            }
            let a = look_alpha(alpha, &schedule, j, metrics.len());
            for (i, m) in metrics.iter().enumerate() {
                if out[i] != Outcome::Inconclusive {
                    continue; // a decided metric keeps its decision
                }
                out[i] = assess(&b[i], &p[i], m.3, a, 400, seed ^ i as u64).outcome;
            }
            if out.iter().all(|o| *o != Outcome::Inconclusive) {
                return (out, n);
            }
        }
        (out, cap)
    }

    #[test]
    fn the_sequential_design_keeps_its_error_rate_on_identical_patches() {
        // 300 identical "patches", each with two timing metrics (3% noise, and 30% noise with
        // cold-start outliers): a gain or a regression reported for any metric of a verdict
        // is a false decision. The design promises at most alpha = 0.05 of verdicts.
        let mut rng = SplitMix64(2026);
        let (mut false_decisions, mut equivalent, mut pairs) = (0, 0, 0);
        let trials = 300usize;
        for t in 0..trials as u64 {
            let (out, n) = run_design(
                &mut rng,
                &[(0.03, 0.0, false, 0.05), (0.30, 0.0, true, 0.10)],
                0.05,
                20,
                t,
            );
            pairs += n;
            if out
                .iter()
                .any(|o| matches!(o, Outcome::Higher | Outcome::Lower))
            {
                false_decisions += 1;
            }
            if out[0] == Outcome::Equivalent {
                equivalent += 1;
            }
        }
        let rate = false_decisions as f64 / trials as f64;
        assert!(rate <= 0.05, "false decisions in {rate} of verdicts");
        // The quiet metric is shown equivalent nearly always (the noisy one mostly stays
        // inconclusive: 30% noise cannot prove a 10% band in 20 pairs, and says so).
        assert!(equivalent >= trials * 8 / 10, "{equivalent}/{trials}");
        assert!(pairs <= trials * 20);
    }

    #[test]
    fn a_change_beyond_the_band_is_rarely_called_equivalent() {
        // The true change is 1.5 bands: "equivalent" would be a false decision.
        let mut rng = SplitMix64(99);
        let trials = 200usize;
        let mut false_eq = 0;
        for t in 0..trials as u64 {
            let (out, _) = run_design(&mut rng, &[(0.05, 0.075, false, 0.05)], 0.05, 20, t);
            if out[0] == Outcome::Equivalent {
                false_eq += 1;
            }
        }
        assert!(
            false_eq * 20 <= trials,
            "{false_eq}/{trials} called equivalent"
        );
    }

    #[test]
    fn clear_cut_changes_stop_early() {
        // A 40% drop with 3% noise: decided at the second look (6 pairs), not at the cap.
        let mut rng = SplitMix64(5);
        for t in 0..20 {
            let (out, n) = run_design(&mut rng, &[(0.03, -0.4, false, 0.05)], 0.05, 20, t);
            assert_eq!(out, vec![Outcome::Lower]);
            assert!(n <= 6, "{n} pairs");
        }
        // A deterministic metric is decided at the first look.
        let r = assess(&[296_095.0; 3], &[169_394.0; 3], 0.0, 0.01, 1000, 1);
        assert_eq!((r.outcome, r.exact), (Outcome::Lower, true));
    }

    #[test]
    fn side_order_is_random_and_replayable() {
        let first: Vec<bool> = (0..64).map(|i| baseline_first(42, i)).collect();
        assert_eq!(
            first,
            (0..64).map(|i| baseline_first(42, i)).collect::<Vec<_>>()
        );
        let n = first.iter().filter(|b| **b).count();
        assert!((20..=44).contains(&n), "{n} of 64 baseline-first");
        let other: Vec<bool> = (0..64).map(|i| baseline_first(43, i)).collect();
        assert_ne!(first, other);
    }
}
