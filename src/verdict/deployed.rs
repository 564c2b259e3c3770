//! `fork verify --patch P --tree DIR`: does a verified verdict speak for this patch and
//! this tree? The verdict signs `patch_hash` (the patch's bytes) and, since schema 1.2,
//! `patched_tree_hash` (the tree the successor ran, [`deploy_tree_hash`]). Here:
//!
//! - `--patch P`: `sha256(P)` must be the verdict's `patch_hash`;
//! - `--tree DIR` with `--patch P`: DIR is the runtime the patch is to be deployed on
//!   (its `fork.toml` names the source tree and `exclude`); P is applied with fork's own
//!   applier to a scratch copy of that tree (minus `exclude`), and the copy's hash must be
//!   the verdict's `patched_tree_hash`;
//! - `--tree DIR` alone: DIR is the deployed (already patched) runtime, e.g. a checkout
//!   after `git apply P`; its tree's hash must be the verdict's `patched_tree_hash`.
//!
//! A mismatch is an [`DeployedError`] naming both hashes: the verdict does not speak for
//! that tree.

use crate::fork::workspace::{copy_tree, deploy_tree_hash, WorkspaceError};
use crate::manifest::{Manifest, ManifestError, MANIFEST_FILE};
use crate::patch::{self, ApplyError, PatchError};
use crate::verdict::Verdict;
use std::io;
use std::path::PathBuf;
use thiserror::Error;

/// The largest patch `--tree` applies: far above any size gate a patch passes to be
/// evaluated (1 MiB by default), and bounded, so that no input can fill the memory.
pub const MAX_APPLIED_PATCH_BYTES: u64 = 64 << 20;

/// The largest `fork.toml` read from `--tree`.
pub const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// What to check a verdict against.
#[derive(Debug, Clone, Default)]
pub struct DeployedCheck {
    /// The patch that is to be (or was) deployed.
    pub patch: Option<PathBuf>,
    /// The runtime directory: the base tree with `patch`, the deployed tree without it.
    pub tree: Option<PathBuf>,
}

/// What matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeployedMatch {
    /// `sha256(P)`, when a patch was given.
    pub patch_hash: Option<String>,
    /// The tree's hash, when a tree was given (it equals the verdict's).
    pub tree_hash: Option<String>,
}

/// Why the verdict does not speak for the given patch or tree, or why that could not be
/// checked.
#[derive(Debug, Error)]
pub enum DeployedError {
    /// Names the patch (an open that refused a FIFO or a device, a read that failed).
    #[error("{source}")]
    ReadPatch {
        path: PathBuf,
        #[source]
        source: crate::patch::PatchFileError,
    },
    #[error("the patch {path} is {size} bytes, more than the {limit} bytes `fork verify --tree` applies: no evaluated patch is that large (a larger one was rejected by the size gate, with no patched tree to check)")]
    PatchTooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    #[error("the patch {path} has hash {actual}, but the verdict is for the patch {signed}")]
    PatchHash {
        path: PathBuf,
        signed: String,
        actual: String,
    },
    #[error("{0}")]
    Manifest(#[from] ManifestError),
    #[error("{path}: the manifest's source tree {source_dir} is not a directory")]
    NoSource { path: PathBuf, source_dir: PathBuf },
    #[error("the patch {path} is malformed: {source}")]
    MalformedPatch {
        path: PathBuf,
        #[source]
        source: PatchError,
    },
    #[error(
        "the patch does not apply to {tree}: {source}; the verdict does not speak for this tree"
    )]
    DoesNotApply {
        tree: PathBuf,
        #[source]
        source: ApplyError,
    },
    #[error("the verdict records no patched_tree_hash (a verdict before schema 1.2, or one where no patched tree ran): it cannot vouch for a tree")]
    NoTreeHash,
    #[error("the tree {what} hashes to {actual}, but the verdict was signed for the patched tree {signed}: the tree differs from the one evaluated")]
    TreeMismatch {
        what: String,
        signed: String,
        actual: String,
    },
    #[error("{0}")]
    Workspace(#[from] WorkspaceError),
    #[error("cannot create a scratch directory: {0}")]
    Scratch(#[source] io::Error),
}

impl DeployedError {
    /// Whether this is the answer "the verdict does not speak for it" (rather than input
    /// that could not be read, or a failure to check).
    pub fn is_mismatch(&self) -> bool {
        matches!(
            self,
            DeployedError::PatchHash { .. }
                | DeployedError::DoesNotApply { .. }
                | DeployedError::NoTreeHash
                | DeployedError::TreeMismatch { .. }
        )
    }
}

/// Checks `verdict` (already verified) against the patch and tree of `check`.
pub fn check_deployed(
    verdict: &Verdict,
    check: &DeployedCheck,
) -> Result<DeployedMatch, DeployedError> {
    let mut raw_patch = None;
    let mut out = DeployedMatch {
        patch_hash: None,
        tree_hash: None,
    };
    if let Some(path) = &check.patch {
        // Opened without blocking (a FIFO or a device is refused at once), hashed whole
        // as `evaluate` hashes it, and kept only as far as a tree check can apply it.
        let keep = if check.tree.is_some() {
            MAX_APPLIED_PATCH_BYTES
        } else {
            0
        };
        let read =
            patch::read_patch_file(path, keep).map_err(|source| DeployedError::ReadPatch {
                path: path.clone(),
                source,
            })?;
        let actual = read.hash();
        if actual != verdict.patch_hash {
            return Err(DeployedError::PatchHash {
                path: path.clone(),
                signed: verdict.patch_hash.clone(),
                actual,
            });
        }
        out.patch_hash = Some(actual);
        if check.tree.is_some() && read.size > MAX_APPLIED_PATCH_BYTES {
            return Err(DeployedError::PatchTooLarge {
                path: path.clone(),
                size: read.size,
                limit: MAX_APPLIED_PATCH_BYTES,
            });
        }
        raw_patch = Some((path, read.bytes));
    }
    let Some(dir) = &check.tree else {
        return Ok(out);
    };
    let signed = verdict
        .patched_tree_hash
        .clone()
        .ok_or(DeployedError::NoTreeHash)?;
    let manifest_path = dir.join(MANIFEST_FILE);
    // Opened without blocking, as `evaluate` opens the manifest, and read bounded: a FIFO,
    // a device or a link to one is refused at once, never waited on or read without end.
    let text = crate::fsx::read_input_to_string_capped(&manifest_path, MAX_MANIFEST_BYTES)
        .map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                ManifestError::Missing {
                    path: manifest_path.clone(),
                }
            } else {
                ManifestError::Read {
                    path: manifest_path.clone(),
                    source: e,
                }
            }
        })?;
    let manifest = Manifest::from_toml(&text, &manifest_path)?;
    let source = dir.join(&manifest.runtime.source);
    if !source.is_dir() {
        return Err(DeployedError::NoSource {
            path: manifest_path,
            source_dir: source,
        });
    }
    let exclude = &manifest.runtime.exclude;
    let (actual, what) = match raw_patch {
        None => (
            deploy_tree_hash(&source, exclude)?,
            format!("{}", source.display()),
        ),
        Some((path, raw)) => {
            let parsed = patch::parse(&raw).map_err(|source| DeployedError::MalformedPatch {
                path: path.clone(),
                source,
            })?;
            let scratch = tempfile::Builder::new()
                .prefix("fork-verify-tree-")
                .tempdir()
                .map_err(DeployedError::Scratch)?;
            let copy = scratch.path().join("src");
            copy_tree(&source, &copy, exclude)?;
            patch::apply(&copy, &parsed).map_err(|e| DeployedError::DoesNotApply {
                tree: source.clone(),
                source: e,
            })?;
            (
                deploy_tree_hash(&copy, exclude)?,
                format!("{} with {} applied", source.display(), path.display()),
            )
        }
    };
    if actual != signed {
        return Err(DeployedError::TreeMismatch {
            what,
            signed,
            actual,
        });
    }
    out.tree_hash = Some(actual);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::EphemeralKey;
    use crate::verdict::sha256_digest;

    fn demo() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/hermes-demo")
    }

    fn swap() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/patches/swap-compressor.diff")
    }

    /// A verdict for swap-compressor on the demo, with the patched tree hash fork computes.
    fn verdict_for_swap() -> Verdict {
        let key = EphemeralKey::generate();
        let mut v = crate::verdict::tests::sample_verdict(&key.public());
        v.patch_hash = sha256_digest(&std::fs::read(swap()).unwrap());
        let m = crate::manifest::load(&demo()).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        copy_tree(&demo(), tmp.path(), &m.runtime.exclude).unwrap();
        let p = patch::parse(&std::fs::read(swap()).unwrap()).unwrap();
        patch::apply(tmp.path(), &p).unwrap();
        v.patched_tree_hash = Some(deploy_tree_hash(tmp.path(), &m.runtime.exclude).unwrap());
        v
    }

    #[test]
    fn patch_and_tree_match_and_mismatch() {
        let v = verdict_for_swap();
        let both = DeployedCheck {
            patch: Some(swap()),
            tree: Some(demo()),
        };
        let ok = check_deployed(&v, &both).unwrap();
        assert_eq!(ok.tree_hash, v.patched_tree_hash);
        assert_eq!(ok.patch_hash.as_deref(), Some(v.patch_hash.as_str()));

        // The unpatched demo is not the deployed tree.
        let deployed = DeployedCheck {
            patch: None,
            tree: Some(demo()),
        };
        let e = check_deployed(&v, &deployed).unwrap_err();
        assert!(e.is_mismatch(), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains(v.patched_tree_hash.as_deref().unwrap()) && msg.contains("sha256:"),
            "{msg}"
        );

        // Another patch.
        let other =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/patches/noop-comment.diff");
        let e = check_deployed(
            &v,
            &DeployedCheck {
                patch: Some(other),
                tree: None,
            },
        )
        .unwrap_err();
        assert!(matches!(e, DeployedError::PatchHash { .. }), "{e}");

        // No tree hash in the verdict (schema 1.1, or a gate rejection).
        let mut old = v.clone();
        old.patched_tree_hash = None;
        let e = check_deployed(&old, &both).unwrap_err();
        assert!(matches!(e, DeployedError::NoTreeHash), "{e}");

        // A tree without a manifest is bad input, not a mismatch.
        let tmp = tempfile::tempdir().unwrap();
        let e = check_deployed(
            &v,
            &DeployedCheck {
                patch: None,
                tree: Some(tmp.path().to_path_buf()),
            },
        )
        .unwrap_err();
        assert!(!e.is_mismatch(), "{e}");
    }
}
