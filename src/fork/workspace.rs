//! The run's workspace: its layout, the copy of the source tree and the tool registry,
//! and its removal (the tree hashes are `hashes.rs`'s, re-exported here).
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
//! blocks until written, elsewhere it is an in-kernel copy. A listed copy
//! ([`copy_tree_beneath_listed`]) reads, hashes and writes each file instead, and lists
//! what it wrote. Permission bits are kept
//! except set-user-ID and set-group-ID, which are dropped; ownership is not kept (the copy
//! belongs to the supervisor). Devices, FIFOs and sockets are skipped and counted.

use super::tree::{build_excludes, Node, Tree};
use crate::ioerr::{IoContext, IoError};
use sha2::{Digest, Sha256};
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The workspace's subdirectories, in the order they are created.
pub const SUBDIRS: [&str; 5] = ["src", "state", "tools", "reports", "home"];

pub use super::error::WorkspaceError;
use super::hashes::Written;
pub use super::hashes::{
    deploy_tree_hash, tree_and_deploy_hashes, tree_and_deploy_hashes_after, tree_hash,
    tree_hash_beneath, tree_hash_excluding, TreeListing,
};

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

/// Copies the tree `from` into the directory `to` (created if missing). `exclude` holds
/// globs matched against paths relative to `from` (`*` stays within one path component,
/// `**` crosses them: `.git`, `state`, `**/*.pyc`, `build/**`); an excluded directory is
/// skipped with all its contents. Symlinks are copied as symlinks, never followed;
/// permission bits are kept (minus set-user-ID/set-group-ID); special files are skipped
/// and counted. If `to` lies inside `from`, it is not copied into itself. `to` may already
/// hold a tree: directories are merged, files and symlinks in the way are replaced (never
/// written through), and a directory in the way of a file is an error.
pub fn copy_tree(from: &Path, to: &Path, exclude: &[String]) -> Result<CopyStats, WorkspaceError> {
    copy_from(&Tree::open(from)?, to, exclude, None)
}

/// [`copy_tree`] of a tree a user hands fork for a sandbox (`fork run --workspace`): no
/// component of `from` a link, and as root, only what the tree's owner could read
/// ([`super::owner`]).
pub fn copy_users_tree(
    from: &Path,
    to: &Path,
    exclude: &[String],
) -> Result<CopyStats, WorkspaceError> {
    // The links the user wrote above the directory itself are resolved now (the last
    // component, as `copy_tree` has it, must not be one); from here on none is followed.
    let from = match (from.parent(), from.file_name()) {
        (Some(dir), Some(name)) if !dir.as_os_str().is_empty() => dir
            .canonicalize()
            .map_err(|e| IoError::new("resolve", dir, e))?
            .join(name),
        _ => from.to_path_buf(),
    };
    copy_from(&Tree::open_users(&from)?, to, exclude, None)
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
    copy_from(&Tree::beneath(root, rel)?, to, exclude, None)
}

/// [`copy_tree_beneath`] into `to`, a directory that must not exist or be empty, and the
/// [`TreeListing`] of the copy it made, taken from the bytes it wrote as it wrote them:
/// [`TreeListing::of`] the copy without reading it a second time.
pub fn copy_tree_beneath_listed(
    root: &Path,
    rel: &Path,
    to: &Path,
    exclude: &[String],
) -> Result<(CopyStats, TreeListing), WorkspaceError> {
    let not_empty = || WorkspaceError::NotEmpty {
        path: to.to_path_buf(),
    };
    match fs::read_dir(to) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(not_empty());
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(IoError::new("read directory", to, e).into()),
    }
    let mut listed = Listed::default();
    let stats = copy_from(&Tree::beneath(root, rel)?, to, exclude, Some(&mut listed))?;
    Ok((stats, TreeListing::of_copy(listed.entries, listed.written)))
}

/// Copies `from` into `out`, the sha256 of the bytes written when `hash` is set (a read,
/// hash and write loop; otherwise `std::io::copy`, which lets the kernel copy).
fn copy_file(
    from: &mut fs::File,
    out: &mut fs::File,
    hash: bool,
    buf: &mut Vec<u8>,
) -> io::Result<(u64, Option<[u8; 32]>)> {
    use std::io::{Read, Write};
    if !hash {
        return Ok((io::copy(from, out)?, None));
    }
    buf.resize(crate::fsx::READ_BUF, 0);
    let (mut h, mut n) = (Sha256::new(), 0u64);
    loop {
        let got = match from.read(buf) {
            Ok(0) => break,
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..got]);
        out.write_all(&buf[..got])?;
        n += got as u64;
    }
    Ok((n, Some(h.finalize().into())))
}

/// What a listed copy wrote: its entries as [`Tree::scan`] of the copy would give them
/// (in walk order: [`TreeListing`] sorts them), and each file's identity once written.
#[derive(Default)]
struct Listed {
    entries: Vec<crate::fork::tree::Scanned>,
    written: std::collections::HashMap<PathBuf, Written>,
}

/// The copy itself; with `listed`, what it wrote is listed there.
fn copy_from(
    tree: &Tree,
    to: &Path,
    exclude: &[String],
    mut listed: Option<&mut Listed>,
) -> Result<CopyStats, WorkspaceError> {
    let mut buf = Vec::new();
    // A listed copy goes into an empty destination: it never merges into what is there.
    let merge = listed.is_none();
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
                    let made = || fs::DirBuilder::new().mode(0o700).create(&dst);
                    match made() {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && !merge => {
                            return Err(IoError::new("create directory", &dst, collided(e)).into())
                        }
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                            if clear_dest(&dst, true)? {
                                // Merge into the existing directory; its mode is set at
                                // the end.
                                fs::set_permissions(&dst, fs::Permissions::from_mode(0o700))
                                    .ctx("set permissions on", &dst)?;
                            } else {
                                made().ctx("create directory", &dst)?;
                            }
                        }
                        Err(e) => return Err(IoError::new("create directory", &dst, e).into()),
                    }
                    stats.dirs += 1;
                    dir_modes.push((dst.clone(), mode & 0o1777));
                    if let Some(l) = listed.as_deref_mut() {
                        l.entries.push((
                            rel.clone(),
                            Node::Dir {
                                mode: mode & 0o1777,
                            },
                            None,
                        ));
                    }
                    stack.push((rel, dst));
                }
                Node::File { mode } => {
                    let mut from = tree.open_file(&dir, &rel_dir, &name)?;
                    let create = || {
                        fs::OpenOptions::new()
                            .write(true)
                            .create_new(true)
                            .mode(0o600)
                            .open(&dst)
                    };
                    let mut out = or_after_clearing(create, &dst, "create", merge)?;
                    // copy_file_range(2): a reflink where the filesystem can (unless the
                    // bytes are hashed on their way).
                    let (n, digest) = copy_file(&mut from, &mut out, listed.is_some(), &mut buf)
                        .ctx("copy", &tree.path().join(&rel))?;
                    out.set_permissions(fs::Permissions::from_mode(mode & 0o1777))
                        .ctx("set permissions on", &dst)?;
                    stats.files += 1;
                    stats.bytes += n;
                    if let Some(l) = listed.as_deref_mut() {
                        // Its identity after the last change the copy made (the mode).
                        let st = nix::sys::stat::fstat(&out)
                            .map_err(|e| IoError::new("stat", &dst, e.into()))?;
                        l.written.insert(rel.clone(), Written::of(&st));
                        l.entries.push((
                            rel,
                            Node::File {
                                mode: mode & 0o1777,
                            },
                            digest,
                        ));
                    }
                }
                Node::Link(target) => {
                    let link = || std::os::unix::fs::symlink(&target, &dst);
                    or_after_clearing(link, &dst, "create symlink", merge)?;
                    stats.symlinks += 1;
                    if let Some(l) = listed.as_deref_mut() {
                        l.entries.push((rel, Node::Link(target), None));
                    }
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

/// An entry already there where a copy into an empty destination (a listed copy's) makes
/// one: two of the source's entries landed on one name (a filesystem that folds case).
fn collided(e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("another entry of the source was copied to this name (does the workspace's filesystem fold case?): {e}"),
    )
}

/// Runs `make`, a creation that refuses an existing entry at `dst`. Only when something is
/// already there (a copy merged into a tree that holds one) is it cleared, as
/// [`clear_dest`] does, and `make` run again: into an empty destination, as a fresh
/// workspace is, a copy costs one call per entry, not a `stat` before each.
/// Without `merge` (a copy into an empty destination) nothing is cleared: an entry there
/// is an error ([`collided`]).
fn or_after_clearing<T>(
    make: impl Fn() -> io::Result<T>,
    dst: &Path,
    action: &'static str,
    merge: bool,
) -> Result<T, WorkspaceError> {
    match make() {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && !merge => {
            Err(IoError::new(action, dst, collided(e)).into())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            clear_dest(dst, false)?;
            Ok(make().ctx(action, dst)?)
        }
        made => Ok(made.ctx(action, dst)?),
    }
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

/// Deletes `path` and everything under it. Idempotent (a missing path is fine). Never
/// follows symlinks and never crosses into another filesystem: a mount point left inside
/// (say by a crashed sandbox) is an error, so a bind mount of host files is never emptied.
/// Directories the successor made unreadable or unwritable are opened up (mode 0700)
/// before being emptied, through a descriptor of the directory itself, never by name
/// ([`crate::fsx::open_dir_checked`]); see [`remove_dir_at`]. The directories above
/// `path` are the caller's.
pub fn remove_tree(path: &Path) -> Result<(), WorkspaceError> {
    use nix::errno::Errno;
    use nix::fcntl::AtFlags;
    use nix::unistd::{unlinkat, UnlinkatFlags};
    use std::os::fd::AsFd;
    let (parent, name) = match (path.parent(), path.file_name()) {
        (Some(p), Some(n)) if p.as_os_str().is_empty() => (Path::new("."), n),
        (Some(p), Some(n)) => (p, n),
        _ => {
            return Err(IoError::new(
                "remove",
                path,
                io::Error::other("not a path to remove: it names no entry of a directory"),
            )
            .into())
        }
    };
    let parent_fd = match crate::fsx::open_dir(parent, true) {
        Ok(fd) => fd,
        // A missing parent is a missing path: removing it is done (`open_dir` says ENOENT
        // as an I/O error).
        Err(crate::fsx::FsxError::Missing { .. }) => return Ok(()),
        Err(crate::fsx::FsxError::Io { source, .. })
            if source.kind() == io::ErrorKind::NotFound =>
        {
            return Ok(())
        }
        Err(e) => return Err(IoError::new("open", parent, io::Error::other(e)).into()),
    };
    let st = match nix::sys::stat::fstatat(&parent_fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(IoError::new("stat", path, e.into()).into()),
    };
    if !crate::fsx::is_directory(&st) {
        return unlinkat(&parent_fd, name, UnlinkatFlags::NoRemoveDir)
            .map_err(|e| IoError::new("remove", path, e.into()).into());
    }
    let shown = path.display().to_string();
    let dir = crate::fsx::open_dir_checked(parent_fd.as_fd(), name, &st, true, &shown)
        .map_err(|e| IoError::new("open", path, io::Error::other(e)))?;
    remove_dir_at(parent_fd.as_fd(), name, dir.as_fd(), path)
}

/// Empties the directory open at `dir` (named `shown` in messages) and then removes it
/// from `parent`, where it is the entry `name`, only if `name` still names it (device and
/// inode): a directory moved away meanwhile is left where it went, emptied, and what now
/// stands at `name` is left alone ([`WorkspaceError::Moved`]). The emptying goes through
/// descriptors only ([`crate::fsx::walk_tree`]): each directory entered beneath its parent
/// without following a link and checked to be the one looked at, opened up (mode 0700)
/// through its own descriptor when its owner lacks read, write or search, each entry
/// removed by `unlinkat` relative to its directory. It never crosses into another
/// filesystem ([`WorkspaceError::MountPoint`]).
pub fn remove_dir_at(
    parent: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::OsStr,
    dir: std::os::fd::BorrowedFd<'_>,
    shown: &Path,
) -> Result<(), WorkspaceError> {
    use nix::fcntl::AtFlags;
    use nix::unistd::{unlinkat, UnlinkatFlags};
    let here = nix::sys::stat::fstat(dir).map_err(|e| IoError::new("stat", shown, e.into()))?;
    // Depth first, relative to each directory's own descriptor (fsx::walk_tree): a tree
    // nested deeper than PATH_MAX is removed like any other.
    let mut mount = None;
    crate::fsx::walk_tree(
        dir,
        shown,
        true,
        |dir, name, st| {
            if !crate::fsx::is_directory(st) {
                unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)?;
                return Ok(false);
            }
            if st.st_dev != here.st_dev {
                mount = Some(shown.join(name));
                return Err(io::Error::other("a mount point"));
            }
            Ok(true)
        },
        |parent, name| Ok(unlinkat(parent, name, UnlinkatFlags::RemoveDir)?),
    )
    .map_err(|e| match mount.take() {
        Some(path) => WorkspaceError::MountPoint { path },
        None => IoError::new("remove", shown, io::Error::other(e.to_string())).into(),
    })?;
    // Only an empty directory goes by rmdir, so between this check and the removal nothing
    // but an empty directory swapped in could be removed instead.
    match nix::sys::stat::fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) if (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino) => {
            unlinkat(parent, name, UnlinkatFlags::RemoveDir)
                .map_err(|e| IoError::new("remove directory", shown, e.into()).into())
        }
        Ok(_) | Err(nix::errno::Errno::ENOENT) => Err(WorkspaceError::Moved {
            path: shown.to_path_buf(),
        }),
        Err(e) => Err(IoError::new("stat", shown, e.into()).into()),
    }
}

#[cfg(test)]
#[path = "workspace_tests.rs"]
mod tests;
