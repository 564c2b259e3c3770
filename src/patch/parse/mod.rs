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
//!
//! The parts, one job each: `git` reads a `diff --git` entry's extended header lines,
//! `plain` a `--- `/`+++ ` entry of `diff -u`, `hunks` the `@@` hunks and their bodies,
//! `binary` binary entries, and `paths` the file names (quoted, prefixed, `/dev/null`).

mod binary;
mod git;
mod hunks;
mod paths;
mod plain;

pub use paths::{strip_prefix, tidy, verify_path};
use plain::is_plain_noise;

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
    /// The file's mode after the change (from `new mode` or `new file mode`; `None`: the file keeps its mode).
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

    /// Every path the patch names, old and new, as a tree's walk spells them (its plain
    /// components joined: `a//b`, `./a/b` and `a/./b` are `a/b`): applying it writes or
    /// deletes no other file.
    pub fn paths(&self) -> std::collections::BTreeSet<std::path::PathBuf> {
        use std::path::{Component, Path};
        self.files
            .iter()
            .flat_map(FilePatch::paths)
            .map(|p| {
                Path::new(p)
                    .components()
                    .filter(|c| matches!(c, Component::Normal(_)))
                    .collect()
            })
            .collect()
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
}

/// The first position of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::path::PathBuf;

    pub(super) fn fixture(name: &str) -> Vec<u8> {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/patches")
            .join(name);
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    pub(super) fn parse_ok(raw: &[u8]) -> Patch {
        parse(raw).unwrap_or_else(|e| panic!("{e}"))
    }

    pub(super) fn parse_err(raw: &str) -> PatchError {
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
}
