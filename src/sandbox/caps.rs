//! The command's privileges, dropped right before Landlock, seccomp and exec: every
//! capability set emptied, the securebits locked so that uid 0 regains nothing on exec,
//! and no_new_privs set.

use caps::CapSet;

const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;
const SECBIT_KEEP_CAPS_LOCKED: libc::c_ulong = 1 << 5;
const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;

/// The securebits the command runs with: no root privilege on exec or setuid, no keeping
/// capabilities, no ambient raise, each locked.
const LOCKED_SECUREBITS: libc::c_ulong = SECBIT_NOROOT
    | SECBIT_NOROOT_LOCKED
    | SECBIT_NO_SETUID_FIXUP
    | SECBIT_NO_SETUID_FIXUP_LOCKED
    | SECBIT_KEEP_CAPS_LOCKED
    | SECBIT_NO_CAP_AMBIENT_RAISE
    | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;

/// Drops every capability (bounding, ambient, inheritable, effective, permitted), locks
/// the securebits so that uid 0 regains nothing on exec, and sets no_new_privs. Runs in
/// the command's process (a fork of the single-threaded init).
pub fn drop_privileges() -> Result<(), String> {
    super::sys::set_securebits(LOCKED_SECUREBITS)
        .map_err(|e| format!("prctl(PR_SET_SECUREBITS): {e}"))?;
    for set in [
        CapSet::Bounding,
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(|e| format!("dropping {set:?} capabilities: {e}"))?;
    }
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("prctl(PR_SET_NO_NEW_PRIVS): {e}"))
}
