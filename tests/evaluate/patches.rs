//! Every fixture patch gets its verdict and exit code: approved, needing revision, not
//! applying, stopped by a gate before anything is cloned, under a 0700 directory, and the
//! hostile patch contained.

use super::*;

#[test]
fn swap_compressor_is_approved_and_improves_compression() {
    need_default_policy!();
    let env = Env::new("ev-swap");
    let e = evaluate(
        &env,
        &patch("swap-compressor"),
        &demo(),
        "tests",
        &["--task", "tests"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert_eq!(e.verdict["task"], "tests");
    assert!(e.verdict["tests"]["passed"].as_u64().unwrap() > 0);
    assert_eq!(e.verdict["tests"]["failed"], 0);
    assert!(e.artifact("tests.xml").is_file());
    assert_eq!(e.sandboxes.len(), 1, "one side: {:?}", e.sandboxes);

    // The compress task runs a baseline too: two sandboxes, both gone (checked by evaluate).
    let e = evaluate(
        &env,
        &patch("swap-compressor"),
        &demo(),
        "compress",
        &["--task", "compress"],
    );
    // Timing metrics the pairs could not decide make it NEEDS_REVISION, saying so.
    assert!(
        e.code == 0 || (e.code == 2 && e.summary().contains("inconclusive")),
        "{}",
        e.ctx()
    );
    assert_eq!(e.verdict["task"], "compress");
    // repeat = 20 in fork.toml: at most 20 pairs of a patched and a baseline sandbox.
    let pairs = e.verdict["metrics"][0]["samples"].as_u64().unwrap() as usize;
    assert!((3..=20).contains(&pairs), "{}", e.ctx());
    assert_eq!(
        e.sandboxes.len(),
        2 * pairs + e.first_pair_extra(),
        "{pairs} x (patched + baseline), and the first patched side again when the \
         baseline was drawn first: {:?}",
        e.sandboxes
    );
    let metrics = e.verdict["metrics"].as_array().expect("metrics");
    let cb = metrics
        .iter()
        .find(|m| m["name"] == "compressed_bytes")
        .unwrap_or_else(|| panic!("no compressed_bytes metric: {}", e.ctx()));
    let baseline = cb["baseline"].as_f64().expect("a baseline value");
    let patched = cb["patched"].as_f64().unwrap();
    let change = cb["change"].as_f64().unwrap();
    assert!(baseline > 0.0 && patched < baseline, "{cb}");
    assert!(change < 0.0, "compressed_bytes must shrink: {cb}");
    assert!(
        ((patched - baseline) / baseline - change).abs() < 1e-9,
        "{cb}"
    );
    // The baseline's metrics travel as their own artifact, and match the verdict.
    let bm = e.artifact_json("baseline-metrics.json");
    assert_eq!(bm["compressed_bytes"].as_f64(), Some(baseline));
    let pm = e.artifact_json("metrics.json");
    assert_eq!(pm["compressed_bytes"].as_f64(), Some(patched));
}

#[test]
fn breaks_test_needs_revision() {
    need_default_policy!();
    let env = Env::new("ev-breaks");
    let e = evaluate(
        &env,
        &patch("breaks-test"),
        &demo(),
        "breaks",
        &["--task", "tests"],
    );
    assert_eq!(e.code, 2, "{}", e.ctx());
    assert!(e.verdict["tests"]["failed"].as_u64().unwrap() >= 1);
    assert!(
        e.summary().contains("test_pick_tool_by_triggers"),
        "{}",
        e.ctx()
    );
    assert!(e.stdout.contains("NEEDS_REVISION"), "{}", e.stdout);
}

#[test]
fn does_not_apply_is_rejected_naming_file_and_hunk() {
    need_default_policy!();
    let env = Env::new("ev-noapply");
    let e = evaluate(&env, &patch("does-not-apply"), &demo(), "noapply", &[]);
    assert_eq!(e.code, 1, "{}", e.ctx());
    let s = e.summary();
    assert!(s.contains("hermes/runtime.py"), "{s}");
    assert!(s.contains("hunk 1"), "{s}");
    assert!(s.contains("does not apply"), "{s}");
    // The gates passed; it was the application that failed.
    assert_eq!(e.verdict["patch_gate"]["passed"], true);
}

#[test]
fn gates_reject_before_anything_is_cloned() {
    need_default_policy!();
    let env = Env::new("ev-gates");
    for (name, gate, names) in [
        (
            "touches-protected",
            "protected_path",
            "tests/test_compressor.py",
        ),
        ("path-traversal", "path_escape", "../escaped.txt"),
        ("reads-node-key", "forbidden_content", ".config/fork"),
        ("adds-binary", "binary", "tools/icon.bin"),
    ] {
        let e = evaluate(&env, &patch(name), &demo(), name, &[]);
        assert_eq!(e.code, 1, "{name}: {}", e.ctx());
        let v = gate_violation(&e);
        assert!(v.starts_with(&format!("{gate}:")), "{name}: {v}");
        assert!(v.contains(names), "{name}: {v}");
        assert!(e.summary().contains(gate), "{name}: {}", e.summary());
        // REJECTed at PLAN time: no sandbox was ever started.
        assert_eq!(e.verdict["isolation"]["sandbox_started"], false, "{name}");
        assert!(e.sandboxes.is_empty(), "{name}: {:?}", e.sandboxes);
        assert!(
            e.verdict["state_hash"]
                .as_str()
                .unwrap()
                .starts_with("sha256:"),
            "{name}"
        );
    }
    assert!(!repo().join("fixtures/escaped.txt").exists());
}

/// A patch that appends a comment line to `file` (relative to the runtime's root, its
/// source), written beside the runtime.
fn appending_patch(rt: &Path, file: &str) -> PathBuf {
    let text = std::fs::read_to_string(rt.join(file)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let n = lines.len();
    let ctx = &lines[n - 3..];
    let mut p = format!(
        "diff --git a/{file} b/{file}\n--- a/{file}\n+++ b/{file}\n@@ -{},3 +{},4 @@\n",
        n - 2,
        n - 2
    );
    for l in ctx {
        p.push_str(&format!(" {l}\n"));
    }
    p.push_str("+# changed by the patch\n");
    let out = rt.with_extension(format!("{}.diff", file.replace('/', "_")));
    std::fs::write(&out, p).unwrap();
    out
}

#[test]
fn the_manifest_and_the_policy_in_use_are_protected_whatever_the_manifest_lists() {
    need_default_policy!();
    // A patch that changed the files saying how it is graded would be graded by the old
    // ones and deployed with the new: every later evaluation would run under what it
    // wrote. Here the manifest protects neither itself nor the policy kept in the source.
    let env = Env::new("ev-grading-files");
    let rt = env.runtime("rt", "");
    let toml = std::fs::read_to_string(rt.join("fork.toml")).unwrap();
    let narrowed = toml.replace(
        r#"protected = ["tests/**", "bench/**", "judge/**", "gateway-policy.toml", "fork.toml"]"#,
        r#"protected = ["tests/**"]"#,
    );
    assert_ne!(
        narrowed, toml,
        "the demo's protected list changed: update this test"
    );
    std::fs::write(rt.join("fork.toml"), narrowed).unwrap();
    std::fs::create_dir_all(rt.join("conf/seccomp")).unwrap();
    std::fs::copy(
        repo().join("policies/default.toml"),
        rt.join("conf/default.toml"),
    )
    .unwrap();
    std::fs::copy(
        repo().join("policies/seccomp/default.json"),
        rt.join("conf/seccomp/default.json"),
    )
    .unwrap();
    let policy = rt.join("conf/default.toml");
    let policy = policy.to_str().unwrap();
    for (name, file, args) in [
        ("manifest", "fork.toml", vec![]),
        ("policy", "conf/default.toml", vec!["--policy", policy]),
        (
            "profile",
            "conf/seccomp/default.json",
            vec!["--policy", policy],
        ),
    ] {
        let diff = appending_patch(&rt, file);
        let e = evaluate(&env, &diff, &rt, name, &args);
        assert_eq!(e.code, 1, "{name}: {}", e.ctx());
        let v = gate_violation(&e);
        assert!(v.starts_with("protected_path:"), "{name}: {v}");
        assert!(v.contains(&format!("`{file}`")), "{name}: {v}");
        assert_eq!(e.verdict["isolation"]["sandbox_started"], false, "{name}");
    }
}

#[test]
fn noop_comment_is_approved() {
    need_default_policy!();
    let env = Env::new("ev-noop");
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &demo(),
        "noop",
        &["--task", "tests"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert_eq!(e.verdict["tests"]["failed"], 0);
    assert!(e.verdict["tests"]["passed"].as_u64().unwrap() > 0);
}

/// A user's runtime lives under their home, which is 0700: not searchable by the sandbox's
/// unprivileged uid. The runtime (its state, its source) and the patch under a 0700
/// directory evaluate like anywhere else: fork stages its own copies under its run root.
/// The whole judged plan runs (the judge comes from the unpatched tree), and the directory
/// keeps its mode.
#[test]
fn a_runtime_under_a_0700_directory_is_evaluated() {
    use std::os::unix::fs::PermissionsExt;
    need_root!();
    let env = Env::new("ev-private-home");
    let home = env.dir.join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    let rt = home.join("runtime");
    copy_dir(&demo(), &rt);
    let diff = home.join("swap-compressor.diff");
    std::fs::copy(patch("swap-compressor"), &diff).unwrap();
    let e = evaluate(&env, &diff, &rt, "private-home", &[]);
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert_eq!(e.verdict["verdict"], "APPROVE", "{}", e.ctx());
    let tasks: Vec<&str> = e.verdict["plan"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task"].as_str().unwrap())
        .collect();
    assert_eq!(tasks, ["contract", "bench"], "{}", e.ctx());
    let mode = std::fs::metadata(&home).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
}

#[test]
fn hostile_escape_is_contained() {
    need_default_policy!();
    let env = Env::new("ev-hostile");
    // A copy of the runtime whose task tells the hostile code where the parent's live
    // state is (as a real successor could guess it), wherever this checkout lives.
    let db = env.dir.join("hermes-demo/state/hermes.db");
    let rt = env.runtime(
        "hermes-demo",
        &format!(
            "\n[tasks.hostile]\ncommand = [\"python3\", \"tests/run.py\"]\n\
             results = {{ format = \"junit\", path = \"tests.xml\" }}\n\
             env = {{ DEMO_PARENT_STATE = \"{}\" }}\n",
            db.display()
        ),
    );
    let before = std::fs::read(&db).unwrap();
    let marker = rt.join("state/ESCAPED");
    let e = evaluate(
        &env,
        &patch("hostile-escape"),
        &rt,
        "hostile",
        &["--task", "hostile"],
    );
    // It passes the gates on purpose, and the tests pass: APPROVE when contained.
    assert_eq!(e.code, 0, "{}", e.ctx());
    let report = e.artifact_json("report-escape.json");
    // Strict: the fixture targets only the parent it is evaluated against (and the key).
    assert_contained(&report, &db, true);
    assert!(!marker.exists(), "{} appeared", marker.display());
    assert_eq!(
        std::fs::read(&db).unwrap(),
        before,
        "the parent's state changed"
    );
    assert!(!demo().join("state/ESCAPED").exists());
}

/// Every side copies the runtime's source afresh: a parent that changes its source during
/// the evaluation would have later runs use another tree than the one the verdict names
/// (or, on the baseline side, than the one the evaluation began with). Every patched side
/// prepared again is checked against the first one's patched tree, every baseline side
/// (and the first patched side, before its patch) against the source hashed when the
/// evaluation began; a change ends the evaluation as bad input naming the source (no
/// verdict on a tree that moved), with nothing left behind. The source changes once the
/// first run has started (its sandbox's init recorded), while that run sleeps (2 s): the
/// next side prepared meets it, a baseline or a patched one; with one pair, the side after
/// the first run is the baseline half the time, so five single-pair evaluations are run
/// (each must end without a verdict; without the baseline's check all five would pass
/// by chance once in 32).
#[test]
fn a_source_tree_changed_mid_evaluation_gives_no_verdict() {
    need_default_policy!();
    let env = Env::new("ev-source-moved");
    for (i, repeat) in [3, 1, 1, 1, 1, 1].into_iter().enumerate() {
        let rt = env.runtime(
            &format!("rt{i}"),
            &format!(
                "\n[tasks.slow]\ncommand = [\"sh\", \"-c\", \"sleep 2\"]\nbaseline = true\nrepeat = {repeat}\n"
            ),
        );
        let e = source_changed_during(&env, &rt, &format!("moved{i}"));
        assert_eq!(e.code, 65, "repeat {repeat}: {}", e.ctx());
        assert!(
            e.stderr
                .contains("the runtime's source tree changed during the evaluation")
                && e.stderr.contains("(changed: README.md)")
                && e.stderr.contains("evaluate again"),
            "{}",
            e.ctx()
        );
        assert!(e.verdict.is_null(), "no verdict: {}", e.ctx());
    }
}

/// Evaluates `--task slow` on `rt`, editing its README (part of its source) once the
/// first run has started.
fn source_changed_during(env: &Env, rt: &Path, name: &str) -> Eval {
    let (run_root, readme) = (env.run_root.clone(), rt.join("README.md"));
    let changer = std::thread::spawn(move || {
        let began = Instant::now();
        let run_started = || {
            std::fs::read_dir(&run_root).is_ok_and(|rd| {
                rd.flatten().any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with("fork-")
                        && !name.starts_with("fork-eval-")
                        && std::fs::read_to_string(e.path().join("meta.json")).is_ok_and(|m| {
                            m.contains("\"init_pid\":") && !m.contains("\"init_pid\":null")
                        })
                })
            })
        };
        while !run_started() && began.elapsed() < Duration::from_secs(120) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut text = std::fs::read_to_string(&readme).unwrap();
        text.push_str("\nedited by the parent mid-evaluation\n");
        std::fs::write(&readme, text).unwrap();
    });
    let e = evaluate(
        env,
        &patch("noop-comment"),
        rt,
        name,
        &["--task", "slow", "--no-ledger"],
    );
    changer.join().unwrap();
    e
}
