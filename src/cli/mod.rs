//! The command line: the only home of clap, printing and exit codes. One file per
//! subcommand under [`commands`]; [`exit`] maps every library error to its exit code.
//! Results go to stdout (text, or JSON with --json) through [`out`]; logs go to stderr.

pub mod args;
pub mod commands;
pub mod exit;
pub mod out;
pub mod progress;

pub use crate::text::{safe_lines, safe_text};
pub use exit::CliError;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "fork",
    version,
    about = "Evaluate a self-modification patch in a hard sandbox and emit a signed verdict"
)]
pub struct Cli {
    /// More logging on stderr (-v info, -vv debug; FORK_LOG or RUST_LOG take a filter).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
// Each subcommand's arguments are built only when it is the one invoked (or its help is
// asked for): building all of them took 0.2 to 0.3 ms of every start (FORK_TRACE).
#[command(defer = true)]
pub enum Command {
    /// Run one command in the sandbox, with every isolation layer and budget in force.
    Run(commands::run::RunArgs),
    /// Show what isolation this host offers, layer by layer, and how to fix what is missing.
    Check(commands::check::CheckArgs),
    /// Evaluate a patch: fork the runtime, patch the copy, run the task sandboxed, sign a verdict.
    Evaluate(commands::evaluate::EvaluateArgs),
    /// Verify a verdict bundle: signatures, endorsement chain, schema, artifact hashes.
    Verify(commands::verify::VerifyArgs),
    /// Create the node's long-term identity key.
    Keygen(commands::keygen::KeygenArgs),
    /// Reclaim what crashed runs left behind (processes, mounts, cgroups, workspaces).
    Gc(commands::gc::GcArgs),
    /// Re-run the evaluation a verdict describes on this node and report agreement.
    Reverify(commands::reverify::ReverifyArgs),
    /// Count the votes of several nodes' verdicts on one patch (k-of-n, with a floor).
    Consensus(commands::consensus::ConsensusArgs),
    /// A human steward's countersignature on an APPROVE verdict (the human gate).
    Approve(commands::approve::ApproveArgs),
    /// Mesh re-verification over NATS: `serve` evaluates proposals, `propose` collects votes.
    Mesh {
        #[command(subcommand)]
        command: commands::mesh::MeshCommand,
    },
    /// List the verdicts recorded in the ledger, newest first.
    History(commands::history::HistoryArgs),
    /// Ledger maintenance: `fork ledger verify` checks the hash chain.
    Ledger(commands::history::LedgerArgs),
}

pub use crate::sandbox::signals::{default_sigpipe, hold_interrupts, release_interrupts};

/// With `FORK_TRACE` set, prints the phases the command went through to stderr, one line
/// each: `fork: trace <phase> +<ms since start>` (see [`crate::trace`]).
pub fn print_trace() {
    if !crate::trace::enabled() {
        return;
    }
    crate::trace::mark("exit");
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    for (phase, at) in crate::trace::take() {
        let _ = writeln!(err, "fork: trace {phase} +{:.3}", at.as_secs_f64() * 1e3);
    }
}

/// Runs a parsed command line; returns the process exit code.
///
/// SIGINT/SIGTERM/SIGHUP are held back from `main`'s start (see [`hold_interrupts`]): the
/// commands that create runs (run, evaluate, reverify, mesh serve) get the interrupt flag
/// first, so one that came during start-up is answered as any other (the run ends
/// cleanly, nothing is left behind); the others get the default action back.
pub fn dispatch(cli: Cli) -> i32 {
    let makes_runs = matches!(
        cli.command,
        Command::Run(_)
            | Command::Evaluate(_)
            | Command::Reverify(_)
            | Command::Mesh {
                command: commands::mesh::MeshCommand::Serve(_)
            }
    );
    if makes_runs || matches!(cli.command, Command::Check(_) | Command::Gc(_)) {
        // Without root: a user and mount namespace of fork's own, for the capped disk
        // (`check` makes a trial launch; `gc` removes what runs as subordinate uids left).
        // Before anything else: it needs a single thread.
        crate::sandbox::rootless::enter();
    }
    if makes_runs {
        crate::sandbox::signals::install_interrupt_flag();
    }
    release_interrupts();
    progress::init(cli.verbose);
    crate::trace::mark("cli: logging ready");
    let r = match cli.command {
        Command::Run(a) => commands::run::run_cmd(a),
        Command::Check(a) => commands::check::check(a),
        Command::Evaluate(a) => commands::evaluate::evaluate_cmd(a),
        Command::Verify(a) => commands::verify::verify_cmd(a),
        Command::Keygen(a) => commands::keygen::keygen(a),
        Command::Gc(a) => commands::gc::gc(a),
        Command::Reverify(a) => commands::reverify::reverify_cmd(a),
        Command::Consensus(a) => commands::consensus::consensus(a),
        Command::Approve(a) => commands::approve::approve(a),
        Command::Mesh { command } => commands::mesh::mesh_cmd(command),
        Command::History(a) => commands::history::history(a),
        Command::Ledger(commands::history::LedgerArgs {
            action: commands::history::LedgerAction::Verify { ledger, json },
        }) => commands::history::ledger_verify(ledger, json),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            out::error(&e.message);
            e.code
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The help text clap renders for `fork ARGS --help`.
    fn help(args: &[&str]) -> String {
        let argv = std::iter::once("fork")
            .chain(args.iter().copied())
            .chain(std::iter::once("--help"));
        match Cli::try_parse_from(argv) {
            Ok(_) => panic!("{args:?} --help parsed as a command"),
            Err(e) => e.to_string(),
        }
    }

    /// The subcommands' arguments are built late (`defer`): a doc comment on an argument
    /// type would then replace the subcommand's own about text in its help (`fork run
    /// --help` opened with the budget flags' description). Every subcommand's help opens
    /// with the line its parent lists for it.
    #[test]
    fn each_subcommands_help_opens_with_its_own_about() {
        let mut seen = 0;
        for parent in [&[][..], &["mesh"][..], &["ledger"][..]] {
            let listing = help(parent);
            let commands = listing
                .split("Commands:\n")
                .nth(1)
                .unwrap_or_else(|| panic!("{parent:?}: no commands listed:\n{listing}"));
            for line in commands.lines().take_while(|l| l.starts_with("  ")) {
                let (name, about) = line.trim_start().split_once("  ").unwrap_or((line, ""));
                if name == "help" || name.is_empty() {
                    continue;
                }
                let mut path = parent.to_vec();
                path.push(name);
                let own = help(&path);
                assert!(
                    own.starts_with(about.trim()),
                    "`fork {} --help` opens with\n{}\nnot with\n{}",
                    path.join(" "),
                    own.lines().next().unwrap_or(""),
                    about.trim()
                );
                seen += 1;
            }
        }
        // Twelve commands, three mesh commands, one ledger command.
        assert_eq!(seen, 16, "subcommands checked");
    }
}
