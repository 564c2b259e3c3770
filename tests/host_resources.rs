//! Host-wide resources a successor could use up outside its budgets (AIO contexts, locked
//! memory, /dev/shm, open files): each is refused or bounded inside `fork run`. Every probe
//! is a short python3 program run in the sandbox; it only touches what it created, bounded
//! in count and size.

mod common;
use common::lifecycle::need_root;
use common::*;
use serde_json::Value;

/// Runs `python3 -c CODE ARGS...` in the sandbox and returns its last JSON line.
fn py(flags: &[&str], code: &str, args: &[&str]) -> (Run, Value) {
    let mut cmd = vec!["python3", "-c", code];
    cmd.extend_from_slice(args);
    let r = run(flags, &cmd);
    let v = r.probe();
    (r, v)
}

const ENOMEM: i64 = 12;
const EMFILE: i64 = 24;

/// io_setup(nr): the return code and errno.
const IO_SETUP: &str = r#"
import ctypes, json, sys
libc = ctypes.CDLL(None, use_errno=True)
ctx = ctypes.c_ulong(0)
rc = libc.syscall(206, int(sys.argv[1]), ctypes.byref(ctx))  # io_setup on x86_64
print(json.dumps({"rc": rc, "errno": ctypes.get_errno()}))
"#;

#[test]
fn aio_contexts_are_refused() {
    need_root!();
    // The host's fs.aio-max-nr is shared by every process on the host: a successor that
    // took it all would make io_setup fail (EAGAIN) for the host until its run ended.
    let (r, v) = py(&[], IO_SETUP, &["128"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(v["rc"], -1, "io_setup worked in the sandbox: {v}");
    assert_eq!(v["errno"].as_i64(), Some(EPERM), "{v}");
}

/// mlock of a fresh anonymous mapping of MIB MiB: the return code and errno.
const MLOCK: &str = r#"
import ctypes, json, mmap, sys
libc = ctypes.CDLL(None, use_errno=True)
n = int(sys.argv[1]) << 20
m = mmap.mmap(-1, n)
buf = ctypes.c_char.from_buffer(m)
rc = libc.mlock(ctypes.addressof(buf), ctypes.c_size_t(n))
out = {"rc": rc, "errno": ctypes.get_errno()}
if rc == 0:
    libc.munlock(ctypes.addressof(buf), ctypes.c_size_t(n))
del buf
m.close()
lim = [l for l in open("/proc/self/limits") if l.startswith("Max locked memory")]
out["limit"] = lim[0].split()[3:5] if lim else None
print(json.dumps(out))
"#;

#[test]
fn locked_memory_is_refused() {
    need_root!();
    // Pages already in the host's page cache are not charged to the sandbox's memory
    // cgroup when mlocked: RLIMIT_MEMLOCK is 0 (soft and hard), so nothing can be pinned.
    for mib in ["1", "16"] {
        let (r, v) = py(&["--memory", "256MiB"], MLOCK, &[mib]);
        assert_eq!(r.code, 0, "{}", r.stderr);
        assert_eq!(v["rc"], -1, "mlock of {mib} MiB worked: {v}");
        // EPERM: a zero limit without CAP_IPC_LOCK (ENOMEM would be a limit above zero).
        assert_eq!(v["errno"].as_i64(), Some(EPERM), "{v}");
        assert_ne!(v["errno"].as_i64(), Some(ENOMEM));
        assert_eq!(v["limit"], serde_json::json!(["0", "0"]), "{v}");
    }
}

/// Opens /dev/null up to N times in one process: how many opened and the errno that
/// stopped it.
const OPEN_MANY: &str = r#"
import json, os, sys
fds, err = [], None
for _ in range(int(sys.argv[1])):
    try:
        fds.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as e:
        err = e.errno
        break
print(json.dumps({"opened": len(fds), "errno": err}))
"#;

#[test]
fn open_files_are_bounded_per_process() {
    need_root!();
    let (r, v) = py(&[], OPEN_MANY, &["5000"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let opened = v["opened"].as_u64().unwrap();
    // RLIMIT_NOFILE 1024, minus stdin/stdout/stderr (and python's own few).
    assert!(
        (1000..1024).contains(&opened),
        "opened {opened} descriptors: {v}"
    );
    assert_eq!(v["errno"].as_i64(), Some(EMFILE), "{v}");
}

/// FORKS processes each holding N descriptors for a moment.
const HOLD_FILES: &str = r#"
import json, os, sys, time
n, forks = int(sys.argv[1]), int(sys.argv[2])
kids = []
for _ in range(forks):
    pid = os.fork()
    if pid == 0:
        fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(n)]
        time.sleep(0.5)
        os._exit(0)
    kids.append(pid)
for k in kids:
    os.waitpid(k, 0)
print(json.dumps({"held": n * forks}))
"#;

#[test]
fn open_files_are_charged_to_the_memory_budget() {
    need_root!();
    // Every open file is kernel memory, and the memory cgroup charges it (cgroup v1 on
    // this kernel counts kernel memory inside memory.limit_in_bytes): 40 processes holding
    // 1,000 descriptors each raise the peak by several MiB over the same 40 holding none.
    let peak = |n: &str| {
        let (r, v) = py(&[], HOLD_FILES, &[n, "40"]);
        assert_eq!(r.code, 0, "{}", r.stderr);
        assert!(v["held"].is_u64(), "{v}");
        r.report["usage"]["memory_peak_bytes"].as_u64().unwrap()
    };
    let (none, many) = (peak("0"), peak("1000"));
    assert!(
        many > none + (40_000 * 100),
        "40,000 open files were not charged: peak {none} without, {many} with"
    );
}

#[test]
fn dev_shm_counts_against_the_disk_budget() {
    need_root!();
    // 16 MiB into /dev/shm under an 8 MiB disk budget: the write stops at the budget
    // (ENOSPC), and the budget is named.
    let r = run(
        &["--disk", "8MiB"],
        &[
            "sh",
            "-c",
            "dd if=/dev/zero of=/dev/shm/fill bs=1M count=16 2>&1; echo dd=$?",
        ],
    );
    assert!(r.stdout.contains("No space left on device"), "{}", r.stdout);
    assert!(r.stdout.contains("dd=1"), "{}", r.stdout);
    assert_eq!(r.budget().as_deref(), Some("disk"), "{}", r.report);
    let used = r.report["usage"]["disk_bytes"].as_u64().unwrap();
    assert!(used <= 8 << 20, "used {used}");
    // /dev/shm and /tmp share the one cap: 6 MiB in each do not both fit in 8 MiB.
    let r = run(
        &["--disk", "8MiB"],
        &[
            "sh",
            "-c",
            "dd if=/dev/zero of=/tmp/a bs=1M count=6 2>/dev/null; \
             dd if=/dev/zero of=/dev/shm/b bs=1M count=6 2>&1; echo dd=$?",
        ],
    );
    assert!(r.stdout.contains("dd=1"), "{}", r.stdout);
    assert_eq!(r.budget().as_deref(), Some("disk"), "{}", r.report);
    // /dev/shm is still an ordinary writable directory for a well-behaved successor.
    let r = run(
        &["--disk", "8MiB"],
        &[
            "sh",
            "-c",
            "echo hi > /dev/shm/x && cat /dev/shm/x && rm /dev/shm/x",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout.trim(), "hi");
    assert_eq!(r.budget(), None);
}
