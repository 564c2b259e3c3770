//! Opening a file that someone else controls beneath a directory, never following a link:
//! the one home of beneath-root opens.
//!
//! The supervisor reads files the successor left behind (its reports) and files of bundles
//! that may have been tampered with (a verdict's artifacts). Their names and their contents
//! are hostile: a symbolic link could point at the host's secrets, `..` could climb out, a
//! FIFO could stall the reader forever, a device could do anything when opened, and a
//! sparse file could claim a terabyte. [`open_beneath`] opens a relative path beneath a
//! directory descriptor so that none of this gets through:
//!
//! * the path must be relative, without `..`, NUL or more than [`MAX_PATH_COMPONENTS`]
//!   components (refused before any system call);
//! * no component may be a symbolic link, including a dangling one;
//! * the file must be a regular file: FIFOs, sockets and devices are refused without being
//!   opened for reading, so none can block the caller or act on being opened;
//! * the file may be at most `max_bytes` long, and [`Opened::read_all`] and
//!   [`Opened::bounded`] never read more than one byte past that, whatever the file does.
//!
//! The type, size and link count are checked on the opened descriptor (`fstat`), never on
//! the path, so the entry cannot be swapped between the check and the read.
//!
//! How: `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, first with `O_PATH` (which
//! resolves the path without opening the file, so the type can be checked before a FIFO or
//! device is really opened), then for reading with `O_NONBLOCK | O_NOCTTY`. Where `openat2`
//! is refused (`ENOSYS` before Linux 5.6, `EPERM`/`ENOSYS` from a container's seccomp
//! profile, `E2BIG`/`EINVAL` from a kernel that does not know the flags), the same
//! guarantees come from a walk: one `fstatat(AT_SYMLINK_NOFOLLOW)` and one
//! `openat(O_NOFOLLOW)` per component. When `openat2` refuses a path, that walk also names
//! the component at fault (`openat2` only says `ELOOP` or `ENOTDIR` for the whole path).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};

/// Most path components accepted in a relative path.
pub const MAX_PATH_COMPONENTS: usize = 32;

/// The buffer through which a file is read to be hashed (and copied, for a bundle's
/// artifact and the protected tree's copy): on the stack, or once per scan where the
/// reading recurses. Most files fork hashes (sources, tests, a bundle's small files) fit in
/// one read; a heap buffer of 64 KiB, zeroed for each file, cost 1.5 us a file more
/// (`fork evaluate` hashes about 80).
pub const READ_BUF: usize = 16 << 10;

/// Why a file beneath a directory was not opened. `component` is the path (relative to the
/// directory, or the directory's own path) of the component at fault.
#[derive(Debug, thiserror::Error)]
pub enum FsxError {
    /// The relative path is empty, absolute, escapes with `..`, holds a NUL or is too deep.
    #[error("`{rel}` is not a usable relative path: {reason}")]
    BadPath { rel: String, reason: &'static str },
    /// A component is a symbolic link.
    #[error("`{component}` is a symbolic link")]
    Symlink { component: String },
    /// A component is not of the expected file type.
    #[error("`{component}` is a {kind}, expected a {expected}")]
    WrongType {
        component: String,
        kind: &'static str,
        expected: &'static str,
    },
    /// A component does not exist.
    #[error("`{component}` does not exist")]
    Missing { component: String },
    /// The file is larger than allowed.
    #[error("larger than the {max}-byte limit ({size} bytes seen)")]
    TooLarge { size: u64, max: u64 },
    /// Any other failure, naming the operation.
    #[error("{op} of `{component}` failed: {source}")]
    Io {
        op: &'static str,
        component: String,
        #[source]
        source: std::io::Error,
    },
}

/// A regular file opened by [`open_beneath`], with what `fstat` said of its descriptor.
#[derive(Debug)]
pub struct Opened {
    /// The open file (read-only, non-blocking; a regular file never blocks anyway).
    pub file: File,
    /// Its size when opened, at most the limit.
    pub size: u64,
    /// Its hard link count.
    pub links: u64,
    max_bytes: u64,
    /// The path it was opened by, for messages.
    component: String,
}

impl Opened {
    /// The file as a reader that stops one byte past the limit, so a file growing after it
    /// was opened shows as longer than the limit instead of being read without end.
    pub fn bounded(self) -> std::io::Take<File> {
        self.file.take(self.max_bytes.saturating_add(1))
    }

    /// The whole file, refused with [`FsxError::TooLarge`] if it grew past the limit.
    pub fn read_all(self) -> Result<Vec<u8>, FsxError> {
        let (max, component) = (self.max_bytes, self.component.clone());
        let mut buf = Vec::with_capacity(usize::try_from(self.size).unwrap_or(0));
        self.bounded()
            .read_to_end(&mut buf)
            .map_err(|source| FsxError::Io {
                op: "read",
                component,
                source,
            })?;
        let size = buf.len() as u64;
        if size > max {
            return Err(FsxError::TooLarge { size, max });
        }
        Ok(buf)
    }
}

/// Opens the directory `path` to open files beneath. With `follow_last` false, a symbolic
/// link as its last component is refused ([`FsxError::Symlink`]); the directories above it
/// are the caller's and are trusted.
pub fn open_dir(path: &Path, follow_last: bool) -> Result<OwnedFd, FsxError> {
    let shown = || path.display().to_string();
    let mut flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    if !follow_last {
        flags |= OFlag::O_NOFOLLOW;
    }
    nix::fcntl::open(path, flags, Mode::empty()).map_err(|e| match e {
        // O_DIRECTORY is checked before O_NOFOLLOW, so a link shows as ENOTDIR.
        Errno::ELOOP | Errno::ENOTDIR
            if !follow_last
                && std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) =>
        {
            FsxError::Symlink { component: shown() }
        }
        Errno::ENOTDIR => not_a_directory(shown()),
        other => FsxError::Io {
            op: "open",
            component: shown(),
            source: other.into(),
        },
    })
}

/// Opens `rel` beneath the directory `dir` for reading: a regular file of at most
/// `max_bytes` bytes, reached without following any symbolic link (see the module docs).
pub fn open_beneath(dir: impl AsFd, rel: &str, max_bytes: u64) -> Result<Opened, FsxError> {
    open_beneath_with(dir.as_fd(), rel, max_bytes, Strategy::Auto)
}

/// How [`open_beneath_with`] resolves the path; only tests choose anything but `Auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    /// `openat2`, falling back on the walk where `openat2` is refused.
    Auto,
    /// `openat2` only: refused `openat2` is an error.
    #[cfg(test)]
    Openat2,
    /// The per-component walk only.
    #[cfg(test)]
    Walk,
}

/// Why the `openat2` path did not open the file.
enum Openat2Failure {
    /// `openat2` itself is refused here: use the walk.
    Unavailable(Errno),
    /// The path was refused; this is the answer.
    Refused(FsxError),
}

fn open_beneath_with(
    dir: BorrowedFd<'_>,
    rel: &str,
    max_bytes: u64,
    strategy: Strategy,
) -> Result<Opened, FsxError> {
    let parts = relative_parts(rel)?;
    let joined: PathBuf = parts.iter().collect();
    let shown = joined.display().to_string();
    let fd = match strategy {
        Strategy::Auto => match by_openat2(dir, &joined, &parts) {
            Ok(fd) => fd,
            Err(Openat2Failure::Unavailable(e)) => {
                tracing::debug!("openat2 refused ({e}): opening `{shown}` by a walk");
                walk(dir, &parts)?
            }
            Err(Openat2Failure::Refused(e)) => return Err(e),
        },
        #[cfg(test)]
        Strategy::Openat2 => by_openat2(dir, &joined, &parts).map_err(|f| match f {
            Openat2Failure::Unavailable(e) => errno_error("openat2", &shown, e),
            Openat2Failure::Refused(e) => e,
        })?,
        #[cfg(test)]
        Strategy::Walk => walk(dir, &parts)?,
    };
    let st = nix::sys::stat::fstat(&fd).map_err(|e| errno_error("fstat", &shown, e))?;
    expect_kind(&st, &shown, "regular file")?;
    // nlink_t is u64 on x86_64 but u32 on other targets: keep the conversion portable.
    #[allow(clippy::useless_conversion)]
    let links = u64::from(st.st_nlink);
    let size = u64::try_from(st.st_size).unwrap_or(0);
    if size > max_bytes {
        return Err(FsxError::TooLarge {
            size,
            max: max_bytes,
        });
    }
    Ok(Opened {
        file: File::from(fd),
        size,
        links,
        max_bytes,
        component: shown,
    })
}

/// Refuses `rel` as [`open_beneath`] would, without any system call: empty, absolute,
/// with `..` or NUL, naming the directory itself, or deeper than [`MAX_PATH_COMPONENTS`].
pub fn check_relative(rel: &str) -> Result<(), FsxError> {
    relative_parts(rel).map(drop)
}

/// The normal components of `rel`, or why it is refused.
fn relative_parts(rel: &str) -> Result<Vec<&std::ffi::OsStr>, FsxError> {
    let bad = |reason| FsxError::BadPath {
        rel: rel.to_string(),
        reason,
    };
    if rel.is_empty() {
        return Err(bad("it is empty"));
    }
    if rel.contains('\0') {
        return Err(bad("it contains a NUL byte"));
    }
    let mut parts = Vec::new();
    for comp in Path::new(rel).components() {
        match comp {
            Component::Normal(p) => parts.push(p),
            Component::CurDir => {}
            Component::ParentDir => return Err(bad("it contains `..`")),
            Component::RootDir | Component::Prefix(_) => return Err(bad("it is absolute")),
        }
    }
    if parts.is_empty() {
        return Err(bad("it names the directory itself"));
    }
    if parts.len() > MAX_PATH_COMPONENTS {
        return Err(bad("it has too many components"));
    }
    Ok(parts)
}

/// Errors `openat2` gives where it is not available to this process (see the module docs).
pub(crate) fn openat2_unavailable(e: Errno) -> bool {
    matches!(
        e,
        Errno::ENOSYS | Errno::EPERM | Errno::E2BIG | Errno::EINVAL
    )
}

fn by_openat2(
    dir: BorrowedFd<'_>,
    joined: &Path,
    parts: &[&std::ffi::OsStr],
) -> Result<OwnedFd, Openat2Failure> {
    let shown = joined.display().to_string();
    let how = |flags: OFlag| {
        OpenHow::new()
            .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS)
    };
    let refused = |e: Errno| {
        if openat2_unavailable(e) {
            Openat2Failure::Unavailable(e)
        } else {
            Openat2Failure::Refused(diagnose(dir, parts, &shown, e))
        }
    };
    // Look before opening: an O_PATH descriptor resolves the path without opening the file,
    // so a FIFO, socket or device is refused here without ever being opened.
    let probe = nix::fcntl::openat2(dir, joined, how(OFlag::O_PATH)).map_err(refused)?;
    let st = nix::sys::stat::fstat(&probe)
        .map_err(|e| Openat2Failure::Refused(errno_error("fstat", &shown, e)))?;
    expect_kind(&st, &shown, "regular file").map_err(Openat2Failure::Refused)?;
    // The entry could have been swapped since: O_NONBLOCK keeps a swapped-in FIFO from
    // blocking the open, and the caller's fstat of this descriptor refuses it.
    nix::fcntl::openat2(
        dir,
        joined,
        how(OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY),
    )
    .map_err(refused)
}

/// The error for a path `openat2` refused with `e`: the walk names the component at fault;
/// if the walk finds nothing (the tree changed in between), `e` for the whole path.
fn diagnose(dir: BorrowedFd<'_>, parts: &[&std::ffi::OsStr], shown: &str, e: Errno) -> FsxError {
    match walk(dir, parts) {
        Err(found) => found,
        Ok(_) => errno_error("openat2", shown, e),
    }
}

/// Opens `parts` beneath `dir` one component at a time, each with `O_NOFOLLOW`, looking at
/// each with `fstatat` first so that a non-directory, link or special file is refused
/// without being opened.
fn walk(dir: BorrowedFd<'_>, parts: &[&std::ffi::OsStr]) -> Result<OwnedFd, FsxError> {
    let mut cur = dir.try_clone_to_owned().map_err(|source| FsxError::Io {
        op: "dup",
        component: ".".into(),
        source,
    })?;
    let last = parts.len().saturating_sub(1);
    let mut walked = PathBuf::new();
    for (i, part) in parts.iter().enumerate() {
        walked.push(part);
        let shown = walked.display().to_string();
        let st = nix::sys::stat::fstatat(&cur, *part, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| errno_error("fstatat", &shown, e))?;
        let expected = if i == last {
            "regular file"
        } else {
            "directory"
        };
        expect_kind(&st, &shown, expected)?;
        // Open with O_NOFOLLOW anyway: the entry could have been swapped since fstatat.
        // O_NONBLOCK keeps a swapped-in FIFO from blocking the open; fstat refuses it later.
        let flags = if i == last {
            OFlag::O_RDONLY
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC
                | OFlag::O_NONBLOCK
                | OFlag::O_NOCTTY
        } else {
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
        };
        cur = nix::fcntl::openat(&cur, *part, flags, Mode::empty())
            .map_err(|e| errno_error("openat", &shown, e))?;
    }
    Ok(cur)
}

/// The kind of file `st` describes, as a word for messages.
/// Whether `st` (from a stat that did not follow links) is a directory.
pub fn is_directory(st: &FileStat) -> bool {
    file_kind(st) == "directory"
}

fn file_kind(st: &FileStat) -> &'static str {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFREG => "regular file",
        SFlag::S_IFDIR => "directory",
        SFlag::S_IFLNK => "symbolic link",
        SFlag::S_IFIFO => "FIFO",
        SFlag::S_IFSOCK => "socket",
        SFlag::S_IFCHR => "character device",
        SFlag::S_IFBLK => "block device",
        _ => "file of unknown type",
    }
}

/// Refuses `st` unless it is an `expected` ("regular file" or "directory"); a link is
/// named as such.
pub(crate) fn expect_kind(
    st: &FileStat,
    component: &str,
    expected: &'static str,
) -> Result<(), FsxError> {
    let kind = file_kind(st);
    if kind == "symbolic link" {
        return Err(FsxError::Symlink {
            component: component.to_string(),
        });
    }
    if kind != expected {
        return Err(FsxError::WrongType {
            component: component.to_string(),
            kind,
            expected,
        });
    }
    Ok(())
}

fn not_a_directory(component: String) -> FsxError {
    FsxError::WrongType {
        component,
        kind: "non-directory",
        expected: "directory",
    }
}

/// A file named on the command line (a patch), opened without blocking and checked on its
/// descriptor: it must be a regular file (a FIFO, socket or device is refused, and opening
/// with `O_NONBLOCK` never waits for a FIFO's writer). Symbolic links are followed: the
/// path is the user's own. Returns the file and its size as `fstat` gave it; the caller
/// reads what it needs, bounded.
pub fn open_regular(path: &Path) -> Result<(File, u64), FsxError> {
    let shown = path.display().to_string();
    let (fd, st) = open_nonblocking(path, OFlag::empty()).map_err(|(op, e)| match (op, e) {
        ("open", Errno::ENOENT) => FsxError::Missing {
            component: shown.clone(),
        },
        ("open", other) => FsxError::Io {
            op,
            component: shown.clone(),
            source: other.into(),
        },
        (op, other) => errno_error(op, &shown, other),
    })?;
    expect_kind(&st, &shown, "regular file")?;
    Ok((File::from(fd), u64::try_from(st.st_size).unwrap_or(0)))
}

/// `path` opened to read without waiting for a FIFO's writer (`O_NONBLOCK`) or taking a
/// terminal, and its `fstat`: what [`open_regular`] and [`open_input`] check the kind of.
/// `extra` adds flags (`O_NOFOLLOW`). The error names the step that failed.
fn open_nonblocking(
    path: &Path,
    extra: OFlag,
) -> Result<(OwnedFd, FileStat), (&'static str, Errno)> {
    let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC | extra;
    let fd = nix::fcntl::open(path, flags, Mode::empty()).map_err(|e| ("open", e))?;
    let st = nix::sys::stat::fstat(&fd).map_err(|e| ("fstat", e))?;
    Ok((fd, st))
}

/// An input file the user named (a policy, a manifest, a key, a bundle's document),
/// opened as [`open_regular`] opens a patch: without waiting for a FIFO's writer, and
/// refused unless it is a regular file, so no input can hang a command. The errors are
/// plain I/O errors (`NotFound` kept), for the caller's own error type.
pub fn open_input(path: &Path) -> std::io::Result<File> {
    open_input_with(path, OFlag::empty())
}

/// [`open_input`] for a file fork keeps itself (a ledger's head record), whose last
/// component fork never makes a symbolic link: one is refused, not followed
/// (`O_NOFOLLOW`: the error is `ELOOP`).
pub fn open_own_input(path: &Path) -> std::io::Result<File> {
    open_input_with(path, OFlag::O_NOFOLLOW)
}

fn open_input_with(path: &Path, extra: OFlag) -> std::io::Result<File> {
    let (fd, st) = open_nonblocking(path, extra).map_err(|(_, e)| std::io::Error::from(e))?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO, socket, device or directory is never read)",
        ));
    }
    Ok(File::from(fd))
}

/// [`open_input`], read whole as text.
pub fn read_input_to_string(path: &Path) -> std::io::Result<String> {
    let mut text = String::new();
    open_input(path)?.read_to_string(&mut text)?;
    Ok(text)
}

/// [`read_input_to_string`], refusing a file of more than `max` bytes (an `InvalidData`
/// error saying so) after reading at most `max + 1` of them, however large it is or grows.
pub fn read_input_to_string_capped(path: &Path, max: u64) -> std::io::Result<String> {
    let mut text = String::new();
    open_input(path)?
        .take(max.saturating_add(1))
        .read_to_string(&mut text)?;
    if text.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {max} bytes, more than any such file needs"),
        ));
    }
    Ok(text)
}

#[cfg(test)]
thread_local! {
    /// Runs in [`walk_tree`] between the look at an entry (`fstatat`) and what is done
    /// with it, given the entry's name: a test swaps the entry there, as a live writer of
    /// the tree could.
    pub(crate) static AFTER_LOOK: std::cell::RefCell<Option<LookHook>> =
        const { std::cell::RefCell::new(None) };
}

/// What [`AFTER_LOOK`] holds.
#[cfg(test)]
pub(crate) type LookHook = Box<dyn FnMut(&OsStr)>;

/// The error for an entry that is no longer the one looked at (`component`).
fn replaced(component: &str) -> FsxError {
    FsxError::Io {
        op: "walk",
        component: component.to_string(),
        source: std::io::Error::other(
            "the entry was replaced since it was looked at (the tree is being changed)",
        ),
    }
}

/// Opens the directory `name` beneath `dir` to walk it: never through a symbolic link
/// (`O_NOFOLLOW | O_DIRECTORY`), and checked on the descriptor to be the directory `seen`
/// (its `fstatat`) describes, by device and inode, so an entry swapped since it was
/// looked at is refused, never walked. With `open_up`, a directory whose owner lacks any
/// of read, write and search (a successor's 0000 directory, which could not be emptied) is
/// given mode 0700 through that descriptor (`fchmod`), never by name: a writer of the tree
/// who swaps the entry for a link (to `/usr/bin/sudo`, say) between the look and the
/// change gets a refusal, not the link's target's mode changed by root. `shown` names the
/// entry in errors.
///
/// Where the caller may not open the directory to read it (not root, a directory without
/// read permission), it is opened as a path only (`O_PATH`, the same flags and check),
/// its mode changed through `/proc/self/fd/N`, a link the kernel resolves to the opened
/// directory itself rather than to any name, and it is reopened through the same (and
/// checked again).
pub fn open_dir_checked(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    seen: &FileStat,
    open_up: bool,
    shown: &str,
) -> Result<OwnedFd, FsxError> {
    use nix::sys::stat::{fchmod, fchmodat, fstat, FchmodatFlags};
    use std::os::fd::AsRawFd;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let same = |fd: &OwnedFd| -> Result<FileStat, FsxError> {
        let st = fstat(fd).map_err(|e| errno_error("fstat", shown, e))?;
        if (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino) {
            return Err(replaced(shown));
        }
        Ok(st)
    };
    let closed = |st: &FileStat| open_up && st.st_mode & 0o700 != 0o700;
    let opened_up = Mode::from_bits_truncate(0o700);
    match nix::fcntl::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => {
            if closed(&same(&fd)?) {
                fchmod(&fd, opened_up).map_err(|e| errno_error("chmod", shown, e))?;
            }
            Ok(fd)
        }
        Err(Errno::EACCES) if open_up => {
            let path_only =
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            let held = nix::fcntl::openat(dir, name, path_only, Mode::empty())
                .map_err(|e| errno_error("open directory", shown, e))?;
            same(&held)?;
            let by_fd = PathBuf::from(format!("/proc/self/fd/{}", held.as_raw_fd()));
            let through_proc = |op: &'static str, e: Errno| FsxError::Io {
                op,
                component: shown.to_string(),
                source: std::io::Error::other(format!(
                    "{e}, through {} (is /proc mounted?)",
                    by_fd.display()
                )),
            };
            // Following this one link is the point: it is the descriptor's own directory.
            fchmodat(
                nix::fcntl::AT_FDCWD,
                &by_fd,
                opened_up,
                FchmodatFlags::FollowSymlink,
            )
            .map_err(|e| through_proc("chmod", e))?;
            let fd = nix::fcntl::open(&by_fd, flags & !OFlag::O_NOFOLLOW, Mode::empty())
                .map_err(|e| through_proc("open directory", e))?;
            same(&fd)?;
            Ok(fd)
        }
        Err(e) => Err(errno_error("open directory", shown, e)),
    }
}

/// Walks the tree beneath the directory open at `root` (named `root_shown` in messages),
/// depth first, holding one directory descriptor at a time: every path is resolved
/// relative to its own directory, so no depth of nesting makes a path too long, and
/// nesting cannot exhaust descriptors. `visit(dir, name, stat)` sees every entry (not
/// `root` itself; `stat` without following links) and says whether to descend into it
/// (only directories are descended into); `leave(parent, name)` runs once a directory's
/// entries are all visited. Each directory is entered as [`open_dir_checked`] opens it
/// (with `open_up` as given): never through a link, and only if it is still the directory
/// `visit` was shown. A directory is re-entered through `..` and checked to be the one that
/// was left, so a rename during the walk is an error, never a walk elsewhere. A writer of
/// the tree can make the walk fail, but not make it act beyond the directories it reached
/// (which, for a live writer, may include ones it moved in).
pub fn walk_tree(
    root: BorrowedFd<'_>,
    root_shown: &Path,
    open_up: bool,
    mut visit: impl FnMut(BorrowedFd<'_>, &OsStr, &FileStat) -> std::io::Result<bool>,
    mut leave: impl FnMut(BorrowedFd<'_>, &OsStr) -> std::io::Result<()>,
) -> Result<(), FsxError> {
    struct Level {
        name: OsString,
        /// Subdirectories still to walk, with what `fstatat` saw of each.
        pending: Vec<(OsString, FileStat)>,
    }
    let root_shown = root_shown.display().to_string();
    // Messages name the root, the depth and the entry (a deep path would be megabytes).
    let shown = |depth: usize, name: &OsStr| {
        format!(
            "{root_shown}/{}{}",
            if depth > 0 {
                format!("<{depth} levels>/")
            } else {
                String::new()
            },
            name.to_string_lossy()
        )
    };
    let dir_flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let entries = |dir: &OwnedFd,
                   depth: usize,
                   visit: &mut dyn FnMut(
        BorrowedFd<'_>,
        &OsStr,
        &FileStat,
    ) -> std::io::Result<bool>|
     -> Result<Vec<(OsString, FileStat)>, FsxError> {
        let names: Vec<OsString> = {
            let mut d = nix::dir::Dir::openat(dir, ".", dir_flags, Mode::empty())
                .map_err(|e| errno_error("read directory", &shown(depth, OsStr::new(".")), e))?;
            let mut names = Vec::new();
            for e in d.iter() {
                let e = e.map_err(|e| errno_error("read directory", &root_shown, e))?;
                let n = OsStr::from_bytes(e.file_name().to_bytes());
                if n != "." && n != ".." {
                    names.push(n.to_os_string());
                }
            }
            names
        };
        let mut dirs = Vec::new();
        for n in names {
            let st = match nix::sys::stat::fstatat(dir, n.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            {
                Ok(st) => st,
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(errno_error("stat", &shown(depth, &n), e)),
            };
            #[cfg(test)]
            AFTER_LOOK.with(|h| {
                if let Some(f) = h.borrow_mut().as_mut() {
                    f(&n)
                }
            });
            let descend = visit(dir.as_fd(), &n, &st).map_err(|source| FsxError::Io {
                op: "visit",
                component: shown(depth, &n),
                source,
            })?;
            if descend && file_kind(&st) == "directory" {
                dirs.push((n, st));
            }
        }
        Ok(dirs)
    };
    let mut cur = root.try_clone_to_owned().map_err(|source| FsxError::Io {
        op: "dup",
        component: root_shown.clone(),
        source,
    })?;
    let pending = entries(&cur, 0, &mut visit)?;
    let mut stack = vec![Level {
        name: OsString::new(),
        pending,
    }];
    loop {
        let depth = stack.len() - 1;
        let top = stack.last_mut().expect("the root level is popped last");
        if let Some((child, seen)) = top.pending.pop() {
            let fd = open_dir_checked(cur.as_fd(), &child, &seen, open_up, &shown(depth, &child))?;
            let pending = entries(&fd, depth + 1, &mut visit)?;
            cur = fd;
            stack.push(Level {
                name: child,
                pending,
            });
            continue;
        }
        let done = stack.pop().expect("a level");
        if stack.is_empty() {
            return Ok(());
        }
        let here = nix::sys::stat::fstat(&cur)
            .map_err(|e| errno_error("fstat", &shown(depth, &done.name), e))?;
        let parent = nix::fcntl::openat(&cur, "..", dir_flags, Mode::empty())
            .map_err(|e| errno_error("open directory", &shown(depth, OsStr::new("..")), e))?;
        let again =
            nix::sys::stat::fstatat(&parent, done.name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(|e| errno_error("stat", &shown(depth - 1, &done.name), e))?;
        if (again.st_dev, again.st_ino) != (here.st_dev, here.st_ino) {
            return Err(FsxError::Io {
                op: "walk",
                component: shown(depth - 1, &done.name),
                source: std::io::Error::other("the directory was moved during the walk"),
            });
        }
        leave(parent.as_fd(), &done.name).map_err(|source| FsxError::Io {
            op: "leave",
            component: shown(depth - 1, &done.name),
            source,
        })?;
        cur = parent;
    }
}

pub(crate) fn errno_error(op: &'static str, component: &str, e: Errno) -> FsxError {
    let component = component.to_string();
    match e {
        Errno::ENOENT => FsxError::Missing { component },
        Errno::ELOOP => FsxError::Symlink { component },
        Errno::ENOTDIR => not_a_directory(component),
        other => FsxError::Io {
            op,
            component,
            source: other.into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::time::Duration;

    const STRATEGIES: [Strategy; 3] = [Strategy::Auto, Strategy::Openat2, Strategy::Walk];

    fn open(d: &Path, rel: &str, max: u64, s: Strategy) -> Result<Opened, FsxError> {
        let dir = open_dir(d, false).unwrap();
        open_beneath_with(dir.as_fd(), rel, max, s)
    }

    /// `openat2` works on the kernels this crate is tested on; where a seccomp profile
    /// refuses it, the `Openat2` strategy cannot run and only the walk is exercised.
    fn openat2_refused() -> bool {
        let dir = open_dir(Path::new("/"), false).unwrap();
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH);
        matches!(nix::fcntl::openat2(&dir, ".", how), Err(e) if openat2_unavailable(e))
    }

    fn strategies() -> Vec<Strategy> {
        if openat2_refused() {
            eprintln!("openat2 is refused here: only the fallback walk is exercised");
            vec![Strategy::Auto, Strategy::Walk]
        } else {
            STRATEGIES.to_vec()
        }
    }

    #[test]
    fn reads_a_regular_file_beneath_with_every_strategy() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/f"), b"hello").unwrap();
        for s in strategies() {
            for rel in ["sub/f", "./sub/./f"] {
                let o = open(d.path(), rel, 5, s).unwrap();
                assert_eq!((o.size, o.links), (5, 1), "{s:?} {rel}");
                assert_eq!(o.read_all().unwrap(), b"hello", "{s:?} {rel}");
            }
        }
    }

    #[test]
    fn a_symlink_in_any_component_is_refused_and_named() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(outside.path().join("dir")).unwrap();
        std::fs::write(outside.path().join("dir/f"), b"secret").unwrap();
        std::fs::create_dir(d.path().join("real")).unwrap();
        symlink(outside.path().join("dir"), d.path().join("real/link")).unwrap();
        symlink(outside.path().join("dir/f"), d.path().join("last")).unwrap();
        symlink("/nonexistent/nowhere", d.path().join("dangling")).unwrap();
        // A relative link that stays beneath the directory is refused too.
        std::fs::write(d.path().join("real/f"), b"x").unwrap();
        symlink("real", d.path().join("inside")).unwrap();
        for s in strategies() {
            for (rel, at) in [
                ("real/link/f", "real/link"),
                ("last", "last"),
                ("dangling", "dangling"),
                ("inside/f", "inside"),
            ] {
                let e = open(d.path(), rel, 100, s).unwrap_err();
                assert!(
                    matches!(&e, FsxError::Symlink { component } if component == at),
                    "{s:?} {rel}: {e}"
                );
            }
        }
        // The directory itself as a link: refused unless the caller follows it.
        let link_dir = d.path().join("dir-link");
        symlink(outside.path(), &link_dir).unwrap();
        let e = open_dir(&link_dir, false).unwrap_err();
        assert!(matches!(e, FsxError::Symlink { .. }), "{e}");
        let dir = open_dir(&link_dir, true).unwrap();
        assert_eq!(
            open_beneath(&dir, "dir/f", 100)
                .unwrap()
                .read_all()
                .unwrap(),
            b"secret"
        );
    }

    #[test]
    fn escaping_and_absolute_paths_are_refused_before_any_lookup() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("a")).unwrap();
        let deep = vec!["a"; MAX_PATH_COMPONENTS + 1].join("/");
        for s in strategies() {
            for rel in [
                "",
                "..",
                "../x",
                "a/../../x",
                "a/..",
                "/etc/passwd",
                ".",
                "a\0b",
                &deep,
            ] {
                let e = open(d.path(), rel, 100, s).unwrap_err();
                assert!(matches!(e, FsxError::BadPath { .. }), "{s:?} {rel:?}: {e}");
            }
        }
    }

    #[test]
    fn fifos_devices_and_directories_are_refused_without_hanging() {
        let d = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(&d.path().join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        std::fs::create_dir(d.path().join("dir")).unwrap();
        std::fs::write(d.path().join("file"), b"x").unwrap();
        // (relative path, component at fault, kind it is)
        let mut cases = vec![
            ("fifo", "fifo", "FIFO"),
            ("dir", "dir", "directory"),
            ("file/child", "file", "regular file"),
        ];
        // A character device (the null device), when this process may make one.
        if nix::sys::stat::mknod(
            &d.path().join("null"),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(1, 3),
        )
        .is_ok()
        {
            cases.push(("null", "null", "character device"));
        }
        for s in strategies() {
            for (rel, at, want) in &cases {
                // On another thread, so that an open that blocks fails the test instead of
                // hanging it.
                let (tx, rx) = std::sync::mpsc::channel();
                let (root, rel_owned) = (d.path().to_path_buf(), rel.to_string());
                std::thread::spawn(move || tx.send(open(&root, &rel_owned, 100, s).map(drop)));
                let e = rx
                    .recv_timeout(Duration::from_secs(10))
                    .unwrap_or_else(|_| panic!("{s:?} {rel}: the open blocked"))
                    .unwrap_err();
                assert!(
                    matches!(&e, FsxError::WrongType { component, kind, .. }
                        if component == at && kind == want),
                    "{s:?} {rel}: {e}"
                );
            }
            let e = open(d.path(), "missing/f", 100, s).unwrap_err();
            assert!(
                matches!(&e, FsxError::Missing { component } if component == "missing"),
                "{s:?}: {e}"
            );
        }
    }

    #[test]
    fn oversize_is_refused_from_fstat_and_while_reading() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("big"), vec![b'a'; 4097]).unwrap();
        let sparse = File::create(d.path().join("sparse")).unwrap();
        sparse.set_len(1 << 30).unwrap();
        for s in strategies() {
            let e = open(d.path(), "big", 4096, s).unwrap_err();
            assert!(
                matches!(
                    e,
                    FsxError::TooLarge {
                        size: 4097,
                        max: 4096
                    }
                ),
                "{s:?}: {e}"
            );
            assert_eq!(open(d.path(), "big", 4097, s).unwrap().size, 4097);
            let e = open(d.path(), "sparse", 1 << 20, s).unwrap_err();
            assert!(matches!(e, FsxError::TooLarge { .. }), "{s:?}: {e}");
        }
        // A file that grows after it was opened is cut one byte past the limit and refused.
        let o = open(d.path(), "big", 4097, Strategy::Auto).unwrap();
        std::fs::write(d.path().join("big"), vec![b'a'; 10_000]).unwrap();
        let e = o.read_all().unwrap_err();
        assert!(
            matches!(
                e,
                FsxError::TooLarge {
                    size: 4098,
                    max: 4097
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn hard_links_are_counted_on_the_descriptor() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), b"x").unwrap();
        std::fs::hard_link(d.path().join("f"), d.path().join("g")).unwrap();
        for s in strategies() {
            assert_eq!(open(d.path(), "g", 100, s).unwrap().links, 2, "{s:?}");
        }
    }
}
