//! The hostile suite for `fork run`: each case runs the hostile probe (examples/hostile.rs)
//! through the real binary, in its own sandbox process, and shows it contained. Every
//! probe only touches what it or this test created, on loopback, bounded.
//!
//! These tests need root (the default policy mounts a capped tmpfs and creates cgroups),
//! as on the project's CI machine.

mod common;
#[path = "sandbox/uids.rs"]
mod uids;
use common::lifecycle::{need_default_policy, need_root};
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn assert_denied(args: &[&str], errno: i64) {
    let r = probe(&[], args);
    assert_eq!(r.code, 0, "probe {args:?} exit; stderr={}", r.stderr);
    let p = r.probe();
    assert_eq!(p["succeeded"], false, "{args:?} was NOT contained: {p}");
    assert_eq!(p["errno"].as_i64(), Some(errno), "{args:?}: {p}");
}

#[test]
fn seccomp_refuses_the_dangerous_syscalls() {
    need_default_policy!();
    for probe in [
        "ptrace",
        "process_vm_readv",
        "mount",
        "umount2",
        "pivot_root",
        "chroot",
        "unshare-user",
        "unshare-net",
        "setns",
        "clone-newuser",
        "bpf",
        "keyctl",
        "add_key",
        "request_key",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "reboot",
        "swapon",
        "swapoff",
        "mknod-char",
        "tiocsti",
        "tioclinux",
        "personality-noaslr",
        "open_by_handle_at",
    ] {
        assert_denied(&[probe], EPERM);
    }
    // clone3's flags cannot be inspected: it gets ENOSYS so libc falls back to clone.
    assert_denied(&["clone3"], ENOSYS);
}

#[test]
fn harmless_calls_still_work() {
    need_default_policy!();
    for probe in ["mknod-fifo", "personality-query"] {
        let p = probe_ok(probe);
        assert_eq!(
            p["succeeded"], true,
            "{probe} should work in the sandbox: {p}"
        );
    }
    let r = run(&[], &["python3", "-c", "import threading,subprocess; t=threading.Thread(target=print,args=('t',)); t.start(); t.join(); print(subprocess.run(['sh','-c','echo sub'],capture_output=True).stdout.decode().strip())"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("sub"), "{}", r.stdout);
}

fn probe_ok(name: &str) -> serde_json::Value {
    let r = probe(&[], &[name]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    r.probe()
}

#[test]
fn no_privileges_inside() {
    need_root!();
    let r = probe(&[], &["getuid"]);
    let p = r.probe();
    let st = &p["status"];
    for k in ["CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"] {
        assert_eq!(st[k], "0000000000000000", "{k} must be empty: {p}");
    }
    assert_eq!(st["NoNewPrivs"], "1");
    assert_eq!(st["Seccomp"], "2");
    // uid 0 inside maps to an unprivileged host uid, never host root.
    let host_uid = r.report["isolation"]["host_uid"].as_u64().unwrap();
    assert_ne!(host_uid, 0);
    let iso = &r.report["isolation"];
    for k in [
        "userns", "pidns", "netns", "mountns", "ipcns", "utsns", "cgroupns",
    ] {
        assert_eq!(iso[k], true, "{k}: {iso}");
    }
    // Everything the policy asks of Landlock needs ABI 6 (TCP rules 4, scoping 6); an older
    // kernel's ruleset is partially enforced, as documented ("Host shapes").
    let abi = iso["landlock_abi"].as_u64().unwrap();
    assert!(abi >= 1);
    let expected = if abi >= 6 {
        "fully_enforced"
    } else {
        "partially_enforced"
    };
    assert_eq!(iso["landlock_enforced"], expected, "{iso}");
    assert_eq!(iso["seccomp"], "default");
    assert!(iso["cgroup"] == "v1" || iso["cgroup"] == "v2");
}

#[test]
fn host_filesystem_is_read_only() {
    need_default_policy!();
    let d = scratch("rofs");
    let victim = d.join("victim.txt");
    std::fs::write(&victim, b"original").unwrap();
    let r = probe(&[], &["write-file", victim.to_str().unwrap()]);
    let p = r.probe();
    assert_eq!(p["succeeded"], false, "{p}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"original");
    // Creating a new file in a host directory fails too.
    let r = probe(&[], &["write-file", d.join("new.txt").to_str().unwrap()]);
    assert_eq!(r.probe()["succeeded"], false);
    assert!(!d.join("new.txt").exists());
    for host_path in [
        "/etc/fork-hostile-probe",
        "/usr/fork-hostile-probe",
        "/fork-hostile-probe",
    ] {
        let r = probe(&[], &["write-file", host_path]);
        assert_eq!(r.probe()["succeeded"], false, "{host_path}");
        assert!(!Path::new(host_path).exists());
    }
    // The workspace, /tmp and /dev/shm are writable.
    for ok in [
        "/tmp/successor/f",
        "/tmp/f",
        "/dev/shm/f",
        "/tmp/successor/home/f",
    ] {
        let r = probe(&[], &["write-file", ok]);
        assert_eq!(r.probe()["succeeded"], true, "{ok}: {}", r.stdout);
    }
}

#[test]
fn symlink_and_hardlink_tricks_stay_inside() {
    need_default_policy!();
    let d = scratch("links");
    let victim = d.join("victim.txt");
    std::fs::write(&victim, b"original").unwrap();
    let r = probe(
        &[],
        &["symlink-escape", "/tmp/successor", victim.to_str().unwrap()],
    );
    assert_eq!(r.probe()["succeeded"], false, "{}", r.stdout);
    let r = probe(
        &[],
        &["hardlink", "/tmp/successor", victim.to_str().unwrap()],
    );
    assert_eq!(r.probe()["succeeded"], false, "{}", r.stdout);
    assert_eq!(std::fs::read(&victim).unwrap(), b"original");
}

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
fn devices_are_minimal() {
    need_default_policy!();
    let p = probe_ok("devices");
    let text = p.to_string();
    for want in [
        "null", "zero", "full", "random", "urandom", "tty", "pts", "shm", "ptmx",
    ] {
        assert!(text.contains(want), "/dev lacks {want}: {text}");
    }
    for bad in ["sda", "vda", "nvme", "loop", "mem\"", "kmsg", "mapper"] {
        assert!(!text.contains(bad), "/dev exposes {bad}: {text}");
    }
    // No device can be created, and /dev itself is read-only.
    assert_denied(&["mknod-char", "/tmp/successor"], EPERM);
    let r = probe(&[], &["write-file", "/dev/fork-hostile"]);
    assert_eq!(r.probe()["succeeded"], false);
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

#[test]
fn network_is_loopback_only() {
    need_default_policy!();
    let p = probe_ok("ifaces");
    let text = p.to_string();
    assert!(text.contains("lo"), "{text}");
    assert!(!text.contains("eth") && !text.contains("ens"), "{text}");
    // A host loopback service is unreachable.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let r = probe(&[], &["connect-tcp", &addr]);
    assert_eq!(r.probe()["succeeded"], false, "{}", r.stdout);
    assert!(
        listener.accept().is_err(),
        "the host listener got a connection"
    );
    // UDP to the host's loopback does not arrive either.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let uaddr = udp.local_addr().unwrap().to_string();
    let _ = probe(&[], &["udp-send", &uaddr]);
    let mut buf = [0u8; 64];
    assert!(
        udp.recv(&mut buf).is_err(),
        "a datagram crossed the namespace"
    );
}

#[test]
fn landlock_restricts_tcp_by_policy() {
    need_default_policy!();
    // The default policy refuses TCP bind/connect (Landlock ABI >= 4) inside the sandbox too.
    let r = probe(&[], &["bind-tcp", "0"]);
    let p = r.probe();
    let iso = &r.report["isolation"];
    if iso["landlock_abi"].as_u64().unwrap() < 4 {
        // Kernels 5.13-6.6 have no TCP rules: the ruleset says so, and the network
        // namespace (loopback only) is what still isolates.
        assert_eq!(iso["landlock_enforced"], "partially_enforced", "{iso}");
        assert_eq!(iso["netns"], true, "{iso}");
        return;
    }
    assert_eq!(p["succeeded"], false, "{p}");
    assert_eq!(p["errno"].as_i64(), Some(EACCES), "{p}");
}

#[test]
fn wall_budget_kills_promptly() {
    need_default_policy!();
    let t = Instant::now();
    let r = run(&["--wall", "2s"], &["sleep", "30"]);
    let took = t.elapsed();
    assert_eq!(r.budget().as_deref(), Some("wall"), "{}", r.report);
    assert_eq!(r.code, 137);
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(took >= Duration::from_secs(2));
}

#[test]
fn memory_budget_ooms_a_big_allocation() {
    need_default_policy!();
    let r = probe(&["--memory", "128MiB"], &["alloc", "1024"]);
    assert_eq!(
        r.budget().as_deref(),
        Some("memory"),
        "{} {}",
        r.report,
        r.stdout
    );
    let peak = r.report["usage"]["memory_peak_bytes"].as_u64().unwrap();
    assert!(peak <= 129 << 20, "peak {peak}");
}

#[test]
fn pids_budget_stops_a_bounded_fork_loop() {
    need_default_policy!();
    let r = probe(&["--pids", "64"], &["fork-many", "200", "5"]);
    assert_eq!(r.budget().as_deref(), Some("pids"), "{}", r.report);
    let peak = r.report["usage"]["pids_peak"].as_u64().unwrap();
    assert!(peak <= 64, "peak {peak}");
    assert!(
        peak >= 32,
        "the loop should get near the limit, peak {peak}"
    );
}

#[test]
fn disk_budget_stops_a_big_write() {
    need_default_policy!();
    let r = probe(
        &["--disk", "64MiB"],
        &["write-bytes", "/tmp/successor/big", "400"],
    );
    assert_eq!(
        r.budget().as_deref(),
        Some("disk"),
        "{} {}",
        r.report,
        r.stdout
    );
    let used = r.report["usage"]["disk_bytes"].as_u64().unwrap();
    assert!(used <= 64 << 20, "used {used}");
    // /tmp shares the same cap.
    let r = probe(&["--disk", "64MiB"], &["write-bytes", "/tmp/big", "400"]);
    assert_eq!(r.budget().as_deref(), Some("disk"), "{}", r.report);
}

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
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_starting(&needle).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the sandbox outlived its supervisor"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
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
    let out = fork_cmd(&run_root).args(["gc", "--json"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        rep["runs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == id.as_str()),
        "{rep}"
    );
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
fn workspace_round_trip() {
    need_default_policy!();
    let ws = scratch("ws");
    std::fs::write(ws.join("input.txt"), b"in").unwrap();
    let r = run(
        &["--workspace", ws.to_str().unwrap()],
        &[
            "sh",
            "-c",
            "cat input.txt > output.txt; echo -n out >> output.txt",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(std::fs::read(ws.join("output.txt")).unwrap(), b"inout");
}

#[test]
fn strict_policy_shows_only_system_directories() {
    need_default_policy!();
    let strict = repo().join("policies/strict.toml");
    let r = run(&["--policy", strict.to_str().unwrap()], &["ls", "/"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let entries: Vec<&str> = r.stdout.split_whitespace().collect();
    for absent in ["root", "home", "work", "var", "opt", "srv"] {
        assert!(
            !entries.contains(&absent),
            "strict root shows /{absent}: {entries:?}"
        );
    }
    for present in ["usr", "tmp", "proc", "dev", "etc"] {
        assert!(
            entries.contains(&present),
            "strict root lacks /{present}: {entries:?}"
        );
    }
    assert_eq!(r.report["isolation"]["root"], "minimal");
}

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

#[test]
fn a_workspace_replaced_by_a_symlink_is_not_copied_back() {
    need_default_policy!();
    let ws = scratch("ws-link");
    let host = scratch("host-secret");
    std::fs::write(host.join("host-only.txt"), b"host").unwrap();
    let r = run(
        &["--workspace", ws.to_str().unwrap()],
        &[
            "sh",
            "-c",
            &format!(
                "cd / && mv /tmp/successor /tmp/old && ln -s {} /tmp/successor",
                host.display()
            ),
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("not copying it back"), "{}", r.stderr);
    assert!(
        !ws.join("host-only.txt").exists(),
        "a host file was copied through the link"
    );
}

/// A policy file: the default one with a `[network]` table replaced.
fn policy_with_network(dir: &std::path::Path, network: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(repo().join("policies/default.toml")).unwrap();
    let start = text.find("[network]").unwrap();
    let end = start + text[start..].find("[seccomp]").unwrap();
    let text = format!(
        "{}[network]\n{network}\n\n{}",
        &text[..start],
        &text[end..].replace(
            "profile = \"seccomp/default.json\"",
            &format!(
                "profile = \"{}\"",
                repo().join("policies/seccomp/default.json").display()
            )
        )
    );
    let p = dir.join("policy.toml");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_forward_makes_one_host_service_reachable_and_nothing_else() {
    need_default_policy!();
    use std::io::{Read, Write};
    // Two host loopback services the test owns; only the first is forwarded.
    let wanted = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    other.set_nonblocking(true).unwrap();
    let wanted_addr = wanted.local_addr().unwrap().to_string();
    let wanted_port = wanted.local_addr().unwrap().port();
    let other_port = other.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        // Bounded: answer at most one connection, then stop. The answer comes in two writes,
        // which the forward may pass on in two segments: the client reads until it has all
        // 10 bytes (a single recv got only `pong:` in the Debian guest).
        let (mut s, _) = wanted.accept().unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        s.write_all(b"pong:").unwrap();
        s.write_all(&buf).unwrap();
    });
    let d = scratch("forward");
    let policy = policy_with_network(
        &d,
        &format!("tcp_bind = []\ntcp_connect = []\nforward = [\"{wanted_addr}\"]"),
    );
    let script = format!(
        "import socket\n\
         s = socket.create_connection(('127.0.0.1', {}), timeout=5)\n\
         s.sendall(b'hello'); data = b''\n\
         while len(data) < 10:\n    chunk = s.recv(64)\n    if not chunk: break\n    data += chunk\n\
         print(data.decode())\n\
         try:\n    socket.create_connection(('127.0.0.1', {}), timeout=2); print('OTHER REACHED')\n\
         except OSError as e:\n    print('other refused', e.errno)\n",
        wanted_port, other_port
    );
    let r = run(
        &["--policy", policy.to_str().unwrap()],
        &["python3", "-c", &script],
    );
    server.join().unwrap();
    assert_eq!(r.code, 0, "{} {}", r.stdout, r.stderr);
    assert!(r.stdout.contains("pong:hello"), "{}", r.stdout);
    assert!(r.stdout.contains("other refused"), "{}", r.stdout);
    assert!(
        other.accept().is_err(),
        "the unforwarded service got a connection"
    );

    // Without the forward the same service is unreachable.
    let again = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    again.set_nonblocking(true).unwrap();
    let port = again.local_addr().unwrap().port();
    let r = run(
        &[],
        &["python3", "-c", &format!("import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('REACHED')\nexcept OSError as e:\n    print('refused', e.errno)\n")],
    );
    assert!(r.stdout.contains("refused"), "{}", r.stdout);
    assert!(again.accept().is_err());
}

#[test]
fn a_forward_to_another_host_is_refused_at_load_time() {
    let d = scratch("forward-bad");
    for bad in ["10.0.0.1:5432", "192.168.0.10:80", "example.com:443"] {
        let policy = policy_with_network(&d, &format!("forward = [\"{bad}\"]"));
        let out = fork_cmd(&d)
            .args(["run", "--policy", policy.to_str().unwrap(), "--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(65), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("network.forward") && err.contains(bad),
            "{err}"
        );
    }
}

#[test]
fn without_the_disk_layer_the_workspace_is_still_there() {
    need_default_policy!();
    // A policy that turns the capped disk off: /tmp is then a tmpfs inside the sandbox and
    // the workspace is bound into it from the run directory; the report says so.
    let d = scratch("nodisk");
    let p = d.join("nodisk.toml");
    std::fs::write(&p, "[layers]\ndisk = \"off\"\n").unwrap();
    let r = run(
        &["--policy", p.to_str().unwrap()],
        &[
            "sh",
            "-c",
            "pwd && echo data > /tmp/successor/f && cat /tmp/successor/f",
        ],
    );
    assert_eq!(r.code, 0, "{} {}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("/tmp/successor") && r.stdout.contains("data"),
        "{}",
        r.stdout
    );
    assert!(r.report["isolation"]["disk"].is_null(), "{}", r.report);
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

// Declared after the helpers and their macros, which a module sees only above it.
#[path = "sandbox/cgroup_join.rs"]
mod cgroup_join;
#[path = "sandbox/run_root.rs"]
mod run_root;
