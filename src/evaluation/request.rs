//! What an evaluation is asked to do: the one request type that the command line,
//! `fork mesh serve` and `fork reverify` build alike. Plain data, no parsing: budget values
//! arrive typed ([`BudgetOverrides`]), so a verdict's limits are reproduced exactly.

use crate::budget::BudgetOverrides;
use std::path::PathBuf;

/// Where the verdict ledger (and so the cache) lives for this evaluation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum LedgerChoice {
    /// `$XDG_DATA_HOME/fork/ledger.db`.
    #[default]
    Default,
    /// A ledger of the caller's choosing.
    At(PathBuf),
    /// Neither read nor write a ledger.
    Off,
}

/// Reports for CI written beside the bundle.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CiOutputs {
    /// A JUnit report: one testcase per test, per metric check, and the verdict.
    pub junit: Option<PathBuf>,
    /// A markdown summary (also appended to `$GITHUB_STEP_SUMMARY` when set).
    pub summary: Option<PathBuf>,
}

/// One evaluation of one patch against one runtime.
#[derive(Debug, Clone)]
pub struct Request {
    /// The patch (a unified diff, as `git diff` writes it).
    pub patch: PathBuf,
    /// The runtime's root, holding fork.toml.
    pub runtime: PathBuf,
    /// The tasks to run, in order, into one verdict (default, when empty: the manifest's
    /// plan, its gating tasks or else its first task).
    pub tasks: Vec<String>,
    /// Policy file (default: the built-in policy).
    pub policy: Option<PathBuf>,
    /// Where the verdict bundle goes (default: `./fork-out/<run-id>`); must not exist.
    pub out: Option<PathBuf>,
    /// The node key that endorses the verdict (default: the local node key, created on
    /// first use).
    pub key: Option<PathBuf>,
    /// Budget limits over the policy's and the task's (the last word).
    pub budget: BudgetOverrides,
    /// Budget limits for one task of the plan, over `budget` (re-verification replays each
    /// task's exact budget).
    pub task_budgets: Vec<(String, BudgetOverrides)>,
    /// Independent patched successors; disagreement lowers the confidence.
    pub replicas: u32,
    /// Whether a verdict the ledger holds for the same inputs may answer.
    pub use_cache: bool,
    pub ledger: LedgerChoice,
    pub ci: CiOutputs,
    /// The mesh proposal this evaluation answers (recorded, signed, in the verdict).
    pub proposal: Option<String>,
}

impl Request {
    /// A request with every choice at its default: one replica, the cache and the default
    /// ledger on, no CI outputs.
    pub fn new(patch: PathBuf, runtime: PathBuf) -> Request {
        Request {
            patch,
            runtime,
            tasks: Vec::new(),
            policy: None,
            out: None,
            key: None,
            budget: BudgetOverrides::default(),
            task_budgets: Vec::new(),
            replicas: 1,
            use_cache: true,
            ledger: LedgerChoice::Default,
            ci: CiOutputs::default(),
            proposal: None,
        }
    }
}
