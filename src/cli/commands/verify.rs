//! `fork verify`: signatures, endorsement chain, schema and artifact hashes of a bundle;
//! with `--patch`/`--tree`, that the verdict speaks for that patch and tree.

use crate::cli::args::parse_keys;
use crate::cli::exit::{self, CliError};
use crate::cli::out;
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
    /// Print the verified verdict as JSON (an invalid bundle: `{"valid": false, "reason"}`).
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

/// What `fork verify --json` prints for a bundle that is not valid (exit 1): one JSON
/// object, as for a valid one (the verdict document).
#[derive(serde::Serialize)]
struct Invalid {
    valid: bool,
    reason: String,
}

/// The answer "invalid" (exit 1): `invalid: <why>`, or with `--json` `{"valid": false,
/// "reason": <why>}`. The reason quotes the bundle: made safe for a terminal.
fn invalid(json: bool, reason: impl std::fmt::Display) -> Result<i32, CliError> {
    let reason = reason.to_string();
    if json {
        out::json(&Invalid {
            valid: false,
            reason,
        })?;
    } else {
        out::line(format!("invalid: {reason}"))?;
    }
    Ok(exit::INVALID)
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
    let v = match crate::verdict::verify_bundle(&a.path, &trusted) {
        Ok(v) => v,
        Err(e) => {
            return match exit::verify(&e) {
                exit::INVALID => invalid(a.json, e),
                code => Err(CliError::from((code, e))),
            }
        }
    };
    let check = crate::verdict::deployed::DeployedCheck {
        patch: a.patch.clone(),
        tree: a.tree.clone(),
    };
    let matched = match crate::verdict::deployed::check_deployed(&v.verdict, &check) {
        Ok(m) => m,
        Err(e) => {
            return match exit::deployed(&e) {
                exit::INVALID => invalid(a.json, e),
                code => Err(CliError::from((code, e))),
            }
        }
    };
    if a.json {
        let doc = v
            .verdict
            .to_json_pretty()
            .map_err(|e| CliError::from((exit::INTERNAL, e)))?;
        out::json_bytes(&doc)?;
        return Ok(0);
    }
    out::line(format!(
        "valid: {} {} (confidence {:.2}), signed by {} endorsed by node {}",
        v.verdict.verdict, v.verdict.patch_hash, v.verdict.confidence, v.successor_key, v.node_key
    ))?;
    if let Some(h) = &matched.patch_hash {
        out::line(format!("  patch matches: {h}"))?;
    }
    if let Some(h) = &matched.tree_hash {
        out::line(format!("  tree matches the patched tree evaluated: {h}"))?;
    }
    if v.artifacts_withheld {
        out::line(format!(
            "  artifacts withheld by the publishing node: {} listed, their sha256 signed, their contents not here",
            v.verdict.artifacts.len()
        ))?;
    }
    Ok(0)
}
