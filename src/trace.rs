//! `FORK_TRACE`: timestamps of a launch's phases, for finding where its time goes.
//!
//! With `FORK_TRACE` set (to anything but empty or `0`) when the process starts,
//! [`mark`] records `(phase, time since start)`; the command line prints the marks to
//! stderr when the command ends (`fork: trace <phase> +<ms>`). Otherwise [`mark`] is one
//! relaxed atomic load: nothing is recorded, nothing printed. The library only records;
//! printing is the command line's.
//!
//! "Start" is the moment [`start`] runs (the first thing `main` does), not the `execve`:
//! what the loader and the Rust runtime spend before `main` is outside the marks (a
//! benchmark sees it as the whole wall time minus the last mark).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The environment variable that turns tracing on.
pub const ENV: &str = "FORK_TRACE";

static ON: AtomicBool = AtomicBool::new(false);
static START: OnceLock<Instant> = OnceLock::new();
static MARKS: Mutex<Vec<(&'static str, Duration)>> = Mutex::new(Vec::new());

/// No more marks are kept than this (an evaluation of many runs stays bounded).
const MAX_MARKS: usize = 4096;

/// Starts the clock, and turns tracing on when `FORK_TRACE` asks for it. Call it first in
/// `main`; later calls do nothing.
pub fn start() {
    let t = *START.get_or_init(Instant::now);
    let on = std::env::var_os(ENV).is_some_and(|v| !v.is_empty() && v != "0");
    if on && !ON.swap(true, Ordering::SeqCst) {
        record("start", t.elapsed());
    }
}

/// Whether marks are being recorded.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Records that `phase` was reached now.
#[inline]
pub fn mark(phase: &'static str) {
    if enabled() {
        let since = START.get().map(|s| s.elapsed()).unwrap_or_default();
        record(phase, since);
    }
}

fn record(phase: &'static str, since: Duration) {
    let mut m = MARKS.lock().unwrap_or_else(|e| e.into_inner());
    if m.len() < MAX_MARKS {
        m.push((phase, since));
    }
}

/// The marks recorded so far, in order, and forgets them.
pub fn take() -> Vec<(&'static str, Duration)> {
    std::mem::take(&mut *MARKS.lock().unwrap_or_else(|e| e.into_inner()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn marks_are_kept_only_when_on() {
        // Off (the test process has no FORK_TRACE set by this test): nothing is kept.
        super::mark("ignored");
        if !super::enabled() {
            assert!(super::take().iter().all(|(p, _)| *p != "ignored"));
        }
        super::ON.store(true, std::sync::atomic::Ordering::SeqCst);
        super::mark("a");
        super::mark("b");
        let m = super::take();
        let a = m.iter().position(|(p, _)| *p == "a").unwrap();
        let b = m.iter().position(|(p, _)| *p == "b").unwrap();
        assert!(a < b && m[a].1 <= m[b].1, "{m:?}");
        super::ON.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}
