//! The door's HTTP work: the hyper server the task calls (accepting connections, routing,
//! admitting (admit.rs) or refusing each request, answering `/v1/models` locally) and the
//! forwarding of admitted calls to the upstream with reqwest, each on its own task, each
//! response streamed back chunk by chunk while it is metered.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinSet;

use super::admit::{Endpoint, Refusal};
use super::config::clip;
use super::meter::Ticket;
use super::usage::{settle, UsageReader};
use super::{CallRecord, Gateway, Price};

/// The most task connections served at once (further ones wait in the listen backlog).
pub const MAX_CONNECTIONS: usize = 32;
/// The most calls forwarded at once (a call outlives its connection when the task hangs
/// up; further calls wait for a turn).
pub const MAX_IN_FLIGHT: usize = 32;
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
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

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

/// When and where a call arrived.
struct Arrival {
    ts: String,
    path: String,
    started: Instant,
}

impl Arrival {
    /// The call, once its model and mode are known (task-controlled text clipped).
    fn into_call(self, model: &str, stream: bool) -> Call {
        Call {
            ts: self.ts,
            endpoint: clip(&self.path),
            model: clip(model),
            stream,
            started: self.started,
        }
    }
}

/// What every call record says about the call itself.
#[derive(Clone)]
struct Call {
    ts: String,
    endpoint: String,
    model: String,
    stream: bool,
    started: Instant,
}

impl Call {
    /// The call's record: `(prompt, completion)` tokens charged at `price` (free without).
    fn record(
        self,
        status: StatusCode,
        (prompt_tokens, completion_tokens): (u64, u64),
        price: Option<Price>,
        metered: &'static str,
        note: Option<String>,
    ) -> CallRecord {
        CallRecord {
            ts: self.ts,
            endpoint: self.endpoint,
            model: self.model,
            stream: self.stream,
            status: status.as_u16(),
            prompt_tokens,
            completion_tokens,
            cost_usd: price.map_or(0.0, |p| p.cost(prompt_tokens, completion_tokens)),
            latency_ms: self.started.elapsed().as_secs_f64() * 1e3,
            metered,
            note,
        }
    }
}

/// What the pump needs to meter and log a forwarded call.
struct CallCtx {
    call: Call,
    price: Price,
    request_bytes: u64,
    /// The call's worst case, (prompt, completion) tokens, and what it is made of: what
    /// the call is charged when its usage cannot be known.
    worst: ((u64, u64), String),
    /// The call's hold on the budget, settled with its charge.
    ticket: Ticket,
    /// The limit the gateway wrote into the call (`max_tokens = 4096`), if it did.
    wrote_limit: Option<String>,
}

impl CallCtx {
    /// Charges the call `(prompt, completion)` tokens and logs it.
    fn settle(
        self,
        status: StatusCode,
        tokens: (u64, u64),
        metered: &'static str,
        mut note: Option<String>,
    ) {
        if let Some(w) = &self.wrote_limit {
            append_note(
                &mut note,
                &format!("the gateway wrote {w} into the call, which set no limit"),
            );
            if status.is_client_error() {
                append_note(
                    &mut note,
                    "if the upstream refused that field (OpenAI's reasoning models refuse max_tokens), set max_tokens or max_completion_tokens in the call, or [gateway] default_max_tokens_field = \"max_completion_tokens\"",
                );
            }
        }
        let record = self
            .call
            .record(status, tokens, Some(self.price), metered, note);
        self.ticket.settle(record);
    }
}

impl Gateway {
    /// Serves the task on `listener` until this future is dropped (abort its task):
    /// one hyper HTTP/1 connection per accept, spawned on the current runtime, and all
    /// of them stopped when this future is dropped. The calls in flight are not: each
    /// runs on its own task until it is charged (a task that stops reading holds it), or until its
    /// owner charges it its worst case ([`crate::sandbox::CostMeter::settle_in_flight`])
    /// or drops the runtime (a call dropped unsettled is charged its worst case).
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
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
            conns.spawn(async move {
                let _permit = permit;
                gw.serve_connection(stream).await;
            });
        }
    }

    async fn serve_connection(self: Arc<Self>, stream: TcpStream) {
        let io = hyper_util::rt::TokioIo::new(stream);
        let gw = self.clone();
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            let gw = gw.clone();
            async move { Ok::<_, Infallible>(gw.handle(req).await) }
        });
        let mut b = hyper::server::conn::http1::Builder::new();
        b.timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT);
        if let Err(e) = b.serve_connection(io, svc).await {
            tracing::debug!("gateway: connection ended: {e}");
        }
    }

    /// Logs a refused call (free) and answers it with a JSON error.
    fn refuse(&self, arrival: Arrival, r: Refusal) -> Response<GwBody> {
        let call = arrival.into_call(&r.model, r.stream);
        self.refuse_call(call, r)
    }

    fn refuse_call(&self, call: Call, r: Refusal) -> Response<GwBody> {
        let message = self.credentials.redact(&r.message);
        let record = call.record(r.status, (0, 0), None, "refused", Some(message.clone()));
        self.meter.charge(record, None);
        error_response(r.status, r.code, &message)
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<GwBody> {
        let arrival = Arrival {
            ts: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            path: req.uri().path().to_string(),
            started: Instant::now(),
        };
        let route = match arrival.path.strip_prefix("/v1") {
            Some("") => "/",
            Some(r) if r.starts_with('/') => r,
            _ => arrival.path.as_str(),
        }
        .to_string();
        if req.method() == Method::GET {
            if route == "/models" {
                return self.models_response(None);
            }
            if let Some(id) = route.strip_prefix("/models/") {
                return self.models_response(Some(id));
            }
        }
        let a = match self.admit(&arrival.path, &route, req).await {
            Ok(a) => a,
            Err(r) => return self.refuse(arrival, r),
        };
        // At most MAX_IN_FLIGHT calls at once; a task that hangs up while waiting for a
        // turn has made no call.
        let Ok(turn) = self.in_flight.clone().acquire_owned().await else {
            return error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "gateway_error",
                "the gateway is closing",
            );
        };
        // The call's worst case must fit in what is left of the budget, and is held
        // against it until the call is charged (so parallel calls cannot overshoot).
        let call = arrival.into_call(&a.model, a.stream);
        let (worst, what) = a.worst(
            self.cfg.default_max_tokens(),
            self.cfg.max_tokens_per_image(),
        );
        let mut worst_record =
            call.clone()
                .record(StatusCode::OK, worst, Some(a.price), "estimated", None);
        // No status until the upstream answers.
        worst_record.status = 0;
        let reserved = self.meter.reserve(
            self.owner,
            worst_record,
            what.clone(),
            a.price,
            call.started,
        );
        let ticket = match reserved {
            Ok(t) => t,
            Err(sf) => {
                let message = format!(
                    "the API-cost budget ({:.6} USD) cannot cover this call: it may cost up to {:.6} USD ({what}), and {:.6} USD is spent and {:.6} USD held for calls in flight; refused, and no further model calls are passed. Ask for fewer tokens (max_tokens) or raise the budget (api_cost)",
                    sf.budget_usd, sf.need_usd, sf.spent_usd, sf.held_usd
                );
                let r = Refusal::new(
                    StatusCode::PAYMENT_REQUIRED,
                    "api_cost_budget_exceeded",
                    message,
                )
                .of(&a.model, a.stream);
                return self.refuse_call(call, r);
            }
        };
        let ctx = CallCtx {
            call,
            price: a.price,
            request_bytes: a.body.len() as u64,
            worst: (worst, what),
            ticket,
            wrote_limit: a.wrote_limit.clone(),
        };
        // The call runs on its own task, which outlives this handler: a task that hangs up
        // before the response head (hyper then drops this future) is still charged for
        // what the upstream generated.
        let (head_tx, head_rx) = oneshot::channel();
        tokio::spawn(async move {
            let _turn = turn;
            self.call(a.endpoint, a.task_headers, a.body, ctx, head_tx)
                .await
        });
        head_rx.await.unwrap_or_else(|_| {
            error_response(
                StatusCode::BAD_GATEWAY,
                "gateway_error",
                "the call ended without an answer",
            )
        })
    }

    /// Forwards an admitted call, hands the response head to the task's handler over
    /// `head` (if it is still there), then passes the body on and meters it.
    async fn call(
        self: Arc<Self>,
        endpoint: Endpoint,
        task_headers: HeaderMap,
        body: Bytes,
        ctx: CallCtx,
        head: oneshot::Sender<Response<GwBody>>,
    ) {
        let url = format!("{}{}", self.upstream_base, endpoint.upstream_path());
        let mut headers = HeaderMap::new();
        for name in REQUEST_HEADERS {
            for v in task_headers.get_all(*name) {
                headers.append(HeaderName::from_static(name), v.clone());
            }
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        match self.credentials.authorization() {
            None => {}
            Some(Ok(v)) => {
                headers.insert(hyper::header::AUTHORIZATION, v);
            }
            // Checked in Gateway::new; never forward a call without its credentials.
            Some(Err(_)) => {
                let _ = head.send(error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "gateway_error",
                    "the gateway's credentials cannot go in a header",
                ));
                return;
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
                // Not connected: nothing reached the upstream, free. Otherwise the upstream
                // may have generated (and billed) anything up to the call's worst case.
                let (worst, what) = &ctx.worst;
                let (status, tokens, note) = if e.is_connect() {
                    (
                        StatusCode::BAD_GATEWAY,
                        (0, 0),
                        format!("the upstream could not be reached: {e}"),
                    )
                } else if e.is_timeout() {
                    (
                        StatusCode::GATEWAY_TIMEOUT,
                        *worst,
                        format!("the upstream did not answer within {}: the call may have been billed, and its usage cannot be known: charged its worst case, {what}", humantime::format_duration(self.cfg.timeout())),
                    )
                } else {
                    (
                        StatusCode::BAD_GATEWAY,
                        *worst,
                        format!("the upstream call failed: {e}; the call may have been billed, and its usage cannot be known: charged its worst case, {what}"),
                    )
                };
                let note = self.credentials.redact(&note);
                let metered = if tokens == (0, 0) {
                    "usage"
                } else {
                    "estimated"
                };
                ctx.settle(status, tokens, metered, Some(note.clone()));
                let _ = head.send(error_response(status, "upstream_error", &note));
                return;
            }
        };

        let status = resp.status();
        ctx.ticket.answered(status.as_u16());
        let mut out_headers = HeaderMap::new();
        for name in RESPONSE_HEADERS {
            for v in resp.headers().get_all(*name) {
                if !self.credentials.appears_in(v.as_bytes()) {
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
            || (ctx.call.stream && !content_type.starts_with("application/json"));
        let (tx, rx) = mpsc::channel::<Bytes>(16);
        let mut response = Response::new(ChannelBody(rx).boxed_unsync());
        *response.status_mut() = status;
        *response.headers_mut() = out_headers;
        // A task that has hung up drops the response (and its body's receiver): the pump
        // sees it and keeps reading to meter.
        let _ = head.send(response);
        self.pump(resp, tx, ctx, status, sse).await;
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
    ) {
        let mut usage = UsageReader::new(sse);
        let mut scrub = self.credentials.scrubber();
        let mut response_bytes: u64 = 0;
        let mut client_gone = false;
        let mut trouble: Option<String> = None;
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
        if !client_gone {
            let tail = scrub.finish();
            if !tail.is_empty() {
                let _ = tx.send(tail).await;
            }
        }
        let (worst, what) = &ctx.worst;
        let mut charge = settle(
            status,
            usage.finish(),
            trouble.is_some(),
            (ctx.request_bytes, response_bytes),
            (*worst, what),
        );
        if let Some(t) = trouble {
            charge.note = Some(match charge.note.take() {
                Some(n) => format!("{t}: {n}"),
                None => t,
            });
        }
        if client_gone {
            append_note(
                &mut charge.note,
                "the task hung up before the end of the response",
            );
        }
        let note = charge.note.map(|n| self.credentials.redact(&n));
        ctx.settle(
            status,
            (charge.prompt, charge.completion),
            charge.metered,
            note,
        );
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

/// Adds `more` to a call's note.
fn append_note(note: &mut Option<String>, more: &str) {
    *note = Some(match note.take() {
        Some(n) => format!("{n}; {more}"),
        None => more.to_string(),
    });
}
