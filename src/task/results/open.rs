//! The hostile-file opener: how the supervisor reads what the sandboxed successor left in its
//! reports directory, through [`crate::fsx`] (no link followed anywhere, regular files only,
//! bounded size), refusing hard-linked files too, with errors that name the report.

use std::path::Path;

use crate::fsx::{self, FsxError};

use super::ResultsError;

/// The default cap on one report file: 16 MiB.
pub const DEFAULT_MAX_REPORT_BYTES: u64 = 16 * 1024 * 1024;

/// Read `rel` beneath `reports_dir` without following any symbolic link, refusing anything
/// that is not a regular, singly linked file of at most `max_bytes` bytes
/// (use [`DEFAULT_MAX_REPORT_BYTES`] unless the task says otherwise).
///
/// `reports_dir` itself must not be a symbolic link either (the successor could have replaced
/// it); the directories above it belong to the supervisor and are trusted.
pub fn read_report_file(
    reports_dir: &Path,
    rel: &str,
    max_bytes: u64,
) -> Result<Vec<u8>, ResultsError> {
    let full = reports_dir.join(rel);
    let error = |e: FsxError| match e {
        FsxError::BadPath { reason, .. } => ResultsError::BadPath {
            rel: rel.to_string(),
            reason,
        },
        FsxError::Symlink { component } => ResultsError::Symlink {
            path: full.clone(),
            component,
        },
        FsxError::WrongType {
            component,
            kind,
            expected,
        } => ResultsError::WrongType {
            path: full.clone(),
            component,
            kind,
            expected,
        },
        FsxError::Missing { .. } => ResultsError::Missing { path: full.clone() },
        FsxError::TooLarge { size, max } => ResultsError::TooLarge {
            path: full.clone(),
            size,
            max,
        },
        FsxError::Io { op, source, .. } => ResultsError::Io {
            path: full.clone(),
            op,
            source,
        },
    };
    // Check the path before touching the directory, so a bad declaration is named as such.
    fsx::check_relative(rel).map_err(error)?;
    let dir = fsx::open_dir(reports_dir, false).map_err(|e| match e {
        FsxError::Io { source, .. } => ResultsError::Io {
            path: full.clone(),
            op: "open of the reports directory",
            source,
        },
        other => error(other),
    })?;
    let opened = fsx::open_beneath(&dir, rel, max_bytes).map_err(error)?;
    if opened.links > 1 {
        return Err(ResultsError::HardLinked {
            path: full.clone(),
            links: opened.links,
        });
    }
    opened.read_all().map_err(error)
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::results::ResultsError;
    use nix::sys::stat::Mode;
    use std::fs::File;
    use std::os::unix::fs::symlink;

    fn reports() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn reads_a_regular_file_in_a_subdirectory() {
        let d = reports();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/tests.xml"), b"<testsuites/>").unwrap();
        let got = read_report_file(d.path(), "sub/tests.xml", DEFAULT_MAX_REPORT_BYTES).unwrap();
        assert_eq!(got, b"<testsuites/>");
        let got = read_report_file(d.path(), "./sub/./tests.xml", 13).unwrap();
        assert_eq!(got.len(), 13);
    }

    #[test]
    fn refuses_bad_relative_paths() {
        let d = reports();
        for rel in ["", "/etc/passwd", "../x", "a/../../x", ".", "a\0b"] {
            let e = read_report_file(d.path(), rel, 100).unwrap_err();
            assert!(matches!(e, ResultsError::BadPath { .. }), "{rel:?}: {e}");
        }
    }

    #[test]
    fn missing_file_is_named() {
        let d = reports();
        let e = read_report_file(d.path(), "tests.xml", 100).unwrap_err();
        assert!(matches!(e, ResultsError::Missing { .. }), "{e}");
        assert!(e.to_string().contains("tests.xml"));
    }

    #[test]
    fn refuses_symlinks_in_any_component() {
        let d = reports();
        let outside = reports();
        std::fs::write(outside.path().join("secret"), b"key material").unwrap();
        std::fs::create_dir(outside.path().join("dir")).unwrap();
        std::fs::write(outside.path().join("dir/tests.xml"), b"x").unwrap();
        // final component
        symlink(outside.path().join("secret"), d.path().join("tests.xml")).unwrap();
        let e = read_report_file(d.path(), "tests.xml", 100).unwrap_err();
        assert!(matches!(e, ResultsError::Symlink { .. }), "{e}");
        // intermediate component
        symlink(outside.path().join("dir"), d.path().join("sub")).unwrap();
        let e = read_report_file(d.path(), "sub/tests.xml", 100).unwrap_err();
        assert!(
            matches!(&e, ResultsError::Symlink { component, .. } if component == "sub"),
            "{e}"
        );
        // a dangling link is still a link, not "missing"
        symlink("/nonexistent/nowhere", d.path().join("dangling")).unwrap();
        let e = read_report_file(d.path(), "dangling", 100).unwrap_err();
        assert!(matches!(e, ResultsError::Symlink { .. }), "{e}");
        // the reports directory itself replaced by a link
        let link_dir = d.path().join("reports-link");
        symlink(outside.path(), &link_dir).unwrap();
        let e = read_report_file(&link_dir, "secret", 100).unwrap_err();
        assert!(matches!(e, ResultsError::Symlink { .. }), "{e}");
    }

    #[test]
    fn refuses_fifos_directories_and_hard_links_without_blocking() {
        let d = reports();
        nix::unistd::mkfifo(&d.path().join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        let e = read_report_file(d.path(), "fifo", 100).unwrap_err();
        assert!(
            matches!(&e, ResultsError::WrongType { kind: "FIFO", .. }),
            "{e}"
        );
        std::fs::create_dir(d.path().join("dir")).unwrap();
        let e = read_report_file(d.path(), "dir", 100).unwrap_err();
        assert!(matches!(e, ResultsError::WrongType { .. }), "{e}");
        std::fs::write(d.path().join("file"), b"x").unwrap();
        let e = read_report_file(d.path(), "file/child", 100).unwrap_err();
        assert!(matches!(e, ResultsError::WrongType { .. }), "{e}");
        std::fs::hard_link(d.path().join("file"), d.path().join("file2")).unwrap();
        let e = read_report_file(d.path(), "file2", 100).unwrap_err();
        assert!(
            matches!(e, ResultsError::HardLinked { links: 2, .. }),
            "{e}"
        );
        let e = read_report_file(d.path(), "/dev/zero", 100).unwrap_err();
        assert!(matches!(e, ResultsError::BadPath { .. }), "{e}");
    }

    #[test]
    fn refuses_oversized_files() {
        let d = reports();
        std::fs::write(d.path().join("big"), vec![b'a'; 4097]).unwrap();
        let e = read_report_file(d.path(), "big", 4096).unwrap_err();
        assert!(
            matches!(
                e,
                ResultsError::TooLarge {
                    size: 4097,
                    max: 4096,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(read_report_file(d.path(), "big", 4097).unwrap().len(), 4097);
        // sparse 1 GiB file: refused from fstat, nothing is read
        let f = File::create(d.path().join("sparse")).unwrap();
        f.set_len(1 << 30).unwrap();
        let e = read_report_file(d.path(), "sparse", DEFAULT_MAX_REPORT_BYTES).unwrap_err();
        assert!(matches!(e, ResultsError::TooLarge { .. }), "{e}");
    }
}
