//! Unit tests of the state snapshot under a writer that commits throughout (a thread of
//! this process, one row per transaction): every way of copying ends in one committed
//! state, and the writer is never held back long.

use super::tests::{make_db, PAYLOAD};
use super::*;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

struct WriterReport {
    /// When each commit began and how long it took.
    commits: Vec<(Instant, Duration)>,
}

impl WriterReport {
    /// The longest commit that overlapped `[from, to]`: the stall the snapshot can be
    /// blamed for. Commits before or after it stall on this machine's load alone.
    /// None when no commit overlapped it (the test then proves nothing: it fails).
    fn longest_during(&self, from: Instant, to: Instant) -> Option<Duration> {
        self.commits
            .iter()
            .filter(|(began, took)| *began <= to && *began + *took >= from)
            .map(|(_, took)| *took)
            .max()
    }
}

/// A writer on its own connection: one row per transaction, each insert timed, until
/// `stop` or `limit` elapses. `committed` is the row count after its last commit.
/// Commits are not synced (`synchronous = OFF`): what is timed is waiting for the
/// snapshot's locks, not a disk flush that other tests' writes on a shared CI machine can
/// stretch to a second.
fn spawn_writer(
    path: PathBuf,
    start_rows: u64,
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicU64>,
    limit: Duration,
) -> std::thread::JoinHandle<WriterReport> {
    std::thread::spawn(move || {
        let c = Connection::open(&path).unwrap();
        c.busy_timeout(Duration::from_secs(10)).unwrap();
        c.execute_batch("PRAGMA synchronous = OFF").unwrap();
        let began = Instant::now();
        let mut n = start_rows;
        let mut commits = Vec::new();
        while !stop.load(Ordering::SeqCst) && began.elapsed() < limit {
            let t = Instant::now();
            let tx = c.unchecked_transaction().unwrap();
            tx.execute(
                "INSERT INTO t (id, body) VALUES (?1, randomblob(?2))",
                rusqlite::params![n as i64 + 1, PAYLOAD as i64],
            )
            .unwrap();
            tx.execute("UPDATE meta SET n = ?1", [n as i64 + 1])
                .unwrap();
            tx.commit().unwrap();
            commits.push((t, t.elapsed()));
            n += 1;
            committed.store(n, Ordering::SeqCst);
            std::thread::sleep(Duration::from_micros(200));
        }
        WriterReport { commits }
    })
}

/// How [`snapshot_under_writer`] copies.
#[derive(Clone, Copy, PartialEq)]
enum Way {
    /// Page by page in small steps.
    Pages,
    /// The one-image copy, through SQLite's pager (`raw_copy` off).
    Image,
    /// The one-image copy as the file's bytes under the lock.
    Raw,
    /// The same, copied first with no lock held (`precopy_min_bytes` of 1 MiB).
    Precopied,
}

fn snapshot_under_writer(wal: bool, start_rows: u64, way: Way) {
    let image = way != Way::Pages;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("live.db");
    make_db(&src, wal, start_rows);
    let limit = Duration::from_secs(4);
    let writer_started = Instant::now();

    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(start_rows));
    let writer = spawn_writer(
        src.clone(),
        start_rows,
        stop.clone(),
        committed.clone(),
        limit,
    );
    // Let the writer get going, then copy in small steps so that it writes in between.
    while committed.load(Ordering::SeqCst) < start_rows + 20 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let before = committed.load(Ordering::SeqCst);
    let opts = if image {
        SnapshotOptions {
            raw_copy: matches!(way, Way::Raw | Way::Precopied),
            precopy_min_bytes: if way == Way::Precopied {
                1 << 20
            } else {
                u64::MAX
            },
            ..SnapshotOptions::default()
        }
    } else {
        SnapshotOptions {
            pages_per_step: 32,
            pause: Duration::from_millis(1),
            image_max_bytes: 0,
            ..SnapshotOptions::default()
        }
    };
    let dest = dir.path().join("copy.db");
    if way == Way::Precopied {
        // At least one commit between the unlocked copy and the lock (at most 5 s).
        let c = committed.clone();
        crate::fork::precopy::AFTER_THE_PRECOPY.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                let (n, t) = (c.load(Ordering::SeqCst), Instant::now());
                while c.load(Ordering::SeqCst) == n && t.elapsed() < Duration::from_secs(5) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }))
        });
    }
    let copy_began = Instant::now();
    let stats = snapshot(&src, &dest, &opts).unwrap();
    let copy_ended = Instant::now();
    let after = committed.load(Ordering::SeqCst);
    // The copy converged while the writer was still writing (not because it stopped).
    let writer_was_running = writer_started.elapsed() < limit;
    stop.store(true, Ordering::SeqCst);
    let report = writer.join().unwrap();

    assert!(stats.integrity_ok);
    assert_eq!(stats.wal, wal);
    let method = match (way, wal) {
        (Way::Pages, _) => SnapshotMethod::Pages,
        (_, true) => SnapshotMethod::WalFiles,
        (Way::Raw, false) => SnapshotMethod::FileBytes,
        (Way::Precopied, false) => SnapshotMethod::FileBytesPrecopied,
        (Way::Image, false) => SnapshotMethod::Serialize,
    };
    assert_eq!(stats.method, method, "{stats:?}");
    if way == Way::Precopied {
        assert!(stats.recopied_bytes.unwrap() > 0, "{stats:?}");
    }
    if image {
        assert_eq!(stats.steps, 1, "{stats:?}");
    } else {
        assert!(stats.steps > 1, "{stats:?}");
    }
    if wal && image {
        // A file copy is made again only when the WAL was started over under it (the
        // writer's own checkpoint, the copy on read-lock 0): rare, never every time.
        assert!(stats.restarts < 3, "{stats:?}");
    } else if wal || image {
        assert_eq!(stats.restarts, 0, "a held read snapshot never restarts");
    } else {
        assert!(
            stats.restarts > 0,
            "commits between steps restart the backup"
        );
    }
    // No side files left next to the copy, so its hash is the whole state.
    for suffix in ["-wal", "-shm", "-journal"] {
        let side = PathBuf::from(format!("{}{suffix}", dest.display()));
        assert!(!side.exists(), "{} left behind", side.display());
    }
    assert_eq!(stats.digest, StateDigest::Blake3.of_path(&dest).unwrap());
    assert_eq!(stats.bytes, fs::metadata(&dest).unwrap().len());

    // The copy is one point in time: the counter matches the rows, and lies between
    // what was committed before the snapshot started and after it ended.
    let c = Connection::open(&dest).unwrap();
    let rows: i64 = c
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    let counter: i64 = c.query_row("SELECT n FROM meta", [], |r| r.get(0)).unwrap();
    let max_id: i64 = c
        .query_row("SELECT max(id) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, counter);
    assert_eq!(rows, max_id);
    assert!(
        (before as i64) <= rows && rows <= after as i64,
        "{before} <= {rows} <= {after}"
    );
    let stall = report
        .longest_during(copy_began, copy_ended)
        .expect("no commit of the writer overlapped the snapshot");
    eprintln!(
        "{} mode: {} pages in {} steps, {} restarts, {} busy, copy {:?}, longest step {:?}; \
         writer: {} commits, longest insert during the copy {:?}",
        if wal { "WAL" } else { "rollback" },
        stats.pages,
        stats.steps,
        stats.restarts,
        stats.busy_retries,
        stats.copy_elapsed,
        stats.longest_step,
        report.commits.len(),
        stall
    );
    assert!(report.commits.len() > 20, "the writer kept writing");
    assert!(
        writer_was_running,
        "the snapshot only finished when the writer stopped"
    );
    // Generous bound for a shared 2-core test machine; the bench reports real numbers.
    assert!(
        stall < Duration::from_millis(750),
        "writer stalled {stall:?} while the snapshot ran"
    );
}

#[test]
fn snapshot_wal_db_under_a_writer() {
    snapshot_under_writer(true, 1500, Way::Pages);
}

#[test]
fn snapshot_rollback_db_under_a_writer() {
    snapshot_under_writer(false, 400, Way::Pages);
}

#[test]
fn image_snapshot_wal_db_under_a_writer() {
    snapshot_under_writer(true, 1500, Way::Image);
}

#[test]
fn image_snapshot_rollback_db_under_a_writer() {
    snapshot_under_writer(false, 400, Way::Image);
}

/// The raw image (the file's bytes copied under the shared lock) is one committed state
/// too, over several of the copy's chunks (about 9 MiB: the lock must hold the writer off
/// from the first chunk to the last).
#[test]
fn raw_image_snapshot_rollback_db_under_a_writer() {
    snapshot_under_writer(false, 1500, Way::Raw);
}

/// Copied first with no lock held, then made the committed state under the lock
/// (`precopy.rs`): one committed state as well, while the writer commits throughout.
#[test]
fn precopied_image_snapshot_rollback_db_under_a_writer() {
    snapshot_under_writer(false, 1500, Way::Precopied);
}
