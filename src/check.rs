//! `fork check`: what isolation this host offers, layer by layer, against a policy, and
//! for each missing layer the fix.

use crate::policy::{Layer, Policy, Requirement};
use crate::sandbox::{cgroup, landlock, probe, seccomp};
use serde::Serialize;

/// One row of `fork check`.
#[derive(Debug, Clone, Serialize)]
pub struct LayerReport {
    pub layer: Layer,
    pub requirement: Requirement,
    pub available: bool,
    pub detail: String,
    pub fix: String,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub kernel: String,
    pub policy: String,
    pub layers: Vec<LayerReport>,
    /// Whether each sandbox (the judge's and the subject's too) runs as a uid of its own.
    pub uids: Uids,
    /// The trial launch ([`check_with_trial`]); absent from a probe-only check.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trial: Option<Trial>,
}

/// The `uids` line of `fork check`: as root, or as a user whose subordinate id ranges fork
/// maps (newuidmap), each sandbox gets a uid of its own; otherwise they share the user's
/// (recorded as `isolation.uid_shared` in every run), and `fix` says how to change that.
#[derive(Debug, Clone, Serialize)]
pub struct Uids {
    pub distinct: bool,
    pub detail: String,
    /// Empty when distinct.
    pub fix: String,
}

/// A trial launch: `true` run in a sandbox under the policy, as `fork run` would run it.
#[derive(Debug, Clone, Serialize)]
pub struct Trial {
    /// False when a required layer was already missing (the launch would be refused).
    pub ran: bool,
    pub ok: bool,
    /// The step that failed (`layer cgroup`, `mounts`, `run directory`, ...); empty when ok.
    pub step: String,
    pub detail: String,
    /// What to do (empty when ok).
    pub fix: String,
}

impl CheckReport {
    /// True when every layer the policy requires is available (and the trial launch, when
    /// there was one, succeeded).
    pub fn ok(&self) -> bool {
        self.layers
            .iter()
            .all(|l| l.available || l.requirement != Requirement::Required)
            && self.trial.as_ref().is_none_or(|t| t.ok)
    }

    /// A table for people.
    pub fn render(&self) -> String {
        let mut s = format!("kernel {}   policy {}\n", self.kernel, self.policy);
        for l in &self.layers {
            let mark = match (l.available, l.requirement) {
                (true, _) => "ok  ",
                (false, Requirement::Required) => "MISSING",
                (false, _) => "absent",
            };
            let req = match l.requirement {
                Requirement::Required => "required",
                Requirement::Optional => "optional",
                Requirement::Off => "off",
            };
            s.push_str(&format!(
                "{:<9} {:<8} {:<7} {}\n",
                l.layer.name(),
                req,
                mark,
                l.detail
            ));
            if !l.available {
                s.push_str(&format!("{:<9} fix: {}\n", "", l.fix));
            }
        }
        s.push_str(&format!(
            "{:<9} {:<8} {:<7} {}\n",
            "uids",
            "-",
            if self.uids.distinct { "ok" } else { "shared" },
            self.uids.detail
        ));
        if !self.uids.distinct {
            s.push_str(&format!("{:<9} fix: {}\n", "", self.uids.fix));
        }
        if let Some(t) = &self.trial {
            if t.ok {
                s.push_str(&format!("trial launch: ok ({})\n", t.detail));
            } else if t.ran {
                s.push_str(&format!(
                    "trial launch: FAILED at {}: {}\n{:<9} fix: {}\n",
                    t.step, t.detail, "", t.fix
                ));
            }
        }
        let trial_failed = self.trial.as_ref().is_some_and(|t| t.ran && !t.ok);
        s.push_str(if self.ok() {
            "every layer this policy requires is available\n"
        } else if trial_failed {
            "the trial launch failed: `fork run` and `fork evaluate` would fail the same way\n"
        } else {
            "a layer this policy requires is missing: `fork run` and `fork evaluate` refuse to run (exit 69)\n"
        });
        s
    }
}

fn kernel() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// The isolation this host puts in force under `policy`, as one stable line: for every
/// layer its requirement and, unless the policy turns it off, whether this host offers it;
/// and the Landlock ABI (which decides which of its rules are enforced). The verdict cache
/// keys on it, so a verdict reached under other isolation is never reused.
pub fn isolation_in_force(policy: &Policy) -> String {
    let rep = check(policy);
    let mut line = String::new();
    for l in &rep.layers {
        let req = match l.requirement {
            Requirement::Required => "required",
            Requirement::Optional => "optional",
            Requirement::Off => "off",
        };
        let available = match (l.requirement, l.available) {
            (Requirement::Off, _) => "-",
            (_, true) => "available",
            (_, false) => "missing",
        };
        line.push_str(&format!("{}={req}/{available};", l.layer.name()));
    }
    let abi = landlock::best_abi()
        .map(|a| a.to_string())
        .unwrap_or_default();
    line.push_str(&format!("landlock_abi={abi}"));
    // A verdict reached while the sandboxes shared the user's uid is not reused once they
    // each have their own (or the other way round).
    if !rep.uids.distinct {
        line.push_str(";uids=shared");
    }
    line
}

/// Probes every layer.
pub fn check(policy: &Policy) -> CheckReport {
    let mut layers = Vec::new();
    let req = |l: Layer| policy.layers.get(l);
    for p in probe::probe_namespaces() {
        layers.push(LayerReport {
            layer: p.layer,
            requirement: req(p.layer),
            available: p.ok,
            detail: p.detail,
            fix: p.fix,
        });
    }
    let sc = seccomp::probe().and_then(|()| match &policy.seccomp {
        crate::policy::SeccompSource::Builtin => seccomp::compile_json(
            &policy.seccomp_name,
            crate::policy::DEFAULT_SECCOMP.as_bytes(),
        )
        .map(|p| {
            format!(
                "profile `{}` ready ({} filters{})",
                p.name,
                p.filter_count(),
                if seccomp::compiled_ahead(crate::policy::DEFAULT_SECCOMP.as_bytes()) {
                    ", shipped compiled"
                } else {
                    ""
                }
            )
        })
        .map_err(|e| format!("the profile does not compile: {e}")),
        crate::policy::SeccompSource::File(f) => seccomp::compile_file(f)
            .map(|p| {
                format!(
                    "profile {} compiles ({} filters)",
                    f.display(),
                    p.filter_count()
                )
            })
            .map_err(|e| format!("fix the profile: {e}")),
    });
    layers.push(match sc {
        Ok(d) => LayerReport {
            layer: Layer::Seccomp,
            requirement: req(Layer::Seccomp),
            available: true,
            detail: d,
            fix: String::new(),
        },
        Err(fix) => LayerReport {
            layer: Layer::Seccomp,
            requirement: req(Layer::Seccomp),
            available: false,
            detail: "seccomp filters unavailable or the profile is broken".into(),
            fix,
        },
    });
    layers.push(match landlock::best_abi() {
        Ok(abi) => LayerReport {
            layer: Layer::Landlock,
            requirement: req(Layer::Landlock),
            available: true,
            detail: format!(
                "Landlock ABI {abi}{}",
                match abi {
                    0..=3 => " (filesystem only)",
                    4..=5 => " (filesystem + TCP)",
                    _ => " (filesystem + TCP + signal/abstract-socket scoping)",
                }
            ),
            fix: String::new(),
        },
        Err(e) => LayerReport {
            layer: Layer::Landlock,
            requirement: req(Layer::Landlock),
            available: false,
            detail: e.reason.clone(),
            fix: e.fix.clone(),
        },
    });
    let cg = cgroup::probe();
    layers.push(LayerReport {
        layer: Layer::Cgroup,
        requirement: req(Layer::Cgroup),
        available: cg.usable,
        detail: cg.summary(),
        fix: cg.fix.join("; "),
    });
    // The cgroup namespace is rooted at the sandbox's cgroup: without one, `fork run` does
    // without it (or refuses, when it is required), and so does this report.
    if !cg.usable || req(Layer::Cgroup) == Requirement::Off {
        if let Some(ns) = layers
            .iter_mut()
            .find(|l| l.layer == Layer::Cgroupns && l.available)
        {
            ns.available = false;
            ns.detail = crate::sandbox::CGROUPNS_NEEDS_CGROUP.to_string();
            ns.fix = crate::sandbox::CGROUPNS_NEEDS_CGROUP_FIX.to_string();
        }
    }
    let root = nix::unistd::geteuid().is_root();
    let rootless = crate::sandbox::rootless::entered();
    layers.push(LayerReport {
        layer: Layer::Disk,
        requirement: req(Layer::Disk),
        available: root || rootless,
        detail: if root {
            "a size-capped tmpfs per run holds the workspace and /tmp".into()
        } else if rootless {
            "a size-capped tmpfs per run holds the workspace and /tmp, mounted in fork's own user and mount namespace".into()
        } else {
            crate::sandbox::rootless::disk_unavailable_reason()
        },
        fix: if root || rootless {
            String::new()
        } else {
            crate::sandbox::rootless::DISK_ROOTLESS_FIX.into()
        },
    });
    let (distinct, detail, fix) = crate::sandbox::rootless::uids_report();
    CheckReport {
        kernel: kernel(),
        policy: policy.origin.clone(),
        layers,
        uids: Uids {
            distinct,
            detail,
            fix,
        },
        trial: None,
    }
}

/// [`check`], then a trial launch: `true` in a sandbox built under `policy` exactly as
/// `fork run` builds it (same layer resolution, same mounts, cgroups, seccomp, Landlock), with
/// a short wall budget and without the model gateway. Whatever would make `fork run` fail
/// makes the trial fail, naming the step and the fix.
pub fn check_with_trial(policy: &Policy) -> CheckReport {
    let mut report = check(policy);
    if !report.ok() {
        report.trial = Some(Trial {
            ran: false,
            ok: false,
            step: "layers".into(),
            detail: "not launched: a required layer is missing".into(),
            fix: "see the missing layers above".into(),
        });
        return report;
    }
    let mut trial_policy = policy.clone();
    trial_policy.budgets.wall = std::time::Duration::from_secs(60);
    trial_policy.gateway = None;
    let started = std::time::Instant::now();
    let result = crate::run::run(crate::run::RunRequest {
        policy: trial_policy,
        workspace: None,
        allow_git_internals: false,
        command: vec!["true".into()],
    });
    report.trial = Some(trial_of(result, started.elapsed()));
    report
}

fn trial_of(
    result: Result<crate::run::RunResult, crate::run::RunError>,
    took: std::time::Duration,
) -> Trial {
    use crate::run::RunError;
    use crate::sandbox::SandboxError;
    let failed = |step: &str, detail: String, fix: String| Trial {
        ran: true,
        ok: false,
        step: step.to_string(),
        detail,
        fix,
    };
    match result {
        Ok(r) if r.outcome.exit_code == 0 || r.outcome.exec_error.is_some() => Trial {
            ran: true,
            ok: true,
            step: String::new(),
            detail: match &r.outcome.exec_error {
                // The sandbox was built; only this policy's root has no `true` to run.
                Some(e) => format!("sandbox built in {:.2?}; {e}", took),
                None => format!("`true` ran in the sandbox in {:.2?}", took),
            },
            fix: String::new(),
        },
        Ok(r) => failed(
            "command",
            format!(
                "`true` ended with {} (budget exceeded: {:?})",
                r.outcome.exit_code,
                r.outcome.budget_exceeded.map(|b| b.as_str())
            ),
            "a budget of the policy is too small to start a process: raise it".into(),
        ),
        Err(RunError::Sandbox(SandboxError::LayerUnavailable { layer, reason, fix })) => {
            failed(&format!("layer {}", layer.name()), reason, fix)
        }
        Err(RunError::Sandbox(SandboxError::Setup { stage, message })) => {
            let fix = setup_fix(&stage);
            failed(&stage, message, fix)
        }
        Err(RunError::Sandbox(e @ SandboxError::RunDir(_))) => failed(
            "run directory",
            e.to_string(),
            "set FORK_RUN_ROOT to a writable directory every directory above which is searchable by others (or leave it unset)".into(),
        ),
        Err(RunError::Sandbox(e @ SandboxError::RunRootUnreachable { .. })) => failed(
            "run directory",
            e.to_string(),
            crate::sandbox::RUN_ROOT_FIX.into(),
        ),
        Err(RunError::Sandbox(e @ SandboxError::Seccomp(_))) => failed(
            "seccomp",
            e.to_string(),
            "fix the policy's seccomp profile".into(),
        ),
        Err(e) => failed(
            "sandbox",
            e.to_string(),
            "`fork run` fails the same way: fix what the message names".into(),
        ),
    }
}

/// The fix for a setup step that failed inside the sandbox.
fn setup_fix(stage: &str) -> String {
    match stage {
        "mounts" => "a mount the sandbox's root needs was refused (message above): remove the path from the policy's `hide` or `binds`, or set FORK_RUN_ROOT to a directory on a local filesystem".into(),
        "run directory" => "set FORK_RUN_ROOT to a writable directory every directory above which is searchable by others (or leave it unset)".into(),
        "cgroupns" | "netns" | "utsns" => format!("the kernel refused the {stage} layer: mark it `optional` in the policy's [layers], or use a kernel that allows it"),
        other => format!("`fork run` fails the same way at {other}: fix what the message names"),
    }
}
