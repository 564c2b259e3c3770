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

/// `[state] precopy`: how a rollback-journal store is copied (before its shared lock, then
/// compared under it; or whole under the lock with `"off"`) changes neither its digest nor
/// the conditions a verdict is cached under. The demo's quiet store (about 380 KB) is below
/// the default's 32 MiB, so the policy's bound is lowered under it to take that path; the
/// method is read from the `-v` log. A value that is neither `"off"` nor a size is bad
/// input naming the policy file and the field.
#[test]
fn the_policys_precopy_changes_the_method_not_the_state_hash_or_the_cache_key() {
    need_default_policy!();
    let env = Env::new("ev-precopy");
    let rt = env.runtime("rt", "\n[tasks.noop]\ncommand = [\"true\"]\n");
    // One policy file, rewritten: its path is among the conditions, its `precopy` is not.
    let policy = env.dir.join("precopy.toml");
    let set = |precopy: &str| {
        let mut doc = std::fs::read_to_string(human_policy()).unwrap();
        doc.push_str(&format!("\n[state]\nprecopy = \"{precopy}\"\n"));
        std::fs::write(&policy, doc).unwrap();
    };
    let run = |name: &str, more: &[&str]| {
        let with = With {
            pre: &["-v"],
            ..With::default()
        };
        let mut args = vec!["--task", "noop", "--policy", policy.to_str().unwrap()];
        args.extend(more);
        evaluate_with(&env, &patch("noop-comment"), &rt, name, &args, with)
    };
    let bytes = std::fs::read(rt.join("state/hermes.db")).unwrap();
    let mut h = Sha256::new();
    h.update(b"fork-state-v1\0state/hermes.db\0");
    h.update(format!("blake3:{}", blake3::hash(&bytes).to_hex()).as_bytes());
    h.update(b"\n");
    let expected = format!("sha256:{}", hex::encode(h.finalize()));

    set("4KiB");
    let early = run("early", &[]);
    assert_eq!(early.code, 0, "{}", early.ctx());
    assert!(
        early.stderr.contains("by FileBytesPrecopied"),
        "{}",
        early.ctx()
    );
    assert_eq!(early.verdict["state_hash"], expected.as_str());
    set("off");
    let cached = run("off-cached", &[]);
    assert_eq!(cached.code, 0, "{}", cached.ctx());
    assert!(
        cached.stderr.contains("reusing the verdict"),
        "{}",
        cached.ctx()
    );
    let fresh = run("off", &["--no-cache", "--no-ledger"]);
    assert_eq!(fresh.code, 0, "{}", fresh.ctx());
    assert!(fresh.stderr.contains("by FileBytes "), "{}", fresh.ctx());
    assert_eq!(fresh.verdict["state_hash"], expected.as_str());
    set("soon");
    let refused = run("bad", &["--no-ledger"]);
    assert_eq!(refused.code, 65, "{}", refused.ctx());
    assert!(refused.stderr.contains("precopy.toml"), "{}", refused.ctx());
    assert!(
        refused.stderr.contains("state.precopy"),
        "{}",
        refused.ctx()
    );
    assert!(refused.stderr.contains("soon"), "{}", refused.ctx());
}
