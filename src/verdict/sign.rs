//! Signatures: DSSE envelopes over in-toto Statements v1: the verdict, and the node's
//! endorsement of the run's ephemeral key.
//!
//! * DSSE (Dead Simple Signing Envelope, protocol v1.0): the signature is ed25519 over
//!   `PAE(payloadType, payload)` where
//!   `PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body`, LEN being the
//!   byte length in ASCII decimal without leading zeros ([`pae`]). The envelope is
//!   `{"payload": base64, "payloadType": ..., "signatures": [{"keyid": ..., "sig": base64}]}`;
//!   we write the standard base64 alphabet with padding and accept either alphabet, as the
//!   spec requires. `keyid` is our key id (`PublicKey::key_id`), a hint only.
//! * Every envelope fork writes (schema 1.4 on) has the in-toto Attestation Framework's
//!   payloadType [`PAYLOAD_TYPE`] (`application/vnd.in-toto+json`) and carries an in-toto
//!   Statement v1 (`_type` `https://in-toto.io/Statement/v1`); what the statement says is
//!   told by its `predicateType`, which a verifier must check ([`parse_statement`]): the
//!   envelopes share one payloadType, so an endorsement must never pass for a verdict.
//! * The verdict statement (`predicateType` `https://fork.dev/verdict/v1`): the predicate is
//!   the verdict document, the subjects are what the verdict is about, each with a `sha256`
//!   digest in bare hex: `patch` (the patch, `patch_hash`), `source` (the patched source
//!   tree, `source_hash`) and `verdict.json` (the exact bytes of the bundle's verdict
//!   document). It is signed by the run's ephemeral key, the verdict's `successor_key`.
//! * The endorsement statement (`predicateType` `https://fork.dev/endorsement/v1`) is signed
//!   by the node key and binds the ephemeral key to the run: its subject `verdict-statement`
//!   is the verdict envelope's payload, its predicate an [`Endorsement`].
//! * Before schema 1.4 the verdict envelope's payloadType was
//!   [`LEGACY_VERDICT_PAYLOAD_TYPE`] (the same statement), and the endorsement envelope's was
//!   [`LEGACY_ENDORSEMENT_PAYLOAD_TYPE`] over a bare [`LegacyEndorsement`]. Such bundles are
//!   still verified ([`EnvelopeFormat`]); a mix of the two formats is refused.

use crate::identity::{PublicKey, SigningIdentity};
use crate::verdict::{sha256_digest, Verdict};
use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use thiserror::Error;

/// payloadType of every envelope fork writes (schema 1.4 on): the in-toto Attestation
/// Framework's.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// payloadType of the verdict envelope before schema 1.4 (still verified).
pub const LEGACY_VERDICT_PAYLOAD_TYPE: &str = "application/vnd.fork.verdict+json";
/// payloadType of the endorsement envelope before schema 1.4 (still verified).
pub const LEGACY_ENDORSEMENT_PAYLOAD_TYPE: &str = "application/vnd.fork.endorsement+json";
/// in-toto Statement v1 `_type`.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// `predicateType` of a verdict statement.
pub const VERDICT_PREDICATE_TYPE: &str = "https://fork.dev/verdict/v1";
/// `predicateType` of an endorsement statement (before schema 1.4: the `_type` of the bare
/// endorsement, [`LegacyEndorsement`]).
pub const ENDORSEMENT_PREDICATE_TYPE: &str = "https://fork.dev/endorsement/v1";
/// The first verdict schema minor version (`1.x`) whose envelopes are in-toto ones.
pub const IN_TOTO_SCHEMA_MINOR: u32 = 4;
/// Subject name, in an endorsement statement, of the verdict envelope's payload.
pub const SUBJECT_VERDICT_STATEMENT: &str = "verdict-statement";
/// Subject name of the patch.
pub const SUBJECT_PATCH: &str = "patch";
/// Subject name of the patched source tree.
pub const SUBJECT_SOURCE: &str = "source";
/// Subject name of the verdict document's bytes.
pub const SUBJECT_VERDICT_DOCUMENT: &str = "verdict.json";

/// Errors building, decoding or checking envelopes.
#[derive(Debug, Error)]
pub enum SignError {
    #[error("cannot serialize the {what}: {source}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("the envelope's {field} is not valid base64")]
    Base64 { field: &'static str },
    #[error("the envelope's payloadType is `{found}`, expected `{expected}`")]
    PayloadType { found: String, expected: String },
    #[error("the envelope has no signature that verifies with {key}")]
    NoValidSignature { key: String },
    #[error("the verdict's successor_key is {in_verdict}, but it is being signed with {signer}")]
    KeyMismatch { in_verdict: String, signer: String },
    #[error("the verdict's {field} `{value}` is not sha256:<hex>")]
    BadHash { field: &'static str, value: String },
    #[error(
        "the payload is not an in-toto Statement v1 with predicateType `{expected}`: {reason}"
    )]
    Statement {
        expected: &'static str,
        reason: String,
    },
}

/// The envelope format of a bundle, told by its verdict's `header.schema.version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvelopeFormat {
    /// Schema 1.4 on: every envelope is [`PAYLOAD_TYPE`] over an in-toto Statement v1.
    InToto,
    /// Before 1.4: [`LEGACY_VERDICT_PAYLOAD_TYPE`] and [`LEGACY_ENDORSEMENT_PAYLOAD_TYPE`].
    Legacy,
}

impl EnvelopeFormat {
    /// The format of a verdict of schema `version` (`1.x`; anything that is not a `1.x`
    /// below 1.4 is taken as the current format, and fails the schema checks if wrong).
    pub fn of_schema(version: &str) -> EnvelopeFormat {
        let minor = version
            .split_once('.')
            .filter(|(major, _)| *major == "1")
            .and_then(|(_, minor)| minor.parse::<u32>().ok());
        match minor {
            Some(m) if m < IN_TOTO_SCHEMA_MINOR => EnvelopeFormat::Legacy,
            _ => EnvelopeFormat::InToto,
        }
    }

    /// payloadType of the verdict envelope.
    pub fn verdict_payload_type(self) -> &'static str {
        match self {
            EnvelopeFormat::InToto => PAYLOAD_TYPE,
            EnvelopeFormat::Legacy => LEGACY_VERDICT_PAYLOAD_TYPE,
        }
    }

    /// payloadType of the endorsement envelope.
    pub fn endorsement_payload_type(self) -> &'static str {
        match self {
            EnvelopeFormat::InToto => PAYLOAD_TYPE,
            EnvelopeFormat::Legacy => LEGACY_ENDORSEMENT_PAYLOAD_TYPE,
        }
    }
}

/// The DSSE pre-authentication encoding of `payload` with type `payload_type`.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let t = payload_type.as_bytes();
    let mut out = Vec::with_capacity(32 + t.len() + payload.len());
    out.extend_from_slice(b"DSSEv1 ");
    out.extend_from_slice(t.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(t);
    out.push(b' ');
    out.extend_from_slice(payload.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload);
    out
}

const LENIENT: GeneralPurposeConfig =
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
const STANDARD_LENIENT: GeneralPurpose = GeneralPurpose::new(&alphabet::STANDARD, LENIENT);
const URL_SAFE_LENIENT: GeneralPurpose = GeneralPurpose::new(&alphabet::URL_SAFE, LENIENT);

/// Decodes base64 in the standard or the URL-safe alphabet, padded or not (DSSE: verifiers
/// must accept either).
pub fn decode_base64_any(s: &str) -> Option<Vec<u8>> {
    STANDARD_LENIENT
        .decode(s)
        .or_else(|_| URL_SAFE_LENIENT.decode(s))
        .ok()
}

/// One DSSE signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvelopeSignature {
    /// Unauthenticated hint: the signer's key id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyid: Option<String>,
    /// base64 of the 64-byte ed25519 signature.
    pub sig: String,
}

/// A DSSE envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// base64 of the serialized body.
    pub payload: String,
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    pub signatures: Vec<EnvelopeSignature>,
}

impl Envelope {
    /// Signs `payload` as `payload_type` with `signer`.
    pub fn sign(payload_type: &str, payload: &[u8], signer: &dyn SigningIdentity) -> Envelope {
        let sig = signer.sign_message(&pae(payload_type, payload));
        Envelope {
            payload: STANDARD.encode(payload),
            payload_type: payload_type.to_string(),
            signatures: vec![EnvelopeSignature {
                keyid: Some(signer.public_key().key_id()),
                sig: STANDARD.encode(sig),
            }],
        }
    }

    /// The decoded payload (not yet verified).
    pub fn payload_bytes(&self) -> Result<Vec<u8>, SignError> {
        decode_base64_any(&self.payload).ok_or(SignError::Base64 { field: "payload" })
    }

    /// DSSE verification against one key: the payloadType must be `expected_type` and a
    /// signature must verify with `key` over the PAE. Returns the payload.
    pub fn verify(&self, expected_type: &str, key: &PublicKey) -> Result<Vec<u8>, SignError> {
        let payload = self.payload_bytes()?;
        let message = pae(&self.payload_type, &payload);
        let mut verified = false;
        for s in &self.signatures {
            let sig = decode_base64_any(&s.sig).ok_or(SignError::Base64 { field: "sig" })?;
            if key.verify(&message, &sig).is_ok() {
                verified = true;
                break;
            }
        }
        if !verified {
            return Err(SignError::NoValidSignature {
                key: key.to_string(),
            });
        }
        if self.payload_type != expected_type {
            return Err(SignError::PayloadType {
                found: self.payload_type.clone(),
                expected: expected_type.to_string(),
            });
        }
        Ok(payload)
    }

    /// The envelope as written in a bundle: pretty JSON and a final newline.
    pub fn to_json_pretty(&self) -> Result<Vec<u8>, SignError> {
        let mut out = serde_json::to_vec_pretty(self).map_err(|source| SignError::Serialize {
            what: "envelope",
            source,
        })?;
        out.push(b'\n');
        Ok(out)
    }
}

/// An in-toto Statement v1 subject.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subject {
    pub name: String,
    /// Algorithm → lowercase hex digest (we write `sha256`).
    pub digest: BTreeMap<String, String>,
}

impl Subject {
    /// A subject with one sha256 digest in bare hex.
    pub fn sha256(name: &str, hex: &str) -> Subject {
        Subject {
            name: name.to_string(),
            digest: BTreeMap::from([("sha256".to_string(), hex.to_string())]),
        }
    }
}

/// An in-toto Statement v1 with predicate `P`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Statement<P> {
    #[serde(rename = "_type")]
    pub statement_type: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: P,
}

/// Parses `payload` as an in-toto Statement v1 whose `predicateType` is `predicate_type`:
/// `_type` and `predicateType` are checked before the predicate is read, so a statement of
/// another kind is refused by name (not as a predicate of the wrong shape), and at least
/// one subject is required, each with a digest.
pub fn parse_statement<P: DeserializeOwned>(
    payload: &[u8],
    predicate_type: &'static str,
) -> Result<Statement<P>, SignError> {
    let fail = |reason: String| SignError::Statement {
        expected: predicate_type,
        reason,
    };
    let head: Statement<IgnoredAny> =
        serde_json::from_slice(payload).map_err(|e| fail(e.to_string()))?;
    if head.statement_type != STATEMENT_TYPE {
        return Err(fail(format!(
            "_type is `{}`, expected `{STATEMENT_TYPE}`",
            head.statement_type
        )));
    }
    if head.predicate_type != predicate_type {
        return Err(fail(format!("predicateType is `{}`", head.predicate_type)));
    }
    if head.subject.is_empty() || head.subject.iter().any(|s| s.digest.is_empty()) {
        return Err(fail("a subject with a digest is required".to_string()));
    }
    serde_json::from_slice(payload).map_err(|e| fail(format!("its predicate: {e}")))
}

/// The node's endorsement of a run's ephemeral key: the predicate of an endorsement
/// statement, signed by the node key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endorsement {
    /// The run's ephemeral key (the verdict's `successor_key`).
    pub ephemeral_key: PublicKey,
    pub run_id: String,
    pub patch_hash: String,
    pub task_hash: String,
    /// The endorsing node key.
    pub node_key: PublicKey,
    /// RFC 3339, UTC.
    pub timestamp: String,
    /// `sha256:<hex>` of the verdict envelope's payload (the statement): the node endorses
    /// this verdict only, so even a leaked ephemeral key cannot sign another one. The
    /// statement's subject `verdict-statement` carries the same digest.
    pub statement_sha256: String,
}

/// The endorsement as written before schema 1.4: a bare document (no statement) with a
/// `_type`, in an envelope of [`LEGACY_ENDORSEMENT_PAYLOAD_TYPE`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LegacyEndorsement {
    /// [`ENDORSEMENT_PREDICATE_TYPE`].
    #[serde(rename = "_type")]
    pub endorsement_type: String,
    pub ephemeral_key: PublicKey,
    pub run_id: String,
    pub patch_hash: String,
    pub task_hash: String,
    pub node_key: PublicKey,
    pub timestamp: String,
    pub statement_sha256: String,
}

impl LegacyEndorsement {
    /// The endorsement it carries.
    pub fn into_endorsement(self) -> Endorsement {
        Endorsement {
            ephemeral_key: self.ephemeral_key,
            run_id: self.run_id,
            patch_hash: self.patch_hash,
            task_hash: self.task_hash,
            node_key: self.node_key,
            timestamp: self.timestamp,
            statement_sha256: self.statement_sha256,
        }
    }
}

/// A statement subject's name and its sha256 digest (`sha256:<hex>`), if it has one.
pub type SubjectDigest = (String, Option<String>);

/// Reads an endorsement payload of `format` (NOT verified: the caller checks the envelope's
/// signature). Returns the endorsement and, for the in-toto format, the statement's subject
/// digests (name, `sha256:<hex>`).
pub fn parse_endorsement(
    payload: &[u8],
    format: EnvelopeFormat,
) -> Result<(Endorsement, Vec<SubjectDigest>), SignError> {
    match format {
        EnvelopeFormat::InToto => {
            let st: Statement<Endorsement> = parse_statement(payload, ENDORSEMENT_PREDICATE_TYPE)?;
            let subjects = st
                .subject
                .iter()
                .map(|s| {
                    let digest = s.digest.get("sha256").map(|h| format!("sha256:{h}"));
                    (s.name.clone(), digest)
                })
                .collect();
            Ok((st.predicate, subjects))
        }
        EnvelopeFormat::Legacy => {
            let legacy: LegacyEndorsement =
                serde_json::from_slice(payload).map_err(|e| SignError::Statement {
                    expected: ENDORSEMENT_PREDICATE_TYPE,
                    reason: format!("not a schema 1.0-1.3 endorsement either: {e}"),
                })?;
            if legacy.endorsement_type != ENDORSEMENT_PREDICATE_TYPE {
                return Err(SignError::Statement {
                    expected: ENDORSEMENT_PREDICATE_TYPE,
                    reason: format!("the endorsement's _type is `{}`", legacy.endorsement_type),
                });
            }
            Ok((legacy.into_endorsement(), Vec::new()))
        }
    }
}

fn bare_hex<'a>(field: &'static str, value: &'a str) -> Result<&'a str, SignError> {
    value
        .strip_prefix("sha256:")
        .filter(|h| crate::verdict::is_sha256_hex(h))
        .ok_or_else(|| SignError::BadHash {
            field,
            value: value.to_string(),
        })
}

/// The statement for `verdict`, whose document bytes (verdict.json) are `document`.
pub fn verdict_statement(
    verdict: &Verdict,
    document: &[u8],
) -> Result<Statement<Verdict>, SignError> {
    let doc_digest = sha256_digest(document);
    Ok(Statement {
        statement_type: STATEMENT_TYPE.to_string(),
        subject: vec![
            Subject::sha256(SUBJECT_PATCH, bare_hex("patch_hash", &verdict.patch_hash)?),
            Subject::sha256(
                SUBJECT_SOURCE,
                bare_hex("source_hash", &verdict.source_hash)?,
            ),
            Subject::sha256(
                SUBJECT_VERDICT_DOCUMENT,
                bare_hex("verdict.json", &doc_digest)?,
            ),
        ],
        predicate_type: VERDICT_PREDICATE_TYPE.to_string(),
        predicate: verdict.clone(),
    })
}

/// Signs the verdict statement with the run's ephemeral key, which must be the verdict's
/// `successor_key`. Returns the envelope and the payload bytes it signs.
pub fn sign_verdict(
    verdict: &Verdict,
    document: &[u8],
    ephemeral: &dyn SigningIdentity,
) -> Result<(Envelope, Vec<u8>), SignError> {
    let signer = ephemeral.public_key().to_string();
    if verdict.successor_key != signer {
        return Err(SignError::KeyMismatch {
            in_verdict: verdict.successor_key.clone(),
            signer,
        });
    }
    let statement = verdict_statement(verdict, document)?;
    let payload = serde_json::to_vec(&statement).map_err(|source| SignError::Serialize {
        what: "statement",
        source,
    })?;
    let format = EnvelopeFormat::of_schema(&verdict.header.schema.version);
    Ok((
        Envelope::sign(format.verdict_payload_type(), &payload, ephemeral),
        payload,
    ))
}

/// The node's endorsement of `ephemeral` for `verdict`'s run, over the verdict envelope's
/// payload `statement_payload`, signed by `node`: an endorsement statement (in the format of
/// the verdict's schema version).
pub fn endorse(
    verdict: &Verdict,
    statement_payload: &[u8],
    ephemeral: &PublicKey,
    node: &dyn SigningIdentity,
) -> Result<(Endorsement, Envelope), SignError> {
    let statement_sha256 = sha256_digest(statement_payload);
    let endorsement = Endorsement {
        ephemeral_key: *ephemeral,
        run_id: verdict.run_id.clone(),
        patch_hash: verdict.patch_hash.clone(),
        task_hash: verdict.task_hash.clone(),
        node_key: node.public_key(),
        timestamp: crate::verdict::now_rfc3339(),
        statement_sha256: statement_sha256.clone(),
    };
    let format = EnvelopeFormat::of_schema(&verdict.header.schema.version);
    let payload = match format {
        EnvelopeFormat::InToto => serde_json::to_vec(&Statement {
            statement_type: STATEMENT_TYPE.to_string(),
            subject: vec![Subject::sha256(
                SUBJECT_VERDICT_STATEMENT,
                bare_hex("statement", &statement_sha256)?,
            )],
            predicate_type: ENDORSEMENT_PREDICATE_TYPE.to_string(),
            predicate: endorsement.clone(),
        }),
        EnvelopeFormat::Legacy => serde_json::to_vec(&LegacyEndorsement {
            endorsement_type: ENDORSEMENT_PREDICATE_TYPE.to_string(),
            ephemeral_key: endorsement.ephemeral_key,
            run_id: endorsement.run_id.clone(),
            patch_hash: endorsement.patch_hash.clone(),
            task_hash: endorsement.task_hash.clone(),
            node_key: endorsement.node_key,
            timestamp: endorsement.timestamp.clone(),
            statement_sha256: endorsement.statement_sha256.clone(),
        }),
    }
    .map_err(|source| SignError::Serialize {
        what: "endorsement",
        source,
    })?;
    let envelope = Envelope::sign(format.endorsement_payload_type(), &payload, node);
    Ok((endorsement, envelope))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{EphemeralKey, NodeKey};
    use ed25519_dalek::{Signer as _, SigningKey};

    /// A signer with a fixed seed, for the DSSE test vectors.
    struct SeedSigner(SigningKey);
    impl SigningIdentity for SeedSigner {
        fn public_key(&self) -> PublicKey {
            PublicKey::from_bytes(&self.0.verifying_key().to_bytes()).unwrap()
        }
        fn sign_message(&self, message: &[u8]) -> [u8; 64] {
            self.0.sign(message).to_bytes()
        }
    }

    fn seed_signer(seed_hex: &str) -> SeedSigner {
        let seed: [u8; 32] = hex::decode(seed_hex).unwrap().try_into().unwrap();
        SeedSigner(SigningKey::from_bytes(&seed))
    }

    #[test]
    fn pae_matches_the_spec_example() {
        // DSSE protocol.md, "Test Vectors".
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
        // LEN counts bytes, not characters; an empty body ends with "0 ".
        assert_eq!(
            pae("application/vnd.exämple+json", b""),
            b"DSSEv1 29 application/vnd.ex\xc3\xa4mple+json 0 ".to_vec()
        );
    }

    /// The vectors of secure-systems-lab/dsse testvectors/vectors.json (key A is the
    /// RFC 8032 test key 1). ed25519 is deterministic, so our signature must equal theirs.
    #[test]
    fn dsse_test_vectors() {
        let a = seed_signer("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60");
        assert_eq!(
            hex::encode(a.public_key().as_bytes()),
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
        );
        let body = br#"{"_type":"https://in-toto.io/Statement/v1"}"#;
        let t = "application/vnd.in-toto+json";
        assert_eq!(
            hex::encode(pae(t, body)),
            "445353457631203238206170706c69636174696f6e2f766e642e696e2d746f746f2b6a736f6e203433207b225f74797065223a2268747470733a2f2f696e2d746f746f2e696f2f53746174656d656e742f7631227d"
        );
        let env = Envelope::sign(t, body, &a);
        assert_eq!(
            env.payload,
            "eyJfdHlwZSI6Imh0dHBzOi8vaW4tdG90by5pby9TdGF0ZW1lbnQvdjEifQ=="
        );
        assert_eq!(
            env.signatures[0].sig,
            "2WAfaHm5jluo0w+0rk8uVkluELJYWjSmU9x7EUzx+AyteDGJ4/nqyJXfmAUVFIAoQafWm7AxBZNw5M9ixNHiCA=="
        );
        assert_eq!(env.verify(t, &a.public_key()).unwrap(), body.to_vec());

        // url-safe-base64: accepted.
        let url: Envelope = serde_json::from_str(
            r#"{"payload": "-_-_Pj8=", "payloadType": "application/vnd.in-toto+json",
                "signatures": [{"sig": "P-_KHICeR7tI6S_YyejJTRtrXhcQyQ2LYPaL8h90KjC9qN8HU_svOQ6TuDOT1HIrsGW886DbWNWcCmX5twLrAw==", "keyid": "A"}]}"#,
        )
        .unwrap();
        assert_eq!(
            url.verify(t, &a.public_key()).unwrap(),
            vec![0xfb, 0xff, 0xbf, 0x3e, 0x3f]
        );

        // payload-type-swapped: rejected.
        let mut swapped = env.clone();
        swapped.payload_type = "application/vnd.example.other+json".into();
        assert!(matches!(
            swapped.verify("application/vnd.example.other+json", &a.public_key()),
            Err(SignError::NoValidSignature { .. })
        ));
        // A right signature, but not the type we support: rejected.
        assert!(matches!(
            env.verify(LEGACY_VERDICT_PAYLOAD_TYPE, &a.public_key()),
            Err(SignError::PayloadType { .. })
        ));

        // empty-payload: accepted.
        let empty: Envelope = serde_json::from_str(
            r#"{"payload": "", "payloadType": "application/vnd.in-toto+json",
                "signatures": [{"sig": "gSggCAaTLTYyRH6FIDBem6meyIynsYy8RTHVzwx9tnTb7Bg/1jMWnuVgI/gffqmbsC2VX5/jHfkkDqsj7CDbDg==", "keyid": "A"}]}"#,
        )
        .unwrap();
        assert_eq!(empty.verify(t, &a.public_key()).unwrap(), Vec::<u8>::new());

        // Key B's signature does not verify as key A's.
        let b = seed_signer("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb");
        let by_b = Envelope::sign(t, body, &b);
        assert_eq!(
            by_b.signatures[0].sig,
            "c1+67/aT0yqEpwx8PsVY3MLHsj9D0CZ014/Fv/QlG59P+9CobUZ7xECJ/V3USG0Ob9CiE5LjReEZUzNF2l7eBw=="
        );
        assert!(by_b.verify(t, &a.public_key()).is_err());
    }

    #[test]
    fn verdict_statement_and_endorsement() {
        let eph = EphemeralKey::generate();
        let node = NodeKey::generate();
        let v = crate::verdict::tests::sample_verdict(&eph.public());
        let doc = v.to_json_pretty().unwrap();
        let (env, payload) = sign_verdict(&v, &doc, &eph).unwrap();
        assert_eq!(env.payload_type, PAYLOAD_TYPE);
        assert_eq!(PAYLOAD_TYPE, "application/vnd.in-toto+json");
        assert_eq!(
            env.signatures[0].keyid.as_deref(),
            Some(eph.public().key_id().as_str())
        );
        let verified = env.verify(PAYLOAD_TYPE, &eph.public()).unwrap();
        assert_eq!(verified, payload);
        let st: Statement<Verdict> = parse_statement(&verified, VERDICT_PREDICATE_TYPE).unwrap();
        assert_eq!(st.statement_type, STATEMENT_TYPE);
        assert_eq!(st.predicate_type, VERDICT_PREDICATE_TYPE);
        assert_eq!(st.predicate, v);
        let names: Vec<_> = st.subject.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["patch", "source", "verdict.json"]);
        assert_eq!(
            format!("sha256:{}", st.subject[0].digest["sha256"]),
            v.patch_hash
        );
        assert_eq!(
            format!("sha256:{}", st.subject[2].digest["sha256"]),
            sha256_digest(&doc)
        );

        // Signing with a key other than the verdict's successor_key is refused.
        let other = EphemeralKey::generate();
        assert!(matches!(
            sign_verdict(&v, &doc, &other),
            Err(SignError::KeyMismatch { .. })
        ));

        // The endorsement: a statement about the verdict statement, signed by the node.
        let (e, env2) = endorse(&v, &payload, &eph.public(), &node).unwrap();
        assert_eq!(env2.payload_type, PAYLOAD_TYPE);
        let p = env2.verify(PAYLOAD_TYPE, &node.public()).unwrap();
        let st: Statement<Endorsement> = parse_statement(&p, ENDORSEMENT_PREDICATE_TYPE).unwrap();
        assert_eq!(st.predicate, e);
        assert_eq!(st.subject.len(), 1);
        assert_eq!(st.subject[0].name, SUBJECT_VERDICT_STATEMENT);
        assert_eq!(
            format!("sha256:{}", st.subject[0].digest["sha256"]),
            sha256_digest(&payload)
        );
        let (back, subjects) = parse_endorsement(&p, EnvelopeFormat::InToto).unwrap();
        assert_eq!(back, e);
        assert_eq!(
            subjects,
            [(
                SUBJECT_VERDICT_STATEMENT.to_string(),
                Some(sha256_digest(&payload))
            )]
        );
        assert_eq!(back.ephemeral_key, eph.public());
        assert_eq!(back.node_key, node.public());
        assert_eq!(back.statement_sha256, sha256_digest(&payload));
        assert!(env2.verify(PAYLOAD_TYPE, &eph.public()).is_err());

        // One payloadType for both: the predicateType tells them apart, both ways.
        let err = parse_statement::<Verdict>(&p, VERDICT_PREDICATE_TYPE).unwrap_err();
        assert!(
            err.to_string()
                .contains("predicateType is `https://fork.dev/endorsement/v1`"),
            "{err}"
        );
        let err = parse_statement::<Endorsement>(&payload, ENDORSEMENT_PREDICATE_TYPE).unwrap_err();
        assert!(
            err.to_string()
                .contains("predicateType is `https://fork.dev/verdict/v1`"),
            "{err}"
        );
        assert!(parse_endorsement(&payload, EnvelopeFormat::InToto).is_err());
        assert!(parse_endorsement(&p, EnvelopeFormat::Legacy).is_err());
    }

    #[test]
    fn schema_versions_before_1_4_sign_in_the_earlier_format() {
        assert_eq!(EnvelopeFormat::of_schema("1.4"), EnvelopeFormat::InToto);
        assert_eq!(EnvelopeFormat::of_schema("1.10"), EnvelopeFormat::InToto);
        assert_eq!(
            EnvelopeFormat::of_schema(crate::verdict::SCHEMA_VERSION),
            EnvelopeFormat::InToto
        );
        for old in ["1.0", "1.1", "1.2", "1.3"] {
            assert_eq!(EnvelopeFormat::of_schema(old), EnvelopeFormat::Legacy);
        }
        let eph = EphemeralKey::generate();
        let node = NodeKey::generate();
        let mut v = crate::verdict::tests::sample_verdict(&eph.public());
        v.header.schema.version = "1.3".into();
        let doc = v.to_json_pretty().unwrap();
        let (env, payload) = sign_verdict(&v, &doc, &eph).unwrap();
        assert_eq!(env.payload_type, LEGACY_VERDICT_PAYLOAD_TYPE);
        let (e, env2) = endorse(&v, &payload, &eph.public(), &node).unwrap();
        assert_eq!(env2.payload_type, LEGACY_ENDORSEMENT_PAYLOAD_TYPE);
        let p = env2
            .verify(LEGACY_ENDORSEMENT_PAYLOAD_TYPE, &node.public())
            .unwrap();
        let legacy: LegacyEndorsement = serde_json::from_slice(&p).unwrap();
        assert_eq!(legacy.endorsement_type, ENDORSEMENT_PREDICATE_TYPE);
        assert_eq!(legacy.into_endorsement(), e);
        assert_eq!(parse_endorsement(&p, EnvelopeFormat::Legacy).unwrap().0, e);
    }
}
