//! The filesystem: the host's is read-only (link tricks included), `/dev` is minimal, the
//! strict policy shows only system directories, and the workspace is copied in and back
//! (never through a symlink), with or without the capped disk.

use super::*;

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
