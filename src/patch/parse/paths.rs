//! File names in a patch: C-style quoted names, the `a/`/`b/` prefixes, `/dev/null`, the
//! two names of `diff --git A B`, UTF-8 checking, and the normal form of a path
//! ([`tidy`], [`verify_path`]): what fork evaluates must be what `git apply` deploys.

use super::{err, find, Parser, PatchError};

impl Parser<'_> {
    /// Reads a `--- ` or `+++ ` line's path (`None` for /dev/null).
    pub(super) fn marker_path(&self, prefix: &[u8]) -> Result<Option<String>, PatchError> {
        let l = self.lines[self.i];
        let rest = &l[prefix.len()..];
        marker_name(rest, self.lineno())
    }
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
pub(super) fn path_text(rest: &[u8], line: usize) -> Result<String, PatchError> {
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
    Ok(tidy(utf8(&bytes, line)?))
}

/// A `--- `/`+++ `/`Binary files` name: quoted or cut at a tab; `/dev/null` is `None`;
/// otherwise the first path component (the `a/` prefix) is stripped.
pub(super) fn marker_name(rest: &[u8], line: usize) -> Result<Option<String>, PatchError> {
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

/// Strips the first component (`a/`, `b/`, `old/`) as `git apply -p1` does, then
/// [`tidy`]. Absolute paths and paths starting with `..` are kept whole so the gates can
/// see them.
pub fn strip_prefix(path: &str) -> String {
    stripped(path).to_string()
}

/// [`strip_prefix`], borrowed.
fn stripped(path: &str) -> &str {
    if path.starts_with('/') {
        return path;
    }
    match path.split_once('/') {
        Some(("..", _)) | None => path,
        Some((_, rest)) => tidied(rest),
    }
}

/// The one normalisation fork does: a leading `./` (repeated) is dropped, so `./x` and
/// `x` are one path (and two entries naming them are caught as duplicates). Nothing else
/// is rewritten: `//`, inner `.` and `..` components are left for [`verify_path`] to
/// refuse (`git apply` squashes `//`, so normalising it here would hide an alias).
pub fn tidy(path: String) -> String {
    let kept = tidied(&path);
    if kept.len() == path.len() {
        return path;
    }
    kept.to_string()
}

/// [`tidy`], borrowed.
fn tidied(path: &str) -> &str {
    let mut rest = path;
    while let Some(r) = rest.strip_prefix("./") {
        rest = r;
    }
    if rest.is_empty() || rest.starts_with('/') {
        // Dropping would leave an empty or absolute path: keep it whole so that
        // `verify_path` refuses it.
        return path;
    }
    rest
}

/// The longest `diff --git` line read (its names): two paths of at most 4,095 bytes
/// (Linux's `PATH_MAX` with its NUL), each behind its `a/` or `b/`, C-quoted at up to
/// four bytes per byte, with their quotes and the space between (32,781 bytes). A longer
/// line names no path any filesystem could hold, and the split of its names, tried at
/// every space, must stay cheap.
const MAX_GIT_HEADER_NAMES: usize = 2 * (4 * (4095 + 2) + 2) + 1;

/// Checks that a (tidied) patch path is in the one spelling git would also use, as
/// git's `verify_path` does: relative, no NUL byte, no empty component (`//` or a
/// trailing `/`), no `.` or `..` component, and no `.git` component in any case.
/// Returns what is wrong, for a gate's message.
pub fn verify_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("empty path".into());
    }
    if path.contains('\0') {
        return Err("the path contains a NUL byte".into());
    }
    if path.starts_with('/') {
        return Err("absolute path; a patch may only name paths inside the tree".into());
    }
    for c in path.split('/') {
        match c {
            "" => {
                return Err(
                    "empty path component (`//` or a trailing `/`): `git apply` would squash \
                     it into another path than the one evaluated"
                        .into(),
                )
            }
            "." => return Err("`.` component: name the path without it".into()),
            ".." => return Err("`..` component: the path escapes the tree".into()),
            c if c.eq_ignore_ascii_case(".git") => {
                return Err("`.git` component: a patch may not write git's own files".into())
            }
            _ => {}
        }
    }
    Ok(())
}

/// The two names of `diff --git A B` when they can be told apart, prefixes stripped.
pub(super) fn git_header_names(
    rest: &[u8],
    line: usize,
) -> Result<Option<(String, String)>, PatchError> {
    if rest.len() > MAX_GIT_HEADER_NAMES {
        return err(
            line,
            format!(
                "a `diff --git` line of {} bytes: its two names can be at most {MAX_GIT_HEADER_NAMES} bytes (paths of at most 4,095 bytes, quoted)",
                rest.len() + "diff --git ".len()
            ),
        );
    }
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
    // Unquoted names may contain spaces: pick the split where both names agree (compared
    // borrowed, lengths first: no copy per space).
    let spaces: Vec<usize> = text.match_indices(' ').map(|(i, _)| i).collect();
    for &sp in &spaces {
        let (a, b) = (stripped(&text[..sp]), stripped(&text[sp + 1..]));
        if a == b {
            return Ok(Some((a.to_string(), b.to_string())));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_header_is_split_in_bounded_time_or_refused() {
        // A name of spaces: every space is a candidate split. At the bound the split is
        // still cheap (no copy per space); past it the line is refused by its length.
        let names = |n: usize| format!("a/{} b/{}", "x ".repeat(n), "y ".repeat(n));
        let started = std::time::Instant::now();
        let at = names((MAX_GIT_HEADER_NAMES - 6) / 4);
        assert!(at.len() <= MAX_GIT_HEADER_NAMES);
        assert_eq!(git_header_names(at.as_bytes(), 1).unwrap(), None);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        let past = names(MAX_GIT_HEADER_NAMES / 4 + 1);
        let e = git_header_names(past.as_bytes(), 1).unwrap_err();
        assert!(e.message.contains("can be at most"), "{}", e.message);
        // The ordinary cases still split where the names agree.
        assert_eq!(
            git_header_names(b"a/my file.txt b/my file.txt", 1).unwrap(),
            Some(("my file.txt".to_string(), "my file.txt".to_string()))
        );
        assert_eq!(
            git_header_names(b"a/./x b/x", 1).unwrap(),
            Some(("x".to_string(), "x".to_string()))
        );
    }

    #[test]
    fn strip_prefix_keeps_what_the_gates_must_see() {
        assert_eq!(strip_prefix("a/src/x"), "src/x");
        assert_eq!(strip_prefix("/etc/passwd"), "/etc/passwd");
        assert_eq!(strip_prefix("../x"), "../x");
        assert_eq!(strip_prefix("a/../x"), "../x");
        assert_eq!(strip_prefix("file"), "file");
        assert_eq!(strip_prefix("a/./x"), "x");
        assert_eq!(strip_prefix("a/././x/y"), "x/y");
        assert_eq!(strip_prefix("a/.//x"), ".//x");
        assert_eq!(strip_prefix("a/x//y"), "x//y");
    }

    #[test]
    fn verify_path_refuses_what_git_would_spell_otherwise() {
        assert!(verify_path("hermes/compressor.py").is_ok());
        assert!(verify_path(".github/ci.yml").is_ok());
        for (p, why) in [
            ("", "empty path"),
            ("hermes//compressor.py", "empty path component"),
            ("hermes/", "empty path component"),
            ("hermes/./x.py", "`.` component"),
            (".", "`.` component"),
            ("hermes/../../x", "`..` component"),
            ("/etc/passwd", "absolute path"),
            (".git/hooks/post-checkout", "`.git` component"),
            ("sub/.GIT/config", "`.git` component"),
            ("a\0b", "NUL byte"),
        ] {
            let e = verify_path(p).expect_err(p);
            assert!(e.contains(why), "{p}: {e}");
        }
    }

    #[test]
    fn tidy_drops_only_a_leading_dot_slash() {
        assert_eq!(tidy("./x".into()), "x");
        assert_eq!(tidy("././x".into()), "x");
        assert_eq!(tidy("x/./y".into()), "x/./y");
        assert_eq!(tidy("./".into()), "./");
        assert_eq!(tidy(".//x".into()), ".//x");
        assert_eq!(tidy(".x".into()), ".x");
    }
}
