//! Phase 4 and the first half of phase 5 for one task of the plan: `repeat` rounds of
//! every patched replica and the baseline, then a decision per replica and their
//! agreement. The plan's tasks are combined into one verdict by the caller.

use super::collect::RunResult;
use super::plan::{Plan, TaskPlan};
use super::prepare::{self, PreparedSide};
use super::{check_interrupt, evidence, side, EvaluateError};
use crate::budget::Exceeded;
use crate::patch::Patch;
use crate::sandbox::BudgetKind;
use crate::verdict::decide::{decide, AlphaScope, Assessed, Decision, DecisionRules};
use crate::verdict::sequential::{self, Outcome};
use crate::verdict::{ArtifactType, VerdictKind};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What one task of the plan gave.
pub struct TaskRun {
    /// The task's decision (the most severe replica's, with their agreement).
    pub decision: Decision,
    /// The run that speaks for the decision.
    pub primary: RunResult,
    /// The budget that ended the task, as the evidence named it.
    pub exceeded: Option<Exceeded>,
    /// Every run's artifacts (the baseline's typed as such).
    pub artifacts: Vec<(ArtifactType, PathBuf)>,
    /// The rules the task was decided by (the policy's, with the task's lower-is-better
    /// metrics).
    pub rules: DecisionRules,
}

/// Where the task's sides come from.
pub struct Sources<'a> {
    pub source_dir: &'a Path,
    pub snap_dir: &'a Path,
    pub patch: &'a Patch,
    pub staging: &'a Path,
    /// The patched tree the verdict names (the first patched side's): every patched side
    /// prepared again must hold the same tree.
    pub tree: &'a prepare::PatchedTree,
    /// The runtime's source tree the evaluation began with (the cache key's): every
    /// side's copy, before any patch, must be it.
    pub source: &'a crate::fork::TreeListing,
}

fn prepare_patched(
    p: &Plan,
    t: &TaskPlan,
    s: &Sources<'_>,
) -> Result<Box<PreparedSide>, EvaluateError> {
    match prepare::prepare_side(p, t, s.source_dir, s.snap_dir, Some(s.patch), s.source)? {
        prepare::Prepared::Ready(side) => {
            // `prepare_side` found the copy to be the source the evaluation began with;
            // the patched tree is compared too (the hashes are taken anyway), so that no
            // run of a tree other than the one the verdict names can ever count.
            let same = side.patched.as_ref().is_some_and(|h| {
                h.source_hash == s.tree.source_hash && h.deploy_hash == s.tree.deploy_hash
            });
            if same {
                return Ok(side);
            }
            let now = side.patched.as_ref().map(|h| h.source_hash.clone());
            if let Err(e) = side.into_sandbox().destroy() {
                tracing::error!("destroying the sandbox of a moved source tree: {e}");
            }
            Err(prepare::source_moved(
                s.source_dir,
                &format!(
                    "the patched tree hashed {}, a later one {}",
                    s.tree.source_hash,
                    now.as_deref().unwrap_or("not at all")
                ),
            ))
        }
        // The copy is the tree the patch applied to before (checked): applying is not
        // what it was, a defect of fork's.
        prepare::Prepared::DidNotApply(msg, _) => Err(EvaluateError::Internal(format!(
            "the patch applied once and then not to the same source tree: {msg}"
        ))),
    }
}

/// Runs one task: rounds of every replica of the patched side and the baseline. Without a
/// baseline (or `repeat = 1`) that is `repeat` rounds. With one, each round is a pair, the
/// order of its two sides drawn from a recorded seed (so drift on the machine hits both
/// sides alike and no side always runs second); the metrics are looked at on the schedule of
/// [`sequential::looks`] and the pairs stop as soon as every metric of every replica is
/// decided, a regression settles the verdict, or the cap (`repeat`, at most the policy's
/// `max_pairs`) is reached. `first` is a patched side already prepared (the evaluation's
/// first, where the patch was tried): used by the first pair when its patched side runs
/// first, else removed before its baseline runs.
pub fn run_task(
    p: &Plan,
    t: &TaskPlan,
    s: &Sources<'_>,
    mut first: Option<Box<PreparedSide>>,
) -> Result<TaskRun, EvaluateError> {
    let replicas = p.replicas;
    let mut rules = p.policy.decision.clone();
    rules
        .lower_is_better
        .extend(t.spec.lower_is_better.iter().cloned());
    let repeat = t.spec.repeat.max(1) as usize;
    let paired = compares_pairs(t);
    let cap = if paired {
        repeat.min(rules.max_pairs as usize)
    } else {
        repeat
    };
    let schedule = if paired && rules.sequential {
        sequential::looks(rules.min_pairs as usize, cap)
    } else {
        vec![cap]
    };
    let order_seed: u64 = rand::random();
    let mut patched: Vec<Vec<RunResult>> = (0..replicas).map(|_| Vec::new()).collect();
    let mut baseline: Vec<RunResult> = Vec::new();
    // The distinct metric names of each side, capped across its runs (and replicas).
    let mut names = Names::default();
    let mut assessed: Vec<BTreeMap<String, Assessed>> = vec![BTreeMap::new(); replicas];
    // The most severe replica's decision stands (below), and a plan is approved whole or
    // not at all, so any replica's or any task's false finding would be the verdict's:
    // each replica of each task that compares pairs spends its share of `alpha`
    // (Bonferroni), and the verdict's error rate holds over all of them.
    let tasks = match rules.alpha_scope {
        AlphaScope::Plan => p.tasks.iter().filter(|t| compares_pairs(t)).count().max(1),
        AlphaScope::Task => 1,
    };
    let share = Share {
        alpha: rules.alpha,
        replicas,
        tasks,
    };
    let mut spending = vec![sequential::Spending::new(share.each(), &schedule); replicas];
    // A cap below what the rank test needs decides only constant metrics declared
    // deterministic: said before the first pair (the user may stop and raise it) and in
    // the verdict.
    let too_few = paired
        .then(|| too_few_pairs(cap, repeat, &rules, &share))
        .flatten();
    if let Some(why) = &too_few {
        tracing::warn!("task `{}`: {why}", t.name);
    }
    let mut stopped = format!("ran all {cap} pairs");
    let decided = |patched: &[Vec<RunResult>]| {
        patched
            .iter()
            .flatten()
            .any(|r| r.outcome.budget_exceeded.is_some() || r.outcome.exec_error.is_some())
    };
    for round in 0..cap {
        // Drawn for every pair with a baseline, a task's single pair too, the evaluation's
        // first pair too: a patched side already prepared for it (where the patch was
        // tried) is given up when the baseline is drawn first, and prepared again after it,
        // so that sandboxes stay one at a time (a prepared side holds its capped disk) and
        // the cold first run falls on either side alike.
        let baseline_first = t.spec.baseline && sequential::baseline_first(order_seed, round);
        if baseline_first {
            if let Some(prepared) = first.take() {
                prepared.into_sandbox().destroy()?;
            }
            run_baseline(p, t, s, round, &mut baseline, &mut names)?;
        }
        for (r, runs) in patched.iter_mut().enumerate() {
            let prepared = match first.take() {
                Some(f) => f,
                None => prepare_patched(p, t, s)?,
            };
            let mut run = side::run_side(
                p,
                t,
                *prepared,
                s.staging,
                s.source,
                &side::side_label("patched", r, round, replicas),
            )?;
            names.patched.admit(&mut run, metrics_file(t), "patched");
            runs.push(run);
            check_interrupt()?;
        }
        if t.spec.baseline && !baseline_first && !decided(&patched) {
            run_baseline(p, t, s, round, &mut baseline, &mut names)?;
        }
        // A run that blew a budget or could not start ends the repeats: the answer is known.
        if decided(&patched) {
            stopped = format!("a run ended the task after {} pairs", round + 1);
            break;
        }
        if paired {
            if let Some(look) = schedule.iter().position(|&n| n == round + 1) {
                let ctx = Look {
                    index: look,
                    order_seed,
                    metrics_declared: t.spec.metrics.is_some(),
                };
                let all = (0..replicas)
                    .map(|r| {
                        let (runs, spent) = (&patched[r], &mut spending[r]);
                        look_at(&rules, runs, &baseline, &ctx, spent, &mut assessed[r])
                    })
                    .fold(Settled::Decided, Settled::min);
                match all {
                    Settled::Decided => {
                        stopped = format!(
                            "every metric decided at look {} of {} ({} pairs)",
                            look + 1,
                            schedule.len(),
                            round + 1
                        );
                        break;
                    }
                    Settled::Regressed => {
                        stopped = format!(
                            "a regression settled the verdict at look {} of {} ({} pairs)",
                            look + 1,
                            schedule.len(),
                            round + 1
                        );
                        break;
                    }
                    Settled::Open if round + 1 == cap => {
                        stopped = format!("the run cap of {cap} pairs");
                    }
                    Settled::Open => {}
                }
            }
        }
    }
    for a in assessed.iter_mut().flat_map(|m| m.values_mut()) {
        a.stopped = stopped.clone();
    }
    if let Some(unused) = first {
        unused.into_sandbox().destroy()?;
    }

    // Whether any metric was tested (not decided exactly) in any replica.
    let tested = assessed
        .iter()
        .flat_map(|m| m.values())
        .any(|x| x.alpha > 0.0);

    // A decision per replica, then agreement.
    let baseline_samples = evidence::baseline_samples(&baseline);
    let mut decisions: Vec<(Decision, usize, Option<Exceeded>)> = Vec::new();
    for (r, runs) in patched.iter().enumerate() {
        let (mut evidence, chosen) =
            evidence::evidence_for(t, runs, &baseline, &baseline_samples, &rules, r as u64);
        evidence.assessments = std::mem::take(&mut assessed[r]);
        // Baseline metrics refused for too many names leave nothing whole to compare
        // with: the patched side's metrics are then no evidence either (fail closed).
        if evidence.metrics_error.is_none() {
            evidence.metrics_error = names.baseline.refused.clone();
        }
        // The API-cost budget is the evaluation's: blown by any run (the baseline's too),
        // it is blown for the verdict.
        if let Some(g) = p.gateway.as_ref().filter(|g| g.meter.exceeded()) {
            if evidence.budget_exceeded.is_none() {
                evidence.budget_exceeded = Some(Exceeded::Run(BudgetKind::ApiCost));
                evidence.usage_summary = Some(format!(
                    "api_cost: ${:.4} of ${:.4} spent by this evaluation's runs{}",
                    g.meter.spent_usd(),
                    g.meter.budget_usd(),
                    crate::budget::api_cost_why(g.meter.spent_usd(), g.meter.budget_usd())
                ));
            }
        }
        decisions.push((decide(&evidence, &rules), chosen, evidence.budget_exceeded));
    }
    let severity = |k: VerdictKind| match k {
        VerdictKind::Reject => 2,
        VerdictKind::NeedsRevision => 1,
        VerdictKind::Approve => 0,
    };
    // The most severe replica's decision stands (a security tool errs towards "no").
    let pick = decisions
        .iter()
        .enumerate()
        .max_by_key(|(i, (d, ..))| (severity(d.verdict), std::cmp::Reverse(*i)))
        .map(|(i, _)| i)
        .unwrap_or(0);
    let mut decision = decisions[pick].0.clone();
    let (chosen_run, exceeded) = (decisions[pick].1, decisions[pick].2);
    if replicas > 1 {
        agreement(&mut decision, &decisions, replicas);
    }
    if let Some(b) = baseline
        .iter()
        .find(|b| b.outcome.exit_code != 0 || b.outcome.budget_exceeded.is_some())
    {
        decision.caveats.push(format!(
            "the baseline (unpatched) run itself ended with exit {}{}",
            b.outcome.exit_code,
            b.outcome
                .budget_exceeded
                .map(|k| format!(" ({} budget)", k.as_str()))
                .unwrap_or_default()
        ));
    }
    if let Some(why) = too_few.filter(|_| tested) {
        decision.caveats.push(why);
    }
    // What fork could not do with what a successor left is said, never an error.
    for note in patched
        .iter()
        .flatten()
        .chain(&baseline)
        .flat_map(|r| &r.notes)
    {
        if !decision.caveats.contains(note) {
            decision.caveats.push(note.clone());
        }
    }
    let mut artifacts = Vec::new();
    for run in patched.iter().flatten() {
        artifacts.extend(run.artifacts.iter().cloned());
    }
    for b in &baseline {
        for (kind, path) in &b.artifacts {
            let kind = match kind {
                ArtifactType::TestReport => ArtifactType::BaselineTestReport,
                ArtifactType::Metrics => ArtifactType::BaselineMetrics,
                other => *other,
            };
            artifacts.push((kind, path.clone()));
        }
    }
    let primary = patched.swap_remove(pick).swap_remove(chosen_run);
    Ok(TaskRun {
        decision,
        primary,
        exceeded,
        artifacts,
        rules,
    })
}

/// Runs the baseline side of pair `round` (when its clone can be prepared).
fn run_baseline(
    p: &Plan,
    t: &TaskPlan,
    s: &Sources<'_>,
    round: usize,
    baseline: &mut Vec<RunResult>,
    names: &mut Names,
) -> Result<(), EvaluateError> {
    if let prepare::Prepared::Ready(side) =
        prepare::prepare_side(p, t, s.source_dir, s.snap_dir, None, s.source)?
    {
        let mut run = side::run_side(
            p,
            t,
            *side,
            s.staging,
            s.source,
            &side::side_label("baseline", 0, round, 1),
        )?;
        names.baseline.admit(&mut run, metrics_file(t), "baseline");
        baseline.push(run);
    }
    check_interrupt()
}

/// The distinct metric names of a task's two sides, each capped across its runs
/// ([`evidence::MetricNames`]).
#[derive(Default)]
struct Names {
    patched: evidence::MetricNames,
    baseline: evidence::MetricNames,
}

/// The task's declared metrics file, as its messages name it.
fn metrics_file(t: &TaskPlan) -> &str {
    t.spec.metrics.as_deref().unwrap_or("metrics")
}

/// Where a look stands in the sequential design.
struct Look {
    index: usize,
    order_seed: u64,
    /// The task declares a metrics file: a look at patched runs that reported no metric
    /// is never settled (there is nothing it decided).
    metrics_declared: bool,
}

/// What a look found for one replica, least settled first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Settled {
    /// A metric is still inconclusive, or one the baseline reported is missing from the
    /// patched runs (or they reported none of a declared metrics file).
    Open,
    /// A deciding metric regressed: the verdict cannot become APPROVE.
    Regressed,
    /// Every metric is decided.
    Decided,
}

impl Settled {
    /// Across replicas: stop only when every replica is settled, and for the weaker reason.
    fn min(self, other: Settled) -> Settled {
        std::cmp::min(self, other)
    }
}

/// Whether a task compares pairs (a baseline and more than one run): its metrics are
/// tested and spend `alpha`.
fn compares_pairs(t: &TaskPlan) -> bool {
    t.spec.baseline && t.spec.repeat > 1
}

/// A replica's share of the policy's `alpha`: split over the replicas and over the plan's
/// tasks that compare pairs.
struct Share {
    alpha: f64,
    replicas: usize,
    tasks: usize,
}

impl Share {
    fn each(&self) -> f64 {
        self.alpha / (self.replicas * self.tasks) as f64
    }

    /// How the share came about, for the warning: "" when it is the whole `alpha`.
    fn split(&self) -> String {
        let over = match (self.tasks, self.replicas) {
            (1, 1) => return String::new(),
            (1, r) => format!("{r} replicas"),
            (t, 1) => format!("{t} tasks that compare pairs"),
            (t, r) => format!("{t} tasks that compare pairs and {r} replicas"),
        };
        format!(" (alpha {} split over {over})", shown(self.alpha))
    }
}

/// A level as the warning shows it: 3 significant digits, no trailing zeros.
fn shown(x: f64) -> String {
    if x > 0.0 && x < 0.001 {
        return format!("{x:.2e}");
    }
    let s = format!("{x:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Why `cap` pairs can never decide a metric that is tested (any but a constant one declared
/// deterministic): the rank test's smallest p at `cap` pairs is not below half a replica's
/// whole share of `alpha` (the most any one metric can be given), or None when it is.
fn too_few_pairs(
    cap: usize,
    repeat: usize,
    rules: &DecisionRules,
    share: &Share,
) -> Option<String> {
    let a = share.each();
    let need = sequential::fewest_pairs(a);
    if need.is_some_and(|n| n <= cap) {
        return None;
    }
    let limit = if cap < repeat {
        format!("the policy's max_pairs = {}", rules.max_pairs)
    } else {
        format!("repeat = {repeat}")
    };
    let need = match need {
        Some(n) => format!("at least {n} pairs, more when several metrics are tested"),
        None => "more than 1000 pairs".into(),
    };
    Some(format!(
        "at most {cap} pairs ({limit}) are too few for the rank test to decide any metric it \
         tests (all but constant ones declared deterministic: band 0, or constant_changes = \
         \"exact\") at alpha {}{}: it needs {need}; such a metric stays inconclusive",
        shown(a),
        share.split()
    ))
}

/// Looks at one replica's pairs: each metric not yet decided is assessed at this look's
/// error level (the look's share of the policy's alpha, split over the tested metrics, from
/// the replica's `spending`); a decided metric keeps its decision.
fn look_at(
    rules: &DecisionRules,
    runs: &[RunResult],
    baseline: &[RunResult],
    look: &Look,
    spending: &mut sequential::Spending,
    assessed: &mut BTreeMap<String, Assessed>,
) -> Settled {
    let ps = evidence::samples(runs);
    let bs = evidence::baseline_samples(baseline);
    let pairs: Vec<(&String, &Vec<f64>, &Vec<f64>)> = ps
        .iter()
        .filter_map(|(k, p)| bs.get(k).map(|b| (k, b, p)))
        .collect();
    // Metrics decided exactly spend nothing; every other one gets its share of the look's.
    let exact = |name: &str, b: &[f64], p: &[f64]| {
        let exactly = rules.constant_sides_are_exact(name);
        sequential::exact_outcome(b, p, rules.band_for(name), exactly).is_some()
    };
    let tested = pairs
        .iter()
        .filter(|(name, b, p)| !exact(name, b, p))
        .count();
    let a = spending.level(look.index, tested);
    for (name, b, p) in &pairs {
        // A tested decision stands (the design spent its error on it); an exact one is
        // looked at again, since a side constant so far may vary from this look on.
        if assessed
            .get(*name)
            .is_some_and(|x| x.outcome != Outcome::Inconclusive && x.alpha > 0.0)
        {
            continue;
        }
        let band = rules.band_for(name);
        let r = sequential::assess(b, p, band, a, rules.constant_sides_are_exact(name));
        assessed.insert(
            (*name).clone(),
            Assessed {
                outcome: r.outcome,
                ci: r.ci,
                band,
                alpha: if r.exact { 0.0 } else { a },
                stopped: String::new(),
                order_seed: look.order_seed,
            },
        );
    }
    let deciding = |name: &str| !rules.is_informational(name);
    let regressed = assessed.iter().any(|(name, x)| {
        deciding(name)
            && rules.regression_is != VerdictKind::Approve
            && match x.outcome {
                Outcome::Higher => rules.is_lower_better(name),
                Outcome::Lower => !rules.is_lower_better(name),
                _ => false,
            }
    });
    // A metric the baseline reported and the patched runs did not (so far) is not decided,
    // informational or not: the decision names it as missing if it stays so, and stopping
    // here would claim every metric decided. Nor is a declared metrics file in which the
    // patched runs reported nothing at all.
    let missing = bs.keys().any(|k| !ps.contains_key(k));
    let reported_none = look.metrics_declared && ps.is_empty();
    let open = missing
        || reported_none
        || assessed
            .iter()
            .any(|(name, x)| deciding(name) && x.outcome == Outcome::Inconclusive);
    if !open {
        Settled::Decided
    } else if regressed {
        Settled::Regressed
    } else {
        Settled::Open
    }
}

/// The replicas' agreement: a caveat, and the confidence scaled by it when they disagree.
fn agreement(
    decision: &mut Decision,
    decisions: &[(Decision, usize, Option<Exceeded>)],
    replicas: usize,
) {
    let agree = decisions
        .iter()
        .filter(|(d, ..)| d.verdict == decision.verdict)
        .count();
    if agree < replicas {
        let counts: Vec<String> = [
            VerdictKind::Approve,
            VerdictKind::NeedsRevision,
            VerdictKind::Reject,
        ]
        .iter()
        .filter_map(|k| {
            let n = decisions.iter().filter(|(d, ..)| d.verdict == *k).count();
            (n > 0).then(|| format!("{n} {k}"))
        })
        .collect();
        decision.caveats.push(format!(
            "The {replicas} replicas disagree ({}); the most severe verdict stands and the confidence is scaled by the agreement ({agree}/{replicas}).",
            counts.join(", ")
        ));
        decision.confidence =
            ((decision.confidence * agree as f64 / replicas as f64) * 1000.0).round() / 1000.0;
    } else {
        decision.caveats.push(format!(
            "All {replicas} independent replicas agree ({}).",
            decision.verdict
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::evidence::testing::with_metrics;
    use super::*;

    fn look_declared(
        rules: &DecisionRules,
        patched: &[RunResult],
        baseline: &[RunResult],
        metrics_declared: bool,
    ) -> Settled {
        let schedule = sequential::looks(3, 20);
        let mut spending = sequential::Spending::new(rules.alpha, &schedule);
        let look = Look {
            index: 0,
            order_seed: 1,
            metrics_declared,
        };
        let mut assessed = BTreeMap::new();
        look_at(
            rules,
            patched,
            baseline,
            &look,
            &mut spending,
            &mut assessed,
        )
    }

    fn looked(rules: &DecisionRules, patched: &[RunResult], baseline: &[RunResult]) -> Settled {
        look_declared(rules, patched, baseline, true)
    }

    /// A metric the baseline reported and the patched runs did not is not decided: the
    /// pairs go on (to the cap, where the decision names it as missing), whether the
    /// patched side reported no metric at all or only some.
    #[test]
    fn a_metric_missing_from_the_patched_side_keeps_the_look_open() {
        let rules = DecisionRules::default();
        let demo = [("compressed_bytes", 296_000.0), ("ratio", 0.86)];
        let baseline: Vec<RunResult> = (0..3).map(|_| with_metrics(&demo)).collect();
        let nothing: Vec<RunResult> = (0..3).map(|_| with_metrics(&[])).collect();
        assert_eq!(looked(&rules, &nothing, &baseline), Settled::Open);
        let some: Vec<RunResult> = (0..3)
            .map(|_| with_metrics(&[("compressed_bytes", 296_000.0)]))
            .collect();
        assert_eq!(looked(&rules, &some, &baseline), Settled::Open);
        // Both reported, both constant and equal: decided (exactly, band 0 for bytes; the
        // ratio by constant_changes = "exact").
        let exact = DecisionRules {
            constant_changes: crate::verdict::decide::ConstantChanges::Exact,
            ..DecisionRules::default()
        };
        assert_eq!(looked(&exact, &baseline, &baseline), Settled::Decided);
        assert_eq!(looked(&exact, &some, &baseline), Settled::Open);
        // An informational metric missing holds the pairs too: the decision names it.
        let info = DecisionRules {
            informational: vec!["ratio".into()],
            ..exact
        };
        assert_eq!(looked(&info, &some, &baseline), Settled::Open);
        // A declared metrics file that neither side filled holds the pairs; a task that
        // declares none (tests only) is settled by its first look, as before.
        let bare: Vec<RunResult> = (0..3).map(|_| super::evidence::testing::run()).collect();
        assert_eq!(looked(&info, &nothing, &nothing), Settled::Open);
        assert_eq!(look_declared(&info, &bare, &bare, false), Settled::Decided);
    }

    /// Names that differ from run to run add up to the cap across the side's runs, and
    /// not past it: a run that would pass it is refused whole, as an unusable metrics
    /// file, and the side's evidence is never a decision on a truncated set.
    #[test]
    fn metric_names_are_capped_across_a_sides_runs() {
        use crate::task::results::MAX_METRICS;
        let run_of = |run: usize, n: usize| {
            let names: Vec<(String, f64)> = (0..n).map(|i| (format!("r{run}_m{i}"), 1.0)).collect();
            let refs: Vec<(&str, f64)> = names.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            with_metrics(&refs)
        };
        let mut names = evidence::MetricNames::default();
        let mut runs = Vec::new();
        for r in 0..3 {
            let mut run = run_of(r, MAX_METRICS / 2 + 1);
            names.admit(&mut run, "metrics.json", "patched");
            runs.push(run);
        }
        assert!(runs[0].metrics.is_some() && runs[0].metrics_error.is_none());
        for run in &runs[1..] {
            assert!(run.metrics.is_none(), "refused whole");
            let e = run.metrics_error.as_deref().unwrap();
            assert!(
                e.starts_with("metrics.json: this patched run reported 5001 metric names")
                    && e.contains(&format!("the {MAX_METRICS} distinct names")),
                "{e}"
            );
        }
        assert!(evidence::samples(&runs).len() <= MAX_METRICS);
        assert!(names.refused.is_some());
        // The same names in every run are never refused, however many runs.
        let mut names = evidence::MetricNames::default();
        for _ in 0..5 {
            let mut run = run_of(0, MAX_METRICS);
            names.admit(&mut run, "metrics.json", "baseline");
            assert!(run.metrics_error.is_none());
        }
        assert!(names.refused.is_none());
        // A refused run makes the decision NEEDS_REVISION, naming why.
        let t = super::evidence::testing::task("metrics = \"metrics.json\"\nrepeat = 3\n");
        let rules = DecisionRules {
            self_reported: crate::verdict::decide::SelfReported::Accept,
            ..DecisionRules::default()
        };
        let (e, _) = evidence::evidence_for(&t, &runs, &[], &Default::default(), &rules, 0);
        let d = decide(&e, &rules);
        assert_eq!(d.verdict, VerdictKind::NeedsRevision, "{}", d.summary);
        assert!(d.summary.contains("distinct names"), "{}", d.summary);
    }
}
