//! What the gateway bounds besides the fields a task sets: a chat call that sets no limit is
//! sent the one it is held at; an image is held at `max_tokens_per_image`, a part with no
//! bound refused; a response of several MiB is metered from its usage without being built
//! whole.

use super::*;

/// The max_tokens / max_completion_tokens the fake upstream's last chat call carried.
async fn last_limits(fake: &Fake) -> Value {
    let v: Value = client()
        .get(format!("http://127.0.0.1:{}/fake/stats", fake.port))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["last_chat_limits"].clone()
}

#[tokio::test]
async fn a_call_that_sets_no_limit_is_sent_the_one_it_is_held_at() {
    let fake = Fake::start(&[]);
    let mut cfg = config(&fake.base(), &[("gpt-test", 1.0, 1.0)]);
    cfg.default_max_tokens = Some(123);
    let rt = start(cfg, None, 1.0).await;
    let c = client();
    let mut req = chat("gpt-test", "no limit set");
    let r = rt.post_chat(&c, &req).await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    assert_eq!(last_limits(&fake).await, json!({"max_tokens": 123}));
    let note = rt.gw.meter().log()[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("the gateway wrote max_tokens = 123 into the call"),
        "{note}"
    );
    // Streamed too, alongside the usage it is made to ask for.
    req["stream"] = json!(true);
    rt.post_chat(&c, &req).await.text().await.unwrap();
    assert_eq!(last_limits(&fake).await, json!({"max_tokens": 123}));
    // A null limit is written over; one the task set goes as it set it.
    for (field, value, seen) in [
        ("max_tokens", json!(null), json!({"max_tokens": 123})),
        (
            "max_completion_tokens",
            json!(null),
            json!({"max_completion_tokens": 123}),
        ),
        ("max_tokens", json!(5), json!({"max_tokens": 5})),
        (
            "max_completion_tokens",
            json!(7),
            json!({"max_completion_tokens": 7}),
        ),
        ("max_tokens", json!(100000), json!({"max_tokens": 100000})),
    ] {
        let mut req = chat("gpt-test", "a limit of its own");
        req[field] = value.clone();
        let r = rt.post_chat(&c, &req).await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        assert_eq!(last_limits(&fake).await, seen, "{field} = {value}");
    }
    let notes: Vec<_> = rt.gw.meter().log().iter().map(|r| r.note.clone()).collect();
    assert!(notes[4..].iter().all(Option::is_none), "{notes:?}");
}

#[tokio::test]
async fn an_upstream_that_refuses_max_tokens_takes_max_completion_tokens() {
    // As OpenAI's reasoning models answer a call that carries max_tokens.
    let fake = Fake::start(&["--refuse-field", "max_tokens"]);
    let cfg = config(&fake.base(), &[("gpt-test", 1.0, 1.0)]);
    let rt = start(cfg.clone(), None, 1.0).await;
    let r = rt.post_chat(&client(), &chat("gpt-test", "hi")).await;
    assert_eq!(r.status(), 400);
    r.bytes().await.unwrap();
    let log = rt.gw.meter().log();
    assert_eq!(log[0].cost_usd, 0.0);
    let note = log[0].note.clone().unwrap_or_default();
    assert!(
        note.contains(&format!(
            "the gateway wrote max_tokens = {DEFAULT_MAX_TOKENS}"
        )) && note.contains("default_max_tokens_field = \"max_completion_tokens\""),
        "{note}"
    );
    let mut cfg = cfg;
    cfg.default_max_tokens_field = Some(LimitField::MaxCompletionTokens);
    let rt = start(cfg, None, 1.0).await;
    let r = rt.post_chat(&client(), &chat("gpt-test", "hi")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        last_limits(&fake).await,
        json!({"max_completion_tokens": DEFAULT_MAX_TOKENS})
    );
}

#[tokio::test]
async fn a_large_deeply_nested_response_is_metered_from_its_usage() {
    // About 4 MiB of small objects, 300 arrays deep, then the usage: the old reader built
    // it whole as a tree on the supervisor, which gave up past 128 levels and estimated.
    let fake = Fake::start(&["--pad-bytes", "4000000", "--pad-depth", "300"]);
    let rt = start(config(&fake.base(), &[("gpt-test", 1.0, 2.0)]), None, 1.0).await;
    let prompt = "one two three";
    let resp = rt.post_chat(&client(), &chat("gpt-test", prompt)).await;
    assert_eq!(resp.status(), 200);
    let got = resp.bytes().await.unwrap();
    assert!(got.len() > 4_000_000, "{} bytes", got.len());
    assert!(got.ends_with(
        b"\"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 6, \"total_tokens\": 9}}"
    ));
    let r = &rt.gw.meter().log()[0];
    assert_eq!(r.metered, "usage", "{:?}", r.note);
    assert_eq!((r.prompt_tokens, r.completion_tokens), (3, 6));
    assert!((rt.gw.meter().spent_usd() - (3.0 + 12.0) / 1e6).abs() < 1e-15);
}

/// A chat call asking for at most 5 tokens, with a text part and `images` images by URL.
fn with_images(images: usize) -> (Value, u64) {
    let img = json!({"type": "image_url", "image_url": {"url": "https://x.test/i.png"}});
    let mut content = vec![json!({"type": "text", "text": "what is in these"})];
    content.extend(std::iter::repeat_n(img, images));
    let v = json!({"model": "gpt-test", "max_tokens": 5,
                   "messages": [{"role": "user", "content": content}]});
    let len = serde_json::to_vec(&v).unwrap().len() as u64;
    (v, len)
}

#[tokio::test]
async fn each_image_is_held_at_max_tokens_per_image() {
    // 1000 USD per million tokens = 0.001 USD per token; each image held at 1000 tokens.
    const PER_IMAGE: u64 = 1000;
    let fake = Fake::start(&["--delay-ms", "600"]);
    let mut cfg = config(&fake.base(), &[("gpt-test", 1000.0, 1000.0)]);
    cfg.max_tokens_per_image = Some(PER_IMAGE);
    let (req, len) = with_images(3);
    let worst = (len + 3 * PER_IMAGE + 5) as f64 * 0.001;

    // Room for the call's worst case: held at it (3 x 1000 tokens and more) while it runs.
    let rt = start(cfg.clone(), None, worst + 0.0005).await;
    let c = client();
    let call = tokio::spawn({
        let (c, url, req) = (c.clone(), rt.url.clone(), req.clone());
        async move {
            let r = c
                .post(format!("{url}/chat/completions"))
                .json(&req)
                .send()
                .await
                .unwrap();
            let st = r.status();
            r.bytes().await.unwrap();
            st
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.gw.meter().held_usd() == 0.0 {
        assert!(Instant::now() < deadline, "the call was never held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let held = rt.gw.meter().held_usd();
    assert!(
        (held - worst).abs() < 1e-9 && held >= 3.0 * PER_IMAGE as f64 * 0.001,
        "held {held}, worst {worst}"
    );
    assert_eq!(call.await.unwrap(), 200);
    assert_eq!(rt.gw.meter().held_usd(), 0.0);

    // A token less than that: refused, the images named in what it may cost.
    let rt = start(cfg, None, worst - 0.001).await;
    let r = rt.post_chat(&c, &req).await;
    assert_eq!(r.status(), 402);
    let msg = r.json::<Value>().await.unwrap()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        msg.contains(&format!(
            "{} prompt tokens (one per request byte, and the gateway's max_tokens_per_image = {PER_IMAGE} for each of its 3 images)",
            len + 3 * PER_IMAGE
        )),
        "{msg}"
    );
    assert_eq!(
        fake.requests().await,
        1,
        "the refused call was not forwarded"
    );
}

#[tokio::test]
async fn a_part_whose_cost_has_no_bound_is_refused() {
    let fake = Fake::start(&[]);
    let rt = start(config(&fake.base(), &[("gpt-test", 1.0, 1.0)]), None, 1.0).await;
    let c = client();
    for part in [
        json!({"type": "file", "file": {"file_id": "file-abc"}}),
        json!({"type": "video_url", "video_url": {"url": "https://x.test/v.mp4"}}),
        json!({"image": "iVBORw0KGgo="}),
    ] {
        let req = json!({"model": "gpt-test", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "and this"}, part]}]});
        let r = rt.post_chat(&c, &req).await;
        assert_eq!(r.status(), 400, "{part}");
        let msg = r.json::<Value>().await.unwrap()["error"]["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(msg.starts_with("messages[0].content[1]: "), "{msg}");
    }
    // Text, images and inline audio pass.
    let req = json!({"model": "gpt-test", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "and this"},
        {"type": "image_url", "image_url": {"url": "https://x.test/i.png"}},
        {"type": "input_audio", "input_audio": {"data": "SUQz", "format": "mp3"}}]}]});
    let r = rt.post_chat(&c, &req).await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    assert_eq!(fake.requests().await, 1);
    let log = rt.gw.meter().log();
    assert_eq!(log.len(), 4);
    assert!(log[..3]
        .iter()
        .all(|r| (r.status, r.metered, r.model.as_str()) == (400, "refused", "gpt-test")));
}
