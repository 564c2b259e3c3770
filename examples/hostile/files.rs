//! File probes: write, read, list, and writes through a symlink or a hard link.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::{Outcome, MARK};

fn append_mark(path: &Path) -> io::Result<usize> {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(MARK)?;
    Ok(MARK.len())
}

pub(crate) fn write_file_probe(path: &Path) -> Outcome {
    match append_mark(path) {
        Ok(n) => Outcome::ok(format!("wrote {n} bytes to {}", path.display())).with("bytes", n),
        Err(e) => Outcome::io(&e, &format!("write {}", path.display())),
    }
}

pub(crate) fn read_file_probe(path: &Path) -> Outcome {
    let read = || -> io::Result<usize> {
        let mut buf = Vec::with_capacity(4096);
        File::open(path)?.take(4096).read_to_end(&mut buf)?;
        Ok(buf.len())
    };
    match read() {
        Ok(n) => Outcome::ok(format!("read {n} bytes of {}", path.display())).with("bytes", n),
        Err(e) => Outcome::io(&e, &format!("read {}", path.display())),
    }
}

pub(crate) fn list_dir_probe(path: &Path) -> Outcome {
    match sorted_names(path, 256) {
        Ok((names, total)) => Outcome::ok(format!("{total} entries in {}", path.display()))
            .with("count", total)
            .with("entries", names),
        Err(e) => Outcome::io(&e, &format!("list {}", path.display())),
    }
}

/// Up to `cap` sorted names, and the total count.
pub(crate) fn sorted_names(path: &Path, cap: usize) -> io::Result<(Vec<String>, usize)> {
    let mut names: Vec<String> = fs::read_dir(path)?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let total = names.len();
    names.truncate(cap);
    Ok((names, total))
}

pub(crate) fn symlink_escape_probe(dir: &Path, target: &Path) -> Outcome {
    let link = dir.join(format!("fork-hostile-link-{}", std::process::id()));
    if let Err(e) = std::os::unix::fs::symlink(target, &link) {
        return Outcome::io(&e, &format!("symlink {}", link.display()));
    }
    write_through(&link, target)
}

pub(crate) fn hardlink_probe(dir: &Path, target: &Path) -> Outcome {
    let link = dir.join(format!("fork-hostile-hardlink-{}", std::process::id()));
    if let Err(e) = fs::hard_link(target, &link) {
        return Outcome::io(
            &e,
            &format!("link {} to {}", link.display(), target.display()),
        )
        .with("linked", false);
    }
    write_through(&link, target)
}

/// Appends the mark to `target` through `link` (made by the caller, removed here).
fn write_through(link: &Path, target: &Path) -> Outcome {
    let out = match append_mark(link) {
        Ok(n) => Outcome::ok(format!(
            "wrote {n} bytes to {} through {}",
            target.display(),
            link.display()
        )),
        Err(e) => Outcome::io(&e, &format!("write through {}", link.display())),
    };
    let _ = fs::remove_file(link);
    out.with("linked", true)
}
