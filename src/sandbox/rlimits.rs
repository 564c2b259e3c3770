//! Per-process resource limits of the command, set (soft and hard) in the command's process
//! right before its privileges are dropped, so neither it nor anything it starts can raise
//! them again. They bound what the cgroup budgets do not see or do not stop in time:
//!
//! - `RLIMIT_MEMLOCK` 0: `mlock`, `mlockall`, `mlock2` and `SHM_LOCK` fail (EPERM). Locking
//!   pages that are already in the host's page cache charges nothing to the sandbox's
//!   memory cgroup, so each process could otherwise pin that much host memory outside the
//!   memory budget.
//! - `RLIMIT_NOFILE` [`OPEN_FILES`]: each process holds at most that many descriptors
//!   (EMFILE beyond), so the sandbox (at most `pids` processes) cannot fill the host's file
//!   table (`fs.file-max`); every open file is also kernel memory charged to the memory
//!   budget.

use nix::sys::resource::{setrlimit, Resource};

/// Bytes of memory a sandboxed process may lock.
pub const LOCKED_MEMORY: u64 = 0;
/// Descriptors one sandboxed process may hold (the usual default soft limit).
pub const OPEN_FILES: u64 = 1024;

/// Sets the command's limits, soft and hard (lowering needs no privilege; raising them
/// back needs CAP_SYS_RESOURCE in the host's user namespace, which the sandbox never has).
pub fn apply() -> Result<(), String> {
    for (res, name, value) in [
        (Resource::RLIMIT_MEMLOCK, "RLIMIT_MEMLOCK", LOCKED_MEMORY),
        (Resource::RLIMIT_NOFILE, "RLIMIT_NOFILE", OPEN_FILES),
    ] {
        setrlimit(res, value, value).map_err(|e| format!("setrlimit({name}, {value}): {e}"))?;
    }
    Ok(())
}
