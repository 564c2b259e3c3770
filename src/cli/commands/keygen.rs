//! `fork keygen`: a long-term identity key (a node's, or a steward's with `--out`).

use crate::cli::exit::{self, CliError};
use crate::cli::out;
use clap::{Args, ValueEnum};
use std::path::PathBuf;

/// How `fork keygen` prints the public key on stdout.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PublicFormat {
    /// `ed25519:<base64>`, fork's own spelling.
    Fork,
    /// SubjectPublicKeyInfo PEM (`-----BEGIN PUBLIC KEY-----`).
    Spki,
    /// One OpenSSH line (`ssh-ed25519 AAAA... fork`).
    Openssh,
}

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Where to write the key, as PKCS#8 PEM (default: $XDG_CONFIG_HOME/fork/node.key);
    /// its public half goes beside it (`.pub`, SubjectPublicKeyInfo PEM).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace an existing key (its identity is lost).
    #[arg(long)]
    pub force: bool,
    /// How to print the public key on stdout.
    #[arg(long, value_enum, default_value = "fork")]
    pub public_format: PublicFormat,
}

pub fn keygen(a: KeygenArgs) -> Result<i32, CliError> {
    let is_node_key = a.out.is_none();
    let path = a.out.unwrap_or_else(crate::identity::default_node_key_path);
    let public = crate::identity::generate_node_key(&path, a.force)
        .map_err(|e| CliError::new(exit::identity(&e), e))?;
    match a.public_format {
        PublicFormat::Fork => out::line(public.to_string())?,
        PublicFormat::Spki => out::lines(public.to_spki_pem())?,
        PublicFormat::Openssh => out::line(public.to_openssh("fork"))?,
    }
    let what = if is_node_key { "node key" } else { "key" };
    out::error(&format!(
        "{what} written to {} (PKCS#8 PEM; public key in {})",
        path.display(),
        crate::identity::public_key_path(&path).display()
    ));
    Ok(0)
}
