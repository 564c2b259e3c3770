//! Keeping what the policy passes into the sandbox out of what fork keeps from a run: the
//! values of its `[environment]` `set` entries, the host values of its `pass` names (see
//! [`Policy::secret_values`]) and the model gateway's credentials. Two boundaries, each
//! crossed once:
//!
//! * what fork stages as an artifact (report files, the output log, the metrics and results
//!   copies, the gateway's call log): its bytes ([`Redactor::bytes`]) and, for a file the
//!   successor named, its name ([`Redactor::appears_in`]: a name that holds a secret is
//!   replaced by a neutral one, never cut or digested);
//! * what a side's runs become as evidence ([`Redactor::run`], applied to what `run_side`
//!   returns, once its attempts are merged): test names, classnames and messages, metric
//!   names, the results and metrics errors, the notes and the protected tree's changed paths.
//!   The verdict, its summary and caveats, every report printed from it and the ledger row
//!   are all made from that evidence.
//!
//! The evidence is parsed from the unredacted bytes (a secret such as `1000` must not break a
//! metric's value or a TAP plan) and redacted after: the decision counts the same cases and
//! the same values either way. Two metric names that become one once redacted are refused
//! as a metrics error rather than merged.
//!
//! What counts as a secret: each value as written, and as fork's own cleaning of report
//! text would show it (control characters replaced by U+FFFD, surrounding whitespace
//! trimmed). Fork's own truncation of a long name or message (marked `…`) may cut a secret
//! short: whatever beginning of a secret stands right before a `…` is redacted too. A
//! value the successor transforms itself (splits, encodes, reverses) is not recognised.
//!
//! [`Policy::secret_values`]: crate::policy::Policy::secret_values

use std::collections::BTreeMap;
use zeroize::Zeroizing;

/// What replaces a secret in everything fork keeps from a run.
pub const REDACTED: &str = "[redacted by fork]";

/// The mark fork's truncation of report text ends a cut with (`task::results::clean`).
const CUT: char = '…';

/// The secrets of one evaluation, in every form they are looked for in, longest first.
#[derive(Default)]
pub struct Redactor {
    forms: Vec<Zeroizing<String>>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} forms)", self.forms.len())
    }
}

/// `s` with control characters replaced by U+FFFD (but `\n` and `\t` when `multiline`), as
/// the report parsers clean names (single line) and messages (multiline).
fn cleaned(s: &str, multiline: bool) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() && !(multiline && (c == '\n' || c == '\t')) {
                '\u{FFFD}'
            } else {
                c
            }
        })
        .collect()
}

impl Redactor {
    /// A redactor for `values` (each at least [`MIN_SECRET_LEN`] bytes; shorter ones are
    /// left out, as they would match by chance).
    ///
    /// [`MIN_SECRET_LEN`]: crate::policy::MIN_SECRET_LEN
    pub fn new<I, S>(values: I) -> Redactor
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut forms: Vec<Zeroizing<String>> = Vec::new();
        for v in values {
            let v = v.as_ref();
            for base in [v, v.trim()] {
                for form in [base.to_string(), cleaned(base, false), cleaned(base, true)] {
                    let form = Zeroizing::new(form);
                    if form.len() >= crate::policy::MIN_SECRET_LEN && !forms.contains(&form) {
                        forms.push(form);
                    }
                }
            }
        }
        // Longest first: a secret that holds another is replaced whole.
        forms.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
        Redactor { forms }
    }

    /// The values `policy` passes into the sandbox and the gateway's `credentials`.
    pub fn for_run(
        policy: &crate::policy::Policy,
        credentials: Option<&Zeroizing<String>>,
    ) -> Redactor {
        let mut values: Vec<Zeroizing<String>> = policy
            .secret_values()
            .into_iter()
            .map(Zeroizing::new)
            .collect();
        values.extend(credentials.cloned());
        Redactor::new(values.iter().map(|v| v.as_str()))
    }

    /// Whether there is anything to redact at all.
    pub fn is_empty(&self) -> bool {
        self.forms.is_empty()
    }

    /// Whether `s` holds a secret (whole).
    pub fn appears_in(&self, s: &str) -> bool {
        self.forms.iter().any(|f| s.contains(f.as_str()))
    }

    /// `bytes` with every occurrence of every secret replaced by [`REDACTED`].
    pub fn bytes(&self, bytes: &[u8]) -> Vec<u8> {
        let mut cur = bytes.to_vec();
        for s in self.forms.iter().map(|f| f.as_bytes()) {
            if !cur.windows(s.len()).any(|w| w == s) {
                continue;
            }
            let mut out = Vec::with_capacity(cur.len());
            let mut i = 0;
            while i < cur.len() {
                if cur[i..].starts_with(s) {
                    out.extend_from_slice(REDACTED.as_bytes());
                    i += s.len();
                } else {
                    out.push(cur[i]);
                    i += 1;
                }
            }
            cur = out;
        }
        cur
    }

    /// `s` with every occurrence of every secret replaced by [`REDACTED`], and the beginning
    /// of a secret that fork's truncation cut short (right before a `…`) too.
    pub fn text(&self, s: &str) -> String {
        let mut out = s.to_string();
        for f in &self.forms {
            if out.contains(f.as_str()) {
                out = out.replace(f.as_str(), REDACTED);
            }
        }
        if self.forms.is_empty() || !out.contains(CUT) {
            return out;
        }
        let mut cut = String::with_capacity(out.len());
        let mut parts = out.split(CUT).peekable();
        while let Some(part) = parts.next() {
            if parts.peek().is_none() {
                cut.push_str(part);
                break;
            }
            let k = self.cut_beginning(part);
            cut.push_str(&part[..part.len() - k]);
            if k > 0 {
                cut.push_str(REDACTED);
            }
            cut.push(CUT);
        }
        cut
    }

    /// The length of the longest end of `s` that is the beginning of a secret (0 if none).
    fn cut_beginning(&self, s: &str) -> usize {
        self.forms
            .iter()
            .flat_map(|f| {
                (1..f.len())
                    .filter(|&k| f.is_char_boundary(k) && s.ends_with(&f[..k]))
                    .max()
            })
            .max()
            .unwrap_or(0)
    }

    /// `metrics` with their names redacted, or the redacted name two of them share.
    pub(super) fn metric_names(
        &self,
        metrics: BTreeMap<String, f64>,
    ) -> Result<BTreeMap<String, f64>, String> {
        let mut out = BTreeMap::new();
        for (name, value) in metrics {
            let name = self.text(&name);
            if out.contains_key(&name) {
                return Err(name);
            }
            out.insert(name, value);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::results::{TestCase, TestOutcome, TestReport};

    fn r() -> Redactor {
        Redactor::new(["token-long-1", "token", "abc"])
    }

    #[test]
    fn every_occurrence_of_every_secret_is_redacted_longest_first() {
        let out = r().bytes(b"a token-long-1 b token c token-long-1");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "a [redacted by fork] b [redacted by fork] c [redacted by fork]"
        );
        assert_eq!(r().bytes(b"nothing here abc"), b"nothing here abc");
        assert_eq!(
            r().text("a token-long-1 b token"),
            "a [redacted by fork] b [redacted by fork]"
        );
        assert!(Redactor::new(["abc"]).is_empty());
    }

    #[test]
    fn a_secret_cut_short_by_truncation_is_redacted_and_so_are_its_cleaned_forms() {
        let r = Redactor::new(["sk-live-0123", "tab\tsecret"]);
        // fork's own cut (names at 512 characters, messages at 1024) ends in `…`.
        assert_eq!(r.text("name sk-live-01…"), "name [redacted by fork]…");
        assert_eq!(
            r.text("x s… y sk…"),
            "x [redacted by fork]… y [redacted by fork]…"
        );
        // Not a cut: left alone.
        assert_eq!(r.text("name sk-live-01"), "name sk-live-01");
        assert_eq!(r.text("loading…"), "loading…");
        // The parsers replace control characters; the cleaned form is a secret too.
        assert_eq!(r.text("a tab\u{FFFD}secret"), "a [redacted by fork]");
        assert_eq!(r.text("a tab\tsecret"), "a [redacted by fork]");
    }

    fn case(name: &str, classname: Option<&str>, outcome: TestOutcome) -> TestCase {
        TestCase {
            name: name.into(),
            classname: classname.map(Into::into),
            outcome,
            time_s: None,
            message: Some(format!("failed with {name}")),
        }
    }

    #[test]
    fn a_run_is_redacted_and_failing_cases_still_fail() {
        let mut run = crate::evaluation::evidence::testing::run();
        run.tests = Some(TestReport {
            cases: vec![
                case("s.t-token", Some("s"), TestOutcome::Failed),
                case("token.t", Some("token"), TestOutcome::Passed),
                case("token-long-1", None, TestOutcome::Failed),
            ],
        });
        run.results_error = Some("root element is <token>".into());
        run.metrics = Some([("m_token".to_string(), 1.0), ("n".to_string(), 2.0)].into());
        run.notes = vec!["could not remove reports/token".into()];
        run.protected_changes = vec![crate::verdict::decide::ProtectedChange {
            path: "tests/token".into(),
            change: crate::verdict::decide::ChangeKind::Added,
        }];
        run.redact(&r(), "metrics.json");
        assert_eq!(run.protected_changes[0].path, "tests/[redacted by fork]");
        let t = run.tests.as_ref().unwrap();
        assert_eq!(t.failed(), 2);
        assert_eq!(t.cases[0].name, "s.t-[redacted by fork]");
        assert_eq!(t.cases[0].classname.as_deref(), Some("s"));
        assert_eq!(t.cases[1].classname.as_deref(), Some("[redacted by fork]"));
        assert_eq!(
            t.cases[2].message.as_deref(),
            Some("failed with [redacted by fork]")
        );
        let text = format!("{:?} {:?} {:?}", t, run.results_error, run.notes);
        assert!(!text.contains("token"), "{text}");
        let m = run.metrics.as_ref().unwrap();
        assert_eq!(m.keys().collect::<Vec<_>>(), ["m_[redacted by fork]", "n"]);
    }

    #[test]
    fn metric_names_that_redact_alike_are_refused_not_merged() {
        let mut run = crate::evaluation::evidence::testing::run();
        run.metrics = Some(
            [
                ("m_token".to_string(), 1.0),
                ("m_[redacted by fork]".to_string(), 2.0),
            ]
            .into(),
        );
        run.redact(&r(), "out/metrics.json");
        assert!(run.metrics.is_none());
        let e = run.metrics_error.unwrap();
        assert!(
            e.starts_with("out/metrics.json: two metric names read `m_[redacted by fork]`"),
            "{e}"
        );
    }
}
