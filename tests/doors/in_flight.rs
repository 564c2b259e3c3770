//! Calls the task does not wait for are charged all the same: a call it hangs up on before
//! the response head, and calls still in flight when the run ends; and a call whose usage
//! cannot be known (the upstream timed out) is charged its worst case. The fake upstream
//! answers after `--delay-ms` (and "bills" whether or not anyone still listens).

use super::*;

/// Sends one chat call on a raw socket and hangs up (or exits) without reading the answer:
/// `argv[1]` the prompt, `argv[2]` max_tokens (0: none), `argv[3]` seconds before hanging
/// up, `argv[4]` seconds to stay alive afterwards. Prints the body's length.
const HANG_UP_SCRIPT: &str = r#"
import json, os, socket, sys, time
port = int(os.environ["FORK_MODEL_URL"].rsplit(":", 1)[1].split("/")[0])
req = {"model": "fake-small", "messages": [{"role": "user", "content": sys.argv[1]}]}
if int(sys.argv[2]) > 0:
    req["max_tokens"] = int(sys.argv[2])
body = json.dumps(req).encode()
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Content-Length: %d\r\n\r\n" % len(body) + body)
time.sleep(float(sys.argv[3]))
print("BODY", len(body), flush=True)
s.close()
time.sleep(float(sys.argv[4]))
"#;

#[test]
fn a_call_the_task_hangs_up_on_before_the_response_head_is_charged() {
    need_root!();
    let dir = scratch("doors-hangup");
    // The upstream answers a second after the call; the task hangs up after 0.3 s and
    // stays alive until well after the answer.
    let up = Upstream::start(&dir, &["--delay-ms", "1000"]);
    let policy = gateway_policy(&dir, "policy", &up, "", "");
    let prompt = "hang up before the answer please";
    let (r, _) = run_py(
        &[],
        &policy,
        &[],
        HANG_UP_SCRIPT,
        &[prompt, "0", "0.3", "2.5"],
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert_eq!(up.requests(), 1, "{}", ctx(&r));
    let charged = r.report["usage"]["api_cost_usd"].as_f64().unwrap();
    assert_close(
        charged,
        cost("fake-small", words(prompt), words(&fake_reply(prompt))),
        "usage.api_cost_usd (the call the task hung up on)",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_call_in_flight_when_the_run_ends_is_charged_what_it_used() {
    need_root!();
    let dir = scratch("doors-run-ends");
    // The task exits 0.2 s into a call the upstream answers after 0.8 s: within the
    // grace the supervisor gives calls in flight when the run ends.
    let up = Upstream::start(&dir, &["--delay-ms", "800"]);
    let policy = gateway_policy(&dir, "policy", &up, "", "");
    let prompt = "the run ends before the answer";
    let (r, _) = run_py(
        &[],
        &policy,
        &[],
        HANG_UP_SCRIPT,
        &[prompt, "0", "0.2", "0"],
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert_eq!(up.requests(), 1, "{}", ctx(&r));
    assert_close(
        r.report["usage"]["api_cost_usd"].as_f64().unwrap(),
        cost("fake-small", words(prompt), words(&fake_reply(prompt))),
        "usage.api_cost_usd (the call in flight when the run ended)",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_call_still_running_after_the_grace_is_charged_its_worst_case() {
    need_root!();
    const MAX_TOKENS: u64 = 40;
    let dir = scratch("doors-worst-case");
    // The upstream takes 8 s, far beyond the grace: the call is charged its worst case,
    // a prompt token per request byte and its max_tokens.
    let up = Upstream::start(&dir, &["--delay-ms", "8000"]);
    let policy = gateway_policy(&dir, "policy", &up, "", "");
    let (r, took) = run_py(
        &[],
        &policy,
        &[],
        HANG_UP_SCRIPT,
        &["still running", &MAX_TOKENS.to_string(), "0.2", "0"],
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert_eq!(up.requests(), 1, "{}", ctx(&r));
    let len: u64 = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("BODY "))
        .unwrap_or_else(|| panic!("no BODY line: {}", ctx(&r)))
        .trim()
        .parse()
        .unwrap();
    assert_close(
        r.report["usage"]["api_cost_usd"].as_f64().unwrap(),
        cost("fake-small", len, MAX_TOKENS),
        "usage.api_cost_usd (the call's worst case)",
    );
    assert!(
        took < Duration::from_secs(7),
        "the run waited for the call: {took:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// One call, its body compact with sorted keys (so the gateway forwards the same bytes even
/// when it rewrites a stream's `stream_options`): `argv[1]` "chat" or "stream",
/// `argv[2]` max_tokens. Prints the status and the body's length.
const TIMEOUT_SCRIPT: &str = r#"
req = {"model": "fake-small", "messages": [{"role": "user", "content": "a slow answer"}],
       "max_tokens": int(sys.argv[2])}
if sys.argv[1] == "stream":
    req["stream"] = True
    req["stream_options"] = {"include_usage": True}
body = json.dumps(req, separators=(",", ":"), sort_keys=True).encode()
r = urllib.request.Request(U + "/chat/completions", data=body,
                           headers={"Content-Type": "application/json"}, method="POST")
try:
    with urllib.request.urlopen(r, timeout=30) as resp:
        st = resp.status
        resp.read()
except urllib.error.HTTPError as e:
    st = e.code
print("RESULT", st, len(body), flush=True)
"#;

#[test]
fn a_call_the_upstream_does_not_finish_within_the_timeout_is_charged_its_worst_case() {
    need_root!();
    const MAX_TOKENS: u64 = 30;
    let dir = scratch("doors-timeout");
    // (the fake's options, the call's kind, the status the task gets): no answer within the
    // 1 s call timeout; a stream whose chunks come 0.7 s apart, cut off by the timeout
    // before its usage.
    for (fake_args, kind, want) in [
        (["--delay-ms", "3000"], "chat", 504),
        (["--chunk-delay-ms", "700"], "stream", 200),
    ] {
        let up = Upstream::start(&dir, &fake_args);
        let policy = gateway_policy(&dir, kind, &up, "timeout = \"1s\"", "");
        let script = format!("{PY_PRELUDE}{TIMEOUT_SCRIPT}");
        let (r, _) = run_py(&[], &policy, &[], &script, &[kind, &MAX_TOKENS.to_string()]);
        assert_eq!(r.code, 0, "{kind}: {}", ctx(&r));
        let result: Vec<u64> = r
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("RESULT "))
            .unwrap_or_else(|| panic!("{kind}: no RESULT: {}", ctx(&r)))
            .split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect();
        assert_eq!(result[0], want, "{kind}: {}", ctx(&r));
        assert_eq!(up.requests(), 1, "{kind}: {}", ctx(&r));
        // A prompt token per request byte, and its max_tokens.
        assert_close(
            r.report["usage"]["api_cost_usd"].as_f64().unwrap(),
            cost("fake-small", result[1], MAX_TOKENS),
            &format!("{kind}: usage.api_cost_usd (the call's worst case)"),
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
