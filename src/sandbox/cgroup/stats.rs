//! Reading the sandbox's usage for the watchdog: CPU time, memory (current and peak), tasks
//! (current and peak), OOM kills and forks refused by the pids limit.
//!
//! Each run is counted from its own start ([`SandboxCgroup::begin_run`]): a rerun of failing
//! tests runs in the same cgroup as the attempt before it, and the kernel's counters
//! (`cpuacct.usage`, `oom_kill`, `pids.events`, the peaks) keep growing across runs. The
//! counters are read against a baseline taken at the run's start; the memory peak, which
//! cannot be subtracted, is reset there where the kernel allows it (v1
//! `memory.max_usage_in_bytes`, v2 `memory.peak` from Linux 6.12, per open file); a peak that
//! could not be reset, and `pids.peak` (never resettable), count only once they rise past
//! what they were at the start, else the current values sampled during the run stand in.
//!
//! Hand-written rather than cgroups-rs's stat readers: those open the file and allocate on
//! every read, while [`SandboxCgroup::sample`] is called every ~50 ms and so reads, with `pread`
//! into a stack buffer, a handful of files opened once at creation.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Mutex;

use super::{CgroupVersion, SandboxCgroup};

/// One reading of the sandbox's usage.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CgroupSample {
    /// CPU time consumed, in nanoseconds (v1 `cpuacct.usage`, v2 `cpu.stat usage_usec`).
    pub cpu_ns: u64,
    /// Memory in use, in bytes.
    pub memory_current: u64,
    /// Peak memory, in bytes (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`).
    pub memory_peak: u64,
    /// Tasks in the cgroup.
    pub pids_current: u64,
    /// Peak tasks, where the kernel has `pids.peak`.
    pub pids_peak: Option<u64>,
    /// Processes killed by the OOM killer (v1 `memory.oom_control`, v2 `memory.events`).
    pub oom_kills: u64,
    /// Forks refused by the pids limit (`pids.events` `max`).
    pub pids_limit_hits: u64,
}

/// Stat files opened once, read with `pread` by [`SandboxCgroup::sample`].
#[derive(Debug, Default)]
pub(super) struct StatFiles {
    cpu: Option<File>,
    mem_current: Option<File>,
    /// Opened for writing too where the kernel lets it (v2's reset is per open file).
    mem_peak: Option<File>,
    mem_events: Option<File>,
    pids_current: Option<File>,
    pids_peak: Option<File>,
    pids_events: Option<File>,
    /// The v1 file whose write of 0 resets the memory peak.
    mem_peak_reset: Option<PathBuf>,
    /// The counters at the current run's start ([`SandboxCgroup::begin_run`]).
    baseline: Mutex<Baseline>,
}

/// What the counters read at a run's start.
#[derive(Debug, Default, Clone, Copy)]
struct Baseline {
    cpu_ns: u64,
    oom_kills: u64,
    pids_limit_hits: u64,
    /// The memory peak when it could not be reset (0 when it was, or on a fresh cgroup).
    memory_peak: u64,
    pids_peak: Option<u64>,
}

impl StatFiles {
    /// Opens the files of `version` in the sandbox directory of each controller (`dir_of`); a
    /// file the kernel does not offer stays `None`.
    pub(super) fn open(version: CgroupVersion, dir_of: impl Fn(&str) -> Option<PathBuf>) -> Self {
        let open = |ctl: &str, name: &str| dir_of(ctl).and_then(|d| File::open(d.join(name)).ok());
        // Read and write where allowed (v2 resets memory.peak for the file written to),
        // else read only.
        let open_rw = |ctl: &str, name: &str| {
            dir_of(ctl).and_then(|d| {
                let p = d.join(name);
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&p)
                    .or_else(|_| File::open(&p))
                    .ok()
            })
        };
        match version {
            CgroupVersion::V1 => StatFiles {
                cpu: open("cpuacct", "cpuacct.usage"),
                mem_current: open("memory", "memory.usage_in_bytes"),
                mem_peak: open("memory", "memory.max_usage_in_bytes"),
                mem_events: open("memory", "memory.oom_control"),
                pids_current: open("pids", "pids.current"),
                pids_peak: open("pids", "pids.peak"),
                pids_events: open("pids", "pids.events"),
                mem_peak_reset: dir_of("memory").map(|d| d.join("memory.max_usage_in_bytes")),
                baseline: Mutex::default(),
            },
            CgroupVersion::V2 => StatFiles {
                cpu: open("cpu", "cpu.stat"),
                mem_current: open("memory", "memory.current"),
                mem_peak: open_rw("memory", "memory.peak"),
                mem_events: open("memory", "memory.events"),
                pids_current: open("pids", "pids.current"),
                pids_peak: open("pids", "pids.peak"),
                pids_events: open("pids", "pids.events"),
                mem_peak_reset: None,
                baseline: Mutex::default(),
            },
        }
    }
}

/// The value of `key` in a flat-keyed file (`key value` per line).
fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut it = line.split_whitespace();
        if it.next()? == key {
            it.next()?.parse().ok()
        } else {
            None
        }
    })
}

/// The value of a single-value file; `max` and garbage read as `None`.
fn single_value(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// Reads a small control file from offset 0 into `buf` (no allocation).
fn pread_small<'a>(file: Option<&File>, buf: &'a mut [u8]) -> Option<&'a str> {
    let file = file?;
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    std::str::from_utf8(&buf[..n]).ok()
}

impl SandboxCgroup {
    /// Starts counting a run: called before any process of the run is in the cgroup (a
    /// rerun's cgroup still holds the counters of the attempts before it). Takes the
    /// baseline [`Self::sample`] subtracts, and resets the memory peak where the kernel
    /// allows it.
    pub fn begin_run(&self) {
        let raw = self.sample_raw();
        let s = &self.stats;
        let reset = match self.version {
            // Any write of 0 resets the cgroup's max_usage_in_bytes to its current usage.
            CgroupVersion::V1 => s
                .mem_peak_reset
                .as_ref()
                .is_some_and(|p| std::fs::write(p, "0").is_ok()),
            // Linux 6.12 and later: any non-empty write resets the peak this file reports.
            CgroupVersion::V2 => s
                .mem_peak
                .as_ref()
                .is_some_and(|f| f.write_at(b"reset\n", 0).is_ok()),
        };
        if !reset && raw.memory_peak > 0 {
            tracing::debug!(
                "cgroup: the memory peak could not be reset; this run's peak counts once it \
                 passes {} bytes",
                raw.memory_peak
            );
        }
        let base = Baseline {
            cpu_ns: raw.cpu_ns,
            oom_kills: raw.oom_kills,
            pids_limit_hits: raw.pids_limit_hits,
            memory_peak: if reset { 0 } else { raw.memory_peak },
            pids_peak: raw.pids_peak,
        };
        *s.baseline.lock().unwrap_or_else(|e| e.into_inner()) = base;
    }

    /// Reads the usage counters of the current run (see [`Self::begin_run`]): a few
    /// `pread`s on files opened at creation. Counters the kernel does not offer read as 0
    /// (`pids_peak` as `None`); a peak that has not risen past its value at the run's start
    /// reads as 0 (`None`), the current value sampled during the run standing in for it.
    pub fn sample(&self) -> CgroupSample {
        let raw = self.sample_raw();
        let base = *self
            .stats
            .baseline
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        CgroupSample {
            cpu_ns: raw.cpu_ns.saturating_sub(base.cpu_ns),
            memory_current: raw.memory_current,
            memory_peak: if raw.memory_peak > base.memory_peak {
                raw.memory_peak
            } else {
                0
            },
            pids_current: raw.pids_current,
            pids_peak: match (raw.pids_peak, base.pids_peak) {
                (Some(p), Some(b)) if p <= b => None,
                (p, _) => p,
            },
            oom_kills: raw.oom_kills.saturating_sub(base.oom_kills),
            pids_limit_hits: raw.pids_limit_hits.saturating_sub(base.pids_limit_hits),
        }
    }

    /// The counters as the kernel has them, since the cgroup was made.
    fn sample_raw(&self) -> CgroupSample {
        let mut buf = [0u8; 1024];
        let s = &self.stats;
        let cpu_ns = match self.version {
            CgroupVersion::V1 => pread_small(s.cpu.as_ref(), &mut buf).and_then(single_value),
            CgroupVersion::V2 => pread_small(s.cpu.as_ref(), &mut buf)
                .and_then(|t| keyed_value(t, "usage_usec"))
                .map(|us| us.saturating_mul(1000)),
        }
        .unwrap_or(0);
        let memory_current = pread_small(s.mem_current.as_ref(), &mut buf)
            .and_then(single_value)
            .unwrap_or(0);
        let memory_peak = pread_small(s.mem_peak.as_ref(), &mut buf)
            .and_then(single_value)
            .unwrap_or(0);
        let oom_kills = pread_small(s.mem_events.as_ref(), &mut buf)
            .and_then(|t| keyed_value(t, "oom_kill"))
            .unwrap_or(0);
        let pids_current = pread_small(s.pids_current.as_ref(), &mut buf)
            .and_then(single_value)
            .unwrap_or(0);
        let pids_peak = pread_small(s.pids_peak.as_ref(), &mut buf).and_then(single_value);
        let pids_limit_hits = pread_small(s.pids_events.as_ref(), &mut buf)
            .and_then(|t| keyed_value(t, "max"))
            .unwrap_or(0);
        CgroupSample {
            cpu_ns,
            memory_current,
            memory_peak,
            pids_current,
            pids_peak,
            oom_kills,
            pids_limit_hits,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{release, spawn_gated, unique, wait_bounded};
    use super::super::CgroupLimits;
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::time::{Duration, Instant};

    #[test]
    fn parses_stat_files() {
        let events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(keyed_value(events, "oom_kill"), Some(2));
        assert_eq!(keyed_value(events, "max"), Some(12));
        let cpu_stat = "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\nnr_periods 0\n";
        assert_eq!(keyed_value(cpu_stat, "usage_usec"), Some(123456));
        let oom_control = "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n";
        assert_eq!(keyed_value(oom_control, "oom_kill"), Some(1));
        assert_eq!(keyed_value("max 0\n", "max"), Some(0));
        assert_eq!(keyed_value(events, "absent"), None);
        assert_eq!(single_value("4096\n"), Some(4096));
        assert_eq!(single_value("max\n"), None);
    }

    #[test]
    fn memory_hog_is_oom_killed_and_counted() {
        let cg = SandboxCgroup::create(
            &unique("oom"),
            &CgroupLimits {
                memory_bytes: Some(128 << 20),
                ..Default::default()
            },
        )
        .unwrap();
        let mut child = spawn_gated("exec python3 -c 'b = b\"x\" * (1 << 30); print(len(b))'");
        cg.add_pid(child.id() as i32).unwrap();
        assert_eq!(cg.sample().oom_kills, 0);
        release(&mut child);
        let st = wait_bounded(&mut child, Duration::from_secs(60));
        assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?}");
        let s = cg.sample();
        assert!(s.oom_kills > 0, "{s:?}");
        assert!(s.memory_peak <= (128 << 20) + (1 << 20), "{s:?}");
        assert!(s.memory_peak > 64 << 20, "{s:?}");
        // A next run in the same cgroup starts from nothing: no OOM kill, a peak reset.
        cg.begin_run();
        let s = cg.sample();
        assert_eq!(s.oom_kills, 0, "{s:?}");
        assert!(s.memory_peak < 16 << 20, "{s:?}");
        cg.destroy().unwrap();
    }

    #[test]
    fn cpu_time_grows_and_the_quota_caps_it() {
        let cg = SandboxCgroup::create(
            &unique("cpu"),
            &CgroupLimits {
                cpu_percent: Some(20),
                ..Default::default()
            },
        )
        .unwrap();
        let mut child = spawn_gated(
            "exec python3 -c 'import time\nt = time.time()\nwhile time.time() - t < 1.0: pass'",
        );
        cg.add_pid(child.id() as i32).unwrap();
        let before = cg.sample().cpu_ns;
        let t = Instant::now();
        release(&mut child);
        let st = wait_bounded(&mut child, Duration::from_secs(30));
        let wall = t.elapsed();
        assert!(st.success(), "{st:?}");
        let used = cg.sample().cpu_ns;
        assert!(used > before, "cpu_ns did not grow: {before} -> {used}");
        assert!(used - before > 20_000_000, "busy loop used only {used} ns");
        // 20% of one core: at most 0.2 x wall, plus one period of slack.
        let cap = wall.as_nanos() as u64 / 5 + 200_000_000;
        assert!(used <= cap, "used {used} ns > cap {cap} ns over {wall:?}");
        // A next run in the same cgroup is not charged for this one's CPU.
        cg.begin_run();
        let again = cg.sample().cpu_ns;
        assert!(again < 10_000_000, "{again} ns carried over from {used} ns");
        cg.destroy().unwrap();
    }
}
