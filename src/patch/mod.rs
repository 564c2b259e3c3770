//! PLAN and PATCH phases: parse a unified diff, run the policy gates on it, and apply
//! it exactly to the clone's source tree (lifecycle steps 1 and 3).

pub mod apply;
pub mod gates;
pub mod input;
pub mod parse;

pub use apply::{apply, ApplyError, ApplySummary};
pub use gates::{
    check_patch, run_gates, size_stop, Gate, GateOutcome, GatePolicy, GateStop, PathRules,
};
pub use input::{hash_patch_file, read_patch_file, PatchFile, PatchFileError};
pub use parse::{parse, ChangeKind, FilePatch, Hunk, HunkLine, LineKind, Patch, PatchError};
