//! Localhost forwards through `fork evaluate`: a task-level forward reaches a host loopback
//! service, without it the task cannot, and a non-loopback entry is refused. Item 6 of the
//! proof list in tests/doors.rs.

use super::*;

/// A host loopback service answering "pong-X" to "ping-X", at most `max` connections,
/// until stopped; counts the connections it served.
struct Service {
    port: u16,
    served: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Service {
    fn start(max: usize) -> Service {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        let served = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (n, s) = (served.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(300);
            while !s.load(Ordering::SeqCst)
                && n.load(Ordering::SeqCst) < max
                && Instant::now() < deadline
            {
                match l.accept() {
                    Ok((mut c, _)) => {
                        c.set_nonblocking(false).unwrap();
                        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                        let mut buf = [0u8; 64];
                        if let Ok(k) = c.read(&mut buf) {
                            if let Some(rest) = buf[..k].strip_prefix(b"ping-") {
                                let _ = c.write_all(&[b"pong-", rest].concat());
                            }
                        }
                        n.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Service {
            port,
            served,
            stop,
            thread: Some(thread),
        }
    }
    fn served(&self) -> usize {
        self.served.load(Ordering::SeqCst)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A `[tasks.NAME]` whose command connects to 127.0.0.1:PORT and exits 0 only when the
/// service answers its ping; `forward` is the task's forward list (TOML), if any.
fn service_task(name: &str, port: u16, forward: Option<&str>) -> String {
    let script = format!(
        "import socket, sys\n\
         try:\n    s = socket.create_connection((\"127.0.0.1\", {port}), timeout=10)\n\
         except OSError as e:\n    print(\"cannot connect:\", e)\n    sys.exit(3)\n\
         s.sendall(b\"ping-{name}\")\n\
         got = s.recv(64)\n\
         print(\"got\", got)\n\
         sys.exit(0 if got == b\"pong-{name}\" else 4)\n"
    );
    let mut t = format!("\n[tasks.{name}]\ncommand = [\"python3\", \"-c\", '''{script}''']\n");
    if let Some(f) = forward {
        t.push_str(&format!("forward = {f}\n"));
    }
    t
}

#[test]
fn evaluate_forwards_a_task_level_loopback_service_and_only_that() {
    need_root!();
    let env = Env::new("doors-forward");
    let svc = Service::start(16);
    let addr = format!("127.0.0.1:{}", svc.port);
    let rt = env.runtime(
        "rt-forward",
        &format!(
            "{}{}",
            service_task("needs_service", svc.port, Some(&format!("[\"{addr}\"]"))),
            service_task("needs_service_closed", svc.port, None)
        ),
    );

    // With the forward: the task reaches the host service, APPROVE.
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "open",
        &["--task", "needs_service"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert_eq!(e.verdict["verdict"], "APPROVE", "{}", e.ctx());
    let served = svc.served();
    assert!(served >= 1, "the service saw no connection: {}", e.ctx());
    let log = std::fs::read_to_string(e.out.join("artifacts/output.log")).unwrap();
    assert!(log.contains("pong-needs_service"), "{log}");

    // Without it: the same command cannot reach the service, NEEDS_REVISION.
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &rt,
        "closed",
        &["--task", "needs_service_closed"],
    );
    assert_eq!(e.code, 2, "{}", e.ctx());
    assert_eq!(e.verdict["verdict"], "NEEDS_REVISION", "{}", e.ctx());
    assert_eq!(
        svc.served(),
        served,
        "an unforwarded run reached the host service"
    );
    let log = std::fs::read_to_string(e.out.join("artifacts/output.log")).unwrap();
    assert!(log.contains("cannot connect"), "{log}");

    // A non-loopback forward in fork.toml is bad input naming the entry; nothing runs.
    let bad = env.runtime(
        "rt-bad-forward",
        &service_task("needs_remote", svc.port, Some("[\"10.0.0.1:80\"]")),
    );
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &bad,
        "bad",
        &["--task", "needs_remote"],
    );
    assert_eq!(e.code, 65, "{}", e.ctx());
    assert!(e.stderr.contains("10.0.0.1:80"), "{}", e.ctx());
    assert!(e.stderr.contains("forward"), "{}", e.ctx());
    assert!(!e.out.exists(), "a bundle was written for bad input");
    assert_eq!(svc.served(), served);
}
