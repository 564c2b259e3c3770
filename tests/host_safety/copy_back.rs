//! `fork run --workspace`: what the successor leaves in its workspace reaches the host
//! workspace only within its budget, without set-id bits or planted hooks, and all or nothing.

use super::*;

fn no_staging_left(ws: &Path) {
    for e in std::fs::read_dir(ws).unwrap().flatten() {
        assert!(
            !e.file_name()
                .to_string_lossy()
                .starts_with(".fork-copyback"),
            "staging directory {} left behind",
            e.path().display()
        );
    }
}

#[test]
fn copy_back_refuses_a_sparse_file_over_the_disk_budget() {
    need_root!();
    let ws = scratch("ws-sparse");
    std::fs::write(ws.join("keep.txt"), b"old").unwrap();
    let before = listing(&ws);
    let r = run(
        &[
            "--disk",
            "16MiB",
            "--memory",
            "128MiB",
            "--workspace",
            ws.to_str().unwrap(),
        ],
        &[
            "sh",
            "-c",
            "truncate -s 1G sparse.bin && echo new > keep.txt && echo x > other.txt",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains("over the 16777216-byte disk budget")
            && r.stderr.contains("nothing was copied back"),
        "{}",
        r.stderr
    );
    assert_eq!(listing(&ws), before, "the host workspace changed");
    no_staging_left(&ws);
}

#[test]
fn copy_back_drops_set_id_bits_and_gives_everything_to_the_directory_owner() {
    need_root!();
    let ws = scratch("ws-suid");
    std::os::unix::fs::chown(&ws, Some(65534), Some(65534)).unwrap();
    let r = run(
        &["--workspace", ws.to_str().unwrap()],
        &[
            "sh",
            "-c",
            "printf '\\177ELF-payload-marker' > payload && chmod 6755 payload && \
             mkdir -p d/e && chmod 3777 d && echo in > d/e/f && chmod 2640 d/e/f && \
             ln -s /etc/passwd link && mkfifo fifo",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let m = std::fs::symlink_metadata(ws.join("payload")).unwrap();
    assert!(m.is_file());
    assert_eq!(m.mode() & 0o7777, 0o755, "set-id bits came back");
    assert_eq!(
        (m.uid(), m.gid()),
        (65534, 65534),
        "not the directory owner's"
    );
    assert_eq!(
        std::fs::read(ws.join("payload")).unwrap(),
        b"\x7fELF-payload-marker"
    );
    let d = std::fs::metadata(ws.join("d")).unwrap();
    assert_eq!(
        d.mode() & 0o7777,
        0o777,
        "sticky/set-gid came back on a directory"
    );
    assert_eq!((d.uid(), d.gid()), (65534, 65534));
    let f = std::fs::metadata(ws.join("d/e/f")).unwrap();
    assert_eq!(f.mode() & 0o7777, 0o640);
    assert_eq!((f.uid(), f.gid()), (65534, 65534));
    // A link is never recreated (nor followed), a FIFO never copied: both named in a note.
    assert!(std::fs::symlink_metadata(ws.join("link")).is_err());
    assert!(std::fs::symlink_metadata(ws.join("fifo")).is_err());
    assert!(
        r.stderr
            .contains("symbolic links are not copied back: skipped link"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("skipped fifo"), "{}", r.stderr);
    no_staging_left(&ws);
}

#[test]
fn planted_git_hooks_are_not_copied_back_unless_asked() {
    need_root!();
    let ws = scratch("ws-git");
    std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    std::fs::write(ws.join(".git/config"), b"[core]\n").unwrap();
    std::fs::write(ws.join("README"), b"hi\n").unwrap();
    let plant = "printf '#!/bin/sh\\necho HOOK RAN\\n' > .git/hooks/post-checkout && \
                 chmod 755 .git/hooks/post-checkout && \
                 printf '[core]\\nfsmonitor = /tmp/x\\n' > .git/config && echo changed > README";
    let r = run(&["--workspace", ws.to_str().unwrap()], &["sh", "-c", plant]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        !ws.join(".git/hooks/post-checkout").exists(),
        "a hook came back"
    );
    assert_eq!(std::fs::read(ws.join(".git/config")).unwrap(), b"[core]\n");
    assert_eq!(std::fs::read(ws.join("README")).unwrap(), b"changed\n");
    assert!(
        r.stderr.contains("`.git` internals are not copied back"),
        "{}",
        r.stderr
    );
    // Asked for: it comes back (still owned by the directory's owner, no set-id bits).
    std::os::unix::fs::chown(&ws, Some(65534), Some(65534)).unwrap();
    let r = run(
        &["--workspace", ws.to_str().unwrap(), "--allow-git-internals"],
        &["sh", "-c", plant],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let hook = std::fs::metadata(ws.join(".git/hooks/post-checkout")).unwrap();
    assert_eq!(hook.permissions().mode() & 0o7777, 0o755);
    assert_eq!(hook.uid(), 65534);
    no_staging_left(&ws);
}

/// A small tmpfs mounted on a scratch directory, unmounted on drop.
struct SmallFs(PathBuf);

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_copy_back_that_fails_midway_leaves_the_workspace_as_it_was() {
    need_root!();
    let ws = scratch("ws-full");
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs"])
        .arg(&ws)
        .status()
        .unwrap();
    assert!(st.success(), "mounting a 1 MiB tmpfs on {}", ws.display());
    let _fs = SmallFs(ws.clone());
    std::fs::write(ws.join("keep.txt"), b"old").unwrap();
    std::fs::create_dir(ws.join("sub")).unwrap();
    std::fs::write(ws.join("sub/a"), b"a").unwrap();
    let before = listing(&ws);
    // 3 x 600 KiB: within the disk budget, over the host filesystem's 1 MiB.
    let r = run(
        &["--workspace", ws.to_str().unwrap()],
        &[
            "sh",
            "-c",
            "echo new > keep.txt && echo b > sub/a && for i in 1 2 3; do \
             head -c 614400 /dev/zero > big$i; chmod 4755 big$i; done",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains("No space left on device")
            && r.stderr.contains("nothing was copied back"),
        "{}",
        r.stderr
    );
    assert_eq!(listing(&ws), before, "the host workspace changed");
    no_staging_left(&ws);
}

// ---------------------------------------------------------------------------------------
// The parent: the snapshot creates (and removes) nothing next to its database.
// ---------------------------------------------------------------------------------------
