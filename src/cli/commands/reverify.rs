//! `fork reverify`: re-run the evaluation another node's verdict describes, and say
//! whether the two agree.

use crate::cli::args::parse_keys;
use crate::cli::args::print_json;
use crate::cli::exit::{self, CliError};
use crate::evaluation::reverify::{reverify, ReverifyRequest};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ReverifyArgs {
    /// The verdict to re-verify: a bundle directory or its verdict.json.
    pub verdict: PathBuf,
    /// The patch it is about; its hash must be the verdict's.
    #[arg(long)]
    pub patch: PathBuf,
    /// This node's copy of the runtime (holding fork.toml).
    #[arg(long, default_value = ".")]
    pub runtime: PathBuf,
    /// Policy file for this node's evaluation (default: the built-in policy).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// This node's key (default: $XDG_CONFIG_HOME/fork/node.key).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Where this node's verdict bundle goes (default: ./fork-out/<run-id>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Node keys trusted to have endorsed the verdict (default: its own endorser, which
    /// then only proves the bundle is intact, not who made it).
    #[arg(long)]
    pub trust: Vec<String>,
    /// Print the agreement report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn reverify_cmd(a: ReverifyArgs) -> Result<i32, CliError> {
    crate::gc::reclaim_on_interrupt(exit::INTERRUPT_GRACE, exit::INTERRUPTED);
    let req = ReverifyRequest {
        verdict: a.verdict.clone(),
        patch: a.patch.clone(),
        runtime: a.runtime.clone(),
        policy: a.policy.clone(),
        key: a.key.clone(),
        out: a.out.clone(),
        trust: parse_keys(&a.trust, "--trust")?,
    };
    let (report, ours) = reverify(&req)?;
    let (agree, their_node_trusted) = (report.agree, report.their_node_trusted);
    if a.json {
        print_json(&report)?;
    } else {
        println!(
            "{}: theirs {} (node {}{}), ours {} (confidence {:.2})",
            if agree { "AGREE" } else { "DISAGREE" },
            report.theirs,
            report.their_node,
            if their_node_trusted {
                ""
            } else {
                ", not pinned with --trust"
            },
            report.ours,
            ours.verdict.confidence
        );
        for m in &report.metrics {
            println!(
                "  {:<20} theirs {:<12} ours {:<12} {}",
                m.name,
                m.theirs,
                m.ours
                    .map(|o| o.to_string())
                    .unwrap_or_else(|| "missing".into()),
                if m.within_band {
                    "within band"
                } else {
                    "OUTSIDE band"
                }
            );
        }
        println!(
            "  our verdict: {}",
            ours.out_dir.join("verdict.json").display()
        );
    }
    Ok(exit::verdict(ours.verdict.verdict))
}
