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
        let name = m["name"].as_str().unwrap_or("");
        let change = m["change"].as_f64().unwrap_or(0.0);
        let lower_is_better = matches!(name, "ratio" | "compressed_bytes" | "p99_ms");
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
        let e = evaluate(
            &env,
            &hack(name),
            &demo(),
            name,
            &["--task", "judged", "--no-ledger"],
        );
        assert!(
            matches!(e.code, 1 | 2),
            "{name} must not be approved: {}",
            e.ctx()
        );
        assert_eq!(e.verdict["provenance"], "judge", "{name}: {}", e.ctx());
        invents_no_gain(&e);
    }
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
        &["--task", "judged", "--no-ledger"],
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
