//! Destroying a sandbox: its cgroup, its disk and its run directory.

use super::*;

impl Sandbox {
    /// Kills whatever remains, removes the cgroup, unmounts the disk and deletes the run
    /// directory: all of it but its record of the cgroups and its lock when the cgroups
    /// could not be removed (`fork gc` removes them later). Idempotent.
    pub fn destroy(mut self) -> Result<(), SandboxError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), SandboxError> {
        let mut first_err = None;
        // Cgroups still being made are waited for, and go like the others; a required
        // layer the host refused is this teardown's error when no run reported it (a
        // sandbox destroyed unused: a patch that did not apply).
        if let Err(e) = self.take_cgroup() {
            first_err = Some(e);
        }
        let mut cgroups_left = None;
        if let CgroupSlot::Ready(cg) = std::mem::replace(&mut self.cgroup, CgroupSlot::None) {
            if let Err(e) = cg.destroy() {
                cgroups_left = Some(e);
            }
        }
        let mut kept = None;
        if let Some(rd) = self.rundir.take() {
            trace::mark("teardown: cgroup removed");
            // The run directory is the only record of the run's cgroups (and its lock says
            // when its supervisor is gone): kept while they are left, for `fork gc`.
            let removed = match cgroups_left {
                None => remove_run_dir(&rd, self.disk_mounted),
                Some(_) => {
                    kept = Some(rd.path.clone());
                    reclaim_dir_keeping_record(&rd.path)
                }
            };
            if let Err(e) = removed {
                first_err.get_or_insert(e);
            }
            drop(rd);
            trace::mark("teardown: run dir removed");
        }
        if let Some(e) = cgroups_left {
            let message = match kept {
                Some(dir) => format!(
                    "{e}; the run directory {} is kept with its record of them (`cgroups`, \
                     `lock`): run `fork gc` once this process has ended to remove them",
                    dir.display()
                ),
                None => e.to_string(),
            };
            first_err.get_or_insert(SandboxError::Setup {
                stage: "destroy cgroup".into(),
                message,
            });
        }
        self.disk_mounted = false;
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            tracing::error!("destroying the sandbox: {e}");
        }
    }
}

/// Unmounts the disk fork mounted and deletes the run directory entry by entry (no scan
/// of the mount table, no listing); anything unexpected in it falls back to the general
/// reclaim `fork gc` uses, which finds every mount beneath it.
fn remove_run_dir(rd: &RunDir, disk_mounted: bool) -> Result<(), SandboxError> {
    use nix::mount::{umount2, MntFlags};
    let unmounted = !disk_mounted
        || match umount2(&rd.disk(), MntFlags::MNT_DETACH) {
            Ok(()) => true,
            Err(e) => e == nix::Error::EINVAL || e == nix::Error::ENOENT,
        };
    if unmounted && rd.remove_known().is_ok() {
        return Ok(());
    }
    reclaim_dir(&rd.path, rd.id.as_str())
}
