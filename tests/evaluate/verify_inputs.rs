//! `fork verify --patch P` and `--tree DIR` read their inputs as every other command reads
//! a patch or a manifest: a FIFO is refused at once (never waited on for a writer), a link
//! to a device is never read (no `/dev/zero` read without end). Both are bad input, exit
//! 65, naming the path. No sandbox runs: no root needed.

use super::*;

/// A bundle signed by this test's node key, claiming a patched tree (so that `--tree`
/// reads the tree's manifest), without any evaluation.
fn bundle_claiming_a_tree(env: &Env) -> PathBuf {
    let o = env.cmd().arg("keygen").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let dir = env.dir.join("bundle");
    use fork::verdict::*;
    let task_hash = sha256_digest(b"task");
    let v = Verdict {
        header: Header::new(),
        verdict: VerdictKind::Approve,
        confidence: 0.9,
        patch_hash: sha256_digest(b"the evaluated patch"),
        task_hash: task_hash.clone(),
        state_hash: sha256_digest(b"state"),
        source_hash: sha256_digest(b"source"),
        patched_tree_hash: Some(sha256_digest(b"the patched tree")),
        evaluation_summary: "The task exited with status 0.".into(),
        caveats: vec![],
        tests: TestCounts::default(),
        metrics: vec![],
        budget: BudgetReport::default(),
        isolation: serde_json::json!({}),
        artifacts: vec![],
        successor_key: String::new(),
        run_id: fork::rundir::new_run_id(),
        task: "t".into(),
        patch_gate: None,
        proposal_id: None,
        provenance: None,
        plan: vec![plan::TaskVerdict {
            task: "t".into(),
            task_hash,
            verdict: Some(VerdictKind::Approve),
            confidence: Some(0.9),
            summary: "The task exited with status 0.".into(),
            provenance: None,
            tests: TestCounts::default(),
            metrics: vec![],
            budget: None,
        }],
    };
    let node = fork::identity::load_node_key(&env.xdg.join("fork/node.key")).unwrap();
    let eph = fork::identity::EphemeralKey::generate();
    write_bundle(&dir, &v, &[], &eph, &node).unwrap();
    eph.destroy();
    dir
}

/// `fork verify BUNDLE ARGS...`, killed if it has not ended within `limit`: its exit code
/// (None when it had to be killed or died of a signal) and its stderr. It runs with its
/// address space capped at 4 GiB (`ulimit -v`), so that a read of `/dev/zero` without end
/// (the defect this guards against) fails fast instead of filling the machine's memory.
fn verify_within(
    env: &Env,
    bundle: &Path,
    args: &[&OsStr],
    limit: Duration,
) -> (Option<i32>, String) {
    let mut verify = env.cmd();
    verify.arg("verify").arg(bundle).args(args);
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("ulimit -v 4194304 && exec \"$@\"")
        .arg("sh")
        .arg(verify.get_program())
        .args(verify.get_args());
    for (k, v) in verify.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut stderr);
    }
    (code, stderr)
}

#[test]
fn verify_refuses_a_fifo_or_a_device_as_patch_or_manifest_at_once() {
    let env = Env::new("ev-verify-inputs");
    let bundle = bundle_claiming_a_tree(&env);
    // The bundle itself verifies: what follows is refused for its inputs alone.
    let (code, stderr) = verify_within(&env, &bundle, &[], Duration::from_secs(60));
    assert_eq!(code, Some(0), "{stderr}");

    let mode = nix::sys::stat::Mode::from_bits_truncate(0o600);
    let fifo_patch = env.dir.join("fifo.diff");
    nix::unistd::mkfifo(&fifo_patch, mode).unwrap();
    let zero_patch = env.dir.join("zero.diff");
    std::os::unix::fs::symlink("/dev/zero", &zero_patch).unwrap();
    let fifo_tree = env.dir.join("fifo-tree");
    std::fs::create_dir(&fifo_tree).unwrap();
    nix::unistd::mkfifo(&fifo_tree.join("fork.toml"), mode).unwrap();
    let zero_tree = env.dir.join("zero-tree");
    std::fs::create_dir(&zero_tree).unwrap();
    std::os::unix::fs::symlink("/dev/zero", zero_tree.join("fork.toml")).unwrap();

    // A manifest far larger than any (sparse: no disk used) is refused by its size.
    let big_tree = env.dir.join("big-tree");
    std::fs::create_dir(&big_tree).unwrap();
    std::fs::File::create(big_tree.join("fork.toml"))
        .unwrap()
        .set_len(32 << 20)
        .unwrap();

    let patch = OsStr::new("--patch");
    let tree = OsStr::new("--tree");
    let fifo = "is a FIFO, expected a regular file";
    let device = "is a character device, expected a regular file";
    let not_regular = "not a regular file";
    let cases: [(&str, Vec<&OsStr>, &str, &str); 7] = [
        (
            "FIFO patch",
            vec![patch, fifo_patch.as_os_str()],
            "fifo.diff",
            fifo,
        ),
        (
            "/dev/zero patch",
            vec![patch, zero_patch.as_os_str()],
            "zero.diff",
            device,
        ),
        (
            "FIFO patch with a tree",
            vec![patch, fifo_patch.as_os_str(), tree, fifo_tree.as_os_str()],
            "fifo.diff",
            fifo,
        ),
        (
            "/dev/zero patch with a tree",
            vec![patch, zero_patch.as_os_str(), tree, zero_tree.as_os_str()],
            "zero.diff",
            device,
        ),
        (
            "FIFO manifest",
            vec![tree, fifo_tree.as_os_str()],
            "fifo-tree/fork.toml",
            not_regular,
        ),
        (
            "/dev/zero manifest",
            vec![tree, zero_tree.as_os_str()],
            "zero-tree/fork.toml",
            not_regular,
        ),
        (
            "32 MiB manifest",
            vec![tree, big_tree.as_os_str()],
            "big-tree/fork.toml",
            "larger than 16777216 bytes",
        ),
    ];
    for (what, args, names, why) in cases {
        let started = Instant::now();
        let (code, stderr) = verify_within(&env, &bundle, &args, Duration::from_secs(30));
        assert_eq!(code, Some(65), "{what}: {stderr}");
        assert!(
            stderr.contains(names) && stderr.contains(why),
            "{what}: the error names {names} and says {why:?}: {stderr}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{what}: refused only after {:?}",
            started.elapsed()
        );
    }
}
