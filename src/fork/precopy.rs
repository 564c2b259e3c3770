//! Rollback journal, a large database (a file of at least
//! [`SnapshotOptions::precopy_min_bytes`]): the one-image copy of `raw.rs` with its lock
//! shortened.
//!
//! The file's bytes are first copied with no lock held (the kernel's copy, as in
//! `raw.rs`): the parent commits meanwhile, so that copy may hold pages of several states
//! and is trusted for nothing. Then, under the shared lock the read transaction holds (no
//! commit can pass it, so the file's first `page_count * page_size` bytes are the
//! committed state), the copy is compared with the live file block by block, each 4 KiB
//! that differs is copied again, what the file grew by is copied, and a copy longer than
//! the database is cut. When the lock goes, every byte of the copy has been read from the
//! committed state or compared equal to it under the lock: the copy holds exactly the
//! bytes `raw.rs` copies.
//!
//! What it changes: a committing writer waits for one reading of both files (the
//! comparison reads from the page cache into two small buffers; measured about half of
//! the kernel's copy of the file, which is what the writer waited for before) plus the
//! pages it changed meanwhile; the snapshot as a whole takes about that reading longer.
//! BLAKE3's pieces are hashed behind the unlocked copy, and those the comparison rewrote,
//! grew or cut are hashed again (`pieces.rs`); SHA-256 hashes the finished copy.
//!
//! A parent that did not commit meanwhile pays no comparison. Before the unlocked copy a
//! first, short read transaction takes the shared lock (so no commit is writing the file)
//! and reads the file's change time (ctime, which every `write` sets and no call can set
//! back; a write through a shared writable mapping to a page already dirty sets nothing,
//! but SQLite writes through one only when built with `SQLITE_MMAP_READWRITE`) with the
//! clock's current tick. Under the second lock, a change time, modification
//! time and length still the same, on a filesystem that keeps them in the inode for every
//! write (ext2/3/4, XFS, Btrfs, tmpfs, F2FS), prove that no byte was written between the
//! two locks: the copy, made between them, is then the committed state without being
//! read again. A write after the first lock is stamped with a later tick (or, on a
//! filesystem with fine-grained stamps, a time after the one read): so the proof is only
//! taken when the change time read was already before the current tick (before the
//! current second on a filesystem stamping whole seconds); otherwise, and
//! on any other filesystem (network and FUSE filesystems may report cached times), every
//! byte is compared. The copy's own change time is checked too, as a guard against
//! another writer of fork's private staging (not a proof: a write within the tick of
//! fork's own last one keeps it).

use super::header::RollbackGuard;
use super::pieces::Behind;
use super::raw::{check_locked_file, copy_chunks, end_read, FileTimes, Image, CHUNK};
use super::sqlite::{
    as_reader, check_and_hash, check_copy, io_err, retry_busy, sqlite_err, SnapshotError,
    SnapshotMethod, SnapshotOptions, SnapshotStats, StateDigest,
};
use rusqlite::Connection;
use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::Instant;

/// The comparison's block: both files are read a block at a time into two buffers that
/// stay in the CPU's caches (measured on a 100 MiB file: 64 KiB blocks compared in 0.75x
/// the time of 256 KiB or 1 MiB ones).
const BLOCK: usize = 64 << 10;

/// Each comparing thread's two buffers (the live file's block, the copy's).
type Buffers = [(Vec<u8>, Vec<u8>); 2];

/// The unit a difference is copied again in.
const UNIT: usize = 4 << 10;

#[cfg(test)]
thread_local! {
    /// Runs once the unlocked copy is made and hashed behind, before the read transaction
    /// that takes the lock (tests change the live database, or the copy, there).
    pub(super) static AFTER_THE_PRECOPY: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::RefCell::new(None) };
}

/// The unlocked copy of the database file, waiting for the read transaction.
pub(super) struct Precopy {
    /// The live file, opened before the copy and kept open until the read transaction
    /// ends (closing any descriptor of a file drops every POSIX lock the process holds on
    /// it, SQLite's SHARED lock included).
    file: File,
    /// The copy, opened to read and write.
    out: File,
    /// The bytes copied (the file's length when the copy began, or where it ended).
    copied: u64,
    /// BLAKE3's pieces hashed behind the copy (None for another digest).
    behind: Option<Behind>,
    /// The comparison's buffers, filled once here so that no page of them is faulted in
    /// under the lock.
    bufs: Buffers,
    /// The live file's stamps read under the first, short read transaction, when they can
    /// prove it untouched later; and the copy's, once written.
    quiet: Option<(Stamps, Stamps)>,
}

/// What a file's inode says of its last change: change time, modification time, length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamps {
    ctime: (i64, i64),
    mtime: (i64, i64),
    len: u64,
}

impl Stamps {
    fn of(file: &File) -> io::Result<Stamps> {
        let m = file.metadata()?;
        Ok(Stamps {
            ctime: (m.ctime(), m.ctime_nsec()),
            mtime: (m.mtime(), m.mtime_nsec()),
            len: m.len(),
        })
    }
}

/// Filesystems that set a file's change time in its inode on every write, whoever writes
/// (`statfs`'s magic numbers): ext2/3/4, XFS, Btrfs, tmpfs, F2FS. (ext2, and ext4 with
/// 128-byte inodes, stamp whole seconds: see [`before_the_tick`].)
const STAMPING: [nix::sys::statfs::FsType; 5] = {
    use nix::sys::statfs::*;
    [
        EXT4_SUPER_MAGIC, // ext2 and ext3 share it
        XFS_SUPER_MAGIC,
        BTRFS_SUPER_MAGIC,
        TMPFS_MAGIC,
        F2FS_SUPER_MAGIC,
    ]
};

/// Whether `file`'s filesystem is one of [`STAMPING`].
pub(super) fn stamping(file: &File) -> bool {
    nix::sys::statfs::fstatfs(file).is_ok_and(|f| STAMPING.contains(&f.filesystem_type()))
}

/// Under a first, short read transaction on `source` (the shared lock: no commit is
/// writing the file), the live file's stamps, when a later change must change them: its
/// filesystem stamps every write, and its change time is before the clock's current tick
/// (a write in the tick the time was read in could leave it as it is).
fn quiet_stamps(
    file: &File,
    source: &Connection,
    guard: &RollbackGuard,
    src: &Path,
    opts: &SnapshotOptions,
    started: Instant,
) -> Result<Option<Stamps>, SnapshotError> {
    use nix::time::{clock_gettime, ClockId};
    if !stamping(file) {
        return Ok(None);
    }
    source
        .execute_batch("BEGIN DEFERRED")
        .map_err(sqlite_err("begin a read transaction on", src))?;
    let read = as_reader(src, opts, || {
        retry_busy(src, opts, started, "read", Some(guard), || {
            source.query_row("SELECT count(*) FROM sqlite_schema", [], |r| {
                r.get::<_, i64>(0)
            })
        })
    });
    // The proof is only a shortcut: a stamp or a clock that cannot be read drops it.
    let stamps = Stamps::of(file).ok();
    let now = clock_gettime(ClockId::CLOCK_REALTIME_COARSE).ok();
    let ended = source
        .execute_batch("COMMIT")
        .map_err(sqlite_err("end the read transaction on", src));
    // A failed read is the error to report (it may have ended the transaction itself).
    read?;
    ended?;
    Ok(match (stamps, now) {
        (Some(stamps), Some(now)) if before_the_tick(stamps, (now.tv_sec(), now.tv_nsec())) => {
            Some(stamps)
        }
        _ => None,
    })
}

/// Whether a write after the clock read `now` must change `stamps`: its change time is
/// before `now`'s tick, and (the kernel rounds every stamp down to the filesystem's
/// granularity) before `now`'s second when its stamps hold no nanoseconds, as on ext2, or
/// ext4 with 128-byte inodes, which stamp whole seconds: a write later in that second
/// would be stamped the same.
fn before_the_tick(stamps: Stamps, now: (i64, i64)) -> bool {
    if stamps.ctime.1 == 0 || stamps.mtime.1 == 0 {
        stamps.ctime.0 < now.0
    } else {
        stamps.ctime < now
    }
}

impl Precopy {
    /// The copy is not used (the database turned out empty or above the image bound):
    /// empties `dest` again for the copy that is (the hashing behind it stops when this
    /// is dropped).
    pub fn discard(self, dest: &Path) -> Result<(), SnapshotError> {
        self.out.set_len(0).map_err(io_err("truncate", dest))
    }
}

/// The live rollback-journal database file as the one-image copy takes it: opened before
/// SQLite's own connection, so that a file put in its place afterwards is seen under the
/// lock as another file (`raw.rs`'s `check_locked_file`), and, when large, copied before
/// the lock.
pub(super) enum RawSource {
    /// Copied under the lock (`raw.rs`).
    Plain(File),
    /// Large: to be copied with no lock held ([`precopy`]) once SQLite has it open.
    Large(File),
    /// Copied with no lock held, to be made the committed state under it.
    Precopied(Box<Precopy>),
}

/// Before SQLite opens the database: the database file the guard opened (another
/// descriptor of it, closed once the read transaction has ended), large when it is at
/// least `opts.precopy_min_bytes` and within the image bound.
pub(super) fn open_raw(
    guard: &RollbackGuard,
    src: &Path,
    opts: &SnapshotOptions,
) -> Result<RawSource, SnapshotError> {
    let file = guard.file().try_clone().map_err(io_err("open", src))?;
    let len = file.metadata().map_err(io_err("stat", src))?.len();
    if len < opts.precopy_min_bytes || len > opts.image_max_bytes {
        return Ok(RawSource::Plain(file));
    }
    Ok(RawSource::Large(file))
}

/// Once SQLite has the database open (`source`), before the read transaction that copies
/// it: the file's stamps under a first, short read transaction ([`quiet_stamps`]), then
/// the file as it is now copied into the empty `dest` with no lock held.
pub(super) fn precopy(
    file: File,
    source: &Connection,
    guard: &RollbackGuard,
    src: &Path,
    dest: &Path,
    opts: &SnapshotOptions,
    started: Instant,
) -> Result<Precopy, SnapshotError> {
    let quiet = quiet_stamps(&file, source, guard, src, opts, started)?;
    let len = quiet.map_or_else(
        || {
            file.metadata()
                .map(|m| m.len())
                .map_err(io_err("stat", src))
        },
        |q| Ok(q.len),
    )?;
    let out = super::sqlite::open_emptied(dest)?;
    let behind = match opts.digest {
        StateDigest::Blake3 => Some(Behind::start(
            File::open(dest).map_err(io_err("open", dest))?,
        )),
        _ => None,
    };
    let copied = copy_chunks(
        &file,
        &out,
        len,
        CHUNK,
        |o| {
            if let Some(b) = &behind {
                b.copied(o)
            }
        },
        src,
    )?;
    if let Some(b) = &behind {
        b.ended(copied);
    }
    // Both stamps, or neither: the copy's own only guards a proof the live file's gives.
    let quiet = quiet.and_then(|live| Stamps::of(&out).ok().map(|ours| (live, ours)));
    #[cfg(test)]
    if let Some(hook) = AFTER_THE_PRECOPY.with(|h| h.borrow_mut().take()) {
        // Every piece hashed first: what the hook changes must then be hashed again.
        if let Some(b) = &behind {
            b.settle(copied);
        }
        hook();
    }
    Ok(Precopy {
        file,
        out,
        copied,
        behind,
        bufs: [
            (vec![0xff; BLOCK], vec![0xff; BLOCK]),
            (vec![0xff; BLOCK], vec![0xff; BLOCK]),
        ],
        quiet,
    })
}

/// Under `source`'s read transaction (the shared lock held): makes the unlocked copy the
/// committed state (see the module docs), ends the transaction, then checks the copy and
/// finishes its hash side by side.
pub(super) fn copy_precopied(
    src: &Path,
    source: Connection,
    dest: &Path,
    image: &Image,
    opts: &SnapshotOptions,
    pre: Precopy,
) -> Result<SnapshotStats, SnapshotError> {
    let Precopy {
        file,
        out,
        copied,
        behind,
        mut bufs,
        quiet,
    } = pre;
    // The cores and the memory bandwidth go to the comparison while the lock is held.
    if let Some(b) = &behind {
        b.pause();
    }
    let reconciled = check_locked_file(&file, src, image).and_then(|()| {
        if untouched(quiet, &file, &out, copied, image.bytes) {
            return Ok((Vec::new(), 0, 0));
        }
        reconcile(&file, &out, copied, image.bytes, &mut bufs, src, dest)
            .map(|(dirty, recopied)| (dirty, recopied, copied.min(image.bytes)))
    });
    // The lock goes as soon as the copy is the committed state.
    let (ended, held) = end_read(source, file, image, src);
    if let Some(b) = &behind {
        b.resume();
    }
    let (dirty, recopied, compared) = reconciled?;
    ended?;
    drop(out);
    let copy_elapsed = image.started.elapsed();
    let mut again = None;
    let (integrity_ok, check_elapsed, digest, hash_elapsed) = match behind {
        Some(b) => {
            // The check on this thread while the thread behind hashes on alone (two
            // threads, not three: a third left the parent's writer, just let through the
            // lock, no core for its commit), then what is left hashed on both.
            let t = Instant::now();
            let checked = check_copy(dest, opts.check)?;
            let check_elapsed = t.elapsed();
            let (pieces, behind) = b.finish(copied).map_err(io_err("hash", dest))?;
            let t = Instant::now();
            let (digest, n) = pieces
                .root_after(dest, image.bytes, dirty)
                .map_err(io_err("hash", dest))?;
            again = Some(n);
            // Its time: what the hashing threads were busy, not their waits.
            (checked, check_elapsed, digest, behind + t.elapsed())
        }
        None => check_and_hash(dest, opts.check, opts.digest)?,
    };
    let times = FileTimes {
        held,
        copy: copy_elapsed,
        check: check_elapsed,
        hash: hash_elapsed,
    };
    Ok(SnapshotStats {
        pieces_hashed_again: again,
        recopied_bytes: Some(recopied),
        compared_bytes: Some(compared),
        ..image.file_stats(
            SnapshotMethod::FileBytesPrecopied,
            times,
            digest,
            integrity_ok,
        )
    })
}

/// Under the second lock: whether the stamps prove that neither the live file nor the copy
/// changed since the first lock, and the copy holds the whole database.
fn untouched(
    quiet: Option<(Stamps, Stamps)>,
    file: &File,
    out: &File,
    copied: u64,
    bytes: u64,
) -> bool {
    let Some((live, ours)) = quiet else {
        return false;
    };
    live.len == copied
        && copied == bytes
        && Stamps::of(file).is_ok_and(|now| now == live)
        && Stamps::of(out).is_ok_and(|now| now == ours)
}

/// Makes `out` (holding `copied` bytes copied from `file` with no lock held) hold exactly
/// `file`'s first `bytes` bytes: compares the common part (its two halves side by side,
/// on this thread and one more), copies each unit that differs again, copies the rest of a
/// longer file, cuts a shorter one. Returns the ranges rewritten inside the common part,
/// and how many bytes were copied again in all.
fn reconcile(
    file: &File,
    out: &File,
    copied: u64,
    bytes: u64,
    bufs: &mut Buffers,
    src: &Path,
    dest: &Path,
) -> Result<(Vec<(u64, u64)>, u64), SnapshotError> {
    let common = copied.min(bytes);
    // The halves split on a block boundary; a file of one block is compared here alone.
    let half = (common / 2).div_ceil(BLOCK as u64) * BLOCK as u64;
    let [first, second] = bufs;
    let (a, b) = std::thread::scope(|s| {
        // Without a thread to be had, this one compares the second half too.
        let other = (half < common).then(|| {
            std::thread::Builder::new()
                .name("fork-compare".into())
                .spawn_scoped(s, move || {
                    compare_range(file, out, half, common, second, src, dest)
                })
        });
        let a = compare_range(file, out, 0, half.min(common), first, src, dest);
        let b = match other {
            Some(Ok(t)) => t.join().unwrap_or_else(|_| {
                Err(SnapshotError::Io {
                    action: "compare",
                    path: dest.to_path_buf(),
                    source: io::Error::other("the comparing thread panicked"),
                })
            }),
            Some(Err(_)) => compare_range(file, out, half, common, first, src, dest),
            None => Ok((Vec::new(), 0)),
        };
        (a, b)
    });
    let ((mut dirty, mut recopied), (more, n)) = (a?, b?);
    dirty.extend(more);
    recopied += n;
    if bytes > copied {
        // The file grew after the unlocked copy: the rest is copied now.
        let (mut from, mut to) = (file, out);
        from.seek(SeekFrom::Start(copied))
            .map_err(io_err("seek", src))?;
        to.seek(SeekFrom::Start(copied))
            .map_err(io_err("seek", dest))?;
        let n = copy_chunks(file, out, bytes - copied, CHUNK, |_| {}, src)?;
        if n != bytes - copied {
            return Err(SnapshotError::Io {
                action: "copy",
                path: src.to_path_buf(),
                source: io::Error::other(format!(
                    "the file ended at byte {} of a {bytes}-byte database",
                    copied + n
                )),
            });
        }
        recopied += n;
    } else if bytes < copied {
        out.set_len(bytes).map_err(io_err("truncate", dest))?;
    }
    Ok((dirty, recopied))
}

/// Compares `out` with `file` over `[from, to)` block by block and copies each unit of
/// `file` that differs into `out`: the ranges rewritten, and their bytes.
fn compare_range(
    file: &File,
    out: &File,
    from: u64,
    to: u64,
    (live, ours): &mut (Vec<u8>, Vec<u8>),
    src: &Path,
    dest: &Path,
) -> Result<(Vec<(u64, u64)>, u64), SnapshotError> {
    let mut dirty: Vec<(u64, u64)> = Vec::new();
    let mut recopied = 0;
    let mut off = from;
    while off < to {
        let n = (BLOCK as u64).min(to - off) as usize;
        file.read_exact_at(&mut live[..n], off)
            .map_err(io_err("read", src))?;
        out.read_exact_at(&mut ours[..n], off)
            .map_err(io_err("read", dest))?;
        if live[..n] != ours[..n] {
            // Each run of differing units is written at once.
            let mut run: Option<(usize, usize)> = None;
            for at in (0..n).step_by(UNIT).chain([n]) {
                let end = (at + UNIT).min(n);
                if at < n && live[at..end] != ours[at..end] {
                    run = Some((run.map_or(at, |r| r.0), end));
                    continue;
                }
                let Some((a, e)) = run.take() else { continue };
                out.write_all_at(&live[a..e], off + a as u64)
                    .map_err(io_err("write", dest))?;
                recopied += (e - a) as u64;
                let (s, e) = (off + a as u64, off + e as u64);
                match dirty.last_mut() {
                    Some(last) if last.1 == s => last.1 = e,
                    _ => dirty.push((s, e)),
                }
            }
        }
        off += n as u64;
    }
    Ok((dirty, recopied))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamps(ctime: (i64, i64), mtime: (i64, i64)) -> Stamps {
        Stamps {
            ctime,
            mtime,
            len: 4096,
        }
    }

    /// A stamp proves a file untouched only when a later write must stamp it otherwise:
    /// before the clock's tick, and before its second on a filesystem of whole seconds.
    #[test]
    fn a_stamp_proves_only_what_a_later_write_must_change() {
        let ns = stamps((100, 500), (100, 500));
        assert!(before_the_tick(ns, (100, 501)));
        assert!(before_the_tick(ns, (101, 0)));
        assert!(!before_the_tick(ns, (100, 500)), "the same tick");
        assert!(!before_the_tick(ns, (100, 499)), "a clock behind the stamp");
        // Whole seconds (no nanoseconds): a write later in second 100 is stamped (100, 0).
        let whole = stamps((100, 0), (100, 0));
        assert!(!before_the_tick(whole, (100, 700_000_000)));
        assert!(before_the_tick(whole, (101, 0)));
        // One of the two without nanoseconds is enough to be careful.
        assert!(!before_the_tick(stamps((100, 5), (100, 0)), (100, 9)));
    }
}
