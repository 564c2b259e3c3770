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

/// The globs a manifest's `protected` list stands for, each with the index of the pattern
/// it comes from: spelled as paths are compared (`./tests/` is `tests`), and a pattern that
/// names one path (no glob character) also as `path/**`, so that a directory named is
/// protected with everything it holds. The gate, the protected tree's copy and its check
/// all read the list through this.
pub fn protected_globs(protected: &[String]) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (i, p) in protected.iter().enumerate() {
        let t = normalize(p);
        if t.is_empty() {
            // `.` (the manifest refuses it): the whole tree.
            out.push(("**".to_string(), i));
        } else if has_glob_syntax(&t) {
            out.push((t, i));
        } else {
            out.push((format!("{t}/**"), i));
            out.push((t, i));
        }
    }
    out
}

/// Whether a pattern uses glob syntax (a `\` escape included), rather than naming a path.
pub fn has_glob_syntax(p: &str) -> bool {
    p.contains(['*', '?', '[', '{', '\\'])
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
    let (globs, from): (Vec<String>, Vec<usize>) = protected_globs(protected).into_iter().unzip();
    let hit = glob_hit(patch, &globs, "protected", |set, rel| {
        set.matches(rel).first().copied()
    })?;
    Some(hit.map_or_else(
        |out| out,
        |(p, line, i)| {
            stop(
                Gate::ProtectedPath,
                format!(
                    "`{p}` (patch line {line}) matches the protected pattern `{}`: the \
                     evaluation's own files (tests, benchmarks, the manifest, the policy in use) may not be \
                     changed by the patch under evaluation; drop this file from the patch",
                    protected[from[i]]
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
#[path = "gates_tests.rs"]
mod tests;
