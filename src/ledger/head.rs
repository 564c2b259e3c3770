//! The sidecar head record `<ledger>.head`: the row count and last row hash kept outside
//! the database, in a small text file rewritten atomically after each append.
//!
//! Its format (byte for byte): `fork-ledger-head v1\ncount <rows>\nhead <64 hex>\n`.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::entry::is_hex64;

/// First line of the sidecar head record.
const HEAD_MAGIC: &str = "fork-ledger-head v1";

/// The head record: how many rows were appended and the last one's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct HeadRecord {
    pub(super) count: i64,
    pub(super) head_hash: String,
}

fn render_head(h: &HeadRecord) -> String {
    format!("{HEAD_MAGIC}\ncount {}\nhead {}\n", h.count, h.head_hash)
}

/// `Ok(None)` when the file does not exist; `Err(why)` when it is unreadable or malformed.
pub(super) fn read_head_file(path: &Path) -> Result<Option<HeadRecord>, String> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut lines = text.lines();
    if lines.next() != Some(HEAD_MAGIC) {
        return Err(format!("the first line is not `{HEAD_MAGIC}`"));
    }
    let count = lines
        .next()
        .and_then(|l| l.strip_prefix("count "))
        .and_then(|c| c.parse::<i64>().ok())
        .filter(|&c| c >= 0)
        .ok_or("the second line is not `count <rows>`")?;
    let head_hash = lines
        .next()
        .and_then(|l| l.strip_prefix("head "))
        .filter(|h| is_hex64(h))
        .ok_or("the third line is not `head <64 hex digits>`")?
        .to_string();
    if lines.next().is_some() {
        return Err("it has extra lines".to_string());
    }
    Ok(Some(HeadRecord { count, head_hash }))
}

/// Atomically replaces the sidecar: unique temporary file (0600), fsync, rename, fsync
/// of the directory.
pub(super) fn write_head_file(path: &Path, h: &HeadRecord) -> io::Result<()> {
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => d.to_path_buf(),
        None => PathBuf::from("."),
    };
    let mut tmp_name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| OsString::from("ledger.head"));
    tmp_name.push(format!(
        ".tmp.{}.{}",
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
