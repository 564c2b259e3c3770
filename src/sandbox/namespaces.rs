//! Namespace work around the clone: the init entering its cgroup namespace and naming its
//! host, the supervisor writing the init's uid/gid maps and joining its network namespace
//! from a helper thread. The namespaces themselves are created by the clone (see
//! `sys::clone_init`).

use super::SandboxError;
use crate::ioerr::IoContext;
use nix::sched::CloneFlags;
use std::path::PathBuf;

/// In the init (already moved into the sandbox cgroup): a cgroup namespace rooted there,
/// so the command sees its own cgroup as `/`.
pub fn enter_cgroupns() -> Result<(), String> {
    nix::sched::unshare(CloneFlags::CLONE_NEWCGROUP)
        .map_err(|e| format!("unshare(CLONE_NEWCGROUP): {e}"))
}

/// In the init: the host name of its UTS namespace.
pub fn set_hostname(name: &str) -> Result<(), String> {
    nix::unistd::sethostname(name).map_err(|e| format!("sethostname: {e}"))
}

/// In the supervisor: maps uid and gid 0 of the init's user namespace to `uid` and `gid`
/// on the host. An unprivileged writer (`deny_setgroups`) may only map its gid once
/// setgroups is denied.
pub fn write_id_maps(
    pid: i32,
    uid: u32,
    gid: u32,
    deny_setgroups: bool,
) -> Result<(), SandboxError> {
    if deny_setgroups {
        write_proc(pid, "setgroups", "deny")?;
    }
    write_proc(pid, "uid_map", &format!("0 {uid} 1\n"))?;
    write_proc(pid, "gid_map", &format!("0 {gid} 1\n"))
}

fn write_proc(pid: i32, file: &str, content: &str) -> Result<(), SandboxError> {
    let path = PathBuf::from(format!("/proc/{pid}/{file}"));
    Ok(std::fs::write(&path, content).ctx("write", &path)?)
}

/// Moves the calling thread (only it: setns affects one thread) into the network
/// namespace of process `pid`. On failure: the step that failed and why.
pub fn join_netns_of(pid: i32) -> Result<(), (&'static str, String)> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .map_err(|e| ("open the sandbox's network namespace", e.to_string()))?;
    nix::sched::setns(&ns, CloneFlags::CLONE_NEWNET)
        .map_err(|e| ("setns into the sandbox's network namespace", e.to_string()))
}

/// How long one private mount namespace serves the clones of a process (see
/// [`with_private_mounts`]): an evaluation's sandboxes share it; then a thread lets go of
/// it, so that a long-lived process (a mesh node) neither shows its sandboxes a stale host
/// mount table for long nor pins mounts the host has since detached.
const TEMPLATE_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// The private mount namespace the inits are cloned from, what it was built to detach,
/// and when it was built.
struct Template {
    ns: std::fs::File,
    detach: Vec<PathBuf>,
    built: std::time::Instant,
}

static TEMPLATE: std::sync::Mutex<Option<Template>> = std::sync::Mutex::new(None);

/// In the supervisor (as root): runs `f` (the clone of the init) with the calling thread in
/// a private copy of its mount namespace in which every mount at or beneath a `detach`
/// path (only beneath, for the run root), and every mount inside a fork run directory (any run root's: other fork
/// processes' runs too), is detached, then returns the thread to its own namespace and working directory.
/// The init's mount namespace, copied from that one, never holds those mounts (mounts it
/// inherits are locked: it could not detach them itself). The host is never affected: the
/// copy is made private before anything is detached, so no mount made later on the host
/// (the next sandboxes' disks) ever propagates into it.
///
/// The copy is built once and then reused by every clone for [`TEMPLATE_TTL`]: building
/// it copies the whole host mount table and detaches each of those mounts, and every
/// detach, like dropping the copy, waits for an RCU grace period of the kernel (which
/// under load costs milliseconds each).
pub fn with_private_mounts<R>(detach: &[PathBuf], f: impl FnOnce() -> R) -> Result<R, String> {
    let own = own_mount_ns()?;
    let cwd = nix::fcntl::open(
        ".",
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| format!("open the working directory: {e}"))?;
    let template = template(detach, &own)?;
    crate::trace::mark("sandbox: mount template ready");
    // A thread sharing its root and working directory with others (any thread it has
    // started, the expiry thread `template` starts included) may not change its mount
    // namespace.
    nix::sched::unshare(CloneFlags::CLONE_FS)
        .map_err(|e| format!("unshare(CLONE_FS) in the supervising thread: {e}"))?;
    nix::sched::setns(&template, CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("enter the private mount namespace: {e}"))?;
    let r = f();
    // Back to the supervisor's own namespace (setns also moves the thread's root and
    // working directory to that namespace's root: restore the latter).
    nix::sched::setns(&own, CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("return to the supervisor's mount namespace: {e}"))?;
    nix::unistd::fchdir(&cwd).map_err(|e| format!("return to the working directory: {e}"))?;
    Ok(r)
}

impl Template {
    fn is_fresh_for(&self, detach: &[PathBuf]) -> bool {
        self.detach == detach && self.built.elapsed() < TEMPLATE_TTL
    }
}

fn own_mount_ns() -> Result<std::fs::File, String> {
    std::fs::File::open("/proc/thread-self/ns/mnt")
        .map_err(|e| format!("open this thread's mount namespace: {e}"))
}

/// A handle on the private mount namespace (see [`with_private_mounts`]): the fresh one
/// at hand, or one built now (the calling thread back in `own` afterwards).
fn template(detach: &[PathBuf], own: &std::fs::File) -> Result<std::fs::File, String> {
    let mut slot = TEMPLATE.lock().unwrap_or_else(|p| p.into_inner());
    if !slot.as_ref().is_some_and(|t| t.is_fresh_for(detach)) {
        // The old copy (if any) goes when the last clone made from it has let it go.
        *slot = None;
        let ns = build_template(detach);
        // Back in our own namespace whatever happened.
        nix::sched::setns(own, CloneFlags::CLONE_NEWNS)
            .map_err(|e| format!("return to the supervisor's mount namespace: {e}"))?;
        let built = std::time::Instant::now();
        *slot = Some(Template {
            ns: ns?,
            detach: detach.to_vec(),
            built,
        });
        // Let go of it once it is stale, even if no clone comes to replace it (then
        // dropping it, and its grace period, happens on that thread, not on a launch).
        let _ = std::thread::Builder::new()
            .name("fork-mounts-expiry".into())
            .spawn(move || {
                std::thread::sleep(TEMPLATE_TTL);
                let mut slot = TEMPLATE.lock().unwrap_or_else(|p| p.into_inner());
                if slot.as_ref().is_some_and(|t| t.built == built) {
                    *slot = None;
                }
            });
    }
    slot.as_ref()
        .map(|t| t.ns.try_clone())
        .transpose()
        .map_err(|e| format!("hold the private mount namespace: {e}"))?
        .ok_or_else(|| "no private mount namespace".to_string())
}

/// What the private mount namespace the init is copied from leaves out: every run root
/// (the other sandboxes' disks and roots, the evaluations' staging areas) and the host's
/// cgroup mounts.
pub(super) fn detached_in_private_mounts() -> Vec<PathBuf> {
    let mut d = crate::rundir::run_roots();
    d.push(PathBuf::from("/sys/fs/cgroup"));
    d
}

/// Builds the private copy (see [`with_private_mounts`]) and returns a handle on it; leaves
/// the calling thread inside it (the caller returns it to its own).
fn build_template(detach: &[PathBuf]) -> Result<std::fs::File, String> {
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    nix::sched::unshare(CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("unshare(CLONE_NEWNS) in the supervising thread: {e}"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("make the private mount namespace private: {e}"))?;
    let table = std::fs::read_to_string("/proc/thread-self/mountinfo")
        .map_err(|e| format!("read the mount table: {e}"))?;
    let run_roots = crate::rundir::run_roots();
    let mut points: Vec<PathBuf> = table
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(super::reclaim::unescape_mountinfo))
        .filter(|p| {
            // At or beneath, but a mount holding a run root (the run root itself when it
            // is a tmpfs, `/dev/shm` say) holds the sandbox's root directory and stays.
            (detach.iter().any(|d| p.starts_with(d)) && !run_roots.iter().any(|r| r.starts_with(p)))
                || p.components()
                    .any(|c| crate::rundir::is_run_dir_name(&c.as_os_str().to_string_lossy()))
        })
        .collect();
    points.sort_by_key(|p| p.components().count());
    points.dedup();
    let mut detached: Vec<PathBuf> = Vec::new();
    for p in points {
        // Detaching a mount takes those beneath it (one detach, one RCU grace period, for
        // /sys/fs/cgroup and every hierarchy in it).
        if detached.iter().any(|d| p.starts_with(d)) {
            continue;
        }
        match umount2(&p, MntFlags::MNT_DETACH) {
            Ok(()) => detached.push(p),
            Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => {}
            Err(e) => return Err(format!("detach {}: {e}", p.display())),
        }
    }
    std::fs::File::open("/proc/thread-self/ns/mnt")
        .map_err(|e| format!("hold the private mount namespace: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;

    /// A tmpfs the test mounted on the host, detached however the test ends.
    struct Mounted(PathBuf);

    impl Drop for Mounted {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }

    fn tmpfs_at(p: &Path) -> Mounted {
        std::fs::create_dir(p).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            p,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some("size=4k"),
        )
        .unwrap();
        Mounted(p.to_path_buf())
    }

    /// The mount table and the mount namespace a clone made now would copy (held open,
    /// so that a namespace made later cannot reuse its number).
    fn seen_by_a_clone(detach: &[PathBuf]) -> (String, u64, std::fs::File) {
        with_private_mounts(detach, || {
            let table = std::fs::read_to_string("/proc/thread-self/mountinfo").unwrap();
            let ns = std::fs::File::open("/proc/thread-self/ns/mnt").unwrap();
            let ino = ns.metadata().unwrap().ino();
            (table, ino, ns)
        })
        .unwrap()
    }

    /// One private namespace serves the clones that follow (no copy and detaches each
    /// time), yet shows them neither the run mounts that existed when it was made nor
    /// those made since (the next sandboxes' disks).
    #[test]
    fn one_private_namespace_serves_later_clones_and_shows_no_run_mount() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: building the private mount namespace needs root");
            return;
        }
        let base = tempfile::tempdir_in(crate::rundir::sandbox_base_dir()).unwrap();
        let before = base
            .path()
            .join(format!("fork-{}", crate::rundir::new_run_id()));
        let after = base
            .path()
            .join(format!("fork-{}", crate::rundir::new_run_id()));
        let _before = tmpfs_at(&before);
        // What the supervisor passes (see supervisor::spawn_init).
        let detach = detached_in_private_mounts();
        let (first, ns_first, _held) = seen_by_a_clone(&detach);
        let _after = tmpfs_at(&after);
        let (second, ns_second, _) = seen_by_a_clone(&detach);
        let own = std::fs::metadata("/proc/thread-self/ns/mnt").unwrap().ino();
        assert_ne!(ns_first, own, "the clone's namespace is a private copy");
        assert_eq!(ns_first, ns_second, "the copy is reused");
        let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        for p in [&before, &after] {
            let p = p.to_str().unwrap();
            assert!(host.contains(p), "the host has {p} mounted");
            assert!(!first.contains(p), "{p} in the private table:\n{first}");
            assert!(!second.contains(p), "{p} in the private table:\n{second}");
        }
        assert!(
            !second.contains(" /sys/fs/cgroup"),
            "cgroup mounts left:\n{second}"
        );
    }
}
