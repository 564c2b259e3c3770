//! One decision from the decisions of an evaluation plan's tasks: the most severe verdict
//! stands, so a metric gain never approves a patch that fails a correctness check.

use super::{severity, Decision};
use crate::verdict::VerdictKind;

/// A task of the plan and its decision (none: it did not run, with why).
pub struct TaskDecision<'a> {
    pub task: &'a str,
    pub decision: Result<&'a Decision, &'a str>,
}

/// Combines the plan's decisions. One task: its decision as it is (a one-task plan's
/// verdict reads as before plans existed). Several: the most severe verdict, the lowest
/// confidence among the tasks that decided it, every summary, caveat and metric named
/// after its task (`contract: ...`, metric `bench/ratio`), and a caveat for every task
/// that did not run.
pub fn combine(tasks: &[TaskDecision<'_>]) -> Option<Decision> {
    let decided: Vec<(&str, &Decision)> = tasks
        .iter()
        .filter_map(|t| t.decision.ok().map(|d| (t.task, d)))
        .collect();
    let worst = decided.iter().map(|(_, d)| severity(d.verdict)).max()?;
    if let ([t], [(_, d)]) = (tasks, decided.as_slice()) {
        let _ = t;
        return Some((*d).clone());
    }
    let speaking: Vec<&(&str, &Decision)> = decided
        .iter()
        .filter(|(_, d)| severity(d.verdict) == worst)
        .collect();
    let verdict = speaking[0].1.verdict;
    let confidence = speaking
        .iter()
        .map(|(_, d)| d.confidence)
        .fold(f64::INFINITY, f64::min);
    let mut summary = Vec::new();
    let mut caveats = Vec::new();
    let mut metrics = Vec::new();
    for t in tasks {
        match t.decision {
            Ok(d) => {
                summary.push(format!("{}: {}", t.task, d.summary.trim()));
                caveats.extend(d.caveats.iter().map(|c| format!("{}: {c}", t.task)));
                metrics.extend(d.metrics.iter().map(|m| {
                    let mut m = m.clone();
                    m.name = format!("{}/{}", t.task, m.name);
                    m
                }));
            }
            Err(why) => caveats.push(format!("task `{}` did not run: {why}", t.task)),
        }
    }
    // A plan is approved whole or not at all: a task that did not run is no evidence.
    let verdict = if verdict == VerdictKind::Approve && decided.len() < tasks.len() {
        summary.push("Not every task of the plan ran.".to_string());
        VerdictKind::NeedsRevision
    } else {
        verdict
    };
    Some(Decision {
        verdict,
        confidence,
        summary: summary.join(" "),
        caveats,
        metrics,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::Metric;

    fn d(v: VerdictKind, c: f64, summary: &str) -> Decision {
        Decision {
            verdict: v,
            confidence: c,
            summary: summary.into(),
            caveats: vec![format!("{summary} caveat")],
            metrics: vec![Metric {
                name: "ratio".into(),
                baseline: Some(1.0),
                patched: 0.5,
                change: Some(-0.5),
                significant: Some(true),
                ci_low: None,
                ci_high: None,
                p_value: None,
                samples: None,
                ..Metric::default()
            }],
        }
    }

    #[test]
    fn one_task_reads_as_before() {
        let a = d(VerdictKind::Approve, 0.97, "Test suite passed (3/3).");
        let c = combine(&[TaskDecision {
            task: "tests",
            decision: Ok(&a),
        }])
        .unwrap();
        assert_eq!(c.summary, a.summary);
        assert_eq!(c.metrics[0].name, "ratio");
        assert_eq!(c.caveats, a.caveats);
    }

    #[test]
    fn a_metric_gain_never_outweighs_a_failed_check() {
        let fail = d(VerdictKind::Reject, 0.95, "2 of 12 tests failed.");
        let gain = d(VerdictKind::Approve, 0.99, "ratio improved 50%.");
        let c = combine(&[
            TaskDecision {
                task: "contract",
                decision: Ok(&fail),
            },
            TaskDecision {
                task: "bench",
                decision: Ok(&gain),
            },
        ])
        .unwrap();
        assert_eq!(c.verdict, VerdictKind::Reject);
        assert_eq!(c.confidence, 0.95);
        assert_eq!(
            c.summary,
            "contract: 2 of 12 tests failed. bench: ratio improved 50%."
        );
        assert_eq!(c.metrics[0].name, "contract/ratio");
        assert_eq!(c.metrics[1].name, "bench/ratio");
        assert!(c
            .caveats
            .contains(&"bench: ratio improved 50%. caveat".to_string()));
    }

    #[test]
    fn all_approve_is_approve() {
        let a = d(VerdictKind::Approve, 0.97, "ok.");
        let b = d(VerdictKind::Approve, 0.9, "fine.");
        let c = combine(&[
            TaskDecision {
                task: "a",
                decision: Ok(&a),
            },
            TaskDecision {
                task: "b",
                decision: Ok(&b),
            },
        ])
        .unwrap();
        assert_eq!(c.verdict, VerdictKind::Approve);
        assert_eq!(c.confidence, 0.9);
    }

    #[test]
    fn all_approve_takes_the_lowest_confidence_and_skips_are_said() {
        let a = d(VerdictKind::Approve, 0.97, "ok.");
        let b = d(VerdictKind::Approve, 0.9, "fine.");
        let c = combine(&[
            TaskDecision {
                task: "a",
                decision: Ok(&a),
            },
            TaskDecision {
                task: "b",
                decision: Ok(&b),
            },
            TaskDecision {
                task: "c",
                decision: Err("the evaluation was over"),
            },
        ])
        .unwrap();
        assert_eq!(
            c.verdict,
            VerdictKind::NeedsRevision,
            "a plan is approved whole"
        );
        assert_eq!(c.confidence, 0.9);
        assert!(c
            .caveats
            .contains(&"task `c` did not run: the evaluation was over".to_string()));
        assert!(combine(&[TaskDecision {
            task: "x",
            decision: Err("no")
        }])
        .is_none());
    }
}
