//! `fork verify`: signatures, endorsement chain, schema and artifact hashes of a bundle;
//! with `--patch`/`--tree`, that the verdict speaks for that patch and tree.

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
    #[arg(long, allow_hyphen_values = true)]
    pub trust: Vec<String>,
    /// Print the verified verdict as JSON.
    #[arg(long)]
    pub json: bool,
    /// The patch to deploy: its sha256 must be the verdict's patch_hash. With --tree, it is
    /// applied (by fork's applier) to a scratch copy of that tree first.
    #[arg(long)]
    pub patch: Option<PathBuf>,
    /// A runtime directory (with fork.toml): the tree the patch is to be applied to (with
    /// --patch), or the deployed, already patched tree (without). Its hash must be the
    /// verdict's patched_tree_hash.
    #[arg(long)]
    pub tree: Option<PathBuf>,
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
            let check = crate::verdict::deployed::DeployedCheck {
                patch: a.patch.clone(),
                tree: a.tree.clone(),
            };
            let matched = match crate::verdict::deployed::check_deployed(&v.verdict, &check) {
                Ok(m) => m,
                Err(e) => {
                    let code = exit::deployed(&e);
                    if code == exit::INVALID {
                        println!("invalid: {e}");
                        return Ok(1);
                    }
                    return Err(CliError::from((code, e)));
                }
            };
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
                if let Some(h) = &matched.patch_hash {
                    println!("  patch matches: {h}");
                }
                if let Some(h) = &matched.tree_hash {
                    println!("  tree matches the patched tree evaluated: {h}");
                }
                if v.artifacts_withheld {
                    println!(
                        "  artifacts withheld by the publishing node: {} listed, their sha256 signed, their contents not here",
                        v.verdict.artifacts.len()
                    );
                }
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
