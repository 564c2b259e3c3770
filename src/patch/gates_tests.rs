use super::*;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixture(name: &str) -> Vec<u8> {
    let p = root().join("fixtures/patches").join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn demo() -> PathBuf {
    root().join("fixtures/hermes-demo")
}

fn rules(protected: &[String]) -> PathRules<'_> {
    PathRules {
        protected,
        exclude: &[],
    }
}

fn protected() -> Vec<String> {
    ["tests/**", "bench/**", "fork.toml"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// The gates' decision as an outcome (the tests compare outcomes).
fn outcome(r: &Result<Patch, GateStop>) -> GateOutcome {
    match r {
        Ok(_) => GateOutcome::Passed,
        Err(GateStop { gate, reason }) => GateOutcome::Stopped {
            gate: *gate,
            reason: reason.clone(),
        },
    }
}

fn check(raw: &[u8], prot: &[String], policy: &GatePolicy) -> GateOutcome {
    outcome(&check_patch(raw, rules(prot), &demo(), policy))
}

fn gate(name: &str, policy: &GatePolicy) -> GateOutcome {
    check(&fixture(name), &protected(), policy)
}

fn stopped_by(out: &GateOutcome) -> (&'static str, String) {
    match out {
        GateOutcome::Stopped { gate, reason } => (gate.name(), reason.clone()),
        GateOutcome::Passed => ("passed", String::new()),
    }
}

#[test]
fn benign_and_hostile_but_disguised_fixtures_pass() {
    let policy = GatePolicy::default();
    for name in [
        "swap-compressor.diff",
        "breaks-test.diff",
        "does-not-apply.diff",
        "noop-comment.diff",
        // Passes on purpose: it spells its targets piece by piece; the sandbox,
        // not the gates, must contain it.
        "hostile-escape.diff",
    ] {
        assert_eq!(gate(name, &policy), GateOutcome::Passed, "{name}");
    }
}

#[test]
fn size_gate_runs_first() {
    let policy = GatePolicy {
        max_patch_bytes: 1000,
        ..GatePolicy::default()
    };
    let (g, reason) = stopped_by(&gate("swap-compressor.diff", &policy));
    assert_eq!(g, "size");
    assert!(
        reason.contains("over the policy's gates.max_patch_bytes of 1000"),
        "{reason}"
    );
    // size wins even over a patch that would also fail later gates
    let raw = [fixture("path-traversal.diff"), vec![b'\n'; 1000]].concat();
    let r = check_patch(&raw, rules(&protected()), &demo(), &policy);
    assert_eq!(outcome(&r).gate(), Some(Gate::Size));
    assert!(r.is_err(), "a stopped patch carries no parsed patch");
    assert_eq!(gate("noop-comment.diff", &policy), GateOutcome::Passed);
}

#[test]
fn parse_gate_reports_the_parser_error() {
    let raw = fixture("swap-compressor.diff");
    let cut = &raw[..raw.len() / 2];
    let r = check_patch(cut, rules(&protected()), &demo(), &GatePolicy::default());
    let (out, parsed) = (outcome(&r), r.ok());
    let (g, reason) = stopped_by(&out);
    assert_eq!(g, "parse");
    assert!(reason.contains("patch line"), "{reason}");
    assert!(parsed.is_none());
    let empty = Patch { files: Vec::new() };
    let out = run_gates(
        b"",
        &empty,
        rules(&protected()),
        &demo(),
        &GatePolicy::default(),
    );
    assert_eq!(out.gate(), Some(Gate::Parse));
}

#[test]
fn path_escape_gate_on_traversal_absolute_and_symlinks() {
    let (g, reason) = stopped_by(&gate("path-traversal.diff", &GatePolicy::default()));
    assert_eq!(g, "path_escape");
    assert!(
        reason.contains("`../escaped.txt`") && reason.contains("escapes the tree"),
        "{reason}"
    );

    let abs = b"--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-a\n+b\n";
    let out = check(abs, &[], &GatePolicy::default());
    assert!(stopped_by(&out).1.contains("absolute path"), "{out:?}");

    // A tree where `hermes` is a symlink: swap-compressor would write through it.
    let tmp = tempfile::tempdir().unwrap();
    let real = tmp.path().join("elsewhere");
    std::fs::create_dir(&real).unwrap();
    let tree = tmp.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    std::os::unix::fs::symlink(&real, tree.join("hermes")).unwrap();
    let out = outcome(&check_patch(
        &fixture("swap-compressor.diff"),
        rules(&protected()),
        &tree,
        &GatePolicy::default(),
    ));
    let (g, reason) = stopped_by(&out);
    assert_eq!(g, "path_escape");
    assert!(reason.contains("`hermes` is a symbolic link"), "{reason}");

    let link = b"diff --git a/l b/l\nnew file mode 120000\nindex 0000000..1111111\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+/etc/shadow\n\\ No newline at end of file\n";
    let out = check(link, &[], &GatePolicy::default());
    assert!(
        stopped_by(&out).1.contains("symbolic link (mode 120000)"),
        "{out:?}"
    );
}

#[test]
fn check_path_cases() {
    let d = demo();
    assert!(check_path(&d, "hermes/compressor.py").is_ok());
    assert!(check_path(&d, "./hermes/new/file.py").is_ok());
    assert!(check_path(&d, "hermes/../../x").is_err());
    assert!(check_path(&d, "/abs").is_err());
    assert!(check_path(&d, "").is_err());
    assert!(check_path(&d, ".").is_err());
}

#[test]
fn protected_path_gate_matches_old_and_new_paths() {
    let (g, reason) = stopped_by(&gate("touches-protected.diff", &GatePolicy::default()));
    assert_eq!(g, "protected_path");
    assert!(
        reason.contains("`tests/test_compressor.py`") && reason.contains("`tests/**`"),
        "{reason}"
    );

    // renaming a protected file away is caught through its old path
    let rename = b"diff --git a/fork.toml b/not-the-manifest.toml\nsimilarity index 100%\nrename from fork.toml\nrename to not-the-manifest.toml\n";
    let out = check(rename, &protected(), &GatePolicy::default());
    assert!(stopped_by(&out).1.contains("`fork.toml`"), "{out:?}");

    // `*` does not cross directories; `./` is normalized away
    let prot = vec!["bench/*.py".to_string()];
    let deep = b"--- a/bench/sub/x.py\n+++ b/bench/sub/x.py\n@@ -1 +1 @@\n-a\n+b\n";
    assert!(check(deep, &prot, &GatePolicy::default()).is_passed());
    let dotted = b"--- a/./bench/x.py\n+++ b/./bench/x.py\n@@ -1 +1 @@\n-a\n+b\n";
    assert_eq!(
        check(dotted, &prot, &GatePolicy::default()).gate(),
        Some(Gate::ProtectedPath)
    );

    let bad = vec!["tests/[".to_string()];
    let out = gate_with(&fixture("noop-comment.diff"), &bad);
    assert!(stopped_by(&out).1.contains("not a valid glob"), "{out:?}");
}

/// A pattern naming one path protects what lies beneath it when it is a directory, and is
/// read as paths are (`./judge/` is `judge`); the stop names the pattern as written.
#[test]
fn a_named_directory_protects_everything_it_holds() {
    let under = b"--- a/judge/score.py\n+++ b/judge/score.py\n@@ -1 +1 @@\n-a\n+b\n";
    let fork_toml = b"--- a/fork.toml\n+++ b/fork.toml\n@@ -1 +1 @@\n-a\n+b\n";
    for spelled in ["judge", "./judge/", "judge/"] {
        let prot = vec![spelled.to_string()];
        let (g, reason) = stopped_by(&gate_with(under, &prot));
        assert_eq!(g, "protected_path", "{spelled}");
        assert!(
            reason.contains(&format!("pattern `{spelled}`")),
            "{spelled}: {reason}"
        );
    }
    let prot = vec!["./fork.toml".to_string()];
    assert_eq!(
        gate_with(fork_toml, &prot).gate(),
        Some(Gate::ProtectedPath)
    );
    // A sibling sharing the name's prefix is not beneath it.
    let sibling = b"--- a/judgement.py\n+++ b/judgement.py\n@@ -1 +1 @@\n-a\n+b\n";
    assert!(gate_with(sibling, &["judge".to_string()]).is_passed());
    assert_eq!(
        protected_globs(&["./judge/".to_string(), "**/*.lock".to_string()]),
        vec![
            ("judge/**".to_string(), 0),
            ("judge".to_string(), 0),
            ("**/*.lock".to_string(), 1)
        ]
    );
}

fn gate_with(raw: &[u8], prot: &[String]) -> GateOutcome {
    check(raw, prot, &GatePolicy::default())
}

#[test]
fn binary_gate_and_its_switch() {
    let (g, reason) = stopped_by(&gate("adds-binary.diff", &GatePolicy::default()));
    assert_eq!(g, "binary");
    assert!(reason.contains("tools/icon.bin"), "{reason}");
    let allow = GatePolicy {
        allow_binary: true,
        ..GatePolicy::default()
    };
    assert!(gate("adds-binary.diff", &allow).is_passed());
}

#[test]
fn forbidden_content_only_in_added_lines() {
    let (g, reason) = stopped_by(&gate("reads-node-key.diff", &GatePolicy::default()));
    assert_eq!(g, "forbidden_content");
    assert!(
        reason.contains("`.config/fork`") && reason.contains("hermes/runtime.py"),
        "{reason}"
    );
    // the reported patch line really is the offending line
    let raw = fixture("reads-node-key.diff");
    let text = String::from_utf8_lossy(&raw);
    let n: usize = reason
        .split("patch line ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .unwrap();
    assert!(text.lines().nth(n - 1).unwrap().contains(".config/fork"));

    // custom pattern on a fixture; removed and context lines do not count
    let policy = GatePolicy {
        forbidden_patterns: vec!["manifest or module".into()],
        ..GatePolicy::default()
    };
    assert_eq!(
        gate("noop-comment.diff", &policy).gate(),
        Some(Gate::ForbiddenContent)
    );
    let policy = GatePolicy {
        forbidden_patterns: vec!["class RegistryError".into()],
        ..GatePolicy::default()
    };
    assert!(gate("noop-comment.diff", &policy).is_passed());
    let removal = b"--- a/x\n+++ b/x\n@@ -1,2 +1 @@\n keep\n-path = '~/.config/fork/node.key'\n";
    assert!(check(removal, &[], &GatePolicy::default()).is_passed());
}

#[test]
fn gate_order_protected_before_binary_before_content() {
    // touches a protected path and adds a forbidden string: protected wins
    let raw = b"--- a/tests/x.py\n+++ b/tests/x.py\n@@ -1 +1 @@\n-a\n+open('node.key')\n";
    assert_eq!(
        check(raw, &protected(), &GatePolicy::default()).gate(),
        Some(Gate::ProtectedPath)
    );
    let both = [fixture("adds-binary.diff"), fixture("reads-node-key.diff")].concat();
    assert_eq!(
        check(&both, &protected(), &GatePolicy::default()).gate(),
        Some(Gate::Binary)
    );
}

fn hack(name: &str) -> Vec<u8> {
    fixture(&format!("hacks/{name}"))
}

/// A one-hunk modification of `path` (as written after `a/`/`b/`).
fn modify(path: &str, add: &str) -> String {
    format!("diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-a\n+{add}\n")
}

#[test]
fn path_escape_refuses_every_spelling_git_would_resolve_otherwise() {
    let policy = GatePolicy::default();
    // F4: `hermes//compressor.py` beside `hermes/compressor.py`.
    let (g, reason) = stopped_by(&check(&hack("dup-path.diff"), &protected(), &policy));
    assert_eq!(g, "path_escape");
    assert!(
        reason.contains("`hermes//compressor.py`") && reason.contains("empty path component"),
        "{reason}"
    );
    for (path, why) in [
        ("hermes/./compressor.py", "`.` component"),
        ("hermes/sub/../../../x", "`..` component"),
        ("hermes/", "empty path component"),
        (".git/hooks/pre-commit", "`.git` component"),
        ("hermes/.Git/config", "`.git` component"),
    ] {
        let (g, reason) = stopped_by(&check(modify(path, "b").as_bytes(), &[], &policy));
        assert_eq!(g, "path_escape", "{path}");
        assert!(reason.contains(why), "{path}: {reason}");
    }
    // A leading `./` is normalised, not refused: `./hermes/x.py` is `hermes/x.py`.
    let p = check_patch(
        modify("./hermes/x.py", "b").as_bytes(),
        rules(&[]),
        &demo(),
        &policy,
    )
    .unwrap();
    assert_eq!(p.files[0].path(), "hermes/x.py");
}

#[test]
fn path_collision_gate_on_duplicates_and_case() {
    let policy = GatePolicy::default();
    // the same path twice, once spelled with a leading `./`
    let dup = format!(
        "{}{}",
        modify("hermes/compressor.py", "b"),
        modify("./hermes/compressor.py", "c")
    );
    let (g, reason) = stopped_by(&check(dup.as_bytes(), &[], &policy));
    assert_eq!(g, "path_collision");
    assert!(
        reason.contains("named by two entries") && reason.contains("patch lines 1 and 7"),
        "{reason}"
    );
    // two spellings that differ only in case
    let case = format!(
        "{}{}",
        modify("hermes/Foo.py", "b"),
        modify("hermes/foo.py", "c")
    );
    let (g, reason) = stopped_by(&check(case.as_bytes(), &[], &policy));
    assert_eq!(g, "path_collision");
    assert!(reason.contains("differ only in case"), "{reason}");
    // a new file whose name is an existing file's but for case (and a directory's)
    for path in ["hermes/Compressor.py", "HERMES/new.py"] {
        let create = format!(
            "diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+x\n"
        );
        let (g, reason) = stopped_by(&check(create.as_bytes(), &[], &policy));
        assert_eq!(g, "path_collision", "{path}");
        assert!(reason.contains("differs only in case from `"), "{reason}");
    }
    // a rename that only changes case
    let rename = b"diff --git a/hermes/state.py b/hermes/State.py\nsimilarity index 100%\nrename from hermes/state.py\nrename to hermes/State.py\n";
    assert_eq!(
        check(rename, &[], &policy).gate(),
        Some(Gate::PathCollision)
    );
    // distinct files pass
    let two = format!(
        "{}{}",
        modify("hermes/a.py", "b"),
        modify("hermes/b.py", "c")
    );
    assert!(check(two.as_bytes(), &[], &policy).is_passed());
}

#[test]
fn excluded_paths_are_protected() {
    let excl = vec!["state".to_string(), "__pycache__/".to_string()];
    let r = PathRules {
        protected: &[],
        exclude: &excl,
    };
    for path in ["state/evil.py", "__pycache__/x.py", "state"] {
        let out = outcome(&check_patch(
            modify(path, "b").as_bytes(),
            r,
            &demo(),
            &GatePolicy::default(),
        ));
        let (g, reason) = stopped_by(&out);
        assert_eq!(g, "protected_path", "{path}");
        assert!(reason.contains("exclude"), "{reason}");
    }
    let ok = check_patch(
        modify("hermes/state.py", "b").as_bytes(),
        r,
        &demo(),
        &GatePolicy::default(),
    );
    assert!(ok.is_ok());
}

#[test]
fn binary_content_in_a_text_hunk_is_binary() {
    let policy = GatePolicy::default();
    // F6: NUL bytes and invalid UTF-8 in `+` lines, creating hermes/turbo.pyc.
    let (g, reason) = stopped_by(&check(&hack("binary-as-text.diff"), &protected(), &policy));
    assert_eq!(g, "binary");
    assert!(reason.contains("hermes/turbo.pyc"), "{reason}");
    // the content alone, under a harmless name
    let raw = hack("binary-as-text.diff");
    let text = replace_all(&raw, b"hermes/turbo.pyc", b"hermes/turbo.txt");
    let (g, reason) = stopped_by(&check(&text, &[], &policy));
    assert_eq!(g, "binary");
    assert!(
        reason.contains("not UTF-8") && reason.contains("patch line 7"),
        "{reason}"
    );
    let nul = b"--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+a\x00b\n";
    let (g, reason) = stopped_by(&check(nul, &[], &policy));
    assert_eq!(g, "binary");
    assert!(
        reason.contains("NUL byte") && reason.contains("patch line 5"),
        "{reason}"
    );
    let latin1 = b"--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+caf\xe9\n";
    let (g, reason) = stopped_by(&check(latin1, &[], &policy));
    assert_eq!(g, "binary");
    assert!(reason.contains("not UTF-8"), "{reason}");
    // removed and context lines count too: the file is binary either way
    let ctx = b"--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n \x00\n-a\n+b\n";
    assert_eq!(check(ctx, &[], &policy).gate(), Some(Gate::Binary));
    // an opaque extension, with perfectly textual content; also as a rename target
    for path in ["hermes/fast.so", "lib/libz.so.1", "pkg/tool.WHL", "x.class"] {
        let (g, reason) = stopped_by(&check(modify(path, "b").as_bytes(), &[], &policy));
        assert_eq!(g, "binary", "{path}");
        assert!(reason.contains("compiled or packaged"), "{reason}");
    }
    let rename = b"diff --git a/hermes/registry.py b/hermes/registry.pyc\nsimilarity index 100%\nrename from hermes/registry.py\nrename to hermes/registry.pyc\n";
    assert_eq!(check(rename, &[], &policy).gate(), Some(Gate::Binary));
    // deleting an opaque file is not adding one; `.solution.py` is not `.so`
    let del = b"diff --git a/old.pyc b/old.pyc\ndeleted file mode 100644\n--- a/old.pyc\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n";
    assert!(check(del, &[], &policy).is_passed());
    assert!(check(modify("hermes/so.py", "b").as_bytes(), &[], &policy).is_passed());
    // the switch lets all of it through
    let allow = GatePolicy {
        allow_binary: true,
        ..GatePolicy::default()
    };
    assert!(check(&hack("binary-as-text.diff"), &protected(), &allow).is_passed());
    assert!(check(latin1, &[], &allow).is_passed());
}

fn replace_all(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

#[test]
fn policy_serde_defaults_units_and_unknown_fields() {
    let p: GatePolicy = toml::from_str("").unwrap();
    assert_eq!(p, GatePolicy::default());
    let p: GatePolicy = toml::from_str("max_patch_bytes = \"64KiB\"\nallow_binary = true").unwrap();
    assert_eq!(p.max_patch_bytes, 64 << 10);
    assert!(p.allow_binary);
    assert_eq!(p.forbidden_patterns, default_forbidden_patterns());
    let p: GatePolicy = toml::from_str("max_patch_bytes = 4096").unwrap();
    assert_eq!(p.max_patch_bytes, 4096);
    let e = toml::from_str::<GatePolicy>("max_bytes = 1")
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field `max_bytes`"), "{e}");
    assert!(toml::from_str::<GatePolicy>("max_patch_bytes = \"lots\"").is_err());
    assert!(GatePolicy::default().validate().is_ok());
    let bad = GatePolicy {
        forbidden_patterns: vec![String::new()],
        ..GatePolicy::default()
    };
    assert!(bad
        .validate()
        .unwrap_err()
        .contains("forbidden_patterns[0]"));
}
