//! The evaluated tree is the deployed tree: hostile patches that made fork evaluate one tree
//! while `git apply` deploys another are REJECTed by a gate, and `fork verify --patch P
//! --tree DIR` ties a verdict to a real git checkout patched by real `git apply`.

use crate::common::lifecycle::*;
use sha2::{Digest, Sha256};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn hack(name: &str) -> PathBuf {
    crate::common::repo()
        .join("fixtures/patches/hacks")
        .join(format!("{name}.diff"))
}

/// The README's `patched_tree_hash`, written out independently of fork: regular files and
/// symlinks under `root`, sorted by path bytes, minus the top-level names in `skip`.
fn deploy_hash(root: &Path, skip: &[&str]) -> String {
    fn walk(root: &Path, rel: &str, skip: &[&str], out: &mut Vec<(String, PathBuf)>) {
        for e in std::fs::read_dir(root.join(rel)).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            if rel.is_empty() && skip.contains(&name.as_str()) {
                continue;
            }
            if e.file_type().unwrap().is_dir() {
                walk(root, &r, skip, out);
            } else {
                out.push((r, e.path()));
            }
        }
    }
    let mut files = Vec::new();
    walk(root, "", skip, &mut files);
    files.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let put = |h: &mut Sha256, b: &[u8]| {
        h.update((b.len() as u64).to_be_bytes());
        h.update(b);
    };
    let mut h = Sha256::new();
    h.update(b"fork-deploy-tree-v1\0");
    for (rel, abs) in files {
        let m = std::fs::symlink_metadata(&abs).unwrap();
        if m.file_type().is_symlink() {
            h.update(b"L");
            put(&mut h, rel.as_bytes());
            let t = std::fs::read_link(&abs).unwrap();
            put(&mut h, t.to_string_lossy().as_bytes());
        } else if m.is_file() {
            h.update(b"F");
            put(&mut h, rel.as_bytes());
            h.update([u8::from(m.permissions().mode() & 0o100 != 0)]);
            h.update(Sha256::digest(std::fs::read(&abs).unwrap()));
        }
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

fn git(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new("git")
        .args([
            "-c",
            "user.name=fork-test",
            "-c",
            "user.email=fork@test.invalid",
        ])
        .args(["-c", "core.autocrlf=false", "-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .expect("spawn git")
}

/// A real git checkout of the demo's source in `env` (what fork.toml's exclude leaves out
/// is not committed: the state database, caches).
fn git_checkout(env: &Env) -> PathBuf {
    let co = env.dir.join("checkout");
    copy_dir(&demo(), &co);
    for gone in ["state", "__pycache__"] {
        let _ = std::fs::remove_dir_all(co.join(gone));
    }
    for args in [
        &["init", "-q", "."][..],
        &["add", "-A"],
        &["commit", "-q", "-m", "base"],
    ] {
        let o = git(&co, args);
        assert!(o.status.success(), "git {args:?}: {o:?}");
    }
    co
}

fn verify(env: &Env, bundle: &Path, args: &[&dyn AsRef<std::ffi::OsStr>]) -> (i32, String) {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
    super::verify_with(env, bundle, &args)
}

#[test]
fn hostile_patches_that_deployed_another_tree_are_rejected_by_a_gate() {
    need_root!();
    let env = Env::new("ev-hacks");
    let rt = env.runtime("rt", "");
    for (name, gate, path) in [
        ("dup-path", "path_escape", "`hermes//compressor.py`"),
        ("binary-as-text", "binary", "`hermes/turbo.pyc`"),
    ] {
        let e = evaluate(&env, &hack(name), &rt, name, &[]);
        assert_eq!(e.code, 1, "{name}: {}", e.ctx());
        assert_eq!(e.verdict["verdict"], "REJECT", "{name}");
        let v = e.verdict["patch_gate"]["violations"][0]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(v.starts_with(&format!("{gate}: ")), "{name}: {v}");
        assert!(v.contains(path), "{name}: {v}");
        assert!(e.summary().contains(gate), "{name}: {}", e.ctx());
        // No patched tree ran: the verdict vouches for no tree.
        assert!(e.verdict.get("patched_tree_hash").is_none(), "{}", e.ctx());
        assert!(e.sandboxes.is_empty(), "{name}: nothing is cloned");
    }
}

#[test]
fn verify_ties_the_verdict_to_a_git_checkout_patched_by_git_apply() {
    need_root!();
    if Command::new("git").arg("--version").output().is_err() {
        eprintln!("git is not installed: this test checks fork against real `git apply`");
        return;
    }
    let env = Env::new("ev-deploy");
    let rt = env.runtime("rt", "");
    let p = patch("swap-compressor");
    let e = evaluate(&env, &p, &rt, "swap", &["--task", "tests"]);
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert_eq!(e.verdict["header"]["schema"]["version"], "1.4");
    let signed = e.verdict["patched_tree_hash"]
        .as_str()
        .unwrap_or_else(|| panic!("no patched_tree_hash: {}", e.ctx()))
        .to_string();

    let co = git_checkout(&env);

    // Before deploying: fork's applier on a scratch copy of the checkout gives the tree
    // the successor ran.
    let (code, out) = verify(&env, &e.out, &[&"--patch", &p, &"--tree", &co]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&signed), "{out}");
    let unpatched = deploy_hash(&co, &[".git", "state", "__pycache__"]);
    assert_ne!(unpatched, signed);

    // Deploy with real `git apply`: the checkout's tree hash is the verdict's.
    let o = git(&co, &["apply", p.to_str().unwrap()]);
    assert!(o.status.success(), "git apply: {o:?}");
    assert_eq!(
        deploy_hash(&co, &[".git"]),
        signed,
        "the git-deployed tree is not the tree fork evaluated"
    );
    let (code, out) = verify(&env, &e.out, &[&"--tree", &co]);
    assert_eq!(code, 0, "{out}");

    // A deployed tree where one file differs fails, naming both hashes.
    let reg = co.join("hermes/registry.py");
    let mut text = std::fs::read_to_string(&reg).unwrap();
    text.push_str("# changed after the evaluation\n");
    std::fs::write(&reg, &text).unwrap();
    let (code, out) = verify(&env, &e.out, &[&"--tree", &co]);
    assert_eq!(code, 1, "{out}");
    assert!(out.starts_with("invalid: "), "{out}");
    assert!(out.contains(&signed), "{out}");
    assert!(out.contains(&deploy_hash(&co, &[".git"])), "{out}");

    // The same change in the base tree: the patch still applies, the result is not the
    // evaluated tree.
    let o = git(&co, &["checkout", "-q", "--", "hermes/compressor.py"]);
    assert!(o.status.success(), "{o:?}");
    let (code, out) = verify(&env, &e.out, &[&"--patch", &p, &"--tree", &co]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("differs from the one evaluated"), "{out}");

    // Another patch is not the verdict's patch.
    let (code, out) = verify(&env, &e.out, &[&"--patch", &patch("noop-comment")]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("the verdict is for the patch"), "{out}");

    // And the F4 patch, which fork used to APPROVE, deploys both of its halves with git.
    let o = git(&co, &["checkout", "-q", "--", "."]);
    assert!(o.status.success(), "{o:?}");
    let o = git(&co, &["apply", hack("dup-path").to_str().unwrap()]);
    assert!(o.status.success(), "git apply dup-path: {o:?}");
    let c = std::fs::read_to_string(co.join("hermes/compressor.py")).unwrap();
    assert!(
        c.contains("return older + recent") && c.contains("# appended to a cut message"),
        "git applies both entries of dup-path.diff"
    );
}

/// A patch that `git apply` places by its new start and whose lone `new mode` it applies:
/// the repeated context of hermes/state.py (lines 131-132 recur at 142-143) with a header
/// that names the second copy, and `new mode 100755` without `old mode`.
const GIT_PLACED: &str = r#"diff --git a/hermes/state.py b/hermes/state.py
--- a/hermes/state.py
+++ b/hermes/state.py
@@ -131,2 +142,3 @@
         created_at = int(time.time()) if created_at is None else int(created_at)
+        # the message's time: the caller's, else now
         with self._conn:
diff --git a/hermes/__main__.py b/hermes/__main__.py
new mode 100755
--- a/hermes/__main__.py
+++ b/hermes/__main__.py
@@ -1,3 +1,4 @@
+#!/usr/bin/env python3
 """hermes in production mode: `python3 -m hermes serve`.
 
 One JSON object per line on stdin, one answer per line on stdout, nothing else on stdout
"#;

#[test]
fn the_evaluated_tree_is_where_git_apply_puts_hunks_and_modes() {
    need_root!();
    if Command::new("git").arg("--version").output().is_err() {
        eprintln!("git is not installed: this test checks fork against real `git apply`");
        return;
    }
    let env = Env::new("ev-gitplace");
    let rt = env.runtime("rt", "");
    let p = env.dir.join("git-placed.diff");
    std::fs::write(&p, GIT_PLACED).unwrap();
    let e = evaluate(&env, &p, &rt, "placed", &["--task", "tests"]);
    assert_eq!(e.code, 0, "{}", e.ctx());
    let signed = e.verdict["patched_tree_hash"]
        .as_str()
        .unwrap_or_else(|| panic!("no patched_tree_hash: {}", e.ctx()))
        .to_string();

    let co = git_checkout(&env);
    let (code, out) = verify(&env, &e.out, &[&"--patch", &p, &"--tree", &co]);
    assert_eq!(code, 0, "{out}");
    let o = git(&co, &["apply", p.to_str().unwrap()]);
    assert!(o.status.success(), "git apply: {o:?}");
    // What git deployed: the comment after line 142 (the second copy), an executable
    // __main__.py.
    let state = std::fs::read_to_string(co.join("hermes/state.py")).unwrap();
    let at = state.lines().position(|l| l.contains("the message's time"));
    assert_eq!(at, Some(142), "git apply inserts after line 142");
    let mode = std::fs::metadata(co.join("hermes/__main__.py"))
        .unwrap()
        .permissions()
        .mode();
    assert_ne!(mode & 0o100, 0, "git apply makes __main__.py executable");
    assert_eq!(
        deploy_hash(&co, &[".git"]),
        signed,
        "the git-deployed tree is not the tree fork evaluated"
    );
    let (code, out) = verify(&env, &e.out, &[&"--tree", &co]);
    assert_eq!(code, 0, "{out}");
}
