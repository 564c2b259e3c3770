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

fn userns_fix(err: nix::Error) -> String {
    if read_sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == Some(1) {
        return "AppArmor restricts unprivileged user namespaces: allow them for fork with an AppArmor profile granting `userns,` (see README), or `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`".into();
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
    let user = unshare_in_child(CloneFlags::empty());
    out.push(match user {
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
