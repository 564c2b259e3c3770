//! The mount layer: the supervisor plans the successor's root (pure, testable), the
//! sandbox init carries the plan out inside its new user + mount namespaces and
//! pivot_roots into it.
//!
//! The constructed root, for `root = "host"`:
//! - the host root bound recursively, read-only, nosuid, nodev;
//! - `/tmp`: the run's size-capped filesystem (writable), holding the workspace at
//!   `/tmp/successor`;
//! - `/proc`: a fresh procfs for the sandbox's pid namespace, with the kernel's
//!   sensitive files masked and `/proc/sys` read-only (the user namespace's limits,
//!   [`super::userns_limits`], are written there first);
//! - `/dev`: a read-only tmpfs with null, zero, full, random, urandom, tty (bound from the
//!   host), a private devpts at /dev/pts (+ ptmx), /dev/shm (a directory of the capped
//!   disk, `/tmp/.fork-shm`, so it counts against the disk budget; without a capped disk
//!   a private tmpfs of the policy's `shm` size); no block devices;
//! - `/sys`: with a network namespace, a fresh sysfs (its `class/net` shows only the
//!   sandbox's loopback; `fs/cgroup` is empty); else the host's, read-only;
//! - the spec's read-only binds (e.g. a protected tree over the workspace);
//! - hidden paths: an empty read-only directory or empty file over each secret (the empty
//!   file comes from a tmpfs made inside the sandbox, so no host path names it).
//!
//! As root, the supervisor hands the capped disk and the read-only binds to the init as
//! detached mount trees (`open_tree`), and clones the init from a private copy of its
//! mount namespace in which every mount beneath the run root and the host's cgroup mounts
//! are detached: no host run directory is part of the sandbox's mount table.
//!
//! For `root = "minimal"` the base is an empty tmpfs (made read-only at the end) holding
//! only the policy's `binds`, read-only.

use crate::ioerr::{IoContext, IoError};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum MountError {
    #[error("{op} {path}: {source}")]
    Sys {
        op: &'static str,
        path: PathBuf,
        source: nix::Error,
    },
    #[error("{} {}: {}", .0.action, .0.path.display(), .0.source)]
    Io(#[from] IoError),
    /// The sandbox's user namespace refused its own limits ([`super::userns_limits`]).
    #[error("lowering the sandbox's user namespace limits: {0}")]
    UserLimits(String),
}

fn sys_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(nix::Error) -> MountError + 'a {
    move |source| MountError::Sys {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// One step of building the root. Paths in `dst` are inside the new root.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MountOp {
    /// The host root, recursively, read-only, nosuid, nodev, as the new root.
    HostRoot,
    /// An empty tmpfs as the new root (minimal mode); made read-only by `Seal`.
    EmptyRoot,
    /// Bind a host path read-only (recursive) at the same place; symlinks are recreated.
    BindRo { src: PathBuf },
    /// Bind a host directory read-write at `dst` (nosuid, nodev).
    BindRw { src: PathBuf, dst: PathBuf },
    /// A private tmpfs of `size` bytes at `dst` (nosuid, nodev), mode 1777.
    Tmpfs { dst: PathBuf, size: u64 },
    /// A fresh procfs at /proc with sensitive entries masked.
    Proc,
    /// The minimal /dev, with a tmpfs of `shm_size` bytes at /dev/shm (0: none, a bind
    /// follows).
    Dev { shm_size: u64 },
    /// Hide a host path: an empty read-only dir over a directory, an empty read-only file
    /// of mode 000 (from a tmpfs made inside the sandbox) over a file.
    Hide { dst: PathBuf, dir: bool },
    /// Bind a host path read-only (recursive, nosuid, nodev) at `dst`, creating the mount
    /// point (a directory when `dir`, else a file) when it is missing.
    BindInto {
        src: PathBuf,
        dst: PathBuf,
        dir: bool,
    },
    /// Attach the detached mount tree the init holds as descriptor `fd` at `dst` (the
    /// supervisor made it with `open_tree` and set its flags), creating the mount point
    /// when it is missing.
    Attach { fd: i32, dst: PathBuf, dir: bool },
    /// A fresh sysfs at /sys, read-only (needs the sandbox's own network namespace).
    Sysfs,
    /// Make the new root's base mount read-only (minimal mode).
    Seal,
}

/// The directory of the capped disk (the sandbox's /tmp) that is also its /dev/shm.
pub const SHM_DIR: &str = ".fork-shm";

/// Inputs for planning a root.
#[derive(Debug, Clone)]
pub struct RootPlan<'a> {
    pub mode: crate::sandbox::spec::RootMode,
    pub binds: &'a [PathBuf],
    pub hide: &'a [PathBuf],
    /// The host directory that becomes /tmp (holds the workspace).
    pub tmp_src: Option<&'a Path>,
    /// Size of /tmp when `tmp_src` is None (a tmpfs made inside the sandbox).
    pub tmp_size: u64,
    /// Without a capped disk (`tmp_src` None): the host directory bound at /tmp/successor.
    pub workspace_src: Option<&'a Path>,
    pub shm_size: u64,
    /// Read-only binds into the sandbox (after /tmp and the workspace exist).
    pub ro_binds: &'a [crate::sandbox::spec::RoBind],
    /// A fresh sysfs at /sys (the sandbox has its own network namespace).
    pub fresh_sysfs: bool,
}

/// Plans the mount operations (pure: reads only host metadata to resolve hide paths).
pub fn plan(p: &RootPlan<'_>) -> Vec<MountOp> {
    let mut ops = Vec::new();
    match p.mode {
        crate::sandbox::spec::RootMode::Host => ops.push(MountOp::HostRoot),
        crate::sandbox::spec::RootMode::Minimal => {
            ops.push(MountOp::EmptyRoot);
            for b in p.binds {
                if std::fs::symlink_metadata(b).is_ok() {
                    ops.push(MountOp::BindRo { src: b.clone() });
                }
            }
        }
    }
    ops.push(MountOp::Proc);
    // On a capped disk, /dev/shm is a directory of that disk (inside the disk budget),
    // bound over the /dev/shm that `Dev` then leaves without a filesystem of its own.
    ops.push(MountOp::Dev {
        shm_size: if p.tmp_src.is_some() { 0 } else { p.shm_size },
    });
    match p.tmp_src {
        Some(src) => {
            ops.push(MountOp::BindRw {
                src: src.to_path_buf(),
                dst: PathBuf::from("/tmp"),
            });
            ops.push(MountOp::BindRw {
                src: src.join(SHM_DIR),
                dst: PathBuf::from("/dev/shm"),
            });
        }
        None => {
            ops.push(MountOp::Tmpfs {
                dst: PathBuf::from("/tmp"),
                size: p.tmp_size,
            });
            if let Some(ws) = p.workspace_src {
                ops.push(MountOp::BindRw {
                    src: ws.to_path_buf(),
                    dst: PathBuf::from(super::WORKSPACE),
                });
            }
        }
    }
    if p.fresh_sysfs && p.mode == crate::sandbox::spec::RootMode::Host {
        ops.push(MountOp::Sysfs);
    }
    for b in p.ro_binds {
        let Ok(md) = std::fs::symlink_metadata(&b.src) else {
            continue;
        };
        ops.push(MountOp::BindInto {
            src: b.src.clone(),
            dst: b.dst.clone(),
            dir: md.is_dir(),
        });
    }
    let mut hidden: Vec<PathBuf> = Vec::new();
    for h in p.hide {
        // Hide what the path really is: a symlinked secret is hidden at its target too.
        let mut targets = vec![h.clone()];
        if let Ok(c) = std::fs::canonicalize(h) {
            if &c != h {
                targets.push(c);
            }
        }
        for t in targets {
            if hidden.contains(&t) || t == Path::new("/") {
                continue;
            }
            // Paths under /tmp, /proc or /dev are already private.
            if ["/tmp", "/proc", "/dev"].iter().any(|p| t.starts_with(p)) {
                continue;
            }
            let Ok(md) = std::fs::symlink_metadata(&t) else {
                continue;
            };
            if md.file_type().is_symlink() {
                continue;
            }
            if p.mode == crate::sandbox::spec::RootMode::Minimal
                && !p.binds.iter().any(|b| t.starts_with(b))
            {
                continue;
            }
            hidden.push(t.clone());
            ops.push(MountOp::Hide {
                dst: t,
                dir: md.is_dir(),
            });
        }
    }
    if p.mode == crate::sandbox::spec::RootMode::Minimal {
        ops.push(MountOp::Seal);
    }
    ops
}

fn inside(root: &Path, p: &Path) -> PathBuf {
    root.join(p.strip_prefix("/").unwrap_or(p))
}

/// Recursively sets mount attributes on `path` (mount_setattr(2), AT_RECURSIVE).
fn setattr_recursive(path: &Path, set: u64, clr: u64) -> Result<(), MountError> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
        MountError::Sys {
            op: "mount_setattr",
            path: path.to_path_buf(),
            source: nix::Error::EINVAL,
        }
    })?;
    super::sys::mount_setattr_recursive(&c, set, clr).map_err(|source| MountError::Sys {
        op: "mount_setattr",
        path: path.to_path_buf(),
        source,
    })
}

pub(super) const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub(super) const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub(super) const MOUNT_ATTR_NODEV: u64 = 0x4;
pub(super) const MOUNT_ATTR_NOEXEC: u64 = 0x8;

/// The flags of the mount at `path` that a bind remount must keep: in a user namespace the
/// kernel locks the flags of every mount inherited from the parent namespace (nosuid,
/// nodev, noexec, read-only and the atime mode, `MNT_LOCK_*`), and a remount that would
/// drop one fails with EPERM. This is how a hidden file or a read-only bind on an
/// overlayfs, 9p or container root (mounted noexec, noatime, ...) keeps working.
fn kept_flags(st: nix::sys::statvfs::FsFlags) -> MsFlags {
    use nix::sys::statvfs::FsFlags as F;
    let mut keep = MsFlags::empty();
    for (f, m) in [
        (F::ST_RDONLY, MsFlags::MS_RDONLY),
        (F::ST_NOSUID, MsFlags::MS_NOSUID),
        (F::ST_NODEV, MsFlags::MS_NODEV),
        (F::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (F::ST_NOATIME, MsFlags::MS_NOATIME),
        (F::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (F::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if st.contains(f) {
            keep |= m;
        }
    }
    // A remount without an atime flag means relatime: keep strictatime explicitly.
    if !st.intersects(F::ST_NOATIME | F::ST_RELATIME) {
        keep |= MsFlags::MS_STRICTATIME;
    }
    keep
}

/// `mount(MS_BIND | MS_REMOUNT | flags)` on the bind mount at `path`, keeping the flags it
/// already has (see `kept_flags`): it only ever adds restrictions.
fn remount_bind(path: &Path, flags: MsFlags) -> nix::Result<()> {
    let st = nix::sys::statvfs::statvfs(path)?;
    mount(
        None::<&str>,
        path,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | flags | kept_flags(st.flags()),
        None::<&str>,
    )
}

fn touch(p: &Path) -> Result<(), MountError> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(p)
        .ctx("create", p)?;
    Ok(())
}

fn mkdirs(p: &Path) -> Result<(), MountError> {
    Ok(std::fs::create_dir_all(p).ctx("mkdir", p)?)
}

fn cpath(p: &Path) -> Result<std::ffi::CString, MountError> {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| MountError::Sys {
        op: "path",
        path: p.to_path_buf(),
        source: nix::Error::EINVAL,
    })
}

/// Makes sure a mount point of the right kind exists at `d` (a directory, or a file).
fn mount_point(d: &Path, dir: bool) -> Result<(), MountError> {
    match std::fs::symlink_metadata(d) {
        Ok(md) if md.is_dir() == dir && !md.file_type().is_symlink() => Ok(()),
        Ok(_) => Err(MountError::Sys {
            op: "mount point (a different kind of file is there)",
            path: d.to_path_buf(),
            source: nix::Error::ENOTDIR,
        }),
        Err(_) if dir => mkdirs(d),
        Err(_) => {
            if let Some(parent) = d.parent() {
                mkdirs(parent)?;
            }
            touch(d)
        }
    }
}

/// Empty read-only files to cover others with: one file on a small tmpfs made here,
/// inside the sandbox and attached nowhere, bound over each file to cover (so the mount
/// table names no host file as their source). Its mode is 000: the command (its owner,
/// without capabilities) can open it for nothing, as an unprivileged process cannot open
/// `/etc/shadow`; a covered database cannot even be locked.
#[derive(Default)]
struct EmptyFiles(Option<std::os::fd::OwnedFd>);

impl EmptyFiles {
    const NAME: &'static std::ffi::CStr = c"empty";

    fn cover(&mut self, target: &Path) -> Result<(), MountError> {
        use std::os::fd::AsFd;
        let err = |op: &'static str| {
            move |source| MountError::Sys {
                op,
                path: target.to_path_buf(),
                source,
            }
        };
        if self.0.is_none() {
            let fs = super::sys::detached_tmpfs(
                c"4k",
                c"0755",
                MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
            )
            .map_err(err("a tmpfs for empty files"))?;
            let f = nix::fcntl::openat(
                fs.as_fd(),
                Self::NAME,
                nix::fcntl::OFlag::O_CREAT
                    | nix::fcntl::OFlag::O_WRONLY
                    | nix::fcntl::OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(err("create an empty file"))?;
            drop(f);
            super::sys::mount_setattr_fd(fs.as_fd(), MOUNT_ATTR_RDONLY, 0)
                .map_err(err("make the empty file read-only"))?;
            self.0 = Some(fs);
        }
        let Some(fs) = &self.0 else {
            return Err(err("empty file")(nix::Error::EINVAL));
        };
        match super::sys::open_tree_clone_at(fs.as_fd(), Self::NAME) {
            Ok(one) => {
                super::sys::move_mount_to(one.as_fd(), &cpath(target)?).map_err(err("cover"))
            }
            // Kernels that cannot clone from a mount attached nowhere (Debian 12's 6.1, for
            // one): /dev/null, read-only, as before (the README's known limits).
            Err(nix::Error::EINVAL) => Self::cover_with_dev_null(target),
            Err(e) => Err(err("clone the empty file")(e)),
        }
    }

    /// Attaches the empty-file tmpfs (if one was made) in the old root's tree, on the run
    /// directory's `disk` beside `newroot`, so that it leaves with the old root when
    /// `pivot` detaches that: one detach, where closing its descriptor while it is attached
    /// nowhere would dissolve it in a second one (each waits for an RCU grace period of
    /// the kernel: milliseconds on a loaded machine, before the command can start). When
    /// that fails it is dropped as before.
    fn retire_beside(&mut self, newroot: &Path) {
        use std::os::fd::AsFd;
        let Some(fs) = self.0.take() else { return };
        let Some(run_dir) = newroot.parent() else {
            return;
        };
        if let Ok(c) = cpath(&run_dir.join("disk")) {
            let _ = super::sys::move_mount_to(fs.as_fd(), &c);
        }
    }

    fn cover_with_dev_null(target: &Path) -> Result<(), MountError> {
        mount(
            Some("/dev/null"),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(sys_err("hide (bind /dev/null over)", target))?;
        remount_bind(
            target,
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        )
        .map_err(sys_err("hide (read-only)", target))
    }
}

/// Runs in the sandbox init (inside its user and mount namespaces): builds the new root
/// at `newroot` and pivots into it. On return, `/` is the new root and the host root is
/// detached. With `scratch`, `newroot`'s parent (the run directory) is first covered by a
/// small tmpfs of the init's own, holding `newroot` (and the `disk` the empty-file tmpfs
/// retires to): the host's run directory then needs no mount point, which costs a
/// directory made and removed on the host's filesystem for every run (on ext4 mounted
/// with `discard`, each rmdir about 0.2 ms). The tmpfs leaves with the old root.
pub fn build_and_pivot(newroot: &Path, scratch: bool, ops: &[MountOp]) -> Result<(), MountError> {
    // Nothing we do may propagate back to the host.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(sys_err("make / private", Path::new("/")))?;
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    // With a scratch tmpfs, the host root is cloned before it is mounted (a recursive bind
    // taken after would carry the scratch tmpfs, the new root's own mount point, into the
    // new root).
    let mut host_root = None;
    if scratch {
        if ops.iter().any(|o| matches!(o, MountOp::HostRoot)) {
            host_root = Some(
                super::sys::open_tree_clone(c"/")
                    .map_err(sys_err("clone the host root", Path::new("/")))?,
            );
        }
        let run_dir = newroot.parent().unwrap_or(newroot);
        mount(
            Some("tmpfs"),
            run_dir,
            Some("tmpfs"),
            nosuid_nodev | MsFlags::MS_NOEXEC,
            Some("mode=0700,size=64k"),
        )
        .map_err(sys_err("mount the scratch tmpfs", run_dir))?;
        mkdirs(newroot)?;
        mkdirs(&run_dir.join("disk"))?;
    }
    let mut minimal = false;
    let mut stash = EmptyFiles::default();
    for op in ops {
        match op {
            MountOp::HostRoot => {
                match host_root.take() {
                    Some(tree) => {
                        use std::os::fd::AsFd;
                        super::sys::move_mount_to(tree.as_fd(), &cpath(newroot)?)
                            .map_err(sys_err("attach host root", newroot))?
                    }
                    None => mount(
                        Some("/"),
                        newroot,
                        None::<&str>,
                        MsFlags::MS_BIND | MsFlags::MS_REC,
                        None::<&str>,
                    )
                    .map_err(sys_err("bind host root", newroot))?,
                }
                setattr_recursive(
                    newroot,
                    MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                    0,
                )?;
            }
            MountOp::EmptyRoot => {
                minimal = true;
                mount(
                    Some("tmpfs"),
                    newroot,
                    Some("tmpfs"),
                    nosuid_nodev,
                    Some("mode=0755,size=1m"),
                )
                .map_err(sys_err("mount tmpfs root", newroot))?;
                for d in ["proc", "dev", "tmp"] {
                    mkdirs(&newroot.join(d))?;
                }
            }
            MountOp::BindRo { src } => {
                let dst = inside(newroot, src);
                let md = std::fs::symlink_metadata(src).ctx("stat", src)?;
                if let Some(parent) = dst.parent() {
                    mkdirs(parent)?;
                }
                if md.file_type().is_symlink() {
                    let target = std::fs::read_link(src).ctx("readlink", src)?;
                    if std::fs::symlink_metadata(&dst).is_err() {
                        symlink(&target, &dst).ctx("symlink", &dst)?;
                    }
                    continue;
                }
                if md.is_dir() {
                    mkdirs(&dst)?;
                } else {
                    touch(&dst)?;
                }
                mount(
                    Some(src.as_path()),
                    &dst,
                    None::<&str>,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    None::<&str>,
                )
                .map_err(sys_err("bind", src))?;
                setattr_recursive(
                    &dst,
                    MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                    0,
                )?;
            }
            MountOp::BindRw { src, dst } => {
                let d = inside(newroot, dst);
                if minimal || !d.exists() {
                    mkdirs(&d)?;
                }
                mount(
                    Some(src.as_path()),
                    &d,
                    None::<&str>,
                    MsFlags::MS_BIND,
                    None::<&str>,
                )
                .map_err(sys_err("bind", src))?;
                remount_bind(&d, nosuid_nodev).map_err(sys_err("remount nosuid,nodev", &d))?;
            }
            MountOp::Tmpfs { dst, size } => {
                let d = inside(newroot, dst);
                if minimal {
                    mkdirs(&d)?;
                }
                let data = format!("mode=1777,size={size}");
                mount(
                    Some("tmpfs"),
                    &d,
                    Some("tmpfs"),
                    nosuid_nodev,
                    Some(data.as_str()),
                )
                .map_err(sys_err("mount tmpfs", &d))?;
            }
            MountOp::Proc => mount_proc(newroot, &mut stash)?,
            MountOp::Dev { shm_size } => mount_dev(newroot, *shm_size)?,
            MountOp::Hide { dst, dir } => {
                let d = inside(newroot, dst);
                // A path the sandbox's uid cannot even reach (e.g. under root's 0700 home)
                // is already invisible to the successor, which runs as that uid with fewer rights.
                match std::fs::symlink_metadata(&d) {
                    Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    _ => {}
                }
                if *dir {
                    mount(
                        Some("tmpfs"),
                        &d,
                        Some("tmpfs"),
                        nosuid_nodev | MsFlags::MS_NOEXEC | MsFlags::MS_RDONLY,
                        Some("mode=0755,size=4k"),
                    )
                    .map_err(sys_err("hide (tmpfs over)", dst))?;
                } else {
                    stash.cover(&d)?;
                }
            }
            MountOp::BindInto { src, dst, dir } => {
                let d = inside(newroot, dst);
                mount_point(&d, *dir)?;
                mount(
                    Some(src.as_path()),
                    &d,
                    None::<&str>,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    None::<&str>,
                )
                .map_err(sys_err("bind", src))?;
                setattr_recursive(
                    &d,
                    MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                    0,
                )?;
            }
            MountOp::Attach { fd, dst, dir } => {
                let d = inside(newroot, dst);
                let tree = super::sys::adopt_inherited_fd(*fd).ok_or(MountError::Sys {
                    op: "attach (the supervisor's mount descriptor is not open)",
                    path: dst.clone(),
                    source: nix::Error::EBADF,
                })?;
                if minimal || !*dir {
                    mount_point(&d, *dir)?;
                } else if std::fs::symlink_metadata(&d).is_err() {
                    mkdirs(&d)?;
                }
                super::sys::move_mount_to(std::os::fd::AsFd::as_fd(&tree), &cpath(&d)?)
                    .map_err(sys_err("attach", dst))?;
            }
            MountOp::Sysfs => {
                let d = newroot.join("sys");
                mkdirs(&d)?;
                mount(
                    Some("sysfs"),
                    &d,
                    Some("sysfs"),
                    MsFlags::MS_RDONLY | nosuid_nodev | MsFlags::MS_NOEXEC,
                    None::<&str>,
                )
                .map_err(sys_err("mount sysfs", &d))?;
            }
            MountOp::Seal => {
                remount_bind(newroot, MsFlags::MS_RDONLY | nosuid_nodev)
                    .map_err(sys_err("remount root read-only", newroot))?;
            }
        }
    }
    stash.retire_beside(newroot);
    pivot(newroot)
}

fn mount_proc(newroot: &Path, stash: &mut EmptyFiles) -> Result<(), MountError> {
    let p = newroot.join("proc");
    mount(
        Some("proc"),
        &p,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(sys_err("mount proc", &p))?;
    // The user namespace's own limits, while /proc/sys is still writable (made read-only
    // below) and before anything of the command runs.
    super::userns_limits::apply(&p).map_err(MountError::UserLimits)?;
    // The kernel's own sensitive files, as container runtimes mask them.
    for f in [
        "kcore",
        "keys",
        "timer_list",
        "sysrq-trigger",
        "kallsyms",
        "sched_debug",
    ] {
        let t = p.join(f);
        if t.is_file() {
            stash.cover(&t)?;
        }
    }
    for d in ["sys", "bus", "irq", "fs"] {
        let t = p.join(d);
        if t.is_dir() {
            mount(
                Some(t.as_path()),
                &t,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            )
            .map_err(sys_err("bind", &t))?;
            setattr_recursive(
                &t,
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                0,
            )?;
        }
    }
    Ok(())
}

/// Device files bound from the host into the minimal /dev.
pub const DEV_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

fn mount_dev(newroot: &Path, shm_size: u64) -> Result<(), MountError> {
    let dev = newroot.join("dev");
    mount(
        Some("tmpfs"),
        &dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=64k"),
    )
    .map_err(sys_err("mount tmpfs", &dev))?;
    for n in DEV_NODES {
        let host = Path::new("/dev").join(n);
        let t = dev.join(n);
        // The bind's mount point: an empty file in the fresh tmpfs, made in one mknod(2)
        // rather than an open and a close.
        nix::sys::stat::mknod(
            &t,
            nix::sys::stat::SFlag::S_IFREG,
            nix::sys::stat::Mode::from_bits_truncate(0o644),
            0,
        )
        .map_err(sys_err("create", &t))?;
        mount(
            Some(host.as_path()),
            &t,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(sys_err("bind device", &host))?;
    }
    let pts = dev.join("pts");
    mkdirs(&pts)?;
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .map_err(sys_err("mount devpts", &pts))?;
    symlink("pts/ptmx", dev.join("ptmx")).ctx("symlink", &dev.join("ptmx"))?;
    let shm = dev.join("shm");
    mkdirs(&shm)?;
    // 0: the capped disk's shm directory is bound here instead (see `plan`).
    if shm_size > 0 {
        let data = format!("mode=1777,size={shm_size}");
        mount(
            Some("tmpfs"),
            &shm,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(data.as_str()),
        )
        .map_err(sys_err("mount /dev/shm", &shm))?;
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("core", "/proc/kcore"),
    ] {
        symlink(target, dev.join(name)).ctx("symlink", &dev.join(name))?;
    }
    // The /dev directory itself is read-only; the device binds, pts and shm keep their own flags.
    remount_bind(
        &dev,
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
    )
    .map_err(sys_err("remount /dev read-only", &dev))?;
    Ok(())
}

/// pivot_root(new, new) then detach the old root stacked beneath (as runc does): no
/// directory for the old root is needed inside the read-only new root.
fn pivot(newroot: &Path) -> Result<(), MountError> {
    nix::unistd::chdir(newroot).map_err(sys_err("chdir", newroot))?;
    nix::unistd::pivot_root(".", ".").map_err(sys_err("pivot_root", newroot))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(sys_err("detach old root", Path::new("/")))?;
    nix::unistd::chdir("/").map_err(sys_err("chdir", Path::new("/")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::spec::RootMode;

    #[test]
    fn host_plan_order_and_hiding() {
        let tmp = tempfile::tempdir().unwrap();
        let secret_dir = tmp.path().join("secrets");
        std::fs::create_dir(&secret_dir).unwrap();
        let secret_file = tmp.path().join("key");
        std::fs::write(&secret_file, b"k").unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&secret_file, &link).unwrap();
        // tempdir lives under /tmp, which is private anyway: use a path elsewhere too.
        let hide = vec![
            PathBuf::from("/etc/hostname"),
            PathBuf::from("/nonexistent/fork-test"),
            PathBuf::from("/etc"),
            link.clone(),
        ];
        let ops = plan(&RootPlan {
            mode: RootMode::Host,
            binds: &[],
            hide: &hide,
            tmp_src: Some(Path::new("/x/disk")),
            tmp_size: 0,
            workspace_src: None,
            shm_size: 1 << 20,
            ro_binds: &[],
            fresh_sysfs: true,
        });
        assert_eq!(ops[0], MountOp::HostRoot);
        assert!(ops.contains(&MountOp::Proc));
        assert!(ops.contains(&MountOp::BindRw {
            src: PathBuf::from("/x/disk"),
            dst: PathBuf::from("/tmp")
        }));
        // /dev/shm lives on the capped disk: no tmpfs of its own, the disk's directory.
        assert!(ops.contains(&MountOp::Dev { shm_size: 0 }));
        assert!(ops.contains(&MountOp::BindRw {
            src: PathBuf::from("/x/disk").join(SHM_DIR),
            dst: PathBuf::from("/dev/shm")
        }));
        assert!(ops.contains(&MountOp::Hide {
            dst: PathBuf::from("/etc"),
            dir: true
        }));
        // Nonexistent paths are skipped; /tmp paths are private already.
        assert!(!ops
            .iter()
            .any(|o| matches!(o, MountOp::Hide { dst, .. } if dst.starts_with("/nonexistent"))));
        assert!(!ops
            .iter()
            .any(|o| matches!(o, MountOp::Hide { dst, .. } if dst.starts_with("/tmp"))));
        // Hides come after the mounts they cover.
        let first_hide = ops
            .iter()
            .position(|o| matches!(o, MountOp::Hide { .. }))
            .unwrap();
        let tmp_pos = ops
            .iter()
            .position(|o| matches!(o, MountOp::BindRw { .. }))
            .unwrap();
        assert!(tmp_pos < first_hide);
    }

    #[test]
    fn a_remount_keeps_the_locked_flags() {
        use nix::sys::statvfs::FsFlags as F;
        let k = kept_flags(F::ST_NOSUID | F::ST_NODEV | F::ST_NOEXEC | F::ST_NOATIME);
        assert!(k.contains(MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC));
        assert!(k.contains(MsFlags::MS_NOATIME) && !k.contains(MsFlags::MS_STRICTATIME));
        let k = kept_flags(F::ST_RDONLY | F::ST_RELATIME | F::ST_NODIRATIME);
        assert!(k.contains(MsFlags::MS_RDONLY | MsFlags::MS_RELATIME | MsFlags::MS_NODIRATIME));
        assert!(!k.contains(MsFlags::MS_NOEXEC));
        // Neither noatime nor relatime: strictatime, which a bare remount would drop.
        assert_eq!(kept_flags(F::empty()), MsFlags::MS_STRICTATIME);
    }

    #[test]
    fn minimal_plan_binds_only_existing_and_seals() {
        let binds = vec![PathBuf::from("/usr"), PathBuf::from("/definitely-not-here")];
        let ops = plan(&RootPlan {
            mode: RootMode::Minimal,
            binds: &binds,
            hide: &[PathBuf::from("/usr/share/doc")],
            tmp_src: None,
            tmp_size: 1 << 20,
            workspace_src: Some(Path::new("/x/ws")),
            shm_size: 1 << 20,
            ro_binds: &[],
            fresh_sysfs: true,
        });
        assert_eq!(ops[0], MountOp::EmptyRoot);
        assert!(ops.contains(&MountOp::BindRo {
            src: PathBuf::from("/usr")
        }));
        assert!(!ops.contains(&MountOp::BindRo {
            src: PathBuf::from("/definitely-not-here")
        }));
        assert_eq!(ops.last(), Some(&MountOp::Seal));
        // Without a capped disk the workspace is bound into the private /tmp.
        assert!(ops.contains(&MountOp::BindRw {
            src: PathBuf::from("/x/ws"),
            dst: PathBuf::from("/tmp/successor")
        }));
        assert!(ops.contains(&MountOp::Tmpfs {
            dst: PathBuf::from("/tmp"),
            size: 1 << 20
        }));
        assert!(ops.contains(&MountOp::Dev { shm_size: 1 << 20 }));
    }
}
