//! The words of a decision: every sentence of the summary and every caveat, and the plain
//! number and list formats they use. What is said, and when, is decided in the parent module;
//! this module only says it.

use crate::task::results::{TestOutcome, TestReport};
use crate::verdict::Metric;

// ---------------------------------------------------------------------------------------
// Formats.
// ---------------------------------------------------------------------------------------

/// A number as people write it: integers without decimals, others with up to 4 decimals,
/// and magnitudes from 1e15 on in exponent form (`1.7e308`, not 309 digits).
pub(in crate::verdict) fn num(x: f64) -> String {
    if x.abs() >= 1e15 && x.is_finite() {
        return format!("{x:e}");
    }
    if x.fract() == 0.0 {
        return format!("{x:.0}");
    }
    let s = format!("{x:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "0" || s == "-0" {
        format!("{x:e}")
    } else {
        s.to_string()
    }
}

pub(super) fn pct(change: f64) -> String {
    format!("{:.1}%", change.abs() * 100.0)
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Drop a trailing period so quoted messages end sentences cleanly.
fn quote(s: &str) -> &str {
    s.trim().trim_end_matches('.')
}

/// At most `max` characters of `s`, with `…` when cut.
pub(in crate::verdict) fn short(s: &str, max: usize) -> String {
    let mut out: String = s.chars().take(max).collect();
    if s.chars().count() > max {
        out.push('…');
    }
    out
}

/// "a, b and c", listing at most `max` items and then "and N more".
fn list(items: &[String], max: usize) -> String {
    let shown: Vec<&str> = items.iter().take(max).map(String::as_str).collect();
    let rest = items.len().saturating_sub(max);
    match (shown.len(), rest) {
        (0, _) => String::new(),
        (1, 0) => shown[0].to_string(),
        (_, 0) => format!(
            "{} and {}",
            shown[..shown.len() - 1].join(", "),
            shown[shown.len() - 1]
        ),
        _ => format!("{} and {rest} more", shown.join(", ")),
    }
}

fn signal_name(sig: i32) -> String {
    match nix::sys::signal::Signal::try_from(sig) {
        Ok(s) => format!("signal {sig} ({})", s.as_str()),
        Err(_) => format!("signal {sig}"),
    }
}

/// `the 1.0% noise band`.
pub(super) fn noise_band(band: f64) -> String {
    format!("the {} noise band", pct(band))
}

/// `the 1.0% noise band` when every metric has that band, else `their noise bands (…)`,
/// naming the first five metrics with theirs.
fn bands_of(metrics: &[&Metric], band: f64) -> String {
    let of = |m: &&Metric| m.band.unwrap_or(band);
    match metrics.first().map(of) {
        Some(first) if metrics.iter().all(|m| of(m) == first) => noise_band(first),
        _ => {
            const SHOWN: usize = 5;
            let items: Vec<String> = metrics
                .iter()
                .take(SHOWN)
                .map(|m| format!("{} {}", m.name, pct(of(m))))
                .collect();
            let more = match metrics.len().saturating_sub(SHOWN) {
                0 => String::new(),
                rest => format!(" and {rest} more"),
            };
            format!("their noise bands ({}{more})", items.join(", "))
        }
    }
}

/// Whether a metric within its band may be called "unchanged": only when it was shown
/// equivalent (its interval inside the band, by the sequential test). Any other metric
/// within its band (one pair, or a change not tested) is only "within" it,
/// [`NOT_TESTED_FOR_EQUIVALENCE`]. The summary and the JUnit report both ask this.
pub(in crate::verdict) fn shown_unchanged(m: &Metric) -> bool {
    m.class == Some(crate::verdict::MetricVerdict::Equivalent)
}

/// What is said of a metric within its band that was not shown equivalent.
pub(in crate::verdict) const NOT_TESTED_FOR_EQUIVALENCE: &str = "not tested for equivalence";

/// Why the evidence could not decide metric `m` (judged against its band, else `band`):
/// an interval across an edge of the band, or (wholly inside or beyond it, or none) too
/// few pairs for the rank test to reach its level, or a zero baseline that gives the band
/// no scale. The summary and the JUnit report both say this.
pub(in crate::verdict) fn inconclusive_reason(m: &Metric, band: f64) -> &'static str {
    let b = m.band.unwrap_or(band);
    let across = matches!((m.ci_low, m.ci_high), (Some(lo), Some(hi))
        if (lo < -b && hi > -b) || (lo < b && hi > b));
    if m.baseline == Some(0.0) && m.ci_low.is_none() {
        "a baseline of 0 gives the band no scale: give the metric band 0 or list it as informational"
    } else if across {
        "the interval reaches across an edge of the band"
    } else {
        "too few pairs for the test to reach its level"
    }
}

/// A signed percentage: `+35.0%`, `-0.8%`.
fn signed_pct(x: f64) -> String {
    format!("{:+.1}%", x * 100.0)
}

/// The metrics the evidence could not decide (at least one), naming the first three with
/// their change and interval.
pub(super) fn inconclusive(metrics: &[&Metric], band: f64) -> String {
    let items: Vec<String> = metrics
        .iter()
        .map(|m| {
            let b = m.band.unwrap_or(band);
            let change = m.change.map(signed_pct).unwrap_or_else(|| "unknown".into());
            let interval = match (m.ci_low, m.ci_high) {
                (Some(lo), Some(hi)) => {
                    format!("interval {} to {}", signed_pct(lo), signed_pct(hi))
                }
                _ => "no bounded interval".to_string(),
            };
            let pairs = m
                .samples
                .map(|n| format!(", {}", plural(n, "pair", "pairs")))
                .unwrap_or_default();
            let why = inconclusive_reason(m, band);
            format!(
                "{} (change {change}, {interval}{pairs}, band ±{}: {why})",
                m.name,
                pct(b)
            )
        })
        .collect();
    format!(
        "The evidence was inconclusive for {}: the change is shown neither inside the band nor beyond it.",
        list(&items, 3)
    )
}

/// Informational metrics the evidence could not decide, or that regressed.
pub(super) fn informational(sentence: &str) -> String {
    format!(
        "{} (informational: the policy does not let this metric decide the verdict)",
        sentence.trim_end_matches('.')
    )
}

// ---------------------------------------------------------------------------------------
// Deterministic rejections.
// ---------------------------------------------------------------------------------------

pub(super) fn gate_rejected(gate: &str, reason: &str) -> String {
    format!("Rejected by the `{gate}` policy gate: {}.", quote(reason))
}

pub(super) fn not_applied(err: &str) -> String {
    format!("The patch did not apply: {}.", quote(err))
}

pub(super) fn could_not_run(err: &str) -> String {
    format!("The task could not run: {}.", quote(err))
}

/// The blown budget by name, quoting the usage summary when there is one.
pub(super) fn budget_exceeded(budget: crate::budget::Exceeded, usage: Option<&str>) -> String {
    let mut s = format!(
        "The {} budget (`{}`) was exceeded",
        budget.label(),
        budget.name()
    );
    match usage {
        Some(u) if !u.trim().is_empty() => {
            s.push_str(": ");
            s.push_str(quote(u));
            s.push('.');
        }
        _ => s.push('.'),
    }
    s
}

/// A problem that did not fit in the summary, as a caveat.
pub(super) fn also(sentence: &str) -> String {
    format!("Also: {sentence}")
}

pub(super) fn tests_before_stop(t: &TestReport) -> String {
    format!(
        "Test results written before the stop: {} passed, {} failed, {} skipped.",
        t.passed() + t.flaky(),
        t.failed(),
        t.skipped()
    )
}

// ---------------------------------------------------------------------------------------
// Tests.
// ---------------------------------------------------------------------------------------

pub(super) fn results_unusable(err: &str) -> String {
    format!(
        "The declared test results could not be used: {}.",
        quote(err)
    )
}

pub(super) const RESULTS_MISSING: &str =
    "The task declares a test results file but it was missing or unreadable; the \
     successor may have skipped writing it, so the test outcome is unknown.";

fn skipped_note(skipped: usize) -> String {
    if skipped > 0 {
        format!("; {skipped} skipped")
    } else {
        String::new()
    }
}

/// Names the first three failing (`Failed` or `Error`) cases of `t`.
pub(super) fn tests_failed(
    t: &TestReport,
    failed: usize,
    executed: usize,
    skipped: usize,
) -> String {
    let names: Vec<String> = t
        .cases
        .iter()
        .filter(|c| matches!(c.outcome, TestOutcome::Failed | TestOutcome::Error))
        .map(|c| c.name.clone())
        .collect();
    format!(
        "Test suite failed ({failed} of {executed} failed: {}{}).",
        list(&names, 3),
        skipped_note(skipped)
    )
}

pub(super) fn no_tests_ran(t: &TestReport) -> String {
    if t.cases.is_empty() {
        "No tests ran: the test report contains no test cases.".into()
    } else {
        format!("No tests ran: all {} skipped.", t.cases.len())
    }
}

pub(super) fn tests_passed(passed: usize, executed: usize, skipped: usize) -> String {
    format!(
        "Test suite passed ({passed}/{executed}{}).",
        skipped_note(skipped)
    )
}

/// Names the first five flaky cases of `t`, with their messages.
pub(super) fn flaky(t: &TestReport, flaky: usize) -> String {
    let items: Vec<String> = t
        .with_outcome(TestOutcome::Flaky)
        .map(|c| match &c.message {
            Some(m) => format!("{} ({})", c.name, short(m, 160)),
            None => c.name.clone(),
        })
        .collect();
    format!(
        "{} passed only after retrying: {}.",
        plural(flaky, "flaky test", "flaky tests"),
        list(&items, 5)
    )
}

/// Names the first five skipped cases of `t`.
pub(super) fn skipped(t: &TestReport, skipped: usize) -> String {
    let names: Vec<String> = t
        .with_outcome(TestOutcome::Skipped)
        .map(|c| c.name.clone())
        .collect();
    format!(
        "{} skipped: {}.",
        plural(skipped, "test", "tests"),
        list(&names, 5)
    )
}

// ---------------------------------------------------------------------------------------
// The task's end.
// ---------------------------------------------------------------------------------------

pub(super) fn killed_by(sig: i32) -> String {
    format!("The task was killed by {}.", signal_name(sig))
}

pub(super) fn exited(code: i32, although_tests_passed: bool) -> String {
    if although_tests_passed {
        format!("The task exited with status {code} although every test that ran passed.")
    } else {
        format!("The task exited with status {code}.")
    }
}

/// What exit statuses 126 and 127 usually mean.
pub(super) fn exit_status_hint(code: i32) -> Option<String> {
    let meaning = match code {
        127 => "was not found",
        126 => "was not executable",
        _ => return None,
    };
    Some(format!(
        "Exit status {code} usually means a command {meaning} inside the successor."
    ))
}

pub(super) const EXIT_NOT_RECORDED: &str = "The task's exit status was not recorded.";

pub(super) const EXITED_ZERO: &str = "The task exited with status 0.";

pub(super) const SELF_REPORTED: &str = "The evidence is self-reported: the task has no judge, so its results were produced in the same process as the code under test, which could have forged them.";

pub(super) const SELF_REPORTED_REFUSED: &str = "The evidence is self-reported (the task has no judge) and the policy does not approve on it ([decision] self_reported = \"needs_revision\"): give the task a judge, or accept self-reported evidence for patches written by people.";

pub(super) const EXIT_STATUS_ONLY: &str =
    "Only the exit status was checked: the task declares no test results or metrics.";

// ---------------------------------------------------------------------------------------
// Metrics.
// ---------------------------------------------------------------------------------------

pub(super) fn baseline_failed(why: &str) -> String {
    format!(
        "The baseline (unpatched) run is no evidence, so the metrics could not be compared with it: {}.",
        quote(why)
    )
}

pub(super) fn metrics_unusable(err: &str) -> String {
    format!("The declared metrics could not be used: {}.", quote(err))
}

pub(super) const METRICS_MISSING: &str =
    "The task declares a metrics file but it was missing or unreadable; the successor \
     may have skipped writing it, so metric changes are unknown.";

/// `p99_ms regressed 12.0% (41 → 45.92)`, or `from 0 to 3` without a relative change.
fn regressed(m: &Metric) -> String {
    let base = m.baseline.unwrap_or(0.0);
    match m.change {
        Some(c) => format!(
            "{} regressed {} ({} → {})",
            m.name,
            pct(c),
            num(base),
            num(m.patched)
        ),
        None => format!(
            "{} regressed from {} to {}",
            m.name,
            num(base),
            num(m.patched)
        ),
    }
}

/// `compressed_bytes improved 41.2%`, or `from 0 to 5` without a relative change.
fn improved(m: &Metric) -> String {
    match m.change {
        Some(c) => format!("{} improved {}", m.name, pct(c)),
        None => format!(
            "{} improved from {} to {}",
            m.name,
            num(m.baseline.unwrap_or(0.0)),
            num(m.patched)
        ),
    }
}

/// The regressions (at least one), naming the first three.
pub(super) fn regressions(regressed_metrics: &[&Metric], band: f64) -> String {
    let items: Vec<String> = regressed_metrics.iter().map(|m| regressed(m)).collect();
    format!(
        "{}, beyond {}.",
        list(&items, 3),
        bands_of(regressed_metrics, band)
    )
}

/// A regression sentence as a caveat, when the rules approve regressions.
pub(super) fn accepted_regressions(sentence: &str) -> String {
    format!(
        "{} (accepted: the decision rules approve regressions)",
        sentence.trim_end_matches('.')
    )
}

/// The improvements (at least one), naming the first three, and how many others stayed
/// within the band.
pub(super) fn improvements(improved_metrics: &[&Metric], noise: &[&Metric], band: f64) -> String {
    let items: Vec<String> = improved_metrics.iter().map(|m| improved(m)).collect();
    let mut s = list(&items, 3);
    if !noise.is_empty() {
        s.push_str(&format!(
            "; {} within {}",
            plural(noise.len(), "other metric", "other metrics"),
            bands_of(noise, band)
        ));
    }
    s.push('.');
    s
}

/// Every compared metric stayed within the band (at least one did). "Unchanged" only when
/// every one of them was shown equivalent; a change measured without a test (one pair) is
/// only "within" the band.
pub(super) fn unchanged(noise: &[&Metric], band: f64) -> String {
    let tested = noise.iter().all(|m| shown_unchanged(m));
    match (noise, tested) {
        ([m], true) => format!("{} unchanged within {}.", m.name, bands_of(noise, band)),
        ([m], false) => format!(
            "{} within {} ({NOT_TESTED_FOR_EQUIVALENCE}).",
            m.name,
            bands_of(noise, band)
        ),
        (_, true) => format!(
            "All {} metrics unchanged within {}.",
            noise.len(),
            bands_of(noise, band)
        ),
        (_, false) => format!(
            "All {} metrics within {} ({NOT_TESTED_FOR_EQUIVALENCE}).",
            noise.len(),
            bands_of(noise, band)
        ),
    }
}

/// A declared metrics file in which the patched side reported no metric, naming what the
/// baseline reported (the first five).
pub(super) fn no_metric_reported(baseline: &[String]) -> String {
    const NONE: &str = "The patched run reported no metrics, although the task declares them";
    if baseline.is_empty() {
        format!("{NONE}.")
    } else {
        format!(
            "{NONE} and the baseline reported {}: {}.",
            baseline.len(),
            list(baseline, 5)
        )
    }
}

pub(super) fn missing_from_patched(missing: &[String]) -> String {
    format!(
        "The patched run did not report {} that the baseline reported: {}.",
        if missing.len() == 1 {
            "a metric"
        } else {
            "metrics"
        },
        list(missing, 5)
    )
}

/// Why compared metric changes (`untested`, at least one) were judged against their bands
/// alone: each metric's own band (its kind's), as it was judged, else `band`.
pub(super) fn significance_untested(untested: &[&Metric], repeated: bool, band: f64) -> String {
    if repeated {
        format!(
            "{} metric change(s) could not be tested for significance (too few samples); \
             they are judged against {} alone.",
            untested.len(),
            bands_of(untested, band)
        )
    } else {
        format!(
            "Metric changes come from a single run of the patched and the baseline task \
             (repeat = 1); they were not tested for significance, so changes within run-to-run \
             noise larger than {} cannot be told apart.",
            bands_of(untested, band)
        )
    }
}

/// The metrics measured without a baseline value, naming the first five.
pub(super) fn without_baseline(metrics: &[&Metric], baseline_ran: bool) -> String {
    let items: Vec<String> = metrics
        .iter()
        .map(|m| format!("{} = {}", m.name, num(m.patched)))
        .collect();
    if baseline_ran {
        format!(
            "The baseline did not report {}; no change computed.",
            list(&items, 5)
        )
    } else {
        format!(
            "No baseline was run, so metric changes are unknown; measured: {}.",
            list(&items, 5)
        )
    }
}

pub(super) fn reported_without_baseline(n: usize) -> String {
    format!(
        "{} reported without a baseline.",
        plural(n, "metric", "metrics")
    )
}

/// The protected tree changed during a run: every path (up to a few) and how.
pub(super) fn protected_changed(changes: &[super::ProtectedChange]) -> String {
    const SHOWN: usize = 5;
    let mut sorted = changes.to_vec();
    sorted.sort();
    sorted.dedup();
    let mut parts: Vec<String> = sorted
        .iter()
        .take(SHOWN)
        .map(|c| {
            let path = match c.path.as_str() {
                "." => "the source tree itself".to_string(),
                p => short(&p.escape_debug().to_string(), 120),
            };
            format!("{path} {}", c.change.as_str())
        })
        .collect();
    if sorted.len() > SHOWN {
        parts.push(format!("and {} more", sorted.len() - SHOWN));
    }
    format!(
        "The protected tree differs from the parent's after the run: {}. The code under test may not change its own tests, benchmarks, judge or manifest.",
        parts.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_plainly() {
        assert_eq!(num(41.0), "41");
        assert_eq!(num(45.92), "45.92");
        assert_eq!(num(0.1 + 0.2), "0.3");
        assert_eq!(num(1.5e-7), "1.5e-7");
        assert_eq!(pct(-0.412), "41.2%");
    }
}
