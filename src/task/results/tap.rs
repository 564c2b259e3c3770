//! TAP 13/14 streams (`prove -v`, Test::More, node-tap): a missing or unmet plan and
//! `Bail out!` are failures, never success.

use super::{
    clean, clean_message, clean_name, ResultsError, TestCase, TestOutcome, TestReport,
    MAX_MESSAGE_CHARS, MAX_TEST_CASES,
};

/// The name of the synthetic case recording a plan problem (missing, unmet, duplicated).
pub const TAP_PLAN_CASE: &str = "TAP plan";
/// The name of the synthetic case recording a `Bail out!`.
pub const TAP_BAIL_CASE: &str = "Bail out!";

/// Parse a TAP 13/14 stream (as written by `prove -v`, Test::More, node-tap, …).
///
/// Top-level `ok`/`not ok` lines become cases (`# SKIP` → Skipped; `not ok … # TODO` →
/// Skipped, an expected failure; `ok … # TODO` → Passed; `not ok … # SKIP` stays Failed).
/// Indented lines (subtests, YAML diagnostics) are left to their parent line; `#` comment lines
/// right after a failure are attached to its message. Like `prove`, a stream is a failure when
/// it bails out, has no plan, or runs a different number of tests than planned: each of these
/// adds one synthetic [`TestOutcome::Error`] case ([`TAP_BAIL_CASE`], [`TAP_PLAN_CASE`]).
/// Only a stream with neither a plan nor a test line (or an unsupported `TAP version`) is an
/// error. Non-UTF-8 bytes are replaced.
pub fn parse_tap(text: &[u8]) -> Result<TestReport, ResultsError> {
    let text = String::from_utf8_lossy(text);
    let mut report = TestReport::default();
    let mut plan: Option<u64> = None;
    let mut plan_problem: Option<String> = None;
    let mut bail: Option<String> = None;
    let mut test_lines = 0usize;
    // Index of the last failed case, while comment lines may still be attached to it.
    let mut diag_target: Option<usize> = None;

    for (idx, raw_line) in text.split('\n').enumerate() {
        let lineno = idx + 1;
        let line = raw_line.strip_suffix('\r').unwrap_or(raw_line);
        if line.starts_with(' ') || line.starts_with('\t') {
            continue; // subtest or YAML block: the parent's line carries the outcome
        }
        if let Some(rest) = line.strip_prefix("TAP version ") {
            match rest.trim().parse::<u32>() {
                Ok(13 | 14) => {}
                _ => {
                    return Err(ResultsError::Tap {
                        line: lineno,
                        message: format!(
                            "unsupported `TAP version {}`; TAP 13 and 14 are understood",
                            clean_name(rest)
                        ),
                    })
                }
            }
            continue;
        }
        if let Some(reason) = line.strip_prefix("Bail out!") {
            bail = Some(reason.trim().to_string());
            break;
        }
        if let Some(rest) = line.strip_prefix('#') {
            if let (Some(i), false) = (diag_target, rest.trim().is_empty()) {
                let c = &mut report.cases[i];
                let mut m = c.message.take().unwrap_or_default();
                if !m.is_empty() {
                    m.push('\n');
                }
                m.push_str(rest.trim());
                c.message = Some(clean(&m, MAX_MESSAGE_CHARS, true));
            }
            continue;
        }
        diag_target = None;
        if let Some(n) = parse_plan(line) {
            if plan.is_some() || plan_problem.is_some() {
                plan_problem = Some(format!("more than one plan line (again at line {lineno})"));
            } else {
                plan = Some(n);
            }
            continue;
        }
        let (ok, rest) = if let Some(r) = strip_word(line, "ok") {
            (true, r)
        } else if let Some(r) = line.strip_prefix("not ").and_then(|l| strip_word(l, "ok")) {
            (false, r)
        } else {
            continue; // unknown lines are ignored, as the TAP specification requires
        };
        test_lines += 1;
        if report.cases.len() >= MAX_TEST_CASES {
            return Err(ResultsError::Tap {
                line: lineno,
                message: format!(
                    "more than {MAX_TEST_CASES} test lines; refusing an oversized report"
                ),
            });
        }
        report.cases.push(tap_case(ok, rest, test_lines));
        if !ok && report.cases.last().map(|c| c.outcome) == Some(TestOutcome::Failed) {
            diag_target = Some(report.cases.len() - 1);
        }
    }

    if plan.is_none() && test_lines == 0 && bail.is_none() {
        return Err(ResultsError::Tap {
            line: 1,
            message: "no plan (`1..N`) and no `ok`/`not ok` line: this is not a TAP stream".into(),
        });
    }
    if let Some(reason) = bail {
        report.cases.push(TestCase {
            name: TAP_BAIL_CASE.into(),
            classname: None,
            outcome: TestOutcome::Error,
            time_s: None,
            message: clean_message(&reason).or_else(|| Some("the test run bailed out".into())),
        });
    } else {
        let problem = match (plan_problem, plan) {
            (Some(p), _) => Some(p),
            (None, None) => Some(format!(
                "no plan line (`1..N`) after {test_lines} test line(s); the stream may be truncated"
            )),
            (None, Some(n)) if n != test_lines as u64 => {
                Some(format!("planned {n} test(s) but {test_lines} ran"))
            }
            _ => None,
        };
        if let Some(p) = problem {
            report.cases.push(TestCase {
                name: TAP_PLAN_CASE.into(),
                classname: None,
                outcome: TestOutcome::Error,
                time_s: None,
                message: Some(p),
            });
        }
    }
    Ok(report)
}

/// `1..N` optionally followed by `# reason`.
fn parse_plan(line: &str) -> Option<u64> {
    let rest = line.strip_prefix("1..")?;
    let (num, tail) = match rest.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let tail = tail.trim_start();
    if !(tail.is_empty() || tail.starts_with('#')) {
        return None;
    }
    num.parse().ok()
}

/// `word` at the start of `line`, followed by whitespace or the end of the line.
fn strip_word<'a>(line: &'a str, word: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(word)?;
    if rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t') {
        Some(rest)
    } else {
        None
    }
}

fn tap_case(ok: bool, rest: &str, seq: usize) -> TestCase {
    let rest = rest.trim_start();
    // Optional test number.
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let (num, rest) = rest.split_at(digits);
    let rest = rest.trim_start();
    let rest = rest.strip_prefix('-').unwrap_or(rest).trim_start();
    // Description up to the first unescaped '#'; the directive after it.
    let mut desc = String::new();
    let mut directive: Option<&str> = None;
    let mut chars = rest.char_indices().peekable();
    while let Some((i, ch)) = chars.next() {
        match ch {
            '\\' => {
                if let Some(&(_, next)) = chars.peek() {
                    if next == '#' || next == '\\' {
                        desc.push(next);
                        chars.next();
                        continue;
                    }
                }
                desc.push('\\');
            }
            '#' => {
                directive = Some(&rest[i + 1..]);
                break;
            }
            _ => desc.push(ch),
        }
    }
    let desc = desc.trim();
    let name = if !desc.is_empty() {
        clean_name(desc)
    } else if !num.is_empty() {
        format!("test {num}")
    } else {
        format!("test {seq}")
    };
    let (skip, todo, reason) = match directive.map(str::trim_start) {
        Some(d) => {
            let word_end = d
                .find(|c: char| !c.is_ascii_alphabetic())
                .unwrap_or(d.len());
            let word = d[..word_end].to_ascii_uppercase();
            let reason = d[word_end..].trim_start_matches(':').trim();
            (
                word.starts_with("SKIP"),
                word == "TODO",
                clean_message(reason),
            )
        }
        None => (false, false, None),
    };
    let with = |label: &str| {
        Some(match &reason {
            Some(r) => format!("{label}: {r}"),
            None => label.to_string(),
        })
    };
    let (outcome, message) = match (ok, skip, todo) {
        (true, true, _) => (TestOutcome::Skipped, with("SKIP")),
        (true, false, true) => (TestOutcome::Passed, with("TODO passed unexpectedly")),
        (true, false, false) => (TestOutcome::Passed, None),
        (false, false, true) => (TestOutcome::Skipped, with("TODO (expected failure)")),
        (false, _, _) => (TestOutcome::Failed, None),
    };
    TestCase {
        name,
        classname: None,
        outcome,
        time_s: None,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::results::outcomes;
    use std::process::Command;

    fn perl_tap(script: &str) -> Vec<u8> {
        let out = Command::new("perl")
            .args(["-MTest::More", "-e", script])
            .output()
            .expect("perl is on PATH");
        // prove reads stdout; Test::More's diagnostics go to stderr, merged here as `prove -v`
        // shows them.
        let mut v = out.stdout;
        v.extend_from_slice(&out.stderr);
        v
    }

    #[test]
    fn parses_real_test_more_output() {
        let tap = perl_tap(
            r#"ok(1, "adds"); is(2, 3, "subtracts");
               SKIP: { skip "no network", 1; ok(1, "fetches") }
               TODO: { local $TODO = "not yet"; ok(0, "flies") }
               ok(1, "hash # in name");
               subtest inner => sub { plan tests => 1; ok(1, "inner") };
               done_testing;"#,
        );
        let r = parse_tap(&tap).unwrap();
        assert_eq!(
            outcomes(&r),
            vec![
                ("adds", TestOutcome::Passed),
                ("subtracts", TestOutcome::Failed),
                ("test 3", TestOutcome::Skipped),
                ("flies", TestOutcome::Skipped),
                ("hash # in name", TestOutcome::Passed),
                ("inner", TestOutcome::Passed),
            ],
            "{}",
            String::from_utf8_lossy(&tap)
        );
        assert_eq!(r.cases[2].message.as_deref(), Some("SKIP: no network"));
        assert_eq!(
            r.cases[3].message.as_deref(),
            Some("TODO (expected failure): not yet")
        );
        assert_eq!((r.passed(), r.failed(), r.skipped()), (3, 1, 2));
    }

    #[test]
    fn test_more_failure_diagnostics_attach_to_the_failure() {
        // Test::More prints diagnostics to stderr; emitted in order via a single handle here.
        let tap = perl_tap(
            r#"Test::More->builder->failure_output(\*STDOUT); is(2, 3, "subtracts"); done_testing;"#,
        );
        let r = parse_tap(&tap).unwrap();
        assert_eq!(r.failed(), 1);
        let m = r.cases[0].message.as_deref().unwrap();
        assert!(m.contains("got: '2'") && m.contains("expected: '3'"), "{m}");
    }

    #[test]
    fn bail_out_and_plan_mismatches_are_failures() {
        let tap = perl_tap(r#"plan tests => 3; ok(1, "a"); BAIL_OUT("database gone");"#);
        let r = parse_tap(&tap).unwrap();
        assert_eq!(r.passed(), 1);
        let last = r.cases.last().unwrap();
        assert_eq!(
            (last.name.as_str(), last.outcome),
            (TAP_BAIL_CASE, TestOutcome::Error)
        );
        assert_eq!(last.message.as_deref(), Some("database gone"));

        // the planned count was not reached (process died part-way)
        let tap = perl_tap(r#"plan tests => 3; ok(1, "a"); exit 0;"#);
        let r = parse_tap(&tap).unwrap();
        assert_eq!(r.failed(), 1);
        assert_eq!(r.cases.last().unwrap().name, TAP_PLAN_CASE);
        assert!(r
            .cases
            .last()
            .unwrap()
            .message
            .as_deref()
            .unwrap()
            .contains("planned 3"));

        // no plan at all: a truncated stream
        let r = parse_tap(b"ok 1 - a\nok 2 - b\n").unwrap();
        assert_eq!((r.passed(), r.failed()), (2, 1));

        // skip-all plan: no cases, no failure
        let r = parse_tap(b"TAP version 14\n1..0 # SKIP no database\n").unwrap();
        assert!(r.cases.is_empty());

        // two plans
        let r = parse_tap(b"1..1\nok 1\n1..1\n").unwrap();
        assert_eq!(r.failed(), 1);
    }

    #[test]
    fn tap_edge_lines() {
        let r = parse_tap(
            b"TAP version 13\r\n1..4\r\nok\r\nokay this is not a test\r\nnot ok 2 # skip nope\r\nok 3 - x # TODO later\r\n  ---\r\n  message: yaml\r\n  ...\r\nok 4 - y # SKIPPED: slow\r\n",
        )
        .unwrap();
        assert_eq!(
            outcomes(&r),
            vec![
                ("test 1", TestOutcome::Passed),
                ("test 2", TestOutcome::Failed),
                ("x", TestOutcome::Passed),
                ("y", TestOutcome::Skipped),
            ]
        );
        assert_eq!(r.cases[3].message.as_deref(), Some("SKIP: slow"));
        assert!(parse_tap(b"").is_err());
        assert!(parse_tap(b"hello\nworld\n").is_err());
        assert!(parse_tap(b"TAP version 99\n1..0\n").is_err());
        // non-UTF-8 descriptions are kept lossily, control characters neutralised
        let r = parse_tap(b"1..1\nok 1 - caf\xe9 \x1b[2J\n").unwrap();
        assert!(!r.cases[0].name.contains('\x1b'));
        assert!(r.cases[0].name.starts_with("caf"));
    }

    #[test]
    fn tap_caps_case_count() {
        let mut s = String::from("1..999999\n");
        for _ in 0..=MAX_TEST_CASES {
            s.push_str("ok\n");
        }
        assert!(matches!(
            parse_tap(s.as_bytes()),
            Err(ResultsError::Tap { .. })
        ));
    }
}
