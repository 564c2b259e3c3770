//! Phase 5, VERDICT: evidence from the runs, the decision per replica and their
//! agreement, the verdict signed into a bundle, recorded in the ledger, CI outputs; and
//! the cache, which answers from an earlier bundle when it still verifies.

use super::plan::{Plan, TaskPlan};
use super::task_run::TaskRun;
use super::{internal, sha256_hex, EvaluateError, Evaluation};
use crate::budget::Exceeded;
use crate::fork::workspace::{copy_tree_beneath, tree_hash};
use crate::identity::{EphemeralKey, NodeKey};
use crate::sandbox::{BudgetKind, Outcome};
use crate::task::results;
use crate::verdict::decide::Decision;
use crate::verdict::plan::TaskVerdict;
use crate::verdict::{
    ArtifactType, BudgetLimits, BudgetReport, BudgetUsed, GateReport, Header, TestCounts, Verdict,
};
use std::path::PathBuf;

/// What a cache lookup needs besides the plan and the key: the tree the patch applies to,
/// the parsed patch, and a scratch directory (in the staging area) to rebuild the patched
/// tree's hash in.
pub struct CacheProbe<'a> {
    pub source_dir: &'a std::path::Path,
    pub patch: &'a crate::patch::Patch,
    pub scratch: PathBuf,
}

/// A verdict the ledger already holds for exactly these inputs, if its bundle still
/// verifies with this node's key and is the very verdict the row recorded for this key (see
/// [`served_verdict_matches`]). Anything else is a miss that says why on stderr.
pub fn cached(
    p: &Plan,
    key: &crate::ledger::CacheKey,
    node: &NodeKey,
    probe: &CacheProbe<'_>,
) -> Result<Option<Evaluation>, EvaluateError> {
    let Some(path) = &p.ledger else {
        return Ok(None);
    };
    let ledger = match crate::ledger::Ledger::open(path) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("verdict cache unavailable: {e}");
            return Ok(None);
        }
    };
    let entry = match ledger.lookup(key) {
        Ok(Some(e)) => e,
        Ok(None) => return Ok(None),
        Err(e) => {
            tracing::warn!("verdict cache: {e}");
            return Ok(None);
        }
    };
    let dir = PathBuf::from(&entry.bundle_dir);
    let verified = match crate::verdict::verify_bundle(&dir, &[node.public()]) {
        Ok(v) => v,
        Err(e) => {
            eprintln!(
                "{}",
                crate::text::safe_text(&format!(
                    "fork: warning: the cached verdict {} no longer verifies ({e}): evaluating again",
                    dir.display()
                ))
            );
            return Ok(None);
        }
    };
    if let Err(why) = served_verdict_matches(p, key, &entry, &verified.verdict, &dir, probe) {
        eprintln!(
            "{}",
            crate::text::safe_text(&format!(
                "fork: warning: not reusing the cached verdict of run {} in {}: {why}; evaluating again",
                entry.run_id,
                dir.display()
            ))
        );
        return Ok(None);
    }
    // Hand the cached bundle over at --out too, so pipelines find it where they asked.
    crate::verdict::bundle::copy_bundle(&dir, &p.out_dir).map_err(|e| match e {
        crate::verdict::BundleError::Exists { path } => {
            out_came_to_exist(&path, &verified.verdict, Some(&dir))
        }
        e => internal("copying the cached bundle")(e.to_string()),
    })?;
    eprintln!(
        "fork: reusing the verdict of run {} (same patch, state, source, task and policy); pass --no-cache to evaluate again",
        entry.run_id
    );
    let mut ev = Evaluation {
        out_dir: p.out_dir.clone(),
        verdict: verified.verdict,
        ci_error: None,
    };
    // The CI outputs, as for a fresh verdict: the tests it listed, kept in the bundle
    // (a bundle from before that file: its first JUnit report, as fork read it then).
    let tests = cached_ci_tests(&ev);
    let rules = plan_rules(p);
    ev.ci_error = write_ci(p, &ev, &rules, tests.as_ref());
    Ok(Some(ev))
}

/// The artifact that keeps the tests a fresh verdict's CI outputs list (every task's
/// speaking run, its reruns merged, redacted), so that a cache hit lists the same.
pub const CI_TESTS_FILE: &str = "ci-tests.json";

/// Writes [`CI_TESTS_FILE`] into `dir` when the plan has tests to list, and says which
/// artifact it is.
pub fn stage_ci_tests(
    c: &Conclusion<'_>,
    dir: &std::path::Path,
) -> Result<Option<(ArtifactType, PathBuf)>, EvaluateError> {
    let Some(tests) = plan_tests(c) else {
        return Ok(None);
    };
    let path = dir.join(CI_TESTS_FILE);
    let doc = serde_json::to_vec(&tests).map_err(|e| internal("ci tests")(e.to_string()))?;
    std::fs::write(&path, doc).map_err(|e| internal("ci tests")(e.to_string()))?;
    Ok(Some((ArtifactType::Other, path)))
}

/// The tests a cached verdict's CI outputs list: its [`CI_TESTS_FILE`] (the bundle was
/// verified, artifacts and all, before this), else, for a bundle written before that file
/// existed, its first test report read as JUnit.
fn cached_ci_tests(ev: &Evaluation) -> Option<results::TestReport> {
    let arts = &ev.verdict.artifacts;
    let kept = arts.iter().find(|a| {
        a.kind == ArtifactType::Other
            && std::path::Path::new(&a.path).file_name() == Some(CI_TESTS_FILE.as_ref())
    });
    match kept {
        Some(a) => std::fs::read(ev.out_dir.join(&a.path))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok()),
        None => arts
            .iter()
            .find(|a| a.kind == ArtifactType::TestReport)
            .and_then(|a| std::fs::read(ev.out_dir.join(&a.path)).ok())
            .and_then(|b| results::parse_junit(&b).ok()),
    }
}

/// Whether the verified bundle a ledger row points to holds the verdict that row recorded
/// for this key: its patch, task and state hashes are the key's, its run id is the row's,
/// its verdict.json has the row's sha256, and its source hash is the tree this key
/// determines (the key's source tree with the patch applied, or unpatched when the patch
/// does not apply: what the verdict records). Says what differs.
fn served_verdict_matches(
    p: &Plan,
    key: &crate::ledger::CacheKey,
    entry: &crate::ledger::Entry,
    v: &Verdict,
    dir: &std::path::Path,
    probe: &CacheProbe<'_>,
) -> Result<(), String> {
    for (name, got, want) in [
        ("patch_hash", &v.patch_hash, &key.patch_hash),
        ("task_hash", &v.task_hash, &key.task_hash),
        ("state_hash", &v.state_hash, &key.state_hash),
        ("run_id", &v.run_id, &entry.run_id),
    ] {
        if got != want {
            return Err(format!(
                "its {name} is {got}, not {want} as the ledger's row says"
            ));
        }
    }
    let doc = std::fs::read(dir.join(crate::verdict::bundle::VERDICT_FILE))
        .map_err(|e| format!("its verdict.json cannot be read: {e}"))?;
    let digest = sha256_hex(&doc);
    if digest != entry.verdict_sha256 {
        return Err(format!(
            "its verdict.json has sha256 {digest}, not {} as the ledger's row says",
            entry.verdict_sha256
        ));
    }
    let expected = patched_source_hash(p, probe)?;
    if v.source_hash != expected {
        return Err(format!(
            "its source_hash is {}, not {expected} (the source tree with this patch applied)",
            v.source_hash
        ));
    }
    Ok(())
}

/// The hash of the tree a verdict for this key records as its source: a copy of the
/// source tree (as a workspace gets it) with the patch applied, or unpatched when it does
/// not apply (the application is atomic), hashed as `side::prepare_side` hashes it.
fn patched_source_hash(p: &Plan, probe: &CacheProbe<'_>) -> Result<String, String> {
    let scratch = &probe.scratch;
    let result = (|| {
        copy_tree_beneath(
            &p.runtime,
            &p.manifest.runtime.source,
            scratch,
            &p.manifest.runtime.exclude,
        )
        .map_err(|e| format!("copying the source to check it: {e}"))?;
        let _ = crate::patch::apply(scratch, probe.patch);
        tree_hash(scratch).map_err(|e| format!("hashing the patched source: {e}"))
    })();
    if let Err(e) = crate::fork::remove_tree(scratch) {
        tracing::warn!("removing {}: {e}", scratch.display());
    }
    result
}

/// The CI outputs of a verdict; a failure is returned, never raised, so that it cannot
/// hide the verdict (the caller shows the verdict first, then the failure).
fn write_ci(
    p: &Plan,
    ev: &Evaluation,
    rules: &crate::verdict::decide::DecisionRules,
    tests: Option<&results::TestReport>,
) -> Option<String> {
    crate::verdict::report::write_ci_outputs(
        &ev.verdict,
        tests,
        rules,
        &ev.out_dir,
        p.ci.junit.as_deref(),
        p.ci.summary.as_deref(),
    )
    .err()
    .map(|e| format!("writing the CI outputs: {e}"))
}

/// Appends the verdict to the ledger, then writes the CI outputs (a failure of those is
/// returned, see [`write_ci`]).
fn record(
    p: &Plan,
    ev: &Evaluation,
    key: &crate::ledger::CacheKey,
    rules: &crate::verdict::decide::DecisionRules,
    tests: Option<&results::TestReport>,
) -> Option<String> {
    if let Some(path) = &p.ledger {
        let verdict_bytes = std::fs::read(ev.out_dir.join("verdict.json")).unwrap_or_default();
        let bundle_dir = std::fs::canonicalize(&ev.out_dir).unwrap_or_else(|_| ev.out_dir.clone());
        let entry = crate::ledger::NewEntry {
            run_id: ev.verdict.run_id.clone(),
            timestamp: ev.verdict.header.timestamp.clone(),
            verdict: ev.verdict.verdict.as_str().to_string(),
            confidence: ev.verdict.confidence,
            task: ev.verdict.task.clone(),
            patch_hash: key.patch_hash.clone(),
            state_hash: key.state_hash.clone(),
            source_hash: key.source_hash.clone(),
            task_hash: key.task_hash.clone(),
            policy_hash: key.policy_hash.clone(),
            bundle_dir: bundle_dir.display().to_string(),
            verdict_sha256: sha256_hex(&verdict_bytes),
        };
        match crate::ledger::Ledger::open(path).and_then(|mut l| l.append(&entry)) {
            Ok(e) => tracing::info!("ledger: appended row {} to {}", e.seq, path.display()),
            Err(e) => eprintln!("fork: warning: the verdict was not recorded in the ledger: {e}"),
        }
    }
    write_ci(p, ev, rules, tests)
}

/// What a verdict is made of, besides the plan: the decision and the evidence behind it.
pub struct Conclusion<'a> {
    /// The plan's decision (its tasks' combined).
    pub decision: Decision,
    pub state_hash: String,
    pub source_hash: String,
    /// The hash of the patched tree the successor ran (none when no patched tree ran).
    pub patched_tree_hash: Option<String>,
    pub gate: GateReport,
    pub artifacts: Vec<(ArtifactType, PathBuf)>,
    /// Every task of the plan, in order: what it gave, or why it did not run.
    pub tasks: Vec<(&'a TaskPlan, Result<&'a TaskRun, String>)>,
}

impl<'a> Conclusion<'a> {
    /// The task whose run speaks for the verdict's budget and isolation: the first whose
    /// decision is the verdict's.
    fn speaking(&self) -> Option<&'a TaskRun> {
        let runs = self.tasks.iter().filter_map(|(_, r)| r.as_ref().ok());
        runs.clone()
            .find(|r| r.decision.verdict == self.decision.verdict)
            .or_else(|| runs.clone().next())
            .copied()
    }
}

/// The rules the plan's metrics are judged by, as the CI outputs word them: the policy's,
/// with each task's lower-is-better metrics (named `task/metric` in a plan of several).
fn plan_rules(p: &Plan) -> crate::verdict::decide::DecisionRules {
    let mut rules = p.policy.decision.clone();
    for t in &p.tasks {
        for m in &t.spec.lower_is_better {
            let m = if p.tasks.len() > 1 {
                format!("{}/{m}", t.name)
            } else {
                m.clone()
            };
            rules.lower_is_better.push(m);
        }
    }
    rules
}

/// The plan's tests as one report for the CI outputs (cases named `task/case` in a plan
/// of several).
fn plan_tests(c: &Conclusion<'_>) -> Option<results::TestReport> {
    let multi = c.tasks.len() > 1;
    let mut out: Option<results::TestReport> = None;
    for (t, run) in &c.tasks {
        let Some(tests) = run.as_ref().ok().and_then(|r| r.primary.tests.as_ref()) else {
            continue;
        };
        let report = out.get_or_insert_with(Default::default);
        report.cases.extend(tests.cases.iter().map(|case| {
            let mut case = case.clone();
            if multi {
                case.name = format!("{}/{}", t.name, case.name);
            }
            case
        }));
    }
    out
}

/// A task's budget: its limits and what the run that speaks for it used.
fn budget_report(
    p: &Plan,
    b: &crate::budget::Budgets,
    outcome: Option<&Outcome>,
    exceeded: Option<Exceeded>,
) -> BudgetReport {
    let limits = BudgetLimits {
        wall_s: Some(b.wall.as_secs_f64()),
        cpu_percent: Some(b.cpu_percent),
        memory_bytes: Some(b.memory_bytes),
        disk_bytes: Some(b.disk_bytes),
        pids: Some(b.pids),
        api_cost_usd: Some(b.api_cost_usd),
        cpu_time_s: b.cpu_time.map(|d| d.as_secs_f64()),
        evaluation_wall_s: Some(b.evaluation_wall.as_secs_f64()),
    };
    let mut used = outcome
        .map(|o| BudgetUsed {
            wall_s: o.usage.wall_s,
            cpu_s: o.usage.cpu_s,
            memory_peak_bytes: o.usage.memory_peak_bytes,
            disk_bytes: o.usage.disk_bytes,
            pids_peak: o.usage.pids_peak,
            api_cost_usd: o.usage.api_cost_usd,
        })
        .unwrap_or_default();
    let mut exceeded =
        exceeded.or_else(|| outcome.and_then(|o| o.budget_exceeded.map(Exceeded::Run)));
    // API cost: what the whole evaluation spent (every run shares the meter).
    if let Some(g) = &p.gateway {
        used.api_cost_usd = g.meter.spent_usd();
        if g.meter.exceeded() && exceeded.is_none() {
            exceeded = Some(Exceeded::Run(BudgetKind::ApiCost));
        }
    }
    BudgetReport {
        limits,
        used,
        exceeded: exceeded.map(|e| e.name().to_string()),
    }
}

fn counts(tests: Option<&results::TestReport>) -> TestCounts {
    tests
        .map(|t| TestCounts {
            passed: t.passed() as u64,
            failed: t.failed() as u64,
            flaky: t.flaky() as u64,
            skipped: t.skipped() as u64,
        })
        .unwrap_or_default()
}

/// The one way an evaluation ends with a verdict: sign it into the bundle with the
/// ephemeral key, destroy that key at once, then record it in the ledger and write the CI
/// outputs.
pub fn seal(
    p: &Plan,
    c: Conclusion<'_>,
    cache_key: &crate::ledger::CacheKey,
    ephemeral: EphemeralKey,
    node: &NodeKey,
) -> Result<Evaluation, EvaluateError> {
    let rules = plan_rules(p);
    let tests = plan_tests(&c);
    let signed = sign(p, c, &ephemeral, node);
    ephemeral.destroy();
    let mut ev = signed?;
    ev.ci_error = record(p, &ev, cache_key, &rules, tests.as_ref());
    Ok(ev)
}

fn sign(
    p: &Plan,
    c: Conclusion<'_>,
    ephemeral: &EphemeralKey,
    node: &NodeKey,
) -> Result<Evaluation, EvaluateError> {
    let speaking = c.speaking();
    let ran: Vec<&TaskRun> = c
        .tasks
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok().copied())
        .collect();
    let plan: Vec<TaskVerdict> = c
        .tasks
        .iter()
        .map(|(t, run)| match run {
            Ok(r) => TaskVerdict {
                task: t.name.clone(),
                task_hash: t.hash.clone(),
                verdict: Some(r.decision.verdict),
                confidence: Some(r.decision.confidence),
                summary: r.decision.summary.clone(),
                provenance: Some(t.provenance()),
                tests: counts(r.primary.tests.as_ref()),
                metrics: r.decision.metrics.clone(),
                budget: Some(budget_report(
                    p,
                    &t.budgets,
                    Some(&r.primary.outcome),
                    r.exceeded,
                )),
            },
            Err(why) => TaskVerdict {
                task: t.name.clone(),
                task_hash: t.hash.clone(),
                verdict: None,
                confidence: None,
                summary: why.clone(),
                provenance: None,
                tests: TestCounts::default(),
                metrics: vec![],
                budget: None,
            },
        })
        .collect();
    let mut tests = TestCounts::default();
    for t in &plan {
        tests.passed += t.tests.passed;
        tests.failed += t.tests.failed;
        tests.flaky += t.tests.flaky;
        tests.skipped += t.tests.skipped;
    }
    // Judged only when every task that ran was judged.
    let provenance = (!ran.is_empty()).then(|| {
        if c.tasks
            .iter()
            .any(|(t, r)| r.is_ok() && t.provenance() == crate::verdict::Provenance::SelfReported)
        {
            crate::verdict::Provenance::SelfReported
        } else {
            crate::verdict::Provenance::Judge
        }
    });
    let speaking_task = c
        .tasks
        .iter()
        .find(|(_, r)| matches!((r, speaking), (Ok(a), Some(b)) if std::ptr::eq(*a, b)))
        .map(|(t, _)| *t)
        .or_else(|| p.tasks.first());
    let budget = match speaking_task {
        Some(t) => budget_report(
            p,
            &t.budgets,
            speaking.map(|r| &r.primary.outcome),
            speaking.and_then(|r| r.exceeded),
        ),
        None => budget_report(p, &p.policy.budgets, None, None),
    };
    crate::trace::mark("evaluate: concluded");
    let d = c.decision;
    let verdict = Verdict {
        header: Header::new(),
        verdict: d.verdict,
        confidence: d.confidence,
        patch_hash: p.patch_hash.clone(),
        task_hash: p.task_hash.clone(),
        state_hash: c.state_hash,
        source_hash: c.source_hash,
        patched_tree_hash: c.patched_tree_hash,
        evaluation_summary: d.summary,
        caveats: d.caveats,
        tests,
        metrics: d.metrics,
        budget,
        isolation: speaking
            .and_then(|r| serde_json::to_value(&r.primary.outcome.isolation).ok())
            .unwrap_or_else(|| serde_json::json!({ "sandbox_started": false })),
        artifacts: vec![],
        successor_key: ephemeral.public().to_string(),
        run_id: p.run_id.clone(),
        task: crate::verdict::plan::plan_name(p.tasks.iter().map(|t| t.name.as_str())),
        patch_gate: Some(c.gate),
        proposal_id: p.proposal_id.clone(),
        provenance,
        plan,
    };
    if let Some(parent) = p.out_dir.parent() {
        if !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent)
                .map_err(|e| EvaluateError::Usage(format!("--out {}: {e}", p.out_dir.display())))?;
        }
    }
    // The sides' sandbox teardowns overlap the bundle's writing, and the staging
    // directory's removal its syncing (once the bundle has copied the artifacts out of
    // it); the bundle takes its name only once every one is done (a failed sandbox
    // teardown is the evaluation's error, as in line; a failed removal of the staging
    // directory is logged, as in line).
    let written = crate::verdict::write_bundle_then(
        &p.out_dir,
        &verdict,
        &c.artifacts,
        ephemeral,
        node,
        || p.teardowns.release_held(),
        || {
            crate::trace::mark("evaluate: bundle synced");
            let r = p.teardowns.wait();
            crate::trace::mark("evaluate: teardowns joined");
            r
        },
    )
    .map_err(|e| match e {
        crate::verdict::BundleError::Exists { path } => out_came_to_exist(&path, &verdict, None),
        e => EvaluateError::Internal(format!("writing the verdict bundle: {e}")),
    })??;
    crate::trace::mark("evaluate: bundle written");
    Ok(Evaluation {
        out_dir: written.dir,
        verdict: written.verdict,
        ci_error: None,
    })
}

/// `--out` was free when the evaluation was planned and is taken when its bundle is to
/// take the name (something else made it meanwhile): the usage error of an existing
/// `--out` (a bundle is never written over anything), saying what the verdict was, that
/// nothing was written for it, and what to do. `cached`: the bundle of a cached verdict
/// that was to be copied there (signed and recorded already).
fn out_came_to_exist(
    path: &std::path::Path,
    v: &Verdict,
    cached: Option<&std::path::Path>,
) -> EvaluateError {
    let said = format!(
        "{} (confidence {:.2}), run {}: {}",
        v.verdict, v.confidence, v.run_id, v.evaluation_summary
    );
    let what = match cached {
        None => format!(
            "the verdict bundle was not written, and no ledger row or CI report either. The verdict would have been {said}; it is signed and recorded nowhere"
        ),
        Some(dir) => format!(
            "the cached verdict was not copied there, and no CI report was written. It is {said}, in {}",
            dir.display()
        ),
    };
    EvaluateError::Usage(format!(
        "--out {} came to exist during the evaluation (something else made it): {what}. Evaluate again with an --out that nothing else writes",
        path.display()
    ))
}
