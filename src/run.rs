//! `fork run` as a library call: one command in the sandbox under a policy, for debugging
//! policies and for benchmarks, with an optional host directory copied in and back out.

use crate::policy::Policy;
use crate::sandbox::{Command, Door, Doors, Outcome, Sandbox, SandboxError, WORKSPACE};
use serde::Serialize;
use std::path::PathBuf;
use thiserror::Error;

/// One command to run.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// The policy, budgets already applied.
    pub policy: Policy,
    /// A host directory copied into the workspace before the run and back after it.
    pub workspace: Option<PathBuf>,
    /// Copy `.git` directories back from the workspace too (off: a planted hook or config
    /// would act on the host).
    pub allow_git_internals: bool,
    pub command: Vec<String>,
}

/// How the run went, and what the caller should be told about it.
#[derive(Debug)]
pub struct RunResult {
    pub outcome: Outcome,
    pub run_id: String,
    /// Things that went wrong around the run without failing it (copy-back refused, ...).
    pub notes: Vec<String>,
}

#[derive(Debug, Error)]
pub enum RunError {
    #[error("--workspace {0}: not a directory")]
    NotADirectory(PathBuf),
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("{0}")]
    Internal(String),
}

/// The JSON written by `fork run --report`.
#[derive(Debug, Serialize)]
pub struct RunReport<'a> {
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub budget_exceeded: Option<&'static str>,
    pub limits: &'a crate::budget::Budgets,
    pub usage: &'a crate::sandbox::Usage,
    pub isolation: &'a crate::sandbox::Isolation,
    pub run_id: &'a str,
    pub interrupted: bool,
}

impl RunResult {
    pub fn report<'a>(&'a self, limits: &'a crate::budget::Budgets) -> RunReport<'a> {
        RunReport {
            exit_code: self.outcome.exit_code,
            signal: self.outcome.signal,
            budget_exceeded: self.outcome.budget_exceeded.map(|b| b.as_str()),
            limits,
            usage: &self.outcome.usage,
            isolation: &self.outcome.isolation,
            run_id: &self.run_id,
            interrupted: self.outcome.interrupted,
        }
    }
}

pub fn run(req: RunRequest) -> Result<RunResult, RunError> {
    let RunRequest {
        mut policy,
        workspace,
        allow_git_internals,
        command,
    } = req;
    if let Some(w) = &workspace {
        if !w.is_dir() {
            return Err(RunError::NotADirectory(w.clone()));
        }
    }
    // The metered model gateway, when the policy has one (its key file stays hidden).
    let gateway = match policy.gateway.clone() {
        None => None,
        Some(cfg) => {
            let creds = cfg
                .load_credentials()
                .map_err(|e| RunError::Input(format!("the model gateway: {e}")))?;
            if let Some(key) = &creds {
                policy
                    .check_gateway_key_not_given(key)
                    .map_err(|e| RunError::Input(e.to_string()))?;
            }
            if let Some(f) = &cfg.credentials_file {
                policy.filesystem.hide.push(f.clone());
            }
            let meter = crate::gateway::Meter::new(policy.budgets.api_cost_usd);
            let url = cfg.task_url();
            let port = cfg.port();
            let gw = crate::gateway::Gateway::new(cfg, creds, meter.clone())
                .map_err(|e| RunError::Input(format!("the model gateway: {e}")))?;
            Some((gw, meter, url, port))
        }
    };
    let mut sb = Sandbox::prepare(&policy.sandbox_spec())?;
    if let Some(w) = &workspace {
        crate::fork::workspace::copy_users_tree(w, &sb.workspace(), &[]).map_err(|e| {
            use crate::fork::WorkspaceError as W;
            match e {
                // What the directory holds is the user's input, named.
                W::Unreadable { .. } | W::Link { .. } | W::NotADirectory { .. } => {
                    RunError::Input(format!("--workspace: {e}"))
                }
                _ => RunError::Internal(format!("copying --workspace in: {e}")),
            }
        })?;
    }
    let mut extra = vec![("FORK_RUN_ID".to_string(), sb.run_id().to_string())];
    if let Some((_, _, url, _)) = &gateway {
        extra.push(("FORK_MODEL_URL".to_string(), url.clone()));
    }
    let env = policy.successor_env(&extra);
    let mut doors = Doors::default();
    for f in &policy.network.forward {
        let addr = crate::policy::parse_forward(f)
            .map_err(|m| RunError::Input(format!("{}: network.forward: {m}", policy.origin)))?;
        doors.doors.push(Door::forward(addr));
    }
    if let Some((gw, _, _, port)) = gateway {
        doors.cost = Some(gw.clone());
        doors.doors.push(Door {
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            serve: Box::new(move |l| Box::pin(gw.serve(l))),
        });
    }
    let outcome = sb.run(Command {
        argv: command,
        env,
        cwd: PathBuf::from(WORKSPACE),
        output: None,
        doors,
        ..Command::new(Vec::new(), Vec::new())
    })?;
    let mut notes = Vec::new();
    if let Some(w) = &workspace {
        // The successor is dead, but it may have left its workspace replaced by a symlink.
        let ws = sb.workspace();
        let intact = std::fs::symlink_metadata(&ws)
            .map(|m| m.is_dir())
            .unwrap_or(false);
        if !intact {
            notes.push(format!(
                "the workspace is no longer a directory (replaced by a link?): not copying it back to {}",
                w.display()
            ));
        } else {
            let opts = crate::fork::copyback::CopyBackOptions {
                max_bytes: policy.budgets.disk_bytes,
                allow_git_internals,
                skip_top: vec!["home".into()],
                tag: sb.run_id().to_string(),
            };
            match crate::fork::copyback::copy_back(&ws, w, &opts) {
                Ok(stats) => notes.extend(stats.notes()),
                Err(e) => notes.push(format!(
                    "copying the workspace back to {}: {e}",
                    w.display()
                )),
            }
        }
    }
    let run_id = sb.run_id().to_string();
    if let Some(m) = &outcome.exec_error {
        notes.push(m.clone());
    }
    if let Some(b) = outcome.budget_exceeded {
        notes.push(format!(
            "budget exceeded: {}",
            crate::budget::describe(b, &policy.budgets, &outcome.usage)
        ));
    }
    sb.destroy()?;
    Ok(RunResult {
        outcome,
        run_id,
        notes,
    })
}
