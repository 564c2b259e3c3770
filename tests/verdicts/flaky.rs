//! Flaky tests: a test that fails once and passes on the rerun is reported flaky, with the
//! retry's evidence in the bundle. Item 4 of the proof list in tests/verdicts.rs.

use super::*;

#[test]
fn flaky_test_passes_on_retry_and_is_reported() {
    need_root!();
    let env = Env::new("vd-flaky");
    let e = evaluate(
        &env,
        &flaky_demo().join("comment.diff"),
        &flaky_demo(),
        "flaky",
        &[],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert_eq!(e.verdict["tests"]["flaky"], 1, "{}", e.ctx());
    assert_eq!(e.verdict["tests"]["failed"], 0, "{}", e.ctx());
    assert_eq!(e.verdict["tests"]["passed"], 2, "{}", e.ctx());
    let caveats = e.caveats();
    assert!(
        caveats
            .iter()
            .any(|c| c.contains("test_first_run_only") && c.contains("retry")),
        "a caveat must name the flaky test and its retry: {caveats:?}"
    );
    // The rerun happened in the same workspace: one sandbox.
    assert_eq!(e.sandboxes.len(), 1, "{:?}", e.sandboxes);
    // Both attempts' evidence: the first (failing) and the retry's (passing) results.
    let names: Vec<String> = std::fs::read_dir(e.out.join("artifacts"))
        .unwrap()
        .flatten()
        .map(|d| d.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("retry1-") && n.ends_with("tests.xml")),
        "{names:?}"
    );
    let first = parse_junit(&std::fs::read(e.artifact("tests.xml")).unwrap()).unwrap();
    let retry = parse_junit(&std::fs::read(e.artifact("retry1-tests.xml")).unwrap()).unwrap();
    let outcome = |r: &TestReport| {
        r.cases
            .iter()
            .find(|c| c.name.ends_with("test_first_run_only"))
            .map(|c| c.outcome)
    };
    assert_eq!(outcome(&first), Some(TestOutcome::Failed));
    assert_eq!(outcome(&retry), Some(TestOutcome::Passed));
    // Listed in the signed verdict too.
    let listed = e.verdict["artifacts"].as_array().unwrap();
    assert!(listed
        .iter()
        .any(|a| a["path"] == "artifacts/retry1-tests.xml"));
}
