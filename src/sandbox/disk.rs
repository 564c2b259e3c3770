//! The sandbox's size-capped disk: the tmpfs holding its /tmp and the workspace.

use super::*;

impl Sandbox {
    pub(super) fn mount_disk(&mut self) -> Result<(), SandboxError> {
        let req = self.spec.layers.get(Layer::Disk);
        if !req.wanted() {
            return Ok(());
        }
        if !is_root() && !rootless::entered() {
            return require_missing(
                &self.spec.layers,
                Layer::Disk,
                &rootless::disk_unavailable_reason(),
                rootless::DISK_ROOTLESS_FIX,
            );
        }
        let disk = self.disk();
        let data = format!(
            "size={},mode=0700,uid={},gid={}",
            self.spec.limits.disk_bytes, self.host_uid, self.host_gid
        );
        use nix::mount::{mount, MsFlags};
        match mount(
            Some("tmpfs"),
            &disk,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(data.as_str()),
        ) {
            Ok(()) => {
                self.disk_mounted = true;
                Ok(())
            }
            Err(e) => require_missing(
                &self.spec.layers,
                Layer::Disk,
                &format!(
                    "mounting a {} tmpfs at {} failed: {e}",
                    self.spec.limits.disk_bytes,
                    disk.display()
                ),
                if is_root() {
                    "run fork with mount rights (CAP_SYS_ADMIN), or set [layers] disk = \"optional\""
                } else {
                    rootless::DISK_ROOTLESS_FIX
                },
            ),
        }
    }
}

/// The directories fork keeps on the sandbox's disk (or, without one, in its run
/// directory) for every run: the workspace (`successor`, its `home`) and, on a capped
/// disk, the sandbox's `/dev/shm` (`.fork-shm`). Each is made when missing and must
/// otherwise be a real directory: the successor of an earlier run of the same sandbox (a
/// rerun of failing tests) owns the disk and may have left a symbolic link there, to any
/// host path, or a file. The supervisor, root on the host, never follows one: each entry
/// is made and opened beneath the disk's own directory without following a link (the
/// successor is dead between runs, so what is checked is what is used), and `/dev/shm`'s
/// mode is set through its descriptor.
impl Sandbox {
    pub fn own_dirs(&self) -> Result<(), SandboxError> {
        use nix::sys::stat::{fchmod, Mode};
        let disk = self.disk();
        let base = crate::fsx::open_dir(&disk, false).map_err(|e| SandboxError::Setup {
            stage: "workspace".into(),
            message: format!("{}: {e}", disk.display()),
        })?;
        let ws = own_dir(&base, &disk, "successor")?;
        own_dir(&ws, &disk.join("successor"), "home")?;
        if self.disk_mounted {
            let shm = own_dir(&base, &disk, super::mounts::SHM_DIR)?;
            let path = disk.join(super::mounts::SHM_DIR);
            fchmod(&shm, Mode::from_bits_truncate(0o1777))
                .map_err(|e| IoError::new("chmod /dev/shm", &path, e.into()))?;
        }
        Ok(())
    }
}

impl Sandbox {
    /// After a run: fork's own entries on the disk that the command replaced with
    /// anything but a directory (a link, to any host path, or a file) are removed (unlinked:
    /// a link is never followed), so that nothing fork reads from the disk afterwards (the
    /// results beneath the workspace, the protected tree's check) goes through them. The
    /// workspace is then simply missing, as if the command had deleted it.
    pub(super) fn unlink_planted(&self) {
        let disk = self.disk();
        for rel in ["successor", super::mounts::SHM_DIR] {
            let p = disk.join(rel);
            match std::fs::symlink_metadata(&p) {
                Ok(m) if !m.is_dir() => {
                    tracing::warn!(
                        "the command left a {} at {}: removed, never followed",
                        if m.file_type().is_symlink() {
                            "link"
                        } else {
                            "file"
                        },
                        p.display()
                    );
                    if let Err(e) = std::fs::remove_file(&p) {
                        tracing::error!("removing {}: {e}", p.display());
                    }
                }
                _ => {}
            }
        }
    }
}

/// `name` beneath the directory `dir` (the host path `at`): made when missing, then opened
/// as a directory without following a link.
fn own_dir(
    dir: &std::os::fd::OwnedFd,
    at: &std::path::Path,
    name: &str,
) -> Result<std::os::fd::OwnedFd, SandboxError> {
    use nix::errno::Errno;
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::{mkdirat, Mode};
    let path = at.join(name);
    match mkdirat(dir, name, Mode::from_bits_truncate(0o777)) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(IoError::new("create", &path, e.into()).into()),
    }
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    openat(dir, name, flags, Mode::empty()).map_err(|e| match e {
        // O_DIRECTORY is checked before O_NOFOLLOW: a link shows as ENOTDIR.
        Errno::ELOOP | Errno::ENOTDIR => SandboxError::Setup {
            stage: "workspace".into(),
            message: format!(
                "{} is not a directory: an earlier run in this sandbox left a link or a file there, which fork never follows",
                path.display()
            ),
        },
        e => IoError::new("open", &path, e.into()).into(),
    })
}
