//! Unknown models are refused (403) and never forwarded. Item 4 of the proof list in
//! tests/doors.rs.

use super::*;

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
