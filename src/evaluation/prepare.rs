//! Phases 2 and 3 for one side: FORK (a sandbox whose workspace holds the source, the
//! tools and the state snapshot) and PATCH (the patched side only), and the doors a run of
//! the plan gets.

use super::plan::{Plan, TaskPlan};
use super::{check_interrupt, internal, EvaluateError};
use crate::fork::workspace::{
    copy_tree, copy_tree_beneath, copy_tree_beneath_listed, tree_and_deploy_hashes_after,
    TreeListing, Workspace,
};
use crate::patch::{self, Patch};
use crate::sandbox::Sandbox;
use std::path::Path;

/// A sandbox with its workspace populated (and patched, on the patched side).
pub struct PreparedSide {
    pub sb: Sandbox,
    pub ws: Workspace,
    /// The patched tree's hashes (the patched side only; every side's copy was compared
    /// with the source the evaluation began with before any patch).
    pub patched: Option<PatchedTree>,
}

/// What the verdict says of the tree the successor ran.
#[derive(Debug, Clone)]
pub struct PatchedTree {
    /// [`tree_hash`] of `src/` after the patch.
    pub source_hash: String,
    /// [`crate::fork::deploy_tree_hash`] of the same tree (what a deployer's `git apply`
    /// must give).
    pub deploy_hash: String,
}

impl PreparedSide {
    /// The sandbox alone (its workspace stays populated on its disk).
    pub fn into_sandbox(self) -> Sandbox {
        self.sb
    }
}

pub enum Prepared {
    Ready(Box<PreparedSide>),
    /// The patch did not apply (message), with the unpatched tree hash.
    DidNotApply(String, String),
}

/// The error for a part of the parent's tree that cannot be read as it must be (a link, a
/// swapped entry): bad input naming it, never followed.
fn refused(what: &'static str) -> impl Fn(String) -> EvaluateError {
    move |e| EvaluateError::Input(format!("copying {what} of the runtime: {e}"))
}

/// How a failed copy of the runtime's source into a side's workspace `dest` is told: a
/// workspace already holding something, or an error on `dest` itself, is fork's own doing
/// (internal, 70); anything else is the runtime's source refused (bad input, 65).
fn source_copy_error(e: crate::fork::workspace::WorkspaceError, dest: &Path) -> EvaluateError {
    use crate::fork::workspace::WorkspaceError;
    match e {
        e @ WorkspaceError::NotEmpty { .. } => internal("copying the source tree")(e.to_string()),
        WorkspaceError::Io(e) if e.path == dest => {
            internal("copying the source tree")(e.to_string())
        }
        e => refused("the source tree")(e.to_string()),
    }
}

/// Whether a failed copy into the workspace ran out of room on the workspace's disk (the
/// only writes a copy makes are there; ENOSPC is also tmpfs's answer past its inodes).
fn out_of_disk(e: &crate::fork::workspace::WorkspaceError) -> bool {
    use crate::fork::workspace::WorkspaceError;
    matches!(e, WorkspaceError::Io(io)
        if matches!(io.source.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)))
}

/// The error of a side whose workspace did not hold the runtime's trees: the disk budget
/// is smaller than what the successor is given before it runs (a usage error: the budget
/// is the caller's to raise), with what each part takes.
fn disk_too_small(
    p: &Plan,
    t: &TaskPlan,
    source_dir: &Path,
    source_is: &TreeListing,
    snap_dir: &Path,
    what: &str,
) -> EvaluateError {
    use crate::units::format_size;
    let source: u64 = source_is
        .files()
        .filter_map(|f| std::fs::symlink_metadata(source_dir.join(f)).ok())
        .map(|m| m.len())
        .sum();
    let tools = p
        .manifest
        .runtime
        .tools
        .as_ref()
        .map_or(0, |t| dir_bytes(&p.runtime.join(t)));
    let state = dir_bytes(snap_dir);
    EvaluateError::Usage(format!(
        "copying {what} into the workspace of task `{}`: its disk is full. The disk budget \
         (budget.disk) is {}, and the workspace needs about {} before anything runs (source \
         {}, tools {}, state {}) besides what the task writes: raise budget.disk (--disk, \
         the policy's [budget] disk, or the task's budget in fork.toml)",
        t.name,
        format_size(t.budgets.disk_bytes),
        format_size(source + tools + state),
        format_size(source),
        format_size(tools),
        format_size(state),
    ))
}

/// The bytes of the regular files beneath `dir`, links not followed (at most 100,000
/// entries looked at: this sizes an error message).
fn dir_bytes(dir: &Path) -> u64 {
    let (mut total, mut left, mut stack) = (0u64, 100_000usize, vec![dir.to_path_buf()]);
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if left == 0 {
                return total;
            }
            left -= 1;
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) if m.is_file() => total += m.len(),
                _ => {}
            }
        }
    }
    total
}

/// The error of a side whose copy of the runtime's source is not the tree the evaluation
/// began with: the parent changed its source meanwhile (`what`: the paths, or the hashes).
/// No run of it may count.
pub fn source_moved(source_dir: &Path, what: &str) -> EvaluateError {
    EvaluateError::Input(format!(
        "{}: the runtime's source tree changed during the evaluation ({what}): no verdict is \
         given on a tree that moved; evaluate again once the parent's source holds still, \
         and list what the running parent writes there in the manifest's `exclude`",
        source_dir.display()
    ))
}

/// FORK (and PATCH) for one run: a sandbox whose workspace holds the source (patched when
/// `patch` is given), the tools and the state snapshot. `source_is`: the tree the copied
/// source (before any patch) must be, the one the evaluation began with (every side's, a
/// judge's too).
pub fn prepare_side(
    p: &Plan,
    t: &TaskPlan,
    source_dir: &Path,
    snap_dir: &Path,
    patch: Option<&Patch>,
    source_is: &TreeListing,
) -> Result<Prepared, EvaluateError> {
    // Every sandbox of the evaluation is served the parent's protected tree read-only
    // (snapshotted next to the state: `<staging>/state` and `<staging>/protected`).
    // Fail closed: without the staging directory there is no protected copy to serve.
    let staging = snap_dir.parent().ok_or_else(|| {
        EvaluateError::Internal(format!(
            "the state snapshot {} has no staging directory above it",
            snap_dir.display()
        ))
    })?;
    let mut spec = t.sandbox.clone();
    spec.ro_binds = super::protect::binds(staging)?;
    // The sandbox destroyed last is gone before the next one is made.
    p.teardowns.wait()?;
    let sb = Sandbox::prepare(&spec)?;
    crate::trace::mark("side: sandbox prepared");
    let ws = Workspace::create(&sb.workspace())
        .map_err(|e| internal("creating the workspace")(e.to_string()))?;
    // The parent's tree is read beneath its runtime directory, never through a link, each
    // file checked on its descriptor: its owner may swap entries while we read.
    let source_rel = source_dir.strip_prefix(&p.runtime).map_err(|_| {
        internal("copying the source tree")(format!(
            "{} is not beneath {}",
            source_dir.display(),
            p.runtime.display()
        ))
    })?;
    // The copy's listing comes from the bytes it wrote (the copy is not read again).
    let (_, now) = copy_tree_beneath_listed(
        &p.runtime,
        source_rel,
        &ws.src(),
        &p.manifest.runtime.exclude,
    )
    .map_err(|e| match out_of_disk(&e) {
        true => disk_too_small(p, t, source_dir, source_is, snap_dir, "the source tree"),
        false => source_copy_error(e, &ws.src()),
    })?;
    // The copy is the source the evaluation began with, or no run of it may count
    // (checked before the tools and the state are copied).
    if now.hash != source_is.hash {
        // The moved tree is the error to report; a sandbox that would not go is said
        // beside it.
        if let Err(e) = sb.destroy() {
            tracing::error!("destroying the sandbox of a moved source tree: {e}");
        }
        let changed: Vec<String> = source_is
            .changed(&now, 5)
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let what = if changed.is_empty() {
            format!("it hashed {}, a later copy {}", source_is.hash, now.hash)
        } else {
            format!("changed: {}", changed.join(", "))
        };
        return Err(source_moved(source_dir, &what));
    }
    if let Some(tools) = &p.manifest.runtime.tools {
        copy_tree_beneath(&p.runtime, tools, &ws.tools(), &[]).map_err(|e| {
            match out_of_disk(&e) {
                true => disk_too_small(p, t, source_dir, source_is, snap_dir, "the tools"),
                false => refused("the tools")(e.to_string()),
            }
        })?;
    }
    copy_tree(snap_dir, &ws.state(), &[]).map_err(|e| match out_of_disk(&e) {
        true => disk_too_small(p, t, source_dir, source_is, snap_dir, "the state snapshot"),
        false => internal("copying the state snapshot")(e.to_string()),
    })?;
    crate::trace::mark("side: trees copied");
    check_interrupt()?;
    // 3 PATCH (the patched side only).
    if let Some(patch) = patch {
        if let Err(e) = patch::apply(&ws.src(), patch) {
            // A patch that does not apply writes nothing (every file is computed first):
            // the tree is the one just hashed.
            sb.destroy()?;
            return Ok(Prepared::DidNotApply(e.to_string(), now.hash));
        }
        crate::trace::mark("side: patch applied");
    }
    // The tree the successor runs, hashed before it runs (it may write into src/).
    let patched = match patch {
        Some(patch) => {
            // The files the patch names are read again; every other one is as copied
            // (only fork has written the copy since), its listed digest stands for it.
            let (source_hash, deploy_hash) = tree_and_deploy_hashes_after(
                &ws.src(),
                &p.manifest.runtime.exclude,
                &now,
                &patch.paths(),
            )
            .map_err(|e| internal("hashing the patched tree")(e.to_string()))?;
            Some(PatchedTree {
                source_hash,
                deploy_hash,
            })
        }
        None => None,
    };
    Ok(Prepared::Ready(Box::new(PreparedSide { sb, ws, patched })))
}

/// The doors of one run: the forwards and, with a gateway, the metered model door (a
/// fresh gateway per run, on that run's runtime, sharing the evaluation's meter).
pub fn doors_for(p: &Plan, t: &TaskPlan) -> Result<crate::sandbox::Doors, EvaluateError> {
    let mut doors = crate::sandbox::Doors {
        doors: t
            .forwards
            .iter()
            .map(|a| crate::sandbox::Door::forward(*a))
            .collect(),
        cost: None,
    };
    if let Some(g) = &p.gateway {
        let gw =
            crate::gateway::Gateway::new(g.cfg.clone(), g.credentials.clone(), g.meter.clone())
                .map_err(|e| EvaluateError::Input(format!("the model gateway: {e}")))?;
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], g.cfg.port()));
        if t.forwards.contains(&addr) {
            return Err(EvaluateError::Input(format!(
                "the model gateway's port {} is also forwarded: choose another gateway.port",
                g.cfg.port()
            )));
        }
        doors.cost = Some(gw.clone());
        doors.doors.push(crate::sandbox::Door {
            addr,
            serve: Box::new(move |l| Box::pin(gw.serve(l))),
        });
    }
    Ok(doors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fork::workspace::WorkspaceError;

    /// A workspace that already holds something, or fails itself, is fork's fault; an
    /// entry of the runtime's source that cannot be copied is the runtime's.
    #[test]
    fn a_failed_source_copy_blames_the_workspace_only_for_its_own_faults() {
        let dest = Path::new("/run/fork-x/ws/src");
        let io = |path: &str| {
            WorkspaceError::Io(crate::ioerr::IoError::new(
                "create",
                Path::new(path),
                std::io::Error::from_raw_os_error(nix::errno::Errno::ENOSPC as i32),
            ))
        };
        let cases = [
            (WorkspaceError::NotEmpty { path: dest.into() }, true),
            (io("/run/fork-x/ws/src"), true),
            (io("/srv/runtime/src/app.py"), false),
            (
                WorkspaceError::Link {
                    path: "/srv/runtime/src/a".into(),
                    component: "a".into(),
                },
                false,
            ),
        ];
        for (e, ours) in cases {
            let shown = e.to_string();
            match source_copy_error(e, dest) {
                EvaluateError::Internal(m) => {
                    assert!(ours, "{shown}: internal");
                    assert!(m.starts_with("copying the source tree: "), "{m}");
                    assert!(m.contains(&shown), "{m}");
                }
                EvaluateError::Input(m) => {
                    assert!(!ours, "{shown}: input");
                    assert!(m.contains(&shown), "{m}");
                }
                other => panic!("{shown}: {other:?}"),
            }
        }
    }
}
