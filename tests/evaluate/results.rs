//! What the evaluation reports: `--json` prints exactly the verdict document, results
//! behind a symlink are never read, and whatever a successor leaves never suppresses its
//! verdict.

use super::*;

#[test]
fn json_prints_exactly_the_verdict_document() {
    need_default_policy!();
    let env = Env::new("ev-json");
    for (name, code) in [("noop-comment", 0), ("touches-protected", 1)] {
        // The contract task: the bench's timing may be inconclusive on a loaded machine.
        let e = evaluate(
            &env,
            &patch(name),
            &demo(),
            name,
            &["--json", "--task", "contract"],
        );
        assert_eq!(e.code, code, "{}", e.ctx());
        let printed: Value = serde_json::from_str(&e.stdout)
            .unwrap_or_else(|err| panic!("stdout is not one JSON document ({err}): {}", e.stdout));
        assert_eq!(printed, e.verdict, "stdout differs from verdict.json");
        assert_eq!(printed["run_id"], e.verdict["run_id"]);
        let want = format!(
            "sha256:{}",
            sha256_hex(&std::fs::read(patch(name)).unwrap())
        );
        assert_eq!(printed["patch_hash"], want.as_str());
        assert_eq!(e.verdict["patch_hash"], want.as_str());
    }
}

/// The successor replaces its reports directory, or its whole workspace, with a symlink to a
/// host directory holding a forged all-passing tests.xml and a secret: the supervisor reads
/// the results beneath the capped disk's root without following any link, so the forgery is
/// never read (no APPROVE) and no host file travels into the bundle.
#[test]
fn results_behind_a_symlink_are_never_read() {
    need_default_policy!();
    let env = Env::new("ev-linked-reports");
    let host = env.dir.join("host-side");
    std::fs::create_dir_all(host.join("reports")).unwrap();
    let forged = "<testsuite name=\"x\" tests=\"1\"><testcase classname=\"forged\" name=\"all_good\"/></testsuite>";
    std::fs::write(host.join("tests.xml"), forged).unwrap();
    std::fs::write(host.join("reports/tests.xml"), forged).unwrap();
    std::fs::write(host.join("secret.txt"), "HOST-SECRET").unwrap();
    std::fs::write(host.join("reports/secret.txt"), "HOST-SECRET").unwrap();
    let h = host.display();
    let rt = env.runtime(
        "hermes-demo",
        &format!(
            "\n[tasks.link_reports]\ncommand = [\"sh\", \"-c\", \"rm -rf /tmp/successor/reports && ln -s {h} /tmp/successor/reports\"]\n\
             results = {{ format = \"junit\", path = \"tests.xml\" }}\n\
             \n[tasks.link_workspace]\ncommand = [\"sh\", \"-c\", \"cd / && mv /tmp/successor /tmp/moved && ln -s {h} /tmp/successor\"]\n\
             results = {{ format = \"junit\", path = \"tests.xml\" }}\n"
        ),
    );
    // Replacing the whole workspace also takes the protected tree away from where the
    // post-run check reads it: that check fails closed (REJECT).
    for (task, code) in [("link_reports", 2), ("link_workspace", 1)] {
        let e = evaluate(
            &env,
            &patch("noop-comment"),
            &rt,
            task,
            &["--task", task, "--no-ledger"],
        );
        assert_eq!(
            e.code,
            code,
            "{task}: the forged results must not be read: {}",
            e.ctx()
        );
        assert_eq!(e.verdict["tests"]["passed"], 0, "{task}: {}", e.ctx());
        let bundle = e.out.join("artifacts");
        for entry in std::fs::read_dir(&bundle).unwrap().flatten() {
            let bytes = std::fs::read(entry.path()).unwrap();
            let text = String::from_utf8_lossy(&bytes);
            assert!(
                !text.contains("HOST-SECRET") && !text.contains("forged"),
                "{task}: a host file travelled into {}",
                entry.path().display()
            );
        }
    }
    assert_eq!(
        std::fs::read_to_string(host.join("secret.txt")).unwrap(),
        "HOST-SECRET"
    );
}

/// The hostile leftovers of `what_a_successor_leaves_never_suppresses_its_verdict`, one
/// task each. Each writes only beneath its own reports directory, workspace and /tmp (its
/// private disk), a few kilobytes in all, and ends within a second or two.
const LEFTOVER_TASKS: &str = r#"
[tasks.long_report_name]
command = ["python3", "-c", "import os; r = os.environ['FORK_REPORTS']; open(r + '/' + 'n' * 250, 'w').write('x'); open(r + '/' + 'm' * 250, 'w').write('y'); open(r + '/a b', 'w').write('1'); open(r + '/a_b', 'w').write('2')"]

[tasks.predicted_log]
command = ["python3", "-c", "import os\nfor i in range(4):\n    open('/tmp/.fork-output-%d.log' % i, 'a').close()\nopen(os.environ['FORK_REPORTS'] + '/tests.xml', 'w').write('<testsuite tests=\"1\" failures=\"1\"><testcase name=\"t\"><failure message=\"no\"/></testcase></testsuite>')"]
results = { format = "junit", path = "tests.xml" }

[tasks.deep_tree]
command = ["python3", "-c", "import os\nr = os.environ['FORK_REPORTS']\nopen(r + '/tests.xml', 'w').write('<testsuite tests=\"1\" failures=\"1\"><testcase name=\"t\"><failure message=\"no\"/></testcase></testsuite>')\nfor top in (r, os.environ['HOME']):\n    os.chdir(top)\n    for i in range(2500):\n        os.mkdir('d' * 40)\n        os.chdir('d' * 40)\n"]
results = { format = "junit", path = "tests.xml" }
"#;

/// Whatever the successor leaves, the evaluation ends in a recorded verdict whose bundle
/// verifies: report files with 250-character names (and names that sanitize alike), files
/// at the names fork once used for its output logs on the sandbox's disk, and directory
/// trees nested deeper than PATH_MAX in the reports directory and the workspace, which a
/// rerun of the failing tests must clear and hand back.
#[test]
fn what_a_successor_leaves_never_suppresses_its_verdict() {
    need_default_policy!();
    let env = Env::new("ev-leftovers");
    let rt = env.runtime("rt", LEFTOVER_TASKS);
    let tasks = ["long_report_name", "predicted_log", "deep_tree"];
    for task in tasks {
        let with = With {
            require_verdict: true,
            ..With::default()
        };
        let e = evaluate_with(
            &env,
            &patch("noop-comment"),
            &rt,
            task,
            &["--task", task],
            with,
        );
        match task {
            "long_report_name" => {
                assert_eq!(e.code, 0, "{}", e.ctx());
                let names: Vec<String> = std::fs::read_dir(e.out.join("artifacts"))
                    .unwrap()
                    .flatten()
                    .map(|x| x.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("report-") || n.contains("-report-"))
                    .collect();
                assert_eq!(names.len(), 4, "every report file kept apart: {names:?}");
                assert!(names.iter().all(|n| n.len() <= 100), "{names:?}");
            }
            _ => {
                // The failing test was rerun (reports cleared, workspace handed back).
                assert_eq!(e.code, 2, "{}", e.ctx());
                assert!(e.artifact("retry1-tests.xml").is_file(), "{}", e.ctx());
                assert!(e.artifact("retry1-output.log").is_file(), "{}", e.ctx());
            }
        }
    }
    // Each verdict is recorded in the ledger.
    let o = env.cmd().args(["history", "--json"]).output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    let rows: Value = serde_json::from_slice(&o.stdout).unwrap();
    let recorded: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["task"].as_str().unwrap())
        .collect();
    for task in tasks {
        assert!(
            recorded.contains(&task),
            "{task} not in the ledger: {recorded:?}"
        );
    }
}
