//! Deciding a metric only when the data can, and running pairs only until it can.
//!
//! [`assess`] classifies one metric's baseline and patched samples against its noise band
//! `band` at an error level `a`:
//! * **equivalent**: the change lies inside `[−band, +band]`, by two one-sided tests (TOST):
//!   both one-sided exact rank-sum (Mann-Whitney) tests against the baseline shifted by
//!   `±band·|median(baseline)|` reject at `a/2` ([`super::ranks::p_greater`]: exact with
//!   ties too), *and* the `1 − a` interval of the change lies inside the band;
//! * **higher** / **lower**: the whole interval lies beyond `+band` (`−band`), *and* the
//!   one-sided rank test against the baseline shifted by `+band` (`−band`) rejects at
//!   `a/2`, on either side alike: a change whose interval reaches back inside the band
//!   stays inconclusive, a gain too (an identical patch measured on a shared machine must
//!   never be called a gain: a systematic difference between the sides of a few percent is
//!   "significant" but not beyond the band);
//! * **inconclusive**: anything else (the interval reaches across a band edge, or the rank
//!   test cannot yet reach `a/2` with so few samples).
//!
//! The interval is the one the rank test inverts ([`super::ranks::shift_interval`], Moses'
//! interval of the shift, relative to `|median(baseline)|`), so the interval the verdict
//! reports and the tests that decide agree; a run a burst on the machine slowed drags it
//! far less than it drags a percentile-bootstrap interval of medians at a look's small `a`.
//! The rank test (exact, distribution-free) is what keeps the stated error rate with few,
//! heavy-tailed samples. A false decision needs a false rank-test rejection, so each look
//! errs with probability at most `a` per metric.
//!
//! **Zero variance.** Two constant sides (at least 2 samples each, every value equal) are
//! decided exactly, spending no error budget, only for a metric declared deterministic
//! (`exactly`: its band is 0, or the policy says so): equivalent when they agree within the
//! band, higher or lower otherwise. Any other metric's constant sides are tested like any
//! sample, whether they agree or not: a noisy metric rounded coarsely can be constant on
//! both sides by chance (a timing of 3 or 4 whole ms, three pairs: 2 in 64 identical
//! patches would show a 33% regression or a 25% gain; a timing of 3-4 ms against one of
//! 4-5 ms reads 4 on all six runs in 1 of 64), and the rank test prices that chance (fully
//! separated sides of `n` pairs: `1 / C(2n, n)`, 1/20 at 3 pairs, 1/924 at 6; equal sides
//! against the baseline shifted by the band alike). Sides constant at 0 are no exception:
//! a counter that fires in one run of five reads 0 on all six runs of 3 pairs a quarter of
//! the time; without a declared band of 0 they stay inconclusive (see below).
//!
//! **A zero baseline.** With a baseline median of 0 a relative band has no scale: only a
//! change beyond 0 can be shown (the rank test against the unshifted baseline, the
//! interval in the metric's own units, not reported as relative); equivalence needs both
//! sides constant at 0 and the metric declared deterministic (exact, above).
//!
//! **Multiplicity and looks.** The verdict's stated error rate `alpha` is spent over the
//! looks of the group-sequential design ([`looks`]) by the Pocock-type spending function
//! `alpha · ln(1 + (e − 1)·t)` (Lan-DeMets; `t` = pairs / cap), a look at which no rank test
//! can reach its level passing its share on, and each look's share is split evenly
//! (Bonferroni) over the statistically tested metrics ([`Spending`]). By the union bound,
//! the chance that *any* metric is falsely decided at *any* look is at most `alpha`,
//! whatever the correlation between metrics and looks.

use serde::{Deserialize, Serialize};

use super::ranks::{p_greater, shift_interval};
use super::stats::{median, relative_change};

/// Fewest finite samples per side for a statistical decision.
pub const MIN_SAMPLES: usize = 3;

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
    /// Decided exactly from two constant sides, no error budget spent.
    pub exact: bool,
}

/// The pair counts at which the data are looked at: `min_pairs`, then doubling while the
/// count stays within half the cap, then half the cap and 70% of it (each rounded up), then
/// `max_pairs`. With 3 and 20: 3, 6, 10, 14, 20. Half the cap is always a look: 10 pairs
/// against 10 is where the exact rank test can first call a metric decided although one run
/// of one side lies beyond the band (a burst on the machine), at the level the spending
/// gives that look; the look at 70% lets a noisy metric stop before the cap.
/// `min_pairs` above `max_pairs` gives the one look `max_pairs`.
pub fn looks(min_pairs: usize, max_pairs: usize) -> Vec<usize> {
    let max = max_pairs.max(1);
    let half = max.div_ceil(2);
    let mut n = min_pairs.clamp(1, max);
    let mut v = vec![n];
    while n * 2 <= half {
        n *= 2;
        v.push(n);
    }
    for next in [half, (max * 7).div_ceil(10), max] {
        if next > n {
            n = next;
            v.push(n);
        }
    }
    v
}

/// The fraction of the error rate spent by information time `t` (pairs / cap) under the
/// Pocock-type spending function of Lan and DeMets (1983), `ln(1 + (e − 1)·t)`: 0 at
/// `t = 0`, 1 at `t = 1`, and concave, so it spends more at the early and middle looks than
/// the linear `t` (at 6 of 20 pairs 0.416 of alpha against 0.3) and less at the last.
pub fn spent_by(t: f64) -> f64 {
    let t = if t.is_nan() { 0.0 } else { t.clamp(0.0, 1.0) };
    (1.0 + (std::f64::consts::E - 1.0) * t).ln().clamp(0.0, 1.0)
}

/// The error rate spent over the looks of one schedule ([`looks`]), for one replica.
///
/// Look `j` (of `K`, at `n_j` pairs) may spend what the spending function allows by then,
/// `alpha · spent_by(n_j / n_K)` (all of `alpha` at the last look), minus what earlier looks
/// spent; that share is split evenly (Bonferroni) over the `tested` metrics of the look. A
/// look at which no rank test can reach its level (fewer than [`MIN_SAMPLES`] pairs, or the
/// smallest one-sided p value with `n_j` against `n_j` values, `1 / C(2·n_j, n_j)`, above
/// half a metric's share), or at which nothing is tested, cannot err: it spends nothing and its share passes on to the
/// next look. So the shares actually spent sum to at most `alpha` on every path.
#[derive(Debug, Clone)]
pub struct Spending {
    alpha: f64,
    schedule: Vec<usize>,
    spent: f64,
}

impl Spending {
    pub fn new(alpha: f64, schedule: &[usize]) -> Spending {
        Spending {
            alpha,
            schedule: schedule.to_vec(),
            spent: 0.0,
        }
    }

    /// The error level of each of the `tested` metrics at look `look` (0-based), recording
    /// the look's share as spent when a rank test can reach it. Call it once per look, in
    /// order.
    pub fn level(&mut self, look: usize, tested: usize) -> f64 {
        let Some(&last) = self.schedule.last() else {
            return self.alpha / tested.max(1) as f64;
        };
        let n = self.schedule.get(look).copied().unwrap_or(last);
        let allowed = if n >= last {
            self.alpha
        } else {
            self.alpha * spent_by(n as f64 / last.max(1) as f64)
        };
        let share = (allowed - self.spent).max(0.0);
        let level = share / tested.max(1) as f64;
        if tested > 0 && n >= MIN_SAMPLES && super::ranks::min_p(n, n) <= level / 2.0 {
            self.spent += share;
        }
        level
    }

    /// The error rate spent so far.
    pub fn spent(&self) -> f64 {
        self.spent
    }
}

/// Fewest pairs at which the rank test can decide a metric tested at error level `a`: at
/// least [`MIN_SAMPLES`], and its smallest one-sided p value, `1 / C(2n, n)`, below `a / 2`
/// (4 pairs at `a` = 0.05, 5 at 0.01, 6 at 0.005). None when not even 1000 pairs could.
pub fn fewest_pairs(a: f64) -> Option<usize> {
    (MIN_SAMPLES..=1000).find(|&n| super::ranks::min_p(n, n) < a / 2.0)
}

/// Whether `xs` holds at least 2 values, all finite and equal.
pub fn is_constant(xs: &[f64]) -> bool {
    xs.len() >= 2 && xs.iter().all(|x| x.is_finite() && *x == xs[0])
}

fn shifted(xs: &[f64], by: f64) -> Vec<f64> {
    xs.iter().map(|x| x + by).collect()
}

/// The exact outcome of two constant sides (see the module documentation), or None when the
/// samples are to be tested: not both constant (at least 2 finite values each, every value
/// equal), or `exactly` is false (the metric is not declared deterministic).
pub fn exact_outcome(
    baseline: &[f64],
    patched: &[f64],
    band: f64,
    exactly: bool,
) -> Option<Outcome> {
    if !(exactly && is_constant(baseline) && is_constant(patched)) {
        return None;
    }
    let (b, p) = (baseline[0], patched[0]);
    match relative_change(b, p) {
        Some(c) if c.abs() <= band => Some(Outcome::Equivalent),
        Some(c) if c > 0.0 => Some(Outcome::Higher),
        Some(_) => Some(Outcome::Lower),
        None if p > 0.0 => Some(Outcome::Higher),
        None => Some(Outcome::Lower),
    }
}

/// Classify one metric (see the module documentation). `a` is this metric's error level at
/// this look ([`Spending::level`]); `exactly`: two constant sides are decided exactly (the
/// metric is declared deterministic).
pub fn assess(baseline: &[f64], patched: &[f64], band: f64, a: f64, exactly: bool) -> Assessment {
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
    if b.len() == baseline.len() && p.len() == patched.len() {
        if let Some(outcome) = exact_outcome(&b, &p, band, exactly) {
            return Assessment {
                outcome,
                ci: relative_change(b[0], p[0]).map(|c| (c, c)),
                exact: true,
            };
        }
    }
    if b.len() < MIN_SAMPLES || p.len() < MIN_SAMPLES {
        return inconclusive(None);
    }
    let Some(mb) = median(&b) else {
        return inconclusive(None);
    };
    let Some((lo, hi)) = shift_interval(&b, &p, a) else {
        return inconclusive(None);
    };
    let level = a / 2.0;
    if mb == 0.0 {
        // No scale for the band: a change beyond 0, in the metric's own units.
        let outcome = if lo > 0.0 && p_greater(&p, &b) < level {
            Outcome::Higher
        } else if hi < 0.0 && p_greater(&b, &p) < level {
            Outcome::Lower
        } else {
            Outcome::Inconclusive
        };
        return Assessment {
            outcome,
            ci: None,
            exact: false,
        };
    }
    let (lo, hi) = (lo / mb.abs(), hi / mb.abs());
    let shift = band * mb.abs();
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
#[path = "sequential_tests.rs"]
mod tests;
