//! Unit tests of `workspace.rs` (the copies, the tree hashes, the removal).

use super::*;
use std::os::unix::fs::symlink;

fn sample_tree(root: &Path) {
    fs::create_dir_all(root.join("a/b")).unwrap();
    fs::create_dir_all(root.join(".git/objects")).unwrap();
    fs::create_dir_all(root.join("state")).unwrap();
    fs::write(root.join("a/one.txt"), b"one").unwrap();
    fs::write(root.join("a/b/two.py"), b"print(2)\n").unwrap();
    fs::write(root.join("a/b/cache.pyc"), b"\0\0").unwrap();
    fs::write(root.join("run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(root.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(root.join(".git/objects/x"), b"blob").unwrap();
    fs::write(root.join("state/hermes.db"), b"live").unwrap();
    symlink("a/one.txt", root.join("link")).unwrap();
    symlink("/etc/passwd", root.join("abs-link")).unwrap();
    symlink("nowhere", root.join("dangling")).unwrap();
    nix::unistd::mkfifo(
        &root.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
}

/// A runtime directory whose `src` is [`sample_tree`] plus a listening socket (kept open
/// by the returned listener).
fn sample_runtime_with_a_socket() -> (tempfile::TempDir, PathBuf, std::os::unix::net::UnixListener)
{
    let dir = tempfile::tempdir().unwrap();
    let from = dir.path().join("rt/src");
    sample_tree(&from);
    let listener = std::os::unix::net::UnixListener::bind(from.join("a/app.sock")).unwrap();
    (dir, from, listener)
}

/// A copy into an empty destination never clears what it finds in its way: two source
/// entries meeting on one name (a case-folding filesystem) are an error naming it, and
/// the entry already copied is kept; a merging copy replaces it.
#[test]
fn a_copy_into_an_empty_destination_refuses_a_second_entry_on_one_name() {
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("README");
    fs::write(&dst, "first").unwrap();
    let create = || {
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&dst)
    };
    let e = or_after_clearing(create, &dst, "create", false).unwrap_err();
    assert!(e.to_string().contains("fold case"), "{e}");
    assert!(e.to_string().contains("README"), "{e}");
    assert_eq!(fs::read_to_string(&dst).unwrap(), "first");
    let link = || std::os::unix::fs::symlink("elsewhere", &dst);
    assert!(or_after_clearing(link, &dst, "create symlink", false).is_err());
    assert_eq!(fs::read_to_string(&dst).unwrap(), "first");
    or_after_clearing(create, &dst, "create", true).unwrap();
    assert_eq!(fs::read_to_string(&dst).unwrap(), "");
}

#[test]
fn workspace_layout() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("fork-run1");
    let ws = Workspace::create(&root).unwrap();
    for (p, name) in [
        (ws.src(), "src"),
        (ws.state(), "state"),
        (ws.tools(), "tools"),
        (ws.reports(), "reports"),
        (ws.home(), "home"),
    ] {
        assert!(p.is_dir());
        assert_eq!(p, root.join(name));
    }
    assert_eq!(
        fs::metadata(&root).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert!(matches!(
        Workspace::create(&root).unwrap_err(),
        WorkspaceError::Exists { .. }
    ));
    assert_eq!(Workspace::open(&root).unwrap(), ws);
    ws.remove().unwrap();
    assert!(!root.exists());
    ws.remove().unwrap();
}

/// A listed copy's listing is what reading the copy gives, without the second reading.
#[test]
fn a_listed_copy_lists_what_reading_the_copy_lists() {
    let (dir, from, _listener) = sample_runtime_with_a_socket();
    // A file larger than one read buffer, and a setuid bit the copy drops.
    fs::write(
        from.join("a/big.bin"),
        vec![7u8; crate::fsx::READ_BUF * 3 + 5],
    )
    .unwrap();
    fs::set_permissions(from.join("a/one.txt"), fs::Permissions::from_mode(0o4755)).unwrap();
    let excl = vec![
        ".git".to_string(),
        "state".to_string(),
        "**/*.pyc".to_string(),
    ];
    let to = dir.path().join("copy");
    let (stats, listed) =
        copy_tree_beneath_listed(&dir.path().join("rt"), Path::new("src"), &to, &excl).unwrap();
    let read = TreeListing::of(&to).unwrap();
    assert_eq!(listed.hash, read.hash);
    assert_eq!(listed.entries, read.entries);
    assert_eq!(stats.special_skipped, 2, "{stats:?}");
    assert_eq!(
        listed.hash,
        tree_hash_beneath(&dir.path().join("rt"), Path::new("src"), &excl).unwrap()
    );
    // The same bytes as the plain copy makes.
    let plain = dir.path().join("plain");
    copy_tree_beneath(&dir.path().join("rt"), Path::new("src"), &plain, &excl).unwrap();
    assert_eq!(tree_hash(&plain).unwrap(), listed.hash);
    assert_eq!(
        fs::read(to.join("a/big.bin")).unwrap().len(),
        crate::fsx::READ_BUF * 3 + 5
    );
    // Only into an empty directory: its listing names only what it wrote.
    let e =
        copy_tree_beneath_listed(&dir.path().join("rt"), Path::new("src"), &to, &excl).unwrap_err();
    assert!(matches!(e, WorkspaceError::NotEmpty { .. }), "{e}");
    let empty = dir.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let (_, again) =
        copy_tree_beneath_listed(&dir.path().join("rt"), Path::new("src"), &empty, &excl).unwrap();
    assert_eq!(again.hash, listed.hash);
}

#[test]
fn hashes_after_a_patch_read_only_what_it_names_and_equal_a_full_reading() {
    let dir = tempfile::tempdir().unwrap();
    let from = dir.path().join("rt/src");
    sample_tree(&from);
    fs::write(from.join("a.txt"), "one\ntwo\nthree\n").unwrap();
    fs::write(from.join("gone.txt"), "bye\n").unwrap();
    fs::write(from.join("keep.txt"), "kept\n").unwrap();
    let excl = vec![".git".to_string(), "state".to_string()];
    let to = dir.path().join("copy");
    let (_, before) =
        copy_tree_beneath_listed(&dir.path().join("rt"), Path::new("src"), &to, &excl).unwrap();
    // Modified in place, deleted, created in a new directory, mode changed, renamed, copied
    // (the first entry's new path spelled `./a.txt`, which the parser tidies).
    let patch = crate::patch::Patch::parse(
        b"\
diff --git a/a.txt b/a.txt
--- a/a.txt
+++ b/./a.txt
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
diff --git a/gone.txt b/gone.txt
deleted file mode 100644
--- a/gone.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
diff --git a/new/dir/x.py b/new/dir/x.py
new file mode 100755
--- /dev/null
+++ b/new/dir/x.py
@@ -0,0 +1 @@
+print('x')
diff --git a/run.sh b/run.sh
old mode 100755
new mode 100644
diff --git a/a/one.txt b/a/uno.txt
similarity index 100%
rename from a/one.txt
rename to a/uno.txt
diff --git a/keep.txt b/a/b/kept.txt
similarity index 100%
copy from keep.txt
copy to a/b/kept.txt
",
    )
    .unwrap();
    let named = patch.paths();
    assert!(named.contains(Path::new("a.txt")), "{named:?}");
    assert!(named.contains(Path::new("a/uno.txt")) && named.contains(Path::new("a/one.txt")));
    assert!(named.contains(Path::new("a/b/kept.txt")) && named.contains(Path::new("keep.txt")));
    crate::patch::apply(&to, &patch).unwrap();
    let after = tree_and_deploy_hashes_after(&to, &excl, &before, &named).unwrap();
    assert_eq!(after, tree_and_deploy_hashes(&to, &excl).unwrap());
    assert_ne!(after.0, before.hash);
    // A file the patch does not name (`a/b/two.py`) counts by its listed digest while it
    // is the file the copy wrote, and is read again once it is not: replaced by another
    // file of the same size (another inode), or written to (another size).
    let two = Path::new("a/b/two.py");
    let st = |to: &Path| {
        nix::sys::stat::fstatat(
            nix::fcntl::AT_FDCWD,
            &to.join(two),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .unwrap()
    };
    assert!(!named.contains(two));
    assert!(
        before.copied_digest(two, &st(&to)).is_some(),
        "reused while unchanged"
    );
    fs::write(to.join("a/b/x.tmp"), "print(3)\n").unwrap();
    fs::rename(to.join("a/b/x.tmp"), to.join(two)).unwrap();
    assert!(
        before.copied_digest(two, &st(&to)).is_none(),
        "a replacement is read"
    );
    let full = tree_and_deploy_hashes(&to, &excl).unwrap();
    assert_ne!(full, after);
    assert_eq!(
        tree_and_deploy_hashes_after(&to, &excl, &before, &named).unwrap(),
        full
    );
    fs::write(to.join(two), "print(22)\n").unwrap();
    assert!(before.copied_digest(two, &st(&to)).is_none());
    assert_eq!(
        tree_and_deploy_hashes_after(&to, &excl, &before, &named).unwrap(),
        tree_and_deploy_hashes(&to, &excl).unwrap()
    );
    // A file the patch names is read even while it looks like the file the copy wrote
    // (written in place at once, the same size: its change time may not have moved).
    let to2 = dir.path().join("copy2");
    let (_, before2) =
        copy_tree_beneath_listed(&dir.path().join("rt"), Path::new("src"), &to2, &excl).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(to2.join("keep.txt"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"KEPT\n"))
        .unwrap();
    let keep: std::collections::BTreeSet<PathBuf> = [PathBuf::from("keep.txt")].into();
    assert_eq!(
        tree_and_deploy_hashes_after(&to2, &excl, &before2, &keep).unwrap(),
        tree_and_deploy_hashes(&to2, &excl).unwrap()
    );
}

/// The live tree's hash (read beneath its root, as the evaluation hashes the parent's
/// source) is its copy's, special files and exclusions included: the evaluation compares
/// the two to see that the parent's source did not move.
#[test]
fn a_tree_and_its_copy_hash_alike_special_files_and_all() {
    let (dir, from, _listener) = sample_runtime_with_a_socket();
    let excl = vec![".git".to_string(), "state".to_string()];
    let to = dir.path().join("copy");
    let stats = copy_tree(&from, &to, &excl).unwrap();
    assert_eq!(stats.special_skipped, 2, "{stats:?}");
    let live = tree_hash_beneath(&dir.path().join("rt"), Path::new("src"), &excl).unwrap();
    assert_eq!(live, tree_hash(&to).unwrap());
    assert_eq!(live, tree_hash_excluding(&from, &excl).unwrap());
    // The listings agree, and name what changes.
    let was = TreeListing::beneath(&dir.path().join("rt"), Path::new("src"), &excl).unwrap();
    assert_eq!(was.hash, live);
    assert!(was.changed(&TreeListing::of(&to).unwrap(), 5).is_empty());
    fs::write(to.join("a/one.txt"), b"ONE").unwrap();
    fs::write(to.join("a/new.txt"), b"new").unwrap();
    fs::remove_file(to.join("run.sh")).unwrap();
    fs::set_permissions(to.join("a/b/two.py"), fs::Permissions::from_mode(0o755)).unwrap();
    let now = TreeListing::of(&to).unwrap();
    assert_ne!(now.hash, live);
    let names =
        |v: Vec<PathBuf>| -> Vec<String> { v.iter().map(|p| p.display().to_string()).collect() };
    assert_eq!(
        names(was.changed(&now, 5)),
        ["a/b/two.py", "a/new.txt", "a/one.txt", "run.sh"]
    );
    assert_eq!(names(was.changed(&now, 2)), ["a/b/two.py", "a/new.txt"]);
}

#[test]
fn copy_tree_keeps_links_modes_and_skips_specials() {
    let dir = tempfile::tempdir().unwrap();
    let from = dir.path().join("from");
    sample_tree(&from);
    let to = dir.path().join("to");
    let excl = vec![
        ".git".to_string(),
        "state/".to_string(),
        "**/*.pyc".to_string(),
    ];
    let stats = copy_tree(&from, &to, &excl).unwrap();
    assert_eq!(stats.files, 3, "{stats:?}");
    assert_eq!(stats.symlinks, 3);
    assert_eq!(stats.special_skipped, 1);
    assert_eq!(stats.excluded, 3);
    assert_eq!(stats.dirs, 2);
    assert_eq!(stats.bytes, 3 + 9 + 18);
    assert_eq!(fs::read(to.join("a/b/two.py")).unwrap(), b"print(2)\n");
    assert!(!to.join(".git").exists() && !to.join("state").exists());
    assert!(!to.join("a/b/cache.pyc").exists());
    assert!(!to.join("fifo").exists());
    assert_eq!(
        fs::read_link(to.join("link")).unwrap(),
        Path::new("a/one.txt")
    );
    assert_eq!(
        fs::read_link(to.join("abs-link")).unwrap(),
        Path::new("/etc/passwd")
    );
    assert!(fs::symlink_metadata(to.join("dangling"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        fs::metadata(to.join("run.sh"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o755
    );
    // Same content, same hash (the fifo is the one difference: drop it first).
    fs::remove_file(from.join("fifo")).unwrap();
    fs::remove_dir_all(from.join(".git")).unwrap();
    fs::remove_dir_all(from.join("state")).unwrap();
    fs::remove_file(from.join("a/b/cache.pyc")).unwrap();
    assert_eq!(tree_hash(&from).unwrap(), tree_hash(&to).unwrap());
}

#[test]
fn copy_tree_modes_and_setuid() {
    let dir = tempfile::tempdir().unwrap();
    let from = dir.path().join("from");
    fs::create_dir_all(from.join("ro")).unwrap();
    fs::write(from.join("ro/f"), b"x").unwrap();
    fs::write(from.join("suid"), b"x").unwrap();
    fs::set_permissions(from.join("suid"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::set_permissions(from.join("ro"), fs::Permissions::from_mode(0o555)).unwrap();
    let to = dir.path().join("to");
    copy_tree(&from, &to, &[]).unwrap();
    assert_eq!(fs::read(to.join("ro/f")).unwrap(), b"x");
    assert_eq!(
        fs::metadata(to.join("ro")).unwrap().permissions().mode() & 0o7777,
        0o555
    );
    assert_eq!(
        fs::metadata(to.join("suid")).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    // Removal opens read-only directories up.
    remove_tree(&to).unwrap();
    assert!(!to.exists());
    fs::set_permissions(from.join("ro"), fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn copy_tree_over_an_existing_tree() {
    let dir = tempfile::tempdir().unwrap();
    let from = dir.path().join("from");
    fs::create_dir_all(from.join("d")).unwrap();
    fs::write(from.join("d/f"), b"new").unwrap();
    fs::write(from.join("g"), b"g").unwrap();
    let to = dir.path().join("to");
    fs::create_dir_all(to.join("d")).unwrap();
    fs::write(to.join("d/old"), b"kept").unwrap();
    // A symlink in the way is replaced, not written through.
    let outside = dir.path().join("outside");
    fs::write(&outside, b"untouched").unwrap();
    symlink(&outside, to.join("d/f")).unwrap();
    let stats = copy_tree(&from, &to, &[]).unwrap();
    assert_eq!(stats.files, 2);
    assert_eq!(fs::read(to.join("d/f")).unwrap(), b"new");
    assert!(!fs::symlink_metadata(to.join("d/f"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read(&outside).unwrap(), b"untouched");
    assert_eq!(fs::read(to.join("d/old")).unwrap(), b"kept");
    // Where the source has a directory: a file in the way is replaced by the directory,
    // and a link to a directory elsewhere is replaced too, never merged through.
    fs::create_dir_all(from.join("e")).unwrap();
    fs::write(from.join("e/x"), b"x").unwrap();
    fs::create_dir_all(from.join("l")).unwrap();
    fs::write(from.join("l/y"), b"y").unwrap();
    fs::write(to.join("e"), b"a file in the way").unwrap();
    let elsewhere = dir.path().join("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    symlink(&elsewhere, to.join("l")).unwrap();
    // A link where the source has a link is replaced by the source's.
    symlink("g", from.join("k")).unwrap();
    symlink(&outside, to.join("k")).unwrap();
    let stats = copy_tree(&from, &to, &[]).unwrap();
    assert_eq!((stats.files, stats.symlinks), (4, 1));
    assert_eq!(fs::read(to.join("e/x")).unwrap(), b"x");
    assert!(!fs::symlink_metadata(to.join("l"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read(to.join("l/y")).unwrap(), b"y");
    assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
    assert_eq!(fs::read_link(to.join("k")).unwrap(), Path::new("g"));
    assert_eq!(fs::read(&outside).unwrap(), b"untouched");
    // A directory where the source has a file is refused.
    fs::remove_file(to.join("g")).unwrap();
    fs::create_dir(to.join("g")).unwrap();
    let err = copy_tree(&from, &to, &[]).unwrap_err();
    assert!(
        matches!(err, WorkspaceError::WouldReplaceDirectory { .. }),
        "{err}"
    );
}

#[test]
fn copy_tree_into_itself_and_bad_glob() {
    let dir = tempfile::tempdir().unwrap();
    let from = dir.path().join("rt");
    fs::create_dir_all(from.join("sub")).unwrap();
    fs::write(from.join("sub/f"), b"x").unwrap();
    let to = from.join("ws-src");
    let stats = copy_tree(&from, &to, &[]).unwrap();
    assert_eq!(stats.files, 1);
    assert!(to.join("sub/f").exists());
    assert!(!to.join("ws-src").exists());
    let err = copy_tree(&from, &dir.path().join("x"), &["a[".to_string()]).unwrap_err();
    assert!(err.to_string().contains("a["), "{err}");
    let err = copy_tree(&from.join("sub/f"), &dir.path().join("y"), &[]).unwrap_err();
    assert!(matches!(err, WorkspaceError::NotADirectory { .. }));
}

#[test]
fn tree_hash_sensitivity() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t");
    fs::create_dir_all(t.join("d")).unwrap();
    fs::write(t.join("d/f.txt"), b"hello world").unwrap();
    fs::write(t.join("g"), b"g").unwrap();
    symlink("d/f.txt", t.join("l")).unwrap();
    let base = tree_hash(&t).unwrap();
    assert!(base.starts_with("sha256:") && base.len() == 7 + 64);
    assert_eq!(tree_hash(&t).unwrap(), base);

    // mtime does not count.
    let f = fs::File::options()
        .write(true)
        .open(t.join("d/f.txt"))
        .unwrap();
    f.set_modified(std::time::SystemTime::UNIX_EPOCH).unwrap();
    drop(f);
    assert_eq!(tree_hash(&t).unwrap(), base);

    // Any byte of content.
    fs::write(t.join("d/f.txt"), b"hello World").unwrap();
    let h = tree_hash(&t).unwrap();
    assert_ne!(h, base);
    fs::write(t.join("d/f.txt"), b"hello world").unwrap();
    assert_eq!(tree_hash(&t).unwrap(), base);

    // A name.
    fs::rename(t.join("g"), t.join("h")).unwrap();
    assert_ne!(tree_hash(&t).unwrap(), base);
    fs::rename(t.join("h"), t.join("g")).unwrap();
    assert_eq!(tree_hash(&t).unwrap(), base);

    // The exec bit.
    fs::set_permissions(t.join("g"), fs::Permissions::from_mode(0o755)).unwrap();
    assert_ne!(tree_hash(&t).unwrap(), base);
    fs::set_permissions(t.join("g"), fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(tree_hash(&t).unwrap(), base);

    // A link target.
    fs::remove_file(t.join("l")).unwrap();
    symlink("d/f.txT", t.join("l")).unwrap();
    assert_ne!(tree_hash(&t).unwrap(), base);
    fs::remove_file(t.join("l")).unwrap();
    symlink("d/f.txt", t.join("l")).unwrap();
    assert_eq!(tree_hash(&t).unwrap(), base);

    // A file turned into a symlink with the same "content" differs by type.
    fs::remove_file(t.join("g")).unwrap();
    symlink("g", t.join("g")).unwrap();
    assert_ne!(tree_hash(&t).unwrap(), base);
    fs::remove_file(t.join("g")).unwrap();
    fs::write(t.join("g"), b"g").unwrap();
    assert_eq!(tree_hash(&t).unwrap(), base);

    // An empty directory counts.
    fs::create_dir(t.join("empty")).unwrap();
    assert_ne!(tree_hash(&t).unwrap(), base);
}

/// The one-reading pair is the two hashes read apart, whatever the excludes skip: a
/// matching file, a matching directory and all it holds (deep too), a glob with a
/// wildcard, a link, a file patched in under an excluded name, and a tree with no
/// excludes at all.
#[test]
fn both_hashes_from_one_reading_are_the_two_read_apart() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t");
    for d in ["src/a", "state/deep/er", "logs", "keep/state"] {
        fs::create_dir_all(t.join(d)).unwrap();
    }
    for (f, body) in [
        ("src/a/x.py", "x"),
        ("src/run.sh", "#!/bin/sh"),
        ("state/db", "live"),
        ("state/deep/er/wal", "w"),
        ("logs/1.log", "l"),
        (
            "keep/state/note",
            "kept: only a top-level state is excluded",
        ),
        ("cache.pyc", "c"),
        ("src/a/new.pyc", "patched in, excluded by name"),
    ] {
        fs::write(t.join(f), body).unwrap();
    }
    symlink("src/a/x.py", t.join("link")).unwrap();
    for excl in [
        vec![],
        vec!["state".to_string()],
        vec!["state/".into(), "logs".into(), "**/*.pyc".into()],
        vec!["./state".into(), "src/a".into()],
        vec!["nothing-matches".into()],
        vec!["state/**".into(), "link".into(), "keep/*".into()],
    ] {
        let (all, deployed) = tree_and_deploy_hashes(&t, &excl).unwrap();
        assert_eq!(all, tree_hash(&t).unwrap(), "{excl:?}");
        assert_eq!(deployed, deploy_tree_hash(&t, &excl).unwrap(), "{excl:?}");
    }
    // The excludes change the deployment hash only.
    let (a, d) = tree_and_deploy_hashes(&t, &["state".to_string()]).unwrap();
    let (a2, d2) = tree_and_deploy_hashes(&t, &[]).unwrap();
    assert_eq!(a, a2);
    assert_ne!(d, d2);
    assert!(tree_and_deploy_hashes(&t, &["[".to_string()]).is_err());
}

#[test]
fn deploy_tree_hash_definition() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t");
    fs::create_dir_all(t.join("d")).unwrap();
    fs::create_dir_all(t.join("state")).unwrap();
    fs::write(t.join("d/f.txt"), b"hello").unwrap();
    fs::write(t.join("run.sh"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(t.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    symlink("d/f.txt", t.join("l")).unwrap();
    fs::write(t.join("state/db"), b"live").unwrap();
    let excl = vec!["state".to_string()];
    let base = deploy_tree_hash(&t, &excl).unwrap();

    // The definition, written out independently.
    let mut h = Sha256::new();
    h.update(b"fork-deploy-tree-v1\0");
    let put = |h: &mut Sha256, b: &[u8]| {
        h.update((b.len() as u64).to_be_bytes());
        h.update(b);
    };
    h.update(b"F");
    put(&mut h, b"d/f.txt");
    h.update([0u8]);
    h.update(Sha256::digest(b"hello"));
    h.update(b"L");
    put(&mut h, b"l");
    put(&mut h, b"d/f.txt");
    h.update(b"F");
    put(&mut h, b"run.sh");
    h.update([1u8]);
    h.update(Sha256::digest(b"#!/bin/sh\n"));
    assert_eq!(base, format!("sha256:{}", hex::encode(h.finalize())));

    // Excluded paths, empty directories, other mode bits and FIFOs do not count.
    fs::write(t.join("state/db"), b"changed").unwrap();
    fs::create_dir_all(t.join("empty/deeper")).unwrap();
    fs::set_permissions(t.join("d/f.txt"), fs::Permissions::from_mode(0o600)).unwrap();
    nix::unistd::mkfifo(
        &t.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    assert_eq!(deploy_tree_hash(&t, &excl).unwrap(), base);
    // Content, the exec bit and a link target do.
    fs::set_permissions(t.join("d/f.txt"), fs::Permissions::from_mode(0o700)).unwrap();
    assert_ne!(deploy_tree_hash(&t, &excl).unwrap(), base);
    fs::set_permissions(t.join("d/f.txt"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(t.join("d/f.txt"), b"hellO").unwrap();
    assert_ne!(deploy_tree_hash(&t, &excl).unwrap(), base);
    fs::write(t.join("d/f.txt"), b"hello").unwrap();
    fs::remove_file(t.join("l")).unwrap();
    symlink("d/F.txt", t.join("l")).unwrap();
    assert_ne!(deploy_tree_hash(&t, &excl).unwrap(), base);
    // A copy (minus exclude) hashes alike.
    fs::remove_file(t.join("l")).unwrap();
    symlink("d/f.txt", t.join("l")).unwrap();
    let to = dir.path().join("to");
    copy_tree(&t, &to, &excl).unwrap();
    assert_eq!(deploy_tree_hash(&to, &[]).unwrap(), base);
}

#[test]
fn remove_tree_does_not_follow_symlinks() {
    let dir = tempfile::tempdir().unwrap();
    let keep = dir.path().join("keep");
    fs::create_dir(&keep).unwrap();
    fs::write(keep.join("precious"), b"p").unwrap();
    let ws = dir.path().join("ws");
    fs::create_dir_all(ws.join("x")).unwrap();
    symlink(&keep, ws.join("x/to-keep")).unwrap();
    symlink(keep.join("precious"), ws.join("file-link")).unwrap();
    remove_tree(&ws).unwrap();
    assert!(!ws.exists());
    assert_eq!(fs::read(keep.join("precious")).unwrap(), b"p");
    remove_tree(&ws).unwrap();
    // Idempotent with its parent gone too.
    remove_tree(&dir.path().join("gone/ws")).unwrap();
}

/// The removal opens up (0700) a directory it cannot enter or empty (0000 here), and never
/// changes a mode through a link: such a directory swapped for a link to a file outside
/// between the look at it and the change of its mode, as a live writer of the tree could
/// (the walk's test hook does it at that point), leaves that file's mode as it was, and
/// the removal fails closed. A link to a file outside that was there all along is removed,
/// its file unchanged. Every file is the test's own, in its temp dir.
#[test]
fn remove_tree_opens_up_directories_but_never_changes_a_mode_through_a_link() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside.txt");
    fs::write(&outside, "outside").unwrap();
    fs::set_permissions(&outside, fs::Permissions::from_mode(0o644)).unwrap();
    let mode = |p: &Path| fs::symlink_metadata(p).unwrap().mode() & 0o7777;
    let t = dir.path().join("t");
    let locked_tree = || {
        fs::create_dir_all(t.join("locked/inner")).unwrap();
        fs::write(t.join("locked/inner/f"), "f").unwrap();
        symlink(&outside, t.join("link")).unwrap();
        fs::set_permissions(t.join("locked/inner"), fs::Permissions::from_mode(0o000)).unwrap();
        fs::set_permissions(t.join("locked"), fs::Permissions::from_mode(0o000)).unwrap();
    };
    locked_tree();
    remove_tree(&t).unwrap();
    assert!(!t.exists());
    assert_eq!(mode(&outside), 0o644);
    // The same tree, `locked` swapped for a link to `outside` once the walk has looked at it.
    locked_tree();
    let moved = dir.path().join("moved");
    let (t2, moved2, outside2) = (t.clone(), moved.clone(), outside.clone());
    let mut swap = Some(move || {
        fs::rename(t2.join("locked"), &moved2).unwrap();
        symlink(&outside2, t2.join("locked")).unwrap();
    });
    crate::fsx::AFTER_LOOK.with(|h| {
        *h.borrow_mut() = Some(Box::new(move |name: &std::ffi::OsStr| {
            if name == "locked" {
                if let Some(s) = swap.take() {
                    s()
                }
            }
        }))
    });
    let r = remove_tree(&t);
    crate::fsx::AFTER_LOOK.with(|h| h.borrow_mut().take());
    assert_eq!(
        mode(&outside),
        0o644,
        "the removal changed the mode of a file outside through a link ({r:?})"
    );
    assert_eq!(fs::read_to_string(&outside).unwrap(), "outside");
    assert_eq!(mode(&moved), 0, "the directory moved away was changed");
    let e = r.unwrap_err();
    assert!(e.to_string().contains("locked"), "{e}");
    fs::set_permissions(&moved, fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(moved.join("inner"), fs::Permissions::from_mode(0o700)).unwrap();
}

/// Not as root (root's filesystem identity given up here, on a thread of its own, for
/// uid 65534's tree): a 0000 directory cannot be opened to read, so it is opened as a path
/// only and opened up through `/proc/self/fd`, and removed; swapped for a link once looked
/// at, it is refused and the link's target keeps its mode. Root only (setfsuid(2)).
#[test]
fn remove_tree_opens_up_a_closed_directory_without_root_and_without_following_a_link() {
    use nix::unistd::{setfsgid, setfsuid, Gid, Uid};
    use std::os::unix::fs::lchown;
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let nobody = 65534;
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    // The user's own directory, holding the tree (removed from it) and the file outside.
    let dir = tmp.path().join("home");
    fs::create_dir(&dir).unwrap();
    lchown(&dir, Some(nobody), Some(nobody)).unwrap();
    let outside = dir.join("outside.txt");
    fs::write(&outside, "outside").unwrap();
    fs::set_permissions(&outside, fs::Permissions::from_mode(0o644)).unwrap();
    lchown(&outside, Some(nobody), Some(nobody)).unwrap();
    let t = dir.join("t");
    let make = || {
        fs::create_dir_all(t.join("locked")).unwrap();
        fs::write(t.join("locked/f"), "f").unwrap();
        for p in [t.clone(), t.join("locked"), t.join("locked/f")] {
            lchown(&p, Some(nobody), Some(nobody)).unwrap();
        }
        fs::set_permissions(t.join("locked"), fs::Permissions::from_mode(0o000)).unwrap();
    };
    // As uid 65534 on this thread only (the fs identity is per thread).
    let as_nobody = |t: PathBuf, swap: Option<(PathBuf, PathBuf)>| {
        std::thread::spawn(move || {
            if let Some((moved, outside)) = swap {
                let t2 = t.clone();
                let mut s = Some(move || {
                    fs::rename(t2.join("locked"), &moved).unwrap();
                    symlink(&outside, t2.join("locked")).unwrap();
                });
                crate::fsx::AFTER_LOOK.with(|h| {
                    *h.borrow_mut() = Some(Box::new(move |name: &std::ffi::OsStr| {
                        if name == "locked" {
                            if let Some(s) = s.take() {
                                s()
                            }
                        }
                    }))
                });
            }
            setfsgid(Gid::from_raw(nobody));
            setfsuid(Uid::from_raw(nobody));
            let r = remove_tree(&t).map_err(|e| e.to_string());
            setfsuid(Uid::from_raw(0));
            setfsgid(Gid::from_raw(0));
            r
        })
        .join()
        .unwrap()
    };
    make();
    as_nobody(t.clone(), None).unwrap();
    assert!(!t.exists());
    make();
    // Renamed within its directory: the user may not move its 0000 directory elsewhere.
    let moved = t.join("moved");
    let e = as_nobody(t.clone(), Some((moved.clone(), outside.clone()))).unwrap_err();
    assert!(e.contains("locked"), "{e}");
    let mode = |p: &Path| fs::symlink_metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(mode(&outside), 0o644, "changed through the link: {e}");
    assert_eq!(mode(&moved), 0);
    fs::set_permissions(&moved, fs::Permissions::from_mode(0o700)).unwrap();
}

/// As root, a tree another user owns is read only as far as that user could read it: a
/// root-only file in it (a hard link to one, where `fs.protected_hardlinks` is 0, looks
/// the same) is refused by the copy and the hash, naming it; what the owner may read is
/// copied. A root-owned tree is read as before.
#[test]
fn a_root_fork_copies_only_what_the_trees_owner_could_read() {
    use std::os::unix::fs::{chown, PermissionsExt};
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let rt = tmp.path().join("rt");
    let src = rt.join("src");
    fs::create_dir_all(&src).unwrap();
    let nobody = 65534;
    chown(&rt, Some(nobody), Some(nobody)).unwrap();
    fs::write(src.join("mine.py"), "m").unwrap();
    chown(src.join("mine.py"), Some(nobody), Some(nobody)).unwrap();
    fs::set_permissions(src.join("mine.py"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(src.join("public.txt"), "p").unwrap();
    fs::set_permissions(src.join("public.txt"), fs::Permissions::from_mode(0o644)).unwrap();
    let to = tmp.path().join("to");
    copy_tree_beneath(&rt, Path::new("src"), &to, &[]).unwrap();
    assert_eq!(fs::read(to.join("mine.py")).unwrap(), b"m");
    // A root-only file, as a hard link from outside the tree.
    let secret = tmp.path().join("secret");
    fs::write(&secret, "root only").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    fs::hard_link(&secret, src.join("linked")).unwrap();
    let to2 = tmp.path().join("to2");
    let e = copy_tree_beneath(&rt, Path::new("src"), &to2, &[]).unwrap_err();
    assert!(
        matches!(&e, WorkspaceError::Unreadable { path, .. } if path.ends_with("linked")),
        "{e}"
    );
    assert!(e.to_string().contains("uid 65534"), "{e}");
    let e = tree_hash_beneath(&rt, Path::new("src"), &[]).unwrap_err();
    assert!(matches!(e, WorkspaceError::Unreadable { .. }), "{e}");
    // A tree handed to a sandbox (`--workspace`) is held to its owner the same way; a tree
    // only hashed or copied for fork itself (`verify --tree`) is not.
    chown(&src, Some(nobody), Some(nobody)).unwrap();
    let e = copy_users_tree(&src, &tmp.path().join("to4"), &[]).unwrap_err();
    assert!(matches!(e, WorkspaceError::Unreadable { .. }), "{e}");
    copy_tree(&src, &tmp.path().join("to5"), &[]).unwrap();
    // The runtime named through a link (one swapped in after planning): refused, so the
    // owner is always the real directory's.
    symlink(&rt, tmp.path().join("alias")).unwrap();
    let e = copy_tree_beneath(&tmp.path().join("alias"), Path::new("src"), &to2, &[]).unwrap_err();
    assert!(matches!(e, WorkspaceError::Link { .. }), "{e}");
    // The same tree as root's own: copied as before.
    chown(&rt, Some(0), Some(0)).unwrap();
    let to3 = tmp.path().join("to3");
    copy_tree_beneath(&rt, Path::new("src"), &to3, &[]).unwrap();
    assert_eq!(fs::read(to3.join("linked")).unwrap(), b"root only");
}

/// As root, a tree another user owns is entered only as far as that user could: every
/// directory read (listed and searched) must be one the owner may list (r) and search (x),
/// the tree's root and the directories on the way to it beneath the runtime included. A
/// root-only directory (0700) holding a world-readable file, one the owner may search but
/// not list (0711: fork would list it for the owner), one it may list but not search
/// (0744), and the owner's own directory closed to itself (0000) are refused by every
/// reading (the copies, the hash, the listing, `--workspace`'s copy), naming the directory
/// and the fix. An excluded directory is never entered, so never refused; the same tree as
/// root's own is read as before.
#[test]
fn a_root_fork_enters_only_directories_the_trees_owner_could_list_and_search() {
    use std::os::unix::fs::{chown, PermissionsExt};
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let nobody = 65534;
    let tmp = tempfile::tempdir().unwrap();
    let rt = tmp.path().join("rt");
    let src = rt.join("src");
    fs::create_dir_all(src.join("mine")).unwrap();
    for p in [&rt, &src, &src.join("mine")] {
        chown(p, Some(nobody), Some(nobody)).unwrap();
    }
    fs::set_permissions(src.join("mine"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(src.join("mine/own.txt"), "own").unwrap();
    chown(src.join("mine/own.txt"), Some(nobody), Some(nobody)).unwrap();
    // The owner's own directory, open to itself only: read.
    copy_tree_beneath(&rt, Path::new("src"), &tmp.path().join("ok"), &[]).unwrap();
    let n = std::cell::Cell::new(0);
    let to = || {
        n.set(n.get() + 1);
        tmp.path().join(format!("to{}", n.get()))
    };
    // Every reading of the tree refuses `name`, naming it, the owner and the fix.
    let refused_everywhere = |name: &str| {
        let check = |e: WorkspaceError, how: &str| {
            assert!(
                matches!(&e, WorkspaceError::Unreadable { path, reason }
                    if path.ends_with(name) && reason.contains("uid 65534")
                        && reason.contains("directory")),
                "{name}, {how}: {e}"
            );
        };
        let src_rel = Path::new("src");
        check(
            copy_tree_beneath(&rt, src_rel, &to(), &[]).unwrap_err(),
            "copy",
        );
        check(
            copy_tree_beneath_listed(&rt, src_rel, &to(), &[]).unwrap_err(),
            "listed copy",
        );
        check(tree_hash_beneath(&rt, src_rel, &[]).unwrap_err(), "hash");
        check(
            TreeListing::beneath(&rt, src_rel, &[]).unwrap_err(),
            "listing",
        );
        check(
            copy_users_tree(&src, &to(), &[]).unwrap_err(),
            "--workspace",
        );
    };
    // (name, owner, mode): each holds a world-readable file.
    for (name, uid, mode) in [
        ("secret", 0, 0o700),
        ("search-only", 0, 0o711),
        ("list-only", 0, 0o744),
        ("own-closed", nobody, 0o000),
    ] {
        let d = src.join(name);
        fs::create_dir(&d).unwrap();
        fs::write(d.join("key.txt"), "root only").unwrap();
        fs::set_permissions(d.join("key.txt"), fs::Permissions::from_mode(0o644)).unwrap();
        chown(&d, Some(uid), Some(uid)).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(mode)).unwrap();
        refused_everywhere(name);
        // Excluded, it is never entered.
        copy_tree_beneath(&rt, Path::new("src"), &to(), &[name.to_string()]).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
        fs::remove_dir_all(&d).unwrap();
    }
    // A directory on the way to the tree, beneath the runtime (a nested source or tools
    // path): the owner must be able to search it.
    let outer = rt.join("outer");
    fs::create_dir_all(outer.join("inner")).unwrap();
    fs::write(outer.join("inner/key.txt"), "root only").unwrap();
    fs::set_permissions(&outer, fs::Permissions::from_mode(0o700)).unwrap();
    let e = copy_tree_beneath(&rt, Path::new("outer/inner"), &to(), &[]).unwrap_err();
    assert!(
        matches!(&e, WorkspaceError::Unreadable { path, reason }
            if path.ends_with("outer") && reason.contains("uid 65534")),
        "{e}"
    );
    fs::set_permissions(&outer, fs::Permissions::from_mode(0o711)).unwrap();
    copy_tree_beneath(&rt, Path::new("outer/inner"), &to(), &[]).unwrap();
    // A directory the owner renames into the way after its parent was listed (a root-only
    // one it cannot enter, put where its own was): the reopening checks the way again.
    fs::create_dir_all(src.join("a/b")).unwrap();
    chown(src.join("a"), Some(nobody), Some(nobody)).unwrap();
    fs::create_dir_all(src.join("secret/b")).unwrap();
    fs::write(src.join("secret/b/key.txt"), "root only").unwrap();
    fs::set_permissions(src.join("secret"), fs::Permissions::from_mode(0o700)).unwrap();
    let tree = Tree::beneath(&rt, Path::new("src")).unwrap();
    tree.dir(Path::new("a")).unwrap();
    fs::rename(src.join("a"), src.join("a-was")).unwrap();
    fs::rename(src.join("secret"), src.join("a")).unwrap();
    let e = tree.dir(Path::new("a/b")).unwrap_err();
    assert!(
        matches!(&e, WorkspaceError::Unreadable { path, .. } if path.ends_with("src/a")),
        "{e}"
    );
    for d in ["a", "a-was"] {
        fs::remove_dir_all(src.join(d)).unwrap();
    }
    // The same tree as root's own: read as before.
    let d = src.join("secret");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("key.txt"), "root only").unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
    chown(&rt, Some(0), Some(0)).unwrap();
    let last = to();
    copy_tree_beneath(&rt, Path::new("src"), &last, &[]).unwrap();
    assert_eq!(fs::read(last.join("secret/key.txt")).unwrap(), b"root only");
}

/// As root, another user's tree is held to each file's access ACL where it has one, as the
/// kernel would hold that user: a root-only file (mode 0600) that an ACL entry opens to
/// the owner is copied, a world-readable one (0644) that an entry closes to the owner is
/// refused, naming it and the ACL. The mode bits alone would say the opposite of both.
#[test]
fn a_root_fork_holds_another_users_tree_to_its_acls() {
    use crate::fork::acl::{self, entry::*};
    use std::os::unix::fs::{chown, PermissionsExt};
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let nobody = 65534;
    let tmp = tempfile::tempdir().unwrap();
    let rt = tmp.path().join("rt");
    let src = rt.join("src");
    fs::create_dir_all(&src).unwrap();
    chown(&rt, Some(nobody), Some(nobody)).unwrap();
    let with_acl = |name: &str, mode: u32, acl: &[acl::Entry]| {
        let path = src.join(name);
        fs::write(&path, name).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        acl::set_or_skip(&path, acl)
    };
    // The copy is refused, naming `name`, its owner's uid and the ACL.
    let refused_by_acl = |name: &str, to: &str| {
        let e = copy_tree_beneath(&rt, Path::new("src"), &tmp.path().join(to), &[]).unwrap_err();
        assert!(
            matches!(&e, WorkspaceError::Unreadable { path, reason } if path.ends_with(name) && reason.contains("access ACL") && reason.contains("uid 65534")),
            "{e}"
        );
    };
    let opened = [
        user_obj(6),
        user(nobody, 4),
        group_obj(0),
        mask(4),
        other(0),
    ];
    if !with_acl("opened.txt", 0o600, &opened) {
        return;
    }
    let to = tmp.path().join("to");
    copy_tree_beneath(&rt, Path::new("src"), &to, &[]).unwrap();
    assert_eq!(fs::read(to.join("opened.txt")).unwrap(), b"opened.txt");
    // The mask (write only) closes the named entry again.
    let masked = [
        user_obj(6),
        user(nobody, 4),
        group_obj(0),
        mask(2),
        other(0),
    ];
    assert!(with_acl("opened.txt", 0o600, &masked));
    refused_by_acl("opened.txt", "to2");
    // An empty mask (group bits all clear) leaves the mode bits to decide, as the kernel
    // does: the others' bit lets the owner read it, whatever the named entry says.
    let empty = [
        user_obj(6),
        user(nobody, 0),
        group_obj(0),
        mask(0),
        other(4),
    ];
    assert!(with_acl("opened.txt", 0o600, &empty));
    copy_tree_beneath(&rt, Path::new("src"), &tmp.path().join("to2b"), &[]).unwrap();
    assert!(with_acl("opened.txt", 0o600, &opened));
    let closed = [
        user_obj(6),
        user(nobody, 0),
        group_obj(4),
        mask(4),
        other(4),
    ];
    assert!(with_acl("closed.txt", 0o644, &closed));
    refused_by_acl("closed.txt", "to3");
    let e = tree_hash_beneath(&rt, Path::new("src"), &[]).unwrap_err();
    assert!(matches!(e, WorkspaceError::Unreadable { .. }), "{e}");
    // Directories are held to their ACLs the same way, for listing and searching (r-x): a
    // root-only directory (0750, root's group) that an entry opens to the owner is read; a
    // world-readable one (0755) that an entry closes, or opens for searching only, is
    // refused, naming it and the ACL. Its file is world-readable: only the directory
    // stands between the owner and it.
    fs::remove_file(src.join("closed.txt")).unwrap();
    let dir_with_acl = |name: &str, mode: u32, acl: &[acl::Entry]| {
        let path = src.join(name);
        fs::create_dir(&path).unwrap();
        fs::write(path.join("inside.txt"), name).unwrap();
        fs::set_permissions(path.join("inside.txt"), fs::Permissions::from_mode(0o644)).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        assert!(acl::set_or_skip(&path, acl));
    };
    dir_with_acl(
        "dir-opened",
        0o750,
        &[
            user_obj(7),
            user(nobody, 5),
            group_obj(5),
            mask(5),
            other(0),
        ],
    );
    let to5 = tmp.path().join("to5");
    copy_tree_beneath(&rt, Path::new("src"), &to5, &[]).unwrap();
    assert_eq!(
        fs::read(to5.join("dir-opened/inside.txt")).unwrap(),
        b"dir-opened"
    );
    for (name, named) in [
        ("dir-closed", 0),
        ("dir-search-only", 1),
        ("dir-list-only", 4),
    ] {
        dir_with_acl(
            name,
            0o755,
            &[
                user_obj(7),
                user(nobody, named),
                group_obj(5),
                mask(5),
                other(5),
            ],
        );
        refused_by_acl(name, &format!("to-{name}"));
        let e = tree_hash_beneath(&rt, Path::new("src"), &[]).unwrap_err();
        assert!(
            matches!(&e, WorkspaceError::Unreadable { path, .. } if path.ends_with(name)),
            "{e}"
        );
        fs::remove_dir_all(src.join(name)).unwrap();
    }
    // A root-owned tree is read as before, ACLs or not.
    chown(&rt, Some(0), Some(0)).unwrap();
    copy_tree_beneath(&rt, Path::new("src"), &tmp.path().join("to4"), &[]).unwrap();
}
