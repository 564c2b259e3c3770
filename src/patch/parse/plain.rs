//! A plain `diff -u` entry (`--- old` / `+++ new` and its hunks), and the lines of
//! `diff -r` output between entries that carry no change (`diff …`, `Index:`, `Only in`).

use super::hunks::check_hunks;
use super::{err, show, ChangeKind, FilePatch, Hunk, Parser, PatchError};

impl Parser<'_> {
    pub(super) fn plain_file(&mut self) -> Result<FilePatch, PatchError> {
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
        let file = plain_entry(
            (old, new),
            false,
            hunks,
            start,
            "both `---` and `+++` are /dev/null",
        )?;
        check_hunks(&file)?;
        Ok(file)
    }
}

/// An entry named only by its old and new names, without git's extended headers (a text
/// entry, or a `binary` one from `Binary files … differ`): it creates, deletes or modifies
/// by which side is /dev/null (`None`); both sides /dev/null is the error `both_null`.
pub(super) fn plain_entry(
    (old, new): (Option<String>, Option<String>),
    binary: bool,
    hunks: Vec<Hunk>,
    start: usize,
    both_null: &str,
) -> Result<FilePatch, PatchError> {
    let kind = match (&old, &new) {
        (None, None) => return err(start, both_null),
        (None, Some(_)) => ChangeKind::Create,
        (Some(_), None) => ChangeKind::Delete,
        (Some(_), Some(_)) => ChangeKind::Modify,
    };
    Ok(FilePatch {
        old_path: old,
        new_path: new,
        kind,
        old_mode: None,
        new_mode: None,
        binary,
        similarity: None,
        hunks,
        line: start,
    })
}

pub(super) fn is_plain_noise(l: &[u8]) -> bool {
    (l.starts_with(b"diff ") && !l.starts_with(b"diff --git "))
        || l.starts_with(b"Index: ")
        || l.starts_with(b"Only in ")
        || (l.len() >= 10 && l.iter().all(|&b| b == b'='))
}

#[cfg(test)]
mod tests {
    use super::super::tests::parse_ok;
    use super::*;

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
}
