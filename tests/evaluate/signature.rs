//! The signature chain: the signed bundle verifies, and any tampering with it is caught.

use super::*;

fn verify_code(env: &Env, bundle: &Path, trust: &[&str]) -> (i32, String) {
    let args: Vec<&str> = trust.iter().flat_map(|t| ["--trust", t]).collect();
    verify_with(env, bundle, &args)
}

/// One way of altering a copy of a bundle.
type Tamper = Box<dyn FnOnce(&Path)>;

/// A copy of the bundle, altered by `f`.
fn tampered(src: &Path, name: &str, f: impl FnOnce(&Path)) -> PathBuf {
    let dst = src.with_file_name(format!("tampered-{name}"));
    copy_dir(src, &dst);
    f(&dst);
    dst
}

fn flip_byte(path: &Path, offset: usize) {
    let mut b = std::fs::read(path).unwrap();
    let i = offset.min(b.len() - 1);
    b[i] ^= 0x01;
    std::fs::write(path, b).unwrap();
}

/// Replaces one character of an envelope's `field` (sig or payload) in place, keeping it
/// valid base64: a single-byte change of the file.
fn flip_envelope_char(path: &Path, field: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let value = if field == "sig" {
        doc["signatures"][0]["sig"].as_str().unwrap().to_string()
    } else {
        doc[field].as_str().unwrap().to_string()
    };
    let start = text.find(&value).unwrap();
    let i = start + value.len() / 2;
    let mut b = text.into_bytes();
    b[i] = if b[i] == b'A' { b'B' } else { b'A' };
    std::fs::write(path, b).unwrap();
}

/// Decodes an envelope's payload, replaces one hex digit of a digest in it, re-encodes:
/// a well-formed envelope whose signed statement was altered.
fn alter_payload_digest(path: &Path) {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut doc: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let payload = b64.decode(doc["payload"].as_str().unwrap()).unwrap();
    let mut text = String::from_utf8(payload).unwrap();
    let i = text.find("sha256").expect("a digest in the statement");
    // The first hex digit after `sha256` and its separator(s).
    let j = text[i + 6..]
        .char_indices()
        .find(|(_, c)| c.is_ascii_hexdigit())
        .map(|(k, _)| i + 6 + k)
        .unwrap();
    let c = text.as_bytes()[j];
    let new = if c == b'0' { "1" } else { "0" };
    text.replace_range(j..j + 1, new);
    doc["payload"] = Value::String(b64.encode(text.as_bytes()));
    std::fs::write(path, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
}

#[test]
fn signature_chain_verifies_and_catches_tampering() {
    need_default_policy!();
    let env = Env::new("ev-sign");
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &demo(),
        "signed",
        &["--task", "tests"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    let node_pub = std::fs::read_to_string(env.node_pub()).unwrap();
    let node_pub = node_pub.trim();
    // Valid: with the local node key, with it named as a file, as a string, and via the
    // verdict.json path.
    for trust in [
        vec![],
        vec![env.node_pub().to_str().unwrap()],
        vec![node_pub],
    ] {
        let (code, msg) = verify_code(&env, &e.out, &trust);
        assert_eq!(code, 0, "{trust:?}: {msg}");
        assert!(msg.contains("valid"), "{msg}");
    }
    let (code, msg) = verify_code(&env, &e.out.join("verdict.json"), &[]);
    assert_eq!(code, 0, "{msg}");

    let v = std::fs::read(e.out.join("verdict.json")).unwrap();
    let summary_at = std::str::from_utf8(&v)
        .unwrap()
        .find("Test suite passed")
        .unwrap();
    let cases: Vec<(&str, Tamper)> = vec![
        (
            "verdict-first-byte",
            Box::new(|d| flip_byte(&d.join("verdict.json"), 0)),
        ),
        (
            "verdict-summary",
            Box::new(move |d| flip_byte(&d.join("verdict.json"), summary_at + 5)),
        ),
        (
            "verdict-middle",
            Box::new(move |d| flip_byte(&d.join("verdict.json"), v.len() / 2)),
        ),
        (
            "artifact-patch",
            Box::new(|d| flip_byte(&d.join("artifacts/patch.diff"), 100)),
        ),
        (
            "artifact-tests-xml",
            Box::new(|d| flip_byte(&d.join("artifacts/tests.xml"), 50)),
        ),
        (
            "artifact-removed",
            Box::new(|d| std::fs::remove_file(d.join("artifacts/output.log")).unwrap()),
        ),
        (
            "artifact-added",
            Box::new(|d| std::fs::write(d.join("artifacts/extra.txt"), b"smuggled").unwrap()),
        ),
        (
            "verdict-envelope-sig",
            Box::new(|d| flip_envelope_char(&d.join("verdict.dsse.json"), "sig")),
        ),
        (
            "endorsement-envelope-sig",
            Box::new(|d| flip_envelope_char(&d.join("endorsement.dsse.json"), "sig")),
        ),
        (
            "verdict-envelope-statement",
            Box::new(|d| alter_payload_digest(&d.join("verdict.dsse.json"))),
        ),
        (
            "endorsement-envelope-statement",
            Box::new(|d| alter_payload_digest(&d.join("endorsement.dsse.json"))),
        ),
    ];
    for (name, f) in cases {
        let t = tampered(&e.out, name, f);
        let (code, msg) = verify_code(&env, &t, &[]);
        assert_eq!(
            code, 1,
            "tampering `{name}` must be invalid (exit 1): {msg}"
        );
        assert!(msg.contains("invalid"), "{name}: {msg}");
    }
    // A raw byte flip anywhere in an envelope never verifies. (One that breaks the JSON
    // itself is "malformed input", exit 65, as src/verdict/verify.rs documents.)
    for f in ["verdict.dsse.json", "endorsement.dsse.json"] {
        let len = std::fs::metadata(e.out.join(f)).unwrap().len() as usize;
        for off in [0, 1, len / 3, len / 2, len - 1] {
            let t = tampered(&e.out, &format!("{f}-{off}"), |d| {
                flip_byte(&d.join(f), off)
            });
            let (code, msg) = verify_code(&env, &t, &[]);
            assert!(
                code == 1 || code == 65,
                "{f} byte {off}: exit {code}: {msg}"
            );
        }
    }
    // An untrusted node key: as a file and as a string.
    let other = env.dir.join("other.key");
    let o = env
        .cmd()
        .args(["keygen", "--out", other.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    let other_pub = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(other_pub.starts_with("ed25519:"), "{other_pub}");
    assert_ne!(other_pub, node_pub);
    let other_file = env.dir.join("other.pub");
    for trust in [other_pub.as_str(), other_file.to_str().unwrap()] {
        let (code, msg) = verify_code(&env, &e.out, &[trust]);
        assert_eq!(code, 1, "{msg}");
        assert!(msg.contains("not a trusted node key"), "{msg}");
    }
}
