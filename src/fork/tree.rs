//! Reading a tree someone else may be changing (the parent's source and tools, which an
//! unprivileged owner of the runtime can rename and relink at any moment) one directory
//! descriptor at a time: every directory is reopened beneath the tree's root descriptor
//! without following any link ([`open_dir_beneath`]), every entry is looked at with
//! `fstatat(AT_SYMLINK_NOFOLLOW)` relative to its directory's descriptor, and every file is
//! opened `O_NOFOLLOW | O_NONBLOCK` relative to it and checked on the opened descriptor
//! (`fstat`): an entry swapped for a link, a FIFO or a device between the look and the open
//! is never followed, never blocks, and is never read. [`super::workspace`]'s copies and
//! hashes read their source through here. For a root fork on another user's tree, each
//! file is read and each directory entered only as that user could ([`super::owner`]):
//! directories are then reopened one component at a time and checked on the way
//! ([`Tree::dir`]).

use super::error::WorkspaceError;
use super::owner::{DirAccess, Owner};
use crate::fsx::FsxError;
use crate::ioerr::IoError;
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use nix::dir::Dir;
use nix::fcntl::{openat, readlinkat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode, SFlag};
use sha2::{Digest, Sha256};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The glob set of a manifest's `exclude` patterns, matched against paths relative to a
/// tree's root (`*` within one component, `**` across them; a trailing `/` and a leading
/// `./` are dropped).
pub fn build_excludes(exclude: &[String]) -> Result<GlobSet, WorkspaceError> {
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

/// One entry of a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir { mode: u32 },
    File { mode: u32 },
    Link(OsString),
    Fifo,
    Socket,
    Char,
    Block,
}

/// One entry of [`Tree::scan`]: its path relative to the root, its kind, and for a
/// regular file the sha256 of its contents.
pub type Scanned = (PathBuf, Node, Option<[u8; 32]>);

/// A tree's root, opened.
pub struct Tree {
    root: OwnedFd,
    shown: PathBuf,
    /// Whose reading a root-run fork holds to: the owner of the tree's root (`open`) or of
    /// the trusted directory above it (`beneath`), when that is another user.
    owner: Option<Owner>,
}

fn io(action: &'static str, path: &Path, e: impl Into<std::io::Error>) -> WorkspaceError {
    IoError::new(action, path, e.into()).into()
}

fn fsx_err(path: &Path, e: crate::fsx::FsxError) -> WorkspaceError {
    match e {
        crate::fsx::FsxError::Symlink { component } => WorkspaceError::Link {
            path: path.to_path_buf(),
            component,
        },
        crate::fsx::FsxError::WrongType { .. } => WorkspaceError::NotADirectory {
            path: path.to_path_buf(),
        },
        other => io("open", path, std::io::Error::other(other)),
    }
}

impl Tree {
    /// The directory `path` (its last component must not be a link; the directories above
    /// it are the caller's).
    pub fn open(path: &Path) -> Result<Tree, WorkspaceError> {
        let root = crate::fsx::open_dir(path, false).map_err(|e| fsx_err(path, e))?;
        Ok(Tree {
            root,
            shown: path.to_path_buf(),
            owner: None,
        })
    }

    /// [`Tree::open`] for a tree a user hands fork to put in a sandbox (`--workspace`): no
    /// component of `path` a link, and as root, read only as far as its owner could.
    pub fn open_users(path: &Path) -> Result<Tree, WorkspaceError> {
        let root = open_dir_no_links(path).map_err(|e| fsx_err(path, e))?;
        let owner = super::owner::Owner::of_dir(&root).map_err(|e| io("stat", path, e))?;
        Ok(Tree {
            root,
            shown: path.to_path_buf(),
            owner,
        })
    }

    /// The directory `rel` beneath the trusted directory `root`, no component of `rel` a
    /// link (the parent's source or tools beneath its runtime directory). Held to an
    /// owner, `root` and every directory of `rel` on the way must be searchable by it.
    pub fn beneath(root: &Path, rel: &Path) -> Result<Tree, WorkspaceError> {
        // No link in any component: the runtime's path is canonical, so a link there was
        // swapped in since (its owner's doing), and would hand another tree, or another
        // owner, to what follows.
        let r = open_dir_no_links(root).map_err(|e| fsx_err(root, e))?;
        let owner = super::owner::Owner::of_dir(&r).map_err(|e| io("stat", root, e))?;
        let shown = root.join(rel);
        // The tree's own root is checked for listing when it is read ([`Tree::dir`]).
        let fd = open_dir_beneath_as(owner.as_ref(), &r, root, rel)?;
        Ok(Tree {
            root: fd,
            shown,
            owner,
        })
    }

    pub fn path(&self) -> &Path {
        &self.shown
    }

    /// `fstat` of the root.
    pub fn stat(&self) -> Result<FileStat, WorkspaceError> {
        fstat(&self.root).map_err(|e| io("stat", &self.shown, e))
    }

    /// The directory `rel` of the tree, reopened beneath the root, to be listed. Held to
    /// an owner, it is reopened one component at a time and refused
    /// ([`WorkspaceError::Unreadable`], naming it) unless the owner may list and search it
    /// and search every directory on the way: checked again on each reopening, so a
    /// directory the owner renames into the way meanwhile (one it could not enter) is
    /// refused as well.
    pub fn dir(&self, rel: &Path) -> Result<OwnedFd, WorkspaceError> {
        let opened = |shown: &Path, e: FsxError| io("open", shown, std::io::Error::other(e));
        match &self.owner {
            None => open_dir_beneath(&self.root, rel).map_err(|e| opened(&self.shown.join(rel), e)),
            Some(o) => open_as(o, &self.root, &self.shown, rel, DirAccess::List, &opened),
        }
    }

    /// The entries of the directory `dir` (= `rel`), not following links, minus what
    /// `excludes` matches (counted in `excluded`), in readdir order.
    pub fn entries(
        &self,
        dir: &OwnedFd,
        rel: &Path,
        excludes: &GlobSet,
        excluded: &mut u64,
    ) -> Result<Vec<(OsString, FileStat, Node)>, WorkspaceError> {
        let shown = self.shown.join(rel);
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let mut d = Dir::openat(dir, ".", flags, Mode::empty())
            .map_err(|e| io("read directory", &shown, e))?;
        let mut names = Vec::new();
        for e in d.iter() {
            let e = e.map_err(|e| io("read directory", &shown, e))?;
            let n = OsStr::from_bytes(e.file_name().to_bytes());
            if n != "." && n != ".." {
                names.push(n.to_os_string());
            }
        }
        let mut out = Vec::new();
        for name in names {
            if excludes.is_match(rel.join(&name)) {
                *excluded += 1;
                continue;
            }
            let st = fstatat(dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(|e| io("stat", &shown.join(&name), e))?;
            let mode = st.st_mode & 0o7777;
            let node = match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
                SFlag::S_IFDIR => Node::Dir { mode },
                SFlag::S_IFREG => Node::File { mode },
                SFlag::S_IFLNK => Node::Link(
                    readlinkat(dir, name.as_os_str())
                        .map_err(|e| io("read link", &shown.join(&name), e))?,
                ),
                SFlag::S_IFIFO => Node::Fifo,
                SFlag::S_IFSOCK => Node::Socket,
                SFlag::S_IFCHR => Node::Char,
                _ => Node::Block,
            };
            out.push((name, st, node));
        }
        Ok(out)
    }

    /// Opens the regular file `name` of `dir` for reading, checked on its descriptor: a
    /// link, FIFO, device or directory swapped in since it was looked at is refused.
    pub fn open_file(
        &self,
        dir: &OwnedFd,
        rel: &Path,
        name: &OsStr,
    ) -> Result<File, WorkspaceError> {
        let shown = self.shown.join(rel).join(name);
        let flags = OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC;
        let fd = openat(dir, name, flags, Mode::empty()).map_err(|e| io("open", &shown, e))?;
        let st = fstat(&fd).map_err(|e| io("stat", &shown, e))?;
        if st.st_mode & SFlag::S_IFMT.bits() != SFlag::S_IFREG.bits() {
            return Err(io(
                "read",
                &shown,
                std::io::Error::other("not a regular file any more (swapped while reading)"),
            ));
        }
        let file = File::from(fd);
        if let Some(Err(reason)) = self.owner.as_ref().map(|o| o.check_read(&file, &st)) {
            return Err(WorkspaceError::Unreadable {
                path: shown,
                reason,
            });
        }
        Ok(file)
    }

    /// Every entry (relative path and kind; for regular files also the sha256 of the
    /// contents, read through the checked descriptor), sorted by path bytes.
    pub fn scan(&self, excludes: &GlobSet) -> Result<Vec<Scanned>, WorkspaceError> {
        self.scan_knowing(excludes, &|_, _| None)
    }

    /// [`Tree::scan`], but a regular file for which `known` (given its path and its
    /// `fstatat`) gives a digest is not read: that digest stands for its contents.
    pub fn scan_knowing(
        &self,
        excludes: &GlobSet,
        known: &dyn Fn(&Path, &FileStat) -> Option<[u8; 32]>,
    ) -> Result<Vec<Scanned>, WorkspaceError> {
        let mut out = Vec::new();
        let mut stack = vec![PathBuf::new()];
        let mut excluded = 0;
        while let Some(rel) = stack.pop() {
            let dir = self.dir(&rel)?;
            for (name, st, node) in self.entries(&dir, &rel, excludes, &mut excluded)? {
                let path = rel.join(&name);
                let digest = match node {
                    Node::File { .. } => match known(&path, &st) {
                        Some(d) => Some(d),
                        None => {
                            let f = self.open_file(&dir, &rel, &name)?;
                            Some(digest(f, &self.shown.join(&path))?)
                        }
                    },
                    Node::Dir { .. } => {
                        stack.push(path.clone());
                        None
                    }
                    _ => None,
                };
                out.push((path, node, digest));
            }
        }
        out.sort_by(|a, b| a.0.as_os_str().as_bytes().cmp(b.0.as_os_str().as_bytes()));
        Ok(out)
    }
}

/// [`open_dir_beneath`] of `rel` beneath `dir` (named `dir_shown`), for a reading held to
/// `owner` when it is `Some` (a root fork on another user's tree): `dir` and every
/// directory of `rel`, the last one included, must then be searchable by the owner
/// ([`WorkspaceError::Unreadable`] names the one that is not); whoever lists the last one
/// checks that too. A link in `rel` is [`WorkspaceError::Link`].
pub fn open_dir_beneath_as(
    owner: Option<&Owner>,
    dir: &OwnedFd,
    dir_shown: &Path,
    rel: &Path,
) -> Result<OwnedFd, WorkspaceError> {
    match owner {
        None => open_dir_beneath(dir, rel).map_err(|e| fsx_err(&dir_shown.join(rel), e)),
        Some(o) => open_as(o, dir, dir_shown, rel, DirAccess::Search, &fsx_err),
    }
}

/// Refuses the directory open at `dir` (named `shown`) unless `owner` (when `Some`) may
/// list and search it ([`Owner::check_dir`]): what a reading that lists a directory of
/// another user's tree checks first.
pub fn check_listable(
    owner: Option<&Owner>,
    dir: BorrowedFd<'_>,
    shown: &Path,
) -> Result<(), WorkspaceError> {
    let Some(o) = owner else {
        return Ok(());
    };
    let st = fstat(dir).map_err(|e| io("stat", shown, e))?;
    o.check_dir(dir, &st, DirAccess::List)
        .map_err(|reason| WorkspaceError::Unreadable {
            path: shown.to_path_buf(),
            reason,
        })
}

/// Opens the directory `rel` beneath `start` (named `start_shown`) as `owner` would reach
/// it, one component at a time, none of them a link ([`open_dir_beneath`] each): `start`
/// and every directory on the way must be searchable by the owner and the last one
/// allowed `last` ([`Owner::check_dir`]: mode bits and ACL, as the kernel decides), else
/// [`WorkspaceError::Unreadable`] names the directory. `on_err` tells an open that failed.
fn open_as(
    owner: &Owner,
    start: &OwnedFd,
    start_shown: &Path,
    rel: &Path,
    last: DirAccess,
    on_err: &dyn Fn(&Path, FsxError) -> WorkspaceError,
) -> Result<OwnedFd, WorkspaceError> {
    let check = |fd: &OwnedFd, shown: &Path, access: DirAccess| {
        let st = fstat(fd).map_err(|e| io("stat", shown, e))?;
        owner
            .check_dir(fd.as_fd(), &st, access)
            .map_err(|reason| WorkspaceError::Unreadable {
                path: shown.to_path_buf(),
                reason,
            })
    };
    let parts: Vec<&OsStr> = rel
        .components()
        .filter(|c| !matches!(c, std::path::Component::CurDir))
        .map(|c| c.as_os_str())
        .collect();
    let access = |i: usize| {
        if i == parts.len() {
            last
        } else {
            DirAccess::Search
        }
    };
    check(start, start_shown, access(0))?;
    let mut cur = start.try_clone().map_err(|e| io("open", start_shown, e))?;
    let mut shown = start_shown.to_path_buf();
    for (i, part) in parts.iter().enumerate() {
        shown.push(part);
        // One component: `..`, an absolute path and a link are refused there.
        cur = open_dir_beneath(&cur, Path::new(part)).map_err(|e| on_err(&shown, e))?;
        check(&cur, &shown, access(i + 1))?;
    }
    Ok(cur)
}

/// The sha256 of what `f` holds.
fn digest(mut f: File, shown: &Path) -> Result<[u8; 32], WorkspaceError> {
    let mut h = Sha256::new();
    let mut buf = [0u8; crate::fsx::READ_BUF];
    loop {
        let n = f.read(&mut buf).map_err(|e| io("read", shown, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().into())
}

/// The directory `path`, no component of it a link (from `/` when absolute, else from the
/// working directory), as [`open_dir_beneath`] opens one.
pub fn open_dir_no_links(path: &Path) -> Result<OwnedFd, FsxError> {
    let (start, rel) = match path.strip_prefix("/") {
        Ok(rel) => (Path::new("/"), rel),
        Err(_) => (Path::new("."), path),
    };
    let top = crate::fsx::open_dir(start, true)?;
    open_dir_beneath(&top, rel)
}

/// Opens the directory `rel` beneath the directory `dir` (`""` is `dir` itself), reached
/// without following any symbolic link and without leaving `dir` (`openat2` with
/// `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, or a per-component `O_NOFOLLOW` walk where
/// `openat2` is refused). No component limit: the trees read this way are fork's inputs.
pub fn open_dir_beneath(dir: impl AsFd, rel: &Path) -> Result<OwnedFd, FsxError> {
    use crate::fsx::{errno_error, expect_kind, openat2_unavailable};
    use nix::errno::Errno;
    use nix::fcntl::{OpenHow, ResolveFlag};
    use std::path::Component;
    let dir = dir.as_fd();
    let shown = rel.display().to_string();
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut parts = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(p) => parts.push(p),
            Component::CurDir => {}
            _ => {
                return Err(FsxError::BadPath {
                    rel: shown,
                    reason: "it is absolute or contains `..`",
                })
            }
        }
    }
    let Some(first) = parts.first() else {
        return dir.try_clone_to_owned().map_err(|source| FsxError::Io {
            op: "dup",
            component: ".".into(),
            source,
        });
    };
    let joined: PathBuf = parts.iter().collect();
    let how = OpenHow::new()
        .flags(flags)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
    let refused = match nix::fcntl::openat2(dir, &joined, how) {
        Ok(fd) => return Ok(fd),
        Err(e @ (Errno::ELOOP | Errno::ENOTDIR)) => Some(e),
        Err(e) if !openat2_unavailable(e) => return Err(errno_error("openat2", &shown, e)),
        Err(_) => None,
    };
    // The walk (where openat2 is refused, or to name the link openat2 found).
    let mut cur = dir.try_clone_to_owned().map_err(|source| FsxError::Io {
        op: "dup",
        component: ".".into(),
        source,
    })?;
    let mut walked = PathBuf::new();
    for part in std::iter::once(first).chain(&parts[1..]) {
        walked.push(part);
        let at = walked.display().to_string();
        let st = nix::sys::stat::fstatat(&cur, *part, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| errno_error("fstatat", &at, e))?;
        expect_kind(&st, &at, "directory")?;
        cur = nix::fcntl::openat(&cur, *part, flags, Mode::empty())
            .map_err(|e| errno_error("openat", &at, e))?;
    }
    match refused {
        Some(e) => Err(errno_error("openat2", &shown, e)),
        None => Ok(cur),
    }
}
