//! CI outputs of an evaluation: a JUnit XML report (`--junit FILE`) and a markdown summary
//! (`--summary FILE`, also appended to `$GITHUB_STEP_SUMMARY` when that is set).
//!
//! Both are pure renderings of the verdict (plus, for JUnit, the parsed test report and the
//! decision rules that say which way a metric is better), deterministic for the same input.
//!
//! Everything rendered may come from code under evaluation (test names, messages, metric
//! names, the summary quoting them), so both writers escape every string:
//! * JUnit: the five XML specials, line breaks and tabs inside attributes as character
//!   references, and every character XML 1.0 cannot carry (C0 controls but tab/LF/CR,
//!   U+FFFE, U+FFFF) as well as C1 controls replaced with U+FFFD. `]]>` cannot occur in text
//!   because every `>` is written `&gt;`.
//! * Markdown: every character markdown, GitHub's extensions (math `$`, emoji `:name:`,
//!   mentions `@`) or HTML could interpret is backslash-escaped, line breaks become spaces
//!   (`<br>` inside table cells), so no string can open a heading, a link, a table cell or
//!   an HTML tag.

use crate::task::results::{TestOutcome, TestReport};
use crate::verdict::decide::DecisionRules;
use crate::verdict::kind::VerdictKind;
use crate::verdict::{Metric, Verdict};
use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::path::Path;

/// The environment variable GitHub Actions points at the job's step summary file.
pub const STEP_SUMMARY_ENV: &str = "GITHUB_STEP_SUMMARY";
/// The JUnit classname of test-case entries.
pub const CLASS_TESTS: &str = "tests";
/// The JUnit classname of metric-check entries.
pub const CLASS_METRICS: &str = "metrics";
/// The JUnit classname of the overall verdict entry.
pub const CLASS_VERDICT: &str = "fork";
/// The JUnit name of the overall verdict entry.
pub const VERDICT_CASE: &str = "verdict";

/// Caveats longer than this (characters) are cut with `…` in the markdown summary.
const MAX_CAVEAT_CHARS: usize = 300;
/// Most caveats listed in the markdown summary.
const MAX_CAVEATS: usize = 50;
/// Most metric rows in the markdown summary.
const MAX_METRIC_ROWS: usize = 100;
/// Most gate violations listed in the markdown summary.
const MAX_VIOLATIONS: usize = 50;
/// Longest isolation line in the markdown summary (characters).
const MAX_ISOLATION_CHARS: usize = 1000;

// ---------------------------------------------------------------------------------------
// Metric checks.
// ---------------------------------------------------------------------------------------

/// How a metric compares with its baseline, by the same rule as `decide`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// No baseline: nothing to compare.
    NoBaseline,
    /// Within the noise band.
    Noise,
    /// Beyond the band, in the good direction.
    Improved,
    /// Beyond the band, in the bad direction.
    Regressed,
}

fn band(rules: &DecisionRules) -> f64 {
    if rules.noise_band.is_finite() && rules.noise_band >= 0.0 {
        rules.noise_band
    } else {
        DecisionRules::DEFAULT_NOISE_BAND
    }
}

/// A metric regressed when it moved in the bad direction (up for lower-is-better names, down
/// otherwise) by more than the noise band; with no relative change (baseline 0), any move is
/// beyond the band.
fn classify(m: &Metric, rules: &DecisionRules) -> Check {
    let Some(b) = m.baseline else {
        return Check::NoBaseline;
    };
    let worse = if rules.is_lower_better(&m.name) {
        m.patched > b
    } else {
        m.patched < b
    };
    // With repeated samples the verdict judged significance; follow it, as `decide` does.
    let beyond = match (m.significant, m.change) {
        (Some(significant), _) => significant,
        (None, Some(c)) => c.abs() > band(rules),
        (None, None) => m.patched != b,
    };
    match (beyond, worse) {
        (false, _) => Check::Noise,
        (true, true) => Check::Regressed,
        (true, false) => Check::Improved,
    }
}

/// A number written plainly: integers without decimals, others with up to 4 decimals.
fn num(x: f64) -> String {
    if !x.is_finite() {
        return x.to_string();
    }
    if x == 0.0 {
        return "0".to_string();
    }
    if x.fract() == 0.0 && x.abs() < 1e15 {
        return format!("{x:.0}");
    }
    let s = format!("{x:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "0" || s == "-0" {
        format!("{x:e}")
    } else {
        s.to_string()
    }
}

/// A relative change as a signed percentage, `+12.0%` / `-18.0%`, or `n/a`.
fn change_pct(change: Option<f64>) -> String {
    match change {
        Some(c) if c.is_finite() => {
            let p = c * 100.0;
            if p.abs() < 0.05 {
                "0.0%".to_string()
            } else {
                format!("{p:+.1}%")
            }
        }
        Some(c) => c.to_string(),
        None => "n/a".to_string(),
    }
}

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

/// Escape `s` as XML character data.
fn esc_text(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            // Always escaped, so `]]>` can never appear in text.
            '>' => out.push_str("&gt;"),
            // A raw CR would be normalized away by the reader.
            '\r' => out.push_str("&#13;"),
            c if xml_char_ok(c) => out.push(c),
            _ => out.push('\u{FFFD}'),
        }
    }
}

/// Escape `s` as a double-quoted XML attribute value (whitespace kept through references,
/// since readers normalize raw tabs and line breaks in attributes to spaces).
fn esc_attr(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' => out.push_str("&#9;"),
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            c if xml_char_ok(c) => out.push(c),
            _ => out.push('\u{FFFD}'),
        }
    }
}

fn attr(out: &mut String, name: &str, value: &str) {
    out.push(' ');
    out.push_str(name);
    out.push_str("=\"");
    esc_attr(out, value);
    out.push('"');
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
    classname: &'static str,
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
        Case {
            classname: CLASS_TESTS,
            name: tc.name.clone(),
            time_s: tc.time_s,
            status,
            system_out,
        }
    })
}

fn metric_case(m: &Metric, rules: &DecisionRules) -> Case {
    let band_text = format!("the {:.1}% noise band", band(rules) * 100.0);
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
    let (status, system_out) = match classify(m, rules) {
        Check::NoBaseline => (
            Status::Skipped {
                message: Some(format!(
                    "{} = {}: no baseline to compare against",
                    m.name,
                    num(m.patched)
                )),
            },
            None,
        ),
        Check::Regressed => {
            let message = format!(
                "{} regressed: {}, beyond {band_text} ({direction}{significance})",
                m.name,
                movement(m)
            );
            (
                Status::Failure {
                    kind: "regression",
                    body: message.clone(),
                    message: Some(message),
                },
                None,
            )
        }
        Check::Improved => (
            Status::Passed,
            Some(format!(
                "{} improved: {}, beyond {band_text} ({direction}{significance})",
                m.name,
                movement(m)
            )),
        ),
        Check::Noise => (
            Status::Passed,
            Some(format!(
                "{} unchanged: {}, within {band_text} ({direction})",
                m.name,
                movement(m)
            )),
        ),
    };
    Case {
        classname: CLASS_METRICS,
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
        classname: CLASS_VERDICT,
        name: VERDICT_CASE.to_string(),
        time_s: Some(v.budget.used.wall_s),
        status,
        system_out,
    }
}

fn write_case(out: &mut String, c: &Case) {
    out.push_str("    <testcase");
    attr(out, "classname", c.classname);
    attr(out, "name", &c.name);
    if let Some(t) = c.time_s.filter(|t| t.is_finite() && *t >= 0.0) {
        attr(out, "time", &format!("{t:.3}"));
    }
    if matches!(c.status, Status::Passed) && c.system_out.is_none() {
        out.push_str("/>\n");
        return;
    }
    out.push_str(">\n");
    match &c.status {
        Status::Passed => {}
        Status::Failure {
            kind,
            message,
            body,
        } => {
            out.push_str("      <failure");
            if let Some(m) = message {
                attr(out, "message", m);
            }
            attr(out, "type", kind);
            if body.is_empty() {
                out.push_str("/>\n");
            } else {
                out.push('>');
                esc_text(out, body);
                out.push_str("</failure>\n");
            }
        }
        Status::Error { kind, message } => {
            out.push_str("      <error");
            if let Some(m) = message {
                attr(out, "message", m);
            }
            attr(out, "type", kind);
            out.push_str("/>\n");
        }
        Status::Skipped { message } => {
            out.push_str("      <skipped");
            if let Some(m) = message {
                attr(out, "message", m);
            }
            out.push_str("/>\n");
        }
    }
    if let Some(so) = &c.system_out {
        out.push_str("      <system-out>");
        esc_text(out, so);
        out.push_str("</system-out>\n");
    }
    out.push_str("    </testcase>\n");
}

/// JUnit XML for CI systems (GitHub test reporters, GitLab `artifacts:reports:junit`).
///
/// `<testsuites>` holding one `<testsuite name="fork: <task>">` with:
/// * one `<testcase classname="tests">` per case of `tests` (its name as parsed):
///   `<failure>` for Failed, `<error>` for Error, `<skipped/>` for Skipped; Flaky passes,
///   with a `<system-out>` note of the failed attempts;
/// * one `<testcase classname="metrics">` per verdict metric: `<failure type="regression">`
///   when it moved in the bad direction beyond `rules.noise_band` (direction from
///   `rules.is_lower_better`, the same rule as `decide`), the message giving
///   `baseline → patched (change %)`; `<skipped/>` when there is no baseline; passed
///   otherwise, with a `<system-out>` note;
/// * one `<testcase classname="fork" name="verdict">` that fails (type = the verdict) unless
///   the verdict is APPROVE, message = the evaluation summary, the body listing caveats,
///   gate violations and a blown budget.
///
/// Suite `<properties>` carry the verdict, confidence, exit code, run id and hashes.
/// Deterministic; every string escaped (see the module documentation).
pub fn junit(v: &Verdict, tests: Option<&TestReport>, rules: &DecisionRules) -> String {
    let mut cases: Vec<Case> = Vec::new();
    if let Some(t) = tests {
        cases.extend(test_cases(t));
    }
    cases.extend(v.metrics.iter().map(|m| metric_case(m, rules)));
    cases.push(verdict_case(v));

    let failures = cases
        .iter()
        .filter(|c| matches!(c.status, Status::Failure { .. }))
        .count();
    let errors = cases
        .iter()
        .filter(|c| matches!(c.status, Status::Error { .. }))
        .count();
    let skipped = cases
        .iter()
        .filter(|c| matches!(c.status, Status::Skipped { .. }))
        .count();
    let total = cases.len().to_string();
    let (failures, errors, skipped) = (
        failures.to_string(),
        errors.to_string(),
        skipped.to_string(),
    );
    let wall = if v.budget.used.wall_s.is_finite() && v.budget.used.wall_s >= 0.0 {
        format!("{:.3}", v.budget.used.wall_s)
    } else {
        "0.000".to_string()
    };

    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites");
    attr(&mut out, "name", "fork");
    attr(&mut out, "tests", &total);
    attr(&mut out, "failures", &failures);
    attr(&mut out, "errors", &errors);
    attr(&mut out, "skipped", &skipped);
    attr(&mut out, "time", &wall);
    out.push_str(">\n  <testsuite");
    attr(&mut out, "name", &format!("fork: {}", v.task));
    attr(&mut out, "tests", &total);
    attr(&mut out, "failures", &failures);
    attr(&mut out, "errors", &errors);
    attr(&mut out, "skipped", &skipped);
    attr(&mut out, "time", &wall);
    attr(&mut out, "timestamp", &v.header.timestamp);
    out.push_str(">\n    <properties>\n");
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
        out.push_str("      <property");
        attr(&mut out, "name", name);
        attr(&mut out, "value", &value);
        out.push_str("/>\n");
    }
    out.push_str("    </properties>\n");
    for c in &cases {
        write_case(&mut out, c);
    }
    out.push_str("  </testsuite>\n</testsuites>\n");
    out
}

// ---------------------------------------------------------------------------------------
// Markdown.
// ---------------------------------------------------------------------------------------

/// Characters backslash-escaped in markdown text: CommonMark's inline syntax, HTML, tables,
/// GitHub's math (`$`), emoji shortcodes (`:`) and mentions (`@`).
const MD_SPECIAL: &[char] = &[
    '\\', '`', '*', '_', '[', ']', '<', '>', '|', '~', '&', '#', '$', ':', '@', '!',
];

/// `s` as one line of inert markdown text; line breaks become `newline`.
fn md_escape(s: &str, newline: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    let mut chars = s.chars().peekable();
    // A leading `-`, `+`, `=` or `1.`/`1)` would start a list or an underline.
    let lead_digits: usize = s.chars().take_while(|c| c.is_ascii_digit()).count();
    let mut index = 0usize;
    while let Some(c) = chars.next() {
        match c {
            '\r' => {
                if chars.peek() == Some(&'\n') {
                    chars.next();
                }
                out.push_str(newline);
            }
            '\n' => out.push_str(newline),
            '\t' => out.push(' '),
            c if MD_SPECIAL.contains(&c) => {
                out.push('\\');
                out.push(c);
            }
            '-' | '+' | '=' if index == 0 => {
                out.push('\\');
                out.push(c);
            }
            '.' | ')' if index == lead_digits && lead_digits > 0 => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push('\u{FFFD}'),
            c => out.push(c),
        }
        index += 1;
    }
    out
}

/// Inert inline text (line breaks become spaces).
fn md_text(s: &str) -> String {
    md_escape(s, " ")
}

/// Inert table-cell text (line breaks become `<br>`, `|` escaped).
fn md_cell(s: &str) -> String {
    md_escape(s, "<br>")
}

/// A code span when `s` can be one safely (no backtick, pipe or control character), inert
/// text otherwise.
fn md_code(s: &str) -> String {
    let plain = !s.is_empty()
        && s.trim() == s
        && !s.chars().any(|c| c == '`' || c == '|' || c.is_control());
    if plain {
        format!("`{s}`")
    } else {
        md_text(s)
    }
}

/// At most `max` characters of `s`, with `…` when cut.
fn truncate(s: &str, max: usize) -> String {
    let mut out: String = s.chars().take(max).collect();
    if s.chars().nth(max).is_some() {
        out.push('…');
    }
    out
}

/// Bytes in binary units: `4.0 KiB`, `117.7 MiB`; plain `B` under 1 KiB.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

fn seconds(s: f64) -> String {
    format!("{} s", num(s))
}

fn or_unlimited<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map(f).unwrap_or_else(|| "unlimited".to_string())
}

/// The isolation object as `key=value · key=value` (keys in order, values compact JSON
/// unless they are strings).
fn isolation_line(iso: &serde_json::Value) -> String {
    let text = match iso.as_object() {
        Some(map) if map.is_empty() => "none recorded".to_string(),
        Some(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            keys.iter()
                .map(|k| {
                    let value = match &map[k.as_str()] {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    format!("{k}={value}")
                })
                .collect::<Vec<_>>()
                .join(" · ")
        }
        None => iso.to_string(),
    };
    md_text(&truncate(&text, MAX_ISOLATION_CHARS))
}

/// A short markdown summary for a CI job page (GitHub's step summary, a merge-request note):
/// a heading with the verdict, a badge-like line (verdict, exit code, confidence, task),
/// the evaluation summary, a table of metrics (baseline, patched, change, significant),
/// the test counts, the caveats (each cut at 300 characters, at most 50), gate violations,
/// a budget table (used against limits), the isolation in one line, and the patch hash,
/// run id and `bundle_dir`. Every string from the verdict is escaped (see the module
/// documentation); deterministic.
pub fn markdown(v: &Verdict, bundle_dir: &Path) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## fork verdict: {}\n", v.verdict);
    let _ = writeln!(
        s,
        "**{}** · exit code {} · confidence {:.2} · task {}\n",
        v.verdict,
        v.verdict.exit_code(),
        v.confidence,
        md_code(&v.task)
    );
    let _ = writeln!(s, "{}\n", md_text(&v.evaluation_summary));

    // Metrics.
    s.push_str("### Metrics\n\n");
    if v.metrics.is_empty() {
        s.push_str("No metrics reported.\n\n");
    } else {
        s.push_str("| metric | baseline | patched | change | significant |\n");
        s.push_str("|:--|--:|--:|--:|:--|\n");
        for m in v.metrics.iter().take(MAX_METRIC_ROWS) {
            let significant = match m.significant {
                Some(true) => "yes",
                Some(false) => "no",
                None => "n/a",
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                md_cell(&m.name),
                m.baseline.map(num).unwrap_or_else(|| "n/a".to_string()),
                num(m.patched),
                change_pct(m.change),
                significant
            );
        }
        if v.metrics.len() > MAX_METRIC_ROWS {
            let _ = writeln!(
                s,
                "\n{} more metrics in verdict.json.",
                v.metrics.len() - MAX_METRIC_ROWS
            );
        }
        s.push('\n');
    }

    // Tests.
    s.push_str("### Tests\n\n");
    let t = &v.tests;
    if t.passed + t.failed + t.flaky + t.skipped == 0 {
        s.push_str("No test results.\n\n");
    } else {
        let _ = writeln!(
            s,
            "{} passed · {} failed · {} flaky · {} skipped\n",
            t.passed, t.failed, t.flaky, t.skipped
        );
    }

    // Caveats.
    if !v.caveats.is_empty() {
        s.push_str("### Caveats\n\n");
        for c in v.caveats.iter().take(MAX_CAVEATS) {
            let _ = writeln!(s, "- {}", md_text(&truncate(c, MAX_CAVEAT_CHARS)));
        }
        if v.caveats.len() > MAX_CAVEATS {
            let _ = writeln!(
                s,
                "- {} more caveats in verdict.json",
                v.caveats.len() - MAX_CAVEATS
            );
        }
        s.push('\n');
    }

    // Gate violations.
    if let Some(g) = v.patch_gate.as_ref().filter(|g| !g.violations.is_empty()) {
        s.push_str("### Patch gate\n\n");
        for violation in g.violations.iter().take(MAX_VIOLATIONS) {
            let _ = writeln!(s, "- {}", md_text(&truncate(violation, MAX_CAVEAT_CHARS)));
        }
        if g.violations.len() > MAX_VIOLATIONS {
            let _ = writeln!(
                s,
                "- {} more violations in verdict.json",
                g.violations.len() - MAX_VIOLATIONS
            );
        }
        s.push('\n');
    }

    // Budget.
    let l = &v.budget.limits;
    let u = &v.budget.used;
    s.push_str("### Budget\n\n| resource | used | limit |\n|:--|--:|--:|\n");
    for (resource, used, limit) in [
        (
            "wall time",
            seconds(u.wall_s),
            or_unlimited(l.wall_s, seconds),
        ),
        (
            "CPU",
            seconds(u.cpu_s),
            or_unlimited(l.cpu_percent, |p| format!("{p}% of one core")),
        ),
        (
            "memory (peak)",
            bytes(u.memory_peak_bytes),
            or_unlimited(l.memory_bytes, bytes),
        ),
        (
            "disk",
            bytes(u.disk_bytes),
            or_unlimited(l.disk_bytes, bytes),
        ),
        (
            "processes (peak)",
            u.pids_peak.to_string(),
            or_unlimited(l.pids, |p| p.to_string()),
        ),
        (
            "API cost",
            format!("{:.2} USD", u.api_cost_usd),
            or_unlimited(l.api_cost_usd, |c| format!("{c:.2} USD")),
        ),
    ] {
        let _ = writeln!(s, "| {resource} | {used} | {limit} |");
    }
    if let Some(b) = &v.budget.exceeded {
        let _ = writeln!(s, "\nBudget exceeded: **{}**", md_text(b));
    }
    s.push('\n');

    let _ = writeln!(s, "**Isolation:** {}\n", isolation_line(&v.isolation));
    let _ = writeln!(
        s,
        "**Patch** {} · **run** {} · **bundle** {}",
        md_code(&v.patch_hash),
        md_code(&v.run_id),
        md_code(&bundle_dir.display().to_string())
    );
    s
}

// ---------------------------------------------------------------------------------------
// Writing.
// ---------------------------------------------------------------------------------------

fn named(path: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} `{}`: {e}", path.display()))
}

/// Whether `a` and `b` name the same file (same device and inode, or the same path when
/// either does not exist yet).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => a == b,
    }
}

/// Append `text` to `path` (created if missing, never truncated), separated from earlier
/// content by a line break.
fn append(path: &Path, text: &str) -> io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| named(path, "opening the step summary", e))?;
    let existing = f
        .metadata()
        .map_err(|e| named(path, "reading the step summary's size", e))?
        .len();
    let mut buf = String::with_capacity(text.len() + 1);
    if existing > 0 {
        buf.push('\n');
    }
    buf.push_str(text);
    f.write_all(buf.as_bytes())
        .map_err(|e| named(path, "appending to the step summary", e))
}

/// [`write_ci_outputs`] with the step summary file given explicitly (`None`: no step
/// summary) instead of read from the environment.
fn write_ci_outputs_to(
    v: &Verdict,
    tests: Option<&TestReport>,
    rules: &DecisionRules,
    bundle_dir: &Path,
    junit_path: Option<&Path>,
    summary_path: Option<&Path>,
    step_summary: Option<&Path>,
) -> io::Result<()> {
    if let Some(p) = junit_path {
        std::fs::write(p, junit(v, tests, rules))
            .map_err(|e| named(p, "writing the JUnit report", e))?;
    }
    let step_summary = step_summary.filter(|p| !p.as_os_str().is_empty());
    if summary_path.is_none() && step_summary.is_none() {
        return Ok(());
    }
    let md = markdown(v, bundle_dir);
    if let Some(p) = summary_path {
        // `--summary "$GITHUB_STEP_SUMMARY"`: append once below, never truncate it.
        if !step_summary.is_some_and(|s| same_file(p, s)) {
            std::fs::write(p, &md).map_err(|e| named(p, "writing the summary", e))?;
        }
    }
    if let Some(s) = step_summary {
        append(s, &md)?;
    }
    Ok(())
}

/// Writes the JUnit report to `junit_path` and the markdown summary to `summary_path`
/// (each replaced, when given), and when `$GITHUB_STEP_SUMMARY` names a file, appends the
/// markdown there too (created if missing, never truncated; written once when
/// `summary_path` is that same file). Errors name the file.
pub fn write_ci_outputs(
    v: &Verdict,
    tests: Option<&TestReport>,
    rules: &DecisionRules,
    bundle_dir: &Path,
    junit_path: Option<&Path>,
    summary_path: Option<&Path>,
) -> io::Result<()> {
    let step = std::env::var_os(STEP_SUMMARY_ENV).map(std::path::PathBuf::from);
    write_ci_outputs_to(
        v,
        tests,
        rules,
        bundle_dir,
        junit_path,
        summary_path,
        step.as_deref(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::EphemeralKey;
    use crate::task::results::{parse_junit, TestCase};
    use crate::verdict::tests::sample_verdict;
    use crate::verdict::GateReport;
    use quick_xml::events::Event;

    fn case(name: &str, outcome: TestOutcome, message: Option<&str>) -> TestCase {
        TestCase {
            name: name.to_string(),
            outcome,
            time_s: Some(0.25),
            message: message.map(str::to_string),
        }
    }

    fn metric(name: &str, baseline: Option<f64>, patched: f64) -> Metric {
        Metric {
            ci_low: None,
            ci_high: None,
            p_value: None,
            samples: None,
            name: name.to_string(),
            baseline,
            patched,
            change: baseline.and_then(|b| (b != 0.0).then(|| (patched - b) / b.abs())),
            significant: None,
        }
    }

    /// A NEEDS_REVISION verdict with metrics of every kind, and a report of every outcome.
    fn fixture() -> (Verdict, TestReport) {
        let k = EphemeralKey::generate();
        let mut v = sample_verdict(&k.public());
        v.verdict = VerdictKind::NeedsRevision;
        v.evaluation_summary = "1 of 5 tests failed (mod.test_b). p99_ms regressed 12.0%.".into();
        v.tests = crate::verdict::TestCounts {
            passed: 1,
            failed: 2,
            flaky: 1,
            skipped: 1,
        };
        v.metrics = vec![
            metric("p99_ms", Some(41.0), 45.92), // lower is better, up 12%: regressed
            metric("throughput", Some(100.0), 120.0), // higher is better, up: improved
            metric("compressed_bytes", Some(1000.0), 1005.0), // +0.5%: noise
            metric("ratio", None, 2.5),          // no baseline: skipped
            metric("errors", Some(0.0), 3.0),    // 0 → 3, lower is better: regressed
            metric("score", Some(10.0), 8.0),    // higher is better, down 20%: regressed
        ];
        let report = TestReport {
            cases: vec![
                case("mod.test_a", TestOutcome::Passed, None),
                case("mod.test_b", TestOutcome::Failed, Some("assert 1 == 2")),
                case("mod.test_c", TestOutcome::Error, Some("ZeroDivisionError")),
                case("mod.test_d", TestOutcome::Skipped, Some("needs GPU")),
                case(
                    "mod.test_e",
                    TestOutcome::Flaky,
                    Some("passed after 2 failed attempts"),
                ),
            ],
        };
        (v, report)
    }

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
        let rules = DecisionRules::default();
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
            ..DecisionRules::default()
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
    fn approve_passes_and_reject_lists_gate_violations() {
        let k = EphemeralKey::generate();
        let v = sample_verdict(&k.public());
        let rules = DecisionRules::default();
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
            ..DecisionRules::default()
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
        let xml = junit(&v, Some(&report), &DecisionRules::default());
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

    #[test]
    fn markdown_has_tables_and_escapes() {
        let (mut v, _) = fixture();
        v.metrics.push(metric("a|b\nc", Some(2.0), 2.0));
        v.caveats = vec![
            "short <b>bold</b> | pipe $x$ :rocket: @someone".into(),
            "y".repeat(1000),
        ];
        v.budget.exceeded = Some("memory".into());
        let md = markdown(&v, Path::new("fork-out/run-20250131-abcdef"));
        assert!(md.starts_with("## fork verdict: NEEDS_REVISION\n"), "{md}");
        assert!(md.contains("**NEEDS_REVISION** · exit code 2 · confidence 0.94 · task `tests`"));
        assert!(md.contains("| metric | baseline | patched | change | significant |"));
        assert!(
            md.contains("| p99\\_ms | 41 | 45.92 | +12.0% | n/a |"),
            "{md}"
        );
        assert!(md.contains("| ratio | n/a | 2.5 | n/a | n/a |"), "{md}");
        assert!(md.contains("| a\\|b<br>c | 2 | 2 | 0.0% | n/a |"), "{md}");
        // Every table row has exactly its 6 unescaped pipes.
        for line in md
            .lines()
            .filter(|l| l.starts_with("| ") && l.contains("\\|"))
        {
            let unescaped = line.matches('|').count() - line.matches("\\|").count();
            assert_eq!(unescaped, 6, "{line}");
        }
        assert!(
            md.contains("- short \\<b\\>bold\\</b\\> \\| pipe \\$x\\$ \\:rocket\\: \\@someone\n")
        );
        let long = md.lines().find(|l| l.starts_with("- yyy")).unwrap();
        assert_eq!(long.chars().count(), 2 + MAX_CAVEAT_CHARS + 1);
        assert!(long.ends_with('…'));
        assert!(
            md.contains("1 passed · 2 failed · 1 flaky · 1 skipped"),
            "{md}"
        );
        assert!(md.contains("| wall time | 12.3 s | 600 s |"), "{md}");
        assert!(
            md.contains("| memory (peak) | 117.7 MiB | 1.0 GiB |"),
            "{md}"
        );
        assert!(md.contains("| disk | 4.0 KiB | unlimited |"), "{md}");
        assert!(md.contains("Budget exceeded: **memory**"));
        assert!(md.contains("**Isolation:** cgroup=v1 · landlock\\_abi=6 · mountns=true"));
        assert!(md.contains(&format!("**Patch** `{}`", v.patch_hash)));
        assert!(md.contains("**run** `run-20250131-abcdef`"));
        assert!(md.contains("**bundle** `fork-out/run-20250131-abcdef`"));
        assert_eq!(md, markdown(&v, Path::new("fork-out/run-20250131-abcdef")));
    }

    #[test]
    fn markdown_text_cannot_start_blocks() {
        assert_eq!(md_text("- item"), "\\- item");
        assert_eq!(md_text("12. x"), "12\\. x");
        assert_eq!(md_text("# h\n===\r\nx"), "\\# h === x");
        assert_eq!(md_text("a\u{1b}[31m"), "a\u{FFFD}\\[31m");
        assert_eq!(md_code("a`b"), "a\\`b");
        assert_eq!(md_code("x|y"), "x\\|y");
        assert_eq!(md_code("sha256:ab"), "`sha256:ab`");
    }

    #[test]
    fn markdown_for_a_bare_reject() {
        let k = EphemeralKey::generate();
        let mut v = sample_verdict(&k.public());
        v.verdict = VerdictKind::Reject;
        v.metrics.clear();
        v.caveats.clear();
        v.tests = Default::default();
        v.isolation = serde_json::json!({});
        v.patch_gate = Some(GateReport {
            passed: false,
            violations: vec!["protected: tests/**".into()],
        });
        let md = markdown(&v, Path::new("out/r"));
        assert!(md.contains("No metrics reported."));
        assert!(md.contains("No test results."));
        assert!(!md.contains("### Caveats"));
        assert!(
            md.contains("### Patch gate\n\n- protected\\: tests/\\*\\*\n"),
            "{md}"
        );
        assert!(md.contains("**Isolation:** none recorded"));
    }

    #[test]
    fn numbers() {
        assert_eq!(num(41.0), "41");
        assert_eq!(num(45.92), "45.92");
        assert_eq!(num(-0.0), "0");
        assert_eq!(num(1.5e-7), "1.5e-7");
        assert_eq!(change_pct(Some(-0.18)), "-18.0%");
        assert_eq!(change_pct(Some(-0.0001)), "0.0%");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1 << 30), "1.0 GiB");
    }

    #[test]
    fn writes_files_and_appends_to_the_step_summary() {
        let (v, report) = fixture();
        let rules = DecisionRules::default();
        let dir = tempfile::tempdir().unwrap();
        let j = dir.path().join("junit.xml");
        let s = dir.path().join("summary.md");
        let step = dir.path().join("step_summary");
        std::fs::write(&step, "earlier step\n").unwrap();
        std::fs::write(&s, "stale content that must go").unwrap();
        let bundle = dir.path().join("out/run");
        for _ in 0..2 {
            write_ci_outputs_to(
                &v,
                Some(&report),
                &rules,
                &bundle,
                Some(&j),
                Some(&s),
                Some(&step),
            )
            .unwrap();
        }
        let md = markdown(&v, &bundle);
        assert_eq!(std::fs::read_to_string(&s).unwrap(), md);
        assert_eq!(
            std::fs::read_to_string(&step).unwrap(),
            format!("earlier step\n\n{md}\n{md}")
        );
        let parsed = parse_junit(&std::fs::read(&j).unwrap()).unwrap();
        assert_eq!(parsed.cases.len(), 12);

        // `--summary "$GITHUB_STEP_SUMMARY"`: appended once, never truncated.
        write_ci_outputs_to(&v, None, &rules, &bundle, None, Some(&step), Some(&step)).unwrap();
        assert_eq!(
            std::fs::read_to_string(&step).unwrap(),
            format!("earlier step\n\n{md}\n{md}\n{md}")
        );

        // Nothing asked, nothing written; an empty variable counts as unset.
        let empty = dir.path().join("untouched");
        write_ci_outputs_to(&v, None, &rules, &bundle, None, None, Some(Path::new(""))).unwrap();
        assert!(!empty.exists());

        // An unwritable path is an error naming it.
        let bad = dir.path().join("no/such/dir/junit.xml");
        let err =
            write_ci_outputs_to(&v, None, &rules, &bundle, Some(&bad), None, None).unwrap_err();
        assert!(err.to_string().contains("no/such/dir/junit.xml"), "{err}");
    }

    const CHILD_MARKER: &str = "FORK_REPORT_TEST_CHILD";

    /// Run in a child process by `step_summary_from_the_environment` with the variable set,
    /// so no test of this process ever changes the environment.
    #[test]
    #[ignore = "run by step_summary_from_the_environment in a child process"]
    fn child_writes_ci_outputs() {
        // Only as the parent's child: never append to a real CI job's step summary.
        if std::env::var_os(CHILD_MARKER).is_none() {
            return;
        }
        let step = std::env::var_os(STEP_SUMMARY_ENV).expect("the parent sets it");
        let (v, report) = fixture();
        write_ci_outputs(
            &v,
            Some(&report),
            &DecisionRules::default(),
            Path::new("fork-out/run-20250131-abcdef"),
            None,
            None,
        )
        .unwrap();
        let text = std::fs::read_to_string(step).unwrap();
        assert!(text.starts_with("before\n\n## fork verdict: NEEDS_REVISION\n"));
    }

    #[test]
    fn step_summary_from_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let step = dir.path().join("step_summary.md");
        std::fs::write(&step, "before\n").unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "--ignored",
                "--test-threads=1",
                "report::tests::child_writes_ci_outputs",
                "verdict::report::tests::child_writes_ci_outputs",
            ])
            .env(STEP_SUMMARY_ENV, &step)
            .env(CHILD_MARKER, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("1 passed"),
            "the child test did not run: {stdout}"
        );
        let text = std::fs::read_to_string(&step).unwrap();
        assert!(text.starts_with("before\n\n## fork verdict: NEEDS_REVISION\n"));
        assert!(text.contains("| p99\\_ms | 41 | 45.92 | +12.0% | n/a |"));
    }
}
