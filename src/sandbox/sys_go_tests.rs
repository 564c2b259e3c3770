//! The init's go message ([`clone_init`], [`release_init`]) on its own, without namespaces
//! or cgroups (any user may run these): a child cloned to join v1 cgroups writes "0" to each
//! file its go carries and goes on to its exec; a go without them, a go with files it was
//! not cloned to expect, or no go at all (the supervisor gone) ends it before its exec.

use super::*;
use std::os::fd::AsFd;

/// Clones a child that execs `/bin/true` after its go, sends the go with `files` (unless
/// `go` is false: then the supervisor's end is closed instead), and returns its exit code.
fn launch(join_v1: bool, files: &[OwnedFd], go: bool) -> i32 {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let (rd, wr) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap();
    let exe = std::fs::File::open("/bin/true").unwrap();
    let argv = [CString::new("true").unwrap()];
    let (_, pidfd) = clone_init(&InitClone {
        ns_flags: 0,
        cgroup_dir: None,
        sync_rd: rd.as_fd(),
        sync_wr: wr.as_fd(),
        join_v1,
        become_root: false,
        root_supervisor: false,
        stdio: None,
        keep: &[],
        exe: exe.as_fd(),
        argv: &argv,
    })
    .unwrap();
    drop(rd);
    let wr = if go {
        release_init(wr.as_fd(), files).unwrap();
        Some(wr)
    } else {
        drop(wr);
        None
    };
    let status = nix::sys::wait::waitid(
        nix::sys::wait::Id::PIDFd(pidfd.as_fd()),
        nix::sys::wait::WaitPidFlag::WEXITED,
    )
    .unwrap();
    drop(wr);
    match status {
        nix::sys::wait::WaitStatus::Exited(_, code) => code,
        other => panic!("the child did not exit: {other:?}"),
    }
}

fn tasks_file(dir: &std::path::Path, name: &str) -> (std::path::PathBuf, OwnedFd) {
    let p = dir.join(name);
    let f = std::fs::File::create(&p).unwrap();
    (p, f.into())
}

#[test]
fn a_child_joins_what_its_go_carries_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    // Cloned to join v1 cgroups: "0" goes to each file, then the exec.
    let (a, fa) = tasks_file(dir.path(), "a");
    let (b, fb) = tasks_file(dir.path(), "b");
    assert_eq!(launch(true, &[fa, fb], true), 0);
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "0");
    assert_eq!(std::fs::read_to_string(&b).unwrap(), "0");
    // Cloned to join v1 cgroups, released without them: never runs its exec.
    assert_eq!(launch(true, &[], true), 122);
    // Not cloned to join any, sent one: refused, nothing written.
    let (c, fc) = tasks_file(dir.path(), "c");
    assert_eq!(launch(false, &[fc], true), 122);
    assert_eq!(std::fs::read_to_string(&c).unwrap(), "");
    // Neither: the exec.
    assert_eq!(launch(false, &[], true), 0);
    // No go at all (the supervisor's end closed): the child ends itself.
    assert_eq!(launch(true, &[], false), 125);
}
