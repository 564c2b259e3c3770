//! Admission: what a task's request must be to be forwarded (a known endpoint, POST, a
//! body within the limits that is a JSON object naming a priced model), what it may cost
//! at most (its worst case, held against the budget while it runs), and the body as
//! forwarded (a stream asks for its usage).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, CONTENT_LENGTH};
use hyper::{Method, Request, StatusCode};
use serde_json::Value;

use super::config::clip;
use super::{Gateway, Price};

/// The largest request body the task may send (413 beyond).
pub const MAX_REQUEST_BYTES: usize = 8 << 20;
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Endpoint {
    Chat,
    Embeddings,
}

impl Endpoint {
    pub(super) fn upstream_path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/chat/completions",
            Endpoint::Embeddings => "/embeddings",
        }
    }
}

/// Why a request is not forwarded: the gateway answers it itself and logs it as refused.
pub(super) struct Refusal {
    pub(super) status: StatusCode,
    pub(super) code: &'static str,
    pub(super) message: String,
    pub(super) model: String,
    pub(super) stream: bool,
}

impl Refusal {
    /// A refusal before the request's model is known.
    pub(super) fn new(status: StatusCode, code: &'static str, message: String) -> Refusal {
        Refusal {
            status,
            code,
            message,
            model: String::new(),
            stream: false,
        }
    }

    /// A refusal of a call for `model`.
    pub(super) fn of(mut self, model: &str, stream: bool) -> Refusal {
        self.model = model.to_string();
        self.stream = stream;
        self
    }
}

/// A request that passed every check, ready to forward.
pub(super) struct Admitted {
    pub(super) endpoint: Endpoint,
    pub(super) task_headers: HeaderMap,
    /// The body as forwarded.
    pub(super) body: Bytes,
    pub(super) model: String,
    pub(super) stream: bool,
    pub(super) price: Price,
    /// The most completion tokens the call asks for (`max_tokens` or
    /// `max_completion_tokens`, the larger), if it says.
    pub(super) max_tokens: Option<u64>,
    /// Completions asked for (`n`, at least 1).
    pub(super) choices: u64,
}

impl Admitted {
    /// The call's worst case, held against the budget while it runs: a prompt token per
    /// request byte (a token is at least a byte of text), and for a chat call `n` times
    /// its `max_tokens` (or `default_max_tokens`) completion tokens; and what it is made of.
    pub(super) fn worst(&self, default_max_tokens: u64) -> ((u64, u64), String) {
        let prompt = self.body.len() as u64;
        if self.endpoint == Endpoint::Embeddings {
            return (
                (prompt, 0),
                format!("{prompt} prompt tokens (one per request byte)"),
            );
        }
        let (per_choice, whose) = match self.max_tokens {
            Some(m) => (m, "its max_tokens"),
            None => (
                default_max_tokens,
                "the gateway's default_max_tokens, as it sets no max_tokens",
            ),
        };
        let completion = per_choice.saturating_mul(self.choices);
        let times = if self.choices > 1 {
            format!(" x n = {}", self.choices)
        } else {
            String::new()
        };
        (
            (prompt, completion),
            format!(
                "{prompt} prompt tokens (one per request byte) and {completion} completion tokens ({whose}{times})"
            ),
        )
    }
}

impl Gateway {
    /// Checks a request to `route` (the path called, less its optional `/v1`): a known
    /// endpoint, POST, a body within the limits that is a JSON object naming a priced
    /// model, and a budget not yet exhausted. A stream is made to ask for its usage.
    pub(super) async fn admit(
        &self,
        path: &str,
        route: &str,
        req: Request<Incoming>,
    ) -> Result<Admitted, Refusal> {
        let endpoint = match route {
            "/chat/completions" => Endpoint::Chat,
            "/embeddings" => Endpoint::Embeddings,
            _ => return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!(
                    "the fork gateway has no endpoint {} {}: it serves POST /v1/chat/completions, POST /v1/embeddings and GET /v1/models",
                    req.method(),
                    clip(path)
                ),
            )),
        };
        if req.method() != Method::POST {
            return Err(Refusal::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{} takes POST, not {}", clip(path), req.method()),
            ));
        }

        // The body: bounded in size and in time.
        let too_large = || {
            Refusal::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                format!(
                    "the request body is over the gateway's limit of {} bytes",
                    MAX_REQUEST_BYTES
                ),
            )
        };
        let bad_request =
            |message: String| Refusal::new(StatusCode::BAD_REQUEST, "bad_request", message);
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > MAX_REQUEST_BYTES as u64) {
            return Err(too_large());
        }
        let task_headers = req.headers().clone();
        let collected = tokio::time::timeout(
            BODY_READ_TIMEOUT,
            Limited::new(req.into_body(), MAX_REQUEST_BYTES).collect(),
        )
        .await;
        let body = match collected {
            Ok(Ok(c)) => c.to_bytes(),
            Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => return Err(too_large()),
            Ok(Err(e)) => {
                return Err(bad_request(format!(
                    "the request body could not be read: {e}"
                )))
            }
            Err(_) => {
                return Err(Refusal::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "request_timeout",
                    format!(
                        "the request body did not arrive within {}s",
                        BODY_READ_TIMEOUT.as_secs()
                    ),
                ))
            }
        };
        let mut obj = match serde_json::from_slice::<Value>(&body) {
            Ok(Value::Object(o)) => o,
            Ok(_) => return Err(bad_request("the request body is not a JSON object".into())),
            Err(e) => return Err(bad_request(format!("the request body is not JSON: {e}"))),
        };
        let Some(model) = obj.get("model").and_then(Value::as_str).map(str::to_string) else {
            return Err(bad_request(
                "the request has no string `model`: name one of the priced models (GET /v1/models)"
                    .into(),
            ));
        };
        let stream = endpoint == Endpoint::Chat && obj.get("stream") == Some(&Value::Bool(true));
        let max_tokens = ["max_tokens", "max_completion_tokens"]
            .iter()
            .filter_map(|k| obj.get(*k).and_then(Value::as_u64))
            .max();
        let choices = obj.get("n").and_then(Value::as_u64).unwrap_or(1).max(1);
        let Some(price) = self.cfg.prices.get(&model).copied() else {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "model_not_priced",
                format!(
                    "model {} is not priced in the policy: refused (calls that cannot be metered are never passed); priced models: {}",
                    clip(&model),
                    self.cfg.prices.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )
            .of(&model, stream));
        };
        if self.meter.exceeded() {
            return Err(Refusal::new(
                StatusCode::PAYMENT_REQUIRED,
                "api_cost_budget_exceeded",
                format!(
                    "the API-cost budget ({:.6} USD) is exhausted: {:.6} USD spent; no further model calls are passed",
                    self.meter.budget_usd(),
                    self.meter.spent_usd()
                ),
            )
            .of(&model, stream));
        }

        // The forwarded body: as sent, except a stream asks for its usage.
        let body = if stream {
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
                    return Err(
                        bad_request(format!("the request could not be re-encoded: {e}"))
                            .of(&model, stream),
                    )
                }
            }
        } else {
            body
        };
        Ok(Admitted {
            endpoint,
            task_headers,
            body,
            model,
            stream,
            price,
            max_tokens,
            choices,
        })
    }
}
