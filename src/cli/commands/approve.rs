//! `fork approve`: a human steward's countersignature on an APPROVE verdict.

use crate::cli::args::{bundle_dir, parse_keys};
use crate::cli::exit::{self, CliError};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ApproveArgs {
    /// The verdict bundle (directory or its verdict.json) to countersign.
    pub verdict: PathBuf,
    /// The steward's key (made with `fork keygen --out`).
    #[arg(long)]
    pub key: PathBuf,
    /// Node keys trusted to have endorsed the verdict (default: the local node key).
    #[arg(long, allow_hyphen_values = true)]
    pub trust: Vec<String>,
}

pub fn approve(a: ApproveArgs) -> Result<i32, CliError> {
    let steward =
        crate::identity::load_node_key(&a.key).map_err(|e| CliError::new(exit::key_file(&e), e))?;
    let mut trusted = parse_keys(&a.trust, "--trust")?;
    if trusted.is_empty() {
        let local = crate::identity::public_key_path(&crate::identity::default_node_key_path());
        if let Ok(k) = crate::identity::read_public_key(&local) {
            trusted.push(k);
        }
    }
    let path = crate::mesh::approve::approve(&bundle_dir(&a.verdict), &steward, &trusted)?;
    crate::cli::out::line(path.display().to_string())?;
    Ok(0)
}
