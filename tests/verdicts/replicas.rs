//! Replicas: `--replicas 3` runs three patched successors that agree, and replicas share
//! `alpha`. Item 8 of the proof list in tests/verdicts.rs.

use super::*;

#[test]
fn three_replicas_agree() {
    need_root!();
    let env = Env::new("vd-replicas");
    let e = evaluate(
        &env,
        &patch("swap-compressor"),
        &demo(),
        "replicas",
        &["--task", "tests", "--replicas", "3"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    assert!(!e.reused());
    let caveats = e.caveats();
    assert!(
        caveats
            .iter()
            .any(|c| c.contains("All 3") && c.contains("agree")),
        "{caveats:?}"
    );
    assert_eq!(
        e.sandboxes.len(),
        3,
        "three patched sandboxes: {:?}",
        e.sandboxes
    );
    for name in ["tests.xml", "replica2-tests.xml", "replica3-tests.xml"] {
        let r = parse_junit(&std::fs::read(e.artifact(name)).unwrap()).unwrap();
        assert!(!r.cases.is_empty() && r.failed() == 0, "{name}");
    }
}

/// The most severe replica's decision stands, so each of `--replicas N` spends `alpha / N`:
/// no tested metric of the verdict was decided at a level above its replica's share of
/// what the spending function allows by its look (with each replica spending the whole
/// `alpha`, the compress demo's metrics are decided at twice that). And a cap that one
/// replica's share cannot decide with (4 pairs: `1/70` is not below `0.025 / 2`; 4 pairs
/// would do for one replica) is said before the first pair.
#[test]
fn replicas_share_the_error_rate() {
    need_root!();
    let env = Env::new("vd-replica-alpha");
    let e = evaluate(
        &env,
        &patch("swap-compressor"),
        &demo(),
        "two",
        &["--task", "compress", "--replicas", "2", "--no-ledger"],
    );
    assert!(matches!(e.code, 0 | 2), "{}", e.ctx());
    let metrics = e.verdict["metrics"].as_array().unwrap();
    let tested: Vec<&Value> = metrics.iter().filter(|m| f(&m["alpha"]) > 0.0).collect();
    assert!(tested.len() >= 2, "{}", e.ctx());
    for m in &tested {
        // The pairs run, at or after the metric's deciding look: the bound is tight when the
        // pairs stop at the look that decided it (the demo's 6), looser after.
        let pairs = m["samples"].as_f64().unwrap();
        // Lan-DeMets, Pocock type: the share of alpha spent by `pairs` of the cap of 20.
        let by = (1.0 + (std::f64::consts::E - 1.0) * (pairs / 20.0).min(1.0)).ln();
        let bound = 0.05 / 2.0 * by / tested.len() as f64;
        assert!(
            f(&m["alpha"]) <= bound * (1.0 + 1e-9),
            "{} at level {} above {bound}: {}",
            m["name"],
            m["alpha"],
            e.ctx()
        );
    }
    let policy = env.dir.join("four.toml");
    std::fs::write(&policy, "[decision]\nmax_pairs = 4\n").unwrap();
    let e = evaluate(
        &env,
        &patch("swap-compressor"),
        &demo(),
        "four",
        &[
            "--task",
            "compress",
            "--replicas",
            "2",
            "--no-ledger",
            "--policy",
            policy.to_str().unwrap(),
        ],
    );
    let why = "at most 4 pairs (the policy's max_pairs = 4) are too few for the rank test";
    assert!(
        e.stderr.contains(why) && e.stderr.contains("split over 2 replicas"),
        "{}",
        e.ctx()
    );
    assert!(e.stderr.contains("at least 5 pairs"), "{}", e.ctx());
}
