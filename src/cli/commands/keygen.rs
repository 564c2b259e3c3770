//! `fork keygen`: the node's long-term identity key.

use crate::cli::exit::{self, CliError};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Where to write the key (default: $XDG_CONFIG_HOME/fork/node.key).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace an existing key (its identity is lost).
    #[arg(long)]
    pub force: bool,
}

pub fn keygen(a: KeygenArgs) -> Result<i32, CliError> {
    let path = a.out.unwrap_or_else(crate::identity::default_node_key_path);
    let public = crate::identity::generate_node_key(&path, a.force)
        .map_err(|e| CliError::new(exit::identity(&e), e))?;
    println!("{public}");
    eprintln!(
        "fork: node key written to {} (public key beside it)",
        path.display()
    );
    Ok(0)
}
