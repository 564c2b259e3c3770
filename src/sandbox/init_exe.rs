//! The sandbox init's executable: `fork-init`, a small binary of the same build found
//! beside the `fork` binary. Each sandbox executes it instead of re-executing the whole
//! `fork` binary (a launch's largest fixed cost was relocating and faulting in the 19 MB
//! binary a second time).
//!
//! It is opened and checked once per process: the file must carry this build's id (the
//! line [`BUILD_MARK`], derived from the sources by the build script), so an init left
//! from another build is refused, never run. The sandbox then executes that same open file
//! (`execveat` on the descriptor), not the path, so what was checked is what runs.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::sync::OnceLock;
use thiserror::Error;

/// The init's file name, beside the `fork` binary.
pub const INIT_NAME: &str = "fork-init";
/// This build's id (see `build.rs`).
pub const BUILD_ID: &str = env!("FORK_BUILD_ID");
/// The line `fork-init --build-id` prints; the supervisor looks for it in the file.
pub const BUILD_MARK: &str = concat!("fork-init build ", env!("FORK_BUILD_ID"), "\n");
/// How to get a matching init.
pub const INIT_FIX: &str = "install fork-init from the same build beside fork: `cargo install --path . --locked` installs both binaries, `cargo build --release` builds both into target/release";
/// No init is larger: a bigger file is not one of ours.
const MAX_INIT_BYTES: u64 = 1 << 30;
/// Read at a time while looking for the mark.
const CHUNK: usize = 64 << 10;

/// The init binary is missing or is not this build's (exit 69: the sandbox cannot start).
#[derive(Debug, Clone, Error)]
#[error("the sandbox init {}: {reason}. Fix: {fix}", .path.display())]
pub struct InitExeError {
    pub path: PathBuf,
    pub reason: String,
    pub fix: String,
}

static INIT: OnceLock<Result<File, InitExeError>> = OnceLock::new();

/// Where the init is looked for: beside the running binary.
pub fn init_path() -> PathBuf {
    let exe = std::fs::read_link("/proc/self/exe")
        .or_else(|_| std::env::current_exe())
        .unwrap_or_default();
    exe.parent()
        .map(|d| d.join(INIT_NAME))
        .unwrap_or_else(|| PathBuf::from(INIT_NAME))
}

/// The checked init, open (close-on-exec) for the rest of the process.
pub(crate) fn open() -> Result<BorrowedFd<'static>, InitExeError> {
    match INIT.get_or_init(|| open_checked(init_path())) {
        Ok(f) => Ok(f.as_fd()),
        Err(e) => Err(e.clone()),
    }
}

fn open_checked(path: PathBuf) -> Result<File, InitExeError> {
    let err = |reason: String| InitExeError {
        path: path.clone(),
        reason,
        fix: INIT_FIX.to_string(),
    };
    let mut f = File::open(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => err("is missing".into()),
        _ => err(format!("cannot be opened: {e}")),
    })?;
    let md = f.metadata().map_err(|e| err(format!("stat: {e}")))?;
    if !md.is_file() || md.len() > MAX_INIT_BYTES {
        return Err(err(format!(
            "is not a fork-init binary (not a regular file of at most {MAX_INIT_BYTES} bytes)"
        )));
    }
    // The mark is a constant of the init's read-only data: looked for there first (about
    // 70 KiB of a 2.5 MB release init), then, if not found there, in the whole file.
    let in_rodata = rodata(&f)
        .and_then(|(off, len)| section_contains_mark(&f, off, len).ok())
        .unwrap_or(false);
    if !in_rodata && !contains_mark(&mut f).map_err(|e| err(format!("read: {e}")))? {
        return Err(err(format!(
            "is not from this build of fork (build {BUILD_ID}): a stale or foreign init is never run"
        )));
    }
    Ok(f)
}

/// The file offset and size of an ELF64 little-endian file's `.rodata` section, read from
/// its section headers (three small reads); `None` for anything else.
fn rodata(f: &File) -> Option<(u64, u64)> {
    use std::os::unix::fs::FileExt;
    let u16_at = |b: &[u8], o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |b: &[u8], o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |b: &[u8], o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
    let mut eh = [0u8; 64];
    f.read_exact_at(&mut eh, 0).ok()?;
    // ELF magic, 64-bit class, little-endian.
    if eh[..4] != *b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return None;
    }
    let (shoff, shentsize) = (u64_at(&eh, 0x28)?, u16_at(&eh, 0x3a)? as usize);
    let (shnum, shstrndx) = (u16_at(&eh, 0x3c)? as usize, u16_at(&eh, 0x3e)? as usize);
    // ELF64 section headers are 64 bytes; a table that does not fit in the file (its
    // size was checked by the caller) is not read, so nothing large is ever allocated.
    let file_len = f.metadata().ok()?.len();
    let table = (shentsize * shnum) as u64;
    if shentsize != 64
        || shnum == 0
        || shnum > 4096
        || shstrndx >= shnum
        || shoff.checked_add(table).is_none_or(|end| end > file_len)
    {
        return None;
    }
    let mut sh = vec![0u8; shentsize * shnum];
    f.read_exact_at(&mut sh, shoff).ok()?;
    let hdr = |i: usize| &sh[i * shentsize..(i + 1) * shentsize];
    // (sh_name, sh_offset, sh_size) of section `i`.
    let field = |i: usize| {
        Some((
            u32_at(hdr(i), 0)?,
            u64_at(hdr(i), 0x18)?,
            u64_at(hdr(i), 0x20)?,
        ))
    };
    let (_, str_off, str_len) = field(shstrndx)?;
    if str_len > 1 << 20
        || str_off
            .checked_add(str_len)
            .is_none_or(|end| end > file_len)
    {
        return None;
    }
    let mut names = vec![0u8; str_len as usize];
    f.read_exact_at(&mut names, str_off).ok()?;
    (0..shnum).find_map(|i| {
        let (name, off, len) = field(i)?;
        let n = names.get(name as usize..)?;
        let inside = off.checked_add(len).is_some_and(|end| end <= file_len);
        (n.starts_with(b".rodata\0") && inside).then_some((off, len))
    })
}

/// Whether `len` bytes of the file at `off` hold [`BUILD_MARK`].
fn section_contains_mark(f: &File, off: u64, len: u64) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, off)?;
    Ok(memchr::memmem::find(&buf, BUILD_MARK.as_bytes()).is_some())
}

/// Whether the file holds [`BUILD_MARK`], read in chunks from the start: the mark is in the
/// read-only data near the front, so a build's own init is found without reading its debug
/// information (a debug build's init is over 100 MB).
fn contains_mark(f: &mut File) -> std::io::Result<bool> {
    let mark = BUILD_MARK.as_bytes();
    let finder = memchr::memmem::Finder::new(mark);
    let mut buf = vec![0u8; CHUNK + mark.len()];
    // `keep` bytes of the previous chunk's end stay in front, so a mark across two chunks
    // is found.
    let mut keep = 0;
    loop {
        let n = f.read(&mut buf[keep..])?;
        if n == 0 {
            return Ok(false);
        }
        let end = keep + n;
        if finder.find(&buf[..end]).is_some() {
            return Ok(true);
        }
        keep = (mark.len() - 1).min(end);
        buf.copy_within(end - keep..end, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn missing_and_foreign_inits_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(INIT_NAME);
        let e = open_checked(p.clone()).unwrap_err();
        assert!(e.reason.contains("missing"), "{e}");
        assert!(e.to_string().contains("cargo install"), "{e}");
        std::fs::write(&p, b"#!/bin/sh\nfork-init build 0000\n").unwrap();
        let e = open_checked(p.clone()).unwrap_err();
        assert!(e.reason.contains("not from this build"), "{e}");
        let mut f = std::fs::File::create(&p).unwrap();
        // The mark straddles the first chunk's end.
        f.write_all(&vec![0u8; CHUNK - 5]).unwrap();
        f.write_all(BUILD_MARK.as_bytes()).unwrap();
        drop(f);
        assert!(open_checked(p.clone()).is_ok());
        // Half a mark is not one.
        std::fs::write(&p, &BUILD_MARK.as_bytes()[..BUILD_MARK.len() / 2]).unwrap();
        assert!(open_checked(p).is_err());
    }

    #[test]
    fn the_mark_is_found_in_the_read_only_data_of_this_builds_init() {
        // The init built beside the test binary's crate (cargo builds both binaries).
        let init = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .join(if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            })
            .join(INIT_NAME);
        let Ok(f) = File::open(&init) else {
            eprintln!("fork-test-skip: no {} to look into", init.display());
            return;
        };
        let (off, len) = rodata(&f).expect("an ELF64 init with a .rodata section");
        assert!(len > 0 && len < f.metadata().unwrap().len());
        // (The init may be of an older build than this test: the section is there, and
        // the search itself is what is tested below.)
        let _ = section_contains_mark(&f, off, len).unwrap();
        // Not an ELF file: no section, the whole-file scan decides.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        std::fs::write(&p, BUILD_MARK).unwrap();
        assert!(rodata(&File::open(&p).unwrap()).is_none());
        assert!(open_checked(p).is_ok());
    }
}
