//! The run's processes: the exit status is the command's, the init reaps orphans and
//! forwards signals, and a supervisor that is SIGKILLed (its run reclaimed by `fork gc`) or
//! gets SIGTERM leaves nothing behind.

use super::*;

#[test]
fn exit_status_is_the_commands() {
    need_default_policy!();
    assert_eq!(run(&[], &["sh", "-c", "exit 7"]).code, 7);
    let r = run(&[], &["sh", "-c", "kill -TERM $$"]);
    assert_eq!(r.code, 143);
    assert_eq!(r.report["signal"], 15);
    let r = run(&[], &["definitely-not-a-command-fork"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("not found"), "{}", r.stderr);
}

#[test]
fn init_reaps_orphans_and_nothing_remains() {
    need_default_policy!();
    let r = probe(&[], &["orphans", "20", "60"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    // `run` asserted that no process, mount, cgroup or directory of the run remains;
    // the orphans (sleeping 60 s) were killed with the namespace.
    let id = r.report["run_id"].as_str().unwrap();
    assert!(processes_matching(&format!("fork-{id}")).is_empty());
}

#[test]
fn supervisor_death_kills_the_tree_and_gc_reclaims() {
    need_default_policy!();
    let run_root = scratch("runs");
    let marker = format!("{}", 2_000 + (std::process::id() % 1000));
    let h = hostile_bin();
    let mut sup = fork_cmd(&run_root)
        .args(["run", "--", h.to_str().unwrap(), "sleep", &marker])
        .spawn()
        .unwrap();
    // Wait until the probe runs in the sandbox.
    let deadline = Instant::now() + Duration::from_secs(10);
    // The probe itself (not the supervisor, whose argv also names it).
    let needle = format!("{} sleep {marker}", h.display());
    while processes_starting(&needle).is_empty() {
        assert!(Instant::now() < deadline, "the probe never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    sup.kill().unwrap(); // SIGKILL: no cleanup code runs in the supervisor.
    sup.wait().unwrap();
    wait_sandbox_gone(&needle, Duration::from_secs(5));
    // The run directory (and its mounts, cgroup) are left; gc reclaims them.
    let leftovers: Vec<_> = std::fs::read_dir(&run_root)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("fork-"))
        .collect();
    assert_eq!(leftovers.len(), 1);
    let id = leftovers[0].file_name().to_string_lossy()["fork-".len()..].to_string();
    // The run directory recorded where its cgroups are (on cgroup v2 they sit beside the
    // dead supervisor's own cgroup, where a `fork gc` started elsewhere cannot derive them).
    let recorded = std::fs::read_to_string(leftovers[0].path().join("cgroups")).unwrap();
    let mut recorded: Vec<PathBuf> = recorded.lines().map(PathBuf::from).collect();
    let mut found = cgroup_dirs(&id);
    recorded.sort();
    found.sort();
    assert!(
        !found.is_empty(),
        "the killed run's cgroups are there before gc"
    );
    assert_eq!(
        recorded, found,
        "the run directory lists exactly its cgroups"
    );
    let rep = gc_report(fork_cmd(&run_root));
    assert!(gc_reclaimed(&rep, &id), "{rep}");
    for p in &recorded {
        assert!(
            rep["cgroups_removed"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r.as_str() == p.to_str()),
            "gc names {p:?} it removed: {rep}"
        );
    }
    assert_nothing_left(&run_root, &id);
}

#[test]
fn sigterm_to_the_supervisor_ends_the_run_cleanly() {
    need_default_policy!();
    let run_root = scratch("runs");
    let report = run_root.join("r.json");
    let marker = format!("{}", 60_000 + (std::process::id() % 1000));
    let sup = fork_cmd(&run_root)
        .args([
            "run",
            "--report",
            report.to_str().unwrap(),
            "--",
            "sleep",
            &marker,
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The run is under way: its command runs in the sandbox (a signal during start-up is
    // tests/interrupt.rs's). A fixed delay was not enough under software emulation.
    let deadline = Instant::now() + Duration::from_secs(30);
    while processes_starting(&format!("sleep {marker}")).is_empty() {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The run's id, from its directory in this test's own run root.
    let ids: Vec<String> = std::fs::read_dir(&run_root)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let id = name.strip_prefix("fork-")?;
            (id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
        })
        .collect();
    assert_eq!(ids.len(), 1, "one run directory: {ids:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sup.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let t = Instant::now();
    let out = sup.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(t.elapsed() < Duration::from_secs(3), "{err}");
    assert_eq!(out.status.code(), Some(137), "{err}");
    match std::fs::read(&report) {
        // The run ended by itself within the grace (300 ms): its report says why.
        Ok(bytes) => {
            let rep: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(rep["interrupted"], true);
            assert_eq!(rep["run_id"], ids[0].as_str());
        }
        // It did not (a slow host: under software emulation, as a user): the interrupt
        // watcher tore it down, and no report is written (README "Exit codes").
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(err.contains("interrupted: 1 run(s) torn down"), "{err}");
        }
        Err(e) => panic!("{}: {e}", report.display()),
    }
    assert_nothing_left(&run_root, &ids[0]);
    assert!(processes_starting(&format!("sleep {marker}")).is_empty());
}

#[test]
fn init_forwards_signals_to_the_command() {
    need_default_policy!();
    let run_root = scratch("runs");
    let report = run_root.join("r.json");
    // The command exits 3 when SIGUSR1 reaches it (and only then: it would sleep 20 s).
    let mut sup = fork_cmd(&run_root)
        .args(["run", "--report", report.to_str().unwrap(), "--"])
        .args([
            "sh",
            "-c",
            "trap 'exit 3' USR1; echo ready > /tmp/successor/ready; i=0; while [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done",
        ])
        .spawn()
        .unwrap();
    let sup_pid = sup.id() as i32;
    let ppid = |p: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        stat.rsplit(')')
            .next()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    // The sandbox init is the supervisor's child; the command is up (its trap set) once
    // one of its `sleep`s runs: a child of the command, itself the init's child. Read from
    // the process tree, which every uid sees: a user's sandbox may run as a subordinate
    // uid whose 0700 disk the user cannot look into.
    let deadline = Instant::now() + Duration::from_secs(60);
    let init = loop {
        let init = processes_matching("__sandbox-init")
            .into_iter()
            .find(|&p| ppid(p) == Some(sup_pid));
        if let Some(init) = init {
            let up = processes_starting("sleep")
                .into_iter()
                .any(|s| ppid(s).and_then(ppid) == Some(init));
            if up {
                break init;
            }
        }
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    if nix::unistd::geteuid().is_root() {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(init),
            nix::sys::signal::Signal::SIGUSR1,
        )
        .unwrap();
    } else {
        // A user's sandbox may run as a subordinate uid the user cannot signal from the
        // host's namespace (as it should be): signal it from fork's own user namespace,
        // which is the user's, as fork itself does.
        let st = std::process::Command::new("nsenter")
            .args(["--user", "--preserve-credentials", "--target"])
            .arg(sup_pid.to_string())
            .args(["--", "kill", "-USR1"])
            .arg(init.to_string())
            .status()
            .unwrap();
        assert!(st.success(), "nsenter ... kill -USR1 {init}: {st}");
    }
    let st = sup.wait().unwrap();
    assert_eq!(
        st.code(),
        Some(3),
        "the trap did not run: the signal was not forwarded"
    );
    let rep: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(rep["exit_code"], 3);
    assert_nothing_left(&run_root, rep["run_id"].as_str().unwrap());
}
