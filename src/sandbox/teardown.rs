//! Destroying a sandbox: its cgroup, its disk and its run directory.

use super::*;

impl Sandbox {
    /// Kills whatever remains, removes the cgroup, unmounts the disk and deletes the run
    /// directory. Idempotent.
    pub fn destroy(mut self) -> Result<(), SandboxError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), SandboxError> {
        let mut first_err = None;
        if let Some(cg) = self.cgroup.take() {
            if let Err(e) = cg.destroy() {
                first_err.get_or_insert(SandboxError::Setup {
                    stage: "destroy cgroup".into(),
                    message: e.to_string(),
                });
            }
        }
        if let Some(rd) = self.rundir.take() {
            trace::mark("teardown: cgroup removed");
            if let Err(e) = reclaim_dir(&rd.path, rd.id.as_str()) {
                first_err.get_or_insert(e);
            }
            drop(rd);
            trace::mark("teardown: run dir removed");
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
