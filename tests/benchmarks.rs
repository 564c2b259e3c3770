//! The benchmark harness (`scripts/bench/interleave.py`), whose figures the README quotes:
//! what it counts must be what a command costs, including what the command leaves running
//! behind it (bubblewrap's monitor exits on its sandbox's exit code before the sandbox's
//! pid 1 has exited).

use std::path::Path;
use std::process::Command;

fn interleave(cmds: &[(&str, &str)]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bench/interleave.py");
    let mut c = Command::new("python3");
    c.arg(script).args(["--runs", "3", "--warmup", "0", "--"]);
    for (name, cmd) in cmds {
        c.args([name, cmd]);
    }
    let out = c.output().expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "interleave.py failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The median of the row `LABEL NAME  x ...` of the harness's report (the wall-time rows
/// have no label).
fn figure(report: &str, label: &str, name: &str) -> f64 {
    let prefix = if label.is_empty() {
        format!("{name} ")
    } else {
        format!("{label} {name} ")
    };
    report
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no `{prefix}` row in:\n{report}"))
}

#[test]
fn what_a_command_leaves_running_is_timed_and_counted() {
    // `left` exits at once, leaving a child that spins about as long as `spin` does
    // itself (a bounded loop, then it exits) and one that sleeps 0.2 s.
    let spin = "i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done";
    let report = interleave(&[
        ("spin", &format!("sh -c '{spin}'")),
        ("left", &format!("sh -c '( {spin} ) & sleep 0.2 & exit 0'")),
    ]);
    let spin_cpu = figure(&report, "cpu", "spin");
    let left_cpu = figure(&report, "cpu", "left");
    assert!(
        spin_cpu > 5.0,
        "the loop takes measurable CPU ({spin_cpu} ms):\n{report}"
    );
    assert!(
        left_cpu > spin_cpu * 0.6,
        "the CPU of the child left running ({left_cpu} ms) counts as the command's, \
         as much as the same loop run in line ({spin_cpu} ms):\n{report}"
    );
    let left_wall = figure(&report, "", "left");
    let left_settled = figure(&report, "settled", "left");
    assert!(
        left_wall < 150.0,
        "wall time is the command's own ({left_wall} ms):\n{report}"
    );
    assert!(
        left_settled >= 200.0,
        "settled waits for the 0.2 s sleep ({left_settled} ms):\n{report}"
    );
}

/// `scripts/bench-launch-layers.sh`: each fork variant it times runs first with `--report`,
/// and its isolation block must have exactly the layers the variant claims (a policy that
/// kept a layer on, or dropped another, stops the script); then every variant and both
/// bwraps get a figure in the summary, and each layer its cost.
#[test]
fn the_launch_by_layer_times_each_variant_with_the_layers_it_claims() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: the benchmark runs fork as root");
        return;
    }
    // Its peer: scripts/test.sh installs it; a bare `cargo test` without it returns here
    // rather than have the script install a package.
    let on_path = |cmd: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
    };
    if !on_path("bwrap") {
        eprintln!("skipped: bwrap (bubblewrap) is not installed; scripts/test.sh installs it");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bench-launch-layers.sh");
    let out = Command::new(script)
        .arg("2")
        .env("FORK_BIN", env!("CARGO_BIN_EXE_fork"))
        .output()
        .expect("the script runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "bench-launch-layers.sh failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let variants = [
        "builtin",
        "file",
        "no-netns",
        "no-seccomp",
        "no-landlock",
        "no-cgroup",
        "no-disk",
        "bwrap-layers",
    ];
    for name in variants {
        assert!(
            text.lines().any(|l| l == format!("isolation ok: {name}")),
            "`{name}` was not checked against what it claims:\n{text}"
        );
    }
    let summary = text
        .split("---- summary")
        .nth(1)
        .unwrap_or_else(|| panic!("no summary in:\n{text}"));
    for name in variants.into_iter().chain(["bwrap", "bwrap-no-netns"]) {
        let row: Vec<f64> = summary
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no `{name}` row in:\n{summary}"))
            .split_whitespace()
            .skip(1)
            .take(2)
            .map(|x| x.parse().unwrap_or(0.0))
            .collect();
        assert!(
            row.len() == 2 && row.iter().all(|x| *x > 0.0),
            "`{name}`: a wall and a CPU figure:\n{summary}"
        );
    }
    for layer in [
        "the network namespace:",
        "seccomp:",
        "Landlock:",
        "the cgroups (and cgroup namespace):",
        "the capped disk:",
        "seccomp + Landlock + cgroups:",
        "bwrap's network namespace:",
    ] {
        assert!(summary.contains(layer), "no cost of {layer}\n{summary}");
    }
    assert!(summary.contains("builtin/bwrap") && summary.contains("bwrap-layers/bwrap"));
}
