//! Calls the task does not wait for are charged all the same: a call it hangs up on before
//! the response head, and calls still in flight when the run ends. The fake upstream
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
