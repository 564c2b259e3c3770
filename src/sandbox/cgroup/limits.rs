//! The sandbox's budgets as cgroup limits: validating [`CgroupLimits`] and writing them through
//! cgroups-rs's controllers.
//!
//! - **v1**: memory is a hard limit (`memory.limit_in_bytes`) with memory+swap set to the same
//!   value (`memory.memsw.limit_in_bytes`) so the kernel OOM-kills instead of swapping; without
//!   swap accounting `memory.swappiness` is set to 0 and `probe` reports the gap when the host
//!   has swap. Socket buffers get a limit of the same size (`memory.kmem.tcp.limit_in_bytes`):
//!   a v1 memory cgroup charges sockets only once that file has been written (then TCP and
//!   UDP buffers alike, measured on kernel 6.18), and to a counter of their own, apart from
//!   `memory.limit_in_bytes`; past it the kernel drops datagrams and holds TCP senders back
//!   (no OOM kill). Without that file the layer is refused ([`CgroupError::NoSocketAccounting`]).
//!   CPU is a CFS quota over a 100 ms period; pids is `pids.max`.
//! - **v2**: `memory.max` (socket buffers included), `memory.swap.max = 0`, `cpu.max`,
//!   `pids.max`.

use std::path::PathBuf;

use cgroups_rs::fs::cpu::CpuController;
use cgroups_rs::fs::memory::MemController;
use cgroups_rs::fs::pid::PidController;
use cgroups_rs::fs::MaxValue;

use super::layout::missing_controllers_error;
use super::{CgroupError, CgroupLimits, CgroupVersion, SandboxCgroup};

/// What to do when a v1 memory controller cannot bound socket buffers.
pub const SOCKET_ACCOUNTING_FIX: &str = "boot the host with cgroup v2 (systemd.unified_cgroup_hierarchy=1), whose memory.max counts socket buffers, or use a kernel whose cgroup v1 memory controller has memory.kmem.tcp.limit_in_bytes";

/// The v1 control file that turns a memory cgroup's socket accounting on and bounds it.
const V1_SOCKET_LIMIT: &str = "memory.kmem.tcp.limit_in_bytes";

/// CFS period for the CPU limit.
const CPU_PERIOD_US: u64 = 100_000;
/// The smallest CFS quota the kernel accepts.
const CPU_MIN_QUOTA_US: u64 = 1_000;

/// The CFS quota and period for `percent` of one core.
fn cpu_quota(percent: u32) -> Result<(u64, u64), CgroupError> {
    if percent == 0 {
        return Err(CgroupError::InvalidLimit {
            field: "cpu_percent",
            value: 0,
            detail: "must be at least 1 (percent of one core)",
        });
    }
    let quota = (CPU_PERIOD_US * u64::from(percent) / 100).max(CPU_MIN_QUOTA_US);
    Ok((quota, CPU_PERIOD_US))
}

/// Limits checked before anything is created: zero memory or pids is refused, and the CPU
/// percentage becomes its CFS `(quota, period)`.
pub(super) fn validate(limits: &CgroupLimits) -> Result<Option<(u64, u64)>, CgroupError> {
    if limits.memory_bytes == Some(0) {
        return Err(CgroupError::InvalidLimit {
            field: "memory_bytes",
            value: 0,
            detail: "must be positive",
        });
    }
    if limits.pids == Some(0) {
        return Err(CgroupError::InvalidLimit {
            field: "pids",
            value: 0,
            detail: "must be positive (the sandbox init itself is one task)",
        });
    }
    limits.cpu_percent.map(cpu_quota).transpose()
}

impl SandboxCgroup {
    /// Writes `limits` (validated, with the CPU `quota` from [`validate`]).
    pub(super) fn apply_limits(
        &self,
        limits: &CgroupLimits,
        quota: Option<(u64, u64)>,
    ) -> Result<(), CgroupError> {
        let v2 = self.version == CgroupVersion::V2;
        let write_err = |dir: Option<PathBuf>, file: &str, value: String| {
            let file = dir.unwrap_or_default().join(file);
            move |source: cgroups_rs::fs::error::Error| CgroupError::Write {
                file,
                value,
                source: Box::new(source),
            }
        };
        if let Some(bytes) = limits.memory_bytes {
            let mem = self
                .cgroup_of("memory")
                .and_then(|c| c.controller_of::<MemController>());
            let dir = self.dir_of("memory");
            let (Some(mem), Some(dir)) = (mem, dir) else {
                return Err(missing_controllers_error(vec!["memory".into()]));
            };
            let value = i64::try_from(bytes).unwrap_or(i64::MAX);
            let limit_file = if v2 {
                "memory.max"
            } else {
                "memory.limit_in_bytes"
            };
            mem.set_limit(value).map_err(write_err(
                Some(dir.clone()),
                limit_file,
                bytes.to_string(),
            ))?;
            if v2 {
                if dir.join("memory.swap.max").exists() {
                    mem.set_memswap_limit(0).map_err(write_err(
                        Some(dir.clone()),
                        "memory.swap.max",
                        "0".into(),
                    ))?;
                }
            } else if dir.join("memory.memsw.limit_in_bytes").exists() {
                mem.set_memswap_limit(value).map_err(write_err(
                    Some(dir.clone()),
                    "memory.memsw.limit_in_bytes",
                    bytes.to_string(),
                ))?;
            } else {
                // No swap accounting: make the cgroup avoid swap as far as v1 allows.
                let _ = mem.set_swappiness(0);
            }
            if !v2 {
                // Socket buffers: charged only once this is written (v2 always charges them
                // to memory.max). Written before any task joins, so every socket the
                // sandbox creates is charged.
                let file = dir.join(V1_SOCKET_LIMIT);
                if !file.exists() {
                    return Err(CgroupError::NoSocketAccounting { file });
                }
                mem.set_tcp_limit(value).map_err(write_err(
                    Some(dir.clone()),
                    V1_SOCKET_LIMIT,
                    bytes.to_string(),
                ))?;
            }
        }
        if let Some((quota_us, period_us)) = quota {
            let cpu = self
                .cgroup_of("cpu")
                .and_then(|c| c.controller_of::<CpuController>());
            let Some(cpu) = cpu else {
                return Err(missing_controllers_error(vec!["cpu".into()]));
            };
            let file = if v2 { "cpu.max" } else { "cpu.cfs_quota_us" };
            cpu.set_cfs_quota_and_period(
                Some(i64::try_from(quota_us).unwrap_or(i64::MAX)),
                Some(period_us),
            )
            .map_err(write_err(
                self.dir_of("cpu"),
                file,
                format!("{quota_us} {period_us}"),
            ))?;
        }
        if let Some(max) = limits.pids {
            let pids = self
                .cgroup_of("pids")
                .and_then(|c| c.controller_of::<PidController>());
            let Some(pids) = pids else {
                return Err(missing_controllers_error(vec!["pids".into()]));
            };
            pids.set_pid_max(MaxValue::Value(i64::try_from(max).unwrap_or(i64::MAX)))
                .map_err(write_err(self.dir_of("pids"), "pids.max", max.to_string()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_quota_and_zero_limits() {
        assert_eq!(cpu_quota(200).unwrap(), (200_000, 100_000));
        assert_eq!(cpu_quota(50).unwrap(), (50_000, 100_000));
        assert_eq!(cpu_quota(1).unwrap(), (1_000, 100_000));
        assert!(cpu_quota(0).is_err());
        for bad in [
            CgroupLimits {
                memory_bytes: Some(0),
                ..Default::default()
            },
            CgroupLimits {
                pids: Some(0),
                ..Default::default()
            },
            CgroupLimits {
                cpu_percent: Some(0),
                ..Default::default()
            },
        ] {
            assert!(
                matches!(validate(&bad), Err(CgroupError::InvalidLimit { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(validate(&CgroupLimits::default()).unwrap(), None);
    }
}
