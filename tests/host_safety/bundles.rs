//! The bundle is private to fork's user, and the policy's secrets are scrubbed from it.

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
