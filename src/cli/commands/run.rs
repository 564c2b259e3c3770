//! `fork run`: one command in the sandbox.

use crate::cli::args::{load_policy, BudgetArgs};
use crate::cli::exit::{self, CliError};
use crate::run::{run, RunRequest};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Policy file (default: the built-in policies/default.toml).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// A directory whose contents are copied into the workspace (/tmp/successor) before
    /// the run; the workspace's final contents are copied back into it afterwards.
    #[arg(long)]
    pub workspace: Option<PathBuf>,
    /// Copy `.git` directories (hooks, config, ...) back from the workspace too; by default
    /// they are left out, since a planted hook runs at the next git command.
    #[arg(long, requires = "workspace")]
    pub allow_git_internals: bool,
    /// Write a JSON report (exit status, budget, usage, isolation) to this file.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

pub fn run_cmd(a: RunArgs) -> Result<i32, CliError> {
    crate::gc::end_on_interrupt(exit::INTERRUPT_GRACE, exit::RUN_KILLED);
    if crate::sandbox::signals::interrupted() {
        // Interrupted during start-up: nothing was created, nothing ran, no report.
        return Err(CliError::new(
            exit::RUN_KILLED,
            "interrupted before the sandbox was made: nothing ran",
        ));
    }
    crate::trace::mark("run: interrupt watch started");
    // The report's path first: a command (and a copy back into --workspace) whose report
    // cannot be written should not run.
    if let Some(path) = &a.report {
        crate::evaluation::outputs::check_file("--report", path)
            .map_err(|e| CliError::new(exit::USAGE, e))?;
    }
    let policy = load_policy(a.policy.as_deref(), &a.budget)?;
    crate::trace::mark("run: policy loaded");
    let limits = policy.budgets.clone();
    let r = run(RunRequest {
        policy,
        workspace: a.workspace.clone(),
        allow_git_internals: a.allow_git_internals,
        command: a.command.clone(),
    })?;
    for n in &r.notes {
        eprintln!("fork: {n}");
    }
    if let Some(path) = &a.report {
        let json = serde_json::to_vec_pretty(&r.report(&limits))
            .map_err(|e| CliError::new(exit::INTERNAL, e))?;
        // A report that fails now never hides how the command ended: its status is said.
        crate::outfile::replace_file(path, &json).map_err(|e| {
            let ended = match r.outcome.signal {
                Some(sig) => format!("it was killed by signal {sig}"),
                None => format!("it exited with status {}", r.outcome.exit_code),
            };
            CliError::new(
                exit::CANT_CREATE,
                format!(
                    "writing report {}: {e} (the command ran: {ended}; without the report, fork run would have exited {})",
                    path.display(),
                    r.outcome.exit_code
                ),
            )
        })?;
    }
    Ok(r.outcome.exit_code)
}
