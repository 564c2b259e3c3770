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
pub mod evidence;
pub mod judge;
pub mod outputs;
pub mod plan;
pub mod prepare;
pub mod progress;
pub mod protect;
pub mod redact;
pub mod request;
pub mod reverify;
pub mod side;
pub mod staging;
pub mod task_run;
pub mod teardowns;

pub use request::{CiOutputs, LedgerChoice, Request};

use crate::identity::EphemeralKey;
use crate::patch::{self, Gate, GateStop};
use crate::sandbox::SandboxError;
use crate::verdict::decide::combine::{combine, TaskDecision};
use crate::verdict::decide::{decide, Evidence};
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

/// The parent's source tree as the evaluation begins with it: listed and hashed (the
/// cache's key and the verdict name the hash; every side's copy is compared with the
/// listing), read beneath the runtime directory, `exclude` left out.
fn parent_source(p: &plan::Plan) -> Result<crate::fork::TreeListing, EvaluateError> {
    crate::fork::TreeListing::beneath(
        &p.runtime,
        &p.manifest.runtime.source,
        &p.manifest.runtime.exclude,
    )
    .map_err(|e| EvaluateError::Input(format!("the runtime's source tree: {e}")))
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The result of an evaluation: the bundle written and the verdict.
pub struct Evaluation {
    pub out_dir: PathBuf,
    pub verdict: Verdict,
    /// Why a CI output (`--junit`, `--summary`, the step summary) could not be written.
    /// The verdict stands (signed, bundled, recorded); the caller shows it, then this.
    pub ci_error: Option<String>,
}

/// The whole evaluation. Errors are failures to answer (bad input, a missing layer);
/// a patch that fails a gate, does not apply or blows a budget is a REJECT verdict.
pub fn evaluate(a: &Request) -> Result<Evaluation, EvaluateError> {
    crate::sandbox::signals::install_interrupt_flag();
    // Every output path first: nothing is worth running if its answer cannot be written.
    outputs::check(a)?;
    // Reclaim what crashed runs left behind before starting a new one.
    let gc = crate::gc::collect();
    if !gc.runs.is_empty() {
        tracing::info!("reclaimed {} stale run(s)", gc.runs.len());
    }
    crate::trace::mark("evaluate: stale runs collected");
    // 1 PLAN
    progress::phase("plan", &format!("patch {}", a.patch.display()));
    let p = plan::plan(a)?;
    crate::trace::mark("evaluate: planned");
    let node = plan::load_node_key(a.key.as_deref())?;
    crate::trace::mark("evaluate: planned, node key loaded");
    let source_dir = p.runtime.join(&p.manifest.runtime.source);
    let exclude = &p.manifest.runtime.exclude;
    progress::phase("gates", &format!("run {}, checking the patch", p.run_id));
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
    // A signal during the gates (no run is held yet, so the interrupt watcher leaves the
    // ending to this thread) ends the evaluation here, before anything is made.
    check_interrupt()?;
    let ephemeral = EphemeralKey::generate();
    // The evaluation's own run directory (locked, 0700): the staging area for the snapshot
    // and the evidence. A crash leaves it to `fork gc`, like a sandbox's.
    let staging = Staging::create(&p.run_id)?;
    std::fs::write(staging.path().join("patch.diff"), &p.raw_patch)
        .map_err(|e| internal("staging")(e.to_string()))?;
    let patch_artifact = (ArtifactType::Patch, staging.path().join("patch.diff"));
    crate::trace::mark("evaluate: gates checked, staging made");

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
            // Rejected before anything is cloned: hashes of the parent as it stands (its
            // stores opened as the snapshot opens them).
            let read_as = staging::stores_read_as(&p.runtime)?;
            let state: Vec<(String, String)> = p
                .manifest
                .runtime
                .state
                .iter()
                .map(|s| {
                    let d = crate::fork::parent::state_digest(
                        &p.runtime,
                        s,
                        p.policy.state.digest,
                        read_as.as_ref(),
                    )
                    .unwrap_or_else(|_| "unreadable".into());
                    (s.display().to_string(), d)
                })
                .collect();
            let source_hash = parent_source(&p)?.hash;
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
                gate: gate_report,
                artifacts: vec![patch_artifact],
                tasks: not_run(&p, &format!("the {gate} gate stopped the patch")),
            };
            // An interrupted evaluation writes no bundle and no ledger row, a REJECT's
            // neither (hashing the parent's state and source above may have taken a while).
            check_interrupt()?;
            let ev = conclude::seal(&p, c, &key, ephemeral, &node)?;
            return Ok(ev);
        }
        Ok(patch) => patch,
    };
    check_interrupt()?;

    // 2 FORK: one snapshot of each state store, shared by both sides.
    progress::phase("snapshot", "the state stores, once for every side");
    // The cache's key needs the parent's source tree hashed: that runs beside the stores'
    // snapshot when it reads no store.
    let hash_source = || {
        let listing = parent_source(&p)?;
        crate::trace::mark("evaluate: parent source hashed");
        Ok(listing)
    };
    let (snap_dir, state_hash, state_check, source) =
        staging::snapshot_state(&p, &staging, hash_source)?;
    crate::trace::mark("evaluate: state and protected tree snapshotted");

    // The cache: the same patch on the same source tree, state, task and policy was
    // evaluated before, and its bundle still verifies. (The key's source is the tree the
    // patch applies to: with the patch hash, it determines the patched tree.)
    let cache_key = crate::ledger::CacheKey {
        patch_hash: p.patch_hash.clone(),
        state_hash: state_hash.clone(),
        source_hash: source.hash.clone(),
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
            state_check.wait()?;
            ephemeral.destroy();
            return Ok(ev);
        }
    }

    // 3 PATCH: the first patched workspace.
    progress::phase("patch", "applying the patch to the copy");
    let first_task = p
        .tasks
        .first()
        .ok_or_else(|| EvaluateError::Internal("an empty evaluation plan".into()))?;
    let first = match prepare::prepare_side(
        &p,
        first_task,
        &source_dir,
        &snap_dir,
        Some(&parsed),
        &source,
    )? {
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
                gate: GateReport {
                    passed: true,
                    violations: vec![],
                },
                artifacts: vec![patch_artifact],
                tasks: not_run(&p, "the patch did not apply"),
            };
            state_check.wait()?;
            let ev = conclude::seal(&p, c, &cache_key, ephemeral, &node)?;
            return Ok(ev);
        }
    };
    let Some(tree) = first.patched.clone() else {
        return Err(EvaluateError::Internal(
            "the patched side was prepared without its tree hashes".into(),
        ));
    };
    let (source_hash, patched_tree_hash) =
        (tree.source_hash.clone(), Some(tree.deploy_hash.clone()));
    crate::trace::mark("evaluate: patched side ready, trees hashed");
    // 4 EVALUATE every task of the plan, in order. A task that does not approve the patch
    // ends the plan: it is approved whole or not at all, and a metric gain never approves
    // a patch that fails a correctness check.
    let sources = task_run::Sources {
        source_dir: &source_dir,
        snap_dir: &snap_dir,
        patch: &parsed,
        staging: staging.path(),
        tree: &tree,
        source: &source,
    };
    let mut first = Some(first);
    let mut runs: Vec<Result<task_run::TaskRun, String>> = Vec::new();
    let mut stopped_by: Option<(String, VerdictKind)> = None;
    for t in &p.tasks {
        if let Some((by, kind)) = &stopped_by {
            runs.push(Err(format!(
                "task `{by}` gave {kind}, and a plan is approved whole or not at all"
            )));
            continue;
        }
        progress::phase(
            "task",
            &format!("{} ({} of {})", t.name, runs.len() + 1, p.tasks.len()),
        );
        let run = task_run::run_task(&p, t, &sources, first.take())?;
        if run.decision.verdict != VerdictKind::Approve {
            stopped_by = Some((t.name.clone(), run.decision.verdict));
        }
        runs.push(Ok(run));
    }

    // 5 VERDICT: the plan's decisions combined into one.
    crate::trace::mark("evaluate: tasks run");
    // The snapshot's integrity check ran beside the sides and the sandboxes: its answer
    // first (a corrupt snapshot fails the evaluation, whatever the tasks said).
    state_check.wait()?;
    // Every sandbox is made: the state snapshot and the protected copy they were served
    // go now, beside the conclusion and the bundle (joined before the bundle is published).
    p.teardowns.remove_dir(snap_dir.clone());
    p.teardowns.remove_dir(protect::copy_root(staging.path()));
    progress::phase("verdict", "deciding and signing");
    let decisions: Vec<TaskDecision<'_>> = p
        .tasks
        .iter()
        .zip(&runs)
        .map(|(t, r)| TaskDecision {
            task: &t.name,
            decision: r.as_ref().map(|r| &r.decision).map_err(|e| e.as_str()),
        })
        .collect();
    let decision = combine(&decisions)
        .ok_or_else(|| EvaluateError::Internal("no task of the plan ran".into()))?;
    let mut artifacts = vec![patch_artifact];
    for r in runs.iter().flatten() {
        artifacts.extend(r.artifacts.iter().cloned());
    }
    if let Some(g) = &p.gateway {
        let path = staging.path().join("gateway-calls.jsonl");
        let mut text = g
            .meter
            .log_jsonl()
            .map_err(|e| internal("gateway log")(e.to_string()))?;
        if let Some(k) = &g.credentials {
            if k.len() >= crate::gateway::MIN_SCRUB_KEY_LEN {
                text = text.replace(k.as_str(), crate::gateway::REDACTED);
            }
        }
        // The endpoints and models the task asked for are the successor's text.
        let text = p.redactor.bytes(text.as_bytes());
        std::fs::write(&path, text).map_err(|e| internal("gateway log")(e.to_string()))?;
        artifacts.push((ArtifactType::Log, path));
    }
    let mut c = Conclusion {
        decision,
        state_hash,
        source_hash,
        patched_tree_hash,
        gate: GateReport {
            passed: true,
            violations: vec![],
        },
        artifacts,
        tasks: p
            .tasks
            .iter()
            .zip(&runs)
            .map(|(t, r)| (t, r.as_ref().map_err(|e| e.clone())))
            .collect(),
    };
    // The tests the CI outputs list, kept in the bundle so that a cache hit lists the same.
    if let Some(art) = conclude::stage_ci_tests(&c, staging.path())? {
        c.artifacts.push(art);
    }
    // 6 DESTROY: sandboxes are gone (run_side); the staging directory goes on a thread of
    // its own once the bundle has copied the artifacts out of it (or in line, on a path
    // that ends before); the ephemeral secret is zeroized as soon as the verdict is
    // signed, the node key when `node` drops. The staging directory's removal may overlap
    // those of its state snapshot and protected copy begun above: each detaches what is
    // still mounted and skips what the other removed first (not found), so neither fails.
    p.teardowns.hold(move || drop(staging));
    conclude::seal(&p, c, &cache_key, ephemeral, &node)
}

/// Every task of the plan, none run, and why.
fn not_run<'a>(
    p: &'a plan::Plan,
    why: &str,
) -> Vec<(&'a plan::TaskPlan, Result<&'a task_run::TaskRun, String>)> {
    p.tasks.iter().map(|t| (t, Err(why.to_string()))).collect()
}
