//! `hostile`: a probe program for the sandbox's hostile test suites.
//!
//! `hostile PROBE [ARGS]` performs ONE hostile action, prints one JSON line
//! `{"probe": "...", "succeeded": bool, "errno": <int or null>, "detail": "...", ...}`
//! and exits 0 (3 for a usage error). `succeeded: true` means the hostile action worked,
//! i.e. containment failed.
//!
//! Every probe stays harmless if it succeeds, even run as root on a bare host: it acts
//! only on what it created itself (a child it forks and kills, a directory it creates
//! under the directory it was given, its own process keyring, a pty it opens), talks to
//! loopback only, is bounded in count, size and time, and makes privileged calls with
//! arguments the kernel must reject (reboot with a bad magic, kexec with bad flags or a bad
//! fd, a module name that cannot exist, swap on a path that does not exist).
//!
//! Raw system calls need `unsafe`; each block says why it is sound.

use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};

const USAGE: &str = "\
usage: hostile PROBE [ARGS]   performs one hostile action, prints one JSON line, exits 0
                              (exit 3: usage error)

system calls (DIR defaults to $TMPDIR; the probe works in a fresh directory under it):
  ptrace  process_vm_readv          on a child the probe forks and kills
  mount [DIR]  umount2 [DIR]  pivot_root [DIR]  chroot [DIR]
  unshare-user  unshare-net  setns  clone-newuser  clone3 (ENOSYS expected)
  bpf  keyctl  add_key  request_key  perf_event_open  userfaultfd  io_uring_setup
  kexec_load  kexec_file_load  init_module  finit_module  delete_module
  reboot  swapon  swapoff  open_by_handle_at [DIR]
  mknod-char [DIR]  mknod-fifo [DIR] (control: should succeed)
  tiocsti  tioclinux                on a pty the probe opens
  personality-noaslr  personality-query (control: should succeed)
files and others:
  write-file PATH  read-file PATH  list-dir PATH
  symlink-escape DIR TARGET  hardlink DIR TARGET
  connect-tcp HOST:PORT  bind-tcp PORT  udp-send HOST:PORT     (loopback only)
  env  proc1-environ  kill PID SIG (PID > 0; PID 1 only with SIG 0)
  fork-many N SECS (N <= 256, SECS <= 30)  alloc MIB (<= 4096)
  write-bytes PATH MIB (<= 4096)  sleep SECS (<= 3600)  orphans N [SECS] (N <= 64, SECS <= 300)
  getuid  hostname  ifaces  mounts  devices
";

const MIB: usize = 1 << 20;
const MARK: &[u8] = b"fork-hostile\n";

/// The result of one probe.
struct Outcome {
    succeeded: bool,
    errno: Option<i32>,
    detail: String,
    extra: Map<String, Value>,
}

impl Outcome {
    fn ok(detail: impl Into<String>) -> Self {
        Outcome {
            succeeded: true,
            errno: None,
            detail: detail.into(),
            extra: Map::new(),
        }
    }

    fn failed(errno: Option<i32>, detail: impl Into<String>) -> Self {
        Outcome {
            succeeded: false,
            errno,
            detail: detail.into(),
            extra: Map::new(),
        }
    }

    fn io(err: &io::Error, what: &str) -> Self {
        Self::failed(err.raw_os_error(), format!("{what}: {err}"))
    }

    /// From a raw system call's return value (errno is read right away).
    fn sys(rc: libc::c_long, what: &str) -> Self {
        if rc < 0 {
            Self::io(&io::Error::last_os_error(), what)
        } else {
            Self::ok(format!("{what} returned {rc}"))
        }
    }

    fn from_result(r: Result<String, io::Error>, what: &str) -> Self {
        match r {
            Ok(detail) => Self::ok(detail),
            Err(e) => Self::io(&e, what),
        }
    }

    fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(key.to_string(), value.into());
        self
    }
}

struct Usage(String);

type ProbeResult = Result<Outcome, Usage>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(probe) = args.first() else {
        usage_exit("missing PROBE");
    };
    match run(probe, &args[1..]) {
        Ok(outcome) => {
            let mut line = Map::new();
            line.insert("probe".into(), json!(probe));
            line.insert("succeeded".into(), json!(outcome.succeeded));
            line.insert("errno".into(), json!(outcome.errno));
            line.insert("detail".into(), json!(outcome.detail));
            line.extend(outcome.extra);
            println!("{}", Value::Object(line));
        }
        Err(Usage(msg)) => usage_exit(&msg),
    }
}

fn usage_exit(msg: &str) -> ! {
    eprintln!("hostile: {msg}\n\n{USAGE}");
    std::process::exit(3);
}

fn run(probe: &str, a: &[String]) -> ProbeResult {
    let dir = || -> PathBuf {
        a.first()
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir)
    };
    Ok(match probe {
        "ptrace" => ptrace_probe(),
        "process_vm_readv" => process_vm_readv_probe(),
        "mount" => with_workdir(&dir(), "mount", mount_probe),
        "umount2" => with_workdir(&dir(), "umount2", umount2_probe),
        "pivot_root" => with_workdir(&dir(), "pivot_root", pivot_root_probe),
        "chroot" => with_workdir(&dir(), "chroot", chroot_probe),
        "unshare-user" => in_child("unshare(CLONE_NEWUSER)", || {
            // SAFETY: unshare takes no pointers; it affects only this forked child.
            unsafe { libc::unshare(libc::CLONE_NEWUSER) }.into()
        }),
        "unshare-net" => in_child("unshare(CLONE_NEWNET)", || {
            // SAFETY: unshare takes no pointers; it affects only this forked child.
            unsafe { libc::unshare(libc::CLONE_NEWNET) }.into()
        }),
        "setns" => setns_probe(),
        "clone-newuser" => clone_newuser_probe(),
        "clone3" => clone3_probe(),
        "bpf" => bpf_probe(),
        "keyctl" => keyctl_probe(),
        "add_key" => add_key_probe(),
        "request_key" => request_key_probe(),
        "perf_event_open" => perf_event_open_probe(),
        "userfaultfd" => userfaultfd_probe(),
        "io_uring_setup" => io_uring_setup_probe(),
        "kexec_load" => kexec_load_probe(),
        "kexec_file_load" => kexec_file_load_probe(),
        "init_module" => init_module_probe(),
        "finit_module" => finit_module_probe(),
        "delete_module" => delete_module_probe(),
        "reboot" => reboot_probe(),
        "swapon" => swap_probe(true),
        "swapoff" => swap_probe(false),
        "mknod-char" => with_workdir(&dir(), "mknod-char", |d| mknod_probe(d, true)),
        "mknod-fifo" => with_workdir(&dir(), "mknod-fifo", |d| mknod_probe(d, false)),
        "tiocsti" => tty_probe(libc::TIOCSTI, "TIOCSTI"),
        "tioclinux" => tty_probe(libc::TIOCLINUX, "TIOCLINUX"),
        "personality-noaslr" => personality_noaslr_probe(),
        "personality-query" => personality_query_probe(),
        "open_by_handle_at" => open_by_handle_at_probe(&dir()),
        "write-file" => write_file_probe(&path_arg(a, 0, "PATH")?),
        "read-file" => read_file_probe(&path_arg(a, 0, "PATH")?),
        "list-dir" => list_dir_probe(&path_arg(a, 0, "PATH")?),
        "symlink-escape" => {
            symlink_escape_probe(&path_arg(a, 0, "DIR")?, &path_arg(a, 1, "TARGET")?)
        }
        "hardlink" => hardlink_probe(&path_arg(a, 0, "DIR")?, &path_arg(a, 1, "TARGET")?),
        "connect-tcp" => connect_tcp_probe(loopback_arg(a, 0)?),
        "bind-tcp" => bind_tcp_probe(num_arg(a, 0, "PORT", u16::MAX)?),
        "udp-send" => udp_send_probe(loopback_arg(a, 0)?),
        "env" => env_probe(),
        "proc1-environ" => proc1_environ_probe(),
        "kill" => kill_probe(a)?,
        "fork-many" => fork_many_probe(num_arg(a, 0, "N", 256)?, num_arg(a, 1, "SECS", 30)?),
        "alloc" => alloc_probe(num_arg(a, 0, "MIB", 4096)?),
        "write-bytes" => write_bytes_probe(&path_arg(a, 0, "PATH")?, num_arg(a, 1, "MIB", 4096)?),
        "sleep" => {
            let secs = num_arg(a, 0, "SECS", 3600)?;
            std::thread::sleep(Duration::from_secs(secs));
            Outcome::ok(format!("slept {secs} s")).with("slept_secs", secs)
        }
        "orphans" => {
            let secs = if a.len() > 1 {
                num_arg(a, 1, "SECS", 300)?
            } else {
                30
            };
            orphans_probe(num_arg(a, 0, "N", 64)?, secs)
        }
        "getuid" => getuid_probe(),
        "hostname" => hostname_probe(),
        "ifaces" => ifaces_probe(),
        "mounts" => mounts_probe(),
        "devices" => devices_probe(),
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            std::process::exit(0);
        }
        other => return Err(Usage(format!("unknown probe `{other}`"))),
    })
}

// ---------------------------------------------------------------- arguments

fn path_arg(a: &[String], i: usize, name: &str) -> Result<PathBuf, Usage> {
    a.get(i)
        .map(PathBuf::from)
        .ok_or_else(|| Usage(format!("missing {name}")))
}

/// A number in 0..=max; larger values are refused rather than silently clamped.
fn num_arg<T>(a: &[String], i: usize, name: &str, max: T) -> Result<T, Usage>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display,
{
    let raw = a.get(i).ok_or_else(|| Usage(format!("missing {name}")))?;
    let n: T = raw
        .parse()
        .map_err(|_| Usage(format!("{name} must be a number, not `{raw}`")))?;
    if n > max {
        return Err(Usage(format!("{name} is capped at {max}, got {raw}")));
    }
    Ok(n)
}

/// HOST:PORT with a literal loopback address; anything else is refused.
fn loopback_arg(a: &[String], i: usize) -> Result<SocketAddr, Usage> {
    let raw = a.get(i).ok_or_else(|| Usage("missing HOST:PORT".into()))?;
    let raw = raw.replace("localhost:", "127.0.0.1:");
    let addr: SocketAddr = raw
        .parse()
        .map_err(|_| Usage(format!("`{raw}` is not an IP:PORT address")))?;
    if !addr.ip().is_loopback() {
        return Err(Usage(format!("refusing non-loopback address {addr}")));
    }
    Ok(addr)
}

fn cstr(p: &Path) -> CString {
    // A path from argv or read_dir cannot hold a NUL byte; map one to an invalid path.
    CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

// ---------------------------------------------------------------- helpers

/// Runs `f` in a fresh directory under `base`, removed afterwards.
fn with_workdir(base: &Path, probe: &str, f: impl FnOnce(&Path) -> Outcome) -> Outcome {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = base.join(format!(
        "fork-hostile-{probe}-{}-{nanos}",
        std::process::id()
    ));
    if let Err(e) = fs::create_dir(&dir) {
        return Outcome::io(&e, &format!("create {}", dir.display()));
    }
    let outcome = f(&dir);
    // Only ever removes what the probe created; fails harmlessly on a busy mount point.
    let _ = fs::remove_dir_all(&dir);
    outcome
}

/// Runs `f` in a forked child; the child exits with 0 on success or the errno.
fn in_child(what: &str, f: impl FnOnce() -> libc::c_long) -> Outcome {
    // SAFETY: this program is single-threaded, so the child may run arbitrary code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Outcome::io(&io::Error::last_os_error(), "fork");
    }
    if pid == 0 {
        let rc = f();
        let code = if rc < 0 { errno().clamp(1, 255) } else { 0 };
        // SAFETY: _exit ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    match wait_exit_code(pid) {
        Some(0) => Outcome::ok(format!("{what} succeeded in a child")),
        Some(code) => Outcome::failed(
            Some(code),
            format!("{what}: {}", io::Error::from_raw_os_error(code)),
        ),
        None => Outcome::failed(None, format!("{what}: the child died of a signal")),
    }
}

/// Waits for `pid`; its exit code, or None if a signal ended it.
fn wait_exit_code(pid: libc::pid_t) -> Option<i32> {
    let mut status = 0;
    // SAFETY: waitpid writes the status into a live local.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        if errno() != libc::EINTR {
            return None;
        }
    }
    libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status))
}

/// A child that sleeps (at most 30 s) until it is killed, reaped on drop.
struct Sleeper(libc::pid_t);

impl Sleeper {
    fn spawn() -> io::Result<Sleeper> {
        // SAFETY: single-threaded program; the child only sleeps and exits.
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            0 => {
                for _ in 0..30 {
                    // SAFETY: sleep has no preconditions.
                    unsafe { libc::sleep(1) };
                }
                // SAFETY: ends the child at once.
                unsafe { libc::_exit(0) }
            }
            pid => Ok(Sleeper(pid)),
        }
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        // SAFETY: self.0 is our own child, not yet reaped, so the pid cannot be reused.
        unsafe { libc::kill(self.0, libc::SIGKILL) };
        let _ = wait_exit_code(self.0);
    }
}

static PROBE_WORD: u64 = 0x5eed_f00d_dead_beef;

// ---------------------------------------------------------------- system-call probes

fn ptrace_probe() -> Outcome {
    let child = match Sleeper::spawn() {
        Ok(c) => c,
        Err(e) => return Outcome::io(&e, "fork"),
    };
    let null = std::ptr::null_mut::<libc::c_void>();
    // SAFETY: PTRACE_ATTACH to our own child; addr and data are unused.
    let rc = unsafe { libc::ptrace(libc::PTRACE_ATTACH, child.0, null, null) };
    Outcome::sys(rc, &format!("ptrace(PTRACE_ATTACH, own child {})", child.0))
}

fn process_vm_readv_probe() -> Outcome {
    let child = match Sleeper::spawn() {
        Ok(c) => c,
        Err(e) => return Outcome::io(&e, "fork"),
    };
    let mut buf = 0u64;
    let local = libc::iovec {
        iov_base: (&mut buf as *mut u64).cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: (&PROBE_WORD as *const u64).cast_mut().cast(),
        iov_len: 8,
    };
    // SAFETY: `local` covers 8 writable bytes of `buf`; `remote` names an address in the
    // child (a fork of this process, so the static is at the same address).
    let rc = unsafe { libc::process_vm_readv(child.0, &local, 1, &remote, 1, 0) };
    let out = Outcome::sys(rc as libc::c_long, "process_vm_readv(own child)");
    if out.succeeded {
        out.with("matched", buf == PROBE_WORD)
    } else {
        out
    }
}

fn mount_probe(dir: &Path) -> Outcome {
    let target = cstr(dir);
    let fstype = c"tmpfs";
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: all pointers are NUL-terminated strings alive for the call; the target is
    // the directory this probe created.
    let rc = unsafe {
        libc::mount(
            c"fork-hostile".as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            c"size=1m".as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Outcome::sys(-1, "mount(tmpfs) on the probe's own directory");
    }
    // SAFETY: unmounts the tmpfs just mounted on our own directory.
    let urc = unsafe { libc::umount2(target.as_ptr(), 0) };
    Outcome::ok("mounted a tmpfs on the probe's own directory").with("unmounted", urc == 0)
}

fn umount2_probe(dir: &Path) -> Outcome {
    let target = cstr(dir);
    // SAFETY: the target is the probe's own, freshly created directory (not a mount point,
    // so the kernel answers EINVAL unless a filter answers first).
    let rc = unsafe { libc::umount2(target.as_ptr(), 0) };
    Outcome::sys(rc.into(), "umount2 on the probe's own directory")
}

fn pivot_root_probe(dir: &Path) -> Outcome {
    let old = dir.join("old");
    if let Err(e) = fs::create_dir(&old) {
        return Outcome::io(&e, "mkdir");
    }
    let (new_root, put_old) = (cstr(dir), cstr(&old));
    // SAFETY: both strings are alive for the call. new_root is a directory the probe just
    // created, never a mount point, so the kernel must refuse (EINVAL) if no filter does.
    let rc = unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) };
    Outcome::sys(rc, "pivot_root(own directory)")
}

fn chroot_probe(dir: &Path) -> Outcome {
    let path = cstr(dir);
    in_child("chroot(own directory)", || {
        // SAFETY: the string is alive; the new root only affects this forked child.
        unsafe { libc::chroot(path.as_ptr()) }.into()
    })
}

fn setns_probe() -> Outcome {
    let ns = match File::open("/proc/self/ns/net") {
        Ok(f) => f,
        Err(e) => return Outcome::io(&e, "open /proc/self/ns/net"),
    };
    in_child("setns(own network namespace)", || {
        // SAFETY: rejoins the namespace the child is already in, through a live fd.
        unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) }.into()
    })
}

fn clone_newuser_probe() -> Outcome {
    let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: a raw clone without CLONE_VM and with a null stack behaves like fork; the
    // child only calls _exit.
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    match pid {
        -1 => Outcome::sys(-1, "clone(CLONE_NEWUSER)"),
        // SAFETY: ends the child at once.
        0 => unsafe { libc::_exit(0) },
        pid => {
            let _ = wait_exit_code(pid as libc::pid_t);
            Outcome::ok("clone(CLONE_NEWUSER) created a child in a new user namespace")
        }
    }
}

fn clone3_probe() -> Outcome {
    // struct clone_args, version 0 (64 bytes): flags, pidfd, child_tid, parent_tid,
    // exit_signal, stack, stack_size, tls.
    let mut args = [0u64; 8];
    args[4] = libc::SIGCHLD as u64;
    // SAFETY: the kernel reads 64 bytes of `args`; no CLONE_VM, so the child gets a copy of
    // this address space and only calls _exit.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            args.as_mut_ptr(),
            std::mem::size_of_val(&args),
        )
    };
    match pid {
        -1 => Outcome::sys(-1, "clone3"),
        // SAFETY: ends the child at once.
        0 => unsafe { libc::_exit(0) },
        pid => {
            let _ = wait_exit_code(pid as libc::pid_t);
            Outcome::ok("clone3 created a child")
        }
    }
}

fn close_if_fd(rc: libc::c_long) {
    if rc >= 0 {
        // SAFETY: rc is a descriptor the probe's system call just returned.
        unsafe { libc::close(rc as libc::c_int) };
    }
}

fn bpf_probe() -> Outcome {
    const BPF_PROG_LOAD: libc::c_long = 5;
    let attr = [0u8; 128];
    // SAFETY: the kernel reads `attr.len()` bytes of a live, zeroed buffer (an empty
    // program of type UNSPEC, which it must reject).
    let rc = unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_LOAD, attr.as_ptr(), attr.len()) };
    close_if_fd(rc);
    Outcome::sys(rc, "bpf(BPF_PROG_LOAD, empty attr)")
}

const KEYCTL_GET_KEYRING_ID: libc::c_long = 0;
const KEYCTL_INVALIDATE: libc::c_long = 21;
const KEY_SPEC_PROCESS_KEYRING: libc::c_long = -2;

fn keyctl_probe() -> Outcome {
    // SAFETY: no pointers; creates (at most) this process's private keyring.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_GET_KEYRING_ID,
            KEY_SPEC_PROCESS_KEYRING,
            1 as libc::c_long,
        )
    };
    Outcome::sys(rc, "keyctl(KEYCTL_GET_KEYRING_ID, own process keyring)")
}

fn add_key_probe() -> Outcome {
    let payload = b"x";
    // SAFETY: NUL-terminated literals and a 1-byte payload, all alive for the call; the
    // key goes to this process's own keyring, which dies with it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_add_key,
            c"user".as_ptr(),
            c"fork-hostile-probe".as_ptr(),
            payload.as_ptr(),
            payload.len(),
            KEY_SPEC_PROCESS_KEYRING,
        )
    };
    if rc >= 0 {
        // SAFETY: invalidates the key just created.
        unsafe { libc::syscall(libc::SYS_keyctl, KEYCTL_INVALIDATE, rc) };
    }
    Outcome::sys(rc, "add_key(user, own process keyring)")
}

fn request_key_probe() -> Outcome {
    let desc =
        CString::new(format!("fork-hostile-absent-{}", std::process::id())).unwrap_or_default();
    // SAFETY: NUL-terminated strings alive for the call; no callout (null), so no upcall.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_request_key,
            c"user".as_ptr(),
            desc.as_ptr(),
            std::ptr::null::<libc::c_char>(),
            0 as libc::c_long,
        )
    };
    Outcome::sys(rc, "request_key(user, absent key)")
}

fn perf_event_open_probe() -> Outcome {
    // struct perf_event_attr: type u32 @0, size u32 @4, config u64 @8, flag bits u64 @40.
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&1u32.to_ne_bytes()); // PERF_TYPE_SOFTWARE
    attr[4..8].copy_from_slice(&128u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&0u64.to_ne_bytes()); // PERF_COUNT_SW_CPU_CLOCK
    let bits: u64 = 1 | (1 << 5) | (1 << 6); // disabled, exclude_kernel, exclude_hv
    attr[40..48].copy_from_slice(&bits.to_ne_bytes());
    const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
    // SAFETY: the kernel reads the 128-byte attr; it counts this process only (pid 0).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            0 as libc::pid_t,
            -1 as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    close_if_fd(rc);
    Outcome::sys(rc, "perf_event_open(self, software cpu clock)")
}

fn userfaultfd_probe() -> Outcome {
    const UFFD_USER_MODE_ONLY: libc::c_int = 1;
    // SAFETY: no pointers; the descriptor is closed at once.
    let rc = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | UFFD_USER_MODE_ONLY) };
    close_if_fd(rc);
    Outcome::sys(rc, "userfaultfd")
}

fn io_uring_setup_probe() -> Outcome {
    let mut params = [0u8; 128]; // struct io_uring_params is 120 bytes
                                 // SAFETY: the kernel reads and writes up to 120 bytes of the live buffer.
    let rc = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    close_if_fd(rc);
    Outcome::sys(rc, "io_uring_setup(1 entry)")
}

fn kexec_load_probe() -> Outcome {
    // An unknown flag bit and 17 segments (the limit is 16): the kernel must reject it
    // after its permission check, so it can never load or unload anything.
    let flags: libc::c_ulong = 0x8000;
    // SAFETY: the segment pointer is null and never read (the call fails first).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_kexec_load,
            0 as libc::c_ulong,
            17 as libc::c_ulong,
            std::ptr::null::<libc::c_void>(),
            flags,
        )
    };
    Outcome::sys(rc, "kexec_load(bad flags, too many segments)")
}

fn kexec_file_load_probe() -> Outcome {
    // SAFETY: bad descriptors (-1), no command line, no flags (no unload): it must fail
    // reading the kernel image, before touching any loaded image.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_kexec_file_load,
            -1 as libc::c_int,
            -1 as libc::c_int,
            0 as libc::c_ulong,
            std::ptr::null::<libc::c_char>(),
            0 as libc::c_ulong,
        )
    };
    Outcome::sys(rc, "kexec_file_load(bad fd)")
}

fn init_module_probe() -> Outcome {
    let image = [0u8; 64]; // not an ELF file: can never load
                           // SAFETY: the kernel reads 64 bytes of the live buffer and an empty parameter string.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_init_module,
            image.as_ptr(),
            image.len(),
            c"".as_ptr(),
        )
    };
    Outcome::sys(rc, "init_module(zeroed image)")
}

fn finit_module_probe() -> Outcome {
    // SAFETY: a bad descriptor and an empty parameter string.
    let rc = unsafe { libc::syscall(libc::SYS_finit_module, -1 as libc::c_int, c"".as_ptr(), 0) };
    Outcome::sys(rc, "finit_module(bad fd)")
}

fn delete_module_probe() -> Outcome {
    // SAFETY: a NUL-terminated name no module can have; O_NONBLOCK never waits.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_delete_module,
            c"fork_hostile_no_such_module".as_ptr(),
            libc::O_NONBLOCK,
        )
    };
    Outcome::sys(rc, "delete_module(absent module)")
}

fn reboot_probe() -> Outcome {
    // magic1 is right, magic2 and the command are invalid: the kernel returns EINVAL.
    // SAFETY: the argument pointer is null and never read.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_reboot,
            0xfee1_dead_u32 as libc::c_int,
            0x00c0_ffee as libc::c_int,
            0xdead_beef_u32 as libc::c_int,
            std::ptr::null::<libc::c_void>(),
        )
    };
    Outcome::sys(rc, "reboot(invalid magic and command)")
}

fn swap_probe(on: bool) -> Outcome {
    let path = CString::new(format!(
        "/nonexistent-fork-hostile-{}/swap",
        std::process::id()
    ))
    .unwrap_or_default();
    // SAFETY: a NUL-terminated path (that does not exist) alive for the call.
    let rc = unsafe {
        if on {
            libc::syscall(libc::SYS_swapon, path.as_ptr(), 0)
        } else {
            libc::syscall(libc::SYS_swapoff, path.as_ptr())
        }
    };
    Outcome::sys(
        rc,
        if on {
            "swapon(absent path)"
        } else {
            "swapoff(absent path)"
        },
    )
}

fn mknod_probe(dir: &Path, char_dev: bool) -> Outcome {
    let path = dir.join(if char_dev { "char-node" } else { "fifo" });
    let c = cstr(&path);
    let (mode, dev) = if char_dev {
        (libc::S_IFCHR | 0o600, libc::makedev(1, 3)) // the same device as /dev/null
    } else {
        (libc::S_IFIFO | 0o600, 0)
    };
    // SAFETY: a NUL-terminated path in the probe's own directory.
    let rc = unsafe { libc::mknod(c.as_ptr(), mode, dev) };
    let what = if char_dev {
        "mknod(S_IFCHR 1:3)"
    } else {
        "mknod(S_IFIFO)"
    };
    let out = Outcome::sys(rc.into(), what);
    let _ = fs::remove_file(&path);
    out
}

/// Runs the terminal ioctl on a pty the probe opens itself (never on a terminal it
/// inherited: injecting input there would reach the user's shell). Without a pty, fd -1:
/// a filter still answers first; the kernel alone would answer EBADF.
fn tty_probe(request: libc::Ioctl, name: &str) -> Outcome {
    let pty = nix::pty::openpty(None, None);
    let (fd, on) = match &pty {
        Ok(p) => (p.slave.as_raw_fd(), "a pty the probe opened"),
        Err(_) => (-1, "fd -1 (no pty available)"),
    };
    let arg: u8 = if request == libc::TIOCSTI { b'#' } else { 7 }; // 7: TIOCL_GETSHIFTSTATE
                                                                   // SAFETY: the third argument points to one live byte, all either request reads.
    let rc = unsafe { libc::ioctl(fd, request, &arg as *const u8) };
    Outcome::sys(rc.into(), &format!("ioctl({name}) on {on}"))
}

const ADDR_NO_RANDOMIZE: libc::c_ulong = 0x0040000;

fn personality_noaslr_probe() -> Outcome {
    // SAFETY: 0xffffffff only queries the persona.
    let current = unsafe { libc::personality(0xffff_ffff) };
    if current < 0 {
        return Outcome::sys(-1, "personality(query)");
    }
    let current = current as libc::c_ulong;
    // SAFETY: changes this process's persona only; restored below.
    let rc = unsafe { libc::personality(current | ADDR_NO_RANDOMIZE) };
    let out = Outcome::sys(rc.into(), "personality(ADDR_NO_RANDOMIZE)");
    if out.succeeded {
        // SAFETY: restores the persona queried above.
        unsafe { libc::personality(current) };
    }
    out
}

fn personality_query_probe() -> Outcome {
    // SAFETY: 0xffffffff only queries the persona.
    let rc = unsafe { libc::personality(0xffff_ffff) };
    let out = Outcome::sys(rc.into(), "personality(0xffffffff)");
    if out.succeeded {
        out.with("persona", rc)
    } else {
        out
    }
}

fn open_by_handle_at_probe(dir: &Path) -> Outcome {
    let mount = match File::open(dir) {
        Ok(f) => f,
        Err(e) => return Outcome::io(&e, &format!("open {}", dir.display())),
    };
    // struct file_handle { u32 handle_bytes; i32 handle_type; u8 f_handle[8]; }, bogus.
    let mut handle = [0u8; 16];
    handle[0..4].copy_from_slice(&8u32.to_ne_bytes());
    handle[4..8].copy_from_slice(&1i32.to_ne_bytes()); // FILEID_INO32_GEN
                                                       // SAFETY: the kernel reads the 16-byte handle; a descriptor it returns is closed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount.as_raw_fd(),
            handle.as_ptr(),
            libc::O_RDONLY,
        )
    };
    close_if_fd(rc);
    Outcome::sys(rc, "open_by_handle_at(bogus handle)")
}

// ---------------------------------------------------------------- files

fn append_mark(path: &Path) -> io::Result<usize> {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(MARK)?;
    Ok(MARK.len())
}

fn write_file_probe(path: &Path) -> Outcome {
    match append_mark(path) {
        Ok(n) => Outcome::ok(format!("wrote {n} bytes to {}", path.display())).with("bytes", n),
        Err(e) => Outcome::io(&e, &format!("write {}", path.display())),
    }
}

fn read_file_probe(path: &Path) -> Outcome {
    let read = || -> io::Result<usize> {
        let mut buf = Vec::with_capacity(4096);
        File::open(path)?.take(4096).read_to_end(&mut buf)?;
        Ok(buf.len())
    };
    match read() {
        Ok(n) => Outcome::ok(format!("read {n} bytes of {}", path.display())).with("bytes", n),
        Err(e) => Outcome::io(&e, &format!("read {}", path.display())),
    }
}

fn list_dir_probe(path: &Path) -> Outcome {
    match sorted_names(path, 256) {
        Ok((names, total)) => Outcome::ok(format!("{total} entries in {}", path.display()))
            .with("count", total)
            .with("entries", names),
        Err(e) => Outcome::io(&e, &format!("list {}", path.display())),
    }
}

/// Up to `cap` sorted names, and the total count.
fn sorted_names(path: &Path, cap: usize) -> io::Result<(Vec<String>, usize)> {
    let mut names: Vec<String> = fs::read_dir(path)?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let total = names.len();
    names.truncate(cap);
    Ok((names, total))
}

fn symlink_escape_probe(dir: &Path, target: &Path) -> Outcome {
    let link = dir.join(format!("fork-hostile-link-{}", std::process::id()));
    if let Err(e) = std::os::unix::fs::symlink(target, &link) {
        return Outcome::io(&e, &format!("symlink {}", link.display()));
    }
    let out = match append_mark(&link) {
        Ok(n) => Outcome::ok(format!(
            "wrote {n} bytes to {} through {}",
            target.display(),
            link.display()
        )),
        Err(e) => Outcome::io(&e, &format!("write through {}", link.display())),
    };
    let _ = fs::remove_file(&link);
    out.with("linked", true)
}

fn hardlink_probe(dir: &Path, target: &Path) -> Outcome {
    let link = dir.join(format!("fork-hostile-hardlink-{}", std::process::id()));
    if let Err(e) = fs::hard_link(target, &link) {
        return Outcome::io(
            &e,
            &format!("link {} to {}", link.display(), target.display()),
        )
        .with("linked", false);
    }
    let out = match append_mark(&link) {
        Ok(n) => Outcome::ok(format!(
            "wrote {n} bytes to {} through {}",
            target.display(),
            link.display()
        )),
        Err(e) => Outcome::io(&e, &format!("write through {}", link.display())),
    };
    let _ = fs::remove_file(&link);
    out.with("linked", true)
}

// ---------------------------------------------------------------- network

fn connect_tcp_probe(addr: SocketAddr) -> Outcome {
    Outcome::from_result(
        TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .map(|_| format!("connected to {addr}")),
        &format!("connect {addr}"),
    )
}

fn bind_tcp_probe(port: u16) -> Outcome {
    match TcpListener::bind(("127.0.0.1", port)) {
        Ok(l) => {
            let local = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
            Outcome::ok(format!("listening on {local}")).with("addr", local)
        }
        Err(e) => Outcome::io(&e, &format!("bind 127.0.0.1:{port}")),
    }
}

fn udp_send_probe(addr: SocketAddr) -> Outcome {
    let local: SocketAddr = if addr.is_ipv4() {
        ([127, 0, 0, 1], 0).into()
    } else {
        (std::net::Ipv6Addr::LOCALHOST, 0).into()
    };
    let sent = UdpSocket::bind(local).and_then(|s| s.send_to(MARK, addr));
    match sent {
        Ok(n) => Outcome::ok(format!("sent {n} bytes to {addr}")).with("bytes", n),
        Err(e) => Outcome::io(&e, &format!("send to {addr}")),
    }
}

// ---------------------------------------------------------------- environment and processes

fn env_probe() -> Outcome {
    let env: Map<String, Value> = std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                Value::from(v.to_string_lossy().into_owned()),
            )
        })
        .collect();
    Outcome::ok(format!("{} variables", env.len())).with("env", env)
}

fn proc1_environ_probe() -> Outcome {
    let read = || -> io::Result<Vec<u8>> {
        let mut buf = Vec::new();
        File::open("/proc/1/environ")?
            .take(64 * 1024)
            .read_to_end(&mut buf)?;
        Ok(buf)
    };
    match read() {
        Ok(buf) => {
            let vars: Vec<String> = buf
                .split(|b| *b == 0)
                .filter(|v| !v.is_empty())
                .map(|v| OsStr::from_bytes(v).to_string_lossy().into_owned())
                .collect();
            Outcome::ok(format!("{} variables in /proc/1/environ", vars.len()))
                .with("environ", vars)
        }
        Err(e) => Outcome::io(&e, "read /proc/1/environ"),
    }
}

fn kill_probe(a: &[String]) -> ProbeResult {
    let pid: libc::pid_t = num_arg(a, 0, "PID", libc::pid_t::MAX)?;
    let sig: libc::c_int = num_arg(a, 1, "SIG", 64)?;
    if pid <= 0 {
        return Err(Usage(format!(
            "PID must be a single process (> 0), not {pid}"
        )));
    }
    if pid == 1 && sig != 0 {
        return Err(Usage(
            "refusing to signal pid 1 (only SIG 0 is allowed)".into(),
        ));
    }
    // SAFETY: kill takes no pointers; the pid is one process chosen by the caller.
    let rc = unsafe { libc::kill(pid, sig) };
    Ok(Outcome::sys(rc.into(), &format!("kill({pid}, {sig})")))
}

fn fork_many_probe(n: u32, secs: u32) -> Outcome {
    let mut pids = Vec::new();
    let mut stopped = None;
    for _ in 0..n {
        // SAFETY: single-threaded program; the child only sleeps and exits.
        match unsafe { libc::fork() } {
            -1 => {
                stopped = Some(errno());
                break;
            }
            0 => {
                // SAFETY: sleep and _exit have no preconditions.
                unsafe {
                    libc::sleep(secs);
                    libc::_exit(0)
                }
            }
            pid => pids.push(pid),
        }
    }
    for pid in &pids {
        let _ = wait_exit_code(*pid);
    }
    let forked = pids.len();
    let detail = format!("forked {forked} of {n} children (each slept {secs} s), all reaped");
    Outcome {
        succeeded: forked == n as usize,
        errno: stopped,
        detail,
        extra: Map::new(),
    }
    .with("forked", forked)
    .with("requested", n)
}

fn alloc_probe(mib: usize) -> Outcome {
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    for _ in 0..mib {
        let mut chunk = Vec::new();
        if chunk.try_reserve_exact(MIB).is_err() {
            return Outcome::failed(
                Some(libc::ENOMEM),
                format!("allocation failed after {} MiB", chunks.len()),
            )
            .with("allocated_mib", chunks.len());
        }
        chunk.resize(MIB, 0x5a); // writes every byte, so every page is touched
        chunks.push(chunk);
    }
    Outcome::ok(format!("allocated and touched {mib} MiB")).with("allocated_mib", chunks.len())
}

fn write_bytes_probe(path: &Path, mib: usize) -> Outcome {
    // Past RLIMIT_FSIZE the kernel sends SIGXFSZ; ignoring it turns that into EFBIG.
    // SAFETY: installs the SIG_IGN disposition, no handler code.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let mut file = match File::create(path) {
        Ok(f) => f,
        Err(e) => return Outcome::io(&e, &format!("create {}", path.display())),
    };
    let chunk = vec![0x5au8; MIB];
    let mut written = 0usize;
    let mut stopped = None;
    'outer: for _ in 0..mib {
        let mut rest = &chunk[..];
        while !rest.is_empty() {
            match file.write(rest) {
                Ok(0) => {
                    stopped = Some(io::Error::from_raw_os_error(libc::ENOSPC));
                    break 'outer;
                }
                Ok(n) => {
                    written += n;
                    rest = &rest[n..];
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    stopped = Some(e);
                    break 'outer;
                }
            }
        }
    }
    if stopped.is_none() {
        stopped = file.sync_all().err();
    }
    let out = match stopped {
        None => Outcome::ok(format!("wrote {written} bytes to {}", path.display())),
        Some(e) => Outcome::io(
            &e,
            &format!("write {} after {written} bytes", path.display()),
        ),
    };
    out.with("bytes_written", written)
}

fn orphans_probe(n: u32, secs: u32) -> Outcome {
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into the live array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Outcome::sys(-1, "pipe");
    }
    let (rd, wr) = (fds[0], fds[1]);
    // SAFETY: single-threaded program; the intermediate child forks sleepers and exits.
    let mid = unsafe { libc::fork() };
    if mid < 0 {
        return Outcome::sys(-1, "fork");
    }
    if mid == 0 {
        // SAFETY: in the intermediate child: only fork, sleep, write and _exit.
        unsafe {
            libc::close(rd);
            for _ in 0..n {
                let pid = libc::fork();
                if pid == 0 {
                    libc::close(wr);
                    libc::sleep(secs);
                    libc::_exit(0);
                }
                if pid < 0 {
                    break;
                }
                libc::write(wr, (&pid as *const libc::pid_t).cast(), 4);
            }
            libc::_exit(0);
        }
    }
    // SAFETY: closes our copy of the write end, so the read below ends.
    unsafe { libc::close(wr) };
    let _ = wait_exit_code(mid);
    let mut bytes = Vec::new();
    // SAFETY: `rd` is the pipe's read end, owned from here on by the File.
    let mut reader = unsafe { <File as std::os::unix::io::FromRawFd>::from_raw_fd(rd) };
    let _ = reader.read_to_end(&mut bytes);
    let pids: Vec<i32> = bytes
        .chunks_exact(4)
        .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let spawned = pids.len();
    Outcome {
        succeeded: spawned == n as usize,
        errno: None,
        detail: format!("{spawned} of {n} orphans sleeping {secs} s, re-parented away"),
        extra: Map::new(),
    }
    .with("pids", pids)
    .with("secs", secs)
}

fn getuid_probe() -> Outcome {
    // SAFETY: these getters have no preconditions.
    let (uid, euid, gid, egid) = unsafe {
        (
            libc::getuid(),
            libc::geteuid(),
            libc::getgid(),
            libc::getegid(),
        )
    };
    let mut status = Map::new();
    let text = fs::read_to_string("/proc/self/status").unwrap_or_default();
    for line in text.lines() {
        if let Some((key, value)) = line.split_once(':') {
            if matches!(
                key,
                "CapInh"
                    | "CapPrm"
                    | "CapEff"
                    | "CapBnd"
                    | "CapAmb"
                    | "NoNewPrivs"
                    | "Seccomp"
                    | "Seccomp_filters"
            ) {
                status.insert(key.to_string(), Value::from(value.trim()));
            }
        }
    }
    Outcome::ok(format!("uid {uid} euid {euid} gid {gid} egid {egid}"))
        .with("uid", uid)
        .with("euid", euid)
        .with("gid", gid)
        .with("egid", egid)
        .with("status", status)
}

fn hostname_probe() -> Outcome {
    // SAFETY: utsname is plain bytes, so all-zero is a valid value.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: uname fills the live struct.
    if unsafe { libc::uname(&mut u) } != 0 {
        return Outcome::sys(-1, "uname");
    }
    // SAFETY: the kernel NUL-terminates nodename within the array.
    let name = unsafe { std::ffi::CStr::from_ptr(u.nodename.as_ptr()) };
    let name = name.to_string_lossy().into_owned();
    Outcome::ok(format!("hostname {name}")).with("hostname", name)
}

fn ifaces_probe() -> Outcome {
    match nix::ifaddrs::getifaddrs() {
        Ok(addrs) => {
            let mut names: Vec<String> = addrs.map(|a| a.interface_name).collect();
            names.sort();
            names.dedup();
            Outcome::ok(format!("{} interfaces", names.len())).with("ifaces", names)
        }
        Err(e) => Outcome::failed(Some(e as i32), format!("getifaddrs: {e}")),
    }
}

fn mounts_probe() -> Outcome {
    match fs::read_to_string("/proc/self/mountinfo") {
        Ok(text) => {
            // Fields: id parent major:minor root mount-point options ...
            let root_rw = text.lines().any(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                f.len() > 5 && f[4] == "/" && f[5].split(',').any(|o| o == "rw")
            });
            let lines = text.lines().count();
            Outcome::ok(format!("{lines} mounts, / read-write: {root_rw}"))
                .with("lines", lines)
                .with("root_rw", root_rw)
        }
        Err(e) => Outcome::io(&e, "read /proc/self/mountinfo"),
    }
}

fn devices_probe() -> Outcome {
    match sorted_names(Path::new("/dev"), 1024) {
        Ok((names, total)) => Outcome::ok(format!("{total} entries in /dev"))
            .with("count", total)
            .with("devices", names),
        Err(e) => Outcome::io(&e, "list /dev"),
    }
}
