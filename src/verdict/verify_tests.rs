use super::*;
use crate::identity::{EphemeralKey, NodeKey};
use crate::verdict::bundle::{write_bundle, BundleError};
use crate::verdict::sign;
use crate::verdict::tests::sample_verdict;
use crate::verdict::ArtifactType;

struct Fixture {
    _dir: tempfile::TempDir,
    out: PathBuf,
    node: NodeKey,
    reports: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let reports = dir.path().join("reports");
    fs::create_dir(&reports).unwrap();
    fs::write(
        reports.join("tests.xml"),
        "<testsuite tests=\"2\"><testcase name=\"a\"/><testcase name=\"b\"/></testsuite>\n",
    )
    .unwrap();
    fs::write(reports.join("metrics.json"), "{\"p99_ms\": 33.6}\n").unwrap();
    let out = dir.path().join("out").join("run-1");
    let eph = EphemeralKey::generate();
    let node = NodeKey::generate();
    let v = sample_verdict(&eph.public());
    write_bundle(
        &out,
        &v,
        &[
            (ArtifactType::TestReport, reports.join("tests.xml")),
            (ArtifactType::Metrics, reports.join("metrics.json")),
        ],
        &eph,
        &node,
    )
    .unwrap();
    eph.destroy();
    Fixture {
        _dir: dir,
        out,
        node,
        reports,
    }
}

#[test]
fn round_trip() {
    let f = fixture();
    let ok = verify_bundle(&f.out, &[f.node.public()]).unwrap();
    assert_eq!(ok.node_key, f.node.public());
    assert_eq!(ok.verdict.artifacts.len(), 2);
    assert_eq!(ok.verdict.artifacts[0].path, "artifacts/tests.xml");
    assert_eq!(
        ok.verdict.artifacts[0].bytes,
        fs::metadata(f.reports.join("tests.xml")).unwrap().len()
    );
    assert_eq!(ok.endorsement.ephemeral_key, ok.successor_key);
    // Through verdict.json too; and verdict.json is the document as written.
    let again = verify_bundle(&f.out.join(VERDICT_FILE), &[f.node.public()]).unwrap();
    assert_eq!(again.verdict, ok.verdict);
    let doc = fs::read(f.out.join(VERDICT_FILE)).unwrap();
    assert_eq!(doc, ok.verdict.to_json_pretty().unwrap());
    // No temporary directory left next to the bundle.
    let siblings: Vec<_> = fs::read_dir(f.out.parent().unwrap()).unwrap().collect();
    assert_eq!(siblings.len(), 1);
}

fn positions(len: usize, count: usize) -> Vec<usize> {
    if len <= count {
        return (0..len).collect();
    }
    let mut p: Vec<usize> = (0..count).map(|i| i * len / count).collect();
    p.extend([len - 1, len - 2]);
    p
}

#[test]
fn any_flipped_byte_fails() {
    let f = fixture();
    let trusted = [f.node.public()];
    let files = [
        VERDICT_FILE,
        VERDICT_ENVELOPE_FILE,
        ENDORSEMENT_FILE,
        "artifacts/tests.xml",
        "artifacts/metrics.json",
    ];
    let mut tried = 0;
    for name in files {
        let path = f.out.join(name);
        let original = fs::read(&path).unwrap();
        for (count, mask) in [(120, 0x01u8), (40, 0x20), (20, 0x80)] {
            for pos in positions(original.len(), count) {
                let mut bytes = original.clone();
                bytes[pos] ^= mask;
                fs::write(&path, &bytes).unwrap();
                let r = verify_bundle(&f.out, &trusted);
                assert!(
                    r.is_err(),
                    "flipping byte {pos} of {name} with {mask:#04x} went unnoticed"
                );
                tried += 1;
            }
        }
        fs::write(&path, &original).unwrap();
        verify_bundle(&f.out, &trusted).unwrap();
    }
    assert!(tried > 500, "{tried}");
}

#[test]
fn trust_is_required() {
    let f = fixture();
    let err = verify_bundle(&f.out, &[]).unwrap_err();
    assert!(matches!(err, VerifyError::NoTrustedKeys));
    assert!(err.to_string().contains("--trust"), "{err}");

    let stranger = NodeKey::generate();
    let err = verify_bundle(&f.out, &[stranger.public()]).unwrap_err();
    assert!(matches!(err, VerifyError::UntrustedNodeKey { .. }), "{err}");
    assert!(err.to_string().contains(&f.node.public().to_string()));
    // Trusting several keys, one of which endorsed it, is fine.
    verify_bundle(&f.out, &[stranger.public(), f.node.public()]).unwrap();
}

fn rewrite_signed(f: &Fixture, verdict: &Verdict, signer: &EphemeralKey) {
    let doc = verdict.to_json_pretty().unwrap();
    let (env, _) = sign::sign_verdict(verdict, &doc, signer).unwrap();
    fs::write(f.out.join(VERDICT_FILE), &doc).unwrap();
    fs::write(
        f.out.join(VERDICT_ENVELOPE_FILE),
        env.to_json_pretty().unwrap(),
    )
    .unwrap();
}

#[test]
fn swapped_ephemeral_key_fails() {
    let f = fixture();
    let ok = verify_bundle(&f.out, &[f.node.public()]).unwrap();
    // An attacker with their own ephemeral key re-signs a changed verdict but keeps the
    // node's endorsement: the endorsement names another ephemeral key.
    let attacker = EphemeralKey::generate();
    let mut forged = ok.verdict.clone();
    forged.verdict = crate::verdict::VerdictKind::Approve;
    forged.evaluation_summary = "All good, trust me.".into();
    forged.successor_key = attacker.public().to_string();
    rewrite_signed(&f, &forged, &attacker);
    let err = verify_bundle(&f.out, &[f.node.public()]).unwrap_err();
    assert!(
        matches!(
            err,
            VerifyError::EndorsementMismatch {
                field: "ephemeral_key",
                ..
            }
        ),
        "{err}"
    );

    // Signed by the attacker while naming the real successor key: bad signature.
    let mut envelope: Envelope =
        serde_json::from_slice(&fs::read(f.out.join(VERDICT_ENVELOPE_FILE)).unwrap()).unwrap();
    let doc = ok.verdict.to_json_pretty().unwrap();
    let st = sign::verdict_statement(&ok.verdict, &doc).unwrap();
    let payload = serde_json::to_vec(&st).unwrap();
    envelope = Envelope {
        signatures: Envelope::sign(PAYLOAD_TYPE, &payload, &attacker).signatures,
        payload: STANDARD.encode(&payload),
        ..envelope
    };
    fs::write(f.out.join(VERDICT_FILE), &doc).unwrap();
    fs::write(
        f.out.join(VERDICT_ENVELOPE_FILE),
        envelope.to_json_pretty().unwrap(),
    )
    .unwrap();
    let err = verify_bundle(&f.out, &[f.node.public()]).unwrap_err();
    assert!(matches!(err, VerifyError::VerdictSignature { .. }), "{err}");
}

#[test]
fn endorsement_of_another_run_fails() {
    // Two runs endorsed by the same node: moving one's endorsement to the other fails.
    let a = fixture();
    let dir = tempfile::tempdir().unwrap();
    let other_out = dir.path().join("run-2");
    let eph = EphemeralKey::generate();
    write_bundle(
        &other_out,
        &sample_verdict(&eph.public()),
        &[],
        &eph,
        &a.node,
    )
    .unwrap();
    fs::copy(
        other_out.join(ENDORSEMENT_FILE),
        a.out.join(ENDORSEMENT_FILE),
    )
    .unwrap();
    let err = verify_bundle(&a.out, &[a.node.public()]).unwrap_err();
    assert!(
        matches!(err, VerifyError::EndorsementMismatch { .. }),
        "{err}"
    );
}

#[test]
fn artifacts_withheld_by_a_mesh_node_verify_only_when_all_are_absent() {
    let f = fixture();
    let trusted = [f.node.public()];
    assert!(!verify_bundle(&f.out, &trusted).unwrap().artifacts_withheld);
    let withheld = f.out.join(WITHHELD_FILE);
    fs::write(&withheld, b"withheld\n").unwrap();
    // The note with the artifacts still there: checked as usual (and the note is fine).
    assert!(!verify_bundle(&f.out, &trusted).unwrap().artifacts_withheld);
    fs::remove_dir_all(f.out.join(ARTIFACTS_DIR)).unwrap();
    assert!(verify_bundle(&f.out, &trusted).unwrap().artifacts_withheld);
    // Without the note, missing artifacts are missing.
    fs::remove_file(&withheld).unwrap();
    let err = verify_bundle(&f.out, &trusted).unwrap_err();
    assert!(matches!(err, VerifyError::ArtifactMissing { .. }), "{err}");
}

#[test]
fn missing_extra_and_replaced_artifacts_fail() {
    let f = fixture();
    let trusted = [f.node.public()];
    let art = f.out.join("artifacts/tests.xml");
    let saved = fs::read(&art).unwrap();

    fs::remove_file(&art).unwrap();
    let err = verify_bundle(&f.out, &trusted).unwrap_err();
    assert!(matches!(err, VerifyError::ArtifactMissing { .. }), "{err}");
    assert!(err.to_string().contains("tests.xml"));

    // A symlink to identical content is still not a regular file.
    let elsewhere = f.out.parent().unwrap().join("copy.xml");
    fs::write(&elsewhere, &saved).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &art).unwrap();
    let err = verify_bundle(&f.out, &trusted).unwrap_err();
    assert!(
        matches!(err, VerifyError::ArtifactNotRegular { .. }),
        "{err}"
    );
    fs::remove_file(&art).unwrap();
    fs::write(&art, &saved).unwrap();
    verify_bundle(&f.out, &trusted).unwrap();

    let mut longer = saved.clone();
    longer.push(b'\n');
    fs::write(&art, &longer).unwrap();
    let err = verify_bundle(&f.out, &trusted).unwrap_err();
    assert!(matches!(err, VerifyError::ArtifactSize { .. }), "{err}");
    fs::write(&art, &saved).unwrap();

    let extra = f.out.join("artifacts/extra.txt");
    fs::write(&extra, b"smuggled").unwrap();
    let err = verify_bundle(&f.out, &trusted).unwrap_err();
    assert!(matches!(err, VerifyError::UnlistedArtifact { .. }), "{err}");
    assert!(err.to_string().contains("extra.txt"));
    fs::remove_file(&extra).unwrap();

    let stray = f.out.join("notes.txt");
    fs::write(&stray, b"x").unwrap();
    let err = verify_bundle(&f.out, &trusted).unwrap_err();
    assert!(matches!(err, VerifyError::UnexpectedFile { .. }), "{err}");
    fs::remove_file(&stray).unwrap();

    fs::remove_file(f.out.join(ENDORSEMENT_FILE)).unwrap();
    let err = verify_bundle(&f.out, &trusted).unwrap_err();
    assert!(matches!(err, VerifyError::Missing { .. }), "{err}");
    assert!(err.to_string().contains(ENDORSEMENT_FILE));

    let err = verify_bundle(&f.reports.join("tests.xml"), &trusted).unwrap_err();
    assert!(matches!(err, VerifyError::NotABundle { .. }), "{err}");
}

#[test]
fn artifacts_are_never_reached_through_a_link_or_a_fifo() {
    let f = fixture();
    let trusted = [f.node.public()];
    let not_regular = || {
        let err = verify_bundle(&f.out, &trusted).unwrap_err();
        assert!(
            matches!(err, VerifyError::ArtifactNotRegular { .. }),
            "{err}"
        );
    };
    // artifacts/ replaced by a link to an identical copy: the listed file is not reached.
    let art_dir = f.out.join(ARTIFACTS_DIR);
    let copy = f.out.parent().unwrap().join("artifacts-copy");
    fs::rename(&art_dir, &copy).unwrap();
    std::os::unix::fs::symlink(&copy, &art_dir).unwrap();
    not_regular();
    fs::remove_file(&art_dir).unwrap();
    fs::rename(&copy, &art_dir).unwrap();
    verify_bundle(&f.out, &trusted).unwrap();
    // A FIFO in place of an artifact is refused without waiting for a writer.
    let art = art_dir.join("tests.xml");
    let saved = fs::read(&art).unwrap();
    fs::remove_file(&art).unwrap();
    nix::unistd::mkfifo(&art, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    not_regular();
    // The bundle directory itself may be named through a link (the caller chose it).
    fs::remove_file(&art).unwrap();
    fs::write(&art, &saved).unwrap();
    let linked = f.out.parent().unwrap().join("latest");
    std::os::unix::fs::symlink(&f.out, &linked).unwrap();
    verify_bundle(&linked, &trusted).unwrap();
}

/// A bundle (no artifacts) of a verdict of schema `version`, its verdict envelope of
/// payloadType `verdict_type` and its endorsement in the format of schema
/// `endorsement_version`, all properly signed. Returns the bundle and the node key.
fn mixed_bundle(
    dir: &Path,
    version: &str,
    verdict_type: &str,
    endorsement_version: &str,
) -> (PathBuf, NodeKey) {
    let out = dir.join(format!(
        "{version}-{}-{endorsement_version}",
        verdict_type.len()
    ));
    fs::create_dir(&out).unwrap();
    let eph = EphemeralKey::generate();
    let node = NodeKey::generate();
    let mut v = sample_verdict(&eph.public());
    v.header.schema.version = version.into();
    let doc = v.to_json_pretty().unwrap();
    let st = sign::verdict_statement(&v, &doc).unwrap();
    let payload = serde_json::to_vec(&st).unwrap();
    let env = Envelope::sign(verdict_type, &payload, &eph);
    let mut for_endorsement = v.clone();
    for_endorsement.header.schema.version = endorsement_version.into();
    let (_, end) = sign::endorse(&for_endorsement, &payload, &eph.public(), &node).unwrap();
    fs::write(out.join(VERDICT_FILE), &doc).unwrap();
    fs::write(
        out.join(VERDICT_ENVELOPE_FILE),
        env.to_json_pretty().unwrap(),
    )
    .unwrap();
    fs::write(out.join(ENDORSEMENT_FILE), end.to_json_pretty().unwrap()).unwrap();
    (out, node)
}

#[test]
fn bundles_of_before_1_4_verify_and_a_mix_of_formats_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    // Both formats, consistent: verified.
    let (new, node) = mixed_bundle(tmp.path(), "1.4", PAYLOAD_TYPE, "1.4");
    let ok = verify_bundle(&new, &[node.public()]).unwrap();
    assert_eq!(ok.verdict.header.schema.version, "1.4");
    let (old, node) = mixed_bundle(tmp.path(), "1.3", LEGACY_VERDICT_PAYLOAD_TYPE, "1.3");
    let ok = verify_bundle(&old, &[node.public()]).unwrap();
    assert_eq!(ok.verdict.header.schema.version, "1.3");
    assert_eq!(ok.node_key, node.public());
    // What write_bundle makes of a 1.3 verdict is the earlier format, and verifies.
    let eph = EphemeralKey::generate();
    let mut v = sample_verdict(&eph.public());
    v.header.schema.version = "1.3".into();
    let written = tmp.path().join("written-1.3");
    write_bundle(&written, &v, &[], &eph, &node).unwrap();
    let env: Envelope =
        serde_json::from_slice(&fs::read(written.join(VERDICT_ENVELOPE_FILE)).unwrap()).unwrap();
    assert_eq!(env.payload_type, LEGACY_VERDICT_PAYLOAD_TYPE);
    verify_bundle(&written, &[node.public()]).unwrap();

    // A mix, each way, each envelope: refused by name, though every signature is good.
    for (version, verdict_type, endorsement_version, bad_file, found) in [
        (
            "1.4",
            LEGACY_VERDICT_PAYLOAD_TYPE,
            "1.4",
            VERDICT_ENVELOPE_FILE,
            LEGACY_VERDICT_PAYLOAD_TYPE,
        ),
        (
            "1.3",
            PAYLOAD_TYPE,
            "1.3",
            VERDICT_ENVELOPE_FILE,
            PAYLOAD_TYPE,
        ),
        (
            "1.4",
            PAYLOAD_TYPE,
            "1.3",
            ENDORSEMENT_FILE,
            LEGACY_ENDORSEMENT_PAYLOAD_TYPE,
        ),
        (
            "1.3",
            LEGACY_VERDICT_PAYLOAD_TYPE,
            "1.4",
            ENDORSEMENT_FILE,
            PAYLOAD_TYPE,
        ),
    ] {
        let (b, node) = mixed_bundle(tmp.path(), version, verdict_type, endorsement_version);
        let err = verify_bundle(&b, &[node.public()]).unwrap_err();
        match &err {
            VerifyError::MixedFormat {
                path,
                found: f,
                version: v,
                ..
            } => {
                assert!(path.ends_with(bad_file), "{err}");
                assert_eq!(f, found, "{err}");
                assert_eq!(v, version, "{err}");
            }
            _ => panic!("{version}/{verdict_type}/{endorsement_version}: {err}"),
        }
        let text = err.to_string();
        assert!(
            text.contains(found) && text.contains(&format!("schema {version}")),
            "{text}"
        );
    }
}

#[test]
fn an_endorsement_is_never_taken_for_a_verdict_nor_the_reverse() {
    let f = fixture();
    let trusted = [f.node.public()];
    let verdict_env = fs::read(f.out.join(VERDICT_ENVELOPE_FILE)).unwrap();
    let endorsement_env = fs::read(f.out.join(ENDORSEMENT_FILE)).unwrap();
    // Both carry the same payloadType: the predicateType tells them apart.
    for bytes in [&verdict_env, &endorsement_env] {
        let env: Envelope = serde_json::from_slice(bytes).unwrap();
        assert_eq!(env.payload_type, "application/vnd.in-toto+json");
    }
    // The node-signed endorsement where the verdict is expected.
    fs::write(f.out.join(VERDICT_ENVELOPE_FILE), &endorsement_env).unwrap();
    let err = verify_bundle(&f.out, &trusted).unwrap_err();
    assert!(matches!(err, VerifyError::Statement { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("predicateType is `https://fork.dev/endorsement/v1`"),
        "{err}"
    );
    // The verdict where the endorsement is expected.
    fs::write(f.out.join(VERDICT_ENVELOPE_FILE), &verdict_env).unwrap();
    fs::write(f.out.join(ENDORSEMENT_FILE), &verdict_env).unwrap();
    let err = verify_bundle(&f.out, &trusted).unwrap_err();
    assert!(
        matches!(err, VerifyError::EndorsementStatement { .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("predicateType is `https://fork.dev/verdict/v1`"),
        "{err}"
    );
    // A node key that signs a verdict statement (say, a node used as its own ephemeral
    // key) still does not make it an endorsement.
    let payload = Envelope::payload_bytes(&serde_json::from_slice(&verdict_env).unwrap()).unwrap();
    let by_node = Envelope::sign(PAYLOAD_TYPE, &payload, &f.node);
    fs::write(
        f.out.join(ENDORSEMENT_FILE),
        by_node.to_json_pretty().unwrap(),
    )
    .unwrap();
    let err = verify_bundle(&f.out, &trusted).unwrap_err();
    assert!(
        matches!(err, VerifyError::EndorsementStatement { .. }),
        "{err}"
    );
    fs::write(f.out.join(ENDORSEMENT_FILE), &endorsement_env).unwrap();
    verify_bundle(&f.out, &trusted).unwrap();
}

#[test]
fn the_endorsement_subject_is_the_verdict_statement() {
    // An endorsement statement whose predicate binds the statement but whose subject
    // names another one (signed by the node all the same) is refused.
    let f = fixture();
    let trusted = [f.node.public()];
    let p = f.out.join(ENDORSEMENT_FILE);
    let env: Envelope = serde_json::from_slice(&fs::read(&p).unwrap()).unwrap();
    let mut st: Statement<Endorsement> =
        serde_json::from_slice(&env.payload_bytes().unwrap()).unwrap();
    st.subject[0]
        .digest
        .insert("sha256".into(), hex::encode([7u8; 32]));
    let forged = Envelope::sign(PAYLOAD_TYPE, &serde_json::to_vec(&st).unwrap(), &f.node);
    fs::write(&p, forged.to_json_pretty().unwrap()).unwrap();
    let err = verify_bundle(&f.out, &trusted).unwrap_err();
    assert!(
        matches!(
            err,
            VerifyError::EndorsementMismatch {
                field: "subject",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn reformatted_envelope_is_not_canonical() {
    let f = fixture();
    let p = f.out.join(VERDICT_ENVELOPE_FILE);
    let env: Envelope = serde_json::from_slice(&fs::read(&p).unwrap()).unwrap();
    fs::write(&p, serde_json::to_vec(&env).unwrap()).unwrap();
    let err = verify_bundle(&f.out, &[f.node.public()]).unwrap_err();
    assert!(matches!(err, VerifyError::NotCanonical { .. }), "{err}");
}

#[test]
fn bundle_refusals() {
    let f = fixture();
    let eph = EphemeralKey::generate();
    let v = sample_verdict(&eph.public());
    // Never overwrites.
    let err = write_bundle(&f.out, &v, &[], &eph, &f.node).unwrap_err();
    assert!(matches!(err, BundleError::Exists { .. }), "{err}");

    let parent = f.out.parent().unwrap().to_path_buf();
    let count = || fs::read_dir(&parent).unwrap().count();
    let before = count();

    let out2 = parent.join("run-2");
    // An artifact that is not a regular file is refused, and nothing is left behind.
    let refused = |artifact: std::path::PathBuf| {
        let err = write_bundle(
            &out2,
            &v,
            &[(ArtifactType::TestReport, artifact)],
            &eph,
            &f.node,
        )
        .unwrap_err();
        assert!(
            matches!(err, BundleError::ArtifactNotRegular { .. }),
            "{err}"
        );
        assert_eq!(count(), before);
    };
    // A symlinked artifact.
    let link = f.reports.join("link.xml");
    std::os::unix::fs::symlink(f.reports.join("tests.xml"), &link).unwrap();
    refused(link);
    // A FIFO, without waiting for a writer.
    let fifo = f.reports.join("pipe.xml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    refused(fifo);

    // An invalid verdict is refused.
    let mut bad = v.clone();
    bad.confidence = 2.0;
    let err = write_bundle(&out2, &bad, &[], &eph, &f.node).unwrap_err();
    assert!(matches!(err, BundleError::Invalid(_)), "{err}");
    assert!(err.to_string().contains("confidence"));
    assert_eq!(count(), before);
    assert!(!out2.exists());
}
