//! Preparing a sandbox: the layer checks, the run directory, the capped disk, the seccomp
//! profile, and the cgroups made on a thread of their own beside them.

use super::*;

impl Sandbox {
    /// Checks the layers the policy requires (exit 69 when one is missing), compiles the
    /// seccomp profile, creates the run directory and the size-capped disk holding `/tmp`
    /// and the workspace, and starts the cgroups, made on a thread of their own while the
    /// rest is made and the caller goes on (the first run takes them, and reports a
    /// required cgroup layer the host refused, before its init runs anything). The built-in profile
    /// comes compiled; another is compiled on a second thread while the rest is made, and
    /// a broken one fails `prepare` (everything made is removed), before anything runs.
    pub fn prepare(spec: &Spec) -> Result<Sandbox, SandboxError> {
        trace::mark("sandbox: prepare");
        // The cgroups are made on a thread of their own from here on (recorded in the run
        // directory once it exists), while the rest is made here and the caller goes on:
        // the first run waits for them, right before the clone (v1 ones as root: after it,
        // before the init's release).
        let run_id = crate::rundir::new_run_id();
        let cgroup = CgroupAhead::start(spec, &run_id);
        trace::mark("sandbox: cgroup thread spawned");
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
            let base = if spec.layers.get(Layer::Disk) == Requirement::Required {
                crate::rundir::sandbox_base_dir()
            } else {
                crate::rundir::base_dir()
            };
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
        // The fast run root only when the sandbox's data will be on its capped disk (with
        // the disk off, the workspace is the run directory's own `disk/`).
        let capped = spec.layers.get(Layer::Disk) == Requirement::Required;
        let rundir = RunDir::create(run_id, capped)?;
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
            cgroup_started: true,
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
            sb.make_cgroup_here();
        }
        Ok(sb)
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
