//! `fork consensus` and `fork approve` through the real binary: three nodes (their own
//! keys) evaluate one patch; votes are counted per unique trusted node key, with a quorum
//! of responders and an absolute floor, and the human steward's gate.

mod common;
use common::lifecycle::{demo, need_root, node_cmd, patch};
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn ok(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// A node: its own key, its verdict on `patch`.
fn node(root: &Path, name: &str, patch: &Path) -> (String, PathBuf) {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("runs")).unwrap();
    let k = node_cmd(&dir).arg("keygen").output().unwrap();
    assert_eq!(k.status.code(), Some(0), "{}", ok(&k));
    let key = String::from_utf8_lossy(&k.stdout).trim().to_string();
    let out = dir.join("verdict");
    let e = node_cmd(&dir)
        .arg("evaluate")
        .arg(patch)
        .arg("--runtime")
        .arg(demo())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(matches!(e.status.code(), Some(0) | Some(2)), "{}", ok(&e));
    (key, out)
}

fn consensus(root: &Path, args: &[&str], bundles: &[&PathBuf]) -> (i32, serde_json::Value) {
    let mut c = fork_cmd(&root.join("runs"));
    c.arg("consensus").arg("--json").args(args);
    for b in bundles {
        c.arg(b);
    }
    let o = c.output().unwrap();
    let v = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", ok(&o)));
    (o.status.code().unwrap_or(-1), v)
}

#[test]
fn quorum_floor_trust_and_the_steward_gate() {
    need_root!();
    let root = scratch("consensus");
    std::fs::create_dir_all(root.join("runs")).unwrap();
    let patch = patch("swap-compressor");
    let (k1, b1) = node(&root, "n1", &patch);
    let (k2, b2) = node(&root, "n2", &patch);
    let (k3, b3) = node(&root, "n3", &patch);
    let p = patch.to_str().unwrap();
    let all = ["--trust", &k1, "--trust", &k2, "--trust", &k3, "--patch", p];

    // Unanimous.
    let (code, rep) = consensus(&root, &all, &[&b1, &b2, &b3]);
    assert_eq!(code, 0, "{rep}");
    assert_eq!(rep["approvals"], 3);
    // The floor: 3 approvals of 3 responders, but 4 required.
    let mut floor = all.to_vec();
    floor.extend(["--min-nodes", "4"]);
    let (code, rep) = consensus(&root, &floor, &[&b1, &b2, &b3]);
    assert_eq!(code, 1, "{rep}");
    // One node offline: 2 of 2 responders approve; with a floor of 3 that is not enough.
    let (code, _) = consensus(&root, &all, &[&b1, &b2]);
    assert_eq!(code, 0);
    let mut floor3 = all.to_vec();
    floor3.extend(["--min-nodes", "3"]);
    let (code, _) = consensus(&root, &floor3, &[&b1, &b2]);
    assert_eq!(code, 1);
    // An untrusted node's vote is refused; the same bundle twice counts once.
    let (code, rep) = consensus(
        &root,
        &["--trust", &k1, "--trust", &k2, "--patch", p],
        &[&b1, &b2, &b3, &b1],
    );
    assert_eq!(code, 0, "{rep}");
    assert_eq!(rep["responders"], 2, "{rep}");
    let reasons: Vec<String> = rep["refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["reason"].as_str().unwrap().to_string())
        .collect();
    assert!(reasons.contains(&"untrusted".to_string()), "{rep}");
    assert!(
        reasons.iter().any(|r| r == "replayed" || r == "duplicate"),
        "{rep}"
    );
    // Votes about another patch do not count.
    let other = common::lifecycle::patch("noop-comment");
    let (code, rep) = consensus(
        &root,
        &[
            "--trust",
            &k1,
            "--trust",
            &k2,
            "--trust",
            &k3,
            "--patch",
            other.to_str().unwrap(),
        ],
        &[&b1, &b2, &b3],
    );
    assert_eq!(code, 1, "{rep}");
    assert_eq!(rep["responders"], 0, "{rep}");

    // A node whose policy gates patches smaller than this one REJECTs it by its size, and
    // its vote is on the same patch (the whole file's hash, not the prefix it kept): its
    // dissent counts. With it, 1 of 2 responders approve, short of 2/3.
    let strict_dir = root.join("strict");
    std::fs::create_dir_all(strict_dir.join("runs")).unwrap();
    let k = node_cmd(&strict_dir).arg("keygen").output().unwrap();
    assert_eq!(k.status.code(), Some(0), "{}", ok(&k));
    let k4 = String::from_utf8_lossy(&k.stdout).trim().to_string();
    let strict = strict_dir.join("strict.toml");
    std::fs::write(&strict, "[gates]\nmax_patch_bytes = 100\n").unwrap();
    let b4 = strict_dir.join("verdict");
    let e = node_cmd(&strict_dir)
        .arg("evaluate")
        .arg(&patch)
        .arg("--runtime")
        .arg(demo())
        .arg("--policy")
        .arg(&strict)
        .arg("--out")
        .arg(&b4)
        .output()
        .unwrap();
    assert_eq!(e.status.code(), Some(1), "a size-gate REJECT: {}", ok(&e));
    let (code, rep) = consensus(
        &root,
        &[
            "--trust",
            &k1,
            "--trust",
            &k4,
            "--patch",
            p,
            "--min-nodes",
            "1",
        ],
        &[&b1, &b4],
    );
    assert_eq!(code, 1, "{rep}");
    assert_eq!(rep["responders"], 2, "{rep}");
    assert_eq!(rep["approvals"], 1, "{rep}");
    assert_eq!(rep["refused"].as_array().unwrap().len(), 0, "{rep}");

    // The human gate: a steward key; without its approval, no consensus.
    let steward_dir = root.join("steward");
    std::fs::create_dir_all(&steward_dir).unwrap();
    let sk = steward_dir.join("steward.key");
    let g = Command::new(fork_bin())
        .args(["keygen", "--out"])
        .arg(&sk)
        .output()
        .unwrap();
    assert_eq!(g.status.code(), Some(0), "{}", ok(&g));
    let steward = String::from_utf8_lossy(&g.stdout).trim().to_string();
    let mut gated = all.to_vec();
    gated.extend(["--steward", &steward]);
    let (code, rep) = consensus(&root, &gated, &[&b1, &b2, &b3]);
    assert_eq!(code, 1, "{rep}");
    let a = Command::new(fork_bin())
        .arg("approve")
        .arg(&b2)
        .arg("--key")
        .arg(&sk)
        .args(["--trust", &k2])
        .output()
        .unwrap();
    assert_eq!(a.status.code(), Some(0), "{}", ok(&a));
    let (code, rep) = consensus(&root, &gated, &[&b1, &b2, &b3]);
    assert_eq!(code, 0, "{rep}");
    // The approved bundle still verifies.
    let v = Command::new(fork_bin())
        .arg("verify")
        .arg(&b2)
        .args(["--trust", &k2])
        .output()
        .unwrap();
    assert_eq!(v.status.code(), Some(0), "{}", ok(&v));
}

/// A `--trust` argument that is neither a key nor a file is refused as what it most likely
/// is, a missing file (usage, exit 64), by every command that takes one; a directory is
/// not a key file.
#[test]
fn a_missing_trust_file_is_named_as_missing() {
    let root = scratch("trust-missing");
    std::fs::create_dir_all(root.join("runs")).unwrap();
    let missing = root.join("nodes/n1.pub");
    let p = patch("swap-compressor");
    for (what, arg, expect) in [
        ("missing", missing.to_str().unwrap(), "no such file"),
        ("directory", root.to_str().unwrap(), "is not a regular file"),
    ] {
        for cmd in [
            vec![
                "consensus",
                "--trust",
                arg,
                "--patch",
                p.to_str().unwrap(),
                "b",
            ],
            vec!["verify", "b", "--trust", arg],
        ] {
            let o = fork_cmd(&root.join("runs")).args(&cmd).output().unwrap();
            assert_eq!(o.status.code(), Some(64), "{what} {cmd:?}: {}", ok(&o));
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                err.contains(expect) && err.contains("--trust"),
                "{what} {cmd:?}: {err}"
            );
            assert!(
                !err.contains("is not a public key"),
                "{what} {cmd:?}: {err}"
            );
        }
    }
}

/// A FIFO given as a bundle, or as a bundle's verdict.json, is refused at once by
/// `fork consensus`, never waited on.
#[test]
fn a_fifo_bundle_is_refused_at_once() {
    let root = scratch("consensus-fifo");
    std::fs::create_dir_all(root.join("runs")).unwrap();
    let key = root.join("k.key");
    let g = Command::new(fork_bin())
        .args(["keygen", "--out"])
        .arg(&key)
        .output()
        .unwrap();
    assert_eq!(g.status.code(), Some(0), "{}", ok(&g));
    let public = String::from_utf8_lossy(&g.stdout).trim().to_string();
    let fifo = root.join("fifo");
    let bundle = root.join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    let mode = nix::sys::stat::Mode::from_bits_truncate(0o600);
    nix::unistd::mkfifo(&fifo, mode).unwrap();
    nix::unistd::mkfifo(&bundle.join("verdict.json"), mode).unwrap();
    for input in [&fifo, &bundle] {
        let mut c = fork_cmd(&root.join("runs"));
        c.args(["consensus", "--json", "--trust", &public])
            .arg(input)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        let started = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > std::time::Duration::from_secs(10) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("consensus waited on the FIFO {}", input.display());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", ok(&o));
        let rep: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(rep["responders"], 0, "{rep}");
        assert_eq!(rep["refused"].as_array().unwrap().len(), 1, "{rep}");
    }
}
