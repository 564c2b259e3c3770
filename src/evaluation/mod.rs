//! `fork evaluate`: the lifecycle, in order, never touching the parent. Data flows one
//! way: [`Request`] -> [`plan::Plan`] -> staging and workspaces -> sandbox outcomes ->
//! evidence -> verdict -> bundle and ledger.
//!
//! 1. PLAN ([`plan`]): manifest, policy, task; hash the patch; run the policy gates (a
//!    stopped patch is REJECTed before anything is cloned).
//! 2. FORK ([`staging`], [`side`]): every SQLite state store snapshotted once with the
//!    online backup API; a sandbox per side (patched, and baseline when the task asks),
//!    each with its own size-capped workspace; a fresh ephemeral key.
//! 3. PATCH ([`side`]): applied exactly to the patched side's copy only.
//! 4. EVALUATE ([`side`]): the task's command in the sandbox, cwd /tmp/successor/src.
//! 5. VERDICT ([`conclude`]): results read after the successor is dead; decide; sign;
//!    bundle; ledger.
//! 6. DESTROY: sandboxes destroyed on every path out (Drop), staging removed, keys zeroized.

pub mod collect;
pub mod conclude;
pub mod judge;
pub mod plan;
pub mod prepare;
pub mod request;
pub mod reverify;
pub mod side;
pub mod staging;

pub use request::{CiOutputs, LedgerChoice, Request};

use crate::budget::Exceeded;
use crate::fork::workspace::tree_hash_beneath;
use crate::identity::EphemeralKey;
use crate::patch::{self, Gate, GateStop};
use crate::sandbox::{BudgetKind, SandboxError};
use crate::verdict::decide::{decide, Decision, Evidence};
use crate::verdict::{ArtifactType, GateReport, Verdict, VerdictKind};
use conclude::Conclusion;
use sha2::{Digest, Sha256};
use staging::Staging;
use std::path::PathBuf;
use thiserror::Error;

/// Why an evaluation could not answer (a patch that fails a gate, does not apply or blows
/// a budget is not an error: it is a REJECT verdict).
#[derive(Debug, Error)]
pub enum EvaluateError {
    /// The request itself is wrong (an existing `--out`, a bad key path, ...).
    #[error("{0}")]
    Usage(String),
    /// An input is malformed (patch, manifest, policy, state).
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("{0}")]
    Internal(String),
    #[error("interrupted: the sandbox and workspace were destroyed, no verdict was written")]
    Interrupted,
}

fn internal(what: &str) -> impl FnOnce(String) -> EvaluateError + '_ {
    move |e| EvaluateError::Internal(format!("{what}: {e}"))
}

/// Between phases, SIGINT/SIGTERM/SIGHUP only set a flag; the phase in progress ends,
/// everything is destroyed, and the evaluation stops. (During the run itself the
/// supervisor's watchdog sees the signal and kills the sandbox at once.)
fn check_interrupt() -> Result<(), EvaluateError> {
    if crate::sandbox::signals::interrupted() {
        Err(EvaluateError::Interrupted)
    } else {
        Ok(())
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The result of an evaluation: the bundle written and the verdict.
pub struct Evaluation {
    pub out_dir: PathBuf,
    pub verdict: Verdict,
}

/// The whole evaluation. Errors are failures to answer (bad input, a missing layer);
/// a patch that fails a gate, does not apply or blows a budget is a REJECT verdict.
pub fn evaluate(a: &Request) -> Result<Evaluation, EvaluateError> {
    crate::sandbox::signals::install_interrupt_flag();
    // Reclaim what crashed runs left behind before starting a new one.
    let gc = crate::gc::collect();
    if !gc.runs.is_empty() {
        tracing::info!("reclaimed {} stale run(s)", gc.runs.len());
    }
    // 1 PLAN
    let p = plan::plan(a)?;
    let node = plan::load_node_key(a.key.as_deref())?;
    let source_dir = p.runtime.join(&p.manifest.runtime.source);
    let exclude = &p.manifest.runtime.exclude;
    // The size gate judges the file's size: of a larger patch only a bounded prefix was read.
    let checked = match patch::size_stop(p.patch_size, &p.policy.gates) {
        Some(stop) => Err(stop),
        None => patch::check_patch(
            &p.raw_patch,
            patch::PathRules {
                protected: &p.manifest.runtime.protected,
                exclude,
            },
            &source_dir,
            &p.policy.gates,
        ),
    };
    let ephemeral = EphemeralKey::generate();
    // The evaluation's own run directory (locked, 0700): the staging area for the snapshot
    // and the evidence. A crash leaves it to `fork gc`, like a sandbox's.
    let staging = Staging::create(&p.run_id)?;
    std::fs::write(staging.path().join("patch.diff"), &p.raw_patch)
        .map_err(|e| internal("staging")(e.to_string()))?;
    let patch_artifact = (ArtifactType::Patch, staging.path().join("patch.diff"));

    let parsed = match checked {
        Err(GateStop {
            gate: Gate::Parse,
            reason,
        }) => {
            return Err(EvaluateError::Input(format!(
                "patch {} is malformed: {reason}",
                a.patch.display()
            )));
        }
        Err(GateStop { gate, reason }) => {
            // Rejected before anything is cloned: hashes of the parent as it stands.
            let state: Vec<(String, String)> = p
                .manifest
                .runtime
                .state
                .iter()
                .map(|s| {
                    let d = crate::fork::parent::state_sha256(&p.runtime, s)
                        .unwrap_or_else(|_| "unreadable".into());
                    (s.display().to_string(), d)
                })
                .collect();
            let source_hash = tree_hash_beneath(&p.runtime, &p.manifest.runtime.source, exclude)
                .map_err(|e| EvaluateError::Input(format!("the runtime's source tree: {e}")))?;
            let evidence = Evidence {
                gate: Some((gate.to_string(), reason.clone())),
                ..Default::default()
            };
            let decision = decide(&evidence, &p.policy.decision);
            let gate_report = GateReport {
                passed: false,
                violations: vec![format!("{gate}: {reason}")],
            };
            let key = crate::ledger::CacheKey {
                patch_hash: p.patch_hash.clone(),
                state_hash: plan::combined_state_hash(&state),
                source_hash: source_hash.clone(),
                task_hash: p.task_hash.clone(),
                policy_hash: p.policy_hash.clone(),
            };
            let c = Conclusion {
                decision,
                state_hash: key.state_hash.clone(),
                source_hash,
                patched_tree_hash: None,
                outcome: None,
                gate: gate_report,
                artifacts: vec![patch_artifact],
                tests: None,
                exceeded: None,
                rules: &p.policy.decision,
            };
            let ev = conclude::seal(&p, c, &key, ephemeral, &node)?;
            return Ok(ev);
        }
        Ok(patch) => patch,
    };
    check_interrupt()?;

    // 2 FORK: one snapshot of each state store, shared by both sides.
    let (snap_dir, state_hash) = staging::snapshot_state(&p, &staging)?;

    // The cache: the same patch on the same source tree, state, task and policy was
    // evaluated before, and its bundle still verifies. (The key's source is the tree the
    // patch applies to: with the patch hash, it determines the patched tree.)
    let parent_source_hash = tree_hash_beneath(&p.runtime, &p.manifest.runtime.source, exclude)
        .map_err(|e| EvaluateError::Input(format!("the runtime's source tree: {e}")))?;
    let cache_key = crate::ledger::CacheKey {
        patch_hash: p.patch_hash.clone(),
        state_hash: state_hash.clone(),
        source_hash: parent_source_hash,
        task_hash: p.task_hash.clone(),
        policy_hash: p.policy_hash.clone(),
    };
    if p.use_cache && p.replicas <= 1 {
        let probe = conclude::CacheProbe {
            source_dir: &source_dir,
            patch: &parsed,
            scratch: staging.path().join("cache-check"),
        };
        if let Some(ev) = conclude::cached(&p, &cache_key, &node, &probe)? {
            ephemeral.destroy();
            return Ok(ev);
        }
    }

    // 3 PATCH: the first patched workspace.
    let first = match prepare::prepare_side(&p, &source_dir, &snap_dir, Some(&parsed))? {
        prepare::Prepared::Ready(side) => side,
        prepare::Prepared::DidNotApply(msg, h) => {
            let evidence = Evidence {
                apply_error: Some(msg),
                ..Default::default()
            };
            let decision = decide(&evidence, &p.policy.decision);
            let c = Conclusion {
                decision,
                state_hash,
                source_hash: h,
                patched_tree_hash: None,
                outcome: None,
                gate: GateReport {
                    passed: true,
                    violations: vec![],
                },
                artifacts: vec![patch_artifact],
                tests: None,
                exceeded: None,
                rules: &p.policy.decision,
            };
            let ev = conclude::seal(&p, c, &cache_key, ephemeral, &node)?;
            return Ok(ev);
        }
    };
    let Some(tree) = first.patched.clone() else {
        return Err(EvaluateError::Internal(
            "the patched side was prepared without its tree hashes".into(),
        ));
    };
    let (source_hash, patched_tree_hash) = (tree.source_hash, Some(tree.deploy_hash));
    // 4 EVALUATE: `repeat` rounds; in each, every replica of the patched side, then the
    // baseline (interleaved, so drift on the machine hits both sides alike).
    let replicas = p.replicas;
    let repeat = p.task.repeat.max(1) as usize;
    let mut patched: Vec<Vec<collect::RunResult>> = (0..replicas).map(|_| Vec::new()).collect();
    let mut baseline: Vec<collect::RunResult> = Vec::new();
    let mut first = Some(first);
    for round in 0..repeat {
        for (r, runs) in patched.iter_mut().enumerate() {
            let prepared = match first.take() {
                Some(f) => *f,
                None => match prepare::prepare_side(&p, &source_dir, &snap_dir, Some(&parsed))? {
                    prepare::Prepared::Ready(side) => *side,
                    prepare::Prepared::DidNotApply(msg, _) => {
                        return Err(EvaluateError::Internal(format!(
                            "the patch applied once and then not: {msg}"
                        )))
                    }
                },
            };
            runs.push(side::run_side(
                &p,
                prepared,
                staging.path(),
                &side::side_label("patched", r, round, replicas),
            )?);
            check_interrupt()?;
        }
        let decided = patched
            .iter()
            .flatten()
            .any(|r| r.outcome.budget_exceeded.is_some() || r.outcome.exec_error.is_some());
        if p.task.baseline && !decided {
            if let prepare::Prepared::Ready(side) =
                prepare::prepare_side(&p, &source_dir, &snap_dir, None)?
            {
                baseline.push(side::run_side(
                    &p,
                    *side,
                    staging.path(),
                    &side::side_label("baseline", 0, round, 1),
                )?);
            }
            check_interrupt()?;
        }
        // A run that blew a budget or could not start ends the repeats: the answer is known.
        if patched
            .iter()
            .flatten()
            .any(|r| r.outcome.budget_exceeded.is_some() || r.outcome.exec_error.is_some())
        {
            break;
        }
    }

    // 5 VERDICT: a decision per replica, then agreement.
    let mut rules = p.policy.decision.clone();
    rules
        .lower_is_better
        .extend(p.task.lower_is_better.iter().cloned());
    let baseline_samples = conclude::samples(&baseline);
    let mut decisions: Vec<(Decision, usize, Option<Exceeded>)> = Vec::new();
    for (r, runs) in patched.iter().enumerate() {
        let (mut evidence, chosen) =
            conclude::evidence_for(&p, runs, &baseline, &baseline_samples, &rules, r as u64);
        // The API-cost budget is the evaluation's: blown by any run (the baseline's too),
        // it is blown for the verdict.
        if let Some(g) = p.gateway.as_ref().filter(|g| g.meter.exceeded()) {
            if evidence.budget_exceeded.is_none() {
                evidence.budget_exceeded = Some(Exceeded::Run(BudgetKind::ApiCost));
                evidence.usage_summary = Some(format!(
                    "api_cost: ${:.4} of ${:.4} spent by this evaluation's runs",
                    g.meter.spent_usd(),
                    g.meter.budget_usd()
                ));
            }
        }
        decisions.push((decide(&evidence, &rules), chosen, evidence.budget_exceeded));
    }
    let severity = |k: VerdictKind| match k {
        VerdictKind::Reject => 2,
        VerdictKind::NeedsRevision => 1,
        VerdictKind::Approve => 0,
    };
    // The most severe replica's decision stands (a security tool errs towards "no").
    let (pick, _) = decisions
        .iter()
        .enumerate()
        .max_by_key(|(i, (d, ..))| (severity(d.verdict), std::cmp::Reverse(*i)))
        .map(|(i, (d, ..))| (i, d.verdict))
        .unwrap_or((0, VerdictKind::Reject));
    let mut decision = decisions[pick].0.clone();
    let chosen_run = decisions[pick].1;
    if replicas > 1 {
        let agree = decisions
            .iter()
            .filter(|(d, ..)| d.verdict == decision.verdict)
            .count();
        if agree < replicas {
            let counts: Vec<String> = [
                VerdictKind::Approve,
                VerdictKind::NeedsRevision,
                VerdictKind::Reject,
            ]
            .iter()
            .filter_map(|k| {
                let n = decisions.iter().filter(|(d, ..)| d.verdict == *k).count();
                (n > 0).then(|| format!("{n} {k}"))
            })
            .collect();
            decision.caveats.push(format!(
                "The {replicas} replicas disagree ({}); the most severe verdict stands and the confidence is scaled by the agreement ({agree}/{replicas}).",
                counts.join(", ")
            ));
            decision.confidence =
                ((decision.confidence * agree as f64 / replicas as f64) * 1000.0).round() / 1000.0;
        } else {
            decision.caveats.push(format!(
                "All {replicas} independent replicas agree ({}).",
                decision.verdict
            ));
        }
    }
    if let Some(b) = baseline
        .iter()
        .find(|b| b.outcome.exit_code != 0 || b.outcome.budget_exceeded.is_some())
    {
        decision.caveats.push(format!(
            "the baseline (unpatched) run itself ended with exit {}{}",
            b.outcome.exit_code,
            b.outcome
                .budget_exceeded
                .map(|k| format!(" ({} budget)", k.as_str()))
                .unwrap_or_default()
        ));
    }
    // What fork could not do with what a successor left is said, never an error.
    for note in patched
        .iter()
        .flatten()
        .chain(&baseline)
        .flat_map(|r| &r.notes)
    {
        if !decision.caveats.contains(note) {
            decision.caveats.push(note.clone());
        }
    }
    let mut artifacts = vec![patch_artifact];
    for run in patched.iter().flatten() {
        artifacts.extend(run.artifacts.iter().cloned());
    }
    for b in &baseline {
        for (t, path) in &b.artifacts {
            let t = match t {
                ArtifactType::TestReport => ArtifactType::BaselineTestReport,
                ArtifactType::Metrics => ArtifactType::BaselineMetrics,
                other => *other,
            };
            artifacts.push((t, path.clone()));
        }
    }
    if let Some(g) = &p.gateway {
        let path = staging.path().join("gateway-calls.jsonl");
        let mut text = String::new();
        for r in g.meter.log() {
            text.push_str(
                &serde_json::to_string(&r).map_err(|e| internal("gateway log")(e.to_string()))?,
            );
            text.push('\n');
        }
        if let Some(k) = &g.credentials {
            if k.len() >= crate::gateway::MIN_SCRUB_KEY_LEN {
                text = text.replace(k.as_str(), crate::gateway::REDACTED);
            }
        }
        std::fs::write(&path, text).map_err(|e| internal("gateway log")(e.to_string()))?;
        artifacts.push((ArtifactType::Log, path));
    }
    let primary = &patched[pick][chosen_run];
    let c = Conclusion {
        decision,
        state_hash,
        source_hash,
        patched_tree_hash,
        outcome: Some(&primary.outcome),
        gate: GateReport {
            passed: true,
            violations: vec![],
        },
        artifacts,
        tests: primary.tests.as_ref(),
        exceeded: decisions[pick].2,
        rules: &rules,
    };
    // 6 DESTROY: sandboxes are gone (run_side), the staging directory goes with `staging`,
    // the ephemeral secret is zeroized as soon as the verdict is signed, the node key when
    // `node` drops.
    conclude::seal(&p, c, &cache_key, ephemeral, &node)
}
