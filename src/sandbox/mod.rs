//! The sandbox: one command run as a successor would run, with every isolation layer of
//! the security model in force.
//!
//! Process roles (as youki names them):
//! - **supervisor**: this process. It plans, creates the run directory, the size-capped
//!   disk and the cgroup, clones the init into new namespaces, writes its uid/gid maps,
//!   moves it into the cgroup, then watches budgets (tokio) until the init exits.
//! - **init**: pid 1 of the new pid namespace; the `fork-init` binary of the same build,
//!   found beside `fork` ([`init_exe`]), run with the `__sandbox-init` role (see
//!   [`init`]). It builds the root, forks the command, reaps, forwards signals, and
//!   reports the command's status. It dies with the supervisor
//!   (PDEATHSIG) and the kernel kills the whole namespace when it dies.
//! - **command**: the successor. Capabilities dropped, no_new_privs, Landlock, seccomp,
//!   then exec.
//!
//! Between clone and exec the child only makes async-signal-safe syscalls.
//!
//! One file per layer: [`namespaces`], [`mounts`], [`net`], [`cgroup`], [`caps`],
//! [`landlock`], [`seccomp`]; every raw system call (the crate's only `unsafe`) is in `sys`.

pub mod caps;
pub mod cgroup;
mod cgroup_ahead;
mod disk;
pub mod fs_identity;
pub mod init;
pub mod init_exe;
pub mod landlock;
pub mod mounts;
pub mod namespaces;
pub mod net;
mod netlink_queues;
mod prepare;
pub mod probe;
mod reclaim;
pub mod rlimits;
pub mod rootless;
pub mod seccomp;
pub mod signals;
pub mod spec;
mod subids;
mod supervisor;
#[allow(unsafe_code)]
pub(crate) mod sys;
mod teardown;
pub mod userns_limits;
mod userns_owner;
pub mod watchdog;

use crate::ioerr::{IoContext, IoError};
use crate::rundir::RunDir;
use crate::trace;
use cgroup_ahead::{CgroupAhead, CgroupSlot};
use reclaim::chown_tree;
pub use reclaim::{reclaim_dir, reclaim_dir_keeping_record};
use serde::{Deserialize, Serialize};
pub use spec::{Layer, Layers, Requirement, RootMode, SeccompSource, Spec};
use std::ffi::CString;
use std::io::{Read, Seek, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use supervisor::{spawn_init, supervise, InitExit, StatusReader};
use thiserror::Error;
pub use watchdog::{BudgetKind, Limits, Observation, Usage, Watchdog};

/// The successor's workspace, inside the sandbox.
pub const WORKSPACE: &str = "/tmp/successor";
/// The argv[1] that makes the binary act as the sandbox init.
pub const INIT_ROLE: &str = "__sandbox-init";
/// The host name in the sandbox's UTS namespace: neutral, the name of no host.
pub const HOSTNAME: &str = "localhost";
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
    /// The sandboxes' run root (`$FORK_RUN_ROOT`, else see
    /// [`crate::rundir::sandbox_base_dir`]) lies beneath a directory
    /// the sandbox's unprivileged uid cannot search: a setting to change, not a fault.
    #[error("the run root {}: {} (mode {mode:o}) is not searchable by others, so the sandbox's unprivileged uid cannot reach its run directory. Fix: {RUN_ROOT_FIX}", .base.display(), .dir.display())]
    RunRootUnreachable {
        base: PathBuf,
        dir: PathBuf,
        mode: u32,
    },
    #[error("the seccomp profile: {0}")]
    Seccomp(#[from] seccomp::SeccompError),
    #[error(transparent)]
    InitExe(#[from] init_exe::InitExeError),
    #[error(transparent)]
    RunDir(#[from] crate::rundir::RunDirError),
    #[error("{op}: {source}")]
    Sys {
        op: &'static str,
        source: nix::Error,
    },
    #[error("{} {}: {}", .0.action, .0.path.display(), .0.source)]
    Io(#[from] IoError),
}

/// The fix for [`SandboxError::RunRootUnreachable`] (`fork check` names it too).
pub const RUN_ROOT_FIX: &str = "set FORK_RUN_ROOT to a writable directory every directory above which is searchable by others (o+x), or leave it unset (the defaults, the system temp dir or /dev/shm, are)";

/// Why the cgroup namespace is missing when the cgroup layer is (`fork check` says the same).
pub const CGROUPNS_NEEDS_CGROUP: &str = "no sandbox cgroup to root the cgroup namespace at";
/// The fix for [`CGROUPNS_NEEDS_CGROUP`].
pub const CGROUPNS_NEEDS_CGROUP_FIX: &str =
    "make the cgroup layer available (see `cgroup`), or mark cgroupns optional";

fn sys_err(op: &'static str) -> impl FnOnce(nix::Error) -> SandboxError {
    move |source| SandboxError::Sys { op, source }
}

/// What the init needs, passed through a memfd as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InitConfig {
    pub newroot: PathBuf,
    /// The init mounts a small tmpfs of its own over `newroot`'s parent (the run
    /// directory, in its own mount namespace only) and builds the root there: the host has
    /// no mount point for it (see `mounts::build_and_pivot`). Only when every source under
    /// the run directory reaches the init as a descriptor.
    #[serde(default)]
    pub scratch: bool,
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
    /// `(target, fd)`: descriptors the init holds (as `fd`) that the command gets at
    /// `target` (e.g. a judge's channel at 3 and 4).
    #[serde(default)]
    pub pass_fds: Vec<(i32, i32)>,
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
    /// The sandbox shares its host uid with the supervisor and with every other sandbox of
    /// this user (fork without root: the judge's and the subject's runs included); as root
    /// each run gets a uid of its own.
    #[serde(default)]
    pub uid_shared: bool,
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
    /// The caller stopped the run (its cancel token), e.g. a subject once its judge ended.
    #[serde(default)]
    pub cancelled: bool,
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

/// What a metered door has spent; the watchdog kills the sandbox once `exceeded()`. When
/// the run ends, the supervisor gives the door's calls still in flight a short grace to
/// finish (driving its runtime while `in_flight()` is not 0), then has the rest charged
/// (`settle_in_flight`) before it reads the spend.
pub trait CostMeter {
    fn spent_usd(&self) -> f64;
    fn exceeded(&self) -> bool;
    /// Calls admitted through the door and not charged yet.
    fn in_flight(&self) -> usize;
    /// Charges every call still in flight its worst case (the run is over).
    fn settle_in_flight(&self);
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
    /// The command's stdin instead of /dev/null (e.g. a pipe from a judge).
    pub stdin: Option<OwnedFd>,
    /// The command's stdout instead of `output` (e.g. a pipe to a judge).
    pub stdout: Option<OwnedFd>,
    /// Descriptors the command gets at the given numbers (3 and up). The supervisor keeps
    /// no copy once the sandbox has started, so the far ends see EOF when the sandbox ends.
    pub pass_fds: Vec<(i32, OwnedFd)>,
    /// Set by another thread to stop the run (reported as `cancelled`, not as a budget).
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
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
            stdin: None,
            stdout: None,
            pass_fds: Vec::new(),
            cancel: None,
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
    cgroup: CgroupSlot,
    /// `prepare` started the cgroups: the first run takes them (an optional layer that
    /// failed is not tried, and warned about, again at that run).
    cgroup_started: bool,
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether each sandbox runs as a uid of its own: as root, or as a user whose subordinate
/// ranges fork's namespace maps (see `rootless`). Otherwise every sandbox runs as the user.
fn own_uid() -> bool {
    is_root() || rootless::distinct_uids()
}

impl Sandbox {
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
        if !own_uid() {
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
            stdin,
            stdout,
            pass_fds,
            cancel,
            doors,
        } = cmd;
        if pass_fds.iter().any(|(t, _)| *t < 3) || pass_fds.len() > 8 {
            return Err(SandboxError::Setup {
                stage: "command".into(),
                message: "passed descriptors go at 3 and above, at most 8 of them".into(),
            });
        }
        let (argv, env, cwd) = (argv.as_slice(), env.as_slice(), cwd.as_path());
        if argv.is_empty() {
            return Err(SandboxError::Setup {
                stage: "command".into(),
                message: "no command given".into(),
            });
        }
        // The workspace and the sandbox's /dev/shm (on the capped disk, see mounts::plan),
        // never through a link an earlier run left (see `disk`).
        self.own_dirs()?;
        trace::mark("sandbox: workspace dirs owned");
        self.chown_workspace()?;
        trace::mark("sandbox: workspace ready");
        let spec = self.spec.clone();
        let layers = &spec.layers;
        let mut isolation = Isolation {
            root: match spec.root {
                RootMode::Host => "host".into(),
                RootMode::Minimal => "minimal".into(),
            },
            host_uid: self.host_uid,
            uid_shared: !own_uid(),
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
        // fork's own run directories are never reachable, whatever the spec hides. As root
        // no mount of them is in the sandbox's mount table (see `mounts`) and what they
        // hold is the supervisor's (0700) or another sandbox uid's (0700): covering the
        // run root too would name it in the mount table. Otherwise it is covered.
        let mut hide = spec.hide.clone();
        if !is_root() {
            hide.extend(crate::rundir::run_roots());
        }
        let ops = mounts::plan(&mounts::RootPlan {
            mode: spec.root,
            binds: &spec.binds,
            hide: &hide,
            tmp_src: tmp_src.as_deref(),
            tmp_size: spec.limits.disk_bytes,
            workspace_src: workspace_src.as_deref(),
            shm_size: spec.shm_bytes,
            ro_binds: &spec.ro_binds,
            fresh_sysfs: ns_flags & libc::CLONE_NEWNET != 0,
        });
        // With a uid of its own (as root, or a user's subordinate one), the disk and the
        // read-only binds go to the init as detached mount trees (the init then needs no
        // host path to them, and its mount table names none).
        let (ops, mount_fds) = if own_uid() {
            supervisor::detach_sources(ops)?
        } else {
            (ops, Vec::new())
        };
        // Door ports must be reachable past Landlock's TCP rules, and only they are added.
        let door_addrs: Vec<std::net::SocketAddr> = doors.doors.iter().map(|d| d.addr).collect();
        let landlock_spec = self.landlock_abi.map(|_| {
            let mut ll = landlock_spec(&spec);
            if let Some(ports) = ll.tcp_connect.as_mut() {
                ports.extend(door_addrs.iter().map(|a| a.port()));
            }
            ll
        });
        // cgroup budgets, beneath our own cgroup (started by `prepare`, made meanwhile on a
        // thread of their own; again after a failure of an optional layer at an earlier
        // run). As root, required v1 ones still being made are waited for after the clone,
        // before the init's release (it joins them itself then); any others before it (on
        // v2 the clone places the init in them; an optional layer the host refuses turns
        // the cgroup namespace off before the init is made).
        let join_later = is_root()
            && layers.get(Layer::Cgroup) == Requirement::Required
            && self.cgroup_v1_in_the_making();
        if !join_later {
            self.ensure_cgroup()?;
            self.begin_cgroup_run();
        }
        if !join_later && self.cgroup.ready().is_none() && cgroupns {
            // A cgroup namespace rooted at the supervisor's own cgroup would reveal it.
            require_missing(
                layers,
                Layer::Cgroupns,
                CGROUPNS_NEEDS_CGROUP,
                CGROUPNS_NEEDS_CGROUP_FIX,
            )?;
            cgroupns = false;
        }
        let cfg = InitConfig {
            newroot: self.rundir().root_mount(),
            scratch: own_uid(),
            mounts: ops,
            cgroupns,
            netns: ns_flags & libc::CLONE_NEWNET != 0,
            hostname: (ns_flags & libc::CLONE_NEWUTS != 0).then(|| HOSTNAME.to_string()),
            argv: argv.to_vec(),
            env: env.to_vec(),
            cwd: cwd.to_path_buf(),
            landlock: landlock_spec,
            landlock_required: layers.get(Layer::Landlock) == Requirement::Required,
            seccomp: self.seccomp.clone(),
            pass_fds: pass_fds
                .iter()
                .map(|(t, fd)| (*t, fd.as_raw_fd()))
                .collect(),
        };
        let io = supervisor::Stdio {
            stdin: stdin.as_ref().map(|f| f.as_fd()),
            stdout: stdout.as_ref().map(|f| f.as_fd()),
            stderr: output.map(|f| f.as_fd()),
            pass: pass_fds.iter().map(|(_, f)| f.as_fd()).collect(),
            mounts: mount_fds.iter().map(|f| f.as_fd()).collect(),
        };

        trace::mark("sandbox: mounts planned");
        let start = Instant::now();
        let pending = match spawn_init(
            &cfg,
            ns_flags as u64,
            self.host_uid,
            self.host_gid,
            match (join_later, self.cgroup.ready()) {
                (true, _) => supervisor::CgroupJoin::V1Later,
                (false, Some(cg)) => supervisor::CgroupJoin::Made(cg),
                (false, None) => supervisor::CgroupJoin::None,
            },
            &io,
        ) {
            Ok(p) => p,
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
        if join_later {
            // Required: made, or the layer's error (exit 69); either way before the init is
            // let go (an error drops the pending init, which kills it).
            self.ensure_cgroup()?;
            self.begin_cgroup_run();
            if self.cgroup.ready().is_none() {
                return Err(SandboxError::Setup {
                    stage: "cgroup".into(),
                    message: "the required cgroup layer was not made".into(),
                });
            }
        }
        let mut child = pending.release(
            self.cgroup.ready(),
            &door_addrs,
            ns_flags & libc::CLONE_NEWNET != 0,
        )?;
        // The init holds its copies now: ours go, so the far ends see EOF when it ends.
        drop(io);
        drop((stdin, stdout, pass_fds, mount_fds));
        // The init is our child and not yet reaped: its pid names it while it is read.
        let init = crate::rundir::ProcessIdentity::of(child.pid);
        self.rundir().write_meta(Some(child.pid), init);
        isolation.userns = true;
        isolation.pidns = true;
        isolation.mountns = true;
        isolation.netns = ns_flags & libc::CLONE_NEWNET != 0;
        isolation.ipcns = ns_flags & libc::CLONE_NEWIPC != 0;
        isolation.utsns = ns_flags & libc::CLONE_NEWUTS != 0;
        isolation.cgroupns = cgroupns;
        isolation.seccomp = self.seccomp.as_ref().map(|s| s.name.clone());
        isolation.cgroup = self.cgroup.ready().map(|c| match c.version() {
            cgroup::CgroupVersion::V1 => "v1".to_string(),
            cgroup::CgroupVersion::V2 => "v2".to_string(),
        });
        isolation.disk = self.disk_mounted.then(|| "tmpfs".to_string());

        trace::mark("sandbox: init released");
        let mut watchdog = Watchdog::new(spec.limits.clone());
        let disk_path = self.disk_mounted.then(|| self.disk());
        let listeners = std::mem::take(&mut child.listeners);
        let netlink = child.netlink.take();
        let mut status = StatusReader::default();
        let (exit, ended) = supervise(
            &child,
            doors,
            listeners,
            self.cgroup.ready(),
            disk_path.as_deref(),
            &mut watchdog,
            start,
            cancel.as_deref(),
            &mut status,
            netlink,
        )?;
        trace::mark("sandbox: init reaped");
        // Whatever the command left where fork's own directories go is never followed by
        // what reads the disk next (results, the protected tree, a rerun): see `disk`.
        self.unlink_planted();
        let (budget, interrupted, cancelled) = (ended.budget, ended.interrupted, ended.cancelled);
        // The status pipe: the command's landlock status, setup errors, the real exit status.
        let msgs = status.finish(child.status);
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
        // (`supervise` took the final sample once the init was reaped.)
        let usage = watchdog.usage().clone();
        // A setup error inside the sandbox is an error, not a result of the command.
        if budget.is_none() && !interrupted && !cancelled {
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
        if !(budget.is_some() || interrupted || cancelled) && msgs.is_empty() {
            if let Some(e) = pre_exec_failure(exit) {
                return Err(e);
            }
        }
        let (exit_code, signal) = match (budget.is_some() || interrupted || cancelled, exited) {
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
            cancelled,
            exec_error,
        })
    }
}

/// The init's child side ended before it executed `fork-init` (`sys::clone_init`'s
/// exit codes 122 to 124, which neither the init nor, through it, the command ever
/// exits with unreported): a setup error naming the step, not a result of the command.
fn pre_exec_failure(exit: InitExit) -> Option<SandboxError> {
    let step = match exit {
        InitExit::Code(122) => "joining its cgroups (or a go message it refused)",
        InitExit::Code(123) => "taking its standard input and output",
        InitExit::Code(124) => "becoming root of its user namespace",
        _ => return None,
    };
    Some(SandboxError::Setup {
        stage: "init".into(),
        message: format!("the sandbox init ended before it ran, at {step}: nothing ran"),
    })
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

#[cfg(test)]
mod tests {
    use super::reclaim::unescape_mountinfo;
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

    /// The child side's own exit codes, said by no message, are setup errors; any other
    /// end (a command's code the init failed to report, a signal) is not taken for one.
    #[test]
    fn an_init_that_ended_before_its_exec_is_a_setup_error() {
        for code in [122, 123, 124] {
            let e = pre_exec_failure(InitExit::Code(code)).expect("a setup error");
            assert!(e.to_string().contains("nothing ran"), "{code}: {e}");
        }
        assert!(pre_exec_failure(InitExit::Code(122))
            .unwrap()
            .to_string()
            .contains("cgroups"));
        for exit in [InitExit::Code(0), InitExit::Code(125), InitExit::Signal(9)] {
            assert!(pre_exec_failure(exit).is_none(), "{exit:?}");
        }
    }
}
