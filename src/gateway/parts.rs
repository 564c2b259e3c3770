//! The content parts of a call's `messages`, walked as they are written (nothing is built):
//! what they may cost beyond a prompt token per request byte.
//!
//! A text part (or a plain string) costs its bytes. An image (`image_url`) may cost far more
//! than its bytes (a URL of a few bytes is a picture of up to thousands of tokens): each is
//! held at `max_tokens_per_image`. Audio (`input_audio`) comes inline, base64: an mp3 or wav
//! at the lowest bit rate is over a thousand bytes a second, against tens of tokens a second
//! for the models that read it, so its bytes bound it. Any other part (a `file`, whose PDF is
//! billed a page image per page however small its bytes; `video_url`, `audio_url`; a type
//! the gateway does not know) has no bound the gateway can hold, and is refused.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::config::clip;

/// What a part costs beyond its bytes.
#[derive(Debug, PartialEq)]
enum Part {
    /// Nothing: text, a refusal, inline audio.
    Bytes,
    /// An image.
    Image,
}

/// A message's field the walk reads; a message naming it twice is refused (the gateway would
/// count one and the upstream might read the other).
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

/// A part's field the walk reads (named twice: refused, as above).
#[derive(Deserialize)]
struct PartFields<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<&'a RawValue>,
}

/// Counts the images in `messages` (the request's field, as sent), and refuses a part whose
/// cost the gateway cannot bound. The message says where the part is and what to do.
pub(super) fn images_in(messages: &RawValue) -> Result<u64, String> {
    let mut images = 0u64;
    each(messages, &mut |i, m| {
        if !starts(m, b'{') {
            return Ok(());
        }
        let content = serde_json::from_str::<Message>(m.get())
            .map_err(|e| format!("messages[{i}]: {e}"))?
            .content;
        let Some(content) = content else {
            return Ok(());
        };
        // One part, or a list of them (a string is text).
        let mut count = |at: String, p: &RawValue| -> Result<(), String> {
            if part(p).map_err(|e| format!("{at}: {e}"))? == Part::Image {
                images += 1;
            }
            Ok(())
        };
        if starts(content, b'{') {
            count(format!("messages[{i}].content"), content)
        } else {
            each(content, &mut |j, p| {
                count(format!("messages[{i}].content[{j}]"), p)
            })
        }
    })?;
    Ok(images)
}

/// What one content part costs beyond its bytes, or why it is refused.
fn part(p: &RawValue) -> Result<Part, String> {
    if starts(p, b'"') {
        return Ok(Part::Bytes);
    }
    let fields = if starts(p, b'{') {
        serde_json::from_str::<PartFields>(p.get()).map_err(|e| e.to_string())?
    } else {
        return Err(format!(
            "{} is not a content part: give an object with a `type`",
            clip(p.get())
        ));
    };
    let kind = fields
        .kind
        .and_then(|k| serde_json::from_str::<String>(k.get()).ok());
    match kind.as_deref() {
        Some("text" | "refusal" | "input_audio") => Ok(Part::Bytes),
        Some("image_url") => Ok(Part::Image),
        Some(other) => Err(format!(
            "a `{}` part is refused: the gateway cannot bound what it costs (a file is billed a page image per page, a video a picture per frame, however few its bytes); send text, images (image_url) or inline audio (input_audio)",
            clip(other)
        )),
        None => Err(
            "a content part without a string `type` is refused: the gateway cannot tell what it costs; give it a type (text, image_url or input_audio)".into(),
        ),
    }
}

fn starts(v: &RawValue, c: u8) -> bool {
    v.get().trim_start().as_bytes().first() == Some(&c)
}

type Each<'f, 'a> = &'f mut dyn FnMut(usize, &'a RawValue) -> Result<(), String>;

/// Calls `f` on each element of `list` (with its index) if it is an array, borrowed as
/// written: the elements are never held together.
fn each<'a>(list: &'a RawValue, f: Each<'_, 'a>) -> Result<(), String> {
    if !starts(list, b'[') {
        return Ok(());
    }
    let mut failed = None;
    let mut de = serde_json::Deserializer::from_str(list.get());
    let walked = Elements {
        f,
        failed: &mut failed,
    }
    .deserialize(&mut de);
    match (failed, walked) {
        (Some(e), _) => Err(e),
        (None, Err(e)) => Err(e.to_string()),
        (None, Ok(())) => Ok(()),
    }
}

struct Elements<'f, 'a, 'e> {
    f: Each<'f, 'a>,
    /// `f`'s error, kept apart from the deserializer's (which would add a position to it).
    failed: &'e mut Option<String>,
}

impl<'a> DeserializeSeed<'a> for Elements<'_, 'a, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'a>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'a> Visitor<'a> for Elements<'_, 'a, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array")
    }
    fn visit_seq<A: SeqAccess<'a>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while let Some(el) = seq.next_element::<&'a RawValue>()? {
            if let Err(e) = (self.f)(i, el) {
                *self.failed = Some(e);
                return Err(de::Error::custom("a part was refused"));
            }
            i += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn images(messages: &str) -> Result<u64, String> {
        images_in(serde_json::from_str::<&RawValue>(messages).unwrap())
    }

    #[test]
    fn images_are_counted_and_parts_without_a_bound_refused() {
        let img =
            r#"{"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "high"}}"#;
        let msgs = format!(
            r#"[{{"role": "system", "content": "be brief"}},
                {{"role": "user", "content": [{{"type": "text", "text": "look"}}, {img}, {img}, "plain"]}},
                {{"role": "assistant", "content": [{{"type": "refusal", "refusal": "no"}}]}},
                {{"role": "user", "content": [{img}, {{"type": "input_audio", "input_audio": {{"data": "AAAA", "format": "mp3"}}}}]}},
                {{"role": "user", "content": {img}}},
                {{"role": "tool", "content": null}}, {{"role": "user"}}, 42, "x"]"#
        );
        assert_eq!(images(&msgs), Ok(4));
        // Shapes an upstream would refuse anyway cost nothing here.
        for m in ["null", "{}", r#""text""#, "[]", r#"[{"content": 5}]"#] {
            assert_eq!(images(m), Ok(0), "{m}");
        }
        for (m, says) in [
            (
                r#"[{"content": "a"}, {"content": [{"type": "text", "text": "b"}, {"type": "file", "file": {"file_id": "f"}}]}]"#,
                "messages[1].content[1]: a `file` part is refused",
            ),
            (
                r#"[{"content": [{"type": "video_url", "video_url": {"url": "v"}}]}]"#,
                "messages[0].content[0]: a `video_url` part",
            ),
            (
                r#"[{"content": [{"image": "AAAA"}]}]"#,
                "without a string `type`",
            ),
            (r#"[{"content": [{"type": 1}]}]"#, "without a string `type`"),
            (r#"[{"content": [null]}]"#, "null is not a content part"),
            (
                r#"[{"content": [{"type": "text", "type": "image_url"}]}]"#,
                "duplicate field `type`",
            ),
            (
                r#"[{"content": "a", "content": [{"type": "image_url"}]}]"#,
                "messages[0]: duplicate field `content`",
            ),
        ] {
            let e = images(m).unwrap_err();
            assert!(e.contains(says), "{m}: {e}");
        }
    }

    #[test]
    fn a_large_deep_body_is_walked_without_building_it() {
        // 200,000 images in one message and a 100,000-deep value elsewhere in it.
        let img = r#"{"type":"image_url","image_url":{"url":"u"}},"#;
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let mut parts = img.repeat(200_000);
        parts.pop();
        let m = format!(r#"[{{"pad": {deep}, "content": [{parts}]}}]"#);
        assert_eq!(images(&m), Ok(200_000));
    }
}
