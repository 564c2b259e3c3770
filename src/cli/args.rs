//! Arguments several subcommands share: budget flags, trusted keys, bundle paths.

use crate::budget::{BudgetOverrides, BudgetText};
use crate::cli::exit::{self, CliError};
use crate::policy::Policy;
use clap::Args;
use std::path::Path;

// Budget overrides shared by `run` and `evaluate`. Every value is taken as text (a
// negative-looking one too: `--wall -5` is a value, not a flag) and checked by fork's one
// budget pipeline, so a bad value gets fork's own error naming the field. (A plain comment:
// the subcommands' arguments are built late (`defer`), and a doc comment here would become
// the about text of `fork run --help` and `fork evaluate --help`.)
#[derive(Debug, Clone, Default, Args)]
pub struct BudgetArgs {
    /// Wall-clock budget, e.g. 30s, 10m, 1h.
    #[arg(long, allow_hyphen_values = true)]
    pub wall: Option<String>,
    /// CPU quota in percent of one core (200 = two cores).
    #[arg(long, allow_hyphen_values = true)]
    pub cpu: Option<String>,
    /// Memory budget, e.g. 512MiB, 2GiB.
    #[arg(long, allow_hyphen_values = true)]
    pub memory: Option<String>,
    /// Maximum number of processes and threads.
    #[arg(long, allow_hyphen_values = true)]
    pub pids: Option<String>,
    /// Disk budget for the workspace and /tmp together, e.g. 64MiB, 10GiB.
    #[arg(long, allow_hyphen_values = true)]
    pub disk: Option<String>,
    /// API cost budget in USD, e.g. 5.00.
    #[arg(long = "api-cost", allow_hyphen_values = true)]
    pub api_cost: Option<String>,
    /// Total CPU time budget of each run, e.g. 10m (kills the sandbox when passed).
    #[arg(long = "cpu-time", allow_hyphen_values = true)]
    pub cpu_time: Option<String>,
    /// Wall-clock budget of the whole evaluation (every run together), e.g. 2h.
    #[arg(long = "evaluation-wall", allow_hyphen_values = true)]
    pub evaluation_wall: Option<String>,
}

impl BudgetArgs {
    /// The flags through the one budget pipeline (exit 64 naming the flag's field).
    pub fn overrides(&self) -> Result<BudgetOverrides, CliError> {
        BudgetText {
            wall: self.wall.clone(),
            cpu: self.cpu.clone(),
            memory: self.memory.clone(),
            pids: self.pids.clone(),
            disk: self.disk.clone(),
            api_cost: self.api_cost.clone(),
            cpu_time: self.cpu_time.clone(),
            evaluation_wall: self.evaluation_wall.clone(),
        }
        .parse()
        .map_err(|e| CliError::new(exit::USAGE, format!("the command line: {e}")))
    }
}

/// Loads a policy (errors exit 65) and applies the command line's budget flags (64).
pub fn load_policy(path: Option<&Path>, b: &BudgetArgs) -> Result<Policy, CliError> {
    let mut p = Policy::load(path)?;
    p.budgets
        .apply(&b.overrides()?)
        .map_err(|e| CliError::new(exit::USAGE, format!("the command line: {e}")))?;
    Ok(p)
}

/// Public keys from `--trust`-style arguments: the key itself (`ed25519:<base64>`,
/// SubjectPublicKeyInfo PEM or an OpenSSH line), or a file holding one.
pub fn parse_keys(
    args: &[String],
    flag: &str,
) -> Result<Vec<crate::identity::PublicKey>, CliError> {
    let mut out = Vec::new();
    for t in args {
        let key = crate::identity::public_key_arg(t)
            .map_err(|e| CliError::from((exit::USAGE, format!("{flag} {t}: {e}"))))?;
        out.push(key);
    }
    Ok(out)
}

/// The bundle directory of a path that names it or its verdict.json (a bare
/// `verdict.json`: the current directory).
pub use crate::verdict::verify::bundle_dir_of as bundle_dir;

/// Prints `value` as pretty JSON on stdout (`--json`): see [`crate::cli::out::json`].
pub use crate::cli::out::json as print_json;
