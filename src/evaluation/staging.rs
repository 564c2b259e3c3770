//! The evaluation's staging area (its own locked run directory, removed on drop) and the
//! one snapshot of every state store that both sides share.

use super::plan::{combined_state_hash, Plan};
use super::{check_interrupt, internal, EvaluateError};
use crate::fork::snapshot::{snapshot, SnapshotOptions};
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

/// FORK, once per evaluation: every state store of the manifest snapshotted with SQLite's
/// online backup API into `<staging>/state` (0600 copies), and the protected tree copied
/// into `<staging>/protected` (see `protect`). Returns the state directory and the
/// combined state hash. The two are independent (different sources, different
/// directories), so the state stores are copied, checked and hashed on a thread of their
/// own while this one copies the protected tree; a state store's error is reported first,
/// as before.
pub fn snapshot_state(p: &Plan, staging: &Staging) -> Result<(PathBuf, String), EvaluateError> {
    let snap_dir = staging.path().join("state");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&snap_dir)
        .map_err(|e| internal("staging")(e.to_string()))?;
    if !stores_outside_protected(p) {
        let state_digests = snapshot_stores(p, &snap_dir)?;
        protect_snapshot(p, staging)?;
        return Ok((snap_dir, combined_state_hash(&state_digests)));
    }
    let (states, protected) = std::thread::scope(|s| {
        let states = s.spawn(|| snapshot_stores(p, &snap_dir));
        let protected = protect_snapshot(p, staging);
        let states = states.join().unwrap_or_else(|_| {
            Err(EvaluateError::Internal(
                "the state snapshot's thread panicked".into(),
            ))
        });
        (states, protected)
    });
    let state_digests = states?;
    protected?;
    Ok((snap_dir, combined_state_hash(&state_digests)))
}

/// The parent's protected tree, served read-only to every sandbox of the evaluation.
fn protect_snapshot(p: &Plan, staging: &Staging) -> Result<(), EvaluateError> {
    super::protect::snapshot(
        staging.path(),
        &p.runtime.join(&p.manifest.runtime.source),
        &p.manifest.runtime.protected,
        &p.manifest.runtime.exclude,
    )
}

/// Whether the protected tree's copy can never open a state store (nor its side files):
/// each lies outside the source tree, or inside a directory the manifest's `exclude` names
/// (as the demo's `state`). Only then do the two copies run side by side: every POSIX lock
/// a process holds on a file (SQLite's SHARED lock, which keeps writers off the database
/// file while its bytes are read) is dropped when any descriptor of that file in the
/// process closes, so nothing else in fork may open a state store while it is snapshotted.
fn stores_outside_protected(p: &Plan) -> bool {
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

/// Every state store of the manifest, snapshotted into `snap_dir`: (path, sha256) each.
fn snapshot_stores(p: &Plan, snap_dir: &Path) -> Result<Vec<(String, String)>, EvaluateError> {
    let mut state_digests = Vec::new();
    let mut seen = std::collections::HashSet::new();
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
        let stats = snapshot(
            &p.runtime.join(s),
            &snap_dir.join(&name),
            &SnapshotOptions::default(),
        )
        .map_err(|e| EvaluateError::Input(format!("snapshotting {}: {e}", s.display())))?;
        tracing::info!(
            "snapshot {}: {} bytes in {:?} ({} steps, {} restarts, longest step {:?})",
            s.display(),
            stats.bytes,
            stats.elapsed,
            stats.steps,
            stats.restarts,
            stats.longest_step
        );
        // The copy of the parent's state is private to fork (and then to the successor).
        std::fs::set_permissions(
            snap_dir.join(&name),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .map_err(|e| internal("protecting the snapshot")(e.to_string()))?;
        state_digests.push((s.display().to_string(), stats.sha256.clone()));
        check_interrupt()?;
    }
    Ok(state_digests)
}
