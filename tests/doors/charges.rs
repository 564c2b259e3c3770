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
