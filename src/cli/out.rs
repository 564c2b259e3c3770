//! Results on stdout: written through one lock and flushed, so a write that fails (a full
//! disk, `> /dev/full`) is exit 74 with one line on stderr, never a panic; and made safe
//! for a terminal ([`safe_text`], [`safe_lines`]): text from a bundle, the bus or a
//! successor never reaches it with a control character in it.

use crate::cli::exit::{self, CliError};
use crate::text::{safe_lines, safe_text};
use std::io::Write as _;

/// Writes `text` to stdout as it is, and flushes.
fn write_stdout(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| {
            CliError::new(
                exit::IO_ERROR,
                format!("cannot write the result to stdout: {e}"),
            )
        })
}

/// Prints one line: every control character in it spelled out, `\n` included.
pub fn line(text: impl AsRef<str>) -> Result<(), CliError> {
    let mut s = safe_text(text.as_ref()).into_owned();
    s.push('\n');
    write_stdout(&s)
}

/// Prints text laid out on several lines (a report ending with its newline): control
/// characters spelled out, `\n` kept. Reports make their fields safe one by one, so no
/// field starts a line of its own.
pub fn lines(text: impl AsRef<str>) -> Result<(), CliError> {
    write_stdout(&safe_lines(text.as_ref()))
}

/// Prints `value` as pretty JSON and a newline (`--json`); exit 70 if it cannot be
/// encoded. serde escapes U+0000 to U+001F; [`escape_c1`] escapes DEL and the C1 controls.
pub fn json<T: serde::Serialize>(value: &T) -> Result<(), CliError> {
    let mut doc =
        serde_json::to_string_pretty(value).map_err(|e| CliError::new(exit::INTERNAL, e))?;
    doc.push('\n');
    write_stdout(&escape_c1(&doc))
}

/// Prints a JSON document already encoded (the verdict, as signed), and a newline.
pub fn json_bytes(doc: &[u8]) -> Result<(), CliError> {
    let mut s = escape_c1(&String::from_utf8_lossy(doc)).into_owned();
    s.push('\n');
    write_stdout(&s)
}

/// JSON text with DEL and the C1 controls (U+007F to U+009F, which a terminal may read as
/// escape sequences: U+009B is CSI) written as `\u00XX` escapes. They can stand only inside
/// strings (JSON's own syntax is ASCII), so the value read back is the same.
fn escape_c1(doc: &str) -> std::borrow::Cow<'_, str> {
    let c1 = |c: char| ('\u{7f}'..='\u{9f}').contains(&c);
    if !doc.contains(c1) {
        return std::borrow::Cow::Borrowed(doc);
    }
    let mut out = String::with_capacity(doc.len() + 16);
    for c in doc.chars() {
        if c1(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Says `message` on stderr as `fork: <message>`, control characters spelled out (`\n`
/// kept: a TOML error's snippet spans lines). Best effort: a closed stderr is no panic.
pub fn error(message: &str) {
    let _ = writeln!(std::io::stderr(), "fork: {}", safe_lines(message));
}

#[cfg(test)]
mod tests {
    #[test]
    fn c1_controls_in_json_are_escaped_and_read_back_the_same() {
        let v = serde_json::json!({"k\u{9b}2J": "a\u{7f}b\u{85}c", "plain": "é"});
        let doc = serde_json::to_string(&v).unwrap();
        let safe = super::escape_c1(&doc);
        assert!(
            !safe.contains(|c: char| ('\u{7f}'..='\u{9f}').contains(&c)),
            "{safe}"
        );
        assert!(safe.contains("\\u009b"), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back, v);
    }
}
