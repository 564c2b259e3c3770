//! `fork run --workspace DIR`: handing the successor's workspace back to the host.
//!
//! The workspace is hostile data, and the copy runs as the supervisor (root, usually). So:
//!
//! * only regular files and directories come back; symbolic links, FIFOs, sockets and
//!   devices are skipped and named in a note (a link is never followed, nor recreated);
//! * every file and directory is created owned by the owner (uid and gid) of DIR, with its
//!   permission bits only (`mode & 0o777`): never set-user-ID, set-group-ID or sticky;
//! * `.git` (at any depth: hooks, config, ...) is skipped unless asked for
//!   ([`CopyBackOptions::allow_git_internals`]): a planted hook would run at the owner's
//!   next `git checkout`;
//! * the apparent and the allocated size of the files are counted against the disk budget
//!   before anything is written (a sparse file claims its apparent size on most host
//!   filesystems once copied): over it, nothing is copied;
//! * everything is first written into a staging directory inside DIR (root-only, 0700,
//!   on DIR's own filesystem, so that the moves below are renames), then moved into place
//!   by `renameat` relative to directory descriptors opened without following links. A
//!   failure while writing (say ENOSPC) removes the staging directory: DIR is as it was.
//!   A conflict (a directory on the host where the workspace has a file, or the other
//!   way round) is found before anything is moved;
//! * DIR's owner can rename the staging directory and put one of its own under its name at
//!   any moment, so fork goes through the descriptor it opened the staging directory by,
//!   never its name: that directory is used only if no one else can write into it
//!   ([`open_staging`]), and it is emptied through descriptors and removed only while its
//!   name still holds it ([`super::workspace::remove_dir_at`]); a directory put in its
//!   place is never written into, emptied, removed or changed in mode.
//!
//! DIR's existing entries that the workspace no longer holds are kept (the copy merges),
//! and DIR's existing directories keep their owner and mode.

use crate::ioerr::IoError;
use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{openat, renameat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstat, fstatat, mkdirat, FileStat, Mode, SFlag};
use nix::unistd::{fchown, Gid, Uid};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Deepest nesting copied back (a deeper tree is refused as a whole).
pub const MAX_DEPTH: usize = 64;

/// What the copy may do.
#[derive(Debug, Clone)]
pub struct CopyBackOptions {
    /// The disk budget: the most bytes (apparent, and allocated) that may come back.
    pub max_bytes: u64,
    /// Copy `.git` directories (hooks, config, ...) too.
    pub allow_git_internals: bool,
    /// Top-level names of the workspace that never come back (`home`).
    pub skip_top: Vec<OsString>,
    /// A unique suffix for the staging directory's name.
    pub tag: String,
}

/// What came back, and what was left out.
#[derive(Debug, Default, Clone)]
pub struct CopyBackStats {
    pub files: u64,
    pub dirs: u64,
    pub bytes: u64,
    /// Symbolic links left out (relative paths).
    pub links: Vec<PathBuf>,
    /// FIFOs, sockets and devices left out.
    pub special: Vec<PathBuf>,
    /// `.git` directories (or files) left out.
    pub git: Vec<PathBuf>,
    /// Files and directories whose set-id or sticky bits were dropped.
    pub stripped: Vec<PathBuf>,
}

impl CopyBackStats {
    /// One line per kind of entry left out or changed, for the user.
    pub fn notes(&self) -> Vec<String> {
        let show = |v: &[PathBuf]| {
            let mut s: Vec<String> = v.iter().take(5).map(|p| p.display().to_string()).collect();
            if v.len() > 5 {
                s.push(format!("and {} more", v.len() - 5));
            }
            s.join(", ")
        };
        let mut out = Vec::new();
        if !self.links.is_empty() {
            out.push(format!(
                "symbolic links are not copied back: skipped {}",
                show(&self.links)
            ));
        }
        if !self.special.is_empty() {
            out.push(format!(
                "FIFOs, sockets and devices are not copied back: skipped {}",
                show(&self.special)
            ));
        }
        if !self.git.is_empty() {
            out.push(format!(
                "`.git` internals are not copied back (pass --allow-git-internals to copy them): skipped {}",
                show(&self.git)
            ));
        }
        if !self.stripped.is_empty() {
            out.push(format!(
                "set-user-ID, set-group-ID and sticky bits dropped on {}",
                show(&self.stripped)
            ));
        }
        out
    }
}

#[derive(Debug, Error)]
pub enum CopyBackError {
    #[error("the workspace holds {apparent} bytes ({allocated} allocated) of files, over the {max}-byte disk budget: nothing was copied back")]
    OverBudget {
        apparent: u64,
        allocated: u64,
        max: u64,
    },
    #[error(
        "the workspace nests deeper than {max} directories at {path}: nothing was copied back"
    )]
    TooDeep { path: PathBuf, max: usize },
    #[error("{path} is a {host} on the host where the workspace has a {ws}: nothing was copied back (move it away first if that is intended)")]
    Conflict {
        path: PathBuf,
        host: &'static str,
        ws: &'static str,
    },
    #[error("{path}: the staging directory fork had just made there was replaced before fork opened it (by the directory's owner?): nothing was copied back, and what is there now was left alone")]
    StagingReplaced { path: PathBuf },
    #[error("{0}: nothing was copied back")]
    Io(IoError),
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> CopyBackError + 'a {
    move |e| CopyBackError::Io(IoError::new(action, path, e.into()))
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Link,
    Special,
}

fn kind(st: &FileStat) -> Kind {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFDIR => Kind::Dir,
        SFlag::S_IFREG => Kind::File,
        SFlag::S_IFLNK => Kind::Link,
        _ => Kind::Special,
    }
}

fn kind_word(k: Kind) -> &'static str {
    match k {
        Kind::Dir => "directory",
        Kind::File => "file",
        Kind::Link => "symbolic link",
        Kind::Special => "special file",
    }
}

/// The names in the directory `dir`, sorted.
fn names(dir: &OwnedFd, shown: &Path) -> Result<Vec<OsString>, CopyBackError> {
    let mut d =
        Dir::openat(dir, ".", DIR_FLAGS, Mode::empty()).map_err(io_err("read directory", shown))?;
    let mut out = Vec::new();
    for e in d.iter() {
        let e = e.map_err(io_err("read directory", shown))?;
        let n = OsStr::from_bytes(e.file_name().to_bytes());
        if n != "." && n != ".." {
            out.push(n.to_os_string());
        }
    }
    out.sort();
    Ok(out)
}

/// The entries of the workspace that come back: `(name, stat)` of `dir`'s entries, with
/// the left-out ones recorded in `stats`.
fn wanted(
    dir: &OwnedFd,
    rel: &Path,
    depth: usize,
    opts: &CopyBackOptions,
    stats: &mut CopyBackStats,
) -> Result<Vec<(OsString, FileStat)>, CopyBackError> {
    let mut out = Vec::new();
    for name in names(dir, rel)? {
        let path = rel.join(&name);
        let st = fstatat(dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(io_err("stat", &path))?;
        if depth == 0 && opts.skip_top.contains(&name) {
            continue;
        }
        if name == ".git" && !opts.allow_git_internals {
            stats.git.push(path);
            continue;
        }
        match kind(&st) {
            Kind::Link => stats.links.push(path),
            Kind::Special => stats.special.push(path),
            Kind::Dir | Kind::File => out.push((name, st)),
        }
    }
    Ok(out)
}

/// Pass 1: what would come back, and its size (apparent, allocated).
fn measure(
    dir: &OwnedFd,
    rel: &Path,
    depth: usize,
    opts: &CopyBackOptions,
    stats: &mut CopyBackStats,
    size: &mut (u64, u64),
) -> Result<(), CopyBackError> {
    for (name, st) in wanted(dir, rel, depth, opts, stats)? {
        let path = rel.join(&name);
        if kind(&st) == Kind::Dir {
            if depth + 1 >= MAX_DEPTH {
                return Err(CopyBackError::TooDeep {
                    path,
                    max: MAX_DEPTH,
                });
            }
            let sub = openat(dir, name.as_os_str(), DIR_FLAGS, Mode::empty())
                .map_err(io_err("open directory", &path))?;
            measure(&sub, &path, depth + 1, opts, stats, size)?;
        } else {
            size.0 = size
                .0
                .saturating_add(u64::try_from(st.st_size).unwrap_or(u64::MAX));
            let blocks = u64::try_from(st.st_blocks).unwrap_or(u64::MAX);
            size.1 = size.1.saturating_add(blocks.saturating_mul(512));
        }
    }
    Ok(())
}

struct Owner {
    uid: Uid,
    gid: Gid,
}

/// Gives `fd` (just created by fork) to the owner, with `mode & 0o777`.
fn settle(fd: &OwnedFd, owner: &Owner, mode: u32, path: &Path) -> Result<(), CopyBackError> {
    fchown(fd, Some(owner.uid), Some(owner.gid)).map_err(io_err("chown", path))?;
    fchmod(fd, Mode::from_bits_truncate(mode & 0o777)).map_err(io_err("chmod", path))
}

/// Pass 2: the wanted entries of `src` written beneath `dst` (fresh, fork's own).
#[allow(clippy::too_many_arguments)]
fn stage(
    src: &OwnedFd,
    dst: &OwnedFd,
    rel: &Path,
    depth: usize,
    opts: &CopyBackOptions,
    owner: &Owner,
    stats: &mut CopyBackStats,
    left: &mut u64,
) -> Result<(), CopyBackError> {
    let mut ignored = CopyBackStats::default();
    for (name, st) in wanted(src, rel, depth, opts, &mut ignored)? {
        let path = rel.join(&name);
        let mode = st.st_mode & 0o7777;
        if mode & 0o7000 != 0 {
            stats.stripped.push(path.clone());
        }
        let n = name.as_os_str();
        if kind(&st) == Kind::Dir {
            mkdirat(dst, n, Mode::from_bits_truncate(0o700)).map_err(io_err("create", &path))?;
            let from = openat(src, n, DIR_FLAGS, Mode::empty()).map_err(io_err("open", &path))?;
            let to = openat(dst, n, DIR_FLAGS, Mode::empty()).map_err(io_err("open", &path))?;
            stage(&from, &to, &path, depth + 1, opts, owner, stats, left)?;
            settle(&to, owner, mode, &path)?;
            stats.dirs += 1;
            continue;
        }
        let read = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let from = openat(src, n, read, Mode::empty()).map_err(io_err("open", &path))?;
        if kind(&fstat(&from).map_err(io_err("stat", &path))?) != Kind::File {
            continue;
        }
        let create =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let to = openat(dst, n, create, Mode::from_bits_truncate(0o600))
            .map_err(io_err("create", &path))?;
        let mut out = File::from(to);
        let copied = io::copy(&mut File::from(from).take(*left + 1), &mut out)
            .map_err(|e| CopyBackError::Io(IoError::new("copy", &path, e)))?;
        if copied > *left {
            // Only a file that grew after it was measured gets here.
            let so_far = opts.max_bytes - *left + copied;
            return Err(CopyBackError::OverBudget {
                apparent: so_far,
                allocated: so_far,
                max: opts.max_bytes,
            });
        }
        *left -= copied;
        let to: OwnedFd = out.into();
        settle(&to, owner, mode, &path)?;
        stats.files += 1;
        stats.bytes += copied;
    }
    Ok(())
}

/// Pass 3: moves the staged tree into DIR (`apply` false only checks for conflicts).
fn merge(staged: &OwnedFd, dest: &OwnedFd, rel: &Path, apply: bool) -> Result<(), CopyBackError> {
    for name in names(staged, rel)? {
        let path = rel.join(&name);
        let n = name.as_os_str();
        let st = fstatat(staged, n, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(io_err("stat", &path))?;
        let ws = kind(&st);
        let host = match fstatat(dest, n, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(h) => Some(kind(&h)),
            Err(Errno::ENOENT) => None,
            Err(e) => return Err(io_err("stat", &path)(e)),
        };
        match (ws, host) {
            (Kind::Dir, Some(Kind::Dir)) => {
                let a =
                    openat(staged, n, DIR_FLAGS, Mode::empty()).map_err(io_err("open", &path))?;
                let b = openat(dest, n, DIR_FLAGS, Mode::empty()).map_err(io_err("open", &path))?;
                merge(&a, &b, &path, apply)?;
            }
            (Kind::Dir, Some(h)) | (_, Some(h @ Kind::Dir)) => {
                return Err(CopyBackError::Conflict {
                    path,
                    host: kind_word(h),
                    ws: kind_word(ws),
                })
            }
            _ if apply => {
                renameat(staged, n, dest, n).map_err(io_err("move into place", &path))?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Opens the staging directory fork has just made as `name` in DIR (`dest`). DIR's owner
/// may have replaced it between the `mkdirat` and this open (renamed it away and put a
/// directory of its own there): what is opened is used only if no one but fork may write
/// into it, that is, it belongs to fork's effective uid, is closed to group and others and
/// is empty (fork's own, or a directory as harmless to fill and remove). Otherwise nothing
/// is copied back and nothing is done to what is there
/// ([`CopyBackError::StagingReplaced`]).
fn open_staging(dest: &OwnedFd, name: &str, shown: &Path) -> Result<OwnedFd, CopyBackError> {
    let fd = match openat(dest, name, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(e @ (Errno::ELOOP | Errno::ENOTDIR | Errno::ENOENT)) => {
            tracing::debug!("opening {}: {e}", shown.display());
            return Err(CopyBackError::StagingReplaced {
                path: shown.to_path_buf(),
            });
        }
        Err(e) => {
            // Presumably still fork's own, empty directory: an rmdir removes nothing else.
            if let Err(r) = nix::unistd::unlinkat(dest, name, nix::unistd::UnlinkatFlags::RemoveDir)
            {
                tracing::error!("removing the staging directory {}: {r}", shown.display());
            }
            return Err(io_err("open", shown)(e));
        }
    };
    let st = fstat(&fd).map_err(io_err("stat", shown))?;
    let ours = st.st_uid == nix::unistd::geteuid().as_raw() && st.st_mode & 0o077 == 0;
    if !ours || !names(&fd, shown)?.is_empty() {
        return Err(CopyBackError::StagingReplaced {
            path: shown.to_path_buf(),
        });
    }
    // Owner bits as made, whatever the umask took away.
    fchmod(&fd, Mode::from_bits_truncate(0o700)).map_err(io_err("chmod", shown))?;
    Ok(fd)
}

/// Copies the workspace `from` (whose writer is dead) back into the host directory `to`
/// under the rules of the module docs.
pub fn copy_back(
    from: &Path,
    to: &Path,
    opts: &CopyBackOptions,
) -> Result<CopyBackStats, CopyBackError> {
    let src = crate::fsx::open_dir(from, false)
        .map_err(|e| CopyBackError::Io(IoError::new("open", from, io::Error::other(e))))?;
    let dest = crate::fsx::open_dir(to, true)
        .map_err(|e| CopyBackError::Io(IoError::new("open", to, io::Error::other(e))))?;
    let st = fstat(&dest).map_err(io_err("stat", to))?;
    let owner = Owner {
        uid: Uid::from_raw(st.st_uid),
        gid: Gid::from_raw(st.st_gid),
    };
    let mut stats = CopyBackStats::default();
    let mut size = (0u64, 0u64);
    measure(&src, Path::new(""), 0, opts, &mut stats, &mut size)?;
    if size.0 > opts.max_bytes || size.1 > opts.max_bytes {
        return Err(CopyBackError::OverBudget {
            apparent: size.0,
            allocated: size.1,
            max: opts.max_bytes,
        });
    }
    let staging_name = format!(".fork-copyback-{}", opts.tag);
    let staging_path = to.join(&staging_name);
    mkdirat(
        &dest,
        staging_name.as_str(),
        Mode::from_bits_truncate(0o700),
    )
    .map_err(io_err("create", &staging_path))?;
    #[cfg(test)]
    hook("made");
    let staged = open_staging(&dest, &staging_name, &staging_path)?;
    let result = (|| {
        let mut left = opts.max_bytes;
        let mut ignored = CopyBackStats::default();
        let root = Path::new("");
        stage(
            &src,
            &staged,
            root,
            0,
            opts,
            &owner,
            &mut ignored,
            &mut left,
        )?;
        stats.files = ignored.files;
        stats.dirs = ignored.dirs;
        stats.bytes = ignored.bytes;
        stats.stripped = ignored.stripped;
        #[cfg(test)]
        hook("staged");
        merge(&staged, &dest, root, false)?;
        merge(&staged, &dest, root, true)
    })();
    // What was not moved (everything, after a failure) goes with the staging directory,
    // through the descriptor it was staged through: DIR's owner may have renamed it and put
    // another directory under its name, which is never emptied or removed (by root).
    if let Err(e) = super::workspace::remove_dir_at(
        dest.as_fd(),
        OsStr::new(&staging_name),
        staged.as_fd(),
        &staging_path,
    ) {
        tracing::error!("removing the staging directory: {e}");
    }
    result.map(|()| stats)
}

#[cfg(test)]
thread_local! {
    /// Runs in [`copy_back`] at the named point (`made`: the staging directory was just
    /// made; `staged`: the workspace was just written into it): a test replaces the staging
    /// directory there, as DIR's owner could.
    static AT: std::cell::RefCell<Option<PointHook>> = const { std::cell::RefCell::new(None) };
}

/// What [`AT`] holds.
#[cfg(test)]
type PointHook = Box<dyn FnMut(&'static str)>;

#[cfg(test)]
fn hook(point: &'static str) {
    AT.with(|h| {
        if let Some(f) = h.borrow_mut().as_mut() {
            f(point)
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    /// DIR's owner renames fork's staging directory away and puts a directory of its own in
    /// its place (a 0000 subdirectory holding a file, a link to a file outside), once just
    /// after fork made it and once after fork wrote the workspace into it. Fork never writes
    /// into that directory, empties it, removes it or changes a mode in it or through its
    /// link: replaced before fork opened it, nothing is copied back; replaced after, the copy
    /// comes back from fork's own directory (held open), which is emptied and left where it
    /// was moved to. Every file is the test's own, in its temp dir.
    #[test]
    fn a_staging_directory_replaced_by_another_is_never_written_emptied_or_removed() {
        for point in ["made", "staged"] {
            let tmp = tempfile::tempdir().unwrap();
            let (from, to) = (tmp.path().join("ws"), tmp.path().join("dir"));
            fs::create_dir_all(from.join("d")).unwrap();
            fs::write(from.join("a.txt"), "new").unwrap();
            fs::write(from.join("d/f"), "f").unwrap();
            fs::create_dir(&to).unwrap();
            fs::write(to.join("keep.txt"), "kept").unwrap();
            let outside = tmp.path().join("outside.txt");
            fs::write(&outside, "outside").unwrap();
            fs::set_permissions(&outside, fs::Permissions::from_mode(0o644)).unwrap();
            let staging = to.join(".fork-copyback-T");
            let moved = to.join(".moved-away");
            let replacement = {
                let (staging, moved, outside) = (staging.clone(), moved.clone(), outside.clone());
                move || {
                    fs::rename(&staging, &moved).unwrap();
                    fs::create_dir_all(staging.join("locked")).unwrap();
                    fs::write(staging.join("locked/mine.txt"), "mine").unwrap();
                    symlink(&outside, staging.join("link")).unwrap();
                    fs::set_permissions(staging.join("locked"), fs::Permissions::from_mode(0o000))
                        .unwrap();
                    if nix::unistd::geteuid().is_root() {
                        // The owner's own, as it would be.
                        std::os::unix::fs::lchown(&staging, Some(65534), Some(65534)).unwrap();
                    }
                }
            };
            let mut replace = Some(replacement);
            AT.with(|h| {
                *h.borrow_mut() = Some(Box::new(move |at| {
                    if at == point {
                        if let Some(r) = replace.take() {
                            r()
                        }
                    }
                }))
            });
            let opts = CopyBackOptions {
                max_bytes: 1 << 20,
                allow_git_internals: false,
                skip_top: vec![],
                tag: "T".into(),
            };
            let r = copy_back(&from, &to, &opts);
            AT.with(|h| h.borrow_mut().take());
            // The replacement is as its owner left it.
            assert!(
                fs::symlink_metadata(staging.join("locked")).is_ok(),
                "{point}: the replacement was emptied or removed: {r:?}"
            );
            assert_eq!(mode(&staging.join("locked")), 0, "{point}: {r:?}");
            fs::set_permissions(staging.join("locked"), fs::Permissions::from_mode(0o700)).unwrap();
            assert_eq!(
                fs::read_to_string(staging.join("locked/mine.txt")).unwrap(),
                "mine",
                "{point}"
            );
            assert_eq!(fs::read_link(staging.join("link")).unwrap(), outside);
            assert_eq!(mode(&outside), 0o644, "{point}");
            assert_eq!(fs::read_to_string(&outside).unwrap(), "outside");
            let names = |d: &Path| -> Vec<String> {
                let mut v: Vec<String> = fs::read_dir(d)
                    .unwrap()
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect();
                v.sort();
                v
            };
            assert_eq!(names(&staging), ["link", "locked"], "{point}: written into");
            assert_eq!(fs::read_to_string(to.join("keep.txt")).unwrap(), "kept");
            if point == "made" {
                let e = r.unwrap_err();
                assert!(e.to_string().contains("nothing was copied back"), "{e}");
                assert!(!to.join("a.txt").exists(), "{point}");
            } else {
                r.unwrap();
                assert_eq!(fs::read_to_string(to.join("a.txt")).unwrap(), "new");
                assert_eq!(fs::read_to_string(to.join("d/f")).unwrap(), "f");
                // Fork's own staging directory, emptied, is left where it was moved to.
                assert!(names(&moved).is_empty(), "{:?}", names(&moved));
            }
        }
    }
}
