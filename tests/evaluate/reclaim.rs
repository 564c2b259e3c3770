//! A killed supervisor's run is reclaimed, by `fork gc` and by the next `fork evaluate`,
//! and its staging copy of the state is private.

use super::*;

/// Waits until the evaluation `sup` runs its task (a process whose command line starts with
/// `needle`), for as long as the evaluation runs: it gets there after the snapshot, the
/// copies, the patch and its gates, which took more than 20 s under software emulation on
/// a loaded host (the Debian guest of scripts/vm-test.sh). An evaluation that ends first
/// fails at once; 600 s is the bound of a hung one, not a measure of speed.
fn wait_until_the_task_runs(sup: &mut Child, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while processes_starting(needle).is_empty() {
        if let Some(st) = sup.try_wait().unwrap() {
            panic!("the evaluation ended ({st}) before its task `{needle}` ran");
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting until the task runs"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts an evaluation of a task that sleeps, waits until the sleep runs in the sandbox,
/// SIGKILLs the supervisor; returns the stale run's id and the sleep's command line.
fn kill_supervisor_mid_run(env: &Env, rt: &Path, task: &str, marker: &str) -> String {
    let before: HashSet<_> = std::fs::read_dir(&env.run_root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    let mut sup = env
        .cmd()
        .arg("evaluate")
        .arg(patch("noop-comment"))
        .arg("--runtime")
        .arg(rt)
        .args(["--task", task, "--out"])
        .arg(env.dir.join(format!("out-killed-{task}")))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until_the_task_runs(&mut sup, &format!("sleep {marker}"));
    sup.kill().unwrap(); // SIGKILL: no cleanup code runs in the supervisor.
    sup.wait().unwrap();
    let new: Vec<String> = std::fs::read_dir(&env.run_root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| !before.contains(n))
        .map(|n| n.to_string_lossy().into_owned())
        .filter_map(|n| n.strip_prefix("fork-").map(str::to_string))
        .filter(|id| !id.starts_with("eval-"))
        .collect();
    assert_eq!(new.len(), 1, "one stale sandbox run directory: {new:?}");
    let id = new[0].clone();
    // There is something to reclaim: the directory, its disk mount and its cgroups. (A
    // user's disk was mounted in the dead supervisor's own mount namespace, which went
    // with it: only root's shows here.)
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    if is_root() {
        assert!(mounts.contains(&format!("fork-{id}")), "no mount of {id}");
    }
    assert!(!cgroup_dirs(&id).is_empty(), "no cgroup of {id}");
    assert!(!env.dir.join(format!("out-killed-{task}")).exists());
    id
}

/// The evaluations' staging directories (`fork-eval-<run-id>/stage`) in a run root.
fn stage_dirs(run_root: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(run_root)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("fork-eval-"))
        .map(|e| e.path().join("stage"))
        .filter(|p| p.is_dir())
        .collect()
}

#[test]
fn killed_supervisor_is_reclaimed_by_gc_and_by_the_next_evaluate() {
    need_default_policy!();
    let env = Env::new("ev-kill");
    let (m1, m2) = (unique_sleep(30), unique_sleep(31));
    let rt = env.runtime(
        "hermes-demo",
        &format!(
            "\n[tasks.slow1]\ncommand = [\"sleep\", \"{m1}\"]\n\
             \n[tasks.slow2]\ncommand = [\"sleep\", \"{m2}\"]\n"
        ),
    );

    // fork gc reclaims it.
    let id = kill_supervisor_mid_run(&env, &rt, "slow1", &m1);
    let rep = gc_report(env.cmd());
    assert!(gc_reclaimed(&rep, &id), "{rep}");
    assert!(
        rep["cgroups_removed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c.as_str().unwrap().ends_with(&format!("fork-{id}"))),
        "{rep}"
    );
    assert_eq!(rep["errors"].as_array().map(Vec::len), Some(0), "{rep}");
    wait_until("the sandboxed task is gone", Duration::from_secs(5), || {
        processes_starting(&format!("sleep {m1}")).is_empty()
    });
    // gc took the evaluation's staging directory (with its state snapshot) too.
    let leaked = stage_dirs(&env.run_root);
    assert!(leaked.is_empty(), "staging left behind: {leaked:?}");
    assert_run_root_clean(&env.run_root, std::slice::from_ref(&id), &leaked);

    // The next evaluate reclaims stale runs before it starts.
    let id2 = kill_supervisor_mid_run(&env, &rt, "slow2", &m2);
    let leaked = stage_dirs(&env.run_root);
    let e = evaluate_with(
        &env,
        &patch("noop-comment"),
        &rt,
        "after-kill",
        &["--task", "contract"],
        With {
            pre: &["-v"],
            allowed_leftovers: &leaked,
            ..With::default()
        },
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    // The killed sandbox's run directory and the killed evaluation's own.
    assert!(e.stderr.contains("reclaimed 2 stale run"), "{}", e.stderr);
    wait_until("the sandboxed task is gone", Duration::from_secs(5), || {
        processes_starting(&format!("sleep {m2}")).is_empty()
    });
    assert_run_root_clean(&env.run_root, &[id2], &leaked);
}

#[test]
fn killed_supervisor_leaves_no_staging_directory() {
    need_default_policy!();
    let env = Env::new("ev-stage");
    let m = unique_sleep(32);
    let rt = env.runtime(
        "hermes-demo",
        &format!("\n[tasks.slow]\ncommand = [\"sleep\", \"{m}\"]\n"),
    );
    let id = kill_supervisor_mid_run(&env, &rt, "slow", &m);
    gc_report(env.cmd());
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "after",
        &["--task", "contract"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    // assert_run_root_clean (inside evaluate) already fails on the leftover; say it plainly:
    assert!(stage_dirs(&env.run_root).is_empty());
    assert_run_root_clean(&env.run_root, &[id], &[]);
}

#[test]
fn staging_copy_of_the_state_is_private() {
    use std::os::unix::fs::PermissionsExt;
    need_default_policy!();
    let env = Env::new("ev-private");
    let m = unique_sleep(33);
    let rt = env.runtime(
        "hermes-demo",
        &format!("\n[tasks.slow]\ncommand = [\"sleep\", \"{m}\"]\n"),
    );
    std::fs::set_permissions(
        rt.join("state/hermes.db"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let mut sup = env
        .cmd()
        .arg("evaluate")
        .arg(patch("noop-comment"))
        .arg("--runtime")
        .arg(&rt)
        .args(["--task", "slow", "--wall", "20s", "--out"])
        .arg(env.dir.join("out"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until_the_task_runs(&mut sup, &format!("sleep {m}"));
    let stages = stage_dirs(&env.run_root);
    let modes: Vec<(PathBuf, u32)> = stages
        .iter()
        .flat_map(|s| [s.clone(), s.join("state"), s.join("state/hermes.db")])
        .map(|p| {
            let m = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            (p, m)
        })
        .collect();
    // End the run cleanly (SIGTERM: the supervisor destroys everything), then judge.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sup.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    sup.wait().unwrap();
    assert_eq!(stages.len(), 1);
    for (p, m) in modes {
        assert_eq!(m & 0o077, 0, "{} is mode {m:o}", p.display());
    }
}
