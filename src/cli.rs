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
    /// Re-run the evaluation a verdict describes on this node and report agreement.
    Reverify(crate::reverify::ReverifyArgs),
    /// Count the votes of several nodes' verdicts on one patch (k-of-n, with a floor).
    Consensus(ConsensusArgs),
    /// A human steward's countersignature on an APPROVE verdict (the human gate).
    Approve(ApproveArgs),
    /// Mesh re-verification over NATS: `serve` evaluates proposals, `propose` collects votes.
    Mesh {
        #[command(subcommand)]
        command: crate::mesh::serve::MeshCommand,
    },
    /// List the verdicts recorded in the ledger, newest first.
    History(HistoryArgs),
    /// Ledger maintenance: `fork ledger verify` checks the hash chain.
    Ledger(LedgerArgs),
}

#[derive(Debug, Args)]
pub struct ConsensusArgs {
    /// Verdict bundles (directories, or their verdict.json), one or more per node.
    #[arg(required = true)]
    pub verdicts: Vec<PathBuf>,
    /// Node public keys whose votes count (ed25519:<base64>, or a file holding one).
    #[arg(long, required = true)]
    pub trust: Vec<String>,
    /// The share of responding nodes that must approve.
    #[arg(long, default_value = "2/3")]
    pub quorum: String,
    /// The least number of approving nodes, whatever the number of responders (an
    /// absolute floor, so nodes that do not answer cannot shrink the vote).
    #[arg(long, default_value_t = 2)]
    pub min_nodes: usize,
    /// Also require a steward's approval (fork approve) of one of the approving verdicts.
    #[arg(long)]
    pub steward: Option<String>,
    /// The patch the votes must be about (its sha256 is compared).
    #[arg(long)]
    pub patch: Option<PathBuf>,
    /// The task hash the votes must share (sha256:<hex>).
    #[arg(long)]
    pub task_hash: Option<String>,
    /// The mesh proposal the votes must answer.
    #[arg(long)]
    pub proposal: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ApproveArgs {
    /// The verdict bundle (directory or its verdict.json) to countersign.
    pub verdict: PathBuf,
    /// The steward's key (made with `fork keygen --out`).
    #[arg(long)]
    pub key: PathBuf,
    /// Node keys trusted to have endorsed the verdict (default: the local node key).
    #[arg(long)]
    pub trust: Vec<String>,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// The ledger (default: $XDG_DATA_HOME/fork/ledger.db).
    #[arg(long)]
    pub ledger: Option<PathBuf>,
    /// At most this many entries.
    #[arg(long, short = 'n')]
    pub limit: Option<usize>,
    /// Print the entries as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LedgerArgs {
    #[command(subcommand)]
    pub action: LedgerAction,
}

#[derive(Debug, Subcommand)]
pub enum LedgerAction {
    /// Recompute the hash chain: any edited, deleted, reordered or inserted row is named.
    Verify {
        /// The ledger (default: $XDG_DATA_HOME/fork/ledger.db).
        #[arg(long)]
        ledger: Option<PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
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

pub use crate::sandbox::signals::default_sigpipe;

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
        Command::Reverify(a) => crate::reverify::reverify_cli(a),
        Command::Consensus(a) => consensus(a),
        Command::Approve(a) => approve(a),
        Command::Mesh { command } => crate::mesh::serve::mesh_cli(command),
        Command::History(a) => history(a),
        Command::Ledger(LedgerArgs {
            action: LedgerAction::Verify { ledger, json },
        }) => ledger_verify(ledger, json),
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

fn ledger_path(p: Option<PathBuf>) -> PathBuf {
    p.unwrap_or_else(crate::ledger::Ledger::default_path)
}

fn ledger_error(e: crate::ledger::LedgerError) -> CliError {
    let code = match e {
        crate::ledger::LedgerError::NotFound { .. } => exit::USAGE,
        crate::ledger::LedgerError::Io { .. } | crate::ledger::LedgerError::Sql { .. } => {
            exit::INTERNAL
        }
        _ => exit::BAD_INPUT,
    };
    CliError::from((code, e))
}

fn history(a: HistoryArgs) -> Result<i32, CliError> {
    let l = crate::ledger::Ledger::open_existing(&ledger_path(a.ledger)).map_err(ledger_error)?;
    let entries = l.history(a.limit).map_err(ledger_error)?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&entries)
                .map_err(|e| CliError::from((exit::INTERNAL, e)))?
        );
    } else {
        for e in &entries {
            println!(
                "{:>5}  {}  {:<14} {:.2}  task `{}`  patch {}  run {}  {}",
                e.seq,
                e.timestamp,
                e.verdict,
                e.confidence,
                e.task,
                e.patch_hash.get(..19).unwrap_or(&e.patch_hash),
                e.run_id,
                e.bundle_dir
            );
        }
        if entries.is_empty() {
            println!("the ledger is empty");
        }
    }
    Ok(0)
}

fn ledger_verify(path: Option<PathBuf>, json: bool) -> Result<i32, CliError> {
    let l = crate::ledger::Ledger::open_existing(&ledger_path(path)).map_err(ledger_error)?;
    let rep = l.verify().map_err(ledger_error)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rep).map_err(|e| CliError::from((exit::INTERNAL, e)))?
        );
    } else if rep.ok {
        println!("ledger ok: {} rows, hash chain intact", rep.rows);
    } else {
        println!("ledger TAMPERED: {} rows", rep.rows);
        for p in &rep.problems {
            println!("  {p}");
        }
    }
    Ok(if rep.ok { 0 } else { 1 })
}

/// Public keys from `--trust`-style arguments: the key itself, or a file holding one.
pub fn parse_keys(
    args: &[String],
    flag: &str,
) -> Result<Vec<crate::identity::PublicKey>, CliError> {
    let mut out = Vec::new();
    for t in args {
        let key = if std::path::Path::new(t).is_file() {
            crate::identity::read_public_key(std::path::Path::new(t))
        } else {
            crate::identity::PublicKey::parse(t)
        }
        .map_err(|e| CliError::from((exit::USAGE, format!("{flag} {t}: {e}"))))?;
        out.push(key);
    }
    Ok(out)
}

fn bundle_dir(p: &std::path::Path) -> PathBuf {
    if p.is_file() {
        p.parent()
            .map(|d| d.to_path_buf())
            .unwrap_or_else(|| PathBuf::from("."))
    } else {
        p.to_path_buf()
    }
}

fn consensus(a: ConsensusArgs) -> Result<i32, CliError> {
    use crate::mesh::consensus::{consensus, ConsensusConfig, Quorum};
    let quorum: Quorum = a
        .quorum
        .parse()
        .map_err(|e| CliError::from((exit::USAGE, format!("--quorum {}: {e}", a.quorum))))?;
    let trusted = parse_keys(&a.trust, "--trust")?;
    let steward = match &a.steward {
        Some(s) => parse_keys(std::slice::from_ref(s), "--steward")?.pop(),
        None => None,
    };
    let patch_hash = match &a.patch {
        Some(p) => {
            use sha2::Digest;
            let raw = std::fs::read(p).map_err(|e| {
                CliError::from((
                    exit::BAD_INPUT,
                    format!("cannot read patch {}: {e}", p.display()),
                ))
            })?;
            Some(format!(
                "sha256:{}",
                hex::encode(sha2::Sha256::digest(&raw))
            ))
        }
        None => None,
    };
    let bundles: Vec<PathBuf> = a.verdicts.iter().map(|p| bundle_dir(p)).collect();
    let cfg = ConsensusConfig {
        quorum,
        min_nodes: a.min_nodes,
        trusted,
        steward,
        patch_hash,
        task_hash: a.task_hash.clone(),
        proposal_id: a.proposal.clone(),
    };
    let rep = consensus(&bundles, &cfg);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rep).map_err(|e| CliError::from((exit::INTERNAL, e)))?
        );
    } else {
        print!("{}", rep.render());
    }
    Ok(if rep.approved { 0 } else { 1 })
}

fn approve(a: ApproveArgs) -> Result<i32, CliError> {
    let steward =
        crate::identity::load_node_key(&a.key).map_err(|e| CliError::from((exit::USAGE, e)))?;
    let mut trusted = parse_keys(&a.trust, "--trust")?;
    if trusted.is_empty() {
        let local = crate::identity::public_key_path(&crate::identity::default_node_key_path());
        if let Ok(k) = crate::identity::read_public_key(&local) {
            trusted.push(k);
        }
    }
    let path = crate::mesh::approve::approve(&bundle_dir(&a.verdict), &steward, &trusted).map_err(
        |e| {
            let code = match e {
                crate::mesh::approve::ApproveError::Verify { .. }
                | crate::mesh::approve::ApproveError::NotApprove { .. } => exit::REJECT,
                crate::mesh::approve::ApproveError::Exists { .. } => exit::USAGE,
                _ => exit::INTERNAL,
            };
            CliError::from((code, e))
        },
    )?;
    println!("{}", path.display());
    Ok(0)
}
