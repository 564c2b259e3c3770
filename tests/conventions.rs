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

/// The demo's `tests` task on the no-op patch, its progress on stderr: piped (plain lines),
/// or, when `tty`, under `script` (a pseudo-terminal: a live line). `vars` go into the
/// environment.
fn progress_of(env: &Env, name: &str, tty: bool, vars: &[(&str, &str)]) -> String {
    let out = env.out(name);
    let mut c = env.cmd();
    c.arg("evaluate")
        .arg(patch("noop-comment"))
        .arg("--runtime")
        .arg(demo())
        .args(["--task", "tests", "--no-cache", "--out"])
        .arg(&out)
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .env_remove("FORK_LOG");
    for (k, v) in vars {
        c.env(k, v);
    }
    let o = if tty {
        // script(1) runs the command on a pseudo-terminal and copies what it writes.
        let mut argv = vec![fork_bin().display().to_string()];
        argv.extend(c.get_args().map(|a| a.to_string_lossy().into_owned()));
        let shell = argv
            .iter()
            .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
            .collect::<Vec<_>>()
            .join(" ");
        let mut s = std::process::Command::new("script");
        s.args(["-qec", &shell, "/dev/null"])
            .stdin(std::process::Stdio::null());
        for (k, v) in c.get_envs() {
            match v {
                Some(v) => s.env(k, v),
                None => s.env_remove(k),
            };
        }
        s.output().expect("script(1) from util-linux")
    } else {
        c.output().unwrap()
    };
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let both = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        both.contains("task: tests (1 of 1)")
            && both.contains("run task tests, patched: exit 0 in ")
            && both.contains("tests 29 passed, 0 failed"),
        "{both}"
    );
    both
}

/// `evaluate` shows its phases and each run on stderr as they happen: plain lines without
/// a single escape code when piped; on a terminal a live line (rewritten in place) and
/// colour, except with NO_COLOR; RUST_LOG works as FORK_LOG does.
#[test]
fn progress_on_stderr_as_it_happens() {
    need_root!();
    let env = Env::new("cv-progress");
    let piped = progress_of(&env, "piped", false, &[]);
    for phase in [
        "plan:",
        "gates:",
        "snapshot:",
        "patch:",
        "task:",
        "verdict:",
    ] {
        assert!(piped.contains(&format!("fork: {phase}")), "{piped}");
    }
    assert!(
        piped.contains("fork: run task tests, patched: running\n"),
        "{piped}"
    );
    assert!(!piped.contains('\x1b') && !piped.contains('\r'), "{piped}");
    assert!(!piped.contains("ledger: appended row"), "{piped}");

    let tty = progress_of(&env, "tty", true, &[]);
    assert!(
        tty.contains("running\x1b[0m\r\x1b[2Kfork: \x1b[32mrun task tests, patched: exit 0"),
        "a live line replaced by the run's result: {tty:?}"
    );
    assert!(tty.contains("\x1b[1mtask: tests"), "{tty:?}");

    let no_colour = progress_of(&env, "nocolour", true, &[("NO_COLOR", "1")]);
    assert!(
        no_colour.contains("running\r\x1b[2Kfork: run task tests, patched: exit 0"),
        "still a live line: {no_colour:?}"
    );
    assert!(!no_colour.contains("\x1b[0m"), "no colour: {no_colour:?}");

    let logged = progress_of(&env, "rustlog", false, &[("RUST_LOG", "info")]);
    assert!(logged.contains("ledger: appended row"), "{logged}");
    let logged = progress_of(
        &env,
        "forklog",
        false,
        &[("FORK_LOG", "info"), ("RUST_LOG", "off")],
    );
    assert!(
        logged.contains("ledger: appended row"),
        "FORK_LOG wins: {logged}"
    );
}
