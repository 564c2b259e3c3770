//! The JUnit report's metric cases say what the verdict's summary and caveats say, from
//! the same wording: why a metric is inconclusive, "unchanged" only for a metric shown
//! equivalent, and each metric's own band in the single-sample caveat.

use super::*;
use crate::verdict::decide::{decide, Evidence};
use crate::verdict::report::tests::{fixture, metric};
use crate::verdict::MetricVerdict;

/// The `<failure message>` or `<system-out>` of the case named `name`.
fn said_of(xml: &str, name: &str) -> String {
    let start = xml
        .find(&format!("name=\"{name}\""))
        .unwrap_or_else(|| panic!("no case {name} in {xml}"));
    let case = &xml[start..];
    let end = case.find("</testcase>").unwrap_or(case.len());
    case[..end].to_string()
}

fn assessed(mut m: Metric, class: MetricVerdict, band: f64, ci: (f64, f64)) -> Metric {
    m.class = Some(class);
    m.band = Some(band);
    (m.ci_low, m.ci_high) = (Some(ci.0), Some(ci.1));
    m.samples = Some(3);
    m
}

#[test]
fn an_inconclusive_metric_says_why_as_the_summary_does() {
    let (mut v, _) = fixture();
    let rules = crate::verdict::decide::tests::rules();
    // Three pairs, an interval well inside the 10% band: too few pairs, not "beyond".
    let few = assessed(
        metric("p99_ms", Some(0.5004), 0.5001),
        MetricVerdict::Inconclusive,
        0.10,
        (-0.001, 0.0),
    );
    // An interval across the band's upper edge.
    let across = assessed(
        metric("latency_ms", Some(100.0), 135.0),
        MetricVerdict::Inconclusive,
        0.10,
        (0.008, 1.07),
    );
    v.metrics = vec![few, across];
    let xml = junit(&v, None, &rules);
    let few_case = said_of(&xml, "p99_ms");
    assert!(
        few_case.contains("too few pairs for the test to reach its level"),
        "{few_case}"
    );
    assert!(!few_case.contains("beyond"), "{few_case}");
    assert!(few_case.contains("the 10.0% noise band"), "{few_case}");
    let across_case = said_of(&xml, "latency_ms");
    assert!(
        across_case.contains("the interval reaches across an edge of the band"),
        "{across_case}"
    );
}

#[test]
fn only_a_metric_shown_equivalent_is_unchanged() {
    let (mut v, _) = fixture();
    let rules = crate::verdict::decide::tests::rules();
    // One pair, +0.2% against a 1% band: within it, never tested.
    let single = metric("p50_ms", Some(0.5), 0.501);
    let equivalent = assessed(
        metric("ratio", Some(0.86), 0.8601),
        MetricVerdict::Equivalent,
        0.01,
        (-0.001, 0.001),
    );
    v.metrics = vec![single, equivalent];
    let xml = junit(&v, None, &rules);
    let single_case = said_of(&xml, "p50_ms");
    assert!(!single_case.contains("unchanged"), "{single_case}");
    assert!(
        single_case.contains("within the 1.0% noise band (not tested for equivalence)"),
        "{single_case}"
    );
    let eq_case = said_of(&xml, "ratio");
    assert!(eq_case.contains("ratio unchanged"), "{eq_case}");
}

/// One pair of `p99_ms` under the default per-kind bands (10% for `*p9*`) and a 1% policy
/// band: the caveat about untested changes quotes the 10% the metric was judged against,
/// in the verdict and so in the JUnit verdict case.
#[test]
fn the_single_sample_caveat_quotes_each_metrics_own_band() {
    let rules = DecisionRules {
        noise_band: 0.01,
        ..DecisionRules::default()
    };
    let mut e = Evidence {
        exit_code: Some(0),
        metrics: Some([("p99_ms".to_string(), 0.501)].into()),
        baseline_metrics: Some([("p99_ms".to_string(), 0.5)].into()),
        ..Evidence::default()
    };
    let d = decide(&e, &rules);
    // As the summary says it, and the JUnit case of the metric.
    let within = "within the 10.0% noise band (not tested for equivalence)";
    assert!(d.summary.contains(within), "{}", d.summary);
    let caveat = d
        .caveats
        .iter()
        .find(|c| c.contains("single run"))
        .unwrap_or_else(|| panic!("{:?}", d.caveats));
    assert!(caveat.contains("the 10.0% noise band"), "{caveat}");
    assert!(!caveat.contains("1.0%"), "{caveat}");
    let (mut v, _) = fixture();
    v.caveats = d.caveats.clone();
    v.metrics = d.metrics.clone();
    let xml = junit(&v, None, &rules);
    assert!(!xml.contains("the 1.0% noise band"), "{xml}");
    assert!(said_of(&xml, "p99_ms").contains(within), "{xml}");
    // Metrics of different bands: each named with its own.
    e.metrics = Some([("p99_ms".into(), 0.501), ("ratio".into(), 0.8601)].into());
    e.baseline_metrics = Some([("p99_ms".into(), 0.5), ("ratio".into(), 0.86)].into());
    let d = decide(&e, &rules);
    let caveat = d.caveats.iter().find(|c| c.contains("single run")).unwrap();
    assert!(
        caveat.contains("their noise bands (p99_ms 10.0%, ratio 1.0%)"),
        "{caveat}"
    );
}
