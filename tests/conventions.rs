//! What users' own tools and habits expect (issue 13), with the real binary: manifest and
//! command-line conventions, progress on stderr, standard key formats.
//!
//! The evaluations need root (the default policy mounts a capped tmpfs and creates
//! cgroups); each test has a private run root, node key and ledger.

mod common;
use common::lifecycle::*;
use common::*;
use std::process::Output;

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `results = { format = "exit_status" }` needs no path (the README offers it so): the
/// task's exit status is the result. Any other format without a path is refused, naming
/// the field.
#[test]
fn exit_status_results_need_no_path() {
    need_root!();
    let env = Env::new("cv-exit-status");
    let rt = env.runtime(
        "hermes-demo",
        "\n[tasks.status]\ncommand = [\"python3\", \"-c\", \"import hermes\"]\nresults = { format = \"exit_status\" }\n",
    );
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "status",
        &["--task", "status"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert_eq!(e.verdict["task"], "status", "{}", e.ctx());

    let rt = env.runtime(
        "no-path",
        "\n[tasks.nopath]\ncommand = [\"true\"]\nresults = { format = \"junit\" }\n",
    );
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "nopath",
        &["--task", "nopath"],
    );
    assert_eq!(e.code, 65, "{}", e.ctx());
    assert!(
        e.stderr.contains("tasks.nopath.results.path") && e.stderr.contains("`junit`"),
        "{}",
        e.ctx()
    );
}

/// A negative-looking budget value is a value, checked by fork's own pipeline: the error
/// names the field (never clap's "to pass '-5' as a value, use '-- -5'"), exit 64.
#[test]
fn negative_budget_values_get_forks_own_error() {
    let dir = scratch("cv-negative");
    for (flag, value, field) in [
        ("--wall", "-5", "budget.wall"),
        ("--cpu", "-5", "budget.cpu"),
        ("--pids", "-3", "budget.pids"),
        ("--api-cost", "-1", "budget.api_cost"),
        ("--memory", "-1GiB", "budget.memory"),
    ] {
        let o = fork_cmd(&dir.join("runs"))
            .args(["run", flag, value, "--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(64), "{}", text(&o));
        assert!(
            err.starts_with(&format!("fork: the command line: {field}: `{value}`")),
            "{}",
            text(&o)
        );
        assert!(!err.contains("-- -"), "no clap tip: {}", text(&o));
    }
    let o = fork_cmd(&dir.join("runs"))
        .args(["evaluate", "x.diff", "--wall", "-5"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("budget.wall: `-5`"),
        "{}",
        text(&o)
    );
}
