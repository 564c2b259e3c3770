//! Where the sandbox's cgroups go: this process's own cgroup in each hierarchy that carries a
//! controller we need, and the sandbox's `fork-<run_id>` beneath it, never a hierarchy root.
//!
//! cgroups-rs reads `/proc/self/cgroup` and finds the v1 mount points, and it addresses the
//! sandbox cgroups ([`HierDir::sandbox`]); the planner that joins the two is pure
//! ([`plan_v1`], [`plan_v2`]) and unit-tested on the layouts fork meets.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use cgroups_rs::fs::cgroup::get_cgroups_relative_paths;
use cgroups_rs::fs::hierarchies::{is_cgroup2_unified_mode, UNIFIED_MOUNTPOINT, V1, V2};
use cgroups_rs::fs::{Cgroup, Controllers, Hierarchy};

use super::delegate::SUPERVISOR_LEAF;
use super::{CgroupError, CgroupVersion};
use crate::ioerr::{IoContext, IoError};

/// Prefix of every sandbox cgroup.
pub(super) const PREFIX: &str = "fork-";

/// Our own cgroup path per controller, as cgroups-rs reads `/proc/self/cgroup`: a line
/// `2:cpu,cpuacct:/x` gives the keys `cpu` and `cpuacct`, the cgroup v2 line `0::/x` the key `""`.
pub(super) type OwnPaths = HashMap<String, String>;

/// The v1 controllers fork uses, and whether a sandbox needs them (freezer only helps the kill).
const V1_WANTED: [(&str, Controllers, bool); 5] = [
    ("memory", Controllers::Mem, true),
    ("pids", Controllers::Pids, true),
    ("cpu", Controllers::Cpu, true),
    ("cpuacct", Controllers::CpuAcct, true),
    ("freezer", Controllers::Freezer, false),
];

/// One hierarchy: which of our controllers it carries and where our own cgroup is in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct HierDir {
    pub(super) controllers: Vec<&'static str>,
    /// Our own cgroup's directory.
    pub(super) own_dir: PathBuf,
    /// The same, relative to the hierarchy's mount point (empty at the hierarchy's root), as
    /// cgroups-rs addresses cgroups.
    pub(super) own_rel: PathBuf,
}

impl HierDir {
    /// The sandbox cgroup `name` beneath our own cgroup: its directory and a cgroups-rs handle
    /// limited to our controllers (a stock v1 hierarchy lists every mounted controller, and a
    /// handle on all of them would create `name` in cpuset, devices, ... too). Nothing is
    /// created here. The stock hierarchies' `remove_task`, `move_task_to_parent` and
    /// `root_control_group` address the real hierarchy root: fork never calls them.
    pub(super) fn sandbox(&self, version: CgroupVersion, name: &str) -> (PathBuf, Cgroup) {
        let hierarchy: Box<dyn Hierarchy> = match version {
            CgroupVersion::V1 => Box::new(v1_hierarchy()),
            CgroupVersion::V2 => Box::new(V2::new()),
        };
        let controllers = self.controllers.iter().map(|c| c.to_string()).collect();
        let cgroup = Cgroup::load_with_specified_controllers(
            hierarchy,
            self.own_rel.join(name),
            controllers,
        );
        (self.own_dir.join(name), cgroup)
    }
}

impl HierDir {
    /// The hierarchy's mount point: our own directory without our own path in it.
    fn mount_point(&self) -> Option<&Path> {
        self.own_dir
            .ancestors()
            .nth(self.own_rel.components().count())
    }
}

/// The layout that addresses exactly the cgroups a run directory recorded for `run_id`
/// (`fork gc` removes a dead supervisor's cgroups wherever they are, not only beneath its
/// own cgroup). Each path must be absolute and plain (no `..`), be named `fork-<run_id>`,
/// lie beneath the mount point of a hierarchy this host's layout uses (on v2 the unified
/// one; on v1 the hierarchy then gives the controllers) and sit on a cgroup filesystem;
/// anything else is refused (`NotOurs`), never touched.
pub(super) fn layout_of_recorded(
    host: &Layout,
    run_id: &str,
    paths: &[PathBuf],
) -> Result<Layout, CgroupError> {
    validate_run_id(run_id)?;
    let name = format!("{PREFIX}{run_id}");
    let mut dirs: Vec<HierDir> = Vec::new();
    for path in paths {
        let refuse = |detail: &'static str| CgroupError::NotOurs {
            path: path.clone(),
            run_id: run_id.to_string(),
            detail,
        };
        let plain = path.is_absolute()
            && path
                .components()
                .skip(1)
                .all(|c| matches!(c, Component::Normal(_)));
        if !plain {
            return Err(refuse("not an absolute plain path"));
        }
        if path.file_name().and_then(|n| n.to_str()) != Some(name.as_str()) {
            return Err(refuse("not named after the run"));
        }
        let parent = path.parent().unwrap_or(Path::new("/"));
        let hier = host.dirs.iter().find_map(|d| {
            let point = d.mount_point()?;
            let rel = parent.strip_prefix(point).ok()?;
            Some((d, rel.to_path_buf()))
        });
        let Some((hier, own_rel)) = hier else {
            return Err(refuse("outside every cgroup hierarchy fork uses here"));
        };
        if !on_cgroup_fs(parent) {
            return Err(refuse("its parent is not on a cgroup filesystem"));
        }
        if dirs.iter().any(|d| d.own_dir == parent) {
            continue;
        }
        dirs.push(HierDir {
            controllers: hier.controllers.clone(),
            own_dir: parent.to_path_buf(),
            own_rel,
        });
    }
    Ok(Layout {
        version: host.version,
        dirs,
        missing: Vec::new(),
    })
}

/// Whether `dir` is on a cgroup (v1 or v2) filesystem.
fn on_cgroup_fs(dir: &Path) -> bool {
    use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC};
    statfs(dir).is_ok_and(|s| {
        let t = s.filesystem_type();
        t == CGROUP2_SUPER_MAGIC || t == CGROUP_SUPER_MAGIC
    })
}

/// Every hierarchy fork uses on this host.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    pub(super) version: CgroupVersion,
    pub(super) dirs: Vec<HierDir>,
    /// Required controllers not found (create fails when non-empty).
    pub(super) missing: Vec<String>,
}

/// Our own cgroup path relative to the mount's root, which is the mount point's directory.
///
/// Hand-written rather than cgroups-rs's `existing_path`: that one strips the mount root as a
/// string prefix (`/docker/c1` would also strip `/docker/c10/app`) and keeps a path outside the
/// mount root or with `..` as it is, which would place the sandbox outside our own cgroup.
fn rel_to_mount_root(mount_root: &Path, own_path: &str) -> Option<PathBuf> {
    let rel = Path::new(own_path).strip_prefix(mount_root).ok()?;
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    Some(rel.to_path_buf())
}

/// The root (4th field) of the cgroup2 mount at `mount_point` in a mountinfo text.
///
/// Hand-written: cgroups-rs's mountinfo reader keeps only v1 (`cgroup`) mounts.
fn cgroup2_mount_root(mountinfo: &str, mount_point: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let fields: Vec<&str> = left.split(' ').collect();
        let fstype = right.split(' ').next()?;
        if fstype == "cgroup2" && fields.get(4) == Some(&mount_point) {
            fields.get(3).map(PathBuf::from)
        } else {
            None
        }
    })
}

/// A run id usable as the cgroup name `fork-<run_id>` (and not the supervisor's own leaf).
pub(super) fn validate_run_id(run_id: &str) -> Result<(), CgroupError> {
    let ok = !run_id.is_empty()
        && run_id.len() <= 64
        && !run_id.starts_with('.')
        && run_id != "supervisor"
        && run_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(CgroupError::InvalidRunId {
            run_id: run_id.to_string(),
        })
    }
}

/// The v1 layout: each wanted controller's mount (`mount_of`, cgroups-rs's `V1::get_mount_point`
/// on a host) joined with our own cgroup in it. Co-mounted controllers share one directory.
pub(super) fn plan_v1(
    own: &OwnPaths,
    mount_of: impl Fn(Controllers) -> Option<(PathBuf, PathBuf)>,
) -> Layout {
    let mut dirs: Vec<HierDir> = Vec::new();
    let mut missing = Vec::new();
    for (name, ctl, required) in V1_WANTED {
        let found = mount_of(ctl).and_then(|(point, root)| {
            let own_rel = rel_to_mount_root(&root, own.get(name)?)?;
            Some((point.join(&own_rel), own_rel))
        });
        match found {
            Some((own_dir, own_rel)) => match dirs.iter_mut().find(|d| d.own_dir == own_dir) {
                Some(d) => d.controllers.push(name),
                None => dirs.push(HierDir {
                    controllers: vec![name],
                    own_dir,
                    own_rel,
                }),
            },
            None if required => missing.push(name.to_string()),
            None => {}
        }
    }
    Layout {
        version: CgroupVersion::V1,
        dirs,
        missing,
    }
}

/// The v2 layout: our own cgroup in the unified hierarchy mounted at [`UNIFIED_MOUNTPOINT`]
/// from `mount_root`. When fork already moved itself into its supervisor leaf, our own cgroup
/// is that leaf's parent, so sandboxes stay siblings of the leaf.
pub(super) fn plan_v2(own: &OwnPaths, mount_root: &Path) -> Result<Layout, CgroupError> {
    let own_path = own.get("").ok_or_else(|| CgroupError::OwnCgroup {
        detail: "no `0::` line in /proc/self/cgroup on a cgroup v2 host".into(),
        fix: "mount /proc and run fork on a kernel with cgroup v2".into(),
    })?;
    let mut own_rel =
        rel_to_mount_root(mount_root, own_path).ok_or_else(|| CgroupError::OwnCgroup {
            detail: format!(
                "own cgroup {own_path:?} is outside the cgroup2 mount root {mount_root:?}"
            ),
            fix: "run fork in a cgroup namespace whose root is visible at /sys/fs/cgroup".into(),
        })?;
    if own_rel.file_name().is_some_and(|n| n == SUPERVISOR_LEAF) {
        own_rel.pop();
    }
    Ok(Layout {
        version: CgroupVersion::V2,
        dirs: vec![HierDir {
            controllers: vec!["memory", "cpu", "pids", "freezer"],
            own_dir: Path::new(UNIFIED_MOUNTPOINT).join(&own_rel),
            own_rel,
        }],
        missing: Vec::new(),
    })
}

/// This host's layout.
pub(super) fn detect_layout() -> Result<Layout, CgroupError> {
    let own = get_cgroups_relative_paths().map_err(|e| {
        IoError::new(
            "reading",
            Path::new("/proc/self/cgroup"),
            io::Error::other(e),
        )
    })?;
    if is_cgroup2_unified_mode() {
        let mi_path = Path::new("/proc/self/mountinfo");
        let mountinfo = fs::read_to_string(mi_path).ctx("reading", mi_path)?;
        let mount_root =
            cgroup2_mount_root(&mountinfo, UNIFIED_MOUNTPOINT).unwrap_or_else(|| "/".into());
        return plan_v2(&own, &mount_root);
    }
    let v1 = v1_hierarchy();
    Ok(plan_v1(&own, |ctl| v1.get_mount_point(ctl)))
}

/// cgroups-rs's v1 hierarchy, read from /proc/self/mountinfo once per process (its
/// constructor parses the whole mount table; the cgroup mounts do not change under us,
/// while the run directories' mounts come and go).
fn v1_hierarchy() -> V1 {
    static V1_MOUNTS: std::sync::OnceLock<V1> = std::sync::OnceLock::new();
    V1_MOUNTS.get_or_init(V1::new).clone()
}

/// The error for required v1 controllers that are not mounted or not listed for us.
pub(super) fn missing_controllers_error(missing: Vec<String>) -> CgroupError {
    CgroupError::MissingControllers {
        fix: format!(
            "mount the cgroup v1 controllers ({}) under /sys/fs/cgroup (e.g. `mount -t cgroup -o {} cgroup /sys/fs/cgroup/{}`), or boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1)",
            missing.join(", "),
            missing[0],
            missing[0]
        ),
        missing,
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::own_v1;
    use super::*;

    fn own_paths(pairs: &[(&str, &str)]) -> OwnPaths {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The development VM: memory at `/process_api/abc`, cpu and cpuacct co-mounted at
    /// `/user.slice`, pids at the root, no freezer mounted.
    #[test]
    fn plans_v1_dirs_beneath_our_own_cgroup_in_each_hierarchy() {
        let own = own_paths(&[
            ("name=systemd", "/"),
            ("pids", "/"),
            ("memory", "/process_api/abc"),
            ("cpu", "/user.slice"),
            ("cpuacct", "/user.slice"),
            ("", "/"),
        ]);
        let mounts = |ctl: Controllers| {
            let point = match ctl {
                Controllers::Mem => "/sys/fs/cgroup/memory",
                Controllers::Pids => "/sys/fs/cgroup/pids",
                Controllers::Cpu | Controllers::CpuAcct => "/sys/fs/cgroup/cpu,cpuacct",
                _ => return None,
            };
            Some((PathBuf::from(point), PathBuf::from("/")))
        };
        let layout = plan_v1(&own, mounts);
        assert_eq!(layout.version, CgroupVersion::V1);
        assert!(layout.missing.is_empty(), "{layout:?}");
        let dir = |ctl: &str| layout.dirs.iter().find(|d| d.controllers.contains(&ctl));
        let mem = dir("memory").unwrap();
        assert_eq!(
            mem.own_dir,
            PathBuf::from("/sys/fs/cgroup/memory/process_api/abc")
        );
        assert_eq!(mem.own_rel, PathBuf::from("process_api/abc"));
        let cpu = dir("cpu").unwrap();
        assert_eq!(cpu.controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(
            cpu.own_dir,
            PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/user.slice")
        );
        let pids = dir("pids").unwrap();
        assert_eq!(pids.own_dir, PathBuf::from("/sys/fs/cgroup/pids"));
        assert_eq!(pids.own_rel, PathBuf::new());
        assert!(dir("freezer").is_none());
        assert_eq!(layout.dirs.len(), 3);

        // The sandbox goes beneath our own cgroup, never in place of it.
        let (path, cgroup) = pids.sandbox(CgroupVersion::V1, "fork-x");
        assert_eq!(path, PathBuf::from("/sys/fs/cgroup/pids/fork-x"));
        assert_eq!(cgroup.path(), "fork-x");
        let (path, cgroup) = mem.sandbox(CgroupVersion::V1, "fork-x");
        assert_eq!(
            path,
            PathBuf::from("/sys/fs/cgroup/memory/process_api/abc/fork-x")
        );
        assert_eq!(cgroup.path(), "process_api/abc/fork-x");

        // A required controller with no mount, or absent from /proc/self/cgroup, is missing.
        let no_memory = plan_v1(&own, |ctl| match ctl {
            Controllers::Mem => None,
            other => mounts(other),
        });
        assert_eq!(no_memory.missing, vec!["memory".to_string()]);
        let unlisted = plan_v1(&own_paths(&[("cpu", "/"), ("cpuacct", "/")]), mounts);
        assert_eq!(
            unlisted.missing,
            vec!["memory".to_string(), "pids".to_string()]
        );
    }

    #[test]
    fn plans_v2_in_our_own_cgroup_and_steps_out_of_the_supervisor_leaf() {
        let session = "/user.slice/user-1000.slice/session-3.scope";
        let layout = plan_v2(&own_paths(&[("", session)]), Path::new("/")).unwrap();
        assert_eq!(layout.version, CgroupVersion::V2);
        assert_eq!(layout.dirs.len(), 1);
        assert_eq!(
            layout.dirs[0].own_dir,
            PathBuf::from("/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope")
        );
        let leaf = format!("{session}/{SUPERVISOR_LEAF}");
        let layout = plan_v2(&own_paths(&[("", &leaf)]), Path::new("/")).unwrap();
        assert_eq!(
            layout.dirs[0].own_rel,
            PathBuf::from("user.slice/user-1000.slice/session-3.scope")
        );
        // A container bind-mounting its own subtree: the mount root is stripped.
        let layout = plan_v2(
            &own_paths(&[("", "/docker/c1/app")]),
            Path::new("/docker/c1"),
        )
        .unwrap();
        assert_eq!(layout.dirs[0].own_dir, PathBuf::from("/sys/fs/cgroup/app"));
        assert!(matches!(
            plan_v2(&own_paths(&[("memory", "/")]), Path::new("/")),
            Err(CgroupError::OwnCgroup { .. })
        ));
        assert!(matches!(
            plan_v2(&own_paths(&[("", "/b")]), Path::new("/a")),
            Err(CgroupError::OwnCgroup { .. })
        ));
    }

    /// cgroups-rs's reading of `/proc/self/cgroup` agrees, on this host, with an independent
    /// reading of every line (a v1 line per hierarchy, split at its controllers; `0::` as `""`).
    #[test]
    fn own_paths_match_proc_self_cgroup_on_this_host() {
        let own = get_cgroups_relative_paths().unwrap();
        let text = fs::read_to_string("/proc/self/cgroup").unwrap();
        let controllers: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split(':').nth(1))
            .flat_map(|c| c.split(','))
            .collect();
        assert!(!controllers.is_empty(), "{text}");
        for ctl in controllers {
            assert_eq!(own.get(ctl), Some(&own_v1(ctl)), "{ctl:?}");
        }
    }

    #[test]
    fn builds_own_dirs_relative_to_the_mount_root() {
        // Our cgroup directory: the mount point plus our cgroup path relative to the mount's root.
        let join_own_dir = |mount_point: &Path, mount_root: &Path, own_path: &str| {
            rel_to_mount_root(mount_root, own_path).map(|rel| mount_point.join(rel))
        };
        let dir = join_own_dir(
            Path::new("/sys/fs/cgroup/memory"),
            Path::new("/"),
            "/process_api/abc",
        );
        assert_eq!(
            dir,
            Some(PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"))
        );
        assert_eq!(
            join_own_dir(Path::new("/sys/fs/cgroup/pids"), Path::new("/"), "/"),
            Some(PathBuf::from("/sys/fs/cgroup/pids"))
        );
        // A container bind-mounting its own subtree: the mount root is stripped.
        assert_eq!(
            join_own_dir(
                Path::new("/sys/fs/cgroup"),
                Path::new("/docker/c1"),
                "/docker/c1/app"
            ),
            Some(PathBuf::from("/sys/fs/cgroup/app"))
        );
        // Outside the mount root (cgroup namespace confusion) and `..` are refused.
        assert_eq!(
            join_own_dir(Path::new("/sys/fs/cgroup"), Path::new("/a"), "/b"),
            None
        );
        assert_eq!(
            join_own_dir(Path::new("/sys/fs/cgroup"), Path::new("/"), "/../x"),
            None
        );
        // A sibling whose name only starts like the mount root is outside it.
        assert_eq!(
            join_own_dir(
                Path::new("/sys/fs/cgroup"),
                Path::new("/docker/c1"),
                "/docker/c10/app"
            ),
            None
        );
    }

    #[test]
    fn finds_the_cgroup2_mount_root() {
        let mi = "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n\
                  31 23 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount_root(mi, "/sys/fs/cgroup"),
            Some(PathBuf::from("/"))
        );
        let container = "40 30 0:26 /docker/c1 /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount_root(container, "/sys/fs/cgroup"),
            Some(PathBuf::from("/docker/c1"))
        );
        assert_eq!(cgroup2_mount_root(mi, "/elsewhere"), None);
    }

    /// Recorded paths are taken only when they are fork's cgroup of that run, beneath a
    /// hierarchy this host's layout uses, on a cgroup filesystem.
    #[test]
    fn recorded_paths_are_checked_before_they_are_addressed() {
        let host = detect_layout().unwrap();
        let d = &host.dirs[0];
        let ours = d.own_dir.join("somewhere/fork-abc");
        let refused = |paths: &[PathBuf]| {
            matches!(
                layout_of_recorded(&host, "abc", paths),
                Err(CgroupError::NotOurs { .. })
            )
        };
        // A directory of another name, another run, outside the hierarchies, with `..`,
        // relative, or on another filesystem.
        assert!(refused(&[d.own_dir.join("somewhere/user.slice")]));
        assert!(refused(&[d.own_dir.join("fork-abd")]));
        assert!(refused(&[PathBuf::from("/tmp/fork-abc")]));
        assert!(refused(&[d.own_dir.join("../x/fork-abc")]));
        assert!(refused(&[PathBuf::from("sys/fs/cgroup/fork-abc")]));
        let tmp = tempfile::tempdir().unwrap();
        let mut fake = host.clone();
        fake.dirs[0].own_dir = tmp.path().to_path_buf();
        fake.dirs[0].own_rel = PathBuf::new();
        assert!(matches!(
            layout_of_recorded(&fake, "abc", &[tmp.path().join("fork-abc")]),
            Err(CgroupError::NotOurs { detail, .. }) if detail.contains("cgroup filesystem")
        ));
        assert!(layout_of_recorded(&host, "a/b", std::slice::from_ref(&ours)).is_err());
        // Fork's cgroup of the run, beneath our hierarchy: addressed there with its controllers.
        let l = layout_of_recorded(&host, "abc", std::slice::from_ref(&ours));
        // `somewhere` does not exist, so statfs fails and it is refused; its parent does.
        assert!(l.is_err());
        let here = d.own_dir.join("fork-abc");
        let l = layout_of_recorded(&host, "abc", std::slice::from_ref(&here)).unwrap();
        assert_eq!(l.version, host.version);
        assert_eq!(l.dirs.len(), 1);
        assert_eq!(l.dirs[0].own_dir, d.own_dir);
        assert_eq!(l.dirs[0].own_rel, d.own_rel);
        assert_eq!(l.dirs[0].controllers, d.controllers);
    }

    #[test]
    fn run_ids() {
        assert!(validate_run_id("3f2a-run_1.x").is_ok());
        for bad in ["", "..", ".hidden", "a/b", "supervisor", &"x".repeat(65)] {
            assert!(validate_run_id(bad).is_err(), "{bad:?}");
        }
    }
}
