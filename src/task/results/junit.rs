//! JUnit XML reports: the dialect of pytest, unittest writers, Maven Surefire and friends,
//! including the rerun extensions, parsed by a bounded streaming reader without a DTD.

use super::{
    clean, clean_message, clean_name, push_bounded, ResultsError, TestCase, TestOutcome,
    TestReport, MAX_MESSAGE_CHARS, MAX_TEST_CASES,
};

/// Deepest element nesting accepted in a JUnit document.
pub const MAX_XML_DEPTH: usize = 64;
/// Most elements (of any kind) accepted in a JUnit document.
pub const MAX_XML_ELEMENTS: usize = 2_000_000;
/// Most attributes accepted on one element whose attributes are read.
pub const MAX_XML_ATTRIBUTES: usize = 256;
/// Longest start tag (name and attributes) accepted, in bytes.
pub const MAX_XML_TAG_BYTES: usize = 1 << 20;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Frame {
    /// `<testsuites>` or `<testsuite>`.
    Suite,
    /// `<testcase>`.
    Case,
    /// A result child of `<testcase>` whose text we collect.
    Detail(DetailKind),
    /// Anything else (properties, system-out, stackTrace, …).
    Other,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum DetailKind {
    Failure,
    Error,
    Skipped,
    Rerun,
}

#[derive(Default)]
struct CaseBuilder {
    name: String,
    classname: Option<String>,
    time_s: Option<f64>,
    failure: Option<String>,
    error: Option<String>,
    skipped: Option<String>,
    has_failure: bool,
    has_error: bool,
    has_skipped: bool,
    reruns: u32,
    rerun_message: Option<String>,
    /// Text collected inside the current detail element.
    text: String,
    /// The current detail element's `message` attribute, if it had one.
    attr_message: Option<String>,
}

impl CaseBuilder {
    fn finish_detail(&mut self, kind: DetailKind) {
        let text = std::mem::take(&mut self.text);
        let msg = match self.attr_message.take() {
            Some(m) if !m.trim().is_empty() => clean_message(&m),
            _ => clean_message(&text),
        };
        let slot = match kind {
            DetailKind::Failure => {
                self.has_failure = true;
                &mut self.failure
            }
            DetailKind::Error => {
                self.has_error = true;
                &mut self.error
            }
            DetailKind::Skipped => {
                self.has_skipped = true;
                &mut self.skipped
            }
            DetailKind::Rerun => {
                self.reruns = self.reruns.saturating_add(1);
                &mut self.rerun_message
            }
        };
        if slot.is_none() {
            *slot = msg;
        }
    }

    fn build(self) -> TestCase {
        let (outcome, message) = if self.has_error {
            (TestOutcome::Error, self.error)
        } else if self.has_failure {
            (TestOutcome::Failed, self.failure)
        } else if self.reruns > 0 {
            let plural = if self.reruns == 1 { "" } else { "s" };
            let mut m = format!("passed after {} failed attempt{plural}", self.reruns);
            if let Some(first) = self.rerun_message {
                m.push_str("; first failure: ");
                m.push_str(&first);
            }
            (TestOutcome::Flaky, Some(clean(&m, MAX_MESSAGE_CHARS, true)))
        } else if self.has_skipped {
            (TestOutcome::Skipped, self.skipped)
        } else {
            (TestOutcome::Passed, None)
        };
        TestCase {
            name: self.name,
            classname: self.classname,
            outcome,
            time_s: self.time_s,
            message,
        }
    }
}

/// Parse a JUnit XML report: `<testsuites>` or a single `<testsuite>` root, suites nested to
/// any depth up to [`MAX_XML_DEPTH`], `<testcase name classname time>` with `<failure>`,
/// `<error>`, `<skipped>`, and the rerun extensions (`<flakyFailure>`, `<flakyError>`,
/// `<rerunFailure>`, `<rerunError>`): a case with reruns but no final `<failure>`/`<error>`
/// passed after retrying and is [`TestOutcome::Flaky`]; with a final failure it is Failed.
///
/// Refused: a DOCTYPE (no DTD, so no entity can be declared, let alone expanded), unknown
/// entity references, any other root element, a second root, a truncated document, a
/// `<testcase>` without `name`, a suite or case inside a case, and the limits above.
pub fn parse_junit(xml: &[u8]) -> Result<TestReport, ResultsError> {
    use quick_xml::events::{BytesStart, Event};
    use quick_xml::Reader;

    let mut reader = Reader::from_reader(xml);
    {
        let cfg = reader.config_mut();
        cfg.check_end_names = true;
        cfg.check_comments = false;
        cfg.expand_empty_elements = false;
    }
    let err_at = |position: u64, message: String| ResultsError::Junit { position, message };

    let mut stack: Vec<Frame> = Vec::new();
    let mut report = TestReport::default();
    let mut case: Option<CaseBuilder> = None;
    let mut root_seen = false;
    let mut elements = 0usize;

    // Decode the attributes `keys` of `e` in one pass over its attributes (linear: the
    // reader's own duplicate check is quadratic, so it is off, and only the keys read are
    // checked for duplicates), refusing more than MAX_XML_ATTRIBUTES attributes, malformed
    // attributes and unknown entities.
    fn attrs<const N: usize>(
        e: &BytesStart<'_>,
        keys: [&[u8]; N],
        pos: u64,
    ) -> Result<[Option<String>; N], ResultsError> {
        let bad = |message: String| ResultsError::Junit {
            position: pos,
            message,
        };
        let mut out: [Option<String>; N] = std::array::from_fn(|_| None);
        for (count, a) in e.attributes().with_checks(false).enumerate() {
            if count >= MAX_XML_ATTRIBUTES {
                return Err(bad(format!(
                    "more than {MAX_XML_ATTRIBUTES} attributes on one element; refusing an oversized report"
                )));
            }
            let a = a.map_err(|err| bad(format!("malformed attribute: {err}")))?;
            let local = a.key.local_name();
            let Some(i) = keys.iter().position(|k| *k == local.as_ref()) else {
                continue;
            };
            let key = String::from_utf8_lossy(keys[i]);
            if out[i].is_some() {
                return Err(bad(format!("duplicate attribute `{key}`")));
            }
            let v = a.unescape_value().map_err(|err| {
                bad(format!(
                    "attribute `{key}`: {err} (only the five predefined XML entities and character references are accepted)"
                ))
            })?;
            out[i] = Some(v.into_owned());
        }
        Ok(out)
    }

    loop {
        let pos = reader.buffer_position();
        let ev = reader.read_event().map_err(|e| {
            err_at(
                reader.error_position(),
                format!("{e}; the file is not well-formed XML"),
            )
        })?;
        let (start, empty) = match &ev {
            Event::Start(e) => (Some(e), false),
            Event::Empty(e) => (Some(e), true),
            _ => (None, false),
        };
        if let Some(e) = start {
            elements += 1;
            if elements > MAX_XML_ELEMENTS {
                return Err(err_at(
                    pos,
                    format!("more than {MAX_XML_ELEMENTS} elements; refusing an oversized report"),
                ));
            }
            if stack.len() >= MAX_XML_DEPTH {
                return Err(err_at(
                    pos,
                    format!("elements nested deeper than {MAX_XML_DEPTH} levels"),
                ));
            }
            if e.len() > MAX_XML_TAG_BYTES {
                return Err(err_at(
                    pos,
                    format!("a start tag longer than {MAX_XML_TAG_BYTES} bytes; refusing an oversized report"),
                ));
            }
            let local = e.local_name();
            let name = local.as_ref();
            let parent = stack.last().copied();
            let frame = match parent {
                None => {
                    if root_seen {
                        return Err(err_at(
                            pos,
                            "a second root element after the first one closed".into(),
                        ));
                    }
                    root_seen = true;
                    if name != b"testsuites" && name != b"testsuite" {
                        return Err(err_at(
                            pos,
                            format!(
                                "root element is <{}>, expected <testsuites> or <testsuite>; is this a JUnit report?",
                                clean_name(&String::from_utf8_lossy(name))
                            ),
                        ));
                    }
                    Frame::Suite
                }
                Some(Frame::Suite) => match name {
                    b"testsuite" | b"testsuites" => Frame::Suite,
                    b"testcase" => {
                        if report.cases.len() >= MAX_TEST_CASES {
                            return Err(err_at(
                                pos,
                                format!("more than {MAX_TEST_CASES} test cases; refusing an oversized report"),
                            ));
                        }
                        let [n, classname, time] =
                            attrs(e, [b"name".as_slice(), b"classname", b"time"], pos)?;
                        let n = n.ok_or_else(|| {
                            err_at(pos, "<testcase> without a `name` attribute".into())
                        })?;
                        let classname = classname.unwrap_or_default();
                        let full = if classname.trim().is_empty() {
                            n
                        } else {
                            format!("{}.{}", classname.trim(), n.trim())
                        };
                        let time_s = time
                            .and_then(|t| t.trim().parse::<f64>().ok())
                            .filter(|t| t.is_finite() && *t >= 0.0);
                        // Kept when the cleaned name still starts with it (the JUnit
                        // report fork writes splits the name there again).
                        let name = clean_name(&full);
                        let classname = Some(clean_name(&classname))
                            .filter(|c| !c.is_empty() && name.starts_with(&format!("{c}.")));
                        case = Some(CaseBuilder {
                            name,
                            classname,
                            time_s,
                            ..CaseBuilder::default()
                        });
                        Frame::Case
                    }
                    _ => Frame::Other,
                },
                Some(Frame::Case) => {
                    let kind = match name {
                        b"failure" => Some(DetailKind::Failure),
                        b"error" => Some(DetailKind::Error),
                        b"skipped" => Some(DetailKind::Skipped),
                        b"flakyFailure" | b"flakyError" | b"rerunFailure" | b"rerunError" => {
                            Some(DetailKind::Rerun)
                        }
                        b"testcase" | b"testsuite" | b"testsuites" => {
                            return Err(err_at(
                                pos,
                                format!("<{}> inside a <testcase>", String::from_utf8_lossy(name)),
                            ))
                        }
                        _ => None,
                    };
                    match (kind, case.as_mut()) {
                        (Some(k), Some(c)) => {
                            c.text.clear();
                            let [message] = attrs(e, [b"message".as_slice()], pos)?;
                            c.attr_message = message;
                            Frame::Detail(k)
                        }
                        _ => Frame::Other,
                    }
                }
                Some(Frame::Detail(_)) | Some(Frame::Other) => {
                    if matches!(name, b"testcase" | b"testsuite" | b"testsuites") && case.is_some()
                    {
                        return Err(err_at(
                            pos,
                            format!("<{}> inside a <testcase>", String::from_utf8_lossy(name)),
                        ));
                    }
                    Frame::Other
                }
            };
            if empty {
                close(frame, &mut case, &mut report);
            } else {
                stack.push(frame);
            }
            continue;
        }
        match ev {
            Event::End(_) => {
                // check_end_names guarantees the end tag matches the open one.
                if let Some(frame) = stack.pop() {
                    close(frame, &mut case, &mut report);
                }
            }
            Event::Text(t) => {
                let raw = t.unescape().map_err(|e| {
                    err_at(
                        pos,
                        format!("{e} (only the five predefined XML entities and character references are accepted)"),
                    )
                })?;
                if stack.is_empty() {
                    if !raw.trim().is_empty() {
                        return Err(err_at(pos, "text outside the root element".into()));
                    }
                } else if let (Some(Frame::Detail(_)), Some(c)) = (stack.last(), case.as_mut()) {
                    push_bounded(&mut c.text, &raw);
                }
            }
            Event::CData(t) => {
                if let (Some(Frame::Detail(_)), Some(c)) = (stack.last(), case.as_mut()) {
                    push_bounded(&mut c.text, &String::from_utf8_lossy(&t));
                }
            }
            Event::DocType(_) => {
                return Err(err_at(
                    pos,
                    "DOCTYPE declarations are refused: a test report needs no DTD, and entity definitions could expand without bound".into(),
                ));
            }
            Event::Eof => break,
            // Declarations, comments and processing instructions carry no results.
            _ => {}
        }
    }
    if !stack.is_empty() {
        return Err(err_at(
            reader.buffer_position(),
            format!(
                "the document ends with {} element(s) still open; the report is truncated",
                stack.len()
            ),
        ));
    }
    if !root_seen {
        return Err(err_at(
            0,
            "no root element; expected <testsuites> or <testsuite>".into(),
        ));
    }
    Ok(report)
}

fn close(frame: Frame, case: &mut Option<CaseBuilder>, report: &mut TestReport) {
    match frame {
        Frame::Detail(kind) => {
            if let Some(c) = case.as_mut() {
                c.finish_detail(kind);
            }
        }
        Frame::Case => {
            if let Some(c) = case.take() {
                report.cases.push(c.build());
            }
        }
        Frame::Suite | Frame::Other => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::results::outcomes;
    use crate::task::results::MAX_NAME_CHARS;
    use std::process::Command;

    /// A real unittest run, written to JUnit by a minimal ElementTree writer (the same shape as
    /// the demo runtime's runner and pytest --junitxml).
    const PY_JUNIT: &str = r#"
import sys, time, unittest, xml.etree.ElementTree as ET
class T(unittest.TestCase):
    def test_pass(self): self.assertEqual(1, 1)
    def test_fail(self): self.assertEqual(1, 2, "one is not two <&>")
    def test_error(self): raise RuntimeError("boom \x1b[31m red")
    @unittest.skip("not on this host")
    def test_skip(self): pass
class R(unittest.TextTestResult):
    def __init__(s, *a, **k):
        super().__init__(*a, **k); s.rows = []
    def startTest(s, t):
        s.t0 = time.perf_counter(); super().startTest(t)
    def _row(s, t, kind=None, text=None):
        s.rows.append((t, time.perf_counter() - s.t0, kind, text))
    def addSuccess(s, t): super().addSuccess(t); s._row(t)
    def addFailure(s, t, e): super().addFailure(t, e); s._row(t, "failure", s.failures[-1][1])
    def addError(s, t, e): super().addError(t, e); s._row(t, "error", s.errors[-1][1])
    def addSkip(s, t, r): super().addSkip(t, r); s._row(t, "skipped", r)
suite = unittest.defaultTestLoader.loadTestsFromTestCase(T)
res = unittest.TextTestRunner(resultclass=R, stream=sys.stderr).run(suite)
root = ET.Element("testsuites")
ts = ET.SubElement(root, "testsuite", name="unittest", tests=str(res.testsRun))
for t, dt, kind, text in res.rows:
    cls, _, name = t.id().rpartition(".")
    tc = ET.SubElement(ts, "testcase", classname=cls, name=name, time="%.6f" % dt)
    if kind:
        el = ET.SubElement(tc, kind, message=text.strip().splitlines()[-1])
        el.text = text
sys.stdout.buffer.write(ET.tostring(root, encoding="utf-8", xml_declaration=True))
"#;

    #[test]
    fn parses_real_unittest_junit() {
        let out = Command::new("python3")
            .args(["-c", PY_JUNIT])
            .output()
            .expect("python3 is on PATH");
        assert!(
            !out.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r = parse_junit(&out.stdout).unwrap();
        assert_eq!(r.cases.len(), 4);
        assert_eq!(
            (r.passed(), r.failed(), r.skipped(), r.flaky()),
            (1, 2, 1, 0)
        );
        let by = |n: &str| r.cases.iter().find(|c| c.name.ends_with(n)).unwrap();
        assert_eq!(by("test_pass").name, "__main__.T.test_pass");
        assert!(by("test_pass").time_s.unwrap() >= 0.0);
        assert_eq!(by("test_fail").outcome, TestOutcome::Failed);
        assert!(by("test_fail")
            .message
            .as_deref()
            .unwrap()
            .contains("one is not two <&>"));
        let err = by("test_error");
        assert_eq!(err.outcome, TestOutcome::Error);
        let m = err.message.as_deref().unwrap();
        assert!(m.contains("RuntimeError: boom"), "{m}");
        assert!(
            !m.contains('\x1b'),
            "escape sequences are neutralised: {m:?}"
        );
        assert_eq!(by("test_skip").outcome, TestOutcome::Skipped);
        assert_eq!(by("test_skip").message.as_deref(), Some("not on this host"));
    }

    /// Shaped like pytest --junitxml (xunit2), with the `flakyFailure` extension from surefire.
    const PYTEST_LIKE: &str = r#"<?xml version="1.0" encoding="utf-8"?>
<testsuites name="pytest tests"><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="5" time="0.051" timestamp="2025-01-01T00:00:00.000000" hostname="h">
<testcase classname="tests.test_gateway" name="test_ok" time="0.001" />
<testcase classname="tests.test_gateway" name="test_bad" time="0.002"><failure message="assert 1 == 2">def test_bad():
&gt;       assert 1 == 2
E       assert 1 == 2</failure></testcase>
<testcase classname="tests.test_gateway" name="test_later" time="0.000"><skipped type="pytest.skip" message="later">tests/test_gateway.py:9: later</skipped></testcase>
<testcase classname="tests.test_gateway" name="test_reconnect" time="1.5"><flakyFailure message="timeout" type="TimeoutError"><stackTrace>trace</stackTrace></flakyFailure><flakyFailure message="timeout again"/><system-out><![CDATA[retrying]]></system-out></testcase>
<testcase classname="tests.test_gateway" name="test_gone" time="0.3"><failure message="still broken"/><rerunFailure message="still broken"/></testcase>
</testsuite></testsuites>"#;

    #[test]
    fn parses_pytest_shape_with_flaky_reruns() {
        let r = parse_junit(PYTEST_LIKE.as_bytes()).unwrap();
        assert_eq!(
            outcomes(&r),
            vec![
                ("tests.test_gateway.test_ok", TestOutcome::Passed),
                ("tests.test_gateway.test_bad", TestOutcome::Failed),
                ("tests.test_gateway.test_later", TestOutcome::Skipped),
                ("tests.test_gateway.test_reconnect", TestOutcome::Flaky),
                ("tests.test_gateway.test_gone", TestOutcome::Failed),
            ]
        );
        assert_eq!(r.cases[1].message.as_deref(), Some("assert 1 == 2"));
        assert_eq!(
            r.cases[3].message.as_deref(),
            Some("passed after 2 failed attempts; first failure: timeout")
        );
        assert_eq!(r.cases[3].time_s, Some(1.5));
        assert_eq!(
            (r.passed(), r.failed(), r.skipped(), r.flaky()),
            (1, 2, 1, 1)
        );
    }

    /// Shaped like cargo2junit: a single `<testsuite>` root is accepted too, and nested suites.
    #[test]
    fn parses_single_and_nested_suites() {
        let single = r#"<testsuite id="0" name="cargo test #0" package="testsuite/cargo test #0" tests="2" errors="0" failures="1" hostname="localhost" timestamp="2025-01-01T00:00:00Z" time="0"><testcase name="units::parse" time="0"/><testcase name="units::bad" time="0"><failure type="cargo test" message="failed units::bad">thread panicked</failure></testcase></testsuite>"#;
        let r = parse_junit(single.as_bytes()).unwrap();
        assert_eq!(r.cases[0].name, "units::parse");
        assert_eq!(r.cases[0].time_s, Some(0.0));
        assert_eq!((r.passed(), r.failed()), (1, 1));

        let nested = r#"<testsuites><testsuite name="a"><testsuite name="b"><testcase name="x" classname="b"/></testsuite><testcase name="y" time="nan"/></testsuite></testsuites>"#;
        let r = parse_junit(nested.as_bytes()).unwrap();
        assert_eq!(r.cases.len(), 2);
        assert_eq!(r.cases[0].name, "b.x");
        assert_eq!(r.cases[1].time_s, None, "a non-finite time is dropped");

        let empty = parse_junit(b"<testsuites></testsuites>").unwrap();
        assert!(empty.cases.is_empty());
    }

    #[test]
    fn refuses_billion_laughs_and_entities() {
        let lol = r#"<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>
<testsuites><testcase name="&lol3;"/></testsuites>"#;
        let e = parse_junit(lol.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("DOCTYPE"), "{e}");
        // an undeclared entity in an attribute or a message is refused, not expanded or kept
        let e = parse_junit(br#"<testsuite><testcase name="&xxe;"/></testsuite>"#).unwrap_err();
        assert!(matches!(e, ResultsError::Junit { .. }), "{e}");
        let e = parse_junit(
            br#"<testsuite><testcase name="a"><failure>&xxe;</failure></testcase></testsuite>"#,
        )
        .unwrap_err();
        assert!(matches!(e, ResultsError::Junit { .. }), "{e}");
        // predefined and numeric references are fine
        let r = parse_junit(br#"<testsuite><testcase name="a&amp;b&#x41;"/></testsuite>"#).unwrap();
        assert_eq!(r.cases[0].name, "a&bA");
    }

    #[test]
    fn refuses_malformed_truncated_and_foreign_documents() {
        let cases: &[&[u8]] = &[
            b"",
            b"not xml at all",
            b"<html><body/></html>",
            b"<testsuites><testsuite><testcase name='a'/>", // truncated
            b"<testsuites><testsuite></testsuites>",        // mismatched end
            b"<testsuites/><testsuites/>",                  // two roots
            b"<testsuite><testcase/></testsuite>",          // no name
            b"<testsuite><testcase name='a'><testcase name='b'/></testcase></testsuite>",
            b"<testsuite><testcase name='a' name='b'/></testsuite>", // duplicate attribute
            b"\xff\xfe<\x00t\x00",
        ];
        for c in cases {
            let e = parse_junit(c).unwrap_err();
            assert!(
                matches!(e, ResultsError::Junit { .. }),
                "{:?}: {e}",
                String::from_utf8_lossy(c)
            );
        }
    }

    #[test]
    fn caps_depth_counts_and_message_length() {
        let deep = format!(
            "<testsuites>{}{}</testsuites>",
            "<testsuite>".repeat(MAX_XML_DEPTH + 5),
            "</testsuite>".repeat(MAX_XML_DEPTH + 5)
        );
        let e = parse_junit(deep.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("deeper"), "{e}");

        let many = format!(
            "<testsuite>{}</testsuite>",
            "<testcase name='t'/>".repeat(MAX_TEST_CASES + 1)
        );
        let e = parse_junit(many.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("test cases"), "{e}");

        let long = format!(
            "<testsuite><testcase name='{}'><failure>{}</failure></testcase></testsuite>",
            "n".repeat(5000),
            "m".repeat(1_000_000)
        );
        let r = parse_junit(long.as_bytes()).unwrap();
        assert_eq!(r.cases[0].name.chars().count(), MAX_NAME_CHARS + 1);
        assert_eq!(
            r.cases[0].message.as_ref().unwrap().chars().count(),
            MAX_MESSAGE_CHARS + 1
        );
    }
}

#[cfg(test)]
mod hostile_tests {
    use super::*;

    /// One `<testcase>` with a million attributes (about 8 MiB): the reader's own duplicate
    /// check made this quadratic (minutes of CPU); it is refused in one linear pass.
    #[test]
    fn a_million_attributes_are_refused_at_once() {
        let mut xml = String::from("<testsuite><testcase name='t' ");
        for i in 0..1_000_000 {
            xml.push_str(&format!("a{i}='' "));
        }
        xml.push_str("/></testsuite>");
        assert!(xml.len() > 7 << 20 && xml.len() < 16 << 20, "{}", xml.len());
        let t = thread_cpu();
        let e = parse_junit(xml.as_bytes()).unwrap_err();
        let took = thread_cpu() - t;
        assert!(e.to_string().contains("start tag longer"), "{e}");
        // This thread's CPU time, not the wall clock: a loaded CI runner stretches the wall
        // time of the linear pass (0.1 s became 0.8 s on a busy 2-core machine), not the
        // CPU it uses. The bounds are far above the linear pass (about 0.1 s of CPU in a
        // debug build) and far below the quadratic one (minutes).
        assert!(
            took < std::time::Duration::from_secs(3),
            "took {took:?} of CPU"
        );
        // 100,000 attributes in a tag under the byte cap (20 s before): the attribute cap.
        let mut xml = String::from("<testsuite><testcase name='t' ");
        for i in 0..100_000 {
            xml.push_str(&format!("a{i}='' "));
        }
        xml.push_str("/></testsuite>");
        assert!(xml.len() < MAX_XML_TAG_BYTES);
        let t = thread_cpu();
        let e = parse_junit(xml.as_bytes()).unwrap_err();
        let took = thread_cpu() - t;
        assert!(e.to_string().contains("more than 256 attributes"), "{e}");
        assert!(
            took < std::time::Duration::from_secs(1),
            "took {took:?} of CPU"
        );
    }

    /// The CPU time (user and system) this thread has used so far.
    fn thread_cpu() -> std::time::Duration {
        use nix::sys::resource::{getrusage, UsageWho};
        let u = getrusage(UsageWho::RUSAGE_THREAD).expect("getrusage(RUSAGE_THREAD)");
        let d = |t: nix::sys::time::TimeVal| {
            std::time::Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000)
        };
        d(u.user_time()) + d(u.system_time())
    }

    #[test]
    fn attributes_up_to_the_cap_parse_and_duplicates_of_read_keys_are_refused() {
        let extra: String = (0..MAX_XML_ATTRIBUTES - 2)
            .map(|i| format!(" x{i}='1'"))
            .collect();
        let xml = format!("<testsuite><testcase name='t' time='2'{extra}/></testsuite>");
        let r = parse_junit(xml.as_bytes()).unwrap();
        assert_eq!(r.cases[0].time_s, Some(2.0));
        let xml = "<testsuite><testcase name='t' name='u'/></testsuite>";
        let e = parse_junit(xml.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("duplicate attribute `name`"), "{e}");
        let tag = format!(
            "<testsuite><testcase name='t' x='{}'/></testsuite>",
            "v".repeat(MAX_XML_TAG_BYTES)
        );
        let e = parse_junit(tag.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("start tag longer"), "{e}");
    }
}
