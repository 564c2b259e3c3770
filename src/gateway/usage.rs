//! Usage accounting: the token usage a response reports (a JSON body, or the SSE chunk
//! that carries it, read as the stream passes), and the estimate charged when there is
//! none.

use std::fmt;

use hyper::StatusCode;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// The most of a non-SSE response body kept to read its usage (estimated beyond).
pub const MAX_METER_BUFFER: usize = 16 << 20;
const MAX_SSE_LINE: usize = 1 << 20;

/// Token usage read from a response.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Usage {
    pub(super) prompt: u64,
    pub(super) completion: u64,
}

/// Reads `usage` out of `json`, which must be one JSON object (UTF-8): its
/// `prompt_tokens`/`completion_tokens` (or `input_tokens`/`output_tokens`) and `total_tokens`;
/// tokens the total counts beyond prompt + completion are charged as completion (the dearer
/// side, conservatively). Nothing but `usage` is built: every other member is skipped as it
/// is read (serde_json skips without recursing, so no depth is too deep), and a response of
/// [`MAX_METER_BUFFER`] costs the supervisor no tree. As in a JSON object built whole, a
/// member named twice counts as the last one. Every body is read as the whole tree read it
/// (the reader this one replaced), but two the tree gave up on (and estimated): one nested
/// deeper than serde_json's 128 levels, and one whose skipped strings hold an unpaired
/// UTF-16 escape (`"\ud800"`); their usage is read now.
pub(super) fn usage_in(json: &[u8]) -> Option<Usage> {
    // Strings are checked as UTF-8 when skipped only from a `str` (as a tree would check them).
    let text = std::str::from_utf8(json).ok()?;
    let raw = serde_json::from_str::<Last<TopKey>>(text).ok()?.usage()?;
    let fields = serde_json::from_str::<Last<UsageKey>>(raw.get()).ok()?;
    let field = |names: &[UsageKey]| -> Result<Option<u64>, ()> {
        for n in names {
            match fields.get(*n) {
                None => continue,
                Some(x) if x.get() == "null" => continue,
                // A whole number that fits (not `3.0`, `-1`, `"3"` or `1e3`).
                Some(x) => {
                    return serde_json::from_str::<u64>(x.get())
                        .map(Some)
                        .map_err(|_| ())
                }
            }
        }
        Ok(None)
    };
    let prompt = field(&[UsageKey::PromptTokens, UsageKey::InputTokens]).ok()?;
    let completion = field(&[UsageKey::CompletionTokens, UsageKey::OutputTokens]).ok()?;
    let total = field(&[UsageKey::TotalTokens]).ok()?;
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

/// The members of a response object the meter reads.
#[derive(Deserialize, Clone, Copy, PartialEq)]
#[serde(field_identifier, rename_all = "snake_case")]
enum TopKey {
    Usage,
    #[serde(other)]
    Other,
}

/// The members of `usage` the meter reads.
#[derive(Deserialize, Clone, Copy, PartialEq)]
#[serde(field_identifier, rename_all = "snake_case")]
enum UsageKey {
    PromptTokens,
    InputTokens,
    CompletionTokens,
    OutputTokens,
    TotalTokens,
    #[serde(other)]
    Other,
}

/// One JSON object's members named by `K` (their last value each, as written), every other
/// member skipped unbuilt.
struct Last<'a, K> {
    values: Vec<(K, &'a RawValue)>,
}

impl<'a, K: PartialEq> Last<'a, K> {
    fn get(&self, key: K) -> Option<&'a RawValue> {
        self.values
            .iter()
            .find_map(|(k, v)| (*k == key).then_some(*v))
    }
}

impl<'a> Last<'a, TopKey> {
    fn usage(&self) -> Option<&'a RawValue> {
        self.get(TopKey::Usage)
    }
}

/// The keys [`Last`] keeps (all but `Other`).
trait Kept {
    fn kept(&self) -> bool;
}
impl Kept for TopKey {
    fn kept(&self) -> bool {
        *self != TopKey::Other
    }
}
impl Kept for UsageKey {
    fn kept(&self) -> bool {
        *self != UsageKey::Other
    }
}

impl<'de, K> Deserialize<'de> for Last<'de, K>
where
    K: Deserialize<'de> + Kept + PartialEq,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<K>(std::marker::PhantomData<K>);
        impl<'de, K: Deserialize<'de> + Kept + PartialEq> Visitor<'de> for V<K> {
            type Value = Last<'de, K>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut values = Vec::new();
                while let Some(k) = map.next_key::<K>()? {
                    if k.kept() {
                        // One entry per name: a later one replaces it.
                        let v = map.next_value::<&RawValue>()?;
                        match values.iter_mut().find(|(key, _)| *key == k) {
                            Some(slot) => slot.1 = v,
                            None => values.push((k, v)),
                        }
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Last { values })
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
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
                usage_in(&buf)
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
    usage_in(data)
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
    use serde_json::{json, Value};

    fn read(body: &str) -> Option<Usage> {
        usage_in(body.as_bytes())
    }

    #[test]
    fn usage_is_read_from_the_usual_shapes() {
        let u = |v: Value| usage_in(json!({ "usage": v }).to_string().as_bytes());
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
        assert_eq!(read(r#"{"choices": []}"#), None);
        // Spaces around values, escaped names, and what a tree would refuse to read.
        let pc = |prompt, completion| Some(Usage { prompt, completion });
        assert_eq!(
            read(
                r#" { "usage" : { "prompt\u005ftokens" : 1 , "completion_tokens":  null , "total_tokens" : 3 } } "#
            ),
            pc(1, 2)
        );
        for body in [
            r#"{"usage": {"prompt_tokens": 3.0}}"#,
            r#"{"usage": {"prompt_tokens": 1e3}}"#,
            r#"{"usage": {"prompt_tokens": 18446744073709551616}}"#,
            r#"{"usage": {"prompt_tokens": [1]}}"#,
            r#"{"usage": [{"prompt_tokens": 1}]}"#,
            r#"[{"usage": {"prompt_tokens": 1}}]"#,
            r#"{"usage": {"prompt_tokens": 1}} x"#,
            r#"{"usage": {"prompt_tokens": 1}, "x": [1,]}"#,
            r#"{"usage": {"prompt_tokens": 1}"#,
            "",
        ] {
            assert_eq!(read(body), None, "{body}");
        }
        // Not UTF-8 (in a string the meter skips): refused, as a tree refused it.
        assert_eq!(
            usage_in(b"{\"x\": \"\xff\", \"usage\": {\"prompt_tokens\": 1}}"),
            None
        );
    }

    /// The reader this one replaced, which built the whole body as a tree.
    fn tree_usage(body: &str) -> Option<Usage> {
        let v: Value = serde_json::from_str(body).ok()?;
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

    #[test]
    fn usage_is_read_as_the_tree_read_it_a_member_named_twice_counting_as_the_last() {
        let pc = |prompt, completion| Some(Usage { prompt, completion });
        let cases = [
            // Named twice: the last one counts, at the top and within usage.
            (
                r#"{"usage": {"prompt_tokens": 1, "completion_tokens": 1}, "usage": {"prompt_tokens": 2, "completion_tokens": 5}}"#,
                pc(2, 5),
            ),
            (r#"{"usage": {"prompt_tokens": 1}, "usage": null}"#, None),
            (
                r#"{"usage": null, "usage": {"prompt_tokens": 4}}"#,
                pc(4, 0),
            ),
            (
                r#"{"usage": {"prompt_tokens": 1, "completion_tokens": 9, "prompt_tokens": 7}}"#,
                pc(7, 9),
            ),
            (
                r#"{"usage": {"prompt_tokens": 1, "prompt_tokens": "7"}}"#,
                None,
            ),
            (
                r#"{"usage": {"prompt_tokens": "7", "prompt_tokens": 1}}"#,
                pc(1, 0),
            ),
            (
                r#"{"usage": {"prompt_tokens": 8, "prompt_tokens": null, "input_tokens": 3}}"#,
                pc(3, 0),
            ),
            // Precedence: prompt_tokens before input_tokens, a null one skipped, a bad one fatal.
            (
                r#"{"usage": {"input_tokens": 3, "prompt_tokens": 8}}"#,
                pc(8, 0),
            ),
            (
                r#"{"usage": {"prompt_tokens": null, "input_tokens": 3}}"#,
                pc(3, 0),
            ),
            (
                r#"{"usage": {"prompt_tokens": -3, "input_tokens": 3}}"#,
                None,
            ),
            (
                r#"{"usage": {"output_tokens": 2, "total_tokens": 10}}"#,
                pc(8, 2),
            ),
            (r#"{"usage": {"total_tokens": null}}"#, None),
            (r#"{"usage": {"total_tokens": true}}"#, None),
            (
                r#"{"usage": {"prompt_tokens": 0, "completion_tokens": 0}}"#,
                pc(0, 0),
            ),
            (r#"{"usage": {"prompt_tokens": -0}}"#, None),
            (
                r#"{"usage": {"prompt_tokens": 5, "x": {"prompt_tokens": 9}}, "choices": [{"usage": {"prompt_tokens": 6}}]}"#,
                pc(5, 0),
            ),
            (r#"{"usage": "5"}"#, None),
            (r#"{"usage": 5}"#, None),
            (r#"{}"#, None),
            (r#"null"#, None),
            (r#""usage""#, None),
            (r#"{"usage": {"prompt_tokens": 1}} {}"#, None),
            (r#"{"usage": {"prompt_tokens": 1}, }"#, None),
            (r#"{"usage" {"prompt_tokens": 1}}"#, None),
        ];
        for (body, want) in cases {
            assert_eq!(tree_usage(body), want, "the tree on {body}");
            assert_eq!(read(body), want, "{body}");
        }
    }

    #[test]
    fn usage_is_read_from_a_large_deeply_nested_response_without_a_tree() {
        // 4 MiB of nested content, 100,000 levels deep at its deepest: far past serde_json's
        // recursion limit (128), which made the old reader (a whole Value tree) give up and
        // charge an estimate. Skipped without recursion: no stack is at risk either.
        let depth = 100_000;
        let mut body = String::from(r#"{"id": "x", "choices": [{"message": {"content": "#);
        body.push_str(&"[".repeat(depth));
        body.push_str(&r#"{"k": [1, 2.5, null, "abc"]}, "#.repeat((4 << 20) / 16));
        body.push('0');
        body.push_str(&"]".repeat(depth));
        body.push_str(r#"}}], "usage": {"prompt_tokens": 12, "completion_tokens": 34}}"#);
        assert!(body.len() > 4 << 20);
        assert!(
            serde_json::from_str::<Value>(&body).is_err(),
            "a tree gives up"
        );
        let want = Some(Usage {
            prompt: 12,
            completion: 34,
        });
        assert_eq!(read(&body), want);
        let mut r = UsageReader::new(false);
        for chunk in body.as_bytes().chunks(64 << 10) {
            r.feed(chunk);
        }
        assert_eq!(r.finish(), want);
        // Deep and broken, deep and not an object, deep under `usage`: an estimate, no panic.
        assert_eq!(read(&body[..body.len() - 1]), None);
        assert_eq!(read(&"[".repeat(depth)), None);
        assert_eq!(
            read(&format!("{}{}", "[".repeat(depth), "]".repeat(depth))),
            None
        );
        let deep_usage = format!(r#"{{"usage": {}{}}}"#, "[".repeat(depth), "]".repeat(depth));
        assert_eq!(read(&deep_usage), None);
        let deep_field = format!(
            r#"{{"usage": {{"prompt_tokens": {}{}}}}}"#,
            "{\"a\":".repeat(depth),
            "}".repeat(depth)
        );
        assert_eq!(read(&deep_field), None);
        // In an SSE line as well.
        let mut r = UsageReader::new(true);
        r.feed(b"data: ");
        r.feed(
            format!(
                r#"{{"x": {}{}, "usage": {{"total_tokens": 5}}}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            )
            .as_bytes(),
        );
        r.feed(b"\n\ndata: [DONE]\n\n");
        assert_eq!(
            r.finish(),
            Some(Usage {
                prompt: 5,
                completion: 0
            })
        );
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
