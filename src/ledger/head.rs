//! The sidecar head record `<ledger>.head`: the row count and last row hash kept outside
//! the database, in a small text file rewritten atomically after each append.
//!
//! Its format (byte for byte): `fork-ledger-head v1\ncount <rows>\nhead <64 hex>\n`.

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::entry::is_hex64;
use super::LedgerError;

/// First line of the sidecar head record.
const HEAD_MAGIC: &str = "fork-ledger-head v1";
/// The largest head record read (a real one is about 110 bytes).
const MAX_HEAD_BYTES: u64 = 4096;
/// What the first line of every version of the head record starts with.
const HEAD_FAMILY: &str = "fork-ledger-head ";

/// The head record: how many rows were appended and the last one's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct HeadRecord {
    pub(super) count: i64,
    pub(super) head_hash: String,
}

fn render_head(h: &HeadRecord) -> String {
    format!("{HEAD_MAGIC}\ncount {}\nhead {}\n", h.count, h.head_hash)
}

/// Why the sidecar could not be read.
#[derive(Debug)]
pub(super) enum HeadReadError {
    /// It exists but reading it failed (permissions, a directory, ...).
    Io(io::Error),
    /// Its first line names another version of the format (`fork-ledger-head v2`): written
    /// by another (newer) fork, never to be overwritten by this one.
    Version(String),
    /// It is not a head record.
    Malformed(String),
}

impl fmt::Display for HeadReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeadReadError::Io(e) => write!(f, "{e}"),
            HeadReadError::Version(line) => write!(
                f,
                "its first line is `{line}`, a format this fork does not read (this fork reads \
                 `{HEAD_MAGIC}`): it was written by a newer fork"
            ),
            HeadReadError::Malformed(why) => write!(f, "{why}"),
        }
    }
}

/// `Ok(None)` when the file does not exist; `Err(why)` when it is unreadable, malformed or
/// of another format version. Opened without waiting for a FIFO's writer and without
/// following a symbolic link, checked to be a regular file on its descriptor, and read
/// bounded ([`MAX_HEAD_BYTES`]): it is read while the ledger's write lock is held, where a
/// hang would stall every appender.
pub(super) fn read_head_file(path: &Path) -> Result<Option<HeadRecord>, HeadReadError> {
    let file = match crate::fsx::open_own_input(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(HeadReadError::Io(io::Error::new(
                e.kind(),
                "it is a symbolic link (fork writes a regular file there and never follows one)",
            )))
        }
        Err(e) => return Err(HeadReadError::Io(e)),
    };
    let mut raw = Vec::new();
    file.take(MAX_HEAD_BYTES + 1)
        .read_to_end(&mut raw)
        .map_err(HeadReadError::Io)?;
    if raw.len() as u64 > MAX_HEAD_BYTES {
        return Err(HeadReadError::Malformed(format!(
            "it is larger than {MAX_HEAD_BYTES} bytes, far more than a head record holds"
        )));
    }
    let text = String::from_utf8(raw)
        .map_err(|_| HeadReadError::Malformed("it is not text".to_string()))?;
    let bad = |why: &str| HeadReadError::Malformed(why.to_string());
    let mut lines = text.lines();
    match lines.next() {
        Some(HEAD_MAGIC) => {}
        Some(other) if other.starts_with(HEAD_FAMILY) => {
            let shown: String = other.chars().take(40).collect();
            return Err(HeadReadError::Version(shown.escape_debug().to_string()));
        }
        _ => return Err(bad(&format!("the first line is not `{HEAD_MAGIC}`"))),
    }
    let count = lines
        .next()
        .and_then(|l| l.strip_prefix("count "))
        .and_then(|c| c.parse::<i64>().ok())
        .filter(|&c| c >= 0)
        .ok_or_else(|| bad("the second line is not `count <rows>`"))?;
    let head_hash = lines
        .next()
        .and_then(|l| l.strip_prefix("head "))
        .filter(|h| is_hex64(h))
        .ok_or_else(|| bad("the third line is not `head <64 hex digits>`"))?
        .to_string();
    if lines.next().is_some() {
        return Err(bad("it has extra lines"));
    }
    Ok(Some(HeadRecord { count, head_hash }))
}

/// The sidecar's text for `h`, as a shell command that writes it to `path` (for an error
/// that tells the user how to re-anchor by hand).
pub(super) fn rewrite_command(path: &Path, h: &HeadRecord) -> String {
    format!(
        "printf '{HEAD_MAGIC}\\ncount {}\\nhead {}\\n' > '{}'",
        h.count,
        h.head_hash,
        path.display().to_string().replace('\'', "'\\''")
    )
}

/// Atomically replaces the sidecar: unique temporary file (0600), fsync, rename, fsync
/// of the directory.
pub(super) fn write_head_file(path: &Path, h: &HeadRecord) -> io::Result<()> {
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => d.to_path_buf(),
        None => PathBuf::from("."),
    };
    // Hidden, as fork's other temporaries (`.<name>.tmp-...`): a cut write leaves no file a
    // listing of the ledger's directory shows.
    let mut tmp_name = OsString::from(".");
    tmp_name.push(
        path.file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_else(|| OsString::from("ledger.head")),
    );
    tmp_name.push(format!(
        ".tmp-{}.{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(render_head(h).as_bytes())?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        fs::File::open(&dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// The error for a sidecar that could not be read while opening or appending.
pub(super) fn unreadable(path: &Path, head_path: &Path, e: HeadReadError) -> LedgerError {
    match e {
        HeadReadError::Version(line) => LedgerError::HeadVersion {
            path: path.to_path_buf(),
            head_path: head_path.to_path_buf(),
            line,
        },
        other => LedgerError::HeadUnreadable {
            path: path.to_path_buf(),
            head_path: head_path.to_path_buf(),
            why: other.to_string(),
        },
    }
}

/// Before an append (under the database's write lock, after the head table was checked
/// against the last row): the sidecar must agree with the head table `table`. The sidecar
/// is the anchor that shows rows deleted from the end when only the database was edited
/// (head table and all); an append would overwrite it and erase that evidence, so any
/// disagreement, and a missing or unreadable sidecar, is refused, naming both files, what
/// differs and how to repair. Never repaired automatically: an append interrupted between
/// the sidecar's rename and the commit leaves the sidecar one row ahead, exactly as a
/// deleted newest row does, and nothing tells the two apart.
pub(super) fn check_sidecar(
    path: &Path,
    head_path: &Path,
    table: &HeadRecord,
) -> Result<(), LedgerError> {
    let db = path.display();
    let hp = head_path.display();
    let aside = format!(
        "move {db} (with its -wal and -shm files, if any) and {hp} aside, keeping them for \
         inspection, and fork starts a new ledger"
    );
    let side = match read_head_file(head_path) {
        Ok(Some(side)) if side == *table => return Ok(()),
        Ok(Some(side)) => side,
        Ok(None) => {
            return Err(LedgerError::Tampered {
                path: path.to_path_buf(),
                detail: format!(
                    "refusing to append: its head record {hp} is missing (deleted or moved), so \
                     nothing outside the database shows whether rows were deleted from its end, \
                     and an append would write a new one agreeing with whatever the database now \
                     holds; restore {hp} from a backup, or {aside}"
                ),
            })
        }
        Err(e) => return Err(unreadable(path, head_path, e)),
    };
    let (tc, sc) = (table.count, side.count);
    let what = if sc == tc + 1 {
        format!(
            "seq {sc} was deleted from the database and its head table edited to match, or an \
             append was interrupted (fork killed) between writing the head record and \
             committing, which leaves exactly this; only if you know an evaluation was killed \
             while recording its verdict, and nothing else writes the database, re-anchor the \
             head record to the database with `{}`; otherwise restore the database from a \
             backup, or {aside}",
            rewrite_command(head_path, table)
        )
    } else if sc > tc {
        format!(
            "seq {}..{sc} were deleted from the database and its head table edited to match \
             (an interrupted append leaves one row's difference, not {}); restore the database \
             from a backup, or {aside}",
            tc + 1,
            sc - tc
        )
    } else if sc < tc {
        format!(
            "the database holds {}, which the head record never saw: rows added outside an \
             append (or the head record was restored from an older copy); restore both from \
             the same backup, or {aside}",
            seq_range(sc + 1, tc)
        )
    } else {
        format!(
            "seq {tc} was rewritten in the database (or one of the two records edited); \
             restore the database from a backup, or {aside}"
        )
    };
    Err(LedgerError::Tampered {
        path: path.to_path_buf(),
        detail: format!(
            "refusing to append (it would rewrite the head record and erase this evidence): \
             its head table records {tc} rows ending in row hash {}, its head record {hp} \
             records {sc} rows ending in {}: {what}",
            table.head_hash, side.head_hash
        ),
    })
}

/// `seq N`, or `seq N..M` for a range of rows.
pub(super) fn seq_range(from: i64, to: i64) -> String {
    if from == to {
        format!("seq {from}")
    } else {
        format!("seq {from}..{to}")
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::Ledger;
    use super::*;

    /// The command in backticks after `with ` in `msg`.
    fn quoted_command(msg: &str) -> &str {
        let start = msg.find("with `printf").expect(msg) + "with `".len();
        let len = msg[start..].find('`').expect(msg);
        &msg[start..start + len]
    }

    #[test]
    fn append_refuses_a_sidecar_that_disagrees_and_names_the_repair() {
        // The newest row deleted and the head table edited to match: what an append killed
        // between the sidecar's rename and its commit leaves too.
        let (_d, mut l, entries) = ledger_with(3);
        let c = raw(&l);
        c.execute("DELETE FROM entries WHERE seq = 3", []).unwrap();
        c.execute(
            "UPDATE head SET count = 2, head_hash = ?1",
            [&entries[1].row_hash],
        )
        .unwrap();
        let side_before = fs::read(l.head_path()).unwrap();
        let err = l.append(&new_entry(4)).unwrap_err();
        assert!(matches!(err, LedgerError::Tampered { .. }), "{err}");
        let msg = err.to_string();
        for needle in [
            "records 2 rows",
            "records 3 rows",
            "seq 3 was deleted",
            "interrupted",
            &l.path().display().to_string(),
            &l.head_path().display().to_string(),
        ] {
            assert!(msg.contains(needle), "{needle}: {msg}");
        }
        assert_eq!(fs::read(l.head_path()).unwrap(), side_before);
        assert_problem(&l.verify().unwrap(), &[".head", "seq 3", "deleted"]);
        // The repair it names for a known crash is a working command: run it, and the
        // ledger verifies and takes appends again.
        let out = std::process::Command::new("sh")
            .args(["-c", quoted_command(&msg)])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(l.verify().unwrap().ok);
        assert_eq!(l.append(&new_entry(4)).unwrap().seq, 3);
        assert!(l.verify().unwrap().ok);

        // A sidecar behind the database (a row added outside an append, head table and
        // all): refused, without the re-anchoring recipe.
        let (_d, mut l, _) = ledger_with(2);
        let older = fs::read(l.head_path()).unwrap();
        l.append(&new_entry(3)).unwrap();
        fs::write(l.head_path(), &older).unwrap();
        let msg = l.append(&new_entry(4)).unwrap_err().to_string();
        assert!(msg.contains("holds seq 3, which"), "{msg}");
        assert!(!msg.contains("printf"), "{msg}");
        assert_eq!(fs::read(l.head_path()).unwrap(), older);

        // No sidecar at all: refused, and none is written.
        fs::remove_file(l.head_path()).unwrap();
        let err = l.append(&new_entry(4)).unwrap_err();
        assert!(matches!(err, LedgerError::Tampered { .. }), "{err}");
        assert!(err.to_string().contains("is missing"), "{err}");
        assert!(!l.head_path().exists());
    }

    #[test]
    fn an_unreadable_or_newer_sidecar_is_refused_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let head = Ledger::head_path_for(&path);
        let v2 = format!("fork-ledger-head v2\ncount 0\nhead {}\n", "0".repeat(64));
        for (text, want_version) in [("garbage\n", false), (v2.as_str(), true)] {
            fs::write(&head, text).unwrap();
            // No database (and an empty one, which an open would initialise): refused.
            for make_empty in [false, true] {
                if make_empty {
                    fs::write(&path, b"").unwrap();
                }
                let err = Ledger::open(&path).unwrap_err();
                let msg = err.to_string();
                if want_version {
                    assert!(matches!(err, LedgerError::HeadVersion { .. }), "{err}");
                    assert!(msg.contains("fork-ledger-head v2"), "{msg}");
                    assert!(msg.contains("newer fork"), "{msg}");
                } else {
                    assert!(matches!(err, LedgerError::HeadUnreadable { .. }), "{err}");
                }
                assert!(msg.contains(&head.display().to_string()), "{msg}");
                assert_eq!(fs::read_to_string(&head).unwrap(), text);
                let size = fs::metadata(&path).map(|m| m.len()).ok();
                assert_eq!(size, make_empty.then_some(0), "{msg}");
            }
            fs::remove_file(&path).unwrap();
        }

        // Beside a ledger: the append refuses by name, the record is kept.
        let (_d, mut l, _) = ledger_with(1);
        fs::write(l.head_path(), &v2).unwrap();
        let err = l.append(&new_entry(2)).unwrap_err();
        assert!(matches!(err, LedgerError::HeadVersion { .. }), "{err}");
        assert_eq!(fs::read_to_string(l.head_path()).unwrap(), v2);
        assert_problem(&l.verify().unwrap(), &[".head", "v2", "newer fork"]);
        fs::remove_file(l.head_path()).unwrap();
        fs::create_dir(l.head_path()).unwrap();
        let err = l.append(&new_entry(2)).unwrap_err();
        assert!(matches!(err, LedgerError::HeadUnreadable { .. }), "{err}");
        assert_eq!(l.history(None).unwrap().len(), 1);
    }

    /// A FIFO, a symbolic link, a huge file at the sidecar's path: refused at once by
    /// name. A FIFO hung `ledger verify` while it held the write lock (every appender then
    /// waited and gave up), and an append or an open the same way.
    #[test]
    fn a_sidecar_that_is_no_regular_file_is_refused_at_once() {
        let (_d, mut l, _) = ledger_with(1);
        let head = l.head_path().to_path_buf();
        let good = fs::read(&head).unwrap();
        fs::remove_file(&head).unwrap();
        nix::unistd::mkfifo(&head, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // Run on a thread, so a hang fails the test instead of stalling it: a writer
        // opened after the deadline releases a reader stuck on the FIFO.
        let (tx, rx) = std::sync::mpsc::channel();
        let path = l.path().to_path_buf();
        std::thread::spawn(move || {
            let l = Ledger::open_existing(&path).unwrap();
            let _ = tx.send(l.verify().map(|r| r.problems));
        });
        let problems = match rx.recv_timeout(std::time::Duration::from_secs(20)) {
            Ok(r) => r.unwrap(),
            Err(_) => {
                let _ = fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&head);
                panic!("verify hung on a FIFO head record");
            }
        };
        assert!(
            problems
                .iter()
                .any(|p| p.contains(".head") && p.contains("not a regular file")),
            "{problems:?}"
        );
        let err = l.append(&new_entry(2)).unwrap_err();
        assert!(matches!(err, LedgerError::HeadUnreadable { .. }), "{err}");
        assert!(err.to_string().contains("not a regular file"), "{err}");

        // A symbolic link, even to a good record, is not followed.
        fs::remove_file(&head).unwrap();
        let elsewhere = head.with_extension("elsewhere");
        fs::write(&elsewhere, &good).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &head).unwrap();
        let err = l.append(&new_entry(2)).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert!(fs::symlink_metadata(&head).unwrap().is_symlink());

        // A huge file is read only as far as the bound.
        fs::remove_file(&head).unwrap();
        let mut big = good.clone();
        big.resize(1 << 20, b'\n');
        fs::write(&head, &big).unwrap();
        let err = l.append(&new_entry(2)).unwrap_err();
        assert!(err.to_string().contains("larger than 4096 bytes"), "{err}");
        fs::write(&head, &good).unwrap();
        assert_eq!(l.append(&new_entry(2)).unwrap().seq, 2);
    }
}
