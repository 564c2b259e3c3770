//! Budgets: a run that blows its wall time, memory, pids or disk budget is stopped, and the
//! report names the budget.

use super::*;

#[test]
fn wall_budget_kills_promptly() {
    need_default_policy!();
    let t = Instant::now();
    let r = run(&["--wall", "2s"], &["sleep", "30"]);
    let took = t.elapsed();
    assert_eq!(r.budget().as_deref(), Some("wall"), "{}", r.report);
    assert_eq!(r.code, 137);
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(took >= Duration::from_secs(2));
}

#[test]
fn memory_budget_ooms_a_big_allocation() {
    need_default_policy!();
    let r = probe(&["--memory", "128MiB"], &["alloc", "1024"]);
    assert_eq!(
        r.budget().as_deref(),
        Some("memory"),
        "{} {}",
        r.report,
        r.stdout
    );
    let peak = r.report["usage"]["memory_peak_bytes"].as_u64().unwrap();
    assert!(peak <= 129 << 20, "peak {peak}");
}

#[test]
fn pids_budget_stops_a_bounded_fork_loop() {
    need_default_policy!();
    let r = probe(&["--pids", "64"], &["fork-many", "200", "5"]);
    assert_eq!(r.budget().as_deref(), Some("pids"), "{}", r.report);
    let peak = r.report["usage"]["pids_peak"].as_u64().unwrap();
    assert!(peak <= 64, "peak {peak}");
    assert!(
        peak >= 32,
        "the loop should get near the limit, peak {peak}"
    );
}

#[test]
fn disk_budget_stops_a_big_write() {
    need_default_policy!();
    let r = probe(
        &["--disk", "64MiB"],
        &["write-bytes", "/tmp/successor/big", "400"],
    );
    assert_eq!(
        r.budget().as_deref(),
        Some("disk"),
        "{} {}",
        r.report,
        r.stdout
    );
    let used = r.report["usage"]["disk_bytes"].as_u64().unwrap();
    assert!(used <= 64 << 20, "used {used}");
    // /tmp shares the same cap.
    let r = probe(&["--disk", "64MiB"], &["write-bytes", "/tmp/big", "400"]);
    assert_eq!(r.budget().as_deref(), Some("disk"), "{}", r.report);
}
