//! `fork history` and `fork ledger verify`: the verdict ledger.

use crate::cli::args::print_json;
use crate::cli::exit::CliError;
use crate::cli::out;
use clap::{Args, Subcommand};
use std::path::PathBuf;

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

fn ledger_path(p: Option<PathBuf>) -> PathBuf {
    p.unwrap_or_else(crate::ledger::Ledger::default_path)
}

pub fn history(a: HistoryArgs) -> Result<i32, CliError> {
    let l = crate::ledger::Ledger::open_existing(&ledger_path(a.ledger))?;
    let entries = l.history(a.limit)?;
    if a.json {
        print_json(&entries)?;
    } else {
        for e in &entries {
            out::line(format!(
                "{:>5}  {}  {:<14} {:.2}  task `{}`  patch {}  run {}  {}",
                e.seq,
                e.timestamp,
                e.verdict,
                e.confidence,
                e.task,
                e.patch_hash.get(..19).unwrap_or(&e.patch_hash),
                e.run_id,
                e.bundle_dir
            ))?;
        }
        if entries.is_empty() {
            out::line("the ledger is empty")?;
        }
    }
    Ok(0)
}

pub fn ledger_verify(path: Option<PathBuf>, json: bool) -> Result<i32, CliError> {
    let l = crate::ledger::Ledger::open_existing(&ledger_path(path))?;
    let rep = l.verify()?;
    if json {
        print_json(&rep)?;
    } else if rep.ok {
        out::line(format!("ledger ok: {} rows, hash chain intact", rep.rows))?;
    } else {
        out::line(format!("ledger TAMPERED: {} rows", rep.rows))?;
        for p in &rep.problems {
            out::line(format!("  {p}"))?;
        }
    }
    Ok(if rep.ok { 0 } else { 1 })
}
