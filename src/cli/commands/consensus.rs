//! `fork consensus`: count several nodes' votes on one patch.

use crate::cli::args::print_json;
use crate::cli::args::{bundle_dir, parse_keys};
use crate::cli::exit::{self, CliError};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ConsensusArgs {
    /// Verdict bundles (directories, or their verdict.json), one or more per node.
    #[arg(required = true)]
    pub verdicts: Vec<PathBuf>,
    /// Node public keys whose votes count (ed25519:<base64>, or a file holding one).
    #[arg(long, allow_hyphen_values = true, required = true)]
    pub trust: Vec<String>,
    /// The share of responding nodes that must approve.
    #[arg(long, default_value = "2/3")]
    pub quorum: String,
    /// The least number of approving nodes, whatever the number of responders (an
    /// absolute floor, so nodes that do not answer cannot shrink the vote).
    #[arg(long, default_value_t = 2)]
    pub min_nodes: usize,
    /// Also require a steward's approval (fork approve) of one of the approving verdicts.
    #[arg(long, allow_hyphen_values = true)]
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

pub fn consensus(a: ConsensusArgs) -> Result<i32, CliError> {
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
        Some(p) => Some(
            crate::patch::hash_patch_file(p)
                .map_err(|e| CliError::from((exit::BAD_INPUT, e.to_string())))?,
        ),
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
        print_json(&rep)?;
    } else {
        crate::cli::out::lines(rep.render())?;
    }
    Ok(if rep.approved { 0 } else { 1 })
}
