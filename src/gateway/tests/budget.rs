//! The API-cost budget at the door: a call is admitted only if its worst case fits, and
//! parallel calls are charged exactly and never overshoot.

use super::*;

/// A chat call asking for at most `max_tokens`, and its body's length.
fn capped_chat(model: &str, prompt: &str, max_tokens: u64) -> (Value, u64) {
    let mut v = chat(model, prompt);
    v["max_tokens"] = json!(max_tokens);
    let len = serde_json::to_vec(&v).unwrap().len() as u64;
    (v, len)
}

#[tokio::test]
async fn a_call_whose_worst_case_does_not_fit_is_refused_and_exhausts_the_budget() {
    let fake = Fake::start(&[]);
    // 1000 USD per million tokens = 0.001 USD per token. A call's worst case is a token per
    // request byte plus its max_tokens; the budget covers one call's worst case and a token.
    let (req, len) = capped_chat("gpt-test", "one two three", 6);
    let worst = (len + 6) as f64 * 0.001;
    let budget = worst + 0.001;
    let rt = start(
        config(&fake.base(), &[("gpt-test", 1000.0, 1000.0)]),
        None,
        budget,
    )
    .await;
    let meter = rt.gw.meter().clone();
    let watcher = tokio::spawn(async move { meter.exceeded_signal().await });
    let c = client();
    let r = rt.post_chat(&c, &req).await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    // 3 prompt + 6 completion tokens at 0.001 USD; nothing is held any more.
    assert!((rt.gw.meter().spent_usd() - 0.009).abs() < 1e-12);
    assert_eq!(rt.gw.meter().held_usd(), 0.0);
    assert!(!rt.gw.meter().exceeded());
    // The same call again: 0.009 spent + its worst case is over the budget.
    let r = rt.post_chat(&c, &req).await;
    assert_eq!(r.status(), 402);
    let msg = r.json::<Value>().await.unwrap()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        msg.contains(&format!(
            "may cost up to {worst:.6} USD ({len} prompt tokens"
        )) && msg.contains("6 completion tokens (its max_tokens)")
            && msg.contains("0.009000 USD is spent"),
        "{msg}"
    );
    tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("exceeded_signal resolved")
        .unwrap();
    assert!(rt.gw.meter().exceeded());
    // Exhausted: even a call that would fit is refused.
    let (small, _) = capped_chat("gpt-test", "x", 1);
    let r = rt.post_chat(&c, &small).await;
    assert_eq!(r.status(), 402);
    assert_eq!(
        fake.requests().await,
        1,
        "the refused calls were not forwarded"
    );
    let log = rt.gw.meter().log();
    assert_eq!(log.len(), 3);
    assert!(log[1..]
        .iter()
        .all(|r| (r.status, r.metered, r.cost_usd) == (402, "refused", 0.0)));
    assert!((rt.gw.meter().spent_usd() - 0.009).abs() < 1e-12);
}

#[tokio::test]
async fn parallel_calls_cannot_overshoot_the_budget() {
    // Each call takes a second upstream; all are made at once.
    let fake = Fake::start(&["--delay-ms", "1000"]);
    let (req, len) = capped_chat("gpt-test", "one two three", 20);
    let price = Price {
        input_per_mtok: 1.0,
        output_per_mtok: 4.0,
    };
    let worst = price.cost(len, 20);
    // Room for three worst cases, not four.
    let budget = 3.5 * worst;
    let rt = start(
        config(&fake.base(), &[("gpt-test", 1.0, 4.0)]),
        None,
        budget,
    )
    .await;
    let c = client();
    let calls = (0..8).map(|_| {
        let r = rt.post_chat(&c, &req);
        async move {
            let r = r.await;
            let st = r.status().as_u16();
            r.bytes().await.unwrap();
            st
        }
    });
    let mut statuses = futures_util::future::join_all(calls).await;
    statuses.sort();
    assert_eq!(statuses, [200, 200, 200, 402, 402, 402, 402, 402]);
    assert_eq!(fake.requests().await, 3);
    // Each answered call: 3 prompt and 6 completion tokens.
    assert!((rt.gw.meter().spent_usd() - 3.0 * price.cost(3, 6)).abs() < 1e-15);
    assert!(rt.gw.meter().spent_usd() <= budget);
    assert_eq!(rt.gw.meter().held_usd(), 0.0);
    assert!(rt.gw.meter().exceeded());
}

#[tokio::test]
async fn parallel_calls_sum_exactly() {
    let fake = Fake::start(&[]);
    let price = Price {
        input_per_mtok: 0.15,
        output_per_mtok: 0.6,
    };
    let rt = start(config(&fake.base(), &[("gpt-test", 0.15, 0.6)]), None, 1.0).await;
    let c = client();
    let calls = (0..20).map(|i| {
        let prompt = vec!["w"; i + 1].join(" ");
        let req = c
            .post(format!("{}/chat/completions", rt.url))
            .json(&chat("gpt-test", &prompt));
        async move {
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200);
            let v: Value = r.json().await.unwrap();
            (
                v["usage"]["prompt_tokens"].as_u64().unwrap(),
                v["usage"]["completion_tokens"].as_u64().unwrap(),
            )
        }
    });
    let usages = futures_util::future::join_all(calls).await;
    let (p, c): (u64, u64) = usages.iter().fold((0, 0), |(a, b), (x, y)| (a + x, b + y));
    assert_eq!(p, (1..=20).sum::<u64>());
    assert_eq!(rt.gw.meter().tokens(), (p, c));
    assert_eq!(rt.gw.meter().spent_usd(), price.cost(p, c));
    assert_eq!(rt.gw.meter().calls(), 20);
    assert_eq!(rt.gw.meter().log().len(), 20);
    assert_eq!(fake.requests().await, 20);
}

#[tokio::test]
async fn the_worst_cases_fields_are_read_strictly() {
    // An upstream that coerces could read `"n": "50"`, `1e5` or `-1` (as "unlimited") where
    // a lenient gateway took the field as absent and held too little: refused, never sent.
    let fake = Fake::start(&[]);
    let rt = start(config(&fake.base(), &[("gpt-test", 1.0, 1.0)]), None, 5.0).await;
    let c = client();
    for (field, value) in [
        ("n", json!("50")),
        ("n", json!(3.0)),
        ("max_tokens", json!(1e5)),
        ("max_tokens", json!(-1)),
        ("max_completion_tokens", json!("100000")),
        ("stream", json!("true")),
        ("stream", json!(1)),
    ] {
        let mut req = chat("gpt-test", "hi");
        req[field] = value.clone();
        let r = rt.post_chat(&c, &req).await;
        assert_eq!(r.status(), 400, "{field} = {value}");
        let msg = r.json::<Value>().await.unwrap()["error"]["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(msg.contains(&format!("`{field}`")), "{msg}");
    }
    // null is absent, and whole numbers pass.
    let mut req = chat("gpt-test", "hi");
    req["n"] = json!(null);
    req["max_tokens"] = json!(5);
    req["stream"] = json!(false);
    assert_eq!(rt.post_chat(&c, &req).await.status(), 200);
    assert_eq!(
        fake.requests().await,
        1,
        "only the well-formed call was sent"
    );
    assert!(!rt.gw.meter().exceeded());
}
