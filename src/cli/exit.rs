//! Exit codes, and the one place where every library error becomes one.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | APPROVE (verify: valid; consensus: quorum approves) |
//! | 1 | REJECT (verify: invalid) |
//! | 2 | NEEDS_REVISION |
//! | 64 | usage error (a bad flag or setting: an unreachable `FORK_RUN_ROOT`) |
//! | 65 | bad input: malformed patch, manifest, policy, task or verdict; a bundle file this user may not read (`verify`, `approve`), a bundle or `--key` file that is not a regular file |
//! | 69 | a required isolation layer is unavailable on this host, or the sandbox init binary is missing or of another build (fail closed) |
//! | 70 | internal error |
//! | 73 | a CI output could not be written (the verdict was printed and recorded first); `run`: its `--report` (the command's status said on stderr) |
//! | 74 | the result could not be written to stdout (a full disk, `> /dev/full`) |
//! | 130 | interrupted |

use crate::evaluation::reverify::ReverifyError;
use crate::evaluation::EvaluateError;
use crate::identity::IdentityError;
use crate::ledger::LedgerError;
use crate::mesh::approve::ApproveError;
use crate::mesh::messages::MeshError;
use crate::policy::PolicyError;
use crate::run::RunError;
use crate::sandbox::SandboxError;
use crate::verdict::deployed::DeployedError;
use crate::verdict::verify::VerifyError;
use crate::verdict::VerdictKind;

pub const APPROVE: i32 = 0;
pub const REJECT: i32 = 1;
pub const NEEDS_REVISION: i32 = 2;
/// A verdict bundle that was checked and is not valid (`fork verify`).
pub const INVALID: i32 = 1;
pub const USAGE: i32 = 64;
pub const BAD_INPUT: i32 = 65;
pub const UNAVAILABLE: i32 = 69;
pub const INTERNAL: i32 = 70;
/// An output file could not be created (sysexits' EX_CANTCREAT): a CI report, after the
/// verdict was printed and recorded; `fork run`'s report, after the command ran.
pub const CANT_CREATE: i32 = 73;
/// The result could not be written to stdout (sysexits' EX_IOERR): what the command did
/// (a verdict signed and recorded) stands; only its printing failed.
pub const IO_ERROR: i32 = 74;
pub const INTERRUPTED: i32 = 130;
/// `fork run` whose sandbox was killed (by a budget or an interruption): 128 + SIGKILL.
pub const RUN_KILLED: i32 = 137;
/// How long after SIGINT/SIGTERM/SIGHUP the phase in progress may take to end by itself
/// before the interrupt watcher tears the process's runs down and exits (see
/// `gc::reclaim_on_interrupt`): the whole answer stays under a second.
pub const INTERRUPT_GRACE: std::time::Duration = std::time::Duration::from_millis(300);

/// An error that reached the command line: its message and the exit code it maps to.
#[derive(Debug)]
pub struct CliError {
    pub code: i32,
    pub message: String,
}

impl CliError {
    pub fn new(code: i32, message: impl std::fmt::Display) -> CliError {
        CliError {
            code,
            message: message.to_string(),
        }
    }
}

impl<E: std::fmt::Display> From<(i32, E)> for CliError {
    fn from((code, e): (i32, E)) -> Self {
        CliError::new(code, e)
    }
}

/// The exit code of a verdict: its own status code, which CI reports also quote.
pub fn verdict(k: VerdictKind) -> i32 {
    k.exit_code()
}

pub fn sandbox(e: &SandboxError) -> i32 {
    match e {
        SandboxError::LayerUnavailable { .. } => UNAVAILABLE,
        // The sandbox init binary is missing or of another build: nothing can be launched.
        SandboxError::InitExe(_) => UNAVAILABLE,
        SandboxError::Seccomp(_) => BAD_INPUT,
        SandboxError::RunRootUnreachable { .. } => USAGE,
        _ => INTERNAL,
    }
}

pub fn evaluate(e: &EvaluateError) -> i32 {
    match e {
        EvaluateError::Usage(_) => USAGE,
        EvaluateError::Input(_) => BAD_INPUT,
        EvaluateError::Sandbox(e) => sandbox(e),
        EvaluateError::Internal(_) => INTERNAL,
        EvaluateError::Interrupted => INTERRUPTED,
    }
}

/// `fork verify`'s own mapping: an invalid bundle is the answer 1, not an error.
pub fn verify(e: &VerifyError) -> i32 {
    match e {
        VerifyError::NoTrustedKeys => USAGE,
        VerifyError::NotABundle { .. }
        | VerifyError::Missing { .. }
        | VerifyError::Malformed { .. } => BAD_INPUT,
        // What the user named is not a readable file (a directory, a device, bytes that
        // are not text, a file this user may not read): bad input; any other failure to
        // read (a failing disk) is fork's.
        VerifyError::Io(e) if bad_input_io(&e.source) => BAD_INPUT,
        VerifyError::Io(_) => INTERNAL,
        _ => INVALID,
    }
}

/// An I/O error that says the input is not what a file of that name must be, or not one
/// this user may read (EACCES, EPERM: a 0700 bundle of another user's is the bundle's
/// problem, not fork's).
fn bad_input_io(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        IsADirectory | NotADirectory | InvalidData | InvalidInput | NotFound | PermissionDenied
    ) || e.raw_os_error() == Some(libc::ELOOP)
}

/// `fork verify --patch/--tree`: a patch or tree the verdict does not speak for is the
/// answer 1 (invalid); input that cannot be read is bad input; a failure to check is
/// internal.
pub fn deployed(e: &DeployedError) -> i32 {
    match e {
        _ if e.is_mismatch() => INVALID,
        DeployedError::ReadPatch { .. }
        | DeployedError::PatchTooLarge { .. }
        | DeployedError::Manifest(_)
        | DeployedError::NoSource { .. }
        | DeployedError::MalformedPatch { .. } => BAD_INPUT,
        _ => INTERNAL,
    }
}

pub fn reverify(e: &ReverifyError) -> i32 {
    match e {
        // A verdict to re-verify that does not verify is bad input here, not an answer.
        ReverifyError::Invalid(v) => match verify(v) {
            INVALID => BAD_INPUT,
            c => c,
        },
        ReverifyError::Input(_) => BAD_INPUT,
        ReverifyError::Evaluate(e) => evaluate(e),
    }
}

pub fn mesh(e: &MeshError) -> i32 {
    match e {
        MeshError::Usage(_) => USAGE,
        MeshError::Connect { .. } => UNAVAILABLE,
        MeshError::Nats { .. } | MeshError::Io(_) | MeshError::Internal(_) => INTERNAL,
        MeshError::Evaluate(e) => evaluate(e),
        MeshError::Interrupted => INTERRUPTED,
        MeshError::Input(_)
        | MeshError::UnknownGeneration { .. }
        | MeshError::BadHeader(_)
        | MeshError::HeaderMismatch { .. }
        | MeshError::Malformed { .. }
        | MeshError::TooLarge { .. }
        | MeshError::PatchHash { .. }
        | MeshError::RuntimeMismatch { .. }
        | MeshError::BadFileName(_) => BAD_INPUT,
    }
}

pub fn run(e: &RunError) -> i32 {
    match e {
        RunError::NotADirectory(_) => USAGE,
        RunError::Input(_) => BAD_INPUT,
        RunError::Sandbox(e) => sandbox(e),
        RunError::Internal(_) => INTERNAL,
    }
}

pub fn policy(_: &PolicyError) -> i32 {
    BAD_INPUT
}

pub fn ledger(e: &LedgerError) -> i32 {
    match e {
        LedgerError::NotFound { .. } => USAGE,
        LedgerError::Io(_) | LedgerError::Sql { .. } => INTERNAL,
        _ => BAD_INPUT,
    }
}

/// Reading or creating the node key (`fork keygen`: an existing key is a usage error).
pub fn identity(e: &IdentityError) -> i32 {
    match e {
        IdentityError::KeyExists { .. }
        | IdentityError::KeyIsPublicPath { .. }
        | IdentityError::KeyPathIsDirectory { .. }
        | IdentityError::PublicOfAnotherKey { .. } => USAGE,
        _ if e.is_bad_input() => BAD_INPUT,
        _ => INTERNAL,
    }
}

/// A key file named by `--key` that could not be loaded: not a regular file is bad input
/// (65); anything else (missing, readable by others, malformed) is the flag's (64).
pub fn key_file(e: &IdentityError) -> i32 {
    if e.is_bad_input() {
        BAD_INPUT
    } else {
        USAGE
    }
}

pub fn approve(e: &ApproveError) -> i32 {
    match e {
        // As `fork verify` answers for the same bundle: invalid is 1, unreadable input 65.
        ApproveError::Verify { source, .. } => verify(source),
        ApproveError::NotApprove { .. } => REJECT,
        ApproveError::Exists { .. } => USAGE,
        _ => INTERNAL,
    }
}

macro_rules! from_error {
    ($($t:ty => $f:ident),* $(,)?) => {$(
        impl From<$t> for CliError {
            fn from(e: $t) -> CliError {
                CliError::new($f(&e), e)
            }
        }
    )*};
}

from_error!(
    SandboxError => sandbox,
    EvaluateError => evaluate,
    ReverifyError => reverify,
    MeshError => mesh,
    RunError => run,
    PolicyError => policy,
    LedgerError => ledger,
    ApproveError => approve,
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ioerr::IoError;

    #[test]
    fn verdict_codes() {
        assert_eq!(verdict(VerdictKind::Approve), APPROVE);
        assert_eq!(verdict(VerdictKind::Reject), REJECT);
        assert_eq!(verdict(VerdictKind::NeedsRevision), NEEDS_REVISION);
    }

    #[test]
    fn verify_errors() {
        assert_eq!(verify(&VerifyError::NoTrustedKeys), 64);
        let e = VerifyError::VerdictSignature { key: "k".into() };
        assert_eq!(verify(&e), 1);
        // In reverify, an invalid verdict is bad input, not an answer.
        assert_eq!(reverify(&ReverifyError::Invalid(e)), BAD_INPUT);
        // A bundle file that is a directory is bad input; a failing disk is fork's.
        let io = |kind: std::io::ErrorKind| {
            VerifyError::Io(IoError::new(
                "read",
                std::path::Path::new("b/verdict.dsse.json"),
                std::io::Error::from(kind),
            ))
        };
        assert_eq!(verify(&io(std::io::ErrorKind::IsADirectory)), BAD_INPUT);
        assert_eq!(verify(&io(std::io::ErrorKind::Other)), INTERNAL);
        // `fork approve` answers as `fork verify` does for the same bundle.
        let missing = ApproveError::Verify {
            path: "b".into(),
            source: VerifyError::Missing {
                path: "b/verdict.dsse.json".into(),
            },
        };
        assert_eq!(approve(&missing), BAD_INPUT);
        let invalid = ApproveError::Verify {
            path: "b".into(),
            source: VerifyError::VerdictSignature { key: "k".into() },
        };
        assert_eq!(approve(&invalid), INVALID);
    }

    #[test]
    fn mesh_generation_is_bad_input() {
        let e = MeshError::UnknownGeneration {
            message_type: "Proposal".into(),
            generation: 2,
        };
        assert_eq!(mesh(&e), BAD_INPUT);
        let e = MeshError::Evaluate(Box::new(EvaluateError::Internal("x".into())));
        assert_eq!(mesh(&e), INTERNAL);
        assert!(e.is_transient());
        let e = MeshError::Evaluate(Box::new(EvaluateError::Input("x".into())));
        assert_eq!(mesh(&e), BAD_INPUT);
        assert!(!e.is_transient());
    }

    #[test]
    fn layers_missing_are_69() {
        let e = SandboxError::LayerUnavailable {
            layer: crate::sandbox::Layer::Cgroup,
            reason: "r".into(),
            fix: "f".into(),
        };
        assert_eq!(sandbox(&e), UNAVAILABLE);
        assert_eq!(evaluate(&EvaluateError::Sandbox(e)), UNAVAILABLE);
        assert_eq!(evaluate(&EvaluateError::Interrupted), 130);
    }

    fn io_error(kind: std::io::ErrorKind) -> IoError {
        IoError::new("read", std::path::Path::new("/x"), kind.into())
    }

    #[test]
    fn io_errors_are_internal() {
        let denied = || io_error(std::io::ErrorKind::PermissionDenied);
        // A bundle file this user may not read is the bundle's problem; a failing disk
        // is fork's.
        assert_eq!(verify(&VerifyError::from(denied())), BAD_INPUT);
        let failing = io_error(std::io::ErrorKind::Other);
        assert_eq!(verify(&VerifyError::from(failing)), INTERNAL);
        assert_eq!(mesh(&MeshError::from(denied())), INTERNAL);
        assert_eq!(ledger(&LedgerError::from(denied())), INTERNAL);
        assert_eq!(identity(&IdentityError::from(denied())), INTERNAL);
        assert_eq!(approve(&ApproveError::from(denied())), INTERNAL);
        let e = SandboxError::from(denied());
        assert_eq!(sandbox(&e), INTERNAL);
        // A file of a bundle that is not there is bad input, not an internal error.
        let missing = VerifyError::from(io_error(std::io::ErrorKind::NotFound));
        assert!(matches!(missing, VerifyError::Missing { .. }));
        assert_eq!(verify(&missing), BAD_INPUT);
    }
}
