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
}

impl CheckReport {
    /// True when every layer the policy requires is available.
    pub fn ok(&self) -> bool {
        self.layers
            .iter()
            .all(|l| l.available || l.requirement != Requirement::Required)
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
        s.push_str(if self.ok() {
            "every layer this policy requires is available\n"
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
                "profile `{}` compiles ({} filters)",
                p.name,
                p.filter_count()
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
    let root = nix::unistd::geteuid().is_root();
    layers.push(LayerReport {
        layer: Layer::Disk,
        requirement: req(Layer::Disk),
        available: root,
        detail: if root {
            "a size-capped tmpfs per run holds the workspace and /tmp".into()
        } else {
            "mounting the size-capped workspace needs root on the host".into()
        },
        fix: if root {
            String::new()
        } else {
            "run fork as root, or set [layers] disk = \"optional\" (then only /tmp is capped)"
                .into()
        },
    });
    CheckReport {
        kernel: kernel(),
        policy: policy.origin.clone(),
        layers,
    }
}
