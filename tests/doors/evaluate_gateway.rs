//! `fork evaluate` of the demo `summarize` task through the gateway: APPROVE, REJECT naming
//! `api_cost` under a tiny budget, the call log as a signed artifact, and the evaluation's
//! whole API spend in the verdict. Item 5 of the proof list in tests/doors.rs.

use super::*;

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

    // REJECT: a budget the summaries overrun (a call is admitted only while its worst
    // case, a prompt token per request byte and its max_tokens, fits in what is left).
    let before = up.requests();
    let limit = 0.01;
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
    assert!(used <= limit, "never over the budget: {}", e.ctx());
    let records = e.gateway_calls();
    check_records(&records);
    let answered = records.iter().filter(|r| r["status"] == 200).count() as u64;
    assert!((1..20).contains(&answered), "{}", e.ctx());
    let first_refused = records.iter().find(|r| r["status"] == 402).unwrap();
    assert!(
        first_refused["note"]
            .as_str()
            .unwrap()
            .contains("cannot cover this call"),
        "{first_refused}"
    );
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
