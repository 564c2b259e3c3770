//! The protected tree at run time: every path the manifest's `protected` globs name
//! (tests, benchmarks, the judge, fork.toml) is served to every sandbox of the evaluation
//! read-only, from one copy of the parent's tree, and checked after every run.
//!
//! - [`snapshot`] (once per evaluation): the parent's protected paths, read from the same
//!   source tree the sides are copied from (never following a link, `exclude` left out as
//!   the sides' copies leave it out), copied into `<staging>/protected` (a tmpfs of its own
//!   when fork runs as root, so the sandbox's mount table names no host path), with a
//!   manifest (`<staging>/protected.json`: path -> kind, sha256, size, mode, link target)
//!   and the binds planned by [`plan_binds`].
//! - [`binds`]: the sandbox's read-only binds of that copy over the workspace
//!   (`/tmp/successor/src/<path>`): a pattern `dir/**` binds the whole directory (nothing
//!   can be changed, removed or added in it), an exact path binds that file or directory,
//!   any other glob (`**/*.lock`) binds each matching file that exists.
//! - [`check`] (after each run, before its results are read): the protected paths as the
//!   subject's workspace shows them (new files matching a pattern included) and the copy
//!   the sandboxes were served, against the manifest. Any difference is a
//!   [`ProtectedChange`], evidence that decides REJECT naming the file. The mounts being
//!   read-only, this should never fire; it is defence in depth, and the only guard of
//!   paths a glob names that did not exist in the parent.

use super::{internal, EvaluateError};
use crate::fork::owner::Owner;
use crate::fork::WorkspaceError;
use crate::patch::gates::protected_globs;
use crate::sandbox::spec::RoBind;
use crate::verdict::decide::{ChangeKind, ProtectedChange};
use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};
use nix::fcntl::OFlag;
use nix::sys::stat::{fstatat, Mode, SFlag};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The copy served to the sandboxes, beneath the staging directory.
const COPY_DIR: &str = "protected";
/// Its manifest, beneath the staging directory (outside the copy).
const MANIFEST: &str = "protected.json";
/// Entries a scan visits at most, and how deep it goes (a hostile workspace is bounded).
const MAX_ENTRIES: usize = 200_000;
const MAX_DEPTH: usize = 128;

/// One protected path as the parent has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entry {
    File {
        /// Empty when a scan did not need the content (its size already differed).
        sha256: String,
        size: u64,
        mode: u32,
    },
    Dir {
        mode: u32,
    },
    Symlink {
        target: String,
    },
    /// A FIFO, socket or device.
    Other,
}

/// What the snapshot holds: the patterns, the planned binds and every protected entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub patterns: Vec<String>,
    /// `(relative path, is a directory)`, each served read-only from the copy.
    pub binds: Vec<(String, bool)>,
    pub entries: BTreeMap<String, Entry>,
}

fn glob(p: &str) -> Result<Glob, String> {
    GlobBuilder::new(p)
        .literal_separator(true)
        .build()
        .map_err(|e| format!("pattern `{p}` is not a valid glob: {e}"))
}

fn glob_set<'a>(
    patterns: impl IntoIterator<Item = &'a String>,
    trim: bool,
) -> Result<GlobSet, String> {
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        let t = if trim {
            let t = p.trim_end_matches('/');
            t.strip_prefix("./").unwrap_or(t)
        } else {
            p.as_str()
        };
        b.add(glob(t)?);
    }
    b.build().map_err(|e| e.to_string())
}

/// The globs the patterns stand for, normalized ([`protected_globs`]: `./judge/` is
/// `judge` and `judge/**`).
fn globs(patterns: &[String]) -> Vec<String> {
    protected_globs(patterns)
        .into_iter()
        .map(|(g, _)| g)
        .collect()
}

fn has_meta(s: &str) -> bool {
    crate::patch::gates::has_glob_syntax(s)
}

/// The literal directory part of a pattern before its first glob component
/// (`tests/**` -> `tests`, `fork.toml` -> `fork.toml`, `**/*.lock` -> ``).
fn literal_prefix(p: &str) -> String {
    p.split('/')
        .take_while(|c| !has_meta(c))
        .collect::<Vec<_>>()
        .join("/")
}

/// Which paths to serve read-only, from the patterns and the parent's protected entries:
/// `dir/**` binds `dir` (when it is a directory), an exact path binds itself (a file or a
/// directory), any other glob binds each matching regular file. Nothing nested in a bound
/// directory is bound again. `kind_of(path)` says what the parent has at a path (None:
/// nothing, or a symlink, which is never bound: the post-run check covers it).
pub fn plan_binds(
    patterns: &[String],
    entries: &BTreeMap<String, Entry>,
    kind_of: impl Fn(&str) -> Option<bool>,
) -> Vec<(String, bool)> {
    let mut dirs: Vec<String> = Vec::new();
    let mut files: Vec<String> = Vec::new();
    for t in &globs(patterns) {
        if let Some(d) = t
            .strip_suffix("/**")
            .filter(|d| !d.is_empty() && !has_meta(d))
        {
            if kind_of(d) == Some(true) {
                dirs.push(d.to_string());
            }
        } else if !has_meta(t) {
            match kind_of(t) {
                Some(true) => dirs.push(t.to_string()),
                Some(false) => files.push(t.to_string()),
                None => {}
            }
        } else if let Ok(g) = glob(t) {
            let m = g.compile_matcher();
            files.extend(
                entries
                    .iter()
                    .filter(|(rel, e)| matches!(e, Entry::File { .. }) && m.is_match(rel))
                    .map(|(rel, _)| rel.clone()),
            );
        }
    }
    let within = |rel: &str, d: &str| {
        rel.len() > d.len() && rel.starts_with(d) && rel.as_bytes()[d.len()] == b'/'
    };
    dirs.sort();
    dirs.dedup();
    let outer: Vec<String> = dirs
        .iter()
        .filter(|d| !dirs.iter().any(|o| within(d, o)))
        .cloned()
        .collect();
    files.sort();
    files.dedup();
    let mut out: Vec<(String, bool)> = outer.iter().map(|d| (d.clone(), true)).collect();
    out.extend(
        files
            .into_iter()
            .filter(|f| !outer.iter().any(|d| within(f, d)))
            .map(|f| (f, false)),
    );
    out
}

/// A scan of one tree for the protected entries beneath it, copying each one as it reads
/// it when it has somewhere to copy them ([`snapshot`]).
struct Scan<'a> {
    protected: &'a GlobSet,
    exclude: &'a GlobSet,
    /// Literal prefixes of the patterns ("" descends everywhere).
    prefixes: Vec<String>,
    /// Whether to hash a file (its path and size); a copied file is always hashed.
    hash_if: &'a dyn Fn(&str, u64) -> bool,
    /// Where each protected entry is copied as it is read; `None` only reads.
    copy_to: Option<&'a Path>,
    /// Whose reading a root-run fork holds the copy to (the runtime's owner, another user).
    owner: Option<Owner>,
    /// The read buffer, one per scan (the scan recurses: no buffer on its stack).
    buf: Vec<u8>,
    /// Set when the failure the scan returns was writing the copy, not reading the tree.
    writing: bool,
    out: Scanned,
    visited: usize,
}

/// What a scan found.
struct Scanned {
    /// The protected entries.
    found: BTreeMap<String, Entry>,
    /// The paths a pattern names literally (`dir` of `dir/**`, an exact path), with what
    /// the scan found there: `Some(true)` a directory, `Some(false)` a regular file,
    /// `None` anything else (nothing, a link, a FIFO or a device), or a path it never
    /// reached (beneath a link or an excluded directory).
    named: BTreeMap<String, Option<bool>>,
}

impl Scan<'_> {
    fn may_hold(&self, rel: &str) -> bool {
        self.prefixes.iter().any(|p| {
            p.is_empty()
                || p == rel
                || (p.starts_with(rel) && p.as_bytes().get(rel.len()) == Some(&b'/'))
                || (rel.starts_with(p.as_str()) && rel.as_bytes().get(p.len()) == Some(&b'/'))
        })
    }

    /// Scans the directory `dir` (at `rel`); on failure, the path that could not be read
    /// (or, copying, written).
    fn dir(
        &mut self,
        dir: BorrowedFd<'_>,
        rel: &str,
        depth: usize,
    ) -> Result<(), (String, String)> {
        let fail = |r: &str, e: &dyn std::fmt::Display| (r.to_string(), e.to_string());
        let shown = if rel.is_empty() { "." } else { rel };
        // Another user's directory is listed only if that user could list and search it.
        crate::fork::tree::check_listable(self.owner.as_ref(), dir, Path::new(shown)).map_err(
            |e| match e {
                WorkspaceError::Unreadable { reason, .. } => fail(rel, &reason),
                e => fail(rel, &e),
            },
        )?;
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let mut names = Vec::new();
        {
            let mut d = nix::dir::Dir::openat(dir, ".", flags, Mode::empty())
                .map_err(|e| fail(shown, &e))?;
            for e in d.iter() {
                let e = e.map_err(|e| fail(shown, &e))?;
                let n = e.file_name().to_bytes();
                if n != b"." && n != b".." {
                    names.push(std::ffi::OsStr::from_bytes(n).to_os_string());
                }
            }
        }
        names.sort();
        for name in names {
            let r = match rel {
                "" => name.to_string_lossy().into_owned(),
                _ => format!("{rel}/{}", name.to_string_lossy()),
            };
            if self.exclude.is_match(&r) {
                continue;
            }
            self.visited += 1;
            if self.visited > MAX_ENTRIES {
                return Err(fail(&r, &format!("more than {MAX_ENTRIES} entries")));
            }
            let st = match fstatat(
                dir,
                name.as_os_str(),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            ) {
                Ok(st) => st,
                Err(nix::Error::ENOENT) => continue,
                Err(e) => return Err(fail(&r, &e)),
            };
            let fmt = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
            let mode = st.st_mode & 0o7777;
            let is_dir = fmt == SFlag::S_IFDIR;
            if let Some(k) = self.out.named.get_mut(&r) {
                *k = (is_dir || fmt == SFlag::S_IFREG).then_some(is_dir);
            }
            if self.protected.is_match(&r) {
                let to = self.copy_to.map(|root| root.join(&r));
                let entry = if fmt == SFlag::S_IFREG {
                    let size = st.st_size as u64;
                    match &to {
                        // Copied from the descriptor it is hashed through: the copy is the
                        // bytes the manifest names, never what a link put there since.
                        Some(to) => {
                            let (sha256, size, mode) =
                                copy_at(dir, &name, to, &mut self.buf, self.owner.as_ref())
                                    .map_err(|(w, e)| {
                                        self.writing = w;
                                        fail(&r, &e)
                                    })?;
                            Entry::File { sha256, size, mode }
                        }
                        None => {
                            let sha256 = if (self.hash_if)(&r, size) {
                                let (f, _) = open_at(dir, &name).map_err(|e| fail(&r, &e))?;
                                read_all(f, &mut self.buf, |_| Ok(()))
                                    .map_err(|e| fail(&r, &format!("reading: {e}")))?
                                    .0
                            } else {
                                String::new()
                            };
                            Entry::File { sha256, size, mode }
                        }
                    }
                } else if is_dir {
                    if let Some(to) = &to {
                        std::fs::create_dir_all(to).map_err(|e| {
                            self.writing = true;
                            fail(&r, &e)
                        })?;
                    }
                    Entry::Dir { mode }
                } else if fmt == SFlag::S_IFLNK {
                    let t =
                        nix::fcntl::readlinkat(dir, name.as_os_str()).map_err(|e| fail(&r, &e))?;
                    if let Some(to) = &to {
                        make_parent(to)
                            .and_then(|()| std::os::unix::fs::symlink(&t, to))
                            .map_err(|e| {
                                self.writing = true;
                                fail(&r, &e)
                            })?;
                    }
                    Entry::Symlink {
                        target: t.to_string_lossy().into_owned(),
                    }
                } else {
                    Entry::Other
                };
                self.out.found.insert(r.clone(), entry);
            }
            if is_dir && self.may_hold(&r) {
                if depth >= MAX_DEPTH {
                    return Err(fail(&r, &format!("nested deeper than {MAX_DEPTH} levels")));
                }
                let sub = nix::fcntl::openat(dir, name.as_os_str(), flags, Mode::empty())
                    .map_err(|e| fail(&r, &e))?;
                self.dir(sub.as_fd(), &r, depth + 1)?;
            }
        }
        Ok(())
    }
}

use std::os::unix::ffi::OsStrExt;

/// Opens the regular file `name` in `dir` without following a link (and without waiting
/// on a FIFO), checked on its descriptor; returns it and its `fstat`.
fn open_at(
    dir: BorrowedFd<'_>,
    name: &std::ffi::OsStr,
) -> Result<(std::fs::File, nix::sys::stat::FileStat), String> {
    let fd: OwnedFd = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| e.to_string())?;
    let st = nix::sys::stat::fstat(&fd).map_err(|e| e.to_string())?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err("not a regular file any more".into());
    }
    Ok((std::fs::File::from(fd), st))
}

/// Reads `f` to its end through `buf`, handing each piece to `sink`; returns the sha256
/// of what was read and its length.
fn read_all(
    mut f: impl Read,
    buf: &mut [u8],
    mut sink: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<(String, u64)> {
    let mut h = Sha256::new();
    let mut len = 0u64;
    loop {
        let n = f.read(buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        sink(&buf[..n])?;
        len += n as u64;
    }
    Ok((hex::encode(h.finalize()), len))
}

/// Copies the regular file `name` in `dir`, opened as [`open_at`] opens it, to `to` (a new
/// file, its parents made as needed): at most the size its descriptor had when opened (a
/// file growing meanwhile is not chased), hashed as it is copied. The copy gets the
/// descriptor's permission bits plus read and write for everyone (see [`snapshot`]).
/// Returns the sha256 and length of the bytes copied, and the mode; on failure, whether it
/// was writing the copy (not reading the tree) and the message.
fn copy_at(
    dir: BorrowedFd<'_>,
    name: &std::ffi::OsStr,
    to: &Path,
    buf: &mut [u8],
    owner: Option<&Owner>,
) -> Result<(String, u64, u32), (bool, String)> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let (f, st) = open_at(dir, name).map_err(|e| (false, e))?;
    if let Some(Err(reason)) = owner.map(|o| o.check_read(&f, &st)) {
        return Err((false, reason));
    }
    let mode = st.st_mode & 0o7777;
    let write = |e: std::io::Error| (true, format!("writing its copy {}: {e}", to.display()));
    make_parent(to).map_err(write)?;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)
        .map_err(write)?;
    let mut failed_write = None;
    let read = read_all(f.take(st.st_size as u64), buf, |b| {
        out.write_all(b)
            .inspect_err(|e| failed_write = Some(e.kind()))
    });
    let (sha256, len) = match (read, failed_write) {
        (Err(e), Some(_)) => return Err(write(e)),
        (Err(e), None) => return Err((false, format!("reading: {e}"))),
        (Ok(r), _) => r,
    };
    out.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(
        (mode & 0o777) | 0o666,
    ))
    .map_err(write)?;
    Ok((sha256, len, mode))
}

/// Makes the directories above `path` (in the copy, which only fork writes).
fn make_parent(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(p) => std::fs::create_dir_all(p),
        None => Ok(()),
    }
}

/// The protected entries beneath `root` (its last component must not be a link; the
/// directories above it are fork's: a workspace, the copy).
fn scan(
    root: &Path,
    patterns: &[String],
    exclude: &[String],
    hash_if: &dyn Fn(&str, u64) -> bool,
) -> Result<BTreeMap<String, Entry>, (String, String)> {
    let fd = crate::fsx::open_dir(root, false).map_err(|e| (".".to_string(), e.to_string()))?;
    scan_fd(fd.as_fd(), patterns, exclude, hash_if, None, None)
        .map(|s| s.found)
        .map_err(|(p, e, _)| (p, e))
}

/// [`scan`] of the tree open at `root`, copying each protected entry beneath `copy_to` as
/// it is read when given; a failure also says whether it was writing the copy.
fn scan_fd(
    root: BorrowedFd<'_>,
    patterns: &[String],
    exclude: &[String],
    hash_if: &dyn Fn(&str, u64) -> bool,
    copy_to: Option<&Path>,
    owner: Option<Owner>,
) -> Result<Scanned, (String, String, bool)> {
    let globs = globs(patterns);
    let protected = glob_set(&globs, false).map_err(|e| (String::new(), e, false))?;
    let exclude = glob_set(exclude, true).map_err(|e| (String::new(), e, false))?;
    let named = globs
        .iter()
        .map(|g| g.strip_suffix("/**").unwrap_or(g))
        .filter(|t| !t.is_empty() && !has_meta(t))
        .map(|t| (t.to_string(), None))
        .collect();
    let mut s = Scan {
        protected: &protected,
        exclude: &exclude,
        prefixes: globs.iter().map(|g| literal_prefix(g)).collect(),
        hash_if,
        copy_to,
        owner,
        buf: vec![0; crate::fsx::READ_BUF],
        out: Scanned {
            found: BTreeMap::new(),
            named,
        },
        visited: 0,
        writing: false,
    };
    if let Err((p, e)) = s.dir(root, "", 0) {
        return Err((p, e, s.writing));
    }
    Ok(s.out)
}

/// How `found` differs from `expected` (only paths `in_scope` counts; modes when `modes`).
fn compare(
    expected: &BTreeMap<String, Entry>,
    found: &BTreeMap<String, Entry>,
    in_scope: &dyn Fn(&str) -> bool,
    modes: bool,
) -> Vec<ProtectedChange> {
    let mut out = Vec::new();
    let change = |path: &str, change| ProtectedChange {
        path: path.to_string(),
        change,
    };
    for (rel, want) in expected.iter().filter(|(r, _)| in_scope(r)) {
        let differs = match (want, found.get(rel)) {
            (_, None) => {
                out.push(change(rel, ChangeKind::Removed));
                continue;
            }
            (
                Entry::File { sha256, size, mode },
                Some(Entry::File {
                    sha256: s2,
                    size: z2,
                    mode: m2,
                }),
            ) => size != z2 || sha256 != s2 || (modes && (mode & 0o777) != (m2 & 0o777)),
            (Entry::Dir { mode }, Some(Entry::Dir { mode: m2 })) => {
                modes && (mode & 0o777) != (m2 & 0o777)
            }
            (Entry::Symlink { target }, Some(Entry::Symlink { target: t2 })) => target != t2,
            (Entry::Other, Some(Entry::Other)) => false,
            _ => true,
        };
        if differs {
            out.push(change(rel, ChangeKind::Modified));
        }
    }
    for rel in found
        .keys()
        .filter(|r| in_scope(r) && !expected.contains_key(*r))
    {
        out.push(change(rel, ChangeKind::Added));
    }
    out
}

pub(super) fn copy_root(staging: &Path) -> PathBuf {
    staging.join(COPY_DIR)
}

/// FORK, once per evaluation: the parent's protected tree, the directory `source` beneath
/// the runtime directory `runtime` (no component of `source` a link), copied into the
/// staging directory, with its manifest and its binds (see the module documentation). Each
/// entry is copied as the scan reads it, through the descriptors the scan opened from the
/// runtime directory down (no path is looked up again, so no link swapped in since is
/// followed), and the manifest hashes the bytes copied.
pub fn snapshot(
    staging: &Path,
    runtime: &Path,
    source: &Path,
    patterns: &[String],
    exclude: &[String],
) -> Result<(), EvaluateError> {
    let shown = runtime.join(source);
    let err = |what: &str, e: &dyn std::fmt::Display| {
        internal("the protected tree")(format!("{what}: {e}"))
    };
    // What the parent's owner controls (a link in the source's path, an entry swapped or
    // unreadable) is bad input, named; a failure writing fork's own copy is internal.
    let refused = |what: String, e: &dyn std::fmt::Display| {
        EvaluateError::Input(format!("reading the protected tree {what}: {e}"))
    };
    let runtime_fd = crate::fork::tree::open_dir_no_links(runtime)
        .map_err(|e| refused(runtime.display().to_string(), &e))?;
    let owner =
        Owner::of_dir(&runtime_fd).map_err(|e| refused(runtime.display().to_string(), &e))?;
    // Held to the runtime's owner, each directory on the way must be one it could search,
    // and each directory the scan lists one it could list and search (`Scan::dir`).
    let root = crate::fork::tree::open_dir_beneath_as(owner.as_ref(), &runtime_fd, runtime, source)
        .map_err(|e| match e {
            WorkspaceError::Unreadable { path, reason } => {
                refused(path.display().to_string(), &reason)
            }
            e => refused(shown.display().to_string(), &e),
        })?;
    let copy = copy_root(staging);
    std::fs::create_dir(&copy).map_err(|e| err("creating the copy", &e))?;
    if nix::unistd::geteuid().is_root() {
        // A tmpfs of its own: a bind from it shows `/tests`, not a host path, as its root.
        // It holds what the parent's protected tree held (each file up to its size when
        // the scan opened it), as the copy sized to the tree did before this copy was made
        // as it is read; nothing writes to it afterwards.
        nix::mount::mount(
            Some("tmpfs"),
            &copy,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some("mode=0755"),
        )
        .map_err(|e| err("mounting its tmpfs", &e))?;
    }
    let Scanned { found, named } = scan_fd(
        root.as_fd(),
        patterns,
        exclude,
        &|_, _| true,
        Some(&copy),
        owner,
    )
    .map_err(|(p, e, writing)| match writing {
        true => err(&format!("copying {}", shown.join(&p).display()), &e),
        false => refused(shown.join(&p).display().to_string(), &e),
    })?;
    let binds = plan_binds(patterns, &found, |rel| named.get(rel).copied().flatten());
    // Every sandbox's uid (each run has its own) may read the copy and is refused writes
    // by the read-only mount alone (EROFS, as a read-only checkout would answer, not
    // EACCES): files a+rw, directories a+rwx. The copy lies beneath the staging directory
    // (0700), out of other host users' reach, and is never written after this. An entry no
    // bind serves (a link or a directory a glob matches) is in the copy, never in a
    // sandbox.
    let mut dirs: Vec<PathBuf> = binds
        .iter()
        .filter(|(_, d)| *d)
        .map(|(rel, _)| copy.join(rel))
        .collect();
    for d in &dirs {
        std::fs::create_dir_all(d).map_err(|e| err(&d.display().to_string(), &e))?;
    }
    dirs.extend(
        found
            .iter()
            .filter(|(_, e)| matches!(e, Entry::Dir { .. }))
            .map(|(rel, _)| copy.join(rel)),
    );
    dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for d in dirs {
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .map_err(|e| err(&d.display().to_string(), &e))?;
    }
    let m = Manifest {
        patterns: patterns.to_vec(),
        binds,
        entries: found,
    };
    let json = serde_json::to_vec(&m).map_err(|e| err("the manifest", &e))?;
    std::fs::write(staging.join(MANIFEST), json).map_err(|e| err("the manifest", &e))
}

fn load(staging: &Path) -> Result<Option<Manifest>, EvaluateError> {
    let path = staging.join(MANIFEST);
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| internal("the protected tree's manifest")(e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(internal("the protected tree's manifest")(e.to_string())),
    }
}

/// The read-only binds of the protected copy over a sandbox's workspace (none before
/// [`snapshot`] ran, or with no protected paths).
pub fn binds(staging: &Path) -> Result<Vec<RoBind>, EvaluateError> {
    let Some(m) = load(staging)? else {
        return Ok(Vec::new());
    };
    let src_inside = PathBuf::from(crate::sandbox::WORKSPACE).join("src");
    Ok(m.binds
        .iter()
        .map(|(rel, _)| RoBind {
            src: copy_root(staging).join(rel),
            dst: src_inside.join(rel),
        })
        .collect())
}

/// After a run, before its results are read: the protected paths as the workspace's
/// source tree `ws_src` shows them, and the copy the sandboxes were served, against the
/// parent's snapshot. Every difference (a path that could not be checked too) is returned.
pub fn check(
    staging: &Path,
    ws_src: &Path,
    exclude: &[String],
) -> Result<Vec<ProtectedChange>, EvaluateError> {
    let Some(m) = load(staging)? else {
        return Ok(Vec::new());
    };
    if m.patterns.is_empty() {
        return Ok(Vec::new());
    }
    let same_size = |rel: &str, size: u64| matches!(m.entries.get(rel), Some(Entry::File { size: s, .. }) if *s == size);
    let unchecked = |(p, _e): (String, String)| {
        vec![ProtectedChange {
            path: if p.is_empty() { ".".into() } else { p },
            change: ChangeKind::Unchecked,
        }]
    };
    let mut changes = match scan(ws_src, &m.patterns, exclude, &same_size) {
        Ok(found) => compare(&m.entries, &found, &|_| true, true),
        Err(e) => unchecked(e),
    };
    let bound = |rel: &str| {
        m.binds.iter().any(|(b, _)| {
            rel == b || (rel.starts_with(b.as_str()) && rel.as_bytes().get(b.len()) == Some(&b'/'))
        })
    };
    match scan(&copy_root(staging), &m.patterns, exclude, &same_size) {
        Ok(found) => changes.extend(compare(&m.entries, &found, &bound, false)),
        Err(e) => changes.extend(unchecked(e)),
    }
    changes.sort();
    changes.dedup();
    Ok(changes)
}

#[cfg(test)]
#[path = "protect_tests.rs"]
mod tests;
