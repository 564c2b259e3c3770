//! Host safety: what a hostile successor (or a runtime's owner) leaves behind never reaches
//! the host, the parent or the bundle with more than it should, one subject per file:
//! `copy_back` (`fork run --workspace`), `wal_parent` (the parent's side files), `links`
//! (links planted in the tools, the source and fork's own rerun directories), `bundles`
//! (private, secrets scrubbed), `foreign_state` (another user's stores read as that
//! user) and `foreign_tree` (another user's trees entered only as that user could). Every
//! case only writes files the test made, in its own scratch directories (and one small
//! tmpfs it mounts and unmounts).

mod common;
use common::lifecycle::need_root;
use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every entry under `dir` (relative path, mode, size, content hash for files).
fn listing(dir: &Path) -> Vec<(PathBuf, u32, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            let rel = e.path().strip_prefix(dir).unwrap().to_path_buf();
            let content = if m.is_file() {
                std::fs::read(e.path()).unwrap()
            } else {
                Vec::new()
            };
            if m.is_dir() {
                stack.push(e.path());
            }
            out.push((rel, m.mode(), m.len(), content));
        }
    }
    out.sort();
    out
}

const SECRET: &str = "ROOT-ONLY-SECRET-f8";

/// A root-only directory outside the runtime holding a marker secret.
fn root_only(env: &common::lifecycle::Env) -> PathBuf {
    let d = env.dir.join("rootonly");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("secret.txt"), SECRET).unwrap();
    std::fs::set_permissions(d.join("secret.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

/// Whether any file under `dir` (not following links) holds the secret.
fn holds_secret(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file()
                && String::from_utf8_lossy(&std::fs::read(e.path()).unwrap_or_default())
                    .contains(SECRET)
            {
                found.push(e.path());
            }
        }
    }
    found
}

#[path = "host_safety/bundles.rs"]
mod bundles;
#[path = "host_safety/copy_back.rs"]
mod copy_back;
#[path = "host_safety/foreign_state.rs"]
mod foreign_state;
#[path = "host_safety/foreign_tree.rs"]
mod foreign_tree;
#[path = "host_safety/links.rs"]
mod links;
#[path = "host_safety/wal_parent.rs"]
mod wal_parent;
