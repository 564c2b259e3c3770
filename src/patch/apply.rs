//! Exact patch application (lifecycle step 3).
//!
//! - Context and removed lines must match byte for byte, including the final newline,
//!   never with fuzz. A hunk is placed exactly where `git apply` (default options) places
//!   it, so that the tree fork evaluates is the tree a deployer's `git apply` writes: see
//!   [`locate`]. In short: the search starts at the hunk's *new* start line, takes the
//!   nearest match (forward first on a tie), never reuses a line an earlier hunk wrote,
//!   and anchors a hunk whose old start is 0 or 1 at the top of the file and a hunk
//!   without trailing context at its end.
//! - A hunk whose result is already in the file while its preimage is not is refused
//!   as "already applied": the patch is never silently reverse-applied (SWE-bench #228).
//! - Atomic: every file's new content is computed in memory first; the tree is written
//!   only when every hunk of every file applied. If a write fails midway, the files
//!   already written are restored.
//! - Every path is checked to stay inside the tree and not to pass through a symlink, and
//!   to be in the one spelling `git apply` also resolves it to (no `//`, `.`, `..` or `.git`
//!   component; a leading `./` is dropped): the plan is keyed by that spelling, so two
//!   entries naming one file apply in turn, as with `git apply`, never side by side.
//! - Modes as `git apply` sets them: a `new mode`/`new file mode` line decides the
//!   executable bit (the owner's, `mode & 0100`), with or without an `old mode` line;
//!   without one the file keeps its mode.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use thiserror::Error;

use super::gates::check_path;
use super::parse::{tidy, ChangeKind, FilePatch, Hunk, LineKind, Patch};

/// What an applied patch changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ApplySummary {
    pub files_changed: usize,
    pub insertions: usize,
    pub deletions: usize,
}

/// Why a patch did not apply. The tree is unchanged whenever this is returned.
#[derive(Debug, Error)]
pub enum ApplyError {
    /// A hunk's context or removed lines are not in the file (at any offset).
    #[error("{file}: hunk {hunk} does not apply: {detail}")]
    HunkMismatch {
        file: String,
        /// 1-based hunk number within the file.
        hunk: usize,
        /// The first mismatching line: where, what the patch expected, what was found.
        detail: String,
    },
    /// The hunk's result is already present: the patch (or this part) was applied before.
    #[error(
        "{file}: hunk {hunk} is already applied (the file already contains its result \
         and not its preimage); refusing to reverse-apply or re-apply the patch"
    )]
    AlreadyApplied { file: String, hunk: usize },
    /// The file is in the wrong state for the change (missing, already exists, binary…).
    #[error("{file}: {problem}")]
    File { file: String, problem: String },
    /// The path leaves the tree or passes through a symlink.
    #[error("{file}: unsafe path: {reason}")]
    UnsafePath { file: String, reason: String },
    /// Reading or writing the tree failed.
    #[error("{file}: {op} failed: {source}")]
    Io {
        file: String,
        op: &'static str,
        #[source]
        source: io::Error,
    },
}

impl ApplyError {
    /// The file the error is about (a path relative to the tree).
    pub fn file(&self) -> &str {
        match self {
            ApplyError::HunkMismatch { file, .. }
            | ApplyError::AlreadyApplied { file, .. }
            | ApplyError::File { file, .. }
            | ApplyError::UnsafePath { file, .. }
            | ApplyError::Io { file, .. } => file,
        }
    }

    /// The 1-based hunk number, for hunk-level errors.
    pub fn hunk(&self) -> Option<usize> {
        match self {
            ApplyError::HunkMismatch { hunk, .. } | ApplyError::AlreadyApplied { hunk, .. } => {
                Some(*hunk)
            }
            _ => None,
        }
    }
}

/// A file's content and permission bits, as planned.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileState {
    content: Vec<u8>,
    perm: u32,
}

/// One line of a file: its bytes without the newline, and whether a newline follows.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    text: Vec<u8>,
    nl: bool,
}

/// Applies `patch` to the files under `tree`, exactly and atomically.
pub fn apply(tree: &Path, patch: &Patch) -> Result<ApplySummary, ApplyError> {
    let mut plan = Plan {
        tree,
        originals: BTreeMap::new(),
        planned: BTreeMap::new(),
    };
    for f in &patch.files {
        plan.file(f)?;
    }
    plan.write()?;
    Ok(ApplySummary {
        files_changed: patch.files.len(),
        insertions: patch.insertions(),
        deletions: patch.deletions(),
    })
}

struct Plan<'a> {
    tree: &'a Path,
    /// The state of each touched path on disk before anything is written.
    originals: BTreeMap<String, Option<FileState>>,
    /// The state each touched path will have (`None`: absent).
    planned: BTreeMap<String, Option<FileState>>,
}

const MODE_TYPE_MASK: u32 = 0o170000;
const MODE_REGULAR: u32 = 0o100000;

impl Plan<'_> {
    /// The current state of `path`: as planned so far, else as on disk.
    fn current(&mut self, path: &str) -> Result<Option<FileState>, ApplyError> {
        if let Some(s) = self.planned.get(path) {
            return Ok(s.clone());
        }
        if let Some(s) = self.originals.get(path) {
            return Ok(s.clone());
        }
        check_path(self.tree, path).map_err(|reason| ApplyError::UnsafePath {
            file: path.to_string(),
            reason,
        })?;
        let full = self.tree.join(path);
        let state = match fs::symlink_metadata(&full) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(ApplyError::Io {
                    file: path.to_string(),
                    op: "stat",
                    source: e,
                })
            }
            Ok(m) if m.is_file() => {
                let content = fs::read(&full).map_err(|e| ApplyError::Io {
                    file: path.to_string(),
                    op: "read",
                    source: e,
                })?;
                Some(FileState {
                    content,
                    perm: m.permissions().mode() & 0o7777,
                })
            }
            Ok(m) => {
                return Err(ApplyError::File {
                    file: path.to_string(),
                    problem: format!(
                        "is a {} in the tree, not a regular file",
                        if m.is_dir() {
                            "directory"
                        } else {
                            "special file"
                        }
                    ),
                })
            }
        };
        self.originals.insert(path.to_string(), state.clone());
        Ok(state)
    }

    fn set(&mut self, path: &str, state: Option<FileState>) -> Result<(), ApplyError> {
        // Make sure the original is recorded (and the path checked) before planning it.
        self.current(path)?;
        self.planned.insert(path.to_string(), state);
        Ok(())
    }

    fn file(&mut self, f: &FilePatch) -> Result<(), ApplyError> {
        let label = match (f.kind, &f.old_path, &f.new_path) {
            (ChangeKind::Rename | ChangeKind::Copy, Some(a), Some(b)) => format!("{a} -> {b}"),
            _ => f.path().to_string(),
        };
        let file_err = |problem: String| ApplyError::File {
            file: label.clone(),
            problem,
        };
        if f.binary {
            return Err(file_err(
                "binary changes cannot be applied; only text hunks are supported".into(),
            ));
        }
        for mode in [f.new_mode, f.old_mode].into_iter().flatten() {
            if mode & MODE_TYPE_MASK != MODE_REGULAR {
                return Err(file_err(format!(
                    "mode {mode:o} is not a regular file; symlinks and submodules are not supported"
                )));
            }
        }
        let need = |p: &Option<String>, which: &str| {
            p.clone()
                .map(tidy)
                .ok_or_else(|| file_err(format!("the patch gives no {which} path")))
        };
        match f.kind {
            ChangeKind::Modify => {
                let path = need(&f.new_path, "new")?;
                let Some(cur) = self.current(&path)? else {
                    return Err(file_err(
                        "does not exist in the tree, but the patch modifies it".into(),
                    ));
                };
                let content = apply_hunks(&label, &cur.content, &f.hunks)?;
                let perm = new_perm(f, cur.perm);
                self.set(&path, Some(FileState { content, perm }))
            }
            ChangeKind::Create => {
                let path = need(&f.new_path, "new")?;
                let result = apply_hunks(&label, &[], &f.hunks)?;
                if let Some(cur) = self.current(&path)? {
                    if cur.content == result && !f.hunks.is_empty() {
                        return Err(ApplyError::AlreadyApplied {
                            file: label.clone(),
                            hunk: 1,
                        });
                    }
                    return Err(file_err(
                        "already exists in the tree, but the patch creates it".into(),
                    ));
                }
                let perm = perm_for_mode(f.new_mode.unwrap_or(0o100644));
                self.set(
                    &path,
                    Some(FileState {
                        content: result,
                        perm,
                    }),
                )
            }
            ChangeKind::Delete => {
                let path = need(&f.old_path, "old")?;
                let Some(cur) = self.current(&path)? else {
                    return Err(file_err(
                        "does not exist in the tree, but the patch deletes it (was the patch \
                         already applied?)"
                            .into(),
                    ));
                };
                let rest = apply_hunks(&label, &cur.content, &f.hunks)?;
                if !rest.is_empty() {
                    return Err(file_err(format!(
                        "the patch deletes the file but does not remove all of it ({} bytes \
                         would remain); the file differs from what the patch expects",
                        rest.len()
                    )));
                }
                self.set(&path, None)
            }
            ChangeKind::Rename | ChangeKind::Copy => {
                let from = need(&f.old_path, "old")?;
                let to = need(&f.new_path, "new")?;
                let Some(cur) = self.current(&from)? else {
                    let already = self.current(&to)?.is_some();
                    return Err(file_err(format!(
                        "`{from}` does not exist in the tree{}",
                        if already && f.kind == ChangeKind::Rename {
                            " and the target exists (was the patch already applied?)"
                        } else {
                            ""
                        }
                    )));
                };
                if self.current(&to)?.is_some() {
                    return Err(file_err(format!(
                        "`{to}` already exists in the tree; a {} may not overwrite it",
                        if f.kind == ChangeKind::Rename {
                            "rename"
                        } else {
                            "copy"
                        }
                    )));
                }
                let content = apply_hunks(&label, &cur.content, &f.hunks)?;
                let perm = new_perm(f, cur.perm);
                if f.kind == ChangeKind::Rename {
                    self.set(&from, None)?;
                }
                self.set(&to, Some(FileState { content, perm }))
            }
        }
    }

    /// Writes the planned states; on failure restores what was already written.
    fn write(self) -> Result<(), ApplyError> {
        let changes: Vec<(&String, &Option<FileState>)> = self
            .planned
            .iter()
            .filter(|(p, s)| self.originals.get(*p) != Some(*s))
            .collect();
        // Deletions first, so that a path freed by a rename can be reused.
        let (deletes, writes): (Vec<_>, Vec<_>) =
            changes.into_iter().partition(|(_, s)| s.is_none());
        let mut done: Vec<&String> = Vec::new();
        let mut created_dirs: Vec<PathBuf> = Vec::new();
        let mut result = Ok(());
        for (path, state) in deletes.into_iter().chain(writes) {
            let r = match state {
                None => self.remove(path),
                Some(s) => self.store(path, s, &mut created_dirs),
            };
            if let Err(e) = r {
                result = Err(e);
                break;
            }
            done.push(path);
        }
        if result.is_err() {
            // Best effort: put back every file already written, newest first.
            for path in done.into_iter().rev() {
                let full = self.tree.join(path);
                match self.originals.get(path) {
                    Some(Some(orig)) => {
                        let _ = write_file(&full, orig);
                    }
                    _ => {
                        let _ = fs::remove_file(&full);
                    }
                }
            }
            for d in created_dirs.iter().rev() {
                let _ = fs::remove_dir(d);
            }
        }
        result
    }

    fn remove(&self, path: &str) -> Result<(), ApplyError> {
        let full = self.tree.join(path);
        fs::remove_file(&full).map_err(|e| ApplyError::Io {
            file: path.to_string(),
            op: "delete",
            source: e,
        })?;
        // Like git apply: drop directories the deletion left empty (never the tree).
        let mut dir = full.parent();
        while let Some(d) = dir {
            if d == self.tree || !d.starts_with(self.tree) || fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
        Ok(())
    }

    fn store(
        &self,
        path: &str,
        state: &FileState,
        created_dirs: &mut Vec<PathBuf>,
    ) -> Result<(), ApplyError> {
        let full = self.tree.join(path);
        let io_err = |op: &'static str| {
            let file = path.to_string();
            move |source| ApplyError::Io { file, op, source }
        };
        if let Some(parent) = full.parent() {
            let mut missing = Vec::new();
            let mut d = parent;
            while !d.exists() && d.starts_with(self.tree) && d != self.tree {
                missing.push(d.to_path_buf());
                match d.parent() {
                    Some(p) => d = p,
                    None => break,
                }
            }
            for m in missing.into_iter().rev() {
                fs::create_dir(&m).map_err(io_err("create directory"))?;
                created_dirs.push(m);
            }
        }
        write_file(&full, state).map_err(io_err("write"))
    }
}

/// Writes through a temporary file in the same directory and renames it into place.
fn write_file(full: &Path, state: &FileState) -> io::Result<()> {
    let dir = full
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no parent"))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".fork-apply-")
        .tempfile_in(dir)?;
    io::Write::write_all(&mut tmp, &state.content)?;
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(state.perm))?;
    tmp.persist(full).map_err(|e| e.error)?;
    Ok(())
}

/// git writes a file executable exactly when its mode has the owner's execute bit
/// (`mode & 0100`): `new file mode 100010` is not executable, `100700` is.
fn is_exec_mode(mode: u32) -> bool {
    mode & 0o100 != 0
}

fn perm_for_mode(mode: u32) -> u32 {
    if is_exec_mode(mode) {
        0o755
    } else {
        0o644
    }
}

/// The permission bits after a modification. `git apply` writes the file with the patch's
/// new mode whenever the patch gives one (`new mode`, with or without `old mode`, even
/// equal to it); only without one does the file keep its mode. (The parser takes the
/// new mode from those lines only: the index line's mode is an old mode.)
fn new_perm(f: &FilePatch, current: u32) -> u32 {
    match f.new_mode {
        Some(m) if is_exec_mode(m) => current | 0o100 | ((current & 0o044) >> 2),
        Some(_) => current & !0o111,
        None => current,
    }
}

fn split_lines(content: &[u8]) -> Vec<Line> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, &b) in content.iter().enumerate() {
        if b == b'\n' {
            out.push(Line {
                text: content[start..i].to_vec(),
                nl: true,
            });
            start = i + 1;
        }
    }
    if start < content.len() {
        out.push(Line {
            text: content[start..].to_vec(),
            nl: false,
        });
    }
    out
}

fn join_lines(lines: &[Line]) -> Vec<u8> {
    let mut out = Vec::with_capacity(lines.iter().map(|l| l.text.len() + 1).sum());
    for l in lines {
        out.extend_from_slice(&l.text);
        if l.nl {
            out.push(b'\n');
        }
    }
    out
}

fn side(h: &Hunk, skip: LineKind) -> Vec<Line> {
    h.lines
        .iter()
        .filter(|l| l.kind != skip)
        .map(|l| Line {
            text: l.text.clone(),
            nl: !l.no_newline,
        })
        .collect()
}

/// Where `git apply` puts a hunk whose preimage is `want`: the line of `image` it
/// replaces, or `None` when git would find no place for it.
///
/// This is git's own search (apply.c: `apply_one_fragment`, `find_pos`, `match_fragment`)
/// for the default options (no `--unidiff-zero`, `-C`, `--allow-overlap`, whitespace
/// fixing or ignoring), reimplemented rule by rule, because any other choice of position
/// makes fork evaluate one tree while `git apply` deploys another:
/// - A position matches when the `want.len()` lines there equal `want` byte for byte and
///   none of them was written by an earlier hunk of this file (`patched`): git marks every
///   line of a hunk's result and never matches a later hunk over it. Earlier hunks do not
///   otherwise limit the search: a later hunk may land before an earlier one.
/// - `at_start` (old start 0 or 1): only position 0 matches. `at_end` (no trailing
///   context): only the position that ends at the last line matches. Both: only a
///   preimage that is the whole file.
/// - Otherwise the search starts at `start` (the hunk's new start line minus one, clamped
///   to the file; never its old start, nor an offset an earlier hunk was found at) and
///   tries `start`, `start + 1`, `start - 1`, `start + 2`, `start - 2`, …: the nearest
///   match wins, the later one on a tie.
fn locate(
    image: &[Line],
    patched: &[bool],
    want: &[Line],
    start: usize,
    at_start: bool,
    at_end: bool,
) -> Option<usize> {
    let fits = |pos: usize| {
        pos + want.len() <= image.len()
            && !patched[pos..pos + want.len()].contains(&true)
            && image[pos..pos + want.len()] == *want
    };
    if at_start || at_end {
        let pos = if at_start {
            0
        } else {
            image.len().checked_sub(want.len())?
        };
        let ends = pos + want.len() == image.len();
        return ((!at_end || ends) && fits(pos)).then_some(pos);
    }
    let start = start.min(image.len());
    for d in 0..=image.len() {
        if start + d <= image.len() && fits(start + d) {
            return Some(start + d);
        }
        if d > 0 && d <= start && fits(start - d) {
            return Some(start - d);
        }
    }
    None
}

fn show_line(l: &Line) -> String {
    let s = String::from_utf8_lossy(&l.text);
    let mut out: String = s.chars().take(100).collect();
    if s.chars().count() > 100 {
        out.push('…');
    }
    if l.nl {
        format!("`{out}`")
    } else {
        format!("`{out}` (no newline at end of file)")
    }
}

/// Describes the first line where `want` differs from `image` at `pos`, with line
/// numbers of the original file (`shift` = lines added so far by earlier hunks).
fn first_mismatch(image: &[Line], want: &[Line], pos: usize, shift: isize) -> String {
    let orig = |i: usize| (i as isize - shift + 1).max(1);
    for (j, w) in want.iter().enumerate() {
        match image.get(pos + j) {
            None => {
                return format!(
                    "expected {} at line {} but the file ends after line {}",
                    show_line(w),
                    orig(pos + j),
                    (image.len() as isize - shift).max(0)
                )
            }
            Some(got) if got != w => {
                return format!(
                    "line {}: expected {}, found {}",
                    orig(pos + j),
                    show_line(w),
                    show_line(got)
                )
            }
            Some(_) => {}
        }
    }
    format!(
        "the lines match at line {} but not where the hunk must be (at the start or end of the file)",
        orig(pos)
    )
}

/// Applies one file's hunks to `content`, each where `git apply` applies it ([`locate`]).
fn apply_hunks(label: &str, content: &[u8], hunks: &[Hunk]) -> Result<Vec<u8>, ApplyError> {
    let mut image = split_lines(content);
    // Lines written by the hunks applied so far: git never matches a later hunk over them.
    let mut patched = vec![false; image.len()];
    let mut shift: isize = 0; // lines added minus removed so far (for messages only)
    for (k, h) in hunks.iter().enumerate() {
        let pre = side(h, LineKind::Add);
        let post = side(h, LineKind::Remove);
        let leading = h
            .lines
            .iter()
            .take_while(|l| l.kind == LineKind::Context)
            .count();
        let trailing = h
            .lines
            .iter()
            .rev()
            .take_while(|l| l.kind == LineKind::Context)
            .count();
        // git's anchors: old start 0 or 1 (with or without old lines) pins the hunk to the
        // top, no trailing context pins it to the end.
        let at_start = h.old_start <= 1;
        let at_end = trailing == 0;
        // git starts searching at the new start, which already counts what earlier hunks
        // added and removed; a header whose new start disagrees with its old start is
        // placed by the new one, as git places it.
        let start = (h.new_start as usize).saturating_sub(1);
        match locate(&image, &patched, &pre, start, at_start, at_end) {
            Some(pos) => {
                let n = post.len();
                image.splice(pos..pos + pre.len(), post);
                patched.splice(pos..pos + pre.len(), std::iter::repeat_n(true, n));
                shift += n as isize - pre.len() as isize;
            }
            None => {
                // Is the hunk's result already there? Then refuse, never reverse.
                if !post.is_empty()
                    && post != pre
                    && locate(&image, &patched, &post, start, at_start, at_end).is_some()
                {
                    return Err(ApplyError::AlreadyApplied {
                        file: label.to_string(),
                        hunk: k + 1,
                    });
                }
                let at = if at_end {
                    image.len().saturating_sub(pre.len())
                } else if at_start {
                    0
                } else {
                    start.min(image.len())
                };
                let mut detail = first_mismatch(&image, &pre, at, shift);
                if leading == 0 && trailing == 0 && !pre.is_empty() {
                    detail.push_str(
                        "; the hunk has no context lines: regenerate the diff with context (git diff -U3)",
                    );
                }
                if leading + trailing == 0 && pre.is_empty() && !image.is_empty() {
                    detail.push_str(
                        "; a hunk without context or removed lines applies only to an empty \
                         file (git apply anchors it at both ends): regenerate the diff with \
                         context (git diff -U3)",
                    );
                }
                return Err(ApplyError::HunkMismatch {
                    file: label.to_string(),
                    hunk: k + 1,
                    detail,
                });
            }
        }
    }
    if let Some(i) = image.iter().rev().skip(1).position(|l| !l.nl) {
        let line = image.len() - 1 - i;
        return Err(ApplyError::HunkMismatch {
            file: label.to_string(),
            hunk: hunks.len(),
            detail: format!(
                "the result would have a line without a newline before its end (line {line})"
            ),
        });
    }
    Ok(join_lines(&image))
}

#[cfg(test)]
#[path = "apply_tests.rs"]
mod tests;
