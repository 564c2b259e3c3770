//! Sandbox teardowns overlapped with what follows them: a side's sandbox (its cgroup, its
//! disk, its run directory) is destroyed on a thread of its own while the evaluation goes
//! on concluding, signing and writing the bundle. Every teardown is joined, and its error
//! surfaced as the evaluation's, before anything depends on it being done:
//!
//! - before the next sandbox of the evaluation is prepared (one side's sandbox is gone
//!   before the next starts, as when it was destroyed in line);
//! - before the verdict bundle takes its name (a failed teardown is the evaluation's
//!   error and no bundle is published, as when it was destroyed in line);
//! - on every other path out of the evaluation (errors, interrupts), when the plan that
//!   holds them drops: nothing is left running or on disk when `evaluate` returns.

use crate::sandbox::{Sandbox, SandboxError};
use std::sync::Mutex;
use std::thread::JoinHandle;

/// The teardowns under way in one evaluation (held by its [`super::plan::Plan`]).
#[derive(Default)]
pub struct Teardowns {
    pending: Mutex<Vec<JoinHandle<Result<(), SandboxError>>>>,
    /// The evaluation's staging directory, held until the bundle has read what it needs
    /// from it ([`Teardowns::release_staging`]); dropped (removed) in line after the
    /// teardowns are joined when the evaluation ends before.
    staging: Mutex<Option<super::staging::Staging>>,
}

impl Teardowns {
    /// Destroys `sb` on a thread of its own; in line when no thread can be started.
    pub fn destroy(&self, sb: Sandbox) -> Result<(), SandboxError> {
        // The sandbox goes to the thread only once the thread exists.
        let (tx, rx) = std::sync::mpsc::channel::<Sandbox>();
        let spawned = std::thread::Builder::new()
            .name("fork-teardown".into())
            .spawn(move || rx.recv().map_or(Ok(()), Sandbox::destroy));
        match spawned {
            Ok(h) => {
                self.lock().push(h);
                // The thread waits on the channel until it gets the sandbox: it cannot
                // have gone. Should it have, the sandbox comes back and is destroyed here.
                tx.send(sb).or_else(|back| back.0.destroy())
            }
            Err(_) => sb.destroy(),
        }
    }

    /// Removes `dir` (a part of the staging area no longer needed) on a thread of its
    /// own. What it cannot remove is only logged: the staging area's own removal, when
    /// the evaluation ends, takes whatever remains (as it always did).
    pub fn remove_dir(&self, dir: std::path::PathBuf) {
        let remove = move || {
            // A directory fork mounted a tmpfs on (the protected tree's copy, as root) goes
            // by detaching that, which frees its files at once; anything else (EINVAL: not
            // a mount point) is removed entry by entry.
            use nix::mount::{umount2, MntFlags};
            let _ = umount2(&dir, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW);
            match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!("removing {}: {e}", dir.display())
                }
                _ => {}
            }
            Ok(())
        };
        if let Ok(h) = std::thread::Builder::new()
            .name("fork-teardown".into())
            .spawn(remove)
        {
            self.lock().push(h);
        }
    }

    /// Holds the evaluation's staging directory until [`Teardowns::release_staging`].
    pub fn hold_staging(&self, staging: super::staging::Staging) {
        *self.staging.lock().unwrap_or_else(|e| e.into_inner()) = Some(staging);
    }

    /// Removes the staging directory held (if any) on a thread of its own, joined with the
    /// teardowns; in line when no thread can be started. Its errors are logged, as when it
    /// is dropped in line.
    pub fn release_staging(&self) {
        let Some(staging) = self
            .staging
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        let (tx, rx) = std::sync::mpsc::channel::<super::staging::Staging>();
        let spawned = std::thread::Builder::new()
            .name("fork-teardown".into())
            .spawn(move || {
                drop(rx.recv());
                Ok(())
            });
        // The staging directory goes to the thread only once the thread exists.
        match spawned {
            Ok(h) => {
                self.lock().push(h);
                let _ = tx.send(staging);
            }
            Err(_) => drop(staging),
        }
    }

    /// Joins every teardown under way; the first error, if any.
    pub fn wait(&self) -> Result<(), SandboxError> {
        let handles = std::mem::take(&mut *self.lock());
        let mut first = Ok(());
        for h in handles {
            let r = h.join().unwrap_or_else(|_| {
                Err(SandboxError::Setup {
                    stage: "destroy".into(),
                    message: "the teardown thread panicked".into(),
                })
            });
            if let (Err(e), Ok(())) = (r, &first) {
                first = Err(e);
            }
        }
        first
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<Result<(), SandboxError>>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Teardowns {
    fn drop(&mut self) {
        if let Err(e) = self.wait() {
            tracing::error!("destroying the sandbox: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removal_is_done_once_joined_and_a_missing_directory_is_no_error() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("state");
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("a/b/store.db"), vec![0u8; 64 * 1024]).unwrap();
        let t = Teardowns::default();
        t.remove_dir(dir.clone());
        t.remove_dir(d.path().join("never-made"));
        t.wait().unwrap();
        assert!(!dir.exists());
        assert!(t.lock().is_empty());
    }

    #[test]
    fn dropping_joins_what_is_under_way() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("protected");
        std::fs::create_dir_all(dir.join("x")).unwrap();
        {
            let t = Teardowns::default();
            t.remove_dir(dir.clone());
        }
        assert!(!dir.exists());
    }
}
