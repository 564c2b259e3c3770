//! Judged tasks, end to end on the real kernel: the subject (`python3 -m hermes serve` from
//! the patched tree) and the judge (judge/judge.py from the parent's unpatched tree) in two
//! sandboxes connected only by a pipe pair. Only the judge's reports are evidence, so the
//! reward hacks under fixtures/patches/hacks/ (each APPROVEd by an unjudged task before)
//! never reach APPROVE and invent no gain.

mod common;
use common::lifecycle::*;
use serde_json::Value;
use std::path::PathBuf;

fn hack(name: &str) -> PathBuf {
    common::repo()
        .join("fixtures/patches/hacks")
        .join(format!("{name}.diff"))
}

/// No metric in the verdict is an improvement beyond its noise band.
fn invents_no_gain(e: &Eval) {
    for m in e.verdict["metrics"].as_array().into_iter().flatten() {
        // A plan of several tasks names its metrics `task/metric`.
        let name = m["name"].as_str().unwrap_or("");
        let name = name.rsplit('/').next().unwrap_or(name);
        let change = m["change"].as_f64().unwrap_or(0.0);
        let lower_is_better = matches!(name, "ratio" | "compressed_bytes" | "p50_ms" | "p99_ms");
        let gain = if lower_is_better { -change } else { change };
        assert!(
            gain <= 0.01 || m["significant"] == Value::Bool(false),
            "an invented gain in {name} ({change}): {}",
            e.ctx()
        );
    }
    assert!(
        !e.summary().contains("improved"),
        "the summary claims a gain: {}",
        e.ctx()
    );
}

#[test]
fn a_real_improvement_is_approved_on_the_judges_word() {
    need_root!();
    let env = Env::new("judge-swap");
    let e = evaluate(
        &env,
        &patch("swap-compressor"),
        &demo(),
        "swap",
        &["--task", "judged", "--no-ledger"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert_eq!(e.verdict["provenance"], "judge", "{}", e.ctx());
    assert!(
        e.verdict["tests"]["passed"].as_u64().unwrap() >= 50,
        "{}",
        e.ctx()
    );
    assert_eq!(e.verdict["tests"]["failed"], 0, "{}", e.ctx());
    let ratio = e.metric("ratio");
    assert!(
        ratio["change"].as_f64().unwrap() < -0.3,
        "the judge measured the real gain: {}",
        e.ctx()
    );
    // The judge's reports are the evidence; the subject's own output is an artifact.
    assert!(e.artifact("tests.xml").is_file(), "{}", e.ctx());
    assert!(e.artifact("subject-output.log").is_file(), "{}", e.ctx());
    assert!(
        !e.caveats().iter().any(|c| c.contains("self-reported")),
        "{}",
        e.ctx()
    );
}

#[test]
fn reward_hacks_never_reach_approve() {
    need_root!();
    let env = Env::new("judge-hacks");
    for name in [
        "forge-approve",
        "forge-envdetect",
        "edit-tests-at-runtime",
        "drop-context",
        "slow-clock",
    ] {
        // The demo as users get it: its plan (contract, then bench), both judged.
        let e = evaluate(&env, &hack(name), &demo(), name, &["--no-ledger"]);
        assert!(
            matches!(e.code, 1 | 2),
            "{name} must not be approved: {}",
            e.ctx()
        );
        assert_eq!(e.verdict["provenance"], "judge", "{name}: {}", e.ctx());
        assert_eq!(e.verdict["task"], "contract+bench", "{name}: {}", e.ctx());
        invents_no_gain(&e);
    }
}

/// `fork evaluate` without `--task` runs the manifest's plan: the demo's two gating tasks,
/// in order, into one signed verdict that lists each task's part.
#[test]
fn the_demo_plan_runs_contract_then_bench_into_one_verdict() {
    need_root!();
    let env = Env::new("judge-plan");
    let ledger = env.dir.join("ledger.db");
    let l = ledger.to_str().unwrap();
    let e = evaluate(
        &env,
        &patch("swap-compressor"),
        &demo(),
        "plan",
        &["--ledger", l],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    let v = &e.verdict;
    assert_eq!(v["header"]["schema"]["version"], "1.4", "{}", e.ctx());
    assert_eq!(v["task"], "contract+bench", "{}", e.ctx());
    assert_eq!(v["provenance"], "judge", "{}", e.ctx());
    let plan = v["plan"].as_array().expect("a plan");
    assert_eq!(plan.len(), 2, "{}", e.ctx());
    for (t, name) in plan.iter().zip(["contract", "bench"]) {
        assert_eq!(t["task"], name, "{}", e.ctx());
        assert_eq!(t["verdict"], "APPROVE", "{}", e.ctx());
        assert_eq!(t["provenance"], "judge", "{}", e.ctx());
        assert!(t["task_hash"].as_str().unwrap().starts_with("sha256:"));
        assert!(t["budget"]["limits"]["wall_s"].as_f64().is_some(), "{t}");
    }
    assert_ne!(
        v["task_hash"], plan[0]["task_hash"],
        "the plan has a hash of its own"
    );
    // The contract's tests and the bench's metrics, each from its own task.
    assert!(
        plan[0]["tests"]["passed"].as_u64().unwrap() >= 50,
        "{}",
        e.ctx()
    );
    assert_eq!(v["tests"]["passed"], plan[0]["tests"]["passed"]);
    assert!(plan[1]["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["name"] == "ratio"));
    let ratio = e.metric("bench/ratio");
    assert!(ratio["change"].as_f64().unwrap() < -0.3, "{}", e.ctx());
    let summary = e.summary();
    assert!(
        summary.starts_with("contract: Test suite passed") && summary.contains("bench: "),
        "{}",
        e.ctx()
    );
    // Each task's artifacts under its own name.
    assert!(e.artifact("contract-tests.xml").is_file(), "{}", e.ctx());
    assert!(e.artifact("bench-metrics.json").is_file(), "{}", e.ctx());
    assert!(
        e.artifact("bench-baseline-metrics.json").is_file(),
        "{}",
        e.ctx()
    );
    assert!(e.stdout.contains("task contract: APPROVE"), "{}", e.stdout);
    let o = env.cmd().arg("verify").arg(&e.out).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The cache keys on the plan: the same plan is served from the ledger, one task of it
    // is not.
    let again = evaluate(
        &env,
        &patch("swap-compressor"),
        &demo(),
        "plan-again",
        &["--ledger", l],
    );
    assert!(
        again.stderr.contains("reusing the verdict"),
        "{}",
        again.ctx()
    );
    assert_eq!(again.verdict["run_id"], v["run_id"]);
    let one = evaluate(
        &env,
        &patch("swap-compressor"),
        &demo(),
        "plan-one",
        &["--ledger", l, "--task", "contract"],
    );
    assert!(!one.stderr.contains("reusing the verdict"), "{}", one.ctx());
    assert_eq!(one.verdict["task"], "contract", "{}", one.ctx());
    assert_eq!(one.verdict["plan"].as_array().unwrap().len(), 1);
}

/// A task that does not approve ends the plan: the benchmark of a patch that breaks the
/// contract is never run, and its gain could not have approved it anyway.
#[test]
fn a_plan_stops_at_the_first_task_that_does_not_approve() {
    need_root!();
    let env = Env::new("judge-plan-stop");
    let e = evaluate(
        &env,
        &hack("drop-context"),
        &demo(),
        "stop",
        &["--no-ledger"],
    );
    assert!(matches!(e.code, 1 | 2), "{}", e.ctx());
    let plan = e.verdict["plan"].as_array().expect("a plan");
    assert_eq!(plan[0]["task"], "contract");
    assert_ne!(plan[0]["verdict"], "APPROVE", "{}", e.ctx());
    assert_eq!(plan[1]["task"], "bench");
    assert!(
        plan[1].get("verdict").is_none(),
        "bench did not run: {}",
        e.ctx()
    );
    assert!(
        plan[1]["summary"]
            .as_str()
            .unwrap()
            .contains("task `contract` gave"),
        "{}",
        e.ctx()
    );
    assert!(
        e.verdict["caveats"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c.as_str().unwrap().starts_with("task `bench` did not run")),
        "{}",
        e.ctx()
    );
    assert!(!e.artifact("bench-metrics.json").exists(), "{}", e.ctx());
    invents_no_gain(&e);
}

/// The default policy does not approve on evidence the code under test produced about
/// itself; `policies/human-patches.toml` (`[decision] self_reported = "accept"`) restores
/// the old behaviour, with a caveat and a lower confidence.
#[test]
fn self_reported_evidence_is_not_approved_by_default() {
    need_root!();
    let env = Env::new("judge-self");
    let e = evaluate_with(
        &env,
        &patch("swap-compressor"),
        &demo(),
        "default",
        &["--task", "tests", "--no-ledger"],
        With {
            builtin_policy: true,
            ..With::default()
        },
    );
    assert_eq!(e.code, 2, "{}", e.ctx());
    assert_eq!(e.verdict["provenance"], "self_reported", "{}", e.ctx());
    assert!(e.summary().contains("self-reported"), "{}", e.ctx());
    assert!(e.summary().contains("Test suite passed"), "{}", e.ctx());
    let human = human_policy();
    let e = evaluate(
        &env,
        &patch("swap-compressor"),
        &demo(),
        "human",
        &[
            "--task",
            "tests",
            "--no-ledger",
            "--policy",
            human.to_str().unwrap(),
        ],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert!(
        e.verdict["caveats"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c.as_str().unwrap().contains("self-reported")),
        "{}",
        e.ctx()
    );
    assert!(
        e.verdict["confidence"].as_f64().unwrap() < 0.95,
        "{}",
        e.ctx()
    );
}

#[test]
fn the_breaking_patch_fails_the_judges_checks() {
    need_root!();
    let env = Env::new("judge-breaks");
    let e = evaluate(
        &env,
        &patch("breaks-test"),
        &demo(),
        "breaks",
        &["--task", "judged", "--no-ledger"],
    );
    assert_eq!(e.code, 2, "{}", e.ctx());
    assert!(
        e.verdict["tests"]["failed"].as_u64().unwrap() > 0,
        "{}",
        e.ctx()
    );
    assert!(e.summary().contains("pick_tool"), "{}", e.ctx());
}

#[test]
fn a_judged_subject_sees_no_fork_variables() {
    need_root!();
    let env = Env::new("judge-env");
    let e = evaluate(
        &env,
        &patch("judged-env-probe"),
        &demo(),
        "probe",
        // The judged contract alone: what the subject sees is the point, not its latency.
        &["--task", "contract", "--no-ledger"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    let log = std::fs::read_to_string(e.artifact("subject-output.log")).unwrap();
    let line = log
        .lines()
        .find(|l| l.starts_with("env: "))
        .unwrap_or_else(|| panic!("the probe did not run: {log}"));
    assert!(line.contains("PATH"), "{line}");
    assert!(!line.contains("FORK_"), "the subject saw {line}");
}

#[test]
fn a_failing_judge_is_never_an_approve() {
    need_root!();
    let env = Env::new("judge-fails");
    for (name, judge, expect) in [
        (
            "crash",
            r#"["python3", "-c", "import sys; sys.exit(3)"]"#,
            2,
        ),
        (
            "garbage",
            r#"["sh", "-c", "echo '<testsuite><bogus' > $FORK_REPORTS/tests.xml"]"#,
            2,
        ),
        ("missing", r#"["/no/such/judge"]"#, 2),
    ] {
        let rt = env.runtime(
            name,
            &format!(
                "\n[tasks.j]\ncommand = [\"python3\", \"-m\", \"hermes\", \"serve\"]\njudge = {judge}\nresults = {{ format = \"junit\", path = \"tests.xml\" }}\n"
            ),
        );
        let e = evaluate(
            &env,
            &patch("noop-comment"),
            &rt,
            name,
            &["--task", "j", "--no-ledger"],
        );
        assert_eq!(e.code, expect, "{name}: {}", e.ctx());
    }
    // A judge that hangs blows its own budget: named as the judge's failure.
    let rt = env.runtime(
        "hang",
        "\n[tasks.j]\ncommand = [\"python3\", \"-m\", \"hermes\", \"serve\"]\njudge = [\"sleep\", \"30\"]\nresults = { format = \"junit\", path = \"tests.xml\" }\nbudget = { wall = \"2s\" }\n",
    );
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "hang",
        &["--task", "j", "--no-ledger"],
    );
    assert_eq!(e.code, 2, "{}", e.ctx());
    assert!(e.summary().contains("the judge failed"), "{}", e.ctx());
}

/// A baseline whose judge wrote its metrics and then blew its budget is no evidence: its
/// metrics are not the baseline's, and the task is NEEDS_REVISION naming that, never an
/// APPROVE on a comparison with them. (The judge sees no FORK_SIDE: the subject tells it
/// which tree it runs, the patch's comment being in the patched one only; the two sides'
/// metrics are equal, so a comparison with the failed judge's would approve.)
#[test]
fn a_baseline_whose_judge_failed_gives_no_metrics() {
    need_root!();
    let env = Env::new("judge-baseline-fails");
    let rt = env.runtime(
        "baseline-judge",
        r#"
[tasks.j]
command = ["sh", "-c", "if grep -q 'raised for any manifest' hermes/registry.py; then echo patched; else echo baseline; fi"]
judge = ["python3", "-c", "import json, os, sys, time; side = os.fdopen(3).readline().strip(); open(os.path.join(os.environ['FORK_REPORTS'], 'm.json'), 'w').write(json.dumps({'x': 1.0})); time.sleep(0 if side == 'patched' else 30)"]
metrics = "m.json"
baseline = true
budget = { wall = "3s" }
"#,
    );
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "baseline-judge",
        &["--task", "j", "--no-ledger"],
    );
    assert_eq!(e.code, 2, "{}", e.ctx());
    assert!(
        e.summary()
            .starts_with("The baseline (unpatched) run is no evidence")
            && e.summary()
                .contains("the judge failed: it exceeded its wall budget"),
        "{}",
        e.ctx()
    );
    // The patched side's judge did not fail: its metric is reported, with no baseline value.
    let m = &e.verdict["metrics"][0];
    assert_eq!(
        (m["name"].as_str(), m["patched"].as_f64()),
        (Some("x"), Some(1.0)),
        "{}",
        e.ctx()
    );
    assert!(m["baseline"].is_null(), "{}", e.ctx());
}

/// Every file of `dir` (relative path -> content), recursively.
fn tree_files(dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// The protected tree is read-only at run time: a patch whose code, at import, appends to
/// every test file, creates tests/conftest.py and deletes a test file is refused each
/// write (EROFS) in the unjudged task and in the judged one, its broken code fails the
/// original tests, and nothing of the protected tree changed.
#[test]
fn the_protected_tree_is_read_only_at_run_time() {
    need_root!();
    let env = Env::new("protect-ro");
    let rt = env.runtime("rt", "");
    let before = tree_files(&rt.join("tests"));
    let e = evaluate(
        &env,
        &hack("rewrite-protected"),
        &rt,
        "tests",
        &["--no-ledger", "--task", "tests"],
    );
    assert_eq!(e.code, 2, "the original tests fail: {}", e.ctx());
    let probe = e.artifact_json("report-protect-probe.json");
    let attempts = probe.as_object().unwrap();
    assert_eq!(attempts.len(), 5, "{probe}");
    for (what, errno) in attempts {
        assert_eq!(errno, "EROFS", "{what}: {probe}");
    }
    // Every original test ran (none deleted, none relaxed) and the broken one failed.
    let t = &e.verdict["tests"];
    let ran = t["passed"].as_u64().unwrap() + t["failed"].as_u64().unwrap();
    assert_eq!(ran, 29, "{}", e.ctx());
    assert!(t["failed"].as_u64().unwrap() >= 1, "{}", e.ctx());
    assert!(
        e.summary().contains("test_pick_tool_by_triggers"),
        "{}",
        e.ctx()
    );
    // Nothing differed after the run (the check found no change) and the parent is intact.
    assert!(!e.summary().contains("protected tree"), "{}", e.ctx());
    assert_eq!(tree_files(&rt.join("tests")), before);

    let j = evaluate(
        &env,
        &hack("rewrite-protected"),
        &rt,
        "judged",
        &["--no-ledger", "--task", "judged"],
    );
    assert!(matches!(j.code, 1 | 2), "{}", j.ctx());
    assert!(!j.summary().contains("protected tree"), "{}", j.ctx());
    assert_eq!(tree_files(&rt.join("tests")), before);
}

/// The post-run check covers what a glob protects but no mount does: a new file matching
/// `**/*.lock` and a protected symlink retargeted are a REJECT naming each file.
#[test]
fn a_change_to_a_protected_glob_is_a_reject_naming_the_file() {
    need_root!();
    let env = Env::new("protect-glob");
    let rt = env.runtime(
        "rt",
        r#"
[tasks.locks]
command = ["sh", "-c", "echo pinned > hermes/extra.lock; ln -sfn ../README.md hermes/link.lock; echo changed > hermes/deps.lock; python3 tests/run.py"]
results = { format = "junit", path = "tests.xml" }
"#,
    );
    let toml = std::fs::read_to_string(rt.join("fork.toml")).unwrap();
    let toml = toml.replacen(r#""fork.toml"]"#, r#""fork.toml", "**/*.lock"]"#, 1);
    assert!(toml.contains(r#""**/*.lock""#));
    std::fs::write(rt.join("fork.toml"), toml).unwrap();
    std::fs::write(rt.join("hermes/deps.lock"), "pinned\n").unwrap();
    std::os::unix::fs::symlink("deps.lock", rt.join("hermes/link.lock")).unwrap();
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "locks",
        &["--no-ledger", "--task", "locks"],
    );
    assert_eq!(e.code, 1, "{}", e.ctx());
    let s = e.summary();
    assert!(s.contains("protected tree"), "{}", e.ctx());
    assert!(s.contains("hermes/extra.lock added"), "{}", e.ctx());
    assert!(s.contains("hermes/link.lock modified"), "{}", e.ctx());
    // The existing lock file was bound read-only: its write failed, so it did not change.
    assert!(!s.contains("deps.lock"), "{}", e.ctx());
    let log = std::fs::read_to_string(e.artifact("output.log")).unwrap();
    assert!(log.contains("Read-only file system"), "{log}");
}

/// Each task of a plan is held to the policy on its own: a judged task beside an unjudged
/// one does not make the unjudged task's self-reported results acceptable (a patch could
/// forge its own test report while the judged benchmark shows a real gain).
#[test]
fn a_judged_task_does_not_vouch_for_an_unjudged_one_in_the_same_plan() {
    need_root!();
    let env = Env::new("judge-mixed");
    let rt = env.runtime(
        "rt",
        "\n[tasks.selftests]\ngate = true\ncommand = [\"python3\", \"tests/run.py\"]\nresults = { format = \"junit\", path = \"tests.xml\" }\n",
    );
    let e = evaluate_with(
        &env,
        &patch("swap-compressor"),
        &rt,
        "mixed",
        &["--no-ledger"],
        With {
            builtin_policy: true,
            ..With::default()
        },
    );
    assert_eq!(e.code, 2, "{}", e.ctx());
    assert_eq!(e.verdict["task"], "contract+bench+selftests", "{}", e.ctx());
    let plan = e.verdict["plan"].as_array().unwrap();
    assert_eq!(plan[0]["verdict"], "APPROVE", "{}", e.ctx());
    assert_eq!(plan[1]["verdict"], "APPROVE", "{}", e.ctx());
    assert_eq!(plan[2]["provenance"], "self_reported", "{}", e.ctx());
    assert_eq!(plan[2]["verdict"], "NEEDS_REVISION", "{}", e.ctx());
    assert!(e.summary().contains("self-reported"), "{}", e.ctx());
}

/// A subject's budgets still apply once its judge is done: a subject that forks past its
/// pids budget when its input ends (as the judge exits) is stopped with the judge, and
/// what the kernel counted until then (the refused forks) is still a REJECT naming pids,
/// not the judge's APPROVE. (Before, a stopped subject's final sample was thrown away.)
#[test]
fn a_subject_that_blows_its_pids_budget_as_its_judge_ends_is_a_reject() {
    need_root!();
    let env = Env::new("judge-eof-bomb");
    // After the stdin loop (EOF: the judge has exited), 40 forks that stay alive.
    let bomb = env.dir.join("eof-bomb.diff");
    std::fs::write(
        &bomb,
        r#"diff --git a/hermes/__main__.py b/hermes/__main__.py
--- a/hermes/__main__.py
+++ b/hermes/__main__.py
@@ -47,6 +47,14 @@
             reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
         stdout.write(json.dumps(reply, separators=(",", ":")) + "\n")
         stdout.flush()
+    import os, time
+    for _ in range(40):
+        try:
+            if os.fork() == 0:
+                time.sleep(5); os._exit(0)
+        except OSError:
+            break
+    time.sleep(5)
     return 0
 
 
"#,
    )
    .unwrap();
    let e = evaluate(
        &env,
        &bomb,
        &demo(),
        "eof-bomb",
        &["--task", "contract", "--pids", "8", "--no-ledger"],
    );
    assert_eq!(e.code, 1, "{}", e.ctx());
    assert_eq!(e.verdict["budget"]["exceeded"], "pids", "{}", e.ctx());
    assert!(e.summary().contains("pids"), "{}", e.ctx());
}
