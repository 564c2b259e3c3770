//! `fork verify`: signatures, endorsement chain, schema and artifact hashes of a bundle.

use crate::cli::args::parse_keys;
use crate::cli::exit::{self, CliError};
use clap::Args;
use std::path::PathBuf;

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

/// `fork verify` from the command line.
pub fn verify_cmd(a: VerifyArgs) -> Result<i32, CliError> {
    let mut trusted = parse_keys(&a.trust, "--trust")?;
    if trusted.is_empty() {
        // The local node's own key, when there is one.
        let key_path = crate::identity::default_node_key_path();
        if let Ok(k) =
            crate::identity::read_public_key(&crate::identity::public_key_path(&key_path))
        {
            trusted.push(k);
        }
    }
    match crate::verdict::verify_bundle(&a.path, &trusted) {
        Ok(v) => {
            if a.json {
                let doc = v
                    .verdict
                    .to_json_pretty()
                    .map_err(|e| CliError::from((exit::INTERNAL, e)))?;
                println!("{}", String::from_utf8_lossy(&doc));
            } else {
                println!(
                    "valid: {} {} (confidence {:.2}), signed by {} endorsed by node {}",
                    v.verdict.verdict,
                    v.verdict.patch_hash,
                    v.verdict.confidence,
                    v.successor_key,
                    v.node_key
                );
            }
            Ok(0)
        }
        Err(e) => {
            let code = exit::verify(&e);
            if code == exit::INVALID {
                println!("invalid: {e}");
                Ok(1)
            } else {
                Err(CliError::from((code, e)))
            }
        }
    }
}
