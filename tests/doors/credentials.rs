//! The credentials never appear inside (environment, readable files, response headers and
//! bodies), from `credentials_env` and from `credentials_file`. Item 3 of the proof list in
//! tests/doors.rs.

use super::*;

/// What the gateway puts where the key would have reached the task.
const REDACTED: &str = "[redacted by fork gateway]";

/// Makes three calls with its own Authorization header, then dumps everything it can see
/// that could carry a key: the environment, /proc environs and command lines, every file
/// under /tmp and $HOME (bounded), the response headers and bodies, and the files named in
/// argv (read as-is). It cannot look for the key itself (it must not know it): the test
/// searches the dump.
const LOOK_SCRIPT: &str = r#"
calls = []
for path, req in [
    ("/chat/completions", {"model": "fake-small", "messages": [{"role": "user", "content": "who am I"}]}),
    ("/chat/completions", {"model": "fake-small", "stream": True,
                           "messages": [{"role": "user", "content": "who am I"}]}),
    ("/embeddings", {"model": "fake-small", "input": "who am I"}),
]:
    st, h, b = post(path, req, {"Authorization": "Bearer task-own-token", "Cookie": "c=task"})
    calls.append({"status": st, "headers": h, "body": b})
with open("/tmp/self-written.txt", "w") as f:
    f.write("file-canary " + os.environ.get("DOORS_CANARY", ""))
files = {}
def grab(p):
    try:
        with open(p, "rb") as f:
            files[p] = f.read(1 << 16).decode("latin-1")
    except OSError as e:
        files[p] = "ERR " + type(e).__name__
for p in ["/proc/self/environ", "/proc/1/environ", "/proc/self/cmdline", "/proc/1/cmdline"]:
    grab(p)
n = 0
for top in ["/tmp", os.environ["HOME"]]:
    for dp, dns, fns in os.walk(top):
        for fn in fns:
            n += 1
            if n <= 400:
                grab(os.path.join(dp, fn))
listed = {}
for p in sys.argv[1:]:
    grab(p)
    d = os.path.dirname(p)
    try:
        listed[d] = sorted(os.listdir(d))
    except OSError as e:
        listed[d] = "ERR " + type(e).__name__
print(json.dumps({"env": dict(os.environ), "calls": calls, "files": files, "walked": n,
                  "listed": listed}))
"#;

/// Checks the dump of LOOK_SCRIPT: the calls succeeded (so the key reached the upstream,
/// which requires it), the key appears nowhere, and the positive controls were seen.
fn check_no_key(r: &Run, key: &str, canary: &str, cred_env: Option<&str>) -> Value {
    assert_eq!(r.code, 0, "{}", ctx(r));
    for (what, text) in [("stdout", &r.stdout), ("stderr", &r.stderr)] {
        assert!(
            !text.contains(key),
            "the key appears in the run's {what}: {}",
            ctx(r)
        );
    }
    assert!(!r.report.to_string().contains(key));
    let d: Value =
        serde_json::from_str(r.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", ctx(r)));
    // The upstream answers 401 without `Bearer KEY`: 200 means the gateway sent the key.
    for c in d["calls"].as_array().unwrap() {
        assert_eq!(c["status"], 200, "{c}");
        let headers = c["headers"].as_object().unwrap();
        for (k, v) in headers {
            let v = v.as_str().unwrap();
            assert!(!v.contains(key), "response header {k} carries the key");
            assert!(!v.contains("task-own-token"), "response header {k}: {v}");
        }
        let lower: Vec<String> = headers.keys().map(|k| k.to_ascii_lowercase()).collect();
        assert!(
            !lower.contains(&"x-echo-authorization".to_string()),
            "{headers:?}"
        );
        assert!(!lower.contains(&"set-cookie".to_string()), "{headers:?}");
        // With --echo-headers the upstream put what it received into the reply: the key's
        // place is redacted, and the task's own Authorization and Cookie never went out.
        let body = c["body"].as_str().unwrap();
        if !body.contains("\"embedding\"") {
            assert!(
                body.contains(REDACTED),
                "no redaction in the echoed headers: {body}"
            );
            assert!(
                !body.contains("task-own-token") && !body.contains("c=task"),
                "{body}"
            );
        }
    }
    // The environment: no key, no credential variable, but the policy's canary is there
    // (so the dump really shows the environment).
    let env = d["env"].as_object().unwrap();
    assert_eq!(env["DOORS_CANARY"], canary);
    if let Some(name) = cred_env {
        assert!(!env.contains_key(name), "{name} reached the sandbox");
    }
    assert!(env.contains_key("FORK_MODEL_URL"));
    let files = d["files"].as_object().unwrap();
    assert!(
        files["/proc/self/environ"]
            .as_str()
            .unwrap()
            .contains(canary),
        "/proc/self/environ was not read: {}",
        files["/proc/self/environ"]
    );
    let init_env = files["/proc/1/environ"].as_str().unwrap();
    assert!(
        init_env.is_empty() || init_env.starts_with("ERR "),
        "/proc/1/environ: {init_env}"
    );
    assert!(
        files["/tmp/self-written.txt"]
            .as_str()
            .unwrap()
            .contains(canary),
        "the walk of /tmp did not read the file the task wrote"
    );
    assert!(d["walked"].as_u64().unwrap() >= 1);
    d
}

#[test]
fn credentials_from_the_environment_never_appear_inside() {
    need_root!();
    let dir = scratch("doors-creds-env");
    let key = fresh_key("env");
    let canary = format!("canary-{}", unique());
    let up = Upstream::start(&dir, &["--require-key", &key, "--echo-headers"]);
    let var = "DOORS_TEST_UPSTREAM_KEY";
    assert!(std::env::var_os(var).is_none());
    let policy = gateway_policy(
        &dir,
        "policy",
        &up,
        &format!("credentials_env = \"{var}\""),
        &format!("[environment]\nset = {{ DOORS_CANARY = \"{canary}\" }}\n"),
    );
    let script = format!("{PY_PRELUDE}{LOOK_SCRIPT}");
    // The key is in fork's own environment only.
    let (r, _) = run_py(&[(var, &key)], &policy, &[], &script, &[]);
    check_no_key(&r, &key, &canary, Some(var));
    assert_eq!(up.requests(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn credentials_from_a_file_are_used_and_the_file_is_invisible_inside() {
    need_root!();
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("doors-creds-file");
    let key = fresh_key("file");
    let canary = format!("canary-{}", unique());
    let secrets = dir.join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o755)).unwrap();
    let key_file = secrets.join("upstream.key");
    let sibling = secrets.join("visible.txt");
    std::fs::write(&key_file, format!("{key}\n")).unwrap();
    std::fs::write(&sibling, format!("sibling {canary}\n")).unwrap();
    // World-readable on purpose: only fork's hiding keeps the task from reading it.
    for f in [&key_file, &sibling] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let up = Upstream::start(&dir, &["--require-key", &key, "--echo-headers"]);
    let policy = gateway_policy(
        &dir,
        "policy",
        &up,
        &format!("credentials_file = \"{}\"", key_file.display()),
        &format!("[environment]\nset = {{ DOORS_CANARY = \"{canary}\" }}\n"),
    );
    let script = format!("{PY_PRELUDE}{LOOK_SCRIPT}");
    let kf = key_file.to_str().unwrap();
    let sib = sibling.to_str().unwrap();
    let (r, _) = run_py(&[], &policy, &[], &script, &[kf, sib]);
    let d = check_no_key(&r, &key, &canary, None);
    let files = d["files"].as_object().unwrap();
    // The directory is visible (its other file is read whole), the key file is not.
    assert!(
        files[sib].as_str().unwrap().contains(&canary),
        "the key file's directory should stay visible: {}",
        files[sib]
    );
    let seen = files[kf].as_str().unwrap();
    assert!(
        seen.is_empty() || seen.starts_with("ERR "),
        "the task read the key file: {seen:?}"
    );
    assert_eq!(up.requests(), 3);
    // And it is untouched on the host.
    assert_eq!(
        std::fs::read_to_string(&key_file).unwrap(),
        format!("{key}\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A policy that passes the gateway's key variable into the sandbox is refused before
/// anything runs, by `fork run` (the policy's own [gateway]) and `fork evaluate` (fork.toml's
/// [gateway]): the error names the policy file, the variable and the fix.
#[test]
fn a_policy_passing_the_gateways_key_variable_is_refused() {
    need_root!();
    let env = Env::new("doors-key-passed");
    let up = Upstream::start(&env.dir, &[]);
    let var = "DOORS_PASSED_KEY";
    let key = fresh_key("passed");
    let passes = format!("[environment]\npass = [\"{var}\"]\n");
    let policy = gateway_policy(
        &env.dir,
        "passes-key",
        &up,
        &format!("credentials_env = \"{var}\""),
        &passes,
    );
    let expect_refusal = |code: i32, stdout: &str, stderr: &str, policy_file: &Path| {
        let all = format!("{stdout}{stderr}");
        assert_eq!(code, 65, "{all}");
        assert!(
            all.contains(&policy_file.display().to_string())
                && all.contains(&format!("environment.pass lists `{var}`"))
                && all.contains(&format!("Remove `{var}` from environment.pass")),
            "{all}"
        );
        assert!(!all.contains(&key), "{all}");
    };

    // fork run, the policy's own [gateway].
    let run_root = scratch("doors-key-passed-runs");
    let out = fork_cmd(&run_root)
        .env(var, &key)
        .arg("run")
        .arg("--policy")
        .arg(&policy)
        .args(["--", "sh", "-c", "echo RAN"])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    expect_refusal(out.status.code().unwrap_or(-1), &stdout, &stderr, &policy);
    assert!(!stdout.contains("RAN"), "{stdout}");
    let _ = std::fs::remove_dir_all(&run_root);

    // fork evaluate, fork.toml's [gateway] and a policy that passes its variable.
    let eval_policy = env.dir.join("passes-only.toml");
    std::fs::write(
        &eval_policy,
        format!("{passes}[decision]\nself_reported = \"accept\"\n"),
    )
    .unwrap();
    let rt = env.runtime(
        "hermes-demo",
        &format!(
            "\n[gateway]\nupstream = \"{}\"\ncredentials_env = \"{var}\"\n[gateway.prices.fake-small]\ninput_per_mtok = 1.5\noutput_per_mtok = 6.0\n",
            up.url()
        ),
    );
    let keyenv = [(var, OsStr::new(&key))];
    let e = evaluate_with(
        &env,
        &patch("swap-compressor"),
        &rt,
        "passes-key",
        &[
            "--task",
            "summarize",
            "--policy",
            eval_policy.to_str().unwrap(),
        ],
        With {
            vars: &keyenv,
            ..With::default()
        },
    );
    expect_refusal(e.code, &e.stdout, &e.stderr, &eval_policy);
    assert_eq!(up.requests(), 0);
}
