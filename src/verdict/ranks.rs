//! The one-sided Wilcoxon rank-sum (Mann-Whitney) test, exact also with ties.
//!
//! [`p_greater`] is the p value of "`x` tends to be larger than `y`": the chance, over every
//! way of splitting the pooled values into groups of `x`'s and `y`'s sizes, that `x`'s rank
//! sum is at least the observed one. Tied values share their midrank, and the distribution
//! is the *conditional* one, given the ties (the permutation test of the midrank sum), so it
//! is exact whatever the ties: metrics rounded to a few decimals (`0.5772` twice) or counted
//! in whole units (kilobytes) tie often, and the normal approximation that
//! [`crate::verdict::stats::mann_whitney_u`] falls back to with ties is far from exact at a
//! handful of samples (at 6 against 6, completely separated, it gives about 0.0025 one-sided where
//! the exact value is 1/924 = 0.0011).
//!
//! The distribution is counted by dynamic programming over the doubled midranks (integers):
//! `ways[k][s]`, the number of `k`-subsets of the pooled values whose doubled ranks sum to
//! `s`. Up to [`MAX_EXACT_SAMPLES`] values in all (30 pairs) that is at most about 5 million
//! additions; beyond, the normal approximation with the tie-corrected variance and a
//! continuity correction is used (accurate at those sizes).

use super::stats::erfc;

/// The exact distribution is counted up to this many values in all (both sides).
pub const MAX_EXACT_SAMPLES: usize = 60;

/// One-sided p value of "`x` tends to be larger than `y`" (see the module documentation).
/// Non-finite values are dropped; an empty side gives 1.
pub fn p_greater(x: &[f64], y: &[f64]) -> f64 {
    let x: Vec<f64> = x.iter().copied().filter(|v| v.is_finite()).collect();
    let y: Vec<f64> = y.iter().copied().filter(|v| v.is_finite()).collect();
    let (n, m) = (x.len(), y.len());
    if n == 0 || m == 0 {
        return 1.0;
    }
    let (ranks2, observed2, tie_term) = doubled_midranks(&x, &y);
    let p = if n + m <= MAX_EXACT_SAMPLES {
        exact_upper_tail(&ranks2, n, observed2)
    } else {
        let (nf, mf) = (n as f64, m as f64);
        let nt = nf + mf;
        let mean = nf * (nt + 1.0) / 2.0;
        let var = nf * mf / 12.0 * ((nt + 1.0) - tie_term / (nt * (nt - 1.0)));
        if var <= 0.0 {
            return 1.0;
        }
        let z = (observed2 as f64 / 2.0 - mean - 0.5) / var.sqrt();
        erfc(z / std::f64::consts::SQRT_2) / 2.0
    };
    p.clamp(0.0, 1.0)
}

/// The smallest one-sided p value [`p_greater`] can give with `n` and `m` values:
/// `1 / C(n + m, n)` (without ties; ties only make it larger).
pub fn min_p(n: usize, m: usize) -> f64 {
    if n == 0 || m == 0 {
        return 1.0;
    }
    let (small, large) = if n < m { (n, m) } else { (m, n) };
    let mut c = 1.0f64;
    for k in 1..=small {
        c = c * (large + k) as f64 / k as f64;
    }
    (1.0 / c).min(1.0)
}

/// The distribution-free `1 − a` confidence interval of the shift `d` in "`y` is
/// distributed as `x + d`" that the rank-sum test inverts (Moses; its centre is the
/// Hodges-Lehmann estimate): from the `n·m` differences `y_j − x_i`, sorted, the `k`-th
/// smallest and the `k`-th largest, where `k − 1` is the largest `U` with
/// `P(U ≤ k − 1) ≤ a/2` under the exact Mann-Whitney distribution (the normal approximation
/// beyond [`super::stats::MAX_EXACT_MWU_SAMPLES`] values). A shift outside the interval is
/// one the one-sided rank test against `x` shifted by it rejects at `a/2` (exactly without
/// ties). One run far off moves `m` (or `n`) of the `n·m` differences: once `k > m` (10
/// pairs against 10 at the levels of a sequential look) a single burst on the machine moves
/// the interval by one difference, where it drags a bootstrap interval of medians at a
/// small `a` towards itself. When the samples are too few for any `k ≥ 1` (the rank test
/// cannot reach `a/2` either), the whole range of the differences (`k = 1`). `None` when a
/// side is empty or `a` is not in `(0, 1)`.
pub fn shift_interval(x: &[f64], y: &[f64], a: f64) -> Option<(f64, f64)> {
    let x: Vec<f64> = x.iter().copied().filter(|v| v.is_finite()).collect();
    let y: Vec<f64> = y.iter().copied().filter(|v| v.is_finite()).collect();
    let (n, m) = (x.len(), y.len());
    if n == 0 || m == 0 || !(a > 0.0 && a < 1.0) {
        return None;
    }
    let nm = n * m;
    let tail = a / 2.0;
    // k − 1 = the largest u with P(U ≤ u) ≤ a/2.
    let k = if n + m <= super::stats::MAX_EXACT_MWU_SAMPLES {
        let counts = super::stats::mwu_counts(n, m);
        let total: f64 = counts.iter().map(|c| *c as f64).sum();
        let mut cum = 0.0;
        let mut k = 0;
        for c in &counts {
            cum += *c as f64;
            if cum / total > tail {
                break;
            }
            k += 1;
        }
        k
    } else {
        let (nf, mf) = (n as f64, m as f64);
        let sd = (nf * mf * (nf + mf + 1.0) / 12.0).sqrt();
        let below =
            |u: usize| erfc((nf * mf / 2.0 - u as f64 - 0.5) / sd / std::f64::consts::SQRT_2) / 2.0;
        // `below` grows with u: the first u above the tail, by bisection.
        let (mut lo, mut hi) = (0usize, nm / 2);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if below(mid) <= tail {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    };
    let k = k.clamp(1, nm.div_ceil(2));
    let mut d: Vec<f64> = x
        .iter()
        .flat_map(|xi| y.iter().map(move |yj| yj - xi))
        .collect();
    d.sort_by(f64::total_cmp);
    Some((d[k - 1], d[nm - k]))
}

/// The doubled midranks of the pooled values (`x`'s first), the doubled rank sum of `x`, and
/// the tie term `Σ (t³ − t)` over groups of `t` equal values.
fn doubled_midranks(x: &[f64], y: &[f64]) -> (Vec<usize>, usize, f64) {
    let mut pooled: Vec<(f64, usize)> = x.iter().chain(y).copied().zip(0..).collect();
    pooled.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut ranks2 = vec![0usize; pooled.len()];
    let mut tie_term = 0.0;
    let mut i = 0;
    while i < pooled.len() {
        let mut j = i + 1;
        // `==` rather than total_cmp: -0.0 and 0.0 are the same measurement.
        while j < pooled.len() && pooled[j].0 == pooled[i].0 {
            j += 1;
        }
        let t = (j - i) as f64;
        tie_term += t * t * t - t;
        // Ranks i+1 ..= j share their mean (i + 1 + j) / 2; doubled, an integer.
        for e in &pooled[i..j] {
            ranks2[e.1] = i + 1 + j;
        }
        i = j;
    }
    let observed2 = ranks2[..x.len()].iter().sum();
    (ranks2, observed2, tie_term)
}

/// `P(S ≥ observed)` where `S` is the sum of `n` of the doubled midranks `ranks` (of `N`
/// values) drawn without replacement, every subset equally likely. Counted on the reversed
/// ranks `2(N + 1) − r`: `S ≥ observed` exactly when their sum is at most
/// `t = 2n(N + 1) − observed`, and only sums up to `t` are kept, so the small p values that
/// decide are the cheap ones.
fn exact_upper_tail(ranks: &[usize], n: usize, observed: usize) -> f64 {
    let big = 2 * (ranks.len() + 1);
    let Some(t) = (n * big).checked_sub(observed) else {
        return 0.0;
    };
    let width = t + 1;
    // ways[k * width + s]: k-subsets of the values seen so far whose reversed ranks sum to s.
    let mut ways = vec![0.0f64; (n + 1) * width];
    ways[0] = 1.0;
    for (seen, &r) in ranks.iter().enumerate() {
        let r = big - r;
        if r > t {
            continue;
        }
        for k in (1..=n.min(seen + 1)).rev() {
            let (lower, upper) = ways.split_at_mut(k * width);
            let from = &lower[(k - 1) * width..];
            let to = &mut upper[..width];
            for s in (r..width).rev() {
                to[s] += from[s - r];
            }
        }
    }
    let tail: f64 = ways[n * width..].iter().sum();
    tail * min_p(n, ranks.len() - n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shift_interval_inverts_the_rank_test() {
        // 6 against 6 at a = 0.02: P(U <= 3) = 7/924 <= 0.01 < P(U <= 4) = 12/924, so k = 4:
        // the 4th smallest and the 4th largest of the 36 differences.
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let y = [11.0, 12.0, 13.0, 14.0, 15.0, 16.0];
        let (lo, hi) = shift_interval(&x, &y, 0.02).unwrap();
        assert_eq!((lo, hi), (7.0, 13.0));
        // Shifts just outside are rejected by the one-sided rank test at a/2, just inside not.
        let shifted = |d: f64| x.iter().map(|v| v + d).collect::<Vec<_>>();
        assert!(p_greater(&y, &shifted(lo - 0.5)) <= 0.01);
        assert!(p_greater(&y, &shifted(lo + 0.5)) > 0.01);
        assert!(p_greater(&shifted(hi + 0.5), &y) <= 0.01);
        assert!(p_greater(&shifted(hi - 0.5), &y) > 0.01);
        // One run far off moves 6 of the 36 differences to the top, past the 4th largest: at 6
        // against 6 it widens the interval to the outlier.
        let mut y2 = y;
        y2[0] = 60.0;
        assert!(shift_interval(&x, &y2, 0.02).unwrap().1 > 50.0);
        // At 10 against 10 the outlier's 10 differences (90 and more) stay beyond the k-th
        // largest: the interval moves by a step or two of the others, not to the outlier.
        let x: Vec<f64> = (1..=10).map(f64::from).collect();
        let y: Vec<f64> = (11..=20).map(f64::from).collect();
        let (lo, hi) = shift_interval(&x, &y, 0.02).unwrap();
        let mut y2 = y.clone();
        y2[0] = 100.0;
        let (lo2, hi2) = shift_interval(&x, &y2, 0.02).unwrap();
        assert!(
            lo2 >= lo && lo2 <= lo + 2.0 && hi2 >= hi && hi2 <= hi + 2.0,
            "{lo}..{hi} {lo2}..{hi2}"
        );
        // Too few samples for the level: the whole range of the differences.
        let (x, y) = ([1.0, 2.0, 3.0], [11.0, 12.0, 13.0]);
        assert_eq!(shift_interval(&x, &y, 0.02), Some((8.0, 12.0)));
        assert_eq!(shift_interval(&x, &[], 0.02), None);
        // Large samples: the normal approximation, about +-1.96 sd of a shift of 0.
        let big: Vec<f64> = (0..60).map(|i| i as f64).collect();
        let (lo, hi) = shift_interval(&big, &big, 0.05).unwrap();
        assert!(lo < 0.0 && hi > 0.0 && (lo + hi).abs() < 1e-9, "{lo} {hi}");
        assert!(hi > 5.0 && hi < 10.0, "{hi}");
    }

    #[test]
    fn without_ties_it_is_the_exact_mann_whitney_distribution() {
        // Completely separated, 6 against 6: 1 of C(12, 6) = 924 splits.
        let hi = [7.0, 8.0, 9.0, 10.0, 11.0, 12.0];
        let lo = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert!((p_greater(&hi, &lo) - 1.0 / 924.0).abs() < 1e-12);
        assert_eq!(p_greater(&lo, &hi), 1.0);
        assert!((min_p(6, 6) - 1.0 / 924.0).abs() < 1e-12);
        assert!((min_p(3, 3) - 0.05).abs() < 1e-12);
        // One swap: U = 1 from the top, 2 of 924.
        let hi1 = [6.0, 8.0, 9.0, 10.0, 11.0, 12.0];
        let lo1 = [1.0, 2.0, 3.0, 4.0, 5.0, 7.0];
        assert!((p_greater(&hi1, &lo1) - 2.0 / 924.0).abs() < 1e-12);
        // Agrees with the Gaussian-binomial counts of stats::mann_whitney_u (two-sided / 2).
        let a = [3.1, 4.7, 2.2, 9.0, 5.5, 6.1, 7.3];
        let b = [1.0, 2.5, 0.3, 4.0, 3.3];
        let (_, p2) = crate::verdict::stats::mann_whitney_u(&a, &b);
        assert!((p_greater(&a, &b) - p2 / 2.0).abs() < 1e-12, "{p2}");
    }

    #[test]
    fn ties_keep_the_test_exact() {
        // The compress demo's swap-compressor pairs: p99_ms rounded to 4 decimals, the
        // baseline tied within itself (0.5772 twice), completely above the patched runs.
        let b = [0.5772, 0.5738, 0.5772, 0.5822, 0.5812, 0.5889];
        let p = [0.1259, 0.1251, 0.1267, 0.1255, 0.1248, 0.1265];
        assert!((p_greater(&b, &p) - 1.0 / 924.0).abs() < 1e-12);
        // The normal approximation the rank test used with ties: more than twice as large,
        // above a look's level of 0.0019 (0.0075 spent at 6 pairs, 2 metrics, one side).
        let (_, p2) = crate::verdict::stats::mann_whitney_u(&b, &p);
        assert!(p2 / 2.0 > 0.0019, "{p2}");
        // Ties across the groups: {2, 3, 3} against {1, 2, 2}. The doubled midranks are 2 for
        // the 1, 6 for each 2 and 11 for each 3; x's sum 28 is the maximum, reached by the 3
        // of the C(6, 3) = 20 splits that give x both 3s and one of the three 2s.
        let x = [2.0, 3.0, 3.0];
        let y = [1.0, 2.0, 2.0];
        assert!((p_greater(&x, &y) - 3.0 / 20.0).abs() < 1e-12);
        // All equal: no evidence either way.
        assert_eq!(p_greater(&[5.0; 4], &[5.0; 4]), 1.0);
        // Empty or non-finite.
        assert_eq!(p_greater(&[], &[1.0]), 1.0);
        assert!((p_greater(&[2.0, f64::NAN], &[1.0]) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn large_samples_use_the_normal_approximation() {
        let x: Vec<f64> = (0..40).map(|i| i as f64 + 0.5).collect();
        let y: Vec<f64> = (0..40).map(|i| i as f64).collect();
        let p = p_greater(&x, &y);
        assert!(p > 0.3 && p < 0.5, "{p}");
        let far: Vec<f64> = x.iter().map(|v| v + 100.0).collect();
        assert!(p_greater(&far, &y) < 1e-12);
        assert!(p_greater(&y, &far) > 1.0 - 1e-12);
        // At the boundary (30 against 30, exact) a shift of 5 in 30 is about as unlikely as
        // the approximation (31 against 30) says.
        let y: Vec<f64> = (0..30).map(|i| i as f64).collect();
        let x: Vec<f64> = y.iter().map(|v| v + 5.25).collect();
        let exact = p_greater(&x, &y);
        let mut y2 = y.clone();
        y2.push(15.1);
        let approx = p_greater(&x, &y2);
        assert!(exact > 0.005 && exact < 0.05, "{exact}");
        assert!((exact - approx).abs() < 0.3 * exact, "{exact} {approx}");
    }
}
