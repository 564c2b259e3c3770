//! The markdown summary of a verdict for a CI job page (GitHub's `$GITHUB_STEP_SUMMARY`, a
//! merge-request note), with every string from the verdict escaped into inert text.

use super::{change_pct, num};
use crate::verdict::decide::wording::short;
use crate::verdict::Verdict;
use std::fmt::Write as _;
use std::path::Path;

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
/// A bullet list of at most `max` items, each cut at [`MAX_CAVEAT_CHARS`], then how many
/// more `noun` the verdict holds; ends with a blank line.
fn bullets(s: &mut String, items: &[String], max: usize, noun: &str) {
    for item in items.iter().take(max) {
        let _ = writeln!(s, "- {}", md_text(&short(item, MAX_CAVEAT_CHARS)));
    }
    if items.len() > max {
        let _ = writeln!(s, "- {} more {noun} in verdict.json", items.len() - max);
    }
    s.push('\n');
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
    md_text(&short(&text, MAX_ISOLATION_CHARS))
}

/// A short markdown summary for a CI job page (GitHub's step summary, a merge-request note):
/// a heading with the verdict, a badge-like line (verdict, exit code, confidence, task),
/// the evaluation summary, a table of metrics (baseline, patched, change, significant),
/// the test counts, the caveats (each cut at 300 characters, at most 50), gate violations,
/// a budget table (used against limits), the isolation in one line, and the patch hash,
/// run id and `bundle_dir`. Every string from the verdict is escaped (see the `report` module
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
        bullets(&mut s, &v.caveats, MAX_CAVEATS, "caveats");
    }

    // Gate violations.
    if let Some(g) = v.patch_gate.as_ref().filter(|g| !g.violations.is_empty()) {
        s.push_str("### Patch gate\n\n");
        bullets(&mut s, &g.violations, MAX_VIOLATIONS, "violations");
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::EphemeralKey;
    use crate::verdict::kind::VerdictKind;
    use crate::verdict::report::tests::{fixture, metric};
    use crate::verdict::tests::sample_verdict;
    use crate::verdict::GateReport;

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
    fn byte_sizes() {
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1 << 30), "1.0 GiB");
    }
}
