//! Launching: a bad policy or seccomp profile (65), a missing isolation layer or a missing or
//! stale `fork-init` (69) is refused, naming it and leaving nothing behind; `fork check`
//! reports every layer; `FORK_TRACE` prints the launch phases in order.

use super::*;

#[test]
fn bad_policy_is_exit_65_naming_the_file() {
    let d = scratch("badpolicy");
    let p = d.join("broken.toml");
    std::fs::write(&p, "[budget]\nwal = \"1h\"\n").unwrap();
    let out = fork_cmd(&d)
        .args(["run", "--policy", p.to_str().unwrap(), "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(65));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("broken.toml") && err.contains("wal"), "{err}");
    let out = fork_cmd(&d)
        .args(["run", "--wall", "soon", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn missing_layer_is_exit_69_naming_it() {
    need_root!();
    // nobody has no cgroup delegated to it (here, and in the VM harness), so the default
    // policy's cgroup layer is missing for it (the capped disk it now has: fork mounts it
    // in a namespace of its own).
    let d = scratch("unpriv");
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(fork_bin())
        .args(["run", "--", "true"])
        .env("FORK_RUN_ROOT", &d)
        .env("HOME", &d)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(69),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("isolation layer") && err.contains("Fix:"),
        "{err}"
    );
    assert!(err.contains("cgroup"), "{err}");
    // The fix a user gets is one the user can take (delegation, cgroup v2, the policy).
    assert!(!err.contains("as root"), "{err}");
}

#[test]
fn check_reports_every_layer() {
    let out = Command::new(fork_bin())
        .args(["check", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let layers = v["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 11);
    if is_root() {
        assert_eq!(out.status.code(), Some(0), "{v}");
        assert!(layers.iter().all(|l| l["available"] == true), "{v}");
    }
}

/// A `fork` whose `fork-init` is missing, or is not of the same build, refuses to launch
/// with exit 69 naming the file and the fix; a foreign init is never run, and nothing is
/// left behind.
#[test]
fn a_missing_or_stale_init_is_refused_with_69() {
    need_root!();
    let head = std::fs::read(fork_bin()).unwrap_or_default();
    if !head.starts_with(b"\x7fELF") {
        // The VM harness's guest stands a shell shim over the binary (to start each fork
        // in a cgroup of its own): a copy of the shim is not a fork without its init.
        eprintln!(
            "fork-test-skip: {} is a wrapper, not the fork binary",
            fork_bin().display()
        );
        return;
    }
    let d = scratch("init-exe");
    let bin = d.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let fork = bin.join("fork");
    if std::fs::hard_link(fork_bin(), &fork).is_err() {
        std::fs::copy(fork_bin(), &fork).unwrap();
    }
    let run_root = d.join("runs");
    std::fs::create_dir_all(&run_root).unwrap();
    let launch = || {
        Command::new(&fork)
            .args(["run", "--", "/bin/true"])
            .env("FORK_RUN_ROOT", &run_root)
            .output()
            .unwrap()
    };
    let check = |out: &std::process::Output, why: &str| {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{err}");
        assert!(
            err.contains(&bin.join("fork-init").display().to_string()),
            "{err}"
        );
        assert!(err.contains(why), "{err}");
        assert!(
            err.contains("Fix:") && err.contains("cargo install"),
            "{err}"
        );
        let left: Vec<_> = std::fs::read_dir(&run_root).unwrap().flatten().collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    };
    // Missing.
    check(&launch(), "is missing");
    // Stale: an executable that is not this build's init (it would leave a mark if run).
    let mark = d.join("ran");
    let init = bin.join("fork-init");
    std::fs::write(
        &init,
        format!("#!/bin/sh\ntouch {}\nexit 0\n", mark.display()),
    )
    .unwrap();
    std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    check(&launch(), "not from this build");
    assert!(!mark.exists(), "the stale init was run");
    // The real one of this build, beside it: the launch works.
    std::fs::remove_file(&init).unwrap();
    let real = fork_bin().parent().unwrap().join("fork-init");
    if std::fs::hard_link(&real, &init).is_err() {
        std::fs::copy(&real, &init).unwrap();
    }
    let out = launch();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn fork_trace_prints_the_launch_phases_in_order_and_nothing_without_it() {
    need_default_policy!();
    let run_root = scratch("trace");
    let launch = |trace: Option<&str>| {
        let mut c = fork_cmd(&run_root);
        c.env_remove("FORK_TRACE");
        if let Some(v) = trace {
            c.env("FORK_TRACE", v);
        }
        let report = run_root.join("report.json");
        let out = c
            .args([
                "run",
                "--report",
                report.to_str().unwrap(),
                "--",
                "/bin/true",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{err}");
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        (err, report)
    };
    let (err, report) = launch(Some("1"));
    // `fork: trace <phase> +<ms>`, one a line, times never going back.
    let marks = trace_marks(&err);
    // As root the v1 cgroups are taken after the clone, before the init's release (the init
    // joins them itself); otherwise before the clone.
    let cgroups_after_clone = is_root() && report["isolation"]["cgroup"] == "v1";
    let (first, second) = if cgroups_after_clone {
        ("sandbox: clone returned", "sandbox: cgroup ready")
    } else {
        ("sandbox: cgroup ready", "sandbox: clone returned")
    };
    let want = [
        "start",
        "run: policy loaded",
        "sandbox: prepare",
        "sandbox: init checked",
        "sandbox: run dir created",
        "sandbox: disk mounted",
        first,
        second,
        "sandbox: init released",
        "init: landlock status received",
        "init: exit status received",
        "sandbox: init reaped",
        "teardown: cgroup removed",
        "teardown: run dir removed",
        "exit",
    ];
    assert_phases_in_order(&marks, &want, &err);
    for pair in marks.windows(2) {
        assert!(pair[0].1 <= pair[1].1, "time went back: {pair:?}\n{err}");
    }
    assert_eq!(marks.last().map(|m| m.0.as_str()), Some("exit"), "{err}");
    // Off (unset, or "0"): not one trace line.
    for off in [None, Some("0")] {
        let (err, _) = launch(off);
        assert!(!err.contains("fork: trace"), "{off:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&run_root);
}

#[test]
fn a_broken_seccomp_profile_is_exit_65_naming_it_and_leaves_nothing() {
    need_root!();
    // The profile is compiled on a second thread while the run directory, the disk and
    // the cgroups are made: its failure must remove all of them, and nothing may run.
    let d = scratch("badseccomp");
    std::fs::write(
        d.join("broken-profile.json"),
        r#"{"successor": {"mismatch_action": "allow", "match_action": {"errno": 1}, "filter": [{"syscall": "no_such_syscall_anywhere"}]}}"#,
    )
    .unwrap();
    let policy = d.join("p.toml");
    std::fs::write(&policy, "[seccomp]\nprofile = \"broken-profile.json\"\n").unwrap();
    let marker = d.join("ran");
    let out = fork_cmd(&d)
        .args([
            "run",
            "--policy",
            policy.to_str().unwrap(),
            "--",
            "/bin/sh",
            "-c",
        ])
        .arg(format!("touch {}", marker.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(65), "{err}");
    assert!(err.contains("broken-profile.json"), "{err}");
    assert!(!marker.exists(), "the command ran");
    let left: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("fork-"))
        .collect();
    assert!(left.is_empty(), "left in the run root: {left:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(d.to_str().unwrap()), "a mount is left");
}
