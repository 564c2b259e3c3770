//! Cgroup budgets: memory, CPU and pids limits for one sandbox, usage sampling for the
//! watchdog, and whole-tree kill.
//!
//! Each sandbox gets a cgroup named `fork-<run_id>` created **beneath this process's own
//! cgroup** in every hierarchy that carries a controller we need (read from
//! `/proc/self/cgroup`), never in place of a hierarchy root. On a v1 host the controllers may
//! live at different places: on the development VM memory is at `/process_api/<id>` while cpu,
//! cpuacct and pids are at `/`, so the sandbox gets `memory/process_api/<id>/fork-<run_id>`,
//! `cpu/fork-<run_id>`, and so on.
//!
//! - **v1**: memory, pids, cpu and cpuacct are required; freezer is used for the kill when
//!   mounted. Memory is a hard limit (`memory.limit_in_bytes`) with memory+swap set to the same
//!   value (`memory.memsw.limit_in_bytes`) so the kernel OOM-kills instead of swapping; without
//!   swap accounting `memory.swappiness` is set to 0 and [`probe`] reports the gap when the host
//!   has swap. CPU is a CFS quota over a 100 ms period; pids is `pids.max`.
//! - **v2** (unified mode): memory, cpu and pids must be in our cgroup's `cgroup.controllers`
//!   (delegation). They are enabled in its `cgroup.subtree_control`; when that is refused
//!   because our cgroup holds processes (the "no internal processes" rule) and we are the only
//!   one, fork moves itself into the leaf `fork-supervisor` and retries, as container runtimes
//!   do; otherwise the error names the fix (`systemd-run --user --scope -p Delegate=yes`).
//!   Limits are `memory.max`, `memory.swap.max = 0`, `cpu.max`, `pids.max`; the kill is
//!   `cgroup.kill`. The v2 path is unit-tested for its pure parts only: it has not run on a live
//!   v2 host.
//!
//! The kill without `cgroup.kill` freezes the cgroup (when a freezer exists), opens a pidfd for
//! each listed process, re-reads the list and signals only the pidfds whose process is still
//! listed (so a recycled pid is never hit), thaws, and repeats until the cgroup is empty.
//!
//! [`SandboxCgroup::sample`] reads a handful of files opened once at creation with `pread`, so
//! the watchdog can call it every ~50 ms.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use cgroups_rs::fs::cpu::CpuController;
use cgroups_rs::fs::cpuacct::CpuAcctController;
use cgroups_rs::fs::freezer::FreezerController;
use cgroups_rs::fs::hierarchies::{is_cgroup2_unified_mode, UNIFIED_MOUNTPOINT, V1};
use cgroups_rs::fs::memory::MemController;
use cgroups_rs::fs::pid::PidController;
use cgroups_rs::fs::{Cgroup, Controllers, Hierarchy, MaxValue, Subsystem};

/// Prefix of every sandbox cgroup.
const PREFIX: &str = "fork-";
/// The v2 leaf fork moves itself into when its own cgroup must stay process-free.
const SUPERVISOR_LEAF: &str = "fork-supervisor";
/// CFS period for the CPU limit.
const CPU_PERIOD_US: u64 = 100_000;
/// The smallest CFS quota the kernel accepts.
const CPU_MIN_QUOTA_US: u64 = 1_000;
/// How long kill_all / destroy wait for the cgroup to empty.
const KILL_WAIT: Duration = Duration::from_secs(2);
/// v2 controllers we need.
const V2_CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];
/// The fix for missing v2 delegation.
const DELEGATE_FIX: &str = "run fork as the only process of a delegated cgroup, e.g. `systemd-run --user --scope -p Delegate=yes fork ...` (as root: `systemd-run --scope -p Delegate=yes fork ...`), or enable the controllers in the parent's cgroup.subtree_control";

/// Which cgroup interface the budgets use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    /// Legacy per-controller hierarchies.
    V1,
    /// The unified hierarchy.
    V2,
}

/// Limits for one sandbox; `None` leaves that resource unlimited (still accounted).
#[derive(Debug, Clone, Default)]
pub struct CgroupLimits {
    /// Hard memory limit in bytes (swap limited too where the kernel allows).
    pub memory_bytes: Option<u64>,
    /// CPU in percent of one core: 200 = 2 cores.
    pub cpu_percent: Option<u32>,
    /// Maximum number of tasks (processes and threads).
    pub pids: Option<u64>,
}

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

/// Errors of this layer; each names the file or syscall and the fix.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The run id cannot be used as a cgroup name.
    #[error("cgroup: run id {run_id:?} is not usable as a cgroup name (1-64 of [A-Za-z0-9_.-], not starting with '.'); fix: use the run's uuid")]
    InvalidRunId {
        /// The rejected id.
        run_id: String,
    },
    /// A limit is out of range.
    #[error("cgroup: limit {field} = {value} is invalid: {detail}")]
    InvalidLimit {
        /// The field of [`CgroupLimits`].
        field: &'static str,
        /// The value given.
        value: u64,
        /// Why.
        detail: &'static str,
    },
    /// A file under /proc or a cgroup filesystem could not be read or written.
    #[error("cgroup: {op} {path:?} failed: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Our own cgroup could not be located in a hierarchy.
    #[error("cgroup: cannot locate this process's own cgroup: {detail}; fix: {fix}")]
    OwnCgroup {
        /// What went wrong.
        detail: String,
        /// What to do.
        fix: String,
    },
    /// Required controllers are not mounted or not listed for this process.
    #[error("cgroup: controllers {missing:?} are not available to this process (not mounted, or absent from /proc/self/cgroup); fix: {fix}")]
    MissingControllers {
        /// The missing controllers.
        missing: Vec<String>,
        /// What to do.
        fix: String,
    },
    /// v2: controllers are not delegated to our cgroup.
    #[error("cgroup v2: controllers {missing:?} are not delegated to {path:?} (absent from cgroup.controllers, or cgroup.subtree_control not writable); fix: {fix}")]
    NotDelegated {
        /// Our cgroup.
        path: PathBuf,
        /// The controllers missing.
        missing: Vec<String>,
        /// What to do.
        fix: String,
    },
    /// v2: our cgroup holds other processes, so controllers cannot be enabled for children.
    #[error("cgroup v2: {path:?} holds {others} other process(es), and the 'no internal processes' rule forbids enabling controllers for child cgroups there; fix: {fix}")]
    InternalProcesses {
        /// Our cgroup.
        path: PathBuf,
        /// How many other processes are in it.
        others: usize,
        /// What to do.
        fix: String,
    },
    /// A cgroup for this run already exists (a crashed run not yet collected).
    #[error("cgroup: {path:?} already exists; fix: run `fork gc` to collect stale runs, or use a fresh run id")]
    AlreadyExists {
        /// The existing directory.
        path: PathBuf,
    },
    /// Writing a limit or control file failed.
    #[error("cgroup: writing {value:?} to {file:?} failed: {source}")]
    Write {
        /// The control file.
        file: PathBuf,
        /// The value.
        value: String,
        /// The underlying error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The pid cannot be moved into the sandbox cgroup.
    #[error("cgroup: refusing to add pid {pid}: {detail}")]
    InvalidPid {
        /// The pid.
        pid: i32,
        /// Why.
        detail: &'static str,
    },
    /// Tasks remained after the bounded kill.
    #[error("cgroup: {remaining} task(s) still in {paths:?} after SIGKILL and {waited:?}; they may be in uninterruptible sleep (D state); fix: retry with `fork gc`")]
    KillTimeout {
        /// The sandbox cgroups.
        paths: Vec<PathBuf>,
        /// Tasks left.
        remaining: usize,
        /// How long we waited.
        waited: Duration,
    },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

// ---------------------------------------------------------------------------------------------
// Pure parsing helpers
// ---------------------------------------------------------------------------------------------

/// One line of `/proc/<pid>/cgroup`: `id:controllers:path`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ProcCgroupEntry {
    id: String,
    controllers: Vec<String>,
    path: String,
}

fn parse_proc_cgroup(text: &str) -> Vec<ProcCgroupEntry> {
    text.lines()
        .filter_map(|line| {
            let mut it = line.splitn(3, ':');
            let id = it.next()?.trim();
            let ctl = it.next()?;
            let path = it.next()?.trim_end();
            if id.is_empty() || path.is_empty() {
                return None;
            }
            Some(ProcCgroupEntry {
                id: id.to_string(),
                controllers: ctl
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_string)
                    .collect(),
                path: path.to_string(),
            })
        })
        .collect()
}

fn own_path_v1<'a>(entries: &'a [ProcCgroupEntry], controller: &str) -> Option<&'a str> {
    entries
        .iter()
        .find(|e| e.controllers.iter().any(|c| c == controller))
        .map(|e| e.path.as_str())
}

fn own_path_v2(entries: &[ProcCgroupEntry]) -> Option<&str> {
    entries
        .iter()
        .find(|e| e.id == "0" && e.controllers.is_empty())
        .map(|e| e.path.as_str())
}

/// Our cgroup directory: the mount point plus our cgroup path relative to the mount's root.
fn join_own_dir(mount_point: &Path, mount_root: &Path, own_path: &str) -> Option<PathBuf> {
    let rel = Path::new(own_path).strip_prefix(mount_root).ok()?;
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    Some(mount_point.join(rel))
}

/// The root (4th field) of the cgroup2 mount at `mount_point` in a mountinfo text.
fn cgroup2_mount_root(mountinfo: &str, mount_point: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let fields: Vec<&str> = left.split(' ').collect();
        let fstype = right.split(' ').next()?;
        if fstype == "cgroup2" && fields.get(4) == Some(&mount_point) {
            fields.get(3).map(PathBuf::from)
        } else {
            None
        }
    })
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

fn single_value(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

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

fn validate_run_id(run_id: &str) -> Result<(), CgroupError> {
    let ok = !run_id.is_empty()
        && run_id.len() <= 64
        && !run_id.starts_with('.')
        && run_id != "supervisor"
        && run_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(CgroupError::InvalidRunId {
            run_id: run_id.to_string(),
        })
    }
}

fn parse_pids(text: &str) -> Vec<i32> {
    text.split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Layout detection
// ---------------------------------------------------------------------------------------------

/// One hierarchy: which of our controllers it carries and where our own cgroup is in it.
#[derive(Debug, Clone)]
struct HierDir {
    controllers: Vec<&'static str>,
    own_dir: PathBuf,
    mount_root: PathBuf,
}

#[derive(Debug, Clone)]
struct Layout {
    version: CgroupVersion,
    dirs: Vec<HierDir>,
    /// Required controllers not found (create fails when non-empty).
    missing: Vec<String>,
}

fn read_proc_self_cgroup() -> Result<Vec<ProcCgroupEntry>, CgroupError> {
    let path = Path::new("/proc/self/cgroup");
    let text = fs::read_to_string(path).map_err(io_err("reading", path))?;
    Ok(parse_proc_cgroup(&text))
}

fn detect_layout() -> Result<Layout, CgroupError> {
    let entries = read_proc_self_cgroup()?;
    if is_cgroup2_unified_mode() {
        let own = own_path_v2(&entries).ok_or_else(|| CgroupError::OwnCgroup {
            detail: "no `0::` line in /proc/self/cgroup on a cgroup v2 host".into(),
            fix: "mount /proc and run fork on a kernel with cgroup v2".into(),
        })?;
        let mi_path = Path::new("/proc/self/mountinfo");
        let mountinfo = fs::read_to_string(mi_path).map_err(io_err("reading", mi_path))?;
        let mount_root =
            cgroup2_mount_root(&mountinfo, UNIFIED_MOUNTPOINT).unwrap_or_else(|| "/".into());
        let mut own_dir = join_own_dir(Path::new(UNIFIED_MOUNTPOINT), &mount_root, own)
            .ok_or_else(|| CgroupError::OwnCgroup {
                detail: format!(
                    "own cgroup {own:?} is outside the cgroup2 mount root {mount_root:?}"
                ),
                fix: "run fork in a cgroup namespace whose root is visible at /sys/fs/cgroup"
                    .into(),
            })?;
        if own_dir.file_name().is_some_and(|n| n == SUPERVISOR_LEAF) {
            own_dir.pop();
        }
        return Ok(Layout {
            version: CgroupVersion::V2,
            dirs: vec![HierDir {
                controllers: vec!["memory", "cpu", "pids", "freezer"],
                own_dir,
                mount_root,
            }],
            missing: Vec::new(),
        });
    }

    let v1 = V1::new();
    let wanted: [(&'static str, Controllers, bool); 5] = [
        ("memory", Controllers::Mem, true),
        ("pids", Controllers::Pids, true),
        ("cpu", Controllers::Cpu, true),
        ("cpuacct", Controllers::CpuAcct, true),
        ("freezer", Controllers::Freezer, false),
    ];
    let mut dirs: Vec<HierDir> = Vec::new();
    let mut missing = Vec::new();
    for (name, ctl, required) in wanted {
        let found = v1.get_mount_point(ctl).and_then(|(point, root)| {
            let own = own_path_v1(&entries, name)?;
            let own_dir = join_own_dir(&point, &root, own)?;
            Some((own_dir, root))
        });
        match found {
            Some((own_dir, mount_root)) => match dirs.iter_mut().find(|d| d.own_dir == own_dir) {
                Some(d) => d.controllers.push(name),
                None => dirs.push(HierDir {
                    controllers: vec![name],
                    own_dir,
                    mount_root,
                }),
            },
            None if required => missing.push(name.to_string()),
            None => {}
        }
    }
    Ok(Layout {
        version: CgroupVersion::V1,
        dirs,
        missing,
    })
}

fn missing_controllers_error(missing: Vec<String>) -> CgroupError {
    CgroupError::MissingControllers {
        fix: format!(
            "mount the cgroup v1 controllers ({}) under /sys/fs/cgroup (e.g. `mount -t cgroup -o {} cgroup /sys/fs/cgroup/{}`), or boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1)",
            missing.join(", "),
            missing[0],
            missing[0]
        ),
        missing,
    }
}

// ---------------------------------------------------------------------------------------------
// cgroups-rs glue: a hierarchy rooted at our own cgroups
// ---------------------------------------------------------------------------------------------

/// A cgroups-rs hierarchy whose subsystems start at our own cgroup in each hierarchy, so that
/// `Cgroup::load(hier, "fork-<id>")` addresses exactly our sandbox directories and no other
/// controller (cpuset, devices, ...) is touched.
#[derive(Debug, Clone)]
struct OwnHierarchy {
    v2: bool,
    root: PathBuf,
    subsystems: Vec<Subsystem>,
}

impl OwnHierarchy {
    fn new(layout: &Layout) -> Self {
        let v2 = layout.version == CgroupVersion::V2;
        let mut subsystems = Vec::new();
        for d in &layout.dirs {
            for &name in &d.controllers {
                let (p, r) = (d.own_dir.clone(), d.mount_root.clone());
                let sub = match name {
                    "memory" => Subsystem::Mem(MemController::new(p, r, v2)),
                    "pids" => Subsystem::Pid(PidController::new(p, r, v2)),
                    "cpu" => Subsystem::Cpu(CpuController::new(p, r, v2)),
                    "cpuacct" => Subsystem::CpuAcct(CpuAcctController::new(p, r)),
                    "freezer" => Subsystem::Freezer(FreezerController::new(p, r, v2)),
                    _ => continue,
                };
                subsystems.push(sub);
            }
        }
        let root = layout
            .dirs
            .first()
            .map(|d| d.own_dir.clone())
            .unwrap_or_else(|| PathBuf::from(UNIFIED_MOUNTPOINT));
        OwnHierarchy {
            v2,
            root,
            subsystems,
        }
    }
}

impl Hierarchy for OwnHierarchy {
    fn subsystems(&self) -> Vec<Subsystem> {
        self.subsystems.clone()
    }

    fn root(&self) -> PathBuf {
        self.root.clone()
    }

    fn root_control_group(&self) -> Cgroup {
        Cgroup::load(Box::new(self.clone()), "")
    }

    fn parent_control_group(&self, _path: &str) -> Cgroup {
        Cgroup::load(Box::new(self.clone()), "")
    }

    fn v2(&self) -> bool {
        self.v2
    }
}

// ---------------------------------------------------------------------------------------------
// v2 delegation
// ---------------------------------------------------------------------------------------------

fn read_words(path: &Path) -> Result<Vec<String>, CgroupError> {
    let text = fs::read_to_string(path).map_err(io_err("reading", path))?;
    Ok(text.split_whitespace().map(str::to_string).collect())
}

/// Makes sure memory, cpu and pids are enabled for children of `own_dir` (v2).
fn ensure_v2_controllers(own_dir: &Path) -> Result<(), CgroupError> {
    let available = read_words(&own_dir.join("cgroup.controllers"))?;
    let missing: Vec<String> = V2_CONTROLLERS
        .iter()
        .filter(|c| !available.iter().any(|a| a == *c))
        .map(|c| c.to_string())
        .collect();
    if !missing.is_empty() {
        return Err(CgroupError::NotDelegated {
            path: own_dir.to_path_buf(),
            missing,
            fix: DELEGATE_FIX.into(),
        });
    }
    let subtree = own_dir.join("cgroup.subtree_control");
    let enabled = read_words(&subtree)?;
    let to_enable: Vec<&str> = V2_CONTROLLERS
        .iter()
        .copied()
        .filter(|c| !enabled.iter().any(|e| e == c))
        .collect();
    if to_enable.is_empty() {
        return Ok(());
    }
    let line = to_enable
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    match fs::write(&subtree, &line) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            let procs_path = own_dir.join("cgroup.procs");
            let procs = parse_pids(
                &fs::read_to_string(&procs_path).map_err(io_err("reading", &procs_path))?,
            );
            let me = std::process::id() as i32;
            let others = procs.iter().filter(|&&p| p != me).count();
            if others > 0 {
                return Err(CgroupError::InternalProcesses {
                    path: own_dir.to_path_buf(),
                    others,
                    fix: format!("{DELEGATE_FIX}; fork then moves itself into {SUPERVISOR_LEAF}"),
                });
            }
            // We are the only process: move into a leaf so the parent may enable controllers.
            let leaf = own_dir.join(SUPERVISOR_LEAF);
            match fs::create_dir(&leaf) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err("creating", &leaf)(e)),
            }
            let leaf_procs = leaf.join("cgroup.procs");
            fs::write(&leaf_procs, me.to_string()).map_err(io_err("writing", &leaf_procs))?;
            fs::write(&subtree, &line).map_err(|source| CgroupError::Write {
                file: subtree.clone(),
                value: line.clone(),
                source: Box::new(source),
            })
        }
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EACCES | libc::EPERM | libc::EROFS)
            ) =>
        {
            Err(CgroupError::NotDelegated {
                path: own_dir.to_path_buf(),
                missing: to_enable.iter().map(|c| c.to_string()).collect(),
                fix: DELEGATE_FIX.into(),
            })
        }
        Err(source) => Err(CgroupError::Write {
            file: subtree,
            value: line,
            source: Box::new(source),
        }),
    }
}

// ---------------------------------------------------------------------------------------------
// The sandbox cgroup
// ---------------------------------------------------------------------------------------------

/// Stat files opened once, read with `pread` by [`SandboxCgroup::sample`].
#[derive(Debug, Default)]
struct StatFiles {
    cpu: Option<File>,
    mem_current: Option<File>,
    mem_peak: Option<File>,
    mem_events: Option<File>,
    pids_current: Option<File>,
    pids_peak: Option<File>,
    pids_events: Option<File>,
}

impl StatFiles {
    fn open(version: CgroupVersion, dir_of: impl Fn(&str) -> Option<PathBuf>) -> Self {
        let open = |ctl: &str, name: &str| dir_of(ctl).and_then(|d| File::open(d.join(name)).ok());
        match version {
            CgroupVersion::V1 => StatFiles {
                cpu: open("cpuacct", "cpuacct.usage"),
                mem_current: open("memory", "memory.usage_in_bytes"),
                mem_peak: open("memory", "memory.max_usage_in_bytes"),
                mem_events: open("memory", "memory.oom_control"),
                pids_current: open("pids", "pids.current"),
                pids_peak: open("pids", "pids.peak"),
                pids_events: open("pids", "pids.events"),
            },
            CgroupVersion::V2 => StatFiles {
                cpu: open("cpu", "cpu.stat"),
                mem_current: open("memory", "memory.current"),
                mem_peak: open("memory", "memory.peak"),
                mem_events: open("memory", "memory.events"),
                pids_current: open("pids", "pids.current"),
                pids_peak: open("pids", "pids.peak"),
                pids_events: open("pids", "pids.events"),
            },
        }
    }
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

/// The cgroup of one sandbox, in every hierarchy we use.
#[derive(Debug)]
pub struct SandboxCgroup {
    run_id: String,
    version: CgroupVersion,
    cgroup: Cgroup,
    /// (controllers, sandbox directory) per hierarchy.
    dirs: Vec<(Vec<&'static str>, PathBuf)>,
    stats: StatFiles,
    done: bool,
}

impl SandboxCgroup {
    /// Creates `fork-<run_id>` beneath this process's own cgroup in each hierarchy that has a
    /// controller we need, and applies the limits. On any error nothing is left behind.
    pub fn create(run_id: &str, limits: &CgroupLimits) -> Result<Self, CgroupError> {
        validate_run_id(run_id)?;
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
        let quota = limits.cpu_percent.map(cpu_quota).transpose()?;
        let layout = detect_layout()?;
        if !layout.missing.is_empty() {
            return Err(missing_controllers_error(layout.missing));
        }
        let name = format!("{PREFIX}{run_id}");
        for d in &layout.dirs {
            let target = d.own_dir.join(&name);
            if target.exists() {
                return Err(CgroupError::AlreadyExists { path: target });
            }
        }
        if layout.version == CgroupVersion::V2 {
            // Single hierarchy: enable controllers for children, then mkdir (not create_dir_all:
            // a missing parent must be an error, not silently created).
            let own = &layout.dirs[0].own_dir; // invariant: v2 layouts have exactly one dir
            ensure_v2_controllers(own)?;
            let target = own.join(&name);
            fs::create_dir(&target).map_err(io_err("creating", &target))?;
        }
        let mut sandbox = Self::attach(&layout, run_id);
        if layout.version == CgroupVersion::V1 {
            if let Err(source) = sandbox.cgroup.create() {
                let path = sandbox.paths().first().cloned().unwrap_or_default();
                let _ = sandbox.remove_dirs(Instant::now());
                sandbox.done = true;
                return Err(CgroupError::Write {
                    file: path,
                    value: "mkdir".into(),
                    source: Box::new(source),
                });
            }
        }
        if let Err(e) = sandbox.apply_limits(limits, quota) {
            let _ = sandbox.destroy_inner();
            return Err(e);
        }
        sandbox.stats = StatFiles::open(sandbox.version, |ctl| sandbox.dir_of(ctl));
        Ok(sandbox)
    }

    /// A handle on `fork-<run_id>` in `layout`, without creating anything.
    fn attach(layout: &Layout, run_id: &str) -> Self {
        let name = format!("{PREFIX}{run_id}");
        let hier = OwnHierarchy::new(layout);
        let cgroup = Cgroup::load(Box::new(hier), name.as_str());
        let dirs = layout
            .dirs
            .iter()
            .map(|d| (d.controllers.clone(), d.own_dir.join(&name)))
            .collect();
        SandboxCgroup {
            run_id: run_id.to_string(),
            version: layout.version,
            cgroup,
            dirs,
            stats: StatFiles::default(),
            done: false,
        }
    }

    fn dir_of(&self, controller: &str) -> Option<PathBuf> {
        self.dirs
            .iter()
            .find(|(ctls, _)| ctls.contains(&controller))
            .map(|(_, d)| d.clone())
    }

    fn apply_limits(
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
            let mem = self.cgroup.controller_of::<MemController>();
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
        }
        if let Some((quota_us, period_us)) = quota {
            let Some(cpu) = self.cgroup.controller_of::<CpuController>() else {
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
            let Some(pids) = self.cgroup.controller_of::<PidController>() else {
                return Err(missing_controllers_error(vec!["pids".into()]));
            };
            pids.set_pid_max(MaxValue::Value(i64::try_from(max).unwrap_or(i64::MAX)))
                .map_err(write_err(self.dir_of("pids"), "pids.max", max.to_string()))?;
        }
        Ok(())
    }

    /// The cgroup interface in use.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The run id this cgroup belongs to.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Moves process `pid` (all its threads) into the sandbox cgroup in every hierarchy. The
    /// supervisor calls this for the sandbox init before it starts working.
    pub fn add_pid(&self, pid: i32) -> Result<(), CgroupError> {
        if pid <= 0 {
            return Err(CgroupError::InvalidPid {
                pid,
                detail: "not a process id",
            });
        }
        if pid == std::process::id() as i32 {
            return Err(CgroupError::InvalidPid {
                pid,
                detail: "that is the supervisor itself, which must stay outside the sandbox",
            });
        }
        for (_, dir) in &self.dirs {
            let procs = dir.join("cgroup.procs");
            fs::write(&procs, pid.to_string()).map_err(|source| CgroupError::Write {
                file: procs.clone(),
                value: pid.to_string(),
                source: Box::new(source),
            })?;
        }
        Ok(())
    }

    /// Reads the usage counters: a few `pread`s on files opened at creation. Counters the
    /// kernel does not offer read as 0 (`pids_peak` as `None`).
    pub fn sample(&self) -> CgroupSample {
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

    /// The processes in the sandbox, across every hierarchy.
    fn live_pids(&self) -> Vec<i32> {
        let mut all = BTreeSet::new();
        for (_, dir) in &self.dirs {
            if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
                all.extend(parse_pids(&text));
            }
        }
        all.into_iter().collect()
    }

    /// Kills every process in the sandbox and waits (bounded, ~2 s) until none is left.
    /// v2 uses `cgroup.kill` when present; otherwise freeze, SIGKILL through pidfds, thaw,
    /// repeat.
    pub fn kill_all(&self) -> Result<(), CgroupError> {
        let start = Instant::now();
        let kill_file = match self.version {
            CgroupVersion::V2 => self
                .dirs
                .first()
                .map(|(_, d)| d.join("cgroup.kill"))
                .filter(|p| p.exists()),
            CgroupVersion::V1 => None,
        };
        loop {
            let pids = self.live_pids();
            if pids.is_empty() {
                return Ok(());
            }
            let used_kill_file = kill_file
                .as_ref()
                .is_some_and(|k| fs::write(k, "1").is_ok());
            if !used_kill_file {
                self.signal_round();
            }
            if start.elapsed() >= KILL_WAIT {
                let remaining = self.live_pids().len();
                if remaining == 0 {
                    return Ok(());
                }
                return Err(CgroupError::KillTimeout {
                    paths: self.paths(),
                    remaining,
                    waited: start.elapsed(),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// One freeze / SIGKILL / thaw round over the listed processes.
    fn signal_round(&self) {
        let freezer = self.cgroup.controller_of::<FreezerController>();
        let frozen = freezer.is_some_and(|f| f.freeze().is_ok());
        let me = std::process::id() as i32;
        let mut targets: Vec<(i32, Option<OwnedFd>)> = Vec::new();
        for pid in self.live_pids() {
            if pid == me {
                continue;
            }
            targets.push((pid, pidfd_open(pid)));
        }
        // Only processes still listed after their pidfd was opened are signalled: a pid that
        // exited and was recycled in between is no longer in our cgroup.
        let still = self.live_pids();
        for (pid, fd) in targets {
            if !still.contains(&pid) {
                continue;
            }
            match fd {
                Some(fd) => pidfd_kill(&fd),
                None => {
                    // pidfd_open unavailable (kernel < 5.3): plain kill after the re-check.
                    // SAFETY: kill(2) with a positive pid listed in our cgroup and SIGKILL.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
            }
        }
        if frozen {
            if let Some(f) = freezer {
                let _ = f.thaw();
            }
        }
    }

    /// Removes the (now empty) directories, retrying while the kernel still sees tasks.
    fn remove_dirs(&self, start: Instant) -> Result<(), CgroupError> {
        for (_, dir) in &self.dirs {
            loop {
                match remove_cgroup_tree(dir) {
                    Ok(()) => break,
                    Err(e)
                        if e.raw_os_error() == Some(libc::EBUSY) && start.elapsed() < KILL_WAIT =>
                    {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => return Err(io_err("removing (rmdir)", dir)(e)),
                }
            }
        }
        Ok(())
    }

    fn destroy_inner(&mut self) -> Result<(), CgroupError> {
        let start = Instant::now();
        let killed = self.kill_all();
        self.stats = StatFiles::default();
        let removed = self.remove_dirs(start);
        self.done = true;
        killed.and(removed)
    }

    /// Kills everything, waits (bounded) for the cgroup to empty and removes it in every
    /// hierarchy. Idempotent: directories already gone are fine.
    pub fn destroy(mut self) -> Result<(), CgroupError> {
        self.destroy_inner()
    }

    /// The sandbox's directories, one per hierarchy.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|(_, d)| d.clone()).collect()
    }
}

impl Drop for SandboxCgroup {
    /// Best effort: a sandbox cgroup is never left behind by an early return or a panic.
    fn drop(&mut self) {
        if !self.done {
            let _ = self.destroy_inner();
        }
    }
}

/// rmdir `dir` after its child cgroups (depth first); a missing directory is success.
fn remove_cgroup_tree(dir: &Path) -> io::Result<()> {
    match fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    remove_cgroup_tree(&entry.path())?;
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    match fs::remove_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(pid, 0) takes no pointers; a non-negative return is a new fd we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    let fd = i32::try_from(fd).ok()?;
    // SAFETY: `fd` was just returned by pidfd_open and is owned by nobody else.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn pidfd_kill(fd: &OwnedFd) {
    // SAFETY: pidfd_send_signal on a pidfd we own, SIGKILL, no siginfo (NULL), flags 0.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        );
    }
}

/// For `fork gc`: removes every `fork-<run_id>` cgroup under our own cgroups whose run id
/// passes `is_stale`, killing its tasks first. Returns the directories removed. Every stale
/// run is attempted; the first failure is returned after the others were tried.
pub fn remove_stale(is_stale: &dyn Fn(&str) -> bool) -> Result<Vec<PathBuf>, CgroupError> {
    let layout = detect_layout()?;
    let mut ids = BTreeSet::new();
    for d in &layout.dirs {
        let entries = match fs::read_dir(&d.own_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err("listing", &d.own_dir)(e)),
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
                continue;
            };
            if validate_run_id(id).is_ok()
                && entry.file_type().is_ok_and(|t| t.is_dir())
                && is_stale(id)
            {
                ids.insert(id.to_string());
            }
        }
    }
    let mut removed = Vec::new();
    let mut first_err = None;
    for id in ids {
        let cg = SandboxCgroup::attach(&layout, &id);
        let existing: Vec<PathBuf> = cg.paths().into_iter().filter(|p| p.exists()).collect();
        match cg.destroy() {
            Ok(()) => removed.extend(existing),
            Err(e) => {
                if first_err.is_none() {
                    first_err = Some(e);
                }
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(removed),
    }
}

/// One controller as seen by [`probe`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct ControllerProbe {
    /// `memory`, `cpu`, `cpuacct`, `pids`, `freezer`.
    pub name: String,
    /// Whether fork can use it.
    pub usable: bool,
    /// Our own cgroup in its hierarchy.
    pub own_cgroup: Option<PathBuf>,
}

/// A problem found by [`probe`], with its fix.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CgroupProblem {
    /// What is wrong.
    pub what: String,
    /// How to fix it.
    pub fix: String,
}

/// What `fork check` reports about cgroups.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CgroupProbe {
    /// The interface in use, when one was found.
    pub version: Option<CgroupVersion>,
    /// Every controller fork uses.
    pub controllers: Vec<ControllerProbe>,
    /// A probe cgroup could be created (with limits) and removed.
    pub can_create: bool,
    /// Memory limits also bound swap (or the host has no swap).
    pub swap_limited: bool,
    /// Problems and their fixes.
    pub problems: Vec<CgroupProblem>,
    /// Budgets can be enforced here: a version was found, every required controller is
    /// usable and a child cgroup could be created and removed.
    pub usable: bool,
    /// The fix of every problem, in order, without repeats.
    pub fix: Vec<String>,
}

impl CgroupProbe {
    /// One line for `fork check`.
    pub fn summary(&self) -> String {
        let Some(version) = self.version else {
            return "no usable cgroup hierarchy found".into();
        };
        let v = match version {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        };
        let usable: Vec<&str> = self
            .controllers
            .iter()
            .filter(|c| c.usable)
            .map(|c| c.name.as_str())
            .collect();
        let unusable: Vec<&str> = self
            .controllers
            .iter()
            .filter(|c| !c.usable)
            .map(|c| c.name.as_str())
            .collect();
        let mut out = format!("cgroup {v}: controllers {}", usable.join(", "));
        if !unusable.is_empty() {
            out.push_str(&format!(" (unavailable: {})", unusable.join(", ")));
        }
        out.push_str(if self.can_create {
            "; child cgroups can be created beneath our own cgroup"
        } else {
            "; cannot create a child cgroup"
        });
        if self.can_create && !self.swap_limited {
            out.push_str("; memory limits do not bound swap");
        }
        out
    }
}

fn host_has_swap() -> bool {
    fs::read_to_string("/proc/swaps")
        .map(|t| t.lines().skip(1).any(|l| !l.trim().is_empty()))
        .unwrap_or(false)
}

/// For `fork check`: the version, which controllers are usable, whether a child cgroup can be
/// created (by creating and removing a probe cgroup with limits), and the fix for each problem.
pub fn probe() -> CgroupProbe {
    let mut out = CgroupProbe {
        version: None,
        controllers: Vec::new(),
        can_create: false,
        swap_limited: false,
        problems: Vec::new(),
        usable: false,
        fix: Vec::new(),
    };
    let layout = match detect_layout() {
        Ok(l) => l,
        Err(e) => {
            let fix = match &e {
                CgroupError::OwnCgroup { fix, .. } => fix.clone(),
                _ => "mount /proc and the cgroup filesystems under /sys/fs/cgroup".into(),
            };
            out.problems.push(CgroupProblem {
                what: e.to_string(),
                fix,
            });
            return finish_probe(out);
        }
    };
    out.version = Some(layout.version);
    let names: &[&str] = match layout.version {
        CgroupVersion::V1 => &["memory", "pids", "cpu", "cpuacct", "freezer"],
        CgroupVersion::V2 => &V2_CONTROLLERS,
    };
    let v2_available = match layout.version {
        CgroupVersion::V2 => layout
            .dirs
            .first()
            .and_then(|d| read_words(&d.own_dir.join("cgroup.controllers")).ok())
            .unwrap_or_default(),
        CgroupVersion::V1 => Vec::new(),
    };
    for &name in names {
        let dir = layout
            .dirs
            .iter()
            .find(|d| d.controllers.contains(&name))
            .map(|d| d.own_dir.clone());
        let usable = match layout.version {
            CgroupVersion::V1 => dir.is_some(),
            CgroupVersion::V2 => v2_available.iter().any(|a| a == name),
        };
        out.controllers.push(ControllerProbe {
            name: name.to_string(),
            usable,
            own_cgroup: dir,
        });
    }
    if !layout.missing.is_empty() {
        if let CgroupError::MissingControllers { fix, .. } =
            missing_controllers_error(layout.missing.clone())
        {
            out.problems.push(CgroupProblem {
                what: format!(
                    "cgroup v1 controllers missing: {}",
                    layout.missing.join(", ")
                ),
                fix,
            });
        }
    }
    let probe_id = format!("probe-{}", uuid::Uuid::new_v4().simple());
    let limits = CgroupLimits {
        memory_bytes: Some(64 << 20),
        cpu_percent: Some(100),
        pids: Some(64),
    };
    match SandboxCgroup::create(&probe_id, &limits) {
        Ok(cg) => {
            out.swap_limited = match cg.dir_of("memory") {
                Some(d) if cg.version == CgroupVersion::V1 => {
                    d.join("memory.memsw.limit_in_bytes").exists() || !host_has_swap()
                }
                Some(d) => d.join("memory.swap.max").exists() || !host_has_swap(),
                None => false,
            };
            match cg.destroy() {
                Ok(()) => out.can_create = true,
                Err(e) => out.problems.push(CgroupProblem {
                    what: format!("the probe cgroup could not be removed: {e}"),
                    fix: "run `fork gc`".into(),
                }),
            }
            if !out.swap_limited {
                out.problems.push(CgroupProblem {
                    what: "memory limits do not bound swap (no swap accounting), so a sandbox \
                           may swap instead of being OOM-killed"
                        .into(),
                    fix: "boot with swapaccount=1 (cgroup v1) or enable the swap controller, \
                          or run without swap"
                        .into(),
                });
            }
        }
        Err(e) => {
            let fix = match &e {
                CgroupError::NotDelegated { fix, .. }
                | CgroupError::InternalProcesses { fix, .. }
                | CgroupError::MissingControllers { fix, .. }
                | CgroupError::OwnCgroup { fix, .. } => fix.clone(),
                _ => "run fork as root or in a delegated cgroup (`systemd-run --user --scope -p Delegate=yes fork ...`)".into(),
            };
            out.problems.push(CgroupProblem {
                what: format!("cannot create a child cgroup: {e}"),
                fix,
            });
        }
    }
    finish_probe(out)
}

/// Fills the derived fields of a probe.
fn finish_probe(mut out: CgroupProbe) -> CgroupProbe {
    let required_ok = out
        .controllers
        .iter()
        .filter(|c| c.name != "freezer")
        .all(|c| c.usable);
    out.usable = out.version.is_some() && required_ok && out.can_create;
    for p in &out.problems {
        if !out.fix.contains(&p.fix) {
            out.fix.push(p.fix.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Child, Command, ExitStatus, Stdio};

    fn unique(tag: &str) -> String {
        format!("test-{tag}-{}", uuid::Uuid::new_v4().simple())
    }

    fn wait_bounded(child: &mut Child, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                panic!("child did not finish within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Spawns `sh -c 'read go; <script>'`: it blocks until released, so it is inside the
    /// cgroup before it does any work.
    fn spawn_gated(script: &str) -> Child {
        Command::new("sh")
            .args(["-c", &format!("read go; {script}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    fn release(child: &mut Child) {
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"go\n").unwrap();
    }

    fn read_trim(path: &Path) -> String {
        fs::read_to_string(path).unwrap().trim().to_string()
    }

    // ---- pure parts -------------------------------------------------------------------------

    #[test]
    fn parses_proc_self_cgroup_v1_and_v2() {
        let v1 = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n2:cpu,cpuacct:/user.slice\n0::/\n";
        let e = parse_proc_cgroup(v1);
        assert_eq!(own_path_v1(&e, "memory"), Some("/process_api/abc"));
        assert_eq!(own_path_v1(&e, "cpuacct"), Some("/user.slice"));
        assert_eq!(own_path_v1(&e, "cpu"), Some("/user.slice"));
        assert_eq!(own_path_v1(&e, "freezer"), None);
        assert_eq!(own_path_v2(&e), Some("/"));
        let v2 = "0::/user.slice/user-1000.slice/session-3.scope\n";
        assert_eq!(
            own_path_v2(&parse_proc_cgroup(v2)),
            Some("/user.slice/user-1000.slice/session-3.scope")
        );
        assert!(parse_proc_cgroup("garbage\n").is_empty());
    }

    #[test]
    fn builds_own_dirs_relative_to_the_mount_root() {
        let dir = join_own_dir(
            Path::new("/sys/fs/cgroup/memory"),
            Path::new("/"),
            "/process_api/abc",
        );
        assert_eq!(
            dir,
            Some(PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"))
        );
        assert_eq!(
            join_own_dir(Path::new("/sys/fs/cgroup/pids"), Path::new("/"), "/"),
            Some(PathBuf::from("/sys/fs/cgroup/pids"))
        );
        // A container bind-mounting its own subtree: the mount root is stripped.
        assert_eq!(
            join_own_dir(
                Path::new("/sys/fs/cgroup"),
                Path::new("/docker/c1"),
                "/docker/c1/app"
            ),
            Some(PathBuf::from("/sys/fs/cgroup/app"))
        );
        // Outside the mount root (cgroup namespace confusion) and `..` are refused.
        assert_eq!(
            join_own_dir(Path::new("/sys/fs/cgroup"), Path::new("/a"), "/b"),
            None
        );
        assert_eq!(
            join_own_dir(Path::new("/sys/fs/cgroup"), Path::new("/"), "/../x"),
            None
        );
    }

    #[test]
    fn finds_the_cgroup2_mount_root() {
        let mi = "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n\
                  31 23 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount_root(mi, "/sys/fs/cgroup"),
            Some(PathBuf::from("/"))
        );
        let container = "40 30 0:26 /docker/c1 /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount_root(container, "/sys/fs/cgroup"),
            Some(PathBuf::from("/docker/c1"))
        );
        assert_eq!(cgroup2_mount_root(mi, "/elsewhere"), None);
    }

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
        assert_eq!(parse_pids("12\n34\n\n"), vec![12, 34]);
    }

    #[test]
    fn cpu_quota_and_run_ids() {
        assert_eq!(cpu_quota(200).unwrap(), (200_000, 100_000));
        assert_eq!(cpu_quota(50).unwrap(), (50_000, 100_000));
        assert_eq!(cpu_quota(1).unwrap(), (1_000, 100_000));
        assert!(cpu_quota(0).is_err());
        assert!(validate_run_id("3f2a-run_1.x").is_ok());
        for bad in ["", "..", ".hidden", "a/b", "supervisor", &"x".repeat(65)] {
            assert!(validate_run_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn probe_summary_and_fixes_for_an_undelegated_v2_host() {
        let problem = CgroupProblem {
            what: "controllers not delegated".into(),
            fix: DELEGATE_FIX.into(),
        };
        let p = finish_probe(CgroupProbe {
            version: Some(CgroupVersion::V2),
            controllers: V2_CONTROLLERS
                .iter()
                .map(|n| ControllerProbe {
                    name: n.to_string(),
                    usable: *n != "memory",
                    own_cgroup: Some(PathBuf::from("/sys/fs/cgroup/user.slice")),
                })
                .collect(),
            can_create: false,
            swap_limited: false,
            problems: vec![problem.clone(), problem],
            usable: true,
            fix: Vec::new(),
        });
        assert!(!p.usable);
        assert_eq!(p.fix, vec![DELEGATE_FIX.to_string()]);
        assert!(p.fix[0].contains("Delegate=yes"));
        let summary = p.summary();
        assert!(summary.contains("cgroup v2"), "{summary}");
        assert!(summary.contains("unavailable: memory"), "{summary}");
        assert!(summary.contains("cannot create"), "{summary}");
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["version"], "v2");
    }

    // ---- real cgroups ------------------------------------------------------------------------

    /// Our own cgroup path for a v1 controller, read independently of the module.
    fn own_v1(controller: &str) -> String {
        let text = fs::read_to_string("/proc/self/cgroup").unwrap();
        text.lines()
            .find_map(|l| {
                let mut it = l.splitn(3, ':');
                let _ = it.next();
                let ctls = it.next()?;
                let path = it.next()?;
                ctls.split(',')
                    .any(|c| c == controller)
                    .then(|| path.to_string())
            })
            .unwrap()
    }

    #[test]
    fn create_writes_limits_under_our_own_cgroup_and_destroy_leaves_nothing() {
        let id = unique("limits");
        let limits = CgroupLimits {
            memory_bytes: Some(128 << 20),
            cpu_percent: Some(150),
            pids: Some(16),
        };
        let cg = SandboxCgroup::create(&id, &limits).unwrap();
        let paths = cg.paths();
        assert!(!paths.is_empty());
        for p in &paths {
            assert!(p.is_dir(), "{p:?}");
            assert_eq!(p.file_name().unwrap(), format!("fork-{id}").as_str());
        }
        match cg.version() {
            CgroupVersion::V1 => {
                let under = |ctl: &str| {
                    let own = own_v1(ctl);
                    PathBuf::from(format!("/sys/fs/cgroup/{ctl}"))
                        .join(own.trim_start_matches('/'))
                        .join(format!("fork-{id}"))
                };
                let mem = under("memory");
                let cpu = under("cpu");
                let pids = under("pids");
                for d in [&mem, &cpu, &pids, &under("cpuacct")] {
                    assert!(paths.contains(d), "{d:?} not in {paths:?}");
                }
                assert_eq!(read_trim(&mem.join("memory.limit_in_bytes")), "134217728");
                if mem.join("memory.memsw.limit_in_bytes").exists() {
                    assert_eq!(
                        read_trim(&mem.join("memory.memsw.limit_in_bytes")),
                        "134217728"
                    );
                }
                assert_eq!(read_trim(&cpu.join("cpu.cfs_period_us")), "100000");
                assert_eq!(read_trim(&cpu.join("cpu.cfs_quota_us")), "150000");
                assert_eq!(read_trim(&pids.join("pids.max")), "16");
            }
            CgroupVersion::V2 => {
                let d = &paths[0];
                assert_eq!(read_trim(&d.join("memory.max")), "134217728");
                assert_eq!(read_trim(&d.join("cpu.max")), "150000 100000");
                assert_eq!(read_trim(&d.join("pids.max")), "16");
            }
        }
        // A second create for the same run id is refused, not merged.
        assert!(matches!(
            SandboxCgroup::create(&id, &CgroupLimits::default()),
            Err(CgroupError::AlreadyExists { .. })
        ));
        cg.destroy().unwrap();
        for p in &paths {
            assert!(!p.exists(), "{p:?} left behind");
        }
    }

    #[test]
    fn dropping_without_destroy_still_removes_the_cgroup() {
        let cg = SandboxCgroup::create(&unique("drop"), &CgroupLimits::default()).unwrap();
        let paths = cg.paths();
        assert!(paths.iter().all(|p| p.exists()));
        drop(cg);
        assert!(paths.iter().all(|p| !p.exists()));
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
        cg.destroy().unwrap();
    }

    #[test]
    fn pids_limit_is_hit_and_kill_all_ends_the_tree_promptly() {
        let cg = SandboxCgroup::create(
            &unique("pids"),
            &CgroupLimits {
                pids: Some(16),
                ..Default::default()
            },
        )
        .unwrap();
        let mut child = spawn_gated("for i in $(seq 40); do sleep 5 & done; wait");
        cg.add_pid(child.id() as i32).unwrap();
        release(&mut child);
        let start = Instant::now();
        let mut s = cg.sample();
        while s.pids_limit_hits == 0 && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
            s = cg.sample();
        }
        assert!(s.pids_limit_hits > 0, "{s:?}");
        assert!(s.pids_current <= 16, "{s:?}");
        if let Some(peak) = s.pids_peak {
            assert!((2..=16).contains(&peak), "{s:?}");
        }
        let t = Instant::now();
        cg.kill_all().unwrap();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        let st = wait_bounded(&mut child, Duration::from_secs(2));
        // The shell either died from SIGKILL or had already exited after a failed fork; either
        // way every task of the tree is gone.
        assert!(st.signal() == Some(libc::SIGKILL) || st.code().is_some());
        assert_eq!(cg.live_pids(), Vec::<i32>::new());
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
        cg.destroy().unwrap();
    }

    #[test]
    fn remove_stale_removes_only_the_stale_leftover_and_its_tasks() {
        let stale_id = unique("stale");
        let live_id = unique("live");
        let stale = SandboxCgroup::create(&stale_id, &CgroupLimits::default()).unwrap();
        let live = SandboxCgroup::create(&live_id, &CgroupLimits::default()).unwrap();
        let mut sleeper = Command::new("sleep")
            .arg("30")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        stale.add_pid(sleeper.id() as i32).unwrap();
        let mut stale_paths = stale.paths();
        // Simulate a crashed supervisor: the handle vanishes without cleanup.
        std::mem::forget(stale);
        let mut removed = remove_stale(&|id| id == stale_id).unwrap();
        removed.sort();
        stale_paths.sort();
        assert_eq!(removed, stale_paths);
        assert!(stale_paths.iter().all(|p| !p.exists()));
        let st = wait_bounded(&mut sleeper, Duration::from_secs(5));
        assert_eq!(st.signal(), Some(libc::SIGKILL));
        assert!(
            live.paths().iter().all(|p| p.exists()),
            "live run untouched"
        );
        live.destroy().unwrap();
    }

    #[test]
    fn add_pid_refuses_the_supervisor() {
        let cg = SandboxCgroup::create(&unique("self"), &CgroupLimits::default()).unwrap();
        assert!(matches!(
            cg.add_pid(std::process::id() as i32),
            Err(CgroupError::InvalidPid { .. })
        ));
        assert!(cg.add_pid(0).is_err());
        cg.destroy().unwrap();
    }

    #[test]
    fn probe_reports_this_host() {
        let p = probe();
        assert!(p.can_create, "{p:?}");
        let (names, tag): (&[&str], &str) = match p.version {
            Some(CgroupVersion::V1) => (&["memory", "pids", "cpu", "cpuacct"], "v1"),
            Some(CgroupVersion::V2) => (&V2_CONTROLLERS, "v2"),
            None => panic!("no cgroup version detected: {p:?}"),
        };
        for &name in names {
            let c = p.controllers.iter().find(|c| c.name == name).unwrap();
            assert!(c.usable && c.own_cgroup.is_some(), "{c:?}");
        }
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["version"], tag);
        assert!(p.usable, "{p:?}");
        for problem in &p.problems {
            assert!(p.fix.contains(&problem.fix), "{p:?}");
        }
        assert!(
            p.summary()
                .starts_with(&format!("cgroup {tag}: controllers ")),
            "{}",
            p.summary()
        );
    }
}
