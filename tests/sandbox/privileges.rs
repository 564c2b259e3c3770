//! No privilege inside: seccomp refuses the dangerous syscalls (harmless calls still work),
//! and the command has no capability, no new privileges and namespaces of its own.

use super::*;

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

/// A pipe holding a page of a file pins that page (with large folios up to 2 MiB for one
/// byte) where reclaim cannot drop it and the memory cgroup never charges it: splice, tee,
/// vmsplice and sendfile get ENOSYS, and programs copy with read and write instead (or
/// copy_file_range, which stays allowed).
#[test]
fn page_pinning_pipe_calls_get_enosys_and_copies_still_work() {
    need_default_policy!();
    for probe in ["splice", "tee", "vmsplice", "sendfile"] {
        assert_denied(&[probe], ENOSYS);
    }
    // shutil.copyfile tries sendfile first, socket.sendfile too; cp uses copy_file_range.
    let script = r#"
import os, shutil, socket, subprocess, threading
d = os.environ["TMPDIR"]
a, b, c = (os.path.join(d, n) for n in "abc")
data = os.urandom(3 << 20)
with open(a, "wb") as f:
    f.write(data)
shutil.copyfile(a, b)
subprocess.run(["cp", a, c], check=True)
l, r = socket.socketpair()
got = []
t = threading.Thread(target=lambda: got.append(b"".join(iter(lambda: r.recv(1 << 16), b""))))
t.start()
with open(a, "rb") as f:
    l.sendfile(f)
l.close(); t.join()
for p in (b, c):
    with open(p, "rb") as f:
        assert f.read() == data, p
assert got == [data]
print("copied")
"#;
    let r = run(&[], &["python3", "-c", script]);
    assert_eq!(r.code, 0, "{} {}", r.stdout, r.stderr);
    assert_eq!(r.stdout.trim(), "copied", "{}", r.stderr);
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
    // The sandbox's user namespace is owned by that uid (its 0 here), not by host root
    // (unmapped here: 65534), so what it holds of the kernel's per-user counts is never
    // charged to root's.
    assert_eq!(p["userns_owner"], 0, "the user namespace's owner: {p}");
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
