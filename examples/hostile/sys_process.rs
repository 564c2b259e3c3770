//! System-call probes on processes, mounts and namespaces: ptrace, process_vm_readv,
//! mount, umount2, pivot_root, chroot, setns, clone with CLONE_NEWUSER, clone3.

use std::fs::{self, File};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use crate::args::cstr;
use crate::helpers::{in_child, wait_exit_code, Sleeper, PROBE_WORD};
use crate::Outcome;

pub(crate) fn ptrace_probe() -> Outcome {
    let child = match Sleeper::spawn() {
        Ok(c) => c,
        Err(e) => return Outcome::io(&e, "fork"),
    };
    let null = std::ptr::null_mut::<libc::c_void>();
    // SAFETY: PTRACE_ATTACH to our own child; addr and data are unused.
    let rc = unsafe { libc::ptrace(libc::PTRACE_ATTACH, child.0, null, null) };
    Outcome::sys(rc, &format!("ptrace(PTRACE_ATTACH, own child {})", child.0))
}

pub(crate) fn process_vm_readv_probe() -> Outcome {
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

pub(crate) fn mount_probe(dir: &Path) -> Outcome {
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

pub(crate) fn umount2_probe(dir: &Path) -> Outcome {
    let target = cstr(dir);
    // SAFETY: the target is the probe's own, freshly created directory (not a mount point,
    // so the kernel answers EINVAL unless a filter answers first).
    let rc = unsafe { libc::umount2(target.as_ptr(), 0) };
    Outcome::sys(rc.into(), "umount2 on the probe's own directory")
}

pub(crate) fn pivot_root_probe(dir: &Path) -> Outcome {
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

pub(crate) fn chroot_probe(dir: &Path) -> Outcome {
    let path = cstr(dir);
    in_child("chroot(own directory)", || {
        // SAFETY: the string is alive; the new root only affects this forked child.
        unsafe { libc::chroot(path.as_ptr()) }.into()
    })
}

pub(crate) fn setns_probe() -> Outcome {
    let ns = match File::open("/proc/self/ns/net") {
        Ok(f) => f,
        Err(e) => return Outcome::io(&e, "open /proc/self/ns/net"),
    };
    in_child("setns(own network namespace)", || {
        // SAFETY: rejoins the namespace the child is already in, through a live fd.
        unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) }.into()
    })
}

pub(crate) fn clone_newuser_probe() -> Outcome {
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

pub(crate) fn clone3_probe() -> Outcome {
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
