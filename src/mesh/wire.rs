//! What the mesh puts around a message's body on the bus: its NATS headers, and the
//! runtime's name as a subject token.
//!
//! Every message published by fork carries, besides `Nats-Msg-Id` (the stream's
//! de-duplication id), a copy of its body header's routing fields:
//!
//! ```text
//! Fork-Message-Type:       Proposal | VerdictMessage | StewardApproval
//! Fork-Schema-Generation:  1
//! Fork-Schema-Version:     1.x
//! ```
//! so that a consumer can route or skip a message without parsing its body. A receiver
//! refuses a message whose header names another schema generation before reading its
//! body, and, once the body is read, a message whose headers are missing or disagree with
//! the body's header (naming the header and both values).

use crate::mesh::messages::MeshError;
use crate::verdict::{Header, SCHEMA_GENERATION};
use async_nats::HeaderMap;

/// The message type (`header.message_type` of the body).
pub const MESSAGE_TYPE_HEADER: &str = "Fork-Message-Type";
/// The schema generation (`header.schema.generation` of the body).
pub const SCHEMA_GENERATION_HEADER: &str = "Fork-Schema-Generation";
/// The schema version (`header.schema.version` of the body).
pub const SCHEMA_VERSION_HEADER: &str = "Fork-Schema-Version";
/// The stream's de-duplication id (NATS's own header).
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";
/// The longest runtime name the mesh carries in a subject.
pub const MAX_RUNTIME_TOKEN: usize = 64;

/// The NATS headers of a message whose body header is `h`, with the stream's
/// de-duplication id `msg_id`.
pub fn headers(h: &Header, msg_id: &str) -> HeaderMap {
    let mut m = HeaderMap::new();
    m.insert(MSG_ID_HEADER, msg_id);
    m.insert(MESSAGE_TYPE_HEADER, h.message_type.as_str());
    m.insert(
        SCHEMA_GENERATION_HEADER,
        h.schema.generation.to_string().as_str(),
    );
    m.insert(SCHEMA_VERSION_HEADER, h.schema.version.as_str());
    m
}

fn get<'a>(headers: Option<&'a HeaderMap>, name: &str) -> Option<&'a str> {
    headers
        .and_then(|h| h.get(name))
        .map(<_ as AsRef<str>>::as_ref)
}

/// The message type a message's headers announce (for routing; the body is checked
/// against it when it is read).
pub fn message_type(headers: Option<&HeaderMap>) -> Option<&str> {
    get(headers, MESSAGE_TYPE_HEADER)
}

/// Refuses, before its body is read, a message whose `Fork-Schema-Generation` header names
/// a generation this code does not read. (A message without the header is left to
/// [`check_headers`].)
pub fn check_generation_header(headers: Option<&HeaderMap>) -> Result<(), MeshError> {
    let Some(g) = get(headers, SCHEMA_GENERATION_HEADER) else {
        return Ok(());
    };
    match g.trim().parse::<u64>() {
        Ok(g) if g == u64::from(SCHEMA_GENERATION) => Ok(()),
        Ok(g) => Err(MeshError::UnknownGeneration {
            message_type: message_type(headers)
                .unwrap_or("unknown")
                .chars()
                .take(64)
                .collect(),
            generation: g,
        }),
        Err(_) => Err(MeshError::BadHeader(format!(
            "NATS header {SCHEMA_GENERATION_HEADER} is `{}`, not a number",
            g.chars().take(64).collect::<String>()
        ))),
    }
}

/// Checks a message's NATS headers against its body's header: each of
/// `Fork-Message-Type`, `Fork-Schema-Generation` and `Fork-Schema-Version` present and
/// equal to the body's (else [`MeshError::HeaderMismatch`], naming the header).
pub fn check_headers(headers: Option<&HeaderMap>, body: &Header) -> Result<(), MeshError> {
    let generation = body.schema.generation.to_string();
    for (name, want) in [
        (MESSAGE_TYPE_HEADER, body.message_type.as_str()),
        (SCHEMA_GENERATION_HEADER, generation.as_str()),
        (SCHEMA_VERSION_HEADER, body.schema.version.as_str()),
    ] {
        let found = get(headers, name);
        if found != Some(want) {
            return Err(MeshError::HeaderMismatch {
                header: name,
                in_header: found.map(|f| f.chars().take(64).collect()),
                in_body: want.chars().take(64).collect(),
            });
        }
    }
    Ok(())
}

/// Checks that a runtime's name (fork.toml `[runtime] name`) can be one subject token:
/// 1 to 64 ASCII letters, digits, `-` or `_` (so never `.`, `*`, `>` or white space).
pub fn check_runtime_token(name: &str) -> Result<(), MeshError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_RUNTIME_TOKEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(MeshError::Input(format!(
            "the runtime's name `{}` (fork.toml [runtime] name) cannot be a mesh subject token: \
             the mesh needs 1 to {MAX_RUNTIME_TOKEN} ASCII letters, digits, `-` or `_`; rename the runtime",
            name.chars().take(80).collect::<String>()
        )))
    }
}

/// [`decode_proposal`](crate::mesh::messages::decode_proposal) of a message received with NATS `headers`: a generation header
/// this code does not read is refused before the body is parsed, and the headers must
/// agree with the body's header ([`check_headers`]).
pub fn decode_proposal_message(
    headers: Option<&async_nats::HeaderMap>,
    bytes: &[u8],
) -> Result<crate::mesh::messages::Proposal, MeshError> {
    check_generation_header(headers)?;
    let p = crate::mesh::messages::decode_proposal(bytes)?;
    check_headers(headers, &p.header)?;
    Ok(p)
}

/// [`decode_verdict_message`](crate::mesh::messages::decode_verdict_message) of a message received with NATS `headers` (checked as
/// [`decode_proposal_message`] does).
pub fn decode_verdict_message_with(
    headers: Option<&async_nats::HeaderMap>,
    bytes: &[u8],
) -> Result<crate::mesh::messages::VerdictMessage, MeshError> {
    check_generation_header(headers)?;
    let m = crate::mesh::messages::decode_verdict_message(bytes)?;
    check_headers(headers, &m.header)?;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::messages::{new_header, PROPOSAL_TYPE};

    #[test]
    fn headers_mirror_the_body_and_a_mismatch_is_named() {
        let h = new_header(PROPOSAL_TYPE);
        let m = headers(&h, "id-1");
        assert_eq!(message_type(Some(&m)), Some(PROPOSAL_TYPE));
        assert_eq!(get(Some(&m), MSG_ID_HEADER), Some("id-1"));
        check_generation_header(Some(&m)).unwrap();
        check_headers(Some(&m), &h).unwrap();

        let mut other = m.clone();
        other.insert(MESSAGE_TYPE_HEADER, "VerdictMessage");
        let e = check_headers(Some(&other), &h).unwrap_err();
        assert!(e.to_string().contains(MESSAGE_TYPE_HEADER), "{e}");
        assert!(e.to_string().contains("VerdictMessage"), "{e}");

        let mut v = m.clone();
        v.insert(SCHEMA_VERSION_HEADER, "1.999");
        let e = check_headers(Some(&v), &h).unwrap_err();
        assert!(e.to_string().contains(SCHEMA_VERSION_HEADER), "{e}");

        let e = check_headers(None, &h).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");

        let mut g = m.clone();
        g.insert(SCHEMA_GENERATION_HEADER, "2");
        assert!(matches!(
            check_generation_header(Some(&g)),
            Err(MeshError::UnknownGeneration { generation: 2, .. })
        ));
        g.insert(SCHEMA_GENERATION_HEADER, "two");
        assert!(matches!(
            check_generation_header(Some(&g)),
            Err(MeshError::BadHeader(_))
        ));
        check_generation_header(None).unwrap();
    }

    #[test]
    fn runtime_tokens() {
        for ok in ["hermes-demo", "a", "A_b-9", &"x".repeat(64)] {
            check_runtime_token(ok).unwrap();
        }
        for bad in ["", "a.b", "a*", ">", "a b", "é", &"x".repeat(65), "a/b"] {
            let e = check_runtime_token(bad).unwrap_err();
            assert!(e.to_string().contains("subject token"), "{e}");
        }
    }
}
