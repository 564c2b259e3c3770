//! Usage accounting: the token usage a response reports (a JSON body, or the SSE chunk
//! that carries it, read as the stream passes), and the estimate charged when there is
//! none.

use hyper::StatusCode;
use serde_json::Value;

/// The most of a non-SSE response body kept to read its usage (estimated beyond).
pub const MAX_METER_BUFFER: usize = 16 << 20;
const MAX_SSE_LINE: usize = 1 << 20;

/// Token usage read from a response.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Usage {
    pub(super) prompt: u64,
    pub(super) completion: u64,
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
pub(super) enum UsageReader {
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
    pub(super) fn new(sse: bool) -> Self {
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

    pub(super) fn feed(&mut self, chunk: &[u8]) {
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

    pub(super) fn finish(self) -> Option<Usage> {
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

/// The estimate charged for `bytes` of request or response without a usable usage: a
/// token per 3 bytes, rounded up.
pub(super) fn estimate_tokens(bytes: u64) -> u64 {
    bytes.div_ceil(3)
}

/// What a forwarded call is charged once its response has passed.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Charge {
    pub(super) prompt: u64,
    pub(super) completion: u64,
    /// `"usage"` or `"estimated"` (as in [`super::CallRecord::metered`]).
    pub(super) metered: &'static str,
    pub(super) note: Option<String>,
}

/// The charge of a forwarded call: nothing for a non-2xx answer; the usage the response
/// reported (even if the response was then cut off: the usage comes last); for a response
/// cut off before its usage, the call's `worst` case (`what` says what it is made of); for
/// a whole response without usage, the estimate for the bytes that went each way.
pub(super) fn settle(
    status: StatusCode,
    found: Option<Usage>,
    cut_off: bool,
    (request_bytes, response_bytes): (u64, u64),
    (worst, what): ((u64, u64), &str),
) -> Charge {
    if !status.is_success() {
        return Charge {
            prompt: 0,
            completion: 0,
            metered: "usage",
            note: Some(format!(
                "upstream answered {}: not charged",
                status.as_u16()
            )),
        };
    }
    match (found, cut_off) {
        (Some(u), _) => Charge {
            prompt: u.prompt,
            completion: u.completion,
            metered: "usage",
            note: cut_off.then(|| "the response was cut off after its usage".to_string()),
        },
        (None, true) => Charge {
            prompt: worst.0,
            completion: worst.1,
            metered: "estimated",
            note: Some(format!(
                "the response was cut off before its usage, which cannot be known: charged its worst case, {what}"
            )),
        },
        (None, false) => Charge {
            prompt: estimate_tokens(request_bytes),
            completion: estimate_tokens(response_bytes),
            metered: "estimated",
            note: Some(
                "the upstream response carried no usable usage: charged an estimate of request bytes / 3 prompt tokens and response bytes / 3 completion tokens"
                    .into(),
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
    fn a_call_cut_off_before_its_usage_is_charged_its_worst_case() {
        let ok = StatusCode::OK;
        let u = Some(Usage {
            prompt: 5,
            completion: 7,
        });
        let worst = ((300, 40), "w");
        let c = settle(ok, u, false, (300, 900), worst);
        assert_eq!((c.prompt, c.completion, c.metered), (5, 7, "usage"));
        // The usage comes last: seen, it stands even if the stream then broke.
        let c = settle(ok, u, true, (300, 900), worst);
        assert_eq!((c.prompt, c.completion, c.metered), (5, 7, "usage"));
        // Cut off before it: the worst case, whatever the bytes say.
        let c = settle(ok, None, true, (300, 900), worst);
        assert_eq!((c.prompt, c.completion, c.metered), (300, 40, "estimated"));
        assert!(c.note.unwrap().contains("charged its worst case, w"));
        // Whole, without usage: the estimate; an error status: free.
        let c = settle(ok, None, false, (300, 900), worst);
        assert_eq!((c.prompt, c.completion, c.metered), (100, 300, "estimated"));
        let c = settle(StatusCode::BAD_REQUEST, None, true, (300, 900), worst);
        assert_eq!((c.prompt, c.completion), (0, 0));
    }
}
