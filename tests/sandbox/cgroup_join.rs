//! The command is in its run's cgroups before any of it runs. On cgroup v2 the clone
//! places the init in its cgroup; on v1, as root, the cgroups are made while the init is
//! cloned, and the init joins each hierarchy at its release (the go message carries the
//! `tasks` files). Either way, seen without a cgroup namespace, every hierarchy fork
//! budgets with names the run's `fork-<id>` cgroup, and the budgets hold from the first
//! instruction. (That the v1 cgroups are taken after the clone, as root, is
//! `fork_trace_prints_the_launch_phases_in_order_and_nothing_without_it` in
//! tests/sandbox/launch.rs.)

use crate::common::*;
use crate::need_default_policy;

/// The controllers fork puts budgets on, one v1 hierarchy each (some share one), and
/// whether fork needs it (freezer only helps the kill: a host may have none).
const V1_CONTROLLERS: [(&str, bool); 5] = [
    ("memory", true),
    ("pids", true),
    ("cpu", true),
    ("cpuacct", true),
    ("freezer", false),
];

#[test]
fn the_command_is_in_the_runs_cgroup_in_every_hierarchy() {
    need_default_policy!();
    let d = scratch("cgroup-join");
    let policy = d.join("p.toml");
    // Without a cgroup namespace, /proc/self/cgroup shows the host's paths.
    std::fs::write(&policy, "[layers]\ncgroupns = \"off\"\n").unwrap();
    let r = run(
        &["--policy", policy.to_str().unwrap()],
        &["cat", "/proc/self/cgroup"],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stderr, r.report);
    let id = r.report["run_id"].as_str().expect("a run id").to_string();
    let leaf = format!("/fork-{id}");
    let version = r.report["isolation"]["cgroup"].as_str().unwrap_or("");
    let lines: Vec<(&str, &str)> = r
        .stdout
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
            Some((ctl, path))
        })
        .collect();
    match version {
        "v1" => {
            for (want, needed) in V1_CONTROLLERS {
                let Some((_, path)) = lines
                    .iter()
                    .find(|(ctl, _)| ctl.split(',').any(|c| c == want))
                else {
                    assert!(!needed, "no {want} hierarchy in {:?}", r.stdout);
                    continue;
                };
                assert!(
                    path.ends_with(&leaf),
                    "{want}: the command is in {path}, not in the run's {leaf}"
                );
            }
        }
        "v2" => {
            let (_, path) = lines
                .iter()
                .find(|(ctl, _)| ctl.is_empty())
                .unwrap_or_else(|| panic!("no unified hierarchy in {:?}", r.stdout));
            assert!(
                path.ends_with(&leaf),
                "the command is in {path}, not {leaf}"
            );
        }
        other => panic!("no cgroup layer in force ({other:?}): {}", r.report),
    }
}

/// The budgets hold from the first instruction: a bounded fork loop started at once is
/// stopped at the pids budget (the init was in its cgroups before the command existed).
#[test]
fn a_budget_holds_from_the_first_instruction() {
    need_default_policy!();
    let r = run(
        &["--pids", "8"],
        &[
            "sh",
            "-c",
            "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16; do sleep 2 & done; wait",
        ],
    );
    assert_eq!(
        r.report["budget_exceeded"].as_str(),
        Some("pids"),
        "{}",
        r.report
    );
    let peak = r.report["usage"]["pids_peak"].as_u64().unwrap_or(0);
    assert!(peak <= 8, "peak {peak}");
}
