//! Policies (`policies/*.toml`): budgets, required isolation layers, what the successor
//! sees of the filesystem, network rules, the seccomp profile, the environment it gets.
//!
//! The default policy is compiled into the binary (with its seccomp profile), so `fork`
//! works from any directory; `--policy FILE` loads another one.

pub use crate::budget::{BudgetOverrides, BudgetText, Budgets};
pub use crate::sandbox::spec::{
    Layer, Layers, Requirement, RootMode, SeccompProfile, SeccompSource, Spec, DEFAULT_SECCOMP,
};
use crate::units;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The built-in default policy (policies/default.toml).
pub const DEFAULT_POLICY: &str = include_str!("../policies/default.toml");
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

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EnvPolicy {
    #[serde(default)]
    pub pass: Vec<String>,
    #[serde(default)]
    pub set: BTreeMap<String, String>,
}

/// What a mesh node publishes of its verdict bundle (`[mesh] publish`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Publish {
    /// The signed verdict and endorsement only: the artifacts' hashes are in the verdict,
    /// their contents (logs, reports) stay on the node.
    #[default]
    Verdict,
    /// The whole bundle, artifacts included.
    Bundle,
}

/// `[mesh]`: what `fork mesh serve` shares.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MeshPolicy {
    #[serde(default)]
    pub publish: Publish,
}

/// `[state]`: how the parent's state stores are named in `state_hash`.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StatePolicy {
    /// The digest of each store's snapshot: `"blake3"` (the default) or `"sha256"` (the
    /// releases before BLAKE3 became the default).
    #[serde(default)]
    pub digest: crate::fork::StateDigest,
    /// `precopy = "32MiB"` (the default; any size, or a number of bytes) | `"off"` (any
    /// case): a rollback-journal store at least this
    /// large is copied before the shared lock is taken and then compared with the live file
    /// under it (the parent's writer waits about half as long, the snapshot takes about 1.5x
    /// as long); `"off"` copies it whole under the lock, as the releases before that did.
    /// The same bytes either way, so it is not part of the conditions a verdict is cached
    /// under (`skip_serializing`).
    #[serde(default, skip_serializing)]
    pub precopy: Precopy,
}

/// `[state] precopy`: from which size a rollback-journal store is copied before its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "SizeOrOff")]
pub struct Precopy {
    /// `SnapshotOptions::precopy_min_bytes`; `u64::MAX` for `"off"`.
    pub min_bytes: u64,
}

impl Default for Precopy {
    fn default() -> Self {
        Precopy {
            min_bytes: crate::fork::snapshot::PRECOPY_MIN_BYTES,
        }
    }
}

/// `[state] precopy` as written: a size (`"32MiB"`, or bytes as a number) or `"off"`.
#[derive(Deserialize)]
#[serde(untagged)]
enum SizeOrOff {
    Bytes(u64),
    Text(String),
    /// Anything else (`true`, `-1`, `1.5`), refused with what is expected.
    Other(toml::Value),
}

impl TryFrom<SizeOrOff> for Precopy {
    type Error = String;
    fn try_from(v: SizeOrOff) -> Result<Self, String> {
        let s = match v {
            SizeOrOff::Bytes(min_bytes) => return Ok(Precopy { min_bytes }),
            SizeOrOff::Text(s) => s,
            SizeOrOff::Other(v) => return Err(precopy_expected(&v.to_string())),
        };
        if s.trim().eq_ignore_ascii_case("off") {
            return Ok(Precopy {
                min_bytes: u64::MAX,
            });
        }
        match units::parse_size(&s) {
            Ok(min_bytes) => Ok(Precopy { min_bytes }),
            Err(_) => Err(precopy_expected(&format!("`{s}`"))),
        }
    }
}

fn precopy_expected(what: &str) -> String {
    format!(
        "state.precopy: {what} is neither \"off\", a number of bytes, nor a size such as \"32MiB\""
    )
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    budget: Option<BudgetText>,
    layers: Option<BTreeMap<Layer, Requirement>>,
    filesystem: Option<RawFilesystem>,
    network: Option<NetPolicy>,
    seccomp: Option<RawSeccomp>,
    environment: Option<EnvPolicy>,
    gates: Option<crate::patch::gates::GatePolicy>,
    decision: Option<crate::verdict::decide::DecisionRules>,
    gateway: Option<crate::gateway::GatewayConfig>,
    mesh: Option<MeshPolicy>,
    state: Option<StatePolicy>,
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
    /// What a mesh node publishes (`[mesh]`).
    pub mesh: MeshPolicy,
    /// How the state stores are named in `state_hash` (`[state]`).
    pub state: StatePolicy,
}

/// Shortest policy value scrubbed as a secret ([`Policy::secret_values`]).
pub const MIN_SECRET_LEN: usize = 4;

impl Policy {
    /// What a sandbox run under this policy isolates and limits. The node key's directory
    /// is always hidden, whatever the policy says (the sandbox hides its run directories).
    pub fn sandbox_spec(&self) -> Spec {
        let mut hide = self.filesystem.hide.clone();
        hide.push(crate::identity::node_key_dir());
        Spec {
            layers: self.layers.clone(),
            limits: self.budgets.run_limits(),
            root: self.filesystem.root,
            binds: self.filesystem.binds.clone(),
            hide,
            ro_binds: Vec::new(),
            shm_bytes: self.filesystem.shm_bytes,
            seccomp: SeccompProfile {
                source: self.seccomp.clone(),
                name: self.seccomp_name.clone(),
            },
            tcp_bind: self.network.tcp_bind.clone(),
            tcp_connect: self.network.tcp_connect.clone(),
        }
    }

    /// The environment a successor gets: a fixed base, `FORK_WORKSPACE`, what the policy
    /// passes or sets, then `extra`. Nothing else of the supervisor's environment.
    pub fn successor_env(&self, extra: &[(String, String)]) -> Vec<(String, String)> {
        use crate::sandbox::{SANDBOX_PATH, WORKSPACE};
        let mut env: Vec<(String, String)> = vec![
            ("PATH".into(), SANDBOX_PATH.into()),
            ("HOME".into(), format!("{WORKSPACE}/home")),
            ("TMPDIR".into(), "/tmp".into()),
            ("LANG".into(), "C.UTF-8".into()),
            ("FORK_WORKSPACE".into(), WORKSPACE.into()),
        ];
        let mut set = |k: &str, v: String| {
            if let Some(e) = env.iter_mut().find(|(ek, _)| ek == k) {
                e.1 = v;
            } else {
                env.push((k.to_string(), v));
            }
        };
        for k in &self.environment.pass {
            if let Ok(v) = std::env::var(k) {
                set(k, v);
            }
        }
        for (k, v) in &self.environment.set {
            set(k, v.clone());
        }
        for (k, v) in extra {
            set(k, v.clone());
        }
        env
    }

    /// Refuses a model gateway (`whose`, e.g. "fork.toml's [gateway]") whose key variable
    /// this policy's `[environment] pass` would put inside the sandbox; the error names the
    /// policy file, the variable and the fix.
    pub fn check_gateway_key_not_passed(
        &self,
        gateway: &crate::gateway::GatewayConfig,
        whose: &str,
    ) -> Result<(), PolicyError> {
        gateway_key_not_passed(&self.environment, gateway, whose)
            .map_err(|m| PolicyError::invalid(&self.origin, m))
    }

    /// Refuses this policy when a variable it gives the successor holds the model
    /// gateway's `key` (a `set` value, or the host's value of a `pass` name, whatever the
    /// variable is called): the name check ([`Policy::check_gateway_key_not_passed`]) misses
    /// a key read from a file that the operator also exports, or kept under two names.
    pub fn check_gateway_key_not_given(&self, key: &str) -> Result<(), PolicyError> {
        if key.is_empty() {
            return Ok(());
        }
        let passed = self
            .environment
            .pass
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.as_str(), v)));
        let set = self
            .environment
            .set
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()));
        match passed.chain(set).find(|(_, v)| v.contains(key)) {
            Some((var, _)) => Err(PolicyError::invalid(
                &self.origin,
                format!(
                    "environment variable `{var}` (environment.pass or environment.set) holds the model gateway's API key: the key would be inside the sandbox. Remove `{var}` from the policy's environment: the gateway adds the key to each call itself"
                ),
            )),
            None => Ok(()),
        }
    }

    /// The values this policy passes into the sandbox that may be secrets (tokens,
    /// credentials): its `[environment]` `set` values and the host's values of its `pass`
    /// names, except locale, terminal and time-zone settings (`LANG`, `LANGUAGE`, `LC_*`,
    /// `TERM`, `TZ`), and except values shorter than [`MIN_SECRET_LEN`] bytes (they would
    /// match by chance). fork scrubs them from what it stores.
    pub fn secret_values(&self) -> Vec<String> {
        let public =
            |k: &str| matches!(k, "LANG" | "LANGUAGE" | "TERM" | "TZ") || k.starts_with("LC_");
        let passed = self
            .environment
            .pass
            .iter()
            .filter(|k| !public(k))
            .filter_map(|k| std::env::var(k).ok());
        let set = self
            .environment
            .set
            .iter()
            .filter(|(k, _)| !public(k))
            .map(|(_, v)| v.clone());
        let mut out: Vec<String> = passed
            .chain(set)
            .filter(|v| v.len() >= MIN_SECRET_LEN)
            .collect();
        out.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
        out.dedup();
        out
    }

    /// The built-in default policy.
    pub fn builtin() -> Result<Policy, PolicyError> {
        Self::parse(DEFAULT_POLICY, "builtin:default", None)
    }

    /// `--policy FILE`, or the built-in default.
    pub fn load(path: Option<&Path>) -> Result<Policy, PolicyError> {
        match path {
            None => Self::builtin(),
            Some(p) => {
                let text =
                    crate::fsx::read_input_to_string(p).map_err(|source| PolicyError::Read {
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
        let mut budgets = Budgets::default();
        if let Some(b) = &raw.budget {
            let o = b
                .parse()
                .map_err(|e| PolicyError::invalid(origin, e.to_string()))?;
            budgets
                .apply(&o)
                .map_err(|e| PolicyError::invalid(origin, e.to_string()))?;
        }
        let mut layers = Layers(
            Layer::ALL
                .iter()
                .map(|l| (*l, Requirement::Required))
                .collect(),
        );
        for (layer, r) in raw.layers.unwrap_or_default() {
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
        if let Some(g) = &raw.gateway {
            gateway_key_not_passed(&environment, g, "its [gateway]")
                .map_err(|m| PolicyError::invalid(origin, m))?;
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
            mesh: raw.mesh.unwrap_or_default(),
            state: raw.state.unwrap_or_default(),
        })
    }
}

/// The gateway's key is the supervisor's alone: `pass` must not name the variable it is read
/// from (the successor would get it in its environment).
fn gateway_key_not_passed(
    env: &EnvPolicy,
    gateway: &crate::gateway::GatewayConfig,
    whose: &str,
) -> Result<(), String> {
    match &gateway.credentials_env {
        Some(var) if env.pass.iter().any(|k| k == var) => Err(format!(
            "environment.pass lists `{var}`, the variable {whose} reads the model API key from (credentials_env): the key would be inside the sandbox. Remove `{var}` from environment.pass: the gateway adds the key to each call itself"
        )),
        _ => Ok(()),
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

    /// Every input a user names is refused at once when it is a FIFO, never waited on (a
    /// read of a FIFO without a writer blocked: `--policy <(...)` or a planted `fork.toml`
    /// hung the command, which ignored SIGTERM while planning): the policy, the manifest,
    /// a node key and a bundle's document. Each load runs on a thread of its own and must
    /// answer within 10 s.
    #[test]
    fn inputs_that_are_fifos_are_refused_at_once() {
        use std::sync::mpsc;
        use std::time::Duration;
        let dir = tempfile::tempdir().unwrap();
        let fifo = |p: &std::path::Path| {
            nix::unistd::mkfifo(p, nix::sys::stat::Mode::S_IRWXU).unwrap();
        };
        let (policy, rt, key, bundle) = (
            dir.path().join("policy.toml"),
            dir.path().join("rt"),
            dir.path().join("node.key"),
            dir.path().join("bundle"),
        );
        std::fs::create_dir_all(&rt).unwrap();
        std::fs::create_dir_all(&bundle).unwrap();
        for p in [
            policy.clone(),
            rt.join(crate::manifest::MANIFEST_FILE),
            key.clone(),
            bundle.join("verdict.dsse.json"),
        ] {
            fifo(&p);
        }
        let trusted = crate::identity::EphemeralKey::generate().public();
        // What each load answered, as text (`Some(error)` when it refused).
        type Load = Box<dyn FnOnce() -> String + Send>;
        let loads: Vec<(&str, Load)> = vec![
            (
                "policy",
                Box::new(move || format!("{:?}", super::Policy::load(Some(&policy)).err())),
            ),
            (
                "manifest",
                Box::new(move || format!("{:?}", crate::manifest::load(&rt).err())),
            ),
            (
                "node key",
                Box::new(move || format!("{:?}", crate::identity::load_node_key(&key).err())),
            ),
            (
                "bundle",
                Box::new(move || {
                    format!(
                        "{:?}",
                        crate::verdict::verify_bundle(&bundle, &[trusted]).err()
                    )
                }),
            ),
        ];
        for (what, load) in loads {
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(load());
            });
            let err = rx
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("the {what} that is a FIFO was waited on"));
            assert!(err.starts_with("Some("), "{what}: {err}");
        }
    }

    #[test]
    fn a_policy_giving_the_gateway_key_under_any_name_is_refused() {
        // SAFETY of the test: a variable only this test reads.
        std::env::set_var("FORK_TEST_KEY_ELSEWHERE", "sk-test-0123456789abcdef");
        let passed = Policy::parse(
            "[environment]\npass = [\"FORK_TEST_KEY_ELSEWHERE\"]\n",
            "p.toml",
            None,
        )
        .unwrap();
        let e = passed
            .check_gateway_key_not_given("sk-test-0123456789abcdef")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("p.toml") && e.contains("`FORK_TEST_KEY_ELSEWHERE`"),
            "{e}"
        );
        let set = Policy::parse(
            "[environment]\nset = { TOKEN = \"Bearer sk-test-0123456789abcdef\" }\n",
            "q.toml",
            None,
        )
        .unwrap();
        assert!(set
            .check_gateway_key_not_given("sk-test-0123456789abcdef")
            .is_err());
        assert!(set
            .check_gateway_key_not_given("sk-other-key-000000")
            .is_ok());
        std::env::remove_var("FORK_TEST_KEY_ELSEWHERE");
    }

    #[test]
    fn secret_values_are_the_set_and_passed_values_but_locale_and_short_ones() {
        let p = Policy::parse(
            "[environment]\npass = [\"LANG\", \"FORK_TEST_SECRET_PASS\"]\n\
             set = { TOKEN = \"abcd1234\", LC_ALL = \"C.UTF-8\", N = \"1\" }\n",
            "p.toml",
            None,
        )
        .unwrap();
        let v = p.secret_values();
        assert!(v.contains(&"abcd1234".to_string()), "{v:?}");
        assert!(!v.iter().any(|x| x == "C.UTF-8" || x == "1"), "{v:?}");
    }
    use super::*;
    use std::time::Duration;

    #[test]
    fn builtin_has_seed_defaults() {
        let p = Policy::builtin().unwrap();
        assert_eq!(p.budgets, Budgets::default());
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
    fn state_precopy_is_off_or_a_size_and_not_among_the_serialized_conditions() {
        let builtin = Policy::builtin().unwrap();
        assert_eq!(
            builtin.state.precopy.min_bytes,
            crate::fork::snapshot::PRECOPY_MIN_BYTES
        );
        let parse =
            |v: &str| Policy::parse(&format!("[state]\nprecopy = \"{v}\"\n"), "p.toml", None);
        assert_eq!(parse("off").unwrap().state.precopy.min_bytes, u64::MAX);
        assert_eq!(parse("Off").unwrap().state.precopy.min_bytes, u64::MAX);
        let bytes = Policy::parse("[state]\nprecopy = 4096\n", "p.toml", None).unwrap();
        assert_eq!(bytes.state.precopy.min_bytes, 4096);
        let small = parse("1MiB").unwrap();
        assert_eq!(small.state.precopy.min_bytes, 1 << 20);
        for bad in ["true", "-1", "1.5"] {
            let e = Policy::parse(&format!("[state]\nprecopy = {bad}\n"), "p.toml", None)
                .unwrap_err()
                .to_string();
            assert!(e.contains("state.precopy") && e.contains(bad), "{e}");
        }
        let e = parse("soon").unwrap_err().to_string();
        assert!(
            e.contains("p.toml") && e.contains("state.precopy") && e.contains("soon"),
            "{e}"
        );
        // The same bytes either way: a verdict's conditions do not depend on it.
        let base = Policy::parse("[state]\n", "p.toml", None).unwrap();
        assert_eq!(
            serde_json::to_string(&small).unwrap(),
            serde_json::to_string(&base).unwrap()
        );
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
}
