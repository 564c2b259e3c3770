//! Teardowns overlapped with what follows them: a side's sandbox (its cgroup, its disk,
//! its run directory) is destroyed on a thread of its own while the evaluation goes on
//! concluding, signing and writing the bundle; the staged state snapshot and protected copy
//! are removed the same way once every sandbox is made ([`Teardowns::remove_dir`]), and the
//! rest of the staging directory once the bundle has copied the artifacts out of it
//! ([`Teardowns::hold`], [`Teardowns::release_held`]). Every teardown is joined, a
//! sandbox's error surfaced as the evaluation's (a removal's is logged), before anything
//! depends on it being done:
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

/// A removal held for later (see [`Teardowns::hold`]).
type Held = Box<dyn FnOnce() + Send>;

/// The teardowns under way in one evaluation (held by its [`super::plan::Plan`]).
#[derive(Default)]
pub struct Teardowns {
    pending: Mutex<Vec<JoinHandle<Result<(), SandboxError>>>>,
    /// A removal held until the bundle has read what it needs ([`Teardowns::release_held`]):
    /// the evaluation's staging directory, moved into it. When the evaluation ends before,
    /// it is dropped unrun after the teardowns are joined, and what it holds with it (the
    /// staging directory is then removed in line).
    held: Mutex<Option<Held>>,
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

    /// Holds `removal` until [`Teardowns::release_held`] (one at a time: a second replaces
    /// the first, which is dropped unrun).
    pub fn hold(&self, removal: impl FnOnce() + Send + 'static) {
        // A replaced removal is dropped after the lock is let go (its drop removes a tree).
        let _replaced = self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(Box::new(removal));
    }

    /// Runs the removal held (if any) on a thread of its own, joined with the teardowns;
    /// in line when no thread can be started.
    pub fn release_held(&self) {
        let Some(removal) = self.held.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let (tx, rx) = std::sync::mpsc::channel::<Held>();
        let spawned = std::thread::Builder::new()
            .name("fork-teardown".into())
            .spawn(move || {
                if let Ok(r) = rx.recv() {
                    r();
                }
                Ok(())
            });
        // The removal goes to the thread only once the thread exists.
        match spawned {
            Ok(h) => {
                self.lock().push(h);
                if let Err(unsent) = tx.send(removal) {
                    (unsent.0)();
                }
            }
            Err(_) => removal(),
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

    /// What a held removal owns, and how often it went and by which way.
    struct Owned(std::sync::Arc<std::sync::atomic::AtomicUsize>);
    impl Drop for Owned {
        fn drop(&mut self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn a_held_removal_runs_once_on_release_and_is_joined_by_the_wait() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let (ran, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let t = Teardowns::default();
        let owned = Owned(dropped.clone());
        let r = ran.clone();
        t.hold(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            r.fetch_add(1, Ordering::SeqCst);
            drop(owned);
        });
        assert_eq!(
            (ran.load(Ordering::SeqCst), dropped.load(Ordering::SeqCst)),
            (0, 0)
        );
        t.release_held();
        t.release_held(); // nothing held any more
        t.wait().unwrap();
        // Done by the time the wait returns, once.
        assert_eq!(
            (ran.load(Ordering::SeqCst), dropped.load(Ordering::SeqCst)),
            (1, 1)
        );
        drop(t);
        assert_eq!(
            (ran.load(Ordering::SeqCst), dropped.load(Ordering::SeqCst)),
            (1, 1)
        );
    }

    #[test]
    fn a_held_removal_never_released_drops_what_it_holds_when_the_teardowns_go() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let (ran, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        {
            let t = Teardowns::default();
            let owned = Owned(dropped.clone());
            let r = ran.clone();
            t.hold(move || {
                r.fetch_add(1, Ordering::SeqCst);
                drop(owned);
            });
            t.wait().unwrap();
            assert_eq!(dropped.load(Ordering::SeqCst), 0, "held until the end");
        }
        // Not run, but what it held is gone (the staging directory's own Drop removes it).
        assert_eq!(
            (ran.load(Ordering::SeqCst), dropped.load(Ordering::SeqCst)),
            (0, 1)
        );
    }
}
