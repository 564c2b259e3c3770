//! The sandbox: one command run as a successor would run, with every isolation layer of
//! the security model in force.
//!
//! Process roles (as youki names them):
//! - **supervisor**: this process. It plans, creates the run directory, the size-capped
//!   disk and the cgroup, clones the init into new namespaces, writes its uid/gid maps,
//!   moves it into the cgroup, then watches budgets (tokio) until the init exits.
//! - **init**: pid 1 of the new pid namespace; `/proc/self/exe` re-executed with the
//!   `__sandbox-init` role (see [`init`]). It builds the root, forks the command, reaps,
//!   forwards signals, and reports the command's status. It dies with the supervisor
//!   (PDEATHSIG) and the kernel kills the whole namespace when it dies.
//! - **command**: the successor. Capabilities dropped, no_new_privs, Landlock, seccomp,
//!   then exec.
//!
//! Between clone and exec the child only makes async-signal-safe syscalls.

pub mod cgroup;
pub mod init;
pub mod landlock;
pub mod mounts;
pub mod net;
pub mod probe;
pub mod seccomp;
pub mod signals;
pub mod spec;
pub mod watchdog;

use crate::rundir::RunDir;
use serde::{Deserialize, Serialize};
pub use spec::{Layer, Layers, Requirement, RootMode, SeccompSource, Spec};
use std::ffi::CString;
use std::io::{Read, Seek, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use thiserror::Error;
pub use watchdog::{BudgetKind, Limits, Observation, Usage, Watchdog};

/// The successor's workspace, inside the sandbox.
pub const WORKSPACE: &str = "/tmp/successor";
/// The argv[1] that makes the binary act as the sandbox init.
pub const INIT_ROLE: &str = "__sandbox-init";
/// The PATH the successor gets.
pub const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, Error)]
pub enum SandboxError {
    #[error("isolation layer `{layer}` is unavailable on this host: {reason}. Fix: {fix}")]
    LayerUnavailable {
        layer: Layer,
        reason: String,
        fix: String,
    },
    #[error("sandbox setup failed at {stage}: {message}")]
    Setup { stage: String, message: String },
    #[error("the seccomp profile: {0}")]
    Seccomp(#[from] seccomp::SeccompError),
    #[error(transparent)]
    RunDir(#[from] crate::rundir::RunDirError),
    #[error("{op}: {source}")]
    Sys {
        op: &'static str,
        source: nix::Error,
    },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn sys(op: &'static str) -> impl FnOnce(nix::Error) -> SandboxError {
    move |source| SandboxError::Sys { op, source }
}

/// What the init needs, passed through a memfd as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InitConfig {
    pub newroot: PathBuf,
    pub mounts: Vec<mounts::MountOp>,
    pub cgroupns: bool,
    pub netns: bool,
    pub hostname: Option<String>,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub landlock: Option<landlock::LandlockSpec>,
    pub landlock_required: bool,
    pub seccomp: Option<seccomp::CompiledProfile>,
}

/// Messages from the init (and the command before exec) to the supervisor: JSON lines.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum InitMsg {
    Landlock {
        status: landlock::LandlockStatus,
    },
    Error {
        stage: String,
        message: String,
        layer: Option<Layer>,
        fix: Option<String>,
    },
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
}

/// Which layers were really in force for a run (the report's `isolation`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Isolation {
    pub userns: bool,
    pub pidns: bool,
    pub netns: bool,
    pub mountns: bool,
    pub ipcns: bool,
    pub utsns: bool,
    pub cgroupns: bool,
    pub landlock_abi: Option<u32>,
    pub landlock_enforced: Option<String>,
    pub seccomp: Option<String>,
    pub cgroup: Option<String>,
    /// "tmpfs": the workspace and /tmp live on a size-capped filesystem.
    pub disk: Option<String>,
    /// "host" or "minimal".
    pub root: String,
    /// The host uid the sandbox's uid 0 maps to.
    pub host_uid: u32,
}

/// How a sandboxed run ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    /// The command's exit code, or 128+N when killed by signal N.
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub budget_exceeded: Option<BudgetKind>,
    pub usage: Usage,
    pub isolation: Isolation,
    /// The supervisor was interrupted (SIGINT/SIGTERM) and killed the sandbox.
    #[serde(default)]
    pub interrupted: bool,
    /// Why the command could not be started (not found, not executable), if so.
    #[serde(default)]
    pub exec_error: Option<String>,
}

/// Serves one door: gets the listener (inside the sandbox, accepted on by the supervisor)
/// and runs on the supervisor's current-thread runtime until the run ends.
pub type DoorServe = Box<
    dyn FnOnce(tokio::net::TcpListener) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>,
>;

/// A controlled door into the sandbox: a TCP listener at `addr` inside its network
/// namespace (loopback), served by the supervisor.
pub struct Door {
    pub addr: std::net::SocketAddr,
    pub serve: DoorServe,
}

impl Door {
    /// A localhost forward: the host's loopback service at `addr` becomes reachable at the
    /// same address inside the sandbox, and nothing else does.
    pub fn forward(addr: std::net::SocketAddr) -> Door {
        Door {
            addr,
            serve: Box::new(move |l| Box::pin(net::relay(l, addr))),
        }
    }
}

/// What a metered door has spent; the watchdog kills the sandbox once `exceeded()`.
pub trait CostMeter {
    fn spent_usd(&self) -> f64;
    fn exceeded(&self) -> bool;
}

/// The doors of one run (none by default: loopback only).
#[derive(Default)]
pub struct Doors {
    pub doors: Vec<Door>,
    pub cost: Option<std::sync::Arc<dyn CostMeter + Send + Sync>>,
}

/// What runs in a sandbox: argv, its whole environment, its working directory (inside
/// the sandbox), where its output goes and the doors it gets.
pub struct Command<'a> {
    pub argv: Vec<String>,
    /// The complete environment the command gets (nothing is inherited).
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// With a file, the command's stdout and stderr go to it and its stdin is /dev/null;
    /// otherwise all three are the supervisor's.
    pub output: Option<&'a std::fs::File>,
    pub doors: Doors,
}

impl Command<'_> {
    /// `argv` with `env`, in the workspace, with the supervisor's stdio and no doors.
    pub fn new(argv: Vec<String>, env: Vec<(String, String)>) -> Command<'static> {
        Command {
            argv,
            env,
            cwd: PathBuf::from(WORKSPACE),
            output: None,
            doors: Doors::default(),
        }
    }
}

/// A prepared sandbox: run directory, capped disk and workspace exist; nothing runs yet.
/// Dropping it destroys everything (as [`Sandbox::destroy`]).
pub struct Sandbox {
    spec: Spec,
    rundir: Option<RunDir>,
    disk_mounted: bool,
    host_uid: u32,
    host_gid: u32,
    seccomp: Option<seccomp::CompiledProfile>,
    landlock_abi: Option<u32>,
    cgroup: Option<cgroup::SandboxCgroup>,
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

impl Sandbox {
    /// Checks the layers the policy requires (exit 69 when one is missing), compiles the
    /// seccomp profile, creates the run directory and the size-capped disk holding
    /// `/tmp` and the workspace.
    pub fn prepare(spec: &Spec) -> Result<Sandbox, SandboxError> {
        let layers = &spec.layers;
        // Seccomp: compile at start, so a broken profile fails before anything runs.
        let seccomp = if layers.get(Layer::Seccomp).wanted() {
            match seccomp::probe() {
                Ok(()) => Some(match &spec.seccomp.source {
                    SeccompSource::Builtin => {
                        seccomp::compile_json(&spec.seccomp.name, spec::DEFAULT_SECCOMP.as_bytes())?
                    }
                    SeccompSource::File(p) => seccomp::compile_file(p)?,
                }),
                Err(fix) => {
                    require_missing(
                        layers,
                        Layer::Seccomp,
                        "the kernel has no seccomp filter mode",
                        &fix,
                    )?;
                    None
                }
            }
        } else {
            None
        };
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
            // A per-run unprivileged uid: never host root, never shared with another run.
            let n = u32::from_str_radix(&crate::rundir::new_run_id()[..6], 16).unwrap_or(0);
            let id = 1_000_000_000 + n;
            (id, id)
        } else {
            (
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
            )
        };
        if is_root() {
            // The init runs as an unprivileged uid and must reach its mount points beneath
            // the run root: every directory above them has to be searchable by others.
            let base = crate::rundir::base_dir();
            let mut dir = Some(base.as_path());
            while let Some(d) = dir {
                use std::os::unix::fs::PermissionsExt;
                if let Ok(md) = std::fs::metadata(d) {
                    if md.permissions().mode() & 0o001 == 0 {
                        return Err(SandboxError::Setup {
                            stage: "run directory".into(),
                            message: format!(
                                "{} (mode {:o}) is not searchable by others, so the sandbox's unprivileged uid cannot reach its run directory under {}: set FORK_RUN_ROOT to a directory whose parents are all o+x (the default, the system temp dir, is)",
                                d.display(),
                                md.permissions().mode() & 0o7777,
                                base.display()
                            ),
                        });
                    }
                }
                dir = d.parent();
            }
        }
        let rundir = RunDir::create(&crate::rundir::new_run_id())?;
        let mut sb = Sandbox {
            spec: spec.clone(),
            rundir: Some(rundir),
            disk_mounted: false,
            host_uid,
            host_gid,
            seccomp,
            landlock_abi,
            cgroup: None,
        };
        if is_root() {
            // The init runs as the unprivileged host uid: it may traverse the run directory
            // (0711, nothing listable) to its own mount point; the disk is its alone (0700).
            use std::os::unix::fs::PermissionsExt;
            let rd = sb.rundir();
            let io_err = |op: &'static str, path: &Path| {
                let path = path.to_path_buf();
                move |source| SandboxError::Io { op, path, source }
            };
            std::fs::set_permissions(&rd.path, std::fs::Permissions::from_mode(0o711))
                .map_err(io_err("chmod", &rd.path))?;
            std::os::unix::fs::chown(rd.root_mount(), Some(host_uid), Some(host_gid))
                .map_err(io_err("chown", &rd.root_mount()))?;
        }
        sb.mount_disk()?;
        Ok(sb)
    }

    fn rundir(&self) -> &RunDir {
        // Invariant: `rundir` is only taken by `destroy`, which consumes the sandbox.
        self.rundir
            .as_ref()
            .expect("run directory present until destroy")
    }

    pub fn run_id(&self) -> &str {
        &self.rundir().id
    }

    /// The host path of the capped filesystem (the sandbox's /tmp).
    pub fn disk(&self) -> PathBuf {
        self.rundir().disk()
    }

    /// The host path of the workspace (`/tmp/successor` inside).
    pub fn workspace(&self) -> PathBuf {
        self.disk().join("successor")
    }

    fn mount_disk(&mut self) -> Result<(), SandboxError> {
        let req = self.spec.layers.get(Layer::Disk);
        if !req.wanted() {
            return Ok(());
        }
        if !is_root() {
            return require_missing(
                &self.spec.layers,
                Layer::Disk,
                "capping the workspace needs a tmpfs mounted by root on the host",
                "run fork as root, or set [layers] disk = \"optional\" in the policy (then /tmp is capped inside the sandbox but the workspace is not)",
            );
        }
        let disk = self.disk();
        let data = format!(
            "size={},mode=0700,uid={},gid={}",
            self.spec.limits.disk_bytes, self.host_uid, self.host_gid
        );
        use nix::mount::{mount, MsFlags};
        match mount(
            Some("tmpfs"),
            &disk,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(data.as_str()),
        ) {
            Ok(()) => {
                self.disk_mounted = true;
                Ok(())
            }
            Err(e) => require_missing(
                &self.spec.layers,
                Layer::Disk,
                &format!(
                    "mounting a {} tmpfs at {} failed: {e}",
                    self.spec.limits.disk_bytes,
                    disk.display()
                ),
                "run fork as root with mount rights, or set [layers] disk = \"optional\"",
            ),
        }
    }

    /// Lowers the wall-clock limit of the runs to come to at most `max` (a caller's own
    /// deadline, such as an evaluation's whole-run budget). Never raises it.
    pub fn clamp_wall(&mut self, max: std::time::Duration) {
        self.spec.limits.wall = self.spec.limits.wall.min(max);
    }

    /// The limits the next run gets.
    pub fn limits(&self) -> &Limits {
        &self.spec.limits
    }

    /// Hands the workspace to the sandbox's uid (after the caller has populated it).
    pub fn chown_workspace(&self) -> Result<(), SandboxError> {
        if !is_root() {
            return Ok(());
        }
        chown_tree(&self.disk(), self.host_uid, self.host_gid)
    }

    /// Runs a command in the sandbox and waits for it, enforcing every budget.
    pub fn run(&mut self, cmd: Command<'_>) -> Result<Outcome, SandboxError> {
        let Command {
            argv,
            env,
            cwd,
            output,
            doors,
        } = cmd;
        let (argv, env, cwd) = (argv.as_slice(), env.as_slice(), cwd.as_path());
        if argv.is_empty() {
            return Err(SandboxError::Setup {
                stage: "command".into(),
                message: "no command given".into(),
            });
        }
        let ws = self.workspace();
        for d in [ws.clone(), ws.join("home")] {
            std::fs::create_dir_all(&d).map_err(|source| SandboxError::Io {
                op: "create workspace",
                path: d.clone(),
                source,
            })?;
        }
        self.chown_workspace()?;
        let spec = self.spec.clone();
        let layers = &spec.layers;
        let mut isolation = Isolation {
            root: match spec.root {
                RootMode::Host => "host".into(),
                RootMode::Minimal => "minimal".into(),
            },
            host_uid: self.host_uid,
            ..Default::default()
        };

        // Namespaces: try them all; on failure find out which one the host lacks.
        let mut ns_flags = libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID;
        for (layer, flag) in [
            (Layer::Netns, libc::CLONE_NEWNET),
            (Layer::Ipcns, libc::CLONE_NEWIPC),
            (Layer::Utsns, libc::CLONE_NEWUTS),
        ] {
            if layers.get(layer).wanted() {
                ns_flags |= flag;
            }
        }
        let mut cgroupns = layers.get(Layer::Cgroupns).wanted();

        // cgroup budgets, beneath our own cgroup.
        if layers.get(Layer::Cgroup).wanted() && self.cgroup.is_none() {
            let limits = cgroup::CgroupLimits {
                memory_bytes: Some(spec.limits.memory_bytes),
                cpu_percent: Some(spec.limits.cpu_percent),
                pids: Some(spec.limits.pids),
            };
            match cgroup::SandboxCgroup::create(&self.rundir().id, &limits) {
                Ok(cg) => self.cgroup = Some(cg),
                Err(e) => {
                    let p = cgroup::probe();
                    let fix = if p.fix.is_empty() {
                        "run fork as root, or delegate a cgroup to your user (systemd-run --user --scope -p Delegate=yes fork ...)".to_string()
                    } else {
                        p.fix.join("; ")
                    };
                    require_missing(layers, Layer::Cgroup, &e.to_string(), &fix)?;
                }
            }
        }
        if self.cgroup.is_none() && cgroupns {
            // A cgroup namespace rooted at the supervisor's own cgroup would reveal it.
            require_missing(
                layers,
                Layer::Cgroupns,
                "no sandbox cgroup to root the cgroup namespace at",
                "make the cgroup layer available",
            )?;
            cgroupns = false;
        }

        let tmp_src = if self.disk_mounted {
            Some(self.disk())
        } else {
            None
        };
        // Without a capped disk, the workspace is bound from the run directory into the
        // sandbox's own (capped) /tmp.
        let workspace_src = if self.disk_mounted {
            None
        } else {
            Some(self.workspace())
        };
        // fork's own run directories are never visible, whatever the spec hides.
        let mut hide = spec.hide.clone();
        hide.push(crate::rundir::base_dir());
        let ops = mounts::plan(&mounts::RootPlan {
            mode: spec.root,
            binds: &spec.binds,
            hide: &hide,
            tmp_src: tmp_src.as_deref(),
            tmp_size: spec.limits.disk_bytes,
            workspace_src: workspace_src.as_deref(),
            shm_size: spec.shm_bytes,
        });
        // Door ports must be reachable past Landlock's TCP rules, and only they are added.
        let door_addrs: Vec<std::net::SocketAddr> = doors.doors.iter().map(|d| d.addr).collect();
        let landlock_spec = self.landlock_abi.map(|_| {
            let mut ll = landlock_spec(&spec);
            if let Some(ports) = ll.tcp_connect.as_mut() {
                ports.extend(door_addrs.iter().map(|a| a.port()));
            }
            ll
        });
        let cfg = InitConfig {
            newroot: self.rundir().root_mount(),
            mounts: ops,
            cgroupns,
            netns: ns_flags & libc::CLONE_NEWNET != 0,
            hostname: (ns_flags & libc::CLONE_NEWUTS != 0).then(|| "successor".to_string()),
            argv: argv.to_vec(),
            env: env.to_vec(),
            cwd: cwd.to_path_buf(),
            landlock: landlock_spec,
            landlock_required: layers.get(Layer::Landlock) == Requirement::Required,
            seccomp: self.seccomp.clone(),
        };

        let start = Instant::now();
        let mut child = match spawn_init(
            &cfg,
            ns_flags as u64,
            self.host_uid,
            self.host_gid,
            self.cgroup.as_ref(),
            output,
            &door_addrs,
        ) {
            Ok(c) => c,
            Err(e) => {
                // Which namespace is missing? Name it (exit 69) rather than a bare errno.
                let probes = probe::probe_namespaces();
                for p in probes.iter().filter(|p| !p.ok) {
                    let req = layers.get(p.layer);
                    if req == Requirement::Required {
                        return Err(SandboxError::LayerUnavailable {
                            layer: p.layer,
                            reason: p.detail.clone(),
                            fix: p.fix.clone(),
                        });
                    }
                }
                return Err(e);
            }
        };
        self.rundir().write_meta(Some(child.pid));
        isolation.userns = true;
        isolation.pidns = true;
        isolation.mountns = true;
        isolation.netns = ns_flags & libc::CLONE_NEWNET != 0;
        isolation.ipcns = ns_flags & libc::CLONE_NEWIPC != 0;
        isolation.utsns = ns_flags & libc::CLONE_NEWUTS != 0;
        isolation.cgroupns = cgroupns;
        isolation.seccomp = self.seccomp.as_ref().map(|s| s.name.clone());
        isolation.cgroup = self.cgroup.as_ref().map(|c| match c.version() {
            cgroup::CgroupVersion::V1 => "v1".to_string(),
            cgroup::CgroupVersion::V2 => "v2".to_string(),
        });
        isolation.disk = self.disk_mounted.then(|| "tmpfs".to_string());

        let mut watchdog = Watchdog::new(spec.limits.clone());
        let disk_path = self.disk_mounted.then(|| self.disk());
        let listeners = std::mem::take(&mut child.listeners);
        let (exit, budget, interrupted) = supervise(
            &child,
            doors,
            listeners,
            self.cgroup.as_ref(),
            disk_path.as_deref(),
            &mut watchdog,
            start,
        )?;
        // The status pipe: the command's landlock status, setup errors, the real exit status.
        let msgs = read_msgs(child.status);
        let mut exited: Option<(Option<i32>, Option<i32>)> = None;
        for m in &msgs {
            match m {
                InitMsg::Landlock { status } => {
                    isolation.landlock_abi = Some(status.abi);
                    isolation.landlock_enforced = Some(
                        serde_json::to_value(status.enforced)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_string))
                            .unwrap_or_else(|| format!("{:?}", status.enforced)),
                    );
                }
                InitMsg::Exited { code, signal } => exited = Some((*code, *signal)),
                InitMsg::Error { .. } => {}
            }
        }
        if let Some(cg) = &self.cgroup {
            let s = cg.sample();
            watchdog.observe(&observation(start, &s, disk_path.as_deref()));
        }
        let usage = watchdog.usage().clone();
        // A setup error inside the sandbox is an error, not a result of the command.
        if budget.is_none() && !interrupted {
            if let Some(InitMsg::Error {
                stage,
                message,
                layer,
                fix,
            }) = msgs.iter().find(|m| matches!(m, InitMsg::Error { .. }))
            {
                if let (Some(layer), Some(fix)) = (layer, fix) {
                    return Err(SandboxError::LayerUnavailable {
                        layer: *layer,
                        reason: message.clone(),
                        fix: fix.clone(),
                    });
                }
                if stage != "exec" {
                    return Err(SandboxError::Setup {
                        stage: stage.clone(),
                        message: message.clone(),
                    });
                }
            }
        }
        let (exit_code, signal) = match (budget.is_some() || interrupted, exited) {
            (false, Some((Some(c), _))) => (c, None),
            (false, Some((None, Some(s)))) => (128 + s, Some(s)),
            // Killed by the supervisor, or the init died without a word: report its end.
            _ => match exit {
                InitExit::Code(c) => (c, None),
                InitExit::Signal(s) => (128 + s, Some(s)),
            },
        };
        let exec_error = msgs.iter().find_map(|m| match m {
            InitMsg::Error { stage, message, .. } if stage == "exec" => Some(message.clone()),
            _ => None,
        });
        Ok(Outcome {
            exit_code,
            signal,
            budget_exceeded: budget,
            usage,
            isolation,
            interrupted,
            exec_error,
        })
    }

    /// Kills whatever remains, removes the cgroup, unmounts the disk and deletes the run
    /// directory. Idempotent.
    pub fn destroy(mut self) -> Result<(), SandboxError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), SandboxError> {
        let mut first_err = None;
        if let Some(cg) = self.cgroup.take() {
            if let Err(e) = cg.destroy() {
                first_err.get_or_insert(SandboxError::Setup {
                    stage: "destroy cgroup".into(),
                    message: e.to_string(),
                });
            }
        }
        if let Some(rd) = self.rundir.take() {
            if let Err(e) = reclaim_dir(&rd.path, rd.id.as_str()) {
                first_err.get_or_insert(e);
            }
            drop(rd);
        }
        self.disk_mounted = false;
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            tracing::error!("destroying the sandbox: {e}");
        }
    }
}

/// Unmounts anything beneath a run directory and deletes it (shared with `fork gc`).
pub fn reclaim_dir(path: &Path, _id: &str) -> Result<(), SandboxError> {
    use nix::mount::{umount2, MntFlags};
    // Unmount deepest first, as listed in our own mount table.
    let mut points: Vec<PathBuf> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(unescape_mountinfo))
        .filter(|p| p.starts_with(path))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        if let Err(e) = umount2(&p, MntFlags::MNT_DETACH) {
            if e != nix::Error::EINVAL && e != nix::Error::ENOENT {
                return Err(SandboxError::Io {
                    op: "unmount",
                    path: p,
                    source: std::io::Error::from(e),
                });
            }
        }
    }
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(SandboxError::Io {
            op: "remove run directory",
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn unescape_mountinfo(s: &str) -> PathBuf {
    // mountinfo escapes space, tab, newline and backslash as \ooo.
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            if let Ok(v) =
                u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 4]).unwrap_or("x"), 8)
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
}

fn require_missing(
    layers: &Layers,
    layer: Layer,
    reason: &str,
    fix: &str,
) -> Result<(), SandboxError> {
    match layers.get(layer) {
        Requirement::Required => Err(SandboxError::LayerUnavailable {
            layer,
            reason: reason.to_string(),
            fix: fix.to_string(),
        }),
        _ => {
            tracing::warn!(
                "layer {} unavailable ({reason}); the policy marks it optional",
                layer.name()
            );
            Ok(())
        }
    }
}

/// The Landlock rules: read and execute everywhere the mount layer shows, write only in
/// /tmp (which holds the workspace) and /dev/shm, the harmless devices.
fn landlock_spec(spec: &Spec) -> landlock::LandlockSpec {
    let mut devices: Vec<PathBuf> = mounts::DEV_NODES
        .iter()
        .map(|n| Path::new("/dev").join(n))
        .collect();
    devices.push(PathBuf::from("/dev/pts"));
    devices.push(PathBuf::from("/dev/ptmx"));
    landlock::LandlockSpec {
        read_exec: vec![PathBuf::from("/")],
        read_write: vec![PathBuf::from("/tmp"), PathBuf::from("/dev/shm")],
        devices,
        tcp_bind: spec.tcp_bind.clone(),
        tcp_connect: spec.tcp_connect.clone(),
        scope_signals: true,
        scope_abstract_unix: true,
    }
}

fn chown_tree(root: &Path, uid: u32, gid: u32) -> Result<(), SandboxError> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        std::os::unix::fs::lchown(&p, Some(uid), Some(gid)).map_err(|source| SandboxError::Io {
            op: "chown",
            path: p.clone(),
            source,
        })?;
        let md = std::fs::symlink_metadata(&p).map_err(|source| SandboxError::Io {
            op: "stat",
            path: p.clone(),
            source,
        })?;
        if md.is_dir() {
            let rd = std::fs::read_dir(&p).map_err(|source| SandboxError::Io {
                op: "read dir",
                path: p.clone(),
                source,
            })?;
            for e in rd.flatten() {
                stack.push(e.path());
            }
        }
    }
    Ok(())
}

/// The init as seen from the supervisor.
struct InitChild {
    pid: i32,
    pidfd: OwnedFd,
    status: OwnedFd,
    /// Held open while the init lives: the init checks it to know the supervisor is alive.
    _sync: OwnedFd,
    /// The doors' listeners, inside the sandbox's network namespace, in `Doors` order.
    listeners: Vec<std::net::TcpListener>,
}

#[derive(Debug, Clone, Copy)]
enum InitExit {
    Code(i32),
    Signal(i32),
}

/// struct clone_args (linux/sched.h), version 2 (with `cgroup`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

fn cstr(s: &str) -> Result<CString, SandboxError> {
    CString::new(s).map_err(|_| SandboxError::Setup {
        stage: "argv".into(),
        message: format!("`{s}` contains a NUL byte"),
    })
}

fn spawn_init(
    cfg: &InitConfig,
    ns_flags: u64,
    uid: u32,
    gid: u32,
    cg: Option<&cgroup::SandboxCgroup>,
    output: Option<&std::fs::File>,
    door_addrs: &[std::net::SocketAddr],
) -> Result<InitChild, SandboxError> {
    use nix::fcntl::OFlag;
    let devnull = match output {
        Some(_) => Some(
            nix::fcntl::open(
                "/dev/null",
                OFlag::O_RDONLY | OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(sys("open /dev/null"))?,
        ),
        None => None,
    };
    let stdio: Option<(RawFd, RawFd)> = match (output, &devnull) {
        (Some(o), Some(n)) => Some((n.as_raw_fd(), o.as_raw_fd())),
        _ => None,
    };
    // Everything the child needs is prepared here, before the clone.
    let cfg_json = serde_json::to_vec(cfg).map_err(|e| SandboxError::Setup {
        stage: "config".into(),
        message: e.to_string(),
    })?;
    let memfd =
        nix::sys::memfd::memfd_create(c"fork-init-config", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
            .map_err(sys("memfd_create"))?;
    let mut f = std::fs::File::from(memfd);
    f.write_all(&cfg_json).map_err(|source| SandboxError::Io {
        op: "write config",
        path: PathBuf::from("memfd"),
        source,
    })?;
    f.rewind().map_err(|source| SandboxError::Io {
        op: "rewind config",
        path: PathBuf::from("memfd"),
        source,
    })?;
    let cfg_fd: OwnedFd = f.into();
    let (sync_rd, sync_wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(sys("pipe2"))?;
    let (status_rd, status_wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(sys("pipe2"))?;
    let exe = nix::fcntl::open(
        "/proc/self/exe",
        OFlag::O_PATH | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(sys("open /proc/self/exe"))?;
    let argv_c = [
        cstr("fork")?,
        cstr(INIT_ROLE)?,
        cstr(&cfg_fd.as_raw_fd().to_string())?,
        cstr(&status_wr.as_raw_fd().to_string())?,
    ];
    let argv_p: Vec<*const libc::c_char> = argv_c
        .iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    let empty = c"";
    // Joining the cgroup: on v2 the kernel places the child at clone (CLONE_INTO_CGROUP); on
    // v1 the child moves itself by writing "0" to each hierarchy's `tasks` (opened here, by
    // us). Both avoid the RCU grace period a supervisor-side write to cgroup.procs waits for.
    let mut cg_dir: Option<OwnedFd> = None;
    let mut cg_tasks: Vec<OwnedFd> = Vec::new();
    if let Some(cg) = cg {
        match cg.version() {
            cgroup::CgroupVersion::V2 => {
                if let Some(dir) = cg.paths().first() {
                    cg_dir = Some(
                        nix::fcntl::open(
                            dir,
                            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                            nix::sys::stat::Mode::empty(),
                        )
                        .map_err(sys("open the sandbox cgroup"))?,
                    );
                }
            }
            cgroup::CgroupVersion::V1 => {
                for dir in cg.paths() {
                    cg_tasks.push(
                        nix::fcntl::open(
                            &dir.join("tasks"),
                            OFlag::O_WRONLY | OFlag::O_CLOEXEC,
                            nix::sys::stat::Mode::empty(),
                        )
                        .map_err(sys("open the sandbox cgroup's tasks file"))?,
                    );
                }
            }
        }
    }
    let cg_tasks_raw: Vec<RawFd> = cg_tasks.iter().map(|f| f.as_raw_fd()).collect();
    let mut pidfd: RawFd = -1;
    const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
    let args = CloneArgs {
        flags: ns_flags
            | libc::CLONE_PIDFD as u64
            | if cg_dir.is_some() {
                CLONE_INTO_CGROUP
            } else {
                0
            },
        pidfd: &mut pidfd as *mut RawFd as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cg_dir.as_ref().map(|f| f.as_raw_fd() as u64).unwrap_or(0),
        ..Default::default()
    };
    let keep = [cfg_fd.as_raw_fd(), status_wr.as_raw_fd()];
    let sync_rd_raw = sync_rd.as_raw_fd();
    let sync_wr_raw = sync_wr.as_raw_fd();
    let exe_raw = exe.as_raw_fd();
    let become_root = is_root();
    // SAFETY: clone3 without CLONE_VM and without a stack behaves like fork: the child
    // gets a copy of the address space. In the child we only call async-signal-safe
    // syscalls (prctl, close, read, fcntl, execveat, _exit) on data prepared above, so
    // no lock held by another supervisor thread at clone time can be touched.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if ret == 0 {
        // Child.
        // SAFETY: raw async-signal-safe syscalls on valid fds and pointers prepared before clone.
        unsafe {
            libc::close(sync_wr_raw);
            let mut b = 0u8;
            // Wait for the supervisor to map ids and place us in the cgroup. EOF means it died.
            if libc::read(sync_rd_raw, &mut b as *mut u8 as *mut libc::c_void, 1) != 1 {
                libc::_exit(125);
            }
            for fd in cg_tasks_raw.iter() {
                if libc::write(*fd, b"0".as_ptr() as *const libc::c_void, 1) != 1 {
                    libc::_exit(122);
                }
            }
            if become_root {
                // Our host credentials (root) are unmapped in the new namespace: become its
                // uid 0 (the unprivileged host uid) and shed host root's supplementary
                // groups. Raw syscalls: glibc's wrappers would signal threads that exist
                // only in the parent.
                if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                    || libc::syscall(libc::SYS_setresgid, 0, 0, 0) != 0
                    || libc::syscall(libc::SYS_setresuid, 0, 0, 0) != 0
                {
                    libc::_exit(124);
                }
            }
            // Die with the supervisor. Set after the credential change, which clears it;
            // exec keeps it. If the supervisor is already gone, its end of the sync pipe is.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            let mut pfd = libc::pollfd {
                fd: sync_rd_raw,
                events: libc::POLLIN,
                revents: 0,
            };
            if libc::poll(&mut pfd, 1, 0) < 0 || pfd.revents & libc::POLLHUP != 0 {
                libc::_exit(125);
            }
            if let Some((input, out)) = stdio {
                if libc::dup2(input, 0) < 0 || libc::dup2(out, 1) < 0 || libc::dup2(out, 2) < 0 {
                    libc::_exit(123);
                }
            }
            for fd in keep {
                libc::fcntl(fd, libc::F_SETFD, 0);
            }
            libc::syscall(
                libc::SYS_execveat,
                exe_raw,
                empty.as_ptr(),
                argv_p.as_ptr(),
                envp.as_ptr(),
                libc::AT_EMPTY_PATH,
            );
            libc::_exit(127);
        }
    }
    if ret < 0 {
        return Err(SandboxError::Sys {
            op: "clone3 (new user, pid, mount, net, ipc, uts namespaces)",
            source: nix::Error::last(),
        });
    }
    let pid = ret as i32;
    // SAFETY: the kernel stored a fresh pidfd at `pidfd` (CLONE_PIDFD); we now own it.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop(sync_rd);
    drop(status_wr);
    drop(cfg_fd);
    drop(cg_tasks);
    drop(cg_dir);
    let mut child = InitChild {
        pid,
        pidfd,
        status: status_rd,
        _sync: sync_wr,
        listeners: Vec::new(),
    };
    let release = |child: &mut InitChild| -> Result<(), SandboxError> {
        // The doors exist before the command does: it may connect at once.
        child.listeners =
            net::listeners_in_netns(pid, door_addrs).map_err(|e| SandboxError::Setup {
                stage: "doors".into(),
                message: e.to_string(),
            })?;
        if !become_root {
            // An unprivileged writer may only map its gid once setgroups is denied.
            write_file(&format!("/proc/{pid}/setgroups"), "deny")?;
        }
        write_file(&format!("/proc/{pid}/uid_map"), &format!("0 {uid} 1\n"))?;
        write_file(&format!("/proc/{pid}/gid_map"), &format!("0 {gid} 1\n"))?;
        nix::unistd::write(&child._sync, &[1u8]).map_err(sys("release init"))?;
        Ok(())
    };
    if let Err(e) = release(&mut child) {
        kill_pidfd(&child.pidfd);
        let _ = nix::sys::wait::waitid(
            nix::sys::wait::Id::PIDFd(child.pidfd.as_fd()),
            nix::sys::wait::WaitPidFlag::WEXITED,
        );
        return Err(e);
    }
    Ok(child)
}

fn write_file(path: &str, content: &str) -> Result<(), SandboxError> {
    std::fs::write(path, content).map_err(|source| SandboxError::Io {
        op: "write",
        path: PathBuf::from(path),
        source,
    })
}

fn kill_pidfd(pidfd: &OwnedFd) {
    // SAFETY: pidfd_send_signal on a pidfd we own; null siginfo is allowed.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        );
    }
}

fn observation(start: Instant, s: &cgroup::CgroupSample, disk: Option<&Path>) -> Observation {
    let (disk_used, disk_size) = match disk.and_then(|d| nix::sys::statvfs::statvfs(d).ok()) {
        Some(v) => {
            let bs = v.fragment_size();
            let size = v.blocks() * bs;
            let free = v.blocks_free() * bs;
            (Some(size.saturating_sub(free)), Some(size))
        }
        None => (None, None),
    };
    Observation {
        elapsed: start.elapsed(),
        cpu_ns: s.cpu_ns,
        memory_peak: s.memory_peak.max(s.memory_current),
        pids_current: s.pids_current,
        pids_peak: s.pids_peak,
        oom_kills: s.oom_kills,
        pids_limit_hits: s.pids_limit_hits,
        disk_used,
        disk_size,
    }
}

/// Watches the init until it exits: wall clock, cgroup events, disk, signals.
fn supervise(
    child: &InitChild,
    doors: Doors,
    listeners: Vec<std::net::TcpListener>,
    cg: Option<&cgroup::SandboxCgroup>,
    disk: Option<&Path>,
    wd: &mut Watchdog,
    start: Instant,
) -> Result<(InitExit, Option<BudgetKind>, bool), SandboxError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| SandboxError::Io {
            op: "start the watchdog runtime",
            path: PathBuf::new(),
            source,
        })?;
    let pidfd_raw = child.pidfd.as_raw_fd();
    let cost = doors.cost.clone();
    // Doors are served on this thread (their futures need not be Send), in a LocalSet that
    // is dropped, with every door, when the run ends.
    let local = tokio::task::LocalSet::new();
    let (budget, interrupted) = local.block_on(&rt, async {
        for (door, l) in doors.doors.into_iter().zip(listeners) {
            match tokio::net::TcpListener::from_std(l) {
                Ok(l) => {
                    tokio::task::spawn_local((door.serve)(l));
                }
                Err(e) => tracing::warn!("door {}: {e}", door.addr),
            }
        }
        // SAFETY: the pidfd (owned by `child`) stays open for longer than this registration,
        // which is dropped at the end of this block.
        let afd = match unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                pidfd_raw,
                tokio::io::Interest::READABLE,
            )
        } {
            Ok(a) => a,
            Err(_) => return (None, false),
        };
        let mut sigint =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
        let mut sigterm =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let mut sighup =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let deadline = tokio::time::Instant::from_std(start + wd.limits().wall);
        let mut tick = tokio::time::interval_at(
            tokio::time::Instant::now() + Duration::from_millis(25),
            Duration::from_millis(50),
        );
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        }
        loop {
            tokio::select! {
                r = afd.readable() => {
                    if let Ok(mut g) = r { g.retain_ready(); }
                    return (None, false);
                }
                _ = tokio::time::sleep_until(deadline) => {
                    return (Some(BudgetKind::Wall), false);
                }
                _ = tick.tick() => {
                    if let Some(c) = &cost {
                        wd.set_api_cost(c.spent_usd());
                        if c.exceeded() {
                            return (Some(BudgetKind::ApiCost), false);
                        }
                    }
                    let s = cg.map(|c| c.sample()).unwrap_or_default();
                    if let Some(b) = wd.observe(&observation(start, &s, disk)) {
                        return (Some(b), false);
                    }
                }
                _ = recv(&mut sigint) => return (None, true),
                _ = recv(&mut sigterm) => return (None, true),
                _ = recv(&mut sighup) => return (None, true),
            }
        }
    });
    if budget.is_some() || interrupted {
        if let Some(b) = budget {
            tracing::info!("budget `{}` exceeded: killing the sandbox", b.as_str());
        }
        kill_pidfd(&child.pidfd);
        if let Some(cg) = cg {
            let _ = cg.kill_all();
        }
    }
    let st = nix::sys::wait::waitid(
        nix::sys::wait::Id::PIDFd(child.pidfd.as_fd()),
        nix::sys::wait::WaitPidFlag::WEXITED,
    )
    .map_err(sys("waitid on the sandbox init"))?;
    let exit = match st {
        nix::sys::wait::WaitStatus::Exited(_, c) => InitExit::Code(c),
        nix::sys::wait::WaitStatus::Signaled(_, s, _) => InitExit::Signal(s as i32),
        _ => InitExit::Code(70),
    };
    // The pid namespace dies with its init; make sure every member is gone before anyone
    // reads what the successor left behind.
    if let Some(cg) = cg {
        if let Err(e) = cg.kill_all() {
            tracing::warn!("emptying the sandbox cgroup: {e}");
        }
    }
    drop(local);
    if let Some(c) = &cost {
        wd.set_api_cost(c.spent_usd());
    }
    let mut wd_budget = budget;
    if wd_budget.is_none() && !interrupted {
        // The command may have ended by the event itself (OOM kill, a full disk) before a tick.
        let s = cg.map(|c| c.sample()).unwrap_or_default();
        wd_budget = wd
            .observe(&observation(start, &s, disk))
            .filter(|b| *b != BudgetKind::Wall);
        if wd_budget.is_none() && cost.as_ref().is_some_and(|c| c.exceeded()) {
            wd_budget = Some(BudgetKind::ApiCost);
        }
    }
    Ok((exit, wd_budget, interrupted))
}

fn read_msgs(status: OwnedFd) -> Vec<InitMsg> {
    let mut f = std::fs::File::from(status);
    let mut buf = Vec::new();
    // Every writer is gone once the init has exited (the pid namespace is dead).
    let _ = Read::by_ref(&mut f).take(1 << 20).read_to_end(&mut buf);
    buf.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .filter_map(|l| serde_json::from_slice(l).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_unescape() {
        assert_eq!(
            unescape_mountinfo("/tmp/a\\040b"),
            PathBuf::from("/tmp/a b")
        );
        assert_eq!(unescape_mountinfo("/plain"), PathBuf::from("/plain"));
    }

    #[test]
    fn init_msgs_roundtrip() {
        let m = InitMsg::Exited {
            code: Some(3),
            signal: None,
        };
        let s = serde_json::to_string(&m).unwrap();
        assert!(s.contains("\"msg\":\"exited\""), "{s}");
        let back: InitMsg = serde_json::from_str(&s).unwrap();
        assert!(matches!(back, InitMsg::Exited { code: Some(3), .. }));
    }
}
