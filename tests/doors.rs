//! The sandbox's two doors (issue 4's proof list), with the real binary:
//!
//! 1. model calls through the metered gateway are charged exactly (non-streaming, streaming
//!    and embeddings, two models at different prices);
//! 2. an API-cost budget blown by a calling loop (or by parallel calls) kills the run
//!    promptly (`api_cost`, exit 137): a call whose worst case does not fit in what is left
//!    gets a 402 and never reaches the upstream, as does any call after it, and the spend
//!    never goes over the budget;
//! 3. the credentials never reach the sandbox (environment, readable files, response
//!    headers and bodies), from `credentials_env` and from `credentials_file`;
//! 4. a model the policy does not price is refused (403) and never forwarded;
//! 5. `fork evaluate` of the demo `summarize` task through the gateway: APPROVE with fewer
//!    prompt tokens for swap-compressor, REJECT naming `api_cost` under a tiny budget, with
//!    the call log as a signed artifact;
//! 6. localhost forwards through `fork evaluate`: a task-level forward reaches a host
//!    loopback service, without it the task cannot, and a non-loopback entry is refused;
//! 7. calls the task does not wait for are charged: one it hangs up on before the answer,
//!    ones still in flight when the run ends.
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

// The tests, by subject (declared after the helpers, as in tests/evaluate.rs).
#[path = "doors/charges.rs"]
mod charges;
#[path = "doors/credentials.rs"]
mod credentials;
#[path = "doors/evaluate_gateway.rs"]
mod evaluate_gateway;
#[path = "doors/forwards.rs"]
mod forwards;
#[path = "doors/in_flight.rs"]
mod in_flight;
#[path = "doors/unknown_models.rs"]
mod unknown_models;
