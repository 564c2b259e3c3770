//! Policy gates run at PLAN time, before anything is cloned (lifecycle step 1).
//!
//! In priority order: `size`, `parse`, `path_escape`, `path_collision`, `protected_path`,
//! `binary`, `forbidden_content`. The first gate that stops the patch decides the outcome;
//! a stopped patch is a REJECT verdict, not an error.
//!
//! The evaluated tree must be the deployed tree: `path_escape` refuses every path `git
//! apply` would spell differently (`//`, `.`, `..`, `.git`; see
//! [`crate::patch::parse::verify_path`]), `path_collision` refuses two entries naming one
//! path (or two paths one case-insensitive filesystem would merge), and `binary` refuses
//! opaque bytes however they are carried (a `GIT binary patch`, a text hunk with NUL
//! bytes or invalid UTF-8, a compiled or packaged file by its extension).
//!
//! The gates are a cheap first filter, not the security boundary: a patch can always
//! spell a forbidden string differently (fixtures/patches/hostile-escape.diff does).
//! Containment is the sandbox's job.

use std::path::{Component, Path};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use serde::{Deserialize, Deserializer, Serialize};

use super::parse::{parse, tidy, verify_path, ChangeKind, FilePatch, LineKind, Patch};

/// The gates, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Gate {
    Size,
    Parse,
    PathEscape,
    PathCollision,
    ProtectedPath,
    Binary,
    ForbiddenContent,
}

impl Gate {
    pub const ALL: [Gate; 7] = [
        Gate::Size,
        Gate::Parse,
        Gate::PathEscape,
        Gate::PathCollision,
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
            Gate::PathCollision => "path_collision",
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

/// The manifest's path rules the gates enforce: `protected` globs (the evaluation's own
/// files) and `exclude` globs (what is never copied into the successor's tree, so never
/// part of the tree hash: a patch may not write there either).
#[derive(Debug, Clone, Copy, Default)]
pub struct PathRules<'a> {
    pub protected: &'a [String],
    pub exclude: &'a [String],
}

/// Runs every gate on raw patch bytes: size first (before parsing), then parse, then
/// [`run_gates`]. The parsed patch when every gate passes; otherwise the gate that
/// stopped it and why.
pub fn check_patch(
    raw: &[u8],
    rules: PathRules<'_>,
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
    stopped(run_gates(raw, &patch, rules, tree, policy))?;
    Ok(patch)
}

/// Runs the gates on an already parsed patch (`raw` is the text it was parsed from).
/// `rules` hold the manifest's glob patterns, relative to `tree` (the runtime's source
/// tree, used to refuse writes through symlinks and case collisions with its files).
pub fn run_gates(
    raw: &[u8],
    patch: &Patch,
    rules: PathRules<'_>,
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
    if let Some(out) = collision_gate(patch, tree) {
        return out;
    }
    if let Some(out) = protected_gate(patch, rules.protected) {
        return out;
    }
    if let Some(out) = excluded_gate(patch, rules.exclude) {
        return out;
    }
    if !policy.allow_binary {
        if let Some(why) = patch.files.iter().find_map(binary_reason) {
            return stop(
                Gate::Binary,
                format!("{why}; binary content is refused unless the policy sets gates.allow_binary = true"),
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

/// Checks that `rel` (a path from a patch; a leading `./` is dropped) names a file inside
/// `tree` in the one spelling git uses ([`verify_path`]: relative, no empty, `.`, `..` or
/// `.git` component), and that no existing component is a symbolic link (a patch may not
/// write through a symlink). Returns what is wrong, for a message.
pub fn check_path(tree: &Path, rel: &str) -> Result<(), String> {
    let rel = tidy(rel.to_string());
    verify_path(&rel)?;
    let path = Path::new(&rel);
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

/// How a case-insensitive filesystem would see a path.
fn fold(path: &str) -> String {
    path.to_lowercase()
}

/// `path_collision`: each (normalised) path is named by one entry only, no two paths of
/// the patch differ only in case, and no path the patch creates differs only in case from
/// a file or directory already in `tree`. Each would deploy otherwise than it was
/// evaluated (`git apply` applies every entry in turn; a case-insensitive filesystem
/// merges the two names).
fn collision_gate(patch: &Patch, tree: &Path) -> Option<GateOutcome> {
    use std::collections::HashMap;
    // folded path -> (path as written, entry's patch line, entry index)
    let mut seen: HashMap<String, (&str, usize, usize)> = HashMap::new();
    for (i, f) in patch.files.iter().enumerate() {
        for p in f.paths() {
            let key = fold(&normalize(p));
            match seen.get(&key) {
                Some(&(q, line, j)) if j != i && normalize(q) == normalize(p) => {
                    return Some(stop(
                        Gate::PathCollision,
                        format!(
                            "`{p}` is named by two entries of the patch (patch lines {line} and \
                             {}); `git apply` would apply both in turn: send one entry per file",
                            f.line
                        ),
                    ));
                }
                Some(&(q, line, _)) if q != p => {
                    return Some(stop(
                        Gate::PathCollision,
                        format!(
                            "`{p}` (patch line {}) and `{q}` (patch line {line}) differ only in \
                             case: a case-insensitive filesystem would deploy them as one file",
                            f.line
                        ),
                    ));
                }
                _ => {
                    seen.insert(key, (p, f.line, i));
                }
            }
        }
        let created = match f.kind {
            ChangeKind::Create | ChangeKind::Rename | ChangeKind::Copy => f.new_path.as_deref(),
            ChangeKind::Modify | ChangeKind::Delete => None,
        };
        if let Some(p) = created {
            if let Some(existing) = case_twin(tree, p) {
                return Some(stop(
                    Gate::PathCollision,
                    format!(
                        "`{p}` (patch line {}) differs only in case from `{existing}` in the \
                         tree: a case-insensitive filesystem would deploy them as one file",
                        f.line
                    ),
                ));
            }
        }
    }
    None
}

/// The first existing entry of `tree` along `rel` whose name equals a component of `rel`
/// but for case (as a path relative to `tree`), if any.
fn case_twin(tree: &Path, rel: &str) -> Option<String> {
    let mut dir = tree.to_path_buf();
    let mut shown: Vec<String> = Vec::new();
    for c in rel.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if std::fs::symlink_metadata(dir.join(c)).is_ok() {
            shown.push(c.to_string());
            dir.push(c);
            continue;
        }
        let twin = std::fs::read_dir(&dir).ok()?.flatten().find_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name != c && fold(&name) == fold(c)).then_some(name)
        })?;
        shown.push(twin);
        return Some(shown.join("/"));
    }
    None
}

/// Whether `rel` lies in a path the manifest's `exclude` leaves out of the copy (the
/// path itself or one of its directories matches): the matching pattern's index.
fn excluded_by(set: &GlobSet, rel: &str) -> Option<usize> {
    let parts: Vec<&str> = rel.split('/').collect();
    (1..=parts.len()).find_map(|n| set.matches(parts[..n].join("/")).first().copied())
}

/// Part of `protected_path`: a patch may not write into a path the manifest excludes
/// (`state`, `.git`, ...). The successor would run with a file the tree hash leaves out.
fn excluded_gate(patch: &Patch, exclude: &[String]) -> Option<GateOutcome> {
    // Spelled as the copy reads them (`state/` and `./state` are `state`).
    let trimmed: Vec<String> = exclude
        .iter()
        .map(|p| {
            let t = p.trim_end_matches('/');
            t.strip_prefix("./").unwrap_or(t).to_string()
        })
        .collect();
    let hit = glob_hit(patch, &trimmed, "exclude", excluded_by)?;
    Some(hit.map_or_else(
        |out| out,
        |(p, line, _)| {
            stop(
                Gate::ProtectedPath,
                format!(
                    "`{p}` (patch line {line}) lies in a path fork.toml [runtime] exclude leaves \
                     out of the successor's tree; the evaluated tree could not cover it"
                ),
            )
        },
    ))
}

/// The first path of `patch` that `hit` finds in the globs `patterns` (fork.toml's
/// `[runtime] field`): the path, its entry's patch line and the pattern's index; or the
/// stop when the patterns do not compile (fail closed: a broken list protects nothing).
fn glob_hit<'p>(
    patch: &'p Patch,
    patterns: &[String],
    field: &str,
    hit: fn(&GlobSet, &str) -> Option<usize>,
) -> Option<Result<(&'p str, usize, usize), GateOutcome>> {
    if patterns.is_empty() {
        return None;
    }
    let set = match protected_set(patterns) {
        Ok(s) => s,
        Err(e) => {
            return Some(Err(stop(
                Gate::ProtectedPath,
                format!("{e}; fix fork.toml [runtime] {field}"),
            )))
        }
    };
    for f in &patch.files {
        for p in f.paths() {
            if let Some(i) = hit(&set, &normalize(p)) {
                return Some(Ok((p, f.line, i)));
            }
        }
    }
    None
}

/// Extensions of compiled or packaged files: opaque to review whatever their encoding.
const OPAQUE_EXTENSIONS: &[&str] = &[
    "pyc", "pyo", "pyd", "so", "o", "a", "obj", "lib", "dylib", "dll", "exe", "class", "jar",
    "war", "ear", "whl", "egg", "wasm", "node", "elc", "beam", "zip", "tar", "gz", "tgz", "bz2",
    "xz", "zst", "7z", "rar",
];

/// The opaque extension of a file name (`libx.so.1` versions included), if any.
fn opaque_extension(path: &str) -> Option<&'static str> {
    let name = path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
    let (_, last) = name.rsplit_once('.')?;
    if let Some(ext) = OPAQUE_EXTENSIONS.iter().find(|e| **e == last) {
        return Some(ext);
    }
    name.split('.').skip(1).any(|p| p == "so").then_some("so")
}

/// Why the `binary` gate stops this entry, if it does: a binary patch, a file left behind
/// with an opaque extension, or a text hunk line carrying a NUL byte or invalid UTF-8.
fn binary_reason(f: &FilePatch) -> Option<String> {
    if f.binary {
        return Some(format!(
            "`{}` (patch line {}) is a binary change",
            f.path(),
            f.line
        ));
    }
    let mut left: Vec<&str> = f.new_path.iter().map(String::as_str).collect();
    if matches!(f.kind, ChangeKind::Rename | ChangeKind::Copy) {
        left.extend(f.old_path.as_deref());
    }
    for p in left {
        if let Some(ext) = opaque_extension(p) {
            return Some(format!(
                "`{p}` (patch line {}) has the extension `.{ext}` of compiled or packaged code",
                f.line
            ));
        }
    }
    for h in &f.hunks {
        let mut patch_line = h.line;
        for l in &h.lines {
            patch_line += 1;
            let what = if l.text.contains(&0) {
                Some("a NUL byte")
            } else if std::str::from_utf8(&l.text).is_err() {
                Some("bytes that are not UTF-8")
            } else {
                None
            };
            if let Some(what) = what {
                return Some(format!(
                    "a hunk line of `{}` (patch line {patch_line}) carries {what}: binary \
                     content in a text hunk",
                    f.path()
                ));
            }
            if l.no_newline {
                patch_line += 1;
            }
        }
    }
    None
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
    let hit = glob_hit(patch, protected, "protected", |set, rel| {
        set.matches(rel).first().copied()
    })?;
    Some(hit.map_or_else(
        |out| out,
        |(p, line, i)| {
            stop(
                Gate::ProtectedPath,
                format!(
                    "`{p}` (patch line {line}) matches the protected pattern `{}`: the \
                     evaluation's own files (tests, benchmarks, the manifest) may not be \
                     changed by the patch under evaluation; drop this file from the patch",
                    protected[i]
                ),
            )
        },
    ))
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

    fn rules(protected: &[String]) -> PathRules<'_> {
        PathRules {
            protected,
            exclude: &[],
        }
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
        outcome(&check_patch(raw, rules(prot), &demo(), policy))
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
        let r = check_patch(&raw, rules(&protected()), &demo(), &policy);
        assert_eq!(outcome(&r).gate(), Some(Gate::Size));
        assert!(r.is_err(), "a stopped patch carries no parsed patch");
        assert_eq!(gate("noop-comment.diff", &policy), GateOutcome::Passed);
    }

    #[test]
    fn parse_gate_reports_the_parser_error() {
        let raw = fixture("swap-compressor.diff");
        let cut = &raw[..raw.len() / 2];
        let r = check_patch(cut, rules(&protected()), &demo(), &GatePolicy::default());
        let (out, parsed) = (outcome(&r), r.ok());
        let (g, reason) = stopped_by(&out);
        assert_eq!(g, "parse");
        assert!(reason.contains("patch line"), "{reason}");
        assert!(parsed.is_none());
        let empty = Patch { files: Vec::new() };
        let out = run_gates(
            b"",
            &empty,
            rules(&protected()),
            &demo(),
            &GatePolicy::default(),
        );
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
            rules(&protected()),
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

    fn hack(name: &str) -> Vec<u8> {
        fixture(&format!("hacks/{name}"))
    }

    /// A one-hunk modification of `path` (as written after `a/`/`b/`).
    fn modify(path: &str, add: &str) -> String {
        format!(
            "diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-a\n+{add}\n"
        )
    }

    #[test]
    fn path_escape_refuses_every_spelling_git_would_resolve_otherwise() {
        let policy = GatePolicy::default();
        // F4: `hermes//compressor.py` beside `hermes/compressor.py`.
        let (g, reason) = stopped_by(&check(&hack("dup-path.diff"), &protected(), &policy));
        assert_eq!(g, "path_escape");
        assert!(
            reason.contains("`hermes//compressor.py`") && reason.contains("empty path component"),
            "{reason}"
        );
        for (path, why) in [
            ("hermes/./compressor.py", "`.` component"),
            ("hermes/sub/../../../x", "`..` component"),
            ("hermes/", "empty path component"),
            (".git/hooks/pre-commit", "`.git` component"),
            ("hermes/.Git/config", "`.git` component"),
        ] {
            let (g, reason) = stopped_by(&check(modify(path, "b").as_bytes(), &[], &policy));
            assert_eq!(g, "path_escape", "{path}");
            assert!(reason.contains(why), "{path}: {reason}");
        }
        // A leading `./` is normalised, not refused: `./hermes/x.py` is `hermes/x.py`.
        let p = check_patch(
            modify("./hermes/x.py", "b").as_bytes(),
            rules(&[]),
            &demo(),
            &policy,
        )
        .unwrap();
        assert_eq!(p.files[0].path(), "hermes/x.py");
    }

    #[test]
    fn path_collision_gate_on_duplicates_and_case() {
        let policy = GatePolicy::default();
        // the same path twice, once spelled with a leading `./`
        let dup = format!(
            "{}{}",
            modify("hermes/compressor.py", "b"),
            modify("./hermes/compressor.py", "c")
        );
        let (g, reason) = stopped_by(&check(dup.as_bytes(), &[], &policy));
        assert_eq!(g, "path_collision");
        assert!(
            reason.contains("named by two entries") && reason.contains("patch lines 1 and 7"),
            "{reason}"
        );
        // two spellings that differ only in case
        let case = format!(
            "{}{}",
            modify("hermes/Foo.py", "b"),
            modify("hermes/foo.py", "c")
        );
        let (g, reason) = stopped_by(&check(case.as_bytes(), &[], &policy));
        assert_eq!(g, "path_collision");
        assert!(reason.contains("differ only in case"), "{reason}");
        // a new file whose name is an existing file's but for case (and a directory's)
        for path in ["hermes/Compressor.py", "HERMES/new.py"] {
            let create = format!(
                "diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+x\n"
            );
            let (g, reason) = stopped_by(&check(create.as_bytes(), &[], &policy));
            assert_eq!(g, "path_collision", "{path}");
            assert!(reason.contains("differs only in case from `"), "{reason}");
        }
        // a rename that only changes case
        let rename = b"diff --git a/hermes/state.py b/hermes/State.py\nsimilarity index 100%\nrename from hermes/state.py\nrename to hermes/State.py\n";
        assert_eq!(
            check(rename, &[], &policy).gate(),
            Some(Gate::PathCollision)
        );
        // distinct files pass
        let two = format!(
            "{}{}",
            modify("hermes/a.py", "b"),
            modify("hermes/b.py", "c")
        );
        assert!(check(two.as_bytes(), &[], &policy).is_passed());
    }

    #[test]
    fn excluded_paths_are_protected() {
        let excl = vec!["state".to_string(), "__pycache__/".to_string()];
        let r = PathRules {
            protected: &[],
            exclude: &excl,
        };
        for path in ["state/evil.py", "__pycache__/x.py", "state"] {
            let out = outcome(&check_patch(
                modify(path, "b").as_bytes(),
                r,
                &demo(),
                &GatePolicy::default(),
            ));
            let (g, reason) = stopped_by(&out);
            assert_eq!(g, "protected_path", "{path}");
            assert!(reason.contains("exclude"), "{reason}");
        }
        let ok = check_patch(
            modify("hermes/state.py", "b").as_bytes(),
            r,
            &demo(),
            &GatePolicy::default(),
        );
        assert!(ok.is_ok());
    }

    #[test]
    fn binary_content_in_a_text_hunk_is_binary() {
        let policy = GatePolicy::default();
        // F6: NUL bytes and invalid UTF-8 in `+` lines, creating hermes/turbo.pyc.
        let (g, reason) = stopped_by(&check(&hack("binary-as-text.diff"), &protected(), &policy));
        assert_eq!(g, "binary");
        assert!(reason.contains("hermes/turbo.pyc"), "{reason}");
        // the content alone, under a harmless name
        let raw = hack("binary-as-text.diff");
        let text = replace_all(&raw, b"hermes/turbo.pyc", b"hermes/turbo.txt");
        let (g, reason) = stopped_by(&check(&text, &[], &policy));
        assert_eq!(g, "binary");
        assert!(
            reason.contains("not UTF-8") && reason.contains("patch line 7"),
            "{reason}"
        );
        let nul = b"--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+a\x00b\n";
        let (g, reason) = stopped_by(&check(nul, &[], &policy));
        assert_eq!(g, "binary");
        assert!(
            reason.contains("NUL byte") && reason.contains("patch line 5"),
            "{reason}"
        );
        let latin1 = b"--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+caf\xe9\n";
        let (g, reason) = stopped_by(&check(latin1, &[], &policy));
        assert_eq!(g, "binary");
        assert!(reason.contains("not UTF-8"), "{reason}");
        // removed and context lines count too: the file is binary either way
        let ctx = b"--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n \x00\n-a\n+b\n";
        assert_eq!(check(ctx, &[], &policy).gate(), Some(Gate::Binary));
        // an opaque extension, with perfectly textual content; also as a rename target
        for path in ["hermes/fast.so", "lib/libz.so.1", "pkg/tool.WHL", "x.class"] {
            let (g, reason) = stopped_by(&check(modify(path, "b").as_bytes(), &[], &policy));
            assert_eq!(g, "binary", "{path}");
            assert!(reason.contains("compiled or packaged"), "{reason}");
        }
        let rename = b"diff --git a/hermes/registry.py b/hermes/registry.pyc\nsimilarity index 100%\nrename from hermes/registry.py\nrename to hermes/registry.pyc\n";
        assert_eq!(check(rename, &[], &policy).gate(), Some(Gate::Binary));
        // deleting an opaque file is not adding one; `.solution.py` is not `.so`
        let del = b"diff --git a/old.pyc b/old.pyc\ndeleted file mode 100644\n--- a/old.pyc\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n";
        assert!(check(del, &[], &policy).is_passed());
        assert!(check(modify("hermes/so.py", "b").as_bytes(), &[], &policy).is_passed());
        // the switch lets all of it through
        let allow = GatePolicy {
            allow_binary: true,
            ..GatePolicy::default()
        };
        assert!(check(&hack("binary-as-text.diff"), &protected(), &allow).is_passed());
        assert!(check(latin1, &[], &allow).is_passed());
    }

    fn replace_all(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < hay.len() {
            if hay[i..].starts_with(from) {
                out.extend_from_slice(to);
                i += from.len();
            } else {
                out.push(hay[i]);
                i += 1;
            }
        }
        out
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
