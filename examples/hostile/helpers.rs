//! Helpers: a fresh working directory, a forked child, waiting, a sleeping child.

use std::fs;
use std::io;
use std::path::Path;

use crate::args::errno;
use crate::Outcome;

/// Runs `f` in a fresh directory under `base`, removed afterwards.
pub(crate) fn with_workdir(base: &Path, probe: &str, f: impl FnOnce(&Path) -> Outcome) -> Outcome {
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
pub(crate) fn in_child(what: &str, f: impl FnOnce() -> libc::c_long) -> Outcome {
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
pub(crate) fn wait_exit_code(pid: libc::pid_t) -> Option<i32> {
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
pub(crate) struct Sleeper(pub(crate) libc::pid_t);

impl Sleeper {
    pub(crate) fn spawn() -> io::Result<Sleeper> {
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

pub(crate) static PROBE_WORD: u64 = 0x5eed_f00d_dead_beef;
