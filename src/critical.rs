//! Steps an interrupt must not cut apart: the ledger's head record written and its row
//! committed (cut between the two, the head says one row more than the table holds, which
//! reads as a deleted row: `ledger verify` says TAMPERED and every later append is refused).
//!
//! Such a step holds a [`Section`]; the interrupt watcher ([`crate::gc`]) ends a process
//! that holds no run only through [`end_outside`], which waits for the sections in progress
//! (at most [`MAX_WAIT`]) and lets no new one start.

use std::sync::{RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

static SECTIONS: RwLock<()> = RwLock::new(());

/// How long an interrupt waits for the sections in progress: each is a couple of fsyncs,
/// a rename and a commit.
pub const MAX_WAIT: Duration = Duration::from_secs(5);

/// A step that must finish whole once begun (see the module's doc); held until dropped.
pub struct Section(#[allow(dead_code)] RwLockReadGuard<'static, ()>);

/// Begins a section (waits while an interrupt is ending the process: then it never begins).
pub fn enter() -> Section {
    Section(SECTIONS.read().unwrap_or_else(|p| p.into_inner()))
}

/// Runs `end` (which ends the process) once no section is in progress, with none allowed to
/// begin; after [`MAX_WAIT`] without that, runs it anyway and says so.
pub fn end_outside(end: impl FnOnce()) {
    let t = Instant::now();
    loop {
        match SECTIONS.try_write() {
            Ok(_held) => {
                end();
                return;
            }
            Err(std::sync::TryLockError::Poisoned(p)) => {
                let _held = p.into_inner();
                end();
                return;
            }
            Err(std::sync::TryLockError::WouldBlock) if t.elapsed() < MAX_WAIT => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                tracing::warn!(
                    "a step that should not be cut (a ledger append) ran past {MAX_WAIT:?}: ending anyway"
                );
                end();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// The end waits for a section in progress, and no section begins after it.
    #[test]
    fn the_end_waits_for_a_section_and_none_begins_after_it() {
        let done = Arc::new(AtomicBool::new(false));
        let s = enter();
        let d = done.clone();
        let ender = std::thread::spawn(move || {
            end_outside(|| assert!(d.load(Ordering::SeqCst), "ended inside the section"));
        });
        std::thread::sleep(Duration::from_millis(50));
        done.store(true, Ordering::SeqCst);
        drop(s);
        ender.join().unwrap();
    }
}
