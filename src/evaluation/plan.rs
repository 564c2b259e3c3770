//! Phase 1, PLAN: the manifest, the policy and the task resolved into one [`Plan`]: the
//! budgets through their one pipeline (policy, then task, then request), the sandbox
//! spec, the hashes that key the cache, the doors. Nothing is cloned yet.

use super::request::{CiOutputs, LedgerChoice, Request};
use super::{sha256_hex, EvaluateError};
use crate::identity::NodeKey;
use crate::manifest::{Manifest, TaskSpec};
use crate::policy::Policy;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Everything planned in phase 1.
pub struct Plan {
    pub run_id: String,
    pub manifest: Manifest,
    pub runtime: PathBuf,
    pub task_name: String,
    pub task: TaskSpec,
    pub policy: Policy,
    /// The patch as read: the whole file, or its first `max_patch_bytes + 1` bytes when it
    /// is larger (it is then REJECTed by the size gate; nothing more is ever read or kept).
    pub raw_patch: Vec<u8>,
    /// The patch file's size (what the size gate judges).
    pub patch_size: u64,
    /// sha256 of `raw_patch`.
    pub patch_hash: String,
    pub task_hash: String,
    /// The conditions the verdict is reached under ([`conditions_hash`]): fork's version,
    /// the resolved policy and the isolation in force. The cache keys on it.
    pub policy_hash: String,
    pub out_dir: PathBuf,
    /// The ledger, unless the request turned it off.
    pub ledger: Option<PathBuf>,
    /// Whether a ledger verdict may answer (never with replicas).
    pub use_cache: bool,
    pub replicas: usize,
    pub ci: CiOutputs,
    /// The sandbox every run of this evaluation gets.
    pub spec: crate::sandbox::Spec,
    /// When the evaluation's own wall budget runs out.
    pub deadline: std::time::Instant,
    /// The secret seed the judges of this evaluation get (never the subject), zeroized
    /// with the plan.
    pub judge_seed: zeroize::Zeroizing<String>,
    /// Host loopback services forwarded into every sandbox (policy and task).
    pub forwards: Vec<std::net::SocketAddr>,
    pub proposal_id: Option<String>,
    /// The metered model gateway (fork.toml's `[gateway]`, else the policy's): its
    /// configuration and credentials, and the meter every run of this evaluation shares
    /// (the API-cost budget is the evaluation's).
    pub gateway: Option<GatewayPlan>,
}

pub struct GatewayPlan {
    pub cfg: crate::gateway::GatewayConfig,
    pub credentials: Option<zeroize::Zeroizing<String>>,
    pub meter: std::sync::Arc<crate::gateway::Meter>,
}

impl Plan {
    /// Who produces this evaluation's evidence: the task's judge, or the task itself.
    pub fn provenance(&self) -> crate::verdict::Provenance {
        if self.task.judge.is_some() {
            crate::verdict::Provenance::Judge
        } else {
            crate::verdict::Provenance::SelfReported
        }
    }
}

/// A fresh 128-bit secret, hex, for the judges of one evaluation alone: every run of the
/// evaluation (repeats, reruns, replicas, the baseline) gets the same one, so that the two
/// sides are judged on the same inputs and a rerun is a real rerun, not new inputs.
fn new_seed() -> String {
    use rand::RngCore;
    let mut b = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut b);
    hex::encode(b)
}

pub fn load_node_key(path: Option<&Path>) -> Result<NodeKey, EvaluateError> {
    match path {
        Some(p) => {
            crate::identity::load_node_key(p).map_err(|e| EvaluateError::Usage(e.to_string()))
        }
        None => {
            let p = crate::identity::default_node_key_path();
            if !p.exists() {
                // Evaluations started together may all find no key: one creates it (the
                // move into place refuses to replace a file), the others load that one.
                match crate::identity::generate_node_key(&p, false) {
                    Ok(public) => {
                        eprintln!("fork: no node key yet: created {} ({public})", p.display())
                    }
                    Err(crate::identity::IdentityError::KeyExists { .. }) => {}
                    Err(e) => {
                        return Err(EvaluateError::Internal(format!(
                            "creating the node key: {e}"
                        )))
                    }
                }
            }
            crate::identity::load_node_key(&p).map_err(|e| EvaluateError::Usage(e.to_string()))
        }
    }
}

pub fn plan(a: &Request) -> Result<Plan, EvaluateError> {
    // The patch's type is checked first (a FIFO is refused at once); it is read, bounded by
    // the policy's size gate, once the policy is known.
    crate::fsx::open_regular(&a.patch).map_err(|e| {
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
    // Budgets: the policy's, then the task's, then the request's, one pipeline.
    let task_budget = task.budget.parse().map_err(|e| {
        EvaluateError::Input(format!(
            "{}: task `{task_name}`: {e}",
            manifest.file.display()
        ))
    })?;
    policy.budgets.apply(&task_budget).map_err(|e| {
        EvaluateError::Input(format!(
            "{}: task `{task_name}`: {e}",
            manifest.file.display()
        ))
    })?;
    policy
        .budgets
        .apply(&a.budget)
        .map_err(|e| EvaluateError::Usage(format!("the requested budget: {e}")))?;
    let patch = crate::patch::read_patch_file(&a.patch, policy.gates.max_patch_bytes)
        .map_err(|e| EvaluateError::Input(e.to_string()))?;
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
    let patch_hash = patch.hash();
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
    let ledger = match &a.ledger {
        LedgerChoice::Default => Some(crate::ledger::Ledger::default_path()),
        LedgerChoice::At(p) => Some(p.clone()),
        LedgerChoice::Off => None,
    };
    // The isolation in force is probed only when a ledger will record (or serve) the key.
    let isolation = if ledger.is_some() {
        crate::check::isolation_in_force(&policy)
    } else {
        String::new()
    };
    let policy_hash = conditions_hash(&policy, &isolation)?;
    let spec = policy.sandbox_spec();
    let deadline = std::time::Instant::now() + policy.budgets.evaluation_wall;
    Ok(Plan {
        use_cache: a.use_cache,
        replicas: a.replicas.max(1) as usize,
        ci: a.ci.clone(),
        spec,
        deadline,
        judge_seed: zeroize::Zeroizing::new(new_seed()),
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
        raw_patch: patch.bytes,
        patch_size: patch.size,
        patch_hash,
        task_hash,
        out_dir,
    })
}

/// The ledger's `policy_hash`: sha256 over the conditions a verdict was reached under, which
/// the cache must match besides the inputs: this fork's version, the resolved policy
/// (budgets, layers, gates, decision rules, ...) and the isolation this host puts in force
/// under it ([`crate::check::isolation_in_force`]).
pub fn conditions_hash(policy: &Policy, isolation: &str) -> Result<String, EvaluateError> {
    let policy_doc =
        serde_json::to_vec(policy).map_err(|e| EvaluateError::Internal(e.to_string()))?;
    let mut h = Sha256::new();
    h.update(b"fork-conditions-v2\0");
    for part in [
        env!("CARGO_PKG_VERSION").as_bytes(),
        &policy_doc,
        isolation.as_bytes(),
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    Ok(format!("sha256:{}", hex::encode(h.finalize())))
}

/// sha256 over every state store: name and digest per file, in manifest order.
pub fn combined_state_hash(files: &[(String, String)]) -> String {
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
