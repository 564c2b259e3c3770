//! Attestations through third-party tools: every envelope fork writes (verdict, endorsement,
//! steward approval) is checked by scripts/verify-bundle.py, which uses securesystemslib's
//! DSSE and ed25519 and in-toto-attestation's Statement v1 validation (PyPI; scripts/test.sh
//! installs them), never fork's code. It starts from the trusted node key alone: node key ->
//! endorsement -> ephemeral key -> verdict. Bundles of schema 1.3 (a checked-in fixture)
//! still verify with `fork verify`, and a mix of the formats is refused.

mod common;
use common::lifecycle::{demo, evaluate_with, need_root, patch, Env, With};
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const PYTHON_PACKAGES: &str = "'securesystemslib[crypto]==1.6.0' 'in-toto-attestation==0.9.3'";

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// Fails (never skips) when the third-party verifier cannot run, naming the fix.
fn require_python_tools() {
    let o = Command::new("python3")
        .args([
            "-c",
            "import securesystemslib.dsse, securesystemslib.signer, in_toto_attestation.v1.statement, cryptography",
        ])
        .output();
    match o {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "the third-party verifier's packages are missing: run scripts/test.sh, or python3 -m pip install {PYTHON_PACKAGES}\n{}",
            text(&o)
        ),
        Err(e) => panic!(
            "python3 is missing ({e}): run scripts/test.sh, which installs it and {PYTHON_PACKAGES}"
        ),
    }
}

/// scripts/verify-bundle.py on `bundle`, trusting `node_key` (and checking `steward`'s
/// approval, if given).
fn third_party(bundle: &Path, node_key: &str, steward: Option<&str>) -> Output {
    let mut c = Command::new("python3");
    c.arg(repo().join("scripts/verify-bundle.py"))
        .arg(bundle)
        .args(["--node-key", node_key]);
    if let Some(s) = steward {
        c.args(["--steward", s]);
    }
    c.output().unwrap()
}

fn accepted(bundle: &Path, node_key: &str, steward: Option<&str>) {
    let o = third_party(bundle, node_key, steward);
    assert_eq!(o.status.code(), Some(0), "not accepted: {}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("OK "),
        "{}",
        text(&o)
    );
}

fn refused(bundle: &Path, node_key: &str, steward: Option<&str>, why: &str) {
    let o = third_party(bundle, node_key, steward);
    assert_eq!(o.status.code(), Some(1), "not refused: {}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("REFUSED") && t.contains(why),
        "expected `{why}`: {t}"
    );
}

/// `fork verify` of `bundle` trusting `node_key`.
fn fork_verify(env: &Env, bundle: &Path, node_key: &Path) -> Output {
    env.cmd()
        .arg("verify")
        .arg(bundle)
        .arg("--trust")
        .arg(node_key)
        .output()
        .unwrap()
}

fn copy(from: &Path, to: &Path) -> PathBuf {
    common::lifecycle::copy_dir(from, to);
    to.to_path_buf()
}

fn flip_byte(path: &Path) {
    let mut b = std::fs::read(path).unwrap();
    let i = b.len() / 2;
    b[i] ^= 0x01;
    std::fs::write(path, b).unwrap();
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_third_party_verifier_accepts_every_attestation_fork_writes() {
    need_root!();
    require_python_tools();
    let env = Env::new("attestation");
    let with = || With {
        require_verdict: true,
        ..With::default()
    };
    let e = evaluate_with(
        &env,
        &patch("noop-comment"),
        &demo(),
        "noop",
        &["--task", "tests"],
        with(),
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    let node_pub = env.node_pub();
    let node_pem = std::fs::read_to_string(&node_pub).unwrap();
    assert!(
        node_pem.starts_with("-----BEGIN PUBLIC KEY-----"),
        "{node_pem}"
    );

    // Every envelope is an in-toto one.
    for f in ["verdict.dsse.json", "endorsement.dsse.json"] {
        let env_json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(e.out.join(f)).unwrap()).unwrap();
        assert_eq!(
            env_json["payloadType"], "application/vnd.in-toto+json",
            "{f}"
        );
    }
    assert_eq!(e.verdict["header"]["schema"]["version"], "1.4");

    // A steward approves it (its public key as an OpenSSH line).
    let steward_key = env.dir.join("steward.key");
    let g = env
        .cmd()
        .args(["keygen", "--public-format", "openssh", "--out"])
        .arg(&steward_key)
        .output()
        .unwrap();
    assert_eq!(g.status.code(), Some(0), "{}", text(&g));
    let steward_ssh = String::from_utf8_lossy(&g.stdout).trim().to_string();
    assert!(steward_ssh.starts_with("ssh-ed25519 "), "{steward_ssh}");
    let a = env
        .cmd()
        .arg("approve")
        .arg(&e.out)
        .arg("--key")
        .arg(&steward_key)
        .arg("--trust")
        .arg(&node_pub)
        .output()
        .unwrap();
    assert_eq!(a.status.code(), Some(0), "{}", text(&a));

    // Accepted from the node key alone, as a SubjectPublicKeyInfo file and as a string;
    // the steward's approval too.
    accepted(&e.out, s(&node_pub), None);
    accepted(&e.out, &node_pem, Some(&steward_ssh));
    let o = fork_verify(&env, &e.out, &node_pub);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // Refused: the wrong node key; another steward.
    let other = Env::new("attestation-other");
    let e2 = evaluate_with(
        &other,
        &patch("noop-comment"),
        &demo(),
        "other",
        &["--task", "tests"],
        with(),
    );
    let other_pub = other.node_pub();
    refused(&e.out, s(&other_pub), None, "does not verify");
    refused(&e.out, s(&node_pub), Some(s(&other_pub)), "steward-");

    // Refused: an endorsement signed by another node key (a real one, of another run).
    let swapped = copy(&e.out, &env.dir.join("swapped"));
    std::fs::copy(
        e2.out.join("endorsement.dsse.json"),
        swapped.join("endorsement.dsse.json"),
    )
    .unwrap();
    refused(
        &swapped,
        s(&node_pub),
        None,
        "endorsement.dsse.json: the signature does not verify",
    );
    // ...and a whole bundle endorsed by another node.
    refused(&e2.out, s(&node_pub), None, "does not verify");
    accepted(&e2.out, s(&other_pub), None);

    // Refused: a tampered bundle, byte by byte: the verdict document, an artifact, the
    // verdict envelope, the endorsement, the approval.
    for f in [
        "verdict.json",
        "artifacts/tests.xml",
        "verdict.dsse.json",
        "endorsement.dsse.json",
    ] {
        let t = copy(
            &e.out,
            &env.dir.join(format!("tampered-{}", f.replace('/', "-"))),
        );
        flip_byte(&t.join(f));
        let o = third_party(&t, s(&node_pub), None);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{f} tampered, accepted: {}",
            text(&o)
        );
        // Invalid (1), or malformed input (65) when the flip breaks the base64.
        let o = fork_verify(&env, &t, &node_pub);
        assert!(
            matches!(o.status.code(), Some(1) | Some(65)),
            "{f}: {}",
            text(&o)
        );
    }
    let t = copy(&e.out, &env.dir.join("tampered-approval"));
    let approval = std::fs::read_dir(&t)
        .unwrap()
        .map(|d| d.unwrap().path())
        .find(|p| p.to_string_lossy().contains("steward-"))
        .unwrap();
    flip_byte(&approval);
    accepted(&t, s(&node_pub), None);
    let o = third_party(&t, s(&node_pub), Some(&steward_ssh));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));

    // Refused: a verdict re-signed by a key it names itself (the endorsement kept): the
    // verifier never trusts the verdict's own successor_key.
    let forged = copy(&e.out, &env.dir.join("forged"));
    let o = Command::new("python3")
        .arg(repo().join("tests/common/forge_verdict.py"))
        .arg(&forged)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    refused(
        &forged,
        s(&node_pub),
        None,
        "verdict.dsse.json: the signature does not verify",
    );
    let o = fork_verify(&env, &forged, &node_pub);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("ephemeral_key"), "{}", text(&o));

    // Refused: the endorsement where the verdict is expected (same payloadType, signed by
    // the trusted node key): told apart by predicateType, by both verifiers.
    let confused = copy(&e.out, &env.dir.join("confused"));
    std::fs::copy(
        e.out.join("endorsement.dsse.json"),
        confused.join("verdict.dsse.json"),
    )
    .unwrap();
    let o = fork_verify(&env, &confused, &node_pub);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("predicateType"), "{}", text(&o));
    let confused = copy(&e.out, &env.dir.join("confused-2"));
    std::fs::copy(
        e.out.join("verdict.dsse.json"),
        confused.join("endorsement.dsse.json"),
    )
    .unwrap();
    refused(&confused, s(&node_pub), None, "endorsement.dsse.json");
    let o = fork_verify(&env, &confused, &node_pub);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("predicateType"), "{}", text(&o));

    // Refused: the schema 1.3 fixture bundle with this (in-toto) endorsement: a mix of
    // formats, named.
    let mixed = copy(
        &repo().join("fixtures/bundles/schema-1.3/bundle"),
        &env.dir.join("mixed"),
    );
    std::fs::copy(
        e.out.join("endorsement.dsse.json"),
        mixed.join("endorsement.dsse.json"),
    )
    .unwrap();
    let o = fork_verify(&env, &mixed, &node_pub);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("never mixes"), "{}", text(&o));
}

/// The checked-in bundle of schema 1.3 (fixtures/bundles), written by the release before
/// the in-toto format: `fork verify` and `fork consensus --steward` still accept it, and
/// refuse it once a byte changes (mixed with an envelope of the new format: see the test
/// above).
#[test]
fn bundles_of_schema_1_3_still_verify() {
    let fixture = repo().join("fixtures/bundles/schema-1.3");
    let env = Env::new("attestation-1.3");
    let node_pub = fixture.join("node.pub");
    let b = copy(&fixture.join("bundle"), &env.dir.join("bundle"));
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(b.join("verdict.json")).unwrap()).unwrap();
    assert_eq!(v["header"]["schema"]["version"], "1.3");
    let o = fork_verify(&env, &b, &node_pub);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // Its steward approval (the earlier format) still counts.
    let o = env
        .cmd()
        .args(["consensus", "--min-nodes", "1", "--trust"])
        .arg(&node_pub)
        .arg("--steward")
        .arg(fixture.join("steward.pub"))
        .arg(&b)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("steward approved"), "{}", text(&o));

    // Tampered: refused.
    for f in [
        "verdict.json",
        "endorsement.dsse.json",
        "artifacts/tests.xml",
    ] {
        let t = copy(
            &fixture.join("bundle"),
            &env.dir.join(format!("t-{}", f.replace('/', "-"))),
        );
        flip_byte(&t.join(f));
        let o = fork_verify(&env, &t, &node_pub);
        assert_eq!(o.status.code(), Some(1), "{f}: {}", text(&o));
    }
    // A moved approval no longer counts.
    let t = copy(&fixture.join("bundle"), &env.dir.join("t-approval"));
    let approval = std::fs::read_dir(&t)
        .unwrap()
        .map(|d| d.unwrap().path())
        .find(|p| p.to_string_lossy().contains("steward-"))
        .unwrap();
    flip_byte(&approval);
    let o = env
        .cmd()
        .args(["consensus", "--min-nodes", "1", "--trust"])
        .arg(&node_pub)
        .arg("--steward")
        .arg(fixture.join("steward.pub"))
        .arg(&t)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));

    // The third-party verifier takes the in-toto format only, and says so.
    require_python_tools();
    refused(
        &b,
        s(&node_pub),
        None,
        "application/vnd.fork.endorsement+json",
    );
}
