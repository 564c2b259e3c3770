//! Unknown models are refused (403) and never forwarded, and a big body naming one costs
//! the supervisor little memory. Item 4 of the proof list in tests/doors.rs.

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

/// `argv[1]` connections at once, each sending an 8 MiB body `{"model": "gpt-unpriced",
/// "pad": [0,0,...]}` (four million JSON values); prints the statuses.
const BIG_BODY_SCRIPT: &str = r#"
import os, socket, sys, threading
port = int(os.environ["FORK_MODEL_URL"].rsplit(":", 1)[1].split("/")[0])
head = b'{"model":"gpt-unpriced","pad":'
k = ((8 << 20) - len(head) - 3) // 2
body = head + b"[" + b"0," * (k - 1) + b"0]}"
out = []
def one():
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
              b"Connection: close\r\n\r\n" % len(body) + body)
    r = b""
    while True:
        c = s.recv(65536)
        if not c:
            break
        r += c
    out.append(r.split(b"\r\n")[0].decode())
ts = [threading.Thread(target=one) for _ in range(int(sys.argv[1]))]
[t.start() for t in ts]
[t.join() for t in ts]
print("STATUSES", sorted(out), flush=True)
"#;

/// The supervisor's peak resident memory (VmHWM) over a `fork run`, and the run.
fn run_measuring_peak(policy: &Path, script: &str, args: &[&str]) -> (Run, u64) {
    let run_root = scratch("doors-peak");
    let report = run_root.join("report.json");
    let mut child = fork_cmd(&run_root)
        .arg("run")
        .arg("--policy")
        .arg(policy)
        .arg("--report")
        .arg(&report)
        .args(["--", "python3", "-c", script])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fork");
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak_kib = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "fork run did not end within 120 s"
        );
        if let Ok(t) = std::fs::read_to_string(&status_file) {
            if let Some(kib) = t
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak_kib = peak_kib.max(kib);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let r = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        report: std::fs::read(&report)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null),
        run_root: run_root.clone(),
    };
    let _ = std::fs::remove_dir_all(&run_root);
    (r, peak_kib << 10)
}

#[test]
fn big_request_bodies_cost_the_supervisor_little_memory() {
    need_root!();
    let dir = scratch("doors-big-body");
    let up = Upstream::start(&dir, &[]);
    let policy = gateway_policy(&dir, "policy", &up, "", "");
    let (r, peak) = run_measuring_peak(&policy, BIG_BODY_SCRIPT, &["3"]);
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert!(
        r.stdout.contains("STATUSES ['HTTP/1.1 403 Forbidden', 'HTTP/1.1 403 Forbidden', 'HTTP/1.1 403 Forbidden']"),
        "{}",
        ctx(&r)
    );
    assert_eq!(up.requests(), 0);
    // The bodies themselves (8 MiB each, read whole) are the supervisor's to hold; built
    // into JSON values (as they were), one took over 100 MiB more (186 MiB in all, 44 MiB
    // without).
    eprintln!(
        "big bodies: the supervisor's peak resident memory: {} MiB",
        peak >> 20
    );
    assert!(peak > 0, "VmHWM was never read");
    assert!(
        peak < 100 << 20,
        "the supervisor peaked at {} MiB for three 8 MiB bodies",
        peak >> 20
    );
    let _ = std::fs::remove_dir_all(&dir);
}
