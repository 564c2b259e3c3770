//! Every path an evaluation will write, checked before any work: an unwritable `--junit`
//! or `--summary` found only after an hour-long evaluation would cost that hour.
//!
//! The checks create nothing. A file that exists must be a regular file (or a character
//! device such as /dev/null) that this process may write, and when it is replaced by a
//! rename (a regular file: see [`crate::outfile::replace_file`]) its directory must be
//! writable too; a file that does not exist yet needs an existing, writable directory.
//! `--out` must not exist, must name a directory of its own (a final component, no `..`),
//! and the nearest of its ancestors that exists must be a writable directory (the bundle's
//! parents are created). And no output may lie in the runtime's source tree unless the
//! manifest's `exclude` leaves it out ([`check_outside_source`]).

use super::request::Request;
use super::EvaluateError;
use crate::manifest::Manifest;
use nix::unistd::{access, AccessFlags};
use std::path::{Component, Path, PathBuf};

/// Checks `--out`'s parent, `--junit` and `--summary` of a request; an error names the
/// flag, the path and the problem.
pub fn check(a: &Request) -> Result<(), EvaluateError> {
    if let Some(out) = &a.out {
        check_out(out)?;
    }
    if let Some(p) = a.ci.junit.as_deref() {
        check_file("--junit", p)?;
    }
    if let Some(p) = a.ci.summary.as_deref() {
        // `--summary "$GITHUB_STEP_SUMMARY"` is appended to, never replaced.
        if step_summary().is_some_and(|s| same_file(p, &s)) {
            check_file_in_place("--summary", p)?;
        } else {
            check_file("--summary", p)?;
        }
    }
    Ok(())
}

/// `$GITHUB_STEP_SUMMARY`, when it names a file.
fn step_summary() -> Option<PathBuf> {
    std::env::var_os(crate::verdict::report::STEP_SUMMARY_ENV)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => a == b,
    }
}

fn usage(flag: &str, p: &Path, problem: impl std::fmt::Display) -> EvaluateError {
    EvaluateError::Usage(format!(
        "{flag} {}: {problem} (checked before anything runs)",
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

/// The file `flag` names, as [`crate::outfile::replace_file`] will write it: a missing
/// file needs a writable directory; an existing one must be writable, and when it is a
/// regular file (not a link, no other hard links), which is replaced by a temporary file
/// renamed over it, its directory must be writable too. An error is a usage error naming
/// the flag and the path.
pub fn check_file(flag: &str, p: &Path) -> Result<(), EvaluateError> {
    use std::os::unix::fs::MetadataExt;
    check_file_in_place(flag, p)?;
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.file_type().is_file() && m.nlink() == 1 => {
            let dir = parent_of(p);
            access(dir, AccessFlags::W_OK | AccessFlags::X_OK).map_err(|e| {
                usage(
                    flag,
                    p,
                    format!(
                        "its directory {} is not writable ({e}), and the file is replaced whole: written there under a temporary name, then renamed over it",
                        dir.display()
                    ),
                )
            })
        }
        _ => Ok(()),
    }
}

/// [`check_file`] for a file written in place (appended to): its directory matters only
/// when it does not exist yet.
fn check_file_in_place(flag: &str, p: &Path) -> Result<(), EvaluateError> {
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
    // The bundle is built beside its final name and renamed to it: `--out` must end in a
    // name of its own (`newp/..` would name an existing directory once `newp` is made).
    if out.components().any(|c| c == Component::ParentDir) {
        return Err(usage(
            "--out",
            out,
            "has a `..` component: name the new directory itself, without `..`",
        ));
    }
    if out.file_name().is_none() {
        return Err(usage(
            "--out",
            out,
            "names no new directory (no final component): give the path of a directory to create",
        ));
    }
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

/// Refuses every output of the evaluation that lies in the runtime's source tree (paths
/// resolved through their links, as the tree's walk reaches them) unless the manifest's
/// `exclude` leaves it out: the tree is copied into every successor and hashed into the
/// cache's key, so an output there (a bundle under the default `./fork-out` of an
/// evaluation run in the runtime) would be copied into the next evaluation's successor,
/// change its source hash (no cached verdict would ever be reused) and make `fork verify
/// --tree` fail. The outputs: `--out` (`out_dir`), `--junit`, `--summary`,
/// `$GITHUB_STEP_SUMMARY` and the ledger's directory (its WAL and head record are written
/// beside it). The error (a usage error) names each, the tree and the fix.
pub fn check_outside_source(
    a: &Request,
    runtime: &Path,
    manifest: &Manifest,
    out_dir: &Path,
    ledger: Option<&Path>,
) -> Result<(), EvaluateError> {
    let Ok(source) = std::fs::canonicalize(runtime.join(&manifest.runtime.source)) else {
        // The manifest's check refuses a missing source; the copy would fail on it anyway.
        return Ok(());
    };
    let excludes = crate::fork::tree::build_excludes(&manifest.runtime.exclude)
        .map_err(|e| EvaluateError::Input(format!("{}: {e}", manifest.file.display())))?;
    let mut outputs: Vec<(String, PathBuf)> = vec![("--out".into(), out_dir.to_path_buf())];
    outputs.extend(a.ci.junit.clone().map(|p| ("--junit".into(), p)));
    outputs.extend(a.ci.summary.clone().map(|p| ("--summary".into(), p)));
    outputs.extend(step_summary().map(|p| ("$GITHUB_STEP_SUMMARY".into(), p)));
    if let Some(l) = ledger {
        outputs.push((
            format!("the ledger {}'s directory", l.display()),
            parent_of(l).to_path_buf(),
        ));
    }
    // The tools directory is copied into every workspace and hashed into the cache's
    // conditions too, and nothing excludes anything in it: an output there is refused.
    let tools = manifest
        .runtime
        .tools
        .as_ref()
        .and_then(|t| std::fs::canonicalize(runtime.join(t)).ok());
    let mut inside = Vec::new();
    let mut patterns = Vec::new();
    for (what, path) in outputs {
        // A path that cannot be resolved (a loop of links) is not taken on trust.
        let Some(real) = resolve(&path) else {
            return Err(EvaluateError::Usage(format!(
                "{what} {}: its links cannot be followed to a place (a loop?): give a plain path",
                path.display()
            )));
        };
        if let Some(t) = tools.as_ref().filter(|t| real.starts_with(t)) {
            return Err(EvaluateError::Usage(format!(
                "{what} {} lies inside the runtime's tools directory {} (fork.toml's `tools`), which every evaluation copies into its successor and hashes into the conditions a cached verdict is matched on. To fix: write it outside the tools directory (checked before anything runs)",
                path.display(),
                t.display()
            )));
        }
        let Some(rel) = real.strip_prefix(&source).ok().map(Path::to_path_buf) else {
            continue;
        };
        let mut prefix = PathBuf::new();
        let excluded = rel.components().any(|c| {
            prefix.push(c);
            excludes.is_match(&prefix)
        });
        if excluded {
            continue;
        }
        inside.push(format!("{what} {}", path.display()));
        // The output's top directory (or file) in the tree; the tree's root itself cannot
        // be excluded.
        if let Some(Component::Normal(top)) = rel.components().next() {
            let top = format!("{:?}", globset::escape(&top.to_string_lossy()));
            if !patterns.contains(&top) {
                patterns.push(top);
            }
        }
    }
    if inside.is_empty() {
        return Ok(());
    }
    let listed = manifest
        .runtime
        .exclude
        .iter()
        .map(|p| format!("{p:?}"))
        .chain(patterns.iter().cloned())
        .collect::<Vec<_>>()
        .join(", ");
    let them = if inside.len() == 1 { "it" } else { "them" };
    let fix = if patterns.is_empty() {
        format!("write {them} outside the tree")
    } else {
        format!(
            "leave {them} out of the tree, `exclude = [{listed}]` under [runtime] in {}; or write {them} outside the tree",
            runtime.join(crate::manifest::MANIFEST_FILE).display()
        )
    };
    Err(EvaluateError::Usage(format!(
        "{} inside the runtime's source tree {} (fork.toml's `source`), which every evaluation copies into its successor and hashes: each evaluation would carry the last one's outputs into the next (its source hash would change every time, so no cached verdict would be reused, and `fork verify --tree` would not match). To fix: {fix} (checked before anything runs)",
        match inside.len() {
            1 => format!("{} lies", inside[0]),
            _ => format!("{} lie", inside.join(", ")),
        },
        source.display()
    )))
}

/// Where a write to `p` lands: `p` made absolute, then walked a component at a time, each
/// symbolic link followed (a dangling one too: writing through it creates its target) and
/// each `..` taken from where the walk is (a missing directory followed by `..`, which a
/// writer creating the directories first would reach, included). `None` for a loop of
/// links (more than 40 followed) or a link that cannot be read.
fn resolve(p: &Path) -> Option<PathBuf> {
    use std::collections::VecDeque;
    let abs = std::path::absolute(p).ok()?;
    let mut todo: VecDeque<std::ffi::OsString> = VecDeque::new();
    let push_all = |todo: &mut VecDeque<std::ffi::OsString>, path: &Path, front: bool| {
        let parts: Vec<_> = path
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_os_string()),
                Component::ParentDir => Some("..".into()),
                _ => None,
            })
            .collect();
        if front {
            for part in parts.into_iter().rev() {
                todo.push_front(part);
            }
        } else {
            todo.extend(parts);
        }
    };
    push_all(&mut todo, &abs, false);
    let mut out = PathBuf::from("/");
    let mut links = 0;
    while let Some(part) = todo.pop_front() {
        if part == ".." {
            out.pop();
            continue;
        }
        let next = out.join(&part);
        match std::fs::symlink_metadata(&next) {
            Ok(m) if m.file_type().is_symlink() => {
                links += 1;
                if links > 40 {
                    return None;
                }
                let target = std::fs::read_link(&next).ok()?;
                if target.is_absolute() {
                    out = PathBuf::from("/");
                }
                push_all(&mut todo, &target, true);
            }
            _ => out = next,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// Where a write lands: through a dangling link (writing creates its target), through
    /// `missing/..` (a writer that creates `missing` first lands beside it), never through a
    /// loop of links.
    #[test]
    fn resolve_follows_dangling_links_and_dot_dot_after_a_missing_directory() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir(base.join("tree")).unwrap();
        std::fs::create_dir(base.join("ci")).unwrap();
        std::os::unix::fs::symlink(base.join("tree/junit.xml"), base.join("ci/j.xml")).unwrap();
        assert_eq!(
            resolve(&base.join("ci/j.xml")),
            Some(base.join("tree/junit.xml"))
        );
        std::os::unix::fs::symlink("../tree", base.join("ci/rel")).unwrap();
        assert_eq!(
            resolve(&base.join("ci/rel/new/x.xml")),
            Some(base.join("tree/new/x.xml"))
        );
        assert_eq!(
            resolve(&base.join("tree/nonexist/../l.db")),
            Some(base.join("tree/l.db"))
        );
        std::os::unix::fs::symlink(base.join("loop2"), base.join("loop1")).unwrap();
        std::os::unix::fs::symlink(base.join("loop1"), base.join("loop2")).unwrap();
        assert_eq!(resolve(&base.join("loop1/x")), None);
    }

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
            (req(Some(d.path().join("newp/..")), None, None), "--out"),
            (req(Some(d.path().join("newp/../o")), None, None), "--out"),
        ] {
            let e = check(&r).unwrap_err();
            assert!(matches!(e, EvaluateError::Usage(_)), "{e}");
            let s = e.to_string();
            assert!(s.starts_with(flag), "{s}");
            assert!(s.contains(&d.path().display().to_string()), "{s}");
        }
    }
}
