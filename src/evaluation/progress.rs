//! Progress of an evaluation, as it happens: the phase it is in and each sandbox run as it
//! starts and ends. The library never prints: it emits `tracing` events with the target
//! [`TARGET`] and a `kind` field, and the command line decides how to show them (a live
//! line on a terminal, plain lines otherwise).

use super::collect::RunResult;

/// The `tracing` target of every progress event.
pub const TARGET: &str = "fork::progress";

/// A phase of the lifecycle begins (`plan`, `gates`, `snapshot`, `patch`, `task`,
/// `verdict`), with what it is about.
pub fn phase(name: &str, detail: &str) {
    tracing::info!(target: TARGET, kind = "phase", phase = name, "{name}: {detail}");
}

/// What a run is called in progress lines: `task tests, patched` or `..., attempt 2`.
fn run_name(task: &str, side: &str, attempt: u32) -> String {
    if attempt == 0 {
        format!("task {task}, {side}")
    } else {
        format!("task {task}, {side}, rerun {attempt}")
    }
}

/// A sandbox run starts (shown until it ends).
pub fn run_started(task: &str, side: &str, attempt: u32) {
    let name = run_name(task, side, attempt);
    tracing::info!(target: TARGET, kind = "run_start", "run {name}: running");
}

/// A sandbox run ended: how, in how long, and what it reported.
pub fn run_finished(task: &str, side: &str, attempt: u32, r: &RunResult) {
    let name = run_name(task, side, attempt);
    let o = &r.outcome;
    let how = if let Some(b) = o.budget_exceeded {
        format!("killed: the {} budget was exceeded", b.as_str())
    } else if let Some(e) = &o.exec_error {
        format!("could not start: {e}")
    } else if let Some(s) = o.signal {
        format!("killed by signal {s}")
    } else {
        format!("exit {}", o.exit_code)
    };
    let tests = r
        .tests
        .as_ref()
        .map(|t| {
            format!(
                ", tests {} passed, {} failed, {} skipped",
                t.passed() + t.flaky(),
                t.failed(),
                t.skipped()
            )
        })
        .unwrap_or_default();
    let ok = o.budget_exceeded.is_none()
        && o.exec_error.is_none()
        && o.signal.is_none()
        && o.exit_code == 0
        && r.tests.as_ref().is_none_or(|t| t.failed() == 0);
    tracing::info!(
        target: TARGET,
        kind = "run_end",
        ok,
        "run {name}: {how} in {:.2}s{tests}",
        o.usage.wall_s
    );
}
