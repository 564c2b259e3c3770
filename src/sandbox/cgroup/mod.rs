//! Cgroup budgets for one sandbox: the set of cgroups that holds it, with memory, CPU and pids
//! limits, created, joined and destroyed as one.
//!
//! Each sandbox gets a cgroup named `fork-<run_id>` created **beneath this process's own
//! cgroup** in every hierarchy that carries a controller we need, never in place of a hierarchy
//! root. On a v1 host the controllers may live at different places: on the development VM
//! memory is at `/process_api/<id>` while cpu, cpuacct and pids are at `/`, so the sandbox gets
//! `memory/process_api/<id>/fork-<run_id>`, `cpu/fork-<run_id>`, and so on.
//!
//! - **v1**: memory, pids, cpu and cpuacct are required; freezer is used for the kill when
//!   mounted. The memory controller must offer socket accounting
//!   (`memory.kmem.tcp.limit_in_bytes`, see `limits.rs`).
//! - **v2** (unified mode): memory, cpu and pids must be delegated to our cgroup; fork enables
//!   them for its children and, when the "no internal processes" rule requires it, moves itself
//!   (and only itself) into the leaf `fork-supervisor`. The v2 path's pure parts are
//!   unit-tested; the whole of it runs on a live v2 host in the VM harness
//!   (`scripts/vm-test.sh`: Debian's stock kernel, as root and as a delegated user).
//!
//! The sandbox init joins its cgroups by itself (see [`SandboxCgroup::paths`]).
//!
//! One job per file: `layout.rs` decides where the cgroups go, `delegate.rs` enables v2
//! controllers beneath our own cgroup, `limits.rs` writes the budgets, `stats.rs` reads usage
//! for the watchdog, `kill.rs` ends a sandbox (or a stale one for `fork gc`), and `probe.rs`
//! reports the host to `fork check`. cgroups-rs reads our own cgroups, addresses the sandbox's,
//! writes the limits, lists, freezes and (v2) kills; each file says what stays hand-written and
//! why.

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::ioerr::{IoContext, IoError};
use cgroups_rs::fs::Cgroup;

mod delegate;
mod kill;
mod layout;
mod limits;
mod probe;
mod stats;
#[cfg(test)]
mod test_support;

pub use kill::{remove_recorded, remove_stale};
pub use probe::{probe, CgroupProbe, CgroupProblem, ControllerProbe};
pub use stats::CgroupSample;

use delegate::ensure_v2_controllers;
pub use delegate::DELEGATE_FIX;
use layout::{detect_layout, missing_controllers_error, validate_run_id, Layout, PREFIX};
pub use limits::SOCKET_ACCOUNTING_FIX;
use stats::StatFiles;

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
    #[error("cgroup: {} {:?} failed: {}", .0.action, .0.path, .0.source)]
    Io(#[from] IoError),
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
    /// A cgroup path a run directory recorded is not one fork made for that run.
    #[error("cgroup: {path:?}, recorded for run {run_id}, is not a fork cgroup of that run ({detail}); left alone")]
    NotOurs {
        /// The recorded path.
        path: PathBuf,
        /// The run it was recorded for.
        run_id: String,
        /// Why it is refused.
        detail: &'static str,
    },
    /// cgroup v1: the memory controller has no socket accounting to turn on, so socket
    /// buffers would be outside the memory budget.
    #[error("cgroup v1: {file:?} is missing, so the sandbox's socket buffers (TCP and UDP) would not count against its memory budget; fix: {SOCKET_ACCOUNTING_FIX}")]
    NoSocketAccounting {
        /// The control file that is missing.
        file: PathBuf,
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

/// The sandbox's cgroup in one hierarchy.
#[derive(Debug)]
struct SandboxDir {
    /// The controllers of this hierarchy that fork uses.
    controllers: Vec<&'static str>,
    /// The directory.
    path: PathBuf,
    /// cgroups-rs's handle on it, limited to `controllers`.
    cgroup: Cgroup,
}

/// The cgroup of one sandbox, in every hierarchy we use.
#[derive(Debug)]
pub struct SandboxCgroup {
    run_id: String,
    version: CgroupVersion,
    /// One per hierarchy.
    dirs: Vec<SandboxDir>,
    stats: StatFiles,
    done: bool,
}

/// What [`SandboxCgroup::create_recorded`] tells before it creates anything.
pub type Recorder<'a> = dyn FnMut(CgroupVersion, &[PathBuf]) -> Result<(), IoError> + 'a;

impl SandboxCgroup {
    /// Creates `fork-<run_id>` beneath this process's own cgroup in each hierarchy that has a
    /// controller we need, and applies the limits. On any error nothing is left behind.
    pub fn create(run_id: &str, limits: &CgroupLimits) -> Result<Self, CgroupError> {
        Self::create_recorded(run_id, limits, &mut |_, _| Ok(()))
    }

    /// [`Self::create`], handing the hierarchies' version and the absolute paths it is
    /// about to create to `record` first (the run directory keeps them for `fork gc`, see
    /// [`remove_recorded`]); a failing `record` creates nothing.
    pub fn create_recorded(
        run_id: &str,
        limits: &CgroupLimits,
        record: &mut Recorder<'_>,
    ) -> Result<Self, CgroupError> {
        validate_run_id(run_id)?;
        let quota = limits::validate(limits)?;
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
        let targets: Vec<PathBuf> = layout.dirs.iter().map(|d| d.own_dir.join(&name)).collect();
        record(layout.version, &targets)?;
        if layout.version == CgroupVersion::V2 {
            // Single hierarchy: enable controllers for children of our own cgroup only (not
            // cgroups-rs's `Cgroup::create`, which writes at the hierarchy root; see
            // delegate.rs), then mkdir (not create_dir_all: a missing parent must be an error,
            // not silently created).
            let own = &layout.dirs[0].own_dir; // invariant: v2 layouts have exactly one dir
            ensure_v2_controllers(own)?;
            let target = own.join(&name);
            fs::create_dir(&target).ctx("creating", &target)?;
        }
        let mut sandbox = Self::attach(&layout, run_id);
        if layout.version == CgroupVersion::V1 {
            let failed = sandbox
                .dirs
                .iter()
                .find_map(|d| d.cgroup.create().err().map(|e| (d.path.clone(), e)));
            if let Some((file, source)) = failed {
                let _ = sandbox.remove_dirs(Instant::now());
                sandbox.done = true;
                return Err(CgroupError::Write {
                    file,
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
        let dirs = layout
            .dirs
            .iter()
            .map(|d| {
                let (path, cgroup) = d.sandbox(layout.version, &name);
                SandboxDir {
                    controllers: d.controllers.clone(),
                    path,
                    cgroup,
                }
            })
            .collect();
        SandboxCgroup {
            run_id: run_id.to_string(),
            version: layout.version,
            dirs,
            stats: StatFiles::default(),
            done: false,
        }
    }

    /// The sandbox's cgroup in the hierarchy that carries `controller`.
    fn dir(&self, controller: &str) -> Option<&SandboxDir> {
        self.dirs
            .iter()
            .find(|d| d.controllers.contains(&controller))
    }

    fn dir_of(&self, controller: &str) -> Option<PathBuf> {
        self.dir(controller).map(|d| d.path.clone())
    }

    fn cgroup_of(&self, controller: &str) -> Option<&Cgroup> {
        self.dir(controller).map(|d| &d.cgroup)
    }

    /// The cgroup interface in use.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The run id this cgroup belongs to.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Moves process `pid` (all its threads) into the sandbox cgroup in every hierarchy.
    ///
    /// The sandbox init does not come this way: it joins by itself (see [`Self::paths`]).
    /// Hand-written rather than cgroups-rs's `add_task_by_tgid`, which writes once per
    /// controller, so twice into a co-mounted `cpu,cpuacct`.
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
        for d in &self.dirs {
            let procs = d.path.join("cgroup.procs");
            fs::write(&procs, pid.to_string()).map_err(|source| CgroupError::Write {
                file: procs.clone(),
                value: pid.to_string(),
                source: Box::new(source),
            })?;
        }
        Ok(())
    }

    /// Kills everything, waits (bounded) for the cgroup to empty and removes it in every
    /// hierarchy. Idempotent: directories already gone are fine.
    pub fn destroy(mut self) -> Result<(), CgroupError> {
        self.destroy_inner()
    }

    /// The sandbox's directories, one per hierarchy.
    ///
    /// The sandbox init joins them by itself rather than being moved by the supervisor: on v2
    /// the kernel places it at clone (`CLONE_INTO_CGROUP` on the directory), on v1 it writes
    /// `0` to each directory's `tasks`, opened for it before the clone. Either way the
    /// supervisor never writes to `cgroup.procs`, a write that waits for an RCU grace period.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.path.clone()).collect()
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

#[cfg(test)]
mod tests {
    use super::test_support::{own_v1, read_trim, unique};
    use super::*;

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
        // cgroups-rs addresses exactly our directories, one controller each, and no other.
        for d in &cg.dirs {
            let subsystems = d.cgroup.subsystems();
            assert_eq!(subsystems.len(), d.controllers.len(), "{d:?}");
            for s in subsystems {
                assert!(
                    d.controllers.contains(&s.controller_name().as_str()),
                    "{d:?}"
                );
                assert_eq!(s.to_controller().path(), d.path, "{d:?}");
            }
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
    fn add_pid_refuses_the_supervisor() {
        let cg = SandboxCgroup::create(&unique("self"), &CgroupLimits::default()).unwrap();
        assert!(matches!(
            cg.add_pid(std::process::id() as i32),
            Err(CgroupError::InvalidPid { .. })
        ));
        assert!(cg.add_pid(0).is_err());
        cg.destroy().unwrap();
    }
}
