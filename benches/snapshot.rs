//! Benchmark for the target "state snapshot: within 1.5x of a plain file copy of
//! the same database, while a writer keeps writing, and the writer is never blocked for
//! long".
//!
//! For each journal mode (WAL and rollback `delete`), a database of FORK_BENCH_MB MiB is
//! built, then a writer *process* (this binary re-executed with `--writer DB`) keeps
//! updating random rows, one transaction per row, timing every commit and, apart, the time
//! each commit found the lock taken (its busy handler). Then N runs, each doing `cp DB
//! copy`, `sha256sum DB` (the hash's peer) and eight snapshot variants (the default one-image
//! copy with `integrity_check` (rollback mode: the file's bytes copied by the kernel with no
//! lock held, hashed behind the copy, then compared with the live file under the shared
//! lock and what differs copied again, `raw_copy` and `precopy_min_bytes`; the same with
//! the whole copy made under the lock, the previous default; WAL mode: the database file and its
//! `-wal` copied by the kernel under a held read transaction, then the WAL replayed into
//! the copy by SQLite, `wal_file_copy`; named by BLAKE3), the image through
//! `sqlite3_serialize` in both modes, the default with `quick_check`, the default named by
//! SHA-256 (`[state] digest = "sha256"`), the default without the check (what `fork
//! evaluate` waits for), the page-by-page backup with the image off, and the backup in one
//! step) in a
//! rotating order (interleaved, so drift in the machine's load hits all alike). Printed per
//! variant: the medians, the ratios to cp (total, the copy phase alone, CPU time), the hash
//! against sha256sum, the restarts, the longest time the source was locked, and the
//! writer's longest lock wait (the stall the snapshot adds) and longest commit (its own
//! fsyncs included) while it ran, against the same writer idle.
//!
//! Run: `cargo bench --bench snapshot` (Cargo.toml: `[[bench]] name = "snapshot"
//! harness = false`). Environment: FORK_BENCH_MB (100), FORK_BENCH_RUNS (7),
//! FORK_BENCH_MODES ("wal,delete"), FORK_BENCH_DIR (default: the system temp directory;
//! point it at the filesystem that matters), FORK_BENCH_SWEEP=1 (also time the copy phase
//! for several `pages_per_step` values, which is how the defaults were chosen),
//! FORK_BENCH_WAL_AUTOCHECKPOINT (the writer's `wal_autocheckpoint`, 1000; 0 lets the WAL
//! grow through the runs, to weigh the WAL file copy's replay against `sqlite3_serialize`),
//! FORK_BENCH_WRITER_PAUSE_MS (the writer's pause after each commit, 1; 1000 is a sparse
//! parent, whose rollback-mode precopy its stamps mostly prove untouched).

use fork::fork::snapshot::{snapshot, IntegrityCheck, SnapshotOptions, SnapshotStats, StateDigest};
use rusqlite::Connection;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROW_BYTES: i64 = 4000;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 3 && args[1] == "--writer" {
        writer(Path::new(&args[2]));
        return;
    }
    let mb: u64 = env_or("FORK_BENCH_MB", 100);
    let runs: usize = env_or::<usize>("FORK_BENCH_RUNS", 7).max(1);
    let modes: String = env_or("FORK_BENCH_MODES", "wal,delete".to_string());
    let base: PathBuf = env_or("FORK_BENCH_DIR", std::env::temp_dir());
    let sweep = std::env::var("FORK_BENCH_SWEEP").is_ok_and(|v| v == "1");
    let dir = tempfile::Builder::new()
        .prefix("fork-bench-snapshot-")
        .tempdir_in(&base)
        .expect("create a scratch directory (set FORK_BENCH_DIR)");
    println!(
        "snapshot vs cp: {mb} MiB database, {runs} interleaved runs per mode, in {}",
        base.display()
    );
    println!("options: {:?}", SnapshotOptions::default());
    for mode in modes.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        bench_mode(dir.path(), mode, mb, runs, sweep);
    }
}

/// When the writer's current statement first found the database locked (µs since the
/// writer's start + 1; 0: not blocked). Set by [`busy`], SQLite's busy handler.
static BLOCKED_SINCE: AtomicU64 = AtomicU64::new(0);
static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

fn now_us() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_micros() as u64 + 1
}

/// The writer's busy handler: notes when the lock was first found taken, then retries every
/// 200 µs for up to 60 s. (SQLite's own `busy_timeout` backs off up to 100 ms between tries,
/// which would add its own sleep to every wait measured here.)
fn busy(tries: i32) -> bool {
    if tries == 0 {
        BLOCKED_SINCE.store(now_us(), Ordering::SeqCst);
    }
    std::thread::sleep(Duration::from_micros(200));
    tries < 300_000
}

/// The writer process: updates a random row per transaction until stdin closes. On each
/// `mark` line it answers `<longest commit in µs> <commits> <longest lock wait in µs>` since
/// the previous mark. The commit's time includes the writer's own work (its fsyncs: in
/// rollback mode each commit syncs the journal and the database, and on a shared ext4 one
/// sync can wait a journal commit of 100+ ms); the lock wait is only the time the commit
/// could not get the lock, which is the stall a reader such as the snapshot can add.
fn writer(db: &Path) {
    let c = Connection::open(db).expect("writer: open");
    c.busy_handler(Some(busy)).expect("writer: busy handler");
    c.execute_batch("PRAGMA synchronous = NORMAL")
        .expect("writer: pragma");
    // FORK_BENCH_WAL_AUTOCHECKPOINT: the writer's automatic checkpoint (pages; 0: none, the
    // WAL then grows through the runs; SQLite's default 1000 keeps it near 4 MiB).
    let pages: i64 = env_or("FORK_BENCH_WAL_AUTOCHECKPOINT", 1000);
    c.execute_batch(&format!("PRAGMA wal_autocheckpoint = {pages}"))
        .expect("writer: pragma");
    let rows: i64 = c
        .query_row("SELECT max(id) FROM t", [], |r| r.get(0))
        .expect("writer: count");
    let longest = Arc::new(AtomicU64::new(0));
    let longest_wait = Arc::new(AtomicU64::new(0));
    let longest_gap = Arc::new(AtomicU64::new(0));
    let commits = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    {
        let (longest, longest_wait, longest_gap, commits, stop) = (
            longest.clone(),
            longest_wait.clone(),
            longest_gap.clone(),
            commits.clone(),
            stop.clone(),
        );
        std::thread::spawn(move || {
            let stdin = std::io::stdin();
            let mut out = std::io::stdout();
            for line in stdin.lock().lines() {
                let Ok(line) = line else { break };
                if line.trim() == "mark" {
                    let l = longest.swap(0, Ordering::SeqCst);
                    let n = commits.swap(0, Ordering::SeqCst);
                    let w = longest_wait.swap(0, Ordering::SeqCst);
                    let g = longest_gap.swap(0, Ordering::SeqCst);
                    let _ = writeln!(out, "{l} {n} {w} {g}");
                    let _ = out.flush();
                }
            }
            stop.store(true, Ordering::SeqCst);
        });
    }
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut last_done = Instant::now();
    // FORK_BENCH_WRITER_PAUSE_MS: the writer's pause after each commit (1 ms: a busy
    // parent, about 380 commits a second here; 1000: a sparse one, whose commits seldom
    // fall inside a snapshot).
    let pause = Duration::from_millis(env_or("FORK_BENCH_WRITER_PAUSE_MS", 1));
    while !stop.load(Ordering::SeqCst) {
        // xorshift: a random row to rewrite.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let id = (x % rows as u64) as i64 + 1;
        let t = Instant::now();
        BLOCKED_SINCE.store(0, Ordering::SeqCst);
        c.execute(
            "UPDATE t SET body = randomblob(?1) WHERE id = ?2",
            rusqlite::params![ROW_BYTES, id],
        )
        .expect("writer: update");
        let since = BLOCKED_SINCE.load(Ordering::SeqCst);
        if since > 0 {
            longest_wait.fetch_max(now_us().saturating_sub(since), Ordering::SeqCst);
        }
        longest.fetch_max(t.elapsed().as_micros() as u64, Ordering::SeqCst);
        longest_gap.fetch_max(last_done.elapsed().as_micros() as u64, Ordering::SeqCst);
        last_done = Instant::now();
        commits.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(pause);
    }
}

struct Writer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// The longest time between two of the writer's commits up to the last mark (the
    /// second after the previous mark): what it was held back by, lock or CPU.
    last_gap: Duration,
}

impl Writer {
    fn start(db: &Path) -> Writer {
        let exe = std::env::current_exe().expect("current_exe");
        let mut child = Command::new(exe)
            .arg("--writer")
            .arg(db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the writer");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("writer stdout"));
        Writer {
            child,
            stdin,
            stdout,
            last_gap: Duration::ZERO,
        }
    }

    /// (longest commit, commits, longest lock wait) since the previous mark.
    fn mark(&mut self) -> (Duration, u64, Duration) {
        let stdin = self.stdin.as_mut().expect("writer stdin");
        writeln!(stdin, "mark").expect("talk to the writer");
        stdin.flush().expect("talk to the writer");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("hear the writer");
        let mut it = line
            .split_whitespace()
            .map(|v| v.parse::<u64>().unwrap_or(0));
        let us = it.next().unwrap_or(0);
        let n = it.next().unwrap_or(0);
        let wait = it.next().unwrap_or(0);
        self.last_gap = Duration::from_micros(it.next().unwrap_or(0));
        (Duration::from_micros(us), n, Duration::from_micros(wait))
    }

    fn stop(mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

fn build_db(path: &Path, mode: &str, mb: u64) -> i64 {
    let rows = (mb * 1024 * 1024 / 4096) as i64;
    let c = Connection::open(path).expect("open");
    c.execute_batch(&format!(
        "PRAGMA journal_mode = {mode}; PRAGMA synchronous = OFF;
         CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL);"
    ))
    .expect("schema");
    c.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
         INSERT INTO t SELECT i, randomblob(?2) FROM n",
        rusqlite::params![rows, ROW_BYTES],
    )
    .expect("fill");
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").ok();
    rows
}

fn remove_copy(p: &Path) {
    for suffix in ["", "-journal", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", p.display()));
    }
}

fn cp(src: &Path, dest: &Path) -> Duration {
    let t = Instant::now();
    let st = Command::new("cp")
        .arg(src)
        .arg(dest)
        .status()
        .expect("run cp");
    let d = t.elapsed();
    assert!(st.success(), "cp failed");
    d
}

/// CPU time (user + system) used so far by this process (`self`) or by its waited-for
/// children: less disturbed by other load on the machine than wall time.
fn cpu(children: bool) -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    let who = if children {
        UsageWho::RUSAGE_CHILDREN
    } else {
        UsageWho::RUSAGE_SELF
    };
    let u = getrusage(who).expect("getrusage");
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    tv(u.user_time()) + tv(u.system_time())
}

fn sha256sum(path: &Path) -> Duration {
    let t = Instant::now();
    let out = Command::new("sha256sum")
        .arg(path)
        .stdout(Stdio::null())
        .status()
        .expect("run sha256sum");
    let d = t.elapsed();
    assert!(out.success(), "sha256sum failed");
    d
}

fn median(v: &[Duration]) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn list(v: &[Duration]) -> String {
    v.iter()
        .map(|d| format!("{:.0}", d.as_secs_f64() * 1e3))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What one variant's runs measured.
#[derive(Default)]
struct Runs {
    total: Vec<Duration>,
    copy: Vec<Duration>,
    check: Vec<Duration>,
    hash: Vec<Duration>,
    longest_step: Vec<Duration>,
    stall: Vec<Duration>,
    wait: Vec<Duration>,
    gap: Vec<Duration>,
    cpu: Vec<Duration>,
    restarts: Vec<u32>,
    /// Runs whose precopy was proven untouched by its stamps (nothing compared under the
    /// lock).
    uncompared: usize,
    last: Option<SnapshotStats>,
}

impl Runs {
    fn push(&mut self, st: &SnapshotStats, stall: Duration, wait: Duration, gap: Duration) {
        self.wait.push(wait);
        self.gap.push(gap);
        self.total.push(st.elapsed);
        self.copy.push(st.copy_elapsed);
        self.check.push(st.check_elapsed);
        self.hash.push(st.hash_elapsed);
        self.longest_step.push(st.longest_step);
        self.stall.push(stall);
        self.restarts.push(st.restarts);
        self.uncompared += usize::from(st.compared_bytes == Some(0));
        self.last = Some(st.clone());
    }
}

fn bench_mode(dir: &Path, mode: &str, mb: u64, runs: usize, sweep: bool) {
    let db = dir.join(format!("live-{mode}.db"));
    let copy = dir.join(format!("copy-{mode}.db"));
    let t = Instant::now();
    let rows = build_db(&db, mode, mb);
    let size = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0);
    println!(
        "\n== journal_mode={mode}: {rows} rows, {:.1} MiB, built in {}",
        size as f64 / (1 << 20) as f64,
        ms(t.elapsed())
    );
    let mut w = Writer::start(&db);
    // Wait until the writer commits.
    let deadline = Instant::now() + Duration::from_secs(30);
    while w.mark().1 == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Warm-up (page cache, code paths), not timed.
    cp(&db, &copy);
    remove_copy(&copy);
    snapshot(&db, &copy, &SnapshotOptions::default()).expect("snapshot");
    remove_copy(&copy);

    // The variants timed against cp (and sha256sum, the hash's peer), each run in a
    // rotating order: the default (rollback mode: the image as the file's bytes, copied by
    // the kernel with no lock held and hashed behind the copy, then made the committed
    // state under the shared lock; the same copied wholly under the lock, the previous
    // default; WAL mode: the database file
    // and its -wal copied by the kernel under a held read transaction, then the WAL
    // replayed into the copy), the pager's image (`sqlite3_serialize`) in both modes, the
    // default with quick_check, the default named by SHA-256 (the releases before BLAKE3),
    // the default without the check (what `fork evaluate` waits for: its check runs
    // beside the first sandbox), the page-by-page backup, and the backup in one step.
    let variants: [(&str, SnapshotOptions); 8] = [
        ("image (default)", SnapshotOptions::default()),
        (
            "image, rollback: the file's bytes copied under the lock (no copy before it: `precopy_min_bytes` off, the previous default; WAL: the default again)",
            SnapshotOptions {
                precopy_min_bytes: u64::MAX,
                ..SnapshotOptions::default()
            },
        ),
        (
            "image, named by sha256 (`[state] digest = \"sha256\"`, the previous default)",
            SnapshotOptions {
                digest: StateDigest::Sha256,
                ..SnapshotOptions::default()
            },
        ),
        (
            "image, no check (as `fork evaluate` waits for it; the check runs beside the sandbox)",
            SnapshotOptions {
                check: IntegrityCheck::Skip,
                ..SnapshotOptions::default()
            },
        ),
        (
            "image via sqlite3_serialize (raw_copy and wal_file_copy off)",
            SnapshotOptions {
                raw_copy: false,
                wal_file_copy: false,
                ..SnapshotOptions::default()
            },
        ),
        (
            "image + quick_check",
            SnapshotOptions {
                check: IntegrityCheck::Quick,
                ..SnapshotOptions::default()
            },
        ),
        (
            "pages (image off)",
            SnapshotOptions {
                image_max_bytes: 0,
                ..SnapshotOptions::default()
            },
        ),
        (
            "pages in one backup step (image off, pages_per_step -1)",
            SnapshotOptions {
                image_max_bytes: 0,
                pages_per_step: -1,
                ..SnapshotOptions::default()
            },
        ),
    ];
    let mut cps = vec![];
    let mut cp_cpu = vec![];
    let mut sums = vec![];
    let mut stall_cp = vec![];
    let mut stall_idle = vec![];
    let mut wait_idle = vec![];
    let mut gap_idle = vec![];
    let mut per: Vec<Runs> = variants.iter().map(|_| Runs::default()).collect();
    let mut commits = 0u64;
    let window = Instant::now();
    w.mark();
    let ops = variants.len() + 2;
    for i in 0..runs {
        for k in 0..ops {
            let op = (i + k) % ops;
            // An idle window: the writer's natural jitter (fsync, checkpoints).
            std::thread::sleep(Duration::from_millis(100));
            let (idle, n, wait) = w.mark();
            stall_idle.push(idle);
            gap_idle.push(w.last_gap);
            wait_idle.push(wait);
            commits += n;
            if op == 0 {
                let c0 = cpu(true);
                cps.push(cp(&db, &copy));
                cp_cpu.push(cpu(true) - c0);
                let (s, n, _) = w.mark();
                stall_cp.push(s);
                commits += n;
            } else if op == 1 {
                sums.push(sha256sum(&db));
                commits += w.mark().1;
            } else {
                let c0 = cpu(false);
                let st = snapshot(&db, &copy, &variants[op - 2].1).expect("snapshot");
                per[op - 2].cpu.push(cpu(false) - c0);
                let (s, n, wait) = w.mark();
                commits += n;
                assert!(st.integrity_ok || variants[op - 2].1.check == IntegrityCheck::Skip);
                per[op - 2].push(&st, s, wait, w.last_gap);
            }
            remove_copy(&copy);
        }
    }
    let rate = commits as f64 / window.elapsed().as_secs_f64();
    if mode == "wal" {
        let wal = std::fs::metadata(format!("{}-wal", db.display())).map_or(0, |m| m.len());
        println!(
            "-wal after the runs: {:.1} MiB",
            wal as f64 / (1 << 20) as f64
        );
    }
    let m_cp = median(&cps);
    let m_sum = median(&sums);
    println!("writer: ~{rate:.0} commits/s (one random 4 KB row rewrite each)");
    println!(
        "cp                     median {:>9}   runs: {}",
        ms(m_cp),
        list(&cps)
    );
    let m_cp_cpu = median(&cp_cpu);
    println!("cp CPU (user + system) median {:>9}", ms(m_cp_cpu));
    println!(
        "sha256sum              median {:>9}   runs: {}   ({:.2}x cp)",
        ms(m_sum),
        list(&sums),
        m_sum.as_secs_f64() / m_cp.as_secs_f64()
    );
    for ((name, opts), r) in variants.iter().zip(&per) {
        let (m_snap, m_copy) = (median(&r.total), median(&r.copy));
        println!("snapshot, {name}:");
        println!(
            "  total                median {:>9}   runs: {}   ratio {:.2}x cp",
            ms(m_snap),
            list(&r.total),
            m_snap.as_secs_f64() / m_cp.as_secs_f64()
        );
        println!(
            "  copy phase           median {:>9}   runs: {}   ratio {:.2}x cp",
            ms(m_copy),
            list(&r.copy),
            m_copy.as_secs_f64() / m_cp.as_secs_f64()
        );
        let m_cpu = median(&r.cpu);
        println!(
            "  CPU (all threads)    median {:>9}   ratio {:.2}x cp's CPU",
            ms(m_cpu),
            m_cpu.as_secs_f64() / m_cp_cpu.as_secs_f64()
        );
        println!("  check                median {:>9}", ms(median(&r.check)));
        let m_hash = median(&r.hash);
        println!(
            "  hash ({:<6})        median {:>9}   ({:.2}x sha256sum of the same file)",
            opts.digest.name(),
            ms(m_hash),
            m_hash.as_secs_f64() / m_sum.as_secs_f64()
        );
        println!(
            "  restarts per run: {:?}; longest step (source locked, rollback mode) median {}, max {}",
            r.restarts,
            ms(median(&r.longest_step)),
            ms(r.longest_step.iter().copied().max().unwrap_or_default())
        );
        if let Some(st) = &r.last {
            println!(
                "  last: {} pages in {} steps, {} busy retries, wal={}, method {:?}, pieces hashed again {:?} of {}, bytes copied again under the lock {:?}, compared {:?}; runs with nothing compared (the stamps proved the file untouched): {} of {}",
                st.pages,
                st.steps,
                st.busy_retries,
                st.wal,
                st.method,
                st.pieces_hashed_again,
                st.bytes.div_ceil(fork::fork::snapshot::PIECE_BYTES),
                st.recopied_bytes,
                st.compared_bytes,
                r.uncompared,
                r.total.len()
            );
        }
        println!(
            "  writer during it: longest lock wait max {} (median {}); longest commit max {} (median {}); longest time between two commits max {} (median {})",
            ms(r.wait.iter().copied().max().unwrap_or_default()),
            ms(median(&r.wait)),
            ms(r.stall.iter().copied().max().unwrap_or_default()),
            ms(median(&r.stall)),
            ms(r.gap.iter().copied().max().unwrap_or_default()),
            ms(median(&r.gap)),
        );
    }
    println!(
        "writer longest commit: during cp max {}; idle max {} (median {}); idle longest lock wait max {}; idle longest time between two commits max {} (median {})",
        ms(stall_cp.iter().copied().max().unwrap_or_default()),
        ms(stall_idle.iter().copied().max().unwrap_or_default()),
        ms(median(&stall_idle)),
        ms(wait_idle.iter().copied().max().unwrap_or_default()),
        ms(gap_idle.iter().copied().max().unwrap_or_default()),
        ms(median(&gap_idle)),
    );

    if sweep {
        println!("sweep (copy phase only, no check), {mode}:");
        for pages in [64, 256, 1024, 4096, 16384, -1] {
            let o = SnapshotOptions {
                pages_per_step: pages,
                check: IntegrityCheck::Skip,
                image_max_bytes: 0,
                ..SnapshotOptions::default()
            };
            let mut times = vec![];
            let mut stalls = vec![];
            let mut rs = vec![];
            for _ in 0..3 {
                w.mark();
                let st = snapshot(&db, &copy, &o).expect("snapshot");
                stalls.push(w.mark().0);
                times.push(st.copy_elapsed);
                rs.push(st.restarts);
                remove_copy(&copy);
            }
            println!(
                "  pages_per_step {pages:>6}: copy median {:>9}, restarts {:?}, writer max stall {}",
                ms(median(&times)),
                rs,
                ms(stalls.iter().copied().max().unwrap_or_default())
            );
        }
    }
    check_alternatives(&db, &copy);
    if mode == "wal" {
        wal_file_copy_bound(&db, &copy, m_cp);
    }
    w.stop();
    let _ = std::fs::remove_file(&db);
}

/// WAL mode's unbuilt alternative, as a lower bound: the time to copy the database file
/// and its `-wal` by the kernel while a read transaction is held (checkpoints cannot move
/// past its mark, the WAL cannot restart). It is not a snapshot by itself: the WAL's frames
/// up to that transaction's mark would still have to be laid over the copy (see the
/// README); this is the copy such a design would start from, against `sqlite3_serialize`.
fn wal_file_copy_bound(db: &Path, copy: &Path, m_cp: Duration) {
    let side = |p: &Path| PathBuf::from(format!("{}-wal", p.display()));
    let mut times = vec![];
    for _ in 0..3 {
        let c = Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("open");
        c.execute_batch("BEGIN").expect("begin");
        let _: i64 = c
            .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
            .expect("read");
        let t = Instant::now();
        for (from, to) in [
            (db.to_path_buf(), copy.to_path_buf()),
            (side(db), side(copy)),
        ] {
            if let Ok(mut f) = std::fs::File::open(&from) {
                let mut out = std::fs::File::create(&to).expect("create");
                std::io::copy(&mut f, &mut out).expect("copy");
            }
        }
        times.push(t.elapsed());
        c.execute_batch("COMMIT").expect("commit");
        drop(c);
        remove_copy(copy);
    }
    let m = median(&times);
    println!(
        "WAL: the database file and its -wal copied by the kernel under a held read transaction (a lower bound, not a snapshot): median {:>9} ({:.2}x cp)   runs: {}",
        ms(m),
        m.as_secs_f64() / m_cp.as_secs_f64(),
        list(&times)
    );
}

/// The check's alternatives on one finished copy (no writer involved: the copy is
/// private): `integrity_check` reading pages through read() (SQLite's default), through a
/// memory map (what the snapshot does), and on an in-memory image (the copy read into
/// SQLite's memory first, then `sqlite3_deserialize`d; the read counted). `quick_check`
/// for scale. (Splitting the full check per table and index across two connections needs
/// a database of several b-trees; this one is one table, and the snapshot's hash already
/// takes the second core.)
fn check_alternatives(db: &Path, copy: &Path) {
    let o = SnapshotOptions {
        check: IntegrityCheck::Skip,
        ..SnapshotOptions::default()
    };
    snapshot(db, copy, &o).expect("snapshot");
    let size = std::fs::metadata(copy).map(|m| m.len()).unwrap_or(0) as usize;
    let run = |pragma: &str, mmap: i64, in_memory: bool| -> Duration {
        let t = Instant::now();
        let c = if in_memory {
            let mut c = Connection::open_in_memory().expect("open");
            let mut image = std::fs::read(copy).expect("read the copy");
            // An in-memory database cannot be in WAL mode: its header says rollback.
            image[18] = 1;
            image[19] = 1;
            c.deserialize_read_exact(rusqlite::MAIN_DB, &image[..], size, true)
                .expect("deserialize");
            c
        } else {
            let c = Connection::open(copy).expect("open the copy");
            c.execute_batch(&format!("PRAGMA mmap_size = {mmap}"))
                .expect("mmap_size");
            c
        };
        let ok: String = c.query_row(pragma, [], |r| r.get(0)).expect("check");
        assert_eq!(ok, "ok");
        t.elapsed()
    };
    println!("the check on one finished copy (3 runs each, medians):");
    for (name, pragma, mmap, mem) in [
        (
            "integrity_check through read()",
            "PRAGMA integrity_check",
            0,
            false,
        ),
        (
            "integrity_check through a memory map (the snapshot's)",
            "PRAGMA integrity_check",
            1 << 30,
            false,
        ),
        (
            "integrity_check on the image in memory (read included)",
            "PRAGMA integrity_check",
            0,
            true,
        ),
        (
            "quick_check through a memory map",
            "PRAGMA quick_check",
            1 << 30,
            false,
        ),
    ] {
        let times: Vec<Duration> = (0..3).map(|_| run(pragma, mmap, mem)).collect();
        println!(
            "  {name:<56} median {:>9}   runs: {}",
            ms(median(&times)),
            list(&times)
        );
    }
    remove_copy(copy);
}
