//! `fork evaluate`: the six phases of the lifecycle (DESIGN.md), in order, never
//! touching the parent:
//!
//! 1. PLAN: manifest, policy, task; hash the patch; run the policy gates (a stopped patch
//!    is REJECTed before anything is cloned).
//! 2. FORK: a sandbox per side (patched, and baseline when the task asks), each with its
//!    own size-capped workspace: the source tree and tools copied, every SQLite state
//!    store snapshotted once with the online backup API; a fresh ephemeral key.
//! 3. PATCH: applied exactly to the patched side's copy only.
//! 4. EVALUATE: the task's command in the sandbox, cwd /tmp/successor/src.
//! 5. VERDICT: results read after the successor is dead; decide; sign; bundle.
//! 6. DESTROY: sandboxes destroyed on every path out (Drop), staging removed, keys zeroized.

use crate::cli::{exit, BudgetArgs, CliError, VerifyArgs};
use crate::fork::snapshot::{file_sha256, snapshot, SnapshotOptions};
use crate::fork::workspace::{copy_tree, tree_hash, tree_hash_excluding, Workspace};
use crate::identity::{EphemeralKey, NodeKey, PublicKey};
use crate::manifest::{Manifest, ResultsFormat, TaskSpec};
use crate::patch::{self, GateOutcome, Patch};
use crate::policy::Policy;
use crate::sandbox::{Outcome, Sandbox, SandboxError, WORKSPACE};
use crate::task::results;
use crate::verdict::decide::{decide, Decision, Evidence};
use crate::verdict::{
    ArtifactType, BudgetLimits, BudgetReport, BudgetUsed, GateReport, Header, TestCounts, Verdict,
    VerdictKind,
};
use sha2::{Digest, Sha256};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, clap::Args)]
pub struct EvaluateArgs {
    /// The patch to evaluate (a unified diff, as `git diff` writes it).
    pub patch: PathBuf,
    /// The runtime's root, holding fork.toml.
    #[arg(long, default_value = ".")]
    pub runtime: PathBuf,
    /// The task to run (default: the first in fork.toml).
    #[arg(long)]
    pub task: Option<String>,
    /// Policy file (default: the built-in policies/default.toml).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Where the verdict bundle goes (default: ./fork-out/<run-id>); must not exist.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the verdict document as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// The node key that endorses the verdict (default: $XDG_CONFIG_HOME/fork/node.key,
    /// created on first use).
    #[arg(long)]
    pub key: Option<PathBuf>,
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Run N independent patched successors; disagreement lowers the confidence.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub replicas: u32,
    /// Evaluate even when the ledger holds a verdict for the same patch, state, source,
    /// task and policy.
    #[arg(long)]
    pub no_cache: bool,
    /// The verdict ledger (default: $XDG_DATA_HOME/fork/ledger.db).
    #[arg(long)]
    pub ledger: Option<PathBuf>,
    /// Neither read nor write the ledger.
    #[arg(long, conflicts_with = "ledger")]
    pub no_ledger: bool,
    /// Write a JUnit report for CI (one testcase per test, per metric check, and the verdict).
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Write a markdown summary (also appended to $GITHUB_STEP_SUMMARY when set).
    #[arg(long)]
    pub summary: Option<PathBuf>,
    /// The mesh proposal this evaluation answers (recorded, signed, in the verdict).
    #[arg(long, hide = true)]
    pub proposal: Option<String>,
}

#[derive(Debug, Error)]
pub enum EvaluateError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("{0}")]
    Internal(String),
    #[error("interrupted: the sandbox and workspace were destroyed, no verdict was written")]
    Interrupted,
}

impl EvaluateError {
    pub fn exit_code(&self) -> i32 {
        match self {
            EvaluateError::Usage(_) => exit::USAGE,
            EvaluateError::Input(_) => exit::BAD_INPUT,
            EvaluateError::Sandbox(e) => e.exit_code(),
            EvaluateError::Internal(_) => exit::INTERNAL,
            EvaluateError::Interrupted => 130,
        }
    }
}

fn internal(what: &str) -> impl FnOnce(String) -> EvaluateError + '_ {
    move |e| EvaluateError::Internal(format!("{what}: {e}"))
}

/// Undeclared files in the reports directory kept as artifacts, at most.
const MAX_EXTRA_REPORTS: usize = 32;
/// Bytes of undeclared report files kept per run, in all (what does not fit is left out).
const MAX_EXTRA_REPORT_BYTES: u64 = 16 << 20;

/// The evaluation's run directory, `<run root>/fork-<run-id>/stage`; removed on drop.
struct Staging {
    rundir: Option<crate::rundir::RunDir>,
    dir: PathBuf,
}

impl Staging {
    fn create(run_id: &str) -> Result<Staging, EvaluateError> {
        use std::os::unix::fs::DirBuilderExt;
        let rundir = crate::rundir::RunDir::create_evaluation(run_id)
            .map_err(|e| EvaluateError::Internal(format!("creating the run directory: {e}")))?;
        let dir = rundir.path.join("stage");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| EvaluateError::Internal(format!("creating {}: {e}", dir.display())))?;
        Ok(Staging {
            rundir: Some(rundir),
            dir,
        })
    }
    fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(rd) = self.rundir.take() {
            if let Err(e) = crate::sandbox::reclaim_dir(&rd.path, &rd.id) {
                tracing::error!("removing the staging directory: {e}");
            }
        }
    }
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

/// What one run of the task (after its reruns) produced.
struct RunResult {
    outcome: Outcome,
    tests: Option<results::TestReport>,
    results_error: Option<String>,
    metrics: Option<std::collections::BTreeMap<String, f64>>,
    metrics_error: Option<String>,
    /// Copies of the report files and the output log, in the staging directory.
    artifacts: Vec<(ArtifactType, PathBuf)>,
}

/// Everything planned in phase 1.
struct Plan {
    run_id: String,
    manifest: Manifest,
    runtime: PathBuf,
    task_name: String,
    task: TaskSpec,
    policy: Policy,
    raw_patch: Vec<u8>,
    patch_hash: String,
    task_hash: String,
    /// sha256 of the resolved policy (budgets, layers, gates, decision rules, ...).
    policy_hash: String,
    out_dir: PathBuf,
    /// The ledger, unless --no-ledger.
    ledger: Option<PathBuf>,
    /// Host loopback services forwarded into every sandbox (policy and task).
    forwards: Vec<std::net::SocketAddr>,
    proposal_id: Option<String>,
    /// The metered model gateway (fork.toml's `[gateway]`, else the policy's): its
    /// configuration and credentials, and the meter every run of this evaluation shares
    /// (the API-cost budget is the evaluation's).
    gateway: Option<GatewayPlan>,
}

struct GatewayPlan {
    cfg: crate::gateway::GatewayConfig,
    credentials: Option<zeroize::Zeroizing<String>>,
    meter: std::sync::Arc<crate::gateway::Meter>,
}

/// The result of an evaluation: the bundle written and the verdict.
pub struct Evaluation {
    pub out_dir: PathBuf,
    pub verdict: Verdict,
}

/// `fork evaluate` from the command line.
pub fn evaluate_cli(a: EvaluateArgs) -> Result<i32, CliError> {
    let json = a.json;
    let ev = evaluate(&a).map_err(|e| CliError {
        code: e.exit_code(),
        message: e.to_string(),
    })?;
    let v = &ev.verdict;
    if json {
        let doc = v
            .to_json_pretty()
            .map_err(|e| CliError::from((exit::INTERNAL, e)))?;
        println!("{}", String::from_utf8_lossy(&doc));
    } else {
        println!(
            "{} (confidence {:.2})  task `{}`  run {}",
            v.verdict, v.confidence, v.task, v.run_id
        );
        println!("  {}", v.evaluation_summary);
        for c in &v.caveats {
            println!("  caveat: {c}");
        }
        println!("  patch {}", v.patch_hash);
        println!("  verdict: {}", ev.out_dir.join("verdict.json").display());
    }
    Ok(v.verdict.exit_code())
}

/// `fork verify` from the command line.
pub fn verify_cli(a: VerifyArgs) -> Result<i32, CliError> {
    let mut trusted: Vec<PublicKey> = Vec::new();
    for t in &a.trust {
        let key = if Path::new(t).is_file() {
            crate::identity::read_public_key(Path::new(t))
        } else {
            PublicKey::parse(t)
        }
        .map_err(|e| CliError::from((exit::USAGE, format!("--trust {t}: {e}"))))?;
        trusted.push(key);
    }
    if trusted.is_empty() {
        // The local node's own key, when there is one.
        let key_path = crate::identity::default_node_key_path();
        if let Ok(k) =
            crate::identity::read_public_key(&crate::identity::public_key_path(&key_path))
        {
            trusted.push(k);
        }
    }
    match crate::verdict::verify_bundle(&a.path, &trusted) {
        Ok(v) => {
            if a.json {
                let doc = v
                    .verdict
                    .to_json_pretty()
                    .map_err(|e| CliError::from((exit::INTERNAL, e)))?;
                println!("{}", String::from_utf8_lossy(&doc));
            } else {
                println!(
                    "valid: {} {} (confidence {:.2}), signed by {} endorsed by node {}",
                    v.verdict.verdict,
                    v.verdict.patch_hash,
                    v.verdict.confidence,
                    v.successor_key,
                    v.node_key
                );
            }
            Ok(0)
        }
        Err(e) => {
            let code = e.exit_code();
            if code == 1 {
                println!("invalid: {e}");
                Ok(1)
            } else {
                Err(CliError::from((code, e)))
            }
        }
    }
}

fn load_node_key(path: Option<&Path>) -> Result<NodeKey, EvaluateError> {
    match path {
        Some(p) => {
            crate::identity::load_node_key(p).map_err(|e| EvaluateError::Usage(e.to_string()))
        }
        None => {
            let p = crate::identity::default_node_key_path();
            if !p.exists() {
                let public = crate::identity::generate_node_key(&p, false)
                    .map_err(|e| EvaluateError::Internal(format!("creating the node key: {e}")))?;
                eprintln!("fork: no node key yet: created {} ({public})", p.display());
            }
            crate::identity::load_node_key(&p).map_err(|e| EvaluateError::Usage(e.to_string()))
        }
    }
}

fn plan(a: &EvaluateArgs) -> Result<Plan, EvaluateError> {
    let raw_patch = std::fs::read(&a.patch).map_err(|e| {
        EvaluateError::Input(format!("cannot read patch {}: {e}", a.patch.display()))
    })?;
    let manifest =
        crate::manifest::load(&a.runtime).map_err(|e| EvaluateError::Input(e.to_string()))?;
    let (task_name, task) = manifest
        .task(a.task.as_deref())
        .map_err(|e| EvaluateError::Input(e.to_string()))?;
    let (task_name, task) = (task_name.to_string(), task.clone());
    let mut policy =
        Policy::load(a.policy.as_deref()).map_err(|e| EvaluateError::Input(e.to_string()))?;
    // Budgets: the policy's, then the task's, then the command line's.
    let tb = task.budget.resolve().map_err(|e| {
        EvaluateError::Input(format!(
            "{}: task `{task_name}`: {e}",
            manifest.file.display()
        ))
    })?;
    let b = &mut policy.budgets;
    if let Some(w) = tb.wall {
        b.wall = w;
    }
    if let Some(m) = tb.memory_bytes {
        b.memory_bytes = m;
    }
    if let Some(c) = tb.cpu_percent {
        b.cpu_percent = c.round().max(1.0) as u32;
    }
    if let Some(d) = tb.disk_bytes {
        b.disk_bytes = d;
    }
    if let Some(p) = tb.pids {
        b.pids = p;
    }
    if let Some(c) = tb.api_cost_usd {
        b.api_cost_usd = c;
    }
    b.apply(&a.budget.overrides(), "the command line")
        .map_err(|e| EvaluateError::Usage(e.to_string()))?;
    let run_id = crate::rundir::new_run_id();
    let out_dir = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("fork-out").join(&run_id));
    if std::fs::symlink_metadata(&out_dir).is_ok() {
        return Err(EvaluateError::Usage(format!(
            "--out {} already exists: choose a new directory (verdicts are never overwritten)",
            out_dir.display()
        )));
    }
    let patch_hash = format!("sha256:{}", sha256_hex(&raw_patch));
    let task_doc = serde_json::to_vec(&(&task_name, &task))
        .map_err(|e| EvaluateError::Internal(e.to_string()))?;
    let task_hash = format!("sha256:{}", sha256_hex(&task_doc));
    let runtime = std::fs::canonicalize(&a.runtime)
        .map_err(|e| EvaluateError::Input(format!("--runtime {}: {e}", a.runtime.display())))?;
    // The parent's live state files (and their journals) are invisible in the sandbox.
    for s in &manifest.runtime.state {
        let p = runtime.join(s);
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut q = p.clone().into_os_string();
            q.push(suffix);
            policy.filesystem.hide.push(PathBuf::from(q));
        }
    }
    if let Some(k) = &a.key {
        policy.filesystem.hide.push(k.clone());
    }
    let mut forwards = Vec::new();
    for f in &policy.network.forward {
        let a = crate::policy::parse_forward(f).map_err(|m| {
            EvaluateError::Input(format!("{}: network.forward: {m}", policy.origin))
        })?;
        forwards.push(a);
    }
    for f in &task.forward {
        let a = crate::policy::parse_forward(f).map_err(|m| {
            EvaluateError::Input(format!(
                "{}: tasks.{task_name}.forward: {m}",
                manifest.file.display()
            ))
        })?;
        if !forwards.contains(&a) {
            forwards.push(a);
        }
    }
    let gateway = match manifest.gateway.clone().or_else(|| policy.gateway.clone()) {
        None => None,
        Some(cfg) => {
            let credentials = cfg
                .load_credentials()
                .map_err(|e| EvaluateError::Input(format!("the model gateway: {e}")))?;
            if let Some(f) = &cfg.credentials_file {
                // The key file is never visible in the sandbox.
                policy.filesystem.hide.push(f.clone());
            }
            Some(GatewayPlan {
                meter: crate::gateway::Meter::new(policy.budgets.api_cost_usd),
                cfg,
                credentials,
            })
        }
    };
    let policy_doc =
        serde_json::to_vec(&policy).map_err(|e| EvaluateError::Internal(e.to_string()))?;
    let policy_hash = format!("sha256:{}", sha256_hex(&policy_doc));
    let ledger = if a.no_ledger {
        None
    } else {
        Some(
            a.ledger
                .clone()
                .unwrap_or_else(crate::ledger::Ledger::default_path),
        )
    };
    Ok(Plan {
        proposal_id: a.proposal.clone(),
        gateway,
        forwards,
        policy_hash,
        ledger,
        run_id,
        manifest,
        runtime,
        task_name,
        task,
        policy,
        raw_patch,
        patch_hash,
        task_hash,
        out_dir,
    })
}

/// sha256 over every state store: name and digest per file, in manifest order.
fn combined_state_hash(files: &[(String, String)]) -> String {
    let mut h = Sha256::new();
    h.update(b"fork-state-v1\0");
    for (name, digest) in files {
        h.update(name.as_bytes());
        h.update([0]);
        h.update(digest.as_bytes());
        h.update([b'\n']);
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// The whole evaluation. Errors are failures to answer (bad input, a missing layer);
/// a patch that fails a gate, does not apply or blows a budget is a REJECT verdict.
pub fn evaluate(a: &EvaluateArgs) -> Result<Evaluation, EvaluateError> {
    crate::sandbox::signals::install_interrupt_flag();
    // Reclaim what crashed runs left behind before starting a new one.
    let gc = crate::gc::collect();
    if !gc.runs.is_empty() {
        tracing::info!("reclaimed {} stale run(s)", gc.runs.len());
    }
    // 1 PLAN
    let p = plan(a)?;
    let node = load_node_key(a.key.as_deref())?;
    let source_dir = p.runtime.join(&p.manifest.runtime.source);
    let exclude = &p.manifest.runtime.exclude;
    let (gate, parsed) = patch::check_patch(
        &p.raw_patch,
        &p.manifest.runtime.protected,
        &source_dir,
        &p.policy.gates,
    );
    let ephemeral = EphemeralKey::generate();
    // The evaluation's own run directory (locked, 0700): the staging area for the snapshot
    // and the evidence. A crash leaves it to `fork gc`, like a sandbox's.
    let staging = Staging::create(&p.run_id)?;
    std::fs::write(staging.path().join("patch.diff"), &p.raw_patch)
        .map_err(|e| internal("staging")(e.to_string()))?;
    let patch_artifact = (ArtifactType::Patch, staging.path().join("patch.diff"));

    let parsed = match (gate, parsed) {
        (
            GateOutcome::Stopped {
                gate: "parse",
                reason,
            },
            _,
        ) => {
            return Err(EvaluateError::Input(format!(
                "patch {} is malformed: {reason}",
                a.patch.display()
            )));
        }
        (GateOutcome::Stopped { gate, reason }, _) => {
            // Rejected before anything is cloned: hashes of the parent as it stands.
            let state: Vec<(String, String)> = p
                .manifest
                .runtime
                .state
                .iter()
                .map(|s| {
                    let d = file_sha256(&p.runtime.join(s)).unwrap_or_else(|_| "unreadable".into());
                    (s.display().to_string(), d)
                })
                .collect();
            let source_hash = tree_hash_excluding(&source_dir, exclude)
                .map_err(|e| internal("hashing the source")(e.to_string()))?;
            let evidence = Evidence {
                gate: Some((gate.to_string(), reason.clone())),
                ..Default::default()
            };
            let decision = decide(&evidence, &p.policy.decision);
            let gate_report = GateReport {
                passed: false,
                violations: vec![format!("{gate}: {reason}")],
            };
            let ev = finish(
                &p,
                decision,
                combined_state_hash(&state),
                source_hash,
                None,
                Some(gate_report),
                vec![patch_artifact],
                None,
                &ephemeral,
                &node,
            )?;
            ephemeral.destroy();
            let key = crate::ledger::CacheKey {
                patch_hash: p.patch_hash.clone(),
                state_hash: ev.verdict.state_hash.clone(),
                source_hash: ev.verdict.source_hash.clone(),
                task_hash: p.task_hash.clone(),
                policy_hash: p.policy_hash.clone(),
            };
            record(&p, &ev, &key, &p.policy.decision, None, a)?;
            return Ok(ev);
        }
        (GateOutcome::Passed, Some(patch)) => patch,
        (GateOutcome::Passed, None) => {
            return Err(EvaluateError::Internal(
                "the gates passed but returned no patch".into(),
            ));
        }
    };
    check_interrupt()?;

    // 2 FORK: one snapshot of each state store, shared by both sides.
    let snap_dir = staging.path().join("state");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&snap_dir)
        .map_err(|e| internal("staging")(e.to_string()))?;
    let mut state_digests = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for s in &p.manifest.runtime.state {
        let name = s
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| {
                EvaluateError::Input(format!("state path {} has no file name", s.display()))
            })?;
        if !seen.insert(name.clone()) {
            return Err(EvaluateError::Input(format!(
                "{}: two state stores share the file name `{name}`",
                p.manifest.file.display()
            )));
        }
        let stats = snapshot(
            &p.runtime.join(s),
            &snap_dir.join(&name),
            &SnapshotOptions::default(),
        )
        .map_err(|e| EvaluateError::Input(format!("snapshotting {}: {e}", s.display())))?;
        tracing::info!(
            "snapshot {}: {} bytes in {:?} ({} steps, {} restarts, longest step {:?})",
            s.display(),
            stats.bytes,
            stats.elapsed,
            stats.steps,
            stats.restarts,
            stats.longest_step
        );
        // The copy of the parent's state is private to fork (and then to the successor).
        std::fs::set_permissions(
            snap_dir.join(&name),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .map_err(|e| internal("protecting the snapshot")(e.to_string()))?;
        state_digests.push((s.display().to_string(), stats.sha256.clone()));
        check_interrupt()?;
    }
    let state_hash = combined_state_hash(&state_digests);

    // The cache: the same patch on the same source tree, state, task and policy was
    // evaluated before, and its bundle still verifies. (The key's source is the tree the
    // patch applies to: with the patch hash, it determines the patched tree.)
    let parent_source_hash = tree_hash_excluding(&source_dir, exclude)
        .map_err(|e| internal("hashing the source")(e.to_string()))?;
    let cache_key = crate::ledger::CacheKey {
        patch_hash: p.patch_hash.clone(),
        state_hash: state_hash.clone(),
        source_hash: parent_source_hash,
        task_hash: p.task_hash.clone(),
        policy_hash: p.policy_hash.clone(),
    };
    if !a.no_cache && a.replicas <= 1 {
        if let Some(ev) = cached(&p, &cache_key, &node, a)? {
            ephemeral.destroy();
            return Ok(ev);
        }
    }

    // 3 PATCH: the first patched workspace.
    let first = match prepare_side(&p, &source_dir, &snap_dir, Some(&parsed))? {
        Prepared::Ready(side) => side,
        Prepared::DidNotApply(msg, h) => {
            let evidence = Evidence {
                apply_error: Some(msg),
                ..Default::default()
            };
            let decision = decide(&evidence, &p.policy.decision);
            let ev = finish(
                &p,
                decision,
                state_hash,
                h,
                None,
                Some(GateReport {
                    passed: true,
                    violations: vec![],
                }),
                vec![patch_artifact],
                None,
                &ephemeral,
                &node,
            )?;
            ephemeral.destroy();
            record(&p, &ev, &cache_key, &p.policy.decision, None, a)?;
            return Ok(ev);
        }
    };
    let source_hash = first.source_hash.clone();
    // 4 EVALUATE: `repeat` rounds; in each, every replica of the patched side, then the
    // baseline (interleaved, so drift on the machine hits both sides alike).
    let replicas = a.replicas.max(1) as usize;
    let repeat = p.task.repeat.max(1) as usize;
    let mut patched: Vec<Vec<RunResult>> = (0..replicas).map(|_| Vec::new()).collect();
    let mut baseline: Vec<RunResult> = Vec::new();
    let mut first = Some(first);
    for round in 0..repeat {
        for (r, runs) in patched.iter_mut().enumerate() {
            let prepared = match first.take() {
                Some(f) => *f,
                None => match prepare_side(&p, &source_dir, &snap_dir, Some(&parsed))? {
                    Prepared::Ready(side) => *side,
                    Prepared::DidNotApply(msg, _) => {
                        return Err(EvaluateError::Internal(format!(
                            "the patch applied once and then not: {msg}"
                        )))
                    }
                },
            };
            runs.push(run_side(
                &p,
                prepared,
                staging.path(),
                &side_label("patched", r, round, replicas),
            )?);
            check_interrupt()?;
        }
        let decided = patched
            .iter()
            .flatten()
            .any(|r| r.outcome.budget_exceeded.is_some() || r.outcome.exec_error.is_some());
        if p.task.baseline && !decided {
            if let Prepared::Ready(side) = prepare_side(&p, &source_dir, &snap_dir, None)? {
                baseline.push(run_side(
                    &p,
                    *side,
                    staging.path(),
                    &side_label("baseline", 0, round, 1),
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
    let baseline_samples = samples(&baseline);
    let mut decisions: Vec<(Decision, usize)> = Vec::new();
    for (r, runs) in patched.iter().enumerate() {
        let (mut evidence, chosen) =
            evidence_for(&p, runs, &baseline, &baseline_samples, &rules, r as u64);
        // The API-cost budget is the evaluation's: blown by any run (the baseline's too),
        // it is blown for the verdict.
        if let Some(g) = p.gateway.as_ref().filter(|g| g.meter.exceeded()) {
            if evidence.budget_exceeded.is_none() {
                evidence.budget_exceeded =
                    Some(crate::budget::BudgetKind::ApiCost.as_str().to_string());
                evidence.usage_summary = Some(format!(
                    "api_cost: ${:.4} of ${:.4} spent by this evaluation's runs",
                    g.meter.spent_usd(),
                    g.meter.budget_usd()
                ));
            }
        }
        decisions.push((decide(&evidence, &rules), chosen));
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
        .max_by_key(|(i, (d, _))| (severity(d.verdict), std::cmp::Reverse(*i)))
        .map(|(i, (d, _))| (i, d.verdict))
        .unwrap_or((0, VerdictKind::Reject));
    let mut decision = decisions[pick].0.clone();
    let chosen_run = decisions[pick].1;
    if replicas > 1 {
        let agree = decisions
            .iter()
            .filter(|(d, _)| d.verdict == decision.verdict)
            .count();
        if agree < replicas {
            let counts: Vec<String> = [
                VerdictKind::Approve,
                VerdictKind::NeedsRevision,
                VerdictKind::Reject,
            ]
            .iter()
            .filter_map(|k| {
                let n = decisions.iter().filter(|(d, _)| d.verdict == *k).count();
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
    let ev = finish(
        &p,
        decision,
        state_hash,
        source_hash,
        Some(&primary.outcome),
        Some(GateReport {
            passed: true,
            violations: vec![],
        }),
        artifacts,
        primary.tests.as_ref(),
        &ephemeral,
        &node,
    )?;
    // 6 DESTROY: sandboxes are gone (run_side), the staging directory goes with `staging`,
    // the ephemeral secret is zeroized now, the node key when `node` drops.
    ephemeral.destroy();
    record(&p, &ev, &cache_key, &rules, primary.tests.as_ref(), a)?;
    Ok(ev)
}

/// `patched`, `patched.r2`, `replica2`, `replica2.r3`, `baseline`, `baseline.r2`.
fn side_label(side: &str, replica: usize, round: usize, replicas: usize) -> String {
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

/// Metric samples across runs: name -> values.
fn samples(runs: &[RunResult]) -> std::collections::BTreeMap<String, Vec<f64>> {
    let mut out: std::collections::BTreeMap<String, Vec<f64>> = std::collections::BTreeMap::new();
    for r in runs {
        if let Some(m) = &r.metrics {
            for (k, v) in m {
                out.entry(k.clone()).or_default().push(*v);
            }
        }
    }
    out
}

/// The evidence of one replica's runs: the run that speaks (a blown budget, a failed
/// start, failing tests, else the first), metric medians and their statistics.
fn evidence_for(
    p: &Plan,
    runs: &[RunResult],
    baseline: &[RunResult],
    baseline_samples: &std::collections::BTreeMap<String, Vec<f64>>,
    rules: &crate::verdict::decide::DecisionRules,
    seed: u64,
) -> (Evidence, usize) {
    let chosen = runs
        .iter()
        .position(|r| r.outcome.budget_exceeded.is_some() || r.outcome.exec_error.is_some())
        .or_else(|| {
            runs.iter()
                .position(|r| r.tests.as_ref().is_some_and(|t| t.failed() > 0))
        })
        .or_else(|| runs.iter().position(|r| r.outcome.exit_code != 0))
        .unwrap_or(0);
    let r = &runs[chosen];
    let o = &r.outcome;
    let mut e = Evidence {
        exit_code: if o.signal.is_none() {
            Some(o.exit_code)
        } else {
            None
        },
        signal: o.signal,
        budget_exceeded: o.budget_exceeded.map(|b| b.as_str().to_string()),
        usage_summary: o
            .budget_exceeded
            .map(|b| crate::budget::describe(b, &p.policy.budgets, &o.usage)),
        run_error: o.exec_error.clone(),
        tests: r.tests.clone(),
        results_error: r.results_error.clone(),
        metrics_error: runs.iter().find_map(|r| r.metrics_error.clone()),
        ..Default::default()
    };
    let patched_samples = samples(runs);
    if !patched_samples.is_empty() {
        let med = |m: &std::collections::BTreeMap<String, Vec<f64>>| {
            m.iter()
                .filter_map(|(k, v)| crate::verdict::stats::median(v).map(|x| (k.clone(), x)))
                .collect::<std::collections::BTreeMap<String, f64>>()
        };
        e.metrics = Some(med(&patched_samples));
        if !baseline.is_empty() {
            e.baseline_metrics = Some(med(baseline_samples));
        }
        // Statistics need repeated samples; single runs are judged on the noise band.
        if !baseline.is_empty() && runs.len() > 1 && baseline.len() > 1 {
            let cfg = crate::verdict::stats::CompareConfig {
                method: rules.method,
                alpha: rules.alpha,
                noise_band: rules.noise_band,
                seed: 0x666f_726b ^ seed,
                ..Default::default()
            };
            for (name, ps) in &patched_samples {
                if let Some(bs) = baseline_samples.get(name) {
                    e.metric_stats.insert(
                        name.clone(),
                        crate::verdict::stats::compare(name, bs, ps, &cfg),
                    );
                }
            }
        }
    }
    (e, chosen)
}

/// A verdict the ledger already holds for exactly these inputs, if its bundle still verifies.
fn cached(
    p: &Plan,
    key: &crate::ledger::CacheKey,
    node: &NodeKey,
    a: &EvaluateArgs,
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
            tracing::warn!(
                "cached verdict {} no longer verifies ({e}): evaluating again",
                dir.display()
            );
            return Ok(None);
        }
    };
    // Hand the cached bundle over at --out too, so pipelines find it where they asked.
    copy_tree(&dir, &p.out_dir, &[])
        .map_err(|e| internal("copying the cached bundle")(e.to_string()))?;
    eprintln!(
        "fork: reusing the verdict of run {} (same patch, state, source, task and policy); pass --no-cache to evaluate again",
        entry.run_id
    );
    let ev = Evaluation {
        out_dir: p.out_dir.clone(),
        verdict: verified.verdict,
    };
    // The CI outputs, as for a fresh verdict (the tests from the bundle's own report).
    let tests = ev
        .verdict
        .artifacts
        .iter()
        .find(|art| art.kind == ArtifactType::TestReport)
        .and_then(|art| std::fs::read(ev.out_dir.join(&art.path)).ok())
        .and_then(|b| results::parse_junit(&b).ok());
    let mut rules = p.policy.decision.clone();
    rules
        .lower_is_better
        .extend(p.task.lower_is_better.iter().cloned());
    crate::verdict::report::write_ci_outputs(
        &ev.verdict,
        tests.as_ref(),
        &rules,
        &ev.out_dir,
        a.junit.as_deref(),
        a.summary.as_deref(),
    )
    .map_err(|e| EvaluateError::Internal(format!("writing the CI outputs: {e}")))?;
    Ok(Some(ev))
}

/// Appends the verdict to the ledger and writes the CI outputs.
fn record(
    p: &Plan,
    ev: &Evaluation,
    key: &crate::ledger::CacheKey,
    rules: &crate::verdict::decide::DecisionRules,
    tests: Option<&results::TestReport>,
    a: &EvaluateArgs,
) -> Result<(), EvaluateError> {
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
    if let Err(e) = crate::verdict::report::write_ci_outputs(
        &ev.verdict,
        tests,
        rules,
        &ev.out_dir,
        a.junit.as_deref(),
        a.summary.as_deref(),
    ) {
        return Err(EvaluateError::Internal(format!(
            "writing the CI outputs: {e}"
        )));
    }
    Ok(())
}

/// A sandbox with its workspace populated (and patched, on the patched side).
struct PreparedSide {
    sb: Sandbox,
    ws: Workspace,
    source_hash: String,
}

enum Prepared {
    Ready(Box<PreparedSide>),
    /// The patch did not apply (message), with the unpatched tree hash.
    DidNotApply(String, String),
}

/// FORK (and PATCH) for one run: a sandbox whose workspace holds the source (patched when
/// `patch` is given), the tools and the state snapshot.
fn prepare_side(
    p: &Plan,
    source_dir: &Path,
    snap_dir: &Path,
    patch: Option<&Patch>,
) -> Result<Prepared, EvaluateError> {
    let sb = Sandbox::prepare(&p.policy)?;
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
    Ok(Prepared::Ready(Box::new(PreparedSide {
        sb,
        ws,
        source_hash,
    })))
}

/// EVALUATE one prepared side (with reruns of failing tests), read its results, destroy it.
fn run_side(
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
    let env = crate::run::successor_env(&p.policy, &extra);
    let side_dir = staging.join(side);
    std::fs::create_dir_all(&side_dir).map_err(|e| internal("staging")(e.to_string()))?;
    // Artifact names: tests.xml, metrics.json, ... for the first patched run; `<side>-*` for
    // the others; `-retryN` for reruns of a run whose tests failed.
    let base_prefix = if side == "patched" {
        String::new()
    } else {
        format!("{side}-")
    };
    let mut attempts: Vec<RunResult> = Vec::new();
    let max_attempts = 1 + p.policy.decision.reruns;
    for attempt in 0..max_attempts {
        let prefix = if attempt == 0 {
            base_prefix.clone()
        } else {
            format!("{base_prefix}retry{attempt}-")
        };
        if attempt > 0 {
            // A fresh reports directory; the rest of the workspace is kept, as a flaky test's
            // own state would be.
            let reports = ws.reports();
            let intact = std::fs::symlink_metadata(&reports)
                .map(|m| m.is_dir())
                .unwrap_or(false);
            if intact {
                crate::fork::workspace::remove_tree(&reports)
                    .map_err(|e| internal("clearing the reports")(e.to_string()))?;
            } else if std::fs::symlink_metadata(&reports).is_ok() {
                std::fs::remove_file(&reports)
                    .map_err(|e| internal("clearing the reports")(e.to_string()))?;
            }
            std::fs::create_dir(&reports).map_err(|e| internal("reports")(e.to_string()))?;
            sb.chown_workspace()?;
        }
        let r = run_attempt(p, &mut sb, &env, &side_dir, &prefix, attempt)?;
        let failed = r.outcome.budget_exceeded.is_none()
            && r.outcome.exec_error.is_none()
            && r.tests.as_ref().is_some_and(|t| t.failed() > 0);
        attempts.push(r);
        if !failed {
            break;
        }
        check_interrupt()?;
    }
    // 6 DESTROY this side's sandbox now.
    sb.destroy()?;
    Ok(merge_attempts(attempts))
}

/// One run of the task in a prepared sandbox, and what it left in its reports directory.
fn run_attempt(
    p: &Plan,
    sb: &mut Sandbox,
    env: &[(String, String)],
    side_dir: &Path,
    prefix: &str,
    attempt: u32,
) -> Result<RunResult, EvaluateError> {
    // The successor's output goes to a log on its own capped disk, read back through our fd.
    let log_path = sb.disk().join(format!(".fork-output-{attempt}.log"));
    let log = std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| internal("creating the output log")(e.to_string()))?;
    let cwd = PathBuf::from(WORKSPACE).join("src");
    let outcome = sb.run_in(&p.task.command, env, &cwd, Some(&log), doors_for(p)?)?;
    if outcome.interrupted {
        return Err(EvaluateError::Interrupted);
    }
    // The successor is dead: read its reports (hostile input, read with care). Read beneath
    // the capped disk's root (which the successor could not replace), walking
    // `successor/reports/...` component by component without following any symlink: the
    // successor may have replaced its workspace or reports directory with a link.
    let disk = sb.disk();
    let in_reports = |rel: &str| format!("successor/reports/{rel}");
    let stage = |name: String, bytes: &[u8]| -> Result<PathBuf, EvaluateError> {
        let dest = side_dir.join(format!("{prefix}{name}"));
        std::fs::write(&dest, bytes).map_err(|e| internal("staging")(e.to_string()))?;
        Ok(dest)
    };
    let mut artifacts = Vec::new();
    let mut tests = None;
    let mut results_error = None;
    if let Some(r) = &p.task.results {
        match results::read_report_file(
            &disk,
            &in_reports(&r.path),
            results::DEFAULT_MAX_REPORT_BYTES,
        ) {
            Ok(bytes) => {
                let parsed = match r.format {
                    ResultsFormat::Junit => results::parse_junit(&bytes),
                    ResultsFormat::Tap => results::parse_tap(&bytes),
                    ResultsFormat::GoTestJson => results::parse_go_test_json(&bytes),
                    ResultsFormat::LibtestJson => results::parse_libtest_json(&bytes),
                    ResultsFormat::ExitStatus => Ok(results::TestReport::default()),
                };
                match parsed {
                    Ok(t) => tests = Some(t),
                    Err(e) => results_error = Some(format!("{}: {e}", r.path)),
                }
                let name = Path::new(&r.path)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "results".into());
                artifacts.push((ArtifactType::TestReport, stage(name, &bytes)?));
            }
            Err(e) => results_error = Some(format!("{}: {e}", r.path)),
        }
    }
    let mut metrics = None;
    let mut metrics_error = None;
    if let Some(m) = &p.task.metrics {
        match results::read_report_file(&disk, &in_reports(m), results::DEFAULT_MAX_REPORT_BYTES) {
            Ok(bytes) => {
                match results::parse_metrics(&bytes) {
                    Ok(v) => metrics = Some(v),
                    Err(e) => metrics_error = Some(format!("{m}: {e}")),
                }
                artifacts.push((ArtifactType::Metrics, stage("metrics.json".into(), &bytes)?));
            }
            Err(e) => metrics_error = Some(format!("{m}: {e}")),
        }
    }
    // Any other report files (top level, regular, bounded in count and size) travel too.
    let declared: Vec<&str> = p
        .task
        .results
        .iter()
        .map(|r| r.path.as_str())
        .chain(p.task.metrics.as_deref())
        .collect();
    let reports_dir = disk.join("successor/reports");
    let reports_intact = ["successor", "successor/reports"].iter().all(|c| {
        std::fs::symlink_metadata(disk.join(c))
            .map(|m| m.is_dir())
            .unwrap_or(false)
    });
    if reports_intact {
        if let Ok(rd) = std::fs::read_dir(&reports_dir) {
            let mut names: Vec<String> = rd
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !declared.contains(&n.as_str()))
                .collect();
            names.sort();
            let mut room = MAX_EXTRA_REPORT_BYTES;
            for name in names.into_iter().take(MAX_EXTRA_REPORTS) {
                // read_report_file refuses symlinks, non-regular and oversized files; what
                // the successor left is bounded in count and in total size on the host.
                if room == 0 {
                    break;
                }
                if let Ok(bytes) = results::read_report_file(&disk, &in_reports(&name), room) {
                    room = room.saturating_sub(bytes.len() as u64);
                    let safe: String = name
                        .chars()
                        .map(|c| {
                            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                                c
                            } else {
                                '_'
                            }
                        })
                        .collect();
                    let dest = stage(format!("report-{}", safe.trim_start_matches('.')), &bytes)?;
                    artifacts.push((ArtifactType::Other, dest));
                }
            }
        }
    }
    // The output log, through the fd we opened (the successor may have replaced the path).
    {
        use std::io::{Read, Seek};
        let mut f = log;
        let mut buf = Vec::new();
        if f.rewind().is_ok() {
            let _ = Read::by_ref(&mut f).take(4 << 20).read_to_end(&mut buf);
        }
        artifacts.push((ArtifactType::Log, stage("output.log".into(), &buf)?));
    }
    let json =
        serde_json::to_vec_pretty(&outcome).map_err(|e| internal("staging")(e.to_string()))?;
    artifacts.push((ArtifactType::Other, stage("sandbox.json".into(), &json)?));
    Ok(RunResult {
        outcome,
        tests,
        results_error,
        metrics,
        metrics_error,
        artifacts,
    })
}

/// The doors of one run: the forwards and, with a gateway, the metered model door (a
/// fresh gateway per run, on that run's runtime, sharing the evaluation's meter).
fn doors_for(p: &Plan) -> Result<crate::sandbox::Doors, EvaluateError> {
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

#[allow(clippy::too_many_arguments)]
fn finish(
    p: &Plan,
    d: Decision,
    state_hash: String,
    source_hash: String,
    outcome: Option<&Outcome>,
    gate: Option<GateReport>,
    artifacts: Vec<(ArtifactType, PathBuf)>,
    tests: Option<&results::TestReport>,
    ephemeral: &EphemeralKey,
    node: &NodeKey,
) -> Result<Evaluation, EvaluateError> {
    let b = &p.policy.budgets;
    let limits = BudgetLimits {
        wall_s: Some(b.wall.as_secs_f64()),
        cpu_percent: Some(b.cpu_percent),
        memory_bytes: Some(b.memory_bytes),
        disk_bytes: Some(b.disk_bytes),
        pids: Some(b.pids),
        api_cost_usd: Some(b.api_cost_usd),
    };
    let used = outcome
        .map(|o| BudgetUsed {
            wall_s: o.usage.wall_s,
            cpu_s: o.usage.cpu_s,
            memory_peak_bytes: o.usage.memory_peak_bytes,
            disk_bytes: o.usage.disk_bytes,
            pids_peak: o.usage.pids_peak,
            api_cost_usd: o.usage.api_cost_usd,
        })
        .unwrap_or_default();
    // API cost: what the whole evaluation spent (every run shares the meter).
    let mut used = used;
    let mut exceeded = outcome.and_then(|o| o.budget_exceeded.map(|b| b.as_str().to_string()));
    if let Some(g) = &p.gateway {
        used.api_cost_usd = g.meter.spent_usd();
        if g.meter.exceeded() && exceeded.is_none() {
            exceeded = Some(crate::budget::BudgetKind::ApiCost.as_str().to_string());
        }
    }
    let counts = tests
        .map(|t| TestCounts {
            passed: t.passed() as u64,
            failed: t.failed() as u64,
            flaky: t.flaky() as u64,
            skipped: t.skipped() as u64,
        })
        .unwrap_or_default();
    let verdict = Verdict {
        header: Header::new(),
        verdict: d.verdict,
        confidence: d.confidence,
        patch_hash: p.patch_hash.clone(),
        task_hash: p.task_hash.clone(),
        state_hash,
        source_hash,
        evaluation_summary: d.summary,
        caveats: d.caveats,
        tests: counts,
        metrics: d.metrics,
        budget: BudgetReport {
            limits,
            used,
            exceeded,
        },
        isolation: outcome
            .and_then(|o| serde_json::to_value(&o.isolation).ok())
            .unwrap_or_else(|| serde_json::json!({ "sandbox_started": false })),
        artifacts: vec![],
        successor_key: ephemeral.public().to_string(),
        run_id: p.run_id.clone(),
        task: p.task_name.clone(),
        patch_gate: gate,
        proposal_id: p.proposal_id.clone(),
    };
    if let Some(parent) = p.out_dir.parent() {
        if !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent)
                .map_err(|e| EvaluateError::Usage(format!("--out {}: {e}", p.out_dir.display())))?;
        }
    }
    let written =
        crate::verdict::write_bundle(&p.out_dir, &verdict, &artifacts, ephemeral, node)
            .map_err(|e| EvaluateError::Internal(format!("writing the verdict bundle: {e}")))?;
    Ok(Evaluation {
        out_dir: written.dir,
        verdict: written.verdict,
    })
}
