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

/// Plants `<root>/fork-<id>` as a dead supervisor leaves it: a directory and a lock file of
/// our own that nobody holds, and `meta` as its meta.json.
fn plant_stale_run(root: &Path, id: &str, meta: &serde_json::Value) {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let d = root.join(format!("fork-{id}"));
    std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
    std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(d.join("lock"))
        .unwrap();
    std::fs::write(d.join("meta.json"), meta.to_string()).unwrap();
}

#[test]
fn gc_never_kills_a_live_run_through_a_stale_runs_recorded_pid() {
    need_default_policy!();
    use std::os::unix::fs::MetadataExt;
    // A live run, whose command ends by itself after 4 s.
    let live_root = scratch("runs");
    let report = live_root.join("r.json");
    let sup = fork_cmd(&live_root)
        .args(["run", "--report", report.to_str().unwrap(), "--"])
        .args(["sleep", "4"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its init's pid, from its meta.json.
    let deadline = Instant::now() + Duration::from_secs(30);
    let init_pid = loop {
        let found = std::fs::read_dir(&live_root)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("fork-"))
            .find_map(|e| {
                let m = std::fs::read(e.path().join("meta.json")).ok()?;
                let m: serde_json::Value = serde_json::from_slice(&m).ok()?;
                m["init_pid"].as_i64()
            });
        if let Some(p) = found {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "the live run never recorded its init"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let pidns = std::fs::metadata(format!("/proc/{init_pid}/ns/pid"))
        .unwrap()
        .ino();
    // Two stale runs in another run root, each recording that pid as its own init's, as
    // when a dead supervisor's init pid is reused by another run's init: one written by an
    // older fork (the pid alone), one with the start time of a process that no longer
    // exists (and the live init's pid namespace).
    let stale_root = scratch("runs");
    let meta = |id: &str| {
        serde_json::json!({
            "run_id": id, "supervisor_pid": 1, "init_pid": init_pid,
            "created": "2026-01-01T00:00:00Z",
        })
    };
    let (old, new) = ("00000000000000a1", "00000000000000a2");
    plant_stale_run(&stale_root, old, &meta(old));
    let mut m = meta(new);
    m["init_start"] = serde_json::json!(1);
    m["init_pidns"] = serde_json::json!(pidns);
    plant_stale_run(&stale_root, new, &m);
    let rep = gc_report(fork_cmd(&stale_root));
    assert!(gc_reclaimed(&rep, old) && gc_reclaimed(&rep, new), "{rep}");
    assert_eq!(rep["processes_killed"], serde_json::json!([]), "{rep}");
    // The live run was left alone: it ends as its command does.
    let out = sup.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["budget_exceeded"], serde_json::Value::Null, "{r}");
    assert_nothing_left(&live_root, r["run_id"].as_str().unwrap());
    assert_nothing_left(&stale_root, old);
    assert_nothing_left(&stale_root, new);
}

#[test]
fn gc_kills_the_init_a_stale_run_recorded_and_only_it() {
    need_default_policy!();
    use std::os::unix::fs::MetadataExt;
    // A stand-in for a dead supervisor's init that outlived it: a shell this test starts,
    // with the init's role among its arguments (as gc requires of what it kills), waiting
    // on a pipe from this test (it ends by itself when the test does) and starting nothing.
    let mut init = Command::new("sh")
        .args(["-c", "read x", "__sandbox-init"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = init.id() as i32;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let start: u64 = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    let pidns = std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .unwrap()
        .ino();
    let root = scratch("runs");
    let meta = |id: &str, start: u64| {
        serde_json::json!({
            "run_id": id, "supervisor_pid": 1, "init_pid": pid, "init_start": start,
            "init_pidns": pidns, "created": "2026-01-01T00:00:00Z",
        })
    };
    // Another start time: another process than the one recorded. Not killed.
    let other = "00000000000000b1";
    plant_stale_run(&root, other, &meta(other, start + 1));
    let rep = gc_report(fork_cmd(&root));
    assert!(gc_reclaimed(&rep, other), "{rep}");
    assert_eq!(rep["processes_killed"], serde_json::json!([]), "{rep}");
    assert!(init.try_wait().unwrap().is_none(), "killed: {rep}");
    // Its own record: killed.
    let own = "00000000000000b2";
    plant_stale_run(&root, own, &meta(own, start));
    let rep = gc_report(fork_cmd(&root));
    assert!(gc_reclaimed(&rep, own), "{rep}");
    assert_eq!(rep["processes_killed"], serde_json::json!([pid]), "{rep}");
    let status = init.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "{status:?}");
    let _ = std::fs::remove_dir_all(&root);
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

/// A teardown that cannot remove the run's cgroups keeps its run directory's record of
/// them (`cgroups`, and the `lock` that tells `fork gc` its supervisor is gone), so that
/// a later `fork gc` removes them; a `fork gc` that cannot either keeps it again. Before,
/// the directory went whatever happened, and with it every way gc had to find them. The
/// failure is made by a tmpfs mounted on a child cgroup made in the run's cgroup (a mount
/// point cannot be removed: EBUSY), unmounted by the test afterwards.
#[test]
fn cgroups_that_cannot_be_removed_keep_their_record_for_gc() {
    need_root!();
    let run_root = scratch("runs");
    let sup = fork_cmd(&run_root)
        .args(["run", "--", "sleep", "1"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (id, cgroups) = loop {
        let id = std::fs::read_dir(&run_root)
            .unwrap()
            .flatten()
            .find_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_prefix("fork-").map(str::to_string)
            });
        if let Some(id) = id {
            let found = cgroup_dirs(&id);
            if !found.is_empty() {
                break (id, found);
            }
        }
        assert!(
            Instant::now() < deadline,
            "the run's cgroups never appeared"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let pin = cgroups[0].join("pinned");
    std::fs::create_dir(&pin).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4k", "fork-test-pin"])
        .arg(&pin)
        .status()
        .unwrap();
    assert!(mounted.success());
    let unpin = || {
        let _ = Command::new("umount").arg(&pin).status();
    };
    // When the test fails (the record gone, nothing would remove them): its own cgroups.
    let clean_up = || {
        unpin();
        for c in cgroup_dirs(&id) {
            let _ = std::fs::remove_dir(c.join("pinned"));
            let _ = std::fs::remove_dir(c);
        }
    };
    let out = sup.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let dir = run_root.join(format!("fork-{id}"));
    let kept: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    if !(dir.join("cgroups").is_file() && dir.join("lock").is_file()) {
        clean_up();
        panic!("the run directory's record is gone ({kept:?}): {stderr}");
    }
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("is kept") && stderr.contains("fork gc"),
        "{stderr}"
    );
    // Only the record is kept: the disk is unmounted and gone.
    assert!(!kept.iter().any(|k| k == "disk"), "{kept:?}");
    // A gc that cannot remove them either keeps the record again.
    let gc = fork_cmd(&run_root).args(["gc", "--json"]).output().unwrap();
    let rep: serde_json::Value = serde_json::from_slice(&gc.stdout).unwrap();
    if !dir.join("cgroups").is_file() {
        clean_up();
        panic!("gc deleted the record of cgroups it left: {rep}");
    }
    unpin();
    assert!(!gc_reclaimed(&rep, &id), "{rep}");
    // Once they can go, gc removes them and the directory.
    let rep = gc_report(fork_cmd(&run_root));
    assert!(gc_reclaimed(&rep, &id), "{rep}");
    assert!(
        rep["cgroups_removed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r.as_str() == cgroups[0].to_str()),
        "{rep}"
    );
    assert_nothing_left(&run_root, &id);
}
