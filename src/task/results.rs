//! Reading what the successor left in its reports directory (DESIGN.md lifecycle step 5).
//!
//! The supervisor reads these files after the successor is dead, but everything in them was
//! written by code under evaluation, so every byte is hostile input:
//!
//! * [`read_report_file`] opens a path beneath the reports directory one component at a time,
//!   each with `O_NOFOLLOW`, so no symbolic link anywhere (including the reports directory
//!   itself) is followed; it refuses anything that is not a regular file (FIFOs are opened
//!   with `O_NONBLOCK` so they cannot stall the supervisor, then refused), files with more
//!   than one hard link, and files over a size limit (checked before and while reading).
//! * [`parse_junit`] refuses DTDs (so no entity can be defined or expanded), unknown entity
//!   references, truncated documents, nesting deeper than [`MAX_XML_DEPTH`], more than
//!   [`MAX_XML_ELEMENTS`] elements and more than [`MAX_TEST_CASES`] test cases.
//! * [`parse_tap`] treats a missing or unmet plan and `Bail out!` as failures (as `prove`
//!   does), never as success.
//! * [`parse_metrics`] accepts only a flat object of finite numbers, refusing duplicate keys.
//!
//! Test names and messages are truncated ([`MAX_NAME_CHARS`], [`MAX_MESSAGE_CHARS`]) and
//! control characters in them are replaced with U+FFFD, so a report cannot smuggle terminal
//! escape sequences into a human-readable verdict.

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};

/// The default cap on one report file: 16 MiB.
pub const DEFAULT_MAX_REPORT_BYTES: u64 = 16 * 1024 * 1024;
/// Deepest element nesting accepted in a JUnit document.
pub const MAX_XML_DEPTH: usize = 64;
/// Most elements (of any kind) accepted in a JUnit document.
pub const MAX_XML_ELEMENTS: usize = 2_000_000;
/// Most test cases accepted in one report (JUnit or TAP).
pub const MAX_TEST_CASES: usize = 200_000;
/// Longest kept test name, in characters (longer names are truncated with `…`).
pub const MAX_NAME_CHARS: usize = 512;
/// Longest kept failure message, in characters (longer messages are truncated with `…`).
pub const MAX_MESSAGE_CHARS: usize = 1024;
/// Most metrics accepted in one metrics file.
pub const MAX_METRICS: usize = 10_000;
/// Most path components accepted in a report's relative path.
const MAX_PATH_COMPONENTS: usize = 32;

/// Why a report could not be read or parsed. Every message names the file or the position.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    /// The relative path is absolute, empty, escapes with `..`, or is too deep.
    #[error("report path `{rel}` is not usable: {reason}; declare a relative path inside the reports directory (no `..`, not absolute)")]
    BadPath { rel: String, reason: &'static str },
    /// A component of the path (or the reports directory itself) is a symbolic link.
    #[error("report `{path}`: `{component}` is a symbolic link; links in the reports directory are never followed, the task must write the file itself")]
    Symlink { path: PathBuf, component: String },
    /// The report (or an intermediate component) is not of the expected file type.
    #[error("report `{path}`: `{component}` is a {kind}, expected a {expected}")]
    WrongType {
        path: PathBuf,
        component: String,
        kind: &'static str,
        expected: &'static str,
    },
    /// The report is a hard link shared with another path.
    #[error("report `{path}` has {links} hard links; refusing a file that is linked from elsewhere, the task must write a fresh file")]
    HardLinked { path: PathBuf, links: u64 },
    /// The report exceeds the size limit.
    #[error("report `{path}` is larger than the {max}-byte limit ({size} bytes seen); write a smaller report or raise the limit")]
    TooLarge { path: PathBuf, size: u64, max: u64 },
    /// The report does not exist.
    #[error("report `{path}` does not exist; the task declared it but did not write it (check the task's results path, relative to $FORK_REPORTS)")]
    Missing { path: PathBuf },
    /// Any other I/O failure, naming the operation.
    #[error("report `{path}`: {op} failed: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The JUnit document is malformed, refused, or over a limit.
    #[error("JUnit XML, byte {position}: {message}")]
    Junit { position: u64, message: String },
    /// The TAP stream is not TAP at all (a merely failing stream is a report, not an error).
    #[error("TAP, line {line}: {message}")]
    Tap { line: usize, message: String },
    /// The metrics file is not a JSON object.
    #[error("metrics JSON: {0}; expected a flat object like {{\"p99_ms\": 41.0}}")]
    MetricsJson(String),
    /// One metric entry is invalid.
    #[error("metrics JSON: key `{key}`: {message}; every value must be a finite number")]
    MetricsKey { key: String, message: String },
}

/// How one test case ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TestOutcome {
    /// Passed on the first attempt.
    Passed,
    /// An assertion failed.
    Failed,
    /// The test errored (exception outside an assertion, harness error, TAP bail-out or bad plan).
    Error,
    /// Skipped (including TAP `not ok … # TODO`, an expected failure).
    Skipped,
    /// Passed only after one or more failed attempts (JUnit `flakyFailure`/`rerunFailure`).
    Flaky,
}

/// One test case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestCase {
    /// `classname.name` for JUnit (just `name` without a classname); the description for TAP.
    pub name: String,
    /// How it ended.
    pub outcome: TestOutcome,
    /// Duration in seconds, when the report gives a finite, non-negative one.
    pub time_s: Option<f64>,
    /// Failure/error/skip message (truncated), or for flaky tests how many attempts failed.
    pub message: Option<String>,
}

/// A parsed test report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TestReport {
    /// Every case, in document order.
    pub cases: Vec<TestCase>,
}

impl TestReport {
    fn count(&self, pred: impl Fn(TestOutcome) -> bool) -> usize {
        self.cases.iter().filter(|c| pred(c.outcome)).count()
    }
    /// Cases that passed on the first attempt.
    pub fn passed(&self) -> usize {
        self.count(|o| o == TestOutcome::Passed)
    }
    /// Cases that failed or errored.
    pub fn failed(&self) -> usize {
        self.count(|o| matches!(o, TestOutcome::Failed | TestOutcome::Error))
    }
    /// Cases that were skipped.
    pub fn skipped(&self) -> usize {
        self.count(|o| o == TestOutcome::Skipped)
    }
    /// Cases that passed only after retries.
    pub fn flaky(&self) -> usize {
        self.count(|o| o == TestOutcome::Flaky)
    }
    /// Cases that ran to an outcome (everything but skipped).
    pub fn executed(&self) -> usize {
        self.cases.len() - self.skipped()
    }
    /// The cases with the given outcome, in document order.
    pub fn with_outcome(&self, outcome: TestOutcome) -> impl Iterator<Item = &TestCase> {
        self.cases.iter().filter(move |c| c.outcome == outcome)
    }
}

// ---------------------------------------------------------------------------------------
// Opening a report file safely.
// ---------------------------------------------------------------------------------------

fn file_kind(st: &FileStat) -> &'static str {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFREG => "regular file",
        SFlag::S_IFDIR => "directory",
        SFlag::S_IFLNK => "symbolic link",
        SFlag::S_IFIFO => "FIFO",
        SFlag::S_IFSOCK => "socket",
        SFlag::S_IFCHR => "character device",
        SFlag::S_IFBLK => "block device",
        _ => "file of unknown type",
    }
}

/// Read `rel` beneath `reports_dir` without following any symbolic link, refusing anything
/// that is not a regular, singly linked file of at most `max_bytes` bytes
/// (use [`DEFAULT_MAX_REPORT_BYTES`] unless the task says otherwise).
///
/// `reports_dir` itself must not be a symbolic link either (the successor could have replaced
/// it); the directories above it belong to the supervisor and are trusted.
pub fn read_report_file(
    reports_dir: &Path,
    rel: &str,
    max_bytes: u64,
) -> Result<Vec<u8>, ResultsError> {
    let full = reports_dir.join(rel);
    let bad = |reason| ResultsError::BadPath {
        rel: rel.to_string(),
        reason,
    };
    if rel.is_empty() {
        return Err(bad("it is empty"));
    }
    if rel.contains('\0') {
        return Err(bad("it contains a NUL byte"));
    }
    let mut parts = Vec::new();
    for comp in Path::new(rel).components() {
        match comp {
            Component::Normal(p) => parts.push(p),
            Component::CurDir => {}
            Component::ParentDir => return Err(bad("it contains `..`")),
            Component::RootDir | Component::Prefix(_) => return Err(bad("it is absolute")),
        }
    }
    if parts.is_empty() {
        return Err(bad("it names the reports directory itself"));
    }
    if parts.len() > MAX_PATH_COMPONENTS {
        return Err(bad("it has too many components"));
    }

    let io_err = |op, e: std::io::Error| ResultsError::Io {
        path: full.clone(),
        op,
        source: e,
    };
    let errno_err = |op, component: &str, e: Errno| match e {
        Errno::ENOENT => ResultsError::Missing { path: full.clone() },
        Errno::ELOOP => ResultsError::Symlink {
            path: full.clone(),
            component: component.to_string(),
        },
        Errno::ENOTDIR => ResultsError::WrongType {
            path: full.clone(),
            component: component.to_string(),
            kind: "non-directory",
            expected: "directory",
        },
        other => io_err(op, std::io::Error::from(other)),
    };

    // The reports directory: O_NOFOLLOW refuses a final-component symlink with ELOOP.
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
        .open(reports_dir)
        .map_err(|e| {
            let shown = reports_dir.display().to_string();
            match e.raw_os_error().map(Errno::from_raw) {
                // O_DIRECTORY is checked before O_NOFOLLOW, so a link shows as ENOTDIR.
                Some(Errno::ELOOP | Errno::ENOTDIR)
                    if std::fs::symlink_metadata(reports_dir)
                        .is_ok_and(|m| m.file_type().is_symlink()) =>
                {
                    errno_err("open", &shown, Errno::ELOOP)
                }
                Some(Errno::ENOTDIR) => errno_err("open", &shown, Errno::ENOTDIR),
                _ => io_err("open of the reports directory", e),
            }
        })?;
    let mut dir: OwnedFd = dir.into();

    let last = parts.len() - 1;
    let mut walked = PathBuf::new();
    for (i, part) in parts.iter().enumerate() {
        walked.push(part);
        let shown = walked.display().to_string();
        // Look before opening, so that a FIFO, socket or device is refused without opening it
        // and a symlink is named as such.
        let st = nix::sys::stat::fstatat(&dir, *part, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| errno_err("fstatat", &shown, e))?;
        let kind = file_kind(&st);
        if kind == "symbolic link" {
            return Err(ResultsError::Symlink {
                path: full.clone(),
                component: shown,
            });
        }
        let expected = if i == last {
            "regular file"
        } else {
            "directory"
        };
        if kind != expected {
            return Err(ResultsError::WrongType {
                path: full.clone(),
                component: shown,
                kind,
                expected,
            });
        }
        // Open with O_NOFOLLOW anyway: the entry could have been swapped since fstatat.
        // O_NONBLOCK keeps a swapped-in FIFO from blocking the open; fstat below refuses it.
        let flags = if i == last {
            OFlag::O_RDONLY
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC
                | OFlag::O_NONBLOCK
                | OFlag::O_NOCTTY
        } else {
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
        };
        let fd = nix::fcntl::openat(&dir, *part, flags, Mode::empty())
            .map_err(|e| errno_err("openat", &shown, e))?;
        dir = fd;
    }
    let file = dir;
    let st = nix::sys::stat::fstat(&file).map_err(|e| errno_err("fstat", rel, e))?;
    let kind = file_kind(&st);
    if kind != "regular file" {
        return Err(ResultsError::WrongType {
            path: full.clone(),
            component: rel.to_string(),
            kind,
            expected: "regular file",
        });
    }
    // nlink_t is u64 on x86_64 but u32 on other targets: keep the conversion portable.
    #[allow(clippy::useless_conversion)]
    let links = u64::from(st.st_nlink);
    if links > 1 {
        return Err(ResultsError::HardLinked {
            path: full.clone(),
            links,
        });
    }
    let size = u64::try_from(st.st_size).unwrap_or(0);
    if size > max_bytes {
        return Err(ResultsError::TooLarge {
            path: full.clone(),
            size,
            max: max_bytes,
        });
    }
    // The size can change between fstat and read (nothing should be writing, but do not trust
    // that): read at most max_bytes + 1 and refuse if the extra byte arrives.
    let mut buf = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    File::from(file)
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|e| io_err("read", e))?;
    if buf.len() as u64 > max_bytes {
        return Err(ResultsError::TooLarge {
            path: full,
            size: buf.len() as u64,
            max: max_bytes,
        });
    }
    Ok(buf)
}

// ---------------------------------------------------------------------------------------
// Text hygiene shared by the parsers.
// ---------------------------------------------------------------------------------------

/// Replace control characters (except `\n` and `\t` when `multiline`) with U+FFFD and truncate
/// to `max` characters, appending `…` when something was cut.
fn clean(s: &str, max: usize, multiline: bool) -> String {
    let mut out = String::with_capacity(s.len().min(max * 4));
    for (n, ch) in s.chars().enumerate() {
        if n == max {
            out.push('…');
            break;
        }
        let keep = !ch.is_control() || (multiline && (ch == '\n' || ch == '\t'));
        out.push(if keep { ch } else { '\u{FFFD}' });
    }
    out
}

fn clean_name(s: &str) -> String {
    clean(s.trim(), MAX_NAME_CHARS, false)
}

fn clean_message(s: &str) -> Option<String> {
    let t = s.trim();
    if t.is_empty() {
        None
    } else {
        Some(clean(t, MAX_MESSAGE_CHARS, true))
    }
}

/// Append to a bounded buffer (used while collecting element text).
fn push_bounded(buf: &mut String, s: &str) {
    // Four bytes per char at most: enough to hold MAX_MESSAGE_CHARS characters plus one.
    let cap = (MAX_MESSAGE_CHARS + 1) * 4;
    if buf.len() >= cap {
        return;
    }
    let room = cap - buf.len();
    if s.len() <= room {
        buf.push_str(s);
    } else {
        let mut end = room;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        buf.push_str(&s[..end]);
    }
}

// ---------------------------------------------------------------------------------------
// JUnit XML.
// ---------------------------------------------------------------------------------------

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

    // Decode one attribute of `e`, refusing malformed attributes and unknown entities.
    fn attr(e: &BytesStart<'_>, key: &[u8], pos: u64) -> Result<Option<String>, ResultsError> {
        for a in e.attributes() {
            let a = a.map_err(|err| ResultsError::Junit {
                position: pos,
                message: format!("malformed attribute: {err}"),
            })?;
            if a.key.local_name().as_ref() == key {
                let v = a.unescape_value().map_err(|err| ResultsError::Junit {
                    position: pos,
                    message: format!(
                        "attribute `{}`: {err} (only the five predefined XML entities and character references are accepted)",
                        String::from_utf8_lossy(key)
                    ),
                })?;
                return Ok(Some(v.into_owned()));
            }
        }
        Ok(None)
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
                        let n = attr(e, b"name", pos)?.ok_or_else(|| {
                            err_at(pos, "<testcase> without a `name` attribute".into())
                        })?;
                        let classname = attr(e, b"classname", pos)?.unwrap_or_default();
                        let full = if classname.trim().is_empty() {
                            n
                        } else {
                            format!("{}.{}", classname.trim(), n.trim())
                        };
                        let time_s = attr(e, b"time", pos)?
                            .and_then(|t| t.trim().parse::<f64>().ok())
                            .filter(|t| t.is_finite() && *t >= 0.0);
                        case = Some(CaseBuilder {
                            name: clean_name(&full),
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
                            c.attr_message = attr(e, b"message", pos)?;
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

// ---------------------------------------------------------------------------------------
// TAP 13/14.
// ---------------------------------------------------------------------------------------

/// The name of the synthetic case recording a plan problem (missing, unmet, duplicated).
pub const TAP_PLAN_CASE: &str = "TAP plan";
/// The name of the synthetic case recording a `Bail out!`.
pub const TAP_BAIL_CASE: &str = "Bail out!";

/// Parse a TAP 13/14 stream (as written by `prove -v`, Test::More, node-tap, …).
///
/// Top-level `ok`/`not ok` lines become cases (`# SKIP` → Skipped; `not ok … # TODO` →
/// Skipped, an expected failure; `ok … # TODO` → Passed; `not ok … # SKIP` stays Failed).
/// Indented lines (subtests, YAML diagnostics) are left to their parent line; `#` comment lines
/// right after a failure are attached to its message. Like `prove`, a stream is a failure when
/// it bails out, has no plan, or runs a different number of tests than planned: each of these
/// adds one synthetic [`TestOutcome::Error`] case ([`TAP_BAIL_CASE`], [`TAP_PLAN_CASE`]).
/// Only a stream with neither a plan nor a test line (or an unsupported `TAP version`) is an
/// error. Non-UTF-8 bytes are replaced.
pub fn parse_tap(text: &[u8]) -> Result<TestReport, ResultsError> {
    let text = String::from_utf8_lossy(text);
    let mut report = TestReport::default();
    let mut plan: Option<u64> = None;
    let mut plan_problem: Option<String> = None;
    let mut bail: Option<String> = None;
    let mut test_lines = 0usize;
    // Index of the last failed case, while comment lines may still be attached to it.
    let mut diag_target: Option<usize> = None;

    for (idx, raw_line) in text.split('\n').enumerate() {
        let lineno = idx + 1;
        let line = raw_line.strip_suffix('\r').unwrap_or(raw_line);
        if line.starts_with(' ') || line.starts_with('\t') {
            continue; // subtest or YAML block: the parent's line carries the outcome
        }
        if let Some(rest) = line.strip_prefix("TAP version ") {
            match rest.trim().parse::<u32>() {
                Ok(13 | 14) => {}
                _ => {
                    return Err(ResultsError::Tap {
                        line: lineno,
                        message: format!(
                            "unsupported `TAP version {}`; TAP 13 and 14 are understood",
                            clean_name(rest)
                        ),
                    })
                }
            }
            continue;
        }
        if let Some(reason) = line.strip_prefix("Bail out!") {
            bail = Some(reason.trim().to_string());
            break;
        }
        if let Some(rest) = line.strip_prefix('#') {
            if let (Some(i), false) = (diag_target, rest.trim().is_empty()) {
                let c = &mut report.cases[i];
                let mut m = c.message.take().unwrap_or_default();
                if !m.is_empty() {
                    m.push('\n');
                }
                m.push_str(rest.trim());
                c.message = Some(clean(&m, MAX_MESSAGE_CHARS, true));
            }
            continue;
        }
        diag_target = None;
        if let Some(n) = parse_plan(line) {
            if plan.is_some() || plan_problem.is_some() {
                plan_problem = Some(format!("more than one plan line (again at line {lineno})"));
            } else {
                plan = Some(n);
            }
            continue;
        }
        let (ok, rest) = if let Some(r) = strip_word(line, "ok") {
            (true, r)
        } else if let Some(r) = line.strip_prefix("not ").and_then(|l| strip_word(l, "ok")) {
            (false, r)
        } else {
            continue; // unknown lines are ignored, as the TAP specification requires
        };
        test_lines += 1;
        if report.cases.len() >= MAX_TEST_CASES {
            return Err(ResultsError::Tap {
                line: lineno,
                message: format!(
                    "more than {MAX_TEST_CASES} test lines; refusing an oversized report"
                ),
            });
        }
        report.cases.push(tap_case(ok, rest, test_lines));
        if !ok && report.cases.last().map(|c| c.outcome) == Some(TestOutcome::Failed) {
            diag_target = Some(report.cases.len() - 1);
        }
    }

    if plan.is_none() && test_lines == 0 && bail.is_none() {
        return Err(ResultsError::Tap {
            line: 1,
            message: "no plan (`1..N`) and no `ok`/`not ok` line: this is not a TAP stream".into(),
        });
    }
    if let Some(reason) = bail {
        report.cases.push(TestCase {
            name: TAP_BAIL_CASE.into(),
            outcome: TestOutcome::Error,
            time_s: None,
            message: clean_message(&reason).or_else(|| Some("the test run bailed out".into())),
        });
    } else {
        let problem = match (plan_problem, plan) {
            (Some(p), _) => Some(p),
            (None, None) => Some(format!(
                "no plan line (`1..N`) after {test_lines} test line(s); the stream may be truncated"
            )),
            (None, Some(n)) if n != test_lines as u64 => {
                Some(format!("planned {n} test(s) but {test_lines} ran"))
            }
            _ => None,
        };
        if let Some(p) = problem {
            report.cases.push(TestCase {
                name: TAP_PLAN_CASE.into(),
                outcome: TestOutcome::Error,
                time_s: None,
                message: Some(p),
            });
        }
    }
    Ok(report)
}

/// `1..N` optionally followed by `# reason`.
fn parse_plan(line: &str) -> Option<u64> {
    let rest = line.strip_prefix("1..")?;
    let (num, tail) = match rest.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let tail = tail.trim_start();
    if !(tail.is_empty() || tail.starts_with('#')) {
        return None;
    }
    num.parse().ok()
}

/// `word` at the start of `line`, followed by whitespace or the end of the line.
fn strip_word<'a>(line: &'a str, word: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(word)?;
    if rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t') {
        Some(rest)
    } else {
        None
    }
}

fn tap_case(ok: bool, rest: &str, seq: usize) -> TestCase {
    let rest = rest.trim_start();
    // Optional test number.
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let (num, rest) = rest.split_at(digits);
    let rest = rest.trim_start();
    let rest = rest.strip_prefix('-').unwrap_or(rest).trim_start();
    // Description up to the first unescaped '#'; the directive after it.
    let mut desc = String::new();
    let mut directive: Option<&str> = None;
    let mut chars = rest.char_indices().peekable();
    while let Some((i, ch)) = chars.next() {
        match ch {
            '\\' => {
                if let Some(&(_, next)) = chars.peek() {
                    if next == '#' || next == '\\' {
                        desc.push(next);
                        chars.next();
                        continue;
                    }
                }
                desc.push('\\');
            }
            '#' => {
                directive = Some(&rest[i + 1..]);
                break;
            }
            _ => desc.push(ch),
        }
    }
    let desc = desc.trim();
    let name = if !desc.is_empty() {
        clean_name(desc)
    } else if !num.is_empty() {
        format!("test {num}")
    } else {
        format!("test {seq}")
    };
    let (skip, todo, reason) = match directive.map(str::trim_start) {
        Some(d) => {
            let word_end = d
                .find(|c: char| !c.is_ascii_alphabetic())
                .unwrap_or(d.len());
            let word = d[..word_end].to_ascii_uppercase();
            let reason = d[word_end..].trim_start_matches(':').trim();
            (
                word.starts_with("SKIP"),
                word == "TODO",
                clean_message(reason),
            )
        }
        None => (false, false, None),
    };
    let with = |label: &str| {
        Some(match &reason {
            Some(r) => format!("{label}: {r}"),
            None => label.to_string(),
        })
    };
    let (outcome, message) = match (ok, skip, todo) {
        (true, true, _) => (TestOutcome::Skipped, with("SKIP")),
        (true, false, true) => (TestOutcome::Passed, with("TODO passed unexpectedly")),
        (true, false, false) => (TestOutcome::Passed, None),
        (false, false, true) => (TestOutcome::Skipped, with("TODO (expected failure)")),
        (false, _, _) => (TestOutcome::Failed, None),
    };
    TestCase {
        name,
        outcome,
        time_s: None,
        message,
    }
}

// ---------------------------------------------------------------------------------------
// Metrics.
// ---------------------------------------------------------------------------------------

/// The entries of a JSON object in document order, duplicates kept (so they can be refused).
struct Entries(Vec<(String, serde_json::Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object mapping metric names to numbers")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, serde_json::Value>()? {
                    if out.len() >= MAX_METRICS {
                        return Err(serde::de::Error::custom(format!(
                            "more than {MAX_METRICS} metrics"
                        )));
                    }
                    out.push((k, v));
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Parse a metrics file: a flat JSON object `{"name": number, …}` with finite numbers.
/// Refused, naming the key: nested values, strings, booleans, null, duplicate keys, empty or
/// over-long names (over [`MAX_NAME_CHARS`]) and names with control characters.
pub fn parse_metrics(json: &[u8]) -> Result<BTreeMap<String, f64>, ResultsError> {
    let entries: Entries =
        serde_json::from_slice(json).map_err(|e| ResultsError::MetricsJson(e.to_string()))?;
    let mut out = BTreeMap::new();
    for (key, value) in entries.0 {
        let bad = |message: String| ResultsError::MetricsKey {
            key: clean_name(&key),
            message,
        };
        if key.trim().is_empty() {
            return Err(bad("empty metric name".into()));
        }
        if key.chars().count() > MAX_NAME_CHARS || key.chars().any(char::is_control) {
            return Err(bad(format!(
                "metric names must be at most {MAX_NAME_CHARS} characters without control characters"
            )));
        }
        let n = match &value {
            serde_json::Value::Number(n) => n.as_f64(),
            serde_json::Value::Null => return Err(bad("null is not a number".into())),
            serde_json::Value::Bool(_) => return Err(bad("a boolean is not a number".into())),
            serde_json::Value::String(_) => {
                return Err(bad(
                    "a string is not a number (write 41.0, not \"41.0\")".into()
                ))
            }
            serde_json::Value::Array(_) => {
                return Err(bad("an array is not a number (one value per metric)".into()))
            }
            serde_json::Value::Object(_) => {
                return Err(bad(
                    "nested objects are not accepted; flatten the name (a_b: 1.0)".into(),
                ))
            }
        };
        let n = n
            .filter(|n| n.is_finite())
            .ok_or_else(|| bad("not a finite number".into()))?;
        if out.insert(key.clone(), n).is_some() {
            return Err(bad("duplicate key".into()));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::process::Command;

    // ---- read_report_file ----

    fn reports() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn reads_a_regular_file_in_a_subdirectory() {
        let d = reports();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/tests.xml"), b"<testsuites/>").unwrap();
        let got = read_report_file(d.path(), "sub/tests.xml", DEFAULT_MAX_REPORT_BYTES).unwrap();
        assert_eq!(got, b"<testsuites/>");
        let got = read_report_file(d.path(), "./sub/./tests.xml", 13).unwrap();
        assert_eq!(got.len(), 13);
    }

    #[test]
    fn refuses_bad_relative_paths() {
        let d = reports();
        for rel in ["", "/etc/passwd", "../x", "a/../../x", ".", "a\0b"] {
            let e = read_report_file(d.path(), rel, 100).unwrap_err();
            assert!(matches!(e, ResultsError::BadPath { .. }), "{rel:?}: {e}");
        }
    }

    #[test]
    fn missing_file_is_named() {
        let d = reports();
        let e = read_report_file(d.path(), "tests.xml", 100).unwrap_err();
        assert!(matches!(e, ResultsError::Missing { .. }), "{e}");
        assert!(e.to_string().contains("tests.xml"));
    }

    #[test]
    fn refuses_symlinks_in_any_component() {
        let d = reports();
        let outside = reports();
        std::fs::write(outside.path().join("secret"), b"key material").unwrap();
        std::fs::create_dir(outside.path().join("dir")).unwrap();
        std::fs::write(outside.path().join("dir/tests.xml"), b"x").unwrap();
        // final component
        symlink(outside.path().join("secret"), d.path().join("tests.xml")).unwrap();
        let e = read_report_file(d.path(), "tests.xml", 100).unwrap_err();
        assert!(matches!(e, ResultsError::Symlink { .. }), "{e}");
        // intermediate component
        symlink(outside.path().join("dir"), d.path().join("sub")).unwrap();
        let e = read_report_file(d.path(), "sub/tests.xml", 100).unwrap_err();
        assert!(
            matches!(&e, ResultsError::Symlink { component, .. } if component == "sub"),
            "{e}"
        );
        // a dangling link is still a link, not "missing"
        symlink("/nonexistent/nowhere", d.path().join("dangling")).unwrap();
        let e = read_report_file(d.path(), "dangling", 100).unwrap_err();
        assert!(matches!(e, ResultsError::Symlink { .. }), "{e}");
        // the reports directory itself replaced by a link
        let link_dir = d.path().join("reports-link");
        symlink(outside.path(), &link_dir).unwrap();
        let e = read_report_file(&link_dir, "secret", 100).unwrap_err();
        assert!(matches!(e, ResultsError::Symlink { .. }), "{e}");
    }

    #[test]
    fn refuses_fifos_directories_and_hard_links_without_blocking() {
        let d = reports();
        nix::unistd::mkfifo(&d.path().join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        let e = read_report_file(d.path(), "fifo", 100).unwrap_err();
        assert!(
            matches!(&e, ResultsError::WrongType { kind: "FIFO", .. }),
            "{e}"
        );
        std::fs::create_dir(d.path().join("dir")).unwrap();
        let e = read_report_file(d.path(), "dir", 100).unwrap_err();
        assert!(matches!(e, ResultsError::WrongType { .. }), "{e}");
        std::fs::write(d.path().join("file"), b"x").unwrap();
        let e = read_report_file(d.path(), "file/child", 100).unwrap_err();
        assert!(matches!(e, ResultsError::WrongType { .. }), "{e}");
        std::fs::hard_link(d.path().join("file"), d.path().join("file2")).unwrap();
        let e = read_report_file(d.path(), "file2", 100).unwrap_err();
        assert!(
            matches!(e, ResultsError::HardLinked { links: 2, .. }),
            "{e}"
        );
        let e = read_report_file(d.path(), "/dev/zero", 100).unwrap_err();
        assert!(matches!(e, ResultsError::BadPath { .. }), "{e}");
    }

    #[test]
    fn refuses_oversized_files() {
        let d = reports();
        std::fs::write(d.path().join("big"), vec![b'a'; 4097]).unwrap();
        let e = read_report_file(d.path(), "big", 4096).unwrap_err();
        assert!(
            matches!(
                e,
                ResultsError::TooLarge {
                    size: 4097,
                    max: 4096,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(read_report_file(d.path(), "big", 4097).unwrap().len(), 4097);
        // sparse 1 GiB file: refused from fstat, nothing is read
        let f = File::create(d.path().join("sparse")).unwrap();
        f.set_len(1 << 30).unwrap();
        let e = read_report_file(d.path(), "sparse", DEFAULT_MAX_REPORT_BYTES).unwrap_err();
        assert!(matches!(e, ResultsError::TooLarge { .. }), "{e}");
    }

    // ---- JUnit ----

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
        let o: Vec<_> = r
            .cases
            .iter()
            .map(|c| (c.name.as_str(), c.outcome))
            .collect();
        assert_eq!(
            o,
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

    // ---- TAP ----

    fn perl_tap(script: &str) -> Vec<u8> {
        let out = Command::new("perl")
            .args(["-MTest::More", "-e", script])
            .output()
            .expect("perl is on PATH");
        // prove reads stdout; Test::More's diagnostics go to stderr, merged here as `prove -v`
        // shows them.
        let mut v = out.stdout;
        v.extend_from_slice(&out.stderr);
        v
    }

    #[test]
    fn parses_real_test_more_output() {
        let tap = perl_tap(
            r#"ok(1, "adds"); is(2, 3, "subtracts");
               SKIP: { skip "no network", 1; ok(1, "fetches") }
               TODO: { local $TODO = "not yet"; ok(0, "flies") }
               ok(1, "hash # in name");
               subtest inner => sub { plan tests => 1; ok(1, "inner") };
               done_testing;"#,
        );
        let r = parse_tap(&tap).unwrap();
        let o: Vec<_> = r
            .cases
            .iter()
            .map(|c| (c.name.as_str(), c.outcome))
            .collect();
        assert_eq!(
            o,
            vec![
                ("adds", TestOutcome::Passed),
                ("subtracts", TestOutcome::Failed),
                ("test 3", TestOutcome::Skipped),
                ("flies", TestOutcome::Skipped),
                ("hash # in name", TestOutcome::Passed),
                ("inner", TestOutcome::Passed),
            ],
            "{}",
            String::from_utf8_lossy(&tap)
        );
        assert_eq!(r.cases[2].message.as_deref(), Some("SKIP: no network"));
        assert_eq!(
            r.cases[3].message.as_deref(),
            Some("TODO (expected failure): not yet")
        );
        assert_eq!((r.passed(), r.failed(), r.skipped()), (3, 1, 2));
    }

    #[test]
    fn test_more_failure_diagnostics_attach_to_the_failure() {
        // Test::More prints diagnostics to stderr; emitted in order via a single handle here.
        let tap = perl_tap(
            r#"Test::More->builder->failure_output(\*STDOUT); is(2, 3, "subtracts"); done_testing;"#,
        );
        let r = parse_tap(&tap).unwrap();
        assert_eq!(r.failed(), 1);
        let m = r.cases[0].message.as_deref().unwrap();
        assert!(m.contains("got: '2'") && m.contains("expected: '3'"), "{m}");
    }

    #[test]
    fn bail_out_and_plan_mismatches_are_failures() {
        let tap = perl_tap(r#"plan tests => 3; ok(1, "a"); BAIL_OUT("database gone");"#);
        let r = parse_tap(&tap).unwrap();
        assert_eq!(r.passed(), 1);
        let last = r.cases.last().unwrap();
        assert_eq!(
            (last.name.as_str(), last.outcome),
            (TAP_BAIL_CASE, TestOutcome::Error)
        );
        assert_eq!(last.message.as_deref(), Some("database gone"));

        // the planned count was not reached (process died part-way)
        let tap = perl_tap(r#"plan tests => 3; ok(1, "a"); exit 0;"#);
        let r = parse_tap(&tap).unwrap();
        assert_eq!(r.failed(), 1);
        assert_eq!(r.cases.last().unwrap().name, TAP_PLAN_CASE);
        assert!(r
            .cases
            .last()
            .unwrap()
            .message
            .as_deref()
            .unwrap()
            .contains("planned 3"));

        // no plan at all: a truncated stream
        let r = parse_tap(b"ok 1 - a\nok 2 - b\n").unwrap();
        assert_eq!((r.passed(), r.failed()), (2, 1));

        // skip-all plan: no cases, no failure
        let r = parse_tap(b"TAP version 14\n1..0 # SKIP no database\n").unwrap();
        assert!(r.cases.is_empty());

        // two plans
        let r = parse_tap(b"1..1\nok 1\n1..1\n").unwrap();
        assert_eq!(r.failed(), 1);
    }

    #[test]
    fn tap_edge_lines() {
        let r = parse_tap(
            b"TAP version 13\r\n1..4\r\nok\r\nokay this is not a test\r\nnot ok 2 # skip nope\r\nok 3 - x # TODO later\r\n  ---\r\n  message: yaml\r\n  ...\r\nok 4 - y # SKIPPED: slow\r\n",
        )
        .unwrap();
        let o: Vec<_> = r
            .cases
            .iter()
            .map(|c| (c.name.as_str(), c.outcome))
            .collect();
        assert_eq!(
            o,
            vec![
                ("test 1", TestOutcome::Passed),
                ("test 2", TestOutcome::Failed),
                ("x", TestOutcome::Passed),
                ("y", TestOutcome::Skipped),
            ]
        );
        assert_eq!(r.cases[3].message.as_deref(), Some("SKIP: slow"));
        assert!(parse_tap(b"").is_err());
        assert!(parse_tap(b"hello\nworld\n").is_err());
        assert!(parse_tap(b"TAP version 99\n1..0\n").is_err());
        // non-UTF-8 descriptions are kept lossily, control characters neutralised
        let r = parse_tap(b"1..1\nok 1 - caf\xe9 \x1b[2J\n").unwrap();
        assert!(!r.cases[0].name.contains('\x1b'));
        assert!(r.cases[0].name.starts_with("caf"));
    }

    #[test]
    fn tap_caps_case_count() {
        let mut s = String::from("1..999999\n");
        for _ in 0..=MAX_TEST_CASES {
            s.push_str("ok\n");
        }
        assert!(matches!(
            parse_tap(s.as_bytes()),
            Err(ResultsError::Tap { .. })
        ));
    }

    // ---- metrics ----

    #[test]
    fn parses_flat_metrics() {
        let m = parse_metrics(br#"{"p99_ms": 41.0, "compressed_bytes": 123456, "ratio": -0.5e-3}"#)
            .unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m["p99_ms"], 41.0);
        assert_eq!(m["compressed_bytes"], 123456.0);
        assert_eq!(m["ratio"], -0.0005);
        assert!(parse_metrics(b"{}").unwrap().is_empty());
    }

    #[test]
    fn metric_errors_name_the_key() {
        let cases: &[(&[u8], &str)] = &[
            (br#"{"a": 1, "p99": "41"}"#, "p99"),
            (br#"{"nested": {"x": 1}}"#, "nested"),
            (br#"{"n": null}"#, "n"),
            (br#"{"b": true}"#, "b"),
            (br#"{"l": [1]}"#, "l"),
            (br#"{"d": 1, "d": 2}"#, "d"),
            (br#"{"": 1}"#, ""),
        ];
        for (json, key) in cases {
            match parse_metrics(json) {
                Err(ResultsError::MetricsKey { key: k, .. }) => assert_eq!(&k, key),
                other => panic!("{}: {other:?}", String::from_utf8_lossy(json)),
            }
        }
        for json in [
            &b"[1,2]"[..],
            b"42",
            b"{\"a\": 1e400}",
            b"{\"a\": 1",
            b"",
            b"{\"a\":1} x",
        ] {
            let e = parse_metrics(json).unwrap_err();
            assert!(
                matches!(e, ResultsError::MetricsJson(_)),
                "{}: {e}",
                String::from_utf8_lossy(json)
            );
        }
        // deep nesting hits serde_json's recursion limit, not the stack
        let deep = format!("{{\"a\": {}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse_metrics(deep.as_bytes()).is_err());
    }
}
