//! `fork gc`: reclaims what crashed supervisors left behind. A run directory whose lock
//! nobody holds belongs to a dead supervisor: its sandbox init (if still alive: the process
//! its recorded pid names has the recorded start time and pid namespace) is killed, which
//! ends its whole pid namespace; its cgroups are removed (those its run
//! directory recorded, wherever they are, and any `fork-<id>` beneath our own cgroup);
//! every mount beneath it is detached and the directory deleted.

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

/// Whether `pid` runs a sandbox init (any run's: the cmdline says only the role).
fn runs_init_role(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            c.split(|b| *b == 0)
                .any(|a| a == crate::sandbox::INIT_ROLE.as_bytes())
        })
        .unwrap_or(false)
}

/// Kills the init a run recorded, if the process its pid names now is that init: same
/// start time and pid namespace, and a sandbox init. The pid is pinned first (a pidfd),
/// then checked, then signalled through the pidfd: a pid reused by another process (another
/// run's init, say) between the check and the kill cannot be hit.
fn kill_recorded_init(init: crate::rundir::ProcessIdentity, rep: &mut GcReport) {
    use crate::sandbox::sys::{pidfd_open, pidfd_send_signal};
    use std::os::fd::AsFd;
    let Ok(pidfd) = pidfd_open(nix::unistd::Pid::from_raw(init.pid)) else {
        // No such process: nothing to kill.
        return;
    };
    // The pidfd names whichever process had the pid when it was opened. If the pid names
    // the recorded init now, that was the init: it started before its record was written,
    // and a process keeps its pid for its whole life.
    if !init.is_current() || !runs_init_role(init.pid) {
        return;
    }
    if let Err(e) = pidfd_send_signal(pidfd.as_fd(), nix::sys::signal::Signal::SIGKILL) {
        rep.errors.push(format!("kill {}: {e}", init.pid));
        return;
    }
    rep.processes_killed.push(init.pid);
    // Wait briefly for the namespace to die so its mounts can go. A dead init that nobody
    // has reaped yet (the interrupted supervisor is its parent) stays a zombie: its
    // namespace is gone already.
    for _ in 0..100 {
        if !init.is_current() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Reclaims every stale run.
pub fn collect() -> GcReport {
    let mut rep = GcReport::default();
    let runs = crate::rundir::list_runs();
    // Only runs known to be dead: cgroups are global, run directories are per run root,
    // so a cgroup whose run directory we cannot see may belong to a live supervisor.
    // An id that also names a live run (two run roots can hold the same name) is not
    // dead: neither its directories nor its cgroups are touched.
    let live: HashSet<&str> = runs
        .iter()
        .filter(|r| !r.stale)
        .map(|r| r.id.as_str())
        .collect();
    let stale: HashSet<String> = runs
        .iter()
        .filter(|r| r.stale && !live.contains(r.id.as_str()))
        .map(|r| r.id.clone())
        .collect();
    for r in runs.iter().filter(|r| stale.contains(&r.id)) {
        reclaim_run(r, &mut rep);
    }
    // Only a stale run's cgroups are removed: with none, no hierarchy need be listed.
    if !stale.is_empty() {
        remove_cgroups(&|id: &str| stale.contains(id), &mut rep);
    }
    rep
}

/// Kills a run's sandbox init (if the process its recorded pid names is still that init),
/// then removes its cgroups (killing what is left in them), unmounts and deletes its
/// directory: all of it but its record of the cgroups (and its lock) when they could not
/// be removed, so that the next `fork gc` tries again. A record that names the init by its
/// pid alone (an older fork's) kills nothing by pid: once that init is gone the pid may
/// name another run's init; the run's recorded cgroups, removed next, hold whatever of it
/// is left.
fn reclaim_run(r: &crate::rundir::FoundRun, rep: &mut GcReport) {
    if let Some(init) = r.meta.as_ref().and_then(|m| m.init()) {
        kill_recorded_init(init, rep);
    }
    // Its cgroups, where it recorded them (wherever they are: on cgroup v2 beside the dead
    // supervisor's own cgroup, not beneath ours).
    let recorded = crate::rundir::recorded_cgroups(&r.path);
    let mut cgroups_left = false;
    if !recorded.is_empty() {
        match crate::sandbox::cgroup::remove_recorded(&r.id, &recorded) {
            Ok(paths) => rep
                .cgroups_removed
                .extend(paths.into_iter().map(|p| p.display().to_string())),
            Err(e) => {
                cgroups_left = true;
                rep.errors.push(format!(
                    "run {}: {e}; its run directory {} is kept with its record of them \
                     (`cgroups`, `lock`): run `fork gc` again to retry",
                    r.id,
                    r.path.display()
                ));
            }
        }
    }
    // The run directory is the only record of its cgroups: while they are left, all of it
    // but that record goes (its mounts first), and the run is not counted as reclaimed.
    if cgroups_left {
        if let Err(e) = crate::sandbox::reclaim_dir_keeping_record(&r.path) {
            rep.errors.push(format!("run {}: {e}", r.id));
        }
        return;
    }
    match crate::sandbox::reclaim_dir(&r.path, &r.id) {
        Ok(()) => rep.runs.push(r.id.clone()),
        Err(e) => rep.errors.push(format!("run {}: {e}", r.id)),
    }
}

fn remove_cgroups(which: &dyn Fn(&str) -> bool, rep: &mut GcReport) {
    match crate::sandbox::cgroup::remove_stale(which) {
        Ok(paths) => rep
            .cgroups_removed
            .extend(paths.into_iter().map(|p| p.display().to_string())),
        Err(e) => rep.errors.push(format!("cgroups: {e}")),
    }
}

/// Reclaims this process's own live runs (sandboxes and evaluation staging), as `fork gc`
/// reclaims a dead supervisor's: their processes, cgroups, mounts and files. The registry
/// stays locked, so no run directory is created after; the caller exits next.
fn reclaim_own(live: &std::collections::BTreeMap<String, std::path::PathBuf>) -> GcReport {
    let mut rep = GcReport::default();
    for r in crate::rundir::list_runs() {
        if live.get(&r.id) == Some(&r.path) {
            reclaim_run(&r, &mut rep);
        }
    }
    // A run whose directory a successor made unlistable is still torn down by its id.
    remove_cgroups(&|id: &str| live.contains_key(id), &mut rep);
    for (id, path) in live {
        // A run whose cgroups could not be removed keeps its record of them (see
        // `reclaim_run`), so that a later `fork gc` retries: not deleted here either.
        let cgroups_left = crate::rundir::recorded_cgroups(path)
            .iter()
            .any(|c| c.exists());
        if path.exists() && !cgroups_left {
            if let Err(e) = crate::sandbox::reclaim_dir(path, id) {
                rep.errors.push(format!("run {id}: {e}"));
            }
        }
    }
    rep
}

/// How often the interrupt watcher looks at the flag.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

/// Whether the interrupt watcher also ends a process that holds no run (see
/// [`end_on_interrupt`]).
static WHEN_IDLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// [`reclaim_on_interrupt`], and past the grace the process ends also while it holds no
/// run, whatever its main thread is doing (blocked writing a report to a FIFO whose reader
/// does not read, say). For commands whose every write outside a run directory can be cut
/// short at any point and leave nothing half written under the name it was asked for:
/// `evaluate` and `reverify` (a bundle is built in a hidden `.<name>.partial-XXXXXX` directory and renamed
/// into place; a report in a hidden `.<name>.tmp-XXXXXX` file, renamed over the old one;
/// the ledger commits in one SQLite transaction, its head record replaced by a rename
/// just before, the two never cut apart (see [`crate::critical`]); a node key is written to hidden temporary names and moved into place) and
/// `run` (its workspace is copied back while its sandbox is held; its report as
/// `evaluate`'s are). A cut may leave those hidden temporary names behind, nothing else.
pub fn end_on_interrupt(grace: std::time::Duration, exit_code: i32) {
    WHEN_IDLE.store(true, std::sync::atomic::Ordering::SeqCst);
    reclaim_on_interrupt(grace, exit_code);
}

/// Makes SIGINT/SIGTERM/SIGHUP end this process within `grace` plus the teardown, whatever
/// phase it is in: the signals set the interrupt flag (which the phases check), and a
/// thread of its own watches it. From `grace` after a signal on, as soon as this process
/// holds run directories (a sandbox, an evaluation's staging), the thread tears them down
/// as `fork gc` would (kills the sandboxes, removes their cgroups, unmounts and deletes)
/// and ends the process at once with `exit_code`, without running destructors; while it
/// holds none, the main thread is left to finish (nothing of a run would remain), unless
/// [`end_on_interrupt`] installed the watcher: then the process ends then too, holding the
/// registry so that no run directory is made meanwhile. Installed once per process; later
/// calls do nothing.
pub fn reclaim_on_interrupt(grace: std::time::Duration, exit_code: i32) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        crate::sandbox::signals::install_interrupt_flag();
        let spawned = std::thread::Builder::new()
            .name("fork-interrupt".into())
            .spawn(move || {
                let mut signalled: Option<std::time::Instant> = None;
                loop {
                    std::thread::sleep(WATCH_EVERY);
                    if !crate::sandbox::signals::interrupted() {
                        continue;
                    }
                    let since = *signalled.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() < grace {
                        continue;
                    }
                    // Past the grace: as soon as the process holds a run, tear it down.
                    let live = crate::rundir::live();
                    if live.is_empty() {
                        if WHEN_IDLE.load(std::sync::atomic::Ordering::SeqCst) {
                            // `live` stays locked: no run directory is made from here on;
                            // a ledger append in progress finishes whole first.
                            crate::critical::end_outside(|| {
                                tracing::warn!("interrupted: ended {grace:?} after the signal");
                                crate::sandbox::signals::exit_now(exit_code);
                            });
                        }
                        drop(live);
                        continue;
                    }
                    let rep = reclaim_own(&live);
                    for e in &rep.errors {
                        tracing::error!("tearing down after the interrupt: {e}");
                    }
                    tracing::warn!("interrupted: {} run(s) torn down", live.len());
                    crate::critical::end_outside(|| crate::sandbox::signals::exit_now(exit_code));
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("no interrupt watcher ({e}): interrupts are seen between phases only");
        }
    });
}
