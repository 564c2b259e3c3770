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

/// Keys in the formats users already hold: a node key made by ssh-keygen (OpenSSH), by
/// OpenSSL (PKCS#8 PEM) or by an earlier fork ("FORK NODE KEY") endorses verdicts, and
/// `--trust` takes its public half as a file or a string in OpenSSH, SubjectPublicKeyInfo
/// PEM or `ed25519:<base64>`. `fork keygen` writes PKCS#8 and SubjectPublicKeyInfo PEM,
/// and names what it wrote without calling a steward's key a node key.
#[test]
fn standard_key_formats_sign_and_are_trusted() {
    need_root!();
    let env = Env::new("cv-keys");
    let tool = |cmd: &str, args: &[&str]| {
        let o = std::process::Command::new(cmd)
            .args(args)
            .current_dir(&env.dir)
            .output()
            .unwrap_or_else(|e| panic!("{cmd}: {e}"));
        assert!(o.status.success(), "{cmd} {args:?}: {}", text(&o));
        o
    };
    tool(
        "ssh-keygen",
        &["-q", "-t", "ed25519", "-N", "", "-C", "n", "-f", "ssh.key"],
    );
    tool(
        "openssl",
        &["genpkey", "-algorithm", "ed25519", "-out", "ossl.key"],
    );
    tool(
        "openssl",
        &["pkey", "-in", "ossl.key", "-pubout", "-out", "ossl.pub"],
    );
    let legacy_seed = [7u8; 32];
    let legacy = env.dir.join("legacy.key");
    std::fs::write(
        &legacy,
        format!(
            "-----BEGIN FORK NODE KEY-----\nKey-Type: ed25519\n\n{}\n-----END FORK NODE KEY-----\n",
            base64_std(&legacy_seed)
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    for k in ["ssh.key", "ossl.key", "legacy.key"] {
        std::fs::set_permissions(env.dir.join(k), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let legacy_pub = fork::identity::load_node_key(&legacy)
        .unwrap()
        .public()
        .to_string();
    let ssh_line = std::fs::read_to_string(env.dir.join("ssh.key.pub")).unwrap();
    let ossl_pem = std::fs::read_to_string(env.dir.join("ossl.pub")).unwrap();
    let cases: [(&str, Vec<String>); 3] = [
        (
            "ssh.key",
            vec![
                env.dir.join("ssh.key.pub").display().to_string(),
                ssh_line.trim().to_string(),
            ],
        ),
        (
            "ossl.key",
            vec![
                env.dir.join("ossl.pub").display().to_string(),
                ossl_pem.clone(),
            ],
        ),
        ("legacy.key", vec![legacy_pub]),
    ];
    for (key, trusts) in cases {
        let key_path = env.dir.join(key);
        let out = env.out(key);
        let o = env
            .cmd()
            .arg("evaluate")
            .arg(patch("noop-comment"))
            .arg("--runtime")
            .arg(demo())
            .args(["--task", "tests", "--no-ledger", "--key"])
            .arg(&key_path)
            .arg("--policy")
            .arg(human_policy())
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{key}: {}", text(&o));
        for trust in trusts {
            let o = env
                .cmd()
                .arg("verify")
                .arg(&out)
                .args(["--trust", &trust])
                .output()
                .unwrap();
            assert_eq!(
                o.status.code(),
                Some(0),
                "{key} trusted as {trust}: {}",
                text(&o)
            );
        }
        // Another key's public half is not trusted.
        let o = env
            .cmd()
            .arg("verify")
            .arg(&out)
            .args(["--trust", &ossl_pem])
            .output()
            .unwrap();
        let expected = if key == "ossl.key" { 0 } else { 1 };
        assert_eq!(o.status.code(), Some(expected), "{key}: {}", text(&o));
    }

    let steward = env.dir.join("steward.key");
    let o = env
        .cmd()
        .args([
            "keygen",
            "--out",
            steward.to_str().unwrap(),
            "--public-format",
            "openssh",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("node key"), "{}", text(&o));
    assert!(
        err.contains("key written to") && err.contains("steward.pub"),
        "{}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("ssh-ed25519 AAAA"),
        "{}",
        text(&o)
    );
    let pem = std::fs::read_to_string(&steward).unwrap();
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"), "{pem}");
    // OpenSSL reads both halves, and they match.
    let derived = tool("openssl", &["pkey", "-in", "steward.key", "-pubout"]);
    assert_eq!(
        String::from_utf8_lossy(&derived.stdout),
        std::fs::read_to_string(env.dir.join("steward.pub")).unwrap()
    );
}

fn base64_std(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}
