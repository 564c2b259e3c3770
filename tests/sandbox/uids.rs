//! A user's sandboxes and their uids: with subordinate id ranges (/etc/subuid and
//! /etc/subgid) and the newuidmap/newgidmap helpers, each sandbox (the judge's and the
//! subject's too) runs as a uid of its own from the user's range, drawn per run; without
//! them, every sandbox runs as the user's uid, and the report and `fork check` say so.
//!
//! As root, each test creates a throwaway user (`forkuids-*`, uids 1551-1553, marked by its
//! comment) with or without ranges and runs fork as that user (setpriv); the user and its
//! ranges are removed when the test ends, failed or not. As a user (the VM harness's
//! unprivileged pass), a test runs fork as that user when its ranges fit the test, else it
//! says why it is skipped.

use crate::common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MARK: &str = "fork uids test";
/// useradd, usermod and userdel lock /etc/passwd: one at a time.
static ADMIN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The user fork runs as: a throwaway one (as root) or this process's own.
struct TestUser {
    name: String,
    uid: u32,
    gid: u32,
    /// Created by this test: removed (with its ranges) on drop.
    throwaway: bool,
}

fn sh(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `name`'s subordinate uid range from /etc/subuid (by name or uid), if any.
fn subuid_range(name: &str, uid: u32) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string("/etc/subuid").unwrap_or_default();
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.trim().split(':').collect();
        if f.len() != 3 || (f[0] != name && f[0] != uid.to_string()) {
            return None;
        }
        Some((f[1].parse().ok()?, f[2].parse().ok()?))
    })
}

/// The first start above every range given to anyone in either file (and above 200000).
fn free_range_start() -> u32 {
    let mut end: u64 = 200_000;
    for f in ["/etc/subuid", "/etc/subgid"] {
        for l in std::fs::read_to_string(f).unwrap_or_default().lines() {
            let v: Vec<u64> = l
                .split(':')
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            if let [s, c] = v[..] {
                end = end.max(s + c);
            }
        }
    }
    end.div_ceil(65536) as u32 * 65536
}

impl TestUser {
    /// As root: a fresh user `name` (uid `uid`) with a 65536-id range when `ranges`. As a
    /// user: this user, when whether it has a range matches `ranges`. None (the reason
    /// printed as a skip) otherwise.
    fn get(name: &str, uid: u32, ranges: bool) -> Option<TestUser> {
        if !is_root() {
            let me = nix::unistd::geteuid().as_raw();
            let my_name = nix::unistd::User::from_uid(me.into())
                .ok()
                .flatten()
                .map(|u| u.name)
                .unwrap_or_else(|| me.to_string());
            if subuid_range(&my_name, me).is_some() != ranges {
                eprintln!(
                    "fork-test-skip: needs root (to make a user) or a user {} subordinate ids",
                    if ranges { "with" } else { "without" }
                );
                return None;
            }
            return Some(TestUser {
                name: my_name,
                uid: me,
                gid: nix::unistd::getegid().as_raw(),
                throwaway: false,
            });
        }
        let _admin = ADMIN.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(Some(u)) = nix::unistd::User::from_name(name) {
            // A leftover of this test (killed before its cleanup) is removed; anyone else's
            // user is never touched.
            if u.gecos.to_string_lossy() != MARK {
                eprintln!("fork-test-skip: a user {name} that is not this test's exists");
                return None;
            }
            remove_user(name);
        }
        if nix::unistd::User::from_uid(uid.into())
            .ok()
            .flatten()
            .is_some()
        {
            eprintln!("fork-test-skip: uid {uid} is taken");
            return None;
        }
        let made = Command::new("useradd")
            .args(["-M", "-s", "/bin/sh", "-c", MARK, "-u", &uid.to_string()])
            .args(["-K", "SUB_UID_COUNT=0", "-K", "SUB_GID_COUNT=0", name])
            .stdout(Stdio::null())
            .output()
            .expect("useradd runs");
        if !made.status.success() {
            // A host whose account files cannot be written (the VM harness's guest has a
            // read-only mount over /etc/shadow); there the user's pass proves this with
            // its own ranged user. Said, and counted as skipped, never as passed.
            eprintln!(
                "fork-test-skip: cannot make a throwaway user here (useradd {name}: {})",
                String::from_utf8_lossy(&made.stderr).trim()
            );
            return None;
        }
        let user = TestUser {
            name: name.into(),
            uid,
            gid: nix::unistd::User::from_name(name)
                .unwrap()
                .expect("the new user")
                .gid
                .as_raw(),
            throwaway: true,
        };
        if ranges {
            let start = free_range_start();
            let r = format!("{start}-{}", start + 65535);
            let added =
                sh(Command::new("usermod").args(["--add-subuids", &r, "--add-subgids", &r, name]));
            assert!(added, "usermod --add-subuids {r} {name}");
        }
        assert_eq!(subuid_range(name, uid).is_some(), ranges);
        Some(user)
    }

    /// `fork ARGS` as this user, in `d`: its own run root, home and key.
    fn fork(&self, d: &Path, path_first: Option<&Path>) -> Command {
        let mut c = if self.throwaway {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={}", self.uid))
                .arg(format!("--regid={}", self.gid))
                .args(["--clear-groups", "--"])
                .arg(fork_bin());
            c.env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            );
            c
        } else {
            Command::new(fork_bin())
        };
        if let Some(p) = path_first {
            let path = std::env::var("PATH").unwrap_or_default();
            let rest = if self.throwaway {
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
            } else {
                &path
            };
            c.env("PATH", format!("{}:{rest}", p.display()));
        }
        c.env("FORK_RUN_ROOT", d.join("runs"))
            .env("HOME", d.join("home"))
            .env("XDG_CONFIG_HOME", d.join("home/xdg"))
            .env("XDG_DATA_HOME", d.join("home/data"))
            .env_remove("GITHUB_STEP_SUMMARY")
            .current_dir(d.join("home"))
            .stdin(Stdio::null());
        c
    }

    /// A scratch directory this user owns: runs/, home/ and the policy (budgets may be
    /// missing: a user's cgroups are the host's to delegate). Removed on drop.
    fn scratch(&self, what: &str) -> Scratch {
        use std::os::unix::fs::PermissionsExt;
        let d = scratch(what);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        for sub in ["runs", "home"] {
            std::fs::create_dir(d.join(sub)).unwrap();
            std::os::unix::fs::chown(d.join(sub), Some(self.uid), Some(self.gid)).unwrap();
        }
        std::fs::write(
            d.join("p.toml"),
            "[layers]\ncgroup = \"optional\"\ncgroupns = \"optional\"\n",
        )
        .unwrap();
        Scratch(d)
    }
}

/// A scratch directory removed when the test ends, failed or not.
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn remove_user(name: &str) {
    let uid = nix::unistd::User::from_name(name)
        .ok()
        .flatten()
        .map(|u| u.uid.as_raw());
    if let Some((start, count)) = uid.and_then(|u| subuid_range(name, u)) {
        let r = format!("{start}-{}", start + count - 1);
        sh(Command::new("usermod").args(["--del-subuids", &r, "--del-subgids", &r, name]));
    }
    sh(Command::new("userdel").arg(name));
}

impl Drop for TestUser {
    fn drop(&mut self) {
        if self.throwaway {
            let _admin = ADMIN.lock().unwrap_or_else(|e| e.into_inner());
            remove_user(&self.name);
            let left = ["/etc/subuid", "/etc/subgid", "/etc/passwd"]
                .iter()
                .any(|f| {
                    std::fs::read_to_string(f)
                        .unwrap_or_default()
                        .lines()
                        .any(|l| l.starts_with(&format!("{}:", self.name)))
                });
            if left && !std::thread::panicking() {
                panic!("user {} or its ranges were left behind", self.name);
            }
        }
    }
}

/// `fork run` of `sleep 3.<marker>` as `user`: the run's report, and the host uid of the
/// sandboxed `sleep` as the host's /proc shows it while it runs.
fn run_and_watch(user: &TestUser, d: &Path, marker: u32) -> (Value, u32) {
    let report = d.join(format!("home/r{marker}.json"));
    let sleep = format!("3.{marker}");
    let child = user
        .fork(d, None)
        .args(["run", "--policy", d.join("p.toml").to_str().unwrap()])
        .args(["--wall", "30s", "--report", report.to_str().unwrap()])
        .args(["--", "sleep", &sleep])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut seen = None;
    while seen.is_none() && started.elapsed() < Duration::from_secs(10) {
        seen = processes_starting(&format!("sleep {sleep} "))
            .into_iter()
            .find_map(|pid| {
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
                let line = status.lines().find(|l| l.starts_with("Uid:"))?;
                line.split_whitespace().nth(1)?.parse::<u32>().ok()
            });
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let uid = seen.unwrap_or_else(|| panic!("the sandboxed sleep was never seen: {err} {r}"));
    (r, uid)
}

fn check_output(user: &TestUser, d: &Path, path_first: Option<&Path>) -> String {
    let out = user
        .fork(d, path_first)
        .args(["check", "--policy", d.join("p.toml").to_str().unwrap()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn uids_line(check: &str) -> String {
    check
        .lines()
        .skip_while(|l| !l.starts_with("uids "))
        .take(2)
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_user_with_subordinate_ids_runs_each_sandbox_as_a_uid_of_its_own_from_the_range() {
    let Some(user) = TestUser::get("forkuids-ranged", 1551, true) else {
        return;
    };
    let (start, count) = subuid_range(&user.name, user.uid).unwrap();
    let range = u64::from(start)..u64::from(start) + u64::from(count);
    let d = user.scratch("uids-ranged");
    let check = uids_line(&check_output(&user, &d, None));
    assert!(
        check.contains(" ok ") && check.contains("subordinate"),
        "{check}"
    );
    let mut seen = Vec::new();
    for marker in [1551, 1552] {
        let (r, uid) = run_and_watch(&user, &d, marker);
        assert_eq!(r["isolation"]["uid_shared"], false, "{r}");
        assert_eq!(r["isolation"]["host_uid"], uid, "{r}");
        assert!(range.contains(&u64::from(uid)), "{uid} not in {range:?}");
        assert_ne!(uid, user.uid);
        assert_nothing_left(&d.join("runs"), r["run_id"].as_str().unwrap());
        seen.push(uid);
    }
    // Drawn per run from 65536 or more ids: equal by chance once in 65536 pairs or less.
    assert_ne!(seen[0], seen[1], "two runs drew the same uid");

    // The judged demo task: the judge's sandbox and the subject's have uids of their own.
    let out_dir = d.join("home/bundle");
    let out = user
        .fork(&d, None)
        .args(["evaluate"])
        .arg(repo().join("fixtures/patches/swap-compressor.diff"))
        .arg("--runtime")
        .arg(repo().join("fixtures/hermes-demo"))
        .args(["--task", "contract", "--no-ledger", "--json", "--policy"])
        .arg(d.join("p.toml"))
        .arg("--out")
        .arg(&out_dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(out.status.code(), Some(0), "{err} {v}");
    assert_eq!(v["isolation"]["uid_shared"], false, "{v}");
    let side = |f: &str| -> Value {
        serde_json::from_slice(&std::fs::read(out_dir.join("artifacts").join(f)).unwrap()).unwrap()
    };
    let (subject, judge) = (side("sandbox.json"), side("judge.json"));
    let subject_uid = subject["isolation"]["host_uid"].as_u64().unwrap();
    let judge_uid = judge["isolation"]["host_uid"].as_u64().unwrap();
    assert_eq!(judge["isolation"]["uid_shared"], false, "{judge}");
    assert_eq!(v["isolation"]["host_uid"], subject_uid, "{v}");
    assert_ne!(
        subject_uid, judge_uid,
        "the judge runs as the subject's uid"
    );
    assert!(range.contains(&subject_uid) && range.contains(&judge_uid));
    let left: Vec<_> = std::fs::read_dir(d.join("runs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left in the run root: {left:?}");
}

#[test]
fn a_user_without_subordinate_ids_shares_its_uid_and_fork_check_names_the_fix() {
    let Some(user) = TestUser::get("forkuids-plain", 1552, false) else {
        return;
    };
    let d = user.scratch("uids-plain");
    let check = uids_line(&check_output(&user, &d, None));
    assert!(check.contains(" shared "), "{check}");
    assert!(
        check.contains(&format!(
            "fix: add a range for {} to /etc/subuid",
            user.name
        )) && check.contains("usermod --add-subuids")
            && check.contains("install uidmap"),
        "{check}"
    );
    let (r, uid) = run_and_watch(&user, &d, 1553);
    assert_eq!(r["isolation"]["uid_shared"], true, "{r}");
    assert_eq!(uid, user.uid);
    assert_eq!(r["isolation"]["host_uid"], user.uid, "{r}");
}

#[test]
fn a_failing_newuidmap_leaves_the_uid_shared_and_says_so() {
    let Some(user) = TestUser::get("forkuids-broken", 1553, true) else {
        return;
    };
    let d = user.scratch("uids-broken");
    // A newuidmap that refuses, found first on PATH: fork falls back to the user's uid and
    // records it; `fork check` names the failure.
    let bin = d.join("bin");
    std::fs::create_dir(&bin).unwrap();
    let fake = bin.join("newuidmap");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'newuidmap: refused by the test' >&2\nexit 1\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let check = uids_line(&check_output(&user, &d, Some(&bin)));
    assert!(
        check.contains(" shared ") && check.contains("refused by the test"),
        "{check}"
    );
    let report = d.join("home/r.json");
    let out = user
        .fork(&d, Some(&bin))
        .args(["run", "--policy", d.join("p.toml").to_str().unwrap()])
        .args(["--report", report.to_str().unwrap(), "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["isolation"]["uid_shared"], true, "{r}");
    assert_eq!(r["isolation"]["host_uid"], user.uid, "{r}");
}

#[test]
fn what_a_killed_supervisor_left_as_subordinate_uids_is_removed_by_fork_gc() {
    let Some(user) = TestUser::get("forkuids-killed", 1554, true) else {
        return;
    };
    let d = user.scratch("uids-killed");
    let mut child = user
        .fork(&d, None)
        .args(["run", "--policy", d.join("p.toml").to_str().unwrap()])
        .args(["--wall", "60s", "--", "sleep", "30.1554"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while processes_starting("sleep 30.1554 ").is_empty() {
        assert!(started.elapsed() < Duration::from_secs(10), "never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The run directory holds the sandbox's mount point, owned by its subordinate uid (0700).
    child.kill().unwrap();
    child.wait().unwrap();
    let runs = d.join("runs");
    let left = || -> Vec<_> {
        std::fs::read_dir(&runs)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect()
    };
    assert_eq!(left().len(), 1, "{:?}", left());
    let out = user.fork(&d, None).arg("gc").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(left().is_empty(), "{:?} {err}", left());
    wait_sandbox_gone("sleep 30.1554 ", Duration::from_secs(5));
}
