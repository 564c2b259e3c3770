//! Links a successor or the runtime's owner plants (tools swapped for a link mid-evaluation,
//! a linked directory in the source, fork's own rerun directories turned into links) are never
//! followed.

use super::*;

#[test]
fn tools_swapped_for_a_link_mid_evaluation_are_never_followed() {
    need_root!();
    let env = common::lifecycle::Env::new("hs-toctou");
    let secret_dir = root_only(&env);
    // Three runs, 2 s each: the tools are copied for every run.
    let rt = env.runtime(
        "rt-toctou",
        "\n[tasks.inventory]\ncommand = [\"sh\", \"-c\", \
         \"ls -la $FORK_TOOLS > $FORK_REPORTS/inventory.txt; \
         cat $FORK_TOOLS/* >> $FORK_REPORTS/inventory.txt 2>&1; sleep 2\"]\nrepeat = 3\n",
    );
    // The runtime's owner swaps tools/ for a link once the plan has validated the manifest:
    // as soon as the first sandbox's run directory appears (during the first run; a fixed
    // delay of 1 s came before the plan's end under software emulation, where the manifest
    // check then refused the link instead), at most 120 s.
    let (tools, moved, target) = (rt.join("tools"), rt.join("tools.orig"), secret_dir.clone());
    let run_root = env.run_root.clone();
    let swapper = std::thread::spawn(move || {
        let began = std::time::Instant::now();
        let sandbox_seen = || {
            std::fs::read_dir(&run_root).is_ok_and(|rd| {
                rd.flatten().any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with("fork-") && !name.starts_with("fork-eval-")
                })
            })
        };
        while !sandbox_seen() && began.elapsed() < std::time::Duration::from_secs(120) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // One atomic exchange: `tools` is never missing in between.
        std::os::unix::fs::symlink(&target, &moved).unwrap();
        nix::fcntl::renameat2(
            nix::fcntl::AT_FDCWD,
            &moved,
            nix::fcntl::AT_FDCWD,
            &tools,
            nix::fcntl::RenameFlags::RENAME_EXCHANGE,
        )
        .unwrap();
    });
    let e = common::lifecycle::evaluate(
        &env,
        &common::lifecycle::patch("noop-comment"),
        &rt,
        "toctou",
        &["--task", "inventory", "--no-ledger"],
    );
    swapper.join().unwrap();
    // Refused as bad input naming the tools, not the manifest check (which ran before).
    assert_eq!(e.code, 65, "{}", e.ctx());
    // (The copy that meets the link first refuses it: a side's source tree, which holds
    // tools/, or a run's tools. When the swap comes before a side's copy of the source,
    // which copies the link as a link, that copy is not the tree the evaluation began
    // with, and the source check refuses it naming tools/: the sandbox's run directory,
    // the swap's signal, appears before the side's trees are copied.)
    let refused_link = (e.stderr.contains("copying the tools of the runtime")
        || e.stderr.contains("copying the source tree of the runtime"))
        && e.stderr.contains("is a symbolic link");
    let source_moved = e
        .stderr
        .contains("the runtime's source tree changed during the evaluation");
    assert!(
        (refused_link || source_moved) && e.stderr.contains("tools"),
        "{}",
        e.stderr
    );
    // The secret is nowhere but where it was: not in a bundle, the run root, the runtime.
    let found: Vec<PathBuf> = holds_secret(&env.dir)
        .into_iter()
        .filter(|p| !p.starts_with(&secret_dir))
        .collect();
    assert!(found.is_empty(), "the secret was copied to {found:?}");
}

#[test]
fn a_linked_directory_inside_the_source_is_copied_as_a_link_never_followed() {
    need_root!();
    let env = common::lifecycle::Env::new("hs-srclink");
    let secret_dir = root_only(&env);
    let rt = env.runtime(
        "rt-srclink",
        "\n[tasks.peek]\ncommand = [\"sh\", \"-c\", \
         \"ls -la hermes > $FORK_REPORTS/peek.txt; cat hermes/leak/secret.txt >> $FORK_REPORTS/peek.txt 2>&1; true\"]\n",
    );
    std::os::unix::fs::symlink(&secret_dir, rt.join("hermes/leak")).unwrap();
    let e = common::lifecycle::evaluate(
        &env,
        &common::lifecycle::patch("noop-comment"),
        &rt,
        "srclink",
        &["--task", "peek", "--no-ledger"],
    );
    assert_eq!(e.code, 0, "{}", e.ctx());
    let peek = std::fs::read_to_string(e.artifact("report-peek.txt")).unwrap();
    assert!(
        peek.contains("leak ->"),
        "the link was not copied as a link: {peek}"
    );
    let found: Vec<PathBuf> = holds_secret(&env.dir)
        .into_iter()
        .filter(|p| !p.starts_with(&secret_dir))
        .collect();
    assert!(found.is_empty(), "the secret was copied to {found:?}");
}

// ---------------------------------------------------------------------------------------
// Bundles and run directories stay private; the policy's secrets never reach a bundle.
// ---------------------------------------------------------------------------------------

/// A successor whose tests fail is run again in the same sandbox (`[decision] reruns`,
/// default 2), on the disk it wrote. After its first attempt it swaps fork's own
/// directories on that disk for links to host paths: `/tmp/.fork-shm` (the sandbox's
/// /dev/shm, which the root supervisor used to make and chmod 1777 by path before the
/// rerun) and, in a second task, the workspace `/tmp/successor` itself (beneath which the
/// supervisor reads the results and checks the protected tree). Fork never follows either:
/// the links are removed after the run, the host directory they point to (the test's own,
/// 0700, holding a file) keeps its mode and contents and is never read (its file's name
/// appears nowhere in the verdict), and the evaluation still ends in a verdict with
/// nothing of it left: the rerun runs on fork's own /dev/shm again (NEEDS_REVISION, the
/// tests still fail), and a workspace the successor replaced is a protected tree that
/// cannot be checked (REJECT); a link left where the workspace's `home` goes (a third task)
/// refuses the rerun, with a caveat saying why (NEEDS_REVISION).
#[test]
fn a_successor_cannot_turn_its_rerun_workspace_into_links_to_host_paths() {
    need_root!();
    let env = common::lifecycle::Env::new("hs-rerun-links");
    let victim = env.dir.join("victim");
    std::fs::create_dir_all(victim.join("src/tests")).unwrap();
    std::fs::write(victim.join("src/tests/host-file-name-leak.py"), "x = 1\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o700)).unwrap();
    let before = listing(&victim);
    let v = victim.display();
    let failing = "printf '<testsuite name=\\\"s\\\" tests=\\\"1\\\" failures=\\\"1\\\">\
                   <testcase name=\\\"t\\\"><failure>x</failure></testcase></testsuite>' \
                   > $FORK_REPORTS/tests.xml";
    let toml = format!(
        "\n[tasks.plant-shm]\ncommand = [\"sh\", \"-c\", \"if [ ! -e /tmp/.planted ]; then \
         touch /tmp/.planted; mv /tmp/.fork-shm /tmp/.old-shm && ln -s {v} /tmp/.fork-shm; fi; \
         {failing}\"]\nresults = {{ format = \"junit\", path = \"tests.xml\" }}\n\
         \n[tasks.plant-ws]\ncommand = [\"sh\", \"-c\", \"{failing}; cd /; \
         mv /tmp/successor /tmp/old-successor && ln -s {v} /tmp/successor\"]\n\
         results = {{ format = \"junit\", path = \"tests.xml\" }}\n\
         \n[tasks.plant-home]\ncommand = [\"sh\", \"-c\", \"{failing}; \
         mv /tmp/successor/home /tmp/old-home && ln -s {v} /tmp/successor/home\"]\n\
         results = {{ format = \"junit\", path = \"tests.xml\" }}\n"
    );
    let rt = env.runtime("rt", &toml);
    for (task, want) in [
        ("plant-shm", "NEEDS_REVISION"),
        ("plant-ws", "REJECT"),
        ("plant-home", "NEEDS_REVISION"),
    ] {
        let e = common::lifecycle::evaluate_with(
            &env,
            &common::lifecycle::patch("noop-comment"),
            &rt,
            task,
            &["--task", task, "--no-ledger"],
            common::lifecycle::With {
                require_verdict: true,
                ..Default::default()
            },
        );
        assert_eq!(e.verdict["verdict"], want, "{task}: {}", e.ctx());
        let m = std::fs::symlink_metadata(&victim).unwrap();
        assert_eq!(
            m.mode() & 0o7777,
            0o700,
            "{task}: the host directory's mode was changed: {}",
            e.ctx()
        );
        assert_eq!(
            listing(&victim),
            before,
            "{task}: the host directory changed: {}",
            e.ctx()
        );
        assert!(
            !e.verdict.to_string().contains("host-file-name-leak")
                && !e.stdout.contains("host-file-name-leak"),
            "{task}: the host directory was read: {}",
            e.ctx()
        );
        // A link left where the workspace's home goes refuses the rerun, said in a caveat.
        if task == "plant-home" {
            assert!(
                e.caveats()
                    .iter()
                    .any(|c| c.contains("were not rerun") && c.contains("never follows")),
                "{task}: {}",
                e.ctx()
            );
        }
    }
}
