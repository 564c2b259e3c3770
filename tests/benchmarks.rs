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
