//! Text from outside (a bundle, the bus, a successor's output, a path) made safe to show
//! people and to write in a report: control characters spelled out as visible escapes, and
//! paths that are not UTF-8 written lossily instead of failing the whole document.
//!
//! The one implementation the command line ([`crate::cli::safe_text`]) and the library's
//! human reports (consensus, proposals, the steward's) use.

use serde::Serializer;
use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// `s` as one line a terminal shows as it is: every control character (C0, DEL and C1:
/// ESC, CR and `\n` among them) spelled as an escape (`\x1b`, `\r`, `\n`, `\x9b`), a tab
/// as a space. A serde error quoting a field name from a hostile bundle can then neither
/// move the cursor, nor clear or colour a line, nor start a line of its own.
pub fn safe_text(s: &str) -> Cow<'_, str> {
    escape(s, false)
}

/// As [`safe_text`], but `\n` is kept: for text laid out on several lines by fork itself
/// (a report whose fields were made safe one by one, a TOML error's snippet).
pub fn safe_lines(s: &str) -> Cow<'_, str> {
    escape(s, true)
}

fn escape(s: &str, keep_newlines: bool) -> Cow<'_, str> {
    let shown = |c: char| !c.is_control() || (keep_newlines && c == '\n');
    if s.chars().all(shown) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            c if shown(c) => out.push(c),
            '\t' => out.push(' '),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            // Every control character (Unicode's Cc) is below U+0100.
            c => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

/// Serializes a path as text, lossily (bytes that are not UTF-8 become U+FFFD): serde's own
/// refuses such a path, and with it the whole report (`--json` printed nothing, exit 70).
/// For `#[serde(serialize_with = "crate::text::lossy_path")]`.
pub fn lossy_path<S: Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&p.to_string_lossy())
}

/// [`lossy_path`] for an optional path (`null` when absent).
pub fn lossy_opt_path<S: Serializer>(p: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
    match p {
        Some(p) => s.serialize_some(&*p.to_string_lossy()),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_spelled_out() {
        let hostile = "unknown field `\u{1b}[2K\r\u{1b}[32mvalid: APPROVE\u{9b}\u{7f}\n`";
        let one = safe_text(hostile);
        assert_eq!(
            one,
            "unknown field `\\x1b[2K\\r\\x1b[32mvalid: APPROVE\\x9b\\x7f\\n`"
        );
        assert!(!one.chars().any(char::is_control));
        let lines = safe_lines("a\u{1b}b\n\tc\r");
        assert_eq!(lines, "a\\x1bb\n c\\r");
        // Text without control characters is not copied.
        assert!(matches!(safe_text("plain, é ✓"), Cow::Borrowed(_)));
        assert!(matches!(safe_lines("two\nlines"), Cow::Borrowed(_)));
    }

    #[test]
    fn paths_that_are_not_utf8_serialize_lossily() {
        use std::os::unix::ffi::OsStrExt;
        #[derive(serde::Serialize)]
        struct R {
            #[serde(serialize_with = "lossy_path")]
            p: PathBuf,
            #[serde(serialize_with = "lossy_opt_path")]
            o: Option<PathBuf>,
            #[serde(serialize_with = "lossy_opt_path")]
            n: Option<PathBuf>,
        }
        let bad = PathBuf::from(std::ffi::OsStr::from_bytes(b"bnd\xff"));
        let r = R {
            p: bad.clone(),
            o: Some(bad),
            n: None,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"p":"bnd�","o":"bnd�","n":null}"#
        );
    }
}
