//! `state_hash`'s derivation, end to end: each state store named by the policy's
//! `[state] digest` (BLAKE3 by default, SHA-256 as earlier releases did).

use crate::common::lifecycle::need_default_policy;
use crate::common::lifecycle::*;
use sha2::{Digest, Sha256};

/// `state_hash` is sha256 over `fork-state-v1\0`, then for each store its manifest name,
/// `\0`, its snapshot's digest and `\n`. The snapshot's digest is BLAKE3 by default
/// (`blake3:<hex>`, what `b3sum` prints of the copy), SHA-256 with the policy's `[state]
/// digest = "sha256"` (the previous releases' `state_hash`, unchanged), and a gate's
/// REJECT hashes the live file with the same digest. The demo's store is quiet and in
/// rollback mode, so its snapshot holds the file's own bytes.
#[test]
fn state_hash_names_each_store_by_the_policys_digest() {
    need_default_policy!();
    let env = Env::new("ev-digest");
    let rt = env.runtime("rt", "\n[tasks.noop]\ncommand = [\"true\"]\n");
    let bytes = std::fs::read(rt.join("state/hermes.db")).unwrap();
    let combined = |digest: String| {
        let mut h = Sha256::new();
        h.update(b"fork-state-v1\0state/hermes.db\0");
        h.update(digest.as_bytes());
        h.update(b"\n");
        format!("sha256:{}", hex::encode(h.finalize()))
    };
    let blake3 = combined(format!("blake3:{}", blake3::hash(&bytes).to_hex()));
    let sha256 = combined(format!("sha256:{}", hex::encode(Sha256::digest(&bytes))));
    let policy = env.dir.join("sha256-policy.toml");
    let mut doc = std::fs::read_to_string(human_policy()).unwrap();
    doc.push_str("\n[state]\ndigest = \"sha256\"\n");
    std::fs::write(&policy, doc).unwrap();
    let noop = ["--task", "noop", "--no-ledger"];
    let by_default = evaluate(&env, &patch("noop-comment"), &rt, "b3", &noop);
    assert_eq!(by_default.code, 0, "{}", by_default.ctx());
    assert_eq!(by_default.verdict["state_hash"], blake3.as_str());
    let policy_arg = policy.to_str().unwrap();
    let mut args = noop.to_vec();
    args.extend(["--policy", policy_arg]);
    let old = evaluate(&env, &patch("noop-comment"), &rt, "sha", &args);
    assert_eq!(old.code, 0, "{}", old.ctx());
    assert_eq!(old.verdict["state_hash"], sha256.as_str());
    let gate = evaluate(
        &env,
        &patch("touches-protected"),
        &rt,
        "gate",
        &["--no-ledger"],
    );
    assert_eq!(gate.code, 1, "{}", gate.ctx());
    assert_eq!(gate.verdict["state_hash"], blake3.as_str());
    let mut args = vec!["--no-ledger", "--policy", policy_arg];
    args.push("--json");
    let gate_old = evaluate(&env, &patch("touches-protected"), &rt, "gate-sha", &args);
    assert_eq!(gate_old.code, 1, "{}", gate_old.ctx());
    assert_eq!(gate_old.verdict["state_hash"], sha256.as_str());
    // A digest the policy does not know is bad input naming the policy file.
    std::fs::write(&policy, "[state]\ndigest = \"md5\"\n").unwrap();
    let bad = evaluate(&env, &patch("noop-comment"), &rt, "bad", &args);
    assert_eq!(bad.code, 65, "{}", bad.ctx());
    assert!(bad.stderr.contains("sha256-policy.toml"), "{}", bad.ctx());
    assert!(bad.stderr.contains("md5"), "{}", bad.ctx());
}
