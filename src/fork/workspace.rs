//! The run's workspace: its layout, the copy of the source tree and the tool registry,
//! the tree hash, and its removal.
//!
//! Layout (lifecycle step 2, FORK): `<tmp>/fork-<run-id>/{src,state,tools,reports,home}`.
//!
//! Copies ([`copy_tree`]) and hashes read their source as [`super::tree`] describes (one
//! directory descriptor at a time, never through a link, each file checked on its
//! descriptor): a link is recreated as a link with the same target (an absolute target
//! then resolves inside the sandbox's own root). Regular files are copied with
//! `std::io::copy` between the two descriptors, which on Linux uses
//! `copy_file_range(2)`: on filesystems that support it (btrfs, XFS with reflink, bcachefs,
//! NFS 4.2 server-side copy, overlayfs over those) the copy is a reflink that shares
//! blocks until written, elsewhere it is an in-kernel copy. Permission bits are kept
//! except set-user-ID and set-group-ID, which are dropped; ownership is not kept (the copy
//! belongs to the supervisor). Devices, FIFOs and sockets are skipped and counted.

use super::tree::{Node, Tree};
use crate::ioerr::{IoContext, IoError};
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use sha2::{Digest, Sha256};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The workspace's subdirectories, in the order they are created.
pub const SUBDIRS: [&str; 5] = ["src", "state", "tools", "reports", "home"];

pub use super::error::WorkspaceError;

/// A run's workspace directory and its fixed layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    root: PathBuf,
}

impl Workspace {
    /// Creates `root` (mode 0700; it must not exist, its parents are created) and the
    /// subdirectories `src/ state/ tools/ reports/ home/` (mode 0755) inside it.
    pub fn create(root: &Path) -> Result<Workspace, WorkspaceError> {
        if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).ctx("create directory", parent)?;
        }
        match fs::DirBuilder::new().mode(0o700).create(root) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(WorkspaceError::Exists {
                    path: root.to_path_buf(),
                })
            }
            Err(e) => return Err(IoError::new("create directory", root, e).into()),
        }
        for sub in SUBDIRS {
            let p = root.join(sub);
            fs::DirBuilder::new()
                .mode(0o755)
                .create(&p)
                .ctx("create directory", &p)?;
        }
        Ok(Workspace {
            root: root.to_path_buf(),
        })
    }

    /// Opens an existing workspace (every subdirectory must be there).
    pub fn open(root: &Path) -> Result<Workspace, WorkspaceError> {
        for sub in SUBDIRS {
            let p = root.join(sub);
            let meta = fs::symlink_metadata(&p).ctx("open", &p)?;
            if !meta.is_dir() {
                return Err(WorkspaceError::NotADirectory { path: p });
            }
        }
        Ok(Workspace {
            root: root.to_path_buf(),
        })
    }

    /// The workspace directory.
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// The patched source tree (`src/`).
    pub fn src(&self) -> PathBuf {
        self.root.join("src")
    }
    /// The state snapshots (`state/`).
    pub fn state(&self) -> PathBuf {
        self.root.join("state")
    }
    /// The copied tool registry (`tools/`).
    pub fn tools(&self) -> PathBuf {
        self.root.join("tools")
    }
    /// Where the successor writes its reports (`reports/`).
    pub fn reports(&self) -> PathBuf {
        self.root.join("reports")
    }
    /// The successor's `$HOME` (`home/`).
    pub fn home(&self) -> PathBuf {
        self.root.join("home")
    }

    /// Deletes the workspace; see [`remove_tree`]. Idempotent.
    pub fn remove(&self) -> Result<(), WorkspaceError> {
        remove_tree(&self.root)
    }
}

/// What [`copy_tree`] copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyStats {
    /// Regular files copied.
    pub files: u64,
    /// Directories created (not counting the destination itself).
    pub dirs: u64,
    /// Symbolic links recreated.
    pub symlinks: u64,
    /// Bytes of regular file content copied.
    pub bytes: u64,
    /// Devices, FIFOs and sockets skipped.
    pub special_skipped: u64,
    /// Entries left out by an exclude pattern (an excluded directory counts once).
    pub excluded: u64,
}

fn build_excludes(exclude: &[String]) -> Result<GlobSet, WorkspaceError> {
    let mut b = GlobSetBuilder::new();
    for pattern in exclude {
        let trimmed = pattern.trim_end_matches('/');
        let trimmed = trimmed.strip_prefix("./").unwrap_or(trimmed);
        let glob = GlobBuilder::new(trimmed)
            .literal_separator(true)
            .build()
            .map_err(|source| WorkspaceError::BadGlob {
                pattern: pattern.clone(),
                source,
            })?;
        b.add(glob);
    }
    b.build().map_err(|source| WorkspaceError::BadGlob {
        pattern: exclude.join(", "),
        source,
    })
}

/// Copies the tree `from` into the directory `to` (created if missing). `exclude` holds
/// globs matched against paths relative to `from` (`*` stays within one path component,
/// `**` crosses them: `.git`, `state`, `**/*.pyc`, `build/**`); an excluded directory is
/// skipped with all its contents. Symlinks are copied as symlinks, never followed;
/// permission bits are kept (minus set-user-ID/set-group-ID); special files are skipped
/// and counted. If `to` lies inside `from`, it is not copied into itself. `to` may already
/// hold a tree: directories are merged, files and symlinks in the way are replaced (never
/// written through), and a directory in the way of a file is an error.
pub fn copy_tree(from: &Path, to: &Path, exclude: &[String]) -> Result<CopyStats, WorkspaceError> {
    copy_from(&Tree::open(from)?, to, exclude)
}

/// [`copy_tree`] of the directory `rel` beneath the directory `root`, where no component of
/// `rel` may be a link: the parent's source and tools beneath its runtime directory, read
/// as [`super::tree`] describes whatever the runtime's owner does meanwhile.
pub fn copy_tree_beneath(
    root: &Path,
    rel: &Path,
    to: &Path,
    exclude: &[String],
) -> Result<CopyStats, WorkspaceError> {
    copy_from(&Tree::beneath(root, rel)?, to, exclude)
}

fn copy_from(tree: &Tree, to: &Path, exclude: &[String]) -> Result<CopyStats, WorkspaceError> {
    let excludes = build_excludes(exclude)?;
    let from_mode = tree.stat()?.st_mode;
    fs::create_dir_all(to).ctx("create directory", to)?;
    let to_meta = fs::metadata(to).ctx("read", to)?;
    let to_id = (to_meta.dev(), to_meta.ino());

    let mut stats = CopyStats::default();
    // (path relative to the tree, destination dir)
    let mut stack = vec![(PathBuf::new(), to.to_path_buf())];
    // Directory modes are applied at the end, deepest first, so that a read-only
    // directory can still be filled.
    let mut dir_modes: Vec<(PathBuf, u32)> = vec![(to.to_path_buf(), from_mode & 0o1777)];
    while let Some((rel_dir, dst_dir)) = stack.pop() {
        let dir = tree.dir(&rel_dir)?;
        for (name, st, node) in tree.entries(&dir, &rel_dir, &excludes, &mut stats.excluded)? {
            let rel = rel_dir.join(&name);
            let dst = dst_dir.join(&name);
            match node {
                Node::Dir { mode } => {
                    if (st.st_dev, st.st_ino) == to_id {
                        // The destination itself, inside the source: never copy it into itself.
                        stats.excluded += 1;
                        continue;
                    }
                    if clear_dest(&dst, true)? {
                        // Merge into the existing directory; its mode is set at the end.
                        fs::set_permissions(&dst, fs::Permissions::from_mode(0o700))
                            .ctx("set permissions on", &dst)?;
                    } else {
                        fs::DirBuilder::new()
                            .mode(0o700)
                            .create(&dst)
                            .ctx("create directory", &dst)?;
                    }
                    stats.dirs += 1;
                    dir_modes.push((dst.clone(), mode & 0o1777));
                    stack.push((rel, dst));
                }
                Node::File { mode } => {
                    let mut from = tree.open_file(&dir, &rel_dir, &name)?;
                    clear_dest(&dst, false)?;
                    let mut out = fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .open(&dst)
                        .ctx("create", &dst)?;
                    // copy_file_range(2): a reflink where the filesystem can.
                    let n = io::copy(&mut from, &mut out).ctx("copy", &tree.path().join(&rel))?;
                    out.set_permissions(fs::Permissions::from_mode(mode & 0o1777))
                        .ctx("set permissions on", &dst)?;
                    stats.files += 1;
                    stats.bytes += n;
                }
                Node::Link(target) => {
                    clear_dest(&dst, false)?;
                    std::os::unix::fs::symlink(&target, &dst).ctx("create symlink", &dst)?;
                    stats.symlinks += 1;
                }
                _ => stats.special_skipped += 1,
            }
        }
    }
    for (dir, mode) in dir_modes.iter().rev() {
        fs::set_permissions(dir, fs::Permissions::from_mode(*mode))
            .ctx("set permissions on", dir)?;
    }
    Ok(stats)
}

/// Makes room for a copy at `dst` in a destination that may already hold a tree: a file or
/// symlink there is removed (never written through); an existing directory is kept when a
/// directory is wanted (returns true: merge into it) and refused otherwise.
fn clear_dest(dst: &Path, want_dir: bool) -> Result<bool, WorkspaceError> {
    match fs::symlink_metadata(dst) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(IoError::new("stat", dst, e).into()),
        Ok(m) if m.is_dir() => {
            if want_dir {
                Ok(true)
            } else {
                Err(WorkspaceError::WouldReplaceDirectory {
                    path: dst.to_path_buf(),
                })
            }
        }
        Ok(_) => {
            fs::remove_file(dst).ctx("replace", dst)?;
            Ok(false)
        }
    }
}

fn put_bytes(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

/// A deterministic `sha256:<hex>` of the tree under `dir`: over every entry, sorted by
/// relative path bytes, its type, its path, and for regular files the owner-execute bit
/// and the sha256 of the contents, for symlinks the target (never followed). Other modes,
/// owners and timestamps do not count. Devices, FIFOs and sockets count by type and name.
pub fn tree_hash(dir: &Path) -> Result<String, WorkspaceError> {
    tree_hash_excluding(dir, &[])
}

/// [`tree_hash`] of the tree as [`copy_tree`] with the same `exclude` globs would copy it
/// (special files aside): the hash of the source a successor would get, without copying.
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
    let globs = build_excludes(exclude)?;
    let all = Tree::open(dir)?.scan(&GlobSet::empty())?;
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
            Node::Fifo => b"P",
            Node::Socket => b"S",
            Node::Char => b"C",
            Node::Block => b"B",
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
/// hashed. Over the tree under `dir` minus the `exclude` globs (matched as [`copy_tree`]
/// matches them; an excluded directory leaves out all it holds), sorted by relative path
/// bytes (`/`-separated, no leading `./`), starting from the bytes `fork-deploy-tree-v1\0`:
///
/// - each regular file: `F`, its path (u64 big-endian length, then the bytes), one byte
///   that is 1 when the owner-execute bit is set and 0 otherwise, the 32-byte sha256 of
///   its contents;
/// - each symbolic link (never followed): `L`, its path, its target (length, bytes);
/// - directories are not hashed (an empty directory does not count: git cannot carry
///   one), nor devices, FIFOs and sockets ([`copy_tree`] never copies them); other mode
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

/// Deletes `path` and everything under it. Idempotent (a missing path is fine). Never
/// follows symlinks and never crosses into another filesystem: a mount point left inside
/// (say by a crashed sandbox) is an error, so a bind mount of host files is never emptied.
/// Directories the successor made unreadable or unwritable are opened up (chmod 0700)
/// before being emptied.
pub fn remove_tree(path: &Path) -> Result<(), WorkspaceError> {
    use nix::sys::stat::{fchmodat, FchmodatFlags, Mode};
    use nix::unistd::{unlinkat, UnlinkatFlags};
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(IoError::new("stat", path, e).into()),
    };
    if !meta.is_dir() {
        return Ok(fs::remove_file(path).ctx("remove", path)?);
    }
    let dev = meta.dev();
    if meta.mode() & 0o700 != 0o700 {
        fs::set_permissions(path, fs::Permissions::from_mode(0o700)).ctx("open up", path)?;
    }
    // Depth first, relative to each directory's own descriptor (fsx::walk_tree): a tree
    // nested deeper than PATH_MAX is removed like any other.
    let mut mount = None;
    crate::fsx::walk_tree(
        path,
        |dir, name, st| {
            if !crate::fsx::is_directory(st) {
                unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)?;
                return Ok(false);
            }
            if st.st_dev != dev {
                mount = Some(path.join(name));
                return Err(io::Error::other("a mount point"));
            }
            if st.st_mode & 0o700 != 0o700 {
                // The entry is a directory (stat did not follow links), and its writer is dead.
                fchmodat(
                    dir,
                    name,
                    Mode::from_bits_truncate(0o700),
                    FchmodatFlags::FollowSymlink,
                )?;
            }
            Ok(true)
        },
        |parent, name| Ok(unlinkat(parent, name, UnlinkatFlags::RemoveDir)?),
    )
    .map_err(|e| match mount.take() {
        Some(path) => WorkspaceError::MountPoint { path },
        None => IoError::new("remove", path, io::Error::other(e.to_string())).into(),
    })?;
    Ok(fs::remove_dir(path).ctx("remove directory", path)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn sample_tree(root: &Path) {
        fs::create_dir_all(root.join("a/b")).unwrap();
        fs::create_dir_all(root.join(".git/objects")).unwrap();
        fs::create_dir_all(root.join("state")).unwrap();
        fs::write(root.join("a/one.txt"), b"one").unwrap();
        fs::write(root.join("a/b/two.py"), b"print(2)\n").unwrap();
        fs::write(root.join("a/b/cache.pyc"), b"\0\0").unwrap();
        fs::write(root.join("run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
        fs::set_permissions(root.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(root.join(".git/objects/x"), b"blob").unwrap();
        fs::write(root.join("state/hermes.db"), b"live").unwrap();
        symlink("a/one.txt", root.join("link")).unwrap();
        symlink("/etc/passwd", root.join("abs-link")).unwrap();
        symlink("nowhere", root.join("dangling")).unwrap();
        nix::unistd::mkfifo(
            &root.join("fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
    }

    #[test]
    fn workspace_layout() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("fork-run1");
        let ws = Workspace::create(&root).unwrap();
        for (p, name) in [
            (ws.src(), "src"),
            (ws.state(), "state"),
            (ws.tools(), "tools"),
            (ws.reports(), "reports"),
            (ws.home(), "home"),
        ] {
            assert!(p.is_dir());
            assert_eq!(p, root.join(name));
        }
        assert_eq!(
            fs::metadata(&root).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert!(matches!(
            Workspace::create(&root).unwrap_err(),
            WorkspaceError::Exists { .. }
        ));
        assert_eq!(Workspace::open(&root).unwrap(), ws);
        ws.remove().unwrap();
        assert!(!root.exists());
        ws.remove().unwrap();
    }

    #[test]
    fn copy_tree_keeps_links_modes_and_skips_specials() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("from");
        sample_tree(&from);
        let to = dir.path().join("to");
        let excl = vec![
            ".git".to_string(),
            "state/".to_string(),
            "**/*.pyc".to_string(),
        ];
        let stats = copy_tree(&from, &to, &excl).unwrap();
        assert_eq!(stats.files, 3, "{stats:?}");
        assert_eq!(stats.symlinks, 3);
        assert_eq!(stats.special_skipped, 1);
        assert_eq!(stats.excluded, 3);
        assert_eq!(stats.dirs, 2);
        assert_eq!(stats.bytes, 3 + 9 + 18);
        assert_eq!(fs::read(to.join("a/b/two.py")).unwrap(), b"print(2)\n");
        assert!(!to.join(".git").exists() && !to.join("state").exists());
        assert!(!to.join("a/b/cache.pyc").exists());
        assert!(!to.join("fifo").exists());
        assert_eq!(
            fs::read_link(to.join("link")).unwrap(),
            Path::new("a/one.txt")
        );
        assert_eq!(
            fs::read_link(to.join("abs-link")).unwrap(),
            Path::new("/etc/passwd")
        );
        assert!(fs::symlink_metadata(to.join("dangling"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(
            fs::metadata(to.join("run.sh"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o755
        );
        // Same content, same hash (the fifo is the one difference: drop it first).
        fs::remove_file(from.join("fifo")).unwrap();
        fs::remove_dir_all(from.join(".git")).unwrap();
        fs::remove_dir_all(from.join("state")).unwrap();
        fs::remove_file(from.join("a/b/cache.pyc")).unwrap();
        assert_eq!(tree_hash(&from).unwrap(), tree_hash(&to).unwrap());
    }

    #[test]
    fn copy_tree_modes_and_setuid() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("from");
        fs::create_dir_all(from.join("ro")).unwrap();
        fs::write(from.join("ro/f"), b"x").unwrap();
        fs::write(from.join("suid"), b"x").unwrap();
        fs::set_permissions(from.join("suid"), fs::Permissions::from_mode(0o4755)).unwrap();
        fs::set_permissions(from.join("ro"), fs::Permissions::from_mode(0o555)).unwrap();
        let to = dir.path().join("to");
        copy_tree(&from, &to, &[]).unwrap();
        assert_eq!(fs::read(to.join("ro/f")).unwrap(), b"x");
        assert_eq!(
            fs::metadata(to.join("ro")).unwrap().permissions().mode() & 0o7777,
            0o555
        );
        assert_eq!(
            fs::metadata(to.join("suid")).unwrap().permissions().mode() & 0o7777,
            0o755
        );
        // Removal opens read-only directories up.
        remove_tree(&to).unwrap();
        assert!(!to.exists());
        fs::set_permissions(from.join("ro"), fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn copy_tree_over_an_existing_tree() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("from");
        fs::create_dir_all(from.join("d")).unwrap();
        fs::write(from.join("d/f"), b"new").unwrap();
        fs::write(from.join("g"), b"g").unwrap();
        let to = dir.path().join("to");
        fs::create_dir_all(to.join("d")).unwrap();
        fs::write(to.join("d/old"), b"kept").unwrap();
        // A symlink in the way is replaced, not written through.
        let outside = dir.path().join("outside");
        fs::write(&outside, b"untouched").unwrap();
        symlink(&outside, to.join("d/f")).unwrap();
        let stats = copy_tree(&from, &to, &[]).unwrap();
        assert_eq!(stats.files, 2);
        assert_eq!(fs::read(to.join("d/f")).unwrap(), b"new");
        assert!(!fs::symlink_metadata(to.join("d/f"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read(&outside).unwrap(), b"untouched");
        assert_eq!(fs::read(to.join("d/old")).unwrap(), b"kept");
        // A directory where the source has a file is refused.
        fs::remove_file(to.join("g")).unwrap();
        fs::create_dir(to.join("g")).unwrap();
        let err = copy_tree(&from, &to, &[]).unwrap_err();
        assert!(
            matches!(err, WorkspaceError::WouldReplaceDirectory { .. }),
            "{err}"
        );
    }

    #[test]
    fn copy_tree_into_itself_and_bad_glob() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("rt");
        fs::create_dir_all(from.join("sub")).unwrap();
        fs::write(from.join("sub/f"), b"x").unwrap();
        let to = from.join("ws-src");
        let stats = copy_tree(&from, &to, &[]).unwrap();
        assert_eq!(stats.files, 1);
        assert!(to.join("sub/f").exists());
        assert!(!to.join("ws-src").exists());
        let err = copy_tree(&from, &dir.path().join("x"), &["a[".to_string()]).unwrap_err();
        assert!(err.to_string().contains("a["), "{err}");
        let err = copy_tree(&from.join("sub/f"), &dir.path().join("y"), &[]).unwrap_err();
        assert!(matches!(err, WorkspaceError::NotADirectory { .. }));
    }

    #[test]
    fn tree_hash_sensitivity() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("t");
        fs::create_dir_all(t.join("d")).unwrap();
        fs::write(t.join("d/f.txt"), b"hello world").unwrap();
        fs::write(t.join("g"), b"g").unwrap();
        symlink("d/f.txt", t.join("l")).unwrap();
        let base = tree_hash(&t).unwrap();
        assert!(base.starts_with("sha256:") && base.len() == 7 + 64);
        assert_eq!(tree_hash(&t).unwrap(), base);

        // mtime does not count.
        let f = fs::File::options()
            .write(true)
            .open(t.join("d/f.txt"))
            .unwrap();
        f.set_modified(std::time::SystemTime::UNIX_EPOCH).unwrap();
        drop(f);
        assert_eq!(tree_hash(&t).unwrap(), base);

        // Any byte of content.
        fs::write(t.join("d/f.txt"), b"hello World").unwrap();
        let h = tree_hash(&t).unwrap();
        assert_ne!(h, base);
        fs::write(t.join("d/f.txt"), b"hello world").unwrap();
        assert_eq!(tree_hash(&t).unwrap(), base);

        // A name.
        fs::rename(t.join("g"), t.join("h")).unwrap();
        assert_ne!(tree_hash(&t).unwrap(), base);
        fs::rename(t.join("h"), t.join("g")).unwrap();
        assert_eq!(tree_hash(&t).unwrap(), base);

        // The exec bit.
        fs::set_permissions(t.join("g"), fs::Permissions::from_mode(0o755)).unwrap();
        assert_ne!(tree_hash(&t).unwrap(), base);
        fs::set_permissions(t.join("g"), fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(tree_hash(&t).unwrap(), base);

        // A link target.
        fs::remove_file(t.join("l")).unwrap();
        symlink("d/f.txT", t.join("l")).unwrap();
        assert_ne!(tree_hash(&t).unwrap(), base);
        fs::remove_file(t.join("l")).unwrap();
        symlink("d/f.txt", t.join("l")).unwrap();
        assert_eq!(tree_hash(&t).unwrap(), base);

        // A file turned into a symlink with the same "content" differs by type.
        fs::remove_file(t.join("g")).unwrap();
        symlink("g", t.join("g")).unwrap();
        assert_ne!(tree_hash(&t).unwrap(), base);
        fs::remove_file(t.join("g")).unwrap();
        fs::write(t.join("g"), b"g").unwrap();
        assert_eq!(tree_hash(&t).unwrap(), base);

        // An empty directory counts.
        fs::create_dir(t.join("empty")).unwrap();
        assert_ne!(tree_hash(&t).unwrap(), base);
    }

    /// The one-reading pair is the two hashes read apart, whatever the excludes skip: a
    /// matching file, a matching directory and all it holds (deep too), a glob with a
    /// wildcard, a link, a file patched in under an excluded name, and a tree with no
    /// excludes at all.
    #[test]
    fn both_hashes_from_one_reading_are_the_two_read_apart() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("t");
        for d in ["src/a", "state/deep/er", "logs", "keep/state"] {
            fs::create_dir_all(t.join(d)).unwrap();
        }
        for (f, body) in [
            ("src/a/x.py", "x"),
            ("src/run.sh", "#!/bin/sh"),
            ("state/db", "live"),
            ("state/deep/er/wal", "w"),
            ("logs/1.log", "l"),
            (
                "keep/state/note",
                "kept: only a top-level state is excluded",
            ),
            ("cache.pyc", "c"),
            ("src/a/new.pyc", "patched in, excluded by name"),
        ] {
            fs::write(t.join(f), body).unwrap();
        }
        symlink("src/a/x.py", t.join("link")).unwrap();
        for excl in [
            vec![],
            vec!["state".to_string()],
            vec!["state/".into(), "logs".into(), "**/*.pyc".into()],
            vec!["./state".into(), "src/a".into()],
            vec!["nothing-matches".into()],
        ] {
            let (all, deployed) = tree_and_deploy_hashes(&t, &excl).unwrap();
            assert_eq!(all, tree_hash(&t).unwrap(), "{excl:?}");
            assert_eq!(deployed, deploy_tree_hash(&t, &excl).unwrap(), "{excl:?}");
        }
        // The excludes change the deployment hash only.
        let (a, d) = tree_and_deploy_hashes(&t, &["state".to_string()]).unwrap();
        let (a2, d2) = tree_and_deploy_hashes(&t, &[]).unwrap();
        assert_eq!(a, a2);
        assert_ne!(d, d2);
        assert!(tree_and_deploy_hashes(&t, &["[".to_string()]).is_err());
    }

    #[test]
    fn deploy_tree_hash_definition() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("t");
        fs::create_dir_all(t.join("d")).unwrap();
        fs::create_dir_all(t.join("state")).unwrap();
        fs::write(t.join("d/f.txt"), b"hello").unwrap();
        fs::write(t.join("run.sh"), b"#!/bin/sh\n").unwrap();
        fs::set_permissions(t.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        symlink("d/f.txt", t.join("l")).unwrap();
        fs::write(t.join("state/db"), b"live").unwrap();
        let excl = vec!["state".to_string()];
        let base = deploy_tree_hash(&t, &excl).unwrap();

        // The definition, written out independently.
        let mut h = Sha256::new();
        h.update(b"fork-deploy-tree-v1\0");
        let put = |h: &mut Sha256, b: &[u8]| {
            h.update((b.len() as u64).to_be_bytes());
            h.update(b);
        };
        h.update(b"F");
        put(&mut h, b"d/f.txt");
        h.update([0u8]);
        h.update(Sha256::digest(b"hello"));
        h.update(b"L");
        put(&mut h, b"l");
        put(&mut h, b"d/f.txt");
        h.update(b"F");
        put(&mut h, b"run.sh");
        h.update([1u8]);
        h.update(Sha256::digest(b"#!/bin/sh\n"));
        assert_eq!(base, format!("sha256:{}", hex::encode(h.finalize())));

        // Excluded paths, empty directories, other mode bits and FIFOs do not count.
        fs::write(t.join("state/db"), b"changed").unwrap();
        fs::create_dir_all(t.join("empty/deeper")).unwrap();
        fs::set_permissions(t.join("d/f.txt"), fs::Permissions::from_mode(0o600)).unwrap();
        nix::unistd::mkfifo(
            &t.join("fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        assert_eq!(deploy_tree_hash(&t, &excl).unwrap(), base);
        // Content, the exec bit and a link target do.
        fs::set_permissions(t.join("d/f.txt"), fs::Permissions::from_mode(0o700)).unwrap();
        assert_ne!(deploy_tree_hash(&t, &excl).unwrap(), base);
        fs::set_permissions(t.join("d/f.txt"), fs::Permissions::from_mode(0o644)).unwrap();
        fs::write(t.join("d/f.txt"), b"hellO").unwrap();
        assert_ne!(deploy_tree_hash(&t, &excl).unwrap(), base);
        fs::write(t.join("d/f.txt"), b"hello").unwrap();
        fs::remove_file(t.join("l")).unwrap();
        symlink("d/F.txt", t.join("l")).unwrap();
        assert_ne!(deploy_tree_hash(&t, &excl).unwrap(), base);
        // A copy (minus exclude) hashes alike.
        fs::remove_file(t.join("l")).unwrap();
        symlink("d/f.txt", t.join("l")).unwrap();
        let to = dir.path().join("to");
        copy_tree(&t, &to, &excl).unwrap();
        assert_eq!(deploy_tree_hash(&to, &[]).unwrap(), base);
    }

    #[test]
    fn remove_tree_does_not_follow_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let keep = dir.path().join("keep");
        fs::create_dir(&keep).unwrap();
        fs::write(keep.join("precious"), b"p").unwrap();
        let ws = dir.path().join("ws");
        fs::create_dir_all(ws.join("x")).unwrap();
        symlink(&keep, ws.join("x/to-keep")).unwrap();
        symlink(keep.join("precious"), ws.join("file-link")).unwrap();
        remove_tree(&ws).unwrap();
        assert!(!ws.exists());
        assert_eq!(fs::read(keep.join("precious")).unwrap(), b"p");
        remove_tree(&ws).unwrap();
    }
}
