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
//! - `RLIMIT_SIGPENDING` [`PENDING_SIGNALS`] and `RLIMIT_MSGQUEUE` [`MESSAGE_QUEUE_BYTES`]:
//!   the kernel counts queued signals and POSIX message queue bytes per user, at every level
//!   of the chain of user namespaces, up to the sandbox's namespace's owner (as root the
//!   run's own uid, see [`super::userns_owner`]; it was host root, whose counts every root
//!   process shares; without root the user). The count of the sandbox's own user is
//!   checked against the queueing process's limit, so with these limits on every process
//!   of the sandbox it holds at most that many of its owner's (a queue is charged when it
//!   is created, even where Landlock then refuses to open it). Standard signals sent while the count is full still
//!   arrive, without their extra information, as the kernel does for any user.
//! - `RLIMIT_CORE` [`CORE_DUMP`] (1 byte): no core file is written (an ELF core needs at
//!   least a page), and a crash under a pipe `core_pattern` (systemd-coredump, apport) is
//!   not handed to the host's helper, which the kernel would start as root outside every
//!   budget of the sandbox, ignoring any other value of this limit: 1 is the value the
//!   kernel takes to mean "abort the dump". Where fork's own hard limit is already 0 it is
//!   kept (raising it needs a privilege the command never has): no file is written then,
//!   but a pipe helper still runs.
//! - `RLIMIT_RTPRIO` 0 and `RLIMIT_NICE` 0: no real-time scheduling class (the CPU quota
//!   throttles only ordinary tasks: a SCHED_FIFO loop would starve the host's own tasks on
//!   its core up to the kernel's real-time throttling, 95% of every second by default) and
//!   no nice value below 0.
//!   Most hosts already give 0 for both; one that raised them for its users passed that on.
//!
//! The user namespace's own limits (inotify, fanotify, namespaces) are set by the init:
//! see [`super::userns_limits`].

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Bytes of memory a sandboxed process may lock.
pub const LOCKED_MEMORY: u64 = 0;
/// Descriptors one sandboxed process may hold (the usual default soft limit).
pub const OPEN_FILES: u64 = 1024;
/// Signals queued for the sandbox's processes at once (root's default limit is in the tens
/// of thousands; queued signals are rare in ordinary programs: each POSIX timer holds one).
pub const PENDING_SIGNALS: u64 = 1024;
/// Bytes of POSIX message queues the sandbox may create: one queue of the default size
/// (10 messages of 8 KiB, about 81 KiB with the kernel's overhead), of root's 800 KiB.
pub const MESSAGE_QUEUE_BYTES: u64 = 100 << 10;
/// The core-dump size limit: 1, which makes the kernel abort every dump (see above).
pub const CORE_DUMP: u64 = 1;

/// Sets the command's limits, soft and hard (lowering needs no privilege; raising them
/// back needs CAP_SYS_RESOURCE in the host's user namespace, which the sandbox never has).
pub fn apply() -> Result<(), String> {
    // 1, or 0 where the hard limit is already 0 (never raised: that would fail).
    let (_, core_hard) =
        getrlimit(Resource::RLIMIT_CORE).map_err(|e| format!("getrlimit(RLIMIT_CORE): {e}"))?;
    for (res, name, value) in [
        (Resource::RLIMIT_MEMLOCK, "RLIMIT_MEMLOCK", LOCKED_MEMORY),
        (Resource::RLIMIT_NOFILE, "RLIMIT_NOFILE", OPEN_FILES),
        (
            Resource::RLIMIT_SIGPENDING,
            "RLIMIT_SIGPENDING",
            PENDING_SIGNALS,
        ),
        (
            Resource::RLIMIT_MSGQUEUE,
            "RLIMIT_MSGQUEUE",
            MESSAGE_QUEUE_BYTES,
        ),
        (
            Resource::RLIMIT_CORE,
            "RLIMIT_CORE",
            CORE_DUMP.min(core_hard),
        ),
        (Resource::RLIMIT_RTPRIO, "RLIMIT_RTPRIO", 0),
        (Resource::RLIMIT_NICE, "RLIMIT_NICE", 0),
    ] {
        setrlimit(res, value, value).map_err(|e| format!("setrlimit({name}, {value}): {e}"))?;
    }
    Ok(())
}
