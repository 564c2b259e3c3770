//! `go test -json` (test2json) event streams: cases per package and test, reruns, and the
//! failures test2json reports outside any test (build failures, panics, timeouts).

use serde::Deserialize;

use super::events::{json_lines, Attempt, CaseTable};
use super::{
    clean, clean_message, clean_name, push_bounded, ResultsError, TestCase, TestOutcome,
    TestReport, MAX_MESSAGE_CHARS, MAX_TEST_CASES,
};

/// One test2json event (`go doc cmd/test2json`); other fields (Time, ImportPath, …) are
/// ignored.
#[derive(Deserialize)]
struct GoEvent {
    #[serde(rename = "Action")]
    action: String,
    #[serde(rename = "Package", default)]
    package: String,
    #[serde(rename = "Test", default)]
    test: String,
    #[serde(rename = "Elapsed", default)]
    elapsed: Option<f64>,
    #[serde(rename = "Output", default)]
    output: Option<String>,
    #[serde(rename = "FailedBuild", default)]
    failed_build: Option<String>,
}

/// Per-package state of a `go test -json` stream.
#[derive(Default)]
struct GoPackage {
    /// The last package-level result: `Some(true)` pass/skip, `Some(false)` fail.
    passed: Option<bool>,
    started: bool,
    /// A test event named this package.
    tests_seen: bool,
    /// One of its tests failed an attempt or never finished.
    explained: bool,
    output: String,
    failed_build: Option<String>,
}

/// The framing lines test2json's input carries for every test; not part of a message.
fn go_framing(line: &str) -> bool {
    let l = line.trim_start();
    [
        "=== RUN",
        "=== PAUSE",
        "=== CONT",
        "=== NAME",
        "=== ATTR",
        "--- PASS",
        "--- FAIL",
        "--- SKIP",
    ]
    .iter()
    .any(|p| l.starts_with(p))
}

/// The suffix of the synthetic case recording a package failure no test explains
/// (`"<package> (package)"`).
pub const GO_PACKAGE_CASE_SUFFIX: &str = " (package)";

/// Parse a `go test -json` event stream (one test2json `TestEvent` object per line).
///
/// Every event with a `Test` field belongs to that test (subtests `Parent/Sub` are cases of
/// their own, and so is the parent); events without one are package-level and are not cases.
/// Cases are named `<Package>.<Test>` (just `<Test>` without a package). `run` starts an
/// attempt and `pass`/`fail`/`skip` end it; a test run more than once (`-count`, or a rerun
/// tool concatenating streams) is [`TestOutcome::Flaky`] when an attempt failed and the last
/// passed, and Failed when the last failed. The output of a failed or skipped attempt (minus
/// the `=== RUN`/`--- FAIL` framing lines) becomes its message.
///
/// Failures are never lost: a test that starts but never finishes (a timeout, a panic in
/// another goroutine, a killed binary) is an [`TestOutcome::Error`]; a package whose last
/// result is `fail` with no failing test to explain it (a build failure, `TestMain`, a panic
/// outside tests), or that started and never reported a result, adds one Error case named
/// `<Package> (package)`. Benchmarks appear only when they fail or are skipped (test2json
/// gives them no `run`). Lines that are not JSON objects with an `Action` are ignored (build
/// noise on a merged stream); a stream with no event at all is an error.
pub fn parse_go_test_json(text: &[u8]) -> Result<TestReport, ResultsError> {
    let text = String::from_utf8_lossy(text);
    let mut table: CaseTable<(String, String)> = CaseTable::new();
    let mut packages: Vec<(String, GoPackage)> = Vec::new();
    let mut package_index: std::collections::HashMap<String, usize> =
        std::collections::HashMap::new();
    let mut events = 0usize;
    let too_many = |line: usize| ResultsError::GoTestJson {
        line,
        message: format!(
            "more than {MAX_TEST_CASES} tests or packages; refusing an oversized report"
        ),
    };

    for (lineno, line) in json_lines(&text) {
        if !line.starts_with('{') {
            continue;
        }
        let Ok(ev) = serde_json::from_str::<GoEvent>(line) else {
            continue;
        };
        events += 1;
        let pkg_slot = match package_index.get(&ev.package) {
            Some(&i) => i,
            None => {
                if packages.len() >= MAX_TEST_CASES {
                    return Err(too_many(lineno));
                }
                packages.push((ev.package.clone(), GoPackage::default()));
                package_index.insert(ev.package.clone(), packages.len() - 1);
                packages.len() - 1
            }
        };
        if ev.test.is_empty() {
            let pkg = &mut packages[pkg_slot].1;
            match ev.action.as_str() {
                "start" => {
                    pkg.started = true;
                    pkg.output.clear();
                }
                "output" => {
                    if let Some(o) = &ev.output {
                        push_bounded(&mut pkg.output, o);
                    }
                }
                "pass" | "skip" => pkg.passed = Some(true),
                "fail" => {
                    pkg.passed = Some(false);
                    if let Some(b) = ev.failed_build.as_deref().filter(|b| !b.is_empty()) {
                        pkg.failed_build = Some(b.to_string());
                    }
                }
                _ => {}
            }
            continue;
        }
        packages[pkg_slot].1.tests_seen = true;
        let package = ev.package.clone();
        let test = ev.test.clone();
        let slot = table
            .slot((ev.package, ev.test), || {
                if package.is_empty() {
                    test
                } else {
                    format!("{package}.{test}")
                }
            })
            .ok_or_else(|| too_many(lineno))?;
        let case = &mut table.cases[slot];
        match ev.action.as_str() {
            "run" => case.start(),
            "output" => {
                if let Some(o) = ev.output {
                    if !go_framing(&o) {
                        push_bounded(&mut case.output, &o);
                    }
                }
            }
            "pass" => case.finish(Attempt::Pass, ev.elapsed, None),
            "fail" => case.finish(Attempt::Fail, ev.elapsed, None),
            "skip" => case.finish(Attempt::Skip, ev.elapsed, None),
            // pause, cont, bench, attr and future actions carry no outcome.
            _ => {}
        }
    }
    if events == 0 {
        return Err(ResultsError::GoTestJson {
            line: 1,
            message: "no test2json event (a JSON object with an `Action` field) in the stream; was the task run with `go test -json`?".into(),
        });
    }

    // A package failure is explained by a test of its own that failed or never finished.
    for ((pkg, _), &i) in &table.index {
        let c = &table.cases[i];
        if c.fails > 0 || c.running {
            if let Some(&p) = package_index.get(pkg) {
                packages[p].1.explained = true;
            }
        }
    }
    let mut report = TestReport {
        cases: table.into_cases(),
    };
    for (name, pkg) in packages {
        let problem = match pkg.passed {
            Some(false) if !pkg.explained => Some(match &pkg.failed_build {
                Some(b) => format!("build failed ({b})"),
                None => "the package failed but none of its tests did (TestMain, init, a panic outside tests, or the test binary exited)".into(),
            }),
            None if pkg.started || pkg.tests_seen => Some(
                "the stream ends before the package's final pass/fail event; it is truncated"
                    .into(),
            ),
            _ => None,
        };
        if let Some(p) = problem {
            let mut m = p;
            if let Some(out) = clean_message(&pkg.output) {
                m.push_str(": ");
                m.push_str(&out);
            }
            let shown = if name.is_empty() { "package" } else { &name };
            report.cases.push(TestCase {
                name: clean_name(&format!("{shown}{GO_PACKAGE_CASE_SUFFIX}")),
                classname: None,
                outcome: TestOutcome::Error,
                time_s: None,
                message: Some(clean(&m, MAX_MESSAGE_CHARS, true)),
            });
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::results::outcomes;

    /// There is no Go toolchain on this host, so these streams are written by hand, modelled
    /// exactly on the documented test2json format (`go doc cmd/test2json`: one `TestEvent`
    /// per line with Time, Action, Package, Test, Elapsed, Output, and since Go 1.24
    /// FailedBuild and the `build-output`/`build-fail` events keyed by ImportPath) and on the
    /// shapes of Go's own test2json testdata (parallel tests pausing and continuing, output
    /// after `--- PASS` lines, a timeout leaving a test without a result).
    const GO_STREAM: &str = r#"{"Time":"2025-01-31T12:00:00.100000+01:00","Action":"start","Package":"example.com/hermes/gateway"}
{"Time":"2025-01-31T12:00:00.101000+01:00","Action":"run","Package":"example.com/hermes/gateway","Test":"TestRoute"}
{"Time":"2025-01-31T12:00:00.101100+01:00","Action":"output","Package":"example.com/hermes/gateway","Test":"TestRoute","Output":"=== RUN   TestRoute\n"}
{"Time":"2025-01-31T12:00:00.101200+01:00","Action":"output","Package":"example.com/hermes/gateway","Test":"TestRoute","Output":"=== PAUSE TestRoute\n"}
{"Time":"2025-01-31T12:00:00.101300+01:00","Action":"pause","Package":"example.com/hermes/gateway","Test":"TestRoute"}
{"Time":"2025-01-31T12:00:00.102000+01:00","Action":"run","Package":"example.com/hermes/gateway","Test":"TestReconnect"}
{"Time":"2025-01-31T12:00:00.102100+01:00","Action":"output","Package":"example.com/hermes/gateway","Test":"TestReconnect","Output":"=== RUN   TestReconnect\n"}
{"Time":"2025-01-31T12:00:00.152000+01:00","Action":"output","Package":"example.com/hermes/gateway","Test":"TestReconnect","Output":"    gateway_test.go:41: dial 127.0.0.1:4222: connection refused\n"}
{"Time":"2025-01-31T12:00:00.152100+01:00","Action":"output","Package":"example.com/hermes/gateway","Test":"TestReconnect","Output":"--- FAIL: TestReconnect (0.05s)\n"}
{"Time":"2025-01-31T12:00:00.152200+01:00","Action":"fail","Package":"example.com/hermes/gateway","Test":"TestReconnect","Elapsed":0.05}
{"Time":"2025-01-31T12:00:00.153000+01:00","Action":"run","Package":"example.com/hermes/gateway","Test":"TestTLS"}
{"Time":"2025-01-31T12:00:00.153100+01:00","Action":"output","Package":"example.com/hermes/gateway","Test":"TestTLS","Output":"=== RUN   TestTLS\n"}
{"Time":"2025-01-31T12:00:00.153200+01:00","Action":"output","Package":"example.com/hermes/gateway","Test":"TestTLS","Output":"    gateway_test.go:77: no certificates in testdata\n"}
{"Time":"2025-01-31T12:00:00.153300+01:00","Action":"output","Package":"example.com/hermes/gateway","Test":"TestTLS","Output":"--- SKIP: TestTLS (0.00s)\n"}
{"Time":"2025-01-31T12:00:00.153400+01:00","Action":"skip","Package":"example.com/hermes/gateway","Test":"TestTLS","Elapsed":0}
{"Time":"2025-01-31T12:00:00.154000+01:00","Action":"cont","Package":"example.com/hermes/gateway","Test":"TestRoute"}
{"Time":"2025-01-31T12:00:00.154100+01:00","Action":"output","Package":"example.com/hermes/gateway","Test":"TestRoute","Output":"=== CONT  TestRoute\n"}
{"Time":"2025-01-31T12:00:00.154200+01:00","Action":"run","Package":"example.com/hermes/gateway","Test":"TestRoute/ipv4"}
{"Time":"2025-01-31T12:00:00.154300+01:00","Action":"output","Package":"example.com/hermes/gateway","Test":"TestRoute/ipv4","Output":"=== RUN   TestRoute/ipv4\n"}
{"Time":"2025-01-31T12:00:00.154400+01:00","Action":"run","Package":"example.com/hermes/gateway","Test":"TestRoute/ipv6"}
{"Time":"2025-01-31T12:00:00.154500+01:00","Action":"output","Package":"example.com/hermes/gateway","Test":"TestRoute/ipv6","Output":"=== RUN   TestRoute/ipv6\n"}
{"Time":"2025-01-31T12:00:00.160000+01:00","Action":"output","Package":"example.com/hermes/gateway","Test":"TestRoute","Output":"--- PASS: TestRoute (0.01s)\n"}
{"Time":"2025-01-31T12:00:00.160100+01:00","Action":"output","Package":"example.com/hermes/gateway","Test":"TestRoute/ipv4","Output":"    --- PASS: TestRoute/ipv4 (0.00s)\n"}
{"Time":"2025-01-31T12:00:00.160200+01:00","Action":"pass","Package":"example.com/hermes/gateway","Test":"TestRoute/ipv4","Elapsed":0}
{"Time":"2025-01-31T12:00:00.160300+01:00","Action":"output","Package":"example.com/hermes/gateway","Test":"TestRoute/ipv6","Output":"    --- PASS: TestRoute/ipv6 (0.00s)\n"}
{"Time":"2025-01-31T12:00:00.160400+01:00","Action":"pass","Package":"example.com/hermes/gateway","Test":"TestRoute/ipv6","Elapsed":0}
{"Time":"2025-01-31T12:00:00.160500+01:00","Action":"pass","Package":"example.com/hermes/gateway","Test":"TestRoute","Elapsed":0.01}
{"Time":"2025-01-31T12:00:00.161000+01:00","Action":"run","Package":"example.com/hermes/gateway","Test":"ExampleRouter"}
{"Time":"2025-01-31T12:00:00.161100+01:00","Action":"output","Package":"example.com/hermes/gateway","Test":"ExampleRouter","Output":"=== RUN   ExampleRouter\n"}
{"Time":"2025-01-31T12:00:00.161200+01:00","Action":"output","Package":"example.com/hermes/gateway","Test":"ExampleRouter","Output":"--- PASS: ExampleRouter (0.00s)\n"}
{"Time":"2025-01-31T12:00:00.161300+01:00","Action":"pass","Package":"example.com/hermes/gateway","Test":"ExampleRouter","Elapsed":0}
{"Time":"2025-01-31T12:00:00.161400+01:00","Action":"output","Package":"example.com/hermes/gateway","Output":"FAIL\n"}
{"Time":"2025-01-31T12:00:00.162000+01:00","Action":"output","Package":"example.com/hermes/gateway","Output":"FAIL\texample.com/hermes/gateway\t0.062s\n"}
{"Time":"2025-01-31T12:00:00.162100+01:00","Action":"fail","Package":"example.com/hermes/gateway","Elapsed":0.062}
{"Time":"2025-01-31T12:00:00.170000+01:00","Action":"start","Package":"example.com/hermes/store"}
{"Action":"run","Package":"example.com/hermes/store","Test":"TestCompress"}
{"Action":"output","Package":"example.com/hermes/store","Test":"TestCompress","Output":"=== RUN   TestCompress\n"}
{"Action":"output","Package":"example.com/hermes/store","Test":"TestCompress","Output":"--- PASS: TestCompress (0.31s)\n"}
{"Action":"pass","Package":"example.com/hermes/store","Test":"TestCompress","Elapsed":0.31}
{"Action":"output","Package":"example.com/hermes/store","Output":"PASS\n"}
{"Action":"output","Package":"example.com/hermes/store","Output":"ok  \texample.com/hermes/store\t(cached)\n"}
{"Action":"pass","Package":"example.com/hermes/store","Elapsed":0}
{"Time":"2025-01-31T12:00:00.180000+01:00","Action":"start","Package":"example.com/hermes/docs"}
{"Time":"2025-01-31T12:00:00.180100+01:00","Action":"output","Package":"example.com/hermes/docs","Output":"?   \texample.com/hermes/docs\t[no test files]\n"}
{"Time":"2025-01-31T12:00:00.180200+01:00","Action":"skip","Package":"example.com/hermes/docs","Elapsed":0}
"#;

    fn go_ev(action: &str, pkg: &str, test: &str, extra: &str) -> String {
        let test = if test.is_empty() {
            String::new()
        } else {
            format!(r#","Test":"{test}""#)
        };
        format!(
            r#"{{"Time":"2025-01-31T12:00:00Z","Action":"{action}","Package":"{pkg}"{test}{extra}}}"#
        ) + "\n"
    }

    #[test]
    fn parses_go_test_json() {
        let r = parse_go_test_json(GO_STREAM.as_bytes()).unwrap();
        let gw = "example.com/hermes/gateway.";
        assert_eq!(
            outcomes(&r),
            vec![
                (&*format!("{gw}TestRoute"), TestOutcome::Passed),
                (&*format!("{gw}TestReconnect"), TestOutcome::Failed),
                (&*format!("{gw}TestTLS"), TestOutcome::Skipped),
                (&*format!("{gw}TestRoute/ipv4"), TestOutcome::Passed),
                (&*format!("{gw}TestRoute/ipv6"), TestOutcome::Passed),
                (&*format!("{gw}ExampleRouter"), TestOutcome::Passed),
                ("example.com/hermes/store.TestCompress", TestOutcome::Passed),
            ]
        );
        // The failure message is the test's own output without the framing lines.
        assert_eq!(
            r.cases[1].message.as_deref(),
            Some("gateway_test.go:41: dial 127.0.0.1:4222: connection refused")
        );
        assert_eq!(r.cases[1].time_s, Some(0.05));
        assert_eq!(
            r.cases[2].message.as_deref(),
            Some("gateway_test.go:77: no certificates in testdata")
        );
        assert_eq!(r.cases[6].time_s, Some(0.31));
        assert_eq!((r.passed(), r.failed(), r.skipped()), (5, 1, 1));
    }

    #[test]
    fn go_reruns_are_flaky_and_final_failures_fail() {
        // `go test -count=2`: one package run, the test runs twice, the package fails.
        let pkg = "example.com/m";
        let mut s = go_ev("start", pkg, "", "");
        s += &go_ev("run", pkg, "TestFlaky", "");
        s += &go_ev(
            "output",
            pkg,
            "TestFlaky",
            r#","Output":"    f_test.go:9: timed out waiting for lock\n""#,
        );
        s += &go_ev("fail", pkg, "TestFlaky", r#","Elapsed":0.2"#);
        s += &go_ev("run", pkg, "TestSteady", "");
        s += &go_ev("pass", pkg, "TestSteady", r#","Elapsed":0.1"#);
        s += &go_ev("run", pkg, "TestFlaky", "");
        s += &go_ev("pass", pkg, "TestFlaky", r#","Elapsed":0.1"#);
        s += &go_ev("run", pkg, "TestSteady", "");
        s += &go_ev("pass", pkg, "TestSteady", r#","Elapsed":0.1"#);
        s += &go_ev("run", pkg, "TestBroken", "");
        s += &go_ev("pass", pkg, "TestBroken", "");
        s += &go_ev("run", pkg, "TestBroken", "");
        s += &go_ev("fail", pkg, "TestBroken", "");
        s += &go_ev("fail", pkg, "", r#","Elapsed":0.5"#);
        let r = parse_go_test_json(s.as_bytes()).unwrap();
        assert_eq!(
            outcomes(&r),
            vec![
                ("example.com/m.TestFlaky", TestOutcome::Flaky),
                ("example.com/m.TestSteady", TestOutcome::Passed),
                ("example.com/m.TestBroken", TestOutcome::Failed),
            ],
            "the package failure is explained by its tests: no synthetic case"
        );
        assert_eq!(
            r.cases[0].message.as_deref(),
            Some("passed after 1 failed attempt; first failure: f_test.go:9: timed out waiting for lock")
        );
        assert_eq!(r.cases[0].time_s, Some(0.1));
        assert!(r.cases[2]
            .message
            .as_deref()
            .unwrap()
            .starts_with("failed the last attempt (1 of 2 failed)"));

        // A rerun tool concatenating two `go test -json` runs: the package fails, then passes.
        let mut s = go_ev("start", pkg, "", "");
        s += &go_ev("run", pkg, "TestFlaky", "");
        s += &go_ev("fail", pkg, "TestFlaky", "");
        s += &go_ev("run", pkg, "TestOther", "");
        s += &go_ev("pass", pkg, "TestOther", "");
        s += &go_ev("fail", pkg, "", "");
        s += &go_ev("start", pkg, "", "");
        s += &go_ev("run", pkg, "TestFlaky", "");
        s += &go_ev("pass", pkg, "TestFlaky", "");
        s += &go_ev("pass", pkg, "", "");
        let r = parse_go_test_json(s.as_bytes()).unwrap();
        assert_eq!(
            outcomes(&r),
            vec![
                ("example.com/m.TestFlaky", TestOutcome::Flaky),
                ("example.com/m.TestOther", TestOutcome::Passed),
            ]
        );
    }

    #[test]
    fn go_failures_outside_tests_are_never_lost() {
        // A timeout (as in Go's test2json testdata/timeout.json): the running test has no
        // result, the package fails.
        let pkg = "example.com/slow";
        let mut s = go_ev("start", pkg, "", "");
        s += &go_ev("run", pkg, "TestHang", "");
        s += &go_ev(
            "output",
            pkg,
            "TestHang",
            r#","Output":"=== RUN   TestHang\n""#,
        );
        s += &go_ev(
            "output",
            pkg,
            "TestHang",
            r#","Output":"panic: test timed out after 10m0s\n""#,
        );
        s += &go_ev(
            "output",
            pkg,
            "",
            r#","Output":"FAIL\texample.com/slow\t600.011s\n""#,
        );
        s += &go_ev("fail", pkg, "", r#","Elapsed":600.011"#);
        // A build failure (Go 1.24+: build events keyed by ImportPath, then FailedBuild).
        let broken = "example.com/broken";
        s += r##"{"ImportPath":"example.com/broken [example.com/broken.test]","Action":"build-output","Output":"# example.com/broken\n"}"##;
        s += "\n";
        s += r#"{"ImportPath":"example.com/broken [example.com/broken.test]","Action":"build-output","Output":"./b.go:3:1: syntax error: non-declaration statement outside function body\n"}"#;
        s += "\n";
        s += r#"{"ImportPath":"example.com/broken [example.com/broken.test]","Action":"build-fail"}"#;
        s += "\n";
        s += &go_ev("start", broken, "", "");
        s += &go_ev(
            "output",
            broken,
            "",
            r#","Output":"FAIL\texample.com/broken [build failed]\n""#,
        );
        s += &go_ev(
            "fail",
            broken,
            "",
            r#","Elapsed":0,"FailedBuild":"example.com/broken [example.com/broken.test]""#,
        );
        // TestMain calls os.Exit(1) after every test passed.
        let main = "example.com/main";
        s += &go_ev("start", main, "", "");
        s += &go_ev("run", main, "TestA", "");
        s += &go_ev("pass", main, "TestA", "");
        s += &go_ev(
            "output",
            main,
            "",
            r#","Output":"FAIL\texample.com/main\t0.003s\n""#,
        );
        s += &go_ev("fail", main, "", "");
        // A stream cut off mid-package (the task was killed).
        let cut = "example.com/cut";
        s += &go_ev("start", cut, "", "");
        s += &go_ev("run", cut, "TestDone", "");
        s += &go_ev("pass", cut, "TestDone", "");
        let r = parse_go_test_json(s.as_bytes()).unwrap();
        assert_eq!(
            outcomes(&r),
            vec![
                ("example.com/slow.TestHang", TestOutcome::Error),
                ("example.com/main.TestA", TestOutcome::Passed),
                ("example.com/cut.TestDone", TestOutcome::Passed),
                ("example.com/broken (package)", TestOutcome::Error),
                ("example.com/main (package)", TestOutcome::Error),
                ("example.com/cut (package)", TestOutcome::Error),
            ]
        );
        let msg = |i: usize| r.cases[i].message.clone().unwrap();
        assert!(msg(0).contains("never finished") && msg(0).contains("test timed out after 10m0s"));
        assert!(msg(3).starts_with("build failed (example.com/broken [example.com/broken.test])"));
        assert!(msg(3).contains("[build failed]"));
        assert!(msg(4).contains("none of its tests did"));
        assert!(msg(5).contains("truncated"));
    }

    #[test]
    fn go_stream_edges() {
        // Benchmarks: output with a Test name but no run/pass; only failures become cases.
        let pkg = "example.com/b";
        let mut s = String::from("go: downloading example.com/dep v1.0.0\n\n");
        s += &go_ev("start", pkg, "", "");
        s += &go_ev(
            "output",
            pkg,
            "BenchmarkLog",
            r#","Output":"    b_test.go:5: log line\n""#,
        );
        s += &go_ev("bench", pkg, "BenchmarkLog", "");
        s += &go_ev(
            "output",
            pkg,
            "",
            r#","Output":"BenchmarkLog-2 \t 1000\t 1200 ns/op\n""#,
        );
        s += &go_ev(
            "output",
            pkg,
            "BenchmarkBad",
            r#","Output":"    b_test.go:9: wrong \u001b[2J answer\n""#,
        );
        s += &go_ev("fail", pkg, "BenchmarkBad", "");
        s += "{not json at all\n";
        s += r#"{"level":"info","msg":"a JSON log line from a test, no Action"}"#;
        s += "\n";
        s += &go_ev("fail", pkg, "", "");
        let r = parse_go_test_json(s.as_bytes()).unwrap();
        assert_eq!(
            outcomes(&r),
            vec![("example.com/b.BenchmarkBad", TestOutcome::Failed)]
        );
        assert_eq!(
            r.cases[0].message.as_deref(),
            Some("b_test.go:9: wrong \u{FFFD}[2J answer")
        );
        // go tool test2json without -p: no Package at all.
        let r = parse_go_test_json(
            b"{\"Action\":\"run\",\"Test\":\"TestX\"}\n{\"Action\":\"pass\",\"Test\":\"TestX\"}\n{\"Action\":\"pass\"}\n",
        )
        .unwrap();
        assert_eq!(outcomes(&r), vec![("TestX", TestOutcome::Passed)]);
        // Not a test2json stream at all.
        for bad in [
            &b""[..],
            b"ok  \texample.com/m\t0.01s\n",
            b"{\"Test\":\"x\"}\n",
        ] {
            let e = parse_go_test_json(bad).unwrap_err();
            assert!(matches!(e, ResultsError::GoTestJson { .. }), "{e}");
        }
        // Too many tests.
        let mut s = String::new();
        for i in 0..=MAX_TEST_CASES {
            s += &format!("{{\"Action\":\"pass\",\"Test\":\"T{i}\"}}\n");
        }
        let e = parse_go_test_json(s.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("oversized"), "{e}");
    }
}
