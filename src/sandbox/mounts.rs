//! The mount layer: the supervisor plans the successor's root (pure, testable), the
//! sandbox init carries the plan out inside its new user + mount namespaces and
//! pivot_roots into it.
//!
//! The constructed root, for `root = "host"`:
//! - the host root bound recursively, read-only, nosuid, nodev;
//! - `/tmp`: the run's size-capped filesystem (writable), holding the workspace at
//!   `/tmp/successor`;
//! - `/proc`: a fresh procfs for the sandbox's pid namespace, with the kernel's
//!   sensitive files masked and `/proc/sys` read-only;
//! - `/dev`: a read-only tmpfs with null, zero, full, random, urandom, tty (bound from the
//!   host), a private devpts at /dev/pts (+ ptmx), a private tmpfs /dev/shm; no block devices;
//! - hidden paths: an empty read-only directory or empty file over each secret.
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
    /// The minimal /dev.
    Dev { shm_size: u64 },
    /// Hide a host path: an empty read-only dir over a directory, /dev/null over a file.
    Hide { dst: PathBuf, dir: bool },
    /// Make the new root's base mount read-only (minimal mode).
    Seal,
}

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
    ops.push(MountOp::Dev {
        shm_size: p.shm_size,
    });
    match p.tmp_src {
        Some(src) => ops.push(MountOp::BindRw {
            src: src.to_path_buf(),
            dst: PathBuf::from("/tmp"),
        }),
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

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

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

/// Runs in the sandbox init (inside its user and mount namespaces): builds the new root
/// at `newroot` and pivots into it. On return, `/` is the new root and the host root is
/// detached.
pub fn build_and_pivot(newroot: &Path, ops: &[MountOp]) -> Result<(), MountError> {
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
    let mut minimal = false;
    for op in ops {
        match op {
            MountOp::HostRoot => {
                mount(
                    Some("/"),
                    newroot,
                    None::<&str>,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    None::<&str>,
                )
                .map_err(sys_err("bind host root", newroot))?;
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
            MountOp::Proc => mount_proc(newroot)?,
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
                    mount(
                        Some("/dev/null"),
                        &d,
                        None::<&str>,
                        MsFlags::MS_BIND,
                        None::<&str>,
                    )
                    .map_err(sys_err("hide (bind /dev/null over)", dst))?;
                    remount_bind(&d, MsFlags::MS_RDONLY | nosuid_nodev)
                        .map_err(sys_err("hide (read-only)", dst))?;
                }
            }
            MountOp::Seal => {
                remount_bind(newroot, MsFlags::MS_RDONLY | nosuid_nodev)
                    .map_err(sys_err("remount root read-only", newroot))?;
            }
        }
    }
    pivot(newroot)
}

fn mount_proc(newroot: &Path) -> Result<(), MountError> {
    let p = newroot.join("proc");
    mount(
        Some("proc"),
        &p,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(sys_err("mount proc", &p))?;
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
            mount(
                Some("/dev/null"),
                &t,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(sys_err("mask", &t))?;
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
        touch(&t)?;
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
    let data = format!("mode=1777,size={shm_size}");
    mount(
        Some("tmpfs"),
        &shm,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(sys_err("mount /dev/shm", &shm))?;
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
        });
        assert_eq!(ops[0], MountOp::HostRoot);
        assert!(ops.contains(&MountOp::Proc));
        assert!(ops.contains(&MountOp::BindRw {
            src: PathBuf::from("/x/disk"),
            dst: PathBuf::from("/tmp")
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
    }
}
