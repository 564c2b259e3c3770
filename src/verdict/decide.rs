//! Deciding the verdict from the evidence of one evaluation (DESIGN.md lifecycle step 5).
//!
//! Pure functions, no I/O: the supervisor gathers an [`Evidence`] (gates, patch application,
//! the run's end, parsed results and metrics) and [`decide`] turns it into a [`Decision`]:
//! the verdict, a confidence, a one- or two-sentence summary in the seed's style
//! ("Test suite passed (312/312). compressed_bytes improved 41.2%."), caveats, and the
//! metric comparisons.
//!
//! # Rules, in order
//! 1. **REJECT** (deterministic) when a policy gate stopped the patch, the patch did not
//!    apply, the task could not run, or a budget was exceeded. The summary names the first of
//!    these (a budget by name, quoting the usage summary); any others become caveats.
//! 2. Otherwise every *problem* found is listed:
//!    * the declared results file is missing or unparsable (never an approval: the successor
//!      may simply have skipped writing it), or the declared metrics file is;
//!    * failing tests (`Failed` or `Error` cases), or a report in which no test ran;
//!    * a death by signal, or a non-zero exit status that no failing test explains, or an
//!      exit status that was not recorded;
//!    * a metric that regressed beyond the noise band, or one the baseline reported and the
//!      patched run did not. These take the verdict [`DecisionRules::regression_is`]
//!      (NEEDS_REVISION by default; APPROVE there turns them into caveats).
//!
//!    The verdict is the most severe problem's (REJECT > NEEDS_REVISION); with no problem it
//!    is **APPROVE**, which therefore means: exit status 0, every executed test passed (flaky
//!    passes count, as caveats), and no metric regressed.
//!
//! A metric's `change` is relative, `(patched - baseline) / |baseline|` (negative means it went
//! down), `None` without a baseline or when the baseline is 0 and the patched value is not. It
//! regressed when it moved in the bad direction by more than `noise_band` (strictly); the bad
//! direction is up for names matching [`DecisionRules::lower_is_better`], down otherwise.
//! With single samples (the task's `repeat = 1`) `significant` is `None` and a caveat says the
//! changes were not tested for significance.
//!
//! # Confidence
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
//!   a metric missing from the patched run: `0.4`;
//! * a regression by `x` noise bands beyond the band, `x = (|change| − band) / band`:
//!   `0.3 + 0.5 · x / (x + 1)` (just beyond the band → 0.3, far beyond → 0.8; the same 0.8
//!   when the change is unbounded or the band is 0), combined over metrics like the others.
//!
//! Penalties (multiplied, both kinds of verdict; the ones marked *approve* only there):
//! * `0.95` per flaky test (at most 20 counted): flaky tests weaken any test-based conclusion;
//! * *approve*: `1 − 0.25 · skipped / total` for skipped tests;
//! * *approve*: `0.9` when metrics were reported but no baseline was run;
//! * *approve*: `0.95` when metric changes come from single samples (significance unknown);
//! * *approve*: `0.9` when a regression was accepted because `regression_is = APPROVE`.
//!
//! So: more passing tests raise an approval's confidence, more flaky or skipped tests lower it,
//! and more failing tests raise a NEEDS_REVISION's confidence. The seed's example (312 passed,
//! one flaky) comes out at 0.946.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

use crate::task::results::{TestOutcome, TestReport};
use crate::verdict::kind::VerdictKind;

/// Everything the supervisor learned about one evaluation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evidence {
    /// `(gate, reason)` if a policy gate stopped the patch.
    pub gate: Option<(String, String)>,
    /// The patch did not apply (names the file and hunk).
    pub apply_error: Option<String>,
    /// The task could not run at all (sandbox setup failed, command not found: exit 127/126).
    pub run_error: Option<String>,
    /// The budget that was blown: `"wall" | "cpu" | "memory" | "pids" | "disk" | "api_cost"`.
    pub budget_exceeded: Option<String>,
    /// The task's exit status, if it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed the task, if one did.
    pub signal: Option<i32>,
    /// Parsed test results, if the task declares them.
    pub tests: Option<TestReport>,
    /// The declared results file was missing or unparsable.
    pub results_error: Option<String>,
    /// Metrics of the patched run.
    pub metrics: Option<BTreeMap<String, f64>>,
    /// Metrics of the baseline (unpatched) run, when the task asks for one.
    pub baseline_metrics: Option<BTreeMap<String, f64>>,
    /// The declared metrics file was missing or unparsable.
    pub metrics_error: Option<String>,
    /// Usage to quote when a budget blew, e.g. `"wall 2.0 s of 2 s"`.
    pub usage_summary: Option<String>,
    /// Per-metric statistics over repeated runs (baseline vs patched samples), when the
    /// task ran more than once per side. With them, a change counts only when significant.
    pub metric_stats: BTreeMap<String, crate::verdict::stats::Comparison>,
}

/// One metric, as reported in the verdict's `metrics` array (the verdict's own type).
pub use crate::verdict::Metric as MetricChange;

/// The outcome of [`decide`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// APPROVE, REJECT or NEEDS_REVISION.
    pub verdict: VerdictKind,
    /// In `[0.5, 1.0]`; see the module documentation for the formula.
    pub confidence: f64,
    /// One or two sentences with exact numbers.
    pub summary: String,
    /// Qualifications: flaky or skipped tests, missing baselines, unknown significance, …
    pub caveats: Vec<String>,
    /// Every metric the patched run reported, in name order.
    pub metrics: Vec<MetricChange>,
}

/// Tunable parts of the decision (a policy's `[decision]` table).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DecisionRules {
    /// Relative changes up to this size (0.01 = 1%) are noise, never regressions.
    pub noise_band: f64,
    /// Metric names for which lower is better (latency, sizes, memory, errors); every other
    /// metric is higher-is-better. Entries are exact names or patterns where `*` matches any
    /// run of characters, matched ASCII-case-insensitively. Default:
    /// [`DecisionRules::DEFAULT_LOWER_IS_BETTER`].
    pub lower_is_better: Vec<String>,
    /// The verdict a metric regression gets (default NEEDS_REVISION).
    pub regression_is: VerdictKind,
    /// How many times a run whose tests failed is run again (in the same workspace) to
    /// tell flaky tests from broken ones; a test that passes on a retry is reported as
    /// flaky, naming the retries (default 2, at most 10).
    pub reruns: u32,
    /// How repeated metric samples are compared: `bootstrap` (a confidence interval of the
    /// relative change) or `mann_whitney`.
    pub method: crate::verdict::stats::Method,
    /// The significance level (default 0.05).
    pub alpha: f64,
}

/// Invalid decision rules.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RulesError {
    /// `noise_band` is negative, NaN or infinite.
    #[error(
        "decision rules: noise_band = {0} is not usable; give a finite number >= 0 (0.01 means 1%)"
    )]
    NoiseBand(f64),
    /// A `lower_is_better` entry is empty.
    #[error("decision rules: lower_is_better contains an empty entry; give metric names or patterns like \"*_ms\"")]
    EmptyPattern,
    /// `reruns` is above [`DecisionRules::MAX_RERUNS`].
    #[error("decision rules: reruns = {0} is too many; give 0 to 10")]
    Reruns(u32),
    /// `alpha` is outside (0, 0.5).
    #[error("decision rules: alpha = {0} is not a usable significance level; give a number between 0 and 0.5 (0.05 is usual)")]
    Alpha(f64),
}

impl DecisionRules {
    /// The default noise band: 1%.
    pub const DEFAULT_NOISE_BAND: f64 = 0.01;
    /// Default number of reruns of a run whose tests failed.
    pub const DEFAULT_RERUNS: u32 = 2;
    /// Most reruns a policy may ask for.
    pub const MAX_RERUNS: u32 = 10;

    /// Default lower-is-better patterns: time units (`*_ms`, `*_us`, `*_ns`, `*_s`, `*_sec`,
    /// `*_secs`, `*_seconds`), size units (`*_bytes`, `*_kb`, `*_kib`, `*_mb`, `*_mib`,
    /// `*_gb`, `*_gib`, `*size`), and names containing `latency`, `duration`, `time`,
    /// `memory`, `rss`, `cost`, `error`, `fail` or `loss`.
    pub const DEFAULT_LOWER_IS_BETTER: &'static [&'static str] = &[
        "*_ms",
        "*_us",
        "*_ns",
        "*_s",
        "*_sec",
        "*_secs",
        "*_seconds",
        "*_bytes",
        "*_kb",
        "*_kib",
        "*_mb",
        "*_mib",
        "*_gb",
        "*_gib",
        "*size",
        "*latency*",
        "*duration*",
        "*time*",
        "*memory*",
        "*rss*",
        "*cost*",
        "*error*",
        "*fail*",
        "*loss*",
    ];

    /// Whether a lower value of `metric` is better under these rules.
    pub fn is_lower_better(&self, metric: &str) -> bool {
        self.lower_is_better
            .iter()
            .any(|p| wildcard_match(p.as_bytes(), metric.as_bytes()))
    }

    /// Check the rules (call when loading a policy); [`decide`] treats an unusable
    /// `noise_band` as the default rather than failing.
    pub fn validate(&self) -> Result<(), RulesError> {
        if !self.noise_band.is_finite() || self.noise_band < 0.0 {
            return Err(RulesError::NoiseBand(self.noise_band));
        }
        if self.lower_is_better.iter().any(|p| p.trim().is_empty()) {
            return Err(RulesError::EmptyPattern);
        }
        if self.reruns > Self::MAX_RERUNS {
            return Err(RulesError::Reruns(self.reruns));
        }
        if !(self.alpha > 0.0 && self.alpha < 0.5) {
            return Err(RulesError::Alpha(self.alpha));
        }
        Ok(())
    }

    fn band(&self) -> f64 {
        if self.noise_band.is_finite() && self.noise_band >= 0.0 {
            self.noise_band
        } else {
            Self::DEFAULT_NOISE_BAND
        }
    }
}

impl Default for DecisionRules {
    fn default() -> Self {
        DecisionRules {
            noise_band: Self::DEFAULT_NOISE_BAND,
            lower_is_better: Self::DEFAULT_LOWER_IS_BETTER
                .iter()
                .map(|s| s.to_string())
                .collect(),
            regression_is: VerdictKind::NeedsRevision,
            reruns: Self::DEFAULT_RERUNS,
            method: crate::verdict::stats::Method::Bootstrap,
            alpha: 0.05,
        }
    }
}

/// `*` matches any run of bytes; everything else matches itself, ASCII-case-insensitively.
fn wildcard_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p].eq_ignore_ascii_case(&text[t]) {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

// ---------------------------------------------------------------------------------------
// Strengths and penalties (see the module documentation).
// ---------------------------------------------------------------------------------------

const S_EXIT_ZERO: f64 = 0.4;
const S_METRICS_OK: f64 = 0.5;
const S_SIGNAL: f64 = 0.7;
const S_NONZERO_EXIT: f64 = 0.6;
const S_NO_EXIT: f64 = 0.3;
const S_MISSING_FILE: f64 = 0.4;
const S_NO_TESTS_RAN: f64 = 0.4;
const S_METRIC_MISSING: f64 = 0.4;
const P_FLAKY: f64 = 0.95;
const P_FLAKY_MAX_COUNTED: i32 = 20;
const P_SKIPPED_WEIGHT: f64 = 0.25;
const P_NO_BASELINE: f64 = 0.9;
const P_SINGLE_SAMPLE: f64 = 0.95;
const P_ACCEPTED_REGRESSION: f64 = 0.9;
const CONFIDENCE_CAP: f64 = 0.99;

fn s_passing(n: usize) -> f64 {
    let n = n as f64;
    n / (n + 5.0)
}

fn s_failing(f: usize) -> f64 {
    let f = f as f64;
    f / (f + 0.5)
}

fn s_regression(change: Option<f64>, band: f64) -> f64 {
    match change {
        Some(c) if band > 0.0 => {
            let x = ((c.abs() - band) / band).max(0.0);
            0.3 + 0.5 * x / (x + 1.0)
        }
        _ => 0.8,
    }
}

fn combine(strengths: impl IntoIterator<Item = f64>) -> f64 {
    1.0 - strengths
        .into_iter()
        .map(|s| 1.0 - s.clamp(0.0, 1.0))
        .product::<f64>()
}

fn confidence(strengths: &[f64], penalties: &[f64]) -> f64 {
    let c = (0.5 + 0.5 * combine(strengths.iter().copied())) * penalties.iter().product::<f64>();
    (c.clamp(0.5, CONFIDENCE_CAP) * 1000.0).round() / 1000.0
}

fn severity(v: VerdictKind) -> u8 {
    match v {
        VerdictKind::Approve => 0,
        VerdictKind::NeedsRevision => 1,
        VerdictKind::Reject => 2,
    }
}

// ---------------------------------------------------------------------------------------
// Wording helpers.
// ---------------------------------------------------------------------------------------

/// A number as people write it: integers without decimals, others with up to 4 decimals.
fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
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

fn pct(change: f64) -> String {
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
fn short(s: &str, max: usize) -> String {
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

fn budget_label(name: &str) -> &'static str {
    match name {
        "wall" => "wall-clock time",
        "cpu" => "CPU time",
        "memory" => "memory",
        "pids" => "process count",
        "disk" => "disk",
        "api_cost" => "API cost",
        _ => "resource",
    }
}

// ---------------------------------------------------------------------------------------
// The decision.
// ---------------------------------------------------------------------------------------

struct Problem {
    sentence: String,
    strength: f64,
    verdict: VerdictKind,
}

enum MetricClass {
    Improved,
    Regressed,
    Noise,
    NoBaseline,
}

/// Decide the verdict for one evaluation. See the module documentation for the rules and the
/// confidence formula.
pub fn decide(e: &Evidence, rules: &DecisionRules) -> Decision {
    let band = rules.band();
    let mut caveats: Vec<String> = Vec::new();

    // ---- Metrics are computed first: they are reported on every path. ----
    let empty = BTreeMap::new();
    let patched = e.metrics.as_ref().unwrap_or(&empty);
    let mut metrics = Vec::new();
    let mut classes = Vec::new();
    for (name, &value) in patched {
        let base = e
            .baseline_metrics
            .as_ref()
            .and_then(|b| b.get(name))
            .copied();
        let stats = e.metric_stats.get(name);
        let change = match (stats, base) {
            (Some(st), _) => st.change,
            (None, Some(b)) if b != 0.0 => Some((value - b) / b.abs()),
            (None, Some(_)) if value == 0.0 => Some(0.0),
            _ => None,
        };
        let class = match (base, stats.and_then(|st| st.significant)) {
            (None, _) => MetricClass::NoBaseline,
            // Repeated samples: only a significant change (beyond the band) counts.
            (Some(b), Some(significant)) => {
                let worse = if rules.is_lower_better(name) {
                    value > b
                } else {
                    value < b
                };
                match (significant, worse) {
                    (false, _) => MetricClass::Noise,
                    (true, true) => MetricClass::Regressed,
                    (true, false) => MetricClass::Improved,
                }
            }
            (Some(b), None) => {
                let worse = if rules.is_lower_better(name) {
                    value > b
                } else {
                    value < b
                };
                let beyond = match change {
                    Some(c) => c.abs() > band,
                    None => value != b,
                };
                match (beyond, worse) {
                    (false, _) => MetricClass::Noise,
                    (true, true) => MetricClass::Regressed,
                    (true, false) => MetricClass::Improved,
                }
            }
        };
        metrics.push(MetricChange {
            name: name.clone(),
            baseline: base,
            patched: value,
            change,
            significant: stats.and_then(|st| st.significant),
            ci_low: stats.and_then(|st| st.ci_low),
            ci_high: stats.and_then(|st| st.ci_high),
            p_value: stats.and_then(|st| st.p_value),
            samples: Some(stats.map(|st| st.n_patched.min(st.n_baseline)).unwrap_or(1)),
        });
        classes.push(class);
    }

    // ---- 1. Deterministic rejections. ----
    let mut rejections = Vec::new();
    if let Some((gate, reason)) = &e.gate {
        rejections.push(format!(
            "Rejected by the `{gate}` policy gate: {}.",
            quote(reason)
        ));
    }
    if let Some(err) = &e.apply_error {
        rejections.push(format!("The patch did not apply: {}.", quote(err)));
    }
    if let Some(err) = &e.run_error {
        rejections.push(format!("The task could not run: {}.", quote(err)));
    }
    if let Some(budget) = &e.budget_exceeded {
        let mut s = format!(
            "The {} budget (`{budget}`) was exceeded",
            budget_label(budget)
        );
        match &e.usage_summary {
            Some(u) if !u.trim().is_empty() => {
                s.push_str(": ");
                s.push_str(quote(u));
                s.push('.');
            }
            _ => s.push('.'),
        }
        rejections.push(s);
    }
    if !rejections.is_empty() {
        let summary = rejections.remove(0);
        caveats.extend(rejections.into_iter().map(|r| format!("Also: {r}")));
        if let Some(t) = &e.tests {
            caveats.push(format!(
                "Test results written before the stop: {} passed, {} failed, {} skipped.",
                t.passed() + t.flaky(),
                t.failed(),
                t.skipped()
            ));
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
            sentence: format!(
                "The declared test results could not be used: {}.",
                quote(err)
            ),
            strength: S_MISSING_FILE,
            verdict: needs,
        });
        caveats.push(
            "The task declares a test results file but it was missing or unreadable; the \
             successor may have skipped writing it, so the test outcome is unknown."
                .into(),
        );
    } else if let Some(t) = &e.tests {
        let (passed, failed, skipped, flaky) = (t.passed(), t.failed(), t.skipped(), t.flaky());
        let executed = passed + failed + flaky;
        passed_count = passed + flaky;
        let skipped_note = if skipped > 0 {
            format!("; {skipped} skipped")
        } else {
            String::new()
        };
        if failed > 0 {
            tests_explain_exit = true;
            let names: Vec<String> = t
                .cases
                .iter()
                .filter(|c| matches!(c.outcome, TestOutcome::Failed | TestOutcome::Error))
                .map(|c| c.name.clone())
                .collect();
            problems.push(Problem {
                sentence: format!(
                    "Test suite failed ({failed} of {executed} failed: {}{skipped_note}).",
                    list(&names, 3)
                ),
                strength: s_failing(failed),
                verdict: needs,
            });
        } else if executed == 0 {
            problems.push(Problem {
                sentence: if t.cases.is_empty() {
                    "No tests ran: the test report contains no test cases.".into()
                } else {
                    format!("No tests ran: all {} skipped.", t.cases.len())
                },
                strength: S_NO_TESTS_RAN,
                verdict: needs,
            });
        } else {
            notes.push(format!(
                "Test suite passed ({passed_count}/{executed}{skipped_note})."
            ));
            support.push(s_passing(passed_count));
        }
        if flaky > 0 {
            let items: Vec<String> = t
                .with_outcome(TestOutcome::Flaky)
                .map(|c| match &c.message {
                    Some(m) => format!("{} ({})", c.name, short(m, 160)),
                    None => c.name.clone(),
                })
                .collect();
            caveats.push(format!(
                "{} passed only after retrying: {}.",
                plural(flaky, "flaky test", "flaky tests"),
                list(&items, 5)
            ));
            let counted = i32::try_from(flaky)
                .unwrap_or(i32::MAX)
                .min(P_FLAKY_MAX_COUNTED);
            penalties.push(P_FLAKY.powi(counted));
        }
        if skipped > 0 && executed > 0 {
            let names: Vec<String> = t
                .with_outcome(TestOutcome::Skipped)
                .map(|c| c.name.clone())
                .collect();
            caveats.push(format!(
                "{} skipped: {}.",
                plural(skipped, "test", "tests"),
                list(&names, 5)
            ));
            approve_penalties.push(1.0 - P_SKIPPED_WEIGHT * skipped as f64 / t.cases.len() as f64);
        }
    }

    // The task's end.
    match (e.exit_code, e.signal) {
        (_, Some(sig)) => problems.push(Problem {
            sentence: format!("The task was killed by {}.", signal_name(sig)),
            strength: S_SIGNAL,
            verdict: needs,
        }),
        (Some(0), None) => support.push(S_EXIT_ZERO),
        (Some(code), None) if !tests_explain_exit => {
            let sentence = if passed_count > 0 && e.results_error.is_none() {
                format!("The task exited with status {code} although every test that ran passed.")
            } else {
                format!("The task exited with status {code}.")
            };
            problems.push(Problem {
                sentence,
                strength: S_NONZERO_EXIT,
                verdict: needs,
            });
            if code == 126 || code == 127 {
                caveats.push(format!(
                    "Exit status {code} usually means a command {} inside the successor.",
                    if code == 127 {
                        "was not found"
                    } else {
                        "was not executable"
                    }
                ));
            }
        }
        (Some(_), None) => {}
        (None, None) => problems.push(Problem {
            sentence: "The task's exit status was not recorded.".into(),
            strength: S_NO_EXIT,
            verdict: needs,
        }),
    }

    // Metrics.
    if let Some(err) = &e.metrics_error {
        problems.push(Problem {
            sentence: format!("The declared metrics could not be used: {}.", quote(err)),
            strength: S_MISSING_FILE,
            verdict: needs,
        });
        caveats.push(
            "The task declares a metrics file but it was missing or unreadable; the successor \
             may have skipped writing it, so metric changes are unknown."
                .into(),
        );
    }
    let band_text = format!("the {} noise band", pct(band));
    let mut regressions = Vec::new();
    let mut regression_strengths = Vec::new();
    let mut improvements = Vec::new();
    let mut noise = 0usize;
    let mut no_baseline = Vec::new();
    for (m, class) in metrics.iter().zip(&classes) {
        match class {
            MetricClass::Regressed => {
                let base = m.baseline.unwrap_or(0.0);
                regressions.push(match m.change {
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
                });
                regression_strengths.push(s_regression(m.change, band));
            }
            MetricClass::Improved => improvements.push(match m.change {
                Some(c) => format!("{} improved {}", m.name, pct(c)),
                None => format!(
                    "{} improved from {} to {}",
                    m.name,
                    num(m.baseline.unwrap_or(0.0)),
                    num(m.patched)
                ),
            }),
            MetricClass::Noise => noise += 1,
            MetricClass::NoBaseline => no_baseline.push(format!("{} = {}", m.name, num(m.patched))),
        }
    }
    // Metrics the baseline reported but the patched run did not.
    if let Some(base) = &e.baseline_metrics {
        if e.metrics_error.is_none() {
            let have: BTreeSet<&String> = patched.keys().collect();
            let missing: Vec<String> = base.keys().filter(|k| !have.contains(k)).cloned().collect();
            if !missing.is_empty() {
                let sentence = format!(
                    "The patched run did not report {} that the baseline reported: {}.",
                    if missing.len() == 1 {
                        "a metric"
                    } else {
                        "metrics"
                    },
                    list(&missing, 5)
                );
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
    }
    if !regressions.is_empty() {
        let sentence = format!("{}, beyond {band_text}.", list(&regressions, 3));
        if rules.regression_is == VerdictKind::Approve {
            caveats.push(format!(
                "{} (accepted: the decision rules approve regressions)",
                sentence.trim_end_matches('.')
            ));
            approve_penalties.push(P_ACCEPTED_REGRESSION);
        } else {
            problems.push(Problem {
                sentence,
                strength: combine(regression_strengths),
                verdict: rules.regression_is,
            });
        }
    }
    let compared = metrics.iter().filter(|m| m.baseline.is_some()).count();
    if !improvements.is_empty() {
        let mut s = list(&improvements, 3);
        if noise > 0 {
            s.push_str(&format!(
                "; {} within {band_text}",
                plural(noise, "other metric", "other metrics")
            ));
        }
        s.push('.');
        notes.push(s);
    } else if noise > 0 && regressions.is_empty() {
        notes.push(if noise == 1 {
            let m = metrics
                .iter()
                .zip(&classes)
                .find(|(_, c)| matches!(c, MetricClass::Noise))
                .map(|(m, _)| m.name.as_str())
                .unwrap_or("metric");
            format!("{m} unchanged within {band_text}.")
        } else {
            format!("All {noise} metrics unchanged within {band_text}.")
        });
    }
    if compared > 0 && regressions.is_empty() {
        support.push(S_METRICS_OK);
    }
    let untested = metrics
        .iter()
        .filter(|m| m.baseline.is_some() && m.significant.is_none())
        .count();
    for st in e.metric_stats.values() {
        if let Some(c) = &st.caveat {
            caveats.push(c.clone());
        }
    }
    if compared > 0 && untested > 0 {
        if e.metric_stats.is_empty() {
            caveats.push(format!(
                "Metric changes come from a single run of the patched and the baseline task \
                 (repeat = 1); they were not tested for significance, so changes within run-to-run \
                 noise larger than {band_text} cannot be told apart."
            ));
        } else {
            caveats.push(format!(
                "{untested} metric change(s) could not be tested for significance (too few samples); \
                 they are judged against {band_text} alone."
            ));
        }
        approve_penalties.push(P_SINGLE_SAMPLE);
    }
    if !no_baseline.is_empty() {
        if e.baseline_metrics.is_none() {
            caveats.push(format!(
                "No baseline was run, so metric changes are unknown; measured: {}.",
                list(&no_baseline, 5)
            ));
        } else {
            caveats.push(format!(
                "The baseline did not report {}; no change computed.",
                list(&no_baseline, 5)
            ));
        }
        approve_penalties.push(P_NO_BASELINE);
        if compared == 0 {
            notes.push(format!(
                "{} reported without a baseline.",
                plural(no_baseline.len(), "metric", "metrics")
            ));
        }
    }
    if e.tests.is_none()
        && e.results_error.is_none()
        && patched.is_empty()
        && e.metrics_error.is_none()
    {
        caveats.push(
            "Only the exit status was checked: the task declares no test results or metrics."
                .into(),
        );
    }

    // ---- The verdict. ----
    if problems.is_empty() {
        let mut sentences = notes;
        if sentences.is_empty() {
            sentences.push("The task exited with status 0.".into());
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
    caveats.splice(0..0, extra.into_iter().map(|s| format!("Also: {s}")));
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
mod tests {
    use super::*;
    use crate::task::results::TestCase;

    fn case(name: &str, outcome: TestOutcome) -> TestCase {
        TestCase {
            name: name.into(),
            outcome,
            time_s: Some(0.01),
            message: None,
        }
    }

    fn report(passed: usize, failed: usize, flaky: usize, skipped: usize) -> TestReport {
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

    fn ok_run(tests: Option<TestReport>) -> Evidence {
        Evidence {
            exit_code: Some(0),
            tests,
            ..Evidence::default()
        }
    }

    fn m(pairs: &[(&str, f64)]) -> Option<BTreeMap<String, f64>> {
        Some(pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect())
    }

    fn rules() -> DecisionRules {
        DecisionRules::default()
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
            budget_exceeded: Some("wall".into()),
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
            budget_exceeded: Some("memory".into()),
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
            "Test suite passed (5/5). throughput unchanged within the 1.0% noise band."
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

    // ---- confidence ----

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

    // ---- rules ----

    #[test]
    fn rules_deserialize_with_defaults_and_refuse_unknown_fields() {
        let r: DecisionRules = toml::from_str("noise_band = 0.05").unwrap();
        assert_eq!(r.noise_band, 0.05);
        assert_eq!(r.regression_is, VerdictKind::NeedsRevision);
        assert_eq!(
            r.lower_is_better.len(),
            DecisionRules::DEFAULT_LOWER_IS_BETTER.len()
        );
        let r: DecisionRules = toml::from_str(
            "regression_is = \"REJECT\"\nlower_is_better = [\"*_ms\", \"queue_depth\"]",
        )
        .unwrap();
        assert_eq!(r.regression_is, VerdictKind::Reject);
        assert!(r.is_lower_better("queue_depth") && !r.is_lower_better("compressed_bytes"));
        let e = toml::from_str::<DecisionRules>("noise = 0.1").unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
        assert!(rules().validate().is_ok());
        let bad = DecisionRules {
            noise_band: -0.1,
            ..rules()
        };
        assert_eq!(bad.validate(), Err(RulesError::NoiseBand(-0.1)));
        let bad = DecisionRules {
            lower_is_better: vec![" ".into()],
            ..rules()
        };
        assert_eq!(bad.validate(), Err(RulesError::EmptyPattern));
    }

    #[test]
    fn wildcards() {
        assert!(wildcard_match(b"*_ms", b"p99_ms"));
        assert!(!wildcard_match(b"*_ms", b"p99_ms_total"));
        assert!(wildcard_match(b"*time*", b"time"));
        assert!(wildcard_match(b"*time*", b"wall_time_s"));
        assert!(wildcard_match(b"a*b*c", b"axxbyyc"));
        assert!(!wildcard_match(b"a*b*c", b"axxbyy"));
        assert!(wildcard_match(b"exact", b"EXACT"));
        assert!(!wildcard_match(b"exact", b"exactly"));
    }

    #[test]
    fn numbers_are_written_plainly() {
        assert_eq!(num(41.0), "41");
        assert_eq!(num(45.92), "45.92");
        assert_eq!(num(0.1 + 0.2), "0.3");
        assert_eq!(num(1.5e-7), "1.5e-7");
        assert_eq!(pct(-0.412), "41.2%");
    }
}
