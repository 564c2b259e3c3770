//! Writing a file the user named as an output (a CI report, `fork run --report`, the step
//! summary): whole or not at all where it can be replaced, and never waiting to open one.
//!
//! A named output may be a FIFO (`mkfifo`, a shell's `>(...)`): opened plainly for writing,
//! one with no reader waits for a reader forever, and the process then answers no signal
//! it merely flags. So every output is opened with `O_NONBLOCK`: a FIFO (or socket) with no
//! reader is an error at once (`ENXIO`), named as such; then the descriptor is made
//! blocking again for the write, so a reader that reads slowly is waited for (and an
//! interrupt still ends the process: `gc::end_on_interrupt`).

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Opens `path` for writing (created when missing, 0666 less the umask; truncated, or
/// with `append` appended to), without waiting for a reader: a FIFO nobody reads is an
/// error (`ENXIO`, said in words) instead of a wait. The file is blocking once open.
pub fn open_output(path: &Path, append: bool) -> io::Result<File> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true);
    if append {
        o.append(true);
    } else {
        o.truncate(true);
    }
    let f = o
        .custom_flags((OFlag::O_NONBLOCK | OFlag::O_NOCTTY).bits())
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENXIO) => io::Error::new(
                e.kind(),
                "nothing has it open for reading (a FIFO or socket with no reader): not waiting for one",
            ),
            _ => e,
        })?;
    let flags = OFlag::from_bits_truncate(fcntl(&f, FcntlArg::F_GETFL).map_err(io::Error::from)?);
    fcntl(&f, FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK)).map_err(io::Error::from)?;
    Ok(f)
}

/// Writes `bytes` as the file at `path`, whole or not at all: into a temporary file beside
/// it (`.<name>.tmp-XXXXXX`, with the old file's mode bits, else 0644 less the umask),
/// synced, then renamed over it, so a reader (a CI step parsing a report) never sees it
/// half written and a failure leaves the old file, if any, as it was (a process killed
/// part way leaves at most that hidden temporary file). Only a missing path or a regular
/// file that is not a link is replaced so: anything else (a symbolic link, `/dev/stdout`,
/// a FIFO, a file with other hard links) is written through in place ([`open_output`]),
/// as a plain write would, since a rename would replace the link or split the links
/// instead of writing their file.
pub fn replace_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let mode = match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_file() || m.nlink() > 1 => {
            return open_output(path, false)?.write_all(bytes);
        }
        Ok(m) => m.mode() & 0o7777,
        Err(_) => 0o644,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().unwrap_or_else(|| OsStr::new("file"));
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.tmp-", name.to_string_lossy()))
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_replaced_file_is_whole_and_nothing_is_left_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("report.xml");
        replace_file(&p, b"first").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"first");
        replace_file(&p, b"second, longer").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"second, longer");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("report.xml")]);
        // A directory that cannot take the file: an error, the old file as it was.
        assert!(replace_file(&dir.path().join("missing/report.xml"), b"x").is_err());
        // Not a regular file (a device): written in place, never replaced by a rename.
        replace_file(Path::new("/dev/null"), b"gone").unwrap();
        // A link to a file: written through, the link kept; the old mode kept.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("link.xml");
        symlink(&p, &link).unwrap();
        replace_file(&link, b"through").unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&p).unwrap(), b"through");
        replace_file(&p, b"mode").unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device());
    }

    #[test]
    fn a_fifo_nobody_reads_is_an_error_at_once_one_read_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("j.xml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let t = std::time::Instant::now();
        let e = replace_file(&fifo, b"report").unwrap_err();
        assert!(e.to_string().contains("no reader"), "{e}");
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
        assert!(open_output(&fifo, true).is_err());
        // With a reader: written, and the descriptor is blocking again.
        let reader = std::thread::spawn({
            let fifo = fifo.clone();
            move || std::fs::read(fifo).unwrap()
        });
        let f = loop {
            match open_output(&fifo, false) {
                Ok(f) => break f,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        };
        let flags = OFlag::from_bits_truncate(fcntl(&f, FcntlArg::F_GETFL).unwrap());
        assert!(!flags.contains(OFlag::O_NONBLOCK));
        (&f).write_all(b"report").unwrap();
        drop(f);
        assert_eq!(reader.join().unwrap(), b"report");
    }
}
