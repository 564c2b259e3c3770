use super::*;
use crate::patch::parse::parse;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixture_patch(name: &str) -> Patch {
    let p = root().join("fixtures/patches").join(name);
    let raw = fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    parse(&raw).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn copy_tree(from: &Path, to: &Path, skip: &[&str]) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if skip.iter().any(|s| name == *s) {
            continue;
        }
        let ty = entry.file_type().unwrap();
        if ty.is_dir() {
            copy_tree(&entry.path(), &to.join(&name), skip);
        } else if ty.is_file() {
            fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}

/// A fork-like workspace: src/ (the tree without state), state/, reports/, home/, tmp/.
struct Workspace {
    _dir: tempfile::TempDir,
    src: PathBuf,
    base: PathBuf,
}

fn workspace() -> Workspace {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().to_path_buf();
    let demo = root().join("fixtures/hermes-demo");
    copy_tree(
        &demo,
        &base.join("src"),
        &["state", ".git", "__pycache__", "reports"],
    );
    copy_tree(&demo.join("state"), &base.join("state"), &[]);
    copy_tree(&demo.join("tools"), &base.join("tools"), &[]);
    for d in ["reports", "home", "tmp"] {
        fs::create_dir_all(base.join(d)).unwrap();
    }
    Workspace {
        src: base.join("src"),
        base,
        _dir: dir,
    }
}

/// Runs a command in src/ with only the successor's variables set.
fn run_in(ws: &Workspace, args: &[&str], reports: &str) -> std::process::Output {
    let reports = ws.base.join(reports);
    fs::create_dir_all(&reports).unwrap();
    Command::new("python3")
        .args(args)
        .current_dir(&ws.src)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("FORK_REPORTS", &reports)
        .env("FORK_STATE", ws.base.join("state"))
        .env("FORK_TOOLS", ws.base.join("tools"))
        .env("HOME", ws.base.join("home"))
        .env("TMPDIR", ws.base.join("tmp"))
        .output()
        .expect("python3 runs")
}

fn junit_counts(xml: &str) -> (usize, usize, usize) {
    let attr = |name: &str| -> usize {
        let key = format!(" {name}=\"");
        let start = xml.find(&key).unwrap() + key.len();
        xml[start..].split('"').next().unwrap().parse().unwrap()
    };
    (attr("tests"), attr("failures"), attr("errors"))
}

fn metrics(ws: &Workspace, reports: &str) -> serde_json::Value {
    let out = run_in(ws, &["bench/compress.py", "--sessions", "100"], reports);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = fs::read_to_string(ws.base.join(reports).join("metrics.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Every file under `dir` with its bytes and permission bits.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (Vec<u8>, u32)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else {
                out.insert(
                    e.path().strip_prefix(dir).unwrap().to_path_buf(),
                    (fs::read(e.path()).unwrap(), m.permissions().mode()),
                );
            }
        }
    }
    out
}

#[test]
fn swap_compressor_applies_keeps_tests_green_and_improves_metrics() {
    let ws = workspace();
    let before = metrics(&ws, "before");
    let summary = apply(&ws.src, &fixture_patch("swap-compressor.diff")).unwrap();
    assert_eq!(summary.files_changed, 1);
    assert!(
        summary.insertions > 50 && summary.deletions > 5,
        "{summary:?}"
    );

    let out = run_in(&ws, &["tests/run.py"], "tests");
    let xml = fs::read_to_string(ws.base.join("tests/tests.xml")).unwrap();
    assert!(
        out.status.success(),
        "{}\n{xml}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (tests, failures, errors) = junit_counts(&xml);
    assert!(tests >= 15, "{xml}");
    assert_eq!((failures, errors), (0, 0));

    let after = metrics(&ws, "after");
    let num = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
    assert!(
        num(&after, "compressed_bytes") < 0.8 * num(&before, "compressed_bytes"),
        "{before} -> {after}"
    );
    assert!(
        num(&after, "ratio") < num(&before, "ratio") - 0.1,
        "{before} -> {after}"
    );
    // No stray writes in the tree (no reports/, no __pycache__).
    assert!(!ws.src.join("reports").exists());
    assert!(!ws.src.join("hermes/__pycache__").exists());
}

#[test]
fn unpatched_demo_passes_and_breaks_test_makes_tests_fail() {
    let ws = workspace();
    let out = run_in(&ws, &["tests/run.py"], "clean");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, f, e) = junit_counts(&fs::read_to_string(ws.base.join("clean/tests.xml")).unwrap());
    assert_eq!((f, e), (0, 0));

    apply(&ws.src, &fixture_patch("breaks-test.diff")).unwrap();
    let out = run_in(&ws, &["tests/run.py"], "broken");
    assert!(!out.status.success());
    let xml = fs::read_to_string(ws.base.join("broken/tests.xml")).unwrap();
    let (tests, failures, errors) = junit_counts(&xml);
    assert!(tests >= 15);
    assert!((1..=2).contains(&(failures + errors)), "{xml}");
    assert!(xml.contains("<failure"), "{xml}");
}

#[test]
fn does_not_apply_names_file_and_hunk_and_leaves_the_tree_untouched() {
    let ws = workspace();
    let before = snapshot(&ws.src);
    let err = apply(&ws.src, &fixture_patch("does-not-apply.diff")).unwrap_err();
    match &err {
        ApplyError::HunkMismatch { file, hunk, detail } => {
            assert_eq!(file, "hermes/runtime.py");
            assert_eq!(*hunk, 1);
            assert!(detail.contains("says: {plan.tool_output}"), "{detail}");
            assert!(
                detail.contains("found `        plan.reply = f\"Used"),
                "{detail}"
            );
        }
        other => panic!("unexpected {other}"),
    }
    assert_eq!(err.hunk(), Some(1));
    assert_eq!(snapshot(&ws.src), before);
}

#[test]
fn failing_later_file_leaves_earlier_files_unwritten() {
    // touches-protected changes compressor.py then tests/test_compressor.py; make
    // the second one fail: nothing may be written.
    let ws = workspace();
    let t = ws.src.join("tests/test_compressor.py");
    let text = fs::read_to_string(&t)
        .unwrap()
        .replace("(1, 3, compressor", "(2, 3, compressor");
    fs::write(&t, text).unwrap();
    let before = snapshot(&ws.src);
    let err = apply(&ws.src, &fixture_patch("touches-protected.diff")).unwrap_err();
    assert_eq!(err.file(), "tests/test_compressor.py");
    assert_eq!(snapshot(&ws.src), before);
}

#[test]
fn already_applied_patch_is_refused_not_reversed() {
    let ws = workspace();
    for name in [
        "swap-compressor.diff",
        "noop-comment.diff",
        "hostile-escape.diff",
    ] {
        apply(&ws.src, &fixture_patch(name)).unwrap();
        let before = snapshot(&ws.src);
        let err = apply(&ws.src, &fixture_patch(name)).unwrap_err();
        assert!(
            matches!(err, ApplyError::AlreadyApplied { hunk: 1, .. }),
            "{name}: {err}"
        );
        assert!(err.to_string().contains("already applied"), "{err}");
        assert_eq!(snapshot(&ws.src), before, "{name}");
    }
}

#[test]
fn offsets_are_allowed_fuzz_is_not() {
    let ws = workspace();
    let f = ws.src.join("hermes/registry.py");
    let orig = fs::read_to_string(&f).unwrap();
    // five extra lines at the top: the hunk is found at an offset
    fs::write(&f, format!("# a\n# b\n# c\n# d\n# e\n{orig}")).unwrap();
    apply(&ws.src, &fixture_patch("noop-comment.diff")).unwrap();
    let now = fs::read_to_string(&f).unwrap();
    assert!(now.contains("class RegistryError(Exception):\n    # raised for any manifest or module problem\n    pass\n"));
    assert!(now.starts_with("# a\n"));

    // one changed context line: no fuzz, the hunk fails
    fs::write(
        &f,
        orig.replace(
            "class RegistryError(Exception):",
            "class RegistryError(ValueError):",
        ),
    )
    .unwrap();
    let err = apply(&ws.src, &fixture_patch("noop-comment.diff")).unwrap_err();
    assert!(
        matches!(err, ApplyError::HunkMismatch { hunk: 1, .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("class RegistryError(Exception):"),
        "{err}"
    );
}

fn apply_text(tree: &Path, patch: &str) -> Result<ApplySummary, ApplyError> {
    apply(tree, &parse(patch.as_bytes()).unwrap())
}

#[test]
fn create_delete_rename_modes_and_no_newline() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path();
    fs::write(t.join("a.txt"), "one\ntwo\nthree").unwrap();
    fs::write(t.join("gone.txt"), "bye\n").unwrap();
    fs::write(t.join("run.sh"), "echo hi\n").unwrap();
    fs::set_permissions(t.join("run.sh"), fs::Permissions::from_mode(0o644)).unwrap();
    let patch = "\
diff --git a/a.txt b/a.txt
index 1111111..2222222 100644
--- a/a.txt
+++ b/a.txt
@@ -1,3 +1,3 @@
 one
 two
-three
\\ No newline at end of file
+three
diff --git a/gone.txt b/gone.txt
deleted file mode 100644
index 3333333..0000000
--- a/gone.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
diff --git a/new/dir/x.py b/new/dir/x.py
new file mode 100755
index 0000000..4444444
--- /dev/null
+++ b/new/dir/x.py
@@ -0,0 +1,2 @@
+#!/usr/bin/env python3
+print('x')
diff --git a/run.sh b/run.sh
old mode 100644
new mode 100755
diff --git a/a.txt b/b.txt
similarity index 90%
rename from a.txt
rename to b.txt
index 2222222..5555555 100644
--- a/a.txt
+++ b/b.txt
@@ -1,3 +1,4 @@
 one
 two
 three
+four
";
    let s = apply_text(t, patch).unwrap();
    assert_eq!(
        s,
        ApplySummary {
            files_changed: 5,
            insertions: 4,
            deletions: 2
        }
    );
    assert!(!t.join("a.txt").exists());
    assert_eq!(
        fs::read_to_string(t.join("b.txt")).unwrap(),
        "one\ntwo\nthree\nfour\n"
    );
    assert!(!t.join("gone.txt").exists());
    let x = t.join("new/dir/x.py");
    assert_eq!(
        fs::read_to_string(&x).unwrap(),
        "#!/usr/bin/env python3\nprint('x')\n"
    );
    assert_eq!(
        fs::metadata(&x).unwrap().permissions().mode() & 0o777,
        0o755
    );
    assert_eq!(
        fs::metadata(t.join("run.sh")).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let leftovers: Vec<_> = fs::read_dir(t)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(leftovers
        .iter()
        .all(|n| !n.to_string_lossy().starts_with(".fork-apply-")));

    // again: the first entry (a.txt) is gone now
    let err = apply_text(t, patch).unwrap_err();
    assert!(matches!(err, ApplyError::File { .. }), "{err}");
    assert!(err.to_string().contains("a.txt: does not exist"), "{err}");
}

#[test]
fn file_state_errors() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path();
    fs::write(t.join("exists.txt"), "other\n").unwrap();
    let create = "--- /dev/null\n+++ b/exists.txt\n@@ -0,0 +1 @@\n+new\n";
    let err = apply_text(t, create).unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    fs::write(t.join("exists.txt"), "new\n").unwrap();
    let err = apply_text(t, create).unwrap_err();
    assert!(matches!(err, ApplyError::AlreadyApplied { .. }), "{err}");

    let delete_partial = "--- a/exists.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-new\n";
    fs::write(t.join("exists.txt"), "new\nmore\n").unwrap();
    let err = apply_text(t, delete_partial).unwrap_err();
    assert!(matches!(err, ApplyError::HunkMismatch { .. }), "{err}");

    let outside = "--- a/../x\n+++ b/../x\n@@ -1 +1 @@\n-a\n+b\n";
    let err = apply_text(t, outside).unwrap_err();
    assert!(matches!(err, ApplyError::UnsafePath { .. }), "{err}");

    std::os::unix::fs::symlink("/tmp", t.join("link")).unwrap();
    let through = "--- /dev/null\n+++ b/link/evil\n@@ -0,0 +1 @@\n+x\n";
    let err = apply_text(t, through).unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");

    let binary = fs::read(root().join("fixtures/patches/adds-binary.diff")).unwrap();
    let err = apply(t, &parse(&binary).unwrap()).unwrap_err();
    assert!(err.to_string().contains("binary"), "{err}");
}

#[test]
fn one_file_has_one_key_in_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path();
    fs::create_dir(t.join("d")).unwrap();
    fs::write(t.join("d/f"), "a\nb\nc\n").unwrap();
    // F4: `d//f` would have been planned beside `d/f`, one half overwriting the other.
    let aliased = "--- a/d//f\n+++ b/d//f\n@@ -1 +1 @@\n-a\n+A\n";
    let err = apply_text(t, aliased).unwrap_err();
    assert!(matches!(err, ApplyError::UnsafePath { .. }), "{err}");
    assert!(err.to_string().contains("empty path component"), "{err}");
    let dotted = "--- a/d/./f\n+++ b/d/./f\n@@ -1 +1 @@\n-a\n+A\n";
    assert!(matches!(
        apply_text(t, dotted).unwrap_err(),
        ApplyError::UnsafePath { .. }
    ));
    // `./d/f` and `d/f` are one file: the two entries apply in turn, as git applies them.
    let both = "--- a/./d/f\n+++ b/./d/f\n@@ -1,3 +1,3 @@\n-a\n+A\n b\n c\n--- a/d/f\n+++ b/d/f\n@@ -1,3 +1,3 @@\n A\n b\n-c\n+C\n";
    apply_text(t, both).unwrap();
    assert_eq!(fs::read_to_string(t.join("d/f")).unwrap(), "A\nb\nC\n");
}

#[test]
fn start_and_end_anchors_and_ambiguous_context() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path();
    // a hunk at line 1 must match at the start, not further down
    fs::write(t.join("f"), "x\na\nb\nc\n").unwrap();
    let at_start = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n-a\n+A\n b\n";
    let err = apply_text(t, at_start).unwrap_err();
    assert!(
        matches!(err, ApplyError::HunkMismatch { hunk: 1, .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("line 1: expected `a`, found `x`"),
        "{err}"
    );
    // no trailing context: must match at the end
    let at_end = "--- a/f\n+++ b/f\n@@ -2,2 +2,2 @@\n a\n-b\n+B\n";
    let err = apply_text(t, at_end).unwrap_err();
    assert!(matches!(err, ApplyError::HunkMismatch { .. }), "{err}");
    // repeated blocks: the nearest to the header's position wins
    fs::write(t.join("g"), "k\nv\nk\nv\nk\nv\nk\nv\n").unwrap();
    let near = "--- a/g\n+++ b/g\n@@ -5,3 +5,3 @@\n k\n-v\n+V\n k\n";
    apply_text(t, near).unwrap();
    assert_eq!(
        fs::read_to_string(t.join("g")).unwrap(),
        "k\nv\nk\nv\nk\nV\nk\nv\n"
    );
}

/// A file of a test tree: path, content, and whether it is executable.
type TestFile<'a> = (&'a str, &'a str, bool);
/// A tree after a patch: each file's content and executable bit, or why it was refused.
type Outcome = Result<BTreeMap<String, (String, bool)>, String>;

fn plant(dir: &Path, files: &[TestFile]) {
    for (path, content, exec) in files {
        let full = dir.join(path);
        fs::create_dir_all(full.parent().unwrap()).unwrap();
        fs::write(&full, content).unwrap();
        let perm = if *exec { 0o755 } else { 0o644 };
        fs::set_permissions(&full, fs::Permissions::from_mode(perm)).unwrap();
    }
}

fn outcome_of(dir: &Path) -> BTreeMap<String, (String, bool)> {
    snapshot(dir)
        .into_iter()
        .filter(|(p, _)| !p.starts_with(".git"))
        .map(|(p, (bytes, mode))| {
            let text = String::from_utf8(bytes).unwrap();
            (p.to_string_lossy().into_owned(), (text, mode & 0o100 != 0))
        })
        .collect()
}

/// What fork's parser and applier make of `patch` on a tree holding `files`.
fn fork_outcome(files: &[TestFile], patch: &str) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    plant(dir.path(), files);
    let parsed = parse(patch.as_bytes()).map_err(|e| e.to_string())?;
    apply(dir.path(), &parsed).map_err(|e| e.to_string())?;
    Ok(outcome_of(dir.path()))
}

/// What real `git apply` (no options, no user or system configuration) makes of `patch`
/// in a repository holding `files`; `None` when git cannot be run here.
fn git_outcome(files: &[TestFile], patch: &str) -> Option<Outcome> {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    fs::create_dir(&repo).unwrap();
    let patch_file = dir.path().join("change.diff");
    fs::write(&patch_file, patch).unwrap();
    let git = |args: &[&std::ffi::OsStr]| {
        Command::new("git")
            .args(args)
            .current_dir(&repo)
            .env("HOME", dir.path())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
    };
    let init = git(&["init".as_ref(), "-q".as_ref()]).ok()?;
    if !init.status.success() {
        return None;
    }
    plant(&repo, files);
    let out = git(&["apply".as_ref(), patch_file.as_os_str()]).ok()?;
    Some(if out.status.success() {
        Ok(outcome_of(&repo))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    })
}

/// One differential case: the tree before, the patch, and the tree `git apply` leaves
/// (checked against real `git apply` when git is installed), or `None` when git refuses.
struct GitCase<'a> {
    name: &'a str,
    files: &'a [TestFile<'a>],
    patch: &'a str,
    git: Option<&'a [TestFile<'a>]>,
}

/// Runs every case and reports all that disagree, so one run shows each broken rule.
fn check_against_git(cases: &[GitCase]) {
    let mut wrong = Vec::new();
    for c in cases {
        let expected: Option<BTreeMap<String, (String, bool)>> = c.git.map(|files| {
            files
                .iter()
                .map(|(p, t, x)| (p.to_string(), (t.to_string(), *x)))
                .collect()
        });
        if let Some(real) = git_outcome(c.files, c.patch) {
            assert_eq!(
                real.as_ref().ok(),
                expected.as_ref(),
                "{}: the test's expectation is not what real `git apply` does: {real:?}",
                c.name
            );
        }
        let fork = fork_outcome(c.files, c.patch);
        if fork.as_ref().ok() != expected.as_ref() {
            wrong.push(format!(
                "{}:\n  git apply: {expected:?}\n  fork:      {fork:?}",
                c.name
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "fork's tree differs from git apply's:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn hunks_land_where_git_apply_puts_them() {
    check_against_git(&[
        GitCase {
            // The reviewer's case: the context is in the file twice; git searches from
            // the hunk's new start (line 7), not its old start (line 2).
            name: "repeated context, new start names the second copy",
            files: &[("f", "a\nctx A\nctx B\nb\nc\nd\nctx A\nctx B\ne\n", false)],
            patch: "--- a/f\n+++ b/f\n@@ -2,2 +7,3 @@\n ctx A\n+NEW\n ctx B\n",
            git: Some(&[(
                "f",
                "a\nctx A\nctx B\nb\nc\nd\nctx A\nNEW\nctx B\ne\n",
                false,
            )]),
        },
        GitCase {
            // An earlier hunk found 5 lines off does not move where git looks for the next.
            name: "no drift from an earlier hunk's offset",
            files: &[(
                "f",
                "p1\np2\np3\np4\np5\nh0\nh1\nh2\nh3\nK\nL\nm\nm\nm\nK\nL\nz\n",
                false,
            )],
            patch: "--- a/f\n+++ b/f\n@@ -2,2 +2,3 @@\n h1\n+NEW1\n h2\n\
                    @@ -10,2 +11,3 @@\n K\n+NEW2\n L\n",
            git: Some(&[(
                "f",
                "p1\np2\np3\np4\np5\nh0\nh1\nNEW1\nh2\nh3\nK\nNEW2\nL\nm\nm\nm\nK\nL\nz\n",
                false,
            )]),
        },
        GitCase {
            // git only forbids reusing lines an earlier hunk wrote; a later hunk may land
            // before an earlier one.
            name: "a later hunk may land before an earlier one",
            files: &[("f", "A\nB\nx1\nx2\nx3\nx4\nC\nD\nE\n", false)],
            patch: "--- a/f\n+++ b/f\n@@ -7,2 +7,3 @@\n C\n+NEW1\n D\n\
                    @@ -20,2 +21,3 @@\n A\n+NEW2\n B\n",
            git: Some(&[("f", "A\nNEW2\nB\nx1\nx2\nx3\nx4\nC\nNEW1\nD\nE\n", false)]),
        },
        GitCase {
            // Old start 1 anchors at the top even without old lines; no trailing context
            // anchors at the end: only an empty file satisfies both.
            name: "a context-less insertion at old line 1",
            files: &[("f", "a\nb\nc\n", false)],
            patch: "--- a/f\n+++ b/f\n@@ -1,0 +2 @@\n+NEW\n",
            git: None,
        },
        GitCase {
            name: "repeated blocks, the nearest to the new start wins (ties go forward)",
            files: &[("g", "k\nv\nk\nv\nk\nv\nk\nv\nk\n", false)],
            patch: "--- a/g\n+++ b/g\n@@ -3,3 +4,3 @@\n k\n-v\n+V\n k\n",
            git: Some(&[("g", "k\nv\nk\nv\nk\nV\nk\nv\nk\n", false)]),
        },
    ]);
}

/// A `run.sh` entry with the header lines `$hdr` and one hunk (`echo hi` -> `echo hello`).
macro_rules! run_sh {
    ($hdr:literal) => {
        concat!(
            "diff --git a/run.sh b/run.sh\n",
            $hdr,
            "--- a/run.sh\n+++ b/run.sh\n@@ -1 +1 @@\n-echo hi\n+echo hello\n"
        )
    };
}

#[test]
fn modes_change_as_git_apply_changes_them() {
    let plain: &[TestFile] = &[("run.sh", "echo hi\n", false)];
    let exec: &[TestFile] = &[("run.sh", "echo hi\n", true)];
    check_against_git(&[
        GitCase {
            // The reviewer's case: git applies the new mode; fork used to ignore it.
            name: "`new mode 100755` without `old mode`",
            files: plain,
            patch: run_sh!("new mode 100755\n"),
            git: Some(&[("run.sh", "echo hello\n", true)]),
        },
        GitCase {
            name: "`new mode 100644` without `old mode`",
            files: exec,
            patch: run_sh!("new mode 100644\n"),
            git: Some(&[("run.sh", "echo hello\n", false)]),
        },
        GitCase {
            // git writes the new mode whatever the old one says.
            name: "`old mode` equal to `new mode`: the new mode still applies",
            files: plain,
            patch: run_sh!("old mode 100755\nnew mode 100755\n"),
            git: Some(&[("run.sh", "echo hello\n", true)]),
        },
        GitCase {
            name: "the index line's mode is the old mode only",
            files: exec,
            patch: run_sh!("index 1111111..2222222 100644\n"),
            git: Some(&[("run.sh", "echo hello\n", true)]),
        },
        GitCase {
            // Without hunks, git changes a mode only when it knows both modes and they
            // differ (else "patch with only garbage").
            name: "index mode and `new mode`, no hunks",
            files: plain,
            patch: "diff --git a/run.sh b/run.sh\nindex 1111111..1111111 100644\nnew mode 100755\n",
            git: Some(&[("run.sh", "echo hi\n", true)]),
        },
        GitCase {
            name: "`old mode` equal to `new mode`, no hunks",
            files: plain,
            patch: "diff --git a/run.sh b/run.sh\nold mode 100755\nnew mode 100755\n",
            git: None,
        },
        GitCase {
            // git tests the owner's execute bit (mode & 0100), nothing else.
            name: "new file mode 100010 is not executable",
            files: &[("keep.txt", "a\n", false)],
            patch: "diff --git a/n.sh b/n.sh\nnew file mode 100010\n--- /dev/null\n+++ b/n.sh\n\
                    @@ -0,0 +1 @@\n+x\n",
            git: Some(&[("keep.txt", "a\n", false), ("n.sh", "x\n", false)]),
        },
    ]);
}
