use super::*;

#[test]
fn subjects_and_streams() {
    let s = Subjects::new(false);
    assert_eq!(s.proposals("hermes-demo"), "fork.v1.proposals.hermes-demo");
    assert_eq!(s.all_proposals(), "fork.v1.proposals.>");
    assert_eq!(s.verdicts("abc"), "fork.v1.verdicts.abc");
    assert_eq!(s.all_verdicts(), "fork.v1.verdicts.>");
    assert_eq!(s.proposals_stream(), "FORK_PROPOSALS");
    assert_eq!(s.verdicts_stream(), "FORK_VERDICTS");
    let s = Subjects::new(true);
    assert_eq!(s.proposals("r"), "fork-staging.v1.proposals.r");
    assert_eq!(s.verdicts_stream(), "FORK_STAGING_VERDICTS");
}

#[test]
fn proposal_round_trip_and_patch_checks() {
    let p = Proposal::new(b"--- a\n+++ b\n", "hermes-demo", Some("tests".into()), None).unwrap();
    let back = decode_proposal(&p.to_json().unwrap()).unwrap();
    assert_eq!(back, p);
    assert_eq!(back.patch().unwrap(), b"--- a\n+++ b\n");
    assert!(!back.expired(SystemTime::now()));

    let mut forged = p.clone();
    forged.patch_b64 = STANDARD.encode(b"something else");
    assert!(matches!(forged.patch(), Err(MeshError::PatchHash { .. })));
    let mut bad = p.clone();
    bad.patch_b64 = "***".into();
    assert!(matches!(bad.patch(), Err(MeshError::Malformed { .. })));

    let big = vec![b'x'; MAX_PATCH_BYTES + 1];
    assert!(matches!(
        Proposal::new(&big, "r", None, None),
        Err(MeshError::TooLarge { .. })
    ));

    let old = Proposal::new(b"x", "r", None, Some(Duration::from_millis(1))).unwrap();
    assert!(old.expired(SystemTime::now() + Duration::from_secs(1)));
}

#[test]
fn unknown_generation_is_refused_before_the_body() {
    let p = Proposal::new(b"x", "r", None, None).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&p.to_json().unwrap()).unwrap();
    v["header"]["schema"]["generation"] = 2.into();
    // A generation-2 body this code could not parse.
    v["patch_b64"] = serde_json::json!({"chunks": []});
    let e = decode_proposal(&serde_json::to_vec(&v).unwrap()).unwrap_err();
    assert!(
        matches!(e, MeshError::UnknownGeneration { generation: 2, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("generation 2"), "{e}");
}

#[test]
fn header_checks() {
    let good = new_header(PROPOSAL_TYPE);
    check_header(&good, PROPOSAL_TYPE).unwrap();
    let mut h = good.clone();
    h.schema.generation = 7;
    assert!(matches!(
        check_header(&h, PROPOSAL_TYPE),
        Err(MeshError::UnknownGeneration { generation: 7, .. })
    ));
    let mut h = good.clone();
    h.schema.version = "1.7".into();
    check_header(&h, PROPOSAL_TYPE).unwrap();
    h.schema.version = "2.0".into();
    assert!(check_header(&h, PROPOSAL_TYPE).is_err());
    assert!(check_header(&good, VERDICT_MESSAGE_TYPE).is_err());
    let mut h = good.clone();
    h.message_id = "not-a-uuid".into();
    assert!(check_header(&h, PROPOSAL_TYPE).is_err());
    let mut h = good;
    h.timestamp = "yesterday".into();
    assert!(check_header(&h, PROPOSAL_TYPE).is_err());
}

#[test]
fn bundle_file_names() {
    for ok in [
        "verdict.json",
        "verdict.dsse.json",
        "endorsement.dsse.json",
        "artifacts/tests.xml",
        "steward-0123456789abcdef.dsse.json",
    ] {
        assert!(is_valid_bundle_file(ok), "{ok}");
    }
    for bad in [
        "../x",
        "/etc/passwd",
        "artifacts/../verdict.json",
        "artifacts/a/b",
        "artifacts/.hidden",
        "artifacts/",
        "other.json",
        "artifacts/..",
        "steward-../x.dsse.json",
        "steward-0123.dsse.json",
    ] {
        assert!(!is_valid_bundle_file(bad), "{bad}");
    }
}

#[test]
fn publishing_the_verdict_only_leaves_the_artifacts_out() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("artifacts")).unwrap();
    for n in ["verdict.json", "verdict.dsse.json", "endorsement.dsse.json"] {
        std::fs::write(src.join(n), "{}\n").unwrap();
    }
    std::fs::write(src.join("artifacts/output.log"), "a log").unwrap();
    let key = crate::identity::NodeKey::generate().public();
    let id = uuid::Uuid::new_v4().to_string();
    let m = VerdictMessage::from_bundle(&id, &key, &src, crate::policy::Publish::Verdict).unwrap();
    let names: Vec<&str> = m.files.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "artifacts.withheld",
            "endorsement.dsse.json",
            "verdict.dsse.json",
            "verdict.json"
        ]
    );
    let dst = t.path().join("dst");
    write_bundle_files(&dst, &m.files).unwrap();
    assert!(!dst.join("artifacts").exists());
    let all = VerdictMessage::from_bundle(&id, &key, &src, crate::policy::Publish::Bundle).unwrap();
    assert!(all.files.contains_key("artifacts/output.log"));
}

#[test]
fn bundle_files_round_trip_and_hostile_names_write_nothing() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("artifacts")).unwrap();
    for (n, c) in [
        ("verdict.json", "{}\n"),
        ("verdict.dsse.json", "{\"a\":1}\n"),
        ("endorsement.dsse.json", "{\"b\":2}\n"),
        ("artifacts/tests.xml", "<x/>"),
    ] {
        std::fs::write(src.join(n), c).unwrap();
    }
    let key = crate::identity::NodeKey::generate().public();
    let id = uuid::Uuid::new_v4().to_string();
    let m = VerdictMessage::from_bundle(&id, &key, &src, crate::policy::Publish::Bundle).unwrap();
    let back = decode_verdict_message(&m.to_json().unwrap()).unwrap();
    assert_eq!(back.files.len(), 4);
    let dst = t.path().join("o/dst");
    write_bundle_files(&dst, &back.files).unwrap();
    assert_eq!(
        std::fs::read(dst.join("artifacts/tests.xml")).unwrap(),
        b"<x/>"
    );
    // An existing directory is never written into.
    assert!(write_bundle_files(&dst, &back.files).is_err());

    let mut hostile = back.files.clone();
    hostile.insert("../escaped".into(), STANDARD.encode(b"x"));
    let dst2 = t.path().join("dst2");
    assert!(matches!(
        write_bundle_files(&dst2, &hostile),
        Err(MeshError::BadFileName(_))
    ));
    assert!(!dst2.exists() && !t.path().join("escaped").exists());
    let mut m2 = back.clone();
    m2.files = hostile;
    let bytes = serde_json::to_vec(&m2).unwrap();
    assert!(matches!(
        decode_verdict_message(&bytes),
        Err(MeshError::BadFileName(_))
    ));

    let mut m3 = back;
    m3.proposal_id = "fork.v1.>".into();
    assert!(decode_verdict_message(&serde_json::to_vec(&m3).unwrap()).is_err());
}

#[test]
fn oversized_messages_are_refused() {
    let big = vec![b' '; MAX_VERDICT_MESSAGE_BYTES + 1];
    assert!(matches!(
        decode_verdict_message(&big),
        Err(MeshError::TooLarge { .. })
    ));
    let big = vec![b' '; MAX_PROPOSAL_MESSAGE_BYTES + 1];
    assert!(matches!(
        decode_proposal(&big),
        Err(MeshError::TooLarge { .. })
    ));
}
