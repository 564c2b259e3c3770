//! What the command sees of the host: no secret (the node key, hidden files, `/run`), no
//! host process it could signal, a scrubbed environment, and no host run directory, network
//! or cgroup in its mount table and `/sys`.

use super::*;

#[test]
fn secrets_are_invisible() {
    need_root!();
    // The node key directory ($XDG_CONFIG_HOME/fork) and the policy's hide list.
    let cfg = scratch("xdg");
    std::fs::create_dir_all(cfg.join("fork")).unwrap();
    std::fs::write(cfg.join("fork/node.key"), b"SECRET-NODE-KEY").unwrap();
    let secret = scratch("hide");
    std::fs::write(secret.join("token"), b"SECRET-TOKEN").unwrap();
    let policy = secret.join("policy.toml");
    let text = std::fs::read_to_string(repo().join("policies/default.toml"))
        .unwrap()
        .replace(
            "hide = [",
            &format!("hide = [\"{}\", ", secret.join("token").display()),
        )
        .replace(
            "profile = \"seccomp/default.json\"",
            &format!(
                "profile = \"{}\"",
                repo().join("policies/seccomp/default.json").display()
            ),
        );
    std::fs::write(&policy, text).unwrap();
    let run_root = scratch("runs");
    let key = cfg.join("fork/node.key");
    let out = fork_cmd(&run_root)
        .env("XDG_CONFIG_HOME", &cfg)
        .args([
            "run",
            "--policy",
            policy.to_str().unwrap(),
            "--",
            "sh",
            "-c",
        ])
        .arg(format!(
            "cat {} {} 2>&1; ls {} 2>&1; ls /run | wc -l",
            key.display(),
            secret.join("token").display(),
            cfg.join("fork").display()
        ))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("SECRET"), "a secret leaked: {stdout}");
    assert!(
        stdout.trim_end().ends_with('0'),
        "/run must be empty: {stdout}"
    );
}

#[test]
fn host_processes_are_invisible_and_unkillable() {
    need_default_policy!();
    let mut victim = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = victim.id().to_string();
    let r = probe(&[], &["kill", &pid, "15"]);
    let p = r.probe();
    assert_eq!(p["succeeded"], false, "{p}");
    assert!(
        victim.try_wait().unwrap().is_none(),
        "the host process was killed"
    );
    victim.kill().unwrap();
    victim.wait().unwrap();
    // pid 1 is fork's init.
    let r = run(
        &[],
        &["sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline; echo; echo $$"],
    );
    assert!(r.stdout.contains("__sandbox-init"), "{}", r.stdout);
}

#[test]
fn environment_is_scrubbed() {
    need_default_policy!();
    let run_root = scratch("runs");
    let h = hostile_bin();
    let out = fork_cmd(&run_root)
        .env("FORK_TEST_SECRET", "supervisor-secret-value")
        .env("AWS_SECRET_ACCESS_KEY", "supervisor-secret-value")
        .args(["run", "--", h.to_str().unwrap(), "env"])
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(!s.contains("supervisor-secret-value"), "{s}");
    let v: serde_json::Value = serde_json::from_str(s.lines().last().unwrap()).unwrap();
    let env = v["env"].as_object().expect("env object");
    let allowed = [
        "PATH",
        "HOME",
        "TMPDIR",
        "LANG",
        "LC_ALL",
        "TERM",
        "TZ",
        "FORK_WORKSPACE",
        "FORK_RUN_ID",
    ];
    for k in env.keys() {
        assert!(
            allowed.contains(&k.as_str()),
            "unexpected variable {k} in the sandbox"
        );
    }
    assert_eq!(env["HOME"], "/tmp/successor/home");
    assert_eq!(env["TMPDIR"], "/tmp");
    // Nothing readable through the init's environment either.
    let out = fork_cmd(&run_root)
        .env("FORK_TEST_SECRET", "supervisor-secret-value")
        .args(["run", "--", h.to_str().unwrap(), "proc1-environ"])
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(!s.contains("supervisor-secret-value"), "{s}");
}

/// Fewer tells: the sandbox's mount table names no host run directory and no host file as
/// the source of a hidden file, `/sys` shows the sandbox's own network (only `lo`) and no
/// host cgroup, and the host name is the neutral one.
#[test]
fn the_sandbox_shows_no_host_run_directory_network_or_cgroup() {
    need_root!();
    let r = run(
        &[],
        &[
            "sh",
            "-c",
            "cat /proc/self/mountinfo; echo '== net'; ls /sys/class/net; echo '== cgroup'; ls -A /sys/fs/cgroup; echo '== host'; cat /proc/sys/kernel/hostname; echo '== shadow'; cat /etc/shadow 2>&1 || echo refused",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let section = |name: &str| -> Vec<String> {
        r.stdout
            .split(&format!("== {name}\n"))
            .nth(1)
            .unwrap_or_else(|| panic!("no {name} section: {}", r.stdout))
            .lines()
            .take_while(|l| !l.starts_with("== "))
            .map(str::to_string)
            .collect()
    };
    let mountinfo: Vec<&str> = r
        .stdout
        .lines()
        .take_while(|l| !l.starts_with("== "))
        .collect();
    assert!(mountinfo.len() > 10, "{}", r.stdout);
    let run_root = r.run_root.display().to_string();
    let null_covers = kernel_before(6, 15);
    for line in &mountinfo {
        let f: Vec<&str> = line.split(' ').collect();
        let (root, point) = (f[3], f[4]);
        assert!(
            !line.contains(&run_root) && !f[3..5].iter().any(|p| names_a_run_dir(p)),
            "a host run directory shows: {line}"
        );
        assert!(
            !line.contains(" cgroup ") && !line.contains(" cgroup2 "),
            "a host cgroup mount shows: {line}"
        );
        if root == "/null" && !null_covers {
            assert_eq!(point, "/dev/null", "{line}");
        }
    }
    // A hidden file is covered by an empty file made inside the sandbox, not by a host file
    // (such as /dev/null) bound over it; only kernels that cannot clone a detached mount
    // (before 6.15: Debian 12's 6.1) get the documented /dev/null fallback. What counts is
    // the top mount at that point (a host may have its own mount there beneath the cover:
    // virtme's guest has one at /etc/shadow).
    let mut top: std::collections::BTreeMap<&str, &str> = Default::default();
    for line in &mountinfo {
        let f: Vec<&str> = line.split(' ').collect();
        if f[4] == "/etc/shadow" || f[4].starts_with("/proc/k") {
            top.insert(f[4], f[3]);
        }
    }
    for (point, root) in &top {
        let expected: &[&str] = if null_covers {
            &["/empty", "/null"]
        } else {
            &["/empty"]
        };
        assert!(
            expected.contains(root),
            "{point} is covered by {root}, expected one of {expected:?}: {}",
            r.stdout
        );
    }
    assert!(
        mountinfo
            .iter()
            .any(|l| l.split(' ').nth(4) == Some("/etc/shadow")),
        "/etc/shadow is hidden by the default policy: {}",
        r.stdout
    );
    assert_eq!(section("net"), vec!["lo".to_string()], "{}", r.stdout);
    assert!(section("cgroup").is_empty(), "{}", r.stdout);
    assert_eq!(section("host"), vec!["localhost".to_string()]);
    // Covered: an empty file the command may not open, as /etc/shadow is to a user.
    let shadow = section("shadow");
    assert_eq!(
        shadow.last().map(String::as_str),
        Some("refused"),
        "{shadow:?}"
    );
    assert!(shadow[0].contains("Permission denied"), "{shadow:?}");
}

/// Whether the running kernel is older than `major.minor`.
fn kernel_before(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut it = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (a, b) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    (a, b) < (major, minor)
}

/// Whether a path has a component named as fork names its run directories (`fork-` or
/// `fork-eval-` and 16 hex digits): other paths with `fork-` in them (a test harness's own
/// directory, say) are not fork's.
fn names_a_run_dir(path: &str) -> bool {
    path.split('/').any(|c| {
        let id = c
            .strip_prefix("fork-eval-")
            .or_else(|| c.strip_prefix("fork-"))
            .unwrap_or("");
        id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit())
    })
}
