//! The runtime manifest, `fork.toml` at the runtime's root (README, "fork.toml"): what to clone (`[runtime]`) and how to evaluate it (`[tasks.NAME]`, in
//! file order; the first task is the default).
//!
//! Unknown fields are errors. Every error names the file and the field and says what
//! to write instead. Paths in `source`, `state` and `tools` must be relative and stay
//! inside the runtime directory (symlinks included); `results.path` and `metrics` are
//! relative to `$FORK_REPORTS` and may not leave it.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The manifest's file name, at the runtime's root.
pub const MANIFEST_FILE: &str = "fork.toml";

/// Environment variables fork sets for the successor besides its `FORK_*` ones; a task may
/// not override them.
pub const RESERVED_ENV: [&str; 2] = ["HOME", "TMPDIR"];

/// The prefix of fork's own variables (FORK_REPORTS, FORK_STATE, FORK_TOOLS,
/// FORK_WORKSPACE, FORK_RUN_ID, FORK_TASK, FORK_SIDE, FORK_MODEL_URL, a judge's FORK_SEED,
/// and any fork adds): a task may set no variable with it.
pub const RESERVED_ENV_PREFIX: &str = "FORK_";

/// The most repetitions a task may ask for.
pub const MAX_REPEAT: u32 = 1000;

/// A manifest that could not be loaded.
#[derive(Debug, Error)]
pub enum ManifestError {
    #[error(
        "{}: not found; create fork.toml at the runtime's root with a [runtime] table and at \
         least one [tasks.NAME] table (see the README, \"fork.toml\")",
        path.display()
    )]
    Missing { path: PathBuf },
    #[error("{}: cannot read it: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Bad TOML, a wrong type, a missing or unknown field (toml's message names the line,
    /// the field and the expected fields).
    #[error("{}: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    /// A value that parsed but is not acceptable.
    #[error("{}: `{field}`: {message}", path.display())]
    Invalid {
        path: PathBuf,
        field: String,
        message: String,
    },
    #[error("{}: no task named `{name}`; the tasks are: {}", path.display(), available.join(", "))]
    UnknownTask {
        path: PathBuf,
        name: String,
        available: Vec<String>,
    },
}

/// A parsed `fork.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub runtime: RuntimeSection,
    /// The tasks in file order; the first one is the default.
    #[serde(
        default,
        serialize_with = "serialize_tasks",
        deserialize_with = "deserialize_tasks"
    )]
    pub tasks: Vec<(String, TaskSpec)>,
    /// The metered model gateway the tasks may use (overrides the policy's `[gateway]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<crate::gateway::GatewayConfig>,
    /// The file this manifest was loaded from (empty when parsed from a string).
    #[serde(skip)]
    pub file: PathBuf,
}

/// `[runtime]`: what fork clones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSection {
    pub name: String,
    /// The tree the patch applies to, relative to the runtime directory.
    #[serde(default = "dot")]
    pub source: PathBuf,
    /// SQLite stores, snapshotted with the online backup API.
    #[serde(default)]
    pub state: Vec<PathBuf>,
    /// The tool registry, copied into the successor's namespace.
    #[serde(default)]
    pub tools: Option<PathBuf>,
    /// Glob patterns (relative to `source`) not copied into the clone's src/.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Glob patterns (relative to `source`) a patch may not touch.
    #[serde(default)]
    pub protected: Vec<String>,
}

fn dot() -> PathBuf {
    PathBuf::from(".")
}

/// `[tasks.NAME]`: one evaluation task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// argv, run with cwd = the clone's src/. In a judged task: the subject, which talks
    /// to the judge over its stdin and stdout.
    pub command: Vec<String>,
    /// A judge (argv, cwd = an unpatched copy of the parent's tree): run in a sandbox of
    /// its own, connected to the subject (fd 3 reads the subject's stdout, fd 4 writes its
    /// stdin). Only the judge's reports are evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<ResultsSpec>,
    /// A JSON file `{"name": number, ...}`, relative to `$FORK_REPORTS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
    /// Part of the evaluation plan: `fork evaluate` without `--task` runs every gating
    /// task, in file order, into one verdict (a manifest that marks none runs its first
    /// task). Not part of the task's hash: it chooses the plan, it does not change the task.
    #[serde(default, skip_serializing)]
    pub gate: bool,
    /// Also run the task on the unpatched clone and compare.
    #[serde(default)]
    pub baseline: bool,
    #[serde(default = "one")]
    pub repeat: u32,
    #[serde(default)]
    pub budget: crate::budget::BudgetText,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Metric names (or `*` patterns) for which a smaller value is better, in addition to
    /// the policy's `[decision] lower_is_better` list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lower_is_better: Vec<String>,
    /// Host loopback services this task needs, forwarded into its sandbox (in addition to
    /// the policy's `[network] forward`), e.g. `["127.0.0.1:5432"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forward: Vec<String>,
}

fn one() -> u32 {
    1
}

/// `results = { format = "junit", path = "tests.xml" }`, or `{ format = "exit_status" }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultsSpec {
    pub format: ResultsFormat,
    /// Relative to `$FORK_REPORTS`; every format but `exit_status` needs one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultsFormat {
    Junit,
    Tap,
    /// `go test -json` event stream.
    GoTestJson,
    /// Rust libtest's `--format json` lines.
    LibtestJson,
    ExitStatus,
}

fn serialize_tasks<S: Serializer>(tasks: &[(String, TaskSpec)], s: S) -> Result<S::Ok, S::Error> {
    let mut m = s.serialize_map(Some(tasks.len()))?;
    for (k, v) in tasks {
        m.serialize_entry(k, v)?;
    }
    m.end()
}

/// Reads `[tasks.*]` in document order (toml keeps table order).
fn deserialize_tasks<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, TaskSpec)>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<(String, TaskSpec)>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a table of tasks, e.g. [tasks.tests] command = [\"make\", \"test\"]")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out: Vec<(String, TaskSpec)> = Vec::new();
            while let Some(name) = map.next_key::<String>()? {
                let spec: TaskSpec = map.next_value()?;
                if out.iter().any(|(n, _)| *n == name) {
                    return Err(de::Error::custom(format!("task `{name}` is defined twice")));
                }
                out.push((name, spec));
            }
            Ok(out)
        }
    }
    d.deserialize_map(V)
}

/// Loads and checks `<runtime_dir>/fork.toml`.
pub fn load(runtime_dir: &Path) -> Result<Manifest, ManifestError> {
    let path = runtime_dir.join(MANIFEST_FILE);
    let text = match crate::fsx::read_input_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(ManifestError::Missing { path })
        }
        Err(e) => return Err(ManifestError::Read { path, source: e }),
    };
    let manifest = Manifest::from_toml(&text, &path)?;
    manifest.validate(runtime_dir)?;
    Ok(manifest)
}

impl Manifest {
    /// Parses manifest text and checks everything that does not need the filesystem.
    /// `file` is only used in messages.
    pub fn from_toml(text: &str, file: &Path) -> Result<Manifest, ManifestError> {
        let mut m: Manifest = toml::from_str(text).map_err(|e| ManifestError::Syntax {
            path: file.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })?;
        m.file = file.to_path_buf();
        m.check_values()?;
        Ok(m)
    }

    /// The named task, or the first one when `name` is `None`.
    pub fn task(&self, name: Option<&str>) -> Result<(&str, &TaskSpec), ManifestError> {
        let found = match name {
            None => self.tasks.first(),
            Some(n) => self.tasks.iter().find(|(k, _)| k == n),
        };
        found
            .map(|(k, v)| (k.as_str(), v))
            .ok_or_else(|| ManifestError::UnknownTask {
                path: self.file.clone(),
                name: name.unwrap_or_default().to_string(),
                available: self.tasks.iter().map(|(k, _)| k.clone()).collect(),
            })
    }

    /// The evaluation plan: the named tasks (each once, in the order given), or, when no
    /// name is given, every task marked `gate = true` in file order, or the first task
    /// when none is marked.
    pub fn plan(&self, names: &[String]) -> Result<Vec<(&str, &TaskSpec)>, ManifestError> {
        if names.is_empty() {
            let gating: Vec<(&str, &TaskSpec)> = self
                .tasks
                .iter()
                .filter(|(_, t)| t.gate)
                .map(|(k, v)| (k.as_str(), v))
                .collect();
            if !gating.is_empty() {
                return Ok(gating);
            }
            return Ok(vec![self.task(None)?]);
        }
        let mut plan: Vec<(&str, &TaskSpec)> = Vec::new();
        for n in names {
            if plan.iter().any(|(k, _)| k == n) {
                return Err(self.invalid(
                    format!("tasks.{n}"),
                    "named twice in the plan: name each task once",
                ));
            }
            plan.push(self.task(Some(n))?);
        }
        Ok(plan)
    }

    /// The names of the tasks, in file order.
    pub fn task_names(&self) -> Vec<&str> {
        self.tasks.iter().map(|(k, _)| k.as_str()).collect()
    }

    fn invalid(&self, field: impl Into<String>, message: impl Into<String>) -> ManifestError {
        ManifestError::Invalid {
            path: self.file.clone(),
            field: field.into(),
            message: message.into(),
        }
    }

    /// Value checks that do not touch the filesystem.
    fn check_values(&self) -> Result<(), ManifestError> {
        if let Some(g) = &self.gateway {
            g.validate(&self.file.display().to_string())
                .map_err(|e| ManifestError::Invalid {
                    path: self.file.clone(),
                    field: "gateway".into(),
                    message: e.to_string(),
                })?;
        }
        let r = &self.runtime;
        if r.name.is_empty()
            || r.name.len() > 64
            || !r
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err(self.invalid(
                "runtime.name",
                format!(
                    "{:?} is not a usable name: write 1-64 letters, digits, '.', '_' or '-', \
                     e.g. name = \"hermes-demo\"",
                    r.name
                ),
            ));
        }
        self.lexical_path("runtime.source", &r.source)?;
        for (i, p) in r.state.iter().enumerate() {
            self.lexical_path(&format!("runtime.state[{i}]"), p)?;
        }
        if let Some(t) = &r.tools {
            self.lexical_path("runtime.tools", t)?;
        }
        for (field, list) in [
            ("runtime.exclude", &r.exclude),
            ("runtime.protected", &r.protected),
        ] {
            for (i, g) in list.iter().enumerate() {
                self.check_glob(&format!("{field}[{i}]"), g)?;
            }
        }
        // `exclude` as the copies and the gate read it: without a trailing `/` or a leading
        // `./` (`a\/` is a valid glob, `a\` is not).
        for (i, g) in r.exclude.iter().enumerate() {
            let t = g.trim_end_matches('/');
            let t = t.strip_prefix("./").unwrap_or(t);
            if t != g {
                self.check_glob(&format!("runtime.exclude[{i}]"), t)?;
            }
        }
        for (i, g) in r.protected.iter().enumerate() {
            self.check_protected(&format!("runtime.protected[{i}]"), g)?;
        }
        if self.tasks.is_empty() {
            return Err(self.invalid(
                "tasks",
                "no task defined: add one, e.g. [tasks.tests] command = [\"make\", \"test\"]",
            ));
        }
        for (name, t) in &self.tasks {
            self.check_task(name, t)?;
        }
        Ok(())
    }

    fn check_task(&self, name: &str, t: &TaskSpec) -> Result<(), ManifestError> {
        let field = |f: &str| format!("tasks.{name}.{f}");
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
        {
            return Err(self.invalid(
                format!("tasks.{name}"),
                "a task name may only hold letters, digits, '_' and '-'; rename the table",
            ));
        }
        if t.command.is_empty() || t.command[0].is_empty() {
            return Err(self.invalid(
                field("command"),
                "empty command: write the argv, e.g. command = [\"python3\", \"tests/run.py\"]",
            ));
        }
        if t.command.iter().any(|a| a.contains('\0')) {
            return Err(self.invalid(
                field("command"),
                "an argument contains a NUL byte; remove it",
            ));
        }
        if let Some(j) = &t.judge {
            if j.is_empty() || j[0].is_empty() || j.iter().any(|a| a.contains('\0')) {
                return Err(self.invalid(
                    field("judge"),
                    "write the judge's argv, e.g. judge = [\"python3\", \"judge/judge.py\"], without NUL bytes",
                ));
            }
            if t.results.is_none() && t.metrics.is_none() {
                return Err(self.invalid(
                    field("judge"),
                    "a judged task needs `results` or `metrics`: what the judge writes to $FORK_REPORTS is the evidence",
                ));
            }
        }
        if let Some(res) = &t.results {
            match (&res.path, res.format) {
                // No report is read for `exit_status`: a path would be required to exist
                // and read as no test at all, so the task could never be approved.
                (Some(p), ResultsFormat::ExitStatus) => {
                    return Err(self.invalid(
                        field("results.path"),
                        format!(
                            "the `exit_status` format reads no report (the exit status is the result), so `{p}` would never be read as results: remove the path (results = {{ format = \"exit_status\" }}), or name the report's format (e.g. junit or tap)"
                        ),
                    ))
                }
                (Some(p), _) => self.report_path(&field("results.path"), p)?,
                (None, ResultsFormat::ExitStatus) => {}
                (None, f) => {
                    return Err(self.invalid(
                        field("results.path"),
                        format!(
                            "the `{}` format reads a report: give its path, relative to $FORK_REPORTS (only `exit_status` needs none)",
                            serde_json::to_value(f).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
                        ),
                    ))
                }
            }
        }
        if let Some(m) = &t.metrics {
            self.report_path(&field("metrics"), m)?;
        }
        if t.repeat == 0 || t.repeat > MAX_REPEAT {
            return Err(self.invalid(
                field("repeat"),
                format!(
                    "{} is out of range: write a count from 1 to {MAX_REPEAT}",
                    t.repeat
                ),
            ));
        }
        if let Err(e) = t.budget.parse() {
            return Err(self.invalid(field(&format!("budget.{}", e.field)), e.message));
        }
        for (k, v) in &t.env {
            let valid = k.bytes().enumerate().all(|(i, b)| {
                b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit())
            });
            if k.is_empty() || !valid {
                return Err(self.invalid(
                    field(&format!("env.{k}")),
                    "not a valid variable name: use letters, digits and '_', not starting with a digit",
                ));
            }
            if RESERVED_ENV.contains(&k.as_str()) {
                return Err(self.invalid(
                    field(&format!("env.{k}")),
                    format!(
                        "{k} is set by fork for the successor and cannot be overridden; remove it"
                    ),
                ));
            }
            if k.starts_with(RESERVED_ENV_PREFIX) {
                return Err(self.invalid(
                    field(&format!("env.{k}")),
                    format!(
                        "{k}: every {RESERVED_ENV_PREFIX}* variable is fork's (it sets FORK_SIDE, FORK_RUN_ID, FORK_REPORTS and others for the successor), so a task cannot set or override one; remove it, or rename it without the {RESERVED_ENV_PREFIX} prefix"
                    ),
                ));
            }
            if v.contains('\0') {
                return Err(
                    self.invalid(field(&format!("env.{k}")), "the value contains a NUL byte")
                );
            }
        }
        Ok(())
    }

    /// Relative, no `..`: checked before touching the filesystem.
    fn lexical_path(&self, field: &str, p: &Path) -> Result<(), ManifestError> {
        if p.as_os_str().is_empty() {
            return Err(self.invalid(
                field,
                "empty path: write a path relative to the runtime directory",
            ));
        }
        if p.is_absolute() {
            return Err(self.invalid(
                field,
                format!(
                    "{} is absolute: write it relative to the runtime directory (the one holding \
                     fork.toml), e.g. \"state/hermes.db\"",
                    p.display()
                ),
            ));
        }
        if p.components().any(|c| c == Component::ParentDir) {
            return Err(self.invalid(
                field,
                format!(
                    "{} leaves the runtime directory through `..`: everything fork clones must \
                     live under the directory holding fork.toml",
                    p.display()
                ),
            ));
        }
        Ok(())
    }

    fn report_path(&self, field: &str, p: &str) -> Result<(), ManifestError> {
        let path = Path::new(p);
        let ok = !p.is_empty()
            && !path.is_absolute()
            && path
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
            && path.components().any(|c| matches!(c, Component::Normal(_)));
        if !ok {
            return Err(self.invalid(
                field,
                format!(
                    "{p:?} must be a file name relative to $FORK_REPORTS without `..`, \
                     e.g. \"tests.xml\""
                ),
            ));
        }
        Ok(())
    }

    fn check_glob(&self, field: &str, g: &str) -> Result<(), ManifestError> {
        if g.is_empty() {
            return Err(self.invalid(field, "empty pattern: remove it"));
        }
        if g.starts_with('/') || g.split('/').any(|c| c == "..") {
            return Err(self.invalid(
                field,
                format!(
                    "{g:?} must be relative to the source tree without `..`, e.g. \"tests/**\""
                ),
            ));
        }
        globset::GlobBuilder::new(g)
            .literal_separator(true)
            .build()
            .map_err(|e| self.invalid(field, format!("{g:?} is not a valid glob: {e}")))?;
        Ok(())
    }

    /// A `protected` pattern as the gate, the protected tree and its check read it
    /// ([`crate::patch::gates::protected_globs`]): naming something less than the whole
    /// tree (which no patch could change), and valid once normalised (`a\/` is not).
    fn check_protected(&self, field: &str, g: &str) -> Result<(), ManifestError> {
        let globs = crate::patch::gates::protected_globs(std::slice::from_ref(&g.to_string()));
        if globs.iter().any(|(glob, _)| glob == "**") {
            return Err(self.invalid(
                field,
                format!(
                    "{g:?} names the whole source tree, which no patch could change: name the \
                     evaluation's own files, e.g. \"tests/**\""
                ),
            ));
        }
        for (glob, _) in globs {
            globset::GlobBuilder::new(&glob)
                .literal_separator(true)
                .build()
                .map_err(|e| {
                    self.invalid(
                        field,
                        format!(
                            "{g:?}, read as the path pattern {glob:?}, is not a valid glob: {e}"
                        ),
                    )
                })?;
        }
        Ok(())
    }

    /// Filesystem checks: `source`, `state` and `tools` exist under `runtime_dir`, with
    /// the right type, and do not resolve outside it (through symlinks).
    pub fn validate(&self, runtime_dir: &Path) -> Result<(), ManifestError> {
        self.check_values()?;
        let root = runtime_dir.canonicalize().map_err(|e| {
            self.invalid(
                "runtime",
                format!(
                    "the runtime directory {} cannot be resolved: {e}",
                    runtime_dir.display()
                ),
            )
        })?;
        let r = &self.runtime;
        self.inside(&root, "runtime.source", &r.source, true)?;
        for (i, p) in r.state.iter().enumerate() {
            self.inside(&root, &format!("runtime.state[{i}]"), p, false)?;
        }
        if let Some(t) = &r.tools {
            self.inside(&root, "runtime.tools", t, true)?;
        }
        Ok(())
    }

    fn inside(
        &self,
        root: &Path,
        field: &str,
        p: &Path,
        want_dir: bool,
    ) -> Result<(), ManifestError> {
        self.lexical_path(field, p)?;
        let full = root.join(p);
        let real = full.canonicalize().map_err(|e| {
            let what = if e.kind() == io::ErrorKind::NotFound {
                "does not exist".to_string()
            } else {
                format!("cannot be resolved ({e})")
            };
            self.invalid(
                field,
                format!(
                    "{} {what} under {}: fix the path or create the {}",
                    p.display(),
                    root.display(),
                    if want_dir { "directory" } else { "file" }
                ),
            )
        })?;
        if !real.starts_with(root) {
            return Err(self.invalid(
                field,
                format!(
                    "{} resolves to {}, outside the runtime directory {} (through a symlink); \
                     point it at a path that really lives there",
                    p.display(),
                    real.display(),
                    root.display()
                ),
            ));
        }
        let is_dir = real.is_dir();
        if want_dir && !is_dir {
            return Err(self.invalid(field, format!("{} is not a directory", p.display())));
        }
        if !want_dir && !real.is_file() {
            return Err(self.invalid(
                field,
                format!(
                    "{} is not a regular file (a SQLite database is expected)",
                    p.display()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn demo() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/hermes-demo")
    }

    const GOOD: &str = r#"
[runtime]
name = "demo"
source = "."
state = ["state/db.sqlite"]
tools = "tools"
exclude = ["state"]
protected = ["tests/**"]

[tasks.zeta]
command = ["true"]

[tasks.alpha]
command = ["python3", "bench.py"]
metrics = "metrics.json"
baseline = true
repeat = 3
budget = { wall = "90s", memory = "512MiB", cpu = 200, pids = 64, disk = "1GiB", api_cost = "$2.50" }
env = { MODE = "fast" }
"#;

    /// A runtime directory with the given manifest and the files GOOD names.
    fn runtime(manifest: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("state")).unwrap();
        std::fs::create_dir_all(d.path().join("tools")).unwrap();
        std::fs::write(d.path().join("state/db.sqlite"), b"").unwrap();
        std::fs::write(d.path().join(MANIFEST_FILE), manifest).unwrap();
        d
    }

    fn load_err(manifest: &str) -> String {
        let d = runtime(manifest);
        let e = load(d.path()).expect_err("the manifest should be rejected");
        let s = e.to_string();
        assert!(s.contains("fork.toml"), "the error names the file: {s}");
        s
    }

    #[test]
    fn demo_manifest_loads_in_file_order() {
        let m = load(&demo()).unwrap();
        assert_eq!(m.runtime.name, "hermes-demo");
        assert_eq!(m.runtime.source, PathBuf::from("."));
        assert_eq!(m.runtime.state, vec![PathBuf::from("state/hermes.db")]);
        assert_eq!(m.runtime.tools.as_deref(), Some(Path::new("tools")));
        assert_eq!(
            m.runtime.exclude,
            ["state", ".git", "**/__pycache__", "fork-out"]
        );
        assert_eq!(
            m.runtime.protected,
            [
                "tests/**",
                "bench/**",
                "judge/**",
                "gateway-policy.toml",
                "fork.toml"
            ]
        );
        assert_eq!(
            m.task_names(),
            [
                "tests",
                "compress",
                "judged",
                "contract",
                "bench",
                "channel",
                "summarize"
            ]
        );
        // The plan: the gating tasks in file order; a named task alone; each once.
        let plan: Vec<&str> = m.plan(&[]).unwrap().iter().map(|(n, _)| *n).collect();
        assert_eq!(plan, ["contract", "bench"]);
        let one: Vec<&str> = m
            .plan(&["tests".to_string()])
            .unwrap()
            .iter()
            .map(|(n, _)| *n)
            .collect();
        assert_eq!(one, ["tests"]);
        let twice = m.plan(&["tests".into(), "tests".into()]).unwrap_err();
        assert!(twice.to_string().contains("named twice"), "{twice}");
        assert!(m.plan(&["nope".into()]).is_err());
        let (_, judged) = m.task(Some("judged")).unwrap();
        assert_eq!(
            judged.judge.as_deref(),
            Some(&["python3", "judge/judge.py", "--suite", "all"].map(String::from)[..])
        );
        let (name, tests) = m.task(None).unwrap();
        assert_eq!(name, "tests");
        assert_eq!(tests.command, ["python3", "tests/run.py"]);
        assert_eq!(
            tests.results,
            Some(ResultsSpec {
                format: ResultsFormat::Junit,
                path: Some("tests.xml".into())
            })
        );
        assert_eq!((tests.repeat, tests.baseline), (1, false));
        let (_, c) = m.task(Some("compress")).unwrap();
        assert_eq!(c.metrics.as_deref(), Some("metrics.json"));
        assert!(c.baseline);
        assert_eq!(c.repeat, 20);
        let b = c.budget.parse().unwrap();
        assert_eq!(b.wall, Some(Duration::from_secs(600)));
        assert_eq!(b.memory_bytes, Some(1 << 30));
        assert_eq!(b.cpu_percent, None);
        assert_eq!(m.file, demo().join(MANIFEST_FILE));
    }

    #[test]
    fn order_numbers_and_round_trip() {
        let d = runtime(GOOD);
        let m = load(d.path()).unwrap();
        assert_eq!(m.task_names(), ["zeta", "alpha"]);
        assert_eq!(m.task(None).unwrap().0, "zeta");
        let (_, a) = m.task(Some("alpha")).unwrap();
        assert_eq!(a.budget.cpu.as_deref(), Some("200"));
        let b = a.budget.parse().unwrap();
        assert_eq!(b.cpu_percent, Some(200));
        assert_eq!(b.pids, Some(64));
        assert_eq!(b.api_cost_usd, Some(2.5));
        assert_eq!(b.disk_bytes, Some(1 << 30));
        assert_eq!(a.env.get("MODE").map(String::as_str), Some("fast"));
        let text = toml::to_string(&m).unwrap();
        let again = Manifest::from_toml(&text, &m.file).unwrap();
        assert_eq!(again, m);
        assert_eq!(again.task_names(), ["zeta", "alpha"]);
    }

    #[test]
    fn a_judge_needs_an_argv_and_reports() {
        let base = "[runtime]\nname = \"r\"\nsource = \".\"\n\n[tasks.t]\ncommand = [\"serve\"]\n";
        for (extra, want) in [
            (
                "judge = []\nresults = { format = \"junit\", path = \"t.xml\" }\n",
                "judge's argv",
            ),
            ("judge = [\"j\"]\n", "needs `results` or `metrics`"),
        ] {
            let d = runtime(&format!("{base}{extra}"));
            let e = load(d.path()).unwrap_err().to_string();
            assert!(e.contains("tasks.t.judge") && e.contains(want), "{e}");
        }
        let d = runtime(&format!("{base}judge = [\"j\"]\nmetrics = \"m.json\"\n"));
        let m = load(d.path()).unwrap();
        assert_eq!(
            m.task(None).unwrap().1.judge.as_deref(),
            Some(&["j".to_string()][..])
        );
    }

    #[test]
    fn missing_file_and_bad_toml() {
        let d = tempfile::tempdir().unwrap();
        let e = load(d.path()).unwrap_err();
        assert!(matches!(e, ManifestError::Missing { .. }));
        let s = e.to_string();
        assert!(
            s.contains("fork.toml: not found") && s.contains("[runtime]"),
            "{s}"
        );

        let s = load_err("[runtime\nname = \"x\"\n");
        assert!(s.contains("line 1"), "{s}");
        let s = load_err("[runtime]\nsource = \".\"\n[tasks.t]\ncommand = [\"true\"]\n");
        assert!(s.contains("missing field `name`"), "{s}");
        let s = load_err("[runtime]\nname = \"x\"\n[tasks.t]\ncommand = \"make test\"\n");
        assert!(s.contains("invalid type") && s.contains("command"), "{s}");
    }

    #[test]
    fn unknown_fields_are_named_with_the_alternatives() {
        let s = load_err(&GOOD.replace("tools = \"tools\"", "tool = \"tools\""));
        assert!(
            s.contains("unknown field `tool`") && s.contains("`tools`"),
            "{s}"
        );
        let s = load_err(&GOOD.replace("baseline = true", "baseline = true\ntimeout = 5"));
        assert!(
            s.contains("unknown field `timeout`") && s.contains("`budget`"),
            "{s}"
        );
        let s = load_err(&GOOD.replace("pids = 64", "threads = 64"));
        assert!(
            s.contains("unknown field `threads`") && s.contains("`pids`"),
            "{s}"
        );
        let s = load_err(&format!("{GOOD}\n[extra]\nx = 1\n"));
        assert!(s.contains("unknown field `extra`"), "{s}");
        let s = load_err(&GOOD.replace(
            "metrics = \"metrics.json\"",
            "results = { format = \"xunit\", path = \"r.xml\" }",
        ));
        assert!(s.contains("xunit") && s.contains("junit"), "{s}");
    }

    #[test]
    fn escaping_paths_are_refused() {
        let s = load_err(&GOOD.replace("state/db.sqlite", "../db.sqlite"));
        assert!(
            s.contains("`runtime.state[0]`") && s.contains("`..`"),
            "{s}"
        );
        let s = load_err(&GOOD.replace("source = \".\"", "source = \"/srv/app\""));
        assert!(
            s.contains("`runtime.source`") && s.contains("absolute"),
            "{s}"
        );
        let s = load_err(&GOOD.replace("tools = \"tools\"", "tools = \"no-such-dir\""));
        assert!(
            s.contains("`runtime.tools`") && s.contains("does not exist"),
            "{s}"
        );
        let s = load_err(&GOOD.replace(
            "metrics = \"metrics.json\"",
            "metrics = \"../../etc/x.json\"",
        ));
        assert!(
            s.contains("`tasks.alpha.metrics`") && s.contains("$FORK_REPORTS"),
            "{s}"
        );
        let s = load_err(&GOOD.replace("protected = [\"tests/**\"]", "protected = [\"../**\"]"));
        assert!(s.contains("`runtime.protected[0]`"), "{s}");
        // The whole tree, however spelled, and a pattern that is no glob once read as a path.
        for whole in [".", "./", "./.", "**", "./**", "**/"] {
            let s = load_err(&GOOD.replace(
                "protected = [\"tests/**\"]",
                &format!("protected = [\"tests/**\", \"{whole}\"]"),
            ));
            assert!(
                s.contains("`runtime.protected[1]`") && s.contains("whole source tree"),
                "{whole}: {s}"
            );
        }
        let s = load_err(&GOOD.replace("exclude = [", r#"exclude = ["a\\/", "#));
        assert!(
            s.contains("`runtime.exclude[0]`") && s.contains("not a valid glob"),
            "{s}"
        );
        let s = load_err(&GOOD.replace("protected = [\"tests/**\"]", r#"protected = ["a\\/"]"#));
        assert!(
            s.contains("`runtime.protected[0]`") && s.contains("read as the path pattern"),
            "{s}"
        );

        // a symlink inside the runtime pointing outside it
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("real.db"), b"").unwrap();
        let d = runtime(&GOOD.replace("state/db.sqlite", "state/link.db"));
        std::os::unix::fs::symlink(
            outside.path().join("real.db"),
            d.path().join("state/link.db"),
        )
        .unwrap();
        let s = load(d.path()).unwrap_err().to_string();
        assert!(s.contains("outside the runtime directory"), "{s}");

        let s = load_err(&GOOD.replace("state/db.sqlite", "tools"));
        assert!(s.contains("not a regular file"), "{s}");
    }

    #[test]
    fn bad_units_and_values() {
        let s = load_err(&GOOD.replace("\"90s\"", "\"soon\""));
        assert!(
            s.contains("`tasks.alpha.budget.wall`") && s.contains("30s, 10m or 1h"),
            "{s}"
        );
        let s = load_err(&GOOD.replace("\"512MiB\"", "\"lots\""));
        assert!(
            s.contains("`tasks.alpha.budget.memory`") && s.contains("512MiB"),
            "{s}"
        );
        let s = load_err(&GOOD.replace("pids = 64", "pids = 0"));
        assert!(s.contains("`tasks.alpha.budget.pids`"), "{s}");
        let s = load_err(&GOOD.replace("cpu = 200", "cpu = \"fast\""));
        assert!(s.contains("`tasks.alpha.budget.cpu`"), "{s}");
        let s = load_err(&GOOD.replace("wall = \"90s\"", "wall = true"));
        assert!(s.contains("human units"), "{s}");
        let s = load_err(&GOOD.replace("repeat = 3", "repeat = 0"));
        assert!(
            s.contains("`tasks.alpha.repeat`") && s.contains("from 1"),
            "{s}"
        );
        let s = load_err(&GOOD.replace("command = [\"true\"]", "command = []"));
        assert!(s.contains("`tasks.zeta.command`"), "{s}");
        let s = load_err(&GOOD.replace("MODE = \"fast\"", "HOME = \"/root\""));
        assert!(
            s.contains("`tasks.alpha.env.HOME`") && s.contains("cannot be overridden"),
            "{s}"
        );
        let s = load_err(&GOOD.replace(
            "metrics = \"metrics.json\"",
            "results = { format = \"exit_status\", path = \"status.txt\" }",
        ));
        assert!(
            s.contains("`tasks.alpha.results.path`")
                && s.contains("`status.txt` would never be read")
                && s.contains("remove the path"),
            "{s}"
        );
        // Every FORK_* name is fork's: those it sets (not only FORK_REPORTS, FORK_STATE and
        // FORK_TOOLS) and any other.
        for k in [
            "FORK_SIDE",
            "FORK_RUN_ID",
            "FORK_TASK",
            "FORK_REPORTS",
            "FORK_MINE",
        ] {
            let s = load_err(&GOOD.replace("MODE = \"fast\"", &format!("{k} = \"x\"")));
            assert!(
                s.contains(&format!("`tasks.alpha.env.{k}`"))
                    && s.contains("cannot set or override")
                    && s.contains("without the FORK_ prefix"),
                "{s}"
            );
        }
        let s = load_err(&GOOD.replace("name = \"demo\"", "name = \"my demo\""));
        assert!(s.contains("`runtime.name`"), "{s}");
        let s = load_err("[runtime]\nname = \"x\"\n");
        assert!(s.contains("`tasks`") && s.contains("no task"), "{s}");
    }

    #[test]
    fn unknown_task_lists_the_tasks() {
        let m = load(&demo()).unwrap();
        let s = m.task(Some("benchmark")).unwrap_err().to_string();
        assert!(
            s.contains("no task named `benchmark`") && s.contains("tests, compress"),
            "{s}"
        );
    }
}
