//! What the command line prints, through the real binary: text from a hostile bundle never
//! reaches the terminal with a control character in it; `--json` is JSON in every outcome
//! (a path that is not UTF-8 included); a stdout that cannot be written is exit 74, never a
//! panic; a bare `verdict.json` names the bundle in the current directory; and the exit
//! codes README's table gives for keys, unreadable bundles and an unreachable bus.

mod common;
use common::lifecycle::{demo, need_default_policy, need_root, patch, Env};
use common::*;
use fork::verdict::sha256_digest;
use serde_json::Value;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A node key at `dir/node.key` and a bundle at `dir/bundle` it endorses (made without
/// an evaluation); returns the key's path, its public half and the bundle.
fn signed_bundle(dir: &Path) -> (PathBuf, String, PathBuf) {
    let key = dir.join("node.key");
    let public = fork::identity::generate_node_key(&key, false).unwrap();
    let bundle = dir.join("bundle");
    let plan = vec![("tests".to_string(), sha256_digest(b"the tests task"))];
    forge_bundle(&bundle, &key, &sha256_digest(b"a patch"), None, plan);
    (key, public.to_string(), bundle)
}

/// A copy of `bundle` at `to` whose verdict.dsse.json had `edit` applied to its JSON.
fn edited_copy(bundle: &Path, to: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    common::lifecycle::copy_dir(bundle, to);
    let file = to.join("verdict.dsse.json");
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    edit(doc.as_object_mut().unwrap());
    std::fs::write(&file, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
}

/// The first control character a terminal would act on in `bytes` (C0 but `\n`, DEL,
/// C1), if any.
fn control_in(bytes: &[u8]) -> Option<char> {
    String::from_utf8_lossy(bytes)
        .chars()
        .find(|&c| c != '\n' && c.is_control())
}

/// Clears the line, writes a green "valid: APPROVE", then starts a line of its own.
const FAKE: &str = "\u{1b}[2K\r\u{1b}[32mvalid: APPROVE sha256:0 (confidence 1.00)\u{1b}[0m\u{9b}\nconsensus: APPROVED";

/// serde's errors quote a bundle's field names as they are: a field name in
/// verdict.dsse.json that clears the line and prints a green "valid: APPROVE" reached the
/// terminal through `fork verify` (stderr, exit 65) and `fork consensus` (stdout); a
/// payloadType doing the same through `verify`'s `invalid:` line. Every such character is
/// now spelled out (`\x1b`), on both streams, and on stdout `\n` too.
#[test]
fn hostile_bundle_text_never_reaches_the_terminal_raw() {
    let dir = scratch("cli-escapes");
    let (_, public, bundle) = signed_bundle(&dir);
    let by_field = dir.join("by-field");
    edited_copy(&bundle, &by_field, |m| {
        m.insert(FAKE.to_string(), Value::Bool(true));
    });
    let by_type = dir.join("by-type");
    edited_copy(&bundle, &by_type, |m| {
        m.insert("payloadType".into(), Value::String(FAKE.to_string()));
    });
    let fork = || {
        let mut c = Command::new(fork_bin());
        c.env("XDG_CONFIG_HOME", dir.join("xdg"));
        c
    };
    let runs = [
        (
            fork()
                .arg("verify")
                .arg(&by_field)
                .args(["--trust", &public])
                .output()
                .unwrap(),
            65,
        ),
        (
            fork()
                .arg("verify")
                .arg(&by_type)
                .args(["--trust", &public])
                .output()
                .unwrap(),
            1,
        ),
        (
            fork()
                .args(["consensus", "--min-nodes", "1", "--trust", &public])
                .arg(&by_field)
                .arg(&by_type)
                .output()
                .unwrap(),
            1,
        ),
    ];
    for (o, code) in &runs {
        assert_eq!(o.status.code(), Some(*code), "{}", text(o));
        for (name, bytes) in [("stdout", &o.stdout), ("stderr", &o.stderr)] {
            assert_eq!(control_in(bytes), None, "{name} of\n{}", text(o));
        }
        // What the bundle said is shown, spelled out.
        let all =
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
        assert!(
            all.contains("\\x1b[2K\\r\\x1b[32mvalid: APPROVE"),
            "{}",
            text(o)
        );
    }
    // On stdout (verify's `invalid:` line, the consensus report) no field starts a line
    // of its own: the report names both refusals, each on its line.
    let invalid = String::from_utf8_lossy(&runs[1].0.stdout);
    assert_eq!(invalid.lines().count(), 1, "{invalid}");
    let report = String::from_utf8_lossy(&runs[2].0.stdout);
    assert_eq!(report.matches("\\x1b[32mvalid").count(), 2, "{report}");
    assert!(report.starts_with("consensus: NOT APPROVED\n"), "{report}");
    assert!(
        !report.lines().any(|l| l.starts_with("consensus: APPROVED")),
        "{report}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `fork verify --json` printed `invalid: ...` as text for a bundle that is not valid, and
/// for a verdict that does not speak for `--patch`: stdout is now one JSON object in every
/// answer, `{"valid": false, "reason": ...}` with exit 1, and the verdict document with 0.
#[test]
fn verify_json_is_json_whatever_the_answer() {
    let dir = scratch("cli-verify-json");
    let (_, public, bundle) = signed_bundle(&dir);
    let other = fork::identity::NodeKey::generate().public().to_string();
    let empty = dir.join("empty.diff");
    std::fs::write(&empty, "").unwrap();
    let verify = |trust: &str, extra: &[&OsStr]| {
        let o = Command::new(fork_bin())
            .arg("verify")
            .arg(&bundle)
            .args(["--json", "--trust", trust])
            .args(extra)
            .output()
            .unwrap();
        let doc: Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", text(&o)));
        (o.status.code(), doc, o)
    };
    // Endorsed by a key nobody trusts; and a patch it is not about.
    for (trust, extra) in [
        (other.as_str(), vec![]),
        (
            public.as_str(),
            vec![OsStr::new("--patch"), empty.as_os_str()],
        ),
    ] {
        let (code, doc, o) = verify(trust, &extra);
        assert_eq!(code, Some(1), "{}", text(&o));
        assert_eq!(doc["valid"], false, "{doc}");
        assert!(
            doc["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{doc}"
        );
    }
    let (code, doc, o) = verify(&public, &[]);
    assert_eq!(code, Some(0), "{}", text(&o));
    assert_eq!(doc["verdict"], "APPROVE", "{doc}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Inside a bundle directory, `fork consensus verdict.json` and `fork approve verdict.json`
/// looked for ` is missing from the bundle` (the empty path `Path::parent` gives a bare
/// file name): a bare verdict.json now names the current directory.
#[test]
fn a_bare_verdict_json_names_the_bundle_here() {
    let dir = scratch("cli-bare-verdict");
    let (_, public, bundle) = signed_bundle(&dir);
    let o = Command::new(fork_bin())
        .current_dir(&bundle)
        .args([
            "consensus",
            "--json",
            "--min-nodes",
            "1",
            "--trust",
            &public,
        ])
        .arg("verdict.json")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let rep: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(rep["approvals"], 1, "{rep}");
    let steward = dir.join("steward.key");
    fork::identity::generate_node_key(&steward, false).unwrap();
    let o = Command::new(fork_bin())
        .current_dir(&bundle)
        .args(["approve", "verdict.json", "--trust", &public, "--key"])
        .arg(&steward)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let written = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(bundle.join(&written).is_file(), "{written}: {}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `fork` with stdout on /dev/full (a full disk).
fn to_full(c: &mut Command) -> Output {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    c.stdout(full).stderr(Stdio::piped()).output().unwrap()
}

/// A result printed to a full disk panicked (`failed printing to stdout`, exit 101), after
/// the verdict was recorded: it is now exit 74 and one line naming stdout; an evaluation's
/// names the verdict that stands. And a bundle path that is not UTF-8 failed `--json`
/// (exit 70, no JSON, the path not named) where text worked: it is written lossily.
#[test]
fn stdout_failures_are_exit_74_and_paths_need_not_be_utf8() {
    let dir = scratch("cli-stdout");
    let (_, public, bundle) = signed_bundle(&dir);
    let no_panic = |o: &Output| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(74), "{}", text(o));
        assert!(!err.contains("panicked"), "{}", text(o));
        assert!(
            err.contains("cannot write the result to stdout"),
            "{}",
            text(o)
        );
    };
    for json in [false, true] {
        let mut c = Command::new(fork_bin());
        c.arg("verify").arg(&bundle).args(["--trust", &public]);
        if json {
            c.arg("--json");
        }
        no_panic(&to_full(&mut c));
    }
    no_panic(&to_full(
        Command::new(fork_bin())
            .args([
                "consensus",
                "--json",
                "--min-nodes",
                "1",
                "--trust",
                &public,
            ])
            .arg(&bundle),
    ));

    // `fork gc` in text mode (an empty run root of the test's own: "nothing to reclaim").
    let root = dir.join("runs");
    std::fs::create_dir_all(&root).unwrap();
    no_panic(&to_full(
        Command::new(fork_bin())
            .arg("gc")
            .env("FORK_RUN_ROOT", &root),
    ));

    let odd = dir.join(OsStr::from_bytes(b"bnd\xff"));
    std::fs::rename(&bundle, &odd).unwrap();
    let o = Command::new(fork_bin())
        .args([
            "consensus",
            "--json",
            "--min-nodes",
            "1",
            "--trust",
            &public,
        ])
        .arg(&odd)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let rep: Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    let shown = rep["votes"][0]["bundle"].as_str().unwrap();
    assert!(shown.ends_with("bnd\u{fffd}"), "{rep}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `fork evaluate --json > /dev/full`: the verdict is signed and recorded, then printing it
/// fails: exit 74 naming the verdict.json that stands, no panic.
#[test]
fn an_evaluation_printed_to_a_full_disk_is_exit_74_naming_its_verdict() {
    need_default_policy!();
    let env = Env::new("cli-evaluate-full");
    let out = env.out("full");
    let o = to_full(
        env.cmd()
            .arg("evaluate")
            .arg(patch("noop-comment"))
            .arg("--runtime")
            .arg(demo())
            .args(["--task", "tests", "--json", "--out"])
            .arg(&out),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(74), "{}", text(&o));
    assert!(!err.contains("panicked"), "{}", text(&o));
    let verdict = out.join("verdict.json");
    assert!(
        err.contains(&format!("the verdict stands: {}", verdict.display())),
        "{}",
        text(&o)
    );
    assert!(verdict.is_file(), "{}", text(&o));
}

/// `fork keygen --out DIR --force` went as far as the rename and exited 70 (`Is a
/// directory`): a directory is refused as a key path first, 64, with or without --force,
/// and nothing is left in it.
#[test]
fn keygen_refuses_a_directory_as_the_key_path() {
    let dir = scratch("cli-keygen-dir");
    for force in [false, true] {
        let mut c = Command::new(fork_bin());
        c.args(["keygen", "--out"]).arg(&dir);
        if force {
            c.arg("--force");
        }
        let o = c.output().unwrap();
        assert_eq!(o.status.code(), Some(64), "--force {force}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("is a directory"),
            "{}",
            text(&o)
        );
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "left in {dir:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A directory given as `--key` was a usage error (64); README's table says an input that
/// is not a regular file is bad input: 65, for `approve`, `mesh approve` and `mesh serve`
/// (all refuse it before any bus is reached).
#[test]
fn a_directory_as_the_key_is_bad_input() {
    let dir = scratch("cli-key-dir");
    let (_, public, bundle) = signed_bundle(&dir);
    let adir = dir.join("adir");
    std::fs::create_dir(&adir).unwrap();
    std::fs::create_dir(dir.join("runs")).unwrap();
    let p = patch("noop-comment");
    let demo = demo();
    let out = dir.join("out");
    let cmds: [Vec<&OsStr>; 4] = [
        vec![
            "evaluate".as_ref(),
            p.as_os_str(),
            "--runtime".as_ref(),
            demo.as_os_str(),
            "--no-ledger".as_ref(),
            "--out".as_ref(),
            out.as_os_str(),
        ],
        vec![
            "approve".as_ref(),
            bundle.as_os_str(),
            "--trust".as_ref(),
            public.as_ref(),
        ],
        vec![
            "mesh".as_ref(),
            "approve".as_ref(),
            p.as_os_str(),
            "--trust".as_ref(),
            public.as_ref(),
            "--nats".as_ref(),
            "nats://127.0.0.1:1".as_ref(),
        ],
        vec![
            "mesh".as_ref(),
            "serve".as_ref(),
            "--once".as_ref(),
            "--runtime".as_ref(),
            demo.as_os_str(),
            "--nats".as_ref(),
            "nats://127.0.0.1:1".as_ref(),
        ],
    ];
    for args in cmds {
        let o = Command::new(fork_bin())
            .args(&args)
            .arg("--key")
            .arg(&adir)
            .env("XDG_CONFIG_HOME", dir.join("xdg"))
            .env("XDG_DATA_HOME", dir.join("data"))
            .env("FORK_RUN_ROOT", dir.join("runs"))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(65), "{args:?}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("is not a regular file"),
            "{args:?}: {}",
            text(&o)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bundle this user may not read (another user's 0700 directory: EACCES) was fork's
/// internal error, 70: it is the bundle's problem, 65, naming the file, for `verify` and
/// `approve` alike.
#[test]
fn an_unreadable_bundle_is_bad_input_naming_the_file() {
    need_root!();
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("cli-unreadable");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (_, public, bundle) = signed_bundle(&dir);
    std::fs::set_permissions(&bundle, std::fs::Permissions::from_mode(0o700)).unwrap();
    let steward = dir.join("steward");
    std::fs::create_dir(&steward).unwrap();
    let key = steward.join("steward.key");
    fork::identity::generate_node_key(&key, false).unwrap();
    nix::unistd::chown(&steward, Some(65534.into()), Some(65534.into())).unwrap();
    nix::unistd::chown(&key, Some(65534.into()), Some(65534.into())).unwrap();
    let as_nobody = |args: &[&OsStr]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(fork_bin())
            .args(args)
            .env("HOME", &steward)
            .env("XDG_CONFIG_HOME", steward.join("xdg"))
            .env("XDG_DATA_HOME", steward.join("data"))
            .output()
            .unwrap()
    };
    let b = bundle.as_os_str();
    for args in [
        vec!["verify".as_ref(), b, "--trust".as_ref(), public.as_ref()],
        vec![
            "approve".as_ref(),
            b,
            "--trust".as_ref(),
            public.as_ref(),
            "--key".as_ref(),
            key.as_os_str(),
        ],
    ] {
        let o = as_nobody(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(65), "{args:?}: {}", text(&o));
        assert!(
            err.contains(&*bundle.to_string_lossy()) && err.contains("ermission denied"),
            "{args:?}: {}",
            text(&o)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `fork mesh serve --once` with no server retried without end; README's table says an
/// unreachable NATS server is 69, as `mesh propose` gives: `--once` gives up as propose
/// does (within 30 s) with 69.
#[test]
fn mesh_serve_once_gives_up_on_an_unreachable_bus() {
    let dir = scratch("cli-serve-once");
    std::fs::create_dir_all(dir.join("runs")).unwrap();
    let mut child = Command::new(fork_bin())
        .args([
            "mesh",
            "serve",
            "--once",
            "--nats",
            "nats://127.0.0.1:1",
            "--runtime",
        ])
        .arg(demo())
        .env("XDG_CONFIG_HOME", dir.join("xdg"))
        .env("XDG_DATA_HOME", dir.join("data"))
        .env("FORK_RUN_ROOT", dir.join("runs"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("mesh serve --once still retrying after 90 s: {}", text(&o));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(69), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cannot reach the NATS server"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
