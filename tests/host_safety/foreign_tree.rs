//! A tree another user owns (a `fork run --workspace`, a runtime's source and tools) is
//! read by a root fork only as far as that user could: a directory its owner cannot list
//! and search is refused, named, as a file its owner cannot read is (exit 65), and nothing
//! beneath it reaches a sandbox.

use super::*;

const NOBODY: u32 = 65534;

/// Gives `dir` and everything beneath it to `uid` (and its group), not following links.
fn chown_tree(dir: &Path, uid: u32) {
    std::os::unix::fs::lchown(dir, Some(uid), Some(uid)).unwrap();
    if std::fs::symlink_metadata(dir).unwrap().is_dir() {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            chown_tree(&e.path(), uid);
        }
    }
}

/// The directory `parent/name`, root's, of mode `mode`, holding `key.txt` (root's, 0644:
/// readable by anyone who reaches it) with the secret.
fn closed_dir(parent: &Path, name: &str, mode: u32) {
    let d = parent.join(name);
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("key.txt"), SECRET).unwrap();
    std::fs::set_permissions(d.join("key.txt"), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `fork run --workspace ws` as root, `ws` uid 65534's: a root-only directory in it (0700)
/// and one the owner may search but not list (0711) are refused with exit 65, naming the
/// directory, and the successor never runs (the secret beneath is never printed); a
/// root-only file is refused with the same exit; the owner's own closed directory (0700,
/// its own) is copied in and read.
#[test]
fn a_foreign_workspace_is_entered_only_as_its_owner_could() {
    need_root!();
    for (name, mode) in [("secret", 0o700), ("search-only", 0o711)] {
        let ws = scratch("ws-foreign-dir");
        closed_dir(&ws, name, mode);
        std::os::unix::fs::lchown(&ws, Some(NOBODY), Some(NOBODY)).unwrap();
        let r = run(
            &["--workspace", ws.to_str().unwrap()],
            &["cat", &format!("/tmp/successor/{name}/key.txt")],
        );
        assert!(!r.stdout.contains(SECRET), "{name}: printed: {}", r.stdout);
        assert_eq!(r.code, 65, "{name}: {}", r.stderr);
        for want in ["--workspace", name, "directory", "uid 65534"] {
            assert!(r.stderr.contains(want), "{name}: {want}: {}", r.stderr);
        }
    }
    // A root-only file: the refusal the directories share (exit 65).
    let ws = scratch("ws-foreign-file");
    std::fs::write(ws.join("key.txt"), SECRET).unwrap();
    std::fs::set_permissions(ws.join("key.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::lchown(&ws, Some(NOBODY), Some(NOBODY)).unwrap();
    let r = run(
        &["--workspace", ws.to_str().unwrap()],
        &["cat", "/tmp/successor/key.txt"],
    );
    assert_eq!(r.code, 65, "{}", r.stderr);
    assert!(!r.stdout.contains(SECRET), "{}", r.stdout);
    // The owner's own directory, closed to everyone else: read.
    let ws = scratch("ws-own-dir");
    std::fs::create_dir(ws.join("mine")).unwrap();
    std::fs::write(ws.join("mine/own.txt"), "own-words").unwrap();
    chown_tree(&ws, NOBODY);
    std::fs::set_permissions(ws.join("mine"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let r = run(
        &["--workspace", ws.to_str().unwrap()],
        &["cat", "/tmp/successor/mine/own.txt"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("own-words"), "{}", r.stdout);
}

/// `fork evaluate` as root on a runtime uid 65534 owns, whose source holds a root-only
/// directory (0700) with a world-readable file: refused as bad input (exit 65) naming the
/// directory, before any sandbox reads it; no bundle, and the secret nowhere in the run
/// root. The same directory opened to the owner (0755) evaluates.
#[test]
fn a_foreign_runtimes_source_is_entered_only_as_its_owner_could() {
    need_root!();
    let env = common::lifecycle::Env::new("hs-tree-owner");
    let rt = env.runtime(
        "rt",
        "\n[tasks.peek]\ncommand = [\"sh\", \"-c\", \
         \"cat hermes/private/key.txt > $FORK_REPORTS/peek.txt 2>&1; true\"]\n",
    );
    chown_tree(&rt, NOBODY);
    closed_dir(&rt.join("hermes"), "private", 0o700);
    let args = ["--task", "peek", "--no-ledger"];
    let patch = common::lifecycle::patch("noop-comment");
    let e = common::lifecycle::evaluate(&env, &patch, &rt, "closed-dir", &args);
    assert_eq!(e.code, 65, "{}", e.ctx());
    for want in ["private", "directory", "uid 65534"] {
        assert!(e.stderr.contains(want), "{want}: {}", e.ctx());
    }
    assert!(!e.out.exists(), "no bundle: {}", e.ctx());
    let private = rt.join("hermes/private");
    let found: Vec<PathBuf> = holds_secret(&env.dir)
        .into_iter()
        .filter(|p| !p.starts_with(&private))
        .collect();
    assert!(found.is_empty(), "the secret was copied to {found:?}");
    std::fs::set_permissions(
        rt.join("hermes/private"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let e = common::lifecycle::evaluate(&env, &patch, &rt, "opened-dir", &args);
    assert_eq!(e.code, 0, "{}", e.ctx());
}
