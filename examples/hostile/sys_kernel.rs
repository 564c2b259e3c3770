//! System-call probes on the kernel's other facilities: bpf, keys, perf events,
//! userfaultfd, io_uring, kexec, modules, reboot, swap, device nodes, terminal ioctls,
//! personality, file handles.

use std::ffi::CString;
use std::fs::{self, File};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use crate::args::cstr;
use crate::Outcome;

fn close_if_fd(rc: libc::c_long) {
    if rc >= 0 {
        // SAFETY: rc is a descriptor the probe's system call just returned.
        unsafe { libc::close(rc as libc::c_int) };
    }
}

pub(crate) fn bpf_probe() -> Outcome {
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

pub(crate) fn keyctl_probe() -> Outcome {
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

pub(crate) fn add_key_probe() -> Outcome {
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

pub(crate) fn request_key_probe() -> Outcome {
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

pub(crate) fn perf_event_open_probe() -> Outcome {
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

pub(crate) fn userfaultfd_probe() -> Outcome {
    const UFFD_USER_MODE_ONLY: libc::c_int = 1;
    // SAFETY: no pointers; the descriptor is closed at once.
    let rc = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | UFFD_USER_MODE_ONLY) };
    close_if_fd(rc);
    Outcome::sys(rc, "userfaultfd")
}

pub(crate) fn io_uring_setup_probe() -> Outcome {
    let mut params = [0u8; 128]; // struct io_uring_params is 120 bytes
                                 // SAFETY: the kernel reads and writes up to 120 bytes of the live buffer.
    let rc = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    close_if_fd(rc);
    Outcome::sys(rc, "io_uring_setup(1 entry)")
}

pub(crate) fn kexec_load_probe() -> Outcome {
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

pub(crate) fn kexec_file_load_probe() -> Outcome {
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

pub(crate) fn init_module_probe() -> Outcome {
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

pub(crate) fn finit_module_probe() -> Outcome {
    // SAFETY: a bad descriptor and an empty parameter string.
    let rc = unsafe { libc::syscall(libc::SYS_finit_module, -1 as libc::c_int, c"".as_ptr(), 0) };
    Outcome::sys(rc, "finit_module(bad fd)")
}

pub(crate) fn delete_module_probe() -> Outcome {
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

pub(crate) fn reboot_probe() -> Outcome {
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

pub(crate) fn swap_probe(on: bool) -> Outcome {
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

pub(crate) fn mknod_probe(dir: &Path, char_dev: bool) -> Outcome {
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
pub(crate) fn tty_probe(request: libc::Ioctl, name: &str) -> Outcome {
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

pub(crate) fn personality_noaslr_probe() -> Outcome {
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

pub(crate) fn personality_query_probe() -> Outcome {
    // SAFETY: 0xffffffff only queries the persona.
    let rc = unsafe { libc::personality(0xffff_ffff) };
    let out = Outcome::sys(rc.into(), "personality(0xffffffff)");
    if out.succeeded {
        out.with("persona", rc)
    } else {
        out
    }
}

pub(crate) fn open_by_handle_at_probe(dir: &Path) -> Outcome {
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
