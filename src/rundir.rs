//! Run directories: `<root>/fork-<run-id>/`, one per sandbox (the root: see
//! [`sandbox_base_dir`]), and `<tmp>/fork-eval-<run-id>/`, one per evaluation (see
//! [`base_dir`]), each with a lock file held
//! (flock) by the supervisor for as long as it lives. A run directory whose lock can be
//! taken belongs to a dead supervisor: `fork gc` (and every `fork evaluate` at start)
//! reclaims it: its processes, mounts, cgroups and files.
//!
//! This process's own live run directories are also listed in memory ([`live`]), so that an
//! interrupted supervisor can tear them down from another thread (`gc::reclaim_on_interrupt`)
//! whatever its main thread is doing.
//!
//! Layout:
//! ```text
//! fork-<id>/lock       the supervisor's flock
//! fork-<id>/meta.json  {run_id, supervisor_pid, init_pid, init_start, init_pidns, created}
//!                      (an internal record, no schema version: `init_start` and
//!                      `init_pidns` are absent from the records of older forks, and gc
//!                      then kills nothing by pid, see [`RunMeta::init`])
//! fork-<id>/cgroups    the absolute path of each cgroup of the run, one a line, written
//!                      before they are created (so `fork gc`, from any cgroup, finds them)
//! fork-<id>/root/      mount point for the sandbox's new root (only used inside its mount ns)
//! fork-<id>/disk/      the size-capped filesystem: the sandbox's /tmp, workspace at disk/successor
//! ```

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use thiserror::Error;

/// This process's live run directories, by id. Creating a run directory holds the lock from
/// before its `mkdir` until it is listed; a teardown that takes the lock and never gives it
/// back (the process exits) therefore sees every run directory, and none is made after.
static LIVE: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());

/// This process's live run directories (id -> path), locked: while the guard lives, none is
/// created or released.
pub fn live() -> MutexGuard<'static, BTreeMap<String, PathBuf>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug, Error)]
pub enum RunDirError {
    #[error("cannot create run directory {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot lock {path}: {source}")]
    Lock { path: PathBuf, source: nix::Error },
}

/// Where evaluations' run directories (their staging areas: the runtime's copy and its
/// state, as large as the parent's) live: `$FORK_RUN_ROOT`, else the system temp dir.
pub fn base_dir() -> PathBuf {
    match run_root_setting() {
        Some(p) => p,
        None => std::env::temp_dir(),
    }
}

fn run_root_setting() -> Option<PathBuf> {
    std::env::var_os("FORK_RUN_ROOT")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// Where sandboxes' run directories live: `$FORK_RUN_ROOT` when set; otherwise, as root,
/// `/dev/shm` when the system temp dir is not a tmpfs and `/dev/shm` is one (see
/// [`sandbox_root_for`]); otherwise the system temp dir.
///
/// A sandbox's run directory holds a lock, two small records and two mount points (its
/// data is on the sandbox's own capped filesystem), and is made and removed at every
/// launch: on a disk filesystem its directory operations are journaled (about 0.5 ms of
/// a `fork run -- /bin/true` with an ext4 `/tmp`).
pub fn sandbox_base_dir() -> PathBuf {
    if let Some(p) = run_root_setting() {
        return p;
    }
    static CHOSEN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    CHOSEN
        .get_or_init(|| {
            let tmp = std::env::temp_dir();
            sandbox_root_for(
                nix::unistd::geteuid().is_root(),
                fs_facts(&tmp),
                fs_facts(Path::new(SHM)),
            )
            .unwrap_or(tmp)
        })
        .clone()
}

/// The shared-memory tmpfs every Linux system mounts.
const SHM: &str = "/dev/shm";

/// What the choice of a sandbox run root looks at in a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsFacts {
    pub tmpfs: bool,
    /// Owned by root, world-writable with the sticky bit (`1777`, as `/tmp` is): others
    /// can make entries in it but never rename or remove fork's.
    pub shared_sticky: bool,
}

fn fs_facts(dir: &Path) -> Option<FsFacts> {
    use std::os::unix::fs::MetadataExt;
    let st = nix::sys::statfs::statfs(dir).ok()?;
    let md = std::fs::symlink_metadata(dir).ok()?;
    Some(FsFacts {
        tmpfs: st.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC,
        shared_sticky: md.is_dir() && md.uid() == 0 && md.mode() & 0o7777 == 0o1777,
    })
}

/// The pure choice behind [`sandbox_base_dir`]: `/dev/shm` only for root (an
/// unprivileged launch keeps the temp dir, whose every directory above the run
/// directories it already checks), only when the temp dir is not a tmpfs already, and
/// only when `/dev/shm` is a tmpfs shared like `/tmp` (root's `1777`); `None` keeps the
/// temp dir.
pub fn sandbox_root_for(root: bool, tmp: Option<FsFacts>, shm: Option<FsFacts>) -> Option<PathBuf> {
    let tmp_on_tmpfs = tmp.is_some_and(|t| t.tmpfs);
    let shm_ok = shm.is_some_and(|s| s.tmpfs && s.shared_sticky);
    (root && !tmp_on_tmpfs && shm_ok).then(|| PathBuf::from(SHM))
}

/// Every directory run directories may live in (the sandboxes' and the evaluations'
/// roots, once each): `fork gc` looks in all of them, and a sandbox sees none of them.
pub fn run_roots() -> Vec<PathBuf> {
    let (a, b) = (sandbox_base_dir(), base_dir());
    if a == b {
        vec![a]
    } else {
        vec![a, b]
    }
}

/// Whether a directory name is one of fork's run directories (`fork-<id>` or
/// `fork-eval-<id>`, `<id>` 16 hex digits), whichever run root it lies in.
pub fn is_run_dir_name(name: &str) -> bool {
    let id = name
        .strip_prefix("fork-eval-")
        .or_else(|| name.strip_prefix("fork-"))
        .unwrap_or("");
    id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A fresh run id: 16 hex characters from a random uuid.
pub fn new_run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..16].to_string()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunMeta {
    pub run_id: String,
    pub supervisor_pid: i32,
    pub init_pid: Option<i32>,
    /// The init's start time, in clock ticks after boot (`/proc/<pid>/stat`'s field 22).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_start: Option<u64>,
    /// The inode of the init's pid namespace (`/proc/<pid>/ns/pid`), when it could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_pidns: Option<u64>,
    pub created: String,
}

impl RunMeta {
    /// The recorded init, when the record identifies it: its pid with its start time (and
    /// its pid namespace when recorded). A pid alone, as older forks recorded it, does not:
    /// once that init is gone the pid may name any process, another run's init included.
    pub fn init(&self) -> Option<ProcessIdentity> {
        Some(ProcessIdentity {
            pid: self.init_pid?,
            start: self.init_start?,
            pidns: self.init_pidns,
        })
    }
}

/// What identifies a process beyond its pid, which the kernel reuses: its start time and
/// its pid namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessIdentity {
    pub pid: i32,
    /// Clock ticks after boot (`/proc/<pid>/stat`'s field 22, `starttime`).
    pub start: u64,
    /// The inode of `/proc/<pid>/ns/pid`, when it could be read.
    pub pidns: Option<u64>,
}

impl ProcessIdentity {
    /// The identity of the process `pid` names now; `None` when there is none (or it is
    /// a zombie: it has ended, and nothing is left to signal).
    pub fn of(pid: i32) -> Option<ProcessIdentity> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (state, start) = parse_stat(&stat)?;
        if state == 'Z' {
            return None;
        }
        use std::os::unix::fs::MetadataExt;
        let pidns = std::fs::metadata(format!("/proc/{pid}/ns/pid"))
            .ok()
            .map(|m| m.ino());
        Some(ProcessIdentity { pid, start, pidns })
    }

    /// Whether the process `self.pid` names now is this one: same start time, and the
    /// same pid namespace when one was recorded and can be read now. (A rootless `fork gc`
    /// runs in a user namespace of its own, a sibling of the supervisor's, and may not
    /// read the init's namespace links: the pid with its start time, in clock ticks since
    /// boot, still names one process, since a pid is reused only after its process ended.)
    pub fn is_current(&self) -> bool {
        ProcessIdentity::of(self.pid).is_some_and(|now| self.matches(&now))
    }

    /// Whether `now` (read from /proc) is the process `self` recorded.
    fn matches(&self, now: &ProcessIdentity) -> bool {
        now.pid == self.pid
            && now.start == self.start
            && (self.pidns.is_none() || now.pidns.is_none() || now.pidns == self.pidns)
    }
}

/// A `/proc/<pid>/stat` line's state (field 3) and start time (field 22). The command name
/// (field 2) may hold blanks and parentheses: the fields are counted after its last `)`.
fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields 4 to 21 lie between the state and the start time.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// A live run directory, locked by this process.
#[derive(Debug)]
pub struct RunDir {
    pub id: String,
    pub path: PathBuf,
    _lock: Flock<File>,
}

impl RunDir {
    /// Creates and locks `<base>/fork-<id>` (a sandbox's run directory), in
    /// [`sandbox_base_dir`] when `capped_disk` (the sandbox's data will be on its own
    /// capped disk, never in the run directory itself), else in [`base_dir`].
    ///
    /// Its `meta.json` is written once the sandbox's init exists ([`RunDir::write_meta`]):
    /// before that there is no process for `fork gc` to kill.
    pub fn create(id: &str, capped_disk: bool) -> Result<RunDir, RunDirError> {
        Self::create_at(id, format!("fork-{id}"), false, capped_disk)
    }

    /// Creates and locks `<base>/fork-eval-<id>`: an evaluation's own run directory (its
    /// staging area), distinct from the run directories of the sandboxes it starts (and,
    /// unlike theirs, without the `root` and `disk` mount points).
    pub fn create_evaluation(id: &str) -> Result<RunDir, RunDirError> {
        Self::create_at(
            &format!("eval-{id}"),
            format!("fork-eval-{id}"),
            true,
            false,
        )
    }

    fn create_at(
        id: &str,
        name: String,
        evaluation: bool,
        fast: bool,
    ) -> Result<RunDir, RunDirError> {
        let base = if fast { sandbox_base_dir() } else { base_dir() };
        Self::create_in(&base, id, name, evaluation)
    }

    fn create_in(
        base: &Path,
        id: &str,
        name: String,
        evaluation: bool,
    ) -> Result<RunDir, RunDirError> {
        let mut live = live();
        let path = base.join(&name);
        // Made under a name `fork gc` does not take for a run's (`.fork-<id>.new`), locked
        // there, then moved into place: a run directory is never seen by another process's
        // gc without its lock held. (Made in place, a gc between the lock file's creation
        // and its flock took the lock, found the run stale, and removed a live run's
        // directory: seen with four evaluations at once, each starting with a gc.)
        let pending = base.join(format!(".{name}{PENDING_SUFFIX}"));
        let mk = |p: &Path| {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(p)
                .map_err(|source| RunDirError::Create {
                    path: p.to_path_buf(),
                    source,
                })
        };
        mk(&pending)?;
        let made = Self::lock_and_fill(&pending, evaluation, &mk).and_then(|lock| {
            let moved = nix::fcntl::renameat2(
                nix::fcntl::AT_FDCWD,
                &pending,
                nix::fcntl::AT_FDCWD,
                &path,
                nix::fcntl::RenameFlags::RENAME_NOREPLACE,
            )
            .map_err(std::io::Error::from);
            let moved = match moved {
                // A filesystem without rename flags (NFS, FUSE without rename2): a plain
                // rename once the name is seen free (the id is 64 random bits).
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    match std::fs::symlink_metadata(&path) {
                        Err(n) if n.kind() == std::io::ErrorKind::NotFound => {
                            std::fs::rename(&pending, &path)
                        }
                        _ => Err(std::io::Error::from_raw_os_error(libc::EEXIST)),
                    }
                }
                other => other,
            };
            moved.map_err(|source| RunDirError::Create {
                path: path.clone(),
                source,
            })?;
            Ok(lock)
        });
        let lock = match made {
            Ok(lock) => lock,
            Err(e) => {
                // Nothing but the lock file and the empty mount point can be in it.
                let _ = std::fs::remove_file(pending.join("lock"));
                let _ = std::fs::remove_dir(pending.join("disk"));
                let _ = std::fs::remove_dir(&pending);
                return Err(e);
            }
        };
        let rd = RunDir {
            id: id.to_string(),
            path,
            _lock: lock,
        };
        if evaluation {
            rd.write_meta(None, None);
        }
        live.insert(rd.id.clone(), rd.path.clone());
        Ok(rd)
    }

    /// The lock file of a run directory being made (locked), and its disk mount point.
    fn lock_and_fill(
        dir: &Path,
        evaluation: bool,
        mk: &dyn Fn(&Path) -> Result<(), RunDirError>,
    ) -> Result<Flock<File>, RunDirError> {
        let lock_path = dir.join("lock");
        let file = OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|source| RunDirError::Create {
                path: lock_path.clone(),
                source,
            })?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
            RunDirError::Lock {
                path: lock_path.clone(),
                source: e,
            }
        })?;
        // A sandbox's disk mount point (its root's, when the host needs one, is made by
        // the sandbox: see `make_root_mount`); an evaluation's staging area needs neither.
        if !evaluation {
            mk(&dir.join("disk"))?;
        }
        Ok(lock)
    }

    pub fn root_mount(&self) -> PathBuf {
        self.path.join("root")
    }
    /// Makes the root's mount point on the host (0700), for an init that builds its root
    /// at a host path rather than on a tmpfs of its own.
    pub fn make_root_mount(&self) -> Result<(), RunDirError> {
        let p = self.root_mount();
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&p)
            .map_err(|source| RunDirError::Create { path: p, source })
    }
    pub fn disk(&self) -> PathBuf {
        self.path.join("disk")
    }

    /// Records the sandbox init (its host pid, start time and pid namespace) so that gc
    /// can kill it after a crash, and only it. `init_pid` alone (its identity could not be
    /// read) is recorded too, but then gc kills nothing by pid. Written in place, not
    /// renamed over: a file torn by a crash is no record (gc then finds the init through
    /// the run's cgroups, and it dies with its supervisor anyway, PDEATHSIG).
    pub fn write_meta(&self, init_pid: Option<i32>, init: Option<ProcessIdentity>) {
        let init = init.filter(|i| Some(i.pid) == init_pid);
        let meta = RunMeta {
            run_id: self.id.clone(),
            supervisor_pid: std::process::id() as i32,
            init_pid,
            init_start: init.map(|i| i.start),
            init_pidns: init.and_then(|i| i.pidns),
            created: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        };
        let ok = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(self.path.join(META_FILE))
            .and_then(|mut f| {
                f.write_all(serde_json::to_string(&meta).unwrap_or_default().as_bytes())
            });
        if let Err(e) = ok {
            tracing::warn!("cannot write run metadata in {}: {e}", self.path.display());
        }
    }
}

impl RunDir {
    /// Deletes a sandbox's run directory, entry by known entry (its disk already
    /// unmounted): what it holds when fork made all of it. Anything else in it (a
    /// workspace left on `disk/` without a mounted disk, a mount) makes this fail, and the
    /// caller falls back to the general reclaim. The lock goes last, so a run directory
    /// half removed by a crash is still found (and finished) by `fork gc`.
    pub fn remove_known(&self) -> std::io::Result<()> {
        let gone_ok = |r: std::io::Result<()>| match r {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        };
        gone_ok(std::fs::remove_file(self.path.join(META_FILE)))?;
        gone_ok(std::fs::remove_file(self.path.join(CGROUPS_FILE)))?;
        gone_ok(std::fs::remove_dir(self.root_mount()))?;
        gone_ok(std::fs::remove_dir(self.disk()))?;
        std::fs::remove_file(self.path.join("lock"))?;
        std::fs::remove_dir(&self.path)
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        live().remove(&self.id);
    }
}

/// The file of a run directory that lists its cgroups.
const CGROUPS_FILE: &str = "cgroups";
/// The file of a run directory that records its supervisor and init.
const META_FILE: &str = "meta.json";
/// The files of a run directory that name what it left on the host (its cgroups, its
/// init) and whether its supervisor lives (the lock): kept when its cgroups could not be
/// removed, so that `fork gc` finds the run and tries again.
pub const RECORD_FILES: [&str; 3] = ["lock", CGROUPS_FILE, META_FILE];

/// Records the absolute paths of the cgroups of the run whose directory is `run_dir`,
/// before they are created: `fork gc` removes exactly those after a crash, whatever cgroup
/// it runs in itself (on cgroup v2 the sandbox's cgroup sits beside the supervisor's,
/// which another process cannot derive from its own).
pub fn record_cgroups(run_dir: &Path, paths: &[PathBuf]) -> std::io::Result<()> {
    let mut text = String::new();
    for p in paths {
        let line = p.to_str().filter(|l| !l.contains('\n')).ok_or_else(|| {
            std::io::Error::other(format!("cgroup path {p:?} is not one line of UTF-8"))
        })?;
        text.push_str(line);
        text.push('\n');
    }
    // Written in place (one write of a few hundred bytes): a record torn
    // by a crash names a path `fork gc` refuses as not this run's, and gc's walk of its
    // own cgroups still finds the run's.
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(run_dir.join(CGROUPS_FILE))?;
    f.write_all(text.as_bytes())
}

/// The cgroups a run directory recorded (see [`record_cgroups`]); none when it
/// recorded none (a run without cgroup budgets, or one made by an older fork).
pub fn recorded_cgroups(run_dir: &Path) -> Vec<PathBuf> {
    std::fs::read_to_string(run_dir.join(CGROUPS_FILE))
        .map(|t| {
            t.lines()
                .filter(|l| !l.is_empty())
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default()
}

/// A run directory found on disk.
#[derive(Debug, Clone)]
pub struct FoundRun {
    pub id: String,
    pub path: PathBuf,
    pub meta: Option<RunMeta>,
    /// True when no supervisor holds its lock.
    pub stale: bool,
}

/// Whether `p` was last modified more than `age` ago.
fn older_than(p: &Path, age: std::time::Duration) -> bool {
    std::fs::symlink_metadata(p)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t.elapsed().is_ok_and(|e| e > age))
}

/// Whether `p` itself (not a symlink's target) is a directory (`dir`) or a regular file
/// owned by this process's user and not writable by its group or others.
fn owned_by_us(p: &Path, dir: bool) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p).is_ok_and(|m| {
        (if dir { m.is_dir() } else { m.is_file() })
            && m.uid() == nix::unistd::geteuid().as_raw()
            && m.mode() & 0o022 == 0
    })
}

/// The suffix of a run directory being made (`.fork-<id>.new`), see [`RunDir::create`].
const PENDING_SUFFIX: &str = ".new";

/// How old a run directory left being made (its maker died in the microseconds between
/// its `mkdir` and its move into place) must be before `fork gc` takes it for stale: a
/// younger one may be another process's, between its `mkdir` and its lock.
const PENDING_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// Lists every `fork-*` run directory under the run roots ([`run_roots`]), and every
/// `.fork-*.new` one left being made.
pub fn list_runs() -> Vec<FoundRun> {
    let mut out = Vec::new();
    for base in run_roots() {
        list_runs_in(&base, &mut out);
    }
    out
}

fn list_runs_in(base: &Path, out: &mut Vec<FoundRun>) {
    let Ok(rd) = std::fs::read_dir(base) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pending = name
            .strip_prefix(".fork-")
            .and_then(|n| n.strip_suffix(PENDING_SUFFIX));
        let Some(id) = pending.or_else(|| name.strip_prefix("fork-")) else {
            continue;
        };
        // Only names fork gives (16 hex digits): `fork-cafe` is someone else's.
        if !is_run_dir_name(&format!("fork-{id}")) {
            continue;
        }
        let path = e.path();
        let lock_path = path.join("lock");
        // Only what this user made: a real directory and lock file of its own, writable
        // by nobody else (a run root is shared with other users: one of them could plant
        // a `fork-<id>` naming a live run of ours, to have gc reclaim it).
        if !owned_by_us(&path, true) {
            continue;
        }
        // One left being made before its lock file existed: ours, old, and with nothing
        // a run directory being made does not hold (at most its empty `disk`).
        let lockless_leftover = pending.is_some()
            && std::fs::symlink_metadata(&lock_path)
                .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
            && older_than(&path, PENDING_GRACE)
            && std::fs::read_dir(&path).is_ok_and(|d| {
                d.flatten().all(|e| {
                    e.file_name() == "disk"
                        && std::fs::read_dir(e.path()).is_ok_and(|mut i| i.next().is_none())
                })
            });
        if !lockless_leftover && !owned_by_us(&lock_path, false) {
            continue;
        }
        // A young directory being made is not even tried: its maker may be about to lock
        // it, and would find the lock taken.
        let stale = lockless_leftover
            || (pending.is_none() || older_than(&path, PENDING_GRACE))
                && match File::open(&lock_path) {
                    Ok(f) => Flock::lock(f, FlockArg::LockExclusiveNonblock).is_ok(),
                    Err(_) => false,
                };
        let meta = std::fs::read(path.join(META_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        out.push(FoundRun {
            id: id.to_string(),
            path,
            meta,
            stale,
        });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_process_is_identified_by_pid_start_time_and_pid_namespace() {
        use super::{parse_stat, ProcessIdentity, RunMeta};
        // A command name with blanks and parentheses; start time 4242.
        let stat = "77 (a) b (c) S 1 77 77 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 4242 1000 10";
        assert_eq!(parse_stat(stat), Some(('S', 4242)));
        assert_eq!(parse_stat("77 (x) Z 1"), None);
        let me = ProcessIdentity::of(std::process::id() as i32).expect("this process");
        assert!(me.is_current());
        // Another start time, or another pid namespace, is another process.
        let other_start = ProcessIdentity {
            start: me.start + 1,
            ..me
        };
        assert!(!other_start.is_current());
        if let Some(ns) = me.pidns {
            let other_ns = ProcessIdentity {
                pidns: Some(ns + 1),
                ..me
            };
            assert!(!other_ns.is_current());
        }
        // No pid namespace recorded: the start time decides.
        assert!(ProcessIdentity { pidns: None, ..me }.is_current());
        // One recorded that cannot be read now (a rootless gc): the start time decides.
        let recorded = ProcessIdentity {
            pidns: Some(7),
            ..me
        };
        assert!(recorded.matches(&ProcessIdentity { pidns: None, ..me }));
        // Records: an older fork's (the pid alone) identifies nothing.
        let old: RunMeta =
            serde_json::from_str(r#"{"run_id":"a","supervisor_pid":1,"init_pid":7,"created":"x"}"#)
                .unwrap();
        assert_eq!(old.init(), None);
        let new: RunMeta = serde_json::from_str(
            r#"{"run_id":"a","supervisor_pid":1,"init_pid":7,"init_start":9,"init_pidns":5,"created":"x"}"#,
        )
        .unwrap();
        assert_eq!(
            new.init(),
            Some(ProcessIdentity {
                pid: 7,
                start: 9,
                pidns: Some(5)
            })
        );
    }

    #[test]
    fn run_dir_names() {
        assert!(super::is_run_dir_name("fork-0123456789abcdef"));
        assert!(super::is_run_dir_name("fork-eval-0123456789abcdef"));
        assert!(!super::is_run_dir_name("fork-out"));
        assert!(!super::is_run_dir_name("fork-0123456789abcdeg"));
        assert!(!super::is_run_dir_name("fork-0123456789abcdef0"));
    }

    use super::*;

    #[test]
    fn sandboxes_run_from_dev_shm_only_as_root_off_a_disk_temp_dir() {
        let f = |tmpfs, shared_sticky| {
            Some(FsFacts {
                tmpfs,
                shared_sticky,
            })
        };
        let shm = Some(PathBuf::from("/dev/shm"));
        // Root, a disk /tmp, root's 1777 tmpfs on /dev/shm.
        assert_eq!(sandbox_root_for(true, f(false, true), f(true, true)), shm);
        // Unknown temp dir facts (it could not be read): still a disk for this purpose.
        assert_eq!(sandbox_root_for(true, None, f(true, true)), shm);
        // The temp dir is a tmpfs already: it stays.
        assert_eq!(sandbox_root_for(true, f(true, true), f(true, true)), None);
        // Not root: the temp dir, whose path the unprivileged checks already cover.
        assert_eq!(sandbox_root_for(false, f(false, true), f(true, true)), None);
        // /dev/shm not a tmpfs, not shared like /tmp (another owner, another mode), or
        // not there.
        assert_eq!(sandbox_root_for(true, f(false, true), f(false, true)), None);
        assert_eq!(sandbox_root_for(true, f(false, true), f(true, false)), None);
        assert_eq!(sandbox_root_for(true, f(false, true), None), None);
    }

    #[test]
    fn lock_marks_live_and_stale() {
        let tmp = tempfile::tempdir().unwrap();
        // SAFETY of the test: FORK_RUN_ROOT is only read by this module's functions.
        std::env::set_var("FORK_RUN_ROOT", tmp.path());
        let id = new_run_id();
        let rd = RunDir::create(&id, true).unwrap();
        let runs = list_runs();
        let r = runs.iter().find(|r| r.id == id).unwrap();
        assert!(!r.stale, "a locked run is live");
        // No init yet, no record of one.
        assert!(r.meta.is_none());
        rd.write_meta(Some(42), None);
        let runs = list_runs();
        let meta = runs
            .iter()
            .find(|r| r.id == id)
            .unwrap()
            .meta
            .clone()
            .unwrap();
        assert_eq!(meta.supervisor_pid, std::process::id() as i32);
        assert_eq!(meta.init_pid, Some(42));
        // A pid alone does not identify the init.
        assert_eq!(meta.init(), None);
        let me = ProcessIdentity::of(std::process::id() as i32).unwrap();
        rd.write_meta(Some(me.pid), Some(me));
        let meta = list_runs()
            .into_iter()
            .find(|r| r.id == id)
            .unwrap()
            .meta
            .unwrap();
        assert_eq!(meta.init(), Some(me));
        let cgroups = vec![
            PathBuf::from("/sys/fs/cgroup/a/fork-x"),
            PathBuf::from("/sys/fs/cgroup/memory/fork-x"),
        ];
        assert!(recorded_cgroups(&rd.path).is_empty());
        record_cgroups(&rd.path, &cgroups).unwrap();
        assert_eq!(recorded_cgroups(&rd.path), cgroups);
        assert!(record_cgroups(&rd.path, &[PathBuf::from("/a\nb")]).is_err());
        drop(rd);
        let runs = list_runs();
        assert!(runs.iter().find(|r| r.id == id).unwrap().stale);

        // Planted by someone else in a shared run root: never listed, so gc never
        // reclaims a live run's id through it. Writable by others, a symlink, a lock
        // that is a symlink, another owner.
        use std::os::unix::fs::PermissionsExt;
        let plant = |name: &str| {
            let d = tmp.path().join(format!("fork-{name}"));
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("lock"), b"").unwrap();
            d
        };
        let open = plant("00000000000000a1");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let target = plant("00000000000000a2");
        std::os::unix::fs::symlink(&target, tmp.path().join("fork-00000000000000a3")).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
        let linked = tmp.path().join("fork-00000000000000a4");
        std::fs::create_dir(&linked).unwrap();
        std::os::unix::fs::symlink(target.join("lock"), linked.join("lock")).unwrap();
        let ids: Vec<String> = list_runs().into_iter().map(|r| r.id).collect();
        for bad in ["00000000000000a1", "00000000000000a3", "00000000000000a4"] {
            assert!(!ids.iter().any(|i| i == bad), "{bad} listed: {ids:?}");
        }
        // The one real directory of ours (0700, our lock) is.
        assert!(ids.iter().any(|i| i == "00000000000000a2"), "{ids:?}");
        if nix::unistd::geteuid().is_root() {
            let theirs = plant("00000000000000a5");
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            let ids: Vec<String> = list_runs().into_iter().map(|r| r.id).collect();
            assert!(!ids.iter().any(|i| i == "00000000000000a5"), "{ids:?}");
        }
        std::env::remove_var("FORK_RUN_ROOT");
    }

    /// The run root given, not `FORK_RUN_ROOT` (other tests of this process use the
    /// default one meanwhile).
    fn listed(base: &std::path::Path) -> Vec<FoundRun> {
        let mut out = Vec::new();
        list_runs_in(base, &mut out);
        out
    }

    #[test]
    fn gc_sees_only_fork_names_and_never_a_run_being_made() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        // A name fork never gives (not 16 hex digits) is someone else's.
        let d = tmp.path().join("fork-cafe");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("lock"), b"").unwrap();
        let ids: Vec<String> = listed(tmp.path()).into_iter().map(|r| r.id).collect();
        assert!(!ids.iter().any(|i| i == "cafe"), "{ids:?}");

        // A directory left being made: live while young (another process may be between
        // its mkdir and its lock), stale once older than the grace.
        let pending = tmp.path().join(".fork-00000000000000b1.new");
        std::fs::create_dir(&pending).unwrap();
        std::fs::write(pending.join("lock"), b"").unwrap();
        let found = |id: &str| listed(tmp.path()).into_iter().find(|r| r.id == id).unwrap();
        assert!(!found("00000000000000b1").stale);
        let old = std::time::SystemTime::now() - PENDING_GRACE * 2;
        std::fs::File::open(&pending)
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert!(found("00000000000000b1").stale);
        std::fs::remove_dir_all(&pending).unwrap();
        // Left before its lock file existed: stale once old, if it holds nothing else.
        let bare = tmp.path().join(".fork-00000000000000b2.new");
        std::fs::create_dir(&bare).unwrap();
        std::fs::set_permissions(&bare, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(!listed(tmp.path())
            .iter()
            .any(|r| r.id == "00000000000000b2"));
        std::fs::File::open(&bare)
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert!(found("00000000000000b2").stale);
        std::fs::write(bare.join("other"), b"").unwrap();
        std::fs::File::open(&bare)
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert!(!listed(tmp.path())
            .iter()
            .any(|r| r.id == "00000000000000b2"));
        std::fs::remove_dir_all(&bare).unwrap();

        // A run directory is never listed under its run name without its lock held: made
        // while another thread lists the run root again and again, none is ever stale.
        let done = std::sync::atomic::AtomicBool::new(false);
        let made: Vec<RunDir> = std::thread::scope(|s| {
            let lister = s.spawn(|| {
                let mut seen_stale = Vec::new();
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    for r in listed(tmp.path()) {
                        let named = r.path.file_name().is_some_and(|n| {
                            n.to_string_lossy().starts_with("fork-")
                                && is_run_dir_name(&n.to_string_lossy())
                        });
                        if named && r.stale {
                            seen_stale.push(r.id);
                        }
                    }
                }
                seen_stale
            });
            let made: Vec<RunDir> = (0..1000)
                .map(|i| {
                    let id = format!("c{i:015x}");
                    RunDir::create_in(tmp.path(), &id, format!("fork-{id}"), false).unwrap()
                })
                .collect();
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            let seen = lister.join().unwrap();
            assert!(seen.is_empty(), "live runs listed as stale: {seen:?}");
            made
        });
        assert_eq!(made.len(), 1000);
        drop(made);
    }
}
