//! The three answers a verdict can give, and how they map to exit codes.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The decision of an evaluation (README, "The verdict bundle").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum VerdictKind {
    /// The patched runtime passed and nothing regressed.
    Approve,
    /// A gate failed, the patch did not apply, a budget was blown, or the task could not run.
    Reject,
    /// The patch applied and ran, but some tests fail or a metric regressed.
    NeedsRevision,
}

impl VerdictKind {
    /// The verdict's status code (0, 1, 2): part of the verdict's contract, since CI
    /// reports quote it and `fork evaluate` exits with it (src/cli/exit.rs uses this).
    pub fn exit_code(self) -> i32 {
        match self {
            VerdictKind::Approve => 0,
            VerdictKind::Reject => 1,
            VerdictKind::NeedsRevision => 2,
        }
    }

    /// The canonical spelling used in verdict documents.
    pub fn as_str(self) -> &'static str {
        match self {
            VerdictKind::Approve => "APPROVE",
            VerdictKind::Reject => "REJECT",
            VerdictKind::NeedsRevision => "NEEDS_REVISION",
        }
    }
}

impl fmt::Display for VerdictKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_as_seed_spelling() {
        let s = serde_json::to_string(&VerdictKind::NeedsRevision).unwrap();
        assert_eq!(s, "\"NEEDS_REVISION\"");
        let k: VerdictKind = serde_json::from_str("\"APPROVE\"").unwrap();
        assert_eq!(k, VerdictKind::Approve);
        assert_eq!(VerdictKind::Reject.exit_code(), 1);
    }
}
