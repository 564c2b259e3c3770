//! The sandbox's two doors (issue 4's proof list), with the real binary:
//!
//! 1. model calls through the metered gateway are charged exactly (non-streaming, streaming
//!    and embeddings, two models at different prices);
//! 2. an API-cost budget blown by a calling loop kills the run promptly (`api_cost`, exit
//!    137), the upstream sees no call beyond the one that crossed the budget, and any call
//!    the task made after that got a 402;
//! 3. the credentials never reach the sandbox (environment, readable files, response
//!    headers and bodies), from `credentials_env` and from `credentials_file`;
//! 4. a model the policy does not price is refused (403) and never forwarded;
//! 5. `fork evaluate` of the demo `summarize` task through the gateway: APPROVE with fewer
//!    prompt tokens for swap-compressor, REJECT naming `api_cost` under a tiny budget, with
//!    the call log as a signed artifact;
//! 6. localhost forwards through `fork evaluate`: a task-level forward reaches a host
//!    loopback service, without it the task cannot, and a non-loopback entry is refused.
//!
//! Each test starts its own fake upstream (scripts/fake-openai.py, 127.0.0.1, a free port,
//! bounded by --max-seconds) and kills it at the end; every address is loopback, every loop
//! bounded. They need root (the default policy mounts a capped tmpfs, creates cgroups).

mod common;
use common::lifecycle::*;
use common::*;
use serde_json::Value;
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the gateway puts where the key would have reached the task.
const REDACTED: &str = "[redacted by fork gateway]";

// ---------------------------------------------------------------------------------------
// The fake upstream.
// ---------------------------------------------------------------------------------------

/// scripts/fake-openai.py on 127.0.0.1, a free port; killed (by its own pid) on drop.
struct Upstream {
    child: Child,
    port: u16,
}

impl Upstream {
    fn start(dir: &Path, args: &[&str]) -> Upstream {
        let port_file = dir.join(format!("upstream-{}.port", unique()));
        let mut child = Command::new("python3")
            .arg(repo().join("scripts/fake-openai.py"))
            .args(["--port", "0", "--max-seconds", "300", "--port-file"])
            .arg(&port_file)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn scripts/fake-openai.py");
        let deadline = Instant::now() + Duration::from_secs(15);
        let port = loop {
            if let Some(p) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|t| t.trim().parse::<u16>().ok())
            {
                break p;
            }
            if let Ok(Some(st)) = child.try_wait() {
                panic!("the fake upstream exited early: {st}");
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the fake upstream did not write its port within 15 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Upstream { child, port }
    }

    /// `GET /fake/stats`: the requests that reached the upstream's /v1 endpoints.
    fn requests(&self) -> u64 {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect upstream");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /fake/stats HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .unwrap();
        let mut buf = Vec::new();
        s.take(1 << 16).read_to_end(&mut buf).unwrap();
        let text = String::from_utf8_lossy(&buf);
        let body = &text[text.find("\r\n\r\n").expect("an HTTP answer") + 4..];
        let v: Value = serde_json::from_str(body).expect("stats JSON");
        v["requests"].as_u64().expect("stats.requests")
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unique() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// A key nobody could guess (and long enough for the gateway's body scrubber).
fn fresh_key(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("sk-doors-{tag}-{}-{nanos:x}", std::process::id())
}

// ---------------------------------------------------------------------------------------
// Policies, prices and the fake's token rule.
// ---------------------------------------------------------------------------------------

/// (model, USD per million input tokens, USD per million output tokens).
const SMALL: (&str, f64, f64) = ("fake-small", 1.5, 6.0);
const LARGE: (&str, f64, f64) = ("fake-large", 10.0, 30.0);

fn price_of(model: &str) -> (f64, f64) {
    [SMALL, LARGE]
        .iter()
        .find(|(m, _, _)| *m == model)
        .map(|(_, i, o)| (*i, *o))
        .unwrap_or_else(|| panic!("{model} is not priced in these tests"))
}

fn cost(model: &str, prompt: u64, completion: u64) -> f64 {
    let (i, o) = price_of(model);
    prompt as f64 * i / 1e6 + completion as f64 * o / 1e6
}

/// A policy file: the default policy plus a `[gateway]` for `upstream` (both priced models)
/// and `extra` tables. `credentials` is a full `credentials_env = ...` or
/// `credentials_file = ...` line, or "".
fn gateway_policy(
    dir: &Path,
    name: &str,
    upstream: &Upstream,
    credentials: &str,
    extra: &str,
) -> PathBuf {
    // The summarize task has no judge: its self-reported metrics are accepted here.
    let mut text = format!(
        "{extra}\n[decision]\nself_reported = \"accept\"\n[gateway]\nupstream = \"{}\"\n{credentials}\n",
        upstream.url()
    );
    for (m, i, o) in [SMALL, LARGE] {
        text.push_str(&format!(
            "[gateway.prices.{m}]\ninput_per_mtok = {i:?}\noutput_per_mtok = {o:?}\n"
        ));
    }
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

fn words(s: &str) -> u64 {
    s.split_whitespace().count() as u64
}

/// The fake upstream's reply to a chat prompt (scripts/fake-openai.py, `reply_text`, without
/// --echo-headers): "fake reply to: " and the prompt's first five words.
fn fake_reply(prompt: &str) -> String {
    let first: Vec<&str> = prompt.split_whitespace().take(5).collect();
    format!("fake reply to: {}", first.join(" "))
}

// ---------------------------------------------------------------------------------------
// `fork run`.
// ---------------------------------------------------------------------------------------

/// `fork run --policy P --report R [flags] -- python3 -c SCRIPT ARGS...` with `env` added
/// to fork's own environment only; asserts nothing of the run remains afterwards.
fn run_py(
    env: &[(&str, &str)],
    policy: &Path,
    flags: &[&str],
    script: &str,
    args: &[&str],
) -> (Run, Duration) {
    let run_root = scratch("doors-runs");
    let report = run_root.join("report.json");
    let mut c = fork_cmd(&run_root);
    for (k, v) in env {
        c.env(k, v);
    }
    c.arg("run")
        .arg("--policy")
        .arg(policy)
        .arg("--report")
        .arg(&report)
        .args(flags)
        .args(["--", "python3", "-c", script])
        .args(args);
    let t = Instant::now();
    let out = c.output().expect("spawn fork");
    let took = t.elapsed();
    let r = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        report: std::fs::read(&report)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null),
        run_root: run_root.clone(),
    };
    let id = r.report["run_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no report: {}", ctx(&r)))
        .to_string();
    assert_nothing_left(&run_root, &id);
    let _ = std::fs::remove_dir_all(&run_root);
    (r, took)
}

fn ctx(r: &Run) -> String {
    format!(
        "exit {}\nstdout:\n{}\nstderr:\n{}\nreport: {}",
        r.code, r.stdout, r.stderr, r.report
    )
}

fn assert_close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-12 + want.abs() * 1e-9,
        "{what}: got {got}, expected {want}"
    );
}

/// The Python helpers every in-sandbox script starts with: `post(path, obj, headers)`
/// returns (status, headers as a dict with lowercase names, body as text) for 2xx and HTTP errors alike.
const PY_PRELUDE: &str = r#"
import json, os, sys, urllib.request, urllib.error
U = os.environ["FORK_MODEL_URL"]
def post(path, obj, headers=None):
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    req = urllib.request.Request(U + path, data=json.dumps(obj).encode(), headers=h, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read().decode("latin-1")
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read().decode("latin-1")
def sse(body):
    text, usage = "", None
    for line in body.splitlines():
        if line.startswith("data: ") and line.strip() != "data: [DONE]":
            ev = json.loads(line[6:])
            for ch in ev.get("choices") or []:
                text += (ch.get("delta") or {}).get("content") or ""
            if ev.get("usage"):
                usage = ev["usage"]
    return text, usage
"#;

// ---------------------------------------------------------------------------------------
// 1. Calls are charged correctly.
// ---------------------------------------------------------------------------------------

const CHARGE_SCRIPT: &str = r#"
out = []
for c in json.loads(sys.argv[1]):
    if c["kind"] == "embeddings":
        st, h, body = post("/embeddings", {"model": c["model"], "input": c["input"]})
        j = json.loads(body)
        out.append({"status": st, "reply": None, "vectors": len(j["data"]),
                    "prompt": j["usage"]["prompt_tokens"], "completion": 0})
        continue
    req = {"model": c["model"], "messages": [{"role": "user", "content": c["prompt"]}]}
    if c["kind"] == "stream":
        req["stream"] = True
    st, h, body = post("/chat/completions", req)
    if c["kind"] == "stream":
        assert h.get("content-type", "").startswith("text/event-stream"), h
        text, usage = sse(body)
    else:
        j = json.loads(body)
        text, usage = j["choices"][0]["message"]["content"], j.get("usage")
    out.append({"status": st, "reply": text,
                "prompt": usage["prompt_tokens"] if usage else None,
                "completion": usage["completion_tokens"] if usage else None})
print(json.dumps(out))
"#;

#[test]
fn calls_are_charged_exactly_from_the_upstreams_usage() {
    need_root!();
    let dir = scratch("doors-charge");
    let up = Upstream::start(&dir, &[]);
    let policy = gateway_policy(&dir, "policy", &up, "", "");
    // (kind, model, prompt or embedding inputs)
    let calls = serde_json::json!([
        {"kind": "chat", "model": "fake-small", "prompt": "summarize the state of the session"},
        {"kind": "chat", "model": "fake-large", "prompt": "one two three four five six seven eight nine ten eleven"},
        {"kind": "chat", "model": "fake-small", "prompt": "hi"},
        {"kind": "stream", "model": "fake-small", "prompt": "stream me a short answer please now"},
        {"kind": "stream", "model": "fake-large", "prompt": "alpha beta gamma"},
        {"kind": "embeddings", "model": "fake-large", "input": ["embed these four words", "and these three", "x"]},
    ]);
    let script = format!("{PY_PRELUDE}{CHARGE_SCRIPT}");
    let (r, _) = run_py(&[], &policy, &[], &script, &[&calls.to_string()]);
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert_eq!(r.report["budget_exceeded"], Value::Null, "{}", ctx(&r));
    let got: Vec<Value> =
        serde_json::from_str(r.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", ctx(&r)));
    let calls = calls.as_array().unwrap();
    assert_eq!(got.len(), calls.len());

    // The expected charge, from the fake upstream's token rule, per call and in total.
    let mut expected = 0.0;
    for (c, g) in calls.iter().zip(&got) {
        assert_eq!(g["status"], 200, "{c}: {g}");
        let model = c["model"].as_str().unwrap();
        let (prompt, completion) = if c["kind"] == "embeddings" {
            let inputs = c["input"].as_array().unwrap();
            assert_eq!(g["vectors"], inputs.len(), "{c}: {g}");
            (inputs.iter().map(|i| words(i.as_str().unwrap())).sum(), 0)
        } else {
            let p = c["prompt"].as_str().unwrap();
            let reply = fake_reply(p);
            // The streamed chunks reassemble to exactly the reply: passed through whole.
            assert_eq!(g["reply"], reply.as_str(), "{c}");
            (words(p), words(&reply))
        };
        // What the task itself received agrees with the rule (the usage chunk of a stream
        // is there because the gateway asked for it).
        assert_eq!(g["prompt"], prompt, "{c}: {g}");
        assert_eq!(g["completion"], completion, "{c}: {g}");
        expected += cost(model, prompt, completion);
    }
    assert!(expected > 0.0);
    let charged = r.report["usage"]["api_cost_usd"].as_f64().unwrap();
    assert_close(charged, expected, "usage.api_cost_usd");
    assert_eq!(
        up.requests(),
        calls.len() as u64,
        "every call reached the upstream once"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------
// 2. Overspending kills the run.
// ---------------------------------------------------------------------------------------

const LOOP_SCRIPT: &str = r#"
body = {"model": "fake-small", "messages": [{"role": "user", "content": sys.argv[1]}]}
for i in range(int(sys.argv[2])):
    st, h, b = post("/chat/completions", body)
    print("CALL", i, st, flush=True)
print("DONE", flush=True)
"#;

#[test]
fn a_blown_api_cost_budget_kills_the_run_promptly_and_later_calls_get_402() {
    need_root!();
    const MAX_CALLS: u64 = 500;
    let dir = scratch("doors-overspend");
    let up = Upstream::start(&dir, &[]);
    let policy = gateway_policy(&dir, "policy", &up, "", "");
    let prompt = "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9";
    let per_call = cost("fake-small", words(prompt), words(&fake_reply(prompt)));
    let budget = 0.0003;
    // The first call whose charge takes the spend over the budget (sequential calls).
    let crossing = (1..=MAX_CALLS)
        .find(|k| *k as f64 * per_call > budget)
        .unwrap();
    assert!(
        crossing > 1 && crossing < 20,
        "budget and prices chosen badly: {crossing}"
    );
    let script = format!("{PY_PRELUDE}{LOOP_SCRIPT}");
    let (r, took) = run_py(
        &[],
        &policy,
        &["--api-cost", &budget.to_string()],
        &script,
        &[prompt, &MAX_CALLS.to_string()],
    );
    assert_eq!(r.code, 137, "{}", ctx(&r));
    assert_eq!(r.budget().as_deref(), Some("api_cost"), "{}", ctx(&r));
    assert!(r.stderr.contains("api_cost"), "{}", ctx(&r));
    assert_close(
        r.report["limits"]["api_cost_usd"].as_f64().unwrap(),
        budget,
        "limits.api_cost_usd",
    );
    let charged = r.report["usage"]["api_cost_usd"].as_f64().unwrap();
    assert!(charged > budget, "{}", ctx(&r));
    assert_close(charged, crossing as f64 * per_call, "usage.api_cost_usd");
    // Not one call beyond the crossing one reached the upstream.
    assert_eq!(up.requests(), crossing, "{}", ctx(&r));
    // The task's own record: 200 up to the crossing call, 402 for every one after; killed
    // long before its loop could end.
    let statuses: Vec<u64> = r
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("CALL "))
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    assert!(
        !r.stdout.contains("DONE"),
        "the loop ran to its end: {}",
        ctx(&r)
    );
    assert!(
        statuses.len() + 1 >= crossing as usize,
        "fewer calls seen than reached the upstream: {}",
        ctx(&r)
    );
    assert!(
        (statuses.len() as u64) < MAX_CALLS / 4,
        "killed too late: {} calls made",
        statuses.len()
    );
    for (i, s) in statuses.iter().enumerate() {
        let want = if (i as u64) < crossing { 200 } else { 402 };
        assert_eq!(*s, want, "call {i}: {}", ctx(&r));
    }
    assert!(took < Duration::from_secs(30), "took {took:?}");
    eprintln!(
        "overspend: {} calls made ({} refused with 402) in {:.3} s of wall",
        statuses.len(),
        statuses.iter().filter(|s| **s == 402).count(),
        r.report["usage"]["wall_s"].as_f64().unwrap_or(0.0)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------
// 3. The credentials never appear inside.
// ---------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------
// 4. Unknown models are refused and never forwarded.
// ---------------------------------------------------------------------------------------

const UNKNOWN_SCRIPT: &str = r#"
out = []
for path, req in [
    ("/chat/completions", {"model": "gpt-unpriced", "messages": [{"role": "user", "content": "hello"}]}),
    ("/chat/completions", {"model": "gpt-unpriced", "stream": True,
                           "messages": [{"role": "user", "content": "hello"}]}),
    ("/embeddings", {"model": "gpt-unpriced", "input": "hello"}),
    ("/chat/completions", {"model": "fake-small", "messages": [{"role": "user", "content": "hello"}]}),
]:
    st, h, b = post(path, req)
    try:
        j = json.loads(b)
    except ValueError:
        j = None
    out.append({"status": st, "json": j})
print(json.dumps(out))
"#;

#[test]
fn an_unpriced_model_is_refused_with_403_and_never_forwarded() {
    need_root!();
    let dir = scratch("doors-unknown");
    let up = Upstream::start(&dir, &[]);
    let policy = gateway_policy(&dir, "policy", &up, "", "");
    let script = format!("{PY_PRELUDE}{UNKNOWN_SCRIPT}");
    let (r, _) = run_py(&[], &policy, &[], &script, &[]);
    assert_eq!(r.code, 0, "{}", ctx(&r));
    let got: Vec<Value> =
        serde_json::from_str(r.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", ctx(&r)));
    assert_eq!(got.len(), 4);
    for g in &got[..3] {
        assert_eq!(g["status"], 403, "{g}");
        assert_eq!(g["json"]["error"]["code"], "model_not_priced", "{g}");
        assert!(g["json"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("gpt-unpriced"));
    }
    // The control call with a priced model did reach the upstream: it was the only one.
    assert_eq!(got[3]["status"], 200, "{}", got[3]);
    assert_eq!(up.requests(), 1, "an unpriced call reached the upstream");
    let expected = cost("fake-small", 1, words(&fake_reply("hello")));
    assert_close(
        r.report["usage"]["api_cost_usd"].as_f64().unwrap(),
        expected,
        "usage.api_cost_usd (the refused calls are free)",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------
// `fork evaluate`.
// ---------------------------------------------------------------------------------------

impl Eval {
    /// The gateway's call log (JSON lines), which must be a listed artifact.
    fn gateway_calls(&self) -> Vec<Value> {
        let listed = self.verdict["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["path"] == "artifacts/gateway-calls.jsonl");
        assert!(
            listed,
            "gateway-calls.jsonl is not a listed artifact: {}",
            self.ctx()
        );
        std::fs::read_to_string(self.out.join("artifacts/gateway-calls.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// Every record of a call log has the fields the issue names, each priced as the rule says.
fn check_records(records: &[Value]) {
    for r in records {
        for f in [
            "ts",
            "endpoint",
            "model",
            "status",
            "prompt_tokens",
            "completion_tokens",
            "cost_usd",
            "latency_ms",
            "metered",
        ] {
            assert!(
                r.get(f).is_some_and(|v| !v.is_null()),
                "record without {f}: {r}"
            );
        }
        assert_eq!(r["model"], "fake-small", "{r}");
        assert!(r["latency_ms"].as_f64().unwrap() >= 0.0, "{r}");
        let (p, c) = (
            r["prompt_tokens"].as_u64().unwrap(),
            r["completion_tokens"].as_u64().unwrap(),
        );
        if r["status"] == 200 {
            assert_eq!(r["metered"], "usage", "{r}");
            assert!(p > 0 && c > 0, "{r}");
        } else {
            assert_eq!((p, c), (0, 0), "a refused call is free: {r}");
        }
        assert_close(
            r["cost_usd"].as_f64().unwrap(),
            cost("fake-small", p, c),
            "a record's cost_usd",
        );
    }
}

// ---------------------------------------------------------------------------------------
// 5. The demo `summarize` task through the gateway.
// ---------------------------------------------------------------------------------------

#[test]
fn evaluate_summarize_through_the_gateway_approves_and_a_tiny_budget_rejects() {
    need_root!();
    let env = Env::new("doors-summarize");
    let key = fresh_key("demo");
    let up = Upstream::start(&env.dir, &["--require-key", &key]);
    // The demo's gateway-policy.toml, pointed at this test's upstream.
    let policy = env.dir.join("gateway-policy.toml");
    std::fs::write(
        &policy,
        format!(
            "[decision]\nself_reported = \"accept\"\n[budget]\napi_cost = 0.05\n\n[gateway]\nupstream = \"{}\"\n\
             credentials_env = \"FORK_DEMO_API_KEY\"\nport = 8089\n\n\
             [gateway.prices.fake-small]\ninput_per_mtok = 1.5\noutput_per_mtok = 6.0\n",
            up.url()
        ),
    )
    .unwrap();
    let rt = env.runtime("hermes-demo", "");
    let p = policy.to_str().unwrap();
    let keyenv = [("FORK_DEMO_API_KEY", OsStr::new(&key))];

    // APPROVE: the swapped compressor sends fewer prompt tokens for the same summaries.
    let e = evaluate_with(
        &env,
        &patch("swap-compressor"),
        &rt,
        "approve",
        &["--task", "summarize", "--policy", p],
        With {
            vars: &keyenv,
            ..With::default()
        },
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert_eq!(e.verdict["verdict"], "APPROVE", "{}", e.ctx());
    let pt = e.metric("prompt_tokens");
    let (base, patched) = (
        pt["baseline"].as_f64().unwrap(),
        pt["patched"].as_f64().unwrap(),
    );
    assert!(patched > 0.0 && patched < base * 0.99, "{pt}");
    assert!(
        e.summary().contains("prompt_tokens improved"),
        "{}",
        e.ctx()
    );
    assert_eq!(e.metric("summaries")["patched"], 20.0);
    let records = e.gateway_calls();
    check_records(&records);
    // Both sides called through the gateway; every call reached the upstream (which wants
    // the key) and was answered; the log's tokens are what the tasks counted themselves.
    assert_eq!(records.len(), 40, "{}", e.ctx());
    assert!(records.iter().all(|r| r["status"] == 200));
    assert_eq!(up.requests(), 40);
    let logged_prompt: u64 = records
        .iter()
        .map(|r| r["prompt_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(logged_prompt as f64, base + patched);
    let used = e.verdict["budget"]["used"]["api_cost_usd"]
        .as_f64()
        .unwrap();
    assert!(used > 0.0 && used <= 0.05, "{}", e.ctx());
    assert!(e.verdict["budget"]
        .get("exceeded")
        .is_none_or(Value::is_null));
    let log = std::fs::read_to_string(e.out.join("artifacts/gateway-calls.jsonl")).unwrap();
    assert!(!log.contains(&key) && !e.stdout.contains(&key) && !e.stderr.contains(&key));

    // REJECT: a budget the summaries overrun.
    let before = up.requests();
    let limit = 0.001;
    let e = evaluate_with(
        &env,
        &patch("swap-compressor"),
        &rt,
        "reject",
        &[
            "--task",
            "summarize",
            "--policy",
            p,
            "--api-cost",
            &limit.to_string(),
        ],
        With {
            vars: &keyenv,
            ..With::default()
        },
    );
    assert_eq!(e.code, 1, "{}", e.ctx());
    assert_eq!(e.verdict["verdict"], "REJECT", "{}", e.ctx());
    assert!(e.summary().contains("api_cost"), "{}", e.ctx());
    assert_eq!(e.verdict["budget"]["exceeded"], "api_cost", "{}", e.ctx());
    assert_close(
        e.verdict["budget"]["limits"]["api_cost_usd"]
            .as_f64()
            .unwrap(),
        limit,
        "budget.limits.api_cost_usd",
    );
    let used = e.verdict["budget"]["used"]["api_cost_usd"]
        .as_f64()
        .unwrap();
    assert!(used > limit, "{}", e.ctx());
    let records = e.gateway_calls();
    check_records(&records);
    let answered = records.iter().filter(|r| r["status"] == 200).count() as u64;
    assert!((1..20).contains(&answered), "{}", e.ctx());
    assert!(
        records
            .iter()
            .all(|r| r["status"] == 200 || r["status"] == 402),
        "{records:?}"
    );
    // Exactly the answered calls reached the upstream, and they are what was charged.
    assert_eq!(up.requests() - before, answered);
    let spent: f64 = records
        .iter()
        .map(|r| r["cost_usd"].as_f64().unwrap())
        .sum();
    assert_close(used, spent, "budget.used.api_cost_usd against the call log");
}

/// The API-cost limit in the verdict is the evaluation's (one meter for both sides and
/// every repeat), so `budget.used.api_cost_usd` must be the evaluation's spend too: the sum
/// of the call log it ships. It is the meter's reading when the primary (patched) run ended,
/// which leaves out the baseline's calls.
#[test]
fn evaluate_reports_the_evaluations_whole_api_spend() {
    need_root!();
    let env = Env::new("doors-spend");
    let up = Upstream::start(&env.dir, &[]);
    let policy = env.dir.join("gateway-policy.toml");
    std::fs::write(
        &policy,
        format!(
            "[decision]\nself_reported = \"accept\"\n[budget]\napi_cost = 0.05\n\n[gateway]\nupstream = \"{}\"\n\n\
             [gateway.prices.fake-small]\ninput_per_mtok = 1.5\noutput_per_mtok = 6.0\n",
            up.url()
        ),
    )
    .unwrap();
    let rt = env.runtime("hermes-demo", "");
    let e = evaluate(
        &env,
        &patch("swap-compressor"),
        &rt,
        "spend",
        &["--task", "summarize", "--policy", policy.to_str().unwrap()],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    let records = e.gateway_calls();
    assert_eq!(records.len(), 40, "both sides' calls are logged");
    let spent: f64 = records
        .iter()
        .map(|r| r["cost_usd"].as_f64().unwrap())
        .sum();
    let used = e.verdict["budget"]["used"]["api_cost_usd"]
        .as_f64()
        .unwrap();
    assert_close(used, spent, "budget.used.api_cost_usd against the call log");
}

// ---------------------------------------------------------------------------------------
// 6. Localhost forwards through `fork evaluate`.
// ---------------------------------------------------------------------------------------

/// A host loopback service answering "pong-X" to "ping-X", at most `max` connections,
/// until stopped; counts the connections it served.
struct Service {
    port: u16,
    served: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Service {
    fn start(max: usize) -> Service {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        let served = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (n, s) = (served.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(300);
            while !s.load(Ordering::SeqCst)
                && n.load(Ordering::SeqCst) < max
                && Instant::now() < deadline
            {
                match l.accept() {
                    Ok((mut c, _)) => {
                        c.set_nonblocking(false).unwrap();
                        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                        let mut buf = [0u8; 64];
                        if let Ok(k) = c.read(&mut buf) {
                            if let Some(rest) = buf[..k].strip_prefix(b"ping-") {
                                let _ = c.write_all(&[b"pong-", rest].concat());
                            }
                        }
                        n.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Service {
            port,
            served,
            stop,
            thread: Some(thread),
        }
    }
    fn served(&self) -> usize {
        self.served.load(Ordering::SeqCst)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A `[tasks.NAME]` whose command connects to 127.0.0.1:PORT and exits 0 only when the
/// service answers its ping; `forward` is the task's forward list (TOML), if any.
fn service_task(name: &str, port: u16, forward: Option<&str>) -> String {
    let script = format!(
        "import socket, sys\n\
         try:\n    s = socket.create_connection((\"127.0.0.1\", {port}), timeout=10)\n\
         except OSError as e:\n    print(\"cannot connect:\", e)\n    sys.exit(3)\n\
         s.sendall(b\"ping-{name}\")\n\
         got = s.recv(64)\n\
         print(\"got\", got)\n\
         sys.exit(0 if got == b\"pong-{name}\" else 4)\n"
    );
    let mut t = format!("\n[tasks.{name}]\ncommand = [\"python3\", \"-c\", '''{script}''']\n");
    if let Some(f) = forward {
        t.push_str(&format!("forward = {f}\n"));
    }
    t
}

#[test]
fn evaluate_forwards_a_task_level_loopback_service_and_only_that() {
    need_root!();
    let env = Env::new("doors-forward");
    let svc = Service::start(16);
    let addr = format!("127.0.0.1:{}", svc.port);
    let rt = env.runtime(
        "rt-forward",
        &format!(
            "{}{}",
            service_task("needs_service", svc.port, Some(&format!("[\"{addr}\"]"))),
            service_task("needs_service_closed", svc.port, None)
        ),
    );

    // With the forward: the task reaches the host service, APPROVE.
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "open",
        &["--task", "needs_service"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert_eq!(e.verdict["verdict"], "APPROVE", "{}", e.ctx());
    let served = svc.served();
    assert!(served >= 1, "the service saw no connection: {}", e.ctx());
    let log = std::fs::read_to_string(e.out.join("artifacts/output.log")).unwrap();
    assert!(log.contains("pong-needs_service"), "{log}");

    // Without it: the same command cannot reach the service, NEEDS_REVISION.
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "closed",
        &["--task", "needs_service_closed"],
    );
    assert_eq!(e.code, 2, "{}", e.ctx());
    assert_eq!(e.verdict["verdict"], "NEEDS_REVISION", "{}", e.ctx());
    assert_eq!(
        svc.served(),
        served,
        "an unforwarded run reached the host service"
    );
    let log = std::fs::read_to_string(e.out.join("artifacts/output.log")).unwrap();
    assert!(log.contains("cannot connect"), "{log}");

    // A non-loopback forward in fork.toml is bad input naming the entry; nothing runs.
    let bad = env.runtime(
        "rt-bad-forward",
        &service_task("needs_remote", svc.port, Some("[\"10.0.0.1:80\"]")),
    );
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &bad,
        "bad",
        &["--task", "needs_remote"],
    );
    assert_eq!(e.code, 65, "{}", e.ctx());
    assert!(e.stderr.contains("10.0.0.1:80"), "{}", e.ctx());
    assert!(e.stderr.contains("forward"), "{}", e.ctx());
    assert!(!e.out.exists(), "a bundle was written for bad input");
    assert_eq!(svc.served(), served);
}
