//! Probing which namespaces this host lets fork create, one short-lived child per
//! namespace type, each reporting the errno of its unshare(2).

use super::sys::unshare_in_child;
use crate::sandbox::spec::Layer;
use nix::sched::CloneFlags;
use serde::Serialize;

/// The result of probing one layer.
#[derive(Debug, Clone, Serialize)]
pub struct LayerProbe {
    pub layer: Layer,
    pub ok: bool,
    pub detail: String,
    /// What to do when it is not available (empty when ok).
    pub fix: String,
}

fn read_sysctl(path: &str) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The fix for AppArmor's restriction of unprivileged user namespaces.
pub const APPARMOR_USERNS_FIX: &str = "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1): install the profile shipped as policies/apparmor/fork (`sudo install -m 644 policies/apparmor/fork /etc/apparmor.d/fork && sudo apparmor_parser -r /etc/apparmor.d/fork`, attachment path adjusted to where fork is), or `sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`";

/// Whether AppArmor's `apparmor_restrict_unprivileged_userns` confines the user namespaces
/// this process creates: the restriction is on, we are not root, and no profile of ours
/// grants `userns` (we run unconfined). unshare(CLONE_NEWUSER) then still succeeds on
/// Ubuntu's kernels, but the namespace gets no capabilities, so no mount would work in it.
pub fn apparmor_confines_userns(restrict: Option<i64>, root: bool, label: &str) -> bool {
    restrict == Some(1) && !root && label.trim_end_matches(['\n', '\0']).trim() == "unconfined"
}

/// [`apparmor_confines_userns`] for this process.
pub(crate) fn apparmor_confines_us() -> bool {
    let label = std::fs::read_to_string("/proc/self/attr/apparmor/current")
        .or_else(|_| std::fs::read_to_string("/proc/self/attr/current"))
        .unwrap_or_default();
    apparmor_confines_userns(
        read_sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"),
        nix::unistd::geteuid().is_root(),
        &label,
    )
}

fn userns_fix(err: nix::Error) -> String {
    if read_sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == Some(1) {
        return APPARMOR_USERNS_FIX.into();
    }
    if read_sysctl("/proc/sys/kernel/unprivileged_userns_clone") == Some(0) {
        return "unprivileged user namespaces are disabled: `sysctl -w kernel.unprivileged_userns_clone=1`".into();
    }
    if read_sysctl("/proc/sys/user/max_user_namespaces") == Some(0) || err == nix::Error::ENOSPC {
        return "user namespaces are limited to 0: `sysctl -w user.max_user_namespaces=15000`"
            .into();
    }
    if err == nix::Error::EINVAL {
        return "the kernel lacks CONFIG_USER_NS: use a kernel built with user namespaces".into();
    }
    "user namespaces are refused here (a container without nested userns? a seccomp profile of the host?): run fork on the host or in a container that allows unshare(CLONE_NEWUSER)".into()
}

/// Probes user, pid, mount, net, ipc, uts and cgroup namespaces.
pub fn probe_namespaces() -> Vec<LayerProbe> {
    let mut out = Vec::new();
    let mut user = unshare_in_child(CloneFlags::empty());
    out.push(match user {
        Ok(()) if apparmor_confines_us() => {
            user = Err(nix::Error::EPERM);
            LayerProbe {
                layer: Layer::Userns,
                ok: false,
                detail:
                    "unshare(CLONE_NEWUSER) works, but AppArmor gives the namespace no capabilities"
                        .into(),
                fix: APPARMOR_USERNS_FIX.into(),
            }
        }
        Ok(()) => LayerProbe {
            layer: Layer::Userns,
            ok: true,
            detail: "unshare(CLONE_NEWUSER) works".into(),
            fix: String::new(),
        },
        Err(e) => LayerProbe {
            layer: Layer::Userns,
            ok: false,
            detail: format!("unshare(CLONE_NEWUSER): {e}"),
            fix: userns_fix(e),
        },
    });
    for (layer, flag, name, config) in [
        (
            Layer::Pidns,
            CloneFlags::CLONE_NEWPID,
            "CLONE_NEWPID",
            "CONFIG_PID_NS",
        ),
        (
            Layer::Mountns,
            CloneFlags::CLONE_NEWNS,
            "CLONE_NEWNS",
            "CONFIG_NAMESPACES",
        ),
        (
            Layer::Netns,
            CloneFlags::CLONE_NEWNET,
            "CLONE_NEWNET",
            "CONFIG_NET_NS",
        ),
        (
            Layer::Ipcns,
            CloneFlags::CLONE_NEWIPC,
            "CLONE_NEWIPC",
            "CONFIG_IPC_NS",
        ),
        (
            Layer::Utsns,
            CloneFlags::CLONE_NEWUTS,
            "CLONE_NEWUTS",
            "CONFIG_UTS_NS",
        ),
        (
            Layer::Cgroupns,
            CloneFlags::CLONE_NEWCGROUP,
            "CLONE_NEWCGROUP",
            "CONFIG_CGROUPS (kernel >= 4.6)",
        ),
    ] {
        if user.is_err() {
            out.push(LayerProbe {
                layer,
                ok: false,
                detail: "needs a user namespace, which is unavailable".into(),
                fix: "make user namespaces available (see userns)".into(),
            });
            continue;
        }
        out.push(match unshare_in_child(flag) {
            Ok(()) => LayerProbe {
                layer,
                ok: true,
                detail: format!("unshare({name}) inside a user namespace works"),
                fix: String::new(),
            },
            Err(e) => LayerProbe {
                layer,
                ok: false,
                detail: format!("unshare({name}): {e}"),
                fix: format!("a kernel with {config}"),
            },
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apparmor_userns_restriction_is_detected_for_unconfined_users_only() {
        assert!(apparmor_confines_userns(Some(1), false, "unconfined\n"));
        // Our profile (or any other) grants what it grants; root is not restricted.
        assert!(!apparmor_confines_userns(
            Some(1),
            false,
            "fork (unconfined)\n"
        ));
        assert!(!apparmor_confines_userns(Some(1), true, "unconfined\n"));
        assert!(!apparmor_confines_userns(Some(0), false, "unconfined\n"));
        assert!(!apparmor_confines_userns(None, false, ""));
        assert!(APPARMOR_USERNS_FIX.contains("policies/apparmor/fork"));
    }
}
