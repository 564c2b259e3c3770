//! The bus: one NATS connection with JetStream.
//!
//! * Connecting retries with a capped exponential backoff, and the client reconnects on its
//!   own, forever, when the server goes away (a node survives a NATS restart).
//! * Two streams, created when missing (never reconfigured when present):
//!   `<PREFIX>_PROPOSALS` on `<prefix>.v1.proposals.>` and `<PREFIX>_VERDICTS` on
//!   `<prefix>.v1.verdicts.>`, file storage, bounded in age, bytes, count and message size.
//!   (A proposals stream made by an earlier fork, on `<prefix>.v1.proposals` alone, gets
//!   the new subject added; nothing else of an existing stream is changed.)
//! * Each node reads proposals through a durable pull consumer named after its node key
//!   and the runtime it serves (`fork-node-<key id>-<runtime>`), filtered on that runtime's
//!   subject, so it never receives another runtime's proposals: a node that starts late
//!   still receives what is pending, acks explicitly once its verdict is published, and
//!   gets a message again if it crashed before that.
//! * Every message is published with its NATS headers ([`crate::mesh::wire::headers`]).

use crate::identity::PublicKey;
use crate::mesh::messages::{
    MeshError, Subjects, MAX_PROPOSAL_MESSAGE_BYTES, MAX_VERDICT_MESSAGE_BYTES,
};
use crate::mesh::wire;
use crate::verdict::Header;
use async_nats::jetstream::{self, consumer, stream};
use std::time::Duration;

/// How long proposals and verdicts are kept.
pub const RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How long a proposal may stay unacknowledged before it is delivered again (a node in
/// the middle of an evaluation extends it with progress acks, see [`PROGRESS_EVERY`]).
pub const ACK_WAIT: Duration = Duration::from_secs(30);
/// How often a node working on a proposal tells the server it still is.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// How many times a proposal is delivered to one node at most.
pub const MAX_DELIVER: i64 = 4;
/// Room for the NATS headers on top of a message's payload.
const HEADER_ROOM: usize = 4 << 10;
/// How many times a stream is looked up (and created when missing) before its
/// creation's refusal is final; with [`backoff`] between them, about 11 s of waiting in
/// all (plus each request's own time-out when the server does not answer); an interrupt
/// (SIGINT, SIGTERM) ends it at once.
const STREAM_ATTEMPTS: usize = 8;
/// How long a command that must end (`mesh propose`, `mesh approve`: at most their
/// `--timeout`; `mesh serve --once`) tries to reach the server before it gives up (exit
/// 69).
pub const CONNECT_GIVE_UP: Duration = Duration::from_secs(30);
/// Largest backoff between connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The delay before reconnect attempt `n` (1-based): 100 ms doubling, capped at 5 s.
pub fn backoff(attempt: usize) -> Duration {
    let exp = attempt.saturating_sub(1).min(16) as u32;
    Duration::from_millis(100u64.saturating_mul(1u64 << exp)).min(MAX_BACKOFF)
}

/// Whether a refusal to create a stream can be outdated by the time it arrives (see
/// [`Bus::stream`]).
fn transient(e: &jetstream::context::CreateStreamError) -> bool {
    use jetstream::context::CreateStreamErrorKind as K;
    use jetstream::ErrorCode as C;
    match e.kind() {
        K::JetStream(err) => matches!(
            err.error_code(),
            C::STREAM_SUBJECT_OVERLAP | C::STREAM_NAME_EXIST | C::CLUSTER_NOT_AVAILABLE
        ),
        K::TimedOut => true,
        _ => false,
    }
}

/// What to do about a stream that could not be created.
fn stream_fix(e: &jetstream::context::CreateStreamError, subjects: &[String]) -> String {
    use jetstream::context::CreateStreamErrorKind as K;
    use jetstream::ErrorCode as C;
    match e.kind() {
        K::JetStream(err) if err.error_code() == C::STREAM_SUBJECT_OVERLAP => format!(
            "another stream on this server takes subjects overlapping {}: \
             remove it (`nats stream ls`) or give fork a server of its own",
            subjects.join(", ")
        ),
        K::JetStream(err) if err.error_code() == C::STREAM_NAME_EXIST => {
            "a stream of this name exists with another configuration: \
             fork never reconfigures it; remove it (`nats stream rm`) and fork makes it again"
                .into()
        }
        _ => "is JetStream enabled on the server, `nats-server -js`?".into(),
    }
}

fn nats_err(action: impl Into<String>) -> impl FnOnce(String) -> MeshError {
    let action = action.into();
    move |reason| MeshError::Nats { action, reason }
}

/// A connection to the bus.
#[derive(Clone)]
pub struct Bus {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub subjects: Subjects,
    pub url: String,
}

impl Bus {
    /// Connects to `url`, retrying with backoff until `give_up_after` (forever with `None`)
    /// or until SIGINT/SIGTERM (when the interrupt flag is installed). Once connected, the
    /// client reconnects by itself whenever the connection drops.
    pub async fn connect(
        url: &str,
        name: &str,
        staging: bool,
        give_up_after: Option<Duration>,
    ) -> Result<Bus, MeshError> {
        let started = tokio::time::Instant::now();
        let mut attempt = 0usize;
        let client = loop {
            attempt += 1;
            let url_owned = url.to_string();
            let opts = async_nats::ConnectOptions::new()
                .name(name)
                .connection_timeout(Duration::from_secs(5))
                .request_timeout(Some(Duration::from_secs(10)))
                .max_reconnects(None)
                .reconnect_delay_callback(backoff)
                .event_callback(move |event| {
                    let url = url_owned.clone();
                    async move {
                        match event {
                            async_nats::Event::Disconnected => {
                                say!("fork mesh: disconnected from {url}, reconnecting")
                            }
                            async_nats::Event::Connected => {
                                say!("fork mesh: connected to {url}")
                            }
                            other => tracing::info!("NATS {url}: {other}"),
                        }
                    }
                });
            match opts.connect(url).await {
                Ok(c) => break c,
                Err(e) => {
                    if crate::sandbox::signals::interrupted() {
                        return Err(MeshError::Interrupted);
                    }
                    let wait = backoff(attempt);
                    if give_up_after.is_some_and(|g| started.elapsed() + wait > g) {
                        return Err(MeshError::Connect {
                            url: url.to_string(),
                            reason: e.to_string(),
                        });
                    }
                    if attempt == 1 || attempt % 10 == 0 {
                        say!("fork mesh: cannot reach {url} yet ({e}); retrying");
                    }
                    tokio::time::sleep(wait).await;
                }
            }
        };
        let js = jetstream::new(client.clone());
        Ok(Bus {
            client,
            js,
            subjects: Subjects::new(staging),
            url: url.to_string(),
        })
    }

    /// The largest payload the server accepts.
    pub fn max_payload(&self) -> usize {
        self.client.server_info().max_payload
    }

    /// Refuses a payload the server would not accept, naming the server setting to raise.
    pub fn check_payload(&self, what: &str, len: usize) -> Result<(), MeshError> {
        let max = self.max_payload();
        if max > 0 && len + HEADER_ROOM > max {
            return Err(MeshError::Nats {
                action: format!("publish {what}"),
                reason: format!(
                    "it is {len} bytes and the server at {} accepts at most {max} (max_payload): \
                     raise max_payload in nats-server's configuration (e.g. `max_payload: 8MB`)",
                    self.url
                ),
            });
        }
        Ok(())
    }

    /// The two streams, created when missing.
    pub async fn ensure_streams(&self) -> Result<(stream::Stream, stream::Stream), MeshError> {
        let max_payload = match self.max_payload() {
            0 => usize::MAX,
            m => m,
        };
        let size = |limit: usize| {
            (limit + HEADER_ROOM)
                .min(max_payload)
                .min(i32::MAX as usize) as i32
        };
        let proposals = self
            .stream(stream::Config {
                name: self.subjects.proposals_stream(),
                description: Some("fork mesh: patches proposed for re-verification".into()),
                subjects: vec![self.subjects.all_proposals()],
                storage: stream::StorageType::File,
                retention: stream::RetentionPolicy::Limits,
                discard: stream::DiscardPolicy::Old,
                max_age: RETENTION,
                max_bytes: 256 << 20,
                max_messages: 100_000,
                max_message_size: size(MAX_PROPOSAL_MESSAGE_BYTES),
                duplicate_window: Duration::from_secs(120),
                num_replicas: 1,
                ..Default::default()
            })
            .await?;
        let proposals = self.add_proposals_subject(proposals).await?;
        let verdicts = self
            .stream(stream::Config {
                name: self.subjects.verdicts_stream(),
                description: Some("fork mesh: the nodes' signed verdicts".into()),
                subjects: vec![self.subjects.all_verdicts()],
                storage: stream::StorageType::File,
                retention: stream::RetentionPolicy::Limits,
                discard: stream::DiscardPolicy::Old,
                max_age: RETENTION,
                max_bytes: 1 << 30,
                max_messages: 1_000_000,
                max_message_size: size(MAX_VERDICT_MESSAGE_BYTES),
                duplicate_window: Duration::from_secs(120),
                num_replicas: 1,
                ..Default::default()
            })
            .await?;
        Ok((proposals, verdicts))
    }

    /// The stream `config` names, created when missing.
    ///
    /// Looking a stream up and creating it are two requests, and the answer to the first
    /// can be out of date by the second: another node or proposer created it in between,
    /// or a server that has just restarted was still recovering its streams from disk
    /// when it answered "not found" (its refusal is then "subjects overlap" or "name
    /// already in use"). Those refusals, and a server saying JetStream is briefly
    /// unavailable, are asked again, up to [`STREAM_ATTEMPTS`] times; every other
    /// refusal is final at once.
    async fn stream(&self, config: stream::Config) -> Result<stream::Stream, MeshError> {
        let name = config.name.clone();
        let mut attempt = 1;
        loop {
            match self.js.get_or_create_stream(config.clone()).await {
                Ok(s) => return Ok(s),
                Err(e)
                    if attempt < STREAM_ATTEMPTS
                        && transient(&e)
                        && !crate::sandbox::signals::interrupted() =>
                {
                    if attempt == 1 {
                        tracing::warn!("creating the stream {name}: {e}; asking again");
                    }
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                Err(e) => {
                    return Err(nats_err(format!("create the stream {name}"))(format!(
                        "{e} ({})",
                        stream_fix(&e, &config.subjects)
                    )))
                }
            }
        }
    }

    /// A proposals stream made by an earlier fork listens on `<prefix>.v1.proposals` only:
    /// the per-runtime subjects are added to it (nothing else is changed).
    async fn add_proposals_subject(
        &self,
        mut proposals: stream::Stream,
    ) -> Result<stream::Stream, MeshError> {
        let want = self.subjects.all_proposals();
        let info = proposals.info().await.map_err(|e| {
            nats_err(format!(
                "read the stream {}",
                self.subjects.proposals_stream()
            ))(e.to_string())
        })?;
        if info.config.subjects.contains(&want) {
            return Ok(proposals);
        }
        let mut config = info.config.clone();
        config.subjects.push(want);
        self.js.update_stream(config).await.map_err(|e| {
            nats_err(format!(
                "add the per-runtime subjects to the stream {}",
                self.subjects.proposals_stream()
            ))(e.to_string())
        })?;
        self.js
            .get_stream(self.subjects.proposals_stream())
            .await
            .map_err(|e| {
                nats_err(format!(
                    "read the stream {}",
                    self.subjects.proposals_stream()
                ))(e.to_string())
            })
    }

    /// The node's durable pull consumer of `runtime`'s proposals (created when missing).
    pub async fn node_consumer(
        &self,
        proposals: &stream::Stream,
        node: &PublicKey,
        runtime: &str,
    ) -> Result<consumer::PullConsumer, MeshError> {
        let name = consumer_name(node, runtime);
        proposals
            .get_or_create_consumer(
                &name,
                consumer::pull::Config {
                    durable_name: Some(name.clone()),
                    description: Some(format!("fork mesh node {node}")),
                    deliver_policy: consumer::DeliverPolicy::All,
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: ACK_WAIT,
                    max_deliver: MAX_DELIVER,
                    filter_subject: self.subjects.proposals(runtime),
                    max_ack_pending: 16,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| nats_err(format!("create the consumer {name}"))(e.to_string()))
    }

    /// Publishes to a stream subject, with the message's NATS headers (from `header`, its
    /// body's header), and waits for the stream's acknowledgement. The message's id
    /// ([`message_id`]: `scope` and the payload's hash) lets the stream drop a retried
    /// duplicate of these very bytes, and nothing else.
    pub async fn publish(
        &self,
        subject: String,
        payload: Vec<u8>,
        header: &Header,
        scope: &str,
    ) -> Result<u64, MeshError> {
        self.check_payload(&subject, payload.len())?;
        let msg_id = message_id(scope, &payload);
        let what = format!("publish to {subject}");
        let ack = self
            .js
            .send_publish(
                subject,
                jetstream::message::PublishMessage::build()
                    .payload(payload.into())
                    .headers(wire::headers(header, &msg_id)),
            )
            .await
            .map_err(|e| nats_err(what.clone())(e.to_string()))?;
        let ack = ack
            .await
            .map_err(|e| nats_err(what)(format!("no acknowledgement from the stream: {e}")))?;
        Ok(ack.sequence)
    }

    /// [`Bus::publish`], retried with backoff until it succeeds or `give_up_after` passes
    /// (the server may be restarting). Errors that retrying cannot fix are returned at once.
    pub async fn publish_retrying(
        &self,
        subject: String,
        payload: Vec<u8>,
        header: &Header,
        scope: &str,
        give_up_after: Duration,
    ) -> Result<u64, MeshError> {
        self.check_payload(&subject, payload.len())?;
        let started = tokio::time::Instant::now();
        let mut attempt = 0usize;
        loop {
            attempt += 1;
            match self
                .publish(subject.clone(), payload.clone(), header, scope)
                .await
            {
                Ok(seq) => return Ok(seq),
                Err(e) => {
                    let wait = backoff(attempt).max(Duration::from_millis(500));
                    if started.elapsed() + wait > give_up_after {
                        return Err(e);
                    }
                    say!("fork mesh: {e}; retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

/// The id a message is published under (NATS's `Nats-Msg-Id`): `scope` (the proposal, and
/// who answers it) and the first 128 bits of the payload's SHA-256. Within its duplicate
/// window the stream stores one message per id and acknowledges any other with that id as
/// a duplicate without storing it: an id anyone could compute before the message exists
/// (the proposal's id and a node's public key id, as an earlier release used) let whoever
/// can publish on the subject send any bytes under it first, and the node's real answer
/// was then dropped while its publish looked acknowledged. With the payload's hash in it,
/// only these very bytes (a retry of this publish) are ever dropped as a duplicate.
pub fn message_id(scope: &str, payload: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let hash = hex::encode(Sha256::digest(payload));
    format!("{scope}-{}", &hash[..32])
}

/// The durable consumer of a node serving `runtime` (a subject token):
/// `fork-node-<key id>-<runtime>`.
pub fn consumer_name(node: &PublicKey, runtime: &str) -> String {
    format!("fork-node-{}-{runtime}", node.key_id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(code: usize, err_code: u64, what: &str) -> jetstream::context::CreateStreamError {
        let e: jetstream::Error = serde_json::from_value(serde_json::json!({
            "code": code, "err_code": err_code, "description": what
        }))
        .unwrap();
        e.into()
    }

    #[test]
    fn only_refusals_a_second_look_can_outdate_are_asked_again() {
        use jetstream::context::{CreateStreamError, CreateStreamErrorKind as K};
        // Created by someone else between the lookup and the creation, or briefly unable.
        assert!(transient(&refusal(400, 10065, "subjects overlap")));
        assert!(transient(&refusal(
            400,
            10058,
            "stream name already in use"
        )));
        assert!(transient(&refusal(
            503,
            10008,
            "JetStream cluster not available"
        )));
        assert!(transient(&CreateStreamError::new(K::TimedOut)));
        // Final at once: no JetStream, a bad configuration, a full store.
        assert!(!transient(&refusal(503, 10076, "JetStream not enabled")));
        assert!(!transient(&refusal(
            400,
            10052,
            "stream configuration invalid"
        )));
        assert!(!transient(&refusal(500, 10077, "stream store failed")));
        assert!(!transient(&CreateStreamError::new(K::JetStreamUnavailable)));
    }

    #[test]
    fn a_refused_stream_names_its_fix() {
        let subjects = ["fork.v1.proposals.>".to_string()];
        let overlap = stream_fix(&refusal(400, 10065, "subjects overlap"), &subjects);
        assert!(overlap.contains("another stream"), "{overlap}");
        assert!(overlap.contains("fork.v1.proposals.>"), "{overlap}");
        let exists = stream_fix(&refusal(400, 10058, "in use"), &subjects);
        assert!(exists.contains("nats stream rm"), "{exists}");
        let off = stream_fix(&refusal(503, 10076, "JetStream not enabled"), &subjects);
        assert!(off.contains("nats-server -js"), "{off}");
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(2), Duration::from_millis(200));
        assert_eq!(backoff(4), Duration::from_millis(800));
        assert_eq!(backoff(10), MAX_BACKOFF);
        assert_eq!(backoff(usize::MAX), MAX_BACKOFF);
    }

    #[test]
    fn consumer_names_are_valid_nats_names() {
        let k = crate::identity::NodeKey::generate().public();
        let n = consumer_name(&k, "hermes_demo-2");
        assert!(n.starts_with("fork-node-") && n.len() == "fork-node-".len() + 16 + 14);
        assert!(n.ends_with("-hermes_demo-2"));
        assert!(n
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    }
}
