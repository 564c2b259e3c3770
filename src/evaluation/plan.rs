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
    /// The evaluation plan: the tasks this evaluation runs, in order, into one verdict.
    pub tasks: Vec<TaskPlan>,
    /// The policy, with the request's budgets over its own (each task's budgets are in its
    /// [`TaskPlan`]).
    pub policy: Policy,
    /// The patch as read: the whole file, or its first `max_patch_bytes + 1` bytes when it
    /// is larger (it is then REJECTed by the size gate; nothing more is ever read or kept).
    pub raw_patch: Vec<u8>,
    /// The patch file's size (what the size gate judges).
    pub patch_size: u64,
    /// sha256 of `raw_patch`.
    pub patch_hash: String,
    /// The plan's hash ([`plan_hash`]): a one-task plan's is its task's hash.
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
    /// When the evaluation's own wall budget runs out.
    pub deadline: std::time::Instant,
    /// The secret seed the judges of this evaluation get (never the subject), zeroized
    /// with the plan.
    pub judge_seed: zeroize::Zeroizing<String>,
    pub proposal_id: Option<String>,
    /// The metered model gateway (fork.toml's `[gateway]`, else the policy's): its
    /// configuration and credentials, and the meter every run of this evaluation shares
    /// (the API-cost budget is the evaluation's).
    pub gateway: Option<GatewayPlan>,
    /// What the policy passes into the sandbox and the gateway's credentials, kept out of
    /// everything the evaluation keeps from its runs (see `redact`).
    pub redactor: super::redact::Redactor,
    /// The sandbox teardowns under way (each joined before the next sandbox, before the
    /// bundle is published, and when the plan drops).
    pub teardowns: super::teardowns::Teardowns,
}

/// One task of the plan, resolved: its budgets through the one pipeline (the policy's,
/// then the task's, then the request's), the sandbox its runs get, its forwards.
pub struct TaskPlan {
    pub name: String,
    pub spec: TaskSpec,
    /// sha256 over the task's name and definition.
    pub hash: String,
    pub budgets: crate::budget::Budgets,
    /// The sandbox every run of this task gets.
    pub sandbox: crate::sandbox::Spec,
    /// Host loopback services forwarded into every sandbox (policy and task).
    pub forwards: Vec<std::net::SocketAddr>,
    /// What this task's artifacts and staging directories are prefixed with: nothing in a
    /// one-task plan (the bundle's layout is unchanged), `<task>-` otherwise.
    pub prefix: String,
}

impl TaskPlan {
    /// Who produces this task's evidence: its judge, or the task itself.
    pub fn provenance(&self) -> crate::verdict::Provenance {
        if self.spec.judge.is_some() {
            crate::verdict::Provenance::Judge
        } else {
            crate::verdict::Provenance::SelfReported
        }
    }
}

pub struct GatewayPlan {
    pub cfg: crate::gateway::GatewayConfig,
    pub credentials: Option<zeroize::Zeroizing<String>>,
    pub meter: std::sync::Arc<crate::gateway::Meter>,
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
        // A `--key` that is not a regular file (a directory, a FIFO) is bad input, as for
        // `approve` and the mesh commands; the other failures are the flag's.
        Some(p) => crate::identity::load_node_key(p).map_err(|e| {
            if e.is_bad_input() {
                EvaluateError::Input(e.to_string())
            } else {
                EvaluateError::Usage(e.to_string())
            }
        }),
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
    let chosen = manifest
        .plan(&a.tasks)
        .map_err(|e| EvaluateError::Input(e.to_string()))?
        .into_iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect::<Vec<_>>();
    let mut policy =
        Policy::load(a.policy.as_deref()).map_err(|e| EvaluateError::Input(e.to_string()))?;
    // Budgets: the policy's, then the task's, then the request's, one pipeline. The
    // request's are checked once here, over the policy's.
    let policy_budgets = policy.budgets.clone();
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
    let runtime = std::fs::canonicalize(&a.runtime)
        .map_err(|e| EvaluateError::Input(format!("--runtime {}: {e}", a.runtime.display())))?;
    let ledger = match &a.ledger {
        LedgerChoice::Default => Some(crate::ledger::Ledger::default_path()),
        LedgerChoice::At(p) => Some(p.clone()),
        LedgerChoice::Off => None,
    };
    // No output may land in the tree every evaluation copies and hashes.
    super::outputs::check_outside_source(a, &runtime, &manifest, &out_dir, ledger.as_deref())?;
    let mut manifest = manifest;
    let grading = grading_files_in_source(&runtime, &manifest.runtime.source, a, &policy);
    manifest.runtime.protected.extend(grading);
    // The parent's live state files (and their journals) are invisible in the sandbox.
    policy
        .filesystem
        .hide
        .extend(state_hides(&runtime, &manifest));
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
    let gateway = match manifest.gateway.clone().or_else(|| policy.gateway.clone()) {
        None => None,
        Some(cfg) => {
            // (The policy's own [gateway] was checked when the policy was read.)
            if manifest.gateway.is_some() {
                policy
                    .check_gateway_key_not_passed(&cfg, "fork.toml's [gateway]")
                    .map_err(|e| EvaluateError::Input(e.to_string()))?;
            }
            let credentials = cfg
                .load_credentials()
                .map_err(|e| EvaluateError::Input(format!("the model gateway: {e}")))?;
            if let Some(key) = &credentials {
                policy
                    .check_gateway_key_not_given(key)
                    .map_err(|e| EvaluateError::Input(e.to_string()))?;
                // A task's own variables, from fork.toml, reach the sandbox too.
                for (name, t) in &chosen {
                    if let Some(var) = t.env.iter().find(|(_, v)| v.contains(key.as_str())) {
                        return Err(EvaluateError::Input(format!(
                            "fork.toml: tasks.{name}.env.{}: holds the model gateway's API key: the key would be inside the sandbox. Remove it: the gateway adds the key to each call itself",
                            var.0
                        )));
                    }
                }
            }
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
    // The isolation in force is probed only when a ledger will record (or serve) the key.
    let isolation = if ledger.is_some() {
        crate::check::isolation_in_force(&policy)
    } else {
        String::new()
    };
    // The tools are copied into every workspace from the runtime's own directory, which
    // the source hash covers only when it lies in the source tree (and not excluded):
    // hashed here for the cache's key, so a verdict is never served for other tools.
    let tools_hash = match (&ledger, &manifest.runtime.tools) {
        (Some(_), Some(t)) => Some(
            crate::fork::TreeListing::beneath(&runtime, t, &[])
                .map_err(|e| {
                    EvaluateError::Input(format!("the tools {}: {e}", runtime.join(t).display()))
                })?
                .hash,
        ),
        _ => None,
    };
    let policy_hash = conditions_hash(
        &policy,
        gateway.as_ref().map(|g| &g.cfg),
        tools_hash.as_deref(),
        &isolation,
    )?;
    let multi = chosen.len() > 1;
    let mut tasks = Vec::with_capacity(chosen.len());
    for (name, spec) in chosen {
        tasks.push(plan_task(
            &manifest,
            &policy,
            &policy_budgets,
            a,
            &forwards,
            name,
            spec,
            multi,
        )?);
    }
    let task_hash = plan_hash(&tasks);
    // The evaluation's wall: the shortest any task of the plan resolves to (a task may
    // shorten it; the request has the last word for every task).
    let evaluation_wall = tasks
        .iter()
        .map(|t| t.budgets.evaluation_wall)
        .min()
        .unwrap_or(policy.budgets.evaluation_wall);
    let deadline = std::time::Instant::now()
        .checked_add(evaluation_wall)
        .ok_or_else(|| {
            EvaluateError::Input(format!(
                "the evaluation's wall ({evaluation_wall:?}) is past the clock's range"
            ))
        })?;
    let redactor = super::redact::Redactor::for_run(
        &policy,
        gateway.as_ref().and_then(|g| g.credentials.as_ref()),
    );
    Ok(Plan {
        redactor,
        use_cache: a.use_cache,
        replicas: a.replicas.max(1) as usize,
        ci: a.ci.clone(),
        deadline,
        judge_seed: zeroize::Zeroizing::new(new_seed()),
        proposal_id: a.proposal.clone(),
        gateway,
        teardowns: Default::default(),
        policy_hash,
        ledger,
        run_id,
        manifest,
        runtime,
        tasks,
        policy,
        raw_patch: patch.bytes,
        patch_size: patch.size,
        patch_hash,
        task_hash,
        out_dir,
    })
}

/// One task of the plan: its budgets (the policy's own, then the task's, then the
/// request's), its sandbox, its forwards (the policy's and its own) and its hash.
#[allow(clippy::too_many_arguments)]
fn plan_task(
    manifest: &Manifest,
    policy: &Policy,
    policy_budgets: &crate::budget::Budgets,
    a: &Request,
    policy_forwards: &[std::net::SocketAddr],
    name: String,
    spec: TaskSpec,
    multi: bool,
) -> Result<TaskPlan, EvaluateError> {
    let bad = |e: String| {
        EvaluateError::Input(format!("{}: task `{name}`: {e}", manifest.file.display()))
    };
    let task_budget = spec.budget.parse().map_err(|e| bad(e.to_string()))?;
    let mut budgets = policy_budgets.clone();
    budgets
        .apply(&task_budget)
        .map_err(|e| bad(e.to_string()))?;
    budgets
        .apply(&a.budget)
        .map_err(|e| EvaluateError::Usage(format!("the requested budget: {e}")))?;
    for (_, o) in a.task_budgets.iter().filter(|(n, _)| *n == name) {
        budgets
            .apply(o)
            .map_err(|e| EvaluateError::Usage(format!("the requested budget of `{name}`: {e}")))?;
    }
    let mut forwards = policy_forwards.to_vec();
    for f in &spec.forward {
        let addr = crate::policy::parse_forward(f).map_err(|m| {
            EvaluateError::Input(format!(
                "{}: tasks.{name}.forward: {m}",
                manifest.file.display()
            ))
        })?;
        if !forwards.contains(&addr) {
            forwards.push(addr);
        }
    }
    let mut task_policy = policy.clone();
    task_policy.budgets = budgets.clone();
    let sandbox = task_policy.sandbox_spec();
    Ok(TaskPlan {
        hash: task_hash(&name, &spec)?,
        prefix: if multi {
            format!("{name}-")
        } else {
            String::new()
        },
        name,
        spec,
        budgets,
        sandbox,
        forwards,
    })
}

/// sha256 over a task's name and definition (as the manifest resolves it; `gate` is not
/// part of it).
pub fn task_hash(name: &str, spec: &TaskSpec) -> Result<String, EvaluateError> {
    let doc =
        serde_json::to_vec(&(name, spec)).map_err(|e| EvaluateError::Internal(e.to_string()))?;
    Ok(format!("sha256:{}", sha256_hex(&doc)))
}

/// The plan's hash ([`crate::verdict::plan::plan_hash`]: a one-task plan's is that task's).
pub fn plan_hash(tasks: &[TaskPlan]) -> String {
    crate::verdict::plan::plan_hash(tasks.iter().map(|t| (t.name.as_str(), t.hash.as_str())))
}

/// The hash a verdict on `manifest`'s plan for `names` carries (`task_hash`), as
/// [`plan`] computes it, without planning: what a proposer pins its vote count to.
pub fn manifest_plan_hash(manifest: &Manifest, names: &[String]) -> Result<String, EvaluateError> {
    let hashes = manifest
        .plan(names)
        .map_err(|e| EvaluateError::Input(e.to_string()))?
        .into_iter()
        .map(|(n, spec)| Ok((n, task_hash(n, spec)?)))
        .collect::<Result<Vec<_>, EvaluateError>>()?;
    Ok(crate::verdict::plan::plan_hash(
        hashes.iter().map(|(n, h)| (*n, h.as_str())),
    ))
}

/// The files that say how a patch is graded, when the patch could reach them: the
/// runtime's `fork.toml`, the policy file in use and its seccomp profile, each if it lies
/// inside the source tree (after links are resolved), as a `protected` pattern naming
/// exactly it (relative to the source, glob characters escaped). A patch editing one of
/// them would be graded by the old file and deployed with the new one: every later
/// evaluation would then run under what the patch wrote (weaker layers, another upstream
/// for the gateway's key, other tasks). So the `protected_path` gate refuses such a patch,
/// and the protected tree's copy and check cover them, whatever the manifest lists.
fn grading_files_in_source(
    runtime: &Path,
    source: &Path,
    a: &Request,
    policy: &Policy,
) -> Vec<String> {
    let Ok(source) = std::fs::canonicalize(runtime.join(source)) else {
        // The manifest's check refuses a missing source; the copy would fail on it anyway.
        return Vec::new();
    };
    let mut files = vec![runtime.join(crate::manifest::MANIFEST_FILE)];
    files.extend(a.policy.clone());
    if let crate::sandbox::SeccompSource::File(f) = &policy.seccomp {
        files.push(f.clone());
    }
    files
        .iter()
        .filter_map(|f| std::fs::canonicalize(f).ok())
        .filter_map(|f| {
            let rel = f.strip_prefix(&source).ok()?;
            let rel = rel.to_str()?;
            (!rel.is_empty()).then(|| globset::escape(rel))
        })
        .collect()
}

/// What hides the parent's state stores: each store's whole directory (an empty tmpfs over
/// it, so that a `-wal`, `-shm` or `-journal` the parent creates after the sandbox started
/// is invisible too), unless that directory holds the source tree (the state sits at the
/// source root): then the store's own names, those that exist when the sandbox starts (a
/// side file created later there stays visible: the README's residue).
pub fn state_hides(runtime: &Path, manifest: &Manifest) -> Vec<PathBuf> {
    let source = runtime.join(&manifest.runtime.source);
    let mut out: Vec<PathBuf> = Vec::new();
    for s in &manifest.runtime.state {
        let p = runtime.join(s);
        match p.parent() {
            Some(dir) if !source.starts_with(dir) => {
                if !out.iter().any(|o| o == dir) {
                    out.push(dir.to_path_buf());
                }
            }
            _ => {
                for suffix in ["", "-wal", "-shm", "-journal"] {
                    out.push(crate::fork::parent::side(&p, suffix));
                }
            }
        }
    }
    out
}

/// The ledger's `policy_hash`: sha256 over the conditions a verdict was reached under, which
/// the cache must match besides the inputs: this fork's version, the resolved policy
/// (budgets, layers, gates, decision rules, ...) and the isolation this host puts in force
/// under it ([`crate::check::isolation_in_force`]).
pub fn conditions_hash(
    policy: &Policy,
    gateway: Option<&crate::gateway::GatewayConfig>,
    tools_hash: Option<&str>,
    isolation: &str,
) -> Result<String, EvaluateError> {
    let policy_doc =
        serde_json::to_vec(policy).map_err(|e| EvaluateError::Internal(e.to_string()))?;
    let gateway_doc =
        serde_json::to_vec(&gateway).map_err(|e| EvaluateError::Internal(e.to_string()))?;
    let mut h = Sha256::new();
    // v5: the gateway's limits (written into calls, images held, parts refused) and the
    // default seccomp profile and rlimits tightened: a verdict cached under the looser ones
    // is evaluated again. v4: the gateway in force (fork.toml's `[gateway]` overrides the policy's) and the
    // tools' tree hash too (a verdict was served after the tools outside the source tree
    // changed). v3: `protected` patterns read as paths, a named directory protecting what
    // it holds (a verdict the gate passed under the old reading is not served again).
    h.update(b"fork-conditions-v5\0");
    for part in [
        env!("CARGO_PKG_VERSION").as_bytes(),
        &policy_doc,
        &gateway_doc,
        tools_hash.unwrap_or("").as_bytes(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(toml: &str, files: &[&str]) -> (tempfile::TempDir, Manifest) {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("fork.toml"), toml).unwrap();
        for f in files {
            let p = d.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"").unwrap();
        }
        let m = crate::manifest::load(d.path()).unwrap();
        (d, m)
    }

    #[test]
    fn state_in_its_own_directory_hides_the_directory_at_the_root_only_its_names() {
        let (d, m) = runtime(
            "[runtime]\nname = \"t\"\nsource = \".\"\nstate = [\"state/a.db\", \"state/b.db\"]\n\
             [tasks.t]\ncommand = [\"true\"]\n",
            &["state/a.db", "state/b.db"],
        );
        assert_eq!(state_hides(d.path(), &m), vec![d.path().join("state")]);
        let (d, m) = runtime(
            "[runtime]\nname = \"t\"\nsource = \".\"\nstate = [\"h.db\"]\n[tasks.t]\ncommand = [\"true\"]\n",
            &["h.db"],
        );
        let names: Vec<PathBuf> = ["h.db", "h.db-wal", "h.db-shm", "h.db-journal"]
            .iter()
            .map(|n| d.path().join(n))
            .collect();
        assert_eq!(state_hides(d.path(), &m), names);
        // The source in a subdirectory, the state at the runtime's root (which holds it).
        let (d, m) = runtime(
            "[runtime]\nname = \"t\"\nsource = \"src\"\nstate = [\"h.db\"]\n[tasks.t]\ncommand = [\"true\"]\n",
            &["h.db", "src/x.py"],
        );
        assert_eq!(state_hides(d.path(), &m).len(), 4);
    }
}
