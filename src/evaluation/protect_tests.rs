//! Unit tests of `protect.rs` (binds, the snapshot, the check, the swapped-link race).

use super::*;

/// The copy's tmpfs (mounted when the tests run as root) detached when a test ends.
struct Unmount(PathBuf);
impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn file() -> Entry {
    Entry::File {
        sha256: "00".into(),
        size: 1,
        mode: 0o644,
    }
}

/// What the post-run check finds in `ws` against the snapshot in `stage`.
fn changes(stage: &Path, ws: &Path) -> Vec<(String, ChangeKind)> {
    check(stage, ws, &[])
        .unwrap()
        .into_iter()
        .map(|c| (c.path, c.change))
        .collect()
}

fn pats(p: &[&str]) -> Vec<String> {
    p.iter().map(|s| s.to_string()).collect()
}

#[test]
fn plan_binds_whole_dirs_exact_paths_and_each_glob_match() {
    let mut entries = BTreeMap::new();
    for f in [
        "tests/a.py",
        "tests/sub/b.py",
        "fork.toml",
        "x/y.lock",
        "z.lock",
        "tests/c.lock",
    ] {
        entries.insert(f.to_string(), file());
    }
    entries.insert(
        "link.lock".to_string(),
        Entry::Symlink {
            target: "z.lock".into(),
        },
    );
    let dirs = ["tests", "tests/sub", "x", "judge"];
    let files = ["fork.toml", "z.lock", "x/y.lock", "tests/c.lock"];
    let kind_of = |p: &str| {
        if dirs.contains(&p) {
            Some(true)
        } else if files.contains(&p) {
            Some(false)
        } else {
            None
        }
    };
    let b = plan_binds(
        &pats(&[
            "tests/**",
            "./judge/**",
            "fork.toml",
            "**/*.lock",
            "bench/**",
            "tests/sub",
            "missing.txt",
        ]),
        &entries,
        kind_of,
    );
    assert_eq!(
        b,
        vec![
            ("judge".to_string(), true),
            ("tests".to_string(), true),
            ("fork.toml".to_string(), false),
            ("x/y.lock".to_string(), false),
            ("z.lock".to_string(), false),
        ],
        "tests/sub and tests/c.lock are inside tests; bench and missing.txt do not exist; a symlink is never bound"
    );
}

#[test]
fn literal_prefixes() {
    assert_eq!(literal_prefix("tests/**"), "tests");
    assert_eq!(literal_prefix("fork.toml"), "fork.toml");
    assert_eq!(literal_prefix("**/*.lock"), "");
    assert_eq!(literal_prefix("a/b*/c"), "a");
}

#[test]
fn snapshot_then_check_finds_every_change() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let stage = tmp.path().join("stage");
    std::fs::create_dir_all(src.join("tests")).unwrap();
    std::fs::create_dir_all(&stage).unwrap();
    std::fs::write(src.join("tests/test_a.py"), "a").unwrap();
    std::fs::write(src.join("tests/test_b.py"), "b").unwrap();
    std::fs::write(src.join("fork.toml"), "m").unwrap();
    std::fs::write(src.join("code.py"), "c").unwrap();
    let patterns = pats(&["tests/**", "fork.toml", "**/*.lock"]);
    let _unmount = Unmount(stage.join(COPY_DIR));
    snapshot(&stage, tmp.path(), Path::new("src"), &patterns, &[]).unwrap();
    let b = binds(&stage).unwrap();
    assert_eq!(b.len(), 2, "{b:?}");
    assert_eq!(b[0].dst, PathBuf::from("/tmp/successor/src/tests"));
    // An untouched copy is clean.
    let ws = tmp.path().join("ws");
    crate::fork::workspace::copy_tree(&src, &ws, &[]).unwrap();
    assert!(check(&stage, &ws, &[]).unwrap().is_empty());
    // Modified, added (under a bound dir, and by a glob), removed; unprotected ignored.
    std::fs::write(ws.join("tests/test_a.py"), "A").unwrap();
    std::fs::write(ws.join("tests/conftest.py"), "").unwrap();
    std::fs::remove_file(ws.join("tests/test_b.py")).unwrap();
    std::fs::write(ws.join("deps.lock"), "").unwrap();
    std::fs::write(ws.join("code.py"), "changed").unwrap();
    assert_eq!(
        changes(&stage, &ws),
        vec![
            ("deps.lock".into(), ChangeKind::Added),
            ("tests/conftest.py".into(), ChangeKind::Added),
            ("tests/test_a.py".into(), ChangeKind::Modified),
            ("tests/test_b.py".into(), ChangeKind::Removed),
        ]
    );
    // A change to the served copy itself is found too.
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let ws2 = tmp.path().join("ws2");
    crate::fork::workspace::copy_tree(&src, &ws2, &[]).unwrap();
    let copied = stage.join(COPY_DIR).join("fork.toml");
    std::fs::set_permissions(&copied, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    std::fs::write(&copied, "changed").unwrap();
    let got = check(&stage, &ws2, &[]).unwrap();
    assert_eq!(
        got,
        vec![ProtectedChange {
            path: "fork.toml".into(),
            change: ChangeKind::Modified
        }]
    );
}
/// The parent's owner may swap a protected file for a link while the protected tree is
/// snapshotted (a swapped-entry race): the copy served to every sandbox must still hold only what
/// lay in the tree, never what a link points to (a root-run fork could read a root-only
/// file). Another thread swaps `tests/t.py` between a file and a link to a secret
/// outside the tree as fast as it can, while the tree is snapshotted again and again
/// (bounded in count and time). Every copy holds the file's own bytes or no file, and
/// the manifest's hash is of the bytes copied.
#[test]
fn a_protected_file_swapped_for_a_link_is_never_copied_through_it() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("tests")).unwrap();
    let secret = tmp.path().join("secret");
    std::fs::write(&secret, "SECRET-OUTSIDE-THE-TREE").unwrap();
    let file = src.join("tests/t.py");
    let (as_file, as_link) = (src.join("tests/.file"), src.join("tests/.link"));
    std::fs::write(&as_file, "the test").unwrap();
    std::os::unix::fs::symlink(&secret, &as_link).unwrap();
    std::fs::copy(&as_file, &file).unwrap();
    let patterns = pats(&["tests/*.py"]);
    let stop = AtomicBool::new(false);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let (mut taken, mut files) = (0, 0);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Hard links of the two names renamed over the file in turn: the path is
            // always there, now a file, now a link.
            let tmp_name = src.join("tests/.next");
            let mut link = false;
            while !stop.load(Ordering::Relaxed) {
                let _ = std::fs::remove_file(&tmp_name);
                let from = if link { &as_link } else { &as_file };
                if std::fs::hard_link(from, &tmp_name).is_ok() {
                    let _ = std::fs::rename(&tmp_name, &file);
                }
                link = !link;
            }
        });
        // The swapping thread stops however this loop ends (a failed assertion too).
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = Stop(&stop);
        for i in 0..300 {
            if std::time::Instant::now() > deadline {
                break;
            }
            let stage = tmp.path().join(format!("stage{i}"));
            std::fs::create_dir_all(&stage).unwrap();
            let _unmount = Unmount(stage.join(COPY_DIR));
            if snapshot(&stage, tmp.path(), Path::new("src"), &patterns, &[]).is_err() {
                continue;
            }
            taken += 1;
            let copied = stage.join(COPY_DIR).join("tests/t.py");
            let m = load(&stage).unwrap().unwrap();
            let entry = m.entries.get("tests/t.py");
            match std::fs::symlink_metadata(&copied) {
                // Seen as a link: copied as the link (never served: a one-level glob
                // binds regular files only), never as what it points to.
                Ok(md) if md.file_type().is_symlink() => {
                    assert!(matches!(entry, Some(Entry::Symlink { .. })), "run {i}");
                }
                Ok(_) => {
                    files += 1;
                    let bytes = std::fs::read(&copied).unwrap();
                    assert_eq!(
                        bytes, b"the test",
                        "run {i}: the copy holds what a link points to"
                    );
                    let Some(Entry::File { sha256, size, .. }) = entry else {
                        panic!("run {i}: a file copied for {entry:?}");
                    };
                    assert_eq!(*sha256, hex::encode(Sha256::digest(&bytes)), "run {i}");
                    assert_eq!(*size, bytes.len() as u64, "run {i}");
                }
                Err(_) => assert!(
                    !matches!(entry, Some(Entry::File { .. })),
                    "run {i}: {entry:?} not copied"
                ),
            }
        }
    });
    // Something was checked: snapshots were taken, some of them with the file in place.
    assert!(
        taken > 0 && files > 0,
        "{taken} snapshots, {files} with the file"
    );
}

/// The binds come from what the scan itself found, never from a second look by path: a
/// `dir/**` whose directory is a link, one beneath an excluded directory and an exact path
/// naming a FIFO are not bound (the link was followed before, the FIFO bound as a file that
/// was never copied); and a source whose path beneath the runtime directory has a link in
/// it is refused, not read through the link.
#[test]
fn binds_come_from_the_scan_and_a_linked_source_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = tmp.path().join("rt");
    let src = rt.join("src");
    std::fs::create_dir_all(src.join("tests")).unwrap();
    std::fs::write(src.join("tests/a.py"), "a").unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("x.py"), "not the parent's").unwrap();
    std::os::unix::fs::symlink(&elsewhere, src.join("linked")).unwrap();
    std::fs::create_dir_all(src.join("state/sub")).unwrap();
    std::fs::write(src.join("state/sub/y"), "excluded").unwrap();
    nix::unistd::mkfifo(&src.join("pipe"), Mode::from_bits_truncate(0o600)).unwrap();
    let patterns = pats(&["tests/**", "linked/**", "state/sub/**", "pipe"]);
    let exclude = pats(&["state"]);
    let stage = tmp.path().join("stage");
    std::fs::create_dir_all(&stage).unwrap();
    let _unmount = Unmount(stage.join(COPY_DIR));
    snapshot(&stage, &rt, Path::new("src"), &patterns, &exclude).unwrap();
    let m = load(&stage).unwrap().unwrap();
    assert_eq!(m.binds, vec![("tests".to_string(), true)]);
    let copy = stage.join(COPY_DIR);
    assert_eq!(std::fs::read(copy.join("tests/a.py")).unwrap(), b"a");
    for gone in ["linked", "state", "pipe"] {
        assert!(
            std::fs::symlink_metadata(copy.join(gone)).is_err(),
            "{gone} is in the copy"
        );
    }
    // The source named through a link beneath the runtime directory: refused.
    std::os::unix::fs::symlink("src", rt.join("alias")).unwrap();
    let stage2 = tmp.path().join("stage2");
    std::fs::create_dir_all(&stage2).unwrap();
    let _unmount2 = Unmount(stage2.join(COPY_DIR));
    let err = snapshot(&stage2, &rt, Path::new("alias"), &patterns, &exclude).unwrap_err();
    // Bad input naming the path (exit 65), as the sides' copies refuse it: the owner's doing.
    assert!(
        matches!(&err, EvaluateError::Input(m) if m.contains("alias")),
        "{err:?}"
    );
    assert!(!stage2.join(COPY_DIR).exists(), "a copy was begun");
}

/// An exact path naming a directory (`judge`, as `./judge/` too) is served with everything
/// it holds, and everything beneath it is checked: the bind of the directory showed an empty
/// directory before (only the name matched), so a judge named so could not run.
#[test]
fn a_named_directory_is_copied_and_checked_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("judge/lib")).unwrap();
    std::fs::write(src.join("judge/score.py"), "s").unwrap();
    std::fs::write(src.join("judge/lib/util.py"), "u").unwrap();
    std::fs::write(src.join("fork.toml"), "m").unwrap();
    std::fs::write(src.join("judgement.py"), "not protected").unwrap();
    let stage = tmp.path().join("stage");
    std::fs::create_dir_all(&stage).unwrap();
    for patterns in [
        pats(&["judge", "./fork.toml"]),
        pats(&["./judge/", "fork.toml"]),
    ] {
        let _ = std::fs::remove_file(stage.join(MANIFEST));
        let _unmount = Unmount(stage.join(COPY_DIR));
        snapshot(&stage, tmp.path(), Path::new("src"), &patterns, &[]).unwrap();
        let m = load(&stage).unwrap().unwrap();
        assert_eq!(
            m.binds,
            vec![
                ("judge".to_string(), true),
                ("fork.toml".to_string(), false)
            ],
            "{patterns:?}"
        );
        let copy = stage.join(COPY_DIR);
        assert_eq!(std::fs::read(copy.join("judge/score.py")).unwrap(), b"s");
        assert_eq!(std::fs::read(copy.join("judge/lib/util.py")).unwrap(), b"u");
        assert_eq!(std::fs::read(copy.join("fork.toml")).unwrap(), b"m");
        assert!(!copy.join("judgement.py").exists());
        let ws = tmp.path().join("ws");
        let _ = std::fs::remove_dir_all(&ws);
        crate::fork::workspace::copy_tree(&src, &ws, &[]).unwrap();
        assert!(check(&stage, &ws, &[]).unwrap().is_empty());
        std::fs::write(ws.join("judge/lib/util.py"), "U").unwrap();
        std::fs::write(ws.join("judge/new.py"), "").unwrap();
        std::fs::write(ws.join("judgement.py"), "changed").unwrap();
        assert_eq!(
            changes(&stage, &ws),
            vec![
                ("judge/lib/util.py".into(), ChangeKind::Modified),
                ("judge/new.py".into(), ChangeKind::Added),
            ],
            "{patterns:?}"
        );
        drop(_unmount);
        if nix::unistd::geteuid().is_root() {
            let _ = nix::mount::umount2(&copy, nix::mount::MntFlags::MNT_DETACH);
        }
        std::fs::remove_dir_all(&copy).unwrap();
    }
}

/// As root, the protected tree of a runtime another user owns is copied only as far as that
/// user could read it: a root-only file linked into it is bad input naming it.
#[test]
fn a_protected_file_its_owner_cannot_read_is_refused() {
    use std::os::unix::fs::{chown, PermissionsExt};
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let rt = tmp.path().join("rt");
    std::fs::create_dir_all(rt.join("src/tests")).unwrap();
    chown(&rt, Some(65534), Some(65534)).unwrap();
    std::fs::write(rt.join("src/tests/a.py"), "a").unwrap();
    let secret = tmp.path().join("secret");
    std::fs::write(&secret, "root only").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::hard_link(&secret, rt.join("src/tests/linked.py")).unwrap();
    // The protected tree's copy into a fresh staging directory `name`, refused: its message.
    let refused = |name: &str| {
        let stage = tmp.path().join(name);
        std::fs::create_dir_all(&stage).unwrap();
        let _unmount = Unmount(stage.join(COPY_DIR));
        match snapshot(&stage, &rt, Path::new("src"), &pats(&["tests/**"]), &[]) {
            Err(EvaluateError::Input(m)) => m,
            other => panic!("{name}: not refused as bad input: {other:?}"),
        }
    };
    let m = refused("stage");
    assert!(m.contains("linked.py") && m.contains("uid 65534"), "{m}");
    // Readable by its mode bits, closed to the owner by an access ACL entry: refused too.
    std::fs::remove_file(rt.join("src/tests/linked.py")).unwrap();
    let closed = rt.join("src/tests/closed.py");
    std::fs::write(&closed, "c").unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o644)).unwrap();
    use crate::fork::acl::{self, entry::*};
    let acl = [user_obj(6), user(65534, 0), group_obj(4), mask(4), other(4)];
    if !acl::set_or_skip(&closed, &acl) {
        return;
    }
    let m = refused("stage2");
    assert!(m.contains("closed.py") && m.contains("access ACL"), "{m}");
    std::fs::remove_file(&closed).unwrap();
    // A root-only directory (0700) holding a world-readable file, and one the owner may
    // search but not list (0711): refused, naming the directory; with the owner given
    // read and search (0755), copied.
    let dir = rt.join("src/tests/private");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("key.py"), "root only").unwrap();
    std::fs::set_permissions(dir.join("key.py"), std::fs::Permissions::from_mode(0o644)).unwrap();
    for (mode, stage) in [(0o700, "stage3"), (0o711, "stage4")] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        let m = refused(stage);
        assert!(
            m.contains("tests/private") && m.contains("directory") && m.contains("uid 65534"),
            "{m}"
        );
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let copied = |name: &str| {
        let stage = tmp.path().join(name);
        std::fs::create_dir_all(&stage).unwrap();
        let _unmount = Unmount(stage.join(COPY_DIR));
        snapshot(&stage, &rt, Path::new("src"), &pats(&["tests/**"]), &[]).unwrap();
        std::fs::read(stage.join(COPY_DIR).join("tests/private/key.py")).unwrap()
    };
    assert_eq!(copied("stage5"), b"root only");
    // The source directory itself, on the way from the runtime, closed to the owner.
    std::fs::set_permissions(rt.join("src"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let m = refused("stage6");
    assert!(
        m.contains("cannot search") && m.contains("uid 65534"),
        "{m}"
    );
}
