//! What `fork check` reports about cgroups: the version, which controllers fork can use, whether
//! a child cgroup can be created beneath our own (by creating and removing a probe cgroup with
//! limits), and the fix for each problem found.

use std::fs;
use std::path::PathBuf;

use super::delegate::{read_words, V2_CONTROLLERS};
use super::layout::{detect_layout, missing_controllers_error};
use super::{CgroupError, CgroupLimits, CgroupVersion, SandboxCgroup};

/// One controller as seen by [`probe`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct ControllerProbe {
    /// `memory`, `cpu`, `cpuacct`, `pids`, `freezer`.
    pub name: String,
    /// Whether fork can use it.
    pub usable: bool,
    /// Our own cgroup in its hierarchy.
    pub own_cgroup: Option<PathBuf>,
}

/// A problem found by [`probe`], with its fix.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CgroupProblem {
    /// What is wrong.
    pub what: String,
    /// How to fix it.
    pub fix: String,
}

/// What `fork check` reports about cgroups.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CgroupProbe {
    /// The interface in use, when one was found.
    pub version: Option<CgroupVersion>,
    /// Every controller fork uses.
    pub controllers: Vec<ControllerProbe>,
    /// A probe cgroup could be created (with limits) and removed.
    pub can_create: bool,
    /// Memory limits also bound swap (or the host has no swap).
    pub swap_limited: bool,
    /// Problems and their fixes.
    pub problems: Vec<CgroupProblem>,
    /// Budgets can be enforced here: a version was found, every required controller is
    /// usable and a child cgroup could be created and removed.
    pub usable: bool,
    /// The fix of every problem, in order, without repeats.
    pub fix: Vec<String>,
}

impl CgroupProbe {
    /// One line for `fork check`.
    pub fn summary(&self) -> String {
        let Some(version) = self.version else {
            return "no usable cgroup hierarchy found".into();
        };
        let v = match version {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        };
        let usable: Vec<&str> = self
            .controllers
            .iter()
            .filter(|c| c.usable)
            .map(|c| c.name.as_str())
            .collect();
        let unusable: Vec<&str> = self
            .controllers
            .iter()
            .filter(|c| !c.usable)
            .map(|c| c.name.as_str())
            .collect();
        let mut out = format!("cgroup {v}: controllers {}", usable.join(", "));
        if !unusable.is_empty() {
            out.push_str(&format!(" (unavailable: {})", unusable.join(", ")));
        }
        out.push_str(if self.can_create {
            "; child cgroups can be created beneath our own cgroup"
        } else {
            "; cannot create a child cgroup"
        });
        if self.can_create && !self.swap_limited {
            out.push_str("; memory limits do not bound swap");
        }
        out
    }
}

fn host_has_swap() -> bool {
    fs::read_to_string("/proc/swaps")
        .map(|t| t.lines().skip(1).any(|l| !l.trim().is_empty()))
        .unwrap_or(false)
}

/// For `fork check`: the version, which controllers are usable, whether a child cgroup can be
/// created (by creating and removing a probe cgroup with limits), and the fix for each problem.
pub fn probe() -> CgroupProbe {
    let mut out = CgroupProbe {
        version: None,
        controllers: Vec::new(),
        can_create: false,
        swap_limited: false,
        problems: Vec::new(),
        usable: false,
        fix: Vec::new(),
    };
    let layout = match detect_layout() {
        Ok(l) => l,
        Err(e) => {
            let fix = match &e {
                CgroupError::OwnCgroup { fix, .. } => fix.clone(),
                _ => "mount /proc and the cgroup filesystems under /sys/fs/cgroup".into(),
            };
            out.problems.push(CgroupProblem {
                what: e.to_string(),
                fix,
            });
            return finish_probe(out);
        }
    };
    out.version = Some(layout.version);
    let names: &[&str] = match layout.version {
        CgroupVersion::V1 => &["memory", "pids", "cpu", "cpuacct", "freezer"],
        CgroupVersion::V2 => &V2_CONTROLLERS,
    };
    let v2_available = match layout.version {
        CgroupVersion::V2 => layout
            .dirs
            .first()
            .and_then(|d| read_words(&d.own_dir.join("cgroup.controllers")).ok())
            .unwrap_or_default(),
        CgroupVersion::V1 => Vec::new(),
    };
    for &name in names {
        let dir = layout
            .dirs
            .iter()
            .find(|d| d.controllers.contains(&name))
            .map(|d| d.own_dir.clone());
        let usable = match layout.version {
            CgroupVersion::V1 => dir.is_some(),
            CgroupVersion::V2 => v2_available.iter().any(|a| a == name),
        };
        out.controllers.push(ControllerProbe {
            name: name.to_string(),
            usable,
            own_cgroup: dir,
        });
    }
    if !layout.missing.is_empty() {
        if let CgroupError::MissingControllers { fix, .. } =
            missing_controllers_error(layout.missing.clone())
        {
            out.problems.push(CgroupProblem {
                what: format!(
                    "cgroup v1 controllers missing: {}",
                    layout.missing.join(", ")
                ),
                fix,
            });
        }
    }
    let probe_id = format!("probe-{}", uuid::Uuid::new_v4().simple());
    let limits = CgroupLimits {
        memory_bytes: Some(64 << 20),
        cpu_percent: Some(100),
        pids: Some(64),
    };
    match SandboxCgroup::create(&probe_id, &limits) {
        Ok(cg) => {
            out.swap_limited = match cg.dir_of("memory") {
                Some(d) if cg.version == CgroupVersion::V1 => {
                    d.join("memory.memsw.limit_in_bytes").exists() || !host_has_swap()
                }
                Some(d) => d.join("memory.swap.max").exists() || !host_has_swap(),
                None => false,
            };
            match cg.destroy() {
                Ok(()) => out.can_create = true,
                Err(e) => out.problems.push(CgroupProblem {
                    what: format!("the probe cgroup could not be removed: {e}"),
                    fix: "run `fork gc`".into(),
                }),
            }
            if !out.swap_limited {
                out.problems.push(CgroupProblem {
                    what: "memory limits do not bound swap (no swap accounting), so a sandbox \
                           may swap instead of being OOM-killed"
                        .into(),
                    fix: "boot with swapaccount=1 (cgroup v1) or enable the swap controller, \
                          or run without swap"
                        .into(),
                });
            }
        }
        Err(e) => {
            let fix = match &e {
                CgroupError::NotDelegated { fix, .. }
                | CgroupError::InternalProcesses { fix, .. }
                | CgroupError::MissingControllers { fix, .. }
                | CgroupError::OwnCgroup { fix, .. } => fix.clone(),
                CgroupError::NoSocketAccounting { .. } => super::SOCKET_ACCOUNTING_FIX.into(),
                _ if !nix::unistd::geteuid().is_root() => match layout.version {
                    CgroupVersion::V2 => super::DELEGATE_FIX.into(),
                    CgroupVersion::V1 => V1_USER_FIX.into(),
                },
                _ => "run fork in a delegated cgroup (`systemd-run --scope -p Delegate=yes fork ...`)".into(),
            };
            out.problems.push(CgroupProblem {
                what: format!("cannot create a child cgroup: {e}"),
                fix,
            });
        }
    }
    finish_probe(out)
}

/// The fix for a user on a cgroup v1 host: v1 hierarchies are not delegated to users.
pub const V1_USER_FIX: &str = "this host's cgroups are v1, which are not delegated to users: on a host booted with cgroup v2 (systemd.unified_cgroup_hierarchy=1, the default of current distributions) start fork as `systemd-run --user --scope -p Delegate=yes fork ...`; here, set [layers] cgroup = \"optional\" and cgroupns = \"optional\" in the policy (no budgets then: the verdict's isolation block records it)";

/// Fills the derived fields of a probe.
fn finish_probe(mut out: CgroupProbe) -> CgroupProbe {
    let required_ok = out
        .controllers
        .iter()
        .filter(|c| c.name != "freezer")
        .all(|c| c.usable);
    out.usable = out.version.is_some() && required_ok && out.can_create;
    for p in &out.problems {
        if !out.fix.contains(&p.fix) {
            out.fix.push(p.fix.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::delegate::DELEGATE_FIX;
    use super::*;

    #[test]
    fn probe_summary_and_fixes_for_an_undelegated_v2_host() {
        let problem = CgroupProblem {
            what: "controllers not delegated".into(),
            fix: DELEGATE_FIX.into(),
        };
        let p = finish_probe(CgroupProbe {
            version: Some(CgroupVersion::V2),
            controllers: V2_CONTROLLERS
                .iter()
                .map(|n| ControllerProbe {
                    name: n.to_string(),
                    usable: *n != "memory",
                    own_cgroup: Some(PathBuf::from("/sys/fs/cgroup/user.slice")),
                })
                .collect(),
            can_create: false,
            swap_limited: false,
            problems: vec![problem.clone(), problem],
            usable: true,
            fix: Vec::new(),
        });
        assert!(!p.usable);
        assert_eq!(p.fix, vec![DELEGATE_FIX.to_string()]);
        assert!(p.fix[0].contains("Delegate=yes"));
        let summary = p.summary();
        assert!(summary.contains("cgroup v2"), "{summary}");
        assert!(summary.contains("unavailable: memory"), "{summary}");
        assert!(summary.contains("cannot create"), "{summary}");
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["version"], "v2");
    }

    #[test]
    fn probe_reports_this_host() {
        let p = probe();
        assert!(p.can_create, "{p:?}");
        let (names, tag): (&[&str], &str) = match p.version {
            Some(CgroupVersion::V1) => (&["memory", "pids", "cpu", "cpuacct"], "v1"),
            Some(CgroupVersion::V2) => (&V2_CONTROLLERS, "v2"),
            None => panic!("no cgroup version detected: {p:?}"),
        };
        for &name in names {
            let c = p.controllers.iter().find(|c| c.name == name).unwrap();
            assert!(c.usable && c.own_cgroup.is_some(), "{c:?}");
        }
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["version"], tag);
        assert!(p.usable, "{p:?}");
        for problem in &p.problems {
            assert!(p.fix.contains(&problem.fix), "{p:?}");
        }
        assert!(
            p.summary()
                .starts_with(&format!("cgroup {tag}: controllers ")),
            "{}",
            p.summary()
        );
    }
}
