//! Ending a sandbox: killing every task of its cgroups (bounded, ~2 s) and removing the
//! directories, for one live sandbox or for the stale leftovers `fork gc` collects.
//!
//! v2 kills through `cgroup.kill` (cgroups-rs's `Cgroup::kill`). Without it (v1, or a kernel
//! before 5.14) the kill freezes the cgroup when a freezer exists, opens a pidfd for each listed
//! process, re-reads the list and signals only the pidfds whose process is still listed (so a
//! recycled pid is never hit), thaws, and repeats until the cgroup is empty.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cgroups_rs::fs::freezer::FreezerController;

use crate::sandbox::sys::{pidfd_open, pidfd_send_signal};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::delegate::SUPERVISOR_LEAF;
use super::layout::{detect_layout, layout_of_recorded, validate_run_id, PREFIX};
use super::{CgroupError, CgroupVersion, SandboxCgroup};
use crate::ioerr::IoError;

/// How long kill_all / destroy wait for the cgroup to empty.
const KILL_WAIT: Duration = Duration::from_secs(2);

impl SandboxCgroup {
    /// The processes in the sandbox, across every hierarchy.
    pub(super) fn live_pids(&self) -> Vec<i32> {
        let mut all = BTreeSet::new();
        for d in &self.dirs {
            all.extend(
                d.cgroup
                    .procs()
                    .into_iter()
                    .filter_map(|p| i32::try_from(p.pid).ok())
                    .filter(|&p| p > 0),
            );
        }
        all.into_iter().collect()
    }

    /// Kills every process in the sandbox and waits (bounded, ~2 s) until none is left.
    /// v2 uses `cgroup.kill` when present; otherwise freeze, SIGKILL through pidfds, thaw,
    /// repeat.
    pub fn kill_all(&self) -> Result<(), CgroupError> {
        let start = Instant::now();
        loop {
            if self.live_pids().is_empty() {
                return Ok(());
            }
            // cgroups-rs refuses `kill` on v1 and where the kernel has no `cgroup.kill`.
            let killed_by_kernel = self.version == CgroupVersion::V2
                && self.dirs.first().is_some_and(|d| d.cgroup.kill().is_ok());
            if !killed_by_kernel {
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
        let freezer = self
            .cgroup_of("freezer")
            .and_then(|c| c.controller_of::<FreezerController>());
        let frozen = freezer.is_some_and(|f| f.freeze().is_ok());
        let me = std::process::id() as i32;
        let mut targets: Vec<(i32, Option<OwnedFd>)> = Vec::new();
        for pid in self.live_pids() {
            if pid == me {
                continue;
            }
            targets.push((pid, pidfd_open(Pid::from_raw(pid)).ok()));
        }
        // Only processes still listed after their pidfd was opened are signalled: a pid that
        // exited and was recycled in between is no longer in our cgroup.
        let still = self.live_pids();
        for (pid, fd) in targets {
            if !still.contains(&pid) {
                continue;
            }
            let _ = match fd {
                Some(fd) => pidfd_send_signal(fd.as_fd(), Signal::SIGKILL),
                // pidfd_open unavailable (kernel < 5.3): plain kill after the re-check.
                None => kill(Pid::from_raw(pid), Signal::SIGKILL),
            };
        }
        if frozen {
            if let Some(f) = freezer {
                let _ = f.thaw();
            }
        }
    }

    /// Removes the (now empty) directories, retrying while the kernel still sees tasks.
    ///
    /// Hand-written rather than cgroups-rs's `Cgroup::delete`: on v2 that is a single rmdir,
    /// which fails on a nested child cgroup and on a directory already gone (destroy must be
    /// idempotent); on v1 it gives up after ~150 ms whatever the error, where we wait out EBUSY
    /// for the same bound as the kill and report any other error at once.
    pub(super) fn remove_dirs(&self, start: Instant) -> Result<(), CgroupError> {
        for d in &self.dirs {
            loop {
                match remove_cgroup_tree(&d.path) {
                    Ok(()) => break,
                    Err(e)
                        if e.raw_os_error() == Some(libc::EBUSY) && start.elapsed() < KILL_WAIT =>
                    {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => return Err(IoError::new("removing (rmdir)", &d.path, e).into()),
                }
            }
        }
        Ok(())
    }

    /// Kill, close the stat files, remove; marks the handle done whatever happened.
    ///
    /// An empty cgroup (the usual case: the supervisor emptied it when the init ended) is
    /// removed at once, one rmdir per hierarchy: the kernel refuses (EBUSY) to remove one
    /// that still holds a task or a child cgroup, and only then are the tasks listed and
    /// killed and the children looked for.
    pub(super) fn destroy_inner(&mut self) -> Result<(), CgroupError> {
        let start = Instant::now();
        self.stats = Default::default();
        if self.remove_empty_dirs() {
            self.done = true;
            return Ok(());
        }
        let killed = self.kill_all();
        let removed = self.remove_dirs(start);
        self.done = true;
        killed.and(removed)
    }

    /// One rmdir per hierarchy (a directory already gone counts as removed); false as soon
    /// as one is refused, the rest then left to [`Self::remove_dirs`].
    fn remove_empty_dirs(&self) -> bool {
        self.dirs.iter().all(|d| match fs::remove_dir(&d.path) {
            Ok(()) => true,
            Err(e) => e.kind() == io::ErrorKind::NotFound,
        })
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
            Err(e) => return Err(IoError::new("listing", &d.own_dir, e).into()),
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

/// For `fork gc`: removes the cgroups a dead supervisor's run directory recorded for
/// `run_id` (see `rundir::record_cgroups`), killing their tasks first, wherever they are
/// (on v2 beside the dead supervisor's own leaf, which `fork gc` cannot derive from its
/// own cgroup). Every path is checked first (named `fork-<run_id>`, beneath a hierarchy
/// fork uses, on a cgroup filesystem); one that fails is left alone and reported. On v2
/// the dead supervisor's leaf `fork-supervisor` beside them goes too when it is empty (the
/// kernel refuses to remove a cgroup that holds a process or a child). Returns the
/// directories removed.
pub fn remove_recorded(run_id: &str, paths: &[PathBuf]) -> Result<Vec<PathBuf>, CgroupError> {
    let present: Vec<PathBuf> = paths.iter().filter(|p| p.exists()).cloned().collect();
    if present.is_empty() {
        return Ok(Vec::new());
    }
    let host = detect_layout()?;
    let layout = layout_of_recorded(&host, run_id, &present)?;
    let cg = SandboxCgroup::attach(&layout, run_id);
    let mut removed: Vec<PathBuf> = cg.paths().into_iter().filter(|p| p.exists()).collect();
    cg.destroy()?;
    if layout.version == CgroupVersion::V2 {
        for d in &layout.dirs {
            let leaf = d.own_dir.join(SUPERVISOR_LEAF);
            if leaf.is_dir() && fs::remove_dir(&leaf).is_ok() {
                removed.push(leaf);
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{release, spawn_gated, unique, wait_bounded};
    use super::super::CgroupLimits;
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};

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
    fn destroy_of_a_cgroup_still_holding_tasks_kills_them_and_removes_it() {
        // destroy tries a bare rmdir first; the kernel refuses it while a task is inside,
        // and the kill then runs as before.
        let cg = SandboxCgroup::create(&unique("busy"), &CgroupLimits::default()).unwrap();
        let paths = cg.paths();
        let mut child = spawn_gated("sleep 30 & sleep 30; wait");
        cg.add_pid(child.id() as i32).unwrap();
        release(&mut child);
        let start = Instant::now();
        while cg.live_pids().len() < 2 && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(cg.live_pids().len() >= 2, "{:?}", cg.live_pids());
        cg.destroy().unwrap();
        let st = wait_bounded(&mut child, Duration::from_secs(2));
        assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?}");
        for p in &paths {
            assert!(!p.exists(), "{p:?} left behind");
        }
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

    /// A crashed supervisor's cgroups are found from the paths its run directory recorded,
    /// not by looking beneath the caller's own cgroup: the caller here is told nothing else.
    #[test]
    fn remove_recorded_removes_exactly_the_recorded_cgroups_and_their_tasks() {
        let id = unique("recorded");
        let other = SandboxCgroup::create(&unique("other"), &CgroupLimits::default()).unwrap();
        let mut recorded = Vec::new();
        let cg = SandboxCgroup::create_recorded(&id, &CgroupLimits::default(), &mut |_, p| {
            recorded = p.to_vec();
            Ok(())
        })
        .unwrap();
        assert_eq!(recorded, cg.paths());
        let mut sleeper = Command::new("sleep")
            .arg("30")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        cg.add_pid(sleeper.id() as i32).unwrap();
        std::mem::forget(cg);
        // A path recorded for another run is refused and nothing is touched.
        assert!(matches!(
            remove_recorded("test-not-this-run", &recorded),
            Err(CgroupError::NotOurs { .. })
        ));
        assert!(recorded.iter().all(|p| p.exists()));
        let mut removed = remove_recorded(&id, &recorded).unwrap();
        removed.sort();
        let mut want = recorded.clone();
        want.sort();
        assert_eq!(removed, want);
        assert!(recorded.iter().all(|p| !p.exists()));
        let st = wait_bounded(&mut sleeper, Duration::from_secs(5));
        assert_eq!(st.signal(), Some(libc::SIGKILL));
        assert!(
            other.paths().iter().all(|p| p.exists()),
            "other run untouched"
        );
        // Already gone: nothing to do, no error.
        assert_eq!(
            remove_recorded(&id, &recorded).unwrap(),
            Vec::<PathBuf>::new()
        );
        other.destroy().unwrap();
    }
}
