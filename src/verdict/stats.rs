//! Comparing the samples of one metric: baseline (unpatched clone) against patched.
//!
//! A task with `repeat = N` and `baseline = true` yields N samples per metric on each side.
//! [`compare`] summarises them: the medians, the relative change of the medians, a bootstrap
//! confidence interval of that change, a Mann-Whitney U test, and whether the change is
//! *significant*. Everything here is pure and deterministic: the bootstrap draws from a
//! SplitMix64 generator seeded from [`CompareConfig::seed`], so the same samples and the same
//! configuration always give the same [`Comparison`] (a verifier can recompute it).
//!
//! # Definitions
//! * `change = (median(patched) − median(baseline)) / |median(baseline)|` (negative: it went
//!   down). When the baseline median is 0 the change is `None`, except that two zero medians
//!   are no change (`Some(0.0)`), as in [`crate::verdict::decide`].
//! * The bootstrap confidence interval resamples each side with replacement
//!   ([`CompareConfig::resamples`] times), computes the change of the resampled medians, and
//!   takes the `alpha/2` and `1 − alpha/2` percentiles (linear interpolation between order
//!   statistics): the 95% interval for `alpha = 0.05`. A resampled baseline median of 0 gives
//!   an infinite change; if an endpoint is then infinite the interval is `None`.
//! * The Mann-Whitney U statistic is that of the baseline sample: the number of
//!   (baseline, patched) pairs where the baseline value is larger, ties counting ½. The
//!   two-sided p value is exact (the full permutation distribution) when there are no ties and
//!   at most 100 samples in all; otherwise it uses the normal approximation with the tie
//!   correction of the variance and a continuity correction of ½.
//!
//! # The significance rule
//! Like criterion (a change is reported when the test rejects "no change" *and* the change
//! exceeds its noise threshold) and google-benchmark's `compare.py` (a U test plus a
//! relative-difference display), a change is **significant** when both hold:
//! 1. the test rejects "no difference" at `alpha`:
//!    * [`Method::Bootstrap`]: the confidence interval of the change excludes 0;
//!    * [`Method::MannWhitney`]: `p < alpha`;
//! 2. its magnitude exceeds the noise band `band` ([`CompareConfig::noise_band`]):
//!    * [`Method::Bootstrap`]: the *whole* interval lies outside `[−band, +band]`
//!      (`ci_low > band` or `ci_high < −band`);
//!    * [`Method::MannWhitney`]: `|change| > band`.
//!
//! For the bootstrap, (2) implies (1) when `band ≥ 0`. `significant` is `None`, with a caveat,
//! when the method cannot decide:
//! * [`Method::Bootstrap`] needs at least [`MIN_BOOTSTRAP_SAMPLES`] (3) finite samples per side;
//! * [`Method::MannWhitney`] needs enough samples that the smallest p value it can produce,
//!   `2 / C(n + m, n)`, is below `alpha` (3 + 3 gives 0.1, so at least 4 per side at 0.05);
//! * the change is undefined (a baseline median of 0 with a non-zero patched median) or the
//!   interval is unbounded.
//!
//! The noise band matters for more than practical relevance: the percentile bootstrap of a
//! median is mildly liberal with small samples (in this module's simulation, 20 normal samples
//! per side from one distribution, about 7% of intervals excluded 0 at a nominal 5%), and the
//! band absorbs that (1 in 100 with the default 1% band and 3% noise).
//!
//! Constant samples work: identical constants have a degenerate interval `[0, 0]` and p = 1
//! (not significant); different constants have the interval `[c, c]` and a small p, so they are
//! significant when `|c|` exceeds the band. Non-finite samples (NaN, ±∞) are dropped and named
//! in the caveat; [`median`], [`mann_whitney_u`] and [`bootstrap_ci`] drop them too.

use serde::{Deserialize, Serialize};

/// Fewest finite samples per side for a bootstrap significance decision.
pub const MIN_BOOTSTRAP_SAMPLES: usize = 3;
/// The exact Mann-Whitney distribution is used up to this many samples in all (without ties).
pub const MAX_EXACT_MWU_SAMPLES: usize = 100;
/// Bootstrap resamples are clamped to `[MIN_RESAMPLES, MAX_RESAMPLES]`.
pub const MIN_RESAMPLES: usize = 100;
/// See [`MIN_RESAMPLES`].
pub const MAX_RESAMPLES: usize = 1_000_000;

/// Which test decides significance (both are always computed when there are samples).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// Percentile bootstrap interval of the relative change of medians.
    #[default]
    Bootstrap,
    /// Mann-Whitney U (Wilcoxon rank-sum) test, two-sided.
    MannWhitney,
}

/// The comparison of one metric's samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Median of the finite baseline samples (NaN when there is none: check `n_baseline`).
    pub baseline_median: f64,
    /// Median of the finite patched samples (NaN when there is none: check `n_patched`).
    pub patched_median: f64,
    /// `(patched_median − baseline_median) / |baseline_median|`; `None` when the baseline
    /// median is 0 and the patched one is not (0 when both are 0).
    pub change: Option<f64>,
    /// Lower end of the bootstrap interval of the change (`None` with too few samples).
    pub ci_low: Option<f64>,
    /// Upper end of the bootstrap interval of the change.
    pub ci_high: Option<f64>,
    /// Two-sided Mann-Whitney p value (`None` when a side has no finite sample).
    pub p_value: Option<f64>,
    /// Whether the change is significant under `method` (see the module documentation);
    /// `None` when there are too few samples for the method.
    pub significant: Option<bool>,
    /// The method that decided `significant`.
    pub method: Method,
    /// Finite baseline samples used.
    pub n_baseline: usize,
    /// Finite patched samples used.
    pub n_patched: usize,
    /// Why `significant` is `None`, which samples were dropped, or which setting was replaced.
    pub caveat: Option<String>,
}

/// How [`compare`] works; [`Default`] gives the documented defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompareConfig {
    /// The deciding test.
    pub method: Method,
    /// Significance level, in `(0, 0.5]` (default 0.05; other values fall back to it).
    pub alpha: f64,
    /// Relative changes up to this size are noise (default 0.01 = 1%; a negative or
    /// non-finite value falls back to it).
    pub noise_band: f64,
    /// Bootstrap resamples (default 10 000; clamped to `[MIN_RESAMPLES, MAX_RESAMPLES]`).
    pub resamples: usize,
    /// Seed of the bootstrap's generator.
    pub seed: u64,
}

impl CompareConfig {
    /// The default significance level.
    pub const DEFAULT_ALPHA: f64 = 0.05;
    /// The default noise band (1%).
    pub const DEFAULT_NOISE_BAND: f64 = 0.01;
    /// The default number of bootstrap resamples.
    pub const DEFAULT_RESAMPLES: usize = 10_000;
    /// The default seed.
    pub const DEFAULT_SEED: u64 = 0x5EED_F0F0_0000_0001;
}

impl Default for CompareConfig {
    fn default() -> Self {
        CompareConfig {
            method: Method::Bootstrap,
            alpha: Self::DEFAULT_ALPHA,
            noise_band: Self::DEFAULT_NOISE_BAND,
            resamples: Self::DEFAULT_RESAMPLES,
            seed: Self::DEFAULT_SEED,
        }
    }
}

fn finite(xs: &[f64]) -> Vec<f64> {
    xs.iter().copied().filter(|x| x.is_finite()).collect()
}

/// Median of a sorted, non-empty slice.
fn median_sorted(xs: &[f64]) -> f64 {
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        // Halves first so that two huge values cannot overflow to infinity.
        xs[n / 2 - 1] / 2.0 + xs[n / 2] / 2.0
    }
}

/// The median of the finite values of `xs` (mean of the two middle ones for an even count);
/// `None` when there is no finite value.
pub fn median(xs: &[f64]) -> Option<f64> {
    let mut v = finite(xs);
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(median_sorted(&v))
}

/// Relative change of `p` against `b`, with the project's zero convention: `None` when it
/// is unbounded, for a baseline of 0 and a patched value that is not, and for a change too
/// large for a finite number (a huge value against a small or opposite one), so that every
/// change that is a number is a finite one.
pub(crate) fn relative_change(b: f64, p: f64) -> Option<f64> {
    if b != 0.0 {
        Some((p - b) / b.abs()).filter(|c| c.is_finite())
    } else if p == 0.0 {
        Some(0.0)
    } else {
        None
    }
}

// ---------------------------------------------------------------------------------------
// Mann-Whitney U.
// ---------------------------------------------------------------------------------------

/// Mann-Whitney U test of `a` against `b` (non-finite values dropped).
///
/// Returns `U` of `a` (pairs with the `a` value larger, ties ½; `U_a + U_b = n·m`) and the
/// two-sided p value: exact without ties and with at most [`MAX_EXACT_MWU_SAMPLES`] values in
/// all, otherwise the normal approximation with tie and continuity corrections. A side with
/// no finite value, or all values tied, gives p = 1.
pub fn mann_whitney_u(a: &[f64], b: &[f64]) -> (f64, f64) {
    let a = finite(a);
    let b = finite(b);
    let (n, m) = (a.len(), b.len());
    if n == 0 || m == 0 {
        return (0.0, 1.0);
    }
    // Rank the pooled sample with midranks for ties; remember the tie groups.
    let mut pooled: Vec<(f64, bool)> = a
        .iter()
        .map(|&x| (x, true))
        .chain(b.iter().map(|&x| (x, false)))
        .collect();
    pooled.sort_by(|x, y| x.0.total_cmp(&y.0));
    let total = pooled.len();
    let mut rank_sum_a = 0.0;
    let mut tie_term = 0.0; // Σ (t³ − t) over tie groups
    let mut ties = false;
    let mut i = 0;
    while i < total {
        let mut j = i + 1;
        // `==` rather than total_cmp: -0.0 and 0.0 are the same measurement.
        while j < total && pooled[j].0 == pooled[i].0 {
            j += 1;
        }
        let t = (j - i) as f64;
        if j - i > 1 {
            ties = true;
            tie_term += t * t * t - t;
        }
        // Ranks i+1 ..= j, averaged.
        let mid = (i + 1 + j) as f64 / 2.0;
        rank_sum_a += mid * pooled[i..j].iter().filter(|e| e.1).count() as f64;
        i = j;
    }
    let (nf, mf) = (n as f64, m as f64);
    let u = rank_sum_a - nf * (nf + 1.0) / 2.0;

    let p = if !ties && n + m <= MAX_EXACT_MWU_SAMPLES {
        exact_two_sided_p(n, m, u)
    } else {
        let mu = nf * mf / 2.0;
        let nt = nf + mf;
        let var = nf * mf / 12.0 * ((nt + 1.0) - tie_term / (nt * (nt - 1.0)));
        if var <= 0.0 {
            1.0
        } else {
            let z = ((u - mu).abs() - 0.5).max(0.0) / var.sqrt();
            erfc(z / std::f64::consts::SQRT_2)
        }
    };
    (u, p.clamp(0.0, 1.0))
}

/// Counts of U = 0..=n·m over all C(n+m, n) arrangements without ties: the coefficients of
/// the Gaussian binomial coefficient [n+m choose n]_q, built as
/// Π_{i=1..n} (1 − q^{m+i}) / (1 − q^i) with exact integer arithmetic.
pub(crate) fn mwu_counts(n: usize, m: usize) -> Vec<i128> {
    let deg = n * m;
    let mut c = vec![0i128; deg + 1];
    c[0] = 1;
    let mut cur_deg = 0usize;
    for i in 1..=n {
        // Multiply by (1 − q^{m+i}).
        let k = m + i;
        let new_deg = cur_deg + m; // degree of [m+i choose i]_q is i·m
        for d in (k..=(cur_deg + k).min(deg)).rev() {
            c[d] -= c[d - k];
        }
        // Divide by (1 − q^i): b[d] = a[d] + b[d − i] (exact, the quotient is a polynomial).
        // Run over the product's whole degree so its top coefficients cancel to 0.
        for d in i..=(cur_deg + k).min(deg) {
            c[d] += c[d - i];
        }
        cur_deg = new_deg;
    }
    c
}

fn exact_two_sided_p(n: usize, m: usize, u: f64) -> f64 {
    let counts = mwu_counts(n, m);
    let total: i128 = counts.iter().sum();
    // Without ties U is an integer.
    let u = u.round().clamp(0.0, (n * m) as f64) as usize;
    let le: i128 = counts[..=u].iter().sum();
    let ge: i128 = counts[u..].iter().sum();
    (2.0 * le.min(ge) as f64 / total as f64).min(1.0)
}

/// The smallest two-sided exact p value with `n` and `m` samples: `2 / C(n+m, n)`.
pub(crate) fn min_exact_p(n: usize, m: usize) -> f64 {
    // C(n+m, n) as f64, multiplicatively (exact enough for this threshold).
    let (small, large) = if n < m { (n, m) } else { (m, n) };
    let mut c = 1.0f64;
    for k in 1..=small {
        c = c * (large + k) as f64 / k as f64;
    }
    (2.0 / c).min(1.0)
}

/// The complementary error function, for the normal tail: a positive-term series for
/// `x < 1` (where `erfc ≥ 0.157`, so `1 − erf` loses nothing), a continued fraction beyond
/// (relative error around 1e-15).
pub(crate) fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x < 0.0 {
        return 2.0 - erfc(-x);
    }
    let frac_1_sqrt_pi = std::f64::consts::FRAC_2_SQRT_PI / 2.0;
    if x < 1.0 {
        // erf(x) = 2/√π · e^{−x²} · Σ_{k≥0} 2^k x^{2k+1} / (1·3·…·(2k+1))
        let mut term = x;
        let mut sum = x;
        let mut k = 0.0;
        while term > sum * 1e-17 {
            k += 1.0;
            term *= 2.0 * x * x / (2.0 * k + 1.0);
            sum += term;
        }
        1.0 - 2.0 * frac_1_sqrt_pi * (-x * x).exp() * sum
    } else {
        // erfc(x) = e^{−x²}/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + …)))), from the bottom;
        // 300 terms reach double precision from x = 1 on.
        let mut f = x;
        for k in (1..=300).rev() {
            f = x + (k as f64 / 2.0) / f;
        }
        frac_1_sqrt_pi * (-x * x).exp() / f
    }
}

// ---------------------------------------------------------------------------------------
// Bootstrap.
// ---------------------------------------------------------------------------------------

/// SplitMix64 (Steele, Lea, Flood 2014): small, fast, and fully specified, so the bootstrap
/// is reproducible across versions of any crate.
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), by multiply-and-shift with rejection (no modulo bias).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        let n = n as u64;
        let threshold = n.wrapping_neg() % n; // 2^64 mod n
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as usize;
            }
        }
    }
}

fn resample_median(rng: &mut SplitMix64, xs: &[f64], buf: &mut Vec<f64>) -> f64 {
    buf.clear();
    buf.extend((0..xs.len()).map(|_| xs[rng.below(xs.len())]));
    let n = buf.len();
    let mid = n / 2;
    let (_, hi, _) = buf.select_nth_unstable_by(mid, f64::total_cmp);
    let hi = *hi;
    if n % 2 == 1 {
        hi
    } else {
        // The lower middle is the largest value left of `mid`.
        let lo = buf[..mid].iter().copied().fold(f64::NEG_INFINITY, f64::max);
        lo / 2.0 + hi / 2.0
    }
}

/// Percentile `q` of sorted values, interpolating linearly between order statistics.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let h = (sorted.len() - 1) as f64 * q;
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    let w = h - lo as f64;
    if w == 0.0 || sorted[lo] == sorted[hi] {
        sorted[lo]
    } else {
        sorted[lo] + w * (sorted[hi] - sorted[lo])
    }
}

/// Percentile bootstrap `1 − alpha` interval of the relative change of medians
/// `(median(patched) − median(baseline)) / |median(baseline)|` (non-finite values dropped).
///
/// `None` when a side has no finite value, `alpha` is not in `(0, 1)`, `resamples` is 0, or an
/// endpoint is not finite (resampled baseline medians of 0). Deterministic in `seed`.
pub fn bootstrap_ci(
    baseline: &[f64],
    patched: &[f64],
    alpha: f64,
    resamples: usize,
    seed: u64,
) -> Option<(f64, f64)> {
    let b = finite(baseline);
    let p = finite(patched);
    if b.is_empty() || p.is_empty() || resamples == 0 || !(alpha > 0.0 && alpha < 1.0) {
        return None;
    }
    let mut rng = SplitMix64(seed);
    let mut buf = Vec::with_capacity(b.len().max(p.len()));
    let mut changes = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        let mb = resample_median(&mut rng, &b, &mut buf);
        let mp = resample_median(&mut rng, &p, &mut buf);
        let c = match relative_change(mb, mp) {
            Some(c) => c,
            // Baseline median 0, patched not, or a change too large to be finite (the
            // patched median then dwarfs the baseline's): unbounded, in the patched
            // median's direction.
            None => f64::INFINITY.copysign(mp),
        };
        changes.push(c);
    }
    changes.sort_by(f64::total_cmp);
    let lo = percentile(&changes, alpha / 2.0);
    let hi = percentile(&changes, 1.0 - alpha / 2.0);
    (lo.is_finite() && hi.is_finite()).then_some((lo, hi))
}

// ---------------------------------------------------------------------------------------
// The comparison.
// ---------------------------------------------------------------------------------------

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn sample_counts(nb: usize, np: usize) -> String {
    if nb == np {
        format!("{} per side", plural(nb, "sample", "samples"))
    } else {
        format!("{nb} baseline and {np} patched samples")
    }
}

/// Fewest equal-sized samples per side for which `2 / C(2k, k) < alpha`.
fn mwu_needed_per_side(alpha: f64) -> Option<usize> {
    (1..=64).find(|&k| min_exact_p(k, k) < alpha)
}

/// Compare the samples of metric `name` (see the module documentation for every rule).
pub fn compare(name: &str, baseline: &[f64], patched: &[f64], cfg: &CompareConfig) -> Comparison {
    let mut caveats: Vec<String> = Vec::new();
    let alpha = if cfg.alpha > 0.0 && cfg.alpha <= 0.5 {
        cfg.alpha
    } else {
        caveats.push(format!(
            "alpha {} is not in (0, 0.5]; used {}",
            cfg.alpha,
            CompareConfig::DEFAULT_ALPHA
        ));
        CompareConfig::DEFAULT_ALPHA
    };
    let band = if cfg.noise_band.is_finite() && cfg.noise_band >= 0.0 {
        cfg.noise_band
    } else {
        caveats.push(format!(
            "noise band {} is not a finite number >= 0; used {}",
            cfg.noise_band,
            CompareConfig::DEFAULT_NOISE_BAND
        ));
        CompareConfig::DEFAULT_NOISE_BAND
    };
    let resamples = cfg.resamples.clamp(MIN_RESAMPLES, MAX_RESAMPLES);

    let b = finite(baseline);
    let p = finite(patched);
    let (nb, np) = (b.len(), p.len());
    let dropped_b = baseline.len() - nb;
    let dropped_p = patched.len() - np;
    if dropped_b + dropped_p > 0 {
        caveats.push(format!(
            "{} skipped (baseline {dropped_b}, patched {dropped_p})",
            plural(
                dropped_b + dropped_p,
                "non-finite sample",
                "non-finite samples"
            )
        ));
    }

    let baseline_median = median(&b).unwrap_or(f64::NAN);
    let patched_median = median(&p).unwrap_or(f64::NAN);
    let change = if nb > 0 && np > 0 {
        relative_change(baseline_median, patched_median)
    } else {
        None
    };
    let p_value = (nb > 0 && np > 0).then(|| mann_whitney_u(&b, &p).1);
    let (ci_low, ci_high) =
        if nb >= MIN_BOOTSTRAP_SAMPLES && np >= MIN_BOOTSTRAP_SAMPLES && change.is_some() {
            match bootstrap_ci(&b, &p, alpha, resamples, cfg.seed) {
                Some((lo, hi)) => (Some(lo), Some(hi)),
                None => (None, None),
            }
        } else {
            (None, None)
        };

    let significant = if nb == 0 || np == 0 {
        let side = match (nb, np) {
            (0, 0) => "either side",
            (0, _) => "the baseline",
            _ => "the patched run",
        };
        caveats.push(format!("no finite sample from {side}; nothing to compare"));
        None
    } else if change.is_none() {
        caveats.push(if baseline_median == 0.0 {
            "the baseline median is 0, so the relative change is undefined; significance not tested"
                .to_string()
        } else {
            "the relative change is too large to be a finite number (unbounded); significance not tested"
                .to_string()
        });
        None
    } else {
        match cfg.method {
            Method::Bootstrap => {
                if nb < MIN_BOOTSTRAP_SAMPLES || np < MIN_BOOTSTRAP_SAMPLES {
                    caveats.push(format!(
                        "{}; at least {MIN_BOOTSTRAP_SAMPLES} are needed to test significance",
                        sample_counts(nb, np)
                    ));
                    None
                } else {
                    match (ci_low, ci_high) {
                        (Some(lo), Some(hi)) => Some(lo > band || hi < -band),
                        _ => {
                            caveats.push(
                                "the bootstrap interval is unbounded (resampled baseline medians of 0); significance not tested"
                                    .to_string(),
                            );
                            None
                        }
                    }
                }
            }
            Method::MannWhitney => {
                if min_exact_p(nb, np) >= alpha {
                    let need = match mwu_needed_per_side(alpha) {
                        Some(k) => format!("at least {k} per side"),
                        None => "far more samples".to_string(),
                    };
                    caveats.push(format!(
                        "{}; the Mann-Whitney test needs {need} to reach p < {alpha}",
                        sample_counts(nb, np)
                    ));
                    None
                } else {
                    let rejects = p_value.is_some_and(|pv| pv < alpha);
                    let beyond = change.is_some_and(|c| c.abs() > band);
                    Some(rejects && beyond)
                }
            }
        }
    };

    Comparison {
        baseline_median,
        patched_median,
        change,
        ci_low,
        ci_high,
        p_value,
        significant,
        method: cfg.method,
        n_baseline: nb,
        n_patched: np,
        caveat: (!caveats.is_empty()).then(|| format!("{name}: {}", caveats.join("; "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Run a python3 snippet that prints one float per line.
    fn python_floats(script: &str) -> Vec<f64> {
        let out = Command::new("python3")
            .args(["-c", script])
            .output()
            .expect("python3 is on PATH");
        assert!(
            out.status.success(),
            "python3 failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect()
    }

    fn py_list(xs: &[f64]) -> String {
        let items: Vec<String> = xs.iter().map(|x| format!("{x:?}")).collect();
        format!("[{}]", items.join(", "))
    }

    /// Exact two-sided Mann-Whitney p by enumerating every split of the pooled sample
    /// (itertools), independent of the Gaussian-binomial counting used here.
    fn python_exact_mwu(a: &[f64], b: &[f64]) -> (f64, f64) {
        let script = format!(
            r#"
import itertools
a = {a}; b = {b}
def u(x, y): return sum((xi > yi) + 0.5 * (xi == yi) for xi in x for yi in y)
u0 = u(a, b)
pool = a + b
le = ge = tot = 0
for idx in itertools.combinations(range(len(pool)), len(a)):
    s = set(idx)
    x = [pool[i] for i in idx]; y = [pool[i] for i in range(len(pool)) if i not in s]
    v = u(x, y); tot += 1
    le += v <= u0; ge += v >= u0
print(u0)
print(min(1.0, 2 * min(le, ge) / tot))
"#,
            a = py_list(a),
            b = py_list(b)
        );
        let v = python_floats(&script);
        (v[0], v[1])
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN, f64::INFINITY]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[5.0, f64::NAN, 1.0]), Some(3.0));
        assert_eq!(median(&[f64::MAX, f64::MAX]), Some(f64::MAX));
    }

    #[test]
    fn mann_whitney_textbook_example() {
        // Conover's example as used in scipy's documentation: five male and four female
        // scores. Male ranks 3, 5, 7, 8, 9 → R = 32, U = 32 − 15 = 17; by hand, the 126
        // arrangements with U ≥ 17 are those with U_max − U = 0, 1, 2, 3: 1 + 1 + 2 + 3 = 7,
        // so the exact two-sided p is 2 · 7/126 = 1/9.
        let males = [19.0, 22.0, 16.0, 29.0, 24.0];
        let females = [20.0, 11.0, 17.0, 12.0];
        let (u, p) = mann_whitney_u(&males, &females);
        assert_eq!(u, 17.0);
        assert!((p - 1.0 / 9.0).abs() < 1e-15, "{p}");
        let (u2, p2) = mann_whitney_u(&females, &males);
        assert_eq!(u2, 20.0 - 17.0);
        assert!((p2 - p).abs() < 1e-15);
        // Complete separation with 3 + 3: p = 2/C(6,3) = 0.1; with 4 + 4: 2/70.
        let (u, p) = mann_whitney_u(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]);
        assert_eq!((u, p), (0.0, 0.1));
        let (_, p) = mann_whitney_u(&[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0]);
        assert!((p - 2.0 / 70.0).abs() < 1e-15);
    }

    #[test]
    fn mann_whitney_exact_matches_enumeration() {
        let cases: [(&[f64], &[f64]); 4] = [
            (&[1.1, 3.4, 2.2, 8.0, 5.5], &[4.0, 6.1, 7.2, 9.9]),
            (
                &[0.5, 0.7, 0.2, 0.9, 0.1, 0.3],
                &[0.6, 0.8, 1.2, 1.5, 0.4, 1.1],
            ),
            (
                &[10.0, 20.0, 30.0],
                &[15.0, 25.0, 35.0, 45.0, 5.0, 50.0, 55.0],
            ),
            (&[2.0], &[1.0, 3.0]),
        ];
        for (a, b) in cases {
            let (u, p) = mann_whitney_u(a, b);
            let (pu, pp) = python_exact_mwu(a, b);
            assert_eq!(u, pu, "{a:?} {b:?}");
            assert!((p - pp).abs() < 1e-12, "{a:?} {b:?}: {p} vs {pp}");
        }
    }

    #[test]
    fn mann_whitney_normal_approximation_with_ties() {
        // Ties force the normal approximation; check against the same formula evaluated by
        // python with math.erfc (an independent implementation of the tail).
        let a = [1.0, 2.0, 2.0, 3.0, 3.0, 3.0, 4.0, 7.0];
        let b = [3.0, 4.0, 4.0, 5.0, 6.0, 6.0, 7.0, 8.0, 9.0];
        let script = format!(
            r#"
import math
a = {a}; b = {b}
n, m = len(a), len(b); N = n + m
pool = sorted(a + b)
def rank(v):
    lo = pool.index(v); hi = lo + pool.count(v)
    return (lo + 1 + hi) / 2
u = sum(rank(v) for v in a) - n * (n + 1) / 2
t = sum(pool.count(v) ** 3 - pool.count(v) for v in set(pool))
var = n * m / 12 * ((N + 1) - t / (N * (N - 1)))
z = max(abs(u - n * m / 2) - 0.5, 0) / math.sqrt(var)
print(u)
print(math.erfc(z / math.sqrt(2)))
"#,
            a = py_list(&a),
            b = py_list(&b)
        );
        let want = python_floats(&script);
        let (u, p) = mann_whitney_u(&a, &b);
        assert_eq!(u, want[0]);
        assert!(
            (p - want[1]).abs() < 1e-12 * want[1].max(1e-300),
            "{p} vs {}",
            want[1]
        );
        // Large samples use the approximation too (and stay finite and in [0, 1]).
        let big_a: Vec<f64> = (0..200).map(|i| i as f64).collect();
        let big_b: Vec<f64> = (0..200).map(|i| i as f64 + 0.5).collect();
        let (_, p) = mann_whitney_u(&big_a, &big_b);
        assert!(p > 0.5 && p <= 1.0, "{p}");
        let far_b: Vec<f64> = (0..200).map(|i| i as f64 + 1000.0).collect();
        let (u, p) = mann_whitney_u(&big_a, &far_b);
        assert_eq!(u, 0.0);
        assert!(p > 0.0 && p < 1e-60, "{p}");
    }

    #[test]
    fn erfc_matches_python() {
        let xs = [
            0.0, 0.1, 0.5, 0.99, 1.0, 1.9, 2.5, 2.99, 3.0, 3.5, 5.0, 10.0, 25.0, -1.3,
        ];
        let script = format!(
            "import math\nfor x in {}: print(repr(math.erfc(x)))",
            py_list(&xs)
        );
        let want = python_floats(&script);
        for (x, w) in xs.iter().zip(want) {
            let got = erfc(*x);
            assert!(
                (got - w).abs() <= 1e-13 * w.abs().max(1e-300),
                "erfc({x}) = {got}, python says {w}"
            );
        }
    }

    #[test]
    fn mann_whitney_degenerate_inputs() {
        assert_eq!(mann_whitney_u(&[], &[1.0]), (0.0, 1.0));
        assert_eq!(mann_whitney_u(&[f64::NAN], &[1.0]), (0.0, 1.0));
        let (u, p) = mann_whitney_u(&[5.0; 6], &[5.0; 6]);
        assert_eq!((u, p), (18.0, 1.0));
    }

    #[test]
    fn exact_counts_are_a_distribution() {
        for (n, m) in [(1, 1), (3, 4), (7, 5), (50, 50), (1, 99)] {
            let c = mwu_counts(n, m);
            assert!(c.iter().all(|&x| x >= 0));
            // Symmetric, and the total is C(n+m, n).
            assert!(c.iter().eq(c.iter().rev()));
            let total: i128 = c.iter().sum();
            let mut binom: i128 = 1;
            for k in 1..=n as i128 {
                binom = binom * (m as i128 + k) / k;
            }
            assert_eq!(total, binom, "n={n} m={m}");
        }
    }

    #[test]
    fn bootstrap_is_deterministic_in_its_seed() {
        let b = [100.0, 103.0, 98.0, 101.0, 99.5, 102.0];
        let p = [95.0, 97.0, 94.0, 99.0, 96.0, 93.5];
        let one = bootstrap_ci(&b, &p, 0.05, 5000, 42).unwrap();
        let two = bootstrap_ci(&b, &p, 0.05, 5000, 42).unwrap();
        assert_eq!(one, two);
        let other = bootstrap_ci(&b, &p, 0.05, 5000, 43).unwrap();
        assert_ne!(one, other, "a different seed draws different resamples");
        assert!(one.0 <= one.1);
        // The point estimate (−4%) lies in the interval.
        let point = (median(&p).unwrap() - median(&b).unwrap()) / median(&b).unwrap();
        assert!(one.0 <= point && point <= one.1, "{one:?} {point}");
        let cfg = CompareConfig::default();
        assert_eq!(compare("x", &b, &p, &cfg), compare("x", &b, &p, &cfg));
    }

    #[test]
    fn bootstrap_ci_edges() {
        assert_eq!(bootstrap_ci(&[], &[1.0], 0.05, 100, 1), None);
        assert_eq!(bootstrap_ci(&[1.0], &[1.0], 0.0, 100, 1), None);
        assert_eq!(bootstrap_ci(&[1.0], &[1.0], 0.05, 0, 1), None);
        // Baseline all zeros: every resampled change is +∞: unbounded, so None.
        assert_eq!(bootstrap_ci(&[0.0; 4], &[1.0; 4], 0.05, 100, 1), None);
        // Constants: a degenerate interval at the exact change.
        assert_eq!(
            bootstrap_ci(&[10.0; 5], &[12.0; 5], 0.05, 100, 1),
            Some((0.2, 0.2))
        );
    }

    /// A deterministic normal sample (Box-Muller over SplitMix64), for the noise tests.
    fn normal_samples(rng: &mut SplitMix64, n: usize, mean: f64, sd: f64) -> Vec<f64> {
        (0..n)
            .map(|_| {
                let u1 = ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
                let u2 = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                mean + sd * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
            })
            .collect()
    }

    #[test]
    fn a_clear_gain_is_significant_with_both_methods() {
        // compressed_bytes 40% lower, 5 noisy samples per side (≈3% noise).
        let b = [1000.0, 1032.0, 975.0, 1011.0, 990.0];
        let p = [600.0, 619.0, 588.0, 611.0, 596.0];
        for method in [Method::Bootstrap, Method::MannWhitney] {
            let cfg = CompareConfig {
                method,
                ..CompareConfig::default()
            };
            let c = compare("compressed_bytes", &b, &p, &cfg);
            assert_eq!(c.significant, Some(true), "{method:?}: {c:?}");
            assert!((c.change.unwrap() + 0.4).abs() < 0.01, "{c:?}");
            assert!(c.ci_high.unwrap() < -0.3, "{c:?}");
            assert!((c.p_value.unwrap() - 2.0 / 252.0).abs() < 1e-12);
            assert_eq!((c.n_baseline, c.n_patched), (5, 5));
            assert_eq!(c.caveat, None);
        }
    }

    #[test]
    fn pure_noise_is_rarely_significant() {
        let mut rng = SplitMix64(7);
        for (method, n) in [
            (Method::Bootstrap, 5),
            (Method::Bootstrap, 20),
            (Method::MannWhitney, 5),
            (Method::MannWhitney, 20),
        ] {
            let mut false_positives = 0;
            for trial in 0..100u64 {
                let b = normal_samples(&mut rng, n, 100.0, 3.0);
                let p = normal_samples(&mut rng, n, 100.0, 3.0);
                let cfg = CompareConfig {
                    method,
                    resamples: 2000,
                    seed: trial,
                    ..CompareConfig::default()
                };
                let c = compare("latency_ms", &b, &p, &cfg);
                assert!(c.significant.is_some(), "{c:?}");
                if c.significant == Some(true) {
                    false_positives += 1;
                }
            }
            assert!(
                false_positives <= 5,
                "{method:?} n={n}: {false_positives}/100 false positives"
            );
        }
    }

    #[test]
    fn a_change_inside_the_band_is_not_significant_even_when_real() {
        // 0.5% slower, measured very precisely 200 times per side: the test rejects "no
        // difference" but the change is inside the 1% band.
        let mut rng = SplitMix64(11);
        let b = normal_samples(&mut rng, 200, 100.0, 0.05);
        let p = normal_samples(&mut rng, 200, 100.5, 0.05);
        for method in [Method::Bootstrap, Method::MannWhitney] {
            let cfg = CompareConfig {
                method,
                resamples: 2000,
                ..CompareConfig::default()
            };
            let c = compare("p99_ms", &b, &p, &cfg);
            assert!(c.p_value.unwrap() < 1e-10, "{c:?}");
            assert!(c.ci_low.unwrap() > 0.0, "the interval excludes 0: {c:?}");
            assert_eq!(c.significant, Some(false), "{method:?}: {c:?}");
            // With a 0.1% band the same change is significant.
            let tight = CompareConfig {
                noise_band: 0.001,
                ..cfg
            };
            assert_eq!(compare("p99_ms", &b, &p, &tight).significant, Some(true));
        }
    }

    #[test]
    fn too_few_samples_give_none_and_a_caveat() {
        let cfg = CompareConfig::default();
        let c = compare("compressed_bytes", &[100.0], &[60.0], &cfg);
        assert_eq!(c.significant, None);
        assert_eq!(c.change, Some(-0.4));
        assert_eq!((c.ci_low, c.ci_high), (None, None));
        assert_eq!(
            c.caveat.as_deref(),
            Some("compressed_bytes: 1 sample per side; at least 3 are needed to test significance")
        );
        let c = compare("x", &[1.0, 2.0], &[3.0, 4.0, 5.0], &cfg);
        assert_eq!(c.significant, None);
        assert!(c
            .caveat
            .unwrap()
            .contains("2 baseline and 3 patched samples; at least 3"));

        // Mann-Whitney with 3 + 3: the smallest p is 0.1 > 0.05, so it cannot decide.
        let mw = CompareConfig {
            method: Method::MannWhitney,
            ..cfg
        };
        let c = compare("p99_ms", &[10.0, 11.0, 12.0], &[20.0, 21.0, 22.0], &mw);
        assert_eq!(c.significant, None);
        assert_eq!(c.p_value, Some(0.1));
        let caveat = c.caveat.unwrap();
        assert!(
            caveat.contains("3 samples per side")
                && caveat.contains("at least 4 per side to reach p < 0.05"),
            "{caveat}"
        );
        // 4 + 4 is enough.
        let c = compare(
            "p99_ms",
            &[10.0, 11.0, 12.0, 13.0],
            &[20.0, 21.0, 22.0, 23.0],
            &mw,
        );
        assert_eq!(c.significant, Some(true));
        // At alpha 0.01 more are needed: 2/C(10,5) = 0.0079 < 0.01, 2/C(8,4) = 0.029.
        let strict = CompareConfig { alpha: 0.01, ..mw };
        let c = compare(
            "p99_ms",
            &[10.0, 11.0, 12.0, 13.0],
            &[20.0, 21.0, 22.0, 23.0],
            &strict,
        );
        assert_eq!(c.significant, None);
        assert!(c.caveat.unwrap().contains("at least 5 per side"));

        // Nothing on one side.
        let c = compare("x", &[], &[1.0, 2.0, 3.0], &cfg);
        assert_eq!(c.significant, None);
        assert!(c.baseline_median.is_nan());
        assert_eq!(c.p_value, None);
        assert!(c
            .caveat
            .unwrap()
            .contains("no finite sample from the baseline"));
    }

    #[test]
    fn constant_samples() {
        for method in [Method::Bootstrap, Method::MannWhitney] {
            let cfg = CompareConfig {
                method,
                ..CompareConfig::default()
            };
            let same = compare("size", &[500.0; 5], &[500.0; 5], &cfg);
            assert_eq!(same.significant, Some(false), "{method:?}: {same:?}");
            assert_eq!(same.change, Some(0.0));
            assert_eq!(same.p_value, Some(1.0));
            let diff = compare("size", &[500.0; 5], &[600.0; 5], &cfg);
            assert_eq!(diff.significant, Some(true), "{method:?}: {diff:?}");
            assert_eq!((diff.ci_low, diff.ci_high), (Some(0.2), Some(0.2)));
            assert!(diff.p_value.unwrap() < 0.01);
            // Different constants, but within the band.
            let tiny = compare("size", &[500.0; 5], &[502.0; 5], &cfg);
            assert_eq!(tiny.significant, Some(false), "{method:?}: {tiny:?}");
        }
    }

    #[test]
    fn non_finite_samples_are_skipped_with_a_caveat() {
        let cfg = CompareConfig::default();
        let c = compare(
            "lat",
            &[10.0, f64::NAN, 10.2, 9.9, 10.1],
            &[f64::INFINITY, 15.0, 15.2, 14.9, f64::NEG_INFINITY],
            &cfg,
        );
        assert_eq!((c.n_baseline, c.n_patched), (4, 3));
        assert_eq!(c.significant, Some(true));
        assert_eq!(
            c.caveat.as_deref(),
            Some("lat: 3 non-finite samples skipped (baseline 1, patched 2)")
        );
        // The result round-trips through JSON.
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains("\"method\":\"bootstrap\""), "{json}");
        assert_eq!(serde_json::from_str::<Comparison>(&json).unwrap(), c);
    }

    #[test]
    fn zero_baselines_and_bad_settings() {
        let cfg = CompareConfig::default();
        let c = compare("errors", &[0.0; 5], &[2.0, 3.0, 2.0, 4.0, 3.0], &cfg);
        assert_eq!(c.change, None);
        assert_eq!(c.significant, None);
        assert!(c.caveat.unwrap().contains("baseline median is 0"));
        let c = compare("errors", &[0.0; 5], &[0.0; 5], &cfg);
        assert_eq!(c.change, Some(0.0));
        assert_eq!(c.significant, Some(false));
        // Half the baseline samples are 0: many resampled medians are 0, the interval is
        // unbounded.
        let c = compare("errors", &[0.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[2.0; 6], &cfg);
        assert_eq!(c.change, Some(3.0));
        assert_eq!(c.significant, None);
        assert!(c.caveat.unwrap().contains("unbounded"));

        let weird = CompareConfig {
            alpha: 2.0,
            noise_band: f64::NAN,
            resamples: 0,
            ..cfg
        };
        let c = compare("x", &[1.0, 1.1, 0.9], &[2.0, 2.1, 1.9], &weird);
        assert_eq!(c.significant, Some(true));
        let caveat = c.caveat.unwrap();
        assert!(
            caveat.contains("alpha 2") && caveat.contains("noise band NaN"),
            "{caveat}"
        );
    }

    #[test]
    fn splitmix_reference_values_and_uniform_below() {
        // First outputs of SplitMix64 seeded with 1234567, as published with the algorithm.
        let mut r = SplitMix64(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
        let mut r = SplitMix64(9);
        let mut seen = [0usize; 3];
        for _ in 0..3000 {
            seen[r.below(3)] += 1;
        }
        assert!(seen.iter().all(|&c| (900..1100).contains(&c)), "{seen:?}");
    }
}
