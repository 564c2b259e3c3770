//! CI outputs: `--junit` and `--summary` (and `$GITHUB_STEP_SUMMARY`) render the verdict
//! (a third-party JUnit reader agrees), every output path is checked before any work, and a
//! failing output never hides the verdict. Item 7 of the proof list in tests/verdicts.rs.

use super::*;

/// A task with both test results and metrics, compared against a baseline.
const BOTH_TASK: &str = r#"
[tasks.both]
command = ["sh", "-c", "python3 tests/run.py && python3 bench/compress.py --sessions 100"]
results = { format = "junit", path = "tests.xml" }
metrics = "metrics.json"
baseline = true
repeat = 3
lower_is_better = ["ratio"]
"#;

fn names_with(r: &TestReport, prefix: &str) -> BTreeSet<String> {
    r.cases
        .iter()
        .filter_map(|c| c.name.strip_prefix(prefix).map(str::to_string))
        .collect()
}

#[test]
fn junit_and_markdown_summaries_for_ci() {
    need_root!();
    let env = Env::new("vd-ci");
    let rt = env.runtime("hermes-demo", BOTH_TASK);
    let step = env.dir.join("step-summary.md");
    let earlier = "# an earlier step\n\nits own summary\n";
    std::fs::write(&step, earlier).unwrap();
    let (ja, sa) = (env.dir.join("a.xml"), env.dir.join("a.md"));
    // Timing and memory on a shared machine may stay inconclusive in 3 pairs, and the ratio
    // (band 1%, constant on both sides, tested) cannot be decided in 3: this test is about
    // the CI outputs, so they are informational here (reported, never deciding).
    let policy = env.dir.join("ci.toml");
    std::fs::write(
        &policy,
        "[decision]\nself_reported = \"accept\"\ninformational = [\"p99_ms\", \"peak_memory_kb\", \"ratio\"]\n",
    )
    .unwrap();
    let a = evaluate_env(
        &env,
        &patch("swap-compressor"),
        &rt,
        "a",
        &[
            "--task",
            "both",
            "--junit",
            ja.to_str().unwrap(),
            "--summary",
            sa.to_str().unwrap(),
            "--policy",
            policy.to_str().unwrap(),
        ],
        &[("GITHUB_STEP_SUMMARY", step.as_os_str())],
    );
    assert_eq!(a.code, 0, "{}", a.ctx());

    // JUnit: one case per test, one per metric, one for the verdict.
    let xml = std::fs::read(&ja).unwrap();
    let r = parse_junit(&xml).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&xml)));
    let t = &a.verdict["tests"];
    let n_tests = ["passed", "failed", "flaky", "skipped"]
        .iter()
        .map(|k| t[k].as_u64().unwrap() as usize)
        .sum::<usize>();
    assert!(n_tests > 0, "{}", a.ctx());
    let own = parse_junit(&std::fs::read(a.artifact("tests.xml")).unwrap()).unwrap();
    assert_eq!(own.cases.len(), n_tests);
    let own_names: BTreeSet<String> = own.cases.iter().map(|c| c.name.clone()).collect();
    let tests: BTreeSet<String> = r
        .cases
        .iter()
        .map(|c| c.name.clone())
        .filter(|n| own_names.contains(n))
        .collect();
    assert_eq!(tests, own_names, "the test cases are the task's own");
    assert!(
        own.cases.iter().all(|c| c.classname.is_some()),
        "the demo's report has classnames"
    );
    assert_eq!(
        r.cases.iter().map(|c| &c.classname).collect::<Vec<_>>()[..n_tests],
        own.cases.iter().map(|c| &c.classname).collect::<Vec<_>>()[..],
        "the task's own classnames, in order"
    );
    junitparser_agrees(&ja, &a.artifact("tests.xml"), metric_count(&a), 0);
    let metric_names: BTreeSet<String> = a.verdict["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(metric_names.len(), 4);
    assert_eq!(names_with(&r, "metrics."), metric_names);
    assert_eq!(
        names_with(&r, "fork."),
        BTreeSet::from(["verdict".to_string()])
    );
    assert_eq!(r.cases.len(), n_tests + metric_names.len() + 1);
    let case = |name: &str| r.cases.iter().find(|c| c.name == name).unwrap();
    assert_eq!(case("fork.verdict").outcome, TestOutcome::Passed);
    for m in ["metrics.compressed_bytes", "metrics.ratio"] {
        assert_eq!(case(m).outcome, TestOutcome::Passed, "{m} improved");
    }
    assert_eq!(
        r.cases
            .iter()
            .filter(|c| own_names.contains(&c.name) && c.outcome == TestOutcome::Passed)
            .count(),
        t["passed"].as_u64().unwrap() as usize
    );
    let xml = String::from_utf8_lossy(&xml);
    assert!(xml.contains(&format!(r#"name="run_id" value="{}""#, a.run_id())));
    assert!(xml.contains(r#"name="verdict" value="APPROVE""#));

    // Markdown: the verdict, the metrics table.
    let md_a = std::fs::read_to_string(&sa).unwrap();
    assert!(md_a.contains("## fork verdict: APPROVE"), "{md_a}");
    assert!(
        md_a.contains("| metric | baseline | patched | change | significant |"),
        "{md_a}"
    );
    for name in &metric_names {
        let row = format!("| {} |", name.replace('_', "\\_"));
        assert!(md_a.contains(&row), "no row {row}: {md_a}");
    }
    assert!(md_a.contains("| yes |"), "significant gains: {md_a}");
    assert!(md_a.contains(a.run_id()), "{md_a}");
    assert_eq!(
        std::fs::read_to_string(&step).unwrap(),
        format!("{earlier}\n{md_a}"),
        "appended below the earlier step's summary"
    );

    // A second evaluation, with caveats (a flaky test), appends again.
    let (jb, sb) = (env.dir.join("b.xml"), env.dir.join("b.md"));
    let b = evaluate_env(
        &env,
        &flaky_demo().join("comment.diff"),
        &flaky_demo(),
        "b",
        &[
            "--junit",
            jb.to_str().unwrap(),
            "--summary",
            sb.to_str().unwrap(),
        ],
        &[("GITHUB_STEP_SUMMARY", step.as_os_str())],
    );
    assert_eq!(b.code, 0, "{}", b.ctx());
    let md_b = std::fs::read_to_string(&sb).unwrap();
    assert!(md_b.contains("### Caveats"), "{md_b}");
    assert!(md_b.contains("test\\_first\\_run\\_only"), "{md_b}");
    assert!(md_b.contains("No metrics reported."), "{md_b}");
    assert!(
        md_b.contains("2 passed · 0 failed · 1 flaky · 0 skipped"),
        "{md_b}"
    );
    assert_eq!(
        std::fs::read_to_string(&step).unwrap(),
        format!("{earlier}\n{md_a}\n{md_b}"),
        "the step summary holds every summary, never truncated"
    );
    let rb = parse_junit(&std::fs::read(&jb).unwrap()).unwrap();
    assert_eq!(rb.cases.len(), 3 + 1);
    assert!(rb.cases.iter().all(|c| c.outcome == TestOutcome::Passed));
    let jb_text = std::fs::read_to_string(&jb).unwrap();
    assert!(
        jb_text.contains("flaky: failed in 1 of 2 runs"),
        "{jb_text}"
    );
}

fn metric_count(e: &Eval) -> usize {
    e.verdict["metrics"].as_array().map_or(0, |m| m.len())
}

/// What junitparser (a JUnit reader from PyPI; scripts/test.sh installs it) reads in each
/// file: per path, its suites' counts and its cases as `[classname, name, result]`.
fn junitparser_read(paths: &[&Path]) -> Value {
    let script = repo().join("tests/common/junit_read.py");
    let o = Command::new("python3")
        .arg(&script)
        .args(paths)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "junitparser could not read the reports (scripts/test.sh installs it: pip install junitparser): {}",
        text(&o)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// junitparser reads fork's JUnit report (`ours`) with every case of the task's own report
/// (`theirs`) under the task's own classname and name, with the same result, plus
/// `metrics` metric cases and the verdict (`fork`/`verdict`); the suite's counts add up.
fn junitparser_agrees(ours: &Path, theirs: &Path, metrics: usize, failures: u64) {
    let read = junitparser_read(&[ours, theirs]);
    let doc = |p: &Path| read[p.to_str().unwrap()].clone();
    let (ours_doc, theirs_doc) = (doc(ours), doc(theirs));
    let cases = |d: &Value| -> Vec<(String, String, String)> {
        d["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let s = |i: usize| c[i].as_str().unwrap_or("").to_string();
                (s(0), s(1), s(2))
            })
            .collect()
    };
    let (ours_cases, theirs_cases) = (cases(&ours_doc), cases(&theirs_doc));
    assert!(!theirs_cases.is_empty(), "{theirs_doc}");
    assert_eq!(
        ours_cases[..theirs_cases.len()],
        theirs_cases[..],
        "the task's own classnames, names and results, in order"
    );
    let rest = &ours_cases[theirs_cases.len()..];
    assert_eq!(rest.len(), metrics + 1, "{ours_doc}");
    assert!(
        rest[..metrics].iter().all(|c| c.0 == "metrics"),
        "{ours_doc}"
    );
    assert_eq!(
        (rest[metrics].0.as_str(), rest[metrics].1.as_str()),
        ("fork", "verdict")
    );
    let suites = ours_doc["suites"].as_array().unwrap();
    assert_eq!(suites.len(), 1, "{ours_doc}");
    assert_eq!(suites[0]["tests"], ours_cases.len() as u64, "{ours_doc}");
    assert_eq!(suites[0]["failures"], failures, "{ours_doc}");
    let count = |kind: &str| ours_cases.iter().filter(|c| c.2 == kind).count() as u64;
    assert_eq!(suites[0]["errors"], count("error"), "{ours_doc}");
    assert_eq!(suites[0]["skipped"], count("skipped"), "{ours_doc}");
    assert_eq!(count("failure"), failures, "{ours_doc}");
}

/// Every output path is checked before any work: an unwritable `--junit`, `--summary` or
/// `--out` parent is a usage error (64) naming the path, and nothing runs.
#[test]
fn unwritable_ci_outputs_are_refused_before_any_work() {
    need_root!();
    let env = Env::new("vd-ci-paths");
    let rt = env.runtime("hermes-demo", BOTH_TASK);
    let file = env.dir.join("a-file");
    std::fs::write(&file, "x").unwrap();
    let missing = env.dir.join("no/such/dir/j.xml");
    let under_file = file.join("j.xml");
    let bad_out = file.join("bundle");
    for (flag, path, named) in [
        ("--junit", &missing, &missing),
        ("--summary", &env.dir, &env.dir),
        ("--junit", &under_file, &file),
    ] {
        let a = ["--task", "both", flag, path.to_str().unwrap()];
        let e = common::lifecycle::evaluate(&env, &patch("swap-compressor"), &rt, "refused", &a);
        assert_eq!(e.code, 64, "{}", e.ctx());
        assert!(e.stderr.contains(named.to_str().unwrap()), "{}", e.ctx());
        assert!(e.sandboxes.is_empty(), "nothing ran: {}", e.ctx());
        assert!(!e.out.exists(), "{}", e.ctx());
    }
    let o = env
        .cmd()
        .args(["evaluate"])
        .arg(patch("swap-compressor"))
        .arg("--runtime")
        .arg(&rt)
        .args(["--task", "both", "--out"])
        .arg(&bad_out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(bad_out.to_str().unwrap()),
        "{}",
        text(&o)
    );
}

/// A report that fails after the verdict (here `/dev/full`: writable, but every write
/// fails) never hides it: the verdict is printed and recorded, then the failure is named
/// and the exit code is 73.
#[test]
fn a_failing_ci_output_never_hides_the_verdict() {
    need_root!();
    let env = Env::new("vd-ci-full");
    let e = common::lifecycle::evaluate(
        &env,
        &patch("swap-compressor"),
        &demo(),
        "full",
        &["--task", "tests", "--junit", "/dev/full"],
    );
    assert_eq!(e.code, 73, "{}", e.ctx());
    assert!(
        e.stdout.starts_with("APPROVE"),
        "the verdict is printed: {}",
        e.ctx()
    );
    assert!(e.stdout.contains(e.run_id()), "{}", e.ctx());
    assert!(
        e.stderr.contains("/dev/full") && e.stderr.contains("the verdict above stands"),
        "{}",
        e.ctx()
    );
    let v = env.cmd().arg("verify").arg(&e.out).output().unwrap();
    assert_eq!(v.status.code(), Some(0), "{}", text(&v));
    let h = env.cmd().args(["history", "--json"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&h.stdout).contains(e.run_id()),
        "recorded in the ledger: {}",
        text(&h)
    );
}

/// A task whose metric is deterministic but noisy: round r gives 10·r ms, +2 ms on the
/// patched side (medians 30 and 32, +6.7%, far from significant with these spreads).
const NOISY_TASK: &str = r#"
[tasks.noisy]
command = ["python3", "-c", "import os, json; s = os.environ['FORK_SIDE']; r = int(s.split('.r')[1]) if '.r' in s else 1; v = 10.0 * r + (2.0 if s.startswith('patched') else 0.0); open(os.path.join(os.environ['FORK_REPORTS'], 'metrics.json'), 'w').write(json.dumps({'queue_ms': v}))"]
metrics = "metrics.json"
baseline = true
repeat = 5
"#;

#[test]
fn junit_metric_cases_follow_the_verdicts_significance() {
    need_root!();
    let env = Env::new("vd-noisy");
    let rt = env.runtime("hermes-demo", NOISY_TASK);
    let j = env.dir.join("noisy.xml");
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "noisy",
        &["--task", "noisy", "--junit", j.to_str().unwrap()],
    );
    // Not significant is not unchanged (issue 14): +6.7% with an interval from about -70%
    // to +320% is no evidence either way, and the verdict says so instead of APPROVE.
    assert_eq!(e.code, 2, "{}", e.ctx());
    let m = e.metric("queue_ms");
    assert_eq!(m["significant"], false, "{m}");
    assert_eq!(m["class"], "inconclusive", "{m}");
    assert!(f(&m["change"]) > 0.05, "{m}");
    assert!(f(&m["ci_low"]) < -0.05 && f(&m["ci_high"]) > 0.05, "{m}");
    let s = e.summary();
    assert!(s.contains("inconclusive for queue_ms"), "{}", e.ctx());
    assert!(!s.contains("unchanged"), "{}", e.ctx());
    let r = parse_junit(&std::fs::read(&j).unwrap()).unwrap();
    let case = r
        .cases
        .iter()
        .find(|c| c.name == "metrics.queue_ms")
        .unwrap();
    assert_eq!(
        case.outcome,
        TestOutcome::Failed,
        "an inconclusive metric fails its JUnit case: {}",
        std::fs::read_to_string(&j).unwrap()
    );
}
