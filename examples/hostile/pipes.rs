//! Page-cache pinning probes: `splice`, `tee`, `vmsplice` and `sendfile` each put a
//! reference to a page of a file into a pipe, where it stays pinned (reclaim cannot drop
//! it, and the memory cgroup is not charged for it) for as long as the pipe holds it.
//!
//! Each probe moves ONE byte of a 4 KiB file it writes itself (in a fresh directory under
//! DIR) into a pipe of its own, then closes everything: harmless if it works.

use std::fs::File;
use std::io::Write;
use std::os::unix::io::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use crate::Outcome;

/// A pipe, both ends closed on drop.
fn pipe() -> Result<(OwnedFd, OwnedFd), Outcome> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into a live two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } < 0 {
        return Err(Outcome::io(&std::io::Error::last_os_error(), "pipe2"));
    }
    // SAFETY: both descriptors were just returned by pipe2 and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A 4 KiB file of the probe's own under `dir`, open for reading.
fn own_file(dir: &Path) -> Result<File, Outcome> {
    let path = dir.join("page");
    let written = File::create(&path).and_then(|mut f| f.write_all(&[b'x'; 4096]));
    if let Err(e) = written {
        return Err(Outcome::io(&e, &format!("write {}", path.display())));
    }
    File::open(&path).map_err(|e| Outcome::io(&e, &format!("open {}", path.display())))
}

/// `splice`, `tee`, `vmsplice` or `sendfile` of one byte of a file of the probe's own into a
/// pipe of its own (`tee` copies a byte between two pipes of its own).
pub(crate) fn pin_probe(dir: &Path, call: &str) -> Outcome {
    let (file, (r, w)) = match own_file(dir).and_then(|f| Ok((f, pipe()?))) {
        Ok(v) => v,
        Err(o) => return o,
    };
    let (fd, w) = (file.as_raw_fd(), w.as_raw_fd());
    let rc = match call {
        "splice" => {
            let mut off: libc::loff_t = 0;
            // SAFETY: two live descriptors, a live offset the kernel updates, one byte.
            unsafe {
                libc::syscall(
                    libc::SYS_splice,
                    fd,
                    &mut off as *mut libc::loff_t,
                    w,
                    std::ptr::null_mut::<libc::loff_t>(),
                    1usize,
                    libc::SPLICE_F_NONBLOCK,
                )
            }
        }
        "sendfile" => {
            let mut off: libc::off_t = 0;
            // SAFETY: two live descriptors, a live offset the kernel updates, one byte.
            unsafe {
                libc::syscall(
                    libc::SYS_sendfile,
                    w,
                    fd,
                    &mut off as *mut libc::off_t,
                    1usize,
                )
            }
        }
        "vmsplice" => {
            // SAFETY: a fresh shared read-only mapping of the probe's own 4 KiB file.
            let map = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            if map == libc::MAP_FAILED {
                return Outcome::io(&std::io::Error::last_os_error(), "mmap");
            }
            let iov = libc::iovec {
                iov_base: map,
                iov_len: 1,
            };
            // SAFETY: one iovec of one byte inside the live mapping.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_vmsplice,
                    w,
                    &iov as *const libc::iovec,
                    1usize,
                    libc::SPLICE_F_NONBLOCK,
                )
            };
            let e = std::io::Error::last_os_error();
            // SAFETY: unmaps exactly the mapping made above, no longer used.
            unsafe { libc::munmap(map, 4096) };
            return if rc < 0 {
                Outcome::io(&e, "vmsplice of a mapped file page")
            } else {
                Outcome::ok(format!("vmsplice returned {rc}"))
            };
        }
        _ => {
            // tee: a byte written into the first pipe, duplicated into a second one.
            let (_r2, w2) = match pipe() {
                Ok(p) => p,
                Err(o) => return o,
            };
            // SAFETY: writes one byte from a live buffer into the probe's own pipe.
            let _ = unsafe { libc::write(w, b"x".as_ptr().cast(), 1) };
            // SAFETY: two live pipe descriptors of the probe's own, one byte.
            unsafe {
                libc::syscall(
                    libc::SYS_tee,
                    r.as_raw_fd(),
                    w2.as_raw_fd(),
                    1usize,
                    libc::SPLICE_F_NONBLOCK,
                )
            }
        }
    };
    Outcome::sys(rc, &format!("{call} of one byte into a pipe"))
}
