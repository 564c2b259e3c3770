//! Metrics over sequential pairs, decided only when the data can: swap-compressor's gains
//! significant, a no-op unchanged, a slowed compressor a significant p99 regression. Items
//! 1-3 of the proof list in tests/verdicts.rs.

use super::*;

fn read_metrics(p: &Path) -> BTreeMap<String, f64> {
    let v: Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
        .collect()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        xs[n / 2 - 1] / 2.0 + xs[n / 2] / 2.0
    }
}

/// The pairs the task ran (every metric records the same count) and why it stopped.
fn pairs_run(e: &Eval) -> (usize, String) {
    let metrics = e.verdict["metrics"].as_array().unwrap();
    let n = metrics[0]["samples"].as_u64().unwrap() as usize;
    let stopped = metrics[0]["stopped"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for m in metrics {
        assert_eq!(m["samples"].as_u64(), Some(n as u64), "{m}");
        assert_eq!(m["stopped"].as_str(), Some(stopped.as_str()), "{m}");
        assert!(m["order_seed"].as_u64().is_some(), "{m}");
    }
    (n, stopped)
}

/// A verdict that is not APPROVE only because a timing metric was inconclusive says so,
/// names it with its interval, and claims no regression.
fn approve_or_inconclusive(e: &Eval) {
    if e.code == 0 {
        return;
    }
    assert_eq!(e.code, 2, "{}", e.ctx());
    let s = e.summary();
    assert!(
        s.contains("inconclusive for") && s.contains("interval"),
        "{}",
        e.ctx()
    );
    assert!(!s.contains("regressed"), "{}", e.ctx());
    for m in e.verdict["metrics"].as_array().unwrap() {
        if m["class"] == "inconclusive" {
            assert!(s.contains(m["name"].as_str().unwrap()), "{}", e.ctx());
        }
    }
}

#[test]
fn swap_compressor_gains_are_significant() {
    need_root!();
    let env = Env::new("vd-swap");
    let e = evaluate(
        &env,
        &patch("swap-compressor"),
        &demo(),
        "swap",
        &["--task", "compress"],
    );
    approve_or_inconclusive(&e);
    assert_eq!(e.verdict["task"], "compress");
    // repeat = 20 with a baseline: at most 20 pairs, one patched and one baseline sandbox
    // each, stopped as soon as every metric was decided.
    let (n, stopped) = pairs_run(&e);
    assert!((3..=20).contains(&n), "{n} pairs: {}", e.ctx());
    assert_eq!(
        e.sandboxes.len(),
        2 * n + e.first_pair_extra(),
        "{:?}",
        e.sandboxes
    );
    if n < 20 {
        assert!(stopped.contains("every metric decided"), "{stopped}");
    }
    for name in ["compressed_bytes", "ratio"] {
        let m = e.metric(name);
        assert_eq!(m["class"], "improved", "{name}: {m}");
        assert_eq!(m["significant"], true, "{name}: {m}");
        let (change, lo, hi) = (f(&m["change"]), f(&m["ci_low"]), f(&m["ci_high"]));
        assert!(change < -0.01, "{name} must go down: {m}");
        assert!(
            lo <= change && change <= hi,
            "{name}: change outside its CI: {m}"
        );
        assert!(hi < 0.0, "{name}: the CI must lie entirely below 0: {m}");
        assert!(f(&m["patched"]) < f(&m["baseline"]), "{m}");
        assert!(m["p_value"].as_f64().is_some(), "{m}");
    }
    assert!(
        e.summary().contains("compressed_bytes improved"),
        "{}",
        e.ctx()
    );
    // The medians are those of the per-run metrics the bundle carries.
    let runs = |side: &str, first: &str| -> Vec<BTreeMap<String, f64>> {
        let mut v = vec![read_metrics(&e.artifact(first))];
        for r in 2..=n {
            v.push(read_metrics(
                &e.artifact(&format!("{side}.r{r}-metrics.json")),
            ));
        }
        v
    };
    let patched = runs("patched", "metrics.json");
    let baseline = runs("baseline", "baseline-metrics.json");
    for m in e.verdict["metrics"].as_array().unwrap() {
        let name = m["name"].as_str().unwrap();
        let med = |side: &[BTreeMap<String, f64>]| median(side.iter().map(|r| r[name]).collect());
        // Within a rounding step: with an even number of pairs the median is a mean of two
        // parsed values.
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * a.abs().max(b.abs());
        assert!(close(f(&m["patched"]), med(&patched)), "{name}: {m}");
        assert!(close(f(&m["baseline"]), med(&baseline)), "{name}: {m}");
    }
}

#[test]
fn noop_patch_changes_nothing_significantly() {
    need_root!();
    let env = Env::new("vd-noop");
    let policy = env.dir.join("human.toml");
    std::fs::write(&policy, "[decision]\nself_reported = \"accept\"\n").unwrap();
    let e = evaluate(
        &env,
        &patch("noop-comment"),
        &demo(),
        "noop",
        &["--task", "compress", "--policy", policy.to_str().unwrap()],
    );
    approve_or_inconclusive(&e);
    let metrics = e.verdict["metrics"].as_array().unwrap();
    assert_eq!(metrics.len(), 4, "{}", e.ctx());
    for m in metrics {
        assert!(
            m["class"] == "equivalent" || m["class"] == "inconclusive",
            "a no-op patch changed {}: {}",
            m["name"],
            e.ctx()
        );
        assert_eq!(m["significant"], false, "{m}");
    }
    // The compression itself is deterministic: exactly no change (the bytes decided exactly,
    // the ratio, band 1%, by the rank test once it can).
    for name in ["compressed_bytes", "ratio"] {
        let m = e.metric(name);
        assert_eq!(f(&m["change"]), 0.0, "{}", e.ctx());
        assert_eq!(m["class"], "equivalent", "{m}");
    }
    let s = e.summary();
    assert!(!s.contains("improved") && !s.contains("regressed"), "{s}");
    // "unchanged" only when every compared metric was shown inside its band.
    if s.contains("unchanged") {
        assert!(metrics.iter().all(|m| m["class"] == "equivalent"), "{s}");
    }
}

#[test]
fn slow_compressor_is_a_significant_p99_regression() {
    need_root!();
    let env = Env::new("vd-slow");
    // The slowed compressor takes ~15 ms per session and run: the same compress task on
    // 5 sessions instead of 100 keeps the runs within seconds (p99 = the slowest).
    let rt = env.runtime("hermes-demo", "");
    let toml = std::fs::read_to_string(rt.join("fork.toml")).unwrap();
    let fewer = toml.replace(r#""--sessions", "100""#, r#""--sessions", "5""#);
    assert_ne!(fewer, toml, "the compress task's --sessions");
    std::fs::write(rt.join("fork.toml"), fewer).unwrap();
    let e = evaluate(
        &env,
        &patch("slows-compressor"),
        &rt,
        "slow",
        &["--task", "compress"],
    );
    assert_eq!(e.code, 2, "{}", e.ctx());
    assert_eq!(e.verdict["verdict"], "NEEDS_REVISION");
    let m = e.metric("p99_ms");
    assert_eq!(m["class"], "regressed", "{m}");
    assert_eq!(m["significant"], true, "{m}");
    let (change, lo) = (f(&m["change"]), f(&m["ci_low"]));
    assert!(change > 0.10, "p99_ms must go up: {m}");
    assert!(lo > 0.10, "the CI must lie above the 10% band: {m}");
    assert!(f(&m["patched"]) > f(&m["baseline"]), "{m}");
    // A regression settles the verdict: no need to run to the cap.
    let (n, stopped) = pairs_run(&e);
    assert!(n < 20, "{n} pairs: {stopped}");
    let s = e.summary();
    assert!(s.contains("p99_ms") && s.contains("regressed"), "{s}");
    // The compression output is unchanged: only the time regressed.
    assert!(!s.contains("compressed_bytes"), "{s}");
    assert_eq!(e.metric("compressed_bytes")["class"], "equivalent");
}

/// A patch whose exit hook empties its own metrics file (`{}`, after the benchmark wrote
/// it: fixtures/patches/hacks/empty-metrics.diff) is never approved (before: APPROVE 0.63,
/// `metrics: []`, stopped after 3 pairs as if every metric were decided, with a caveat
/// that the task declares no metrics). The baseline's metrics are named as missing from
/// the patched side, the pairs run to the cap, and no caveat says the task declares none.
#[test]
fn a_patch_that_empties_its_metrics_is_never_approved() {
    need_root!();
    let env = Env::new("vd-empty-metrics");
    // 5 sessions and at most 5 pairs keep the runs short; the first look is still at 3.
    let rt = env.runtime("hermes-demo", "");
    let toml = std::fs::read_to_string(rt.join("fork.toml")).unwrap();
    let short = toml
        .replace(r#""--sessions", "100""#, r#""--sessions", "5""#)
        .replace(
            "repeat = 20                      # at most 20 pairs",
            "repeat = 5 #",
        );
    assert_eq!(
        short.matches("repeat = 5 #").count(),
        1,
        "the compress task's repeat"
    );
    std::fs::write(rt.join("fork.toml"), short).unwrap();
    let hack = repo().join("fixtures/patches/hacks/empty-metrics.diff");
    let e = evaluate(&env, &hack, &rt, "empty", &["--task", "compress"]);
    assert_eq!(e.code, 2, "{}", e.ctx());
    assert_eq!(e.verdict["verdict"], "NEEDS_REVISION", "{}", e.ctx());
    let s = e.summary();
    assert!(
        s.starts_with("The patched run reported no metrics, although the task declares them"),
        "{}",
        e.ctx()
    );
    for name in ["compressed_bytes", "p99_ms", "peak_memory_kb", "ratio"] {
        assert!(s.contains(name), "{name} not named: {}", e.ctx());
    }
    assert!(
        !e.caveats().iter().any(|c| c.contains("declares no")),
        "a false caveat: {}",
        e.ctx()
    );
    // The patched side really wrote `{}`; the baseline's files hold the metrics.
    assert_eq!(read_metrics(&e.artifact("metrics.json")).len(), 0);
    assert_eq!(read_metrics(&e.artifact("baseline-metrics.json")).len(), 4);
    // Nothing was decided, so nothing stopped the pairs before the cap.
    let staged = |suffix: &str| {
        std::fs::read_dir(e.out.join("artifacts"))
            .unwrap()
            .flatten()
            .filter(|f| f.file_name().to_string_lossy().ends_with(suffix))
            .count()
    };
    assert_eq!(staged("metrics.json"), 10, "5 pairs: {}", e.ctx());
}

/// A runtime whose one task reports `p99_ms` (0.5 unpatched, the value of `patched.txt`
/// once a patch adds it), with a baseline and a single pair.
fn one_metric_runtime(env: &Env) -> PathBuf {
    let rt = env.dir.join("one-metric");
    std::fs::create_dir_all(&rt).unwrap();
    std::fs::write(
        rt.join("fork.toml"),
        "[runtime]\nname = \"one-metric\"\nsource = \".\"\nprotected = [\"fork.toml\", \"run.sh\"]\n\n\
         [tasks.bench]\ncommand = [\"sh\", \"run.sh\"]\nmetrics = \"metrics.json\"\nbaseline = true\nrepeat = 1\n",
    )
    .unwrap();
    std::fs::write(
        rt.join("run.sh"),
        "if [ -f patched.txt ]; then v=$(cat patched.txt); else v=0.5; fi\n\
         printf '{\"p99_ms\": %s}' \"$v\" > \"$FORK_REPORTS/metrics.json\"\n",
    )
    .unwrap();
    rt
}

/// A huge but finite metric value (the relative change overflows at 1.7e308; at 1e307 it
/// is finite, but its distance beyond the band is not) is an unbounded regression with a
/// recorded, signed NEEDS_REVISION and a ledger row. Before: the confidence came out NaN,
/// the bundle writer refused the verdict, and `evaluate` exited 70 with no verdict and no
/// row, so a regressing patch left no record at all.
#[test]
fn a_huge_metric_value_is_a_recorded_regression() {
    need_root!();
    let env = Env::new("vd-huge-metric");
    let rt = one_metric_runtime(&env);
    for (name, value, shown) in [
        ("overflow", "1.7e308", "1.7e308"),
        ("huge", "1e307", "1e307"),
    ] {
        let diff = env.dir.join(format!("{name}.diff"));
        std::fs::write(
            &diff,
            format!("diff --git a/patched.txt b/patched.txt\nnew file mode 100644\n--- /dev/null\n+++ b/patched.txt\n@@ -0,0 +1 @@\n+{value}\n"),
        )
        .unwrap();
        // `evaluate` (this crate's) demands a verdict and checks that the bundle verifies.
        let e = evaluate(&env, &diff, &rt, name, &[]);
        assert_eq!(e.code, 2, "{}", e.ctx());
        assert_eq!(e.verdict["verdict"], "NEEDS_REVISION", "{}", e.ctx());
        let c = f(&e.verdict["confidence"]);
        assert!((0.5..=1.0).contains(&c), "{}", e.ctx());
        let m = e.metric("p99_ms");
        assert!(m["change"].is_null() || f(&m["change"]).is_finite(), "{m}");
        assert!(
            e.summary().contains("p99_ms regressed") && e.summary().contains(shown),
            "{}",
            e.ctx()
        );
        let o = env.cmd().args(["history", "--json"]).output().unwrap();
        let rows: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
        assert!(
            rows.as_array()
                .is_some_and(|r| r.iter().any(|row| row["run_id"] == e.verdict["run_id"])),
            "no ledger row for {name}: {rows}"
        );
    }
}

/// Every run reports 10,000 metrics whose long names change from run to run (a run id in
/// the name): the names no longer add up across the runs (before: three runs made a 101 MB
/// verdict.json, 733 MB of memory, and a bundle `fork verify` refused as larger than 64
/// MiB). The first run's names count; the later runs' metrics are refused as unusable, the
/// verdict is a NEEDS_REVISION saying why, and its bundle verifies.
#[test]
fn metric_names_that_change_every_run_do_not_add_up() {
    need_root!();
    let env = Env::new("vd-many-names");
    let rt = env.dir.join("many-names");
    std::fs::create_dir_all(&rt).unwrap();
    std::fs::write(
        rt.join("fork.toml"),
        "[runtime]\nname = \"many-names\"\nsource = \".\"\nprotected = [\"fork.toml\", \"gen.py\"]\n\n\
         [tasks.bench]\ncommand = [\"python3\", \"gen.py\"]\nmetrics = \"metrics.json\"\nrepeat = 3\n",
    )
    .unwrap();
    std::fs::write(
        rt.join("gen.py"),
        "import json, os, uuid\n\
         run = uuid.uuid4().hex[:8]\n\
         body = '\\U0001F600' * 380\n\
         m = {f'{run}{i:05d}{body}': 1.0 for i in range(10000)}\n\
         with open(os.path.join(os.environ['FORK_REPORTS'], 'metrics.json'), 'w', encoding='utf-8') as f:\n\
         \x20   json.dump(m, f, ensure_ascii=False)\n",
    )
    .unwrap();
    let diff = env.dir.join("note.diff");
    std::fs::write(
        &diff,
        "diff --git a/note.txt b/note.txt\nnew file mode 100644\n--- /dev/null\n+++ b/note.txt\n@@ -0,0 +1 @@\n+a note\n",
    )
    .unwrap();
    // `evaluate` (this crate's) demands a verdict and that `fork verify` accepts its bundle.
    let e = evaluate(&env, &diff, &rt, "names", &[]);
    assert_eq!(e.code, 2, "{}", e.ctx());
    assert!(
        e.summary().contains("distinct names a task may report"),
        "{}",
        e.ctx()
    );
    let metrics = e.verdict["metrics"].as_array().unwrap().len();
    assert!(metrics <= fork::task::results::MAX_METRICS, "{metrics}");
    let size = std::fs::metadata(e.out.join("verdict.json")).unwrap().len();
    assert!(size < 64 << 20, "verdict.json is {size} bytes");
    // The evaluation's memory stayed bounded (the largest child this test waited for).
    let peak = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .unwrap()
        .max_rss(); // KiB
    eprintln!("peak RSS of a child: {peak} KiB, verdict.json {size} bytes");
    assert!(peak < 600 << 10, "peak RSS {peak} KiB");
}
