//! Reading what the successor left in its reports directory, after it is dead: the shared
//! report types ([`TestReport`], [`TestCase`], [`TestOutcome`], [`ResultsError`]), the text
//! hygiene every parser applies, and the dispatch by declared format ([`parse_report`]).
//!
//! Everything in those files was written by code under evaluation, so every byte is hostile
//! input. Each job has its own module:
//!
//! * `open` ([`read_report_file`]): opens a path beneath the reports directory through
//!   [`crate::fsx`], so no symbolic link anywhere (including the reports directory itself)
//!   is followed; refuses anything that is not a regular file (a FIFO or device is never
//!   opened for reading, so it cannot stall the supervisor), files with more than one hard
//!   link, and files over a size limit (checked before and while reading).
//! * `junit` ([`parse_junit`]): refuses DTDs (so no entity can be defined or expanded),
//!   unknown entity references, truncated documents, nesting deeper than [`MAX_XML_DEPTH`],
//!   more than [`MAX_XML_ELEMENTS`] elements, more than [`MAX_TEST_CASES`] test cases, more
//!   than [`MAX_XML_ATTRIBUTES`] attributes on an element it reads and start tags over
//!   [`MAX_XML_TAG_BYTES`]; attributes are read in one linear pass.
//! * `tap` ([`parse_tap`]): a missing or unmet plan and `Bail out!` are failures (as `prove`
//!   treats them), never success.
//! * `gotest` ([`parse_go_test_json`]) and `libtest` ([`parse_libtest_json`]) read event
//!   streams (`go test -json`, Rust libtest's `--format json`) through the shared `events`
//!   case table; a test that starts and never finishes, a package or test binary that fails
//!   or dies without a failing test to show for it, become [`TestOutcome::Error`] cases, so a
//!   crash can never read as a pass.
//! * `metrics` ([`parse_metrics`]): only a flat object of finite numbers, duplicate keys
//!   refused.
//!
//! Test names and messages are truncated ([`MAX_NAME_CHARS`], [`MAX_MESSAGE_CHARS`]) and
//! control characters in them are replaced with U+FFFD, so a report cannot smuggle terminal
//! escape sequences into a human-readable verdict.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

use crate::manifest::ResultsFormat;

mod events;
mod gotest;
#[cfg(test)]
mod hostile_tests;
mod junit;
mod libtest;
mod metrics;
mod open;
mod tap;

pub use gotest::{parse_go_test_json, GO_PACKAGE_CASE_SUFFIX};
pub use junit::{
    parse_junit, MAX_XML_ATTRIBUTES, MAX_XML_DEPTH, MAX_XML_ELEMENTS, MAX_XML_TAG_BYTES,
};
pub use libtest::{parse_libtest_json, LIBTEST_SUITE_CASE};
pub use metrics::{parse_metrics, MAX_METRICS};
pub use open::{read_report_file, DEFAULT_MAX_REPORT_BYTES};
pub use tap::{parse_tap, TAP_BAIL_CASE, TAP_PLAN_CASE};

/// Most test cases accepted in one report (any format).
pub const MAX_TEST_CASES: usize = 200_000;
/// Longest kept test name, in characters (longer names are truncated with `…`).
pub const MAX_NAME_CHARS: usize = 512;
/// Longest kept failure message, in characters (longer messages are truncated with `…`).
pub const MAX_MESSAGE_CHARS: usize = 1024;

/// Why a report could not be read or parsed. Every message names the file or the position.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    /// The relative path is absolute, empty, escapes with `..`, or is too deep.
    #[error("report path `{rel}` is not usable: {reason}; declare a relative path inside the reports directory (no `..`, not absolute)")]
    BadPath { rel: String, reason: &'static str },
    /// A component of the path (or the reports directory itself) is a symbolic link.
    #[error("report `{path}`: `{component}` is a symbolic link; links in the reports directory are never followed, the task must write the file itself")]
    Symlink { path: PathBuf, component: String },
    /// The report (or an intermediate component) is not of the expected file type.
    #[error("report `{path}`: `{component}` is a {kind}, expected a {expected}")]
    WrongType {
        path: PathBuf,
        component: String,
        kind: &'static str,
        expected: &'static str,
    },
    /// The report is a hard link shared with another path.
    #[error("report `{path}` has {links} hard links; refusing a file that is linked from elsewhere, the task must write a fresh file")]
    HardLinked { path: PathBuf, links: u64 },
    /// The report exceeds the size limit.
    #[error("report `{path}` is larger than the {max}-byte limit ({size} bytes seen); write a smaller report or raise the limit")]
    TooLarge { path: PathBuf, size: u64, max: u64 },
    /// The report does not exist.
    #[error("report `{path}` does not exist; the task declared it but did not write it (check the task's results path, relative to $FORK_REPORTS)")]
    Missing { path: PathBuf },
    /// Any other I/O failure, naming the operation.
    #[error("report `{path}`: {op} failed: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The JUnit document is malformed, refused, or over a limit.
    #[error("JUnit XML, byte {position}: {message}")]
    Junit { position: u64, message: String },
    /// The TAP stream is not TAP at all (a merely failing stream is a report, not an error).
    #[error("TAP, line {line}: {message}")]
    Tap { line: usize, message: String },
    /// A `go test -json` stream has no event at all, or is over a limit (a failing stream is a
    /// report, not an error).
    #[error("go test -json, line {line}: {message}")]
    GoTestJson { line: usize, message: String },
    /// A libtest JSON stream has no event at all, or is over a limit.
    #[error("libtest JSON, line {line}: {message}")]
    LibtestJson { line: usize, message: String },
    /// The metrics file is not a JSON object.
    #[error("metrics JSON: {0}; expected a flat object like {{\"p99_ms\": 41.0}}")]
    MetricsJson(String),
    /// One metric entry is invalid.
    #[error("metrics JSON: key `{key}`: {message}; every value must be a finite number")]
    MetricsKey { key: String, message: String },
}

/// How one test case ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TestOutcome {
    /// Passed on the first attempt.
    Passed,
    /// An assertion failed.
    Failed,
    /// The test errored (exception outside an assertion, harness error, TAP bail-out or bad plan).
    Error,
    /// Skipped (including TAP `not ok … # TODO`, an expected failure).
    Skipped,
    /// Passed only after one or more failed attempts (JUnit `flakyFailure`/`rerunFailure`).
    Flaky,
}

/// One test case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestCase {
    /// `classname.name` for JUnit (just `name` without a classname); the description for TAP.
    pub name: String,
    /// JUnit's `classname`, as the report gave it (trimmed, cleaned); `None` for formats
    /// without one. `name` then starts with it and a dot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classname: Option<String>,
    /// How it ended.
    pub outcome: TestOutcome,
    /// Duration in seconds, when the report gives a finite, non-negative one.
    pub time_s: Option<f64>,
    /// Failure/error/skip message (truncated), or for flaky tests how many attempts failed.
    pub message: Option<String>,
}

/// A parsed test report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TestReport {
    /// Every case, in document order.
    pub cases: Vec<TestCase>,
}

impl TestReport {
    fn count(&self, pred: impl Fn(TestOutcome) -> bool) -> usize {
        self.cases.iter().filter(|c| pred(c.outcome)).count()
    }
    /// Cases that passed on the first attempt.
    pub fn passed(&self) -> usize {
        self.count(|o| o == TestOutcome::Passed)
    }
    /// Cases that failed or errored.
    pub fn failed(&self) -> usize {
        self.count(|o| matches!(o, TestOutcome::Failed | TestOutcome::Error))
    }
    /// Cases that were skipped.
    pub fn skipped(&self) -> usize {
        self.count(|o| o == TestOutcome::Skipped)
    }
    /// Cases that passed only after retries.
    pub fn flaky(&self) -> usize {
        self.count(|o| o == TestOutcome::Flaky)
    }
    /// Cases that ran to an outcome (everything but skipped).
    pub fn executed(&self) -> usize {
        self.cases.len() - self.skipped()
    }
    /// The cases with the given outcome, in document order.
    pub fn with_outcome(&self, outcome: TestOutcome) -> impl Iterator<Item = &TestCase> {
        self.cases.iter().filter(move |c| c.outcome == outcome)
    }
}

/// Parse a test report in its declared `format`. [`ResultsFormat::ExitStatus`] declares no
/// report to parse: it gives an empty report (the task's exit status is the result).
pub fn parse_report(format: ResultsFormat, bytes: &[u8]) -> Result<TestReport, ResultsError> {
    match format {
        ResultsFormat::Junit => parse_junit(bytes),
        ResultsFormat::Tap => parse_tap(bytes),
        ResultsFormat::GoTestJson => parse_go_test_json(bytes),
        ResultsFormat::LibtestJson => parse_libtest_json(bytes),
        ResultsFormat::ExitStatus => Ok(TestReport::default()),
    }
}

// ---------------------------------------------------------------------------------------
// Text hygiene shared by the parsers.
// ---------------------------------------------------------------------------------------

/// Replace control characters (except `\n` and `\t` when `multiline`) with U+FFFD and truncate
/// to `max` characters, appending `…` when something was cut.
pub(super) fn clean(s: &str, max: usize, multiline: bool) -> String {
    let mut out = String::with_capacity(s.len().min(max * 4));
    for (n, ch) in s.chars().enumerate() {
        if n == max {
            out.push('…');
            break;
        }
        let keep = !ch.is_control() || (multiline && (ch == '\n' || ch == '\t'));
        out.push(if keep { ch } else { '\u{FFFD}' });
    }
    out
}

pub(super) fn clean_name(s: &str) -> String {
    clean(s.trim(), MAX_NAME_CHARS, false)
}

pub(super) fn clean_message(s: &str) -> Option<String> {
    let t = s.trim();
    if t.is_empty() {
        None
    } else {
        Some(clean(t, MAX_MESSAGE_CHARS, true))
    }
}

/// Append to a bounded buffer (used while collecting element text). A cut is marked with
/// `…`, as [`clean`] marks its own (what fork redacts from report text relies on it: the
/// beginning of a secret cut short stands right before a `…`).
pub(super) fn push_bounded(buf: &mut String, s: &str) {
    // Four bytes per char at most: enough to hold MAX_MESSAGE_CHARS characters plus one.
    let cap = (MAX_MESSAGE_CHARS + 1) * 4;
    if buf.len() >= cap {
        return;
    }
    let room = cap - buf.len();
    if s.len() <= room {
        buf.push_str(s);
    } else {
        let mut end = room;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        buf.push_str(&s[..end]);
        // At least `cap` bytes now (`end` is at most three below `room`): nothing more is
        // added.
        buf.push('…');
    }
}

/// The cases of a report as `(name, outcome)`, in order, for the parsers' tests.
#[cfg(test)]
pub(super) fn outcomes(r: &TestReport) -> Vec<(&str, TestOutcome)> {
    r.cases
        .iter()
        .map(|c| (c.name.as_str(), c.outcome))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bounded_buffer_marks_its_cut() {
        // Leading whitespace the message's trim removes leaves fewer characters than
        // `clean` cuts at: the buffer's own cut is still marked.
        let mut buf = " ".repeat(1000);
        push_bounded(&mut buf, &format!("{}sk-live", "\u{1D11E}".repeat(1000)));
        assert!(buf.ends_with('…'), "{}", &buf[buf.len() - 8..]);
        let kept = buf.len();
        push_bounded(&mut buf, "more");
        assert_eq!(buf.len(), kept);
        let m = clean_message(&buf).unwrap();
        assert!(m.chars().count() <= MAX_MESSAGE_CHARS + 1 && m.ends_with('…'));
        let mut small = String::new();
        push_bounded(&mut small, "short");
        assert_eq!(small, "short");
    }

    #[test]
    fn dispatches_by_declared_format() {
        let junit = br#"<testsuite><testcase name="a"/></testsuite>"#;
        let tap = b"1..1\nok 1 - a\n";
        let go = br#"{"Action":"run","Package":"p","Test":"a"}
{"Action":"pass","Package":"p","Test":"a"}
{"Action":"pass","Package":"p"}"#;
        let libtest = br#"{"type":"suite","event":"started","test_count":1}
{"type":"test","event":"ok","name":"a"}
{"type":"suite","event":"ok","passed":1,"failed":0,"ignored":0,"measured":0,"filtered_out":0}"#;
        for (format, bytes) in [
            (ResultsFormat::Junit, &junit[..]),
            (ResultsFormat::Tap, &tap[..]),
            (ResultsFormat::GoTestJson, &go[..]),
            (ResultsFormat::LibtestJson, &libtest[..]),
        ] {
            let r = parse_report(format, bytes).unwrap();
            assert_eq!(
                (r.cases.len(), r.passed()),
                (1, 1),
                "{format:?}: {:?}",
                r.cases
            );
            // Each format's parser, not another's: the same bytes as JUnit are refused.
            if format != ResultsFormat::Junit {
                assert!(
                    parse_report(ResultsFormat::Junit, bytes).is_err(),
                    "{format:?}"
                );
            }
        }
        assert_eq!(
            parse_report(ResultsFormat::ExitStatus, b"anything").unwrap(),
            TestReport::default()
        );
    }
}
