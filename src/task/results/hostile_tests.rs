//! Every parser of successor output, on 4 MiB hostile inputs: each answers (a report or a
//! refusal) in one linear pass, well under a second in a release build. Debug builds are
//! 10-20x slower, so the bound is looser there; a quadratic parser takes minutes either way
//! (one `<testcase>` with 80,000 attributes took 21 s before the JUnit reader was fixed).

use super::*;
use std::time::{Duration, Instant};

const SIZE: usize = 4 << 20;
const BOUND: Duration = if cfg!(debug_assertions) {
    Duration::from_secs(10)
} else {
    Duration::from_secs(1)
};

/// `line(i)` repeated until the input is about 8 MiB.
fn repeat(line: impl Fn(usize) -> String) -> Vec<u8> {
    let mut out = Vec::with_capacity(SIZE + 4096);
    let mut i = 0;
    while out.len() < SIZE {
        out.extend_from_slice(line(i).as_bytes());
        i += 1;
    }
    out
}

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    let took = t.elapsed();
    assert!(took < BOUND, "{what}: took {took:?}");
    r
}

#[test]
fn tap_streams_are_linear() {
    let many = repeat(|i| format!("ok {} - t{i}\n", i + 1));
    let _ = timed("tap, many cases", || parse_tap(&many));
    let same = repeat(|_| "not ok 1 - same name # TODO\n  ---\n  message: x\n  ...\n".into());
    let _ = timed("tap, one name repeated", || parse_tap(&same));
    let mut long = b"1..1\nok 1 - ".to_vec();
    long.extend(std::iter::repeat_n(b'n', SIZE));
    let _ = timed("tap, one long line", || parse_tap(&long));
}

#[test]
fn event_streams_are_linear() {
    let go = repeat(|i| {
        format!(
            "{{\"Action\":\"output\",\"Package\":\"p\",\"Test\":\"T{}\",\"Output\":\"{}\\n\"}}\n",
            i % 7,
            "o".repeat(200)
        )
    });
    let _ = timed("go test -json, output", || parse_go_test_json(&go));
    let go_many =
        repeat(|i| format!("{{\"Action\":\"run\",\"Package\":\"p{i}\",\"Test\":\"T{i}\"}}\n"));
    let _ = timed("go test -json, many tests", || parse_go_test_json(&go_many));
    let lt = repeat(|i| format!("{{\"type\":\"test\",\"event\":\"started\",\"name\":\"t{i}\"}}\n"));
    let _ = timed("libtest, many started", || parse_libtest_json(&lt));
    let lt_suites =
        repeat(|_| "{\"type\":\"suite\",\"event\":\"started\",\"test_count\":9}\n".into());
    let _ = timed("libtest, many suites", || parse_libtest_json(&lt_suites));
}

#[test]
fn metrics_and_junit_are_linear() {
    let mut m = b"{".to_vec();
    m.extend(repeat(|i| format!("\"k{i}\":1,")));
    m.extend_from_slice(b"\"last\":1}");
    let e = timed("metrics, many keys", || parse_metrics(&m)).unwrap_err();
    assert!(e.to_string().contains("more than"), "{e}");
    let mut nested = b"{\"a\":".to_vec();
    nested.extend(std::iter::repeat_n(b'[', SIZE));
    let _ = timed("metrics, deep nesting", || parse_metrics(&nested)).unwrap_err();
    let mut j = b"<testsuite>".to_vec();
    j.extend(repeat(|i| {
        format!("<testcase name='t{i}'><failure message='m'/></testcase>")
    }));
    j.extend_from_slice(b"</testsuite>");
    let _ = timed("junit, many cases", || parse_junit(&j));
    let mut deep = b"<testsuite>".to_vec();
    deep.extend(repeat(|_| "<x>".into()));
    let _ = timed("junit, deep", || parse_junit(&deep)).unwrap_err();
    let mut props = b"<testsuite><properties>".to_vec();
    props.extend(repeat(|i| format!("<property name='p{i}' value='v'/>")));
    props.extend_from_slice(b"</properties></testsuite>");
    let _ = timed("junit, many properties", || parse_junit(&props));
}
