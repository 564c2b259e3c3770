//! Process-wide signal dispositions of the supervisor: SIGPIPE back to its default, and
//! SIGINT/SIGTERM/SIGHUP turned into a flag checked between phases (the handlers
//! themselves live in `sys`).

use super::sys;
use nix::sys::signal::Signal;

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
    ONCE.call_once(|| sys::flag_on_signals(&[Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP]));
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
