//! The bundle is private to fork's user, and the policy's secrets are scrubbed from it: from
//! its artifacts, and from what the verdict says of the successor's reports.

use super::*;

const TOKEN: &str = "tok-s3cr3t-value-8f2c41";

#[test]
fn bundles_are_private_and_policy_secrets_are_scrubbed_from_them() {
    need_root!();
    let env = common::lifecycle::Env::new("hs-private");
    let policy = env.dir.join("secret-policy.toml");
    std::fs::write(
        &policy,
        format!("[environment]\npass = [\"LANG\"]\nset = {{ API_TOKEN = \"{TOKEN}\" }}\n"),
    )
    .unwrap();
    let rt = env.runtime(
        "rt-private",
        "\n[tasks.leak]\ncommand = [\"sh\", \"-c\", \
         \"echo token=$API_TOKEN; echo \\\"{\\\\\\\"t\\\\\\\": \\\\\\\"$API_TOKEN\\\\\\\"}\\\" > $FORK_REPORTS/leak.json; sleep 1\"]\n",
    );
    // Watch the run root while the evaluation runs: every run directory is 0700.
    let run_root = env.run_root.clone();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done2 = done.clone();
    let watcher = std::thread::spawn(move || {
        let mut seen = Vec::new();
        while !done2.load(std::sync::atomic::Ordering::SeqCst) {
            for e in std::fs::read_dir(&run_root).into_iter().flatten().flatten() {
                if let Ok(m) = std::fs::symlink_metadata(e.path()) {
                    if m.is_dir() && e.file_name().to_string_lossy().starts_with("fork-") {
                        seen.push((e.file_name(), m.mode() & 0o7777));
                    }
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        seen
    });
    let e = common::lifecycle::evaluate_with(
        &env,
        &common::lifecycle::patch("noop-comment"),
        &rt,
        "private",
        &[
            "--task",
            "leak",
            "--no-ledger",
            "--policy",
            policy.to_str().unwrap(),
        ],
        common::lifecycle::With {
            pre: &[],
            require_verdict: true,
            ..Default::default()
        },
    );
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = watcher.join().unwrap();
    assert!(!seen.is_empty(), "no run directory seen");
    for (name, mode) in &seen {
        // A sandbox's run directory is 0711 (its unprivileged uid traverses it to its own
        // mount point; nothing is listable), made 0700 and opened to 0711 a moment later
        // (the watcher may see it in between); the evaluation's own is 0700.
        let allowed: &[u32] = if name.to_string_lossy().starts_with("fork-eval-") {
            &[0o700]
        } else {
            &[0o700, 0o711]
        };
        assert!(
            allowed.contains(mode),
            "run directory {name:?} is {mode:o}, expected one of {allowed:?} (octal 700 or 711)"
        );
    }
    // The bundle: 0700 directories, 0600 files.
    let mut stack = vec![e.out.clone()];
    let mut files = 0;
    while let Some(d) = stack.pop() {
        let m = std::fs::symlink_metadata(&d).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o700, "{}", d.display());
        for f in std::fs::read_dir(&d).unwrap().flatten() {
            let m = std::fs::symlink_metadata(f.path()).unwrap();
            if m.is_dir() {
                stack.push(f.path());
            } else {
                files += 1;
                assert_eq!(m.mode() & 0o7777, 0o600, "{}", f.path().display());
                let text = String::from_utf8_lossy(&std::fs::read(f.path()).unwrap()).into_owned();
                assert!(
                    !text.contains(TOKEN),
                    "the token is in {}",
                    f.path().display()
                );
            }
        }
    }
    assert!(files > 4, "{}", e.ctx());
    // The successor did print it: it shows redacted in the output log and its report.
    let log = std::fs::read_to_string(e.artifact("output.log")).unwrap();
    assert!(log.contains("token=[redacted by fork]"), "{log}");
    let report = std::fs::read_to_string(e.artifact("report-leak.json")).unwrap();
    assert!(report.contains("[redacted by fork]"), "{report}");
}

const LEAK_TOKEN: &str = "sk-live-Q7rX2-leakcheck-0412";

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

/// The successor names a failing test, its classname and message, a metric and a report
/// file after a value the policy passes in, and a second failing test whose name fork's
/// truncation cuts in the middle of it: the value, whole or its beginning, is nowhere in the
/// bundle (verdict.json included), the --junit and --summary reports, the ledger, stdout or
/// stderr; the failing tests still fail the verdict.
#[test]
fn what_the_successor_names_after_a_policy_secret_is_redacted_from_the_verdict() {
    need_root!();
    let env = common::lifecycle::Env::new("hs-named-leak");
    let policy = env.dir.join("secret-policy.toml");
    std::fs::write(
        &policy,
        format!(
            "[decision]\nself_reported = \"accept\"\n[environment]\npass = [\"LANG\"]\n\
             set = {{ API_TOKEN = \"{LEAK_TOKEN}\" }}\n"
        ),
    )
    .unwrap();
    let rt = env.runtime(
        "rt-named-leak",
        "\n[tasks.named]\ncommand = [\"sh\", \"named-leak.sh\"]\n\
         results = { format = \"junit\", path = \"tests.xml\" }\nmetrics = \"metrics.json\"\n",
    );
    // The second case's name: 500 characters and the token, cut at 512 by the parser, so
    // its first 12 characters would be kept.
    std::fs::write(
        rt.join("named-leak.sh"),
        r#"T="$API_TOKEN"
pad=$(printf '%0500d' 0)
printf '<testsuite><testcase classname="c%s" name="leak-%s"><failure message="got %s"/></testcase><testcase name="%s%s"><failure/></testcase><testcase name="ok"/></testsuite>' "$T" "$T" "$T" "$pad" "$T" > "$FORK_REPORTS/tests.xml"
printf '{"m_%s": 1, "speed": 2}' "$T" > "$FORK_REPORTS/metrics.json"
echo hi > "$FORK_REPORTS/report-$T.txt"
echo "token=$T"
"#,
    )
    .unwrap();
    let junit = env.dir.join("named.junit.xml");
    let summary = env.dir.join("named.summary.md");
    let e = common::lifecycle::evaluate_with(
        &env,
        &common::lifecycle::patch("noop-comment"),
        &rt,
        "named",
        &[
            "--task",
            "named",
            "--no-cache",
            "--policy",
            policy.to_str().unwrap(),
            "--junit",
            junit.to_str().unwrap(),
            "--summary",
            summary.to_str().unwrap(),
        ],
        common::lifecycle::With {
            require_verdict: true,
            ..Default::default()
        },
    );
    // The failing tests still count: no APPROVE.
    assert_ne!(e.verdict["verdict"], "APPROVE", "{}", e.ctx());
    assert_eq!(e.verdict["tests"]["failed"], 2, "{}", e.ctx());
    assert!(
        e.summary().contains("leak-[redacted by fork]"),
        "{}",
        e.ctx()
    );
    assert!(
        e.verdict["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "m_[redacted by fork]"),
        "{}",
        e.ctx()
    );
    assert!(e.artifact("report-redacted").is_file(), "{}", e.ctx());
    // Nowhere: neither whole nor the beginning the truncation kept.
    let beginning = &LEAK_TOKEN[..12];
    let mut places = files_under(&e.out);
    places.extend(files_under(&env.data()));
    places.extend([junit, summary]);
    assert!(places.len() > 8, "{places:?}");
    for f in &places {
        let bytes = std::fs::read(f).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.contains(beginning),
            "the token is in {}:\n{text}",
            f.display()
        );
        assert!(
            !f.to_string_lossy().contains(beginning),
            "the token names {}",
            f.display()
        );
    }
    for (what, text) in [("stdout", &e.stdout), ("stderr", &e.stderr)] {
        assert!(!text.contains(beginning), "the token is in {what}: {text}");
    }
}
