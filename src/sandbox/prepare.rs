//! Preparing a sandbox: the layer checks, the run directory, the capped disk, the seccomp
//! profile, and the cgroups made on a thread of their own beside them.

use super::*;

impl Sandbox {
    /// Checks the layers the policy requires (exit 69 when one is missing), compiles the
    /// seccomp profile, creates the run directory and the size-capped disk holding `/tmp`
    /// and the workspace, and starts the cgroups, made on a thread of their own while the
    /// rest is made and the caller goes on (the first run takes them, and reports a
    /// required cgroup layer the host refused, before its clone). The built-in profile
    /// comes compiled; another is compiled on a second thread while the rest is made, and
    /// a broken one fails `prepare` (everything made is removed), before anything runs.
    pub fn prepare(spec: &Spec) -> Result<Sandbox, SandboxError> {
        trace::mark("sandbox: prepare");
        // The cgroups are made on a thread of their own from here on (recorded in the run
        // directory once it exists), while the rest is made here and the caller goes on:
        // the first run waits for them, right before the clone.
        let run_id = crate::rundir::new_run_id();
        let cgroup = CgroupAhead::start(spec, &run_id);
        // No init of this build beside fork: refuse before anything is created (exit 69).
        init_exe::open()?;
        trace::mark("sandbox: init checked");
        let layers = &spec.layers;
        let compile_seccomp = if layers.get(Layer::Seccomp).wanted() {
            match seccomp::probe() {
                Ok(()) => true,
                Err(fix) => {
                    require_missing(
                        layers,
                        Layer::Seccomp,
                        "the kernel has no seccomp filter mode",
                        &fix,
                    )?;
                    false
                }
            }
        } else {
            false
        };
        // The built-in profile is carried compiled: nothing to do beside the rest.
        if compile_seccomp && is_compiled_ahead(&spec.seccomp) {
            let seccomp = compile_profile(&spec.seccomp)?;
            let mut sb = Self::make(spec, &run_id, cgroup)?;
            sb.seccomp = Some(seccomp);
            trace::mark("sandbox: seccomp ready");
            return Ok(sb);
        }
        std::thread::scope(|scope| {
            let compiled = compile_seccomp.then(|| {
                let source = &spec.seccomp;
                std::thread::Builder::new()
                    .name("fork-seccomp".into())
                    .spawn_scoped(scope, move || compile_profile(source))
            });
            let sb = Self::make(spec, &run_id, cgroup);
            let seccomp = match compiled {
                None => None,
                // No second thread to be had: compiled here.
                Some(Err(_)) => Some(compile_profile(&spec.seccomp)?),
                Some(Ok(h)) => Some(h.join().unwrap_or_else(|_| {
                    Err(SandboxError::Setup {
                        stage: "seccomp".into(),
                        message: "the thread compiling the profile panicked".into(),
                    })
                })?),
            };
            let mut sb = sb?;
            sb.seccomp = seccomp;
            trace::mark("sandbox: seccomp ready");
            Ok(sb)
        })
    }

    /// `prepare` but the seccomp profile: the Landlock probe, the run directory, the disk
    /// and the cgroups.
    fn make(spec: &Spec, run_id: &str, cgroup: CgroupAhead) -> Result<Sandbox, SandboxError> {
        let layers = &spec.layers;
        let landlock_abi = if layers.get(Layer::Landlock).wanted() {
            match landlock::best_abi() {
                Ok(abi) => Some(abi),
                Err(e) => {
                    require_missing(layers, Layer::Landlock, &e.reason, &e.fix)?;
                    None
                }
            }
        } else {
            None
        };
        let (host_uid, host_gid) = if is_root() {
            // A per-run unprivileged uid, never host root, drawn at random: 28 bits, so four
            // runs at once share one with a chance of about 2e-8.
            let n = u32::from_str_radix(&crate::rundir::new_run_id()[..7], 16).unwrap_or(0);
            let id = 1_000_000_000 + n;
            (id, id)
        } else if let Some(ids) = rootless::distinct_ids() {
            // A user's: drawn from the subordinate ranges fork's namespace maps.
            ids
        } else {
            (
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
            )
        };
        if own_uid() {
            // The init runs as an unprivileged uid and must reach its mount points beneath
            // the run root: every directory above them has to be searchable by others.
            let base = crate::rundir::base_dir();
            let mut dir = Some(base.as_path());
            while let Some(d) = dir {
                use std::os::unix::fs::PermissionsExt;
                if let Ok(md) = std::fs::metadata(d) {
                    if md.permissions().mode() & 0o001 == 0 {
                        return Err(SandboxError::RunRootUnreachable {
                            base: base.clone(),
                            dir: d.to_path_buf(),
                            mode: md.permissions().mode() & 0o7777,
                        });
                    }
                }
                dir = d.parent();
            }
        }
        let rundir = RunDir::create(run_id)?;
        let cgroup = cgroup.go(&rundir.path);
        trace::mark("sandbox: run dir created");
        let mut sb = Sandbox {
            spec: spec.clone(),
            rundir: Some(rundir),
            disk_mounted: false,
            host_uid,
            host_gid,
            seccomp: None,
            landlock_abi,
            cgroup,
            cgroup_tried: true,
        };
        if own_uid() {
            // The init runs as the unprivileged host uid: it may traverse the run directory
            // (0711, nothing listable) to cover it with a tmpfs of its own, where it builds
            // its root (`InitConfig::scratch`: no mount point for it on the host); the disk
            // is its alone (0700).
            use std::os::unix::fs::PermissionsExt;
            let rd = sb.rundir();
            std::fs::set_permissions(&rd.path, std::fs::Permissions::from_mode(0o711))
                .ctx("chmod", &rd.path)?;
        } else {
            // The init (the user's own uid) builds its root at this host path.
            sb.rundir()
                .make_root_mount()
                .map_err(|e| SandboxError::Setup {
                    stage: "run directory".into(),
                    message: e.to_string(),
                })?;
        }
        sb.mount_disk()?;
        trace::mark("sandbox: disk mounted");
        if matches!(sb.cgroup, CgroupSlot::None) {
            // No thread to be had: made here.
            sb.start_cgroup();
        }
        Ok(sb)
    }

    /// Makes the cgroup budgets here, unless they exist or are not wanted;
    /// [`Sandbox::settle_cgroup`] takes the result.
    fn start_cgroup(&mut self) {
        self.cgroup_tried = true;
        if !self.spec.layers.get(Layer::Cgroup).wanted() || !matches!(self.cgroup, CgroupSlot::None)
        {
            return;
        }
        let rd = self.rundir();
        let dir = RecordIn::Dir(rd.path.clone());
        let made = make_cgroup(&self.spec.layers, &self.spec.limits, &rd.id, dir);
        self.cgroup = CgroupSlot::Made(made);
    }

    /// Takes the cgroup budgets [`Sandbox::start_cgroup`] made (waiting for its thread):
    /// the error of a required layer that could not be made; an optional one was warned
    /// about and is left out.
    pub(super) fn settle_cgroup(&mut self) -> Result<(), SandboxError> {
        let made = match std::mem::replace(&mut self.cgroup, CgroupSlot::None) {
            CgroupSlot::Making(h) => h.join().unwrap_or_else(|_| {
                Err(SandboxError::Setup {
                    stage: "cgroup".into(),
                    message: "the thread making the cgroup panicked".into(),
                })
            }),
            CgroupSlot::Made(r) => r,
            other => {
                self.cgroup = other;
                return Ok(());
            }
        };
        trace::mark("sandbox: cgroup ready");
        if let Some(cg) = made? {
            self.cgroup = CgroupSlot::Ready(cg);
        }
        Ok(())
    }

    /// The cgroup budgets for a run: those `prepare` started at the first, else made now
    /// unless they exist (an optional layer that failed is tried again, and warned about).
    pub(super) fn ensure_cgroup(&mut self) -> Result<(), SandboxError> {
        if !self.cgroup_tried {
            self.start_cgroup();
        }
        self.cgroup_tried = false;
        self.settle_cgroup()
    }
}

/// Where the cgroups are recorded before they are made: the run directory, or (made
/// ahead, see [`CgroupAhead`]) the run directory once `prepare` has made it.
enum RecordIn {
    Dir(PathBuf),
    Later(std::sync::mpsc::Receiver<PathBuf>),
}

/// The cgroups of a sandbox `prepare` is making, made on a thread of their own from its
/// start: the layout found, then, once the run directory exists ([`CgroupAhead::go`]),
/// recorded there and made. Dropped before that (an earlier error), the thread makes
/// nothing and ends.
struct CgroupAhead {
    started: Option<(std::sync::mpsc::Sender<PathBuf>, CgroupSlot)>,
}

impl CgroupAhead {
    fn start(spec: &Spec, run_id: &str) -> CgroupAhead {
        if !spec.layers.get(Layer::Cgroup).wanted() {
            return CgroupAhead { started: None };
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let (layers, limits, id) = (spec.layers.clone(), spec.limits.clone(), run_id.to_string());
        let spawned = std::thread::Builder::new()
            .name("fork-cgroup".into())
            .spawn(move || {
                trace::mark("cgroup thread: started");
                let r = make_cgroup(&layers, &limits, &id, RecordIn::Later(rx));
                trace::mark("cgroup thread: made");
                r
            });
        CgroupAhead {
            started: spawned.ok().map(|h| (tx, CgroupSlot::Making(h))),
        }
    }

    /// The run directory exists: the cgroups are recorded there and made.
    fn go(mut self, run_dir: &Path) -> CgroupSlot {
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
    /// Given up before the run directory existed: the thread, told so, makes nothing;
    /// waited for, so that nothing of this sandbox goes on after `prepare` failed.
    fn drop(&mut self) {
        if let Some((tx, slot)) = self.started.take() {
            drop(tx);
            if let CgroupSlot::Making(h) = slot {
                let _ = h.join();
            }
        }
    }
}

/// Makes the cgroup budgets of run `id` (recorded in its run directory `dir` first):
/// `Some` when made, `None` when the layer is optional and could not be (warned about),
/// the layer's error (exit 69, naming the fix) when it is required.
fn make_cgroup(
    layers: &Layers,
    limits: &spec::Limits,
    id: &str,
    dir: RecordIn,
) -> Result<Option<cgroup::SandboxCgroup>, SandboxError> {
    let limits = cgroup::CgroupLimits {
        memory_bytes: Some(limits.memory_bytes),
        cpu_percent: Some(limits.cpu_percent),
        pids: Some(limits.pids),
    };
    let mut gave_up = false;
    let created = cgroup::SandboxCgroup::create_recorded(id, &limits, &mut |paths| {
        trace::mark("cgroup thread: layout found");
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
        crate::rundir::record_cgroups(&dir, paths).ctx("recording the cgroups in", &dir)
    });
    if gave_up {
        // `prepare` failed before the run directory existed: nothing was made.
        return Ok(None);
    }
    match created {
        Ok(cg) => Ok(Some(cg)),
        Err(e) => {
            let p = cgroup::probe();
            let fix = if p.fix.is_empty() {
                cgroup::DELEGATE_FIX.to_string()
            } else {
                p.fix.join("; ")
            };
            require_missing(layers, Layer::Cgroup, &e.to_string(), &fix)?;
            Ok(None)
        }
    }
}

/// Whether the spec's profile is the built-in one fork carries compiled.
fn is_compiled_ahead(s: &spec::SeccompProfile) -> bool {
    matches!(s.source, SeccompSource::Builtin)
        && seccomp::compiled_ahead(spec::DEFAULT_SECCOMP.as_bytes())
}

/// Compiles the spec's seccomp profile (cached per process by `seccomp`).
fn compile_profile(s: &spec::SeccompProfile) -> Result<seccomp::CompiledProfile, SandboxError> {
    Ok(match &s.source {
        SeccompSource::Builtin => seccomp::compile_json(&s.name, spec::DEFAULT_SECCOMP.as_bytes())?,
        SeccompSource::File(p) => seccomp::compile_file(p)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `fork-<id>` beside our own cgroup, in any hierarchy (read independently of
    /// the cgroup module: each hierarchy's mount point joined with our path in it).
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
    #[test]
    fn cgroups_started_ahead_are_not_made_when_prepare_gives_up() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: making cgroups needs root");
            return;
        }
        let spec = crate::policy::Policy::builtin().unwrap().sandbox_spec();
        let id = crate::rundir::new_run_id();
        let ahead = CgroupAhead::start(&spec, &id);
        assert!(matches!(
            ahead.started.as_ref().map(|(_, s)| s),
            Some(CgroupSlot::Making(_))
        ));
        // The thread has found the layout and waits for the run directory: nothing made.
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(made(&id).is_empty(), "{:?}", made(&id));
        drop(ahead);
        assert!(made(&id).is_empty(), "{:?}", made(&id));
        // Once told the run directory, the same thread records and makes them.
        let dir = tempfile::tempdir_in(crate::rundir::base_dir()).unwrap();
        let id = crate::rundir::new_run_id();
        let slot = CgroupAhead::start(&spec, &id).go(dir.path());
        let CgroupSlot::Making(h) = slot else {
            panic!("not made ahead");
        };
        let cg = h
            .join()
            .unwrap()
            .unwrap()
            .expect("the cgroups are made here");
        assert!(!made(&id).is_empty());
        let recorded: std::collections::BTreeSet<PathBuf> =
            crate::rundir::recorded_cgroups(dir.path())
                .into_iter()
                .collect();
        assert_eq!(recorded, made(&id));
        cg.destroy().unwrap();
        assert!(made(&id).is_empty());
    }
}
