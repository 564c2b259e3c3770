//! The seccomp-bpf layer: compiles a profile (seccompiler's JSON format, under
//! `policies/seccomp/`) into BPF programs ahead of time, and installs them in the child
//! right before `execve`.
//!
//! A profile defines exactly two filters, installed in this order:
//! - `successor`: the allowlist (a mismatch returns an errno, normally EPERM);
//! - `successor_enosys`: `clone3` returns ENOSYS, so libc falls back to `clone`, whose
//!   flags (unlike clone3's, which live in memory) the allowlist can inspect. The kernel
//!   runs every installed filter and, between two errno results, the most recently
//!   installed one wins; so ENOSYS wins over the allowlist's EPERM.
//!
//! A profile lacking either filter, or defining any other, is an error: a profile that
//! silently installs nothing is a known failure of peers (nsjail #285).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The filters a profile must define, in install order.
pub const FILTER_NAMES: [&str; 2] = ["successor", "successor_enosys"];

/// The kernel's limit on the instructions of one BPF program (BPF_MAXINSNS).
const BPF_MAX_INSNS: usize = 4096;

/// An architecture seccompiler can compile for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    X86_64,
    Aarch64,
    Riscv64,
}

impl Arch {
    /// The architecture this binary runs on, if seccompiler supports it.
    pub fn current() -> Option<Arch> {
        match std::env::consts::ARCH {
            "x86_64" => Some(Arch::X86_64),
            "aarch64" => Some(Arch::Aarch64),
            "riscv64" => Some(Arch::Riscv64),
            _ => None,
        }
    }

    fn target(self) -> seccompiler::TargetArch {
        match self {
            Arch::X86_64 => seccompiler::TargetArch::x86_64,
            Arch::Aarch64 => seccompiler::TargetArch::aarch64,
            Arch::Riscv64 => seccompiler::TargetArch::riscv64,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
            Arch::Riscv64 => "riscv64",
        }
    }
}

use super::sys::Insn;

mod shipped;
mod tree;

/// The compiled BPF programs, in install order (a newtype so `Debug` stays short).
#[derive(Clone, Serialize, Deserialize)]
struct Programs(Vec<Vec<Insn>>);

impl std::fmt::Debug for Programs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lens: Vec<usize> = self.0.iter().map(Vec::len).collect();
        write!(f, "Programs(instructions per filter: {lens:?})")
    }
}

/// A seccomp profile compiled for one architecture, ready to install without allocating.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompiledProfile {
    /// The profile's name, e.g. `default` (the file stem), as recorded in the verdict.
    pub name: String,
    arch: Arch,
    programs: Programs,
}

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error(
        "cannot read seccomp profile {path}: {source}; check the policy's seccomp profile path"
    )]
    Read { path: PathBuf, source: io::Error },

    #[error("seccomp profile {profile} is not valid JSON for seccompiler: {detail}; the format is {{\"successor\": {{\"mismatch_action\": …, \"match_action\": …, \"filter\": [{{\"syscall\": …}}]}}, \"successor_enosys\": {{…}}}}")]
    Malformed { profile: String, detail: String },

    #[error("seccomp profile {profile} has no filter `{filter}`; a profile must define both `successor` (the allowlist) and `successor_enosys` (clone3 → ENOSYS), or the sandbox would run with less filtering than intended")]
    MissingFilter {
        profile: String,
        filter: &'static str,
    },

    #[error("seccomp profile {profile} defines filter `{filter}`, which is never installed (only `successor` and `successor_enosys` are); remove or rename it")]
    UnknownFilter { profile: String, filter: String },

    #[error("seccomp profile {profile}: filter `successor` must be an allowlist, but its mismatch_action is `{action}`; set it to {{\"errno\": 1}}")]
    NotAllowlist { profile: String, action: String },

    #[error("seccomp profile {profile}: filter `{filter}` lists syscall `{syscall}` both with and without `args`; seccompiler would keep only the conditional rules and silently drop the unconditional one: keep one form")]
    MixedRules {
        profile: String,
        filter: String,
        syscall: String,
    },

    #[error("seccomp profile {profile} does not compile for {arch}: {source}; fix the profile (syscall names must exist on {arch})")]
    Compile {
        profile: String,
        arch: &'static str,
        source: seccompiler::Error,
    },

    #[error("seccomp profile {profile}: filter `{filter}` compiles to {len} BPF instructions, over the kernel's limit of {BPF_MAX_INSNS}; shorten the profile")]
    TooLarge {
        profile: String,
        filter: &'static str,
        len: usize,
    },

    #[error("seccomp filters cannot be compiled for this architecture ({arch}): seccompiler supports x86_64, aarch64 and riscv64; run on one of them or allow a degraded seccomp layer in the policy")]
    UnsupportedArch { arch: &'static str },

    #[error("seccomp profile was compiled for {compiled:?} but this machine is {running}; compile it on the machine that installs it")]
    WrongArch {
        compiled: Arch,
        running: &'static str,
    },

    #[error("compiled seccomp profile is corrupt: {detail}; compile it again from its JSON")]
    Corrupt { detail: &'static str },

    #[error("installing seccomp filter `{filter}` failed: {source} (EACCES: set no_new_privs first; EINVAL: the kernel lacks seccomp filter mode)")]
    Install {
        filter: &'static str,
        source: io::Error,
    },
}

/// Compiles the profile at `path` for the architecture this binary runs on; the profile's
/// name is the file stem (`policies/seccomp/default.json` → `default`).
pub fn compile_file(path: &Path) -> Result<CompiledProfile, SeccompError> {
    let json = std::fs::read(path).map_err(|source| SeccompError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    compile_labelled(&name, &path.display().to_string(), &json)
}

/// Compiles a profile given as JSON text; `name` names it in the verdict and in errors.
pub fn compile_json(name: &str, json: &[u8]) -> Result<CompiledProfile, SeccompError> {
    compile_labelled(name, &format!("`{name}`"), json)
}

/// Profiles this process has compiled, by (name, label, JSON text): an evaluation
/// prepares a sandbox per run and compiles the same profile each time; the JSON is
/// compared whole, so an edited file is compiled anew. Only successes are kept.
type Compiled = Vec<((String, String, Vec<u8>), CompiledProfile)>;
static COMPILED: std::sync::Mutex<Compiled> = std::sync::Mutex::new(Vec::new());

fn compile_labelled(name: &str, label: &str, json: &[u8]) -> Result<CompiledProfile, SeccompError> {
    let arch = Arch::current().ok_or(SeccompError::UnsupportedArch {
        arch: std::env::consts::ARCH,
    })?;
    let mut cache = COMPILED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, p)) = cache
        .iter()
        .find(|((n, l, j), _)| n == name && l == label && j.as_slice() == json)
    {
        return Ok(p.clone());
    }
    if let Some(programs) = shipped::programs(json, arch) {
        return finish(name, label, arch, programs);
    }
    let compiled = compile_for(name, label, json, arch)?;
    // A handful of profiles at most; never more than a few kept.
    if cache.len() >= 8 {
        cache.remove(0);
    }
    cache.push((
        (name.to_string(), label.to_string(), json.to_vec()),
        compiled.clone(),
    ));
    Ok(compiled)
}

/// Whether `json` is the built-in profile, whose programs fork carries compiled (see
/// `shipped.rs`): [`compile_json`] of it costs no compilation.
pub fn compiled_ahead(json: &[u8]) -> bool {
    shipped::matches(json)
}

/// Whether seccompiler knows `syscall` on `arch` (a one-rule filter compiles).
fn syscall_exists(syscall: &str, arch: Arch) -> bool {
    let json = serde_json::json!({"probe": {
        "mismatch_action": "allow",
        "match_action": {"errno": 1},
        "filter": [{"syscall": syscall}],
    }});
    seccompiler::compile_from_json(json.to_string().as_bytes(), arch.target()).is_ok()
}

/// One source list for every architecture: the profile's rules for syscalls that `arch`
/// does not have but another supported architecture does (x86_64's legacy `open`, `stat`,
/// `fork`, ... on aarch64) are left out for `arch`: a syscall that does not exist cannot be
/// called, so an allowlist loses nothing. A name no architecture knows stays in, and the
/// compile reports it. Returns the profile without them and the names left out.
fn without_foreign_syscalls(json: &[u8], arch: Arch) -> Option<(Vec<u8>, Vec<String>)> {
    let mut value: serde_json::Value = serde_json::from_slice(json).ok()?;
    let others: Vec<Arch> = [Arch::X86_64, Arch::Aarch64, Arch::Riscv64]
        .into_iter()
        .filter(|a| *a != arch)
        .collect();
    let mut dropped: Vec<String> = Vec::new();
    for filter in value.as_object_mut()?.values_mut() {
        let Some(rules) = filter.get_mut("filter").and_then(|r| r.as_array_mut()) else {
            continue;
        };
        rules.retain(|rule| {
            let Some(name) = rule.get("syscall").and_then(|s| s.as_str()) else {
                return true;
            };
            let foreign = !syscall_exists(name, arch)
                && others.iter().any(|other| syscall_exists(name, *other));
            if foreign && !dropped.iter().any(|d| d == name) {
                dropped.push(name.to_string());
            }
            !foreign
        });
    }
    Some((serde_json::to_vec(&value).ok()?, dropped))
}

/// How the allowlist finds a syscall's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dispatch {
    /// A balanced binary search over the syscall numbers ([`tree`]); what fork installs.
    BinarySearch,
    /// seccompiler's program as it is: one `jeq` per syscall, in ascending order. For
    /// comparison (the tests, `benches/seccomp.rs`).
    Linear,
}

/// Compiles a profile given as JSON text with the given dispatch; for measurements and
/// comparisons ([`compile_json`] is what fork uses). Not cached.
pub fn compile_json_with(
    name: &str,
    json: &[u8],
    dispatch: Dispatch,
) -> Result<CompiledProfile, SeccompError> {
    let arch = Arch::current().ok_or(SeccompError::UnsupportedArch {
        arch: std::env::consts::ARCH,
    })?;
    compile_with(name, &format!("`{name}`"), json, arch, dispatch)
}

/// Compiles a profile for `arch` (which need not be the running one: the aarch64 profile is
/// compiled in a test on x86_64).
fn compile_for(
    name: &str,
    label: &str,
    json: &[u8],
    arch: Arch,
) -> Result<CompiledProfile, SeccompError> {
    compile_with(name, label, json, arch, Dispatch::BinarySearch)
}

fn compile_with(
    name: &str,
    label: &str,
    json: &[u8],
    arch: Arch,
    dispatch: Dispatch,
) -> Result<CompiledProfile, SeccompError> {
    let value = check_structure(label, json)?;
    if dispatch == Dispatch::BinarySearch {
        // The common case: one seccompiler compilation, the allowlist as a binary search.
        if let Some(programs) = tree::compile(&value, arch.target()) {
            return finish(name, label, arch, programs);
        }
    }
    let compile_error = |source| SeccompError::Compile {
        profile: label.to_string(),
        arch: arch.as_str(),
        source,
    };
    // The common case compiles as it is; only a profile naming another architecture's
    // syscalls pays for looking each name up.
    let (mut compiled, source) = match seccompiler::compile_from_json(json, arch.target()) {
        Ok(c) => (c, std::borrow::Cow::Borrowed(json)),
        Err(first) => match without_foreign_syscalls(json, arch) {
            Some((portable, dropped)) if !dropped.is_empty() => {
                tracing::debug!(
                    "seccomp profile {label}: {} has no {}",
                    arch.as_str(),
                    dropped.join(", ")
                );
                let c = seccompiler::compile_from_json(portable.as_slice(), arch.target())
                    .map_err(compile_error)?;
                (c, std::borrow::Cow::Owned(portable))
            }
            _ => return Err(compile_error(first)),
        },
    };
    // A profile naming another architecture's syscalls: the allowlist of what is left, as
    // a binary search where it can be built.
    if dispatch == Dispatch::BinarySearch && matches!(source, std::borrow::Cow::Owned(_)) {
        if let Some(programs) = serde_json::from_slice(&source)
            .ok()
            .and_then(|v| tree::compile(&v, arch.target()))
        {
            return finish(name, label, arch, programs);
        }
    }
    if dispatch == Dispatch::BinarySearch {
        tracing::debug!(
            "seccomp profile {label}: the allowlist keeps seccompiler's linear dispatch"
        );
    }
    let mut programs: Vec<Vec<Insn>> = Vec::with_capacity(FILTER_NAMES.len());
    for filter in FILTER_NAMES {
        let program = compiled
            .remove(filter)
            .ok_or_else(|| SeccompError::MissingFilter {
                profile: label.to_string(),
                filter,
            })?;
        programs.push(
            program
                .into_iter()
                .map(|i| Insn(i.code, i.jt, i.jf, i.k))
                .collect(),
        );
    }
    finish(name, label, arch, programs)
}

/// The compiled profile of `programs` (in [`FILTER_NAMES`] order), each within the kernel's
/// limit.
fn finish(
    name: &str,
    label: &str,
    arch: Arch,
    programs: Vec<Vec<Insn>>,
) -> Result<CompiledProfile, SeccompError> {
    for (program, filter) in programs.iter().zip(FILTER_NAMES) {
        if program.len() > BPF_MAX_INSNS {
            return Err(SeccompError::TooLarge {
                profile: label.to_string(),
                filter,
                len: program.len(),
            });
        }
    }
    Ok(CompiledProfile {
        name: name.to_string(),
        arch,
        programs: Programs(programs),
    })
}

/// What seccompiler itself does not check: the set of filters, that `successor` is an
/// allowlist, and rules that seccompiler would merge in a surprising way.
fn check_structure(label: &str, json: &[u8]) -> Result<serde_json::Value, SeccompError> {
    let malformed = |detail: String| SeccompError::Malformed {
        profile: label.to_string(),
        detail,
    };
    let value: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| malformed(e.to_string()))?;
    let filters = value
        .as_object()
        .ok_or_else(|| malformed("the top level must be an object of named filters".into()))?;
    if let Some(unknown) = filters.keys().find(|k| !FILTER_NAMES.contains(&k.as_str())) {
        return Err(SeccompError::UnknownFilter {
            profile: label.to_string(),
            filter: unknown.clone(),
        });
    }
    for filter in FILTER_NAMES {
        if !filters.contains_key(filter) {
            return Err(SeccompError::MissingFilter {
                profile: label.to_string(),
                filter,
            });
        }
    }
    for (filter_name, filter) in filters {
        if filter_name == FILTER_NAMES[0] {
            let action = filter
                .get("mismatch_action")
                .or_else(|| filter.get("default_action"));
            if let Some(action @ serde_json::Value::String(s)) = action {
                if s == "allow" || s == "log" {
                    return Err(SeccompError::NotAllowlist {
                        profile: label.to_string(),
                        action: action.to_string(),
                    });
                }
            }
        }
        let Some(rules) = filter.get("filter").and_then(|r| r.as_array()) else {
            continue; // seccompiler reports the missing or mistyped field
        };
        let mut unconditional = BTreeSet::new();
        let mut conditional = BTreeSet::new();
        for rule in rules {
            let Some(syscall) = rule.get("syscall").and_then(|s| s.as_str()) else {
                continue;
            };
            if rule.get("args").is_some() {
                conditional.insert(syscall);
            } else {
                unconditional.insert(syscall);
            }
        }
        if let Some(syscall) = unconditional.intersection(&conditional).next() {
            return Err(SeccompError::MixedRules {
                profile: label.to_string(),
                filter: filter_name.clone(),
                syscall: (*syscall).to_string(),
            });
        }
    }
    Ok(value)
}

impl CompiledProfile {
    /// Installs the filters, in order, on the calling thread. The caller has already set
    /// no_new_privs. Does not allocate: it runs right before execve in a freshly forked
    /// child.
    pub fn install(&self) -> Result<(), SeccompError> {
        match Arch::current() {
            Some(running) if running == self.arch => {}
            _ => {
                return Err(SeccompError::WrongArch {
                    compiled: self.arch,
                    running: std::env::consts::ARCH,
                })
            }
        }
        if self.programs.0.len() != FILTER_NAMES.len() {
            return Err(SeccompError::Corrupt {
                detail: "it does not hold exactly the filters successor and successor_enosys",
            });
        }
        // Check every program before installing any, so a failure never leaves half a profile.
        if self
            .programs
            .0
            .iter()
            .any(|p| p.is_empty() || p.len() > BPF_MAX_INSNS)
        {
            return Err(SeccompError::Corrupt {
                detail: "a filter is empty or longer than the kernel's limit",
            });
        }
        for (program, filter) in self.programs.0.iter().zip(FILTER_NAMES) {
            super::sys::seccomp_set_mode_filter(program).map_err(|e| SeccompError::Install {
                filter,
                source: e.into(),
            })?;
        }
        Ok(())
    }

    /// How many filters `install` installs.
    pub fn filter_count(&self) -> usize {
        self.programs.0.len()
    }

    /// BPF instructions per filter, in install order (for `fork check` and diagnostics).
    pub fn instruction_counts(&self) -> BTreeMap<&'static str, usize> {
        FILTER_NAMES
            .iter()
            .zip(&self.programs.0)
            .map(|(name, p)| (*name, p.len()))
            .collect()
    }
}

/// Whether this kernel supports seccomp filter mode; Err(text naming the fix) if not.
pub fn probe() -> Result<(), String> {
    let mode = super::sys::seccomp_mode().map_err(|e| {
        format!(
            "seccomp is unavailable (prctl(PR_GET_SECCOMP): {}); use a kernel built with \
             CONFIG_SECCOMP=y and CONFIG_SECCOMP_FILTER=y, or allow a degraded seccomp layer \
             in the policy",
            io::Error::from(e)
        )
    })?;
    if mode == 1 {
        return Err(
            "this process runs in seccomp strict mode, where no filter can be added; \
                    run fork outside of it"
                .to_string(),
        );
    }
    let actions = [
        ("SECCOMP_RET_ALLOW", libc::SECCOMP_RET_ALLOW),
        ("SECCOMP_RET_ERRNO", libc::SECCOMP_RET_ERRNO),
        ("SECCOMP_RET_KILL_PROCESS", libc::SECCOMP_RET_KILL_PROCESS),
    ];
    for (name, action) in actions {
        if let Err(e) = super::sys::seccomp_action_avail(action) {
            let err = io::Error::from(e);
            return Err(match err.raw_os_error() {
                Some(libc::ENOSYS) => "the seccomp(2) system call is unavailable (ENOSYS): \
                                       use Linux 4.14 or later built with CONFIG_SECCOMP_FILTER=y, \
                                       or allow a degraded seccomp layer in the policy"
                    .to_string(),
                _ => format!(
                    "seccomp filter action {name} is unavailable ({err}): use Linux 4.14 or \
                     later with CONFIG_SECCOMP_FILTER=y (or, inside a container, a runtime \
                     profile that allows seccomp(2)), or allow a degraded seccomp layer"
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Output, Stdio};

    fn profile_path() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/seccomp/default.json")
    }

    fn default_profile() -> CompiledProfile {
        compile_file(&profile_path()).expect("the shipped default profile compiles")
    }

    /// target/debug/deps/<test exe> → target/debug/examples/hostile
    fn hostile_bin() -> PathBuf {
        let exe = std::env::current_exe().expect("current_exe");
        let debug_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("test binary lives in target/<profile>/deps");
        let bin = debug_dir.join("examples").join("hostile");
        assert!(
            bin.exists(),
            "{} is missing: build it with `cargo test` or `cargo build --examples`",
            bin.display()
        );
        bin
    }

    /// Runs `program args` in a fresh child with no_new_privs and, if given, the profile;
    /// killed after 120 s. Output goes to files, so a lingering grandchild holding the
    /// pipe cannot hang the test.
    fn run(program: &Path, args: &[&str], profile: Option<&CompiledProfile>) -> Output {
        let capture = tempdir();
        let (out_path, err_path) = (capture.path().join("out"), capture.path().join("err"));
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out_path).expect("stdout file"))
            .stderr(std::fs::File::create(&err_path).expect("stderr file"));
        if let Some(profile) = profile {
            let profile = profile.clone();
            // The hook runs between fork and exec and only makes two system calls (prctl,
            // seccomp); `install` does not allocate.
            super::super::sys::pre_exec(&mut cmd, move || {
                nix::sys::prctl::set_no_new_privs()?;
                profile.install().map_err(|e| match e {
                    SeccompError::Install { source, .. } => source,
                    _ => io::Error::from_raw_os_error(libc::EINVAL),
                })
            });
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{} {args:?} timed out; stderr: {}",
                    program.display(),
                    std::fs::read_to_string(&err_path).unwrap_or_default()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        Output {
            status,
            stdout: std::fs::read(&out_path).expect("stdout file"),
            stderr: std::fs::read(&err_path).expect("stderr file"),
        }
    }

    struct Probe {
        succeeded: bool,
        errno: Option<i64>,
        json: serde_json::Value,
    }

    fn hostile(args: &[&str], profile: Option<&CompiledProfile>) -> Probe {
        let out = run(&hostile_bin(), args, profile);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "hostile {args:?} exited with {:?}; stdout: {stdout}; stderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout.lines().last().unwrap_or_default();
        let json: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("hostile {args:?} printed {stdout:?}: {e}"));
        assert_eq!(json["probe"], args[0], "{json}");
        Probe {
            succeeded: json["succeeded"].as_bool().expect("succeeded is a bool"),
            errno: json["errno"].as_i64(),
            json,
        }
    }

    fn assert_denied(args: &[&str], errno: i32) {
        let p = hostile(args, Some(&default_profile()));
        assert!(
            !p.succeeded && p.errno == Some(i64::from(errno)),
            "{args:?} under the filter must fail with errno {errno}: {}",
            p.json
        );
    }

    fn tempdir() -> tempfile::TempDir {
        tempfile::tempdir().expect("tempdir")
    }

    #[test]
    fn shipped_profile_compiles_with_both_filters() {
        let p = default_profile();
        assert_eq!(p.name, "default");
        assert_eq!(p.filter_count(), 2);
        let counts = p.instruction_counts();
        // The allowlist has hundreds of rules (in a binary search: a few instructions per
        // run of syscall numbers); the ENOSYS filter (clone3 and the four calls that put
        // page-cache pages in pipes) a handful per syscall.
        assert!(counts["successor"] > 100, "{counts:?}");
        assert!(counts["successor_enosys"] < 40, "{counts:?}");
        // It survives the trip to the child (serialized, e.g. over a pipe to init).
        let json = serde_json::to_string(&p).expect("serialize");
        let back: CompiledProfile = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back.instruction_counts(), counts);
        assert!(format!("{back:?}").len() < 300, "Debug stays short");
    }

    /// One source list: the shipped profile compiles for aarch64 too, leaving out only
    /// x86_64's legacy syscalls, and a name no architecture knows is still an error there.
    #[test]
    fn shipped_profile_compiles_for_aarch64_from_the_same_list() {
        let json = std::fs::read(profile_path()).unwrap();
        let arm = compile_for("default", "default", &json, Arch::Aarch64).unwrap();
        assert_eq!(arm.arch, Arch::Aarch64);
        assert_eq!(arm.filter_count(), 2);
        assert!(arm.instruction_counts().values().all(|&n| n > 0));
        let (_, dropped) = without_foreign_syscalls(&json, Arch::Aarch64).unwrap();
        for legacy in ["open", "stat", "fork", "pipe", "poll", "access", "unlink"] {
            assert!(dropped.iter().any(|d| d == legacy), "{legacy}: {dropped:?}");
        }
        for common in [
            "read",
            "openat",
            "clone",
            "execve",
            "exit_group",
            "newfstatat",
        ] {
            assert!(
                !dropped.iter().any(|d| d == common),
                "{common}: {dropped:?}"
            );
        }
        // On x86_64 nothing is left out.
        let (_, none) = without_foreign_syscalls(&json, Arch::X86_64).unwrap();
        assert!(none.is_empty(), "{none:?}");
        let x86 = compile_for("default", "default", &json, Arch::X86_64).unwrap();
        assert_eq!(x86.filter_count(), 2);

        let typo = String::from_utf8(json).unwrap().replacen(
            "\"syscall\": \"read\"",
            "\"syscall\": \"raed\"",
            1,
        );
        assert!(typo.contains("raed"));
        assert!(matches!(
            compile_for("typo", "typo", typo.as_bytes(), Arch::Aarch64),
            Err(SeccompError::Compile { .. })
        ));
    }

    #[test]
    fn probe_reports_seccomp_available() {
        assert_eq!(probe(), Ok(()));
    }

    #[test]
    fn malformed_profile_is_a_clear_error() {
        let err = compile_json("broken", b"{\"successor\": [").unwrap_err();
        assert!(matches!(err, SeccompError::Malformed { .. }), "{err:?}");
        assert!(err.to_string().contains("`broken`"), "{err}");

        let dir = tempdir();
        let path = dir.path().join("typo.json");
        let json = r#"{"successor": {"mismatch_action": {"errno": 1}, "match_action": "allow",
                        "filter": [{"syscall": "no_such_syscall"}]},
                       "successor_enosys": {"mismatch_action": "allow", "match_action": {"errno": 38},
                        "filter": [{"syscall": "clone3"}]}}"#;
        std::fs::write(&path, json).expect("write");
        let err = compile_file(&path).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, SeccompError::Compile { .. }), "{err:?}");
        assert!(
            msg.contains("typo.json") && msg.contains("no_such_syscall"),
            "{msg}"
        );

        let err = compile_file(&dir.path().join("absent.json")).unwrap_err();
        assert!(matches!(err, SeccompError::Read { .. }), "{err:?}");
        assert!(err.to_string().contains("absent.json"), "{err}");
    }

    /// A profile compiled once is reused, but only for the very same text: a file edited
    /// between two sandboxes is compiled anew (here into an error).
    #[test]
    fn compiled_profiles_are_reused_only_for_the_same_text() {
        let dir = tempdir();
        let path = dir.path().join("mine.json");
        let good = r#"{"successor": {"mismatch_action": {"errno": 1}, "match_action": "allow",
                        "filter": [{"syscall": "read"}, {"syscall": "write"}]},
                       "successor_enosys": {"mismatch_action": "allow", "match_action": {"errno": 38},
                        "filter": [{"syscall": "clone3"}]}}"#;
        std::fs::write(&path, good).expect("write");
        let a = compile_file(&path).expect("compile");
        let b = compile_file(&path).expect("compile again");
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&b).unwrap()
        );
        std::fs::write(&path, good.replace("\"read\"", "\"no_such_syscall\"")).expect("edit");
        let err = compile_file(&path).unwrap_err();
        assert!(matches!(err, SeccompError::Compile { .. }), "{err:?}");
    }

    #[test]
    fn missing_unknown_and_permissive_filters_are_rejected() {
        let only_allowlist = r#"{"successor": {"mismatch_action": {"errno": 1},
            "match_action": "allow", "filter": [{"syscall": "read"}]}}"#;
        let err = compile_json("partial", only_allowlist.as_bytes()).unwrap_err();
        assert!(
            matches!(
                err,
                SeccompError::MissingFilter {
                    filter: "successor_enosys",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("successor_enosys"), "{err}");

        let err = compile_json("empty", b"{}").unwrap_err();
        assert!(
            matches!(
                err,
                SeccompError::MissingFilter {
                    filter: "successor",
                    ..
                }
            ),
            "{err:?}"
        );

        let extra = r#"{"successor": {"mismatch_action": {"errno": 1}, "match_action": "allow",
            "filter": [{"syscall": "read"}]},
            "successor_enosys": {"mismatch_action": "allow", "match_action": {"errno": 38},
            "filter": [{"syscall": "clone3"}]},
            "vcpu": {"mismatch_action": "allow", "match_action": "trap", "filter": []}}"#;
        let err = compile_json("extra", extra.as_bytes()).unwrap_err();
        assert!(
            matches!(&err, SeccompError::UnknownFilter { filter, .. } if filter == "vcpu"),
            "{err:?}"
        );

        let denylist = r#"{"successor": {"mismatch_action": "allow", "match_action": {"errno": 1},
            "filter": [{"syscall": "ptrace"}]},
            "successor_enosys": {"mismatch_action": "allow", "match_action": {"errno": 38},
            "filter": [{"syscall": "clone3"}]}}"#;
        let err = compile_json("denylist", denylist.as_bytes()).unwrap_err();
        assert!(matches!(err, SeccompError::NotAllowlist { .. }), "{err:?}");

        let mixed = r#"{"successor": {"mismatch_action": {"errno": 1}, "match_action": "allow",
            "filter": [{"syscall": "socket"},
                       {"syscall": "socket", "args": [{"index": 0, "type": "dword", "op": "eq", "val": 1}]}]},
            "successor_enosys": {"mismatch_action": "allow", "match_action": {"errno": 38},
            "filter": [{"syscall": "clone3"}]}}"#;
        let err = compile_json("mixed", mixed.as_bytes()).unwrap_err();
        assert!(
            matches!(&err, SeccompError::MixedRules { syscall, .. } if syscall == "socket"),
            "{err:?}"
        );
    }

    #[test]
    fn corrupt_compiled_profile_is_refused_before_installing() {
        let mut p = default_profile();
        p.programs.0.pop();
        let err = p.install().unwrap_err();
        assert!(matches!(err, SeccompError::Corrupt { .. }), "{err:?}");
    }

    /// Every required-denied probe fails with EPERM under the filter, one process each.
    #[test]
    fn hostile_syscalls_are_denied_with_eperm() {
        let dir = tempdir();
        let d = dir.path().to_str().expect("utf-8 temp path");
        let cases: &[&[&str]] = &[
            &["ptrace"],
            &["process_vm_readv"],
            &["mount", d],
            &["umount2", d],
            &["pivot_root", d],
            &["chroot", d],
            &["unshare-user"],
            &["unshare-net"],
            &["setns"],
            &["clone-newuser"],
            &["bpf"],
            &["keyctl"],
            &["add_key"],
            &["request_key"],
            &["perf_event_open"],
            &["userfaultfd"],
            &["io_uring_setup"],
            &["kexec_load"],
            &["kexec_file_load"],
            &["init_module"],
            &["finit_module"],
            &["delete_module"],
            &["reboot"],
            &["swapon"],
            &["swapoff"],
            &["mknod-char", d],
            &["tiocsti"],
            &["tioclinux"],
            &["personality-noaslr"],
            &["open_by_handle_at", d],
        ];
        for case in cases {
            assert_denied(case, libc::EPERM);
        }
        // Nothing was left behind in the directory the probes were given.
        let left: Vec<_> = std::fs::read_dir(dir.path()).expect("read_dir").collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn clone3_gets_enosys_so_libc_falls_back_to_clone() {
        assert_denied(&["clone3"], libc::ENOSYS);
    }

    /// A page of a file held by a pipe is pinned outside the memory budget: the calls that
    /// put one there get ENOSYS (programs fall back to read and write). MPTCP, which
    /// Landlock's TCP rules do not see, gets EPERM as any other refused socket.
    #[test]
    fn pipe_page_pinning_gets_enosys_and_mptcp_eperm() {
        for probe in ["splice", "tee", "vmsplice", "sendfile"] {
            assert_denied(&[probe], libc::ENOSYS);
        }
        assert_denied(&["bind-mptcp", "0"], libc::EPERM);
        // Protocol 0 of a type other than a stream or a datagram: SCTP where loaded.
        assert_denied(&["socket-seqpacket"], libc::EPERM);
    }

    /// The probes above are not failing on their own: without the filter, the same
    /// probes either work or fail with an errno other than EPERM (the kernel's own answer
    /// to the invalid arguments they pass). As root, more of them reach the kernel.
    #[test]
    fn denied_probes_are_not_eperm_without_the_filter() {
        let dir = tempdir();
        let d = dir.path().to_str().expect("utf-8 temp path");
        // (probe, whether it must succeed outright)
        let mut cases: Vec<(Vec<&str>, bool)> = vec![
            (vec!["ptrace"], true),
            (vec!["process_vm_readv"], true),
            (vec!["clone3"], true),
            (vec!["personality-noaslr"], true),
            (vec!["keyctl"], true),
            (vec!["tioclinux"], false),
            (vec!["splice"], true),
            (vec!["tee"], true),
            (vec!["vmsplice"], true),
            (vec!["sendfile"], true),
            (vec!["socket-seqpacket"], false),
        ];
        if std::fs::read_to_string("/proc/sys/net/mptcp/enabled").is_ok_and(|v| v.trim() == "1") {
            cases.push((vec!["bind-mptcp", "0"], true));
        }
        if nix::unistd::geteuid().is_root() {
            cases.extend([
                (vec!["mount", d], true),
                (vec!["mknod-char", d], true),
                (vec!["unshare-net"], true),
                (vec!["clone-newuser"], true),
                (vec!["umount2", d], false),
                (vec!["pivot_root", d], false),
                (vec!["bpf"], false),
                (vec!["reboot"], false),
                (vec!["delete_module"], false),
                (vec!["swapon"], false),
            ]);
        }
        for (args, must_succeed) in cases {
            let p = hostile(&args, None);
            if must_succeed {
                assert!(p.succeeded, "{args:?} without a filter: {}", p.json);
            } else {
                assert!(
                    !p.succeeded && p.errno.is_some_and(|e| e != i64::from(libc::EPERM)),
                    "{args:?} without a filter must fail, but not with EPERM: {}",
                    p.json
                );
            }
        }
    }

    /// The control probes still work under the filter.
    #[test]
    fn control_probes_succeed_under_the_filter() {
        let profile = default_profile();
        let dir = tempdir();
        let d = dir.path().to_str().expect("utf-8 temp path");
        let file = dir.path().join("written");
        let file = file.to_str().expect("utf-8 temp path");
        for args in [
            vec!["mknod-fifo", d],
            vec!["personality-query"],
            vec!["write-file", file],
            vec!["fork-many", "3", "0"],
            vec!["getuid"],
        ] {
            let p = hostile(&args, Some(&profile));
            assert!(p.succeeded, "{args:?} under the filter: {}", p.json);
        }
        assert_eq!(
            std::fs::read(file).expect("written file"),
            b"fork-hostile\n"
        );
        let p = hostile(&["fork-many", "3", "0"], Some(&profile));
        assert_eq!(p.json["forked"], 3, "{}", p.json);
        let p = hostile(&["getuid"], Some(&profile));
        assert_eq!(p.json["status"]["NoNewPrivs"], "1", "{}", p.json);
        assert_eq!(p.json["status"]["Seccomp"], "2", "{}", p.json);
        // Two more filters than this test process runs under (CI may add its own).
        let own = std::fs::read_to_string("/proc/self/status").expect("status");
        let own: u64 = own
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp_filters:"))
            .map_or(0, |v| v.trim().parse().expect("a count"));
        assert_eq!(
            p.json["status"]["Seccomp_filters"],
            (own + 2).to_string(),
            "{}",
            p.json
        );
    }

    fn run_tool(args: &[&str]) -> String {
        let profile = default_profile();
        let path = which(args[0]);
        let out = run(&path, &args[1..], Some(&profile));
        assert!(
            out.status.success(),
            "{args:?} under the filter: {:?}\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn which(tool: &str) -> PathBuf {
        std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join(tool))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("{tool} is not on PATH"))
    }

    #[test]
    fn shell_pipeline_runs_under_the_filter() {
        let out = run_tool(&["sh", "-c", "ls / | wc -l"]);
        let n: usize = out.trim().parse().expect("a line count");
        assert!(n > 3, "{out}");
    }

    #[test]
    fn python_threads_asyncio_subprocess_multiprocessing_run_under_the_filter() {
        let script = r#"
import asyncio, multiprocessing, os, socket, subprocess, sys, tempfile, threading
def square(x):
    return x * x
async def main():
    proc = await asyncio.create_subprocess_exec("true")
    await proc.wait()
    r, w = socket.socketpair()
    w.send(b"x")
    data = await asyncio.get_running_loop().sock_recv(r, 1)
    return proc.returncode, data
if __name__ == "__main__":
    out = []
    t = threading.Thread(target=lambda: out.append(sum(range(1000))))
    t.start(); t.join()
    assert out == [499500], out
    assert subprocess.run(["sh", "-c", "echo hi"], capture_output=True).stdout == b"hi\n"
    assert asyncio.run(main()) == (0, b"x")
    for method in ("fork", "spawn"):
        with multiprocessing.get_context(method).Pool(2) as pool:
            assert pool.map(square, range(5)) == [0, 1, 4, 9, 16]
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "f")
        with open(p, "w") as f:
            f.write("x")
        os.rename(p, p + "2")
    print("ok")
"#;
        // A file, not `-c`: multiprocessing's spawn workers re-import __main__.
        let dir = tempdir();
        let path = dir.path().join("check.py");
        std::fs::write(&path, script).expect("write script");
        let out = run_tool(&["python3", path.to_str().expect("utf-8 temp path")]);
        assert_eq!(out.trim(), "ok");
    }

    #[test]
    fn git_and_cc_run_under_the_filter() {
        let dir = tempdir();
        let d = dir.path().to_str().expect("utf-8 temp path");
        let script = format!(
            "set -e; cd {d}; git init -q repo; cd repo; echo 'int main(void){{return 0;}}' > m.c; \
             git add m.c; git -c user.name=t -c user.email=t@t commit -qm init; git log --oneline | wc -l; \
             cc -o m m.c; ./m; echo built"
        );
        let out = run_tool(&["sh", "-c", &script]);
        assert_eq!(out.split_whitespace().collect::<Vec<_>>(), ["1", "built"]);
    }

    #[test]
    fn rust_threads_and_process_spawn_run_under_the_filter() {
        // The hostile binary is a Rust program: its std runtime plus fork and waitpid.
        let p = hostile(&["fork-many", "2", "0"], Some(&default_profile()));
        assert_eq!(p.json["forked"], 2, "{}", p.json);
        // A Rust test binary (this one), running one trivial test under the filter:
        // libtest's threads, std::process::Command (clone3 → ENOSYS → clone), statx.
        let exe = std::env::current_exe().expect("current_exe");
        let out = run(
            &exe,
            &[
                "filtered_self_check",
                "--include-ignored",
                "--test-threads=2",
            ],
            Some(&default_profile()),
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{:?}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Run by `rust_threads_and_process_spawn_run_under_the_filter` inside the filter.
    #[test]
    #[ignore = "run under the filter by rust_threads_and_process_spawn_run_under_the_filter"]
    fn filtered_self_check() {
        let t = std::thread::spawn(|| 6 * 7);
        assert_eq!(t.join().expect("thread"), 42);
        let out = Command::new("sh")
            .args(["-c", "echo spawned"])
            .output()
            .expect("spawn under the filter");
        assert_eq!(out.stdout, b"spawned\n");
        assert!(std::fs::metadata("/").expect("statx").is_dir());
    }
}
