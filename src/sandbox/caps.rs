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
/// the command's process (a fork of the single-threaded init). One system call per
/// bounding capability, one for the ambient set and one capset(2) for the other three.
pub fn drop_privileges() -> Result<(), String> {
    super::sys::set_securebits(LOCKED_SECUREBITS)
        .map_err(|e| format!("prctl(PR_SET_SECUREBITS): {e}"))?;
    for cap in caps::all() {
        // PR_CAPBSET_DROP needs CAP_SETPCAP even for a capability already gone: only
        // then is it looked up, and only one still present is an error.
        if let Err(e) = caps::drop(None, CapSet::Bounding, cap) {
            if caps::has_cap(None, CapSet::Bounding, cap).unwrap_or(true) {
                return Err(format!("dropping {cap} from the bounding set: {e}"));
            }
        }
    }
    caps::clear(None, CapSet::Ambient)
        .map_err(|e| format!("dropping the ambient capabilities: {e}"))?;
    super::sys::capset_clear_all().map_err(|e| {
        format!("capset(effective, permitted and inheritable capabilities all empty): {e}")
    })?;
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("prctl(PR_SET_NO_NEW_PRIVS): {e}"))
}
