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
//! JSON object whose `model` is priced in the policy (else 403: a call that cannot be metered
//! is never passed), and the budget must not be exhausted (else 402). A streamed chat
//! completion gets `stream_options.include_usage = true` so its last chunk carries usage.
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
//! from the `data:` line that carries it. A 2xx answer without a usable `usage` is charged
//! an estimate, `ceil(request bytes / 3)` prompt tokens and `ceil(response bytes / 3)`
//! completion tokens, marked `"estimated"`. A non-2xx answer costs nothing but is logged.
//! The charge is recorded before the response body ends, so a task that saw the end of a
//! response and calls again sees the new spend. If the task hangs up mid-stream, the
//! gateway keeps reading the upstream (within the call timeout) to meter what was really
//! generated.
//!
//! Credentials: never in a response header, a log record or an error message. Response
//! BODIES are scrubbed too: any occurrence of the key (when it is at least
//! [`MIN_SCRUB_KEY_LEN`] bytes long) is replaced by [`REDACTED`], also across chunk
//! boundaries. The gateway cannot know what a body means, so this is defence in depth
//! against an upstream that echoes its request (error pages, debugging proxies); it is
//! not a promise about what an upstream may disclose in other forms.
//!
//! Bounds (the gateway runs in the supervisor, outside the sandbox's cgroup): at most
//! [`MAX_CONNECTIONS`] task connections at once, header and body read timeouts, the
//! upstream call timeout, at most [`MAX_METER_BUFFER`] of a JSON response kept for
//! metering (beyond it the call is estimated), at most [`MAX_LOG_RECORDS`] call records.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use thiserror::Error;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;
use zeroize::Zeroizing;

/// The port the task reaches inside the sandbox when the policy names none.
pub const DEFAULT_PORT: u16 = 8089;
/// The per-upstream-call timeout when the policy names none.
pub const DEFAULT_TIMEOUT: &str = "120s";
/// The largest request body the task may send (413 beyond).
pub const MAX_REQUEST_BYTES: usize = 8 << 20;
/// The most of a non-SSE response body kept to read its usage (estimated beyond).
pub const MAX_METER_BUFFER: usize = 16 << 20;
/// The most task connections served at once (further ones wait in the listen backlog).
pub const MAX_CONNECTIONS: usize = 32;
/// The most call records kept (further calls are still metered, their records counted).
pub const MAX_LOG_RECORDS: usize = 100_000;
/// Keys shorter than this are not scrubbed from bodies (they would match by chance).
pub const MIN_SCRUB_KEY_LEN: usize = 8;
/// What replaces the key wherever it would have reached the task.
pub const REDACTED: &str = "[redacted by fork gateway]";
/// The upstream response headers passed back to the task; every other one is dropped.
pub const RESPONSE_HEADERS: &[&str] = &[
    "content-type",
    "x-request-id",
    "openai-processing-ms",
    "openai-version",
    "openai-model",
    "retry-after",
    "x-ratelimit-limit-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
];
/// The task's request headers forwarded upstream (besides the ones the gateway sets).
const REQUEST_HEADERS: &[&str] = &["accept", "user-agent", "openai-beta"];
const MAX_SSE_LINE: usize = 1 << 20;
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
const MAX_ECHOED_LEN: usize = 200;

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

/// USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

impl Price {
    /// `prompt * input / 1e6 + completion * output / 1e6`.
    pub fn cost(&self, prompt_tokens: u64, completion_tokens: u64) -> f64 {
        prompt_tokens as f64 * self.input_per_mtok / 1e6
            + completion_tokens as f64 * self.output_per_mtok / 1e6
    }
}

/// The policy's `[gateway]` table.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// The upstream base URL, e.g. `https://api.openai.com/v1` or `http://127.0.0.1:8080/v1`.
    pub upstream: String,
    /// The supervisor's environment variable holding the API key.
    #[serde(default)]
    pub credentials_env: Option<String>,
    /// Or a file holding it (first line, trimmed).
    #[serde(default)]
    pub credentials_file: Option<PathBuf>,
    /// model -> price; models not listed are refused.
    pub prices: BTreeMap<String, Price>,
    /// The port inside the sandbox (default [`DEFAULT_PORT`]).
    #[serde(default)]
    pub port: Option<u16>,
    /// Per upstream call, a human duration (default [`DEFAULT_TIMEOUT`]).
    #[serde(default)]
    pub timeout: Option<String>,
}

impl GatewayConfig {
    /// Checks every field; `origin` names where the config came from (a policy file).
    pub fn validate(&self, origin: &str) -> Result<(), GatewayError> {
        let err = |field: &str, problem: String| GatewayError::Config {
            origin: origin.to_string(),
            field: field.to_string(),
            problem,
        };
        let url = reqwest::Url::parse(self.upstream.trim()).map_err(|e| {
            err(
                "upstream",
                format!(
                    "`{}` is not a URL ({e}): write it like https://api.openai.com/v1",
                    clip(&self.upstream)
                ),
            )
        })?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(err(
                "upstream",
                format!("the scheme `{}` is not http or https", url.scheme()),
            ));
        }
        let host = match url.host_str() {
            Some(h) if !h.is_empty() => h.to_string(),
            _ => return Err(err("upstream", "the URL has no host".into())),
        };
        if !url.username().is_empty() || url.password().is_some() {
            return Err(err(
                "upstream",
                "the URL carries user:password: put the key in credentials_env or credentials_file"
                    .into(),
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(err(
                "upstream",
                "the URL has a query or fragment: give the base only, like https://api.openai.com/v1".into(),
            ));
        }
        let has_credentials = self.credentials_env.is_some() || self.credentials_file.is_some();
        if url.scheme() == "http" && has_credentials && !is_loopback_host(&host) {
            return Err(err(
                "upstream",
                format!("http:// to `{host}` would send the key in clear over the network: use https://, or a loopback upstream"),
            ));
        }
        if self.prices.is_empty() {
            return Err(err(
                "prices",
                "no model is priced: list at least one, like prices.\"gpt-4o-mini\" = { input_per_mtok = 0.15, output_per_mtok = 0.6 }".into(),
            ));
        }
        for (model, p) in &self.prices {
            if model.trim().is_empty() {
                return Err(err("prices", "a model name is empty".into()));
            }
            for (what, v) in [
                ("input_per_mtok", p.input_per_mtok),
                ("output_per_mtok", p.output_per_mtok),
            ] {
                if !v.is_finite() || v < 0.0 {
                    return Err(err(
                        &format!("prices.\"{model}\".{what}"),
                        format!("{v} is not a finite price >= 0 (USD per million tokens)"),
                    ));
                }
            }
        }
        match (&self.credentials_env, &self.credentials_file) {
            (Some(_), Some(_)) => {
                return Err(err(
                    "credentials_env",
                    "both credentials_env and credentials_file are set: keep exactly one".into(),
                ))
            }
            (Some(var), None) => {
                if var.is_empty() || var.contains('=') || var.contains('\0') {
                    return Err(err(
                        "credentials_env",
                        format!("`{}` is not an environment variable name", clip(var)),
                    ));
                }
            }
            (None, Some(path)) => {
                if path.as_os_str().is_empty() {
                    return Err(err("credentials_file", "the path is empty".into()));
                }
            }
            (None, None) => {}
        }
        if self.port == Some(0) {
            return Err(err(
                "port",
                "0 is not a port the task can be told: pick one like 8089 (or leave it out)".into(),
            ));
        }
        if let Some(t) = &self.timeout {
            match crate::units::parse_duration(t) {
                Ok(d) if !d.is_zero() => {}
                Ok(_) => {
                    return Err(err(
                        "timeout",
                        "0 would fail every call: give a duration like 120s".into(),
                    ))
                }
                Err(e) => return Err(err("timeout", e.to_string())),
            }
        }
        Ok(())
    }

    /// The port the task reaches inside the sandbox.
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(DEFAULT_PORT)
    }

    /// The per-upstream-call timeout (the default when absent or invalid; `validate` rejects invalid).
    pub fn timeout(&self) -> Duration {
        self.timeout
            .as_deref()
            .and_then(|t| crate::units::parse_duration(t).ok())
            .filter(|d| !d.is_zero())
            .unwrap_or(Duration::from_secs(120))
    }

    /// What the task is given as `FORK_MODEL_URL`.
    pub fn task_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port())
    }

    /// Reads the API key from the configured source (none configured: `Ok(None)`).
    /// The key is trimmed, must be non-empty and a valid header value; errors never show it.
    pub fn load_credentials(&self) -> Result<Option<Zeroizing<String>>, GatewayError> {
        let (source_name, raw) = match (&self.credentials_env, &self.credentials_file) {
            (None, None) => return Ok(None),
            (Some(_), Some(_)) => {
                return Err(GatewayError::Credentials {
                    source_name: "credentials_env and credentials_file".into(),
                    problem: "both are set: keep exactly one".into(),
                })
            }
            (Some(var), None) => {
                let name = format!("environment variable {var}");
                match std::env::var(var) {
                    Ok(v) => (name, Zeroizing::new(v)),
                    Err(std::env::VarError::NotPresent) => return Err(GatewayError::Credentials {
                        source_name: name,
                        problem:
                            "not set in the supervisor's environment: export it before running fork"
                                .into(),
                    }),
                    Err(std::env::VarError::NotUnicode(_)) => {
                        return Err(GatewayError::Credentials {
                            source_name: name,
                            problem: "not valid UTF-8".into(),
                        })
                    }
                }
            }
            (None, Some(path)) => {
                let name = format!("file {}", path.display());
                let bytes =
                    Zeroizing::new(std::fs::read(path).map_err(|e| GatewayError::Credentials {
                        source_name: name.clone(),
                        problem: format!("cannot read it: {e}"),
                    })?);
                let text = std::str::from_utf8(&bytes).map_err(|_| GatewayError::Credentials {
                    source_name: name.clone(),
                    problem: "not valid UTF-8".into(),
                })?;
                let first = text.lines().next().unwrap_or("");
                (name, Zeroizing::new(first.to_string()))
            }
        };
        let key = Zeroizing::new(raw.trim().to_string());
        if key.is_empty() {
            return Err(GatewayError::Credentials {
                source_name,
                problem: "the key is empty".into(),
            });
        }
        if key.bytes().any(|b| !(0x21..0x7f).contains(&b)) {
            return Err(GatewayError::Credentials {
                source_name,
                problem: "the key has spaces or characters outside printable ASCII: it cannot go in an HTTP header".into(),
            });
        }
        Ok(Some(key))
    }
}

fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost") || h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Shortens task- or user-controlled text quoted in a message.
fn clip(s: &str) -> String {
    if s.len() <= MAX_ECHOED_LEN {
        return s.to_string();
    }
    let mut end = MAX_ECHOED_LEN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// One call through the gateway, as logged (JSON lines).
#[derive(Debug, Clone, Serialize)]
pub struct CallRecord {
    /// RFC 3339, when the call arrived.
    pub ts: String,
    /// The path the task called.
    pub endpoint: String,
    /// The requested model ("" when none could be read).
    pub model: String,
    pub stream: bool,
    /// The status the task got.
    pub status: u16,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost_usd: f64,
    pub latency_ms: f64,
    /// `"usage"` (from the response), `"estimated"` (no usable usage) or `"refused"` (not forwarded).
    pub metered: &'static str,
    pub note: Option<String>,
}

#[derive(Debug, Default)]
struct ModelTotals {
    prompt_tokens: u64,
    completion_tokens: u64,
    price: Option<Price>,
}

#[derive(Debug, Default)]
struct MeterState {
    by_model: BTreeMap<String, ModelTotals>,
    spent_usd: f64,
    calls: u64,
    log: Vec<CallRecord>,
    dropped: u64,
}

/// The API-cost meter, shared by the gateway and the supervisor. Race-free (one mutex).
///
/// The spend is computed from per-model token totals (exact integers) and their prices,
/// so it does not depend on the order in which parallel calls were charged.
#[derive(Debug)]
pub struct Meter {
    budget_usd: f64,
    state: Mutex<MeterState>,
    exceeded: watch::Sender<bool>,
}

impl Meter {
    /// A meter for `budget_usd` (use `f64::INFINITY` for no limit; a NaN or negative
    /// budget is taken as 0: fail closed).
    pub fn new(budget_usd: f64) -> Arc<Meter> {
        let budget_usd = if budget_usd.is_nan() || budget_usd < 0.0 {
            0.0
        } else {
            budget_usd
        };
        Arc::new(Meter {
            budget_usd,
            state: Mutex::new(MeterState::default()),
            exceeded: watch::channel(false).0,
        })
    }

    fn lock(&self) -> MutexGuard<'_, MeterState> {
        // A panic while holding the lock cannot leave the totals half-updated in a way
        // that matters more than losing the meter: keep metering.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn budget_usd(&self) -> f64 {
        self.budget_usd
    }

    /// The USD spent so far.
    pub fn spent_usd(&self) -> f64 {
        self.lock().spent_usd
    }

    /// Every call recorded (refused ones included).
    pub fn calls(&self) -> u64 {
        self.lock().calls
    }

    /// (prompt, completion) tokens charged so far, all models.
    pub fn tokens(&self) -> (u64, u64) {
        let s = self.lock();
        s.by_model.values().fold((0, 0), |(p, c), t| {
            (
                p.saturating_add(t.prompt_tokens),
                c.saturating_add(t.completion_tokens),
            )
        })
    }

    /// True once the spend is over the budget.
    pub fn exceeded(&self) -> bool {
        *self.exceeded.borrow()
    }

    /// Resolves once the spend is over the budget (at once if it already is).
    pub async fn exceeded_signal(&self) {
        let mut rx = self.exceeded.subscribe();
        // The sender lives in `self`, so `wait_for` cannot fail while we are borrowed.
        let _ = rx.wait_for(|e| *e).await;
    }

    /// The call records kept (at most [`MAX_LOG_RECORDS`]).
    pub fn log(&self) -> Vec<CallRecord> {
        self.lock().log.clone()
    }

    /// Calls whose record was not kept because the log was full.
    pub fn records_dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// Charges a call's tokens at `price` and logs it; signals exceeded when the spend
    /// goes over the budget. Returns the spend after the charge.
    pub fn charge(&self, record: CallRecord, price: Option<Price>) -> f64 {
        let mut s = self.lock();
        if let Some(price) = price {
            if record.prompt_tokens > 0 || record.completion_tokens > 0 {
                let t = s.by_model.entry(record.model.clone()).or_default();
                t.prompt_tokens = t.prompt_tokens.saturating_add(record.prompt_tokens);
                t.completion_tokens = t.completion_tokens.saturating_add(record.completion_tokens);
                t.price = Some(price);
                s.spent_usd = s
                    .by_model
                    .values()
                    .map(|t| {
                        t.price
                            .map_or(0.0, |p| p.cost(t.prompt_tokens, t.completion_tokens))
                    })
                    .sum();
            }
        }
        s.calls += 1;
        if s.log.len() < MAX_LOG_RECORDS {
            s.log.push(record);
        } else {
            s.dropped += 1;
        }
        let spent = s.spent_usd;
        if spent > self.budget_usd {
            self.exceeded.send_replace(true);
        }
        spent
    }
}

type GwBody = UnsyncBoxBody<Bytes, Infallible>;

/// A response body fed by the pump task, chunk by chunk.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Endpoint {
    Chat,
    Embeddings,
}

impl Endpoint {
    fn upstream_path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/chat/completions",
            Endpoint::Embeddings => "/embeddings",
        }
    }
}

/// The gateway: an OpenAI-compatible front for one upstream, metered.
pub struct Gateway {
    cfg: GatewayConfig,
    upstream_base: String,
    credentials: Option<Zeroizing<String>>,
    meter: Arc<Meter>,
    client: reqwest::Client,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("upstream", &self.upstream_base)
            .field("credentials", &self.credentials.as_ref().map(|_| REDACTED))
            .field("models", &self.cfg.prices.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// When and where a call arrived.
struct Arrival {
    ts: String,
    path: String,
    started: Instant,
}

/// What the pump needs to meter and log a forwarded call.
struct CallCtx {
    ts: String,
    endpoint: String,
    model: String,
    stream: bool,
    price: Price,
    request_bytes: u64,
    started: Instant,
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
            .and_then(|u| u.host_str().map(is_loopback_host))
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
        if let Some(k) = &credentials {
            if HeaderValue::from_str(&format!("Bearer {}", k.as_str())).is_err() {
                return Err(GatewayError::Credentials {
                    source_name: "the key given to Gateway::new".into(),
                    problem: "it cannot go in an HTTP header".into(),
                });
            }
        }
        Ok(Arc::new(Gateway {
            cfg,
            upstream_base,
            credentials,
            meter,
            client,
        }))
    }

    pub fn meter(&self) -> &Arc<Meter> {
        &self.meter
    }

    pub fn config(&self) -> &GatewayConfig {
        &self.cfg
    }

    /// Serves the task on `listener` until this future is dropped (abort its task):
    /// one hyper HTTP/1 connection per accept, spawned on the current runtime, and all
    /// of them (and their in-flight streams) stopped when this future is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        // Dropping this future drops `_shutdown`: every pump sees it and stops.
        let (_shutdown, shutdown_rx) = watch::channel(());
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let mut conns = JoinSet::new();
        loop {
            while conns.try_join_next().is_some() {}
            let permit = tokio::select! {
                p = slots.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return, // the semaphore is never closed
                },
                Some(_) = conns.join_next() => continue,
            };
            let stream = tokio::select! {
                r = listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::warn!("gateway: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                Some(_) = conns.join_next() => continue,
            };
            let gw = self.clone();
            let sd = shutdown_rx.clone();
            conns.spawn(async move {
                let _permit = permit;
                gw.serve_connection(stream, sd).await;
            });
        }
    }

    async fn serve_connection(self: Arc<Self>, stream: TcpStream, shutdown: watch::Receiver<()>) {
        let io = hyper_util::rt::TokioIo::new(stream);
        let gw = self.clone();
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            let gw = gw.clone();
            let sd = shutdown.clone();
            async move { Ok::<_, Infallible>(gw.handle(req, sd).await) }
        });
        let mut b = hyper::server::conn::http1::Builder::new();
        b.timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT);
        if let Err(e) = b.serve_connection(io, svc).await {
            tracing::debug!("gateway: connection ended: {e}");
        }
    }

    /// Writes the call log as JSON lines, one per call.
    pub fn write_log(&self, path: &Path) -> std::io::Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        for r in self.meter.log() {
            let line = serde_json::to_string(&r).map_err(std::io::Error::other)?;
            writeln!(f, "{}", self.redact(&line))?;
        }
        f.flush()
    }

    /// Replaces the key in `s` (when one is configured).
    fn redact(&self, s: &str) -> String {
        match &self.credentials {
            Some(k) if !k.is_empty() => s.replace(k.as_str(), REDACTED),
            _ => s.to_string(),
        }
    }

    fn refuse(
        &self,
        arrival: &Arrival,
        model: &str,
        stream: bool,
        status: StatusCode,
        code: &str,
        message: String,
    ) -> Response<GwBody> {
        let message = self.redact(&message);
        self.meter.charge(
            CallRecord {
                ts: arrival.ts.clone(),
                endpoint: clip(&arrival.path),
                model: clip(model),
                stream,
                status: status.as_u16(),
                prompt_tokens: 0,
                completion_tokens: 0,
                cost_usd: 0.0,
                latency_ms: arrival.started.elapsed().as_secs_f64() * 1e3,
                metered: "refused",
                note: Some(message.clone()),
            },
            None,
        );
        error_response(status, code, &message)
    }

    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        shutdown: watch::Receiver<()>,
    ) -> Response<GwBody> {
        let arrival = Arrival {
            ts: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            path: req.uri().path().to_string(),
            started: Instant::now(),
        };
        let path = arrival.path.clone();
        let route = match path.strip_prefix("/v1") {
            Some("") => "/",
            Some(r) if r.starts_with('/') => r,
            _ => path.as_str(),
        }
        .to_string();
        let endpoint = match route.as_str() {
            "/chat/completions" => Some(Endpoint::Chat),
            "/embeddings" => Some(Endpoint::Embeddings),
            _ => None,
        };
        if req.method() == Method::GET {
            if route == "/models" {
                return self.models_response(None);
            }
            if let Some(id) = route.strip_prefix("/models/") {
                return self.models_response(Some(id));
            }
        }
        let Some(endpoint) = endpoint else {
            return self.refuse(&arrival, "", false,
                StatusCode::NOT_FOUND,
                "not_found",
                format!(
                    "the fork gateway has no endpoint {} {}: it serves POST /v1/chat/completions, POST /v1/embeddings and GET /v1/models",
                    req.method(),
                    clip(&path)
                ),
            );
        };
        if req.method() != Method::POST {
            return self.refuse(
                &arrival,
                "",
                false,
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{} takes POST, not {}", clip(&path), req.method()),
            );
        }

        // The body: bounded in size and in time.
        let too_large = || {
            format!(
                "the request body is over the gateway's limit of {} bytes",
                MAX_REQUEST_BYTES
            )
        };
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > MAX_REQUEST_BYTES as u64) {
            return self.refuse(
                &arrival,
                "",
                false,
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                too_large(),
            );
        }
        let task_headers = req.headers().clone();
        let collected = tokio::time::timeout(
            BODY_READ_TIMEOUT,
            Limited::new(req.into_body(), MAX_REQUEST_BYTES).collect(),
        )
        .await;
        let body = match collected {
            Ok(Ok(c)) => c.to_bytes(),
            Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
                return self.refuse(
                    &arrival,
                    "",
                    false,
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request_too_large",
                    too_large(),
                );
            }
            Ok(Err(e)) => {
                return self.refuse(
                    &arrival,
                    "",
                    false,
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    format!("the request body could not be read: {e}"),
                );
            }
            Err(_) => {
                return self.refuse(
                    &arrival,
                    "",
                    false,
                    StatusCode::REQUEST_TIMEOUT,
                    "request_timeout",
                    format!(
                        "the request body did not arrive within {}s",
                        BODY_READ_TIMEOUT.as_secs()
                    ),
                );
            }
        };
        let mut obj = match serde_json::from_slice::<Value>(&body) {
            Ok(Value::Object(o)) => o,
            Ok(_) => {
                return self.refuse(
                    &arrival,
                    "",
                    false,
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "the request body is not a JSON object".into(),
                );
            }
            Err(e) => {
                return self.refuse(
                    &arrival,
                    "",
                    false,
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    format!("the request body is not JSON: {e}"),
                );
            }
        };
        let Some(model) = obj.get("model").and_then(Value::as_str).map(str::to_string) else {
            return self.refuse(
                &arrival,
                "",
                false,
                StatusCode::BAD_REQUEST,
                "bad_request",
                "the request has no string `model`: name one of the priced models (GET /v1/models)"
                    .into(),
            );
        };
        let stream = endpoint == Endpoint::Chat && obj.get("stream") == Some(&Value::Bool(true));
        let Some(price) = self.cfg.prices.get(&model).copied() else {
            return self.refuse(&arrival, &model, stream,
                StatusCode::FORBIDDEN,
                "model_not_priced",
                format!(
                    "model {} is not priced in the policy: refused (calls that cannot be metered are never passed); priced models: {}",
                    clip(&model),
                    self.cfg.prices.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            );
        };
        if self.meter.exceeded() {
            return self.refuse(&arrival, &model, stream,
                StatusCode::PAYMENT_REQUIRED,
                "api_cost_budget_exceeded",
                format!(
                    "the API-cost budget ({:.6} USD) is exhausted: {:.6} USD spent; no further model calls are passed",
                    self.meter.budget_usd(),
                    self.meter.spent_usd()
                ),
            );
        }

        // The forwarded body: as sent, except a stream asks for its usage.
        let forwarded = if stream {
            let opts = obj
                .entry("stream_options")
                .or_insert_with(|| Value::Object(Default::default()));
            if !opts.is_object() {
                *opts = Value::Object(Default::default());
            }
            if let Some(o) = opts.as_object_mut() {
                o.insert("include_usage".into(), Value::Bool(true));
            }
            match serde_json::to_vec(&obj) {
                Ok(v) => Bytes::from(v),
                Err(e) => {
                    return self.refuse(
                        &arrival,
                        &model,
                        stream,
                        StatusCode::BAD_REQUEST,
                        "bad_request",
                        format!("the request could not be re-encoded: {e}"),
                    );
                }
            }
        } else {
            body
        };

        let ctx = CallCtx {
            ts: arrival.ts,
            endpoint: clip(&path),
            model: clip(&model),
            stream,
            price,
            request_bytes: forwarded.len() as u64,
            started: arrival.started,
        };
        self.forward(endpoint, &task_headers, forwarded, ctx, shutdown)
            .await
    }

    async fn forward(
        self: Arc<Self>,
        endpoint: Endpoint,
        task_headers: &HeaderMap,
        body: Bytes,
        ctx: CallCtx,
        shutdown: watch::Receiver<()>,
    ) -> Response<GwBody> {
        let url = format!("{}{}", self.upstream_base, endpoint.upstream_path());
        let mut headers = HeaderMap::new();
        for name in REQUEST_HEADERS {
            for v in task_headers.get_all(*name) {
                headers.append(HeaderName::from_static(name), v.clone());
            }
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(k) = &self.credentials {
            let bearer = Zeroizing::new(format!("Bearer {}", k.as_str()));
            match HeaderValue::from_str(&bearer) {
                Ok(mut v) => {
                    v.set_sensitive(true);
                    headers.insert(hyper::header::AUTHORIZATION, v);
                }
                // Checked in Gateway::new; never forward a call without its credentials.
                Err(_) => {
                    return error_response(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "gateway_error",
                        "the gateway's credentials cannot go in a header",
                    );
                }
            }
        }
        let sent = self
            .client
            .post(&url)
            .headers(headers)
            .body(body)
            .send()
            .await;
        let resp = match sent {
            Ok(r) => r,
            Err(e) => {
                let (status, prompt, note) = if e.is_connect() {
                    (
                        StatusCode::BAD_GATEWAY,
                        0,
                        format!("the upstream could not be reached: {e}"),
                    )
                } else if e.is_timeout() {
                    (
                        StatusCode::GATEWAY_TIMEOUT,
                        ctx.request_bytes.div_ceil(3),
                        format!("the upstream did not answer within {}: the request may have been billed, its bytes / 3 are charged as prompt tokens", humantime::format_duration(self.cfg.timeout())),
                    )
                } else {
                    (
                        StatusCode::BAD_GATEWAY,
                        ctx.request_bytes.div_ceil(3),
                        format!("the upstream call failed: {e}; the request may have been billed, its bytes / 3 are charged as prompt tokens"),
                    )
                };
                let note = self.redact(&note);
                self.meter.charge(
                    CallRecord {
                        ts: ctx.ts,
                        endpoint: ctx.endpoint,
                        model: ctx.model,
                        stream: ctx.stream,
                        status: status.as_u16(),
                        prompt_tokens: prompt,
                        completion_tokens: 0,
                        cost_usd: ctx.price.cost(prompt, 0),
                        latency_ms: ctx.started.elapsed().as_secs_f64() * 1e3,
                        metered: if prompt > 0 { "estimated" } else { "usage" },
                        note: Some(note.clone()),
                    },
                    Some(ctx.price),
                );
                return error_response(status, "upstream_error", &note);
            }
        };

        let status = resp.status();
        let mut out_headers = HeaderMap::new();
        for name in RESPONSE_HEADERS {
            for v in resp.headers().get_all(*name) {
                if !self.contains_key(v.as_bytes()) {
                    out_headers.append(HeaderName::from_static(name), v.clone());
                }
            }
        }
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let sse = content_type.starts_with("text/event-stream")
            || (ctx.stream && !content_type.starts_with("application/json"));
        let (tx, rx) = mpsc::channel::<Bytes>(16);
        tokio::spawn(self.clone().pump(resp, tx, ctx, status, sse, shutdown));
        let mut response = Response::new(ChannelBody(rx).boxed_unsync());
        *response.status_mut() = status;
        *response.headers_mut() = out_headers;
        response
    }

    fn contains_key(&self, hay: &[u8]) -> bool {
        match &self.credentials {
            Some(k) if !k.is_empty() => find(hay, k.as_bytes()).is_some(),
            _ => false,
        }
    }

    /// Passes the upstream body to the task chunk by chunk, meters it, and records the
    /// charge before the task's body ends.
    async fn pump(
        self: Arc<Self>,
        mut resp: reqwest::Response,
        tx: mpsc::Sender<Bytes>,
        ctx: CallCtx,
        status: StatusCode,
        sse: bool,
        mut shutdown: watch::Receiver<()>,
    ) {
        let mut usage = UsageReader::new(sse);
        let mut scrub = Scrubber::new(
            self.credentials
                .as_ref()
                .map(|k| k.as_bytes())
                .filter(|k| k.len() >= MIN_SCRUB_KEY_LEN),
        );
        let mut response_bytes: u64 = 0;
        let mut client_gone = false;
        let mut trouble: Option<String> = None;
        {
            let relay = async {
                loop {
                    match resp.chunk().await {
                        Ok(Some(chunk)) => {
                            response_bytes += chunk.len() as u64;
                            usage.feed(&chunk);
                            if !client_gone {
                                let out = scrub.feed(chunk);
                                if !out.is_empty() && tx.send(out).await.is_err() {
                                    // The task hung up: keep reading to meter what was generated.
                                    client_gone = true;
                                }
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            trouble = Some(format!("the upstream body failed midway: {e}"));
                            break;
                        }
                    }
                }
            };
            let stopped = tokio::select! {
                _ = relay => false,
                _ = shutdown.changed() => true,
            };
            if stopped {
                trouble = Some("the gateway was stopped mid-response".into());
            }
        }
        if !client_gone {
            let tail = scrub.finish();
            if !tail.is_empty() {
                let _ = tx.send(tail).await;
            }
        }
        let found = usage.finish();
        let (prompt, completion, metered, mut note) = if !status.is_success() {
            (
                0,
                0,
                "usage",
                Some(format!(
                    "upstream answered {}: not charged",
                    status.as_u16()
                )),
            )
        } else if let (Some(u), None) = (found, &trouble) {
            (u.prompt, u.completion, "usage", None)
        } else {
            let why = if found.is_some() {
                "the response was cut off"
            } else {
                "the upstream response carried no usable usage"
            };
            (
                ctx.request_bytes.div_ceil(3),
                response_bytes.div_ceil(3),
                "estimated",
                Some(format!(
                    "{why}: charged an estimate of request bytes / 3 prompt tokens and response bytes / 3 completion tokens"
                )),
            )
        };
        if let Some(t) = trouble {
            note = Some(match note {
                Some(n) => format!("{n}; {t}"),
                None => t,
            });
        }
        if client_gone {
            let gone = "the task hung up before the end of the response";
            note = Some(match note {
                Some(n) => format!("{n}; {gone}"),
                None => gone.into(),
            });
        }
        let record = CallRecord {
            ts: ctx.ts,
            endpoint: ctx.endpoint,
            model: ctx.model,
            stream: ctx.stream,
            status: status.as_u16(),
            prompt_tokens: prompt,
            completion_tokens: completion,
            cost_usd: ctx.price.cost(prompt, completion),
            latency_ms: ctx.started.elapsed().as_secs_f64() * 1e3,
            metered,
            note: note.map(|n| self.redact(&n)),
        };
        self.meter.charge(record, Some(ctx.price));
        // `tx` drops here: the task sees the end of the body only after the charge.
        drop(tx);
    }

    fn models_response(&self, id: Option<&str>) -> Response<GwBody> {
        let entry =
            |m: &str| json!({"id": m, "object": "model", "created": 0, "owned_by": "fork-gateway"});
        match id {
            None => {
                let data: Vec<Value> = self.cfg.prices.keys().map(|m| entry(m)).collect();
                json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
            }
            Some(m) if self.cfg.prices.contains_key(m) => json_response(StatusCode::OK, &entry(m)),
            Some(m) => error_response(
                StatusCode::NOT_FOUND,
                "model_not_found",
                &format!("model {} is not priced in the policy", clip(m)),
            ),
        }
    }
}

fn json_response(status: StatusCode, v: &Value) -> Response<GwBody> {
    let body = Bytes::from(v.to_string());
    let mut r = Response::new(Full::new(body).boxed_unsync());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn error_response(status: StatusCode, code: &str, message: &str) -> Response<GwBody> {
    json_response(
        status,
        &json!({"error": {"type": "fork_gateway", "code": code, "message": message}}),
    )
}

/// Token usage read from a response.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Usage {
    prompt: u64,
    completion: u64,
}

/// Reads `usage` out of a JSON object: `prompt_tokens`/`completion_tokens` (or
/// `input_tokens`/`output_tokens`) and `total_tokens`; tokens the total counts beyond
/// prompt + completion are charged as completion (the dearer side, conservatively).
fn usage_of(v: &Value) -> Option<Usage> {
    let u = v.get("usage")?.as_object()?;
    let field = |names: &[&str]| -> Result<Option<u64>, ()> {
        for n in names {
            match u.get(*n) {
                None | Some(Value::Null) => continue,
                Some(x) => return x.as_u64().map(Some).ok_or(()),
            }
        }
        Ok(None)
    };
    let prompt = field(&["prompt_tokens", "input_tokens"]).ok()?;
    let completion = field(&["completion_tokens", "output_tokens"]).ok()?;
    let total = field(&["total_tokens"]).ok()?;
    if prompt.is_none() && completion.is_none() && total.is_none() {
        return None;
    }
    let total = total.unwrap_or(0);
    let p = prompt.unwrap_or_else(|| total.saturating_sub(completion.unwrap_or(0)));
    let c = completion.unwrap_or(0).max(total.saturating_sub(p));
    Some(Usage {
        prompt: p,
        completion: c,
    })
}

/// Finds usage in a response as it passes: SSE `data:` lines, or a JSON body.
enum UsageReader {
    Sse {
        line: Vec<u8>,
        overflow: bool,
        usage: Option<Usage>,
    },
    Json {
        buf: Vec<u8>,
        overflow: bool,
    },
}

impl UsageReader {
    fn new(sse: bool) -> Self {
        if sse {
            UsageReader::Sse {
                line: Vec::new(),
                overflow: false,
                usage: None,
            }
        } else {
            UsageReader::Json {
                buf: Vec::new(),
                overflow: false,
            }
        }
    }

    fn feed(&mut self, chunk: &[u8]) {
        match self {
            UsageReader::Json { buf, overflow } => {
                if !*overflow {
                    if buf.len() + chunk.len() > MAX_METER_BUFFER {
                        *overflow = true;
                        *buf = Vec::new();
                    } else {
                        buf.extend_from_slice(chunk);
                    }
                }
            }
            UsageReader::Sse {
                line,
                overflow,
                usage,
            } => {
                let mut rest = chunk;
                while let Some(i) = rest.iter().position(|&b| b == b'\n') {
                    if !*overflow && line.len() + i <= MAX_SSE_LINE {
                        line.extend_from_slice(&rest[..i]);
                        if let Some(u) = sse_line_usage(line) {
                            *usage = Some(u);
                        }
                    }
                    line.clear();
                    *overflow = false;
                    rest = &rest[i + 1..];
                }
                if !*overflow {
                    if line.len() + rest.len() > MAX_SSE_LINE {
                        // A line this long is skipped; if it held the usage, the call is estimated.
                        *overflow = true;
                        line.clear();
                    } else {
                        line.extend_from_slice(rest);
                    }
                }
            }
        }
    }

    fn finish(self) -> Option<Usage> {
        match self {
            UsageReader::Json { buf, overflow } => {
                if overflow {
                    return None;
                }
                usage_of(&serde_json::from_slice::<Value>(&buf).ok()?)
            }
            UsageReader::Sse {
                line,
                overflow,
                usage,
            } => {
                let last = if overflow {
                    None
                } else {
                    sse_line_usage(&line)
                };
                last.or(usage)
            }
        }
    }
}

fn sse_line_usage(line: &[u8]) -> Option<Usage> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let data = line.strip_prefix(b"data:")?;
    let data = data.trim_ascii();
    if data == b"[DONE]" {
        return None;
    }
    usage_of(&serde_json::from_slice::<Value>(data).ok()?)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Replaces the key in a byte stream, also where it straddles chunks: only a tail that
/// could still be the start of the key is held back (an SSE event's closing newlines never
/// are, so streaming stays live).
struct Scrubber<'k> {
    key: Option<&'k [u8]>,
    tail: Vec<u8>,
}

impl<'k> Scrubber<'k> {
    fn new(key: Option<&'k [u8]>) -> Self {
        Scrubber {
            key,
            tail: Vec::new(),
        }
    }

    fn feed(&mut self, chunk: Bytes) -> Bytes {
        let Some(key) = self.key else {
            return chunk;
        };
        if self.tail.is_empty() && find(&chunk, key).is_none() && partial_suffix(&chunk, key) == 0 {
            return chunk;
        }
        let mut buf = std::mem::take(&mut self.tail);
        buf.extend_from_slice(&chunk);
        let mut out = replace_all(&buf, key);
        let hold = partial_suffix(&out, key);
        self.tail = out.split_off(out.len() - hold);
        Bytes::from(out)
    }

    fn finish(&mut self) -> Bytes {
        Bytes::from(std::mem::take(&mut self.tail))
    }
}

/// The length of the longest proper prefix of `key` that `buf` ends with.
fn partial_suffix(buf: &[u8], key: &[u8]) -> usize {
    (1..key.len())
        .rev()
        .find(|&k| k <= buf.len() && buf.ends_with(&key[..k]))
        .unwrap_or(0)
}

fn replace_all(buf: &[u8], key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(buf.len());
    let mut rest = buf;
    while let Some(i) = find(rest, key) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(REDACTED.as_bytes());
        rest = &rest[i + key.len()..];
    }
    out.extend_from_slice(rest);
    out
}

impl crate::sandbox::CostMeter for Meter {
    fn spent_usd(&self) -> f64 {
        Meter::spent_usd(self)
    }
    fn exceeded(&self) -> bool {
        Meter::exceeded(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    const KEY: &str = "sk-fork-test-supervisor-0123456789abcdef";

    fn script() -> PathBuf {
        // `file!()` is `src/gateway.rs` (relative to the package root, the test's cwd) in the
        // main crate, or an absolute path when this file is mounted elsewhere with #[path].
        let here = Path::new(file!());
        let root = here
            .parent()
            .and_then(Path::parent)
            .unwrap_or(Path::new(""));
        let p = root.join("scripts/fake-openai.py");
        if p.exists() {
            p
        } else {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fake-openai.py")
        }
    }

    /// The fake upstream (scripts/fake-openai.py) on a loopback port, killed on drop.
    struct Fake {
        child: std::process::Child,
        port: u16,
        _dir: tempfile::TempDir,
    }

    impl Fake {
        fn start(args: &[&str]) -> Fake {
            let dir = tempfile::tempdir().unwrap();
            let port_file = dir.path().join("port");
            let child = Command::new("python3")
                .arg(script())
                .args(["--port", "0", "--max-seconds", "120", "--port-file"])
                .arg(&port_file)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .expect("python3 runs scripts/fake-openai.py");
            // Owned by `Fake` at once: its Drop kills and reaps the child on every path.
            let mut fake = Fake {
                child,
                port: 0,
                _dir: dir,
            };
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if let Ok(s) = std::fs::read_to_string(&port_file) {
                    if let Ok(port) = s.trim().parse() {
                        fake.port = port;
                        return fake;
                    }
                }
                assert!(Instant::now() < deadline, "the fake upstream did not start");
                std::thread::sleep(Duration::from_millis(20));
            }
        }

        fn base(&self) -> String {
            format!("http://127.0.0.1:{}/v1", self.port)
        }

        /// How many /v1 requests reached the upstream.
        async fn requests(&self) -> u64 {
            let v: Value = client()
                .get(format!("http://127.0.0.1:{}/fake/stats", self.port))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v["requests"].as_u64().unwrap()
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn config(upstream: &str, prices: &[(&str, f64, f64)]) -> GatewayConfig {
        GatewayConfig {
            upstream: upstream.into(),
            credentials_env: None,
            credentials_file: None,
            prices: prices
                .iter()
                .map(|(m, i, o)| {
                    (
                        m.to_string(),
                        Price {
                            input_per_mtok: *i,
                            output_per_mtok: *o,
                        },
                    )
                })
                .collect(),
            port: None,
            timeout: Some("30s".into()),
        }
    }

    /// The task's HTTP client.
    fn client() -> reqwest::Client {
        reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap()
    }

    struct Running {
        gw: Arc<Gateway>,
        url: String,
        serve: tokio::task::JoinHandle<()>,
    }

    impl Drop for Running {
        fn drop(&mut self) {
            self.serve.abort();
        }
    }

    async fn start(cfg: GatewayConfig, key: Option<&str>, budget: f64) -> Running {
        let gw = Gateway::new(
            cfg,
            key.map(|k| Zeroizing::new(k.to_string())),
            Meter::new(budget),
        )
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let serve = tokio::spawn(gw.clone().serve(listener));
        Running {
            gw,
            url: format!("http://127.0.0.1:{port}/v1"),
            serve,
        }
    }

    fn chat(model: &str, prompt: &str) -> Value {
        json!({"model": model, "messages": [{"role": "user", "content": prompt}]})
    }

    fn words(s: &str) -> u64 {
        s.split_whitespace().count() as u64
    }

    #[tokio::test]
    async fn non_streaming_chat_is_charged_exactly_from_usage() {
        let fake = Fake::start(&[]);
        let rt = start(config(&fake.base(), &[("gpt-test", 2.5, 10.0)]), None, 1.0).await;
        let prompt = "one two three four five six seven";
        let resp = client()
            .post(format!("{}/chat/completions", rt.url))
            .json(&chat("gpt-test", prompt))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let body: Value = resp.json().await.unwrap();
        let reply = body["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(reply, "fake reply to: one two three four five");
        let (p, c) = (words(prompt), words(reply));
        assert_eq!((p, c), (7, 8));
        assert_eq!(body["usage"]["prompt_tokens"], p);
        assert_eq!(body["usage"]["completion_tokens"], c);

        let log = rt.gw.meter().log();
        assert_eq!(log.len(), 1);
        let r = &log[0];
        assert_eq!((r.prompt_tokens, r.completion_tokens), (7, 8));
        assert_eq!(r.metered, "usage");
        assert_eq!((r.status, r.stream), (200, false));
        assert_eq!(r.model, "gpt-test");
        assert_eq!(r.endpoint, "/v1/chat/completions");
        // 7 * 2.5 / 1e6 + 8 * 10 / 1e6 = 97.5e-6 USD
        assert!((r.cost_usd - 97.5e-6).abs() < 1e-15, "{}", r.cost_usd);
        assert!((rt.gw.meter().spent_usd() - 97.5e-6).abs() < 1e-15);
        assert_eq!(rt.gw.meter().tokens(), (7, 8));
        assert!(!rt.gw.meter().exceeded());
        assert_eq!(fake.requests().await, 1);
    }

    #[tokio::test]
    async fn streaming_chat_passes_chunks_as_they_come_and_is_charged_from_the_usage_chunk() {
        let fake = Fake::start(&["--chunk-delay-ms", "150"]);
        let rt = start(config(&fake.base(), &[("gpt-test", 1.0, 4.0)]), None, 1.0).await;
        // The task even asks for no usage: the gateway asks for it anyway.
        let req = json!({"model": "gpt-test", "stream": true,
                         "stream_options": {"include_usage": false},
                         "messages": [{"role": "user", "content": "a b c d e"}]});
        let t0 = Instant::now();
        let mut resp = client()
            .post(format!("{}/chat/completions", rt.url))
            .json(&req)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert!(resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        let mut raw = Vec::new();
        let mut first_chunk = None;
        while let Some(chunk) = resp.chunk().await.unwrap() {
            first_chunk.get_or_insert(t0.elapsed());
            raw.extend_from_slice(&chunk);
        }
        let end = t0.elapsed();
        let first = first_chunk.unwrap();
        // 8 words, 150 ms apart: the first must reach the task long before the last.
        assert!(
            first + Duration::from_millis(500) < end,
            "not streamed: first chunk at {first:?}, end at {end:?}"
        );
        let text = String::from_utf8(raw).unwrap();
        let mut content = String::new();
        let mut usage = None;
        let mut done = false;
        for line in text.lines() {
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let v: Value = serde_json::from_str(data).unwrap();
            if let Some(d) = v["choices"][0]["delta"]["content"].as_str() {
                content.push_str(d);
            }
            if v["usage"].is_object() {
                usage = Some(v["usage"].clone());
            }
        }
        assert!(done, "the [DONE] line was passed through");
        assert_eq!(content, "fake reply to: a b c d e");
        let usage = usage.expect("the final usage chunk reached the task");
        assert_eq!(usage["prompt_tokens"], 5);
        assert_eq!(usage["completion_tokens"], 8);
        let log = rt.gw.meter().log();
        assert_eq!(log.len(), 1);
        assert!(log[0].stream);
        assert_eq!(log[0].metered, "usage");
        assert_eq!((log[0].prompt_tokens, log[0].completion_tokens), (5, 8));
        assert!((rt.gw.meter().spent_usd() - (5.0 * 1.0 + 8.0 * 4.0) / 1e6).abs() < 1e-15);
    }

    #[tokio::test]
    async fn embeddings_are_charged() {
        let fake = Fake::start(&[]);
        let rt = start(
            config(&fake.base(), &[("embed-test", 0.02, 0.0)]),
            None,
            1.0,
        )
        .await;
        let resp = client()
            .post(format!("{}/embeddings", rt.url))
            .json(&json!({"model": "embed-test", "input": ["alpha beta", "gamma"]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["data"].as_array().unwrap().len(), 2);
        let log = rt.gw.meter().log();
        assert_eq!((log[0].prompt_tokens, log[0].completion_tokens), (3, 0));
        assert_eq!(log[0].endpoint, "/v1/embeddings");
        assert!((rt.gw.meter().spent_usd() - 3.0 * 0.02 / 1e6).abs() < 1e-18);
    }

    #[tokio::test]
    async fn refusals_are_never_forwarded() {
        let fake = Fake::start(&[]);
        let rt = start(
            config(
                &fake.base(),
                &[("gpt-test", 1.0, 1.0), ("embed-test", 0.1, 0.0)],
            ),
            None,
            1.0,
        )
        .await;
        let c = client();
        let post = |path: &str, body: Vec<u8>| {
            c.post(format!("{}{path}", rt.url))
                .header("content-type", "application/json")
                .body(body)
                .send()
        };
        // An unpriced model.
        let r = post(
            "/chat/completions",
            chat("gpt-unpriced", "hi").to_string().into_bytes(),
        )
        .await
        .unwrap();
        assert_eq!(r.status(), 403);
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["type"], "fork_gateway");
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("model gpt-unpriced is not priced in the policy"),
            "{msg}"
        );
        // No model, not JSON, not an object, too large.
        let r = post("/chat/completions", br#"{"messages": []}"#.to_vec())
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        let r = post("/embeddings", b"not json".to_vec()).await.unwrap();
        assert_eq!(r.status(), 400);
        let r = post("/embeddings", b"[1, 2]".to_vec()).await.unwrap();
        assert_eq!(r.status(), 400);
        let mut big = br#"{"model": "gpt-test", "pad": ""#.to_vec();
        big.resize(MAX_REQUEST_BYTES + 1024, b'x');
        big.extend_from_slice(b"\"}");
        let r = post("/chat/completions", big).await.unwrap();
        assert_eq!(r.status(), 413);
        // Unknown endpoints and methods.
        let r = post(
            "/completions",
            chat("gpt-test", "hi").to_string().into_bytes(),
        )
        .await
        .unwrap();
        assert_eq!(r.status(), 404);
        assert_eq!(
            r.json::<Value>().await.unwrap()["error"]["type"],
            "fork_gateway"
        );
        let r = c
            .get(format!("{}/chat/completions", rt.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 405);
        assert_eq!(
            fake.requests().await,
            0,
            "nothing refused reached the upstream"
        );
        let log = rt.gw.meter().log();
        assert_eq!(log.len(), 7);
        assert!(log
            .iter()
            .all(|r| r.metered == "refused" && r.cost_usd == 0.0));
        assert_eq!(log[0].model, "gpt-unpriced");
        assert_eq!(rt.gw.meter().spent_usd(), 0.0);

        // The models are answered locally.
        let m: Value = c
            .get(format!("{}/models", rt.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let ids: Vec<&str> = m["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["embed-test", "gpt-test"]);
        let r = c
            .get(format!("{}/models/gpt-test", rt.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let r = c
            .get(format!("{}/models/gpt-unpriced", rt.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
        assert_eq!(fake.requests().await, 0);

        // The same endpoint without /v1 is forwarded.
        let base = rt.url.trim_end_matches("/v1");
        let r = c
            .post(format!("{base}/chat/completions"))
            .json(&chat("gpt-test", "hello"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(fake.requests().await, 1);
    }

    #[tokio::test]
    async fn the_key_is_added_the_tasks_credentials_are_not_and_nothing_leaks_back() {
        let fake = Fake::start(&["--require-key", KEY, "--echo-headers"]);
        let rt = start(
            config(&fake.base(), &[("gpt-test", 1.0, 1.0)]),
            Some(KEY),
            1.0,
        )
        .await;
        let c = client();
        let resp = c
            .post(format!("{}/chat/completions", rt.url))
            .header("authorization", "Bearer stolen")
            .header("proxy-authorization", "Basic c3RvbGVu")
            .header("cookie", "session=stolen")
            .header("x-custom", "private")
            .json(&chat("gpt-test", "show me the headers"))
            .send()
            .await
            .unwrap();
        // --require-key passed: the configured key reached the upstream, not the task's.
        assert_eq!(resp.status(), 200);
        for (name, value) in resp.headers() {
            let v = String::from_utf8_lossy(value.as_bytes());
            assert!(!v.contains(KEY), "header {name} carries the key");
            assert!(
                RESPONSE_HEADERS.contains(&name.as_str())
                    || name == "content-length"
                    || name == "date"
                    || name == "transfer-encoding",
                "header {name} should not have been passed"
            );
        }
        assert!(resp.headers().get("set-cookie").is_none());
        assert!(resp.headers().get("x-echo-authorization").is_none());
        assert!(resp.headers().get("x-request-id").is_some());
        let text = resp.text().await.unwrap();
        let body: Value = serde_json::from_str(&text).unwrap();
        let echoed = body["choices"][0]["message"]["content"].as_str().unwrap();
        // The upstream saw the key (it echoes it; the gateway scrubs the echo) and
        // none of the task's credentials or unlisted headers.
        assert!(echoed.contains(&format!("Bearer {REDACTED}")), "{echoed}");
        assert!(!text.contains(KEY));
        for leaked in [
            "stolen",
            "c3RvbGVu",
            "cookie",
            "proxy-authorization",
            "private",
            "x-custom",
        ] {
            assert!(
                !echoed.to_lowercase().contains(leaked),
                "{leaked} reached the upstream: {echoed}"
            );
        }

        // Streamed, the echo is scrubbed too.
        let mut req = chat("gpt-test", "stream the headers");
        req["stream"] = json!(true);
        let text = c
            .post(format!("{}/chat/completions", rt.url))
            .json(&req)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(text.contains(REDACTED) && !text.contains(KEY));

        // Nor in the log, nor in the gateway's Debug.
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("calls.jsonl");
        rt.gw.write_log(&log).unwrap();
        assert!(!std::fs::read_to_string(&log).unwrap().contains(KEY));
        assert!(!format!("{:?}", rt.gw).contains(KEY));
        assert_eq!(rt.gw.meter().log().len(), 2);
        assert!(rt.gw.meter().log().iter().all(|r| r.metered == "usage"));

        // Without configured credentials, nothing is added and the task's still do not pass.
        let open = Fake::start(&["--echo-headers"]);
        let rt = start(config(&open.base(), &[("gpt-test", 1.0, 1.0)]), None, 1.0).await;
        let v: Value = c
            .post(format!("{}/chat/completions", rt.url))
            .header("authorization", "Bearer stolen")
            .header("cookie", "session=stolen")
            .json(&chat("gpt-test", "anything"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let echoed = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(
            echoed.contains("\"content-type\": \"application/json\""),
            "{echoed}"
        );
        assert!(
            !echoed.contains("Authorization") && !echoed.contains("stolen"),
            "{echoed}"
        );
    }

    #[tokio::test]
    async fn upstream_errors_are_passed_free_and_logged() {
        // Without the key, the upstream refuses: 401 passed through, nothing charged.
        let fake = Fake::start(&["--require-key", KEY]);
        let rt = start(config(&fake.base(), &[("gpt-test", 1.0, 1.0)]), None, 1.0).await;
        let r = client()
            .post(format!("{}/chat/completions", rt.url))
            .json(&chat("gpt-test", "hi"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
        assert_eq!(
            r.json::<Value>().await.unwrap()["error"]["code"],
            "invalid_api_key"
        );
        let log = rt.gw.meter().log();
        assert_eq!((log[0].status, log[0].cost_usd), (401, 0.0));
        assert!(log[0].note.as_deref().unwrap().contains("401"));
        assert_eq!(rt.gw.meter().spent_usd(), 0.0);

        // An upstream nobody listens on: 502, free, and the key is nowhere in the answer.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let rt = start(
            config(
                &format!("http://127.0.0.1:{port}/v1"),
                &[("gpt-test", 1.0, 1.0)],
            ),
            Some(KEY),
            1.0,
        )
        .await;
        let r = client()
            .post(format!("{}/chat/completions", rt.url))
            .json(&chat("gpt-test", "hi"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 502);
        let text = r.text().await.unwrap();
        assert!(
            text.contains("could not be reached") && !text.contains(KEY),
            "{text}"
        );
        assert_eq!(rt.gw.meter().spent_usd(), 0.0);
        assert_eq!(rt.gw.meter().log()[0].status, 502);
    }

    #[tokio::test]
    async fn over_budget_the_first_call_is_charged_then_exceeded_fires_then_402() {
        let fake = Fake::start(&[]);
        // 1000 USD per million tokens = 0.001 USD per token; the budget is one token.
        let rt = start(
            config(&fake.base(), &[("gpt-test", 1000.0, 1000.0)]),
            None,
            0.001,
        )
        .await;
        let meter = rt.gw.meter().clone();
        let watcher = tokio::spawn(async move { meter.exceeded_signal().await });
        let c = client();
        let r = c
            .post(format!("{}/chat/completions", rt.url))
            .json(&chat("gpt-test", "one two three"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        // 3 prompt + 6 completion tokens at 0.001 USD.
        assert!((rt.gw.meter().spent_usd() - 0.009).abs() < 1e-12);
        tokio::time::timeout(Duration::from_secs(5), watcher)
            .await
            .expect("exceeded_signal resolved")
            .unwrap();
        assert!(rt.gw.meter().exceeded());
        let r = c
            .post(format!("{}/chat/completions", rt.url))
            .json(&chat("gpt-test", "again"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 402);
        let msg = r.json::<Value>().await.unwrap()["error"]["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            msg.contains("API-cost budget (0.001000 USD)") && msg.contains("0.009000 USD spent"),
            "{msg}"
        );
        assert_eq!(
            fake.requests().await,
            1,
            "the refused call was not forwarded"
        );
        let log = rt.gw.meter().log();
        assert_eq!((log[1].status, log[1].metered), (402, "refused"));
        assert!((rt.gw.meter().spent_usd() - 0.009).abs() < 1e-12);
    }

    #[tokio::test]
    async fn a_response_without_usage_is_charged_an_estimate() {
        let fake = Fake::start(&["--no-usage"]);
        let rt = start(config(&fake.base(), &[("gpt-test", 3.0, 7.0)]), None, 1.0).await;
        let body = chat("gpt-test", "no usage here please")
            .to_string()
            .into_bytes();
        let resp = client()
            .post(format!("{}/chat/completions", rt.url))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let got = resp.bytes().await.unwrap();
        assert!(serde_json::from_slice::<Value>(&got)
            .unwrap()
            .get("usage")
            .is_none());
        let r = &rt.gw.meter().log()[0];
        assert_eq!(r.metered, "estimated");
        let (p, c) = (
            (body.len() as u64).div_ceil(3),
            (got.len() as u64).div_ceil(3),
        );
        assert_eq!((r.prompt_tokens, r.completion_tokens), (p, c));
        assert!((r.cost_usd - (p as f64 * 3.0 + c as f64 * 7.0) / 1e6).abs() < 1e-15);
        assert!(r.note.as_deref().unwrap().contains("estimate"));

        // Streamed without a usage chunk: estimated as well.
        let mut req = chat("gpt-test", "stream without usage");
        req["stream"] = json!(true);
        let resp = client()
            .post(format!("{}/chat/completions", rt.url))
            .json(&req)
            .send()
            .await
            .unwrap();
        let text = resp.text().await.unwrap();
        assert!(text.ends_with("data: [DONE]\n\n"));
        let r = &rt.gw.meter().log()[1];
        assert_eq!((r.metered, r.stream), ("estimated", true));
        assert_eq!(r.completion_tokens, (text.len() as u64).div_ceil(3));
    }

    #[tokio::test]
    async fn parallel_calls_sum_exactly() {
        let fake = Fake::start(&[]);
        let price = Price {
            input_per_mtok: 0.15,
            output_per_mtok: 0.6,
        };
        let rt = start(config(&fake.base(), &[("gpt-test", 0.15, 0.6)]), None, 1.0).await;
        let c = client();
        let calls = (0..20).map(|i| {
            let prompt = vec!["w"; i + 1].join(" ");
            let req = c
                .post(format!("{}/chat/completions", rt.url))
                .json(&chat("gpt-test", &prompt));
            async move {
                let r = req.send().await.unwrap();
                assert_eq!(r.status(), 200);
                let v: Value = r.json().await.unwrap();
                (
                    v["usage"]["prompt_tokens"].as_u64().unwrap(),
                    v["usage"]["completion_tokens"].as_u64().unwrap(),
                )
            }
        });
        let usages = futures_util::future::join_all(calls).await;
        let (p, c): (u64, u64) = usages.iter().fold((0, 0), |(a, b), (x, y)| (a + x, b + y));
        assert_eq!(p, (1..=20).sum::<u64>());
        assert_eq!(rt.gw.meter().tokens(), (p, c));
        assert_eq!(rt.gw.meter().spent_usd(), price.cost(p, c));
        assert_eq!(rt.gw.meter().calls(), 20);
        assert_eq!(rt.gw.meter().log().len(), 20);
        assert_eq!(fake.requests().await, 20);
    }

    #[tokio::test]
    async fn the_call_log_is_json_lines_with_every_field() {
        let fake = Fake::start(&[]);
        let rt = start(config(&fake.base(), &[("gpt-test", 1.0, 2.0)]), None, 1.0).await;
        let c = client();
        for model in ["gpt-test", "nope"] {
            c.post(format!("{}/chat/completions", rt.url))
                .json(&chat(model, "log me"))
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.jsonl");
        rt.gw.write_log(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        for l in &lines {
            let o = l.as_object().unwrap();
            for f in [
                "ts",
                "endpoint",
                "model",
                "stream",
                "status",
                "prompt_tokens",
                "completion_tokens",
                "cost_usd",
                "latency_ms",
                "metered",
                "note",
            ] {
                assert!(o.contains_key(f), "field {f} missing in {l}");
            }
            assert!(humantime::parse_rfc3339(l["ts"].as_str().unwrap()).is_ok());
            assert!(l["latency_ms"].as_f64().unwrap() >= 0.0);
        }
        assert_eq!(lines[0]["metered"], "usage");
        assert_eq!(lines[0]["status"], 200);
        assert_eq!(lines[0]["prompt_tokens"], 2);
        assert_eq!(lines[1]["metered"], "refused");
        assert_eq!(lines[1]["model"], "nope");
        assert_eq!(lines[1]["status"], 403);
    }

    #[tokio::test]
    async fn aborting_serve_closes_the_door() {
        let fake = Fake::start(&[]);
        let mut rt = start(config(&fake.base(), &[("gpt-test", 1.0, 1.0)]), None, 1.0).await;
        let r = client()
            .get(format!("{}/models", rt.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        rt.serve.abort();
        assert!((&mut rt.serve).await.unwrap_err().is_cancelled());
        // The listener went with the serve task: a fresh connection is refused.
        let fresh = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        assert!(fresh
            .get(format!("{}/models", rt.url))
            .send()
            .await
            .is_err());
    }

    #[test]
    fn config_validation_names_the_field() {
        let ok = config("https://api.example.com/v1", &[("m", 1.0, 2.0)]);
        ok.validate("policy.toml").unwrap();
        assert_eq!(ok.port(), DEFAULT_PORT);
        assert_eq!(ok.task_url(), "http://127.0.0.1:8089/v1");
        assert_eq!(ok.timeout(), Duration::from_secs(30));
        type Breaker = Box<dyn Fn(&mut GatewayConfig)>;
        let cases: Vec<(&str, Breaker)> = vec![
            (
                "gateway.upstream",
                Box::new(|c| c.upstream = "not a url".into()),
            ),
            (
                "gateway.upstream",
                Box::new(|c| c.upstream = "ftp://example.com/v1".into()),
            ),
            (
                "gateway.upstream",
                Box::new(|c| c.upstream = "https://user:pw@example.com/v1".into()),
            ),
            (
                "gateway.upstream",
                Box::new(|c| c.upstream = "https://example.com/v1?k=1".into()),
            ),
            (
                "gateway.upstream",
                Box::new(|c| {
                    c.upstream = "http://example.com/v1".into();
                    c.credentials_env = Some("OPENAI_API_KEY".into());
                }),
            ),
            ("gateway.prices", Box::new(|c| c.prices.clear())),
            (
                "gateway.prices.\"m\".input_per_mtok",
                Box::new(|c| c.prices.get_mut("m").unwrap().input_per_mtok = -1.0),
            ),
            (
                "gateway.prices.\"m\".output_per_mtok",
                Box::new(|c| c.prices.get_mut("m").unwrap().output_per_mtok = f64::NAN),
            ),
            (
                "gateway.credentials_env",
                Box::new(|c| {
                    c.credentials_env = Some("K".into());
                    c.credentials_file = Some("/k".into());
                }),
            ),
            (
                "gateway.credentials_env",
                Box::new(|c| c.credentials_env = Some("A=B".into())),
            ),
            ("gateway.port", Box::new(|c| c.port = Some(0))),
            (
                "gateway.timeout",
                Box::new(|c| c.timeout = Some("soon".into())),
            ),
            (
                "gateway.timeout",
                Box::new(|c| c.timeout = Some("0s".into())),
            ),
        ];
        for (field, break_it) in cases {
            let mut c = ok.clone();
            break_it(&mut c);
            let e = c.validate("policy.toml").unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("policy.toml: {field}:")),
                "{e} does not name {field}"
            );
        }
        // http to a loopback upstream with a key is fine; so is http without a key.
        let mut c = ok.clone();
        c.upstream = "http://127.0.0.1:8080/v1".into();
        c.credentials_env = Some("K".into());
        c.validate("p").unwrap();
        c.upstream = "http://[::1]:8080/v1".into();
        c.validate("p").unwrap();
        c.credentials_env = None;
        c.upstream = "http://example.com/v1".into();
        c.validate("p").unwrap();
        // Unknown fields are refused when read from a policy.
        let t = "upstream = \"https://x/v1\"\nprices.m = { input_per_mtok = 1.0, output_per_mtok = 1.0 }\nbudget = 3\n";
        assert!(toml::from_str::<GatewayConfig>(t)
            .unwrap_err()
            .to_string()
            .contains("budget"));
        let t = "upstream = \"https://x/v1\"\ncredentials_env = \"K\"\n[prices.m]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.5\n";
        let c: GatewayConfig = toml::from_str(t).unwrap();
        c.validate("p").unwrap();
        assert_eq!(c.prices["m"].output_per_mtok, 2.5);
    }

    #[test]
    fn credentials_load_from_env_or_file_and_errors_never_show_the_key() {
        let mut c = config("https://api.example.com/v1", &[("m", 1.0, 1.0)]);
        assert!(c.load_credentials().unwrap().is_none());
        let var = "FORK_GATEWAY_TEST_KEY_7f3a";
        c.credentials_env = Some(var.into());
        let e = c.load_credentials().unwrap_err().to_string();
        assert!(e.contains(var) && e.contains("not set"), "{e}");
        // Edition 2021: set_var is safe; the variable is used by this test only.
        std::env::set_var(var, format!("  {KEY}\n"));
        assert_eq!(c.load_credentials().unwrap().unwrap().as_str(), KEY);
        std::env::set_var(var, format!("{KEY} with spaces"));
        let e = c.load_credentials().unwrap_err().to_string();
        assert!(!e.contains(KEY), "{e}");
        std::env::remove_var(var);

        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("key");
        std::fs::write(&f, format!("{KEY}\nsecond line ignored\n")).unwrap();
        c.credentials_env = None;
        c.credentials_file = Some(f.clone());
        assert_eq!(c.load_credentials().unwrap().unwrap().as_str(), KEY);
        std::fs::write(&f, "\n").unwrap();
        let e = c.load_credentials().unwrap_err().to_string();
        assert!(
            e.contains(&f.display().to_string()) && e.contains("empty"),
            "{e}"
        );
        c.credentials_file = Some(dir.path().join("missing"));
        assert!(c
            .load_credentials()
            .unwrap_err()
            .to_string()
            .contains("cannot read"));
    }

    #[test]
    fn usage_is_read_from_the_usual_shapes() {
        let u = |v: Value| usage_of(&json!({ "usage": v }));
        assert_eq!(
            u(json!({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7})),
            Some(Usage {
                prompt: 3,
                completion: 4
            })
        );
        assert_eq!(
            u(json!({"prompt_tokens": 5, "total_tokens": 5})),
            Some(Usage {
                prompt: 5,
                completion: 0
            })
        );
        assert_eq!(
            u(json!({"total_tokens": 9})),
            Some(Usage {
                prompt: 9,
                completion: 0
            })
        );
        assert_eq!(
            u(json!({"input_tokens": 2, "output_tokens": 6})),
            Some(Usage {
                prompt: 2,
                completion: 6
            })
        );
        // A total beyond prompt + completion is charged as completion.
        assert_eq!(
            u(json!({"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 10})),
            Some(Usage {
                prompt: 2,
                completion: 8
            })
        );
        assert_eq!(
            u(json!({"prompt_tokens": -1, "completion_tokens": 1})),
            None
        );
        assert_eq!(u(json!({"prompt_tokens": "3"})), None);
        assert_eq!(u(json!(null)), None);
        assert_eq!(u(json!({})), None);
        assert_eq!(usage_of(&json!({"choices": []})), None);
    }

    #[test]
    fn sse_usage_is_found_across_chunk_boundaries() {
        let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\r\n\r\n\
                      : a comment\n\n\
                      data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":22}}\n\n\
                      data: [DONE]\n\n";
        for split in [1, 2, 7, 13, 64, stream.len()] {
            let mut r = UsageReader::new(true);
            for chunk in stream.as_bytes().chunks(split) {
                r.feed(chunk);
            }
            assert_eq!(
                r.finish(),
                Some(Usage {
                    prompt: 11,
                    completion: 22
                }),
                "split {split}"
            );
        }
        // Usage on a last line without its newline, and a JSON body in pieces.
        let mut r = UsageReader::new(true);
        r.feed(b"data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}");
        assert_eq!(
            r.finish(),
            Some(Usage {
                prompt: 1,
                completion: 2
            })
        );
        let mut r = UsageReader::new(false);
        r.feed(b"{\"usage\":{\"prompt_tokens\":4,");
        r.feed(b"\"completion_tokens\":5}}");
        assert_eq!(
            r.finish(),
            Some(Usage {
                prompt: 4,
                completion: 5
            })
        );
        let mut r = UsageReader::new(true);
        r.feed(b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n");
        assert_eq!(r.finish(), None);
    }

    #[test]
    fn the_scrubber_replaces_the_key_across_chunks_and_holds_back_only_a_possible_start() {
        let key = KEY.as_bytes();
        let text = format!("a {KEY} b {KEY}{KEY} sk-fork-not-the-key\n\nend sk-fork");
        for split in [1, 3, 10, 41, 1000] {
            let mut s = Scrubber::new(Some(key));
            let mut out = Vec::new();
            for chunk in text.as_bytes().chunks(split) {
                out.extend_from_slice(&s.feed(Bytes::copy_from_slice(chunk)));
            }
            out.extend_from_slice(&s.finish());
            let want = text.replace(KEY, REDACTED);
            assert_eq!(String::from_utf8(out).unwrap(), want, "split {split}");
        }
        // An SSE event's end is never held back.
        let mut s = Scrubber::new(Some(key));
        let chunk = Bytes::from_static(b"data: {\"x\": 1}\n\n");
        assert_eq!(s.feed(chunk.clone()), chunk);
        // A possible start of the key is held until it is resolved.
        assert_eq!(
            s.feed(Bytes::from_static(b"xx sk-fo")),
            Bytes::from_static(b"xx ")
        );
        assert_eq!(
            s.feed(Bytes::from_static(b"o")),
            Bytes::from_static(b"sk-foo")
        );
        assert_eq!(partial_suffix(b"abc", b"cde"), 1);
        assert_eq!(partial_suffix(b"abc", b"xyz"), 0);
    }

    #[tokio::test]
    async fn the_meter_signals_once_over_budget_and_fails_closed() {
        let m = Meter::new(0.5);
        let rec = |tokens: u64| CallRecord {
            ts: String::new(),
            endpoint: "/v1/chat/completions".into(),
            model: "m".into(),
            stream: false,
            status: 200,
            prompt_tokens: tokens,
            completion_tokens: 0,
            cost_usd: 0.0,
            latency_ms: 0.0,
            metered: "usage",
            note: None,
        };
        let price = Some(Price {
            input_per_mtok: 1e6,
            output_per_mtok: 0.0,
        }); // 1 USD per token
        assert!(!m.exceeded());
        let waiter = {
            let m = m.clone();
            tokio::spawn(async move { m.exceeded_signal().await })
        };
        m.charge(rec(0), price);
        assert!(!m.exceeded(), "a free call does not exceed");
        m.charge(rec(1), price);
        assert!(m.exceeded());
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        // At once when already exceeded.
        tokio::time::timeout(Duration::from_secs(1), m.exceeded_signal())
            .await
            .unwrap();
        assert_eq!(m.calls(), 2);
        assert_eq!(Meter::new(f64::NAN).budget_usd(), 0.0);
        assert_eq!(Meter::new(-3.0).budget_usd(), 0.0);
        let unlimited = Meter::new(f64::INFINITY);
        unlimited.charge(rec(1_000_000), price);
        assert!(!unlimited.exceeded());
    }
}
