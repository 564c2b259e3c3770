//! The decision's tunable rules (a policy's `[decision]` table): the noise band, which
//! metrics are lower-is-better, the verdict a regression gets, reruns and the statistics
//! method; and how those rules classify one metric against its baseline.

use serde::{Deserialize, Serialize};

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
        Ok(())
    }

    /// The noise band in force: `noise_band`, or the default when it is unusable.
    pub(in crate::verdict) fn band(&self) -> f64 {
        if self.noise_band.is_finite() && self.noise_band >= 0.0 {
            self.noise_band
        } else {
            Self::DEFAULT_NOISE_BAND
        }
    }

    /// How `m` compares with its baseline under these rules. It moved beyond the band when
    /// its change was judged significant (repeated samples), else when its relative change
    /// exceeds the noise band (strictly), else (no relative change: the baseline is 0) when
    /// it moved at all; it got worse when it went up for a lower-is-better name, down
    /// otherwise. The decision and the JUnit report both classify by this one rule.
    pub(in crate::verdict) fn classify(&self, m: &Metric) -> MetricClass {
        let Some(b) = m.baseline else {
            return MetricClass::NoBaseline;
        };
        let worse = if self.is_lower_better(&m.name) {
            m.patched > b
        } else {
            m.patched < b
        };
        let beyond = match (m.significant, m.change) {
            (Some(significant), _) => significant,
            (None, Some(c)) => c.abs() > self.band(),
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
    /// Within the noise band (or not significant).
    Noise,
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
