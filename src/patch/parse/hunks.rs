//! The `@@ -a,b +c,d @@` hunks of one file: their headers, bodies held to exactly the
//! counted lines, `\ No newline at end of file` markers, and their order.

use super::{err, show, ChangeKind, FilePatch, Hunk, HunkLine, LineKind, Parser, PatchError};

impl Parser<'_> {
    pub(super) fn hunks(&mut self) -> Result<Vec<Hunk>, PatchError> {
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
pub(super) fn check_hunks(file: &FilePatch) -> Result<(), PatchError> {
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

#[cfg(test)]
mod tests {
    use super::super::tests::parse_ok;

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
}
