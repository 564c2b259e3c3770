//! `fork gc`: reclaims what crashed supervisors left behind. A run directory whose lock
//! nobody holds belongs to a dead supervisor: its sandbox init (if still alive) is
//! killed, which ends its whole pid namespace; its cgroups are removed; every mount
//! beneath it is detached and the directory deleted.

use serde::Serialize;
use std::collections::HashSet;

#[derive(Debug, Default, Serialize)]
pub struct GcReport {
    pub runs: Vec<String>,
    pub processes_killed: Vec<i32>,
    pub cgroups_removed: Vec<String>,
    pub errors: Vec<String>,
}

impl GcReport {
    pub fn render(&self) -> String {
        if self.runs.is_empty() && self.cgroups_removed.is_empty() && self.errors.is_empty() {
            return "nothing to reclaim\n".into();
        }
        let mut s = String::new();
        for r in &self.runs {
            s.push_str(&format!("reclaimed run {r}\n"));
        }
        for p in &self.processes_killed {
            s.push_str(&format!("killed sandbox init {p}\n"));
        }
        for c in &self.cgroups_removed {
            s.push_str(&format!("removed cgroup {c}\n"));
        }
        for e in &self.errors {
            s.push_str(&format!("error: {e}\n"));
        }
        s
    }
}

/// Is `pid` still a sandbox init of ours (and not a recycled pid)?
fn is_our_init(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            c.split(|b| *b == 0)
                .any(|a| a == crate::sandbox::INIT_ROLE.as_bytes())
        })
        .unwrap_or(false)
}

/// Reclaims every stale run.
pub fn collect() -> GcReport {
    let mut rep = GcReport::default();
    let runs = crate::rundir::list_runs();
    // Only runs known to be dead: cgroups are global, run directories are per run root,
    // so a cgroup whose run directory we cannot see may belong to a live supervisor.
    let stale: HashSet<String> = runs
        .iter()
        .filter(|r| r.stale)
        .map(|r| r.id.clone())
        .collect();
    for r in runs.iter().filter(|r| r.stale) {
        if let Some(pid) = r.meta.as_ref().and_then(|m| m.init_pid) {
            if is_our_init(pid) {
                match nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                ) {
                    Ok(()) => rep.processes_killed.push(pid),
                    Err(e) => rep.errors.push(format!("kill {pid}: {e}")),
                }
                // Wait briefly for the namespace to die so its mounts can go.
                for _ in 0..100 {
                    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
        }
        match crate::sandbox::reclaim_dir(&r.path, &r.id) {
            Ok(()) => rep.runs.push(r.id.clone()),
            Err(e) => rep.errors.push(format!("run {}: {e}", r.id)),
        }
    }
    match crate::sandbox::cgroup::remove_stale(&|id: &str| stale.contains(id)) {
        Ok(paths) => rep
            .cgroups_removed
            .extend(paths.into_iter().map(|p| p.display().to_string())),
        Err(e) => rep.errors.push(format!("cgroups: {e}")),
    }
    rep
}
