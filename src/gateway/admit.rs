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
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::config::{clip, LimitField};
use super::{Gateway, Price};

/// The largest request body the task may send (413 beyond).
pub const MAX_REQUEST_BYTES: usize = 8 << 20;
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest `stream_options` object a streamed call may send (the gateway rewrites it).
const MAX_STREAM_OPTIONS: usize = 4096;

/// The fields of a request the gateway reads, borrowed from the body as they are written;
/// every other field is skipped without being built. A field named twice is refused (the
/// upstream might read the other one).
#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    model: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    stream: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    stream_options: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    max_completion_tokens: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    n: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    messages: Option<&'a RawValue>,
}

/// A field that is there, `null` included (`None` is for a field that is not).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

impl<'a> Probe<'a> {
    /// Reads `text`, which must be one JSON object.
    fn read(text: &'a str) -> Result<Probe<'a>, String> {
        // (A struct also deserializes from an array, positionally.)
        if !text.trim_start().starts_with('{') {
            return Err(match serde_json::from_str::<serde::de::IgnoredAny>(text) {
                Ok(_) => "the request body is not a JSON object".into(),
                Err(e) => format!("the request body is not JSON: {e}"),
            });
        }
        serde_json::from_str(text).map_err(|e| format!("the request body is not JSON: {e}"))
    }
}

/// The `stream_options` a streamed call is forwarded with: the task's (at most
/// [`MAX_STREAM_OPTIONS`] bytes; not an object, an empty one) with `include_usage: true`.
fn ask_for_usage(stream_options: Option<&RawValue>) -> Result<String, String> {
    let mut opts = match stream_options.map(RawValue::get) {
        Some(r) if r.len() > MAX_STREAM_OPTIONS => {
            return Err(format!(
                "stream_options is over {MAX_STREAM_OPTIONS} bytes: send only the options (like include_usage)"
            ))
        }
        Some(r) => serde_json::from_str::<Map<String, Value>>(r).unwrap_or_default(),
        None => Map::new(),
    };
    opts.insert("include_usage".into(), Value::Bool(true));
    serde_json::to_string(&opts).map_err(|e| e.to_string())
}

/// Changes to a request body: fields whose values are written over, fields added.
#[derive(Default)]
struct Edits<'a> {
    /// (the value as it sits in the body, its new value)
    replaced: Vec<(&'a RawValue, String)>,
    /// (name, value), written first in the object.
    added: Vec<(&'static str, String)>,
}

impl<'a> Edits<'a> {
    /// Sets field `name`: written over where the body has it (`value`), else added.
    fn set(&mut self, name: &'static str, value: Option<&'a RawValue>, new: String) {
        match value {
            Some(v) => self.replaced.push((v, new)),
            None => self.added.push((name, new)),
        }
    }

    /// Writes `limit` into a chat call that sets none: over each of `max_tokens` and
    /// `max_completion_tokens` the call has as null, or as `field` when it has neither.
    /// Returns what it wrote (`max_tokens = 4096`).
    fn write_limit(&mut self, probe: &Probe<'a>, limit: u64, field: LimitField) -> String {
        let nulls: Vec<(&'static str, &'a RawValue)> = [
            ("max_tokens", probe.max_tokens),
            ("max_completion_tokens", probe.max_completion_tokens),
        ]
        .into_iter()
        .filter_map(|(name, v)| Some((name, v?)))
        .collect();
        let mut names = Vec::new();
        if nulls.is_empty() {
            self.set(field.name(), None, limit.to_string());
            names.push(field.name());
        }
        for (name, v) in nulls {
            self.set(name, Some(v), limit.to_string());
            names.push(name);
        }
        format!("{} = {limit}", names.join(" and "))
    }

    /// `body` (a JSON object, as read by [`Probe::read`], the values of `replaced` borrowed
    /// from it) with the edits made, the rest byte for byte as sent.
    fn apply(mut self, body: &str) -> Result<Vec<u8>, String> {
        let mut spans = Vec::with_capacity(self.replaced.len());
        for (old, new) in self.replaced.drain(..) {
            let r = old.get();
            let start = (r.as_ptr() as usize)
                .checked_sub(body.as_ptr() as usize)
                .filter(|s| body.get(*s..*s + r.len()) == Some(r))
                .ok_or("a field of the request could not be located to be rewritten")?;
            spans.push((start, start + r.len(), new));
        }
        spans.sort_by_key(|s| s.0);
        let extra: usize = spans.iter().map(|s| s.2.len()).sum::<usize>()
            + self
                .added
                .iter()
                .map(|(n, v)| n.len() + v.len() + 4)
                .sum::<usize>();
        let mut out = Vec::with_capacity(body.len() + extra);
        // Just past the object's `{`; the object is not empty (it names its model), so
        // an added field is followed by a comma.
        let mut at = body.len() - body.trim_start().len() + 1;
        out.extend_from_slice(&body.as_bytes()[..at]);
        for (name, value) in &self.added {
            out.extend_from_slice(format!("\"{name}\":{value},").as_bytes());
        }
        for (start, end, new) in spans {
            out.extend_from_slice(&body.as_bytes()[at..start]);
            out.extend_from_slice(new.as_bytes());
            at = end;
        }
        out.extend_from_slice(&body.as_bytes()[at..]);
        Ok(out)
    }
}

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
    /// What the gateway wrote into a call that set no limit (`max_tokens = 4096`).
    pub(super) wrote_limit: Option<String>,
    /// The image parts of its messages.
    pub(super) images: u64,
}

impl Admitted {
    /// The call's worst case, held against the budget while it runs: a prompt token per
    /// request byte (a token is at least a byte of text) and `per_image` per image part,
    /// and for a chat call `n` times its `max_tokens` (or `default_max_tokens`) completion
    /// tokens; and what it is made of.
    pub(super) fn worst(&self, default_max_tokens: u64, per_image: u64) -> ((u64, u64), String) {
        let bytes = self.body.len() as u64;
        let prompt = bytes.saturating_add(self.images.saturating_mul(per_image));
        let prompt_what = if self.images == 0 {
            format!("{prompt} prompt tokens (one per request byte)")
        } else {
            format!(
                "{prompt} prompt tokens (one per request byte, and the gateway's max_tokens_per_image = {per_image} for each of its {} images)",
                self.images
            )
        };
        if self.endpoint == Endpoint::Embeddings {
            return ((prompt, 0), prompt_what);
        }
        let (per_choice, whose) = match self.max_tokens {
            Some(m) => (m, "its max_tokens"),
            None => (
                default_max_tokens,
                "the gateway's default_max_tokens, written into the call as it set no max_tokens",
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
            format!("{prompt_what} and {completion} completion tokens ({whose}{times})"),
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
        // Only the fields the gateway reads are taken out of the body; the rest is
        // skipped without being built (the body is the task's, up to 8 MiB).
        let text = std::str::from_utf8(&body)
            .map_err(|e| bad_request(format!("the request body is not JSON: not UTF-8 ({e})")))?;
        let probe = Probe::read(text).map_err(bad_request)?;
        let Some(model) = probe
            .model
            .and_then(|m| serde_json::from_str::<String>(m.get()).ok())
        else {
            return Err(bad_request(
                "the request has no string `model`: name one of the priced models (GET /v1/models)"
                    .into(),
            ));
        };
        // The fields the worst case is made of are read strictly: an upstream that coerces
        // (`"n": "50"`, `1e5`, `-1` as "unlimited") could read a value the gateway would
        // have taken as absent, and generate past the hold.
        let stream = match probe.stream.map(RawValue::get) {
            None | Some("null") | Some("false") => false,
            Some("true") => endpoint == Endpoint::Chat,
            Some(other) => {
                return Err(bad_request(format!(
                    "`stream` is {}: give true or false",
                    clip(other)
                )))
            }
        };
        let number = |name: &str, v: Option<&RawValue>| -> Result<Option<u64>, Refusal> {
            match v.map(RawValue::get) {
                None | Some("null") => Ok(None),
                Some(raw) => serde_json::from_str::<u64>(raw).map(Some).map_err(|_| {
                    bad_request(format!(
                        "`{name}` is {}: give a whole number (digits only, no exponent, sign or quotes)",
                        clip(raw)
                    ))
                }),
            }
        };
        let max_tokens = number("max_tokens", probe.max_tokens)?.max(number(
            "max_completion_tokens",
            probe.max_completion_tokens,
        )?);
        let choices = number("n", probe.n)?.unwrap_or(1).max(1);
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

        // What its content parts may cost beyond their bytes (a part with no bound: 400).
        let images = match probe.messages {
            Some(m) => super::parts::images_in(m).map_err(|e| {
                bad_request(format!(
                    "{e} (the gateway holds each call's worst case against the API-cost budget)"
                ))
                .of(&model, stream)
            })?,
            None => 0,
        };

        // The forwarded body: as sent, except a stream asks for its usage, and a chat call
        // that sets no limit gets the one it is held at (a null one written over), so the
        // upstream generates no more than the hold.
        let mut edits = Edits::default();
        if stream {
            let opts = ask_for_usage(probe.stream_options)
                .map_err(|m| bad_request(m).of(&model, stream))?;
            edits.set("stream_options", probe.stream_options, opts);
        }
        let wrote_limit = (endpoint == Endpoint::Chat && max_tokens.is_none()).then(|| {
            edits.write_limit(
                &probe,
                self.cfg.default_max_tokens(),
                self.cfg.default_max_tokens_field(),
            )
        });
        let body = if edits.replaced.is_empty() && edits.added.is_empty() {
            body
        } else {
            Bytes::from(
                edits
                    .apply(text)
                    .map_err(|m| bad_request(m).of(&model, stream))?,
            )
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
            wrote_limit,
            images,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage_asked(body: &str) -> Result<String, String> {
        let probe = Probe::read(body)?;
        let mut edits = Edits::default();
        edits.set(
            "stream_options",
            probe.stream_options,
            ask_for_usage(probe.stream_options)?,
        );
        edits.apply(body).map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn the_probe_reads_only_its_fields_and_refuses_what_is_not_one_object() {
        let p = Probe::read(
            r#" {"pad": [[1, {"a": 2}], "x"], "model": "m", "n": 3, "stream_options": null}"#,
        )
        .unwrap();
        assert_eq!(p.model.unwrap().get(), r#""m""#);
        assert_eq!(p.n.unwrap().get(), "3");
        assert_eq!(p.stream_options.unwrap().get(), "null");
        assert!(p.stream.is_none() && p.max_tokens.is_none());
        for (body, says) in [
            ("[\"m\", true]", "not a JSON object"),
            ("42", "not a JSON object"),
            ("not json", "not JSON"),
            (r#"{"model": "m""#, "not JSON"),
            (r#"{"model": "m"} x"#, "not JSON"),
            (
                r#"{"model": "cheap", "model": "dear"}"#,
                "duplicate field `model`",
            ),
            (
                r#"{"model": "m", "messages": [], "messages": [{"content": "x"}]}"#,
                "duplicate field `messages`",
            ),
        ] {
            let e = Probe::read(body)
                .err()
                .unwrap_or_else(|| panic!("{body} was read"));
            assert!(e.contains(says), "{body}: {e}");
        }
    }

    #[test]
    fn a_stream_is_made_to_ask_for_its_usage_and_the_rest_goes_byte_for_byte() {
        // No stream_options: one is added first.
        assert_eq!(
            usage_asked(" {\"model\": \"m\",  \"stream\": true, \"x\": [1.50, 2e3]}").unwrap(),
            " {\"stream_options\":{\"include_usage\":true},\"model\": \"m\",  \"stream\": true, \"x\": [1.50, 2e3]}"
        );
        // Rewritten in place, its other options kept.
        assert_eq!(
            usage_asked(
                r#"{"model":"m","stream_options": {"include_usage": false, "z": 1},"k":0.10}"#
            )
            .unwrap(),
            r#"{"model":"m","stream_options": {"include_usage":true,"z":1},"k":0.10}"#
        );
        // Not an object (null too): replaced.
        assert_eq!(
            usage_asked(r#"{"model":"m","stream_options":null}"#).unwrap(),
            r#"{"model":"m","stream_options":{"include_usage":true}}"#
        );
        let big = format!(
            r#"{{"model":"m","stream_options":{{"pad":"{}"}}}}"#,
            "x".repeat(MAX_STREAM_OPTIONS)
        );
        assert!(usage_asked(&big)
            .unwrap_err()
            .contains("stream_options is over"));
    }

    fn limited(body: &str, field: LimitField, stream: bool) -> (String, String) {
        let probe = Probe::read(body).unwrap();
        let mut edits = Edits::default();
        if stream {
            let opts = ask_for_usage(probe.stream_options).unwrap();
            edits.set("stream_options", probe.stream_options, opts);
        }
        let wrote = edits.write_limit(&probe, 77, field);
        (
            String::from_utf8(edits.apply(body).unwrap()).unwrap(),
            wrote,
        )
    }

    #[test]
    fn a_call_that_sets_no_limit_gets_the_default_written_in_and_the_rest_goes_byte_for_byte() {
        let body = r#" {"model": "m", "messages": [{"role": "user", "content": "x"}], "k": 1.50}"#;
        assert_eq!(
            limited(body, LimitField::MaxTokens, false),
            (
                r#" {"max_tokens":77,"model": "m", "messages": [{"role": "user", "content": "x"}], "k": 1.50}"#.to_string(),
                "max_tokens = 77".to_string()
            )
        );
        assert_eq!(
            limited(body, LimitField::MaxCompletionTokens, false).0,
            r#" {"max_completion_tokens":77,"model": "m", "messages": [{"role": "user", "content": "x"}], "k": 1.50}"#
        );
        // A null limit is written over where it is (no second field of the same name), each.
        assert_eq!(
            limited(
                r#"{"model":"m","max_tokens": null,"z":0}"#,
                LimitField::MaxCompletionTokens,
                false
            ),
            (
                r#"{"model":"m","max_tokens": 77,"z":0}"#.to_string(),
                "max_tokens = 77".to_string()
            )
        );
        assert_eq!(
            limited(
                r#"{"max_completion_tokens":null,"model":"m","max_tokens":null}"#,
                LimitField::MaxTokens,
                false
            ),
            (
                r#"{"max_completion_tokens":77,"model":"m","max_tokens":77}"#.to_string(),
                "max_tokens and max_completion_tokens = 77".to_string()
            )
        );
        // With a stream's usage asked for as well, in place and first.
        assert_eq!(
            limited(
                r#"{"model":"m","stream":true,"stream_options":{"z":1},"max_completion_tokens":null}"#,
                LimitField::MaxTokens,
                true
            )
            .0,
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":true,"z":1},"max_completion_tokens":77}"#
        );
        assert_eq!(
            limited(
                r#"{"model":"m","stream":true}"#,
                LimitField::MaxTokens,
                true
            )
            .0,
            r#"{"stream_options":{"include_usage":true},"max_tokens":77,"model":"m","stream":true}"#
        );
    }
}
