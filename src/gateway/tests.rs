//! The door end to end: a real gateway on a loopback port in front of the fake upstream
//! (scripts/fake-openai.py), called as a task would; and the fixtures the other test
//! modules of the gateway share.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::net::TcpListener;
use zeroize::Zeroizing;

use super::*;

mod bounds;
mod budget;

/// The supervisor's key in these tests (long enough to be scrubbed from bodies).
pub(super) const KEY: &str = "sk-fork-test-supervisor-0123456789abcdef";

fn script() -> PathBuf {
    // `file!()` is `src/gateway/tests.rs`, relative to the package root (the test's cwd);
    // when the tests run from elsewhere, the manifest directory is the root.
    let root = Path::new(file!())
        .ancestors()
        .nth(3)
        .unwrap_or(Path::new(""));
    let p = root.join("scripts/fake-openai.py");
    if p.exists() {
        p
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fake-openai.py")
    }
}

/// The fake upstream (scripts/fake-openai.py) on a loopback port, killed on drop.
struct Fake {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Fake {
    fn start(args: &[&str]) -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let port_file = dir.path().join("port");
        let child = Command::new("python3")
            .arg(script())
            .args(["--port", "0", "--max-seconds", "120", "--port-file"])
            .arg(&port_file)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("python3 runs scripts/fake-openai.py");
        // Owned by `Fake` at once: its Drop kills and reaps the child on every path.
        let mut fake = Fake {
            child,
            port: 0,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(s) = std::fs::read_to_string(&port_file) {
                if let Ok(port) = s.trim().parse() {
                    fake.port = port;
                    return fake;
                }
            }
            assert!(Instant::now() < deadline, "the fake upstream did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// How many /v1 requests reached the upstream.
    async fn requests(&self) -> u64 {
        let v: Value = client()
            .get(format!("http://127.0.0.1:{}/fake/stats", self.port))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["requests"].as_u64().unwrap()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A config for `upstream` pricing `(model, input, output)` per million tokens.
pub(super) fn config(upstream: &str, prices: &[(&str, f64, f64)]) -> GatewayConfig {
    GatewayConfig {
        upstream: upstream.into(),
        credentials_env: None,
        credentials_file: None,
        prices: prices
            .iter()
            .map(|(m, i, o)| {
                (
                    m.to_string(),
                    Price {
                        input_per_mtok: *i,
                        output_per_mtok: *o,
                    },
                )
            })
            .collect(),
        port: None,
        timeout: Some("30s".into()),
        default_max_tokens: None,
        default_max_tokens_field: None,
        max_tokens_per_image: None,
    }
}

/// The task's HTTP client.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

struct Running {
    gw: Arc<Gateway>,
    url: String,
    serve: tokio::task::JoinHandle<()>,
}

impl Running {
    /// POSTs `body` to the gateway's chat endpoint as the task would (panics when the
    /// request cannot be sent at all).
    async fn post_chat(&self, c: &reqwest::Client, body: &Value) -> reqwest::Response {
        c.post(format!("{}/chat/completions", self.url))
            .json(body)
            .send()
            .await
            .unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.serve.abort();
    }
}

async fn start(cfg: GatewayConfig, key: Option<&str>, budget: f64) -> Running {
    let gw = Gateway::new(
        cfg,
        key.map(|k| Zeroizing::new(k.to_string())),
        Meter::new(budget),
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let serve = tokio::spawn(gw.clone().serve(listener));
    Running {
        gw,
        url: format!("http://127.0.0.1:{port}/v1"),
        serve,
    }
}

fn chat(model: &str, prompt: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": prompt}]})
}

fn words(s: &str) -> u64 {
    s.split_whitespace().count() as u64
}

#[tokio::test]
async fn non_streaming_chat_is_charged_exactly_from_usage() {
    let fake = Fake::start(&[]);
    let rt = start(config(&fake.base(), &[("gpt-test", 2.5, 10.0)]), None, 1.0).await;
    let prompt = "one two three four five six seven";
    let resp = rt.post_chat(&client(), &chat("gpt-test", prompt)).await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    let reply = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(reply, "fake reply to: one two three four five");
    let (p, c) = (words(prompt), words(reply));
    assert_eq!((p, c), (7, 8));
    assert_eq!(body["usage"]["prompt_tokens"], p);
    assert_eq!(body["usage"]["completion_tokens"], c);

    let log = rt.gw.meter().log();
    assert_eq!(log.len(), 1);
    let r = &log[0];
    assert_eq!((r.prompt_tokens, r.completion_tokens), (7, 8));
    assert_eq!(r.metered, "usage");
    assert_eq!((r.status, r.stream), (200, false));
    assert_eq!(r.model, "gpt-test");
    assert_eq!(r.endpoint, "/v1/chat/completions");
    // 7 * 2.5 / 1e6 + 8 * 10 / 1e6 = 97.5e-6 USD
    assert!((r.cost_usd - 97.5e-6).abs() < 1e-15, "{}", r.cost_usd);
    assert!((rt.gw.meter().spent_usd() - 97.5e-6).abs() < 1e-15);
    assert_eq!(rt.gw.meter().tokens(), (7, 8));
    assert!(!rt.gw.meter().exceeded());
    assert_eq!(fake.requests().await, 1);
}

#[tokio::test]
async fn streaming_chat_passes_chunks_as_they_come_and_is_charged_from_the_usage_chunk() {
    let fake = Fake::start(&["--chunk-delay-ms", "150"]);
    let rt = start(config(&fake.base(), &[("gpt-test", 1.0, 4.0)]), None, 1.0).await;
    // The task even asks for no usage: the gateway asks for it anyway.
    let req = json!({"model": "gpt-test", "stream": true,
                     "stream_options": {"include_usage": false},
                     "messages": [{"role": "user", "content": "a b c d e"}]});
    let t0 = Instant::now();
    let mut resp = rt.post_chat(&client(), &req).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let mut raw = Vec::new();
    let mut first_chunk = None;
    while let Some(chunk) = resp.chunk().await.unwrap() {
        first_chunk.get_or_insert(t0.elapsed());
        raw.extend_from_slice(&chunk);
    }
    let end = t0.elapsed();
    let first = first_chunk.unwrap();
    // 8 words, 150 ms apart: the first must reach the task long before the last.
    assert!(
        first + Duration::from_millis(500) < end,
        "not streamed: first chunk at {first:?}, end at {end:?}"
    );
    let text = String::from_utf8(raw).unwrap();
    let mut content = String::new();
    let mut usage = None;
    let mut done = false;
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        if let Some(d) = v["choices"][0]["delta"]["content"].as_str() {
            content.push_str(d);
        }
        if v["usage"].is_object() {
            usage = Some(v["usage"].clone());
        }
    }
    assert!(done, "the [DONE] line was passed through");
    assert_eq!(content, "fake reply to: a b c d e");
    let usage = usage.expect("the final usage chunk reached the task");
    assert_eq!(usage["prompt_tokens"], 5);
    assert_eq!(usage["completion_tokens"], 8);
    let log = rt.gw.meter().log();
    assert_eq!(log.len(), 1);
    assert!(log[0].stream);
    assert_eq!(log[0].metered, "usage");
    assert_eq!((log[0].prompt_tokens, log[0].completion_tokens), (5, 8));
    assert!((rt.gw.meter().spent_usd() - (5.0 * 1.0 + 8.0 * 4.0) / 1e6).abs() < 1e-15);
}

#[tokio::test]
async fn embeddings_are_charged() {
    let fake = Fake::start(&[]);
    let rt = start(
        config(&fake.base(), &[("embed-test", 0.02, 0.0)]),
        None,
        1.0,
    )
    .await;
    let resp = client()
        .post(format!("{}/embeddings", rt.url))
        .json(&json!({"model": "embed-test", "input": ["alpha beta", "gamma"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["data"].as_array().unwrap().len(), 2);
    let log = rt.gw.meter().log();
    assert_eq!((log[0].prompt_tokens, log[0].completion_tokens), (3, 0));
    assert_eq!(log[0].endpoint, "/v1/embeddings");
    assert!((rt.gw.meter().spent_usd() - 3.0 * 0.02 / 1e6).abs() < 1e-18);
}

#[tokio::test]
async fn refusals_are_never_forwarded() {
    let fake = Fake::start(&[]);
    let rt = start(
        config(
            &fake.base(),
            &[("gpt-test", 1.0, 1.0), ("embed-test", 0.1, 0.0)],
        ),
        None,
        1.0,
    )
    .await;
    let c = client();
    let post = |path: &str, body: Vec<u8>| {
        c.post(format!("{}{path}", rt.url))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    // An unpriced model.
    let r = post(
        "/chat/completions",
        chat("gpt-unpriced", "hi").to_string().into_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 403);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["type"], "fork_gateway");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("model gpt-unpriced is not priced in the policy"),
        "{msg}"
    );
    // No model, not JSON, not an object, too large.
    let r = post("/chat/completions", br#"{"messages": []}"#.to_vec())
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = post("/embeddings", b"not json".to_vec()).await.unwrap();
    assert_eq!(r.status(), 400);
    let r = post("/embeddings", b"[1, 2]".to_vec()).await.unwrap();
    assert_eq!(r.status(), 400);
    let mut big = br#"{"model": "gpt-test", "pad": ""#.to_vec();
    big.resize(MAX_REQUEST_BYTES + 1024, b'x');
    big.extend_from_slice(b"\"}");
    let r = post("/chat/completions", big).await.unwrap();
    assert_eq!(r.status(), 413);
    // Unknown endpoints and methods.
    let r = post(
        "/completions",
        chat("gpt-test", "hi").to_string().into_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["type"],
        "fork_gateway"
    );
    let r = c
        .get(format!("{}/chat/completions", rt.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(
        fake.requests().await,
        0,
        "nothing refused reached the upstream"
    );
    let log = rt.gw.meter().log();
    assert_eq!(log.len(), 7);
    assert!(log
        .iter()
        .all(|r| r.metered == "refused" && r.cost_usd == 0.0));
    assert_eq!(log[0].model, "gpt-unpriced");
    assert_eq!(rt.gw.meter().spent_usd(), 0.0);

    // The models are answered locally.
    let m: Value = c
        .get(format!("{}/models", rt.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = m["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["embed-test", "gpt-test"]);
    let r = c
        .get(format!("{}/models/gpt-test", rt.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .get(format!("{}/models/gpt-unpriced", rt.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(fake.requests().await, 0);

    // The same endpoint without /v1 is forwarded.
    let base = rt.url.trim_end_matches("/v1");
    let r = c
        .post(format!("{base}/chat/completions"))
        .json(&chat("gpt-test", "hello"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(fake.requests().await, 1);
}

#[tokio::test]
async fn a_body_naming_its_model_twice_is_refused() {
    // The gateway would meter one model and the upstream might run the other.
    let fake = Fake::start(&[]);
    let rt = start(
        config(&fake.base(), &[("cheap", 0.1, 0.1), ("dear", 100.0, 100.0)]),
        None,
        1.0,
    )
    .await;
    let body =
        r#"{"model": "dear", "model": "cheap", "messages": [{"role": "user", "content": "hi"}]}"#;
    let r = client()
        .post(format!("{}/chat/completions", rt.url))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let msg = r.json::<Value>().await.unwrap()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(msg.contains("duplicate field `model`"), "{msg}");
    assert_eq!(fake.requests().await, 0);
}

#[tokio::test]
async fn the_key_is_added_the_tasks_credentials_are_not_and_nothing_leaks_back() {
    let fake = Fake::start(&["--require-key", KEY, "--echo-headers"]);
    let rt = start(
        config(&fake.base(), &[("gpt-test", 1.0, 1.0)]),
        Some(KEY),
        1.0,
    )
    .await;
    let c = client();
    let resp = c
        .post(format!("{}/chat/completions", rt.url))
        .header("authorization", "Bearer stolen")
        .header("proxy-authorization", "Basic c3RvbGVu")
        .header("cookie", "session=stolen")
        .header("x-custom", "private")
        .json(&chat("gpt-test", "show me the headers"))
        .send()
        .await
        .unwrap();
    // --require-key passed: the configured key reached the upstream, not the task's.
    assert_eq!(resp.status(), 200);
    for (name, value) in resp.headers() {
        let v = String::from_utf8_lossy(value.as_bytes());
        assert!(!v.contains(KEY), "header {name} carries the key");
        assert!(
            RESPONSE_HEADERS.contains(&name.as_str())
                || name == "content-length"
                || name == "date"
                || name == "transfer-encoding",
            "header {name} should not have been passed"
        );
    }
    assert!(resp.headers().get("set-cookie").is_none());
    assert!(resp.headers().get("x-echo-authorization").is_none());
    assert!(resp.headers().get("x-request-id").is_some());
    let text = resp.text().await.unwrap();
    let body: Value = serde_json::from_str(&text).unwrap();
    let echoed = body["choices"][0]["message"]["content"].as_str().unwrap();
    // The upstream saw the key (it echoes it; the gateway scrubs the echo) and
    // none of the task's credentials or unlisted headers.
    assert!(echoed.contains(&format!("Bearer {REDACTED}")), "{echoed}");
    assert!(!text.contains(KEY));
    for leaked in [
        "stolen",
        "c3RvbGVu",
        "cookie",
        "proxy-authorization",
        "private",
        "x-custom",
    ] {
        assert!(
            !echoed.to_lowercase().contains(leaked),
            "{leaked} reached the upstream: {echoed}"
        );
    }

    // Streamed, the echo is scrubbed too.
    let mut req = chat("gpt-test", "stream the headers");
    req["stream"] = json!(true);
    let text = rt.post_chat(&c, &req).await.text().await.unwrap();
    assert!(text.contains(REDACTED) && !text.contains(KEY));

    // Nor in the log, nor in the gateway's Debug.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls.jsonl");
    rt.gw.write_log(&log).unwrap();
    assert!(!std::fs::read_to_string(&log).unwrap().contains(KEY));
    assert!(!format!("{:?}", rt.gw).contains(KEY));
    assert_eq!(rt.gw.meter().log().len(), 2);
    assert!(rt.gw.meter().log().iter().all(|r| r.metered == "usage"));

    // Without configured credentials, nothing is added and the task's still do not pass.
    let open = Fake::start(&["--echo-headers"]);
    let rt = start(config(&open.base(), &[("gpt-test", 1.0, 1.0)]), None, 1.0).await;
    let v: Value = c
        .post(format!("{}/chat/completions", rt.url))
        .header("authorization", "Bearer stolen")
        .header("cookie", "session=stolen")
        .json(&chat("gpt-test", "anything"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let echoed = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        echoed.contains("\"content-type\": \"application/json\""),
        "{echoed}"
    );
    assert!(
        !echoed.contains("Authorization") && !echoed.contains("stolen"),
        "{echoed}"
    );
}

#[tokio::test]
async fn upstream_errors_are_passed_free_and_logged() {
    // Without the key, the upstream refuses: 401 passed through, nothing charged.
    let fake = Fake::start(&["--require-key", KEY]);
    let rt = start(config(&fake.base(), &[("gpt-test", 1.0, 1.0)]), None, 1.0).await;
    let r = rt.post_chat(&client(), &chat("gpt-test", "hi")).await;
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "invalid_api_key"
    );
    let log = rt.gw.meter().log();
    assert_eq!((log[0].status, log[0].cost_usd), (401, 0.0));
    assert!(log[0].note.as_deref().unwrap().contains("401"));
    assert_eq!(rt.gw.meter().spent_usd(), 0.0);

    // An upstream nobody listens on: 502, free, and the key is nowhere in the answer.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let rt = start(
        config(
            &format!("http://127.0.0.1:{port}/v1"),
            &[("gpt-test", 1.0, 1.0)],
        ),
        Some(KEY),
        1.0,
    )
    .await;
    let r = rt.post_chat(&client(), &chat("gpt-test", "hi")).await;
    assert_eq!(r.status(), 502);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("could not be reached") && !text.contains(KEY),
        "{text}"
    );
    assert_eq!(rt.gw.meter().spent_usd(), 0.0);
    assert_eq!(rt.gw.meter().log()[0].status, 502);
}

#[tokio::test]
async fn a_response_without_usage_is_charged_an_estimate() {
    let fake = Fake::start(&["--no-usage"]);
    let rt = start(config(&fake.base(), &[("gpt-test", 3.0, 7.0)]), None, 1.0).await;
    let body = chat("gpt-test", "no usage here please")
        .to_string()
        .into_bytes();
    let resp = client()
        .post(format!("{}/chat/completions", rt.url))
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let got = resp.bytes().await.unwrap();
    assert!(serde_json::from_slice::<Value>(&got)
        .unwrap()
        .get("usage")
        .is_none());
    let r = &rt.gw.meter().log()[0];
    assert_eq!(r.metered, "estimated");
    // The request as forwarded: with the max_tokens the gateway writes into a call that
    // sets none.
    let sent = body.len() + format!("\"max_tokens\":{DEFAULT_MAX_TOKENS},").len();
    let (p, c) = ((sent as u64).div_ceil(3), (got.len() as u64).div_ceil(3));
    assert_eq!((r.prompt_tokens, r.completion_tokens), (p, c));
    assert!((r.cost_usd - (p as f64 * 3.0 + c as f64 * 7.0) / 1e6).abs() < 1e-15);
    assert!(r.note.as_deref().unwrap().contains("estimate"));

    // Streamed without a usage chunk: estimated as well.
    let mut req = chat("gpt-test", "stream without usage");
    req["stream"] = json!(true);
    let resp = rt.post_chat(&client(), &req).await;
    let text = resp.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"));
    let r = &rt.gw.meter().log()[1];
    assert_eq!((r.metered, r.stream), ("estimated", true));
    assert_eq!(r.completion_tokens, (text.len() as u64).div_ceil(3));
}

#[tokio::test]
async fn the_call_log_is_json_lines_with_every_field() {
    let fake = Fake::start(&[]);
    let rt = start(config(&fake.base(), &[("gpt-test", 1.0, 2.0)]), None, 1.0).await;
    let c = client();
    for model in ["gpt-test", "nope"] {
        rt.post_chat(&c, &chat(model, "log me"))
            .await
            .bytes()
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.jsonl");
    rt.gw.write_log(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    for l in &lines {
        let o = l.as_object().unwrap();
        for f in [
            "ts",
            "endpoint",
            "model",
            "stream",
            "status",
            "prompt_tokens",
            "completion_tokens",
            "cost_usd",
            "latency_ms",
            "metered",
            "note",
        ] {
            assert!(o.contains_key(f), "field {f} missing in {l}");
        }
        assert!(humantime::parse_rfc3339(l["ts"].as_str().unwrap()).is_ok());
        assert!(l["latency_ms"].as_f64().unwrap() >= 0.0);
    }
    assert_eq!(lines[0]["metered"], "usage");
    assert_eq!(lines[0]["status"], 200);
    assert_eq!(lines[0]["prompt_tokens"], 2);
    assert_eq!(lines[1]["metered"], "refused");
    assert_eq!(lines[1]["model"], "nope");
    assert_eq!(lines[1]["status"], 403);
}

#[tokio::test]
async fn aborting_serve_closes_the_door() {
    let fake = Fake::start(&[]);
    let mut rt = start(config(&fake.base(), &[("gpt-test", 1.0, 1.0)]), None, 1.0).await;
    let r = client()
        .get(format!("{}/models", rt.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    rt.serve.abort();
    assert!((&mut rt.serve).await.unwrap_err().is_cancelled());
    // The listener went with the serve task: a fresh connection is refused.
    let fresh = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    assert!(fresh
        .get(format!("{}/models", rt.url))
        .send()
        .await
        .is_err());
}
