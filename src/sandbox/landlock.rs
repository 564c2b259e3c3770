//! Landlock: the filesystem, TCP and scoping layer of the sandbox.
//!
//! The supervisor calls [`prepare`] **before** forking: it probes the kernel's Landlock ABI,
//! creates the ruleset, opens every path of the [`LandlockSpec`] (`O_PATH`) and adds one rule per
//! path and per TCP port. The forked child then calls [`Prepared::restrict_self`] right before
//! `execve`; that call only issues `landlock_restrict_self()` (no_new_privs is already set),
//! allocates nothing and moves out a status computed before the fork.
//!
//! # Which rights each list grants
//!
//! The ruleset *handles* every filesystem right of the best ABI that both the kernel and the
//! `landlock` crate know (`AccessFs::from_all(abi)`): whatever is not granted below is denied.
//!
//! | list | rights granted beneath each path |
//! |---|---|
//! | `read_exec` | `execute`, `read_file`, `read_dir` |
//! | `read_write` | every handled right **except** `make_char`, `make_block` and `ioctl_dev` |
//! | `devices` | `read_file`, `write_file`, `ioctl_dev` (+ `read_dir` on a directory such as `/dev/pts`) |
//!
//! Decisions, and why:
//! - **refer** (ABI 2, cross-directory rename/link) is granted only beneath `read_write`. Landlock
//!   refuses a rename or link that would give the file more rights at its destination than at its
//!   source, and every `read_write` root has the same rights, so `mv` between the workspace and
//!   `/tmp` works while nothing can be moved out of a `read_exec` tree or into one.
//! - **truncate** (ABI 3) is granted beneath `read_write` only; `read_exec` files can never be
//!   truncated. Devices do not need it: the kernel ignores `O_TRUNC` on non-regular files, so
//!   `> /dev/null` works with `write_file` alone.
//! - **ioctl_dev** (ABI 5) is granted only on the listed `devices` (terminal ioctls on
//!   `/dev/tty` and `/dev/pts/*`), never beneath `read_write` nor `read_exec`.
//! - **make_char / make_block** are never granted: a successor that is real root (for instance
//!   when the user namespace layer is degraded) could otherwise `mknod` a raw disk node in `/tmp`
//!   and write through it. This is the one deviation from "every access beneath `read_write`".
//! - **resolve_unix** (ABI 9, connecting to pathname UNIX sockets) is handled when the kernel has
//!   it and granted only beneath `read_write`: host sockets such as `/run/docker.sock` stay
//!   unreachable even when `/` is in `read_exec`.
//! - A path that is a regular file (or device) rather than a directory gets only the rights that
//!   apply to files; a path that does not exist is skipped and listed in
//!   [`LandlockStatus::skipped_paths`]. Symbolic links in the spec are followed when the rule is
//!   built (the rule applies to the target); symbolic links *inside* a tree cannot widen access,
//!   because Landlock checks the resolved file.
//! - TCP: `tcp_bind` / `tcp_connect` of `None` leave that operation unhandled; `Some(ports)`
//!   allows exactly those ports (`Some(vec![])` denies all). Binding port 0 (an ephemeral port) is
//!   allowed only when 0 is listed.
//!
//! # Honest status
//!
//! Compatibility is best-effort so that older kernels still get what they support, and the
//! status says what was lost. What the policy *requires* is the filesystem rights of ABI 5
//! (everything up to `ioctl_dev`), TCP restriction (ABI 4) when a `tcp_*` list is given, and
//! scoping (ABI 6) when a `scope_*` flag is set. [`Enforcement::FullyEnforced`] means all of it
//! is in force; [`Enforcement::PartiallyEnforced`] means the kernel lacks part of it (the
//! booleans `fs`, `net`, `scope` say which layer is in force). Rights newer than the requirement
//! (`resolve_unix`) are defence in depth and do not lower the status when missing.
//!
//! Landlock unavailability is an error of [`prepare`] ([`LandlockError::Unavailable`]), so a
//! caller fails closed unless it deliberately catches that variant. And a ruleset that the kernel
//! reports as *not enforced* while the ABI probe found Landlock is always an error
//! ([`LandlockError::NotEnforced`]), never a status: rules silently dropped (the failure behind
//! hakoniwa #164) cannot go unnoticed. Each rule is added with the crate's hard-requirement
//! level, after masking its rights to the handled set, so the crate cannot drop one quietly either.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

/// The newest ABI the `landlock` crate (0.4.7) has definitions for.
const NEWEST_KNOWN_ABI: u32 = 9;

/// The first ABI with every filesystem right the policy depends on (up to `ioctl_dev`).
const REQUIRED_FS_ABI: ABI = ABI::V5;
/// The first ABI with TCP bind/connect restriction.
const NET_ABI: u32 = 4;
/// The first ABI with signal and abstract-UNIX-socket scoping.
const SCOPE_ABI: u32 = 6;

/// What the successor may touch, as Landlock rules.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct LandlockSpec {
    /// Read files, read directories and execute, beneath these.
    pub read_exec: Vec<PathBuf>,
    /// Every filesystem access beneath these (the workspace, `/tmp`, `/dev/shm`), except device
    /// node creation and device ioctls (see the module documentation).
    pub read_write: Vec<PathBuf>,
    /// Read + write (+ ioctl where the ABI has it) on these files: `/dev/null`,
    /// `/dev/zero`, `/dev/full`, `/dev/random`, `/dev/urandom`, `/dev/tty`, `/dev/ptmx`,
    /// `/dev/pts`.
    pub devices: Vec<PathBuf>,
    /// `None`: bind not restricted; `Some(ports)`: only these ports (ABI >= 4).
    pub tcp_bind: Option<Vec<u16>>,
    /// `None`: connect not restricted; `Some(ports)`: only these ports (ABI >= 4).
    pub tcp_connect: Option<Vec<u16>>,
    /// ABI >= 6: no signals to processes outside the Landlock domain.
    pub scope_signals: bool,
    /// ABI >= 6: no connections to abstract UNIX sockets created outside the domain.
    pub scope_abstract_unix: bool,
}

/// How much of what the spec asked for the kernel enforces.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Enforcement {
    /// Everything the spec requires is in force.
    FullyEnforced,
    /// Landlock is in force but the kernel lacks part of what the spec requires.
    PartiallyEnforced,
    /// Nothing is enforced. [`Prepared::restrict_self`] never returns this (it is an error
    /// there); it exists for callers that record a degraded, Landlock-less run.
    NotEnforced,
}

/// What Landlock really enforces for one sandbox.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct LandlockStatus {
    /// The ABI the ruleset was built for: the kernel's, capped at the newest the `landlock`
    /// crate knows.
    pub abi: u32,
    /// Requested versus enforced (see the module documentation).
    pub enforced: Enforcement,
    /// Filesystem rules in force, with every right the policy requires (ABI >= 5).
    pub fs: bool,
    /// TCP bind/connect restriction in force (false when not requested or ABI < 4).
    pub net: bool,
    /// Every requested scope in force (false when none requested or ABI < 6).
    pub scope: bool,
    /// Paths of the spec that did not exist and got no rule.
    pub skipped_paths: Vec<PathBuf>,
}

/// Why Landlock cannot be used on this host, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, thiserror::Error)]
#[error("Landlock is unavailable: {reason}; fix: {fix}")]
pub struct LandlockUnavailable {
    /// What the kernel said.
    pub reason: String,
    /// How to get Landlock on this host.
    pub fix: String,
}

/// Errors of this layer.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    /// The kernel offers no Landlock at all.
    #[error(transparent)]
    Unavailable(#[from] LandlockUnavailable),
    /// A path in the spec is relative.
    #[error("landlock: {field} entry {path:?} is not an absolute path; fix: use absolute paths in the policy's filesystem lists")]
    RelativePath {
        /// The spec field (`read_exec`, `read_write`, `devices`).
        field: &'static str,
        /// The offending path.
        path: PathBuf,
    },
    /// A path exists but could not be opened or inspected.
    #[error("landlock: cannot open {field} path {path:?} (open O_PATH / fstat): {source}; fix: make it accessible to the supervisor or remove it from the policy")]
    OpenPath {
        /// The spec field.
        field: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Building the ruleset failed (create, handle, add_rule).
    #[error("landlock: {op} failed: {source}")]
    Ruleset {
        /// The operation, naming the path or port involved.
        op: String,
        /// The crate's error.
        source: landlock::RulesetError,
    },
    /// `prctl(PR_SET_NO_NEW_PRIVS)` or `landlock_restrict_self()` failed in the child.
    #[error("landlock: prctl(PR_SET_NO_NEW_PRIVS) or landlock_restrict_self() failed in the sandbox child: {}", io::Error::from_raw_os_error(*errno))]
    RestrictSelf {
        /// The errno of the failed call.
        errno: i32,
    },
    /// The kernel has Landlock but enforced nothing: a ruleset silently dropped.
    #[error("landlock: the kernel offers Landlock ABI {abi} but landlock_restrict_self() reported the ruleset as NOT enforced; refusing to run the successor unconfined (this is a bug in fork or the landlock crate, not a host limitation)")]
    NotEnforced {
        /// The ABI the ruleset was built for.
        abi: u32,
    },
}

impl LandlockError {
    /// An errno for this error, for a `pre_exec` hook that must return an `io::Error` without
    /// allocating (`io::Error::from_raw_os_error(e.errno())`).
    pub fn errno(&self) -> i32 {
        match self {
            LandlockError::RestrictSelf { errno } => *errno,
            LandlockError::OpenPath { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            LandlockError::Unavailable(_) => libc::ENOSYS,
            LandlockError::NotEnforced { .. } => libc::EPERM,
            LandlockError::RelativePath { .. } | LandlockError::Ruleset { .. } => libc::EINVAL,
        }
    }
}

/// The best Landlock ABI this kernel offers (the raw version number, which may be newer than
/// what the `landlock` crate knows), or why there is none.
pub fn best_abi() -> Result<u32, LandlockUnavailable> {
    let errno = match super::sys::landlock_abi_version() {
        Ok(v) if v >= 1 => return Ok(u32::try_from(v).unwrap_or(u32::MAX)),
        Ok(_) => 0,
        Err(e) => e as i32,
    };
    let lsm = std::fs::read_to_string("/sys/kernel/security/lsm").ok();
    Err(unavailable_for(errno, lsm.as_deref()))
}

/// The reason and fix for a failed ABI probe (pure, for tests).
fn unavailable_for(errno: i32, lsm_list: Option<&str>) -> LandlockUnavailable {
    match errno {
        libc::ENOSYS => LandlockUnavailable {
            reason: "landlock_create_ruleset() returned ENOSYS: this kernel was built without \
                     Landlock (CONFIG_SECURITY_LANDLOCK)"
                .into(),
            fix: "run a kernel >= 5.13 built with CONFIG_SECURITY_LANDLOCK=y (and landlock in \
                  CONFIG_LSM); >= 6.7 for TCP rules, >= 6.12 for scoping"
                .into(),
        },
        libc::EOPNOTSUPP => {
            let fix = match lsm_list.map(str::trim).filter(|l| !l.is_empty()) {
                Some(list) => format!(
                    "Landlock is built in but not enabled: boot with lsm=landlock,{list} (the \
                     current list, from /sys/kernel/security/lsm, with landlock added first)"
                ),
                None => "Landlock is built in but not enabled: add landlock to the kernel's lsm= \
                         boot parameter, keeping the current list (see /sys/kernel/security/lsm \
                         once securityfs is mounted, or CONFIG_LSM in the kernel config), e.g. \
                         lsm=landlock,lockdown,yama,integrity,apparmor,bpf"
                    .into(),
            };
            LandlockUnavailable {
                reason: "landlock_create_ruleset() returned EOPNOTSUPP: Landlock is not in the \
                         kernel's active LSM list"
                    .into(),
                fix,
            }
        }
        0 => LandlockUnavailable {
            reason: "landlock_create_ruleset() returned ABI version 0".into(),
            fix: "run a kernel >= 5.13 with Landlock enabled".into(),
        },
        e => LandlockUnavailable {
            reason: format!(
                "landlock_create_ruleset() failed: {}",
                io::Error::from_raw_os_error(e)
            ),
            fix: "check whether a seccomp filter or the container runtime blocks the \
                  landlock_* system calls, and allow them"
                .into(),
        },
    }
}

/// A ruleset fully built before the fork; only [`Prepared::restrict_self`] remains.
#[derive(Debug)]
pub struct Prepared {
    ruleset: RulesetCreated,
    status: LandlockStatus,
}

/// Which list of the spec a path comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PathKind {
    ReadExec,
    ReadWrite,
    Device,
}

impl PathKind {
    fn field(self) -> &'static str {
        match self {
            PathKind::ReadExec => "read_exec",
            PathKind::ReadWrite => "read_write",
            PathKind::Device => "devices",
        }
    }
}

/// The rights granted beneath one path of `kind` under `abi` (pure, for tests).
fn rights_for(kind: PathKind, abi: ABI, is_dir: bool) -> BitFlags<AccessFs> {
    let all = AccessFs::from_all(abi);
    let wanted = match kind {
        PathKind::ReadExec => AccessFs::Execute | AccessFs::ReadFile | AccessFs::ReadDir,
        PathKind::ReadWrite => {
            all & !(AccessFs::MakeChar | AccessFs::MakeBlock | AccessFs::IoctlDev)
        }
        PathKind::Device => {
            let base = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev;
            if is_dir {
                base | AccessFs::ReadDir
            } else {
                base
            }
        }
    };
    let rights = wanted & all;
    if is_dir {
        rights
    } else {
        rights & AccessFs::from_file(abi)
    }
}

/// The status a ruleset built for `kernel_abi` will have (pure, for tests).
fn predict_status(kernel_abi: u32, spec: &LandlockSpec, skipped: Vec<PathBuf>) -> LandlockStatus {
    let abi = kernel_abi.min(NEWEST_KNOWN_ABI);
    let crate_abi = ABI::from(i32::try_from(abi).unwrap_or(i32::MAX));
    let required_fs = AccessFs::from_all(REQUIRED_FS_ABI);
    let fs = AccessFs::from_all(crate_abi).contains(required_fs);
    let net_requested = spec.tcp_bind.is_some() || spec.tcp_connect.is_some();
    let net = net_requested && abi >= NET_ABI;
    let scope_requested = spec.scope_signals || spec.scope_abstract_unix;
    let scope = scope_requested && abi >= SCOPE_ABI;
    let full = fs && (net || !net_requested) && (scope || !scope_requested);
    LandlockStatus {
        abi,
        enforced: if full {
            Enforcement::FullyEnforced
        } else {
            Enforcement::PartiallyEnforced
        },
        fs,
        net,
        scope,
        skipped_paths: skipped,
    }
}

/// Opens `path` with `O_PATH`; `Ok(None)` when it does not exist.
fn open_path(kind: PathKind, path: &Path) -> Result<Option<(OwnedFd, bool)>, LandlockError> {
    if !path.is_absolute() {
        return Err(LandlockError::RelativePath {
            field: kind.field(),
            path: path.to_path_buf(),
        });
    }
    let fd = match nix::fcntl::open(
        path,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(e) => {
            return Err(LandlockError::OpenPath {
                field: kind.field(),
                path: path.to_path_buf(),
                source: io::Error::from_raw_os_error(e as i32),
            })
        }
    };
    let st = nix::sys::stat::fstat(&fd).map_err(|e| LandlockError::OpenPath {
        field: kind.field(),
        path: path.to_path_buf(),
        source: io::Error::from_raw_os_error(e as i32),
    })?;
    let is_dir = (st.st_mode & libc::S_IFMT) == libc::S_IFDIR;
    Ok(Some((fd, is_dir)))
}

fn ruleset_err(op: impl Into<String>) -> impl FnOnce(landlock::RulesetError) -> LandlockError {
    let op = op.into();
    move |source| LandlockError::Ruleset { op, source }
}

/// Builds everything before the fork: probes the ABI, creates the ruleset, opens every path and
/// adds every rule. Fails with [`LandlockError::Unavailable`] when the kernel has no Landlock.
pub fn prepare(spec: &LandlockSpec) -> Result<Prepared, LandlockError> {
    let kernel_abi = best_abi()?;
    let abi_num = kernel_abi.min(NEWEST_KNOWN_ABI);
    let abi = ABI::from(i32::try_from(abi_num).unwrap_or(i32::MAX));

    let handled_fs = AccessFs::from_all(abi);
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(handled_fs)
        .map_err(ruleset_err("landlock ruleset: handle filesystem rights"))?;

    let mut handled_net: BitFlags<AccessNet> = BitFlags::EMPTY;
    if spec.tcp_bind.is_some() {
        handled_net |= AccessNet::BindTcp;
    }
    if spec.tcp_connect.is_some() {
        handled_net |= AccessNet::ConnectTcp;
    }
    if !handled_net.is_empty() {
        // Best effort: on ABI < 4 the crate drops this and marks the ruleset partial, which the
        // status reports as `net: false`.
        ruleset = ruleset
            .handle_access(handled_net)
            .map_err(ruleset_err("landlock ruleset: handle TCP bind/connect"))?;
    }
    let mut scopes: BitFlags<Scope> = BitFlags::EMPTY;
    if spec.scope_signals {
        scopes |= Scope::Signal;
    }
    if spec.scope_abstract_unix {
        scopes |= Scope::AbstractUnixSocket;
    }
    if !scopes.is_empty() {
        ruleset = ruleset.scope(scopes).map_err(ruleset_err(
            "landlock ruleset: scope signals/abstract UNIX sockets",
        ))?;
    }
    let mut created = ruleset
        .create()
        .map_err(ruleset_err("landlock_create_ruleset()"))?;

    let mut skipped = Vec::new();
    let lists = [
        (PathKind::ReadExec, &spec.read_exec),
        (PathKind::ReadWrite, &spec.read_write),
        (PathKind::Device, &spec.devices),
    ];
    for (kind, paths) in lists {
        for path in paths.iter() {
            let Some((fd, is_dir)) = open_path(kind, path)? else {
                skipped.push(path.clone());
                continue;
            };
            let rights = rights_for(kind, abi, is_dir);
            if rights.is_empty() {
                // Cannot happen for ABI >= 1 (every kind includes read_file); refuse rather
                // than silently add nothing.
                return Err(LandlockError::OpenPath {
                    field: kind.field(),
                    path: path.clone(),
                    source: io::Error::from_raw_os_error(libc::EINVAL),
                });
            }
            let rule = PathBeneath::new(fd, rights).set_compatibility(CompatLevel::HardRequirement);
            created = created.add_rule(rule).map_err(ruleset_err(format!(
                "landlock_add_rule(path_beneath) for {} {}",
                kind.field(),
                path.display()
            )))?;
        }
    }

    if abi_num >= NET_ABI {
        let ports = [
            (AccessNet::BindTcp, "tcp_bind", &spec.tcp_bind),
            (AccessNet::ConnectTcp, "tcp_connect", &spec.tcp_connect),
        ];
        for (access, field, list) in ports {
            for &port in list.iter().flatten() {
                let rule =
                    NetPort::new(port, access).set_compatibility(CompatLevel::HardRequirement);
                created = created.add_rule(rule).map_err(ruleset_err(format!(
                    "landlock_add_rule(net_port) for {field} port {port}"
                )))?;
            }
        }
    }

    Ok(Prepared {
        ruleset: created,
        status: predict_status(kernel_abi, spec, skipped),
    })
}

impl Prepared {
    /// The status [`Prepared::restrict_self`] will return when the kernel agrees (known before
    /// the fork, for `fork check` and the verdict's isolation record).
    pub fn expected_status(&self) -> &LandlockStatus {
        &self.status
    }

    /// Runs in the forked child right before `execve`: `landlock_restrict_self()` only,
    /// with no allocation (the returned status was built before the fork and is moved out).
    /// The caller has set no_new_privs first ([`super::caps::drop_privileges`] does, and
    /// the kernel refuses the call to a process without it and without CAP_SYS_ADMIN), so
    /// the crate does not set it a second time. A ruleset the kernel reports as not
    /// enforced is [`LandlockError::NotEnforced`].
    pub fn restrict_self(self) -> Result<LandlockStatus, LandlockError> {
        let Prepared {
            ruleset,
            mut status,
        } = self;
        let restriction = ruleset.no_new_privs(false).restrict_self().map_err(|e| {
            LandlockError::RestrictSelf {
                errno: errno_in(&e),
            }
        })?;
        match restriction.ruleset {
            RulesetStatus::FullyEnforced => {}
            RulesetStatus::PartiallyEnforced => status.enforced = Enforcement::PartiallyEnforced,
            RulesetStatus::NotEnforced => {
                return Err(LandlockError::NotEnforced { abi: status.abi })
            }
        }
        Ok(status)
    }
}

/// The OS error inside a crate error, walking the source chain without allocating.
fn errno_in(e: &landlock::RulesetError) -> i32 {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            return io.raw_os_error().unwrap_or(libc::EIO);
        }
        cur = err.source();
    }
    libc::EIO
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::process::{Child, Command, ExitStatus, Stdio};
    use std::time::{Duration, Instant};

    /// The system paths a `sh` or `python3` child needs to start.
    fn system_read_exec() -> Vec<PathBuf> {
        ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"]
            .iter()
            .map(PathBuf::from)
            .collect()
    }

    fn base_spec(dir: &Path) -> LandlockSpec {
        let mut read_exec = system_read_exec();
        read_exec.push(dir.join("ro"));
        LandlockSpec {
            read_exec,
            read_write: vec![dir.join("rw")],
            devices: vec![PathBuf::from("/dev/null")],
            ..Default::default()
        }
    }

    fn fixture() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("ro")).unwrap();
        std::fs::create_dir(dir.path().join("rw")).unwrap();
        std::fs::create_dir(dir.path().join("outside")).unwrap();
        std::fs::write(dir.path().join("ro/hello.txt"), "hello from ro\n").unwrap();
        std::fs::write(dir.path().join("outside/secret.txt"), "secret\n").unwrap();
        dir
    }

    struct Outcome {
        status: ExitStatus,
        stdout: String,
        stderr: String,
        /// The status bytes the child wrote after restrict_self: abi, enforced, fs, net, scope.
        landlock: Vec<u8>,
    }

    fn enforcement_code(e: Enforcement) -> u8 {
        match e {
            Enforcement::FullyEnforced => 1,
            Enforcement::PartiallyEnforced => 2,
            Enforcement::NotEnforced => 3,
        }
    }

    fn wait_bounded(child: &mut Child, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                panic!("confined child did not finish within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Spawns `program args` with `prepared` applied in pre_exec; one process per case.
    fn run_confined(prepared: Prepared, program: &str, args: &[&str]) -> Outcome {
        let (rd, wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let mut slot = Some(prepared);
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // The hook runs in the forked child before execve: it only sets no_new_privs (as
        // the sandbox's command does before), calls restrict_self (landlock syscalls) and
        // write(2), and forgets the status so nothing is freed after the fork. It owns the
        // pipe's write end, closed here with `cmd`.
        super::super::sys::pre_exec(&mut cmd, move || {
            let Some(p) = slot.take() else {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            };
            nix::sys::prctl::set_no_new_privs()?;
            let st = p
                .restrict_self()
                .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
            let bytes = [
                u8::try_from(st.abi).unwrap_or(u8::MAX),
                enforcement_code(st.enforced),
                u8::from(st.fs),
                u8::from(st.net),
                u8::from(st.scope),
            ];
            let _ = nix::unistd::write(&wr, &bytes);
            std::mem::forget(st);
            Ok(())
        });
        let mut child = cmd.spawn().unwrap();
        drop(cmd);
        let mut landlock = Vec::new();
        std::fs::File::from(rd).read_to_end(&mut landlock).unwrap();
        let mut out = child.stdout.take().unwrap();
        let mut err = child.stderr.take().unwrap();
        let status = wait_bounded(&mut child, Duration::from_secs(30));
        let mut stdout = String::new();
        let mut stderr = String::new();
        out.read_to_string(&mut stdout).unwrap();
        err.read_to_string(&mut stderr).unwrap();
        Outcome {
            status,
            stdout,
            stderr,
            landlock,
        }
    }

    fn py(prepared: Prepared, code: &str) -> Outcome {
        run_confined(prepared, "python3", &["-c", code])
    }

    /// Python snippet: run `body` (which may raise OSError) and print "ok" or "err <errno>".
    fn py_errno(body: &str) -> String {
        format!("import socket,sys,os\ntry:\n    {body}\n    print('ok')\nexcept OSError as e:\n    print('err', e.errno)\n")
    }

    #[test]
    fn best_abi_reports_this_kernel() {
        let abi = best_abi().expect("this VM has Landlock");
        assert!(abi >= 6, "kernel 6.18 should offer ABI >= 6, got {abi}");
    }

    #[test]
    fn unavailable_messages_name_the_fix() {
        let enosys = unavailable_for(libc::ENOSYS, None);
        assert!(enosys.reason.contains("CONFIG_SECURITY_LANDLOCK"));
        assert!(enosys.fix.contains("5.13"));
        let eopnotsupp = unavailable_for(libc::EOPNOTSUPP, Some("lockdown,capability,yama\n"));
        assert!(eopnotsupp.reason.contains("LSM"));
        assert!(
            eopnotsupp
                .fix
                .contains("lsm=landlock,lockdown,capability,yama"),
            "{}",
            eopnotsupp.fix
        );
        let no_list = unavailable_for(libc::EOPNOTSUPP, None);
        assert!(no_list.fix.contains("lsm="));
        let other = unavailable_for(libc::EPERM, None);
        assert!(other.fix.contains("seccomp"));
    }

    #[test]
    fn rights_follow_the_documented_table() {
        let rw = rights_for(PathKind::ReadWrite, ABI::V7, true);
        assert!(rw.contains(AccessFs::Refer | AccessFs::Truncate | AccessFs::MakeReg));
        assert!(!rw.intersects(AccessFs::MakeChar | AccessFs::MakeBlock | AccessFs::IoctlDev));
        let ro = rights_for(PathKind::ReadExec, ABI::V7, true);
        assert_eq!(
            ro,
            AccessFs::Execute | AccessFs::ReadFile | AccessFs::ReadDir
        );
        let dev = rights_for(PathKind::Device, ABI::V7, false);
        assert_eq!(
            dev,
            AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev
        );
        // On ABI 2 ioctl_dev does not exist: it is masked, not requested.
        let pts = rights_for(PathKind::Device, ABI::V7, true);
        assert!(pts.contains(AccessFs::ReadDir) && !pts.contains(AccessFs::Truncate));
        let dev_v2 = rights_for(PathKind::Device, ABI::V2, false);
        assert_eq!(dev_v2, AccessFs::ReadFile | AccessFs::WriteFile);
        // A file under read_exec gets no directory-only right.
        let ro_file = rights_for(PathKind::ReadExec, ABI::V7, false);
        assert_eq!(ro_file, AccessFs::Execute | AccessFs::ReadFile);
        // ABI 9 adds resolve_unix beneath read_write only.
        assert!(rights_for(PathKind::ReadWrite, ABI::V9, true).contains(AccessFs::ResolveUnix));
        assert!(!rights_for(PathKind::ReadExec, ABI::V9, true).contains(AccessFs::ResolveUnix));
    }

    #[test]
    fn older_kernels_are_reported_partial() {
        let spec = LandlockSpec {
            tcp_connect: Some(vec![]),
            scope_signals: true,
            ..Default::default()
        };
        let v3 = predict_status(3, &spec, vec![]);
        assert_eq!(v3.enforced, Enforcement::PartiallyEnforced);
        assert!(!v3.fs && !v3.net && !v3.scope);
        let v5 = predict_status(5, &spec, vec![]);
        assert_eq!(v5.enforced, Enforcement::PartiallyEnforced);
        assert!(v5.fs && v5.net && !v5.scope);
        let v6 = predict_status(6, &spec, vec![]);
        assert_eq!(v6.enforced, Enforcement::FullyEnforced);
        let newer = predict_status(42, &LandlockSpec::default(), vec![]);
        assert_eq!(newer.abi, NEWEST_KNOWN_ABI);
        assert_eq!(newer.enforced, Enforcement::FullyEnforced);
        assert!(
            !newer.net && !newer.scope,
            "nothing requested, nothing claimed"
        );
    }

    #[test]
    fn relative_paths_are_refused() {
        let spec = LandlockSpec {
            read_exec: vec![PathBuf::from("usr")],
            ..Default::default()
        };
        let err = prepare(&spec).unwrap_err();
        assert!(matches!(
            err,
            LandlockError::RelativePath {
                field: "read_exec",
                ..
            }
        ));
    }

    #[test]
    fn status_is_fully_enforced_on_this_kernel_and_lists_skipped_paths() {
        let dir = fixture();
        let missing = dir.path().join("does-not-exist");
        let mut spec = base_spec(dir.path());
        spec.read_exec.push(missing.clone());
        spec.tcp_connect = Some(vec![]);
        spec.scope_signals = true;
        spec.scope_abstract_unix = true;
        let prepared = prepare(&spec).unwrap();
        assert_eq!(prepared.expected_status().skipped_paths, vec![missing]);
        let out = run_confined(prepared, "sh", &["-c", "exit 0"]);
        assert!(out.status.success(), "{}", out.stderr);
        assert_eq!(out.landlock.len(), 5, "child wrote its status");
        assert!(out.landlock[0] >= 6, "abi {}", out.landlock[0]);
        assert_eq!(
            out.landlock[1],
            enforcement_code(Enforcement::FullyEnforced)
        );
        assert_eq!(&out.landlock[2..], &[1, 1, 1], "fs, net, scope in force");
    }

    #[test]
    fn reads_allowed_beneath_read_exec_and_refused_elsewhere() {
        let dir = fixture();
        let ok = py(
            prepare(&base_spec(dir.path())).unwrap(),
            &format!(
                "print(open({:?}).read(), end='')",
                dir.path().join("ro/hello.txt")
            ),
        );
        assert!(ok.status.success(), "{}", ok.stderr);
        assert_eq!(ok.stdout, "hello from ro\n");

        let denied = py(
            prepare(&base_spec(dir.path())).unwrap(),
            &py_errno(&format!(
                "open({:?}).read()",
                dir.path().join("outside/secret.txt")
            )),
        );
        assert_eq!(denied.stdout.trim(), format!("err {}", libc::EACCES));
    }

    #[test]
    fn writes_refused_outside_read_write_with_eacces() {
        let dir = fixture();
        let target = dir.path().join("ro/new.txt");
        let out = py(
            prepare(&base_spec(dir.path())).unwrap(),
            &py_errno(&format!("open({target:?}, 'w').write('x')")),
        );
        assert!(out.status.success(), "{}", out.stderr);
        assert_eq!(out.stdout.trim(), format!("err {}", libc::EACCES));
        assert!(!target.exists());
    }

    #[test]
    fn writes_allowed_inside_read_write() {
        let dir = fixture();
        let rw = dir.path().join("rw");
        let target = rw.join("new.txt");
        // os.rename across directories needs the refer right (mv would hide an EXDEV by
        // falling back to copy + unlink).
        let out = py(
            prepare(&base_spec(dir.path())).unwrap(),
            &py_errno(&format!(
                "os.mkdir({d:?}); open({f:?}, 'w').write('written'); os.rename({f:?}, {t:?})",
                d = rw.join("d"),
                f = rw.join("d/f"),
                t = target
            )),
        );
        assert_eq!(out.stdout.trim(), "ok", "{}", out.stderr);
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "written");
    }

    #[test]
    fn device_nodes_cannot_be_created_beneath_read_write() {
        let dir = fixture();
        let node = dir.path().join("rw/null-copy");
        // We run as root, so only Landlock stands between mknod and a new device node.
        let out = py(
            prepare(&base_spec(dir.path())).unwrap(),
            &py_errno(&format!(
                "os.mknod({node:?}, 0o600 | __import__('stat').S_IFCHR, os.makedev(1, 3))"
            )),
        );
        assert_eq!(
            out.stdout.trim(),
            format!("err {}", libc::EACCES),
            "{}",
            out.stderr
        );
        assert!(!node.exists());
    }

    #[test]
    fn symlink_inside_read_write_cannot_write_outside() {
        let dir = fixture();
        let outside = dir.path().join("outside/secret.txt");
        let link = dir.path().join("rw/link");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        let out = py(
            prepare(&base_spec(dir.path())).unwrap(),
            &py_errno(&format!("open({link:?}, 'a').write('pwned')")),
        );
        assert_eq!(
            out.stdout.trim(),
            format!("err {}", libc::EACCES),
            "{}",
            out.stderr
        );
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "secret\n");
    }

    #[test]
    fn dev_null_is_writable() {
        let dir = fixture();
        // `>` opens with O_TRUNC, which the kernel ignores on a character device.
        let out = run_confined(
            prepare(&base_spec(dir.path())).unwrap(),
            "sh",
            &["-c", "echo discard > /dev/null && echo ok"],
        );
        assert!(out.status.success(), "{}", out.stderr);
        assert_eq!(out.stdout.trim(), "ok");
    }

    #[test]
    fn tcp_connect_is_limited_to_listed_ports() {
        let dir = fixture();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let body = format!("socket.create_connection(('127.0.0.1', {port}), timeout=5).close()");

        let mut denied_spec = base_spec(dir.path());
        denied_spec.tcp_connect = Some(vec![]);
        let denied = py(prepare(&denied_spec).unwrap(), &py_errno(&body));
        assert_eq!(
            denied.stdout.trim(),
            format!("err {}", libc::EACCES),
            "{}",
            denied.stderr
        );

        let mut allowed_spec = base_spec(dir.path());
        allowed_spec.tcp_connect = Some(vec![port]);
        let allowed = py(prepare(&allowed_spec).unwrap(), &py_errno(&body));
        assert_eq!(allowed.stdout.trim(), "ok", "{}", allowed.stderr);
        // The allowed connection really reached our listener.
        listener.set_nonblocking(true).unwrap();
        assert!(listener.accept().is_ok());
    }

    fn spawn_victim() -> Child {
        Command::new("sleep")
            .arg("30")
            .stdin(Stdio::null())
            .spawn()
            .unwrap()
    }

    #[test]
    fn scope_signals_blocks_signalling_outside_the_domain() {
        let dir = fixture();
        let kill_cmd = |pid: u32| format!("kill -TERM {pid}");

        let mut victim = spawn_victim();
        let mut spec = base_spec(dir.path());
        spec.scope_signals = true;
        let out = run_confined(
            prepare(&spec).unwrap(),
            "sh",
            &["-c", &kill_cmd(victim.id())],
        );
        assert!(!out.status.success(), "kill must fail inside the scope");
        assert!(out.stderr.contains("not permitted"), "{}", out.stderr);
        std::thread::sleep(Duration::from_millis(100));
        assert!(victim.try_wait().unwrap().is_none(), "victim must be alive");
        victim.kill().unwrap();
        victim.wait().unwrap();

        // Control: the same command without scoping does reach a fresh victim.
        let mut victim = spawn_victim();
        let out = run_confined(
            prepare(&base_spec(dir.path())).unwrap(),
            "sh",
            &["-c", &kill_cmd(victim.id())],
        );
        assert!(out.status.success(), "{}", out.stderr);
        let st = wait_bounded(&mut victim, Duration::from_secs(5));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(st.signal(), Some(libc::SIGTERM));
    }
}
