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
//!
//! The parts: `junit` writes the JUnit report, `markdown` the summary; this module holds
//! what both use and writes the files.

mod junit;
mod markdown;

pub use junit::junit;
pub use markdown::markdown;

use crate::task::results::TestReport;
use crate::verdict::decide::{wording, DecisionRules};
use crate::verdict::Verdict;
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

// ---------------------------------------------------------------------------------------
// Numbers, as both outputs write them.
// ---------------------------------------------------------------------------------------

/// A number written plainly: integers without decimals, others with up to 4 decimals, and
/// never a negative zero.
fn num(x: f64) -> String {
    if x == 0.0 {
        return "0".to_string();
    }
    wording::num(x)
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
    // Never waiting for a reader: a FIFO nobody reads is an error at once.
    let mut f = crate::outfile::open_output(path, true)
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
        crate::outfile::replace_file(p, junit(v, tests, rules).as_bytes())
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
            crate::outfile::replace_file(p, md.as_bytes())
                .map_err(|e| named(p, "writing the summary", e))?;
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
pub(super) mod tests {
    use super::*;
    use crate::identity::EphemeralKey;
    use crate::task::results::{parse_junit, TestCase, TestOutcome};
    use crate::verdict::kind::VerdictKind;
    use crate::verdict::tests::sample_verdict;
    use crate::verdict::Metric;

    pub(super) fn case(name: &str, outcome: TestOutcome, message: Option<&str>) -> TestCase {
        TestCase {
            name: name.to_string(),
            classname: None,
            outcome,
            time_s: Some(0.25),
            message: message.map(str::to_string),
        }
    }

    pub(super) fn metric(name: &str, baseline: Option<f64>, patched: f64) -> Metric {
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
            ..Metric::default()
        }
    }

    /// A NEEDS_REVISION verdict with metrics of every kind, and a report of every outcome.
    pub(super) fn fixture() -> (Verdict, TestReport) {
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

    #[test]
    fn numbers() {
        assert_eq!(num(41.0), "41");
        assert_eq!(num(45.92), "45.92");
        assert_eq!(num(-0.0), "0");
        assert_eq!(num(1.5e-7), "1.5e-7");
        assert_eq!(change_pct(Some(-0.18)), "-18.0%");
        assert_eq!(change_pct(Some(-0.0001)), "0.0%");
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
