//! What a sandbox is asked to isolate: the layers (and how much each is insisted on), what
//! the successor sees of the host filesystem, its TCP rules, its seccomp profile and its
//! limits. The sandbox takes a [`Spec`] and a command; it knows nothing of policies, tasks
//! or verdicts (a policy produces a spec).
//!
//! Adding an isolation layer: a variant of [`Layer`] (with its name and, when the
//! sandbox is built on it, `is_core`), its probe in `probe.rs` / `fork check`, and its
//! enforcement in the sandbox. Policies read `[layers]` straight into [`Layers`].

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

pub use super::watchdog::Limits;

/// The built-in default seccomp profile (policies/seccomp/default.json).
pub const DEFAULT_SECCOMP: &str = include_str!("../../policies/seccomp/default.json");

/// How much a policy insists on one isolation layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Requirement {
    Required,
    Optional,
    Off,
}

impl Requirement {
    pub fn wanted(self) -> bool {
        self != Requirement::Off
    }
}

/// Every layer a policy can require, in the order `fork check` prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layer {
    Userns,
    Pidns,
    Mountns,
    Netns,
    Ipcns,
    Utsns,
    Cgroupns,
    Seccomp,
    Landlock,
    Cgroup,
    Disk,
}

impl Layer {
    pub const ALL: [Layer; 11] = [
        Layer::Userns,
        Layer::Pidns,
        Layer::Mountns,
        Layer::Netns,
        Layer::Ipcns,
        Layer::Utsns,
        Layer::Cgroupns,
        Layer::Seccomp,
        Layer::Landlock,
        Layer::Cgroup,
        Layer::Disk,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Layer::Userns => "userns",
            Layer::Pidns => "pidns",
            Layer::Mountns => "mountns",
            Layer::Netns => "netns",
            Layer::Ipcns => "ipcns",
            Layer::Utsns => "utsns",
            Layer::Cgroupns => "cgroupns",
            Layer::Seccomp => "seccomp",
            Layer::Landlock => "landlock",
            Layer::Cgroup => "cgroup",
            Layer::Disk => "disk",
        }
    }

    /// The sandbox is built on these; a policy cannot relax them.
    pub fn is_core(self) -> bool {
        matches!(self, Layer::Userns | Layer::Pidns | Layer::Mountns)
    }
}

/// The requirement for each layer.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Layers(pub BTreeMap<Layer, Requirement>);

impl Layers {
    pub fn get(&self, l: Layer) -> Requirement {
        self.0.get(&l).copied().unwrap_or(Requirement::Required)
    }
    pub fn set(&mut self, l: Layer, r: Requirement) {
        self.0.insert(l, r);
    }
}

/// What the successor sees of the host filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RootMode {
    /// The whole host root, read-only.
    Host,
    /// Only the policy's `binds`, read-only, on an empty read-only root.
    Minimal,
}

/// Where the seccomp profile comes from.
#[derive(Debug, Clone, Serialize)]
pub enum SeccompSource {
    /// The profile compiled into the binary.
    Builtin,
    File(PathBuf),
}

/// The seccomp profile of a sandbox and the name it is reported under.
#[derive(Debug, Clone, Serialize)]
pub struct SeccompProfile {
    pub source: SeccompSource,
    /// The profile's name as reported in `isolation.seccomp`.
    pub name: String,
}

/// Everything a sandbox isolates and limits.
#[derive(Debug, Clone)]
pub struct Spec {
    pub layers: Layers,
    pub limits: Limits,
    /// The host root read-only, or only `binds` on an empty root.
    pub root: RootMode,
    /// Read-only binds (with [`RootMode::Minimal`]).
    pub binds: Vec<PathBuf>,
    /// Host paths made invisible (secrets, live state, the run directories).
    pub hide: Vec<PathBuf>,
    /// Host files or directories served read-only at a path inside the sandbox (typically
    /// beneath the workspace), mounted over whatever the workspace holds there.
    pub ro_binds: Vec<RoBind>,
    /// The size of `/dev/shm`.
    pub shm_bytes: u64,
    pub seccomp: SeccompProfile,
    /// Landlock's TCP rules (None: unrestricted by Landlock; the network namespace still
    /// holds only loopback).
    pub tcp_bind: Option<Vec<u16>>,
    pub tcp_connect: Option<Vec<u16>>,
}

/// A read-only bind of a host file or directory (`src`) at `dst` inside the sandbox:
/// read-only, nosuid, nodev, recursive; nothing can be changed, removed or added there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoBind {
    pub src: PathBuf,
    pub dst: PathBuf,
}

impl std::fmt::Display for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
