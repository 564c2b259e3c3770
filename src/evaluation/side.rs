//! Phases 2-4 for one side: FORK (a sandbox whose workspace holds the source, tools and
//! state snapshot), PATCH (the patched side only), EVALUATE (the task, with reruns of
//! failing tests), and what the successor left read back with care. Each side's sandbox
//! is destroyed (on a thread, overlapping what follows) before the next starts.

use super::collect::{collect, Reading, RunResult, Stager};
use super::plan::{Plan, TaskPlan};
use super::prepare::{doors_for, PreparedSide};
use super::{check_interrupt, internal, EvaluateError};
use crate::fork::workspace::Workspace;
use crate::sandbox::{Command, Sandbox, WORKSPACE};
use crate::task::results;
use crate::verdict::ArtifactType;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// `patched`, `patched.r2`, `replica2`, `replica2.r3`, `baseline`, `baseline.r2`.
pub fn side_label(side: &str, replica: usize, round: usize, replicas: usize) -> String {
    let base = if side == "patched" && replicas > 1 && replica > 0 {
        format!("replica{}", replica + 1)
    } else {
        side.to_string()
    };
    if round == 0 {
        base
    } else {
        format!("{base}.r{}", round + 1)
    }
}

/// EVALUATE one prepared side (with reruns of failing tests), read its results, destroy it.
/// `source`: the runtime's source tree the evaluation began with, which a judge's copy
/// must be too.
pub fn run_side(
    p: &Plan,
    t: &TaskPlan,
    prepared: PreparedSide,
    staging: &Path,
    source: &crate::fork::TreeListing,
    side: &str,
) -> Result<RunResult, EvaluateError> {
    let PreparedSide { mut sb, ws, .. } = prepared;
    // 4 EVALUATE
    let mut extra = vec![
        ("FORK_REPORTS".to_string(), format!("{WORKSPACE}/reports")),
        ("FORK_STATE".to_string(), format!("{WORKSPACE}/state")),
        ("FORK_TOOLS".to_string(), format!("{WORKSPACE}/tools")),
        ("FORK_RUN_ID".to_string(), p.run_id.clone()),
        ("FORK_TASK".to_string(), t.name.clone()),
        ("FORK_SIDE".to_string(), side.to_string()),
    ];
    if let Some(g) = &p.gateway {
        extra.push(("FORK_MODEL_URL".to_string(), g.cfg.task_url()));
    }
    for (k, v) in &t.spec.env {
        extra.push((k.clone(), v.clone()));
    }
    let env = p.policy.successor_env(&extra);
    // A judged subject sees no FORK_* variable: nothing tells it that it is being judged.
    let env = if t.spec.judge.is_some() {
        super::judge::subject_env(&env)
    } else {
        env
    };
    let side_dir = staging.join(format!("{}{side}", t.prefix));
    std::fs::create_dir_all(&side_dir).map_err(|e| internal("staging")(e.to_string()))?;
    // Artifact names: tests.xml, metrics.json, ... for the first patched run; `<side>-*` for
    // the others; `-retryN` for reruns of a run whose tests failed.
    let base_prefix = if side == "patched" {
        t.prefix.clone()
    } else {
        format!("{}{side}-", t.prefix)
    };
    // The output log: created before the successor first runs, under a name it cannot
    // predict, and read back and emptied through our own descriptor for every attempt.
    let log = create_output_log(&sb.disk())?;
    let mut attempts: Vec<RunResult> = Vec::new();
    let mut notes = Vec::new();
    let max_attempts = 1 + p.policy.decision.reruns;
    for attempt in 0..max_attempts {
        let prefix = if attempt == 0 {
            base_prefix.clone()
        } else {
            format!("{base_prefix}retry{attempt}-")
        };
        if attempt > 0 {
            // A fresh reports directory; the rest of the workspace is kept, as a flaky test's
            // own state would be. What the successor left may defeat that: then there is no
            // rerun, the failing attempt stands, and the verdict says why.
            if let Err(e) = fresh_reports(&sb, &ws) {
                notes.push(format!(
                    "the failing tests were not rerun: the workspace the successor left could not be prepared for a rerun ({e})"
                ));
                break;
            }
        }
        super::progress::run_started(&t.name, side, attempt);
        let r = if t.spec.judge.is_some() {
            let stage = Stager {
                dir: &side_dir,
                prefix: &prefix,
            };
            super::judge::run_judged(p, t, &mut sb, &env, staging, source, &stage)?
        } else {
            run_attempt(p, t, &mut sb, &env, &side_dir, &prefix, &log)?
        };
        super::progress::run_finished(&t.name, side, attempt, &r);
        // A changed protected tree is a REJECT already (and the workspace it left is not
        // one to serve the protected tree over again): no rerun.
        let failed = r.outcome.budget_exceeded.is_none()
            && r.outcome.exec_error.is_none()
            && r.protected_changes.is_empty()
            && r.tests.as_ref().is_some_and(|t| t.failed() > 0);
        attempts.push(r);
        if !failed {
            break;
        }
        check_interrupt()?;
    }
    drop(log);
    // 6 DESTROY this side's sandbox now, on a thread of its own: joined before the next
    // sandbox is made and before the verdict is published (see `teardowns`).
    p.teardowns.destroy(sb)?;
    let mut merged = merge_attempts(attempts);
    merged.notes.extend(notes);
    // The evidence leaves here, redacted once (its artifacts were as they were staged):
    // after the attempts are merged, which matches failures by the names as reported.
    let metrics_path = t.spec.metrics.as_deref().unwrap_or("metrics");
    merged.redact(&p.redactor, metrics_path);
    Ok(merged)
}

/// Creates the output log on the sandbox's disk under a random name (`create_new`, so an
/// existing file is never adopted).
fn create_output_log(disk: &Path) -> Result<std::fs::File, EvaluateError> {
    let name = format!(".fork-output-{}.log", crate::rundir::new_run_id());
    std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .append(true)
        .open(disk.join(name))
        .map_err(|e| internal("creating the output log")(e.to_string()))
}

/// Replaces the reports directory with an empty one owned by the sandbox's uid. The
/// workspace the last attempt's successor left is checked first: a link where fork's own
/// directories should be (to a host path) is never followed, and there is no rerun.
fn fresh_reports(sb: &Sandbox, ws: &Workspace) -> Result<(), String> {
    sb.own_dirs().map_err(|e| e.to_string())?;
    let reports = ws.reports();
    match std::fs::symlink_metadata(&reports) {
        Ok(m) if m.is_dir() => {
            crate::fork::workspace::remove_tree(&reports).map_err(|e| e.to_string())?
        }
        Ok(_) => std::fs::remove_file(&reports).map_err(|e| e.to_string())?,
        Err(_) => {}
    }
    std::fs::create_dir(&reports).map_err(|e| format!("creating the reports directory: {e}"))?;
    sb.chown_workspace().map_err(|e| e.to_string())
}

/// One run of the task in a prepared sandbox, and what it left in its reports directory.
fn run_attempt(
    p: &Plan,
    t: &TaskPlan,
    sb: &mut Sandbox,
    env: &[(String, String)],
    side_dir: &Path,
    prefix: &str,
    log: &std::fs::File,
) -> Result<RunResult, EvaluateError> {
    // The successor's output goes to a log on its own capped disk, read back through our fd
    // (emptied first: an earlier attempt's output is that attempt's artifact).
    log.set_len(0)
        .map_err(|e| internal("emptying the output log")(e.to_string()))?;
    // The evaluation's own wall budget bounds every run: a run gets at most what is left.
    sb.clamp_wall(
        p.deadline
            .saturating_duration_since(std::time::Instant::now()),
    );
    let outcome = sb.run(Command {
        argv: t.spec.command.clone(),
        env: env.to_vec(),
        cwd: PathBuf::from(WORKSPACE).join("src"),
        output: Some(log),
        doors: doors_for(p, t)?,
        ..Command::new(Vec::new(), Vec::new())
    })?;
    if outcome.interrupted {
        return Err(EvaluateError::Interrupted);
    }
    // The protected tree, before any result is read.
    // Fail closed: the protected tree is always checked against the staging copy.
    let staging = side_dir.parent().ok_or_else(|| {
        EvaluateError::Internal(format!(
            "the side directory {} has no staging directory above it",
            side_dir.display()
        ))
    })?;
    let protected_changes = super::protect::check(
        staging,
        &sb.workspace().join("src"),
        &p.manifest.runtime.exclude,
    )?;
    // The successor is dead: read what it left (hostile input, read with care).
    let stage = Stager {
        dir: side_dir,
        prefix,
    };
    let c = collect(p, &t.spec, &sb.disk(), log, &stage, Reading::Evidence)?;
    let json =
        serde_json::to_vec_pretty(&outcome).map_err(|e| internal("staging")(e.to_string()))?;
    let mut artifacts = c.artifacts;
    artifacts.push((ArtifactType::Other, stage.put("sandbox.json", &json)?));
    let over_evaluation_wall = outcome.budget_exceeded == Some(crate::sandbox::BudgetKind::Wall)
        && sb.limits().wall < t.budgets.wall;
    Ok(RunResult {
        over_evaluation_wall,
        outcome,
        tests: c.tests,
        results_error: c.results_error,
        metrics: c.metrics,
        metrics_error: c.metrics_error,
        artifacts,
        notes: Vec::new(),
        protected_changes,
    })
}

/// Folds the attempts of one run (the first, then reruns after failing tests) into one
/// result: the last attempt's outcome, with every test that failed before but passed in
/// the end marked flaky (naming the retries it needed), and every test that failed before
/// and was not shown to pass in the end (absent from the last report, or skipped there)
/// still failed, saying so; all attempts' artifacts.
fn merge_attempts(mut attempts: Vec<RunResult>) -> RunResult {
    let mut artifacts: Vec<(ArtifactType, PathBuf)> = Vec::new();
    for a in &attempts {
        artifacts.extend(a.artifacts.iter().cloned());
    }
    // A change to the protected tree in any attempt counts.
    let mut protected: Vec<_> = attempts
        .iter()
        .flat_map(|a| a.protected_changes.iter().cloned())
        .collect();
    protected.sort();
    protected.dedup();
    // Invariant: run_side always makes at least one attempt.
    let mut last = attempts.pop().expect("at least one attempt");
    last.protected_changes = protected;
    if let Some(t) = last.tests.as_mut() {
        carry_failures(t, &attempts);
    }
    last.artifacts = artifacts;
    last
}

/// Folds the failures of the `earlier` attempts into the last attempt's report `last`.
/// A rerun is run by the code under test, which may leave a failing test out of its
/// report (or skip it) as easily as pass it: only a pass clears an earlier failure (as
/// flaky); a failure the last report leaves out is carried forward as it last failed, and
/// one it skips is a failure again, each with a message saying why.
fn carry_failures(last: &mut results::TestReport, earlier: &[RunResult]) {
    if earlier.is_empty() {
        return;
    }
    let n = earlier.len() + 1;
    let rerun = n - 1;
    let failing = |c: &&results::TestCase| {
        matches!(
            c.outcome,
            results::TestOutcome::Failed | results::TestOutcome::Error
        )
    };
    // Each earlier failure by name, in the order first seen: how many attempts it failed
    // in, and its latest failing case. (Indexed: the reports are the successor's, as long
    // as their size bound lets them be.)
    let mut failures: Vec<(usize, results::TestCase)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for t in earlier.iter().filter_map(|a| a.tests.as_ref()) {
        let mut seen: HashSet<&str> = HashSet::new();
        for c in t.cases.iter().filter(failing) {
            let first_here = seen.insert(c.name.as_str());
            match index.get(&c.name) {
                Some(&i) => {
                    failures[i].0 += usize::from(first_here);
                    failures[i].1 = c.clone();
                }
                None => {
                    index.insert(c.name.clone(), failures.len());
                    failures.push((1, c.clone()));
                }
            }
        }
    }
    for case in last.cases.iter_mut() {
        let Some((failed_in, before)) = index.get(&case.name).map(|&i| &failures[i]) else {
            continue;
        };
        match case.outcome {
            results::TestOutcome::Passed => {
                case.outcome = results::TestOutcome::Flaky;
                case.message = Some(format!(
                    "failed in {failed_in} of {n} runs, passed on retry {rerun}"
                ));
            }
            results::TestOutcome::Skipped => {
                case.outcome = before.outcome;
                case.message = Some(format!(
                    "failed in {failed_in} of {n} runs and was skipped in rerun {rerun}"
                ));
            }
            _ => {}
        }
    }
    let reported: HashSet<String> = last.cases.iter().map(|c| c.name.clone()).collect();
    for (failed_in, before) in failures {
        if reported.contains(&before.name) {
            continue;
        }
        last.cases.push(results::TestCase {
            message: Some(format!(
                "failed in {failed_in} of {n} runs and was missing from the report of rerun {rerun}{}",
                before
                    .message
                    .as_deref()
                    .map(|m| format!("; it failed with: {m}"))
                    .unwrap_or_default()
            )),
            ..before
        });
    }
}

#[cfg(test)]
mod tests {
    use super::super::evidence::testing::{report, run};
    use super::*;
    use results::TestOutcome::{Error, Failed, Passed, Skipped};

    fn attempt(cases: &[(&str, results::TestOutcome)]) -> RunResult {
        RunResult {
            tests: Some(report(cases)),
            ..run()
        }
    }

    fn outcome_of(r: &RunResult, name: &str) -> Option<results::TestOutcome> {
        r.tests
            .as_ref()
            .and_then(|t| t.cases.iter().find(|c| c.name == name))
            .map(|c| c.outcome)
    }

    /// A test that failed and then passed on a rerun is flaky; one that failed and is
    /// absent from the last rerun's report still failed (the rerun may simply have left it
    /// out), and says so.
    #[test]
    fn a_failure_absent_from_the_rerun_still_failed() {
        let merged = merge_attempts(vec![
            attempt(&[("a", Passed), ("b", Failed), ("c", Failed)]),
            attempt(&[("a", Passed), ("b", Passed)]),
        ]);
        assert_eq!(outcome_of(&merged, "a"), Some(Passed));
        assert_eq!(outcome_of(&merged, "b"), Some(results::TestOutcome::Flaky));
        assert_eq!(outcome_of(&merged, "c"), Some(Failed), "{:?}", merged.tests);
        let t = merged.tests.as_ref().unwrap();
        assert_eq!(t.failed(), 1);
        let c = t.cases.iter().find(|c| c.name == "c").unwrap();
        assert!(
            c.message
                .as_deref()
                .is_some_and(|m| m.contains("missing from the report of rerun 1")),
            "{c:?}"
        );
        // An error in the second of three attempts, absent from the third, counts once.
        let merged = merge_attempts(vec![
            attempt(&[("a", Failed), ("b", Passed)]),
            attempt(&[("a", Failed), ("b", Error)]),
            attempt(&[("a", Passed)]),
        ]);
        assert_eq!(outcome_of(&merged, "a"), Some(results::TestOutcome::Flaky));
        assert_eq!(outcome_of(&merged, "b"), Some(Error), "{:?}", merged.tests);
        assert_eq!(merged.tests.as_ref().unwrap().cases.len(), 2);
    }

    /// A test that failed and is skipped in the last rerun was not shown to pass: it
    /// still failed.
    #[test]
    fn a_failure_skipped_in_the_rerun_still_failed() {
        let merged = merge_attempts(vec![
            attempt(&[("a", Failed), ("s", Skipped)]),
            attempt(&[("a", Skipped), ("s", Skipped)]),
        ]);
        assert_eq!(outcome_of(&merged, "a"), Some(Failed), "{:?}", merged.tests);
        assert_eq!(outcome_of(&merged, "s"), Some(Skipped));
    }

    /// A single attempt is kept as it is.
    #[test]
    fn one_attempt_is_kept_as_is() {
        let merged = merge_attempts(vec![attempt(&[("a", Failed), ("b", Passed)])]);
        assert_eq!(merged.tests, Some(report(&[("a", Failed), ("b", Passed)])));
    }
}
