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

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Map, Value};

#[path = "hostile/args.rs"]
mod args;
#[path = "hostile/environment.rs"]
mod environment;
#[path = "hostile/files.rs"]
mod files;
#[path = "hostile/helpers.rs"]
mod helpers;
#[path = "hostile/net.rs"]
mod net;
#[path = "hostile/pipes.rs"]
mod pipes;
#[path = "hostile/sys_kernel.rs"]
mod sys_kernel;
#[path = "hostile/sys_process.rs"]
mod sys_process;

use args::{loopback_arg, num_arg, path_arg};
use environment::{
    alloc_probe, devices_probe, env_probe, fork_many_probe, getuid_probe, hostname_probe,
    ifaces_probe, kill_probe, mounts_probe, orphans_probe, proc1_environ_probe, write_bytes_probe,
};
use files::{
    hardlink_probe, list_dir_probe, read_file_probe, symlink_escape_probe, write_file_probe,
};
use helpers::{in_child, with_workdir};
use net::{bind_tcp_probe, connect_tcp_probe, mptcp_probe, seqpacket_probe, udp_send_probe};
use pipes::pin_probe;
use sys_kernel::{
    add_key_probe, bpf_probe, delete_module_probe, finit_module_probe, init_module_probe,
    io_uring_setup_probe, kexec_file_load_probe, kexec_load_probe, keyctl_probe, mknod_probe,
    open_by_handle_at_probe, perf_event_open_probe, personality_noaslr_probe,
    personality_query_probe, reboot_probe, request_key_probe, swap_probe, tty_probe,
    userfaultfd_probe,
};
use sys_process::{
    chroot_probe, clone3_probe, clone_newuser_probe, mount_probe, pivot_root_probe,
    process_vm_readv_probe, ptrace_probe, setns_probe, umount2_probe,
};

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
  splice [DIR]  tee [DIR]  vmsplice [DIR]  sendfile [DIR]   one byte of a file of its own
                                    into a pipe (ENOSYS expected: pipes pin page cache)
files and others:
  write-file PATH  read-file PATH  list-dir PATH
  symlink-escape DIR TARGET  hardlink DIR TARGET
  connect-tcp HOST:PORT  bind-tcp PORT  udp-send HOST:PORT     (loopback only)
  connect-mptcp HOST:PORT  bind-mptcp PORT   the same over Multipath TCP (IPPROTO_MPTCP)
  socket-seqpacket   an inet SOCK_SEQPACKET socket of protocol 0 (SCTP, where loaded)
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
        "splice" | "tee" | "vmsplice" | "sendfile" => {
            with_workdir(&dir(), probe, |d| pin_probe(d, probe))
        }
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
        "connect-mptcp" => mptcp_probe(loopback_arg(a, 0)?, true),
        "socket-seqpacket" => seqpacket_probe(),
        "bind-mptcp" => {
            let port = num_arg(a, 0, "PORT", u16::MAX)?;
            mptcp_probe(([127, 0, 0, 1], port).into(), false)
        }
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
