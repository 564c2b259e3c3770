//! Binary entries: `Binary files A and B differ` (from `diff`, or inside a git entry) and
//! the base85 blocks of `GIT binary patch`, which are checked for shape and skipped, never
//! decoded.

use super::paths::marker_name;
use super::plain::plain_entry;
use super::{err, find, show, FilePatch, Parser, PatchError};

impl Parser<'_> {
    pub(super) fn skip_binary_data(&mut self) -> Result<(), PatchError> {
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

    pub(super) fn plain_binary(&mut self, l: &[u8]) -> Result<FilePatch, PatchError> {
        let start = self.lineno();
        let inner = &l[b"Binary files ".len()..l.len() - b" differ".len()];
        let Some(pos) = find(inner, b" and ") else {
            return err(start, "expected `Binary files OLD and NEW differ`");
        };
        let old = marker_name(&inner[..pos], start)?;
        let new = marker_name(&inner[pos + 5..], start)?;
        self.i += 1;
        plain_entry(
            (old, new),
            true,
            Vec::new(),
            start,
            "both sides of `Binary files` are /dev/null",
        )
    }
}

fn is_base85_line(data: &[u8]) -> bool {
    !data.is_empty()
        && data.len() % 5 == 0
        && data
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&()*+-;<=>?@^_`{|}~".contains(&b))
}
