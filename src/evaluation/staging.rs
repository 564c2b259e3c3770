//! The evaluation's staging area (its own locked run directory, removed on drop) and the
//! one snapshot of every state store that both sides share.

use super::plan::{combined_state_hash, Plan};
use super::{check_interrupt, internal, EvaluateError};
use crate::fork::owner::{Owner, ReadAs};
use crate::fork::snapshot::{snapshot, IntegrityCheck, SnapshotOptions};
use crate::sandbox::fs_identity::FsIdentity;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The evaluation's run directory, `<run root>/fork-<run-id>/stage`; removed on drop.
pub struct Staging {
    rundir: Option<crate::rundir::RunDir>,
    dir: PathBuf,
}

impl Staging {
    pub fn create(run_id: &str) -> Result<Staging, EvaluateError> {
        use std::os::unix::fs::DirBuilderExt;
        let rundir = crate::rundir::RunDir::create_evaluation(run_id)
            .map_err(|e| EvaluateError::Internal(format!("creating the run directory: {e}")))?;
        let dir = rundir.path.join("stage");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| EvaluateError::Internal(format!("creating {}: {e}", dir.display())))?;
        Ok(Staging {
            rundir: Some(rundir),
            dir,
        })
    }
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(rd) = self.rundir.take() {
            if let Err(e) = crate::sandbox::reclaim_dir(&rd.path, &rd.id) {
                tracing::error!("removing the staging directory: {e}");
            }
            crate::trace::mark("evaluate: staging removed");
        }
    }
}

/// FORK, once per evaluation: every state store of the manifest snapshotted (see
/// `fork::snapshot`) into `<staging>/state` (0600 copies), and the protected tree copied
/// into `<staging>/protected` (see `protect`). Returns the state directory, the combined
/// state hash, the copies' integrity check, begun on a thread of its own (see
/// [`StateCheck`]), and what `beside` returned. The two copies are independent (different
/// sources, different directories), so the state stores are copied and hashed on a thread
/// of their own while this one copies the protected tree and then runs `beside` (the
/// evaluation hashes the parent's source tree there: it reads no store either); a state
/// store's error is reported first, as before, then the protected tree's, then
/// `beside`'s. When a store may lie in the protected tree, everything runs in turn, and
/// `beside` last.
pub fn snapshot_state<R>(
    p: &Plan,
    staging: &Staging,
    beside: impl FnOnce() -> Result<R, EvaluateError>,
) -> Result<(PathBuf, String, StateCheck, R), EvaluateError> {
    let snap_dir = staging.path().join("state");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&snap_dir)
        .map_err(|e| internal("staging")(e.to_string()))?;
    let (copies, answer) = if !stores_outside_source(p) {
        let copies = snapshot_stores(p, &snap_dir)?;
        protect_snapshot(p, staging)?;
        (copies, beside()?)
    } else {
        let (states, ours) = std::thread::scope(|s| {
            let states = s.spawn(|| snapshot_stores(p, &snap_dir));
            let ours = protect_snapshot(p, staging).and_then(|()| beside());
            let states = states.join().unwrap_or_else(|_| {
                Err(EvaluateError::Internal(
                    "the state snapshot's thread panicked".into(),
                ))
            });
            (states, ours)
        });
        (states?, ours?)
    };
    let digests: Vec<(String, String)> = copies
        .iter()
        .map(|c| (c.name.clone(), c.digest.clone()))
        .collect();
    Ok((
        snap_dir,
        combined_state_hash(&digests),
        StateCheck::start(copies),
        answer,
    ))
}

/// The integrity check of the state stores' copies (`PRAGMA integrity_check`, the copy
/// opened read-only and immutable), run on a thread of its own while the sides are
/// prepared and the first sandbox starts: on a small store it is most of the snapshot's
/// time, and nothing before the verdict needs its answer. Nothing reads a copy's answer
/// before [`StateCheck::wait`]: the evaluation waits for it before it removes the
/// snapshot, uses the cache or seals any verdict, and a failed check fails the evaluation
/// with the same error as before (naming the store), whatever the sandboxes did. Dropped
/// unwaited (an earlier error), it still joins the thread, before the staging directory
/// that holds the copies goes.
pub struct StateCheck(Check);

/// The check under way on its thread, or (no thread to be had) its answer, taken at once.
enum Check {
    Running(std::thread::JoinHandle<Result<(), EvaluateError>>),
    Done(Result<(), EvaluateError>),
    Taken,
}

/// One store's copy in the staging area.
struct StoreCopy {
    /// The store as the manifest names it.
    name: String,
    /// The parent's store.
    source: PathBuf,
    /// Its copy.
    path: PathBuf,
    /// `<digest>:<hex>` of the copy (the policy's `[state] digest`).
    digest: String,
}

impl StateCheck {
    fn start(copies: Vec<StoreCopy>) -> StateCheck {
        let copies = std::sync::Arc::new(copies);
        let theirs = std::sync::Arc::clone(&copies);
        let spawned = std::thread::Builder::new()
            .name("fork-state-check".into())
            .spawn(move || check_stores(&theirs));
        match spawned {
            Ok(h) => StateCheck(Check::Running(h)),
            // No thread to be had: the check still runs, here and now.
            Err(e) => {
                tracing::warn!("checking the state snapshot on this thread: {e}");
                StateCheck(Check::Done(check_stores(&copies)))
            }
        }
    }

    /// The check's answer: Ok when every copy passed.
    pub fn wait(mut self) -> Result<(), EvaluateError> {
        let r = match std::mem::replace(&mut self.0, Check::Taken) {
            Check::Running(h) => h.join().unwrap_or_else(|_| {
                Err(EvaluateError::Internal(
                    "the state snapshot's check thread panicked".into(),
                ))
            }),
            Check::Done(r) => r,
            Check::Taken => Err(EvaluateError::Internal(
                "the state snapshot's check was answered twice".into(),
            )),
        };
        crate::trace::mark("evaluate: state snapshot checked");
        r
    }
}

impl Drop for StateCheck {
    fn drop(&mut self) {
        if let Check::Running(h) = std::mem::replace(&mut self.0, Check::Taken) {
            let _ = h.join();
        }
    }
}

fn check_stores(copies: &[StoreCopy]) -> Result<(), EvaluateError> {
    use crate::fork::snapshot::check_copy;
    for c in copies {
        let t = std::time::Instant::now();
        use crate::fork::snapshot::SnapshotError;
        check_copy(&c.path, IntegrityCheck::Full).map_err(|e| {
            EvaluateError::Input(match e {
                // The copy is gone with the staging area: name the parent's store.
                SnapshotError::Corrupt { report, .. } => format!(
                    "snapshotting {}: the copy failed its integrity check: {report}; the \
                     source database may itself be damaged: run `sqlite3 {} 'PRAGMA \
                     integrity_check'`",
                    c.name,
                    c.source.display()
                ),
                e => format!("snapshotting {}: {e}", c.name),
            })
        })?;
        tracing::info!("snapshot {}: checked in {:?}", c.name, t.elapsed());
    }
    Ok(())
}

/// The parent's protected tree, served read-only to every sandbox of the evaluation.
fn protect_snapshot(p: &Plan, staging: &Staging) -> Result<(), EvaluateError> {
    super::protect::snapshot(
        staging.path(),
        &p.runtime,
        &p.manifest.runtime.source,
        &p.manifest.runtime.protected,
        &p.manifest.runtime.exclude,
    )?;
    crate::trace::mark("evaluate: protected tree copied");
    Ok(())
}

/// Whether no read of the source tree (the protected tree's copy, the source's hash) can
/// open a state store (nor its side files): each lies outside the source tree, or inside
/// a directory the manifest's `exclude` names (as the demo's `state`). Only then do those
/// reads run beside the stores' snapshot: every POSIX lock a process holds on a file
/// (SQLite's SHARED lock, which keeps writers off the database file while its bytes are
/// read) is dropped when any descriptor of that file in the process closes, so nothing
/// else in fork may open a state store while it is snapshotted. (A store hard-linked into
/// the source tree under another name is not seen here: only the runtime's owner can make
/// one, and it only spoils the snapshot of their own evaluation.)
fn stores_outside_source(p: &Plan) -> bool {
    use std::path::Component;
    let source = p.runtime.join(&p.manifest.runtime.source);
    p.manifest.runtime.state.iter().all(|s| {
        if s.components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return false;
        }
        let full = p.runtime.join(s);
        let Ok(rel) = full.strip_prefix(&source) else {
            return true;
        };
        rel.ancestors().any(|a| {
            !a.as_os_str().is_empty()
                && a != rel
                && p.manifest.runtime.exclude.iter().any(|e| Path::new(e) == a)
        })
    })
}

/// Every state store of the manifest, snapshotted into `snap_dir` and hashed; the copies'
/// integrity check is left to a [`StateCheck`].
fn snapshot_stores(p: &Plan, snap_dir: &Path) -> Result<Vec<StoreCopy>, EvaluateError> {
    let mut copies = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let read_as = stores_read_as(&p.runtime)?;
    for s in &p.manifest.runtime.state {
        let name = s
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| {
                EvaluateError::Input(format!("state path {} has no file name", s.display()))
            })?;
        if !seen.insert(name.clone()) {
            return Err(EvaluateError::Input(format!(
                "{}: two state stores share the file name `{name}`",
                p.manifest.file.display()
            )));
        }
        let opts = SnapshotOptions {
            check: IntegrityCheck::Skip,
            digest: p.policy.state.digest,
            precopy_min_bytes: p.policy.state.precopy.min_bytes,
            read_as: read_as.clone(),
            ..SnapshotOptions::default()
        };
        let stats = snapshot(&p.runtime.join(s), &snap_dir.join(&name), &opts)
            .map_err(|e| EvaluateError::Input(format!("snapshotting {}: {e}", s.display())))?;
        tracing::info!(
            "snapshot {}: {} bytes in {:?} by {:?} (copy {:?}, hash {:?}; {} steps, {} restarts, longest step {:?}; under the lock compared {:?} bytes, copied again {:?})",
            s.display(),
            stats.bytes,
            stats.elapsed,
            stats.method,
            stats.copy_elapsed,
            stats.hash_elapsed,
            stats.steps,
            stats.restarts,
            stats.longest_step,
            stats.compared_bytes,
            stats.recopied_bytes
        );
        // The copy of the parent's state is private to fork (and then to the successor).
        std::fs::set_permissions(
            snap_dir.join(&name),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .map_err(|e| internal("protecting the snapshot")(e.to_string()))?;
        copies.push(StoreCopy {
            name: s.display().to_string(),
            source: p.runtime.join(s),
            path: snap_dir.join(&name),
            digest: stats.digest.clone(),
        });
        check_interrupt()?;
    }
    crate::trace::mark("evaluate: state stores copied");
    Ok(copies)
}

/// Who the state stores of the runtime at `runtime` are opened as: a root-run fork on
/// another user's runtime opens them as that user (its filesystem identity on the
/// snapshotting thread), so a store it could not read (a hard link to a root-only
/// database, where `fs.protected_hardlinks` is 0) is refused, not copied into a sandbox
/// that runs the owner's code. None: as fork itself.
pub(super) fn stores_read_as(runtime: &Path) -> Result<Option<ReadAs>, EvaluateError> {
    let refused = |e: &dyn std::fmt::Display| {
        EvaluateError::Input(format!("opening the runtime {}: {e}", runtime.display()))
    };
    let fd = crate::fork::tree::open_dir_no_links(runtime).map_err(|e| refused(&e))?;
    let Some(o) = Owner::of_dir(&fd).map_err(|e| refused(&e))? else {
        return Ok(None);
    };
    let id = FsIdentity {
        uid: o.uid,
        gid: o.gid,
        groups: o.gids,
    };
    // Taken once here, so that a host where it cannot be taken (capabilities fork lacks)
    // is told so, as fork's own failure rather than as bad input.
    id.run(|| ())
        .map_err(|e| EvaluateError::Internal(format!("reading the state stores: {e}")))?;
    Ok(Some(ReadAs::new(o.uid, move |f| {
        id.run(f).map_err(std::io::Error::other)
    })))
}
