//! Where run directories live when `FORK_RUN_ROOT` is not set. As root on a host whose
//! temp dir is on a disk filesystem and whose `/dev/shm` is a tmpfs shared like `/tmp`
//! (root's, `1777`), a sandbox's run directory is made in `/dev/shm` (it holds a lock, two
//! small records and two mount points, made and removed at every launch), while an
//! evaluation's staging area (as large as the parent's state) stays in the temp dir.
//! `fork gc` looks in both. Every other test sets `FORK_RUN_ROOT`; these leave it unset
//! and point the temp dir (`TMPDIR`) at a scratch directory of their own.

use crate::common::lifecycle::{demo, patch};
use crate::common::*;
use crate::need_default_policy;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SHM: &str = "/dev/shm";

/// The tests here watch `/dev/shm` as a whole: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn is_tmpfs(p: &Path) -> bool {
    nix::sys::statfs::statfs(p).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

/// A private temp dir on a disk filesystem, when this host is one where the sandboxes'
/// run directories go to `/dev/shm` (else why the test is skipped).
fn disk_tmpdir(name: &str) -> Result<PathBuf, String> {
    if !is_root() {
        return Err("run directories move to /dev/shm for root only".into());
    }
    let shm = std::fs::symlink_metadata(SHM).map_err(|e| format!("{SHM}: {e}"))?;
    if !is_tmpfs(Path::new(SHM)) || shm.uid() != 0 || shm.mode() & 0o7777 != 0o1777 {
        return Err(format!("{SHM} is not root's 1777 tmpfs here"));
    }
    let dir = scratch(name);
    if is_tmpfs(&dir) {
        return Err(format!("the scratch dir {} is a tmpfs", dir.display()));
    }
    Ok(dir)
}

macro_rules! need_disk_tmpdir {
    ($name:expr) => {
        match disk_tmpdir($name) {
            Ok(d) => d,
            Err(why) => {
                eprintln!("skipped: {why}");
                return;
            }
        }
    };
}

/// `fork` with the default run roots: no `FORK_RUN_ROOT`, the temp dir `tmpdir`.
fn default_roots_cmd(tmpdir: &Path) -> Command {
    let mut c = Command::new(fork_bin());
    c.env_remove("FORK_RUN_ROOT")
        .env("TMPDIR", tmpdir)
        .env("XDG_CONFIG_HOME", tmpdir.join("xdg"))
        .env("XDG_DATA_HOME", tmpdir.join("data"))
        .env_remove("GITHUB_STEP_SUMMARY")
        .stdin(Stdio::null());
    c
}

/// The run directories in `dir` whose `meta.json` names `supervisor` (none when that
/// supervisor has written none yet).
fn runs_of(dir: &Path, supervisor: u32) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    std::fs::read(p.join("meta.json"))
                        .ok()
                        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                        .is_some_and(|m| m["supervisor_pid"] == supervisor)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn fork_entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("fork-"))
                .collect()
        })
        .unwrap_or_default()
}

/// A sandbox's run directory is made in `/dev/shm` (none in the temp dir), is removed
/// when the run ends, and one a SIGKILLed supervisor left there is found and reclaimed by
/// `fork gc` (its init, mounts and cgroups with it).
#[test]
fn as_root_a_sandbox_runs_from_dev_shm_and_gc_reclaims_it_there() {
    need_default_policy!();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmpdir = need_disk_tmpdir!("tmpdir-shm");
    let h = hostile_bin();
    let marker = format!("{}", 1_000 + (std::process::id() % 1000));
    let mut sup = default_roots_cmd(&tmpdir)
        .args(["run", "--", h.to_str().unwrap(), "sleep", &marker])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let needle = format!("{} sleep {marker}", h.display());
    let deadline = Instant::now() + Duration::from_secs(10);
    while processes_starting(&needle).is_empty() || runs_of(Path::new(SHM), sup.id()).is_empty() {
        if let Some(st) = sup.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut sup.stderr.take().unwrap(), &mut err).unwrap();
            panic!("the supervisor ended first ({st}): {err}");
        }
        assert!(
            Instant::now() < deadline,
            "the probe never started ({:?}) or no run directory in {SHM} names supervisor {} \
             ({:?})",
            processes_starting(&needle),
            sup.id(),
            fork_entries(Path::new(SHM))
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let ours = runs_of(Path::new(SHM), sup.id());
    assert_eq!(ours.len(), 1, "{ours:?}");
    let dir = ours[0].clone();
    let id = dir.file_name().unwrap().to_string_lossy()["fork-".len()..].to_string();
    assert!(
        fork_entries(&tmpdir).is_empty(),
        "{:?}",
        fork_entries(&tmpdir)
    );
    // Root's, 0711 at most: no other user lists or writes it.
    let md = std::fs::metadata(&dir).unwrap();
    assert_eq!(md.uid(), 0);
    assert_eq!(md.mode() & 0o077 & !0o011, 0, "mode {:o}", md.mode());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        mounts.contains(&format!("{}/disk", dir.display())),
        "the disk is mounted in the run directory"
    );

    // A stale directory of the same name in the other run root (the temp dir) does not
    // make the live run dead: gc reclaims neither it nor the live run's cgroups.
    let twin = tmpdir.join(format!("fork-{id}"));
    std::fs::create_dir(&twin).unwrap();
    std::fs::write(twin.join("lock"), b"").unwrap();
    let cgroups = cgroup_dirs(&id);
    assert!(!cgroups.is_empty(), "the live run has cgroups");
    let rep = gc_report(default_roots_cmd(&tmpdir));
    assert!(
        !gc_reclaimed(&rep, &id),
        "gc took a live run's id for dead: {rep}"
    );
    assert_eq!(cgroup_dirs(&id), cgroups, "{rep}");
    assert!(
        !processes_starting(&needle).is_empty(),
        "the live run was killed"
    );
    assert!(dir.exists() && twin.exists());
    std::fs::remove_dir_all(&twin).unwrap();

    sup.kill().unwrap(); // SIGKILL: no cleanup code runs.
    sup.wait().unwrap();
    wait_sandbox_gone(&needle, Duration::from_secs(5));
    assert!(dir.exists(), "a killed supervisor leaves its run directory");
    let rep = gc_report(default_roots_cmd(&tmpdir));
    assert!(gc_reclaimed(&rep, &id), "{rep}");
    assert_nothing_left(Path::new(SHM), &id);

    // A run that ends leaves nothing in either place.
    let report = tmpdir.join("report.json");
    let out = default_roots_cmd(&tmpdir)
        .args(["run", "--report"])
        .arg(&report)
        .args(["--", "/bin/true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_nothing_left(Path::new(SHM), r["run_id"].as_str().unwrap());
    assert!(fork_entries(&tmpdir).is_empty());
    let _ = std::fs::remove_dir_all(&tmpdir);
}

/// An evaluation as root with the default run roots: its staging area in the temp dir,
/// its sandboxes' run directories in `/dev/shm`, the verdict the same as ever, nothing
/// left in either.
#[test]
fn an_evaluation_stages_in_the_temp_dir_and_runs_its_sandboxes_from_dev_shm() {
    need_default_policy!();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmpdir = need_disk_tmpdir!("tmpdir-eval");
    let runtime = tmpdir.join("demo");
    let st = Command::new("cp")
        .arg("-a")
        .arg(demo())
        .arg(&runtime)
        .status()
        .unwrap();
    assert!(st.success());
    let out_dir = tmpdir.join("out");
    // Watch both places while the evaluation runs.
    let mut child = default_roots_cmd(&tmpdir)
        .arg("evaluate")
        .arg(patch("swap-compressor"))
        .arg("--runtime")
        .arg(&runtime)
        .args(["--task", "contract", "--json", "--out"])
        .arg(&out_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut staged = false;
    let mut ours = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the evaluation did not finish");
        staged |= fork_entries(&tmpdir)
            .iter()
            .any(|n| n.starts_with("fork-eval-"));
        // This evaluation's own sandboxes (their meta.json names its pid): other root
        // runs on this host may come and go in /dev/shm meanwhile.
        for d in runs_of(Path::new(SHM), child.id()) {
            ours.insert(d);
        }
        assert!(
            !fork_entries(&tmpdir)
                .iter()
                .any(|n| !n.starts_with("fork-eval-")),
            "a sandbox's run directory in the temp dir"
        );
        assert!(
            !fork_entries(Path::new(SHM))
                .iter()
                .any(|n| n.starts_with("fork-eval-")),
            "a staging area in /dev/shm"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["verdict"], "APPROVE", "{report}");
    assert!(staged, "no staging area was seen in the temp dir");
    assert!(
        !ours.is_empty(),
        "no sandbox run directory was seen in /dev/shm"
    );
    assert!(
        fork_entries(&tmpdir).is_empty(),
        "{:?}",
        fork_entries(&tmpdir)
    );
    for d in &ours {
        assert!(!d.exists(), "{} left behind", d.display());
    }
    let _ = std::fs::remove_dir_all(&tmpdir);
}
