//! Rust libtest's JSON event stream (`cargo test -- -Z unstable-options --format json`):
//! one suite per test binary, and a binary that died mid-suite is never a pass.

use serde::Deserialize;

use super::events::{json_lines, Attempt, CaseTable};
use super::{push_bounded, ResultsError, TestCase, TestOutcome, TestReport, MAX_TEST_CASES};

/// The name of the synthetic case recording a libtest suite that did not end properly.
pub const LIBTEST_SUITE_CASE: &str = "libtest suite";

#[derive(Deserialize)]
struct LibtestEvent {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    event: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    test_count: Option<u64>,
    #[serde(default)]
    exec_time: Option<f64>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    stdout: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

/// One test binary's run.
struct LibtestSuite {
    number: usize,
    line: usize,
    test_count: Option<u64>,
    reported: u64,
    /// Cases started in this suite (indices into the table), checked when it closes.
    started: Vec<usize>,
}

/// Parse Rust libtest's JSON output (`cargo test -- -Z unstable-options --format json`,
/// which needs a nightly toolchain or `RUSTC_BOOTSTRAP=1`): `{"type":"suite",…}` lines
/// delimit one test binary each, `{"type":"test","event":"ok"|"failed"|"ignored",…}` lines
/// are cases (`started` and `timeout` events carry no outcome; `bench` lines count towards
/// the suite but are not cases). A failure's message is its `message` (e.g. "test did not
/// panic as expected"), then its captured `stdout` (the panic text); an ignored test's is
/// the `#[ignore = "…"]` reason; `exec_time` (with `--report-time`) is the duration.
///
/// A test binary that crashes (abort, signal, OOM kill) leaves its suite without the closing
/// line: tests it started become [`TestOutcome::Error`], and a synthetic Error case named
/// [`LIBTEST_SUITE_CASE`] says how many of the announced tests reported. The same happens
/// when a suite closes with fewer results than its `test_count`. Cases are keyed by suite and
/// name, so the same name in two binaries gives two cases; a name reported twice in one suite
/// is retried (Flaky when a failure is followed by a pass). Lines that are not JSON objects
/// with a `type` are ignored (`--nocapture` output); a stream with no event is an error.
pub fn parse_libtest_json(text: &[u8]) -> Result<TestReport, ResultsError> {
    let text = String::from_utf8_lossy(text);
    let mut table: CaseTable<(usize, String)> = CaseTable::new();
    let mut suite: Option<LibtestSuite> = None;
    let mut suites_seen = 0usize;
    let mut synthetic: Vec<TestCase> = Vec::new();
    let mut events = 0usize;
    let too_many = |line: usize| ResultsError::LibtestJson {
        line,
        message: format!("more than {MAX_TEST_CASES} tests; refusing an oversized report"),
    };

    // Close `s`: flag its unfinished tests and, if it fell short, add a synthetic case.
    fn close_suite(
        s: LibtestSuite,
        summary: bool,
        table: &mut CaseTable<(usize, String)>,
        synthetic: &mut Vec<TestCase>,
    ) {
        for &i in &s.started {
            let c = &mut table.cases[i];
            if c.running {
                c.unfinished = Some(if summary {
                    "started but the suite ended without its result".into()
                } else {
                    "started but never finished: the test binary crashed, was killed or timed out"
                        .into()
                });
            }
        }
        let count = s.test_count.map(|c| format!(" of {c}")).unwrap_or_default();
        let problem = if !summary {
            Some(format!(
                "suite {} (started at line {}) has no closing line after {}{count} test(s) reported; the test binary crashed or was killed",
                s.number, s.line, s.reported
            ))
        } else if s.test_count.is_some_and(|c| c != s.reported) {
            Some(format!(
                "suite {} (started at line {}) announced {} test(s) but {} reported",
                s.number,
                s.line,
                s.test_count.unwrap_or(0),
                s.reported
            ))
        } else {
            None
        };
        if let Some(message) = problem {
            if synthetic.len() < MAX_TEST_CASES {
                synthetic.push(TestCase {
                    name: LIBTEST_SUITE_CASE.into(),
                    classname: None,
                    outcome: TestOutcome::Error,
                    time_s: None,
                    message: Some(message),
                });
            }
        }
    }

    for (lineno, line) in json_lines(&text) {
        if !line.starts_with('{') {
            continue;
        }
        let Ok(ev) = serde_json::from_str::<LibtestEvent>(line) else {
            continue;
        };
        events += 1;
        let event = ev.event.as_deref().unwrap_or("");
        match ev.kind.as_str() {
            "suite" => match event {
                "started" => {
                    if let Some(s) = suite.take() {
                        close_suite(s, false, &mut table, &mut synthetic);
                    }
                    suites_seen += 1;
                    suite = Some(LibtestSuite {
                        number: suites_seen,
                        line: lineno,
                        test_count: ev.test_count,
                        reported: 0,
                        started: Vec::new(),
                    });
                }
                "ok" | "failed" => {
                    if let Some(s) = suite.take() {
                        close_suite(s, true, &mut table, &mut synthetic);
                    }
                }
                _ => {}
            },
            "test" | "bench" => {
                let Some(name) = ev.name.as_deref() else {
                    continue;
                };
                let attempt = match (ev.kind.as_str(), event) {
                    ("bench", _) => {
                        if let Some(s) = suite.as_mut() {
                            s.reported += 1;
                        }
                        continue;
                    }
                    (_, "started") => None,
                    (_, "ok") => Some(Attempt::Pass),
                    (_, "failed") => Some(Attempt::Fail),
                    (_, "ignored") => Some(Attempt::Skip),
                    _ => continue, // "timeout" (still running after 60 s) and future events
                };
                let key = (suite.as_ref().map_or(0, |s| s.number), name.to_string());
                let slot = table
                    .slot(key, || name.to_string())
                    .ok_or_else(|| too_many(lineno))?;
                let case = &mut table.cases[slot];
                match attempt {
                    None => {
                        if !case.running {
                            if let Some(s) = suite.as_mut() {
                                s.started.push(slot);
                            }
                        }
                        case.start();
                    }
                    Some(a) => {
                        let mut message = String::new();
                        for part in [&ev.message, &ev.reason, &ev.stdout].into_iter().flatten() {
                            if !part.trim().is_empty() {
                                if !message.is_empty() {
                                    message.push('\n');
                                }
                                push_bounded(&mut message, part.trim());
                            }
                        }
                        case.finish(a, ev.exec_time, Some(&message));
                        if let Some(s) = suite.as_mut() {
                            s.reported += 1;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    if let Some(s) = suite.take() {
        close_suite(s, false, &mut table, &mut synthetic);
    }
    if events == 0 {
        return Err(ResultsError::LibtestJson {
            line: 1,
            message: "no libtest event (a JSON object with a `type` field) in the stream; run the tests with `-- -Z unstable-options --format json`".into(),
        });
    }
    let mut report = TestReport {
        cases: table.into_cases(),
    };
    report.cases.extend(synthetic);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::results::outcomes;

    /// REAL output, captured on this host (rustc 1.95.0) from a throwaway crate with a lib
    /// test module, a `tests/crash.rs` whose second test calls `std::process::abort()`, and a
    /// `tests/it.rs`:
    /// `RUSTC_BOOTSTRAP=1 RUST_BACKTRACE=0 cargo test --no-fail-fast --
    ///  -Z unstable-options --format json --report-time --test-threads=1`
    /// (the abort kills the second binary mid-suite: it never prints its closing line).
    const LIBTEST_SERIAL: &str = r#"{ "type": "suite", "event": "started", "test_count": 7 }
{ "type": "test", "event": "started", "name": "tests::adds" }
{ "type": "test", "name": "tests::adds", "event": "ok", "exec_time": 0.000001135 }
{ "type": "test", "event": "started", "name": "tests::fails" }
{ "type": "test", "name": "tests::fails", "event": "failed", "exec_time": 0.000073137, "stdout": "some \"quoted\" stdout\n\nthread 'tests::fails' (32716) panicked at src/lib.rs:15:9:\nassertion `left == right` failed: math is broken\n  left: 4\n right: 5\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n" }
{ "type": "test", "event": "started", "name": "tests::ignored_plain" }
{ "type": "test", "name": "tests::ignored_plain", "event": "ignored" }
{ "type": "test", "event": "started", "name": "tests::ignored_with_reason" }
{ "type": "test", "name": "tests::ignored_with_reason", "event": "ignored", "message": "needs a GPU" }
{ "type": "test", "event": "started", "name": "tests::panics_as_expected" }
{ "type": "test", "name": "tests::panics_as_expected", "event": "ok", "exec_time": 0.000027363 }
{ "type": "test", "event": "started", "name": "tests::returns_err" }
{ "type": "test", "name": "tests::returns_err", "event": "failed", "exec_time": 0.000007574, "stdout": "Error: \"bad \\u{1b}[31mred\\u{1b}[0m input\"\n" }
{ "type": "test", "event": "started", "name": "tests::should_panic_but_does_not" }
{ "type": "test", "name": "tests::should_panic_but_does_not", "event": "failed", "exec_time": 0.000000264, "message": "test did not panic as expected at src/lib.rs:34:8" }
{ "type": "suite", "event": "failed", "passed": 2, "failed": 3, "ignored": 2, "measured": 0, "filtered_out": 0, "exec_time": 0.005967399 }
{ "type": "suite", "event": "started", "test_count": 3 }
{ "type": "test", "event": "started", "name": "a_before_crash" }
{ "type": "test", "name": "a_before_crash", "event": "ok", "exec_time": 0.000000821 }
{ "type": "test", "event": "started", "name": "b_aborts" }
{ "type": "suite", "event": "started", "test_count": 1 }
{ "type": "test", "event": "started", "name": "integration_ok" }
{ "type": "test", "name": "integration_ok", "event": "ok", "exec_time": 0.000000842 }
{ "type": "suite", "event": "ok", "passed": 1, "failed": 0, "ignored": 0, "measured": 0, "filtered_out": 0, "exec_time": 0.00057919 }
{ "type": "suite", "event": "started", "test_count": 0 }
{ "type": "suite", "event": "ok", "passed": 0, "failed": 0, "ignored": 0, "measured": 0, "filtered_out": 0, "exec_time": 0.000036785 }
"#;

    /// REAL output of the same lib tests run in parallel (the default), captured with
    /// `cargo test --lib -- -Z unstable-options --format json`: starts and results interleave.
    const LIBTEST_PARALLEL: &str = r#"{ "type": "suite", "event": "started", "test_count": 7 }
{ "type": "test", "event": "started", "name": "tests::adds" }
{ "type": "test", "event": "started", "name": "tests::fails" }
{ "type": "test", "name": "tests::adds", "event": "ok" }
{ "type": "test", "event": "started", "name": "tests::ignored_plain" }
{ "type": "test", "name": "tests::fails", "event": "failed", "stdout": "some \"quoted\" stdout\n\nthread 'tests::fails' (4642) panicked at src/lib.rs:15:9:\nassertion `left == right` failed: math is broken\n  left: 4\n right: 5\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n" }
{ "type": "test", "event": "started", "name": "tests::ignored_with_reason" }
{ "type": "test", "name": "tests::ignored_plain", "event": "ignored" }
{ "type": "test", "event": "started", "name": "tests::panics_as_expected" }
{ "type": "test", "name": "tests::ignored_with_reason", "event": "ignored", "message": "needs a GPU" }
{ "type": "test", "event": "started", "name": "tests::returns_err" }
{ "type": "test", "name": "tests::panics_as_expected", "event": "ok" }
{ "type": "test", "event": "started", "name": "tests::should_panic_but_does_not" }
{ "type": "test", "name": "tests::returns_err", "event": "failed", "stdout": "Error: \"bad \\u{1b}[31mred\\u{1b}[0m input\"\n" }
{ "type": "test", "name": "tests::should_panic_but_does_not", "event": "failed", "message": "test did not panic as expected at src/lib.rs:34:8" }
{ "type": "suite", "event": "failed", "passed": 2, "failed": 3, "ignored": 2, "measured": 0, "filtered_out": 0, "exec_time": 0.000847951 }
"#;

    #[test]
    fn parses_real_libtest_json() {
        let lib = [
            ("tests::adds", TestOutcome::Passed),
            ("tests::fails", TestOutcome::Failed),
            ("tests::ignored_plain", TestOutcome::Skipped),
            ("tests::ignored_with_reason", TestOutcome::Skipped),
            ("tests::panics_as_expected", TestOutcome::Passed),
            ("tests::returns_err", TestOutcome::Failed),
            ("tests::should_panic_but_does_not", TestOutcome::Failed),
        ];
        let r = parse_libtest_json(LIBTEST_PARALLEL.as_bytes()).unwrap();
        assert_eq!(outcomes(&r), lib.to_vec());
        let fails = r.cases[1].message.as_deref().unwrap();
        assert!(
            fails.starts_with("some \"quoted\" stdout")
                && fails.contains("assertion `left == right` failed: math is broken"),
            "{fails}"
        );
        assert_eq!(r.cases[3].message.as_deref(), Some("needs a GPU"));
        assert_eq!(r.cases[2].message, None);
        assert_eq!(
            r.cases[6].message.as_deref(),
            Some("test did not panic as expected at src/lib.rs:34:8")
        );
        assert_eq!(r.cases[0].time_s, None, "no --report-time, no duration");

        let r = parse_libtest_json(LIBTEST_SERIAL.as_bytes()).unwrap();
        let mut want = lib.to_vec();
        want.extend([
            ("a_before_crash", TestOutcome::Passed),
            ("b_aborts", TestOutcome::Error),
            ("integration_ok", TestOutcome::Passed),
            (LIBTEST_SUITE_CASE, TestOutcome::Error),
        ]);
        assert_eq!(outcomes(&r), want);
        assert_eq!(r.cases[0].time_s, Some(0.000001135));
        assert!(r.cases[8].message.as_deref().unwrap().contains("crashed"));
        let suite = r.cases[10].message.as_deref().unwrap();
        assert!(
            suite.contains("suite 2 (started at line 17)") && suite.contains("1 of 3"),
            "{suite}"
        );
        assert_eq!((r.passed(), r.failed(), r.skipped()), (4, 5, 2));
    }

    #[test]
    fn libtest_stream_edges() {
        // Cut off after a suite started (the binary was killed before any test ran), with
        // --nocapture output and a JSON line of the test's own mixed in.
        let s = "{ \"type\": \"suite\", \"event\": \"started\", \"test_count\": 2 }\n\
                 hello from a test\n\
                 {\"msg\": \"a log line\"}\n\
                 { \"type\": \"test\", \"event\": \"started\", \"name\": \"t1\" }\n\
                 { \"type\": \"test\", \"event\": \"timeout\", \"name\": \"t1\" }\n";
        let r = parse_libtest_json(s.as_bytes()).unwrap();
        assert_eq!(
            outcomes(&r),
            vec![
                ("t1", TestOutcome::Error),
                (LIBTEST_SUITE_CASE, TestOutcome::Error)
            ]
        );
        // A suite that closes with fewer results than announced.
        let s = "{ \"type\": \"suite\", \"event\": \"started\", \"test_count\": 2 }\n\
                 { \"type\": \"test\", \"name\": \"t1\", \"event\": \"ok\" }\n\
                 { \"type\": \"suite\", \"event\": \"ok\", \"passed\": 2, \"failed\": 0 }\n";
        let r = parse_libtest_json(s.as_bytes()).unwrap();
        assert_eq!(
            outcomes(&r),
            vec![
                ("t1", TestOutcome::Passed),
                (LIBTEST_SUITE_CASE, TestOutcome::Error)
            ]
        );
        assert!(r.cases[1]
            .message
            .as_deref()
            .unwrap()
            .contains("announced 2"));
        // Benchmarks count towards the suite but are not cases; the same name in two suites
        // gives two cases; a name retried in one suite is flaky; control characters in a
        // real escape (not libtest's Debug-escaped text) are neutralised.
        let s = "{ \"type\": \"suite\", \"event\": \"started\", \"test_count\": 2 }\n\
                 { \"type\": \"bench\", \"name\": \"b1\", \"median\": 10, \"deviation\": 1 }\n\
                 { \"type\": \"test\", \"name\": \"t\", \"event\": \"ok\" }\n\
                 { \"type\": \"suite\", \"event\": \"ok\" }\n\
                 { \"type\": \"suite\", \"event\": \"started\", \"test_count\": 2 }\n\
                 { \"type\": \"test\", \"name\": \"t\", \"event\": \"failed\", \"stdout\": \"\\u001b[2Jgone\" }\n\
                 { \"type\": \"test\", \"name\": \"t\", \"event\": \"ok\" }\n\
                 { \"type\": \"suite\", \"event\": \"ok\" }\n";
        let r = parse_libtest_json(s.as_bytes()).unwrap();
        assert_eq!(
            outcomes(&r),
            vec![("t", TestOutcome::Passed), ("t", TestOutcome::Flaky)]
        );
        assert_eq!(
            r.cases[1].message.as_deref(),
            Some("passed after 1 failed attempt; first failure: \u{FFFD}[2Jgone")
        );
        // Not libtest JSON at all.
        for bad in [
            &b""[..],
            b"running 3 tests\ntest a ... ok\n",
            b"{\"event\": \"ok\"}",
        ] {
            let e = parse_libtest_json(bad).unwrap_err();
            assert!(matches!(e, ResultsError::LibtestJson { .. }), "{e}");
        }
        // Too many tests.
        let mut s = String::new();
        for i in 0..=MAX_TEST_CASES {
            s += &format!("{{\"type\":\"test\",\"name\":\"t{i}\",\"event\":\"ok\"}}\n");
        }
        let e = parse_libtest_json(s.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("oversized"), "{e}");
    }
}
