//! Phases 2-4 for one side: FORK (a sandbox whose workspace holds the source, tools and
//! state snapshot), PATCH (the patched side only), EVALUATE (the task, with reruns of
//! failing tests), and what the successor left read back with care. Each side's sandbox
//! is destroyed before the next starts.

use super::collect::{collect, Reading, Stager};
use super::plan::Plan;
use super::{check_interrupt, internal, EvaluateError};
use crate::fork::workspace::{copy_tree, deploy_tree_hash, tree_hash, Workspace};
use crate::patch::{self, Patch};
use crate::sandbox::{Command, Outcome, Sandbox, WORKSPACE};
use crate::task::results;
use crate::verdict::ArtifactType;
use std::path::{Path, PathBuf};

/// What one run of the task (after its reruns) produced.
pub struct RunResult {
    pub outcome: Outcome,
    /// The run was ended by the evaluation's own wall budget (its per-run wall had been
    /// lowered to what the evaluation had left).
    pub over_evaluation_wall: bool,
    pub tests: Option<results::TestReport>,
    pub results_error: Option<String>,
    pub metrics: Option<std::collections::BTreeMap<String, f64>>,
    pub metrics_error: Option<String>,
    /// Copies of the report files and the output log, in the staging directory.
    pub artifacts: Vec<(ArtifactType, PathBuf)>,
    /// What fork could not do with what the successor left (a rerun it could not prepare),
    /// for the verdict's caveats.
    pub notes: Vec<String>,
}

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

/// A sandbox with its workspace populated (and patched, on the patched side).
pub struct PreparedSide {
    sb: Sandbox,
    ws: Workspace,
    pub source_hash: String,
    /// [`deploy_tree_hash`] of the patched tree (the patched side only).
    pub patched_tree_hash: Option<String>,
}

impl PreparedSide {
    /// The sandbox alone (its workspace stays populated on its disk).
    pub fn into_sandbox(self) -> Sandbox {
        self.sb
    }
}

pub enum Prepared {
    Ready(Box<PreparedSide>),
    /// The patch did not apply (message), with the unpatched tree hash.
    DidNotApply(String, String),
}

/// FORK (and PATCH) for one run: a sandbox whose workspace holds the source (patched when
/// `patch` is given), the tools and the state snapshot.
pub fn prepare_side(
    p: &Plan,
    source_dir: &Path,
    snap_dir: &Path,
    patch: Option<&Patch>,
) -> Result<Prepared, EvaluateError> {
    let sb = Sandbox::prepare(&p.spec)?;
    let ws = Workspace::create(&sb.workspace())
        .map_err(|e| internal("creating the workspace")(e.to_string()))?;
    copy_tree(source_dir, &ws.src(), &p.manifest.runtime.exclude)
        .map_err(|e| internal("copying the source tree")(e.to_string()))?;
    if let Some(t) = &p.manifest.runtime.tools {
        copy_tree(&p.runtime.join(t), &ws.tools(), &[])
            .map_err(|e| internal("copying the tools")(e.to_string()))?;
    }
    copy_tree(snap_dir, &ws.state(), &[])
        .map_err(|e| internal("copying the state snapshot")(e.to_string()))?;
    check_interrupt()?;
    // 3 PATCH (the patched side only).
    if let Some(patch) = patch {
        if let Err(e) = patch::apply(&ws.src(), patch) {
            let h =
                tree_hash(&ws.src()).map_err(|e| internal("hashing the source")(e.to_string()))?;
            sb.destroy()?;
            return Ok(Prepared::DidNotApply(e.to_string(), h));
        }
    }
    let source_hash =
        tree_hash(&ws.src()).map_err(|e| internal("hashing the source")(e.to_string()))?;
    // The tree the successor runs, hashed before it runs (it may write into src/).
    let patched_tree_hash = match patch {
        Some(_) => Some(
            deploy_tree_hash(&ws.src(), &p.manifest.runtime.exclude)
                .map_err(|e| internal("hashing the patched tree")(e.to_string()))?,
        ),
        None => None,
    };
    Ok(Prepared::Ready(Box::new(PreparedSide {
        sb,
        ws,
        source_hash,
        patched_tree_hash,
    })))
}

/// EVALUATE one prepared side (with reruns of failing tests), read its results, destroy it.
pub fn run_side(
    p: &Plan,
    prepared: PreparedSide,
    staging: &Path,
    side: &str,
) -> Result<RunResult, EvaluateError> {
    let PreparedSide { mut sb, ws, .. } = prepared;
    // 4 EVALUATE
    let mut extra = vec![
        ("FORK_REPORTS".to_string(), format!("{WORKSPACE}/reports")),
        ("FORK_STATE".to_string(), format!("{WORKSPACE}/state")),
        ("FORK_TOOLS".to_string(), format!("{WORKSPACE}/tools")),
        ("FORK_RUN_ID".to_string(), p.run_id.clone()),
        ("FORK_TASK".to_string(), p.task_name.clone()),
        ("FORK_SIDE".to_string(), side.to_string()),
    ];
    if let Some(g) = &p.gateway {
        extra.push(("FORK_MODEL_URL".to_string(), g.cfg.task_url()));
    }
    for (k, v) in &p.task.env {
        extra.push((k.clone(), v.clone()));
    }
    let env = p.policy.successor_env(&extra);
    // A judged subject sees no FORK_* variable: nothing tells it that it is being judged.
    let env = if p.task.judge.is_some() {
        super::judge::subject_env(&env)
    } else {
        env
    };
    let side_dir = staging.join(side);
    std::fs::create_dir_all(&side_dir).map_err(|e| internal("staging")(e.to_string()))?;
    // Artifact names: tests.xml, metrics.json, ... for the first patched run; `<side>-*` for
    // the others; `-retryN` for reruns of a run whose tests failed.
    let base_prefix = if side == "patched" {
        String::new()
    } else {
        format!("{side}-")
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
        let r = if p.task.judge.is_some() {
            let stage = Stager {
                dir: &side_dir,
                prefix: &prefix,
            };
            super::judge::run_judged(p, &mut sb, &env, staging, &stage)?
        } else {
            run_attempt(p, &mut sb, &env, &side_dir, &prefix, &log)?
        };
        let failed = r.outcome.budget_exceeded.is_none()
            && r.outcome.exec_error.is_none()
            && r.tests.as_ref().is_some_and(|t| t.failed() > 0);
        attempts.push(r);
        if !failed {
            break;
        }
        check_interrupt()?;
    }
    drop(log);
    // 6 DESTROY this side's sandbox now.
    sb.destroy()?;
    let mut merged = merge_attempts(attempts);
    merged.notes.extend(notes);
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

/// Replaces the reports directory with an empty one owned by the sandbox's uid.
fn fresh_reports(sb: &Sandbox, ws: &Workspace) -> Result<(), String> {
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

/// Longest staged artifact name kept from a name the successor chose (well below NAME_MAX,
/// with room for the side and retry prefixes).
const MAX_STAGED_NAME: usize = 96;

/// A staging file name for a report file the successor named: only `[A-Za-z0-9._-]` (as
/// the bundle names artifacts), at most [`MAX_STAGED_NAME`] bytes (a longer name is cut and
/// keeps a digest of the whole, so two long names stay apart).
pub(super) fn staged_report_name(name: &str) -> String {
    let safe = crate::verdict::bundle::sanitize_name(name);
    let full = format!("report-{safe}");
    if full.len() <= MAX_STAGED_NAME {
        return full;
    }
    let digest = &super::sha256_hex(name.as_bytes())[..16];
    format!("{}-{digest}", &full[..MAX_STAGED_NAME - 17])
}

/// One run of the task in a prepared sandbox, and what it left in its reports directory.
fn run_attempt(
    p: &Plan,
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
        argv: p.task.command.clone(),
        env: env.to_vec(),
        cwd: PathBuf::from(WORKSPACE).join("src"),
        output: Some(log),
        doors: doors_for(p)?,
        ..Command::new(Vec::new(), Vec::new())
    })?;
    if outcome.interrupted {
        return Err(EvaluateError::Interrupted);
    }
    // The successor is dead: read what it left (hostile input, read with care).
    let stage = Stager {
        dir: side_dir,
        prefix,
    };
    let c = collect(p, &sb.disk(), log, &stage, Reading::Evidence)?;
    let json =
        serde_json::to_vec_pretty(&outcome).map_err(|e| internal("staging")(e.to_string()))?;
    let mut artifacts = c.artifacts;
    artifacts.push((ArtifactType::Other, stage.put("sandbox.json", &json)?));
    let over_evaluation_wall = outcome.budget_exceeded == Some(crate::sandbox::BudgetKind::Wall)
        && sb.limits().wall < p.policy.budgets.wall;
    Ok(RunResult {
        over_evaluation_wall,
        outcome,
        tests: c.tests,
        results_error: c.results_error,
        metrics: c.metrics,
        metrics_error: c.metrics_error,
        artifacts,
        notes: Vec::new(),
    })
}

/// The doors of one run: the forwards and, with a gateway, the metered model door (a
/// fresh gateway per run, on that run's runtime, sharing the evaluation's meter).
pub fn doors_for(p: &Plan) -> Result<crate::sandbox::Doors, EvaluateError> {
    let mut doors = crate::sandbox::Doors {
        doors: p
            .forwards
            .iter()
            .map(|a| crate::sandbox::Door::forward(*a))
            .collect(),
        cost: None,
    };
    if let Some(g) = &p.gateway {
        let gw =
            crate::gateway::Gateway::new(g.cfg.clone(), g.credentials.clone(), g.meter.clone())
                .map_err(|e| EvaluateError::Input(format!("the model gateway: {e}")))?;
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], g.cfg.port()));
        if p.forwards.contains(&addr) {
            return Err(EvaluateError::Input(format!(
                "the model gateway's port {} is also forwarded: choose another gateway.port",
                g.cfg.port()
            )));
        }
        doors.doors.push(crate::sandbox::Door {
            addr,
            serve: Box::new(move |l| Box::pin(gw.serve(l))),
        });
        doors.cost = Some(g.meter.clone());
    }
    Ok(doors)
}

/// Folds the attempts of one run (the first, then reruns after failing tests) into one
/// result: the last attempt's outcome, with every test that failed before but passed in
/// the end marked flaky (naming the retries it needed); all attempts' artifacts.
fn merge_attempts(mut attempts: Vec<RunResult>) -> RunResult {
    let n = attempts.len();
    let mut artifacts: Vec<(ArtifactType, PathBuf)> = Vec::new();
    for a in &attempts {
        artifacts.extend(a.artifacts.iter().cloned());
    }
    let earlier_failures: Vec<std::collections::HashSet<String>> = attempts
        .iter()
        .map(|a| {
            a.tests
                .as_ref()
                .map(|t| {
                    t.cases
                        .iter()
                        .filter(|c| {
                            matches!(
                                c.outcome,
                                results::TestOutcome::Failed | results::TestOutcome::Error
                            )
                        })
                        .map(|c| c.name.clone())
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect();
    // Invariant: run_side always makes at least one attempt.
    let mut last = attempts.pop().expect("at least one attempt");
    if n > 1 {
        if let Some(t) = last.tests.as_mut() {
            for case in t.cases.iter_mut() {
                if case.outcome != results::TestOutcome::Passed {
                    continue;
                }
                let failed_in: usize = earlier_failures[..n - 1]
                    .iter()
                    .filter(|s| s.contains(&case.name))
                    .count();
                if failed_in > 0 {
                    case.outcome = results::TestOutcome::Flaky;
                    case.message = Some(format!(
                        "failed in {failed_in} of {n} runs, passed on retry {}",
                        n - 1
                    ));
                }
            }
        }
    }
    last.artifacts = artifacts;
    last
}
