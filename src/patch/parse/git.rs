//! A `diff --git` entry: its extended header lines (modes, renames, copies, similarity,
//! `index`), and how they, the `diff --git` names and the `---`/`+++` lines combine into
//! one consistent [`FilePatch`].

use super::hunks::check_hunks;
use super::paths::{git_header_names, path_text};
use super::{err, show, ChangeKind, FilePatch, Hunk, Parser, PatchError};

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
    /// The old and new mode so far, with the header line that gave each: see `note_mode`.
    old_seen: Option<(u32, &'static str)>,
    new_seen: Option<(u32, &'static str)>,
}

#[derive(Clone, Copy)]
enum Side {
    Old,
    New,
}

impl GitHeader {
    /// `git apply` keeps one old mode (from `old mode`, `deleted file mode` or the index
    /// line's mode) and one new mode (from `new mode` or `new file mode`), each overwritten
    /// by every later line that gives it. Rather than copy that "last line wins", fork
    /// refuses an entry whose lines give one of them two different values: the mode it
    /// applies and the mode the gates check are then the only one the entry names.
    fn note_mode(
        &mut self,
        side: Side,
        what: &'static str,
        mode: Option<u32>,
        line: usize,
    ) -> Result<(), PatchError> {
        let Some(mode) = mode else { return Ok(()) };
        let (seen, which) = match side {
            Side::Old => (&mut self.old_seen, "old"),
            Side::New => (&mut self.new_seen, "new"),
        };
        match *seen {
            Some((m, by)) if m != mode => err(
                line,
                format!(
                    "`{what}` gives the {which} mode {mode:o} but `{by}` gave {m:o}: give each \
                     mode once"
                ),
            ),
            _ => {
                *seen = Some((mode, what));
                Ok(())
            }
        }
    }
}

impl Parser<'_> {
    pub(super) fn git_file(&mut self) -> Result<FilePatch, PatchError> {
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
                h.note_mode(Side::Old, "old mode", h.old_mode, n)?;
            } else if let Some(rest) = l.strip_prefix(b"new mode ") {
                h.new_mode = Some(mode(rest, n)?);
                h.note_mode(Side::New, "new mode", h.new_mode, n)?;
            } else if let Some(rest) = l.strip_prefix(b"deleted file mode ") {
                h.deleted_mode = Some(mode(rest, n)?);
                h.note_mode(Side::Old, "deleted file mode", h.deleted_mode, n)?;
            } else if let Some(rest) = l.strip_prefix(b"new file mode ") {
                h.created_mode = Some(mode(rest, n)?);
                h.note_mode(Side::New, "new file mode", h.created_mode, n)?;
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
                h.note_mode(Side::Old, "index", h.index_mode, n)?;
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
    // `note_mode` made every line that gives a mode agree, so these are git's modes.
    let old_mode = h.old_mode.or(h.deleted_mode).or(match kind {
        ChangeKind::Create => None,
        _ => h.index_mode,
    });
    // Only `new mode`/`new file mode` give the new mode: git reads the index line's mode
    // as the old mode, and a file whose entry gives no new mode keeps its mode.
    let new_mode = h.new_mode.or(h.created_mode);
    // As git: an entry without hunks changes a mode only when it gives both modes (the
    // index line's counts as the old one) and they differ; git refuses anything else as
    // "patch with only garbage".
    let changes_something = !hunks.is_empty()
        || h.binary
        || kind != ChangeKind::Modify
        || matches!((old_mode, new_mode), (Some(a), Some(b)) if a != b);
    if !changes_something {
        return err(
            start,
            format!(
                "the entry for {} changes nothing: expected hunks, a mode change (`old mode` \
                 and `new mode` lines with different modes), a rename, or a new/deleted file",
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
    use super::super::tests::parse_ok;
    use super::*;

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
    fn modes_are_read_as_git_apply_reads_them() {
        use super::super::tests::parse_err;
        // The index line's mode is the old mode only: the file keeps whatever mode it has.
        let p = parse_ok(b"diff --git a/x b/x\nindex 1111111..2222222 100644\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n");
        assert_eq!(
            (p.files[0].old_mode, p.files[0].new_mode),
            (Some(0o100644), None)
        );
        // A lone `new mode` with hunks is the new mode.
        let p = parse_ok(
            b"diff --git a/x b/x\nnew mode 100755\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n",
        );
        assert_eq!(
            (p.files[0].old_mode, p.files[0].new_mode),
            (None, Some(0o100755))
        );
        // Header only: a mode change needs both modes (the index line gives the old one)
        // and they must differ, as `git apply` requires ("patch with only garbage").
        let p = parse_ok(b"diff --git a/x b/x\nindex 1111111..1111111 100644\nnew mode 100755\n");
        assert_eq!(
            (p.files[0].old_mode, p.files[0].new_mode),
            (Some(0o100644), Some(0o100755))
        );
        for lone in [
            "diff --git a/x b/x\nnew mode 100755\n",
            "diff --git a/x b/x\nold mode 100755\nnew mode 100755\n",
        ] {
            let e = parse_err(lone);
            assert!(e.message.contains("changes nothing"), "{lone}: {e}");
        }
        // Two lines giving one mode differently: git takes the last, fork refuses.
        for (twice, line) in [
            ("diff --git a/x b/x\nnew file mode 100644\nnew mode 100755\n--- /dev/null\n+++ b/x\n@@ -0,0 +1 @@\n+a\n", 3),
            ("diff --git a/x b/x\nold mode 100644\nnew mode 100755\nindex 1111111..2222222 100755\n", 4),
            ("diff --git a/x b/x\nnew mode 100755\nnew mode 100644\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n", 3),
        ] {
            let e = parse_err(twice);
            assert_eq!(e.line, line, "{twice}: {e}");
            assert!(e.message.contains("gives the"), "{twice}: {e}");
        }
    }
}
