//! Portability: what differs between hosts (locked mount flags, AppArmor's user namespace
//! restriction, layers that depend on each other) and `fork check`'s trial launch. Run on
//! this host by `cargo test`, and inside the Debian-kernel VM by `scripts/vm-test.sh full`.

mod common;
use common::lifecycle::need_root;
use common::*;
use std::path::Path;
use std::process::Command;

/// `fork` run as nobody (uid and gid 65534, no supplementary groups), which has no cgroup
/// delegated to it here nor in the VM harness.
fn fork_as_nobody() -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(fork_bin());
    c
}

#[test]
fn hiding_and_binding_keep_the_mount_flags_a_user_namespace_locks() {
    need_root!();
    // As on a distribution or container root: /dev (where the /dev/null hiding a file comes
    // from) mounted noexec,noatime, and the run directory on a noexec,strictatime filesystem.
    // In the sandbox's user namespace the kernel locks those flags: a remount that dropped
    // one failed with EPERM ("hide (read-only) /etc/shadow"). Everything happens in a
    // private mount namespace of this test's own.
    let d = scratch("locked");
    let runs = d.join("runs");
    std::fs::create_dir(&runs).unwrap();
    let nodisk = d.join("nodisk.toml");
    std::fs::write(&nodisk, "[layers]\ndisk = \"off\"\n").unwrap();
    for policy in [None, Some(&nodisk)] {
        let policy_flag = policy
            .map(|p| format!("--policy {}", p.display()))
            .unwrap_or_default();
        let script = format!(
            "set -e; mount -o remount,bind,nosuid,noexec,noatime /dev; \
             mount -t tmpfs -o nosuid,nodev,noexec,strictatime,size=1m fork-test {runs}; \
             chmod 755 {runs}; \
             FORK_RUN_ROOT={runs} {fork} run {policy_flag} -- sh -c 'stat -c %F /etc/shadow; echo ok > /tmp/successor/f; cat /tmp/successor/f'",
            runs = runs.display(),
            fork = fork_bin().display(),
        );
        let out = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{policy_flag}: {stdout} {stderr}"
        );
        // A hidden file is an empty file of mode 000 (made inside the sandbox), or, on
        // kernels that cannot clone a detached mount (Debian 12's 6.1), /dev/null bound
        // read-only (see mounts.rs).
        let stdout = stdout.trim();
        assert!(
            stdout == "regular empty file\nok" || stdout == "character special file\nok",
            "{policy_flag}: {stdout} {stderr}"
        );
    }
}

/// The AppArmor profile shipped for hosts that restrict unprivileged user namespaces parses.
/// Debian 12's apparmor_parser (3.0) predates the `userns` rule and `abi/4.0`: there the
/// test checks that those two are the only things it refuses (the rest of the profile parses
/// under abi/3.0), and that the restriction is named as the reason.
#[test]
fn the_apparmor_profile_parses() {
    let parser = ["/sbin/apparmor_parser", "/usr/sbin/apparmor_parser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("apparmor_parser is missing: `apt-get install apparmor` (scripts/test.sh does)");
    let profile = repo().join("policies/apparmor/fork");
    let text = std::fs::read_to_string(&profile).unwrap();
    assert!(text.contains("\n  userns,\n") && text.contains("abi <abi/4.0>,"));
    let parse = |p: &Path| {
        Command::new(parser)
            .args(["-Q", "-K"])
            .arg(p)
            .output()
            .unwrap()
    };
    let version = String::from_utf8_lossy(
        &Command::new(parser)
            .arg("--version")
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    let major: u32 = version
        .split_whitespace()
        .find_map(|w| w.split('.').next()?.parse().ok())
        .unwrap_or(0);
    let out = parse(&profile);
    if major >= 4 {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    assert!(!out.status.success(), "parser {version} accepted `userns`?");
    let d = scratch("apparmor");
    let older = d.join("fork");
    std::fs::write(
        &older,
        text.replace("abi <abi/4.0>,", "abi <abi/3.0>,")
            .replace("\n  userns,\n", "\n"),
    )
    .unwrap();
    let out = parse(&older);
    assert!(
        out.status.success(),
        "the profile without `userns` must parse with {version}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `fork check` resolves cgroupns's dependency on a sandbox cgroup as `fork run` does: for a
/// user whose cgroup layer is missing (optional here, as disk), a check that said OK while
/// the run exited 69 ("no sandbox cgroup") was the bug; now both refuse alike, naming it.
#[test]
fn check_and_run_agree_on_cgroupns_without_a_sandbox_cgroup() {
    need_root!();
    let d = scratch("cgns");
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let policy = d.join("p.toml");
    std::fs::write(
        &policy,
        "[layers]\ndisk = \"optional\"\ncgroup = \"optional\"\n",
    )
    .unwrap();
    let as_nobody = |args: &[&str]| {
        fork_as_nobody()
            .args(args)
            .env("FORK_RUN_ROOT", &d)
            .env("HOME", &d)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let check = as_nobody(&["check", "--json", "--policy", policy.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    let cgroup = v["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["layer"] == "cgroup")
        .unwrap()
        .clone();
    // This host's cgroups are not delegated to nobody (the case this test is about).
    assert_eq!(cgroup["available"], false, "{v}");
    let cgns = v["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["layer"] == "cgroupns")
        .unwrap()
        .clone();
    assert_eq!(cgns["available"], false, "{v}");
    assert!(
        cgns["detail"]
            .as_str()
            .unwrap()
            .contains("no sandbox cgroup"),
        "{v}"
    );
    assert_eq!(check.status.code(), Some(69), "{v}");
    let run = as_nobody(&["run", "--policy", policy.to_str().unwrap(), "--", "true"]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(69), "{err}");
    assert!(err.contains("cgroupns"), "{err}");
}

/// `fork check` launches a trial sandbox: a host problem that every layer's probe misses
/// (here: a run root the sandbox's uid cannot reach) fails the check as it fails `fork run`,
/// naming the step and the fix.
#[test]
fn check_fails_whenever_run_would() {
    need_root!();
    let d = scratch("trial");
    let hidden = d.join("private");
    std::fs::create_dir(&hidden).unwrap();
    std::fs::set_permissions(&hidden, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let runs = hidden.join("runs");
    std::fs::create_dir(&runs).unwrap();
    let run = fork_cmd(&runs)
        .args(["run", "--", "true"])
        .output()
        .unwrap();
    assert_ne!(run.status.code(), Some(0), "the run was expected to fail");
    let check = fork_cmd(&runs).args(["check", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_ne!(check.status.code(), Some(0), "{v}");
    assert_eq!(v["trial"]["ran"], true, "{v}");
    assert_eq!(v["trial"]["ok"], false, "{v}");
    assert!(!v["trial"]["step"].as_str().unwrap().is_empty(), "{v}");
    assert!(!v["trial"]["fix"].as_str().unwrap().is_empty(), "{v}");
    // The text report names the step and the fix too.
    let text = fork_cmd(&runs).arg("check").output().unwrap();
    let out = String::from_utf8_lossy(&text.stdout);
    assert!(
        out.contains("trial launch: FAILED at") && out.contains("fix:"),
        "{out}"
    );
    // And on this host, with a reachable run root, the trial passes.
    let ok = fork_cmd(&scratch("trial-ok"))
        .args(["check", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert_eq!(ok.status.code(), Some(0), "{v}");
    assert_eq!(v["trial"]["ok"], true, "{v}");
}

/// Without root, fork mounts the size-capped disk in a user and mount namespace of its own
/// (as rootless container engines do): the `disk` layer is there for a user, the workspace
/// is capped, the report says `disk: tmpfs` and that the uid is shared, and nothing of the
/// run is left (its mounts were never on the host). Before, the layer was missing for every
/// user (exit 69 under a policy requiring it). As root the test drops to nobody.
#[test]
fn a_user_gets_the_capped_disk_in_a_namespace_of_its_own() {
    let d = scratch("rootless");
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let runs = d.join("runs");
    std::fs::create_dir(&runs).unwrap();
    std::fs::set_permissions(&runs, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    // Only the budgets may be missing (this host's cgroups need not be the user's); the
    // disk stays required, as the default policy has it.
    let policy = d.join("p.toml");
    std::fs::write(
        &policy,
        "[layers]\ncgroup = \"optional\"\ncgroupns = \"optional\"\n",
    )
    .unwrap();
    let report = runs.join("r.json");
    let mut cmd = if is_root() {
        fork_as_nobody()
    } else {
        Command::new(fork_bin())
    };
    let out = cmd
        .args(["run", "--policy", policy.to_str().unwrap(), "--disk", "8MiB"])
        .arg("--report")
        .arg(&report)
        .args([
            "--",
            "sh",
            "-c",
            "echo kept > /tmp/successor/f; head -c 20000000 /dev/zero > /tmp/successor/big; sleep 60",
        ])
        .env("FORK_RUN_ROOT", &runs)
        .env("HOME", &d)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap_or_default()).unwrap_or_default();
    // The 20 MB write fills the 8 MiB disk: the run is stopped by the disk budget at once.
    assert_eq!(out.status.code(), Some(137), "{err} {r}");
    assert_eq!(r["budget_exceeded"], "disk", "{err} {r}");
    assert_eq!(r["isolation"]["disk"], "tmpfs", "{r}");
    assert_eq!(r["isolation"]["uid_shared"], true, "{r}");
    assert_eq!(r["isolation"]["userns"], true, "{r}");
    let id = r["run_id"].as_str().unwrap();
    assert_nothing_left(&runs, id);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(runs.to_str().unwrap()), "{mounts}");
}

/// A run root beneath a directory others cannot search (a 0700 home): root's sandboxes run
/// as an unprivileged uid that could not reach their run directories. That is a setting to
/// change, not an internal error: `fork run` and `fork evaluate` refuse it with the usage
/// exit (64) naming the directory, its mode, FORK_RUN_ROOT and the fix, and leave nothing
/// in the run root; `fork check`'s trial launch names the same fix.
#[test]
fn an_unreachable_run_root_is_a_usage_error_naming_the_fix() {
    use std::os::unix::fs::PermissionsExt;
    need_root!();
    let d = scratch("runroot");
    let closed = d.join("closed");
    let runs = closed.join("runs");
    std::fs::create_dir_all(&runs).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let fork = |args: &[&str]| {
        Command::new(fork_bin())
            .args(args)
            .env("FORK_RUN_ROOT", &runs)
            .env("XDG_CONFIG_HOME", d.join("xdg"))
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let diff = repo().join("fixtures/patches/swap-compressor.diff");
    let demo = repo().join("fixtures/hermes-demo");
    let out_dir = d.join("out");
    let evaluate: Vec<&str> = vec![
        "evaluate",
        diff.to_str().unwrap(),
        "--runtime",
        demo.to_str().unwrap(),
        "--task",
        "judged",
        "--no-ledger",
        "--out",
        out_dir.to_str().unwrap(),
    ];
    for args in [vec!["run", "--", "true"], evaluate] {
        let out = fork(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        let named = format!(
            "{} (mode 700) is not searchable by others",
            closed.display()
        );
        assert!(err.contains(&named), "{args:?}: {err}");
        assert!(
            err.contains("Fix: set FORK_RUN_ROOT to a writable directory"),
            "{args:?}: {err}"
        );
        let left: Vec<_> = std::fs::read_dir(&runs).unwrap().collect();
        assert!(left.is_empty(), "{args:?} left {left:?} in the run root");
    }
    let check = fork(&["check"]);
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(
        text.contains("trial launch: FAILED at run directory") && text.contains("(o+x)"),
        "{text}"
    );
}

/// A required layer the host refuses ends `fork evaluate` with exit 69 naming it, even when
/// no sandbox of the evaluation runs a command: a patch that does not apply is found in a
/// sandbox's workspace, whose cgroups (made on a thread beside it) the host refused. No
/// verdict is written and nothing is left. As root the test drops to nobody, which has no
/// cgroup delegated to it here (nor in the VM harness).
#[test]
fn a_refused_cgroup_layer_is_exit_69_even_when_the_patch_does_not_apply() {
    need_root!();
    let d = scratch("refused-cgroup");
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let runs = d.join("runs");
    std::fs::create_dir(&runs).unwrap();
    std::fs::set_permissions(&runs, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let out_dir = d.join("out");
    let out = fork_as_nobody()
        .arg("evaluate")
        .arg(repo().join("fixtures/patches/does-not-apply.diff"))
        .arg("--runtime")
        .arg(repo().join("fixtures/hermes-demo"))
        .args(["--task", "tests", "--no-ledger", "--out"])
        .arg(&out_dir)
        .env("FORK_RUN_ROOT", &runs)
        .env("HOME", &d)
        .env("XDG_CONFIG_HOME", d.join("xdg"))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(
        err.contains("isolation layer") && err.contains("cgroup") && err.contains("Fix:"),
        "{err}"
    );
    assert!(!out_dir.exists(), "a verdict was written: {err}");
    let left: Vec<_> = std::fs::read_dir(&runs).unwrap().collect();
    assert!(left.is_empty(), "left in the run root: {left:?}");
}
