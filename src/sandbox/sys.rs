//! Every raw system call of the crate, each behind a small safe wrapper: the one module
//! allowed to write `unsafe` (the crate root denies `unsafe_code` everywhere else).
//!
//! Each `unsafe` block carries a `// SAFETY:` line saying why it is sound. Where soundness
//! rests on something the types cannot express (the process has one thread; nothing else
//! owns a descriptor), the wrapper is crate-private and its doc states the caller's part
//! under "Contract". Calls nix offers safely (prctl's no_new_privs and pdeathsig, kill,
//! setns, unshare, signalfd, waitid) are made through nix by the callers, not here.

use nix::errno::Errno;
use nix::sched::CloneFlags;
use nix::sys::signal::{sigaction, signal, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::unistd::{ForkResult, Pid};
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

// ---------------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------------

/// Ends the calling process with `code` at once: no destructors, no atexit handlers, no
/// stdio flush (what a forked child must do instead of returning).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit(2) takes an integer, touches no memory of ours and never returns; it
    // is async-signal-safe.
    unsafe { libc::_exit(code) }
}

/// fork(2) from a process with a single thread (the sandbox init).
///
/// Contract: the calling process has exactly one thread, so the child inherits no lock
/// held by another thread and may call anything, the allocator included.
pub(crate) fn fork_single_threaded() -> nix::Result<ForkResult> {
    // SAFETY: per the contract there is no other thread whose locks (allocator, stdio) the
    // child could inherit held; the child is then free of fork's async-signal-safe rule.
    unsafe { nix::unistd::fork() }
}

/// Takes ownership of a descriptor inherited across exec, named on the command line by
/// the parent (the init's config memfd and status pipe). `None` when it is stdin,
/// stdout, stderr or not open.
///
/// Contract: called once per descriptor, at start-up, before anything else in the
/// process could have opened, wrapped or closed it.
pub(crate) fn adopt_inherited_fd(fd: RawFd) -> Option<OwnedFd> {
    if fd <= 2 {
        return None;
    }
    // SAFETY: F_GETFD takes no pointer and only reads the descriptor's flags.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: `fd` is open (checked above) and, per the contract, owned by nothing else in
    // this process, so the OwnedFd is its only owner and closes it exactly once.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Closes every descriptor above stderr except `keep`, right before exec.
///
/// Contract: the caller then execs or leaves with [`exit_now`]; it neither uses nor drops
/// any other descriptor above stderr it still holds (their owners' destructors never run).
pub(crate) fn close_fds_except(keep: &[RawFd]) {
    let mut keep: Vec<libc::c_uint> = keep
        .iter()
        .filter(|fd| **fd > 2)
        .map(|fd| *fd as libc::c_uint)
        .collect();
    keep.sort_unstable();
    keep.dedup();
    let mut from: libc::c_uint = 3;
    // SAFETY: close_range(2) takes integers only; per the contract no live owner of a
    // closed descriptor uses or closes it again.
    unsafe {
        for k in keep {
            if k > from {
                libc::syscall(libc::SYS_close_range, from, k - 1, 0u32);
            }
            from = k + 1;
        }
        libc::syscall(libc::SYS_close_range, from, u32::MAX, 0u32);
    }
}

/// A duplicate of `fd` numbered `floor` or above, close-on-exec.
pub(crate) fn dup_above(fd: BorrowedFd<'_>, floor: RawFd) -> nix::Result<OwnedFd> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) reads an integer; on success it returns a fresh
    // descriptor that nothing else owns, which the OwnedFd then owns alone.
    unsafe {
        let d = libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, floor);
        if d < 0 {
            return Err(Errno::last());
        }
        Ok(OwnedFd::from_raw_fd(d))
    }
}

/// In the command's child, before exec: places each `(target, source)` descriptor at
/// `target` (close-on-exec cleared), whatever numbers the sources had, and returns false
/// if a step failed. Sources are first moved above every target, so that no placement
/// overwrites a source still to be placed.
pub(crate) fn place_fds(pairs: &[(RawFd, RawFd)]) -> bool {
    let floor = pairs.iter().map(|(t, _)| *t).max().unwrap_or(0) + 1;
    let mut moved = [(-1, -1); 16];
    if pairs.len() > moved.len() {
        return false;
    }
    for (i, (t, s)) in pairs.iter().enumerate() {
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) on an integer descriptor; async-signal-safe.
        let m = unsafe { libc::fcntl(*s, libc::F_DUPFD_CLOEXEC, floor) };
        if m < 0 {
            return false;
        }
        moved[i] = (*t, m);
    }
    for (t, m) in moved.iter().take(pairs.len()) {
        // SAFETY: dup2(2) onto a target number this child owns (the caller closes the rest);
        // the duplicate has close-on-exec cleared by dup2. The moved copy is closed after.
        unsafe {
            if libc::dup2(*m, *t) < 0 {
                return false;
            }
            libc::close(*m);
        }
    }
    true
}

/// In a short-lived child: unshare(CLONE_NEWUSER), then unshare(`extra`) if not empty.
/// Returns the errno of the first that failed.
pub fn unshare_in_child(extra: CloneFlags) -> nix::Result<()> {
    let extra = extra.bits();
    // SAFETY: the child makes only async-signal-safe calls (unshare, _exit) on integers,
    // so it is sound even if this process has other threads.
    match unsafe { libc::fork() } {
        -1 => Err(Errno::last()),
        0 => {
            // SAFETY: as above; errno is read through the libc accessor of this thread.
            unsafe {
                if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                    libc::_exit(*libc::__errno_location() & 0x7f);
                }
                if extra != 0 && libc::unshare(extra) != 0 {
                    libc::_exit(*libc::__errno_location() & 0x7f);
                }
                libc::_exit(0);
            }
        }
        pid => {
            let st = nix::sys::wait::waitpid(Pid::from_raw(pid), None)?;
            match st {
                nix::sys::wait::WaitStatus::Exited(_, 0) => Ok(()),
                nix::sys::wait::WaitStatus::Exited(_, e) => Err(Errno::from_raw(e)),
                _ => Err(Errno::EINVAL),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Cloning the sandbox init
// ---------------------------------------------------------------------------------------

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

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Everything the init's child side needs between clone3 and execveat, prepared by the
/// supervisor beforehand (the child allocates nothing).
pub(crate) struct InitClone<'a> {
    /// CLONE_NEW* flags.
    pub ns_flags: u64,
    /// A cgroup v2 directory the kernel places the child in (CLONE_INTO_CGROUP).
    pub cgroup_dir: Option<BorrowedFd<'a>>,
    /// The child's end of the sync socket (a stream socketpair): it blocks on it until
    /// the supervisor's go, one byte carrying the cgroup v1 `tasks` files the child writes
    /// "0" to, joining each hierarchy (see [`release_init`]); EOF: the supervisor died.
    pub sync_rd: BorrowedFd<'a>,
    /// The supervisor's end of the sync socket, which the child closes.
    pub sync_wr: BorrowedFd<'a>,
    /// The go must carry at least one cgroup v1 `tasks` file (the run has v1 cgroups);
    /// otherwise it must carry none. The child exits 122 on any other go.
    pub join_v1: bool,
    /// Become uid/gid 0 of the new user namespace and drop supplementary groups.
    pub become_root: bool,
    /// The supervisor is root (the clone's effective uid was the run's, see
    /// `userns_owner`): the child takes its namespace's root before joining v1 cgroups.
    pub root_supervisor: bool,
    /// (stdin, stdout, stderr) for the init, when they are redirected.
    pub stdio: Option<(BorrowedFd<'a>, BorrowedFd<'a>, BorrowedFd<'a>)>,
    /// Descriptors that survive the exec (close-on-exec cleared).
    pub keep: &'a [BorrowedFd<'a>],
    /// The executable (`fork-init`, opened and checked), run with an empty environment.
    pub exe: BorrowedFd<'a>,
    pub argv: &'a [CString],
}

/// In the cloned child: uid and gid 0 of its new user namespace, no supplementary groups.
/// Raw syscalls: glibc's wrappers would signal threads that exist only in the parent.
/// False when one is refused.
///
/// # Safety
/// Only in the child of [`clone_init`], before its exec (async-signal-safe syscalls only).
unsafe fn child_become_root() -> bool {
    // SAFETY: plain syscalls on integers and a null pointer with a zero length.
    unsafe {
        libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) == 0
            && libc::syscall(libc::SYS_setresgid, 0, 0, 0) == 0
            && libc::syscall(libc::SYS_setresuid, 0, 0, 0) == 0
    }
}

/// clone3(2) of the sandbox init into new namespaces (and, on cgroup v2, straight into its
/// cgroup), with CLONE_PIDFD. The child waits for the supervisor's go on the sync socket,
/// becomes root of its user namespace, joins the v1 cgroups, sets PDEATHSIG, and execs
/// `exe argv` with an empty environment; it exits 122..=127 if a step fails. Returns the
/// child's pid and pidfd.
pub(crate) fn clone_init(c: &InitClone<'_>) -> nix::Result<(Pid, OwnedFd)> {
    // Everything the child touches is prepared here, before the clone.
    let argv_p: Vec<*const libc::c_char> = c
        .argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    let empty: &CStr = c"";
    let sync_rd = c.sync_rd.as_raw_fd();
    let sync_wr = c.sync_wr.as_raw_fd();
    let exe = c.exe.as_raw_fd();
    let stdio = c
        .stdio
        .map(|(i, o, e)| (i.as_raw_fd(), o.as_raw_fd(), e.as_raw_fd()));
    // The go message, received into buffers made here: one byte, and at most
    // MAX_CGROUP_TASKS descriptors.
    let mut go = 0u8;
    let mut iov = libc::iovec {
        iov_base: &mut go as *mut u8 as *mut libc::c_void,
        iov_len: 1,
    };
    // u64s: a control message's header is read in place, at its type's alignment.
    let mut control = vec![0u64; cmsg_space(MAX_CGROUP_TASKS).div_ceil(8)];
    // SAFETY: msghdr is plain data; all-zero is a valid empty header, filled in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = (control.len() * 8) as _;
    let join_v1 = c.join_v1;
    let mut pidfd: RawFd = -1;
    let args = CloneArgs {
        flags: c.ns_flags
            | libc::CLONE_PIDFD as u64
            | if c.cgroup_dir.is_some() {
                CLONE_INTO_CGROUP
            } else {
                0
            },
        pidfd: &mut pidfd as *mut RawFd as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: c.cgroup_dir.map(|f| f.as_raw_fd() as u64).unwrap_or(0),
        ..Default::default()
    };
    // SAFETY: clone3 without CLONE_VM and without a stack behaves like fork: the child
    // gets a copy of the address space. In the child we only call async-signal-safe
    // syscalls (recvmsg, write, setgroups, setresgid, setresuid, prctl, poll, dup2, fcntl,
    // close, execveat, _exit) and the CMSG_* arithmetic on data prepared above, so no lock
    // held by another supervisor thread at clone time can be touched.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if ret == 0 {
        // SAFETY: raw async-signal-safe syscalls on descriptors and pointers prepared before
        // the clone (argv_p, envp, `empty`, `msg` and the buffers it points to outlive the
        // call; execveat or _exit ends it). The control buffer is u64-aligned, so the
        // headers CMSG_FIRSTHDR/NXTHDR return are aligned; the descriptors after them are
        // read unaligned.
        unsafe {
            libc::close(sync_wr);
            // Die with the supervisor while waiting for its go (set again after the
            // credential change below, which clears it).
            let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
            // Wait for the supervisor to map ids and send the cgroups to join. EOF means it
            // died.
            if libc::recvmsg(sync_rd, &mut msg, libc::MSG_CMSG_CLOEXEC) != 1 {
                libc::_exit(125);
            }
            if msg.msg_flags & libc::MSG_CTRUNC != 0 {
                libc::_exit(122);
            }
            // Our host credentials are unmapped in the new namespace: become its uid 0 (the
            // run's unprivileged host uid) and shed the supplementary groups. As root, before
            // joining the v1 cgroups: the thread that cloned this child had the run's uid as
            // its effective one (see `userns_owner`), and a kernel that checks that write
            // against the writer's own credentials (before Linux 5.16 and its backports) lets
            // a task move itself when its effective uid is its real one. Without root, after
            // it: the `tasks` files were opened by the user, and a kernel that checks the
            // opener's credentials wants the mover's uid to be the opener's.
            if c.become_root && c.root_supervisor && !child_become_root() {
                libc::_exit(124);
            }
            // The go byte is 1 + the number of `tasks` files it carries.
            let mut joined = 0usize;
            // Join each v1 hierarchy: "0" to its `tasks` (this thread, no threadgroup lock).
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    let fds = libc::CMSG_DATA(cmsg) as *const libc::c_int;
                    for i in 0..bytes / std::mem::size_of::<libc::c_int>() {
                        let fd = std::ptr::read_unaligned(fds.add(i));
                        if !join_v1 || libc::write(fd, b"0".as_ptr() as *const libc::c_void, 1) != 1
                        {
                            libc::_exit(122);
                        }
                        libc::close(fd);
                        joined += 1;
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
            // (Read through the pointer recvmsg wrote through.)
            let got = std::ptr::read_volatile((*msg.msg_iov).iov_base as *const u8);
            if got as usize != 1 + joined || (join_v1 && joined == 0) {
                libc::_exit(122);
            }
            if c.become_root && !c.root_supervisor && !child_become_root() {
                libc::_exit(124);
            }
            // Die with the supervisor. Set after the credential change, which clears it;
            // exec keeps it. If the supervisor is already gone, its end of the sync socket is.
            // (nix's wrapper is the bare prctl(2) plus an errno read: async-signal-safe.)
            let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
            let mut pfd = libc::pollfd {
                fd: sync_rd,
                events: libc::POLLIN,
                revents: 0,
            };
            if libc::poll(&mut pfd, 1, 0) < 0 || pfd.revents & libc::POLLHUP != 0 {
                libc::_exit(125);
            }
            if let Some((input, out, err)) = stdio {
                if libc::dup2(input, 0) < 0 || libc::dup2(out, 1) < 0 || libc::dup2(err, 2) < 0 {
                    libc::_exit(123);
                }
            }
            for fd in c.keep {
                libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, 0);
            }
            libc::syscall(
                libc::SYS_execveat,
                exe,
                empty.as_ptr(),
                argv_p.as_ptr(),
                envp.as_ptr(),
                libc::AT_EMPTY_PATH,
            );
            libc::_exit(127);
        }
    }
    if ret < 0 {
        return Err(Errno::last());
    }
    // SAFETY: the kernel stored a fresh pidfd at `pidfd` (CLONE_PIDFD), owned by nobody else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok((Pid::from_raw(ret as i32), pidfd))
}

#[cfg(test)]
#[path = "sys_go_tests.rs"]
mod go_tests;

/// At most this many cgroup v1 hierarchies are joined (one `tasks` file each).
pub(crate) const MAX_CGROUP_TASKS: usize = 16;

/// Room for `n` descriptors in a control message.
fn cmsg_space(n: usize) -> usize {
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    unsafe { libc::CMSG_SPACE((n * std::mem::size_of::<libc::c_int>()) as u32) as usize }
}

/// The supervisor's go to the child [`clone_init`] made: one byte on the sync socket,
/// with the cgroup v1 `tasks` files it is to join (at most [`MAX_CGROUP_TASKS`]).
pub(crate) fn release_init(sync: BorrowedFd<'_>, cgroup_tasks: &[OwnedFd]) -> nix::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    if cgroup_tasks.len() > MAX_CGROUP_TASKS {
        return Err(Errno::E2BIG);
    }
    let fds: Vec<RawFd> = cgroup_tasks.iter().map(|f| f.as_raw_fd()).collect();
    let cmsgs = [ControlMessage::ScmRights(&fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsgs };
    // The byte tells how many files come with it (the child checks).
    let go = [1 + fds.len() as u8];
    let iov = [std::io::IoSlice::new(&go)];
    match sendmsg::<()>(sync.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)? {
        1 => Ok(()),
        _ => Err(Errno::EIO),
    }
}

// ---------------------------------------------------------------------------------------
// pidfds (nix 0.30 has neither pidfd_open nor pidfd_send_signal)
// ---------------------------------------------------------------------------------------

/// pidfd_open(2): a descriptor that names `pid` for good (immune to pid reuse).
pub fn pidfd_open(pid: Pid) -> nix::Result<OwnedFd> {
    // SAFETY: pidfd_open(pid, 0) takes no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    let fd = RawFd::try_from(Errno::result(fd)?).map_err(|_| Errno::EBADF)?;
    // SAFETY: `fd` was just returned by pidfd_open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// pidfd_send_signal(2): sends `sig` to the process `pidfd` names (no siginfo, flags 0).
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: Signal) -> nix::Result<()> {
    // SAFETY: the descriptor is borrowed, so open for the call; a null siginfo is allowed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig as libc::c_int,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    Errno::result(r).map(drop)
}

/// Registers a borrowed descriptor (a pidfd) with the current tokio reactor.
pub fn async_fd(
    fd: BorrowedFd<'_>,
    interest: tokio::io::Interest,
) -> std::io::Result<tokio::io::unix::AsyncFd<BorrowedFd<'_>>> {
    // SAFETY: `fd` is borrowed for the AsyncFd's whole life (its lifetime is tied to the
    // borrow), so it stays open and is the same descriptor until the AsyncFd is dropped.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, interest) }.map_err(|e| e.into())
}

// ---------------------------------------------------------------------------------------
// Signal dispositions
// ---------------------------------------------------------------------------------------

/// Gives `sig` its default disposition.
pub fn default_disposition(sig: Signal) -> nix::Result<()> {
    // SAFETY: SIG_DFL installs no handler of ours, so no handler can break
    // async-signal-safety.
    unsafe { signal(sig, SigHandler::SigDfl) }.map(drop)
}

extern "C" fn do_nothing(_: libc::c_int) {}

/// Catches `sig` with a handler that does nothing (SA_RESTART): the signal is delivered,
/// not dropped (pid 1 ignores signals left at SIG_DFL), and can be read from a signalfd.
pub fn catch_with_noop(sig: Signal) -> nix::Result<()> {
    let sa = SigAction::new(
        SigHandler::Handler(do_nothing),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handler does nothing, which is async-signal-safe.
    unsafe { sigaction(sig, &sa) }.map(drop)
}

static SIGNAL_FLAG: AtomicBool = AtomicBool::new(false);

extern "C" fn raise_flag(_: libc::c_int) {
    SIGNAL_FLAG.store(true, Ordering::SeqCst);
}

/// Makes each of `sigs` only raise the process-wide signal flag (SA_RESTART); read it with
/// [`signal_flag`]. A signal that already raised it is not forgotten.
pub fn flag_on_signals(sigs: &[Signal]) {
    let sa = SigAction::new(
        SigHandler::Handler(raise_flag),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for s in sigs {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        let _ = unsafe { sigaction(*s, &sa) };
    }
}

/// Whether one of the signals given to [`flag_on_signals`] arrived since.
pub fn signal_flag() -> bool {
    SIGNAL_FLAG.load(Ordering::SeqCst)
}

// ---------------------------------------------------------------------------------------
// Privileges (nix has no PR_SET_SECUREBITS, nor PR_GET_SECCOMP)
// ---------------------------------------------------------------------------------------

/// prctl(PR_SET_SECUREBITS, bits).
pub fn set_securebits(bits: libc::c_ulong) -> nix::Result<()> {
    // SAFETY: prctl with integer arguments only.
    Errno::result(unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0) }).map(drop)
}

/// prctl(PR_GET_SECCOMP): 0 (off), 1 (strict) or 2 (filter).
pub fn seccomp_mode() -> nix::Result<i32> {
    // SAFETY: PR_GET_SECCOMP takes no pointer arguments and only reads the caller's mode.
    Errno::result(unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) })
}

// ---------------------------------------------------------------------------------------
// seccomp(2) and landlock(7) (neither in nix)
// ---------------------------------------------------------------------------------------

/// One classic BPF instruction (code, jt, jf, k), laid out exactly as the kernel's
/// `struct sock_filter` (asserted below, where it is handed to the kernel); serialized as a
/// 4-element array.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct Insn(pub(super) u16, pub(super) u8, pub(super) u8, pub(super) u32);

// `seccomp_set_mode_filter` hands a `[Insn]` to the kernel as a `[libc::sock_filter]`.
const _: () = assert!(std::mem::size_of::<Insn>() == std::mem::size_of::<libc::sock_filter>());
const _: () = assert!(std::mem::align_of::<Insn>() == std::mem::align_of::<libc::sock_filter>());
const _: () = assert!(std::mem::offset_of!(Insn, 1) == std::mem::offset_of!(libc::sock_filter, jt));
const _: () = assert!(std::mem::offset_of!(Insn, 2) == std::mem::offset_of!(libc::sock_filter, jf));
const _: () = assert!(std::mem::offset_of!(Insn, 3) == std::mem::offset_of!(libc::sock_filter, k));

/// seccomp(SECCOMP_SET_MODE_FILTER, 0, program) on the calling thread. Does not allocate.
/// EINVAL for a program longer than a `sock_fprog` can hold.
pub(super) fn seccomp_set_mode_filter(program: &[Insn]) -> nix::Result<()> {
    let len = u16::try_from(program.len()).map_err(|_| Errno::EINVAL)?;
    let fprog = libc::sock_fprog {
        len,
        filter: program.as_ptr().cast::<libc::sock_filter>().cast_mut(),
    };
    // SAFETY: `Insn` is repr(C) with the same fields, sizes and alignment as
    // `sock_filter` (asserted at compile time above); `fprog` points to `len` live
    // instructions for the duration of the call, and the kernel copies them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0 as libc::c_ulong,
            &fprog as *const libc::sock_fprog,
        )
    };
    Errno::result(rc).map(drop)
}

/// seccomp(SECCOMP_GET_ACTION_AVAIL): whether the kernel supports filter action `action`.
pub fn seccomp_action_avail(action: u32) -> nix::Result<()> {
    // SAFETY: SECCOMP_GET_ACTION_AVAIL reads one u32 through the pointer, which points
    // to a live local for the duration of the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_ACTION_AVAIL,
            0 as libc::c_ulong,
            &action as *const u32,
        )
    };
    Errno::result(rc).map(drop)
}

/// landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION): the kernel's
/// Landlock ABI version (0 or an errno when there is none).
pub fn landlock_abi_version() -> nix::Result<i64> {
    const CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attribute, size 0 and the VERSION flag the call only queries the
    // ABI version; it reads no memory and creates no file descriptor.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    Errno::result(ret)
}

// ---------------------------------------------------------------------------------------
// Mounts (nix has no mount_setattr)
// ---------------------------------------------------------------------------------------

/// mount_setattr(2) on `path` and every mount below it (AT_RECURSIVE): sets `set`,
/// clears `clr` (MOUNT_ATTR_* bits).
pub fn mount_setattr_recursive(path: &CStr, set: u64, clr: u64) -> nix::Result<()> {
    mount_setattr(libc::AT_FDCWD, path, AT_RECURSIVE, set, clr)
}

/// The one mount_setattr(2) call: on `dirfd` + `path` with `flags`, recursively setting
/// `set` and clearing `clr`.
fn mount_setattr(
    dirfd: RawFd,
    path: &CStr,
    flags: libc::c_uint,
    set: u64,
    clr: u64,
) -> nix::Result<()> {
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clr,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `dirfd` is AT_FDCWD or a descriptor the caller keeps open for the call,
    // `path` a valid NUL-terminated string, `attr` a properly laid-out struct mount_attr
    // that lives for the call, and its size is passed alongside.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    Errno::result(r).map(drop)
}

/// AT_RECURSIVE (linux/fcntl.h).
const AT_RECURSIVE: libc::c_uint = 0x8000;

/// open_tree(2) with OPEN_TREE_CLONE | AT_RECURSIVE | OPEN_TREE_CLOEXEC: a detached copy of
/// the mount tree at `path` (attached nowhere; it lives as long as the descriptor, or
/// until it is attached with [`move_mount_to`]).
pub fn open_tree_clone(path: &CStr) -> nix::Result<OwnedFd> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    let flags = OPEN_TREE_CLONE | AT_RECURSIVE | libc::O_CLOEXEC as libc::c_uint;
    // SAFETY: `path` is a valid NUL-terminated string for the call; on success the kernel
    // returns a fresh descriptor that nothing else owns, which the OwnedFd then owns alone.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags) };
    let fd = Errno::result(fd)?;
    // SAFETY: as above: `fd` is a new descriptor owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// mount_setattr(2) on the detached (or attached) mount tree `tree` refers to, recursively:
/// sets `set`, clears `clr` (MOUNT_ATTR_* bits).
pub fn mount_setattr_fd(tree: BorrowedFd<'_>, set: u64, clr: u64) -> nix::Result<()> {
    mount_setattr(
        tree.as_raw_fd(),
        c"",
        AT_RECURSIVE | libc::AT_EMPTY_PATH as libc::c_uint,
        set,
        clr,
    )
}

/// move_mount(2) of the detached tree `tree` onto `dst` (MOVE_MOUNT_F_EMPTY_PATH).
pub fn move_mount_to(tree: BorrowedFd<'_>, dst: &CStr) -> nix::Result<()> {
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    // SAFETY: the descriptor is open for the call and both paths are valid NUL-terminated
    // strings that live for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    Errno::result(r).map(drop)
}

/// A new tmpfs (fsopen, fsconfig `size`/`mode`, fsmount), attached nowhere: the
/// descriptor of its root, with the MOUNT_ATTR_* bits `attrs`.
pub fn detached_tmpfs(size: &CStr, mode: &CStr, attrs: u64) -> nix::Result<OwnedFd> {
    const FSOPEN_CLOEXEC: libc::c_uint = 1;
    const FSCONFIG_SET_STRING: libc::c_uint = 1;
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
    const FSMOUNT_CLOEXEC: libc::c_uint = 1;
    // SAFETY: the name is a valid NUL-terminated string; on success the kernel returns a
    // fresh descriptor that nothing else owns, which the OwnedFd owns alone.
    let fs = unsafe {
        let r = Errno::result(libc::syscall(
            libc::SYS_fsopen,
            c"tmpfs".as_ptr(),
            FSOPEN_CLOEXEC,
        ))?;
        OwnedFd::from_raw_fd(r as RawFd)
    };
    for (key, value) in [(c"source", c"tmpfs"), (c"size", size), (c"mode", mode)] {
        // SAFETY: the descriptor is open; key and value are valid NUL-terminated strings
        // that live for the call.
        Errno::result(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                FSCONFIG_SET_STRING,
                key.as_ptr(),
                value.as_ptr(),
                0,
            )
        })?;
    }
    // SAFETY: the descriptor is open; CMD_CREATE takes no pointers (NULL key and value).
    Errno::result(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_char>(),
            0,
        )
    })?;
    // SAFETY: the descriptor is open and created; on success the kernel returns a fresh
    // descriptor that nothing else owns, which the OwnedFd owns alone.
    unsafe {
        let r = Errno::result(libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            FSMOUNT_CLOEXEC,
            attrs as libc::c_uint,
        ))?;
        Ok(OwnedFd::from_raw_fd(r as RawFd))
    }
}

/// open_tree(2) with OPEN_TREE_CLONE of `name` beneath the mount `dir` refers to: a
/// detached bind of that one file or directory.
pub fn open_tree_clone_at(dir: BorrowedFd<'_>, name: &CStr) -> nix::Result<OwnedFd> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    let flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
    // SAFETY: the descriptor is open and `name` a valid NUL-terminated string for the
    // call; on success the kernel returns a fresh descriptor that nothing else owns.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, dir.as_raw_fd(), name.as_ptr(), flags) };
    let fd = Errno::result(fd)?;
    // SAFETY: as above: `fd` is a new descriptor owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

// ---------------------------------------------------------------------------------------
// Network interfaces (nix has no SIOCGIFFLAGS / SIOCSIFFLAGS)
// ---------------------------------------------------------------------------------------

/// A zeroed `ifreq` naming interface `name` (EINVAL if the name does not fit).
fn ifreq_for(name: &str) -> nix::Result<libc::ifreq> {
    // SAFETY: ifreq is plain old data (integers, arrays and a union of them); all-zero is
    // a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= req.ifr_name.len() || name.as_bytes().contains(&0) {
        return Err(Errno::EINVAL);
    }
    for (slot, b) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *slot = *b as libc::c_char;
    }
    Ok(req)
}

/// The flags (IFF_*) of interface `name`, through socket `sock` (SIOCGIFFLAGS).
pub fn interface_flags(sock: BorrowedFd<'_>, name: &str) -> nix::Result<libc::c_short> {
    let mut req = ifreq_for(name)?;
    // SAFETY: the socket is open for the call and `req` is a valid ifreq naming the
    // interface, which SIOCGIFFLAGS fills in place.
    Errno::result(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) })?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    Ok(unsafe { req.ifr_ifru.ifru_flags })
}

/// Sets the flags (IFF_*) of interface `name`, through socket `sock` (SIOCSIFFLAGS).
pub fn set_interface_flags(
    sock: BorrowedFd<'_>,
    name: &str,
    flags: libc::c_short,
) -> nix::Result<()> {
    let mut req = ifreq_for(name)?;
    req.ifr_ifru.ifru_flags = flags;
    // SAFETY: the socket is open for the call and `req` is a valid ifreq naming the
    // interface with its flags member set; SIOCSIFFLAGS only reads it.
    Errno::result(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) }).map(drop)
}

// ---------------------------------------------------------------------------------------
// Test support
// ---------------------------------------------------------------------------------------

/// Runs `hook` in the child between fork and exec (`CommandExt::pre_exec`).
///
/// Contract: the test process has many threads, so `hook` makes only async-signal-safe
/// calls: it must not allocate, free or take a lock.
#[cfg(test)]
pub(crate) fn pre_exec<F>(cmd: &mut std::process::Command, hook: F)
where
    F: FnMut() -> std::io::Result<()> + Send + Sync + 'static,
{
    use std::os::unix::process::CommandExt;
    // SAFETY: per the contract the hook is async-signal-safe, which is all pre_exec asks.
    unsafe {
        cmd.pre_exec(hook);
    }
}

// ---------------------------------------------------------------------------------------
// Capabilities (the command's side, right before Landlock and seccomp)
// ---------------------------------------------------------------------------------------

/// `struct __user_cap_header_struct` of capset(2).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct` of capset(2) (two of them in version 3).
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets, as two `CapData`.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Empties the calling thread's effective, permitted and inheritable capability sets in
/// one capset(2) (the `caps` crate reads and writes each set in turn: three round trips).
pub fn capset_clear_all() -> nix::Result<()> {
    let header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: `header` and `data` are the kernel's version-3 structures (repr(C), two data
    // entries as version 3 requires), live for the duration of the call; the kernel only
    // reads them.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) };
    Errno::result(rc).map(drop)
}

/// Sets the calling thread's effective uid (and with it its filesystem uid) to `euid`, and
/// only the calling thread's: setresuid(2) made directly (glibc's `setresuid`, which nix
/// calls, changes every thread of the process). The real and saved uids stay as they are,
/// so a thread whose real uid is 0 can always return. See `userns_owner`.
pub fn thread_seteuid(euid: u32) -> nix::Result<()> {
    // On 32-bit x86 and Arm, `setresuid` is the old 16-bit call.
    #[cfg(any(target_arch = "x86", target_arch = "arm"))]
    let nr = libc::SYS_setresuid32;
    #[cfg(not(any(target_arch = "x86", target_arch = "arm")))]
    let nr = libc::SYS_setresuid;
    let keep = libc::uid_t::MAX;
    // SAFETY: setresuid takes three integers and touches no memory of ours; -1 (uid_t::MAX)
    // leaves the real and saved uids unchanged.
    let rc = unsafe { libc::syscall(nr, keep, euid as libc::uid_t, keep) };
    Errno::result(rc).map(drop)
}

// ---------------------------------------------------------------------------------------
// Per-thread filesystem identity (see `fs_identity`)
// ---------------------------------------------------------------------------------------

/// Sets the calling thread's supplementary groups to `groups`, and only the calling
/// thread's: setgroups(2) made directly (glibc's `setgroups`, which nix calls, changes every
/// thread of the process). Needs CAP_SETGID.
pub fn thread_setgroups(groups: &[u32]) -> nix::Result<()> {
    // On 32-bit x86 and Arm, `setgroups` is the old 16-bit call.
    #[cfg(any(target_arch = "x86", target_arch = "arm"))]
    let nr = libc::SYS_setgroups32;
    #[cfg(not(any(target_arch = "x86", target_arch = "arm")))]
    let nr = libc::SYS_setgroups;
    // SAFETY: the kernel reads `groups.len()` gid_t values from the pointer, which points
    // into the live slice (gid_t is u32 on Linux); a null pointer is never passed with a
    // nonzero length.
    let rc = unsafe {
        libc::syscall(
            nr,
            groups.len() as libc::size_t,
            groups.as_ptr() as *const libc::gid_t,
        )
    };
    Errno::result(rc).map(drop)
}
