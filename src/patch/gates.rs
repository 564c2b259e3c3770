//! Policy gates run at PLAN time, before anything is cloned (lifecycle step 1).
//!
//! In priority order: `size`, `parse`, `path_escape`, `protected_path`, `binary`,
//! `forbidden_content`. The first gate that stops the patch decides the outcome; a
//! stopped patch is a REJECT verdict, not an error.
//!
//! The gates are a cheap first filter, not the security boundary: a patch can always
//! spell a forbidden string differently (fixtures/patches/hostile-escape.diff does).
//! Containment is the sandbox's job.

use std::path::{Component, Path};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use serde::{Deserialize, Deserializer, Serialize};

use super::parse::{parse, LineKind, Patch};

/// The gates, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Gate {
    Size,
    Parse,
    PathEscape,
    ProtectedPath,
    Binary,
    ForbiddenContent,
}

impl Gate {
    pub const ALL: [Gate; 6] = [
        Gate::Size,
        Gate::Parse,
        Gate::PathEscape,
        Gate::ProtectedPath,
        Gate::Binary,
        Gate::ForbiddenContent,
    ];

    /// The gate's name, as verdicts and the README spell it.
    pub fn name(self) -> &'static str {
        match self {
            Gate::Size => "size",
            Gate::Parse => "parse",
            Gate::PathEscape => "path_escape",
            Gate::ProtectedPath => "protected_path",
            Gate::Binary => "binary",
            Gate::ForbiddenContent => "forbidden_content",
        }
    }
}

impl std::fmt::Display for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The default `max_patch_bytes`: 1 MiB.
pub const DEFAULT_MAX_PATCH_BYTES: u64 = 1 << 20;

/// The policy's `[gates]` table.
///
/// `forbidden_patterns` are plain, case-sensitive substrings searched in the lines a
/// patch adds (never in removed or context lines). `max_patch_bytes` accepts a number
/// of bytes or a size such as "512KiB".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatePolicy {
    #[serde(deserialize_with = "bytes_or_size")]
    pub max_patch_bytes: u64,
    pub allow_binary: bool,
    pub forbidden_patterns: Vec<String>,
}

impl Default for GatePolicy {
    fn default() -> Self {
        GatePolicy {
            max_patch_bytes: DEFAULT_MAX_PATCH_BYTES,
            allow_binary: false,
            forbidden_patterns: default_forbidden_patterns(),
        }
    }
}

/// Touching the node identity key, and asking for a privileged container.
pub fn default_forbidden_patterns() -> Vec<String> {
    [".config/fork", "node.key", "--privileged"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

impl GatePolicy {
    /// Checks the policy itself: a positive size limit and no empty pattern (an empty
    /// pattern would match every added line).
    pub fn validate(&self) -> Result<(), String> {
        if self.max_patch_bytes == 0 {
            return Err(
                "gates.max_patch_bytes is 0: no patch could pass; write a size such as \"1MiB\""
                    .into(),
            );
        }
        if let Some(i) = self.forbidden_patterns.iter().position(|p| p.is_empty()) {
            return Err(format!(
                "gates.forbidden_patterns[{i}] is empty and would match every line; remove it"
            ));
        }
        Ok(())
    }
}

fn bytes_or_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Bytes(u64),
        Text(String),
    }
    match Raw::deserialize(d)? {
        Raw::Bytes(n) => Ok(n),
        Raw::Text(s) => crate::units::parse_size(&s).map_err(serde::de::Error::custom),
    }
}

/// What the gates decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateOutcome {
    Passed,
    /// `reason` says what was found and what to do.
    Stopped {
        gate: Gate,
        reason: String,
    },
}

impl GateOutcome {
    pub fn is_passed(&self) -> bool {
        matches!(self, GateOutcome::Passed)
    }

    /// The gate that stopped the patch, if any.
    pub fn gate(&self) -> Option<Gate> {
        match self {
            GateOutcome::Passed => None,
            GateOutcome::Stopped { gate, .. } => Some(*gate),
        }
    }
}

fn stop(gate: Gate, reason: String) -> GateOutcome {
    GateOutcome::Stopped { gate, reason }
}

/// A patch the gates stopped: which gate and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateStop {
    pub gate: Gate,
    pub reason: String,
}

/// Runs every gate on raw patch bytes: size first (before parsing), then parse, then
/// [`run_gates`]. The parsed patch when every gate passes; otherwise the gate that
/// stopped it and why.
pub fn check_patch(
    raw: &[u8],
    protected: &[String],
    tree: &Path,
    policy: &GatePolicy,
) -> Result<Patch, GateStop> {
    let stopped = |out: GateOutcome| match out {
        GateOutcome::Stopped { gate, reason } => Err(GateStop { gate, reason }),
        GateOutcome::Passed => Ok(()),
    };
    if let Some(out) = size_gate(raw, policy) {
        stopped(out)?;
    }
    let patch = match parse(raw) {
        Ok(p) => p,
        Err(e) => {
            return Err(GateStop {
                gate: Gate::Parse,
                reason: format!("the patch is not a valid unified diff: {e}"),
            })
        }
    };
    stopped(run_gates(raw, &patch, protected, tree, policy))?;
    Ok(patch)
}

/// Runs the gates on an already parsed patch (`raw` is the text it was parsed from).
/// `protected` are the manifest's glob patterns, relative to `tree` (the runtime's
/// source tree, used to refuse writes through symlinks).
pub fn run_gates(
    raw: &[u8],
    patch: &Patch,
    protected: &[String],
    tree: &Path,
    policy: &GatePolicy,
) -> GateOutcome {
    if let Some(out) = size_gate(raw, policy) {
        return out;
    }
    if patch.files.is_empty() {
        return stop(Gate::Parse, "the patch contains no file changes".into());
    }
    if let Some(out) = path_escape_gate(patch, tree) {
        return out;
    }
    if let Some(out) = protected_gate(patch, protected) {
        return out;
    }
    if !policy.allow_binary {
        if let Some(f) = patch.files.iter().find(|f| f.binary) {
            return stop(
                Gate::Binary,
                format!(
                    "`{}` (patch line {}) is a binary change; binary patches are refused \
                     unless the policy sets gates.allow_binary = true",
                    f.path(),
                    f.line
                ),
            );
        }
    }
    if let Some(out) = forbidden_gate(patch, policy) {
        return out;
    }
    GateOutcome::Passed
}

fn size_gate(raw: &[u8], policy: &GatePolicy) -> Option<GateOutcome> {
    size_outcome(raw.len() as u64, policy)
}

/// The size gate for a patch of `len` bytes (a file's size, when only a bounded prefix of
/// it was read): the stop when it is over the policy's `max_patch_bytes`.
pub fn size_stop(len: u64, policy: &GatePolicy) -> Option<GateStop> {
    match size_outcome(len, policy)? {
        GateOutcome::Stopped { gate, reason } => Some(GateStop { gate, reason }),
        GateOutcome::Passed => None,
    }
}

fn size_outcome(len: u64, policy: &GatePolicy) -> Option<GateOutcome> {
    (len > policy.max_patch_bytes).then(|| {
        stop(
            Gate::Size,
            format!(
                "the patch is {len} bytes ({}), over the policy's gates.max_patch_bytes of {} \
                 ({}); split the patch or raise the limit",
                crate::units::format_size(len),
                policy.max_patch_bytes,
                crate::units::format_size(policy.max_patch_bytes)
            ),
        )
    })
}

const MODE_SYMLINK: u32 = 0o120000;
const MODE_GITLINK: u32 = 0o160000;

fn path_escape_gate(patch: &Patch, tree: &Path) -> Option<GateOutcome> {
    for f in &patch.files {
        for p in f.paths() {
            if let Err(why) = check_path(tree, p) {
                return Some(stop(
                    Gate::PathEscape,
                    format!("`{p}` (patch line {}): {why}", f.line),
                ));
            }
        }
        for mode in [f.old_mode, f.new_mode].into_iter().flatten() {
            let what = match mode & 0o170000 {
                MODE_SYMLINK => "a symbolic link (mode 120000)",
                MODE_GITLINK => "a submodule (mode 160000)",
                _ => continue,
            };
            return Some(stop(
                Gate::PathEscape,
                format!(
                    "`{}` (patch line {}) is {what}; a patch may only change regular files",
                    f.path(),
                    f.line
                ),
            ));
        }
    }
    None
}

/// Checks that `rel` (a path from a patch) names a file inside `tree`: relative, no
/// `..` component, and no existing component that is a symbolic link (a patch may not
/// write through a symlink). Returns what is wrong, for a message.
pub fn check_path(tree: &Path, rel: &str) -> Result<(), String> {
    if rel.is_empty() {
        return Err("empty path".into());
    }
    if rel.contains('\0') {
        return Err("the path contains a NUL byte".into());
    }
    let path = Path::new(rel);
    if path.is_absolute() {
        return Err("absolute path; a patch may only name paths inside the tree".into());
    }
    let mut cur = tree.to_path_buf();
    let mut shown = String::new();
    let mut any = false;
    let mut exists = true;
    for c in path.components() {
        match c {
            Component::ParentDir => {
                return Err("`..` component: the path escapes the tree".into());
            }
            Component::CurDir => continue,
            Component::RootDir | Component::Prefix(_) => {
                return Err("absolute path; a patch may only name paths inside the tree".into());
            }
            Component::Normal(name) => {
                any = true;
                cur.push(name);
                if !shown.is_empty() {
                    shown.push('/');
                }
                shown.push_str(&name.to_string_lossy());
                if !exists {
                    continue;
                }
                match std::fs::symlink_metadata(&cur) {
                    Ok(m) if m.file_type().is_symlink() => {
                        return Err(format!(
                            "`{shown}` is a symbolic link in the tree; a patch may not write \
                             through a symlink"
                        ));
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => exists = false,
                    Err(e) => return Err(format!("cannot inspect `{shown}`: {e}")),
                }
            }
        }
    }
    if !any {
        return Err("the path names the tree itself, not a file".into());
    }
    Ok(())
}

/// `a/./b//c` -> `a/b/c`, for glob matching.
fn normalize(rel: &str) -> String {
    rel.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect::<Vec<_>>()
        .join("/")
}

fn protected_set(protected: &[String]) -> Result<GlobSet, String> {
    let mut b = GlobSetBuilder::new();
    for p in protected {
        let glob = GlobBuilder::new(p)
            .literal_separator(true)
            .build()
            .map_err(|e| format!("protected pattern `{p}` is not a valid glob: {e}"))?;
        b.add(glob);
    }
    b.build().map_err(|e| format!("protected patterns: {e}"))
}

fn protected_gate(patch: &Patch, protected: &[String]) -> Option<GateOutcome> {
    if protected.is_empty() {
        return None;
    }
    let set = match protected_set(protected) {
        Ok(s) => s,
        // Fail closed: a broken protection list protects nothing otherwise.
        Err(e) => {
            return Some(stop(
                Gate::ProtectedPath,
                format!("{e}; fix fork.toml [runtime] protected"),
            ))
        }
    };
    for f in &patch.files {
        for p in f.paths() {
            let norm = normalize(p);
            if let Some(&i) = set.matches(&norm).first() {
                return Some(stop(
                    Gate::ProtectedPath,
                    format!(
                        "`{p}` (patch line {}) matches the protected pattern `{}`: the \
                         evaluation's own files (tests, benchmarks, the manifest) may not be \
                         changed by the patch under evaluation; drop this file from the patch",
                        f.line, protected[i]
                    ),
                ));
            }
        }
    }
    None
}

fn forbidden_gate(patch: &Patch, policy: &GatePolicy) -> Option<GateOutcome> {
    let patterns: Vec<&String> = policy
        .forbidden_patterns
        .iter()
        .filter(|p| !p.is_empty())
        .collect();
    if patterns.is_empty() {
        return None;
    }
    for f in &patch.files {
        for (hi, h) in f.hunks.iter().enumerate() {
            // Each hunk line is one patch line, plus one per `\ No newline` marker.
            let mut patch_line = h.line;
            for l in &h.lines {
                patch_line += 1;
                if l.kind == LineKind::Add {
                    if let Some(p) = patterns.iter().find(|p| contains(&l.text, p.as_bytes())) {
                        return Some(stop(
                            Gate::ForbiddenContent,
                            format!(
                                "a line added to `{}` (hunk {}, patch line {patch_line}) contains \
                                 the forbidden pattern `{p}`",
                                f.path(),
                                hi + 1
                            ),
                        ));
                    }
                }
                if l.no_newline {
                    patch_line += 1;
                }
            }
        }
    }
    None
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn root() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    fn fixture(name: &str) -> Vec<u8> {
        let p = root().join("fixtures/patches").join(name);
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    fn demo() -> PathBuf {
        root().join("fixtures/hermes-demo")
    }

    fn protected() -> Vec<String> {
        ["tests/**", "bench/**", "fork.toml"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// The gates' decision as an outcome (the tests compare outcomes).
    fn outcome(r: &Result<Patch, GateStop>) -> GateOutcome {
        match r {
            Ok(_) => GateOutcome::Passed,
            Err(GateStop { gate, reason }) => GateOutcome::Stopped {
                gate: *gate,
                reason: reason.clone(),
            },
        }
    }

    fn check(raw: &[u8], prot: &[String], policy: &GatePolicy) -> GateOutcome {
        outcome(&check_patch(raw, prot, &demo(), policy))
    }

    fn gate(name: &str, policy: &GatePolicy) -> GateOutcome {
        check(&fixture(name), &protected(), policy)
    }

    fn stopped_by(out: &GateOutcome) -> (&'static str, String) {
        match out {
            GateOutcome::Stopped { gate, reason } => (gate.name(), reason.clone()),
            GateOutcome::Passed => ("passed", String::new()),
        }
    }

    #[test]
    fn benign_and_hostile_but_disguised_fixtures_pass() {
        let policy = GatePolicy::default();
        for name in [
            "swap-compressor.diff",
            "breaks-test.diff",
            "does-not-apply.diff",
            "noop-comment.diff",
            // Passes on purpose: it spells its targets piece by piece; the sandbox,
            // not the gates, must contain it.
            "hostile-escape.diff",
        ] {
            assert_eq!(gate(name, &policy), GateOutcome::Passed, "{name}");
        }
    }

    #[test]
    fn size_gate_runs_first() {
        let policy = GatePolicy {
            max_patch_bytes: 1000,
            ..GatePolicy::default()
        };
        let (g, reason) = stopped_by(&gate("swap-compressor.diff", &policy));
        assert_eq!(g, "size");
        assert!(
            reason.contains("over the policy's gates.max_patch_bytes of 1000"),
            "{reason}"
        );
        // size wins even over a patch that would also fail later gates
        let raw = [fixture("path-traversal.diff"), vec![b'\n'; 1000]].concat();
        let r = check_patch(&raw, &protected(), &demo(), &policy);
        assert_eq!(outcome(&r).gate(), Some(Gate::Size));
        assert!(r.is_err(), "a stopped patch carries no parsed patch");
        assert_eq!(gate("noop-comment.diff", &policy), GateOutcome::Passed);
    }

    #[test]
    fn parse_gate_reports_the_parser_error() {
        let raw = fixture("swap-compressor.diff");
        let cut = &raw[..raw.len() / 2];
        let r = check_patch(cut, &protected(), &demo(), &GatePolicy::default());
        let (out, parsed) = (outcome(&r), r.ok());
        let (g, reason) = stopped_by(&out);
        assert_eq!(g, "parse");
        assert!(reason.contains("patch line"), "{reason}");
        assert!(parsed.is_none());
        let empty = Patch { files: Vec::new() };
        let out = run_gates(b"", &empty, &protected(), &demo(), &GatePolicy::default());
        assert_eq!(out.gate(), Some(Gate::Parse));
    }

    #[test]
    fn path_escape_gate_on_traversal_absolute_and_symlinks() {
        let (g, reason) = stopped_by(&gate("path-traversal.diff", &GatePolicy::default()));
        assert_eq!(g, "path_escape");
        assert!(
            reason.contains("`../escaped.txt`") && reason.contains("escapes the tree"),
            "{reason}"
        );

        let abs = b"--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-a\n+b\n";
        let out = check(abs, &[], &GatePolicy::default());
        assert!(stopped_by(&out).1.contains("absolute path"), "{out:?}");

        // A tree where `hermes` is a symlink: swap-compressor would write through it.
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("elsewhere");
        std::fs::create_dir(&real).unwrap();
        let tree = tmp.path().join("tree");
        std::fs::create_dir(&tree).unwrap();
        std::os::unix::fs::symlink(&real, tree.join("hermes")).unwrap();
        let out = outcome(&check_patch(
            &fixture("swap-compressor.diff"),
            &protected(),
            &tree,
            &GatePolicy::default(),
        ));
        let (g, reason) = stopped_by(&out);
        assert_eq!(g, "path_escape");
        assert!(reason.contains("`hermes` is a symbolic link"), "{reason}");

        let link = b"diff --git a/l b/l\nnew file mode 120000\nindex 0000000..1111111\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+/etc/shadow\n\\ No newline at end of file\n";
        let out = check(link, &[], &GatePolicy::default());
        assert!(
            stopped_by(&out).1.contains("symbolic link (mode 120000)"),
            "{out:?}"
        );
    }

    #[test]
    fn check_path_cases() {
        let d = demo();
        assert!(check_path(&d, "hermes/compressor.py").is_ok());
        assert!(check_path(&d, "./hermes/new/file.py").is_ok());
        assert!(check_path(&d, "hermes/../../x").is_err());
        assert!(check_path(&d, "/abs").is_err());
        assert!(check_path(&d, "").is_err());
        assert!(check_path(&d, ".").is_err());
    }

    #[test]
    fn protected_path_gate_matches_old_and_new_paths() {
        let (g, reason) = stopped_by(&gate("touches-protected.diff", &GatePolicy::default()));
        assert_eq!(g, "protected_path");
        assert!(
            reason.contains("`tests/test_compressor.py`") && reason.contains("`tests/**`"),
            "{reason}"
        );

        // renaming a protected file away is caught through its old path
        let rename = b"diff --git a/fork.toml b/not-the-manifest.toml\nsimilarity index 100%\nrename from fork.toml\nrename to not-the-manifest.toml\n";
        let out = check(rename, &protected(), &GatePolicy::default());
        assert!(stopped_by(&out).1.contains("`fork.toml`"), "{out:?}");

        // `*` does not cross directories; `./` is normalized away
        let prot = vec!["bench/*.py".to_string()];
        let deep = b"--- a/bench/sub/x.py\n+++ b/bench/sub/x.py\n@@ -1 +1 @@\n-a\n+b\n";
        assert!(check(deep, &prot, &GatePolicy::default()).is_passed());
        let dotted = b"--- a/./bench/x.py\n+++ b/./bench/x.py\n@@ -1 +1 @@\n-a\n+b\n";
        assert_eq!(
            check(dotted, &prot, &GatePolicy::default()).gate(),
            Some(Gate::ProtectedPath)
        );

        let bad = vec!["tests/[".to_string()];
        let out = gate_with(&fixture("noop-comment.diff"), &bad);
        assert!(stopped_by(&out).1.contains("not a valid glob"), "{out:?}");
    }

    fn gate_with(raw: &[u8], prot: &[String]) -> GateOutcome {
        check(raw, prot, &GatePolicy::default())
    }

    #[test]
    fn binary_gate_and_its_switch() {
        let (g, reason) = stopped_by(&gate("adds-binary.diff", &GatePolicy::default()));
        assert_eq!(g, "binary");
        assert!(reason.contains("tools/icon.bin"), "{reason}");
        let allow = GatePolicy {
            allow_binary: true,
            ..GatePolicy::default()
        };
        assert!(gate("adds-binary.diff", &allow).is_passed());
    }

    #[test]
    fn forbidden_content_only_in_added_lines() {
        let (g, reason) = stopped_by(&gate("reads-node-key.diff", &GatePolicy::default()));
        assert_eq!(g, "forbidden_content");
        assert!(
            reason.contains("`.config/fork`") && reason.contains("hermes/runtime.py"),
            "{reason}"
        );
        // the reported patch line really is the offending line
        let raw = fixture("reads-node-key.diff");
        let text = String::from_utf8_lossy(&raw);
        let n: usize = reason
            .split("patch line ")
            .nth(1)
            .and_then(|s| s.split(')').next())
            .and_then(|s| s.parse().ok())
            .unwrap();
        assert!(text.lines().nth(n - 1).unwrap().contains(".config/fork"));

        // custom pattern on a fixture; removed and context lines do not count
        let policy = GatePolicy {
            forbidden_patterns: vec!["manifest or module".into()],
            ..GatePolicy::default()
        };
        assert_eq!(
            gate("noop-comment.diff", &policy).gate(),
            Some(Gate::ForbiddenContent)
        );
        let policy = GatePolicy {
            forbidden_patterns: vec!["class RegistryError".into()],
            ..GatePolicy::default()
        };
        assert!(gate("noop-comment.diff", &policy).is_passed());
        let removal =
            b"--- a/x\n+++ b/x\n@@ -1,2 +1 @@\n keep\n-path = '~/.config/fork/node.key'\n";
        assert!(check(removal, &[], &GatePolicy::default()).is_passed());
    }

    #[test]
    fn gate_order_protected_before_binary_before_content() {
        // touches a protected path and adds a forbidden string: protected wins
        let raw = b"--- a/tests/x.py\n+++ b/tests/x.py\n@@ -1 +1 @@\n-a\n+open('node.key')\n";
        assert_eq!(
            check(raw, &protected(), &GatePolicy::default()).gate(),
            Some(Gate::ProtectedPath)
        );
        let both = [fixture("adds-binary.diff"), fixture("reads-node-key.diff")].concat();
        assert_eq!(
            check(&both, &protected(), &GatePolicy::default()).gate(),
            Some(Gate::Binary)
        );
    }

    #[test]
    fn policy_serde_defaults_units_and_unknown_fields() {
        let p: GatePolicy = toml::from_str("").unwrap();
        assert_eq!(p, GatePolicy::default());
        let p: GatePolicy =
            toml::from_str("max_patch_bytes = \"64KiB\"\nallow_binary = true").unwrap();
        assert_eq!(p.max_patch_bytes, 64 << 10);
        assert!(p.allow_binary);
        assert_eq!(p.forbidden_patterns, default_forbidden_patterns());
        let p: GatePolicy = toml::from_str("max_patch_bytes = 4096").unwrap();
        assert_eq!(p.max_patch_bytes, 4096);
        let e = toml::from_str::<GatePolicy>("max_bytes = 1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `max_bytes`"), "{e}");
        assert!(toml::from_str::<GatePolicy>("max_patch_bytes = \"lots\"").is_err());
        assert!(GatePolicy::default().validate().is_ok());
        let bad = GatePolicy {
            forbidden_patterns: vec![String::new()],
            ..GatePolicy::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .contains("forbidden_patterns[0]"));
    }
}
