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
