//! What the gateway bounds besides the fields a task sets: a response of several MiB is
//! metered from its usage without being built whole.

use super::*;

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
