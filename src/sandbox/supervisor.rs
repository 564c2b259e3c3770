//! The supervisor's side of a run: cloning the init into its namespaces (clone3, uid/gid
//! maps, the cgroup), then watching it until it exits, enforcing every budget and serving
//! the doors.

use super::netlink_queues::NetlinkQueues;
#[allow(unused_imports)]
use super::*;
use std::os::fd::BorrowedFd;

/// The init as seen from the supervisor.
pub(super) struct InitChild {
    pub(super) pid: i32,
    pub(super) pidfd: OwnedFd,
    pub(super) status: OwnedFd,
    /// Held open while the init lives: the init checks it to know the supervisor is alive.
    pub(super) _sync: OwnedFd,
    /// The doors' listeners, inside the sandbox's network namespace, in `Doors` order.
    pub(super) listeners: Vec<std::net::TcpListener>,
    /// The receive queues of the sandbox's netlink sockets, when it has its own network
    /// namespace (set at release).
    pub(super) netlink: Option<NetlinkQueues>,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum InitExit {
    Code(i32),
    Signal(i32),
}

pub(super) fn cstr(s: &str) -> Result<CString, SandboxError> {
    CString::new(s).map_err(|_| SandboxError::Setup {
        stage: "argv".into(),
        message: format!("`{s}` contains a NUL byte"),
    })
}

/// A cloned init waiting for its go ([`PendingInit::release`]); dropped without it, the
/// init is killed and reaped.
pub(super) struct PendingInit {
    child: Option<InitChild>,
    uid: u32,
    gid: u32,
    become_root: bool,
    /// The init expects v1 `tasks` files with its go (and exits without them).
    join_v1: bool,
}

/// How the init joins its cgroups.
#[derive(Debug, Clone, Copy)]
pub(super) enum CgroupJoin<'a> {
    /// No cgroups for this run.
    None,
    /// Made already: a v2 cgroup the clone places the init in, or v1 ones it joins at its
    /// release.
    Made(&'a cgroup::SandboxCgroup),
    /// v1 cgroups still being made: given to [`PendingInit::release`], which refuses to
    /// let the init go without them.
    V1Later,
}

/// Clones the init into its namespaces (into its v2 cgroup straight away); it waits for
/// [`PendingInit::release`] before anything else.
pub(super) fn spawn_init(
    cfg: &InitConfig,
    ns_flags: u64,
    uid: u32,
    gid: u32,
    join: CgroupJoin<'_>,
    io: &Stdio<'_>,
) -> Result<PendingInit, SandboxError> {
    use nix::fcntl::OFlag;
    // Redirected (any of the three given): what is not given is /dev/null. Otherwise the
    // init and the command share the supervisor's stdio.
    let redirected = io.stdin.is_some() || io.stdout.is_some() || io.stderr.is_some();
    let null = |flags: OFlag| {
        nix::fcntl::open(
            "/dev/null",
            flags | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(sys_err("open /dev/null"))
    };
    let (null_in, null_out) = if redirected {
        (Some(null(OFlag::O_RDONLY)?), Some(null(OFlag::O_WRONLY)?))
    } else {
        (None, None)
    };
    let stdio = match (&null_in, &null_out) {
        (Some(ni), Some(no)) => Some((
            io.stdin.unwrap_or(ni.as_fd()),
            io.stdout.or(io.stderr).unwrap_or(no.as_fd()),
            io.stderr.unwrap_or(no.as_fd()),
        )),
        _ => None,
    };
    // Everything the child needs is prepared here, before the clone (but the v1 cgroups'
    // `tasks` files, which come with its go).
    let cfg_json = serde_json::to_vec(cfg).map_err(|e| SandboxError::Setup {
        stage: "config".into(),
        message: e.to_string(),
    })?;
    let memfd =
        nix::sys::memfd::memfd_create(c"fork-init-config", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
            .map_err(sys_err("memfd_create"))?;
    let mut f = std::fs::File::from(memfd);
    f.write_all(&cfg_json)
        .ctx("write config", Path::new("memfd"))?;
    f.rewind().ctx("rewind config", Path::new("memfd"))?;
    let cfg_fd: OwnedFd = f.into();
    let (sync_rd, sync_wr) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::Stream,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
    .map_err(sys_err("socketpair"))?;
    let (status_rd, status_wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(sys_err("pipe2"))?;
    // The small init binary of this build (checked once per process), not this binary.
    let exe = init_exe::open()?;
    let argv_c = [
        cstr(init_exe::INIT_NAME)?,
        cstr(INIT_ROLE)?,
        cstr(&cfg_fd.as_raw_fd().to_string())?,
        cstr(&status_wr.as_raw_fd().to_string())?,
    ];
    // Joining the cgroup: on v2 the kernel places the child at clone (CLONE_INTO_CGROUP); on
    // v1 the child moves itself by writing "0" to each hierarchy's `tasks`, which the go
    // message brings it (see `release`). Both avoid the RCU grace period a supervisor-side
    // write to cgroup.procs waits for.
    let join_v1 = match join {
        CgroupJoin::None => false,
        CgroupJoin::Made(cg) => cg.version() == cgroup::CgroupVersion::V1,
        CgroupJoin::V1Later => true,
    };
    let cg_dir = match join {
        CgroupJoin::Made(cg) if cg.version() == cgroup::CgroupVersion::V2 => {
            match cg.paths().first() {
                Some(dir) => Some(
                    nix::fcntl::open(
                        dir,
                        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                        nix::sys::stat::Mode::empty(),
                    )
                    .map_err(sys_err("open the sandbox cgroup"))?,
                ),
                None => None,
            }
        }
        _ => None,
    };
    // The init becomes uid 0 of its namespace, mapped to the run's own uid (as root, or a
    // user with subordinate ids); else it keeps the user's uid, mapped to 0.
    let become_root = is_root() || super::rootless::distinct_uids();
    let mut keep = vec![cfg_fd.as_fd(), status_wr.as_fd()];
    keep.extend(io.pass.iter().copied());
    keep.extend(io.mounts.iter().copied());
    let clone = || {
        sys::clone_init(&sys::InitClone {
            ns_flags,
            cgroup_dir: cg_dir.as_ref().map(|f| f.as_fd()),
            sync_rd: sync_rd.as_fd(),
            sync_wr: sync_wr.as_fd(),
            join_v1,
            become_root,
            root_supervisor: is_root(),
            stdio,
            keep: &keep,
            exe,
            argv: &argv_c,
        })
    };
    // As root, the init's mount namespace is copied from a private one of this thread in
    // which fork's run directories and the host's cgroup mounts are detached, and its user
    // namespace is owned by the run's uid, not root (see `userns_owner`).
    let cloned = if is_root() {
        let detach = namespaces::detached_in_private_mounts();
        namespaces::with_private_mounts(&detach, || super::userns_owner::owned_by(uid, clone))
            .map_err(|message| SandboxError::Setup {
                stage: "mount namespace".into(),
                message,
            })?
            .map_err(|message| SandboxError::Setup {
                stage: "user namespace owner".into(),
                message,
            })?
    } else {
        clone()
    };
    let (pid, pidfd) = cloned.map_err(sys_err(
        "clone3 (new user, pid, mount, net, ipc, uts namespaces)",
    ))?;
    trace::mark("sandbox: clone returned");
    Ok(PendingInit {
        child: Some(InitChild {
            pid: pid.as_raw(),
            pidfd,
            status: status_rd,
            _sync: sync_wr,
            listeners: Vec::new(),
            netlink: None,
        }),
        uid,
        gid,
        become_root,
        join_v1,
    })
}

impl PendingInit {
    /// The go: the doors' listeners made in the init's network namespace, its uid/gid maps
    /// written, and the message that lets it go on, carrying the `tasks` files of `cg`
    /// when it is a v1 cgroup (a v2 one was given to the clone). On failure the init is
    /// killed and reaped.
    pub(super) fn release(
        mut self,
        cg: Option<&cgroup::SandboxCgroup>,
        door_addrs: &[std::net::SocketAddr],
        netns: bool,
    ) -> Result<InitChild, SandboxError> {
        let gone = || SandboxError::Setup {
            stage: "release init".into(),
            message: "the init is no longer held".into(),
        };
        let child = self.child.as_mut().ok_or_else(gone)?;
        let pid = child.pid;
        // The doors exist before the command does: it may connect at once.
        child.listeners =
            net::listeners_in_netns(pid, door_addrs).map_err(|e| SandboxError::Setup {
                stage: "doors".into(),
                message: e.to_string(),
            })?;
        let mut tasks: Vec<OwnedFd> = Vec::new();
        let v1 = cg.filter(|c| c.version() == cgroup::CgroupVersion::V1);
        if self.join_v1 != v1.is_some() {
            return Err(SandboxError::Setup {
                stage: "cgroup".into(),
                message: "the init's cgroups are not the ones it was cloned to join".into(),
            });
        }
        if let Some(cg) = v1 {
            for dir in cg.paths() {
                tasks.push(
                    nix::fcntl::open(
                        &dir.join("tasks"),
                        nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
                        nix::sys::stat::Mode::empty(),
                    )
                    .map_err(sys_err("open the sandbox cgroup's tasks file"))?,
                );
            }
        }
        if netns {
            // Required with a network namespace of its own: what it queues on netlink
            // sockets is counted against the memory budget by nothing else.
            child.netlink = Some(NetlinkQueues::open(pid).map_err(|e| SandboxError::Setup {
                stage: "netlink".into(),
                message: format!(
                    "cannot open /proc/{pid}/net/netlink to count the sandbox's netlink \
                     queues against its memory budget: {e}"
                ),
            })?);
        }
        namespaces::write_id_maps(pid, self.uid, self.gid, !self.become_root)?;
        sys::release_init(child._sync.as_fd(), &tasks).map_err(sys_err("release init"))?;
        self.child.take().ok_or_else(gone)
    }
}

impl Drop for PendingInit {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let _ = sys::pidfd_send_signal(child.pidfd.as_fd(), nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::wait::waitid(
                nix::sys::wait::Id::PIDFd(child.pidfd.as_fd()),
                nix::sys::wait::WaitPidFlag::WEXITED,
            );
        }
    }
}

/// Turns the plan's binds of host paths into the disk and the read-only binds into
/// detached mount trees (`open_tree`, flags set here) that the init attaches by
/// descriptor; returns the plan and the descriptors the init must inherit.
pub(super) fn detach_sources(
    ops: Vec<mounts::MountOp>,
) -> Result<(Vec<mounts::MountOp>, Vec<OwnedFd>), SandboxError> {
    use mounts::MountOp;
    let mut fds = Vec::new();
    let mut out = Vec::with_capacity(ops.len());
    for op in ops {
        let (src, dst, dir, attrs) = match &op {
            MountOp::BindRw { src, dst } => (
                src.clone(),
                dst.clone(),
                true,
                mounts::MOUNT_ATTR_NOSUID | mounts::MOUNT_ATTR_NODEV,
            ),
            MountOp::BindInto { src, dst, dir } => (
                src.clone(),
                dst.clone(),
                *dir,
                mounts::MOUNT_ATTR_RDONLY | mounts::MOUNT_ATTR_NOSUID | mounts::MOUNT_ATTR_NODEV,
            ),
            _ => {
                out.push(op);
                continue;
            }
        };
        let c =
            CString::new(src.as_os_str().as_encoded_bytes()).map_err(|_| SandboxError::Setup {
                stage: "mounts".into(),
                message: format!("{} contains a NUL byte", src.display()),
            })?;
        let tree = sys::open_tree_clone(&c).map_err(|e| SandboxError::Setup {
            stage: "mounts".into(),
            message: format!("open_tree {}: {e}", src.display()),
        })?;
        sys::mount_setattr_fd(tree.as_fd(), attrs, 0).map_err(|e| SandboxError::Setup {
            stage: "mounts".into(),
            message: format!("mount_setattr {}: {e}", src.display()),
        })?;
        out.push(MountOp::Attach {
            fd: tree.as_raw_fd(),
            dst,
            dir,
        });
        fds.push(tree);
    }
    Ok((out, fds))
}

pub(super) fn observation(
    start: Instant,
    s: &cgroup::CgroupSample,
    disk: Option<&Path>,
    netlink_queued: u64,
) -> Observation {
    let (disk_used, disk_size) = disk.and_then(disk_use).unzip();
    Observation {
        elapsed: start.elapsed(),
        cpu_ns: s.cpu_ns,
        memory_peak: s.memory_peak.max(s.memory_current),
        memory_current: s.memory_current,
        netlink_queued,
        pids_current: s.pids_current,
        pids_peak: s.pids_peak,
        oom_kills: s.oom_kills,
        pids_limit_hits: s.pids_limit_hits,
        disk_used,
        disk_size,
    }
}

/// The bytes used on the capped filesystem at `disk`, and its size (one statvfs).
fn disk_use(disk: &Path) -> Option<(u64, u64)> {
    let v = nix::sys::statvfs::statvfs(disk).ok()?;
    let bs = v.fragment_size();
    let size = v.blocks() * bs;
    let free = v.blocks_free() * bs;
    Some((size.saturating_sub(free), size))
}

/// The descriptors a run's init (and so its command) gets: stdin, stdout and stderr, and
/// the descriptors it passes on to the command (see `InitConfig::pass_fds`).
pub(super) struct Stdio<'a> {
    pub stdin: Option<BorrowedFd<'a>>,
    pub stdout: Option<BorrowedFd<'a>>,
    pub stderr: Option<BorrowedFd<'a>>,
    pub pass: Vec<BorrowedFd<'a>>,
    /// Detached mount trees the init attaches (see `mounts::MountOp::Attach`).
    pub mounts: Vec<BorrowedFd<'a>>,
}

/// How the watch ended, besides the init's exit.
pub(super) struct Ended {
    pub budget: Option<BudgetKind>,
    pub interrupted: bool,
    /// The caller's cancel token was set: the run was stopped, no budget was blown.
    pub cancelled: bool,
}

/// Watches the init until it exits: wall clock, cgroup events, disk, signals, and the
/// caller's cancel token.
#[allow(clippy::too_many_arguments)]
pub(super) fn supervise(
    child: &InitChild,
    doors: Doors,
    listeners: Vec<std::net::TcpListener>,
    cg: Option<&cgroup::SandboxCgroup>,
    disk: Option<&Path>,
    wd: &mut Watchdog,
    start: Instant,
    cancel: Option<&std::sync::atomic::AtomicBool>,
    status: &mut StatusReader,
    mut netlink: Option<NetlinkQueues>,
) -> Result<(InitExit, Ended), SandboxError> {
    let cancelled = || cancel.is_some_and(|c| c.load(std::sync::atomic::Ordering::SeqCst));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ctx("start the watchdog runtime", Path::new(""))?;
    let cost = doors.cost.clone();
    // Doors are served on this thread (their futures need not be Send), in a LocalSet that
    // is dropped, with every door, when the run ends.
    let local = tokio::task::LocalSet::new();
    let (budget, interrupted, stopped) = local.block_on(&rt, async {
        for (door, l) in doors.doors.into_iter().zip(listeners) {
            match tokio::net::TcpListener::from_std(l) {
                Ok(l) => {
                    tokio::task::spawn_local((door.serve)(l));
                }
                Err(e) => tracing::warn!("door {}: {e}", door.addr),
            }
        }
        let afd = match sys::async_fd(child.pidfd.as_fd(), tokio::io::Interest::READABLE) {
            Ok(a) => a,
            Err(_) => return (None, false, false),
        };
        // The status pipe, read as the init writes (its messages are timed for FORK_TRACE);
        // whatever is left is read once the init has exited.
        let status_fd = status
            .nonblocking(child.status.as_fd())
            .then(|| sys::async_fd(child.status.as_fd(), tokio::io::Interest::READABLE).ok())
            .flatten();
        let mut status_open = status_fd.is_some();
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
        // Between ticks, the disk alone while it is near full (tmpfs counts no failed
        // write: a fill is seen only while it lasts).
        let mut disk_tick = tokio::time::interval(watchdog::DISK_NEAR_EVERY);
        disk_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut disk_near = false;
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
                    // What the init wrote before it ended is read (and timed) first.
                    if status_open {
                        status.read_available(child.status.as_fd());
                    }
                    trace::mark("init exit seen (pidfd)");
                    return (None, false, false);
                }
                r = async { status_fd.as_ref()?.readable().await.ok() }, if status_open => {
                    match r {
                        Some(mut g) => {
                            if !status.read_available(child.status.as_fd()) {
                                status_open = false;
                            }
                            g.clear_ready();
                        }
                        None => status_open = false,
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    return (Some(BudgetKind::Wall), false, false);
                }
                _ = tick.tick() => {
                    // Stopped or interrupted: the command is killed next, and what the
                    // kernel counted until then is still read (the final sample, below).
                    if cancelled() {
                        return (None, false, true);
                    }
                    // A signal that came before the handlers above existed.
                    if super::signals::interrupted() {
                        return (None, true, false);
                    }
                    if let Some(c) = &cost {
                        wd.set_api_cost(c.spent_usd());
                        if c.exceeded() {
                            return (Some(BudgetKind::ApiCost), false, false);
                        }
                    }
                    let s = cg.map(|c| c.sample()).unwrap_or_default();
                    // Fail closed: a table that cannot be read (or is too long to read
                    // every look) ends the run as over memory; nothing is made up for
                    // the reported peak.
                    let queued = match netlink.as_mut().map(NetlinkQueues::queued) {
                        None => 0,
                        Some(Some(q)) => q,
                        Some(None) => {
                            tracing::warn!(
                                "the sandbox's netlink table could not be read, or is longer \
                                 than {} KiB (hundreds of netlink sockets): its memory cannot \
                                 be counted; stopped as over its memory budget",
                                super::netlink_queues::NETLINK_TABLE_MAX >> 10
                            );
                            return (Some(BudgetKind::Memory), false, false);
                        }
                    };
                    if let Some(b) = wd.observe(&observation(start, &s, disk, queued)) {
                        return (Some(b), false, false);
                    }
                    disk_near = wd.disk_near_full();
                }
                _ = disk_tick.tick(), if disk_near => {
                    if let Some((used, size)) = disk.and_then(disk_use) {
                        if let Some(b) = wd.observe_disk(used, size) {
                            return (Some(b), false, false);
                        }
                    }
                    disk_near = wd.disk_near_full();
                }
                _ = recv(&mut sigint) => return (None, true, false),
                _ = recv(&mut sigterm) => return (None, true, false),
                _ = recv(&mut sighup) => return (None, true, false),
            }
        }
    });
    if budget.is_some() || interrupted || stopped {
        if let Some(b) = budget {
            tracing::info!("budget `{}` exceeded: killing the sandbox", b.as_str());
        }
        let _ = sys::pidfd_send_signal(child.pidfd.as_fd(), nix::sys::signal::Signal::SIGKILL);
        if let Some(cg) = cg {
            let _ = cg.kill_all();
        }
    }
    let st = nix::sys::wait::waitid(
        nix::sys::wait::Id::PIDFd(child.pidfd.as_fd()),
        nix::sys::wait::WaitPidFlag::WEXITED,
    )
    .map_err(sys_err("waitid on the sandbox init"))?;
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
    // The doors close (the gateway admits no more calls); its calls still in flight get a
    // short grace to finish and be charged what they used, then the rest are charged
    // their worst case, before the spend is read.
    drop(local);
    if let Some(c) = &cost {
        let until = Instant::now() + IN_FLIGHT_GRACE;
        rt.block_on(async {
            while c.in_flight() > 0 && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        c.settle_in_flight();
        wd.set_api_cost(c.spent_usd());
    }
    // The final usage, sampled once, after every member is gone, however the run ended.
    let s = cg.map(|c| c.sample()).unwrap_or_default();
    // (Every netlink socket closed with its process: nothing is queued any more.)
    let last = wd.observe(&observation(start, &s, disk, 0));
    let wd_budget = final_budget(budget, last, interrupted || stopped, || {
        cost.as_ref().is_some_and(|c| c.exceeded())
    });
    Ok((
        exit,
        Ended {
            budget: wd_budget,
            interrupted,
            cancelled: stopped,
        },
    ))
}

/// The budget a run ended over: the one the watch saw, else the one the final sample
/// (`last`, taken once every member is gone) shows. The command may have ended by the
/// event itself (an OOM kill, a refused fork, a full disk) before a tick saw it. A run
/// stopped by its caller or interrupted (`ended_early`) still keeps what the kernel
/// counted before the stop (memory OOM kills, pids limit hits, the disk's use): a judged
/// subject that blew one once its judge was done blew it all the same. Only what the
/// supervisor's own clock or meter says is dropped then: wall and CPU time (run on
/// past the stop while it was being killed), and the API cost (its calls in flight at the
/// stop are charged their worst case).
fn final_budget(
    budget: Option<BudgetKind>,
    last: Option<BudgetKind>,
    ended_early: bool,
    cost_exceeded: impl FnOnce() -> bool,
) -> Option<BudgetKind> {
    if budget.is_some() {
        return budget;
    }
    let counted =
        |b: &BudgetKind| matches!(b, BudgetKind::Memory | BudgetKind::Pids | BudgetKind::Disk);
    if ended_early {
        return last.filter(counted);
    }
    last.filter(|b| *b != BudgetKind::Wall)
        .or_else(|| cost_exceeded().then_some(BudgetKind::ApiCost))
}

/// How long a metered door's calls still in flight when the run ends may take to finish
/// (and be charged what they used) before they are charged their worst case.
const IN_FLIGHT_GRACE: Duration = Duration::from_secs(2);

/// At most this much is read from the status pipe.
const STATUS_MAX: usize = 1 << 20;

/// What the init has written on its status pipe so far.
#[derive(Default)]
pub(super) struct StatusReader {
    buf: Vec<u8>,
    /// Complete lines already marked for FORK_TRACE.
    marked: usize,
}

impl StatusReader {
    /// Makes our end of the pipe non-blocking (for reading while the init runs).
    fn nonblocking(&self, fd: BorrowedFd<'_>) -> bool {
        set_nonblocking(fd, true)
    }

    /// Reads what is there now; false at end of file (or an error, or the cap).
    fn read_available(&mut self, fd: BorrowedFd<'_>) -> bool {
        let mut chunk = [0u8; 4096];
        loop {
            if self.buf.len() >= STATUS_MAX {
                return false;
            }
            match nix::unistd::read(fd, &mut chunk) {
                Ok(0) => return false,
                Ok(n) => {
                    let take = n.min(STATUS_MAX - self.buf.len());
                    self.buf.extend_from_slice(&chunk[..take]);
                    self.mark_lines();
                }
                Err(nix::Error::EINTR) => continue,
                Err(nix::Error::EAGAIN) => return true,
                Err(_) => return false,
            }
        }
    }

    /// FORK_TRACE: one mark per message, when it arrived.
    fn mark_lines(&mut self) {
        if !trace::enabled() {
            return;
        }
        let lines = self.buf.iter().filter(|b| **b == b'\n').count();
        for line in self
            .buf
            .split(|b| *b == b'\n')
            .skip(self.marked)
            .take(lines - self.marked)
        {
            trace::mark(match serde_json::from_slice::<InitMsg>(line) {
                Ok(InitMsg::Landlock { .. }) => "init: landlock status received",
                Ok(InitMsg::Exited { .. }) => "init: exit status received",
                Ok(InitMsg::Error { .. }) => "init: error received",
                Err(_) => "init: unreadable message received",
            });
        }
        self.marked = lines;
    }

    /// Reads the rest (every writer is gone once the init has exited: the pid namespace is
    /// dead) and returns every message.
    pub(super) fn finish(mut self, status: OwnedFd) -> Vec<InitMsg> {
        set_nonblocking(status.as_fd(), false);
        let mut f = std::fs::File::from(status);
        let room = STATUS_MAX.saturating_sub(self.buf.len()) as u64;
        let _ = Read::by_ref(&mut f).take(room).read_to_end(&mut self.buf);
        self.mark_lines();
        self.buf
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect()
    }
}

fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> bool {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let Ok(bits) = fcntl(fd, FcntlArg::F_GETFL) else {
        return false;
    };
    let mut flags = OFlag::from_bits_truncate(bits);
    flags.set(OFlag::O_NONBLOCK, on);
    fcntl(fd, FcntlArg::F_SETFL(flags)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::{final_budget, BudgetKind};

    /// A run its caller stopped (a judged subject once its judge was done) or that was
    /// interrupted keeps what the kernel counted before the stop: OOM kills, refused forks,
    /// a full disk. Only the supervisor's clock and meter are dropped then (wall, CPU time,
    /// API cost). A run that ended on its own keeps every budget but wall.
    #[test]
    fn a_stopped_run_keeps_the_budgets_the_kernel_counted() {
        let never = || panic!("the meter is not read for a stopped run");
        for b in [BudgetKind::Memory, BudgetKind::Pids, BudgetKind::Disk] {
            assert_eq!(final_budget(None, Some(b), true, never), Some(b));
            assert_eq!(final_budget(None, Some(b), false, || false), Some(b));
        }
        for b in [BudgetKind::Wall, BudgetKind::Cpu] {
            assert_eq!(final_budget(None, Some(b), true, never), None);
        }
        assert_eq!(final_budget(None, None, true, never), None);
        assert_eq!(
            final_budget(None, Some(BudgetKind::Cpu), false, || false),
            Some(BudgetKind::Cpu)
        );
        assert_eq!(
            final_budget(None, Some(BudgetKind::Wall), false, || false),
            None
        );
        assert_eq!(
            final_budget(None, None, false, || true),
            Some(BudgetKind::ApiCost)
        );
        // What the watch saw first stays.
        assert_eq!(
            final_budget(
                Some(BudgetKind::Wall),
                Some(BudgetKind::Pids),
                false,
                || true
            ),
            Some(BudgetKind::Wall)
        );
    }
}
