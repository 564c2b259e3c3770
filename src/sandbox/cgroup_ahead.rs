//! A sandbox's cgroup budgets, made beside the rest of the sandbox: from `prepare`'s start
//! on a thread of their own (the hierarchies' layout read at once; the cgroups recorded in
//! the run directory and made as soon as it exists), taken by the first run: right before
//! the clone of the init, or, for required v1 ones as root, right after it and before the
//! init's release (the init joins them itself then). A later run makes them again here if
//! an optional layer could not be made the first time.

use super::*;
use std::sync::mpsc::{Receiver, Sender};

/// A sandbox's cgroup budgets, from `prepare` to the runs that use them.
pub(super) enum CgroupSlot {
    /// None: not wanted, not made yet at a later run, or an optional layer that could not
    /// be made.
    None,
    /// Being made on a thread of their own, which tells their version as soon as it has
    /// read the hierarchies' layout.
    Making {
        thread: std::thread::JoinHandle<Made>,
        version: Receiver<cgroup::CgroupVersion>,
        /// What `version` said, once asked (it says it once).
        told: std::cell::OnceCell<Option<cgroup::CgroupVersion>>,
    },
    /// Made (or refused) without a thread, not yet taken.
    Made(Made),
    /// Taken by a run: what the runs use.
    Ready(cgroup::SandboxCgroup),
}

/// What making the cgroups gave: `Some` when made, `None` when the layer is optional and
/// could not be (warned about), the layer's error (exit 69, naming the fix) when required.
pub(super) type Made = Result<Option<cgroup::SandboxCgroup>, SandboxError>;

impl CgroupSlot {
    /// The cgroups a run may use.
    pub(super) fn ready(&self) -> Option<&cgroup::SandboxCgroup> {
        match self {
            CgroupSlot::Ready(cg) => Some(cg),
            _ => None,
        }
    }
}

/// Where the cgroups are recorded before they are made: the run directory, or (made ahead)
/// the run directory once `prepare` has made it.
enum RecordIn {
    Dir(PathBuf),
    Later(Receiver<PathBuf>),
}

/// The cgroups of a sandbox `prepare` is making, on a thread of their own from its start.
/// Dropped before [`CgroupAhead::go`] (an earlier error), the thread makes nothing, and is
/// waited for: nothing of the sandbox goes on after `prepare` failed.
pub(super) struct CgroupAhead {
    started: Option<(Sender<PathBuf>, CgroupSlot)>,
}

impl CgroupAhead {
    /// Starts the thread (nothing when the layer is not wanted or no thread is to be had:
    /// `prepare` then makes them itself).
    pub(super) fn start(spec: &Spec, run_id: &str) -> CgroupAhead {
        if !spec.layers.get(Layer::Cgroup).wanted() {
            return CgroupAhead { started: None };
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let (layers, limits, id) = (spec.layers.clone(), spec.limits.clone(), run_id.to_string());
        let (told, version) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("fork-cgroup".into())
            .spawn(move || {
                trace::mark("cgroup thread: started");
                let made = make_cgroup(&layers, &limits, &id, RecordIn::Later(rx), Some(told));
                if matches!(made, Ok(Some(_))) {
                    trace::mark("cgroup thread: made");
                }
                made
            });
        CgroupAhead {
            started: spawned.ok().map(|thread| {
                let told = std::cell::OnceCell::new();
                (
                    tx,
                    CgroupSlot::Making {
                        thread,
                        version,
                        told,
                    },
                )
            }),
        }
    }

    /// The run directory exists: the cgroups are recorded there and made.
    pub(super) fn go(mut self, run_dir: &Path) -> CgroupSlot {
        match self.started.take() {
            Some((tx, slot)) => {
                let _ = tx.send(run_dir.to_path_buf());
                slot
            }
            None => CgroupSlot::None,
        }
    }
}

impl Drop for CgroupAhead {
    fn drop(&mut self) {
        if let Some((tx, slot)) = self.started.take() {
            // The thread, told so (its receiver fails), makes nothing.
            drop(tx);
            if let CgroupSlot::Making { thread, .. } = slot {
                let _ = thread.join();
            }
        }
    }
}

impl Sandbox {
    /// Makes the cgroup budgets here, unless they are under way, made, or not wanted; the
    /// next [`Sandbox::ensure_cgroup`] takes them.
    pub(super) fn make_cgroup_here(&mut self) {
        if !self.spec.layers.get(Layer::Cgroup).wanted() || !matches!(self.cgroup, CgroupSlot::None)
        {
            return;
        }
        let rd = self.rundir();
        let dir = RecordIn::Dir(rd.path.clone());
        let made = make_cgroup(&self.spec.layers, &self.spec.limits, &rd.id, dir, None);
        self.cgroup = CgroupSlot::Made(made);
    }

    /// What is being made or was made and not yet taken, waited for and taken: `Ok` when
    /// nothing is pending, or when it was made or an optional layer was left out; the
    /// required layer's error otherwise.
    pub(super) fn take_cgroup(&mut self) -> Result<(), SandboxError> {
        let made = match std::mem::replace(&mut self.cgroup, CgroupSlot::None) {
            CgroupSlot::Making { thread, .. } => thread.join().unwrap_or_else(|_| {
                Err(SandboxError::Setup {
                    stage: "cgroup".into(),
                    message: "the thread making the cgroup panicked".into(),
                })
            }),
            CgroupSlot::Made(made) => made,
            other => {
                self.cgroup = other;
                return Ok(());
            }
        };
        if let Some(cg) = made? {
            self.cgroup = CgroupSlot::Ready(cg);
        }
        Ok(())
    }

    /// Whether this run's cgroups are being made on their thread and are v1 ones (told by
    /// the thread as soon as it has read the layout, waited for until then): the clone
    /// need not wait for them to be made (the init joins v1 cgroups itself at its
    /// release, see `supervisor::PendingInit::release`). A thread that ends without
    /// telling (a layout it could not read) says no.
    pub(super) fn cgroup_v1_in_the_making(&self) -> bool {
        match &self.cgroup {
            CgroupSlot::Making { version, told, .. } => {
                *told.get_or_init(|| version.recv().ok()) == Some(cgroup::CgroupVersion::V1)
            }
            _ => false,
        }
    }

    /// Starts counting this run in the cgroup, before any of its processes is in it: a
    /// rerun keeps the cgroup of the attempts before it, whose CPU time, peaks, OOM kills
    /// and refused forks are not this run's (see `cgroup/stats.rs`).
    pub(super) fn begin_cgroup_run(&self) {
        if let Some(cg) = self.cgroup.ready() {
            cg.begin_run();
        }
    }

    /// The cgroup budgets for a run: at the first, those `prepare` started; at a later one
    /// made now unless they exist (an optional layer that failed is tried again, and
    /// warned about).
    pub(super) fn ensure_cgroup(&mut self) -> Result<(), SandboxError> {
        if !self.cgroup_started {
            self.make_cgroup_here();
        }
        self.cgroup_started = false;
        self.take_cgroup()?;
        trace::mark("sandbox: cgroup ready");
        Ok(())
    }
}

/// Makes the cgroup budgets of run `id`, recorded in its run directory first (`fork gc`
/// removes exactly what a record names). The record and the cgroups are made holding the
/// process's list of live runs, which the interrupt watcher holds from its teardown to the
/// process's end: a run it tears down was either recorded and made before (and is
/// removed) or is never made.
fn make_cgroup(
    layers: &Layers,
    limits: &spec::Limits,
    id: &str,
    dir: RecordIn,
    version: Option<Sender<cgroup::CgroupVersion>>,
) -> Made {
    let limits = cgroup::CgroupLimits {
        memory_bytes: Some(limits.memory_bytes),
        cpu_percent: Some(limits.cpu_percent),
        pids: Some(limits.pids),
    };
    let ahead = matches!(dir, RecordIn::Later(_));
    let mut gave_up = false;
    let mut recorded = false;
    let mut held = None;
    let created = cgroup::SandboxCgroup::create_recorded(id, &limits, &mut |v, paths| {
        if ahead {
            trace::mark("cgroup thread: layout found");
        }
        if let Some(tx) = &version {
            let _ = tx.send(v);
        }
        let dir = match &dir {
            RecordIn::Dir(d) => d.clone(),
            RecordIn::Later(rx) => rx.recv().map_err(|_| {
                gave_up = true;
                IoError::new(
                    "recording the cgroups in",
                    Path::new("the run directory"),
                    std::io::Error::other("the sandbox was given up before it was made"),
                )
            })?,
        };
        held = Some(crate::rundir::live());
        recorded = true;
        crate::rundir::record_cgroups(&dir, paths).ctx("recording the cgroups in", &dir)
    });
    drop(held);
    if gave_up {
        // `prepare` failed before the run directory existed: nothing was made.
        return Ok(None);
    }
    match created {
        Ok(cg) => Ok(Some(cg)),
        Err(e) => {
            // A layout that could not be read, with `prepare` given up meanwhile: nothing
            // to report to anyone.
            if let (false, RecordIn::Later(rx)) = (recorded, &dir) {
                if rx.recv().is_err() {
                    return Ok(None);
                }
            }
            let fix = if matches!(e, cgroup::CgroupError::NoSocketAccounting { .. }) {
                cgroup::SOCKET_ACCOUNTING_FIX.to_string()
            } else {
                let p = cgroup::probe();
                if p.fix.is_empty() {
                    cgroup::DELEGATE_FIX.to_string()
                } else {
                    p.fix.join("; ")
                }
            };
            require_missing(layers, Layer::Cgroup, &e.to_string(), &fix)?;
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `fork-<id>` beside our own cgroup, in any hierarchy (read independently of the
    /// cgroup module: each hierarchy's mount point joined with our path in it, less the
    /// supervisor's own leaf on v2, beside which the sandboxes' cgroups go).
    fn made(id: &str) -> std::collections::BTreeSet<PathBuf> {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mut found = std::collections::BTreeSet::new();
        for h in ["memory", "pids", "cpu", "cpuacct", "freezer", "unified", ""] {
            let root = Path::new("/sys/fs/cgroup").join(h);
            for line in own.lines() {
                let rel = line
                    .rsplit(':')
                    .next()
                    .unwrap_or("/")
                    .trim_start_matches('/');
                let rel = rel.strip_suffix("fork-supervisor").unwrap_or(rel);
                let p = root.join(rel).join(format!("fork-{id}"));
                if p.is_dir() {
                    found.insert(p);
                }
            }
        }
        found
    }

    /// `prepare` given up before its run directory exists (fork-init missing, a layer
    /// refused): the cgroups started ahead are never made, and their thread has ended.
    /// Told the run directory, the same thread records and makes them.
    #[test]
    fn cgroups_started_ahead_are_made_only_once_the_run_directory_exists() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: making cgroups needs root");
            return;
        }
        let spec = crate::policy::Policy::builtin().unwrap().sandbox_spec();
        let id = crate::rundir::new_run_id();
        let ahead = CgroupAhead::start(&spec, &id);
        assert!(matches!(
            ahead.started.as_ref().map(|(_, s)| s),
            Some(CgroupSlot::Making { .. })
        ));
        // Time for the thread to read the layout: it waits for the run directory.
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(made(&id).is_empty(), "{:?}", made(&id));
        drop(ahead);
        assert!(made(&id).is_empty(), "{:?}", made(&id));

        let dir = tempfile::tempdir_in(crate::rundir::base_dir()).unwrap();
        let id = crate::rundir::new_run_id();
        let CgroupSlot::Making {
            thread, version, ..
        } = CgroupAhead::start(&spec, &id).go(dir.path())
        else {
            panic!("not made ahead");
        };
        let cg = thread
            .join()
            .unwrap()
            .unwrap()
            .expect("the cgroups are made");
        // The thread told the version it found before making them.
        assert_eq!(version.recv().ok(), Some(cg.version()));
        let recorded: std::collections::BTreeSet<PathBuf> =
            crate::rundir::recorded_cgroups(dir.path())
                .into_iter()
                .collect();
        assert!(!recorded.is_empty());
        assert_eq!(recorded, made(&id));
        cg.destroy().unwrap();
        assert!(made(&id).is_empty());
    }
}
