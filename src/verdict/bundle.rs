//! The signed verdict bundle on disk: all that survives a run.
//!
//! ```text
//! out/<run-id>/
//!   verdict.json            the verdict document, pretty JSON (what `--json` prints)
//!   verdict.dsse.json       DSSE envelope, payloadType application/vnd.in-toto+json:
//!                           an in-toto Statement v1 whose predicate is the verdict and
//!                           whose subjects are the patch, the patched source tree and
//!                           verdict.json's bytes; signed by the run's ephemeral key
//!   endorsement.dsse.json   DSSE envelope, payloadType application/vnd.in-toto+json: an
//!                           in-toto Statement v1, the node key's endorsement of that
//!                           ephemeral key for this run (subject: the verdict statement)
//!   artifacts/<name>        evidence files, each listed in the verdict with sha256 and size
//! ```
//! Every JSON file is pretty-printed with a final newline, and `fork verify` requires the
//! envelopes in exactly that form (and verdict.json byte for byte, through its signed
//! digest), so any change to any byte of the bundle is detected. Verdicts of schema 1.0-1.3
//! are signed in the earlier format (see [`crate::verdict::sign`]).
//!
//! The bundle is built in a temporary directory next to the destination
//! (`.<name>.partial-XXXXXX`, which `fork gc` may delete) and renamed into place with
//! `RENAME_NOREPLACE`, so a crash never leaves a half bundle under the final name and an
//! existing bundle is never replaced.

use crate::identity::{EphemeralKey, NodeKey, PublicKey, SigningIdentity};
use crate::ioerr::{IoContext, IoError};
pub use crate::verdict::bundle_error::BundleError;
use crate::verdict::bundle_limit;
use crate::verdict::sign::{self, Endorsement};
use crate::verdict::{Artifact, ArtifactType, Verdict};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The verdict document.
pub const VERDICT_FILE: &str = "verdict.json";
/// The verdict's DSSE envelope.
pub const VERDICT_ENVELOPE_FILE: &str = "verdict.dsse.json";
/// The endorsement's DSSE envelope.
pub const ENDORSEMENT_FILE: &str = "endorsement.dsse.json";
/// The artifacts directory.
pub const ARTIFACTS_DIR: &str = "artifacts";
/// In a bundle received over the mesh from a node that publishes only its verdict: says the
/// artifacts were withheld (their hashes stay signed in the verdict).
pub const WITHHELD_FILE: &str = "artifacts.withheld";
/// Infix of the temporary directory a bundle is built in (`.<name>.partial-XXXXXX`).
pub const PARTIAL_INFIX: &str = ".partial-";

/// A bundle that was written.
#[derive(Debug, Clone)]
pub struct WrittenBundle {
    /// The bundle directory.
    pub dir: PathBuf,
    /// The verdict as written (artifacts and successor_key filled in).
    pub verdict: Verdict,
    /// The endorsement as signed.
    pub endorsement: Endorsement,
    /// The node key that endorsed it.
    pub node_key: PublicKey,
}

/// A file name safe for `artifacts/`: letters, digits, `.`, `_`, `-`; not hidden.
pub(crate) fn sanitize_name(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.starts_with('.') {
        s.insert(0, '_');
    }
    if s.is_empty() {
        s.push_str("artifact");
    }
    s.truncate(200);
    s
}

fn pick_name(used: &mut HashSet<String>, kind: ArtifactType, source: &Path) -> String {
    let base = sanitize_name(
        &source
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    // Lazily: the numbered names are made only while the earlier ones are taken (making
    // all 10 000 up front cost about a millisecond per artifact).
    let candidates = [base.clone(), format!("{}-{base}", kind.as_str())]
        .into_iter()
        .chain((2..).take(10_000).map(|i| format!("{i}-{base}")));
    for c in candidates {
        if used.insert(c.clone()) {
            return c;
        }
    }
    // 10 000 artifacts with one name: fall back on a counter nobody used.
    let c = format!("{}-{base}", used.len());
    used.insert(c.clone());
    c
}

/// Copies `source` (a regular file, symlinks never followed, FIFOs never waited on) to the
/// new file `dest`, hashing what is copied. Returns (bare hex sha256, bytes, the copy, not
/// yet synced: see [`sync_together`]).
fn copy_artifact(source: &Path, dest: &Path) -> Result<(String, u64, fs::File), BundleError> {
    let mut input = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(source)
    {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(BundleError::ArtifactNotRegular {
                path: source.to_path_buf(),
            })
        }
        Err(e) => return Err(IoError::new("open artifact", source, e).into()),
    };
    let meta = input.metadata().ctx("stat", source)?;
    if !meta.file_type().is_file() {
        return Err(BundleError::ArtifactNotRegular {
            path: source.to_path_buf(),
        });
    }
    let mut output = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dest)
        .ctx("create", dest)?;
    private(&output, dest)?;
    let mut hasher = Sha256::new();
    let mut buf = [0u8; crate::fsx::READ_BUF];
    let mut bytes = 0u64;
    loop {
        let n = input.read(&mut buf).ctx("read", source)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        output.write_all(&buf[..n]).ctx("write", dest)?;
        bytes += n as u64;
    }
    Ok((hex::encode(hasher.finalize()), bytes, output))
}

/// Bundles are readable by the invoking user only: files 0600, directories 0700, set on
/// the descriptor whatever the umask.
fn private(f: &fs::File, path: &Path) -> Result<(), BundleError> {
    let mode = if f.metadata().ctx("stat", path)?.is_dir() {
        0o700
    } else {
        0o600
    };
    Ok(f.set_permissions(fs::Permissions::from_mode(mode))
        .ctx("set permissions on", path)?)
}

/// Writes the new file `path`; returns it, not yet synced (see [`sync_together`]).
fn write_new(path: &Path, bytes: &[u8]) -> Result<fs::File, BundleError> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .ctx("create", path)?;
    private(&f, path)?;
    f.write_all(bytes).ctx("write", path)?;
    Ok(f)
}

fn sync_dir(dir: &Path) -> Result<(), BundleError> {
    Ok(fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx("sync directory", dir)?)
}

/// At most this many fsyncs run at once.
const SYNC_THREADS: usize = 8;

/// fsyncs every file (and directory) of `files` at once, on a thread each (at most
/// [`SYNC_THREADS`]), and returns when all are durable. The same fsyncs as one after the
/// other, but the filesystem commits them together: on ext4 each fsync of a new file
/// waits for its own journal commit and disk flush, while concurrent ones share one
/// (measured on the development machine: 7 small files and their directory, 15 ms one by
/// one, 2 ms together).
fn sync_together(files: &[(fs::File, PathBuf)]) -> Result<(), BundleError> {
    let per = files.len().div_ceil(SYNC_THREADS).max(1);
    std::thread::scope(|s| {
        let workers: Vec<_> = files
            .chunks(per)
            .map(|group| {
                s.spawn(move || -> Result<(), BundleError> {
                    for (f, path) in group {
                        f.sync_all().ctx("sync", path)?;
                    }
                    Ok(())
                })
            })
            .collect();
        let mut result = Ok(());
        for w in workers {
            let r = w.join().unwrap_or_else(|_| {
                Err(IoError::new(
                    "sync",
                    Path::new("the bundle"),
                    io::Error::other("a syncing thread panicked"),
                )
                .into())
            });
            if result.is_ok() {
                result = r;
            }
        }
        result
    })
}

/// Writes the signed bundle to `out_dir` (which must not exist; its parent is created).
///
/// The artifacts are copied into `artifacts/` (regular files only, never following
/// symlinks; names sanitized, and made unique with a `<type>-` or `<n>-` prefix), hashed
/// as they are copied, and listed in the verdict, replacing its `artifacts`; the verdict's
/// `successor_key` is set to `ephemeral`'s public key. The verdict must then pass
/// [`Verdict::validate`]. It is signed by `ephemeral` and endorsed by `node`; see the
/// module docs for the layout. The caller destroys the ephemeral key afterwards.
pub fn write_bundle(
    out_dir: &Path,
    verdict: &Verdict,
    artifacts: &[(ArtifactType, PathBuf)],
    ephemeral: &EphemeralKey,
    node: &NodeKey,
) -> Result<WrittenBundle, BundleError> {
    let go = || Ok::<(), std::convert::Infallible>(());
    match write_bundle_then(out_dir, verdict, artifacts, ephemeral, node, || {}, go)? {
        Ok(w) => Ok(w),
        Err(never) => match never {},
    }
}

/// [`write_bundle`], with `sources_read` run once every artifact has been copied into the
/// bundle (nothing reads the `artifacts` paths after it), and `before_publish` once the
/// whole bundle is written and synced under its temporary name, just before it takes its
/// name: when that fails, the partial bundle is removed, nothing is published, and its
/// error is returned (inner). (An evaluation starts removing its staging directory at the
/// first and joins that and its sandbox teardowns at the second: they overlap the
/// bundle's writing and syncing.)
pub fn write_bundle_then<E>(
    out_dir: &Path,
    verdict: &Verdict,
    artifacts: &[(ArtifactType, PathBuf)],
    ephemeral: &EphemeralKey,
    node: &NodeKey,
    sources_read: impl FnOnce(),
    before_publish: impl FnOnce() -> Result<(), E>,
) -> Result<Result<WrittenBundle, E>, BundleError> {
    if fs::symlink_metadata(out_dir).is_ok() {
        return Err(BundleError::Exists {
            path: out_dir.to_path_buf(),
        });
    }
    let (parent, tmp) = partial_dir(out_dir)?;
    let staging = tmp.path().to_path_buf();

    // Artifacts first: their hashes go into the verdict.
    let art_dir = staging.join(ARTIFACTS_DIR);
    fs::create_dir(&art_dir).ctx("create directory", &art_dir)?;
    private(&fs::File::open(&art_dir).ctx("open", &art_dir)?, &art_dir)?;
    let mut used = HashSet::new();
    let mut listed = Vec::with_capacity(artifacts.len());
    // Every file of the bundle and both its directories, synced together before the
    // bundle takes its name.
    let mut unsynced = Vec::with_capacity(artifacts.len() + 5);
    for (kind, source) in artifacts {
        let file = pick_name(&mut used, *kind, source);
        let dest = art_dir.join(&file);
        let (sha256, bytes, copy) = copy_artifact(source, &dest)?;
        unsynced.push((copy, dest));
        listed.push(Artifact {
            kind: *kind,
            path: format!("{ARTIFACTS_DIR}/{file}"),
            sha256,
            bytes,
        });
    }

    crate::trace::mark("bundle: artifacts copied");
    sources_read();

    let mut verdict = verdict.clone();
    verdict.artifacts = listed;
    verdict.successor_key = ephemeral.public().to_string();
    // Validated and signed; never larger than `fork verify` reads (a verdict that would be
    // is recorded without its metrics, never as an approval).
    let signed = bundle_limit::sign_within(verdict, ephemeral, bundle_limit::MAX_JSON_BYTES)?;
    let verdict = signed.verdict;
    let (endorsement, endorsement_env) =
        sign::endorse(&verdict, &signed.payload, &ephemeral.public(), node)?;

    for (file, bytes) in [
        (VERDICT_FILE, signed.document),
        (VERDICT_ENVELOPE_FILE, signed.envelope),
        (ENDORSEMENT_FILE, endorsement_env.to_json_pretty()?),
    ] {
        let path = staging.join(file);
        unsynced.push((write_new(&path, &bytes)?, path));
    }
    fs::set_permissions(&staging, fs::Permissions::from_mode(0o700))
        .ctx("set permissions on", &staging)?;
    for dir in [&art_dir, &staging] {
        unsynced.push((fs::File::open(dir).ctx("open", dir)?, dir.clone()));
    }
    // Every file and directory durable before the rename makes the bundle visible: a
    // crash leaves no bundle or a whole one.
    crate::trace::mark("bundle: signed and written");
    sync_together(&unsynced)?;
    if let Err(e) = before_publish() {
        // `tmp` drops: the partial bundle is removed.
        return Ok(Err(e));
    }

    rename_no_replace(&parent, &staging, out_dir)?;
    // The directory now has its final name; nothing is left to clean up.
    let _ = tmp.keep();
    sync_dir(&parent)?;
    Ok(Ok(WrittenBundle {
        dir: out_dir.to_path_buf(),
        verdict,
        endorsement,
        node_key: node.public_key(),
    }))
}

/// The directory a bundle for `out_dir` is assembled in: a hidden `.<name>.partial-*`
/// beside it (its parent made as needed), removed when dropped unless kept; and the parent.
fn partial_dir(out_dir: &Path) -> Result<(PathBuf, tempfile::TempDir), BundleError> {
    let name = out_dir
        .file_name()
        .ok_or_else(|| {
            IoError::new(
                "use as a bundle directory",
                out_dir,
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "the path has no final component",
                ),
            )
        })?
        .to_string_lossy()
        .into_owned();
    let parent = match out_dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).ctx("create directory", &parent)?;
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}{PARTIAL_INFIX}"))
        .tempdir_in(&parent)
        .ctx("create a temporary directory in", &parent)?;
    Ok((parent, tmp))
}

/// A copy of the bundle at `from` (a verified one: the cache's) published at `out_dir` as
/// a written bundle is: copied under a temporary name beside it, every file and directory
/// synced, then renamed into place without replacing anything, so `out_dir` holds the
/// whole bundle or nothing (an error or an interrupt leaves no half bundle under its name).
pub fn copy_bundle(from: &Path, out_dir: &Path) -> Result<(), BundleError> {
    if fs::symlink_metadata(out_dir).is_ok() {
        return Err(BundleError::Exists {
            path: out_dir.to_path_buf(),
        });
    }
    let (parent, tmp) = partial_dir(out_dir)?;
    let staged = tmp.path().to_path_buf();
    crate::fork::workspace::copy_tree(from, &staged, &[]).map_err(|e| {
        IoError::new(
            "copy the bundle to",
            &staged,
            io::Error::other(e.to_string()),
        )
    })?;
    let mut unsynced = Vec::new();
    let mut dirs = vec![staged.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).ctx("read directory", &dir)? {
            let path = entry.ctx("read directory", &dir)?.path();
            let kind = fs::symlink_metadata(&path).ctx("stat", &path)?.file_type();
            if kind.is_dir() {
                dirs.push(path);
            } else if kind.is_file() {
                unsynced.push((fs::File::open(&path).ctx("open", &path)?, path));
            }
        }
        unsynced.push((fs::File::open(&dir).ctx("open", &dir)?, dir));
    }
    sync_together(&unsynced)?;
    rename_no_replace(&parent, &staged, out_dir)?;
    // The directory now has its final name; nothing is left to clean up.
    let _ = tmp.keep();
    sync_dir(&parent)?;
    Ok(())
}

/// Renames `from` to `to` (both in `parent`), failing if `to` exists.
fn rename_no_replace(parent: &Path, from: &Path, to: &Path) -> Result<(), BundleError> {
    let dir = fs::File::open(parent).ctx("open directory", parent)?;
    let from_name = from.file_name().unwrap_or_default();
    let to_name = to.file_name().unwrap_or_default();
    match nix::fcntl::renameat2(
        &dir,
        from_name,
        &dir,
        to_name,
        nix::fcntl::RenameFlags::RENAME_NOREPLACE,
    ) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EEXIST) => Err(BundleError::Exists {
            path: to.to_path_buf(),
        }),
        Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOSYS) => {
            // A filesystem without RENAME_NOREPLACE: check, then rename (a small window).
            if fs::symlink_metadata(to).is_ok() {
                return Err(BundleError::Exists {
                    path: to.to_path_buf(),
                });
            }
            Ok(fs::rename(from, to).ctx("move the bundle to", to)?)
        }
        Err(e) => Err(IoError::new("move the bundle to", to, io::Error::from(e)).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copied_bundle_is_whole_and_never_replaces_anything() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("cached");
        fs::create_dir_all(from.join(ARTIFACTS_DIR)).unwrap();
        fs::write(from.join(VERDICT_FILE), "{}").unwrap();
        fs::write(from.join(ARTIFACTS_DIR).join("patch.diff"), "p").unwrap();
        let out = dir.path().join("out");
        copy_bundle(&from, &out).unwrap();
        assert_eq!(fs::read(out.join(VERDICT_FILE)).unwrap(), b"{}");
        assert_eq!(fs::read(out.join("artifacts/patch.diff")).unwrap(), b"p");
        // Nothing but the two directories: no partial copy left beside them.
        let mut names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["cached", "out"]);
        // An existing --out is never replaced, even an empty directory.
        let empty = dir.path().join("empty");
        fs::create_dir(&empty).unwrap();
        assert!(matches!(
            copy_bundle(&from, &empty),
            Err(BundleError::Exists { .. })
        ));
        assert_eq!(fs::read_dir(&empty).unwrap().count(), 0);
    }

    #[test]
    fn names_are_sanitized_and_unique() {
        let mut used = HashSet::new();
        let p = Path::new("/r/tests.xml");
        assert_eq!(
            pick_name(&mut used, ArtifactType::TestReport, p),
            "tests.xml"
        );
        assert_eq!(
            pick_name(&mut used, ArtifactType::BaselineTestReport, p),
            "baseline_test_report-tests.xml"
        );
        assert_eq!(
            pick_name(&mut used, ArtifactType::BaselineTestReport, p),
            "2-tests.xml"
        );
        assert_eq!(sanitize_name(".hidden"), "_.hidden");
        assert_eq!(sanitize_name("a b/ç"), "a_b__");
        assert_eq!(sanitize_name(""), "artifact");
        for name in ["tests.xml", "_.hidden", "a_b__"] {
            assert!(crate::verdict::is_valid_artifact_path(&format!(
                "artifacts/{name}"
            )));
        }
    }
}
