//! Process-wide signal dispositions of the supervisor: SIGPIPE back to its default, and
//! SIGINT/SIGTERM/SIGHUP turned into a flag checked between phases (the handlers
//! themselves live in `sys`).

use super::sys;
use nix::sys::signal::{SigSet, Signal};

/// The signals that interrupt a run.
const INTERRUPTS: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

fn interrupt_set() -> SigSet {
    let mut set = SigSet::empty();
    for s in INTERRUPTS {
        set.add(s);
    }
    set
}

/// Holds SIGINT/SIGTERM/SIGHUP back (blocked, kept pending) from the first thing the
/// process does until [`release_interrupts`]: a signal that comes while the command line
/// is read is then answered like one that comes later, instead of killing the process
/// before it can say so. Call it before any thread exists (threads inherit the mask).
pub fn hold_interrupts() {
    let _ = interrupt_set().thread_block();
}

/// Unblocks SIGINT/SIGTERM/SIGHUP, whether [`hold_interrupts`] or whoever started the
/// process blocked them: one that came in between is delivered now, to the flag when
/// [`install_interrupt_flag`] was called before, else with its default action.
pub fn release_interrupts() {
    let _ = interrupt_set().thread_unblock();
}

/// Restores SIGPIPE's default for the command-line process, so `fork history | head` ends
/// quietly instead of panicking on a closed pipe (the Rust runtime ignores SIGPIPE). The
/// sandboxed command gets the same before its exec.
pub fn default_sigpipe() {
    let _ = sys::default_disposition(Signal::SIGPIPE);
}

/// SIGINT, SIGTERM and SIGHUP only set a flag from now on (see [`interrupted`]); the
/// supervisor checks it between phases and destroys everything before it stops. Installed
/// once per process: installing it again would forget a signal that already came, and
/// would replace the handler the supervisor's runtime chains onto it.
pub fn install_interrupt_flag() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| sys::flag_on_signals(&INTERRUPTS));
}

/// Whether SIGINT/SIGTERM/SIGHUP arrived since [`install_interrupt_flag`].
pub fn interrupted() -> bool {
    sys::signal_flag()
}

/// Ends the process at once with `code`: no destructor, no atexit handler, no other
/// thread runs any further (for a teardown that has already released everything).
pub fn exit_now(code: i32) -> ! {
    sys::exit_now(code)
}
