//! Process-wide signal dispositions of the supervisor (the only `unsafe` signal setup
//! outside the init and the command, which live in init.rs).

use nix::sys::signal::{sigaction, signal, SaFlags, SigAction, SigHandler, SigSet, Signal};
use std::sync::atomic::{AtomicBool, Ordering};

/// Restores SIGPIPE's default for the command-line process, so `fork history | head` ends
/// quietly instead of panicking on a closed pipe (the Rust runtime ignores SIGPIPE).
pub fn default_sigpipe() {
    // SAFETY: restoring a default disposition has no preconditions.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// SIGINT, SIGTERM and SIGHUP only set a flag from now on (see [`interrupted`]); the
/// supervisor checks it between phases and destroys everything before it stops.
pub fn install_interrupt_flag() {
    INTERRUPTED.store(false, Ordering::SeqCst);
    let sa = SigAction::new(
        SigHandler::Handler(on_interrupt),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        let _ = unsafe { sigaction(s, &sa) };
    }
}

/// Whether SIGINT/SIGTERM/SIGHUP arrived since [`install_interrupt_flag`].
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}
