//! The hashes of a tree (lifecycle step 2): the source hash every copy is checked by
//! ([`tree_hash`], [`TreeListing`]), and the deployment hash a verdict signs
//! ([`deploy_tree_hash`]); both read the tree as [`super::tree`] describes.

use super::error::WorkspaceError;
use super::tree::{build_excludes, Node, Tree};
use globset::GlobSet;
use sha2::{Digest, Sha256};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

fn put_bytes(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

/// A deterministic `sha256:<hex>` of the tree under `dir`: over every entry, sorted by
/// relative path bytes, its type, its path, and for regular files the owner-execute bit
/// and the sha256 of the contents, for symlinks the target (never followed). Other modes,
/// owners and timestamps do not count, nor do devices, FIFOs and sockets, which a copy
/// never holds: the hash of a tree is the hash of its copy (before this release they
/// counted by type and name, so a runtime whose source held a socket hashed otherwise
/// than every copy of it).
pub fn tree_hash(dir: &Path) -> Result<String, WorkspaceError> {
    tree_hash_excluding(dir, &[])
}

/// [`tree_hash`] of the tree as [`copy_tree`](super::workspace::copy_tree) with the same `exclude` globs would copy it:
/// the hash of the source a successor would get, without copying.
pub fn tree_hash_excluding(dir: &Path, exclude: &[String]) -> Result<String, WorkspaceError> {
    hash_tree(&Tree::open(dir)?, exclude)
}

/// [`tree_hash_excluding`] of the directory `rel` beneath `root`, no component of `rel` a
/// link (the parent's source tree, read as [`super::tree`] describes).
pub fn tree_hash_beneath(
    root: &Path,
    rel: &Path,
    exclude: &[String],
) -> Result<String, WorkspaceError> {
    hash_tree(&Tree::beneath(root, rel)?, exclude)
}

/// A source tree as an evaluation began with it: its [`tree_hash`] and its entries, so
/// that a later copy that hashes otherwise can be told what changed.
#[derive(Debug, Clone)]
pub struct TreeListing {
    /// The tree's [`tree_hash`].
    pub hash: String,
    pub(super) entries: Vec<crate::fork::tree::Scanned>,
    /// For a listed copy ([`copy_tree_beneath_listed`](super::workspace::copy_tree_beneath_listed)): each file's identity as written
    /// (inode, change time, size), by path; empty for a listing read from a tree.
    written: std::collections::HashMap<PathBuf, Written>,
}

/// A copied file as its copy left it: while these hold, its listed digest is its contents'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Written {
    ino: u64,
    ctime: (i64, i64),
    size: i64,
}

impl Written {
    pub(super) fn of(st: &nix::sys::stat::FileStat) -> Self {
        Written {
            ino: st.st_ino,
            ctime: (st.st_ctime, st.st_ctime_nsec),
            size: st.st_size,
        }
    }
}

impl TreeListing {
    /// The tree `rel` beneath `root` without the `exclude` globs, read as
    /// [`tree_hash_beneath`] reads it (its hash is that hash).
    pub fn beneath(root: &Path, rel: &Path, exclude: &[String]) -> Result<Self, WorkspaceError> {
        Ok(Self::of_entries(
            Tree::beneath(root, rel)?.scan(&build_excludes(exclude)?)?,
        ))
    }

    /// Everything under `dir` (its hash is [`tree_hash`]).
    pub fn of(dir: &Path) -> Result<Self, WorkspaceError> {
        Ok(Self::of_entries(Tree::open(dir)?.scan(&GlobSet::empty())?))
    }

    /// The listing of a copy from what it wrote: its entries (sorted here) and each
    /// file's identity once written.
    pub(super) fn of_copy(
        mut entries: Vec<crate::fork::tree::Scanned>,
        written: std::collections::HashMap<PathBuf, Written>,
    ) -> Self {
        entries.sort_by(|a, b| a.0.as_os_str().as_bytes().cmp(b.0.as_os_str().as_bytes()));
        TreeListing {
            written,
            ..Self::of_entries(entries)
        }
    }

    fn of_entries(mut entries: Vec<crate::fork::tree::Scanned>) -> Self {
        entries.retain(|(_, node, _)| !is_special(node));
        TreeListing {
            hash: hash_entries(&entries),
            entries,
            written: Default::default(),
        }
    }

    /// The regular files of the listing, relative to its root, in path order.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.entries.iter().filter_map(|(p, node, _)| match node {
            Node::File { .. } => Some(p.as_path()),
            _ => None,
        })
    }

    /// The listed digest of the regular file `rel` of a listed copy, if the file `st`
    /// describes is still the one the copy wrote there (same inode, change time and size):
    /// otherwise none.
    pub(super) fn copied_digest(
        &self,
        rel: &Path,
        st: &nix::sys::stat::FileStat,
    ) -> Option<[u8; 32]> {
        if self.written.get(rel) != Some(&Written::of(st)) {
            return None;
        }
        let key = rel.as_os_str().as_bytes();
        let i = self
            .entries
            .binary_search_by(|(p, _, _)| p.as_os_str().as_bytes().cmp(key))
            .ok()?;
        match &self.entries[i] {
            (_, Node::File { .. }, digest) => *digest,
            _ => None,
        }
    }

    /// The paths whose entries differ between `self` and `other`, as the hash counts
    /// them (added, removed, or changed in type, contents, owner-execute bit or link
    /// target), in path order, at most `max`.
    pub fn changed(&self, other: &TreeListing, max: usize) -> Vec<PathBuf> {
        use std::cmp::Ordering::*;
        let counted = |(_, node, digest): &crate::fork::tree::Scanned| match node {
            Node::File { mode } => (b'F', mode & 0o100 != 0, None, *digest),
            Node::Link(t) => (b'L', false, Some(t.clone()), None),
            _ => (b'D', false, None, None),
        };
        let (a, b) = (&self.entries, &other.entries);
        let (mut i, mut j, mut out) = (0, 0, Vec::new());
        while out.len() < max {
            let (x, y) = (a.get(i), b.get(j));
            let order = match (x, y) {
                (None, None) => break,
                (Some(_), None) => Less,
                (None, Some(_)) => Greater,
                (Some(x), Some(y)) => x.0.as_os_str().as_bytes().cmp(y.0.as_os_str().as_bytes()),
            };
            match (order, x, y) {
                (Less, Some(x), _) => {
                    out.push(x.0.clone());
                    i += 1;
                }
                (Greater, _, Some(y)) => {
                    out.push(y.0.clone());
                    j += 1;
                }
                (_, Some(x), Some(y)) => {
                    if counted(x) != counted(y) {
                        out.push(x.0.clone());
                    }
                    i += 1;
                    j += 1;
                }
                _ => break,
            }
        }
        out
    }
}

/// Devices, FIFOs and sockets: never copied, never hashed.
fn is_special(node: &Node) -> bool {
    matches!(node, Node::Fifo | Node::Socket | Node::Char | Node::Block)
}

fn hash_tree(tree: &Tree, exclude: &[String]) -> Result<String, WorkspaceError> {
    Ok(hash_entries(&tree.scan(&build_excludes(exclude)?)?))
}

/// [`tree_hash`] and [`deploy_tree_hash`] (with `exclude`) of the tree under `dir`, from
/// one reading of it: the tree the successor runs is read and hashed once, not twice.
/// The entries the deployment hash leaves out are those `exclude` would have skipped
/// while reading: an entry matching it, or beneath a directory matching it.
pub fn tree_and_deploy_hashes(
    dir: &Path,
    exclude: &[String],
) -> Result<(String, String), WorkspaceError> {
    both_hashes(Tree::open(dir)?.scan(&GlobSet::empty())?, exclude)
}

/// [`tree_and_deploy_hashes`] of a listed copy `before` ([`copy_tree_beneath_listed`](super::workspace::copy_tree_beneath_listed))
/// that a patch naming the paths in `changed` was applied to: a file not in `changed`
/// that is still the very file the copy wrote (same inode, change time and size; a patch
/// replaces every file it writes by a new one) is not read again, its listed digest
/// stands for it. The tree's entries, their kinds and modes are read as ever, and every
/// other file is read.
pub fn tree_and_deploy_hashes_after(
    dir: &Path,
    exclude: &[String],
    before: &TreeListing,
    changed: &std::collections::BTreeSet<PathBuf>,
) -> Result<(String, String), WorkspaceError> {
    let known = |rel: &Path, st: &nix::sys::stat::FileStat| {
        if changed.contains(rel) {
            return None;
        }
        before.copied_digest(rel, st)
    };
    let all = Tree::open(dir)?.scan_knowing(&GlobSet::empty(), &known)?;
    both_hashes(all, exclude)
}

/// The tree hash of `all` and the deployment hash of those of them `exclude` keeps.
fn both_hashes(
    all: Vec<crate::fork::tree::Scanned>,
    exclude: &[String],
) -> Result<(String, String), WorkspaceError> {
    let globs = build_excludes(exclude)?;
    let deployed = all.iter().filter(|(rel, _, _)| {
        !rel.ancestors()
            .filter(|a| !a.as_os_str().is_empty())
            .any(|a| globs.is_match(a))
    });
    Ok((hash_entries(&all), deploy_hash_entries(deployed)))
}

/// The [`tree_hash`] of scanned entries (sorted by path bytes, as `scan` returns them).
fn hash_entries(entries: &[crate::fork::tree::Scanned]) -> String {
    let mut h = Sha256::new();
    h.update(b"fork-tree-v1\0");
    for (rel, node, digest) in entries {
        let tag: &[u8; 1] = match node {
            Node::Dir { .. } => b"D",
            Node::File { .. } => b"F",
            Node::Link(_) => b"L",
            // Never copied (`copy_tree` skips them), so never hashed.
            Node::Fifo | Node::Socket | Node::Char | Node::Block => continue,
        };
        h.update(tag);
        put_bytes(&mut h, rel.as_os_str().as_bytes());
        if let (Node::File { mode }, Some(d)) = (node, digest) {
            h.update([u8::from(mode & 0o100 != 0)]);
            h.update(d);
        } else if let Node::Link(target) = node {
            put_bytes(&mut h, target.as_bytes());
        }
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// The patched tree hash (verdict field `patched_tree_hash`): a `sha256:<hex>` of what a
/// deployment of the tree consists of, the same whether fork's copy or a git checkout is
/// hashed. Over the tree under `dir` minus the `exclude` globs (matched as [`copy_tree`](super::workspace::copy_tree)
/// matches them; an excluded directory leaves out all it holds), sorted by relative path
/// bytes (`/`-separated, no leading `./`), starting from the bytes `fork-deploy-tree-v1\0`:
///
/// - each regular file: `F`, its path (u64 big-endian length, then the bytes), one byte
///   that is 1 when the owner-execute bit is set and 0 otherwise, the 32-byte sha256 of
///   its contents;
/// - each symbolic link (never followed): `L`, its path, its target (length, bytes);
/// - directories are not hashed (an empty directory does not count: git cannot carry
///   one), nor devices, FIFOs and sockets ([`copy_tree`](super::workspace::copy_tree) never copies them); other mode
///   bits, owners and timestamps do not count.
pub fn deploy_tree_hash(dir: &Path, exclude: &[String]) -> Result<String, WorkspaceError> {
    let entries = Tree::open(dir)?.scan(&build_excludes(exclude)?)?;
    Ok(deploy_hash_entries(entries.iter()))
}

/// The [`deploy_tree_hash`] of scanned entries (in the order `scan` returns them).
fn deploy_hash_entries<'a>(
    entries: impl Iterator<Item = &'a crate::fork::tree::Scanned>,
) -> String {
    let mut h = Sha256::new();
    h.update(b"fork-deploy-tree-v1\0");
    for (rel, node, digest) in entries {
        if let (Node::File { mode }, Some(d)) = (node, digest) {
            h.update(b"F");
            put_bytes(&mut h, rel.as_os_str().as_bytes());
            h.update([u8::from(mode & 0o100 != 0)]);
            h.update(d);
        } else if let Node::Link(target) = node {
            h.update(b"L");
            put_bytes(&mut h, rel.as_os_str().as_bytes());
            put_bytes(&mut h, target.as_bytes());
        }
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}
