//! Policies (`policies/*.toml`): budgets, required isolation layers, what the successor
//! sees of the filesystem, network rules, the seccomp profile, the environment it gets.
//!
//! The default policy is compiled into the binary (with its seccomp profile), so `fork`
//! works from any directory; `--policy FILE` loads another one.

use crate::units::{self, UnitError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

/// The built-in default policy (policies/default.toml).
pub const DEFAULT_POLICY: &str = include_str!("../policies/default.toml");
/// The built-in default seccomp profile (policies/seccomp/default.json).
pub const DEFAULT_SECCOMP: &str = include_str!("../policies/seccomp/default.json");

#[derive(Debug, Error)]
pub enum PolicyError {
    #[error("cannot read policy {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("policy {path} is not valid: {message}")]
    Invalid { path: String, message: String },
}

impl PolicyError {
    fn invalid(path: &str, message: impl Into<String>) -> Self {
        PolicyError::Invalid {
            path: path.to_string(),
            message: message.into(),
        }
    }
}

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLayers {
    userns: Option<Requirement>,
    pidns: Option<Requirement>,
    mountns: Option<Requirement>,
    netns: Option<Requirement>,
    ipcns: Option<Requirement>,
    utsns: Option<Requirement>,
    cgroupns: Option<Requirement>,
    seccomp: Option<Requirement>,
    landlock: Option<Requirement>,
    cgroup: Option<Requirement>,
    disk: Option<Requirement>,
}

/// The requirement for each layer.
#[derive(Debug, Clone, Serialize)]
pub struct Layers(pub BTreeMap<Layer, Requirement>);

impl Layers {
    pub fn get(&self, l: Layer) -> Requirement {
        self.0.get(&l).copied().unwrap_or(Requirement::Required)
    }
    pub fn set(&mut self, l: Layer, r: Requirement) {
        self.0.insert(l, r);
    }
}

/// Budget limits, resolved to numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Budgets {
    #[serde(serialize_with = "ser_secs")]
    pub wall: Duration,
    pub cpu_percent: u32,
    pub memory_bytes: u64,
    pub pids: u64,
    pub disk_bytes: u64,
    pub api_cost_usd: f64,
    #[serde(serialize_with = "ser_opt_secs")]
    pub cpu_time: Option<Duration>,
}

fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}
fn ser_opt_secs<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

/// Budget values as people write them (policy files, fork.toml, the command line).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BudgetOverrides {
    pub wall: Option<String>,
    pub cpu: Option<u32>,
    pub memory: Option<String>,
    pub pids: Option<u64>,
    pub disk: Option<String>,
    pub api_cost: Option<f64>,
    pub cpu_time: Option<String>,
}

impl Budgets {
    /// Applies overrides on top of these limits; `origin` names where they came from.
    pub fn apply(&mut self, o: &BudgetOverrides, origin: &str) -> Result<(), PolicyError> {
        let bad = |e: UnitError, field: &str| {
            PolicyError::invalid(origin, format!("budget.{field}: {e}"))
        };
        if let Some(w) = &o.wall {
            self.wall = units::parse_duration(w).map_err(|e| bad(e, "wall"))?;
            if self.wall.is_zero() {
                return Err(PolicyError::invalid(
                    origin,
                    "budget.wall must be more than 0",
                ));
            }
        }
        if let Some(c) = o.cpu {
            if c == 0 || c > 100 * 1024 {
                return Err(PolicyError::invalid(
                    origin,
                    format!("budget.cpu = {c}: give a percentage of one core, 1 to 102400 (200 = two cores)"),
                ));
            }
            self.cpu_percent = c;
        }
        if let Some(m) = &o.memory {
            self.memory_bytes = units::parse_size(m).map_err(|e| bad(e, "memory"))?;
            if self.memory_bytes < (8 << 20) {
                return Err(PolicyError::invalid(
                    origin,
                    "budget.memory must be at least 8MiB",
                ));
            }
        }
        if let Some(p) = o.pids {
            if p < 2 {
                return Err(PolicyError::invalid(
                    origin,
                    "budget.pids must be at least 2 (the sandbox's init and the command)",
                ));
            }
            self.pids = p;
        }
        if let Some(d) = &o.disk {
            self.disk_bytes = units::parse_size(d).map_err(|e| bad(e, "disk"))?;
            if self.disk_bytes < (1 << 20) {
                return Err(PolicyError::invalid(
                    origin,
                    "budget.disk must be at least 1MiB",
                ));
            }
        }
        if let Some(a) = o.api_cost {
            if !(a.is_finite() && a >= 0.0) {
                return Err(PolicyError::invalid(
                    origin,
                    "budget.api_cost must be a non-negative number of USD",
                ));
            }
            self.api_cost_usd = a;
        }
        if let Some(c) = &o.cpu_time {
            self.cpu_time = Some(units::parse_duration(c).map_err(|e| bad(e, "cpu_time"))?);
        }
        Ok(())
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFilesystem {
    root: Option<RootMode>,
    #[serde(default)]
    binds: Vec<String>,
    #[serde(default)]
    hide: Vec<String>,
    shm: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FsPolicy {
    pub root: RootMode,
    pub binds: Vec<PathBuf>,
    pub hide: Vec<PathBuf>,
    pub shm_bytes: u64,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NetPolicy {
    pub tcp_bind: Option<Vec<u16>>,
    pub tcp_connect: Option<Vec<u16>>,
    /// Host loopback services made reachable at the same address inside the sandbox
    /// (`"127.0.0.1:5432"`, `"localhost:6379"`, `"[::1]:8080"`); nothing else is.
    #[serde(default)]
    pub forward: Vec<String>,
}

/// Parses one `forward` entry: a loopback address with a port, or `localhost:PORT`.
/// Anything else (another host, a private or public address, no port) is refused.
pub fn parse_forward(entry: &str) -> Result<std::net::SocketAddr, String> {
    let e = entry.trim();
    let addr: std::net::SocketAddr = if let Some(port) = e.strip_prefix("localhost:") {
        let port: u16 = port
            .parse()
            .map_err(|_| format!("`{entry}`: `{port}` is not a port number"))?;
        std::net::SocketAddr::from(([127, 0, 0, 1], port))
    } else {
        e.parse().map_err(|_| {
            format!("`{entry}` is not an address with a port: write it like \"127.0.0.1:5432\" or \"localhost:5432\"")
        })?
    };
    if !addr.ip().is_loopback() {
        return Err(format!(
            "`{entry}`: only loopback services can be forwarded into the sandbox (127.0.0.0/8 or ::1); the successor never reaches another host"
        ));
    }
    if addr.port() == 0 {
        return Err(format!("`{entry}`: port 0 cannot be forwarded"));
    }
    Ok(addr)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSeccomp {
    profile: Option<String>,
}

/// Where the seccomp profile comes from.
#[derive(Debug, Clone, Serialize)]
pub enum SeccompSource {
    /// The profile compiled into the binary.
    Builtin,
    File(PathBuf),
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EnvPolicy {
    #[serde(default)]
    pub pass: Vec<String>,
    #[serde(default)]
    pub set: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    budget: Option<BudgetOverrides>,
    layers: Option<RawLayers>,
    filesystem: Option<RawFilesystem>,
    network: Option<NetPolicy>,
    seccomp: Option<RawSeccomp>,
    environment: Option<EnvPolicy>,
    gates: Option<crate::patch::gates::GatePolicy>,
    decision: Option<crate::verdict::decide::DecisionRules>,
    gateway: Option<crate::gateway::GatewayConfig>,
}

/// A loaded, validated policy.
#[derive(Debug, Clone, Serialize)]
pub struct Policy {
    /// The file it came from, or "builtin:default".
    pub origin: String,
    pub budgets: Budgets,
    pub layers: Layers,
    pub filesystem: FsPolicy,
    pub network: NetPolicy,
    pub seccomp: SeccompSource,
    /// The profile's name as reported in `isolation.seccomp` (the file stem).
    pub seccomp_name: String,
    pub environment: EnvPolicy,
    pub gates: crate::patch::gates::GatePolicy,
    /// How evidence becomes a verdict (`[decision]`).
    pub decision: crate::verdict::decide::DecisionRules,
    /// The metered model gateway (`[gateway]`), if any.
    pub gateway: Option<crate::gateway::GatewayConfig>,
}

/// The seed's defaults, used for anything a policy leaves out.
pub fn seed_budgets() -> Budgets {
    Budgets {
        wall: Duration::from_secs(3600),
        cpu_percent: 200,
        memory_bytes: 2 << 30,
        pids: 512,
        disk_bytes: 10 << 30,
        api_cost_usd: 5.0,
        cpu_time: None,
    }
}

impl Policy {
    /// The built-in default policy.
    pub fn builtin() -> Result<Policy, PolicyError> {
        Self::parse(DEFAULT_POLICY, "builtin:default", None)
    }

    /// `--policy FILE`, or the built-in default.
    pub fn load(path: Option<&Path>) -> Result<Policy, PolicyError> {
        match path {
            None => Self::builtin(),
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| PolicyError::Read {
                    path: p.to_path_buf(),
                    source,
                })?;
                Self::parse(&text, &p.display().to_string(), p.parent())
            }
        }
    }

    /// Parses policy text; `dir` resolves the seccomp profile path (None: built-in).
    pub fn parse(text: &str, origin: &str, dir: Option<&Path>) -> Result<Policy, PolicyError> {
        let mut raw: RawPolicy =
            toml::from_str(text).map_err(|e| PolicyError::invalid(origin, e.to_string()))?;
        if dir.is_some() {
            // A policy file starts from the built-in default: a table it leaves out keeps the
            // default's (its hide list, its TCP rules, ...), a table it writes replaces it.
            let base: RawPolicy = toml::from_str(DEFAULT_POLICY)
                .map_err(|e| PolicyError::invalid("builtin:default", e.to_string()))?;
            raw.layers = raw.layers.or(base.layers);
            raw.filesystem = raw.filesystem.or(base.filesystem);
            raw.network = raw.network.or(base.network);
            raw.environment = raw.environment.or(base.environment);
            raw.gates = raw.gates.or(base.gates);
            raw.decision = raw.decision.or(base.decision);
            if raw.budget.is_none() {
                raw.budget = base.budget;
            }
        }
        let mut budgets = seed_budgets();
        if let Some(b) = &raw.budget {
            budgets.apply(b, origin)?;
        }
        let mut layers = Layers(
            Layer::ALL
                .iter()
                .map(|l| (*l, Requirement::Required))
                .collect(),
        );
        if let Some(l) = raw.layers {
            let pairs = [
                (Layer::Userns, l.userns),
                (Layer::Pidns, l.pidns),
                (Layer::Mountns, l.mountns),
                (Layer::Netns, l.netns),
                (Layer::Ipcns, l.ipcns),
                (Layer::Utsns, l.utsns),
                (Layer::Cgroupns, l.cgroupns),
                (Layer::Seccomp, l.seccomp),
                (Layer::Landlock, l.landlock),
                (Layer::Cgroup, l.cgroup),
                (Layer::Disk, l.disk),
            ];
            for (layer, req) in pairs {
                if let Some(r) = req {
                    if layer.is_core() && r != Requirement::Required {
                        return Err(PolicyError::invalid(
                            origin,
                            format!(
                                "layers.{} must be \"required\": the sandbox is built on it",
                                layer.name()
                            ),
                        ));
                    }
                    layers.set(layer, r);
                }
            }
        }
        let fs = raw.filesystem.unwrap_or(RawFilesystem {
            root: None,
            binds: vec![],
            hide: vec![],
            shm: None,
        });
        let root = fs.root.unwrap_or(RootMode::Host);
        let mut binds = Vec::new();
        for b in &fs.binds {
            binds.push(absolute(b, origin, "filesystem.binds")?);
        }
        if root == RootMode::Minimal && binds.is_empty() {
            return Err(PolicyError::invalid(
                origin,
                "filesystem.root = \"minimal\" needs filesystem.binds (e.g. [\"/usr\", \"/lib\"])",
            ));
        }
        let mut hide = Vec::new();
        for h in &fs.hide {
            hide.push(absolute(h, origin, "filesystem.hide")?);
        }
        let shm_bytes = match &fs.shm {
            Some(s) => units::parse_size(s)
                .map_err(|e| PolicyError::invalid(origin, format!("filesystem.shm: {e}")))?,
            None => 64 << 20,
        };
        let network = raw.network.unwrap_or_default();
        for f in &network.forward {
            parse_forward(f)
                .map_err(|m| PolicyError::invalid(origin, format!("network.forward: {m}")))?;
        }
        let (seccomp, seccomp_name) = match raw.seccomp.and_then(|s| s.profile) {
            None => (SeccompSource::Builtin, "default".to_string()),
            Some(p) => {
                let name = Path::new(&p)
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "custom".into());
                match dir {
                    // The built-in policy names the built-in profile.
                    None => (SeccompSource::Builtin, name),
                    Some(d) => {
                        let path = if Path::new(&p).is_absolute() {
                            PathBuf::from(&p)
                        } else {
                            d.join(&p)
                        };
                        (SeccompSource::File(path), name)
                    }
                }
            }
        };
        let gates = raw.gates.unwrap_or_default();
        gates
            .validate()
            .map_err(|e| PolicyError::invalid(origin, format!("gates: {e}")))?;
        let decision = raw.decision.unwrap_or_default();
        decision
            .validate()
            .map_err(|e| PolicyError::invalid(origin, format!("decision: {e}")))?;
        if let Some(g) = &raw.gateway {
            g.validate(origin)
                .map_err(|e| PolicyError::invalid(origin, e.to_string()))?;
        }
        let environment = raw.environment.unwrap_or_default();
        for k in environment.set.keys().chain(environment.pass.iter()) {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(PolicyError::invalid(
                    origin,
                    format!("environment: `{k}` is not a variable name"),
                ));
            }
        }
        Ok(Policy {
            origin: origin.to_string(),
            budgets,
            layers,
            filesystem: FsPolicy {
                root,
                binds,
                hide,
                shm_bytes,
            },
            network,
            seccomp,
            seccomp_name,
            environment,
            gates,
            decision,
            gateway: raw.gateway,
        })
    }
}

/// Expands `~/` against the supervisor's home and insists on an absolute path.
fn absolute(p: &str, origin: &str, field: &str) -> Result<PathBuf, PolicyError> {
    let expanded = if let Some(rest) = p.strip_prefix("~/") {
        home_dir().join(rest)
    } else {
        PathBuf::from(p)
    };
    if !expanded.is_absolute() {
        return Err(PolicyError::invalid(
            origin,
            format!("{field}: `{p}` must be an absolute path (or start with ~/)"),
        ));
    }
    Ok(expanded)
}

/// The supervisor's home directory ($HOME, else /root for uid 0, else /).
pub fn home_dir() -> PathBuf {
    match std::env::var_os("HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h),
        _ => {
            if nix::unistd::geteuid().is_root() {
                PathBuf::from("/root")
            } else {
                PathBuf::from("/")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_has_seed_defaults() {
        let p = Policy::builtin().unwrap();
        assert_eq!(p.budgets, seed_budgets());
        assert_eq!(p.budgets.wall, Duration::from_secs(3600));
        assert_eq!(p.budgets.cpu_percent, 200);
        assert_eq!(p.budgets.disk_bytes, 10 << 30);
        assert_eq!(p.budgets.api_cost_usd, 5.0);
        for l in Layer::ALL {
            assert_eq!(p.layers.get(l), Requirement::Required, "{l:?}");
        }
        assert!(p.filesystem.hide.iter().any(|h| h == Path::new("/run")));
    }

    #[test]
    fn strict_file_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/strict.toml");
        let p = Policy::load(Some(&path)).unwrap();
        assert_eq!(p.filesystem.root, RootMode::Minimal);
        assert!(p.filesystem.binds.contains(&PathBuf::from("/usr")));
        assert!(matches!(p.seccomp, SeccompSource::File(_)));
    }

    #[test]
    fn core_layers_cannot_be_optional() {
        let e = Policy::parse("[layers]\nuserns = \"optional\"\n", "p.toml", None).unwrap_err();
        assert!(e.to_string().contains("layers.userns"), "{e}");
    }

    #[test]
    fn unknown_fields_and_bad_units_are_named() {
        let e = Policy::parse("[budget]\nwal = \"1h\"\n", "p.toml", None).unwrap_err();
        assert!(
            e.to_string().contains("p.toml") && e.to_string().contains("wal"),
            "{e}"
        );
        let e = Policy::parse("[budget]\nmemory = \"lots\"\n", "p.toml", None).unwrap_err();
        assert!(e.to_string().contains("budget.memory"), "{e}");
        let e = Policy::parse("[filesystem]\nhide = [\"relative\"]\n", "p.toml", None).unwrap_err();
        assert!(e.to_string().contains("filesystem.hide"), "{e}");
    }

    #[test]
    fn a_policy_file_inherits_the_default_tables_it_leaves_out() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("p.toml");
        std::fs::write(&p, "[budget]\nwall = \"5m\"\n").unwrap();
        let pol = Policy::load(Some(&p)).unwrap();
        assert_eq!(pol.budgets.wall, Duration::from_secs(300));
        assert!(pol.filesystem.hide.iter().any(|h| h == Path::new("/run")));
        assert_eq!(pol.network.tcp_connect, Some(vec![]));
        std::fs::write(&p, "[filesystem]\nhide = []\n").unwrap();
        assert!(Policy::load(Some(&p)).unwrap().filesystem.hide.is_empty());
    }

    #[test]
    fn forwards_are_loopback_only() {
        assert_eq!(parse_forward("127.0.0.1:5432").unwrap().port(), 5432);
        assert_eq!(
            parse_forward("localhost:6379").unwrap().to_string(),
            "127.0.0.1:6379"
        );
        assert!(parse_forward("[::1]:80").is_ok());
        for bad in [
            "10.0.0.1:80",
            "192.168.1.1:22",
            "8.8.8.8:53",
            "example.com:80",
            "127.0.0.1",
            "127.0.0.1:0",
        ] {
            assert!(parse_forward(bad).is_err(), "{bad}");
        }
        let e = Policy::parse("[network]\nforward = [\"10.1.2.3:5432\"]\n", "p.toml", None)
            .unwrap_err();
        assert!(
            e.to_string().contains("network.forward") && e.to_string().contains("10.1.2.3:5432"),
            "{e}"
        );
    }

    #[test]
    fn overrides_apply() {
        let mut b = seed_budgets();
        b.apply(
            &BudgetOverrides {
                wall: Some("2s".into()),
                memory: Some("128MiB".into()),
                pids: Some(64),
                ..Default::default()
            },
            "cli",
        )
        .unwrap();
        assert_eq!(b.wall, Duration::from_secs(2));
        assert_eq!(b.memory_bytes, 128 << 20);
        assert_eq!(b.pids, 64);
        assert!(b
            .apply(
                &BudgetOverrides {
                    cpu: Some(0),
                    ..Default::default()
                },
                "cli"
            )
            .is_err());
    }
}
