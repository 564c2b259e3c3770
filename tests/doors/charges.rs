//! Calls are charged correctly (non-streaming, streaming and embeddings, two models at
//! different prices), and overspending kills the run (`api_cost`, exit 137): any later call
//! gets a 402. Items 1 and 2 of the proof list in tests/doors.rs.

use super::*;

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

const LOOP_SCRIPT: &str = r#"
body = {"model": "fake-small", "messages": [{"role": "user", "content": sys.argv[1]}],
        "max_tokens": int(sys.argv[3])}
assert len(json.dumps(body)) == int(sys.argv[4]), len(json.dumps(body))
for i in range(int(sys.argv[2])):
    st, h, b = post("/chat/completions", body)
    print("CALL", i, st, flush=True)
print("DONE", flush=True)
"#;

/// The body a script sends for `prompt` with `max_tokens` (as Python's json.dumps writes it).
fn capped_body(prompt: &str, max_tokens: u64) -> String {
    format!(
        r#"{{"model": "fake-small", "messages": [{{"role": "user", "content": "{prompt}"}}], "max_tokens": {max_tokens}}}"#
    )
}

#[test]
fn a_blown_api_cost_budget_kills_the_run_promptly_and_later_calls_get_402() {
    need_root!();
    const MAX_CALLS: u64 = 500;
    const MAX_TOKENS: u64 = 16;
    let dir = scratch("doors-overspend");
    let up = Upstream::start(&dir, &[]);
    let policy = gateway_policy(&dir, "policy", &up, "", "");
    let prompt = "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9";
    let per_call = cost("fake-small", words(prompt), words(&fake_reply(prompt)));
    // A call is admitted only while the spend plus its worst case (a prompt token per
    // request byte, MAX_TOKENS completion tokens) fits in the budget.
    let len = capped_body(prompt, MAX_TOKENS).len() as u64;
    let worst = cost("fake-small", len, MAX_TOKENS);
    let budget = 0.0006;
    // The first call (1-based, sequential) that is refused.
    let refused = (1..=MAX_CALLS)
        .find(|k| (*k - 1) as f64 * per_call + worst > budget)
        .unwrap();
    assert!(
        refused > 2 && refused < 20,
        "budget and prices chosen badly: {refused}"
    );
    let answered = refused - 1;
    let script = format!("{PY_PRELUDE}{LOOP_SCRIPT}");
    let (r, took) = run_py(
        &[],
        &policy,
        &["--api-cost", &budget.to_string()],
        &script,
        &[
            prompt,
            &MAX_CALLS.to_string(),
            &MAX_TOKENS.to_string(),
            &len.to_string(),
        ],
    );
    assert_eq!(r.code, 137, "{}", ctx(&r));
    assert_eq!(r.budget().as_deref(), Some("api_cost"), "{}", ctx(&r));
    assert!(r.stderr.contains("api_cost"), "{}", ctx(&r));
    assert_close(
        r.report["limits"]["api_cost_usd"].as_f64().unwrap(),
        budget,
        "limits.api_cost_usd",
    );
    // Never over the budget: the call that would have crossed it was refused.
    let charged = r.report["usage"]["api_cost_usd"].as_f64().unwrap();
    assert!(charged <= budget, "{}", ctx(&r));
    assert_close(charged, answered as f64 * per_call, "usage.api_cost_usd");
    // Not one refused call reached the upstream.
    assert_eq!(up.requests(), answered, "{}", ctx(&r));
    // The task's own record: 200 for the answered calls, 402 for every one after; killed
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
        statuses.len() as u64 >= answered,
        "fewer calls seen than reached the upstream: {}",
        ctx(&r)
    );
    assert!(
        (statuses.len() as u64) < MAX_CALLS / 4,
        "killed too late: {} calls made",
        statuses.len()
    );
    for (i, s) in statuses.iter().enumerate() {
        let want = if (i as u64) < answered { 200 } else { 402 };
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

/// `argv[1]` calls at once, each `{"content": argv[2], "max_tokens": argv[3]}`.
const PARALLEL_SCRIPT: &str = r#"
import threading
body = {"model": "fake-small", "messages": [{"role": "user", "content": sys.argv[2]}],
        "max_tokens": int(sys.argv[3])}
assert len(json.dumps(body)) == int(sys.argv[4]), len(json.dumps(body))
out = []
def call():
    out.append(post("/chat/completions", body)[0])
ts = [threading.Thread(target=call) for _ in range(int(sys.argv[1]))]
[t.start() for t in ts]
[t.join() for t in ts]
print("STATUSES", sorted(out), flush=True)
"#;

#[test]
fn parallel_calls_cannot_overshoot_the_api_cost_budget() {
    need_root!();
    const CALLS: u64 = 6;
    const MAX_TOKENS: u64 = 20;
    let dir = scratch("doors-parallel");
    // Each call takes a second upstream: all six are in flight together.
    let up = Upstream::start(&dir, &["--delay-ms", "1000"]);
    let policy = gateway_policy(&dir, "policy", &up, "", "");
    let prompt = "x y z";
    let len = capped_body(prompt, MAX_TOKENS).len() as u64;
    let worst = cost("fake-small", len, MAX_TOKENS);
    // Room for two calls' worst cases, not three.
    let budget = 2.5 * worst;
    let script = format!("{PY_PRELUDE}{PARALLEL_SCRIPT}");
    let (r, _) = run_py(
        &[],
        &policy,
        &["--api-cost", &format!("{budget:.9}")],
        &script,
        &[
            &CALLS.to_string(),
            prompt,
            &MAX_TOKENS.to_string(),
            &len.to_string(),
        ],
    );
    // The refused calls exhaust the budget: the run is killed.
    assert_eq!(r.code, 137, "{}", ctx(&r));
    assert_eq!(r.budget().as_deref(), Some("api_cost"), "{}", ctx(&r));
    assert_eq!(up.requests(), 2, "only two calls fit: {}", ctx(&r));
    // The two admitted calls finish within the grace the run's end gives them: charged
    // exactly what they used, within the budget.
    let charged = r.report["usage"]["api_cost_usd"].as_f64().unwrap();
    assert!(charged <= budget, "{}", ctx(&r));
    let per_call = cost("fake-small", words(prompt), words(&fake_reply(prompt)));
    assert_close(charged, 2.0 * per_call, "usage.api_cost_usd");
    let _ = std::fs::remove_dir_all(&dir);
}
