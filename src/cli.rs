//! The command line: clap definitions and the dispatch from subcommands to library
//! calls. Results go to stdout (text, or JSON with --json); logs go to stderr.

use crate::policy::{BudgetOverrides, Policy};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Exit codes (DESIGN.md, "Exit codes").
pub mod exit {
    pub const APPROVE: i32 = 0;
    pub const REJECT: i32 = 1;
    pub const NEEDS_REVISION: i32 = 2;
    pub const USAGE: i32 = 64;
    pub const BAD_INPUT: i32 = 65;
    pub const UNAVAILABLE: i32 = 69;
    pub const INTERNAL: i32 = 70;
}

#[derive(Debug, Parser)]
#[command(
    name = "fork",
    version,
    about = "Evaluate a self-modification patch in a hard sandbox and emit a signed verdict"
)]
pub struct Cli {
    /// More logging on stderr (-v info, -vv debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one command in the sandbox, with every isolation layer and budget in force.
    Run(RunArgs),
    /// Show what isolation this host offers, layer by layer, and how to fix what is missing.
    Check(CheckArgs),
    /// Evaluate a patch: fork the runtime, patch the copy, run the task sandboxed, sign a verdict.
    Evaluate(crate::evaluate::EvaluateArgs),
    /// Verify a verdict bundle: signatures, endorsement chain, schema, artifact hashes.
    Verify(VerifyArgs),
    /// Create the node's long-term identity key.
    Keygen(KeygenArgs),
    /// Reclaim what crashed runs left behind (processes, mounts, cgroups, workspaces).
    Gc(GcArgs),
}

/// Budget overrides shared by `run` and `evaluate`.
#[derive(Debug, Clone, Default, Args)]
pub struct BudgetArgs {
    /// Wall-clock budget, e.g. 30s, 10m, 1h.
    #[arg(long)]
    pub wall: Option<String>,
    /// CPU quota in percent of one core (200 = two cores).
    #[arg(long)]
    pub cpu: Option<u32>,
    /// Memory budget, e.g. 512MiB, 2GiB.
    #[arg(long)]
    pub memory: Option<String>,
    /// Maximum number of processes and threads.
    #[arg(long)]
    pub pids: Option<u64>,
    /// Disk budget for the workspace and /tmp together, e.g. 64MiB, 10GiB.
    #[arg(long)]
    pub disk: Option<String>,
    /// API cost budget in USD.
    #[arg(long = "api-cost")]
    pub api_cost: Option<f64>,
    /// Total CPU time budget, e.g. 10m (kills the sandbox when passed).
    #[arg(long = "cpu-time")]
    pub cpu_time: Option<String>,
}

impl BudgetArgs {
    pub fn overrides(&self) -> BudgetOverrides {
        BudgetOverrides {
            wall: self.wall.clone(),
            cpu: self.cpu,
            memory: self.memory.clone(),
            pids: self.pids,
            disk: self.disk.clone(),
            api_cost: self.api_cost,
            cpu_time: self.cpu_time.clone(),
        }
    }
}

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
    /// Write a JSON report (exit status, budget, usage, isolation) to this file.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Policy file (default: the built-in policies/default.toml).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The out directory of a run, or its verdict.json.
    pub path: PathBuf,
    /// A trusted node public key (ed25519:<base64>), or a file holding one. Repeatable.
    /// Without any, the local node key's public half is trusted.
    #[arg(long)]
    pub trust: Vec<String>,
    /// Print the verified verdict as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Where to write the key (default: $XDG_CONFIG_HOME/fork/node.key).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace an existing key (its identity is lost).
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct GcArgs {
    /// Print what was reclaimed as JSON.
    #[arg(long)]
    pub json: bool,
}

/// An error that reached the CLI: its message and the exit code it maps to.
#[derive(Debug)]
pub struct CliError {
    pub code: i32,
    pub message: String,
}

impl<E: std::fmt::Display> From<(i32, E)> for CliError {
    fn from((code, e): (i32, E)) -> Self {
        CliError {
            code,
            message: e.to_string(),
        }
    }
}

/// Loads a policy and applies command-line budget overrides (errors exit 65).
pub fn load_policy(path: Option<&std::path::Path>, b: &BudgetArgs) -> Result<Policy, CliError> {
    let mut p = Policy::load(path).map_err(|e| CliError::from((exit::BAD_INPUT, e)))?;
    p.budgets
        .apply(&b.overrides(), "the command line")
        .map_err(|e| CliError::from((exit::USAGE, e)))?;
    Ok(p)
}

/// Runs a parsed command line; returns the process exit code.
pub fn dispatch(cli: Cli) -> i32 {
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FORK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .with_writer(std::io::stderr)
        .without_time()
        .try_init();
    let r = match cli.command {
        Command::Run(a) => crate::run::run(a),
        Command::Check(a) => check(a),
        Command::Evaluate(a) => crate::evaluate::evaluate_cli(a),
        Command::Verify(a) => crate::evaluate::verify_cli(a),
        Command::Keygen(a) => keygen(a),
        Command::Gc(a) => gc(a),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fork: {}", e.message);
            e.code
        }
    }
}

fn check(a: CheckArgs) -> Result<i32, CliError> {
    let policy =
        Policy::load(a.policy.as_deref()).map_err(|e| CliError::from((exit::BAD_INPUT, e)))?;
    let report = crate::check::check(&policy);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report)
                .map_err(|e| CliError::from((exit::INTERNAL, e)))?
        );
    } else {
        print!("{}", report.render());
    }
    Ok(if report.ok() { 0 } else { exit::UNAVAILABLE })
}

fn keygen(a: KeygenArgs) -> Result<i32, CliError> {
    let path = a.out.unwrap_or_else(crate::identity::default_node_key_path);
    let public = crate::identity::generate_node_key(&path, a.force).map_err(|e| {
        let code = match e {
            crate::identity::IdentityError::KeyExists { .. } => exit::USAGE,
            _ => exit::INTERNAL,
        };
        CliError::from((code, e))
    })?;
    println!("{public}");
    eprintln!(
        "fork: node key written to {} (public key beside it)",
        path.display()
    );
    Ok(0)
}

fn gc(a: GcArgs) -> Result<i32, CliError> {
    let report = crate::gc::collect();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report)
                .map_err(|e| CliError::from((exit::INTERNAL, e)))?
        );
    } else {
        print!("{}", report.render());
    }
    Ok(if report.errors.is_empty() {
        0
    } else {
        exit::INTERNAL
    })
}
