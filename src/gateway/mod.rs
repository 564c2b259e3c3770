//! The model gateway: the successor's one metered door to a model.
//!
//! The successor's network namespace has loopback only. The supervisor creates a TCP
//! listener inside it (`127.0.0.1:PORT`) and hands it to [`Gateway::serve`]; the task
//! reaches it through `FORK_MODEL_URL=http://127.0.0.1:PORT/v1`. The gateway speaks the
//! OpenAI-compatible API, forwards each call to the configured upstream with the
//! credentials only the supervisor holds, and meters every call's token usage against
//! the API-cost budget ([`Meter`]).
//!
//! Endpoints (the `/v1` prefix is optional: `/chat/completions` is `/v1/chat/completions`;
//! the upstream URL is always `upstream` + the path after `/v1`, so `upstream` is the
//! base that already ends in `/v1` for OpenAI):
//! - `POST /v1/chat/completions`, `POST /v1/embeddings`: forwarded and metered;
//! - `GET /v1/models`, `GET /v1/models/{id}`: answered locally with the priced models;
//! - anything else: a 404 (or 405) JSON error, never forwarded.
//!
//! Before a call is forwarded: the body (at most [`MAX_REQUEST_BYTES`], else 413) must be a
//! JSON object (else 400; only the fields the gateway reads are taken out of it, the rest is
//! skipped without being built, and one of them named twice is refused) whose `model` is
//! priced in the policy (else 403: a call that cannot be metered is never passed), and the
//! call's worst case must fit in the budget (else 402): the spend,
//! plus the worst cases held for the calls in flight, plus this call's worst case (a prompt
//! token per request byte and `max_tokens_per_image` per image part of its `messages`, and
//! for a chat call `n` times its `max_tokens`, or `default_max_tokens` when it sets none,
//! completion tokens). A content part whose cost no hold bounds (a `file`, a `video_url`, a
//! part without a known `type`: see parts.rs) is refused with a 400. A call that does not fit
//! exhausts the budget: no further call is passed, and the supervisor ends the run. An
//! admitted call's worst case is held until its real charge replaces it. A streamed chat
//! completion gets `stream_options.include_usage = true` so its last chunk carries usage
//! (that object rewritten in place, the rest of the body forwarded byte for byte); a chat
//! call that sets neither `max_tokens` nor `max_completion_tokens` (or sets them null) gets
//! `default_max_tokens` written in, as `default_max_tokens_field` (`max_tokens` unless the
//! policy says; a null one is written over where it is), so the upstream generates no more
//! than the hold.
//!
//! Request headers forwarded: only `accept`, `user-agent` and `openai-beta` from the task,
//! `content-type: application/json`, and `Authorization: Bearer <key>` when credentials are
//! configured. Never the task's `Authorization`, `Proxy-Authorization` or `Cookie`.
//! Response headers passed back: only [`RESPONSE_HEADERS`] (never `set-cookie`, never a
//! header whose value contains the key). Bodies are passed through chunk by chunk as they
//! arrive (SSE streams included).
//!
//! Metering: the response's `usage` (`prompt_tokens`/`completion_tokens`, or
//! `input_tokens`/`output_tokens`, or `total_tokens`), read from the JSON body or, for SSE,
//! from the `data:` line that carries it; only `usage` is built, the rest of the body is
//! skipped as it is read (no tree of a response of up to [`MAX_METER_BUFFER`] bytes, no
//! depth limit), and a `usage` named twice counts as the last one. A 2xx answer without a usable `usage` is charged
//! an estimate, `ceil(request bytes / 3)` prompt tokens and `ceil(response bytes / 3)`
//! completion tokens, marked `"estimated"`. A call whose usage cannot be known (the upstream
//! did not answer within the timeout or failed after the call was sent, or the response was
//! cut off before its usage) is charged its worst case, marked `"estimated"` too. A call
//! that never reached the upstream (no connection), or a non-2xx answer, costs nothing
//! but is logged.
//! The charge is recorded before the response body ends, so a task that saw the end of a
//! response and calls again sees the new spend. Each admitted call runs on its own task,
//! which outlives the task's connection: if the task hangs up (before the response head or
//! mid-stream), the gateway keeps reading the upstream to meter what was really generated
//! (within the call timeout while the body is read; a task that stops reading without
//! hanging up holds its call until the run ends, which settles it). When the run ends, its gateway's calls still in flight get a
//! short grace to finish (the supervisor drives them), then each is charged its worst case
//! (`"estimated"`, its note says why) before the spend is read.
//!
//! Credentials: never in a response header, a log record or an error message. Response
//! BODIES are scrubbed too: any occurrence of the key (when it is at least
//! [`MIN_SCRUB_KEY_LEN`] bytes long) is replaced by [`REDACTED`], also across chunk
//! boundaries. The gateway cannot know what a body means, so this is defence in depth
//! against an upstream that echoes its request (error pages, debugging proxies); it is
//! not a promise about what an upstream may disclose in other forms.
//!
//! Bounds (the gateway runs in the supervisor, outside the sandbox's cgroup): at most
//! [`MAX_CONNECTIONS`] task connections and [`MAX_IN_FLIGHT`] calls at once, header and
//! body read timeouts, the upstream call timeout, at most [`MAX_METER_BUFFER`] of a JSON
//! response kept for metering (beyond it the call is estimated), at most
//! [`MAX_LOG_RECORDS`] records of forwarded calls and [`MAX_REFUSED_RECORDS`] of refused
//! ones (capped separately, so refusals never push out a charged call's record; what is
//! dropped is counted in a summary line at the end of the log).

mod admit;
mod config;
mod log;
mod meter;
mod parts;
mod proxy;
mod scrub;
mod usage;

#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use zeroize::Zeroizing;

pub use admit::MAX_REQUEST_BYTES;
pub use config::{
    GatewayConfig, LimitField, Price, DEFAULT_MAX_TOKENS, DEFAULT_MAX_TOKENS_PER_IMAGE,
    DEFAULT_PORT, DEFAULT_TIMEOUT,
};
pub use log::{CallRecord, MAX_LOG_RECORDS, MAX_REFUSED_RECORDS};
pub use meter::Meter;
pub use proxy::{MAX_CONNECTIONS, MAX_IN_FLIGHT, RESPONSE_HEADERS};
pub use scrub::{MIN_SCRUB_KEY_LEN, REDACTED};
pub use usage::MAX_METER_BUFFER;

use scrub::ApiKey;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Errors of the gateway's configuration and set-up. Messages never carry the key.
#[derive(Debug, Error)]
pub enum GatewayError {
    #[error("{origin}: gateway.{field}: {problem}")]
    Config {
        origin: String,
        field: String,
        problem: String,
    },
    #[error("gateway credentials ({source_name}): {problem}")]
    Credentials {
        source_name: String,
        problem: String,
    },
    #[error("gateway: cannot build the upstream HTTP client: {0}")]
    Client(String),
}

/// The gateway: an OpenAI-compatible front for one upstream, metered.
pub struct Gateway {
    cfg: GatewayConfig,
    upstream_base: String,
    credentials: ApiKey,
    meter: Arc<Meter>,
    client: reqwest::Client,
    /// Turns for calls in flight (at most [`MAX_IN_FLIGHT`]).
    in_flight: Arc<tokio::sync::Semaphore>,
    /// This gateway's calls in the meter (which a whole evaluation shares).
    owner: u64,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("upstream", &self.upstream_base)
            .field(
                "credentials",
                &self.credentials.is_set().then_some(REDACTED),
            )
            .field("models", &self.cfg.prices.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Gateway {
    /// Validates `cfg` and builds the upstream HTTP client.
    pub fn new(
        cfg: GatewayConfig,
        credentials: Option<Zeroizing<String>>,
        meter: Arc<Meter>,
    ) -> Result<Arc<Gateway>, GatewayError> {
        cfg.validate("gateway config")?;
        let upstream_base = cfg.upstream.trim().trim_end_matches('/').to_string();
        let loopback = reqwest::Url::parse(&upstream_base)
            .ok()
            .and_then(|u| u.host_str().map(config::is_loopback_host))
            .unwrap_or(false);
        let mut b = reqwest::Client::builder()
            .timeout(cfg.timeout())
            .connect_timeout(CONNECT_TIMEOUT.min(cfg.timeout()))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("fork-gateway/", env!("CARGO_PKG_VERSION")));
        if loopback {
            b = b.no_proxy();
        }
        let client = b.build().map_err(|e| GatewayError::Client(e.to_string()))?;
        let credentials = ApiKey::new(credentials);
        if let Some(Err(_)) = credentials.authorization() {
            return Err(GatewayError::Credentials {
                source_name: "the key given to Gateway::new".into(),
                problem: "it cannot go in an HTTP header".into(),
            });
        }
        let owner = meter.new_owner();
        Ok(Arc::new(Gateway {
            owner,
            cfg,
            upstream_base,
            credentials,
            meter,
            client,
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
        }))
    }

    pub fn meter(&self) -> &Arc<Meter> {
        &self.meter
    }

    pub fn config(&self) -> &GatewayConfig {
        &self.cfg
    }

    /// The calls this gateway admitted that are not charged yet.
    pub fn in_flight(&self) -> usize {
        self.meter.in_flight(self.owner)
    }

    /// Writes the call log as JSON lines, one per call (then a summary line if records
    /// were dropped: see [`MAX_LOG_RECORDS`]), the key redacted.
    pub fn write_log(&self, path: &Path) -> std::io::Result<()> {
        let text = self.meter.log_jsonl().map_err(std::io::Error::other)?;
        std::fs::write(path, self.credentials.redact(&text))
    }
}

/// The run's view of its gateway: the evaluation's spend, and this gateway's calls in
/// flight, charged their worst case when the run ends before they do.
impl crate::sandbox::CostMeter for Gateway {
    fn spent_usd(&self) -> f64 {
        self.meter.spent_usd()
    }
    fn exceeded(&self) -> bool {
        self.meter.exceeded()
    }
    fn in_flight(&self) -> usize {
        Gateway::in_flight(self)
    }
    fn settle_in_flight(&self) {
        self.meter.settle_in_flight(self.owner);
    }
}
