//! A judged run: the subject (the task's `command`, from the patched tree) and its judge
//! (the task's `judge`, from an unpatched copy of the parent's tree) in two sandboxes of
//! their own, each with its own uid, connected only by two pipes the supervisor makes:
//!
//! ```text
//!   judge fd 4 ──pipe──▶ subject stdin
//!   judge fd 3 ◀──pipe── subject stdout
//! ```
//!
//! The judge's own stdin is /dev/null and its stdout and stderr go to its log; the
//! subject's stderr goes to its log. Only what the judge writes to its `$FORK_REPORTS` is
//! evidence: the subject's own reports and logs are artifacts, never read as results. The
//! judge gets a per-run secret seed (`FORK_SEED`) the subject never sees. When the judge
//! ends, the subject is stopped. The subject's environment holds no `FORK_*` variable.

use super::collect::{collect, Collected, Reading, RunResult, Stager};
use super::plan::{Plan, TaskPlan};
use super::prepare::{doors_for, prepare_side, Prepared};
use super::{internal, EvaluateError};
use crate::sandbox::{Command, Outcome, Sandbox, WORKSPACE};
use crate::verdict::ArtifactType;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The descriptor numbers the judge reads the subject's stdout on, and writes its stdin on.
pub const FROM_SUBJECT_FD: i32 = 3;
pub const TO_SUBJECT_FD: i32 = 4;

/// A judged subject's environment: the successor's, without any `FORK_*` variable.
pub fn subject_env(env: &[(String, String)]) -> Vec<(String, String)> {
    env.iter()
        .filter(|(k, _)| !k.starts_with("FORK_"))
        .cloned()
        .collect()
}

/// A log on a sandbox's own disk under a name the successor cannot predict (so a file it
/// planted is never adopted), read back through this descriptor.
fn log_file(sb: &Sandbox, role: &str) -> Result<std::fs::File, EvaluateError> {
    let path = sb
        .disk()
        .join(format!(".fork-{role}-{}.log", crate::rundir::new_run_id()));
    std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .append(true)
        .open(&path)
        .map_err(|e| internal("creating a log")(e.to_string()))
}

/// One judged attempt: `subject` is the prepared (patched, or baseline) sandbox; the judge
/// gets a sandbox of its own, prepared here from the unpatched tree and destroyed before
/// this returns.
pub fn run_judged(
    p: &Plan,
    t: &TaskPlan,
    subject: &mut Sandbox,
    subject_env: &[(String, String)],
    staging: &Path,
    source: &crate::fork::TreeListing,
    stage: &Stager<'_>,
) -> Result<RunResult, EvaluateError> {
    let judge_argv = t
        .spec
        .judge
        .clone()
        .ok_or_else(|| EvaluateError::Internal("a judged run without a judge".into()))?;
    let source_dir = p.runtime.join(&p.manifest.runtime.source);
    let mut judge_sb = match prepare_side(p, t, &source_dir, &staging.join("state"), None, source)?
    {
        Prepared::Ready(side) => side.into_sandbox(),
        Prepared::DidNotApply(m, _) => {
            return Err(EvaluateError::Internal(format!(
                "preparing the judge's tree: {m}"
            )))
        }
    };
    let judge_env = p.policy.successor_env(&[
        ("FORK_REPORTS".to_string(), format!("{WORKSPACE}/reports")),
        ("FORK_STATE".to_string(), format!("{WORKSPACE}/state")),
        ("FORK_TOOLS".to_string(), format!("{WORKSPACE}/tools")),
        ("FORK_RUN_ID".to_string(), p.run_id.clone()),
        ("FORK_TASK".to_string(), t.name.clone()),
        ("FORK_SEED".to_string(), p.judge_seed.to_string()),
    ]);
    let subject_log = log_file(subject, "subject")?;
    let judge_log = log_file(&judge_sb, "judge")?;
    let flags = nix::fcntl::OFlag::O_CLOEXEC;
    let (to_subject_r, to_subject_w) =
        nix::unistd::pipe2(flags).map_err(|e| internal("pipe")(e.to_string()))?;
    let (from_subject_r, from_subject_w) =
        nix::unistd::pipe2(flags).map_err(|e| internal("pipe")(e.to_string()))?;
    let remaining = p
        .deadline
        .saturating_duration_since(std::time::Instant::now());
    subject.clamp_wall(remaining);
    judge_sb.clamp_wall(remaining);
    let stop_subject = Arc::new(AtomicBool::new(false));
    let subject_cmd = Command {
        argv: t.spec.command.clone(),
        env: subject_env.to_vec(),
        cwd: PathBuf::from(WORKSPACE).join("src"),
        output: Some(&subject_log),
        stdin: Some(to_subject_r),
        stdout: Some(from_subject_w),
        cancel: Some(stop_subject.clone()),
        doors: doors_for(p, t)?,
        ..Command::new(Vec::new(), Vec::new())
    };
    let (judge_out, subject_out) = std::thread::scope(|s| {
        let judge = s.spawn(|| {
            let r = judge_sb.run(Command {
                argv: judge_argv,
                env: judge_env,
                cwd: PathBuf::from(WORKSPACE).join("src"),
                output: Some(&judge_log),
                pass_fds: vec![
                    (FROM_SUBJECT_FD, from_subject_r),
                    (TO_SUBJECT_FD, to_subject_w),
                ],
                ..Command::new(Vec::new(), Vec::new())
            });
            // The judge has spoken (or failed): the subject has nothing more to do.
            stop_subject.store(true, Ordering::SeqCst);
            r
        });
        let subject = subject.run(subject_cmd);
        let judge = judge
            .join()
            .map_err(|_| EvaluateError::Internal("the judge's supervising thread panicked".into()));
        (judge, subject)
    });
    let judge_out = judge_out??;
    let subject_out = subject_out?;
    if judge_out.interrupted || subject_out.interrupted {
        return Err(EvaluateError::Interrupted);
    }
    // The protected tree as the subject's workspace shows it, before any result is read.
    let protected_changes = super::protect::check(
        staging,
        &subject.workspace().join("src"),
        &p.manifest.runtime.exclude,
    )?;
    // Evidence: the judge's reports alone. The subject's reports and log: artifacts.
    let mut judged = collect(
        p,
        &t.spec,
        &judge_sb.disk(),
        &judge_log,
        stage,
        Reading::Evidence,
    )?;
    let subject_prefix = format!("{}subject-", stage.prefix);
    let subject_stage = Stager {
        dir: stage.dir,
        prefix: &subject_prefix,
    };
    let own = collect(
        p,
        &t.spec,
        &subject.disk(),
        &subject_log,
        &subject_stage,
        Reading::ArtifactsOnly,
    )?;
    judge_sb.destroy()?;
    let mut artifacts = std::mem::take(&mut judged.artifacts);
    artifacts.extend(own.artifacts);
    for (name, o) in [("judge.json", &judge_out), ("sandbox.json", &subject_out)] {
        let json = serde_json::to_vec_pretty(o).map_err(|e| internal("staging")(e.to_string()))?;
        artifacts.push((ArtifactType::Other, stage.put(name, &json)?));
    }
    let (outcome, over_evaluation_wall, judge_failed) =
        speaking_outcome(t, subject, subject_out, judge_out);
    let judged = believed(judged, judge_failed);
    Ok(RunResult {
        over_evaluation_wall,
        outcome,
        tests: judged.tests,
        results_error: judged.results_error,
        notes: Vec::new(),
        protected_changes,
        metrics: judged.metrics,
        metrics_error: judged.metrics_error,
        artifacts,
    })
}

/// What a judge's reports are evidence of: all of it, or nothing when the judge failed
/// (`judge_failed` says how): then its reports, if any, are not believed, its tests and
/// metrics are dropped (a baseline's samples would otherwise take them in) and the
/// failure is the results' error. The artifacts are kept either way.
fn believed(judged: Collected, judge_failed: Option<String>) -> Collected {
    match judge_failed {
        None => judged,
        Some(failure) => Collected {
            tests: None,
            results_error: Some(failure),
            metrics: None,
            metrics_error: None,
            artifacts: judged.artifacts,
        },
    }
}

/// The outcome that speaks for a judged run: the subject's when it blew a budget or could
/// not start (the patch's doing), else the judge's (its exit status says whether its checks
/// passed). A judge that blew a budget or could not start is the judge's failure, named
/// (the third value): no evidence, never an APPROVE. The usage is the subject's.
fn speaking_outcome(
    t: &TaskPlan,
    subject_sb: &Sandbox,
    subject: Outcome,
    judge: Outcome,
) -> (Outcome, bool, Option<String>) {
    let over = |o: &Outcome, wall: std::time::Duration| {
        o.budget_exceeded == Some(crate::sandbox::BudgetKind::Wall) && wall < t.budgets.wall
    };
    // A subject that only ran out of wall time while its judge did too was waiting on the
    // judge (a judge bounds every call it makes): that is the judge's failure.
    let waited_on_judge = subject.budget_exceeded == Some(crate::sandbox::BudgetKind::Wall)
        && judge.budget_exceeded.is_some();
    if (subject.budget_exceeded.is_some() && !waited_on_judge) || subject.exec_error.is_some() {
        let o = over(&subject, subject_sb.limits().wall);
        return (subject, o, None);
    }
    let failed = match (&judge.budget_exceeded, &judge.exec_error) {
        (Some(b), _) if !over(&judge, subject_sb.limits().wall) => Some(format!(
            "the judge failed: it exceeded its {} budget; its reports are not evidence",
            b.as_str()
        )),
        (_, Some(e)) => Some(format!("the judge could not start: {e}")),
        _ => None,
    };
    let o = over(&judge, subject_sb.limits().wall);
    let mut speaking = judge;
    if failed.is_some() {
        // Not the patch's budget: the verdict names the judge's failure instead.
        speaking.budget_exceeded = None;
        speaking.exec_error = None;
    }
    speaking.usage = subject.usage;
    speaking.isolation = subject.isolation;
    (speaking, o, failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A judge that failed after writing its reports leaves none of them as evidence: not
    /// its metrics (which a baseline's samples took in), not its tests; its failure is the
    /// results' error. A judge that did not fail is believed.
    #[test]
    fn a_failed_judges_reports_are_not_believed() {
        let judged = || Collected {
            tests: Some(Default::default()),
            results_error: None,
            metrics: Some([("x".to_string(), 1.0)].into_iter().collect()),
            metrics_error: Some("m.json: bad".into()),
            artifacts: vec![(ArtifactType::Metrics, PathBuf::from("metrics.json"))],
        };
        let failure = "the judge failed: it exceeded its wall budget; its reports are not evidence";
        let c = believed(judged(), Some(failure.into()));
        assert_eq!(c.tests, None);
        assert_eq!(c.metrics, None);
        assert_eq!(c.metrics_error, None);
        assert_eq!(c.results_error.as_deref(), Some(failure));
        assert_eq!(
            c.artifacts.len(),
            1,
            "its reports are still kept as artifacts"
        );
        let c = believed(judged(), None);
        assert!(c.tests.is_some() && c.metrics.is_some() && c.metrics_error.is_some());
        assert_eq!(c.results_error, None);
    }
}
