//! The verdict cache: a verdict is reused only for the same inputs and an intact bundle of
//! its own; a hit prepares no sandbox and still writes the CI outputs. Item 5 of the proof
//! list in tests/verdicts.rs.

use super::*;

#[test]
fn cache_reuses_only_identical_intact_evaluations() {
    need_root!();
    let env = Env::new("vd-cache");
    let swap = patch("swap-compressor");
    let first = evaluate(&env, &swap, &demo(), "c1", &["--task", "tests"]);
    assert_eq!(first.code, 0, "{}", first.ctx());
    assert!(!first.reused(), "{}", first.ctx());
    assert_eq!(first.sandboxes.len(), 1);

    // Same inputs: the verdict is reused, not evaluated again.
    let second = evaluate(&env, &swap, &demo(), "c2", &["--task", "tests"]);
    assert_eq!(second.code, 0, "{}", second.ctx());
    assert!(second.reused(), "{}", second.ctx());
    assert!(second.stderr.contains(first.run_id()), "{}", second.ctx());
    assert_eq!(second.run_id(), first.run_id());
    assert_eq!(
        std::fs::read(second.out.join("verdict.json")).unwrap(),
        std::fs::read(first.out.join("verdict.json")).unwrap(),
        "the reused verdict is the first one, byte for byte"
    );
    // No task ran: the output log is the first run's (its timestamps and all), and at most
    // the patched tree was prepared (see cache_hit_prepares_no_sandbox).
    assert_eq!(
        std::fs::read(second.artifact("sandbox.json")).unwrap(),
        std::fs::read(first.artifact("sandbox.json")).unwrap()
    );
    assert!(second.sandboxes.len() <= 1, "{:?}", second.sandboxes);

    // A different patch is never served another patch's verdict.
    let noop = evaluate(
        &env,
        &patch("noop-comment"),
        &demo(),
        "c3",
        &["--task", "tests"],
    );
    assert_eq!(noop.code, 0, "{}", noop.ctx());
    assert!(!noop.reused(), "{}", noop.ctx());
    assert_ne!(noop.run_id(), first.run_id());
    assert_eq!(noop.sandboxes.len(), 1, "a sandbox ran");
    assert_eq!(
        noop.verdict["patch_hash"],
        patch_hash(&patch("noop-comment"))
    );

    // --no-cache evaluates again.
    let forced = evaluate(
        &env,
        &swap,
        &demo(),
        "c4",
        &["--task", "tests", "--no-cache"],
    );
    assert!(!forced.reused(), "{}", forced.ctx());
    assert_ne!(forced.run_id(), first.run_id());
    assert_eq!(forced.sandboxes.len(), 1, "a sandbox ran");

    // The newest matching entry is the one offered: tamper with its bundle.
    let vj = forced.out.join("verdict.json");
    let mut bytes = std::fs::read(&vj).unwrap();
    let i = bytes.len() / 2;
    bytes[i] ^= 0x01;
    std::fs::write(&vj, &bytes).unwrap();
    let after = evaluate(&env, &swap, &demo(), "c5", &["--task", "tests"]);
    assert!(
        !after.reused(),
        "a tampered bundle was reused: {}",
        after.ctx()
    );
    assert!(
        after.stderr.contains("no longer verifies"),
        "{}",
        after.ctx()
    );
    assert_ne!(after.run_id(), forced.run_id());
    assert_ne!(after.run_id(), first.run_id());
    assert_eq!(after.sandboxes.len(), 1, "a sandbox ran");

    // And that fresh, intact verdict is what the next evaluation reuses.
    let again = evaluate(&env, &swap, &demo(), "c6", &["--task", "tests"]);
    assert!(again.reused(), "{}", again.ctx());
    assert_eq!(again.run_id(), after.run_id());
}

/// The cache serves only the verdict its row recorded for the key: a bundle directory
/// replaced with another patch's APPROVE (which verifies with the same node key) is a miss
/// that says why, and the patch is evaluated again.
#[test]
fn cache_refuses_a_bundle_replaced_by_another_patchs() {
    need_root!();
    let env = Env::new("vd-cache-swap");
    let breaks = evaluate(
        &env,
        &patch("breaks-test"),
        &demo(),
        "b1",
        &["--task", "tests"],
    );
    assert_eq!(breaks.code, 2, "{}", breaks.ctx());
    let swap = evaluate(
        &env,
        &patch("swap-compressor"),
        &demo(),
        "s1",
        &["--task", "tests"],
    );
    assert_eq!(swap.code, 0, "{}", swap.ctx());
    // Replace breaks-test's bundle directory (where its ledger row points) with swap's.
    std::fs::remove_dir_all(&breaks.out).unwrap();
    copy_dir(&swap.out, &breaks.out);
    let again = evaluate(
        &env,
        &patch("breaks-test"),
        &demo(),
        "b2",
        &["--task", "tests"],
    );
    assert!(!again.reused(), "{}", again.ctx());
    assert_ne!(again.verdict["verdict"], "APPROVE", "{}", again.ctx());
    assert_eq!(again.code, 2, "{}", again.ctx());
    assert_eq!(
        again.verdict["patch_hash"],
        patch_hash(&patch("breaks-test")),
        "{}",
        again.ctx()
    );
    assert!(
        again.stderr.contains("not reusing the cached verdict")
            && again.stderr.contains("patch_hash"),
        "stderr says why the cache was not used: {}",
        again.ctx()
    );
    assert_eq!(again.sandboxes.len(), 1, "a sandbox ran");
}

#[test]
fn cache_hit_prepares_no_sandbox() {
    need_root!();
    let env = Env::new("vd-cache-nosb");
    let swap = patch("swap-compressor");
    let first = evaluate(&env, &swap, &demo(), "c1", &["--task", "tests"]);
    assert_eq!(first.sandboxes.len(), 1);
    let second = evaluate(&env, &swap, &demo(), "c2", &["--task", "tests"]);
    assert!(second.reused(), "{}", second.ctx());
    assert_eq!(
        second.sandboxes,
        Vec::<String>::new(),
        "a cache hit must start no sandbox"
    );
}

#[test]
fn cache_hit_still_writes_ci_outputs() {
    need_root!();
    let env = Env::new("vd-cache-ci");
    let swap = patch("swap-compressor");
    let first = evaluate(&env, &swap, &demo(), "c1", &["--task", "tests"]);
    let (j, s) = (env.dir.join("j.xml"), env.dir.join("s.md"));
    let second = evaluate(
        &env,
        &swap,
        &demo(),
        "c2",
        &[
            "--task",
            "tests",
            "--junit",
            j.to_str().unwrap(),
            "--summary",
            s.to_str().unwrap(),
        ],
    );
    assert!(second.reused(), "{}", second.ctx());
    let junit = std::fs::read_to_string(&j).expect("--junit written on a cache hit");
    assert!(junit.contains(first.run_id()));
    let md = std::fs::read_to_string(&s).expect("--summary written on a cache hit");
    assert!(md.contains("APPROVE"));
}

#[test]
fn cache_keys_on_the_tools_outside_the_source_hash() {
    need_root!();
    // The tools are copied into every workspace from the runtime's own directory; here
    // the source hash leaves them out (excluded), as it does for tools outside the source
    // tree. A verdict was served after they changed: the task reads them.
    let env = Env::new("vd-cache-tools");
    let rt = env.runtime(
        "rt",
        r#"
[tasks.tool]
command = ["sh", "-c", "sh \"$FORK_TOOLS/check.sh\""]
results = { format = "exit_status" }
"#,
    );
    let toml = std::fs::read_to_string(rt.join("fork.toml")).unwrap();
    let toml = toml.replacen(
        r#"exclude = ["state", ".git", "**/__pycache__", "fork-out"]"#,
        r#"exclude = ["state", ".git", "**/__pycache__", "fork-out", "tools"]"#,
        1,
    );
    assert!(
        toml.contains(r#""tools"]"#),
        "the demo's exclude changed: update this test"
    );
    std::fs::write(rt.join("fork.toml"), toml).unwrap();
    std::fs::write(rt.join("tools/check.sh"), "exit 0\n").unwrap();
    let swap = patch("swap-compressor");
    let human = human_policy();
    let args = ["--task", "tool", "--policy", human.to_str().unwrap()];
    let first = evaluate(&env, &swap, &rt, "t1", &args);
    assert_eq!(first.code, 0, "{}", first.ctx());
    // Unchanged: served from the cache.
    let again = evaluate(&env, &swap, &rt, "t2", &args);
    assert!(again.reused(), "{}", again.ctx());
    // The tools changed (the source hash did not): evaluated again, and the check fails.
    std::fs::write(rt.join("tools/check.sh"), "exit 1\n").unwrap();
    let changed = evaluate(&env, &swap, &rt, "t3", &args);
    assert!(!changed.reused(), "{}", changed.ctx());
    assert_ne!(changed.verdict["verdict"], "APPROVE", "{}", changed.ctx());
    assert_eq!(
        changed.verdict["source_hash"],
        first.verdict["source_hash"],
        "the source hash leaves the tools out: {}",
        changed.ctx()
    );
}

#[test]
fn cache_hit_lists_the_same_tests_as_the_fresh_verdict() {
    need_root!();
    // A TAP task with a test that fails once then passes on its rerun (flaky), in a plan
    // of two tasks: a cache hit rebuilt the JUnit from the first report it found, read as
    // JUnit (none of these tests, and the first attempt's failure, and one task's).
    let env = Env::new("vd-cache-ci-same");
    let rt = env.runtime(
        "rt",
        r#"
[tasks.tapped]
command = ["sh", "-c", "if [ -e /tmp/once ]; then b='ok 2 - beta'; else touch /tmp/once; b='not ok 2 - beta'; fi; printf 'TAP version 13\n1..3\nok 1 - alpha\n%s\nok 3 - gamma\n' \"$b\" > \"$FORK_REPORTS/tests.tap\""]
results = { format = "tap", path = "tests.tap" }
gate = true

[tasks.exits]
command = ["true"]
results = { format = "exit_status" }
gate = true
"#,
    );
    let human = human_policy();
    let cases = |j: &Path| -> BTreeSet<(String, String)> {
        let r = parse_junit(&std::fs::read(j).unwrap()).unwrap();
        r.cases
            .iter()
            .map(|c| (c.name.clone(), format!("{:?}", c.outcome)))
            .collect()
    };
    let mut listed = Vec::new();
    for name in ["f1", "f2"] {
        let j = env.dir.join(format!("{name}.xml"));
        let e = evaluate(
            &env,
            &patch("swap-compressor"),
            &rt,
            name,
            &[
                "--policy",
                human.to_str().unwrap(),
                "--junit",
                j.to_str().unwrap(),
            ],
        );
        assert_eq!(e.reused(), name == "f2", "{}", e.ctx());
        listed.push(cases(&j));
    }
    let names: Vec<&str> = listed[0].iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        names.iter().any(|n| n.contains("beta")) && names.iter().any(|n| n.contains("gamma")),
        "{:?}",
        listed[0]
    );
    assert_eq!(listed[0], listed[1], "the cache hit lists other tests");
}
