//! Replicas: `--replicas 3` runs three patched successors that agree. Item 8 of the proof
//! list in tests/verdicts.rs.

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
