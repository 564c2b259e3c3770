//! The evaluation plan in a verdict (schema 1.3): every task the evaluation planned, in
//! order, with what each one decided, so that one verdict combines them ("Test suite
//! passed (12/12). ratio improved 18%.") and a reader can still see each task's part.

use super::{BudgetReport, Metric, Provenance, TestCounts, VerdictKind};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// One task of the plan, as it ran (or why it did not).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskVerdict {
    /// The task's name in fork.toml.
    pub task: String,
    /// sha256 over the task's name and definition.
    pub task_hash: String,
    /// This task's own decision; absent when it did not run (a gate stopped the patch, the
    /// patch did not apply, or an earlier task of the plan already rejected it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<VerdictKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    /// This task's own summary, or why it did not run.
    pub summary: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
    #[serde(default)]
    pub tests: TestCounts,
    #[serde(default)]
    pub metrics: Vec<Metric>,
    /// This task's budget (limits and what its speaking run used), when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetReport>,
}

/// The plan's hash from its tasks' names and hashes, in order: a one-task plan's is that
/// task's hash (so the verdicts, cache rows and consensus of one task read the same as
/// before plans existed); a plan of several hashes every name and hash.
pub fn plan_hash<'a>(tasks: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let tasks: Vec<(&str, &str)> = tasks.into_iter().collect();
    if let [(_, one)] = tasks.as_slice() {
        return one.to_string();
    }
    let mut h = Sha256::new();
    h.update(b"fork-plan-v1\0");
    for (name, hash) in tasks {
        h.update(name.as_bytes());
        h.update([0]);
        h.update(hash.as_bytes());
        h.update([b'\n']);
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// The verdict's `task` for a plan: its tasks' names joined by `+`.
pub fn plan_name<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names.into_iter().collect::<Vec<_>>().join("+")
}

/// The checks a 1.3 verdict's plan must pass against the verdict's `task` and
/// `task_hash`; every problem found.
pub fn check_plan(plan: &[TaskVerdict], task: &str, task_hash: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if plan.is_empty() {
        errs.push("plan is empty: a 1.3 verdict lists the tasks it ran".to_string());
        return errs;
    }
    for (i, t) in plan.iter().enumerate() {
        if t.task.is_empty() {
            errs.push(format!("plan[{i}].task is empty"));
        }
        if !super::is_sha256_digest(&t.task_hash) {
            errs.push(format!(
                "plan[{i}].task_hash `{}` is not sha256:<64 lowercase hex digits>",
                t.task_hash
            ));
        }
        if let Some(c) = t
            .confidence
            .filter(|c| !(c.is_finite() && (0.0..=1.0).contains(c)))
        {
            errs.push(format!("plan[{i}].confidence {c} is not in [0, 1]"));
        }
        if plan[..i].iter().any(|o| o.task == t.task) {
            errs.push(format!("plan[{i}].task `{}` appears twice", t.task));
        }
    }
    let name = plan_name(plan.iter().map(|t| t.task.as_str()));
    if name != task {
        errs.push(format!(
            "task `{task}` is not the plan's tasks joined by `+` (`{name}`)"
        ));
    }
    let hash = plan_hash(plan.iter().map(|t| (t.task.as_str(), t.task_hash.as_str())));
    if hash != task_hash {
        errs.push(format!(
            "task_hash {task_hash} is not the hash of the plan's tasks ({hash})"
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, hash: &str) -> TaskVerdict {
        TaskVerdict {
            task: name.into(),
            task_hash: hash.into(),
            verdict: Some(VerdictKind::Approve),
            confidence: Some(0.9),
            summary: "ok".into(),
            provenance: Some(Provenance::Judge),
            tests: TestCounts::default(),
            metrics: vec![],
            budget: None,
        }
    }

    #[test]
    fn a_one_task_plan_hashes_as_its_task() {
        let h = format!("sha256:{}", "a".repeat(64));
        assert_eq!(plan_hash([("tests", h.as_str())]), h);
        assert!(check_plan(&[entry("tests", &h)], "tests", &h).is_empty());
    }

    #[test]
    fn a_plan_of_several_is_checked_against_task_and_task_hash() {
        let (a, b) = (
            format!("sha256:{}", "a".repeat(64)),
            format!("sha256:{}", "b".repeat(64)),
        );
        let plan = vec![entry("contract", &a), entry("bench", &b)];
        let h = plan_hash([("contract", a.as_str()), ("bench", b.as_str())]);
        assert_ne!(h, a);
        assert_ne!(
            h,
            plan_hash([("bench", b.as_str()), ("contract", a.as_str())]),
            "the order is part of the plan"
        );
        assert!(check_plan(&plan, "contract+bench", &h).is_empty());
        let errs = check_plan(&plan, "contract", &a);
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs[0].contains("contract+bench"));
        assert!(check_plan(&[], "x", &a)[0].contains("plan is empty"));
        let dup = vec![entry("bench", &b), entry("bench", &b)];
        let h2 = plan_hash([("bench", b.as_str()), ("bench", b.as_str())]);
        assert!(check_plan(&dup, "bench+bench", &h2)[0].contains("appears twice"));
    }
}
