//! The sandbox init: `fork-init __sandbox-init CFG_FD STATUS_FD`, pid 1 of the new
//! pid namespace, started by the supervisor with an empty environment (so nothing of the
//! supervisor's environment can be read from /proc/1/environ).
//!
//! It enters the cgroup namespace (the supervisor has already moved it into the sandbox
//! cgroup), builds the root and pivots into it (lowering its user namespace's limits on
//! the way, [`super::userns_limits`]), names the host, brings loopback up, then
//! forks the command. The command lowers its resource limits ([`super::rlimits`]), drops
//! every capability and sets no_new_privs ([`super::caps`]), restricts itself with Landlock, installs the seccomp filters and
//! execs. Namespace steps are in [`super::namespaces`], raw system calls in `sys`. The init reaps every
//! orphan, forwards SIGTERM/SIGINT/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 to the command's process
//! group, and when the command ends reports its status on the status pipe and exits:
//! the kernel then kills everything left in the namespace.

use super::{namespaces, sys, InitConfig, InitMsg, Layer};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{ForkResult, Pid};
use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

const FORWARDED: [Signal; 6] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

struct Status(std::fs::File);

impl Status {
    fn send(&mut self, m: &InitMsg) {
        if let Ok(mut line) = serde_json::to_vec(m) {
            line.push(b'\n');
            let _ = self.0.write_all(&line);
        }
    }
    fn error(&mut self, stage: &str, message: String) {
        self.send(&setup_error(stage, message));
    }
}

/// The two descriptors numbered on the command line, each if it is open, above stderr,
/// and not the other one.
fn adopt_fds(a: Option<&String>, b: Option<&String>) -> (Option<OwnedFd>, Option<OwnedFd>) {
    let parse = |s: Option<&String>| s.and_then(|s| s.parse::<RawFd>().ok());
    match (parse(a), parse(b)) {
        (Some(a), Some(b)) if a != b => (sys::adopt_inherited_fd(a), sys::adopt_inherited_fd(b)),
        _ => (None, None),
    }
}

/// The init's own exit codes, as a shell reports them (the command's own status passes
/// through unchanged; killed by signal N it is 128+N).
pub mod code {
    /// The init role was started by hand, not by fork.
    pub const NOT_BY_FORK: i32 = 64;
    /// The sandbox could not be built (config, mounts, namespaces, signals).
    pub const SETUP_FAILED: i32 = 125;
    /// The command was found but could not be started (cwd, privileges, Landlock,
    /// seccomp, exec).
    pub const CANNOT_EXECUTE: i32 = 126;
    /// The command was not found in the sandbox.
    pub const NOT_FOUND: i32 = 127;
    /// Killed by a signal: 128 + its number.
    pub const SIGNALED_BASE: i32 = 128;
}

/// Entry point of the init role. Returns the process exit code.
pub fn main(args: &[String]) -> i32 {
    // The supervisor passed these two descriptors, open and ours alone.
    let (Some(cfg_owned), Some(status_owned)) = adopt_fds(args.first(), args.get(1)) else {
        eprintln!(
            "fork: {} is internal: fork runs it itself",
            super::INIT_ROLE
        );
        return code::NOT_BY_FORK;
    };
    let mut status = Status(std::fs::File::from(status_owned));
    let _ = nix::fcntl::fcntl(
        &status.0,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    );
    let mut raw = Vec::new();
    if let Err(e) = std::fs::File::from(cfg_owned).read_to_end(&mut raw) {
        status.error("config", format!("reading the init config: {e}"));
        return code::SETUP_FAILED;
    }
    let cfg: InitConfig = match serde_json::from_slice(&raw) {
        Ok(c) => c,
        Err(e) => {
            status.error("config", format!("parsing the init config: {e}"));
            return code::SETUP_FAILED;
        }
    };
    if let Err(e) = setup(&cfg) {
        status.send(&e);
        return code::SETUP_FAILED;
    }
    run_command(&cfg, &mut status)
}

/// A setup error as the status pipe carries it.
fn setup_error(stage: &str, message: String) -> InitMsg {
    InitMsg::Error {
        stage: stage.to_string(),
        message,
        layer: None,
        fix: None,
    }
}

/// Builds the sandbox around the init. On failure: the error for the status pipe (naming
/// the layer and its fix when a layer is what is missing).
fn setup(cfg: &InitConfig) -> Result<(), InitMsg> {
    if cfg.cgroupns {
        namespaces::enter_cgroupns().map_err(|e| setup_error("cgroupns", e))?;
    }
    super::mounts::build_and_pivot(&cfg.newroot, cfg.scratch, &cfg.mounts).map_err(|e| {
        match e {
            // Without its own limits the sandbox could take host root's per-user counts.
            super::mounts::MountError::UserLimits(_) => InitMsg::Error {
                stage: "userns".into(),
                message: e.to_string(),
                layer: Some(Layer::Userns),
                fix: Some(super::userns_limits::FIX.into()),
            },
            e => setup_error("mounts", e.to_string()),
        }
    })?;
    if let Some(h) = &cfg.hostname {
        namespaces::set_hostname(h).map_err(|e| setup_error("utsns", e))?;
    }
    if cfg.netns {
        super::net::loopback_up().map_err(|e| setup_error("netns", e.to_string()))?;
    }
    Ok(())
}

fn run_command(cfg: &InitConfig, status: &mut Status) -> i32 {
    // Forwarded signals and SIGCHLD are blocked and read from a signalfd. A real (no-op)
    // handler keeps them from being dropped: pid 1 ignores signals left at SIG_DFL.
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    for s in FORWARDED {
        mask.add(s);
        let _ = sys::catch_with_noop(s);
    }
    if let Err(e) = mask.thread_block() {
        status.error("signals", format!("sigprocmask: {e}"));
        return code::SETUP_FAILED;
    }
    let mut sfd = match nix::sys::signalfd::SignalFd::with_flags(
        &mask,
        nix::sys::signalfd::SfdFlags::SFD_CLOEXEC,
    ) {
        Ok(s) => s,
        Err(e) => {
            status.error("signals", format!("signalfd: {e}"));
            return code::SETUP_FAILED;
        }
    };
    // Everything the command needs is prepared before the fork.
    let program = match resolve(&cfg.argv[0], &cfg.env) {
        Some(p) => p,
        None => {
            status.error(
                "exec",
                format!("{}: command not found in the sandbox", cfg.argv[0]),
            );
            return code::NOT_FOUND;
        }
    };
    let argv: Vec<CString> = cfg
        .argv
        .iter()
        .filter_map(|a| CString::new(a.as_bytes()).ok())
        .collect();
    let envp: Vec<CString> = cfg
        .env
        .iter()
        .filter_map(|(k, v)| CString::new(format!("{k}={v}")).ok())
        .collect();
    let landlock = match &cfg.landlock {
        Some(spec) => match super::landlock::prepare(spec) {
            Ok(p) => Some(p),
            Err(e) => {
                status.send(&InitMsg::Error {
                    stage: "landlock".into(),
                    message: e.to_string(),
                    layer: cfg.landlock_required.then_some(Layer::Landlock),
                    fix: cfg.landlock_required.then(|| {
                        "a kernel with Landlock enabled, or [layers] landlock = \"optional\""
                            .to_string()
                    }),
                });
                if cfg.landlock_required {
                    return code::SETUP_FAILED;
                }
                None
            }
        },
        None => None,
    };

    // The init is single-threaded, so the child may use the allocator freely.
    let child = match sys::fork_single_threaded() {
        Ok(ForkResult::Child) => {
            let code = command_child(cfg, status, &mask, landlock, &program, &argv, &envp);
            // Leave without running the init's destructors or atexit handlers.
            sys::exit_now(code)
        }
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => {
            status.error("fork", format!("fork: {e}"));
            return code::SETUP_FAILED;
        }
    };
    supervise_command(child, &mut sfd, status)
}

/// The command's side: privileges off, Landlock, seccomp, exec. Returns only on failure.
fn command_child(
    cfg: &InitConfig,
    status: &mut Status,
    mask: &SigSet,
    landlock: Option<super::landlock::Prepared>,
    program: &CString,
    argv: &[CString],
    envp: &[CString],
) -> i32 {
    let _ = mask.thread_unblock();
    // The Rust runtime ignores SIGPIPE, and an ignored signal stays ignored across exec:
    // give the command the default disposition, as std::process::Command does.
    super::signals::default_sigpipe();
    let _ = nix::unistd::setsid();
    if let Err(e) = std::env::set_current_dir(&cfg.cwd) {
        status.error("exec", format!("chdir {}: {e}", cfg.cwd.display()));
        return code::CANNOT_EXECUTE;
    }
    if let Err(e) = super::rlimits::apply() {
        status.error("rlimits", e);
        return code::CANNOT_EXECUTE;
    }
    if let Err(e) = super::caps::drop_privileges() {
        status.error("capabilities", e);
        return code::CANNOT_EXECUTE;
    }
    if let Some(l) = landlock {
        match l.restrict_self() {
            Ok(st) => {
                let enforced = st.enforced == super::landlock::Enforcement::FullyEnforced;
                let partial = st.enforced == super::landlock::Enforcement::PartiallyEnforced;
                status.send(&InitMsg::Landlock { status: st });
                if cfg.landlock_required && !(enforced || partial) {
                    status.send(&InitMsg::Error {
                        stage: "landlock".into(),
                        message: "the kernel did not enforce the Landlock ruleset".into(),
                        layer: Some(Layer::Landlock),
                        fix: Some(
                            "a kernel with Landlock in its LSM list (lsm=...,landlock)".into(),
                        ),
                    });
                    return code::CANNOT_EXECUTE;
                }
            }
            Err(e) => {
                status.send(&InitMsg::Error {
                    stage: "landlock".into(),
                    message: e.to_string(),
                    layer: cfg.landlock_required.then_some(Layer::Landlock),
                    fix: cfg
                        .landlock_required
                        .then(|| "a kernel with Landlock enabled".to_string()),
                });
                if cfg.landlock_required {
                    return code::CANNOT_EXECUTE;
                }
            }
        }
    }
    // Passed descriptors go to their numbers (the status pipe first moves out of the way);
    // then every descriptor above stderr but those and the status pipe (close-on-exec) is
    // closed, now that Landlock no longer needs its ruleset fd; only exec or _exit follow.
    let mut keep: Vec<RawFd> = cfg.pass_fds.iter().map(|(t, _)| *t).collect();
    if !cfg.pass_fds.is_empty() {
        let floor = keep.iter().copied().max().unwrap_or(2) + 1;
        match sys::dup_above(status.0.as_fd(), floor) {
            Ok(fd) => status.0 = std::fs::File::from(fd),
            Err(e) => {
                status.error("exec", format!("moving the status pipe: {e}"));
                return code::CANNOT_EXECUTE;
            }
        }
        if !sys::place_fds(&cfg.pass_fds) {
            status.error("exec", "placing the passed descriptors failed".to_string());
            return code::CANNOT_EXECUTE;
        }
    }
    keep.push(status.0.as_raw_fd());
    sys::close_fds_except(&keep);
    if let Some(sc) = &cfg.seccomp {
        if let Err(e) = sc.install() {
            status.send(&InitMsg::Error {
                stage: "seccomp".into(),
                message: e.to_string(),
                layer: Some(Layer::Seccomp),
                fix: Some("a kernel with CONFIG_SECCOMP_FILTER".into()),
            });
            return code::CANNOT_EXECUTE;
        }
    }
    let e = nix::unistd::execve(program, argv, envp).err();
    status.error(
        "exec",
        format!(
            "exec {}: {}",
            program.to_string_lossy(),
            e.map(|e| e.to_string()).unwrap_or_default()
        ),
    );
    126
}

/// Finds the program in the sandbox's PATH (the command's environment, not ours).
fn resolve(prog: &str, env: &[(String, String)]) -> Option<CString> {
    if prog.contains('/') {
        return CString::new(prog).ok();
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or(super::SANDBOX_PATH);
    for dir in path.split(':').filter(|d| !d.is_empty()) {
        let cand: PathBuf = Path::new(dir).join(prog);
        if let Ok(md) = std::fs::metadata(&cand) {
            use std::os::unix::fs::PermissionsExt;
            if md.is_file() && md.permissions().mode() & 0o111 != 0 {
                return CString::new(cand.as_os_str().as_encoded_bytes()).ok();
            }
        }
    }
    None
}

fn supervise_command(
    child: Pid,
    sfd: &mut nix::sys::signalfd::SignalFd,
    status: &mut Status,
) -> i32 {
    loop {
        let info = match sfd.read_signal() {
            Ok(Some(i)) => i,
            Ok(None) => continue,
            Err(nix::Error::EINTR) => continue,
            Err(e) => {
                status.error("init", format!("reading signals: {e}"));
                return code::SETUP_FAILED;
            }
        };
        let signo = info.ssi_signo as i32;
        if signo == libc::SIGCHLD {
            // Reap every child that has ended, orphans included.
            loop {
                match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::Exited(pid, code)) if pid == child => {
                        status.send(&InitMsg::Exited {
                            code: Some(code),
                            signal: None,
                        });
                        return code;
                    }
                    Ok(WaitStatus::Signaled(pid, sig, _)) if pid == child => {
                        status.send(&InitMsg::Exited {
                            code: None,
                            signal: Some(sig as i32),
                        });
                        return code::SIGNALED_BASE + sig as i32;
                    }
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(_) => continue,
                }
            }
        } else if let Ok(sig) = Signal::try_from(signo) {
            // Forward to the command's process group (it is a session leader), then to it.
            let _ = nix::sys::signal::kill(Pid::from_raw(-child.as_raw()), sig);
            let _ = nix::sys::signal::kill(child, sig);
        }
    }
}
