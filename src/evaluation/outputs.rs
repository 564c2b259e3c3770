//! Every path an evaluation will write, checked before any work: an unwritable `--junit`
//! or `--summary` found only after an hour-long evaluation would cost that hour.
//!
//! The checks create nothing. A file that exists must be a regular file (or a character
//! device such as /dev/null) that this process may write; a file that does not exist yet
//! needs an existing, writable directory. `--out` must not exist, and the nearest of its
//! ancestors that exists must be a writable directory (the bundle's parents are created).

use super::request::Request;
use super::EvaluateError;
use nix::unistd::{access, AccessFlags};
use std::path::Path;

/// Checks `--out`'s parent, `--junit` and `--summary` of a request; an error names the
/// flag, the path and the problem.
pub fn check(a: &Request) -> Result<(), EvaluateError> {
    if let Some(out) = &a.out {
        check_out(out)?;
    }
    for (flag, path) in [
        ("--junit", a.ci.junit.as_deref()),
        ("--summary", a.ci.summary.as_deref()),
    ] {
        if let Some(p) = path {
            check_file(flag, p)?;
        }
    }
    Ok(())
}

fn usage(flag: &str, p: &Path, problem: impl std::fmt::Display) -> EvaluateError {
    EvaluateError::Usage(format!(
        "{flag} {}: {problem} (checked before the evaluation starts)",
        p.display()
    ))
}

/// The directory a relative path with no parent lives in.
fn parent_of(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

fn writable_dir(flag: &str, p: &Path, dir: &Path) -> Result<(), EvaluateError> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => access(dir, AccessFlags::W_OK | AccessFlags::X_OK).map_err(|e| {
            usage(
                flag,
                p,
                format!("its directory {} is not writable: {e}", dir.display()),
            )
        }),
        Ok(_) => Err(usage(
            flag,
            p,
            format!("{} is not a directory", dir.display()),
        )),
        Err(e) => Err(usage(
            flag,
            p,
            format!("its directory {}: {e}", dir.display()),
        )),
    }
}

fn check_file(flag: &str, p: &Path) -> Result<(), EvaluateError> {
    if p.as_os_str().is_empty() {
        return Err(usage(flag, p, "an empty path"));
    }
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => Err(usage(flag, p, "is a directory")),
        Ok(_) => {
            access(p, AccessFlags::W_OK).map_err(|e| usage(flag, p, format!("not writable: {e}")))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => writable_dir(flag, p, parent_of(p)),
        Err(e) => Err(usage(flag, p, e)),
    }
}

fn check_out(out: &Path) -> Result<(), EvaluateError> {
    if std::fs::symlink_metadata(out).is_ok() {
        // plan() says so in its own words; nothing more to check here.
        return Ok(());
    }
    let mut dir = parent_of(out);
    loop {
        match std::fs::symlink_metadata(dir) {
            Ok(_) => return writable_dir("--out", out, dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match dir.parent() {
                Some(d) if !d.as_os_str().is_empty() => dir = d,
                _ => return writable_dir("--out", out, Path::new(".")),
            },
            Err(e) => return Err(usage("--out", out, format!("{}: {e}", dir.display()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn req(out: Option<PathBuf>, junit: Option<PathBuf>, summary: Option<PathBuf>) -> Request {
        let mut r = Request::new("p.diff".into(), ".".into());
        r.out = out;
        r.ci.junit = junit;
        r.ci.summary = summary;
        r
    }

    #[test]
    fn names_the_flag_and_path_of_an_unwritable_output() {
        let d = tempfile::tempdir().unwrap();
        let ok = req(
            Some(d.path().join("new/deeper/out")),
            Some(d.path().join("j.xml")),
            Some(PathBuf::from("/dev/null")),
        );
        check(&ok).unwrap();
        let file = d.path().join("file");
        std::fs::write(&file, "x").unwrap();
        for (r, flag) in [
            (
                req(None, Some(d.path().join("no/such/j.xml")), None),
                "--junit",
            ),
            (req(None, None, Some(d.path().to_path_buf())), "--summary"),
            (req(Some(file.join("out")), None, None), "--out"),
            (req(None, Some(file.join("j.xml")), None), "--junit"),
        ] {
            let e = check(&r).unwrap_err();
            assert!(matches!(e, EvaluateError::Usage(_)), "{e}");
            let s = e.to_string();
            assert!(s.starts_with(flag), "{s}");
            assert!(s.contains(&d.path().display().to_string()), "{s}");
        }
    }
}
