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

#[test]
fn a_rerun_is_not_charged_for_the_earlier_attempts_cpu() {
    need_root!();
    // The flaky demo's suite, burning 2.5 s of CPU in every attempt, under a task budget of
    // 4 s of CPU time: one attempt fits, two together do not. The rerun of the failing
    // first attempt runs in the same sandbox (the same cgroup): it must be charged for its
    // own CPU only, or it is killed as over the CPU budget and the flaky test turns into a
    // REJECT.
    let env = Env::new("vd-flaky-cpu");
    let rt = env.dir.join("flaky-cpu");
    copy_dir(&flaky_demo(), &rt);
    let run_py = rt.join("tests/run.py");
    let code = std::fs::read_to_string(&run_py).unwrap();
    let anchor = "sys.path.insert(0, os.getcwd())\n";
    assert!(code.contains(anchor));
    let burn = "import time\n_t = time.process_time()\n\
                while time.process_time() - _t < 2.5:\n    pass\n";
    std::fs::write(&run_py, code.replace(anchor, &format!("{burn}{anchor}"))).unwrap();
    let mut toml = std::fs::read_to_string(rt.join("fork.toml")).unwrap();
    assert!(toml
        .trim_end()
        .ends_with("results = { format = \"junit\", path = \"tests.xml\" }"));
    toml.push_str("budget = { cpu_time = \"4s\", wall = \"120s\" }\n");
    std::fs::write(rt.join("fork.toml"), toml).unwrap();
    let e = evaluate(
        &env,
        &flaky_demo().join("comment.diff"),
        &rt,
        "flaky-cpu",
        &[],
    );
    assert_eq!(e.verdict["budget"]["exceeded"], Value::Null, "{}", e.ctx());
    assert_eq!(
        e.verdict["budget"]["limits"]["cpu_time_s"],
        4.0,
        "{}",
        e.ctx()
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert_eq!(e.verdict["tests"]["flaky"], 1, "{}", e.ctx());
    assert_eq!(e.verdict["tests"]["failed"], 0, "{}", e.ctx());
    // What is reported is one attempt's CPU, not the two attempts' sum.
    let cpu = e.verdict["budget"]["used"]["cpu_s"].as_f64().unwrap();
    assert!((2.0..4.0).contains(&cpu), "cpu_s {cpu}: {}", e.ctx());
}
