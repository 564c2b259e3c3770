//! A strict unified-diff parser for git-style and plain diffs.
//!
//! Accepts what `git diff` / `git format-patch` and `diff -u` produce: many files per
//! patch; `a/`/`b/` prefixes and `/dev/null`; new and deleted files; mode changes;
//! renames and copies; `Binary files … differ` and `GIT binary patch` (marked binary,
//! never decoded); hunks with exact lines and `\ No newline at end of file`.
//!
//! Strictness: every hunk body must hold exactly the lines its header counts, hunks of
//! a file must be in order and may not overlap, and anything between files that is not
//! a header is an error (text before the first file and a format-patch signature after
//! the last one are allowed). Errors name the 1-based line of the patch and what was
//! expected there.

use thiserror::Error;

/// A malformed patch: the 1-based line of the patch and what was wrong there.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("patch line {line}: {message}")]
pub struct PatchError {
    /// 1-based line number in the patch text.
    pub line: usize,
    /// What was expected and what was found.
    pub message: String,
}

/// A parsed patch: the file changes in the order the patch lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patch {
    pub files: Vec<FilePatch>,
}

/// What a file entry does to its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Changes an existing file in place (content and/or mode).
    Modify,
    /// Creates `new_path`.
    Create,
    /// Deletes `old_path`.
    Delete,
    /// Moves `old_path` to `new_path` (possibly with hunks).
    Rename,
    /// Copies `old_path` to `new_path` (possibly with hunks).
    Copy,
}

/// One file's entry in a patch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePatch {
    /// The path before the change, prefix (`a/`) stripped; `None` for `/dev/null`.
    pub old_path: Option<String>,
    /// The path after the change, prefix (`b/`) stripped; `None` for `/dev/null`.
    pub new_path: Option<String>,
    pub kind: ChangeKind,
    /// The file's mode before the change (from `old mode`, `deleted file mode` or `index`).
    pub old_mode: Option<u32>,
    /// The file's mode after the change (from `new mode`, `new file mode` or `index`).
    pub new_mode: Option<u32>,
    /// A `Binary files … differ` or `GIT binary patch` entry: there are no text hunks.
    pub binary: bool,
    /// `similarity index N%` of a rename or copy.
    pub similarity: Option<u8>,
    pub hunks: Vec<Hunk>,
    /// 1-based line of this entry's first header line in the patch.
    pub line: usize,
}

/// One `@@ -a,b +c,d @@` hunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk {
    pub old_start: u32,
    pub old_count: u32,
    pub new_start: u32,
    pub new_count: u32,
    /// The text after the closing `@@` (git's function context), without the space.
    pub section: String,
    pub lines: Vec<HunkLine>,
    /// 1-based line of the `@@` header in the patch.
    pub line: usize,
}

/// Whether a hunk line is kept, added or removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    Context,
    Add,
    Remove,
}

/// One line of a hunk body: its kind, its exact bytes (without the leading marker and
/// the newline) and whether it is the last line of a file without a final newline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HunkLine {
    pub kind: LineKind,
    pub text: Vec<u8>,
    pub no_newline: bool,
}

impl Patch {
    /// Parses a patch; see the module documentation for what is accepted.
    pub fn parse(raw: &[u8]) -> Result<Patch, PatchError> {
        parse(raw)
    }

    /// Lines added over all files.
    pub fn insertions(&self) -> usize {
        self.files
            .iter()
            .flat_map(|f| &f.hunks)
            .map(Hunk::insertions)
            .sum()
    }

    /// Lines removed over all files.
    pub fn deletions(&self) -> usize {
        self.files
            .iter()
            .flat_map(|f| &f.hunks)
            .map(Hunk::deletions)
            .sum()
    }
}

impl FilePatch {
    /// The path this entry leaves behind (the new path, or the old one for a deletion).
    pub fn path(&self) -> &str {
        self.new_path
            .as_deref()
            .or(self.old_path.as_deref())
            .unwrap_or_default()
    }

    /// Every path this entry names (old and new, without duplicates).
    pub fn paths(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::with_capacity(2);
        for p in [self.old_path.as_deref(), self.new_path.as_deref()]
            .into_iter()
            .flatten()
        {
            if !out.contains(&p) {
                out.push(p);
            }
        }
        out
    }
}

impl Hunk {
    pub fn insertions(&self) -> usize {
        self.lines
            .iter()
            .filter(|l| l.kind == LineKind::Add)
            .count()
    }

    pub fn deletions(&self) -> usize {
        self.lines
            .iter()
            .filter(|l| l.kind == LineKind::Remove)
            .count()
    }
}

/// Parses a unified diff (see the module documentation).
pub fn parse(raw: &[u8]) -> Result<Patch, PatchError> {
    let lines = split_lines(raw);
    let mut p = Parser { lines, i: 0 };
    p.parse()
}

fn split_lines(raw: &[u8]) -> Vec<&[u8]> {
    let mut lines: Vec<&[u8]> = raw.split(|&b| b == b'\n').collect();
    if raw.ends_with(b"\n") || raw.is_empty() {
        lines.pop();
    }
    lines
}

fn err<T>(line: usize, message: impl Into<String>) -> Result<T, PatchError> {
    Err(PatchError {
        line,
        message: message.into(),
    })
}

/// Shows a patch line in an error message (lossy, shortened).
fn show(line: &[u8]) -> String {
    let s = String::from_utf8_lossy(line);
    let mut out: String = s.chars().take(80).collect();
    if s.chars().count() > 80 {
        out.push('…');
    }
    format!("`{out}`")
}

struct Parser<'a> {
    lines: Vec<&'a [u8]>,
    i: usize,
}

/// The header lines of a git entry, before hunks.
#[derive(Default)]
struct GitHeader {
    names: Option<(String, String)>,
    old_mode: Option<u32>,
    new_mode: Option<u32>,
    deleted_mode: Option<u32>,
    created_mode: Option<u32>,
    index_mode: Option<u32>,
    rename_from: Option<String>,
    rename_to: Option<String>,
    copy_from: Option<String>,
    copy_to: Option<String>,
    similarity: Option<u8>,
    binary: bool,
    minus: Option<Option<String>>,
    plus: Option<Option<String>>,
}

impl<'a> Parser<'a> {
    fn line(&self) -> Option<&'a [u8]> {
        self.lines.get(self.i).copied()
    }

    /// 1-based number of the current line.
    fn lineno(&self) -> usize {
        self.i + 1
    }

    fn parse(&mut self) -> Result<Patch, PatchError> {
        // Text before the first file (a commit message, an email header) is allowed.
        while let Some(l) = self.line() {
            if self.starts_file(l) {
                break;
            }
            self.i += 1;
        }
        if self.line().is_none() {
            return err(
                self.lines.len().max(1),
                "no file changes found: expected a `diff --git a/… b/…` header or a \
                 `--- old` / `+++ new` pair followed by `@@` hunks",
            );
        }
        let mut files = Vec::new();
        while let Some(l) = self.line() {
            if l.starts_with(b"diff --git ") {
                files.push(self.git_file()?);
            } else if l.starts_with(b"--- ") {
                files.push(self.plain_file()?);
            } else if l.starts_with(b"Binary files ") && l.ends_with(b" differ") {
                files.push(self.plain_binary(l)?);
            } else if is_plain_noise(l) {
                self.i += 1;
            } else if l == b"-- " {
                // format-patch signature: the rest is the version trailer.
                break;
            } else if self.lines[self.i..].iter().all(|l| l.is_empty()) {
                break;
            } else if l.starts_with(b"@@ ") {
                return err(
                    self.lineno(),
                    "hunk header outside a file: the previous hunk's header counts \
                     fewer lines than its body has, or a `---`/`+++` pair is missing",
                );
            } else {
                return err(
                    self.lineno(),
                    format!(
                        "expected a file header (`diff --git …` or `--- …`), a hunk \
                         (`@@ …`) or the end of the patch, found {}",
                        show(l)
                    ),
                );
            }
        }
        if files.is_empty() {
            return err(self.lineno(), "no file changes found in the patch");
        }
        Ok(Patch { files })
    }

    fn starts_file(&self, l: &[u8]) -> bool {
        if l.starts_with(b"diff --git ") {
            return true;
        }
        l.starts_with(b"--- ")
            && self
                .lines
                .get(self.i + 1)
                .is_some_and(|n| n.starts_with(b"+++ "))
            && self
                .lines
                .get(self.i + 2)
                .is_some_and(|n| n.starts_with(b"@@ "))
    }

    fn git_file(&mut self) -> Result<FilePatch, PatchError> {
        let start = self.lineno();
        let header = self.lines[self.i];
        let names = git_header_names(&header[b"diff --git ".len()..], start)?;
        let mut h = GitHeader {
            names,
            ..GitHeader::default()
        };
        self.i += 1;
        while let Some(l) = self.line() {
            let n = self.lineno();
            if let Some(rest) = l.strip_prefix(b"old mode ") {
                h.old_mode = Some(mode(rest, n)?);
            } else if let Some(rest) = l.strip_prefix(b"new mode ") {
                h.new_mode = Some(mode(rest, n)?);
            } else if let Some(rest) = l.strip_prefix(b"deleted file mode ") {
                h.deleted_mode = Some(mode(rest, n)?);
            } else if let Some(rest) = l.strip_prefix(b"new file mode ") {
                h.created_mode = Some(mode(rest, n)?);
            } else if let Some(rest) = l.strip_prefix(b"rename from ") {
                h.rename_from = Some(path_text(rest, n)?);
            } else if let Some(rest) = l.strip_prefix(b"rename to ") {
                h.rename_to = Some(path_text(rest, n)?);
            } else if let Some(rest) = l.strip_prefix(b"copy from ") {
                h.copy_from = Some(path_text(rest, n)?);
            } else if let Some(rest) = l.strip_prefix(b"copy to ") {
                h.copy_to = Some(path_text(rest, n)?);
            } else if let Some(rest) = l.strip_prefix(b"similarity index ") {
                h.similarity = Some(percent(rest, n)?);
            } else if let Some(rest) = l.strip_prefix(b"dissimilarity index ") {
                percent(rest, n)?;
            } else if let Some(rest) = l.strip_prefix(b"index ") {
                h.index_mode = index_line(rest, n)?;
            } else if l.starts_with(b"Binary files ") && l.ends_with(b" differ") {
                h.binary = true;
                self.i += 1;
                break;
            } else if l == b"GIT binary patch" {
                h.binary = true;
                self.i += 1;
                self.skip_binary_data()?;
                break;
            } else if l.starts_with(b"--- ") {
                h.minus = Some(self.marker_path(b"--- ")?);
                self.i += 1;
                match self.line() {
                    Some(p) if p.starts_with(b"+++ ") => {
                        h.plus = Some(self.marker_path(b"+++ ")?);
                        self.i += 1;
                    }
                    other => {
                        return err(
                            self.lineno(),
                            format!(
                                "expected `+++ b/…` after the `---` line, found {}",
                                other
                                    .map(show)
                                    .unwrap_or_else(|| "the end of the patch".into())
                            ),
                        )
                    }
                }
                break;
            } else if l.starts_with(b"@@ ") {
                return err(
                    n,
                    "hunk without `--- a/…` and `+++ b/…` lines: the file header is incomplete",
                );
            } else {
                // Any other line ends this entry's header (the next file, or garbage
                // that the main loop reports).
                break;
            }
            self.i += 1;
        }
        let hunks = if h.plus.is_some() {
            self.hunks()?
        } else {
            Vec::new()
        };
        build_git_file(h, hunks, start)
    }

    /// Reads a `--- ` or `+++ ` line's path (`None` for /dev/null).
    fn marker_path(&self, prefix: &[u8]) -> Result<Option<String>, PatchError> {
        let l = self.lines[self.i];
        let rest = &l[prefix.len()..];
        marker_name(rest, self.lineno())
    }

    fn skip_binary_data(&mut self) -> Result<(), PatchError> {
        let mut blocks = 0;
        while let Some(l) = self.line() {
            if l.starts_with(b"literal ") || l.starts_with(b"delta ") {
                let digits = l.splitn(2, |&b| b == b' ').nth(1).unwrap_or_default();
                if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                    return err(
                        self.lineno(),
                        format!("expected `literal N` or `delta N`, found {}", show(l)),
                    );
                }
                blocks += 1;
            } else if l.is_empty() {
                // separates the forward and reverse blocks
            } else if l[0].is_ascii_alphabetic() && is_base85_line(&l[1..]) {
                if blocks == 0 {
                    return err(self.lineno(), "binary data before `literal N`/`delta N`");
                }
            } else {
                break;
            }
            self.i += 1;
        }
        if blocks == 0 {
            return err(
                self.lineno(),
                "`GIT binary patch` must be followed by a `literal N` or `delta N` block",
            );
        }
        Ok(())
    }

    fn plain_file(&mut self) -> Result<FilePatch, PatchError> {
        let start = self.lineno();
        let old = self.marker_path(b"--- ")?;
        self.i += 1;
        let new = match self.line() {
            Some(l) if l.starts_with(b"+++ ") => self.marker_path(b"+++ ")?,
            other => {
                return err(
                    self.lineno(),
                    format!(
                        "expected `+++ new-path` after the `---` line, found {}",
                        other
                            .map(show)
                            .unwrap_or_else(|| "the end of the patch".into())
                    ),
                )
            }
        };
        self.i += 1;
        let hunks = self.hunks()?;
        if hunks.is_empty() {
            return err(
                self.lineno(),
                "expected a hunk (`@@ -start,count +start,count @@`) after the `+++` line",
            );
        }
        let kind = match (&old, &new) {
            (None, None) => return err(start, "both `---` and `+++` are /dev/null"),
            (None, Some(_)) => ChangeKind::Create,
            (Some(_), None) => ChangeKind::Delete,
            (Some(_), Some(_)) => ChangeKind::Modify,
        };
        let file = FilePatch {
            old_path: old,
            new_path: new,
            kind,
            old_mode: None,
            new_mode: None,
            binary: false,
            similarity: None,
            hunks,
            line: start,
        };
        check_hunks(&file)?;
        Ok(file)
    }

    fn plain_binary(&mut self, l: &[u8]) -> Result<FilePatch, PatchError> {
        let start = self.lineno();
        let inner = &l[b"Binary files ".len()..l.len() - b" differ".len()];
        let Some(pos) = find(inner, b" and ") else {
            return err(start, "expected `Binary files OLD and NEW differ`");
        };
        let old = marker_name(&inner[..pos], start)?;
        let new = marker_name(&inner[pos + 5..], start)?;
        self.i += 1;
        let kind = match (&old, &new) {
            (None, None) => return err(start, "both sides of `Binary files` are /dev/null"),
            (None, Some(_)) => ChangeKind::Create,
            (Some(_), None) => ChangeKind::Delete,
            _ => ChangeKind::Modify,
        };
        Ok(FilePatch {
            old_path: old,
            new_path: new,
            kind,
            old_mode: None,
            new_mode: None,
            binary: true,
            similarity: None,
            hunks: Vec::new(),
            line: start,
        })
    }

    fn hunks(&mut self) -> Result<Vec<Hunk>, PatchError> {
        let mut hunks = Vec::new();
        while let Some(l) = self.line() {
            if !l.starts_with(b"@@ ") {
                break;
            }
            hunks.push(self.hunk()?);
        }
        Ok(hunks)
    }

    fn hunk(&mut self) -> Result<Hunk, PatchError> {
        let start = self.lineno();
        let (old_start, old_count, new_start, new_count, section) =
            hunk_header(self.lines[self.i], start)?;
        self.i += 1;
        let (mut old_left, mut new_left) = (old_count, new_count);
        let mut lines: Vec<HunkLine> = Vec::new();
        loop {
            let line = self.line();
            // A no-newline marker belongs to the line before it, even after the counts
            // are complete.
            if let Some(l) = line {
                if l.starts_with(b"\\") {
                    let Some(prev) = lines.last_mut() else {
                        return err(
                            self.lineno(),
                            "`\\ No newline at end of file` must follow a hunk line",
                        );
                    };
                    if prev.no_newline {
                        return err(self.lineno(), "repeated `\\ No newline at end of file`");
                    }
                    prev.no_newline = true;
                    self.i += 1;
                    continue;
                }
            }
            if old_left == 0 && new_left == 0 {
                break;
            }
            let promise = || {
                format!(
                    "the hunk at line {start} promises {old_count} old and {new_count} new \
                     lines but its body ends early ({} old and {} new missing)",
                    old_left, new_left
                )
            };
            let Some(l) = line else {
                return err(
                    self.lineno(),
                    format!("{}: unexpected end of the patch", promise()),
                );
            };
            let (kind, text) = match l.first() {
                Some(b' ') => (LineKind::Context, &l[1..]),
                Some(b'-') => (LineKind::Remove, &l[1..]),
                Some(b'+') => (LineKind::Add, &l[1..]),
                // Some tools strip the space of an empty context line.
                None => (LineKind::Context, l),
                Some(_) => {
                    return err(
                        self.lineno(),
                        format!(
                            "{}: expected a line starting with ' ', '-', '+' or '\\', found {}",
                            promise(),
                            show(l)
                        ),
                    )
                }
            };
            let (needs_old, needs_new) = match kind {
                LineKind::Context => (true, true),
                LineKind::Remove => (true, false),
                LineKind::Add => (false, true),
            };
            if (needs_old && old_left == 0) || (needs_new && new_left == 0) {
                return err(
                    self.lineno(),
                    format!(
                        "the hunk at line {start} (-{old_start},{old_count} +{new_start},{new_count}) \
                         has more {} lines than its header counts: {}",
                        if needs_old && old_left == 0 { "old" } else { "new" },
                        show(l)
                    ),
                );
            }
            if needs_old {
                old_left -= 1;
            }
            if needs_new {
                new_left -= 1;
            }
            lines.push(HunkLine {
                kind,
                text: text.to_vec(),
                no_newline: false,
            });
            self.i += 1;
        }
        check_no_newline(&lines, start)?;
        Ok(Hunk {
            old_start,
            old_count,
            new_start,
            new_count,
            section,
            lines,
            line: start,
        })
    }
}

/// Only the last line of each side (old: context + removed; new: context + added) may
/// lack a final newline.
fn check_no_newline(lines: &[HunkLine], hunk_line: usize) -> Result<(), PatchError> {
    for side in [LineKind::Remove, LineKind::Add] {
        let on_side: Vec<&HunkLine> = lines
            .iter()
            .filter(|l| l.kind == LineKind::Context || l.kind == side)
            .collect();
        if let Some(pos) = on_side.iter().position(|l| l.no_newline) {
            if pos + 1 != on_side.len() {
                return err(
                    hunk_line,
                    "`\\ No newline at end of file` marks a line that is not the last \
                     of its side of the hunk",
                );
            }
        }
    }
    Ok(())
}

fn is_plain_noise(l: &[u8]) -> bool {
    (l.starts_with(b"diff ") && !l.starts_with(b"diff --git "))
        || l.starts_with(b"Index: ")
        || l.starts_with(b"Only in ")
        || (l.len() >= 10 && l.iter().all(|&b| b == b'='))
}

fn is_base85_line(data: &[u8]) -> bool {
    !data.is_empty()
        && data.len() % 5 == 0
        && data
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&()*+-;<=>?@^_`{|}~".contains(&b))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn utf8(bytes: &[u8], line: usize) -> Result<String, PatchError> {
    String::from_utf8(bytes.to_vec()).or_else(|_| err(line, "a path is not valid UTF-8"))
}

/// Decodes a C-style quoted name (`"a/tab\there"`), returning it and the rest after
/// the closing quote.
fn unquote(s: &[u8], line: usize) -> Result<(Vec<u8>, &[u8]), PatchError> {
    debug_assert!(s.first() == Some(&b'"'));
    let mut out = Vec::new();
    let mut i = 1;
    while i < s.len() {
        match s[i] {
            b'"' => return Ok((out, &s[i + 1..])),
            b'\\' => {
                let Some(&c) = s.get(i + 1) else { break };
                let simple = match c {
                    b'a' => Some(7),
                    b'b' => Some(8),
                    b't' => Some(b'\t'),
                    b'n' => Some(b'\n'),
                    b'v' => Some(11),
                    b'f' => Some(12),
                    b'r' => Some(b'\r'),
                    b'"' => Some(b'"'),
                    b'\\' => Some(b'\\'),
                    _ => None,
                };
                if let Some(b) = simple {
                    out.push(b);
                    i += 2;
                } else if s.len() >= i + 4
                    && s[i + 1..i + 4].iter().all(|d| (b'0'..=b'7').contains(d))
                {
                    let v = s[i + 1..i + 4]
                        .iter()
                        .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                    let Ok(b) = u8::try_from(v) else {
                        return err(line, "octal escape out of range in a quoted path");
                    };
                    out.push(b);
                    i += 4;
                } else {
                    return err(line, "unknown escape in a quoted path");
                }
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    err(line, "unterminated quoted path (missing closing `\"`)")
}

/// A path as written in `rename from`/`copy to` lines (no prefix to strip).
fn path_text(rest: &[u8], line: usize) -> Result<String, PatchError> {
    let bytes = if rest.first() == Some(&b'"') {
        let (name, tail) = unquote(rest, line)?;
        if !tail.is_empty() {
            return err(line, "unexpected text after a quoted path");
        }
        name
    } else {
        rest.to_vec()
    };
    if bytes.is_empty() {
        return err(line, "empty path");
    }
    utf8(&bytes, line)
}

/// A `--- `/`+++ `/`Binary files` name: quoted or cut at a tab; `/dev/null` is `None`;
/// otherwise the first path component (the `a/` prefix) is stripped.
fn marker_name(rest: &[u8], line: usize) -> Result<Option<String>, PatchError> {
    let bytes = if rest.first() == Some(&b'"') {
        unquote(rest, line)?.0
    } else {
        let end = rest.iter().position(|&b| b == b'\t').unwrap_or(rest.len());
        rest[..end].to_vec()
    };
    if bytes.is_empty() {
        return err(line, "empty path after `---`/`+++`");
    }
    if bytes == b"/dev/null" {
        return Ok(None);
    }
    Ok(Some(strip_prefix(&utf8(&bytes, line)?)))
}

/// Strips the first component (`a/`, `b/`, `old/`) as `git apply -p1` does. Absolute
/// paths and paths starting with `..` are kept whole so the gates can see them.
pub fn strip_prefix(path: &str) -> String {
    if path.starts_with('/') {
        return path.to_string();
    }
    match path.split_once('/') {
        Some(("..", _)) | None => path.to_string(),
        Some((_, rest)) => rest.to_string(),
    }
}

/// The two names of `diff --git A B` when they can be told apart, prefixes stripped.
fn git_header_names(rest: &[u8], line: usize) -> Result<Option<(String, String)>, PatchError> {
    if rest.first() == Some(&b'"') {
        let (a, tail) = unquote(rest, line)?;
        let Some(tail) = tail.strip_prefix(b" ") else {
            return err(
                line,
                "expected a space between the two names of `diff --git`",
            );
        };
        let b = if tail.first() == Some(&b'"') {
            unquote(tail, line)?.0
        } else {
            tail.to_vec()
        };
        return Ok(Some((
            strip_prefix(&utf8(&a, line)?),
            strip_prefix(&utf8(&b, line)?),
        )));
    }
    if let Some(q) = find(rest, b" \"") {
        let (b, _) = unquote(&rest[q + 1..], line)?;
        return Ok(Some((
            strip_prefix(&utf8(&rest[..q], line)?),
            strip_prefix(&utf8(&b, line)?),
        )));
    }
    let text = utf8(rest, line)?;
    // Unquoted names may contain spaces: pick the split where both names agree.
    let spaces: Vec<usize> = text.match_indices(' ').map(|(i, _)| i).collect();
    for &sp in &spaces {
        let (a, b) = (strip_prefix(&text[..sp]), strip_prefix(&text[sp + 1..]));
        if a == b {
            return Ok(Some((a, b)));
        }
    }
    if spaces.len() == 1 {
        let sp = spaces[0];
        return Ok(Some((
            strip_prefix(&text[..sp]),
            strip_prefix(&text[sp + 1..]),
        )));
    }
    Ok(None)
}

fn mode(rest: &[u8], line: usize) -> Result<u32, PatchError> {
    let s = std::str::from_utf8(rest).unwrap_or_default();
    if s.len() < 6 || s.len() > 7 || !s.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return err(
            line,
            format!(
                "expected an octal file mode like 100644, found {}",
                show(rest)
            ),
        );
    }
    u32::from_str_radix(s, 8).or_else(|_| err(line, "file mode out of range"))
}

fn percent(rest: &[u8], line: usize) -> Result<u8, PatchError> {
    let s = std::str::from_utf8(rest).unwrap_or_default();
    match s.strip_suffix('%').and_then(|n| n.parse::<u8>().ok()) {
        Some(n) if n <= 100 => Ok(n),
        _ => err(
            line,
            format!("expected a percentage like 95%, found {}", show(rest)),
        ),
    }
}

/// `index abc123..def456[ mode]`: returns the mode when present.
fn index_line(rest: &[u8], line: usize) -> Result<Option<u32>, PatchError> {
    let s = std::str::from_utf8(rest).unwrap_or_default();
    let mut parts = s.split(' ');
    let ids = parts.next().unwrap_or_default();
    let ok_ids = ids.split_once("..").is_some_and(|(a, b)| {
        !a.is_empty()
            && !b.is_empty()
            && a.bytes().all(|c| c.is_ascii_hexdigit())
            && b.bytes().all(|c| c.is_ascii_hexdigit())
    });
    if !ok_ids {
        return err(
            line,
            format!("expected `index OLD..NEW [mode]`, found {}", show(rest)),
        );
    }
    match (parts.next(), parts.next()) {
        (None, _) => Ok(None),
        (Some(m), None) => mode(m.as_bytes(), line).map(Some),
        _ => err(
            line,
            format!("unexpected text in the index line: {}", show(rest)),
        ),
    }
}

type HunkHeader = (u32, u32, u32, u32, String);

fn hunk_header(l: &[u8], line: usize) -> Result<HunkHeader, PatchError> {
    let bad = || {
        err(
            line,
            format!(
                "malformed hunk header {}: expected `@@ -start[,count] +start[,count] @@`",
                show(l)
            ),
        )
    };
    let Ok(s) = std::str::from_utf8(l) else {
        return bad();
    };
    let Some(rest) = s.strip_prefix("@@ -") else {
        return bad();
    };
    let Some((ranges, after)) = rest.split_once(" @@") else {
        return bad();
    };
    let Some((old, new)) = ranges.split_once(" +") else {
        return bad();
    };
    let (Some((os, oc)), Some((ns, nc))) = (range(old), range(new)) else {
        return bad();
    };
    let section = match after.strip_prefix(' ') {
        Some(sec) => sec.to_string(),
        None if after.is_empty() => String::new(),
        None => return bad(),
    };
    if (oc > 0 && os == 0) || (nc > 0 && ns == 0) {
        return err(
            line,
            format!(
                "hunk header {}: a range with lines cannot start at line 0",
                show(l)
            ),
        );
    }
    Ok((os, oc, ns, nc, section))
}

fn range(s: &str) -> Option<(u32, u32)> {
    let num = |t: &str| -> Option<u32> {
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    };
    match s.split_once(',') {
        Some((a, b)) => Some((num(a)?, num(b)?)),
        None => Some((num(s)?, 1)),
    }
}

/// Hunks in order, not overlapping, and consistent with creation/deletion.
fn check_hunks(file: &FilePatch) -> Result<(), PatchError> {
    let mut prev_end: Option<(u32, usize)> = None;
    for h in &file.hunks {
        let begin = if h.old_count == 0 {
            h.old_start
        } else {
            h.old_start - 1
        };
        if let Some((end, at)) = prev_end {
            if begin < end {
                return err(
                    h.line,
                    format!(
                        "hunks of {} overlap or are out of order (this hunk starts at old \
                         line {} but the hunk at line {at} ends at old line {end})",
                        file.path(),
                        h.old_start
                    ),
                );
            }
        }
        prev_end = Some((begin + h.old_count, h.line));
        if file.kind == ChangeKind::Create && h.old_count != 0 {
            return err(
                h.line,
                format!("new file {} has a hunk with old lines", file.path()),
            );
        }
        if file.kind == ChangeKind::Delete && h.new_count != 0 {
            return err(
                h.line,
                format!("deleted file {} has a hunk with new lines", file.path()),
            );
        }
    }
    Ok(())
}

fn build_git_file(h: GitHeader, hunks: Vec<Hunk>, start: usize) -> Result<FilePatch, PatchError> {
    let renamed = h.rename_from.is_some() || h.rename_to.is_some();
    let copied = h.copy_from.is_some() || h.copy_to.is_some();
    let kind = match (
        h.created_mode.is_some(),
        h.deleted_mode.is_some(),
        renamed,
        copied,
    ) {
        (false, false, false, false) => ChangeKind::Modify,
        (true, false, false, false) => ChangeKind::Create,
        (false, true, false, false) => ChangeKind::Delete,
        (false, false, true, false) => ChangeKind::Rename,
        (false, false, false, true) => ChangeKind::Copy,
        _ => {
            return err(
                start,
                "conflicting headers: a file entry can be only one of new, deleted, renamed \
                 or copied",
            )
        }
    };
    let (from, to) = match kind {
        ChangeKind::Rename => (h.rename_from.clone(), h.rename_to.clone()),
        ChangeKind::Copy => (h.copy_from.clone(), h.copy_to.clone()),
        _ => (None, None),
    };
    if matches!(kind, ChangeKind::Rename | ChangeKind::Copy) && (from.is_none() || to.is_none()) {
        return err(
            start,
            "a rename or copy needs both its `from` and `to` lines",
        );
    }
    // The names the header gives (rename/copy lines, else `diff --git a/X b/Y`).
    let (hdr_old, hdr_new) = match kind {
        ChangeKind::Rename | ChangeKind::Copy => (from, to),
        _ => (
            h.names.as_ref().map(|n| n.0.clone()),
            h.names.as_ref().map(|n| n.1.clone()),
        ),
    };
    // The ---/+++ lines must agree with the entry's kind and with the header's names.
    if let Some(minus) = &h.minus {
        match (minus, kind) {
            (Some(m), ChangeKind::Create) => {
                return err(
                    start,
                    format!("new file, but the `---` line names {m} instead of /dev/null"),
                )
            }
            (None, k) if k != ChangeKind::Create => {
                return err(
                    start,
                    "the `---` line is /dev/null but the header does not say `new file mode`",
                )
            }
            (Some(m), _) => {
                if let Some(hd) = hdr_old.as_ref().filter(|hd| *hd != m) {
                    return err(
                        start,
                        format!("inconsistent old name: the `---` line says {m} but the header says {hd}"),
                    );
                }
            }
            _ => {}
        }
    }
    if let Some(plus) = &h.plus {
        match (plus, kind) {
            (Some(p), ChangeKind::Delete) => {
                return err(
                    start,
                    format!("deleted file, but the `+++` line names {p} instead of /dev/null"),
                )
            }
            (None, k) if k != ChangeKind::Delete => {
                return err(
                    start,
                    "the `+++` line is /dev/null but the header does not say `deleted file mode`",
                )
            }
            (Some(p), _) => {
                if let Some(hd) = hdr_new.as_ref().filter(|hd| *hd != p) {
                    return err(
                        start,
                        format!("inconsistent new name: the `+++` line says {p} but the header says {hd}"),
                    );
                }
            }
            _ => {}
        }
    }
    let old_path = match kind {
        ChangeKind::Create => None,
        _ => h.minus.clone().flatten().or(hdr_old),
    };
    let new_path = match kind {
        ChangeKind::Delete => None,
        _ => h.plus.clone().flatten().or(hdr_new),
    };
    if kind == ChangeKind::Modify {
        match (&old_path, &new_path) {
            (Some(a), Some(b)) if a == b => {}
            (Some(a), Some(b)) => {
                return err(
                    start,
                    format!(
                    "old name {a} and new name {b} differ without `rename from`/`rename to` lines"
                ),
                )
            }
            _ => return err(
                start,
                "cannot tell the file's name from `diff --git`: add `--- a/…` and `+++ b/…` lines",
            ),
        }
    }
    if kind == ChangeKind::Create && new_path.is_none() {
        return err(start, "new file without a name");
    }
    if kind == ChangeKind::Delete && old_path.is_none() {
        return err(start, "deleted file without a name");
    }
    let old_mode = h.old_mode.or(h.deleted_mode).or(match kind {
        ChangeKind::Create => None,
        _ => h.index_mode,
    });
    let new_mode = h.new_mode.or(h.created_mode).or(match kind {
        ChangeKind::Delete => None,
        _ => h.index_mode,
    });
    let changes_something = !hunks.is_empty()
        || h.binary
        || kind != ChangeKind::Modify
        || (h.old_mode.is_some() && h.new_mode.is_some());
    if !changes_something {
        return err(
            start,
            format!(
                "the entry for {} changes nothing: expected hunks, a mode change, a rename, \
                 or a new/deleted file",
                new_path.as_deref().unwrap_or_default()
            ),
        );
    }
    if h.binary && !hunks.is_empty() {
        return err(start, "a binary entry cannot also have text hunks");
    }
    let file = FilePatch {
        old_path,
        new_path,
        kind,
        old_mode,
        new_mode,
        binary: h.binary,
        similarity: h.similarity,
        hunks,
        line: start,
    };
    check_hunks(&file)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(name: &str) -> Vec<u8> {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/patches")
            .join(name);
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    fn parse_ok(raw: &[u8]) -> Patch {
        parse(raw).unwrap_or_else(|e| panic!("{e}"))
    }

    fn parse_err(raw: &str) -> PatchError {
        parse(raw.as_bytes()).expect_err("the patch should be rejected")
    }

    #[test]
    fn swap_compressor_fixture() {
        let p = parse_ok(&fixture("swap-compressor.diff"));
        assert_eq!(p.files.len(), 1);
        let f = &p.files[0];
        assert_eq!(f.kind, ChangeKind::Modify);
        assert_eq!(f.old_path.as_deref(), Some("hermes/compressor.py"));
        assert_eq!(f.new_path.as_deref(), Some("hermes/compressor.py"));
        assert_eq!(f.old_mode, Some(0o100644));
        assert!(!f.binary);
        assert!(!f.hunks.is_empty());
        for h in &f.hunks {
            let old = h.lines.iter().filter(|l| l.kind != LineKind::Add).count();
            let new = h
                .lines
                .iter()
                .filter(|l| l.kind != LineKind::Remove)
                .count();
            assert_eq!((old as u32, new as u32), (h.old_count, h.new_count));
        }
        assert!(p.insertions() > 50 && p.deletions() > 5);
    }

    #[test]
    fn every_fixture_parses_with_the_expected_shape() {
        let cases: &[(&str, &[(&str, ChangeKind)])] = &[
            (
                "breaks-test.diff",
                &[("hermes/runtime.py", ChangeKind::Modify)],
            ),
            (
                "does-not-apply.diff",
                &[("hermes/runtime.py", ChangeKind::Modify)],
            ),
            (
                "touches-protected.diff",
                &[
                    ("hermes/compressor.py", ChangeKind::Modify),
                    ("tests/test_compressor.py", ChangeKind::Modify),
                ],
            ),
            (
                "path-traversal.diff",
                &[
                    ("hermes/state.py", ChangeKind::Modify),
                    ("../escaped.txt", ChangeKind::Create),
                ],
            ),
            (
                "hostile-escape.diff",
                &[
                    ("hermes/diagnostics.py", ChangeKind::Create),
                    ("hermes/runtime.py", ChangeKind::Modify),
                ],
            ),
            (
                "reads-node-key.diff",
                &[("hermes/runtime.py", ChangeKind::Modify)],
            ),
            (
                "noop-comment.diff",
                &[("hermes/registry.py", ChangeKind::Modify)],
            ),
            (
                "adds-binary.diff",
                &[("tools/icon.bin", ChangeKind::Create)],
            ),
        ];
        for (name, expected) in cases {
            let p = parse_ok(&fixture(name));
            let got: Vec<(&str, ChangeKind)> = p.files.iter().map(|f| (f.path(), f.kind)).collect();
            assert_eq!(&got, expected, "{name}");
        }
        let noop = parse_ok(&fixture("noop-comment.diff"));
        assert_eq!((noop.insertions(), noop.deletions()), (1, 0));
        let bin = parse_ok(&fixture("adds-binary.diff"));
        assert!(bin.files[0].binary && bin.files[0].hunks.is_empty());
        assert_eq!(bin.files[0].new_mode, Some(0o100644));
        let created = &parse_ok(&fixture("hostile-escape.diff")).files[0];
        assert_eq!(created.old_path, None);
        assert_eq!(created.hunks[0].old_count, 0);
    }

    // Real `git diff -M` output: a rename with an edit plus a mode change.
    const RENAME_AND_MODE: &str = "\
diff --git a/old name.txt b/new name.txt
similarity index 80%
rename from old name.txt
rename to new name.txt
index 3b18e51..e2a8c9f 100644
--- a/old name.txt
+++ b/new name.txt
@@ -1,4 +1,4 @@
 one
 two
-three
+THREE
 four
diff --git a/run.sh b/run.sh
old mode 100644
new mode 100755
diff --git a/gone.txt b/gone.txt
deleted file mode 100644
index 8baef1b..0000000
--- a/gone.txt
+++ /dev/null
@@ -1 +0,0 @@
-abc
diff --git a/empty b/empty
new file mode 100644
index 0000000..e69de29
diff --git a/a.txt b/copy.txt
similarity index 100%
copy from a.txt
copy to copy.txt
";

    #[test]
    fn renames_modes_deletes_empty_files_and_copies() {
        let p = parse_ok(RENAME_AND_MODE.as_bytes());
        let kinds: Vec<ChangeKind> = p.files.iter().map(|f| f.kind).collect();
        assert_eq!(
            kinds,
            [
                ChangeKind::Rename,
                ChangeKind::Modify,
                ChangeKind::Delete,
                ChangeKind::Create,
                ChangeKind::Copy
            ]
        );
        let r = &p.files[0];
        assert_eq!(r.old_path.as_deref(), Some("old name.txt"));
        assert_eq!(r.new_path.as_deref(), Some("new name.txt"));
        assert_eq!(r.similarity, Some(80));
        assert_eq!((r.hunks[0].insertions(), r.hunks[0].deletions()), (1, 1));
        let m = &p.files[1];
        assert_eq!((m.old_mode, m.new_mode), (Some(0o100644), Some(0o100755)));
        assert!(m.hunks.is_empty());
        assert_eq!(p.files[2].new_path, None);
        assert_eq!(p.files[2].old_path.as_deref(), Some("gone.txt"));
        assert_eq!(p.files[3].new_path.as_deref(), Some("empty"));
        assert_eq!(p.files[4].paths(), vec!["a.txt", "copy.txt"]);
        assert_eq!(p.files[4].line, 27);
    }

    #[test]
    fn no_newline_markers_and_quoted_paths() {
        let raw = concat!(
            "diff --git \"a/tab\\there\" \"b/tab\\there\"\n",
            "index 1111111..2222222 100644\n",
            "--- \"a/tab\\there\"\n",
            "+++ \"b/tab\\there\"\n",
            "@@ -1,2 +1,2 @@\n",
            " keep\n",
            "-old\n",
            "\\ No newline at end of file\n",
            "+new\n",
            "\\ No newline at end of file\n",
        );
        let p = parse_ok(raw.as_bytes());
        let f = &p.files[0];
        assert_eq!(f.path(), "tab\there");
        let lines = &f.hunks[0].lines;
        assert_eq!(lines.len(), 3);
        assert!(!lines[0].no_newline && lines[1].no_newline && lines[2].no_newline);
        assert_eq!(lines[2].text, b"new");
    }

    #[test]
    fn plain_diffs_with_timestamps_preamble_and_binary() {
        let raw = concat!(
            "Some commit message\n",
            "explaining the change.\n",
            "diff -ruN old/src/x.c new/src/x.c\n",
            "--- old/src/x.c\t2024-01-01 10:00:00.000000000 +0000\n",
            "+++ new/src/x.c\t2024-01-02 10:00:00.000000000 +0000\n",
            "@@ -1 +1,2 @@\n",
            " int x;\n",
            "+int y;\n",
            "Only in new: extra\n",
            "Binary files old/logo.png and new/logo.png differ\n",
            "-- \n",
            "2.47.3\n",
        );
        let p = parse_ok(raw.as_bytes());
        assert_eq!(p.files.len(), 2);
        assert_eq!(p.files[0].path(), "src/x.c");
        assert_eq!(p.files[0].kind, ChangeKind::Modify);
        assert_eq!(p.files[0].line, 4);
        assert!(p.files[1].binary);
        assert_eq!(p.files[1].path(), "logo.png");
    }

    #[test]
    fn crlf_and_non_utf8_content_is_kept_exactly() {
        let mut raw = b"--- a/w.txt\n+++ b/w.txt\n@@ -1 +1 @@\n-caf\xe9\r\n+cafe\r\n".to_vec();
        let p = parse_ok(&raw);
        let l = &p.files[0].hunks[0].lines;
        assert_eq!(l[0].text, b"caf\xe9\r");
        assert_eq!(l[1].text, b"cafe\r");
        raw.truncate(raw.len() - 1); // no final newline in the patch file itself
        assert_eq!(parse_ok(&raw).files[0].hunks[0].lines[1].text, b"cafe\r");
    }

    #[test]
    fn malformed_inputs_name_the_line_and_the_expectation() {
        let e = parse_err("");
        assert!(e.message.contains("no file changes"), "{e}");
        let e = parse_err("just some text\nand more\n");
        assert!(e.message.contains("no file changes"), "{e}");

        // body shorter than the header's counts
        let e = parse_err("--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n-b\n+c\n");
        assert_eq!(e.line, 7, "{e}");
        assert!(e.message.contains("promises 3 old and 3 new"), "{e}");

        // body longer than the counts: the extra line is not a header
        let e = parse_err("--- a/x\n+++ b/x\n@@ -1,1 +1,1 @@\n-b\n+c\n+d\n");
        assert_eq!(e.line, 6, "{e}");
        assert!(e.message.contains("expected a file header"), "{e}");

        // a removed line when only new lines are left
        let e = parse_err("--- a/x\n+++ b/x\n@@ -1,1 +1,2 @@\n-b\n-c\n+d\n");
        assert_eq!(e.line, 5, "{e}");
        assert!(e.message.contains("more old lines"), "{e}");

        let e = parse_err("--- a/x\n+++ b/x\n@@ -1,x +1 @@\n a\n");
        assert_eq!(e.line, 3, "{e}");
        assert!(e.message.contains("malformed hunk header"), "{e}");

        let e = parse_err("--- a/x\n+++ b/x\n@@ -1 +1 @@\n*a\n");
        assert_eq!(e.line, 4, "{e}");
        assert!(e.message.contains("expected a line starting with"), "{e}");

        // overlapping hunks
        let e =
            parse_err("--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n@@ -2,1 +2,1 @@\n-b\n+c\n");
        assert_eq!(e.line, 7, "{e}");
        assert!(e.message.contains("overlap"), "{e}");

        let e = parse_err("diff --git a/x b/x\nindex 1..2 100644\n@@ -1 +1 @@\n-a\n+b\n");
        assert_eq!(e.line, 3, "{e}");
        assert!(e.message.contains("without `--- a/…`"), "{e}");

        let e = parse_err("diff --git a/x b/x\nnew mode 10064x\n");
        assert_eq!(e.line, 2, "{e}");
        assert!(e.message.contains("octal file mode"), "{e}");

        let e = parse_err("diff --git a/x b/x\n--- a/x\n+++ b/y\n@@ -1 +1 @@\n-a\n+b\n");
        assert!(e.message.contains("inconsistent new name"), "{e}");

        let e = parse_err("diff --git a/x b/x\nindex 1111111..2222222 100644\n");
        assert!(e.message.contains("changes nothing"), "{e}");

        let e = parse_err("diff --git a/x b/x\nGIT binary patch\nnot base85 at all!\n");
        assert!(e.message.contains("literal N"), "{e}");

        let e = parse_err("--- a/x\n+++ b/x\n@@ -1 +1 @@\n\\ No newline at end of file\n-a\n+b\n");
        assert_eq!(e.line, 4, "{e}");

        let e = parse_err(
            "--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-a\n\\ No newline at end of file\n-b\n+c\n+d\n",
        );
        assert!(e.message.contains("not the last"), "{e}");

        let e = parse_err("diff --git a/x b/x\nnew file mode 100644\n--- /dev/null\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n");
        assert!(
            e.message.contains("new file x has a hunk with old lines"),
            "{e}"
        );
    }

    #[test]
    fn truncated_fixture_is_rejected_with_the_line() {
        let raw = fixture("swap-compressor.diff");
        let text = String::from_utf8(raw).unwrap_or_default();
        let cut: Vec<&str> = text.lines().take(20).collect();
        let e = parse(cut.join("\n").as_bytes()).expect_err("truncated");
        assert!(e.message.contains("unexpected end of the patch"), "{e}");
        assert_eq!(e.line, 21);
    }

    #[test]
    fn strip_prefix_keeps_what_the_gates_must_see() {
        assert_eq!(strip_prefix("a/src/x"), "src/x");
        assert_eq!(strip_prefix("/etc/passwd"), "/etc/passwd");
        assert_eq!(strip_prefix("../x"), "../x");
        assert_eq!(strip_prefix("a/../x"), "../x");
        assert_eq!(strip_prefix("file"), "file");
    }
}
