//! `fork evaluate`: the command line's request for an evaluation, and the verdict printed.

use crate::cli::args::BudgetArgs;
use crate::cli::exit::{self, CliError};
use crate::cli::out;
use crate::evaluation::{evaluate, CiOutputs, LedgerChoice, Request};
use crate::verdict::Verdict;
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct EvaluateArgs {
    /// The patch to evaluate (a unified diff, as `git diff` writes it).
    pub patch: PathBuf,
    /// The runtime's root, holding fork.toml.
    #[arg(long, default_value = ".")]
    pub runtime: PathBuf,
    /// Run this one task (default: the manifest's plan, every `gate = true` task in file
    /// order into one verdict, or the first task when none is marked).
    #[arg(long)]
    pub task: Option<String>,
    /// Policy file (default: the built-in policies/default.toml).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Where the verdict bundle goes (default: ./fork-out/<run-id>); must not exist.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the verdict document as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// The node key that endorses the verdict (default: $XDG_CONFIG_HOME/fork/node.key,
    /// created on first use).
    #[arg(long)]
    pub key: Option<PathBuf>,
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Run N independent patched successors; disagreement lowers the confidence.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub replicas: u32,
    /// Evaluate even when the ledger holds a verdict for the same patch, state, source,
    /// task and policy.
    #[arg(long)]
    pub no_cache: bool,
    /// The verdict ledger (default: $XDG_DATA_HOME/fork/ledger.db).
    #[arg(long)]
    pub ledger: Option<PathBuf>,
    /// Neither read nor write the ledger.
    #[arg(long, conflicts_with = "ledger")]
    pub no_ledger: bool,
    /// Write a JUnit report for CI (one testcase per test, per metric check, and the verdict).
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Write a markdown summary (also appended to $GITHUB_STEP_SUMMARY when set).
    #[arg(long)]
    pub summary: Option<PathBuf>,
}

impl EvaluateArgs {
    pub fn request(&self) -> Result<Request, CliError> {
        let mut r = Request::new(self.patch.clone(), self.runtime.clone());
        r.tasks = self.task.iter().cloned().collect();
        r.policy = self.policy.clone();
        r.out = self.out.clone();
        r.key = self.key.clone();
        r.budget = self.budget.overrides()?;
        r.replicas = self.replicas;
        r.use_cache = !self.no_cache;
        r.ledger = match (&self.ledger, self.no_ledger) {
            (_, true) => LedgerChoice::Off,
            (Some(p), false) => LedgerChoice::At(p.clone()),
            (None, false) => LedgerChoice::Default,
        };
        r.ci = CiOutputs {
            junit: self.junit.clone(),
            summary: self.summary.clone(),
        };
        Ok(r)
    }
}

pub fn evaluate_cmd(a: EvaluateArgs) -> Result<i32, CliError> {
    crate::gc::end_on_interrupt(exit::INTERRUPT_GRACE, exit::INTERRUPTED);
    let ev = evaluate(&a.request()?)?;
    let v = &ev.verdict;
    let verdict_path = ev.out_dir.join("verdict.json");
    // The verdict is signed and recorded before it is printed: stdout that cannot be
    // written (exit 74) says where the verdict is.
    print_verdict(v, &verdict_path, a.json).map_err(|e| match e.code {
        exit::IO_ERROR => CliError::new(
            e.code,
            format!(
                "{} (the verdict stands: {})",
                e.message,
                verdict_path.display()
            ),
        ),
        _ => e,
    })?;
    // The verdict is shown (and signed and recorded) first; a report that could not be
    // written is then an error of its own, never one that hides the answer.
    if let Some(e) = &ev.ci_error {
        return Err(CliError::new(
            exit::CANT_CREATE,
            format!("{e} (the verdict above stands: {})", verdict_path.display()),
        ));
    }
    Ok(exit::verdict(v.verdict))
}

/// The verdict on stdout: its document (`--json`), or a summary of it.
fn print_verdict(v: &Verdict, verdict_path: &Path, json: bool) -> Result<(), CliError> {
    if json {
        let doc = v
            .to_json_pretty()
            .map_err(|e| CliError::new(exit::INTERNAL, e))?;
        return out::json_bytes(&doc);
    }
    let what = if v.plan.len() > 1 { "plan" } else { "task" };
    out::line(format!(
        "{} (confidence {:.2})  {what} `{}`  run {}",
        v.verdict, v.confidence, v.task, v.run_id
    ))?;
    out::line(format!("  {}", v.evaluation_summary))?;
    if v.plan.len() > 1 {
        for t in &v.plan {
            let said = t
                .verdict
                .map(|k| k.to_string())
                .unwrap_or_else(|| "NOT RUN".into());
            out::line(format!("  task {}: {said}", t.task))?;
        }
    }
    for c in &v.caveats {
        out::line(format!("  caveat: {c}"))?;
    }
    out::line(format!("  patch {}", v.patch_hash))?;
    out::line(format!("  verdict: {}", verdict_path.display()))
}
