//! The JUnit XML report of a verdict (`--junit FILE`): one case per test, one per metric
//! check and one for the verdict, written with quick-xml's writer.
//!
//! quick-xml writes attribute values and text as given (`from_escaped`, raw attributes), so
//! this module escapes every string itself: quick-xml's own escaping leaves characters that
//! XML 1.0 cannot carry (C0 controls, U+FFFE) in place, which readers such as expat refuse,
//! and keeps tabs and line breaks raw inside attributes, where readers turn them into spaces.

use quick_xml::events::attributes::Attribute;
use quick_xml::events::{BytesDecl, BytesEnd, BytesStart, BytesText, Event};
use quick_xml::Writer;
use std::fmt::Write as _;
use std::io;

use super::{change_pct, num, CLASS_METRICS, CLASS_TESTS, CLASS_VERDICT, VERDICT_CASE};
use crate::task::results::{TestOutcome, TestReport};
use crate::verdict::decide::{wording, DecisionRules, MetricClass};
use crate::verdict::kind::VerdictKind;
use crate::verdict::{Metric, Verdict};

/// `41 → 45.92 (+12.0%)`, or `45.92 (no baseline)`.
fn movement(m: &Metric) -> String {
    match m.baseline {
        Some(b) => format!("{} → {} ({})", num(b), num(m.patched), change_pct(m.change)),
        None => format!("{} (no baseline)", num(m.patched)),
    }
}

// ---------------------------------------------------------------------------------------
// JUnit XML.
// ---------------------------------------------------------------------------------------

/// Whether XML 1.0 can carry `c` (the `Char` production), and it is not a C1 control.
fn xml_char_ok(c: char) -> bool {
    matches!(c,
        '\t' | '\n' | '\r'
        | '\u{20}'..='\u{7E}'
        | '\u{A0}'..='\u{D7FF}'
        | '\u{E000}'..='\u{FFFD}'
        | '\u{10000}'..='\u{10FFFF}')
}

/// `s` escaped for XML: the markup characters (`>` too, so `]]>` can never appear), CR as
/// a reference (a reader would normalize a raw one away), and every character XML 1.0
/// cannot carry replaced with U+FFFD. In a double-quoted attribute value (`attribute`)
/// quotes, tabs and line feeds become references too, since readers normalize raw tabs and
/// line breaks in attributes to spaces.
fn escape(s: &str, attribute: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\r' => out.push_str("&#13;"),
            '"' if attribute => out.push_str("&quot;"),
            '\'' if attribute => out.push_str("&apos;"),
            '\t' if attribute => out.push_str("&#9;"),
            '\n' if attribute => out.push_str("&#10;"),
            c if xml_char_ok(c) => out.push(c),
            _ => out.push('\u{FFFD}'),
        }
    }
    out
}

/// An element's tag with its attributes, in order, each value escaped by [`escape`].
fn element<'a>(name: &'a str, attrs: &[(&str, &str)]) -> BytesStart<'a> {
    let mut e = BytesStart::new(name);
    for (key, value) in attrs {
        let value = escape(value, true);
        e.push_attribute(Attribute::from((key.as_bytes(), value.as_bytes())));
    }
    e
}

/// `<name>text</name>` on one line, the text escaped by [`escape`].
fn text_element<W: io::Write>(
    w: &mut Writer<W>,
    start: BytesStart<'_>,
    text: &str,
) -> io::Result<()> {
    let end = start.to_end().into_owned();
    w.write_event(Event::Start(start))?;
    w.write_event(Event::Text(BytesText::from_escaped(escape(text, false))))?;
    w.write_event(Event::End(end))
}

/// How a rendered test case ended.
enum Status {
    Passed,
    /// `<failure type message>body</failure>`.
    Failure {
        kind: &'static str,
        message: Option<String>,
        body: String,
    },
    /// `<error type message>body</error>`.
    Error {
        kind: &'static str,
        message: Option<String>,
    },
    /// `<skipped message/>`.
    Skipped {
        message: Option<String>,
    },
}

struct Case {
    classname: String,
    name: String,
    time_s: Option<f64>,
    status: Status,
    system_out: Option<String>,
}

fn test_cases(report: &TestReport) -> impl Iterator<Item = Case> + '_ {
    report.cases.iter().map(|tc| {
        let (status, system_out) = match tc.outcome {
            TestOutcome::Passed => (Status::Passed, None),
            TestOutcome::Failed => (
                Status::Failure {
                    kind: "failure",
                    message: tc.message.clone(),
                    body: String::new(),
                },
                None,
            ),
            TestOutcome::Error => (
                Status::Error {
                    kind: "error",
                    message: tc.message.clone(),
                },
                None,
            ),
            TestOutcome::Skipped => (
                Status::Skipped {
                    message: tc.message.clone(),
                },
                None,
            ),
            TestOutcome::Flaky => (
                Status::Passed,
                Some(match &tc.message {
                    Some(m) => format!("flaky: {m}"),
                    None => "flaky: passed after failed attempts".to_string(),
                }),
            ),
        };
        // The task's own classname and name, so CI test views keep its grouping; a case
        // without a classname (TAP, go test, libtest) goes under `tests`.
        let (classname, name) = match tc
            .classname
            .as_deref()
            .and_then(|c| Some((c, tc.name.strip_prefix(c)?.strip_prefix('.')?)))
        {
            Some((c, n)) => (c.to_string(), n.to_string()),
            None => (CLASS_TESTS.to_string(), tc.name.clone()),
        };
        Case {
            classname,
            name,
            time_s: tc.time_s,
            status,
            system_out,
        }
    })
}

fn metric_case(m: &Metric, rules: &DecisionRules) -> Case {
    let band_text = format!(
        "the {:.1}% noise band",
        m.band.unwrap_or_else(|| rules.band_for(&m.name)) * 100.0
    );
    let direction = if rules.is_lower_better(&m.name) {
        "lower is better"
    } else {
        "higher is better"
    };
    let significance = match m.significant {
        Some(true) => "; significant",
        Some(false) => "; not significant",
        None => "",
    };
    let (status, system_out) = match rules.classify(m) {
        MetricClass::NoBaseline => (
            Status::Skipped {
                message: Some(format!(
                    "{} = {}: no baseline to compare against",
                    m.name,
                    num(m.patched)
                )),
            },
            None,
        ),
        MetricClass::Regressed => {
            let message = format!(
                "{} regressed: {}, beyond {band_text} ({direction}{significance})",
                m.name,
                movement(m)
            );
            if rules.is_informational(&m.name) {
                // As in the verdict: an informational metric never decides, it is a caveat.
                (Status::Passed, Some(format!("{message}; informational")))
            } else {
                (
                    Status::Failure {
                        kind: "regression",
                        body: message.clone(),
                        message: Some(message),
                    },
                    None,
                )
            }
        }
        MetricClass::Improved => (
            Status::Passed,
            Some(format!(
                "{} improved: {}, beyond {band_text} ({direction}{significance})",
                m.name,
                movement(m)
            )),
        ),
        MetricClass::Inconclusive => {
            // Why, as the verdict's summary says it.
            let message = format!(
                "{} inconclusive: {}, against {band_text}: {} ({direction})",
                m.name,
                movement(m),
                wording::inconclusive_reason(m, rules.band_for(&m.name))
            );
            if rules.is_informational(&m.name) {
                (Status::Passed, Some(format!("{message}; informational")))
            } else {
                (
                    Status::Failure {
                        kind: "inconclusive",
                        body: message.clone(),
                        message: Some(message),
                    },
                    None,
                )
            }
        }
        // "Unchanged" only for a metric shown equivalent, as in the verdict's summary.
        MetricClass::Noise if wording::shown_unchanged(m) => (
            Status::Passed,
            Some(format!(
                "{} unchanged: {}, within {band_text} ({direction})",
                m.name,
                movement(m)
            )),
        ),
        MetricClass::Noise => (
            Status::Passed,
            Some(format!(
                "{} within {band_text} ({}): {} ({direction})",
                m.name,
                wording::NOT_TESTED_FOR_EQUIVALENCE,
                movement(m)
            )),
        ),
    };
    Case {
        classname: CLASS_METRICS.to_string(),
        name: m.name.clone(),
        time_s: None,
        status,
        system_out,
    }
}

/// The text describing the whole verdict: kind, exit code, confidence, summary, caveats,
/// gate violations and a blown budget.
fn verdict_details(v: &Verdict) -> String {
    let mut s = format!(
        "{} (exit code {}), confidence {:.3}\n{}\n",
        v.verdict,
        v.verdict.exit_code(),
        v.confidence,
        v.evaluation_summary
    );
    if let Some(b) = &v.budget.exceeded {
        let _ = writeln!(s, "budget exceeded: {b}");
    }
    if let Some(g) = &v.patch_gate {
        for violation in &g.violations {
            let _ = writeln!(s, "gate: {violation}");
        }
    }
    for c in &v.caveats {
        let _ = writeln!(s, "caveat: {c}");
    }
    let _ = write!(s, "run {} · patch {}", v.run_id, v.patch_hash);
    s
}

fn verdict_case(v: &Verdict) -> Case {
    let details = verdict_details(v);
    let (status, system_out) = if v.verdict == VerdictKind::Approve {
        (Status::Passed, Some(details))
    } else {
        (
            Status::Failure {
                kind: v.verdict.as_str(),
                message: Some(v.evaluation_summary.clone()),
                body: details,
            },
            None,
        )
    };
    Case {
        classname: CLASS_VERDICT.to_string(),
        name: VERDICT_CASE.to_string(),
        time_s: Some(v.budget.used.wall_s),
        status,
        system_out,
    }
}

/// The `message` (when there is one) and `type` (when given) attributes, in that order.
fn message_and_type<'a>(
    message: &'a Option<String>,
    kind: Option<&'a str>,
) -> Vec<(&'static str, &'a str)> {
    let message = message.as_deref().map(|m| ("message", m));
    message
        .into_iter()
        .chain(kind.map(|k| ("type", k)))
        .collect()
}

/// One `<testcase>`: self-closing when it passed without output.
fn write_case<W: io::Write>(w: &mut Writer<W>, c: &Case) -> io::Result<()> {
    let time = c
        .time_s
        .filter(|t| t.is_finite() && *t >= 0.0)
        .map(|t| format!("{t:.3}"));
    let mut attrs = vec![
        ("classname", c.classname.as_str()),
        ("name", c.name.as_str()),
    ];
    attrs.extend(time.as_deref().map(|t| ("time", t)));
    let start = element("testcase", &attrs);
    if matches!(c.status, Status::Passed) && c.system_out.is_none() {
        return w.write_event(Event::Empty(start));
    }
    w.write_event(Event::Start(start))?;
    match &c.status {
        Status::Passed => {}
        Status::Failure {
            kind,
            message,
            body,
        } => {
            let failure = element("failure", &message_and_type(message, Some(kind)));
            if body.is_empty() {
                w.write_event(Event::Empty(failure))?;
            } else {
                text_element(w, failure, body)?;
            }
        }
        Status::Error { kind, message } => {
            let error = element("error", &message_and_type(message, Some(kind)));
            w.write_event(Event::Empty(error))?;
        }
        Status::Skipped { message } => {
            let skipped = element("skipped", &message_and_type(message, None));
            w.write_event(Event::Empty(skipped))?;
        }
    }
    if let Some(so) = &c.system_out {
        text_element(w, BytesStart::new("system-out"), so)?;
    }
    w.write_event(Event::End(BytesEnd::new("testcase")))
}

/// JUnit XML for CI systems (GitHub test reporters, GitLab `artifacts:reports:junit`).
///
/// `<testsuites>` holding one `<testsuite name="fork: <task>">` with:
/// * one `<testcase>` per case of `tests`, with the task's own `classname` and `name`
///   (`classname="tests"` and the whole name for formats without classnames):
///   `<failure>` for Failed, `<error>` for Error, `<skipped/>` for Skipped; Flaky passes,
///   with a `<system-out>` note of the failed attempts;
/// * one `<testcase classname="metrics">` per verdict metric: `<failure type="regression">`
///   when it moved in the bad direction beyond its noise band (direction from
///   `rules.is_lower_better`, the same rule as `decide`), the message giving
///   `baseline → patched (change %)`; `<failure type="inconclusive">` when the evidence
///   could not decide it, saying why as the summary does; `<skipped/>` when there is no
///   baseline; passed otherwise, with a `<system-out>` note ("unchanged" only for a metric
///   shown equivalent, as in the summary; else "within" its band, not tested);
/// * one `<testcase classname="fork" name="verdict">` that fails (type = the verdict) unless
///   the verdict is APPROVE, message = the evaluation summary, the body listing caveats,
///   gate violations and a blown budget.
///
/// Suite `<properties>` carry the verdict, confidence, exit code, run id and hashes.
pub fn junit(v: &Verdict, tests: Option<&TestReport>, rules: &DecisionRules) -> String {
    let mut cases: Vec<Case> = Vec::new();
    if let Some(t) = tests {
        cases.extend(test_cases(t));
    }
    cases.extend(v.metrics.iter().map(|m| metric_case(m, rules)));
    cases.push(verdict_case(v));

    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    // Invariant: the writer writes into a Vec, whose io::Write never fails.
    write_report(&mut w, v, &cases).expect("writing XML into memory cannot fail");
    let mut out = w.into_inner();
    out.push(b'\n');
    // Everything written is ASCII markup or came from `&str`s: the lossy path never runs.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// `<testsuites>` with its one `<testsuite>`: counts, properties and the cases.
fn write_report<W: io::Write>(w: &mut Writer<W>, v: &Verdict, cases: &[Case]) -> io::Result<()> {
    let count = |f: fn(&Status) -> bool| cases.iter().filter(|c| f(&c.status)).count().to_string();
    let total = cases.len().to_string();
    let failures = count(|s| matches!(s, Status::Failure { .. }));
    let errors = count(|s| matches!(s, Status::Error { .. }));
    let skipped = count(|s| matches!(s, Status::Skipped { .. }));
    let wall = if v.budget.used.wall_s.is_finite() && v.budget.used.wall_s >= 0.0 {
        format!("{:.3}", v.budget.used.wall_s)
    } else {
        "0.000".to_string()
    };
    let counts = [
        ("tests", total.as_str()),
        ("failures", &failures),
        ("errors", &errors),
        ("skipped", &skipped),
        ("time", &wall),
    ];

    w.write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)))?;
    let mut attrs = vec![("name", "fork")];
    attrs.extend(counts);
    w.write_event(Event::Start(element("testsuites", &attrs)))?;
    let suite_name = format!("fork: {}", v.task);
    let mut attrs = vec![("name", suite_name.as_str())];
    attrs.extend(counts);
    attrs.push(("timestamp", &v.header.timestamp));
    w.write_event(Event::Start(element("testsuite", &attrs)))?;
    w.write_event(Event::Start(BytesStart::new("properties")))?;
    for (name, value) in [
        ("verdict", v.verdict.as_str().to_string()),
        ("exit_code", v.verdict.exit_code().to_string()),
        ("confidence", format!("{:.3}", v.confidence)),
        ("run_id", v.run_id.clone()),
        ("task", v.task.clone()),
        ("patch_hash", v.patch_hash.clone()),
        ("task_hash", v.task_hash.clone()),
        ("source_hash", v.source_hash.clone()),
        ("state_hash", v.state_hash.clone()),
    ] {
        let property = element("property", &[("name", name), ("value", &value)]);
        w.write_event(Event::Empty(property))?;
    }
    w.write_event(Event::End(BytesEnd::new("properties")))?;
    for c in cases {
        write_case(w, c)?;
    }
    w.write_event(Event::End(BytesEnd::new("testsuite")))?;
    w.write_event(Event::End(BytesEnd::new("testsuites")))
}

#[cfg(test)]
#[path = "junit_wording_tests.rs"]
mod wording_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::EphemeralKey;
    use crate::task::results::parse_junit;
    use crate::verdict::report::tests::{case, fixture, metric};
    use crate::verdict::tests::sample_verdict;
    use crate::verdict::GateReport;
    use quick_xml::events::Event;

    /// The suite-level attribute `key` of the first `<testsuite>`.
    fn suite_attr(xml: &str, key: &str) -> String {
        let mut r = quick_xml::Reader::from_str(xml);
        loop {
            match r.read_event().unwrap() {
                Event::Start(e) if e.local_name().as_ref() == b"testsuite" => {
                    let a = e.try_get_attribute(key).unwrap().unwrap();
                    return a.unescape_value().unwrap().into_owned();
                }
                Event::Eof => panic!("no <testsuite>"),
                _ => {}
            }
        }
    }

    /// Every character of `xml` is one XML 1.0 allows (so expat and friends accept it).
    fn assert_xml_chars(xml: &str) {
        for (i, c) in xml.char_indices() {
            assert!(
                xml_char_ok(c),
                "character U+{:04X} at byte {i} is not allowed in XML 1.0",
                c as u32
            );
        }
    }

    fn outcome_of(report: &TestReport, name: &str) -> TestOutcome {
        report
            .cases
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no case {name} in {report:#?}"))
            .outcome
    }

    fn message_of(report: &TestReport, name: &str) -> String {
        report
            .cases
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.message.clone())
            .unwrap_or_default()
    }

    #[test]
    fn junit_parses_back_with_expected_counts() {
        let (v, report) = fixture();
        let rules = crate::verdict::decide::tests::rules();
        let xml = junit(&v, Some(&report), &rules);
        let parsed = parse_junit(xml.as_bytes()).unwrap();
        assert_eq!(parsed.cases.len(), 5 + 6 + 1);
        // tests: Passed, Failed, Error, Skipped; the flaky one counts as passed.
        assert_eq!(outcome_of(&parsed, "tests.mod.test_a"), TestOutcome::Passed);
        assert_eq!(outcome_of(&parsed, "tests.mod.test_b"), TestOutcome::Failed);
        assert_eq!(message_of(&parsed, "tests.mod.test_b"), "assert 1 == 2");
        assert_eq!(outcome_of(&parsed, "tests.mod.test_c"), TestOutcome::Error);
        assert_eq!(message_of(&parsed, "tests.mod.test_c"), "ZeroDivisionError");
        assert_eq!(
            outcome_of(&parsed, "tests.mod.test_d"),
            TestOutcome::Skipped
        );
        assert_eq!(outcome_of(&parsed, "tests.mod.test_e"), TestOutcome::Passed);
        assert!(xml.contains("<system-out>flaky: passed after 2 failed attempts</system-out>"));
        // metrics
        assert_eq!(outcome_of(&parsed, "metrics.p99_ms"), TestOutcome::Failed);
        let p99 = message_of(&parsed, "metrics.p99_ms");
        assert!(p99.contains("41 → 45.92 (+12.0%)"), "{p99}");
        assert!(p99.contains("1.0% noise band"), "{p99}");
        assert_eq!(
            outcome_of(&parsed, "metrics.throughput"),
            TestOutcome::Passed
        );
        assert_eq!(
            outcome_of(&parsed, "metrics.compressed_bytes"),
            TestOutcome::Passed
        );
        assert_eq!(outcome_of(&parsed, "metrics.ratio"), TestOutcome::Skipped);
        assert_eq!(outcome_of(&parsed, "metrics.errors"), TestOutcome::Failed);
        assert!(message_of(&parsed, "metrics.errors").contains("0 → 3 (n/a)"));
        assert_eq!(outcome_of(&parsed, "metrics.score"), TestOutcome::Failed);
        assert!(message_of(&parsed, "metrics.score").contains("-20.0%"));
        // the verdict
        assert_eq!(outcome_of(&parsed, "fork.verdict"), TestOutcome::Failed);
        assert_eq!(message_of(&parsed, "fork.verdict"), v.evaluation_summary);

        // The project's counts and the suite's attributes agree.
        assert_eq!(parsed.failed(), 1 + 1 + 3 + 1);
        assert_eq!(parsed.skipped(), 2);
        assert_eq!(parsed.passed(), 2 + 2);
        assert_eq!(suite_attr(&xml, "tests"), "12");
        assert_eq!(suite_attr(&xml, "failures"), "5");
        assert_eq!(suite_attr(&xml, "errors"), "1");
        assert_eq!(suite_attr(&xml, "skipped"), "2");
        assert_eq!(suite_attr(&xml, "name"), "fork: tests");
        // Deterministic.
        assert_eq!(xml, junit(&v, Some(&report), &rules));
    }

    #[test]
    fn junit_follows_the_rules_direction_and_band() {
        let (v, _) = fixture();
        // p99_ms higher-is-better under these rules, and a 15% band swallows its +12%.
        let rules = DecisionRules {
            noise_band: 0.15,
            lower_is_better: vec!["errors".into()],
            ..crate::verdict::decide::tests::rules()
        };
        let parsed = parse_junit(junit(&v, None, &rules).as_bytes()).unwrap();
        assert_eq!(parsed.cases.len(), 6 + 1);
        assert_eq!(outcome_of(&parsed, "metrics.p99_ms"), TestOutcome::Passed);
        assert_eq!(outcome_of(&parsed, "metrics.score"), TestOutcome::Failed);
        assert_eq!(outcome_of(&parsed, "metrics.errors"), TestOutcome::Failed);
        // Lower is better is not the default for `score` any more: up would be fine.
        let mut v2 = v.clone();
        v2.metrics = vec![metric("score", Some(10.0), 12.0)];
        let parsed = parse_junit(junit(&v2, None, &rules).as_bytes()).unwrap();
        assert_eq!(outcome_of(&parsed, "metrics.score"), TestOutcome::Passed);
    }

    #[test]
    fn an_informational_regression_passes_as_in_the_verdict() {
        let (v, _) = fixture();
        let rules = crate::verdict::decide::tests::rules();
        let parsed = parse_junit(junit(&v, None, &rules).as_bytes()).unwrap();
        assert_eq!(outcome_of(&parsed, "metrics.errors"), TestOutcome::Failed);
        // The verdict makes an informational metric's regression a caveat: so does JUnit.
        let rules = DecisionRules {
            informational: vec!["errors".into()],
            ..rules
        };
        let parsed = parse_junit(junit(&v, None, &rules).as_bytes()).unwrap();
        assert_eq!(outcome_of(&parsed, "metrics.errors"), TestOutcome::Passed);
    }

    #[test]
    fn approve_passes_and_reject_lists_gate_violations() {
        let k = EphemeralKey::generate();
        let v = sample_verdict(&k.public());
        let rules = crate::verdict::decide::tests::rules();
        let xml = junit(&v, None, &rules);
        let parsed = parse_junit(xml.as_bytes()).unwrap();
        assert_eq!(outcome_of(&parsed, "fork.verdict"), TestOutcome::Passed);
        assert_eq!(outcome_of(&parsed, "metrics.p99_ms"), TestOutcome::Passed);
        assert_eq!(parsed.failed(), 0);
        assert_eq!(suite_attr(&xml, "failures"), "0");

        let mut r = sample_verdict(&k.public());
        r.verdict = VerdictKind::Reject;
        r.metrics.clear();
        r.evaluation_summary = "Patch touches protected path tests/test_x.py.".into();
        r.patch_gate = Some(GateReport {
            passed: false,
            violations: vec!["protected: tests/test_x.py".into()],
        });
        let xml = junit(&r, None, &rules);
        let parsed = parse_junit(xml.as_bytes()).unwrap();
        assert_eq!(parsed.cases.len(), 1);
        assert_eq!(outcome_of(&parsed, "fork.verdict"), TestOutcome::Failed);
        assert_eq!(message_of(&parsed, "fork.verdict"), r.evaluation_summary);
        assert!(xml.contains("gate: protected: tests/test_x.py"), "{xml}");
        assert!(xml.contains("type=\"REJECT\""), "{xml}");
    }

    #[test]
    fn hostile_names_stay_well_formed() {
        let (mut v, _) = fixture();
        let hostile = [
            "a<b>&c\"d'e",
            "x]]>y<![CDATA[z",
            "ctl\u{1}\u{8}\u{1b}[31mred\u{7f}\u{9b}",
            "nonchar\u{FFFE}\u{FFFF}",
            "tab\tnl\ncr\r",
            "</testcase></testsuite><testsuite name=\"pwn\">",
        ];
        let report = TestReport {
            cases: hostile
                .iter()
                .map(|n| case(n, TestOutcome::Failed, Some(n)))
                .collect(),
        };
        v.task = "t<&>\"'\u{0}".into();
        v.evaluation_summary = "summary ]]> <x> & \u{2}".into();
        v.caveats = hostile.iter().map(|s| s.to_string()).collect();
        v.metrics = hostile.iter().map(|n| metric(n, Some(1.0), 2.0)).collect();
        let rules = DecisionRules {
            lower_is_better: vec!["*".into()],
            ..crate::verdict::decide::tests::rules()
        };
        let xml = junit(&v, Some(&report), &rules);
        assert_xml_chars(&xml);
        assert!(!xml.contains("]]>"), "{xml}");
        // quick-xml reads it through, events balanced, one suite.
        let mut r = quick_xml::Reader::from_str(&xml);
        r.config_mut().check_end_names = true;
        let (mut depth, mut suites) = (0i32, 0);
        loop {
            match r.read_event().unwrap() {
                Event::Start(e) => {
                    depth += 1;
                    suites += i32::from(e.local_name().as_ref() == b"testsuite");
                }
                Event::End(_) => depth -= 1,
                Event::Text(t) => {
                    t.unescape().unwrap();
                }
                Event::Eof => break,
                _ => {}
            }
        }
        assert_eq!((depth, suites), (0, 1));
        // The project's parser gets every name and message back.
        let parsed = parse_junit(xml.as_bytes()).unwrap();
        assert_eq!(parsed.cases.len(), 2 * hostile.len() + 1);
        assert_eq!(parsed.failed(), 2 * hostile.len() + 1);
        let names: Vec<&str> = parsed.cases.iter().map(|c| c.name.as_str()).collect();
        assert!(names.contains(&"tests.a<b>&c\"d'e"), "{names:?}");
        assert!(names.contains(&"metrics.x]]>y<![CDATA[z"), "{names:?}");
        assert!(
            names.contains(&"tests.</testcase></testsuite><testsuite name=\"pwn\">"),
            "{names:?}"
        );
        assert_eq!(message_of(&parsed, "tests.a<b>&c\"d'e"), "a<b>&c\"d'e");
        assert_eq!(
            suite_attr(&xml, "name"),
            "fork: t<&>\"'\u{FFFD}",
            "the task name round-trips, NUL replaced"
        );
        // Line breaks and tabs in attributes survive as references.
        assert!(xml.contains("tab&#9;nl&#10;cr&#13;"), "{xml}");
    }

    /// Independent check with Python's expat, which enforces XML 1.0's character rules.
    #[test]
    fn hostile_junit_passes_expat() {
        let (mut v, _) = fixture();
        v.evaluation_summary = "\u{1}\u{1f}\u{FFFE} ]]> &amp; <".into();
        let report = TestReport {
            cases: vec![case(
                "n\u{0}\u{b}\u{c}x",
                TestOutcome::Error,
                Some("\u{1b}[2J"),
            )],
        };
        let xml = junit(&v, Some(&report), &crate::verdict::decide::tests::rules());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.xml");
        std::fs::write(&path, &xml).unwrap();
        let script = "import sys, xml.etree.ElementTree as E\n\
                      r = E.parse(sys.argv[1]).getroot()\n\
                      print(len(r.findall('.//testcase')))";
        match std::process::Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(&path)
            .output()
        {
            Ok(out) => {
                assert!(
                    out.status.success(),
                    "expat refused the report: {}\n{xml}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let n = 1 + v.metrics.len() + 1;
                assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), n.to_string());
            }
            Err(e) => eprintln!("python3 not available ({e}); checked characters only"),
        }
        assert_xml_chars(&xml);
    }
}
