//! Keeping the upstream API key out of the sandbox and the call log: the key itself
//! ([`ApiKey`], which never prints), the redaction of text that may quote it, and the
//! scrubbing of response bodies as they stream ([`Scrubber`]).

use bytes::Bytes;
use hyper::header::{HeaderValue, InvalidHeaderValue};
use zeroize::Zeroizing;

/// Keys shorter than this are not scrubbed from bodies (they would match by chance).
pub const MIN_SCRUB_KEY_LEN: usize = 8;
/// What replaces the key wherever it would have reached the task.
pub const REDACTED: &str = "[redacted by fork gateway]";

/// The upstream API key, held by the supervisor only (zeroed on drop).
pub(super) struct ApiKey(Option<Zeroizing<String>>);

impl ApiKey {
    pub(super) fn new(key: Option<Zeroizing<String>>) -> ApiKey {
        ApiKey(key)
    }

    /// True when a key is configured.
    pub(super) fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// `Bearer <key>` as a sensitive header value: `None` without a key, an error when
    /// the key cannot go in an HTTP header.
    pub(super) fn authorization(&self) -> Option<Result<HeaderValue, InvalidHeaderValue>> {
        self.0.as_ref().map(|k| {
            let bearer = Zeroizing::new(format!("Bearer {}", k.as_str()));
            HeaderValue::from_str(&bearer).map(|mut v| {
                v.set_sensitive(true);
                v
            })
        })
    }

    /// The key, when one is configured and non-empty.
    fn text(&self) -> Option<&str> {
        self.0
            .as_ref()
            .map(|k| k.as_str())
            .filter(|k| !k.is_empty())
    }

    /// `s` with every occurrence of the key replaced by [`REDACTED`].
    pub(super) fn redact(&self, s: &str) -> String {
        match self.text() {
            Some(k) => s.replace(k, REDACTED),
            None => s.to_string(),
        }
    }

    /// True when `hay` contains the key.
    pub(super) fn appears_in(&self, hay: &[u8]) -> bool {
        self.text()
            .is_some_and(|k| find(hay, k.as_bytes()).is_some())
    }

    /// A scrubber for one response body (a no-op for keys under [`MIN_SCRUB_KEY_LEN`]).
    pub(super) fn scrubber(&self) -> Scrubber<'_> {
        Scrubber::new(
            self.0
                .as_ref()
                .map(|k| k.as_bytes())
                .filter(|k| k.len() >= MIN_SCRUB_KEY_LEN),
        )
    }
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
pub(super) struct Scrubber<'k> {
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

    pub(super) fn feed(&mut self, chunk: Bytes) -> Bytes {
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

    pub(super) fn finish(&mut self) -> Bytes {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::tests::KEY;

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
}
