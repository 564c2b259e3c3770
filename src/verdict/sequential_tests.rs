//! The sequential design's unit tests: the looks, the spending, the exact and tested
//! outcomes, and simulations of whole evaluations (identical patches keep the error rate,
//! clear-cut changes stop early).

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
    assert_eq!(looks(3, 20), vec![3, 6, 10, 14, 20]);
    assert_eq!(looks(3, 40), vec![3, 6, 12, 20, 28, 40]);
    assert_eq!(looks(2, 4), vec![2, 3, 4]);
    assert_eq!(looks(3, 1000).len(), 11);
    assert_eq!(looks(3, 5), vec![3, 4, 5]);
    assert_eq!(looks(5, 5), vec![5]);
    assert_eq!(looks(8, 3), vec![3]);
    assert_eq!(looks(1, 3), vec![1, 2, 3]);
    // Pocock-type spending over 3, 6, 10, 14, 20 pairs: alpha · ln(1 + (e − 1)·t) by then.
    let s = looks(3, 20);
    let spent = |n: f64| 0.05 * (1.0 + (std::f64::consts::E - 1.0) * n / 20.0).ln();
    let mut one = Spending::new(0.05, &s);
    let levels: Vec<f64> = (0..5).map(|j| one.level(j, 1)).collect();
    // 3 pairs: no rank test can reach 0.0115 / 2 (its floor is 1/20), so nothing is
    // spent and the share passes on to 6 pairs.
    let want = [
        spent(3.0),
        spent(6.0),
        spent(10.0) - spent(6.0),
        spent(14.0) - spent(10.0),
        0.05 - spent(14.0),
    ];
    for (got, want) in levels.iter().zip(want) {
        assert!((got - want).abs() < 1e-12, "{levels:?}");
    }
    assert!((levels[1] - 0.020786).abs() < 1e-6, "{levels:?}");
    assert!((one.spent() - 0.05).abs() < 1e-12);
    // Two metrics share each look's part.
    let mut two = Spending::new(0.05, &s);
    let levels: Vec<f64> = (0..5).map(|j| two.level(j, 2)).collect();
    assert!((levels[1] - spent(6.0) / 2.0).abs() < 1e-12, "{levels:?}");
    assert!((two.spent() - 0.05).abs() < 1e-12);
    // A look with nothing to test spends nothing either.
    let mut none = Spending::new(0.05, &s);
    none.level(0, 0);
    none.level(1, 0);
    assert_eq!(none.spent(), 0.0);
    assert!((none.level(2, 1) - spent(10.0)).abs() < 1e-12);
    // One look: all of alpha, split over the metrics.
    assert_eq!(Spending::new(0.05, &[5]).level(0, 1), 0.05);
    assert_eq!(Spending::new(0.05, &[20]).level(0, 2), 0.025);
    assert_eq!(Spending::new(0.05, &[]).level(0, 0), 0.05);
    assert_eq!(spent_by(0.0), 0.0);
    assert!((spent_by(1.0) - 1.0).abs() < 1e-12);
    assert!(spent_by(0.3) > 0.3 && spent_by(0.6) > 0.6);
}

#[test]
fn the_fewest_pairs_that_can_decide() {
    // 1/20 at 3 pairs, 1/70 at 4, 1/252 at 5, 1/924 at 6.
    assert_eq!(fewest_pairs(0.05), Some(4));
    assert_eq!(fewest_pairs(0.029), Some(4));
    assert_eq!(fewest_pairs(0.028), Some(5));
    assert_eq!(fewest_pairs(0.01), Some(5));
    assert_eq!(fewest_pairs(0.005), Some(6));
    assert_eq!(fewest_pairs(0.0), None);
    // Never below the samples `assess` needs, whatever alpha: 1/6 at 2 pairs is below
    // 0.45 / 2, but 2 samples per side are never tested.
    assert_eq!(fewest_pairs(0.45), Some(MIN_SAMPLES));
    assert_eq!(
        assess(&[1.0, 1.1], &[2.0, 2.1], 0.05, 0.45, false).outcome,
        Outcome::Inconclusive
    );
    // ... so a look at 2 pairs spends nothing: its share passes on.
    let mut s = Spending::new(0.45, &looks(2, 3));
    s.level(0, 1);
    assert_eq!(s.spent(), 0.0);
    // What it promises: at that many pairs a fully separated change is decided, at one
    // fewer it cannot be.
    for a in [0.05, 0.01, 0.001] {
        let n = fewest_pairs(a).unwrap();
        let at = |n: usize| assess(&vec![100.0; n], &vec![150.0; n], 0.05, a, false).outcome;
        assert_eq!(at(n), Outcome::Higher, "{a} at {n}");
        assert_eq!(at(n - 1), Outcome::Inconclusive, "{a} at {}", n - 1);
    }
}

#[test]
fn zero_variance_is_decided_exactly() {
    let a = 0.001;
    // A deterministic metric (band 0, or the policy's `constant_changes = "exact"`):
    // constant sides are exact, equal or not.
    let same = assess(&[500.0; 3], &[500.0; 3], 0.0, a, true);
    assert_eq!(
        (same.outcome, same.ci, same.exact),
        (Outcome::Equivalent, Some((0.0, 0.0)), true)
    );
    let down = assess(&[500.0; 2], &[300.0; 2], 0.0, a, true);
    assert_eq!(
        (down.outcome, down.ci),
        (Outcome::Lower, Some((-0.4, -0.4)))
    );
    let up = assess(&[500.0; 3], &[505.0; 3], 0.0, a, true);
    assert_eq!(up.outcome, Outcome::Higher);
    let small = assess(&[500.0; 3], &[504.0; 3], 0.01, a, true);
    assert_eq!((small.outcome, small.exact), (Outcome::Equivalent, true));
    // From zero: a change without a relative size.
    let from0 = assess(&[0.0; 3], &[2.0; 3], 0.01, a, true);
    assert_eq!((from0.outcome, from0.ci), (Outcome::Higher, None));
    // Two sides constant at 0: equivalent exactly when declared deterministic; else a
    // relative band has no scale there, and no test can show them equivalent (a
    // counter firing in one run of five reads 0 on all six runs of 3 pairs a quarter
    // of the time).
    let zeros = assess(&[0.0; 3], &[0.0; 3], 0.01, a, true);
    assert_eq!((zeros.outcome, zeros.exact), (Outcome::Equivalent, true));
    let zeros = assess(&[0.0; 10], &[0.0; 10], 0.01, 0.05, false);
    assert_eq!(
        (zeros.outcome, zeros.ci, zeros.exact),
        (Outcome::Inconclusive, None, false)
    );
    assert_eq!(exact_outcome(&[0.0; 3], &[0.0; 3], 0.01, false), None);
    // One sample per side is no evidence of zero variance.
    let one = assess(&[500.0], &[500.0], 0.01, a, true);
    assert_eq!(one.outcome, Outcome::Inconclusive);
}

/// A noisy metric constant on both sides by chance (whole milliseconds, 3 or 4) is no
/// proof of a change: tested, it stays inconclusive until the rank test can price the
/// separation (1/20 at 3 pairs, 1/924 at 6), and is then decided at the look's level.
#[test]
fn constant_sides_of_a_noisy_metric_are_tested_not_taken_as_exact() {
    let a = 0.0104;
    for (b, p, at6) in [(3.0, 4.0, Outcome::Higher), (4.0, 3.0, Outcome::Lower)] {
        let three = assess(&[b; 3], &[p; 3], 0.05, a, false);
        assert_eq!((three.outcome, three.exact), (Outcome::Inconclusive, false));
        let six = assess(&[b; 6], &[p; 6], 0.05, a, false);
        assert_eq!((six.outcome, six.exact), (at6, false), "{b} -> {p}");
        // Below 1/924 / 2 per side, not even 6 pairs decide.
        let strict = assess(&[b; 6], &[p; 6], 0.05, 0.002, false);
        assert_eq!(strict.outcome, Outcome::Inconclusive);
    }
    assert_eq!(
        exact_outcome(&[3.0; 3], &[4.0; 3], 0.05, false),
        None,
        "tested"
    );
    assert_eq!(
        exact_outcome(&[3.0; 3], &[4.0; 3], 0.05, true),
        Some(Outcome::Higher)
    );
    assert_eq!(exact_outcome(&[3.0, 3.0, 4.0], &[3.0; 3], 0.05, true), None);
}

/// Equal constant sides of a noisy metric prove no equivalence either: a timing of 3-4
/// whole ms against a patch's 4-5 ms reads 4 on all six runs of 3 pairs in 1 of 64
/// evaluations. Tested (against the baseline shifted by the band), they are equivalent
/// only once the rank test can price that chance, as a change is.
#[test]
fn equal_constant_sides_of_a_noisy_metric_are_tested_too() {
    let a = 0.0104;
    assert_eq!(exact_outcome(&[4.0; 3], &[4.0; 3], 0.05, false), None);
    assert_eq!(
        exact_outcome(&[4.0; 3], &[4.0; 3], 0.05, true),
        Some(Outcome::Equivalent)
    );
    let three = assess(&[4.0; 3], &[4.0; 3], 0.05, a, false);
    assert_eq!((three.outcome, three.exact), (Outcome::Inconclusive, false));
    let six = assess(&[4.0; 6], &[4.0; 6], 0.05, a, false);
    assert_eq!(
        (six.outcome, six.ci, six.exact),
        (Outcome::Equivalent, Some((0.0, 0.0)), false)
    );
    let strict = assess(&[4.0; 6], &[4.0; 6], 0.05, 0.002, false);
    assert_eq!(strict.outcome, Outcome::Inconclusive);
    // The chance that makes the tie: a 29% slower patch whose runs happen to agree
    // (all six read 4 in about 1 in 64) is never equivalent at 3 pairs.
    let mut tied = 0;
    for seed in 0..6400u64 {
        let mut rng = SplitMix64(seed);
        let mut draw = |lo: f64| lo + (rng.next_u64() >> 63) as f64;
        let b: Vec<f64> = (0..3).map(|_| draw(3.0)).collect();
        let p: Vec<f64> = (0..3).map(|_| draw(4.0)).collect();
        if b.iter().chain(&p).all(|x| *x == 4.0) {
            tied += 1;
        }
        assert_eq!(exact_outcome(&b, &p, 0.05, false), None, "{b:?} {p:?}");
        assert_ne!(assess(&b, &p, 0.05, a, false).outcome, Outcome::Equivalent);
    }
    assert!((50..=160).contains(&tied), "{tied} ties in 6400");
}

/// A zero baseline median: a change beyond 0 is shown by the rank test in the metric's
/// own units (no relative interval); noise around 0 is never equivalent.
#[test]
fn a_zero_baseline_is_decided_by_a_change_beyond_zero() {
    let a = 0.0104;
    let up = assess(&[0.0; 6], &[2.0, 3.0, 2.0, 4.0, 2.0, 3.0], 0.01, a, false);
    assert_eq!(
        (up.outcome, up.ci, up.exact),
        (Outcome::Higher, None, false)
    );
    let noise = assess(&[0.0, 1.0, 0.0, 0.0, 0.0, 0.0], &[0.0; 6], 0.01, a, false);
    assert_eq!(noise.outcome, Outcome::Inconclusive);
}

#[test]
fn not_significant_is_not_unchanged() {
    // The busy wait: p99 up by about a third, with an interval that reaches
    // from about 0 to +100%: neither a regression proven beyond 10% nor equivalence.
    let b = [1.40, 1.81, 1.44, 1.40, 1.38];
    let p = [1.90, 2.50, 1.45, 1.43, 2.28];
    let r = assess(&b, &p, 0.10, 0.005, false);
    assert_eq!(r.outcome, Outcome::Inconclusive, "{r:?}");
    let (lo, hi) = r.ci.unwrap();
    assert!(lo < 0.10 && hi > 0.10, "{r:?}");
    // Tight, equal samples inside a 5% band are equivalent once the rank tests can
    // reach the level, and not before.
    let b = [100.0, 100.4, 99.7, 100.2, 99.9, 100.1, 99.8, 100.3];
    let p = [100.1, 99.8, 100.2, 99.9, 100.3, 100.0, 99.6, 100.2];
    assert_eq!(
        assess(&b, &p, 0.05, 0.005, false).outcome,
        Outcome::Equivalent
    );
    assert_eq!(
        assess(&b[..3], &p[..3], 0.05, 0.005, false).outcome,
        Outcome::Inconclusive
    );
    // A clear 40% drop: lower.
    let p2: Vec<f64> = b.iter().map(|x| x * 0.6).collect();
    let r = assess(&b, &p2, 0.05, 0.005, false);
    assert_eq!(r.outcome, Outcome::Lower, "{r:?}");
    // A gain of uncertain size (the interval reaches back inside the band, though not
    // past 0) is inconclusive, like a regression of uncertain size: more pairs decide.
    let b = [1.0, 1.3, 0.9, 1.6, 1.1, 2.4, 1.2, 1.0];
    let p = [0.5, 0.55, 0.4, 0.9, 0.45, 0.6, 0.42, 0.48];
    let r = assess(&b, &p, 0.50, 0.005, false);
    let (_, hi) = r.ci.unwrap();
    assert!(hi < 0.0 && hi > -0.50, "{r:?}");
    assert_eq!(r.outcome, Outcome::Inconclusive, "{r:?}");
    // A regression of uncertain size alike (here about +60%, the interval from inside
    // the band to far beyond it).
    let q = [1.5, 2.4, 1.3, 2.9, 1.8, 1.4, 2.0, 1.6];
    let worse = assess(&b, &q, 0.50, 0.005, false);
    let (lo, hi) = worse.ci.unwrap();
    assert!(lo < 0.50 && hi > 0.50, "{worse:?}");
    assert_eq!(worse.outcome, Outcome::Inconclusive, "{worse:?}");
    // Every patched run beyond +50% of every baseline run: higher, although one baseline
    // run (2.4) is twice the others (the rank interval is not dragged by it).
    let up = assess(&p, &b, 0.50, 0.005, false);
    assert_eq!(up.outcome, Outcome::Higher, "{up:?}");
}

/// Run the sequential design on one synthetic metric pair generator: returns the
/// outcomes per metric and the pairs used.
fn run_design(
    rng: &mut SplitMix64,
    metrics: &[(f64, f64, bool, f64)], // (sd, true change, outliers, band)
    alpha: f64,
    cap: usize,
) -> (Vec<Outcome>, usize) {
    let schedule = looks(3, cap);
    let mut spending = Spending::new(alpha, &schedule);
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
        let a = spending.level(j, metrics.len());
        for (i, m) in metrics.iter().enumerate() {
            if out[i] != Outcome::Inconclusive {
                continue; // a decided metric keeps its decision
            }
            out[i] = assess(&b[i], &p[i], m.3, a, m.3 == 0.0).outcome;
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
    for _ in 0..trials {
        let (out, n) = run_design(
            &mut rng,
            &[(0.03, 0.0, false, 0.05), (0.30, 0.0, true, 0.10)],
            0.05,
            20,
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
    for _ in 0..trials {
        let (out, _) = run_design(&mut rng, &[(0.05, 0.075, false, 0.05)], 0.05, 20);
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
    for _ in 0..20 {
        let (out, n) = run_design(&mut rng, &[(0.03, -0.4, false, 0.05)], 0.05, 20);
        assert_eq!(out, vec![Outcome::Lower]);
        assert!(n <= 6, "{n} pairs");
    }
    // A deterministic metric is decided at the first look.
    let r = assess(&[296_095.0; 3], &[169_394.0; 3], 0.0, 0.01, true);
    assert_eq!((r.outcome, r.exact), (Outcome::Lower, true));
}

/// One metric of a simulated run: its centre, its own noise (log scale), whether the
/// run's shared slowdown moves it (timings do, memory does not), its rounding quantum
/// (0: none) and its band.
struct SimMetric {
    centre: f64,
    sd: f64,
    shared: bool,
    quantum: f64,
    band: f64,
}

/// The compress demo's metrics: `p99_ms` (rounded to 4 decimals, so it ties),
/// `peak_memory_kb` (whole 4 KiB pages), `compressed_bytes` (deterministic), and a
/// noisier median timing like the judged bench's `p50_ms`.
fn demo_metrics() -> Vec<SimMetric> {
    vec![
        SimMetric {
            centre: 0.58,
            sd: 0.01,
            shared: true,
            quantum: 1e-4,
            band: 0.10,
        },
        SimMetric {
            centre: 16_100.0,
            sd: 0.004,
            shared: false,
            quantum: 4.0,
            band: 0.05,
        },
        SimMetric {
            centre: 296_095.0,
            sd: 0.0,
            shared: false,
            quantum: 0.0,
            band: 0.0,
        },
        SimMetric {
            centre: 12.0,
            sd: 0.03,
            shared: true,
            quantum: 0.01,
            band: 0.05,
        },
    ]
}

/// How the machine disturbs a run: the step of the load's drift across pairs (log
/// scale), and a burst slowing one run in `every` by up to `burst`.
#[derive(Clone, Copy)]
struct Machine {
    drift: f64,
    every: usize,
    burst: f64,
}

/// A shared machine under bursty load (harsher than the demo's measurements).
const BUSY: Machine = Machine {
    drift: 0.05,
    every: 8,
    burst: 0.4,
};
/// As the compress demo's `p99_ms` (each session's best of 5 tries) measured it on a
/// quiet machine: about 1% spread, and of 80 runs 2 more than 5% slower, 1 more than 10%
/// (+22%).
const QUIET: Machine = Machine {
    drift: 0.003,
    every: 20,
    burst: 0.25,
};

/// One run's metrics with run-level noise: a slowdown shared by the run's timings (the
/// machine's drifting `load` and its bursts), times each metric's own noise, with the
/// patch's `change` on the patched side (only for the metrics listed in `changed`).
fn sim_run(
    rng: &mut SplitMix64,
    ms: &[SimMetric],
    (load, machine): (f64, Machine),
    change: f64,
    changed: &[usize],
) -> Vec<f64> {
    let burst = if rng.below(machine.every) == 0 {
        1.0 + machine.burst * (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    } else {
        1.0
    };
    let run = load * burst * (machine.drift / 5.0 * normal(rng)).exp();
    ms.iter()
        .enumerate()
        .map(|(i, m)| {
            let c = if changed.contains(&i) {
                1.0 + change
            } else {
                1.0
            };
            let mut x = m.centre * c * (m.sd * normal(rng)).exp();
            if m.shared {
                x *= run;
            }
            if m.quantum > 0.0 {
                x = (x / m.quantum).round() * m.quantum;
            }
            x
        })
        .collect()
}

/// The sequential design on whole simulated runs (pairs in a random side order under a
/// drifting load), as `task_run` runs it: the outcomes per metric and the pairs used.
fn run_pairs(
    rng: &mut SplitMix64,
    machine: Machine,
    ms: &[SimMetric],
    change: f64,
    changed: &[usize],
    alpha: f64,
    seed: u64,
) -> (Vec<Outcome>, usize) {
    let schedule = looks(3, 20);
    let mut spending = Spending::new(alpha, &schedule);
    let (mut b, mut p) = (vec![Vec::new(); ms.len()], vec![Vec::new(); ms.len()]);
    let mut out = vec![Outcome::Inconclusive; ms.len()];
    let mut exact = vec![false; ms.len()];
    let mut load = 1.0f64;
    for (j, &n) in schedule.iter().enumerate() {
        while b[0].len() < n {
            load = (load.ln() * 0.8 + machine.drift * normal(rng)).exp();
            let first = sim_run(rng, ms, (load, machine), 0.0, &[]);
            let second = sim_run(rng, ms, (load, machine), change, changed);
            let (base, pat) = if baseline_first(seed, b[0].len()) {
                (first, second)
            } else {
                // The patched side ran first: the same draws, the other labels.
                let pat = first
                    .iter()
                    .enumerate()
                    .map(|(i, x)| {
                        if changed.contains(&i) {
                            x * (1.0 + change)
                        } else {
                            *x
                        }
                    })
                    .collect::<Vec<_>>();
                let base = second
                    .iter()
                    .enumerate()
                    .map(|(i, x)| {
                        if changed.contains(&i) {
                            x / (1.0 + change)
                        } else {
                            *x
                        }
                    })
                    .collect::<Vec<_>>();
                (base, pat)
            };
            for i in 0..ms.len() {
                b[i].push(base[i]);
                p[i].push(pat[i]);
            }
        }
        // As `look_at` does: a band of 0 declares a metric deterministic.
        let tested = (0..ms.len())
            .filter(|&i| exact_outcome(&b[i], &p[i], ms[i].band, ms[i].band == 0.0).is_none())
            .count();
        let a = spending.level(j, tested);
        // A tested decision stands; an exact one is looked at again.
        for (i, m) in ms.iter().enumerate() {
            if out[i] == Outcome::Inconclusive || exact[i] {
                let r = assess(&b[i], &p[i], m.band, a, m.band == 0.0);
                (out[i], exact[i]) = (r.outcome, r.exact);
            }
        }
        if out.iter().all(|o| *o != Outcome::Inconclusive) {
            return (out, n);
        }
    }
    (out, 20)
}

#[test]
fn identical_patches_under_run_level_noise_keep_the_error_rate() {
    // Identical patches, the demo's four metrics, run-level noise (a drifting load and
    // bursts shared by a run's timings, rounding that ties): a gain or a regression
    // reported for any metric, at any look, is a false decision. At alpha 0.05 and at a
    // loose 0.30 (where the rank tests' tails are reached often), the rate stays under
    // alpha.
    let ms = demo_metrics();
    for (alpha, trials, seed) in [(0.05, 200u64, 14), (0.30, 200, 15)] {
        let mut rng = SplitMix64(seed);
        let mut false_decisions = 0;
        for t in 0..trials {
            let (out, _) = run_pairs(&mut rng, BUSY, &ms, 0.0, &[], alpha, t);
            if out
                .iter()
                .any(|o| matches!(o, Outcome::Higher | Outcome::Lower))
            {
                false_decisions += 1;
            }
        }
        let rate = false_decisions as f64 / trials as f64;
        assert!(
            rate <= alpha,
            "alpha {alpha}: false decisions in {rate} of verdicts"
        );
    }
    // The compress demo's three metrics measured as on a quiet machine: the no-op is
    // settled (every metric equivalent) by 6 pairs mostly (a run 10% or more off, one in
    // about 30, in the first 12 runs waits for 10 pairs), by 10 nearly always.
    let mut rng = SplitMix64(16);
    let trials = 100;
    let (mut by6, mut by10) = (0, 0);
    for t in 0..trials {
        let (out, n) = run_pairs(&mut rng, QUIET, &ms[..3], 0.0, &[], 0.05, t);
        let wrong = |o: &Outcome| matches!(o, Outcome::Higher | Outcome::Lower);
        assert!(!out.iter().any(wrong), "{out:?}");
        if out.iter().all(|o| *o == Outcome::Equivalent) {
            by6 += u64::from(n <= 6);
            by10 += u64::from(n <= 10);
        }
    }
    assert!(by6 * 10 >= trials * 6, "{by6}/{trials} settled by 6 pairs");
    assert!(
        by10 * 10 >= trials * 9,
        "{by10}/{trials} settled by 10 pairs"
    );
}

#[test]
fn the_demos_clear_cut_gain_is_decided_at_6_pairs() {
    // swap-compressor on the compress demo: p99_ms down 78% (tied by rounding), memory
    // unchanged, the bytes deterministic. Every metric decided at the second
    // look, in every trial: the tied rank test is exact, and the Pocock-type spending
    // gives the second look 0.021 of alpha (the linear function's 0.0075 with the
    // normal approximation under ties waited for 12 pairs).
    let ms = &demo_metrics()[..3];
    let mut rng = SplitMix64(78);
    for t in 0..40 {
        let (out, n) = run_pairs(&mut rng, QUIET, ms, -0.78, &[0], 0.05, t);
        assert_eq!(out[0], Outcome::Lower, "{out:?}");
        assert_eq!(out[1], Outcome::Equivalent, "{out:?}");
        assert_eq!(n, 6, "{out:?}");
    }
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
