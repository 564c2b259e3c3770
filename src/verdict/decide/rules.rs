//! The decision's tunable rules (a policy's `[decision]` table): the noise band, which
//! metrics are lower-is-better, the verdict a regression gets, reruns and the statistics
//! method; and how those rules classify one metric against its baseline.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::verdict::kind::VerdictKind;
use crate::verdict::Metric;

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
    /// What evidence the code under test produced about itself (a task without a judge)
    /// may earn: `needs_revision` (the default: at most NEEDS_REVISION, saying why) or
    /// `accept` (an APPROVE, with a caveat and lower confidence: for CI gating of patches
    /// written by people).
    pub self_reported: SelfReported,
    /// Noise bands per metric kind: metric name (or `*` pattern, as in `lower_is_better`)
    /// -> band. An exact name wins, then the widest band of the matching patterns; metrics
    /// matching none get `noise_band`. `0` means exact: a deterministic metric must not
    /// move at all (and two constant sides of it are decided exactly).
    pub bands: BTreeMap<String, f64>,
    /// Metrics (names or patterns) that are reported but never decide the verdict: an
    /// inconclusive or regressed informational metric is a caveat, not a NEEDS_REVISION.
    pub informational: Vec<String>,
    /// Sequential stopping for tasks with a baseline and `repeat` > 1: pairs run until
    /// every metric is decided or the cap; `false` runs every pair and looks once.
    pub sequential: bool,
    /// How two constant sides are decided (see [`ConstantChanges`]).
    pub constant_changes: ConstantChanges,
    /// What `alpha` holds for: the verdict's whole plan, or each task (see [`AlphaScope`]).
    pub alpha_scope: AlphaScope,
    /// Pairs (baseline + patched) of the first look (default 3, at least 2).
    pub min_pairs: u32,
    /// The most pairs any task runs, whatever its `repeat` (default 20).
    pub max_pairs: u32,
}

/// How a metric constant on both sides is decided (`[decision] constant_changes`), whether
/// the sides agree within its band or not (sides constant at 0 too: with `Tested` and a
/// band that is not 0 they stay inconclusive, as a relative band has no scale at 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConstantChanges {
    /// Exactly only when the metric's band is 0 (declared deterministic); otherwise by the
    /// rank test like any sample, spending its share of `alpha`: a noisy metric rounded
    /// coarsely can come out constant on both sides by chance, and a few equal values
    /// prove neither a change nor its absence.
    #[default]
    Tested,
    /// Exactly, whatever the band, spending no `alpha` (the rule of the releases before
    /// this setting existed).
    Exact,
}

/// What the error rate `alpha` holds for (`[decision] alpha_scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlphaScope {
    /// The verdict: `alpha` is split evenly over the plan's tasks that compare pairs (a
    /// false decision in any of them would be the verdict's, as one replica's is).
    #[default]
    Plan,
    /// Each task on its own (the rule before this setting existed): a plan of `K` such
    /// tasks can be fooled up to `K` times as often as `alpha` says.
    Task,
}

/// How far self-reported evidence goes (`[decision] self_reported`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SelfReported {
    Accept,
    NeedsRevision,
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
    /// A `bands` entry is empty, or its band negative, NaN or infinite.
    #[error("decision rules: bands.\"{0}\" = {1} is not usable; give a metric name or pattern and a finite band >= 0 (0.05 means 5%)")]
    Band(String, f64),
    /// `min_pairs` / `max_pairs` out of range.
    #[error("decision rules: min_pairs = {0}, max_pairs = {1}; give 2 <= min_pairs <= max_pairs <= 1000")]
    Pairs(u32, u32),
}

impl DecisionRules {
    /// The default noise band: 1%.
    pub const DEFAULT_NOISE_BAND: f64 = 0.01;
    /// Default number of reruns of a run whose tests failed.
    pub const DEFAULT_RERUNS: u32 = 2;
    /// Most reruns a policy may ask for.
    pub const MAX_RERUNS: u32 = 10;
    /// Default pairs of the first look.
    pub const DEFAULT_MIN_PAIRS: u32 = 3;
    /// Default run cap (pairs).
    pub const DEFAULT_MAX_PAIRS: u32 = 20;

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

    /// Check the rules (call when loading a policy); [`decide`](super::decide) treats an unusable
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
        if let Some((k, v)) = self
            .bands
            .iter()
            .find(|(k, v)| k.trim().is_empty() || !v.is_finite() || **v < 0.0)
        {
            return Err(RulesError::Band(k.clone(), *v));
        }
        if self.informational.iter().any(|p| p.trim().is_empty()) {
            return Err(RulesError::EmptyPattern);
        }
        if self.min_pairs < 2 || self.max_pairs < self.min_pairs || self.max_pairs > 1000 {
            return Err(RulesError::Pairs(self.min_pairs, self.max_pairs));
        }
        Ok(())
    }

    /// Whether two constant sides of `metric` are decided exactly (see [`ConstantChanges`]).
    pub fn constant_sides_are_exact(&self, metric: &str) -> bool {
        self.constant_changes == ConstantChanges::Exact || self.band_for(metric) == 0.0
    }

    /// The noise band of `metric`: its `bands` entry by exact name, else the widest band of
    /// the matching patterns, else the noise band in force.
    pub fn band_for(&self, metric: &str) -> f64 {
        let usable = |b: f64| b.is_finite() && b >= 0.0;
        if let Some((_, &b)) = self
            .bands
            .iter()
            .find(|(k, b)| !k.contains('*') && k.eq_ignore_ascii_case(metric) && usable(**b))
        {
            return b;
        }
        self.bands
            .iter()
            .filter(|(k, b)| usable(**b) && wildcard_match(k.as_bytes(), metric.as_bytes()))
            .map(|(_, &b)| b)
            .fold(None, |acc: Option<f64>, b| {
                Some(acc.map_or(b, |a| a.max(b)))
            })
            .unwrap_or_else(|| self.band())
    }

    /// The default noise bands per metric kind ([`DecisionRules::bands`]): sizes in bytes
    /// exact; ratios 1%; timings (names in time units or with `latency`, `duration`, `time`)
    /// and medians 5%; high percentiles (`p9*`) 10%; memory 5%.
    pub const DEFAULT_BANDS: &'static [(&'static str, f64)] = &[
        ("*_bytes", 0.0),
        ("*ratio*", 0.01),
        ("*_ms", 0.05),
        ("*_us", 0.05),
        ("*_ns", 0.05),
        ("*_s", 0.05),
        ("*_sec", 0.05),
        ("*_secs", 0.05),
        ("*_seconds", 0.05),
        ("*latency*", 0.05),
        ("*duration*", 0.05),
        ("*time*", 0.05),
        ("*p50*", 0.05),
        ("*median*", 0.05),
        ("*p9*", 0.10),
        ("*memory*", 0.05),
        ("*rss*", 0.05),
    ];

    /// Whether `metric` is informational (reported, never deciding).
    pub fn is_informational(&self, metric: &str) -> bool {
        self.informational
            .iter()
            .any(|p| wildcard_match(p.as_bytes(), metric.as_bytes()))
    }

    /// The noise band in force: `noise_band`, or the default when it is unusable.
    pub(in crate::verdict) fn band(&self) -> f64 {
        if self.noise_band.is_finite() && self.noise_band >= 0.0 {
            self.noise_band
        } else {
            Self::DEFAULT_NOISE_BAND
        }
    }

    /// How `m` compares with its baseline under these rules. With repeated samples the
    /// sequential assessment decides (`m.class`: improved, regressed, equivalent or
    /// inconclusive). Without it (single samples) the metric moved beyond the band when its
    /// change was judged significant, else when its relative change exceeds its noise band
    /// (strictly), else (no relative change: the baseline is 0) when it moved at all; it got
    /// worse when it went up for a lower-is-better name, down otherwise. The decision and the
    /// JUnit report both classify by this one rule.
    pub(in crate::verdict) fn classify(&self, m: &Metric) -> MetricClass {
        let Some(b) = m.baseline else {
            return MetricClass::NoBaseline;
        };
        match m.class {
            Some(crate::verdict::MetricVerdict::Improved) => return MetricClass::Improved,
            Some(crate::verdict::MetricVerdict::Regressed) => return MetricClass::Regressed,
            Some(crate::verdict::MetricVerdict::Equivalent) => return MetricClass::Noise,
            Some(crate::verdict::MetricVerdict::Inconclusive) => return MetricClass::Inconclusive,
            None => {}
        }
        let worse = if self.is_lower_better(&m.name) {
            m.patched > b
        } else {
            m.patched < b
        };
        let band = m.band.unwrap_or_else(|| self.band_for(&m.name));
        let beyond = match (m.significant, m.change) {
            (Some(significant), _) => significant,
            (None, Some(c)) => c.abs() > band,
            (None, None) => m.patched != b,
        };
        match (beyond, worse) {
            (false, _) => MetricClass::Noise,
            (true, true) => MetricClass::Regressed,
            (true, false) => MetricClass::Improved,
        }
    }
}

/// How a metric compares with its baseline ([`DecisionRules::classify`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::verdict) enum MetricClass {
    /// No baseline: nothing to compare.
    NoBaseline,
    /// Within the noise band: equivalent (repeated samples), or not beyond the band (single
    /// samples).
    Noise,
    /// Repeated samples that could not tell: the interval reaches beyond the band.
    Inconclusive,
    /// Beyond the band, in the good direction.
    Improved,
    /// Beyond the band, in the bad direction.
    Regressed,
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
            // The code under test does not approve itself by default (it did before verdict
            // schema 1.3; policies/human-patches.toml restores that).
            self_reported: SelfReported::NeedsRevision,
            bands: Self::DEFAULT_BANDS
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            informational: Vec::new(),
            sequential: true,
            constant_changes: ConstantChanges::Tested,
            alpha_scope: AlphaScope::Plan,
            min_pairs: Self::DEFAULT_MIN_PAIRS,
            max_pairs: Self::DEFAULT_MAX_PAIRS,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> DecisionRules {
        DecisionRules::default()
    }

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
}
