//! The metrics JSON a task may write: a flat object of finite numbers, duplicate keys and
//! anything nested refused, naming the key.

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

use super::{clean_name, ResultsError, MAX_NAME_CHARS};

/// Most metrics accepted in one metrics file.
pub const MAX_METRICS: usize = 10_000;

/// The entries of a JSON object in document order, duplicates kept (so they can be refused).
struct Entries(Vec<(String, serde_json::Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object mapping metric names to numbers")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, serde_json::Value>()? {
                    if out.len() >= MAX_METRICS {
                        return Err(serde::de::Error::custom(format!(
                            "more than {MAX_METRICS} metrics"
                        )));
                    }
                    out.push((k, v));
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Parse a metrics file: a flat JSON object `{"name": number, …}` with finite numbers.
/// Refused, naming the key: nested values, strings, booleans, null, duplicate keys, empty or
/// over-long names (over [`MAX_NAME_CHARS`]) and names with control characters.
pub fn parse_metrics(json: &[u8]) -> Result<BTreeMap<String, f64>, ResultsError> {
    let entries: Entries =
        serde_json::from_slice(json).map_err(|e| ResultsError::MetricsJson(e.to_string()))?;
    let mut out = BTreeMap::new();
    for (key, value) in entries.0 {
        let bad = |message: String| ResultsError::MetricsKey {
            key: clean_name(&key),
            message,
        };
        if key.trim().is_empty() {
            return Err(bad("empty metric name".into()));
        }
        if key.chars().count() > MAX_NAME_CHARS || key.chars().any(char::is_control) {
            return Err(bad(format!(
                "metric names must be at most {MAX_NAME_CHARS} characters without control characters"
            )));
        }
        let n = match &value {
            serde_json::Value::Number(n) => n.as_f64(),
            serde_json::Value::Null => return Err(bad("null is not a number".into())),
            serde_json::Value::Bool(_) => return Err(bad("a boolean is not a number".into())),
            serde_json::Value::String(_) => {
                return Err(bad(
                    "a string is not a number (write 41.0, not \"41.0\")".into()
                ))
            }
            serde_json::Value::Array(_) => {
                return Err(bad("an array is not a number (one value per metric)".into()))
            }
            serde_json::Value::Object(_) => {
                return Err(bad(
                    "nested objects are not accepted; flatten the name (a_b: 1.0)".into(),
                ))
            }
        };
        let n = n
            .filter(|n| n.is_finite())
            .ok_or_else(|| bad("not a finite number".into()))?;
        if out.insert(key.clone(), n).is_some() {
            return Err(bad("duplicate key".into()));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_flat_metrics() {
        let m = parse_metrics(br#"{"p99_ms": 41.0, "compressed_bytes": 123456, "ratio": -0.5e-3}"#)
            .unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m["p99_ms"], 41.0);
        assert_eq!(m["compressed_bytes"], 123456.0);
        assert_eq!(m["ratio"], -0.0005);
        assert!(parse_metrics(b"{}").unwrap().is_empty());
    }

    #[test]
    fn metric_errors_name_the_key() {
        let cases: &[(&[u8], &str)] = &[
            (br#"{"a": 1, "p99": "41"}"#, "p99"),
            (br#"{"nested": {"x": 1}}"#, "nested"),
            (br#"{"n": null}"#, "n"),
            (br#"{"b": true}"#, "b"),
            (br#"{"l": [1]}"#, "l"),
            (br#"{"d": 1, "d": 2}"#, "d"),
            (br#"{"": 1}"#, ""),
        ];
        for (json, key) in cases {
            match parse_metrics(json) {
                Err(ResultsError::MetricsKey { key: k, .. }) => assert_eq!(&k, key),
                other => panic!("{}: {other:?}", String::from_utf8_lossy(json)),
            }
        }
        for json in [
            &b"[1,2]"[..],
            b"42",
            b"{\"a\": 1e400}",
            b"{\"a\": 1",
            b"",
            b"{\"a\":1} x",
        ] {
            let e = parse_metrics(json).unwrap_err();
            assert!(
                matches!(e, ResultsError::MetricsJson(_)),
                "{}: {e}",
                String::from_utf8_lossy(json)
            );
        }
        // deep nesting hits serde_json's recursion limit, not the stack
        let deep = format!("{{\"a\": {}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse_metrics(deep.as_bytes()).is_err());
    }
}
