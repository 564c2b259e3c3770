//! The network: loopback only, TCP restricted by Landlock as the policy says, and a policy's
//! forward makes one host loopback service reachable (a forward to another host is refused).

use super::*;

#[test]
fn network_is_loopback_only() {
    need_default_policy!();
    let p = probe_ok("ifaces");
    let text = p.to_string();
    assert!(text.contains("lo"), "{text}");
    assert!(!text.contains("eth") && !text.contains("ens"), "{text}");
    // A host loopback service is unreachable.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let r = probe(&[], &["connect-tcp", &addr]);
    assert_eq!(r.probe()["succeeded"], false, "{}", r.stdout);
    assert!(
        listener.accept().is_err(),
        "the host listener got a connection"
    );
    // UDP to the host's loopback does not arrive either.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let uaddr = udp.local_addr().unwrap().to_string();
    let _ = probe(&[], &["udp-send", &uaddr]);
    let mut buf = [0u8; 64];
    assert!(
        udp.recv(&mut buf).is_err(),
        "a datagram crossed the namespace"
    );
}

#[test]
fn landlock_restricts_tcp_by_policy() {
    need_default_policy!();
    // The default policy refuses TCP bind/connect (Landlock ABI >= 4) inside the sandbox too.
    let r = probe(&[], &["bind-tcp", "0"]);
    let p = r.probe();
    let iso = &r.report["isolation"];
    if iso["landlock_abi"].as_u64().unwrap() < 4 {
        // Kernels 5.13-6.6 have no TCP rules: the ruleset says so, and the network
        // namespace (loopback only) is what still isolates.
        assert_eq!(iso["landlock_enforced"], "partially_enforced", "{iso}");
        assert_eq!(iso["netns"], true, "{iso}");
        return;
    }
    assert_eq!(p["succeeded"], false, "{p}");
    assert_eq!(p["errno"].as_i64(), Some(EACCES), "{p}");
}

/// A policy file: the default one with a `[network]` table replaced.
fn policy_with_network(dir: &std::path::Path, network: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(repo().join("policies/default.toml")).unwrap();
    let start = text.find("[network]").unwrap();
    let end = start + text[start..].find("[seccomp]").unwrap();
    let text = format!(
        "{}[network]\n{network}\n\n{}",
        &text[..start],
        &text[end..].replace(
            "profile = \"seccomp/default.json\"",
            &format!(
                "profile = \"{}\"",
                repo().join("policies/seccomp/default.json").display()
            )
        )
    );
    let p = dir.join("policy.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// Landlock's TCP rules cover IPPROTO_TCP only: a Multipath TCP socket (IPPROTO_MPTCP)
/// bound and connected past them, and without a network namespace it reached a host
/// loopback service. Seccomp allows inet sockets of TCP, UDP and ping only.
#[test]
fn mptcp_sockets_are_refused_with_and_without_a_network_namespace() {
    need_default_policy!();
    assert_denied(&["bind-mptcp", "8080"], EPERM);
    assert_denied(&["connect-mptcp", "127.0.0.1:8080"], EPERM);
    assert_denied(&["connect-mptcp", "[::1]:8080"], EPERM);
    // TCP and UDP sockets, by protocol number too, and IPv6 are still made (bind and
    // connect are Landlock's to refuse); other protocols (here MPTCP, UDP-Lite: both built
    // into the kernel, so no module is asked for even without the filter) are not.
    let script = "import socket\n\
        for fam in (socket.AF_INET, socket.AF_INET6):\n\
        \x20   for ty, protos in ((socket.SOCK_STREAM, (0, 6)), (socket.SOCK_DGRAM, (0, 17))):\n\
        \x20       for p in protos: socket.socket(fam, ty, p).close()\n\
        out = []\n\
        for ty, p in ((socket.SOCK_STREAM, 262), (socket.SOCK_DGRAM, 136)):\n\
        \x20   try: socket.socket(socket.AF_INET, ty, p); out.append('made')\n\
        \x20   except OSError as e: out.append(e.errno)\n\
        print(out)\n";
    let r = run(&[], &["python3", "-c", script]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout.trim(), "[1, 1]", "MPTCP, UDP-Lite: {}", r.stderr);

    // Without the network namespace, Landlock and seccomp alone stand between the sandbox
    // and a host loopback service (the test's own, never answered).
    let d = scratch("mptcp-nonet");
    let policy = policy_with_network(&d, "tcp_bind = []\ntcp_connect = []");
    let text = std::fs::read_to_string(&policy).unwrap();
    assert!(text.contains("netns = \"required\""), "{text}");
    std::fs::write(
        &policy,
        text.replace("netns = \"required\"", "netns = \"off\""),
    )
    .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let flags = ["--policy", policy.to_str().unwrap()];
    for (name, errno) in [("connect-mptcp", EPERM), ("connect-tcp", EACCES)] {
        let r = probe(&flags, &[name, &addr]);
        assert_eq!(r.code, 0, "{name}: {}", r.stderr);
        let iso = &r.report["isolation"];
        assert_eq!(iso["netns"], false, "{iso}");
        if name == "connect-tcp" && iso["landlock_abi"].as_u64().unwrap() < 4 {
            continue; // no TCP rules before Landlock ABI 4: nothing refuses it there
        }
        let p = r.probe();
        assert_eq!(p["succeeded"], false, "{name} reached the host: {p}");
        assert_eq!(p["errno"].as_i64(), Some(errno), "{name}: {p}");
    }
    assert!(
        listener.accept().is_err(),
        "the host listener got a connection"
    );
}

#[test]
fn a_forward_makes_one_host_service_reachable_and_nothing_else() {
    need_default_policy!();
    use std::io::{Read, Write};
    // Two host loopback services the test owns; only the first is forwarded.
    let wanted = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    other.set_nonblocking(true).unwrap();
    let wanted_addr = wanted.local_addr().unwrap().to_string();
    let wanted_port = wanted.local_addr().unwrap().port();
    let other_port = other.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        // Bounded: answer at most one connection, then stop. The answer comes in two writes,
        // which the forward may pass on in two segments: the client reads until it has all
        // 10 bytes (a single recv got only `pong:` in the Debian guest).
        let (mut s, _) = wanted.accept().unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        s.write_all(b"pong:").unwrap();
        s.write_all(&buf).unwrap();
    });
    let d = scratch("forward");
    let policy = policy_with_network(
        &d,
        &format!("tcp_bind = []\ntcp_connect = []\nforward = [\"{wanted_addr}\"]"),
    );
    let script = format!(
        "import socket\n\
         s = socket.create_connection(('127.0.0.1', {}), timeout=5)\n\
         s.sendall(b'hello'); data = b''\n\
         while len(data) < 10:\n    chunk = s.recv(64)\n    if not chunk: break\n    data += chunk\n\
         print(data.decode())\n\
         try:\n    socket.create_connection(('127.0.0.1', {}), timeout=2); print('OTHER REACHED')\n\
         except OSError as e:\n    print('other refused', e.errno)\n",
        wanted_port, other_port
    );
    let r = run(
        &["--policy", policy.to_str().unwrap()],
        &["python3", "-c", &script],
    );
    server.join().unwrap();
    assert_eq!(r.code, 0, "{} {}", r.stdout, r.stderr);
    assert!(r.stdout.contains("pong:hello"), "{}", r.stdout);
    assert!(r.stdout.contains("other refused"), "{}", r.stdout);
    assert!(
        other.accept().is_err(),
        "the unforwarded service got a connection"
    );

    // Without the forward the same service is unreachable.
    let again = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    again.set_nonblocking(true).unwrap();
    let port = again.local_addr().unwrap().port();
    let r = run(
        &[],
        &["python3", "-c", &format!("import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('REACHED')\nexcept OSError as e:\n    print('refused', e.errno)\n")],
    );
    assert!(r.stdout.contains("refused"), "{}", r.stdout);
    assert!(again.accept().is_err());
}

#[test]
fn a_forward_to_another_host_is_refused_at_load_time() {
    let d = scratch("forward-bad");
    for bad in ["10.0.0.1:5432", "192.168.0.10:80", "example.com:443"] {
        let policy = policy_with_network(&d, &format!("forward = [\"{bad}\"]"));
        let out = fork_cmd(&d)
            .args(["run", "--policy", policy.to_str().unwrap(), "--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(65), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("network.forward") && err.contains(bad),
            "{err}"
        );
    }
}
