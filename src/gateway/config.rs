//! The gateway's configuration: the policy's `[gateway]` table ([`GatewayConfig`]), its
//! model prices ([`Price`]), its validation, and loading the upstream API key.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::GatewayError;

/// The port the task reaches inside the sandbox when the policy names none.
pub const DEFAULT_PORT: u16 = 8089;
/// The per-upstream-call timeout when the policy names none.
pub const DEFAULT_TIMEOUT: &str = "120s";
/// The completion tokens a chat call that sets no `max_tokens` may cost at most when the
/// policy names no `default_max_tokens`: held against the budget while it runs, and written
/// into the call (see [`LimitField`]) so the upstream generates no more.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;
/// The largest `default_max_tokens` a policy may set.
const MAX_DEFAULT_MAX_TOKENS: u64 = 1_000_000;
/// The prompt tokens each image part of a call is held at (beyond a token per request byte)
/// when the policy names no `max_tokens_per_image`. OpenAI bills a high-detail image by
/// 512-px tiles of it scaled into 2048 x 2048 with its short side at most 768 px, so at
/// most 8 tiles: gpt-4o 85 + 170 a tile (at most 1,445 tokens), gpt-4o-mini 2,833 + 5,667
/// a tile (at most 48,169, the most of OpenAI's published rates), the patch-billed models
/// (gpt-4.1-mini, gpt-4.1-nano, o4-mini) at most 1,536 patches x 2.46 (3,779); Qwen2-VL
/// at most 16,384, Claude about 1,600. 50,000 covers them; a policy pricing only gpt-4o
/// can hold 1,445.
pub const DEFAULT_MAX_TOKENS_PER_IMAGE: u64 = 50_000;
/// The largest `max_tokens_per_image` a policy may set.
const MAX_MAX_TOKENS_PER_IMAGE: u64 = 10_000_000;
const MAX_ECHOED_LEN: usize = 200;

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

/// The field a chat call that sets no limit gets `default_max_tokens` in.
///
/// `max_tokens` by default: OpenAI-compatible servers read it, and some read only it
/// (llama.cpp before February 2026; Ollama and LM Studio when this was written). A field an
/// upstream does not know is ignored, and the call would run unbounded; a field it refuses
/// is a 400, free. OpenAI's reasoning models (o1, o3, gpt-5 and later) refuse `max_tokens`
/// that way (the call's log record then points here): for them, `max_completion_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitField {
    #[default]
    MaxTokens,
    MaxCompletionTokens,
}

impl LimitField {
    /// The field's name in a request.
    pub fn name(self) -> &'static str {
        match self {
            LimitField::MaxTokens => "max_tokens",
            LimitField::MaxCompletionTokens => "max_completion_tokens",
        }
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
    /// The completion tokens a chat call that sets neither `max_tokens` nor
    /// `max_completion_tokens` may generate (default [`DEFAULT_MAX_TOKENS`]): held against
    /// the budget, and written into the call as `default_max_tokens_field`.
    #[serde(default)]
    pub default_max_tokens: Option<u64>,
    /// The field `default_max_tokens` is written into (default `max_tokens`; see
    /// [`LimitField`]). Left out of the policy's serialized form when absent, so the
    /// conditions hash of a policy without it is what it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_max_tokens_field: Option<LimitField>,
    /// The prompt tokens each image part of a call is held at, beyond a token per request
    /// byte (default [`DEFAULT_MAX_TOKENS_PER_IMAGE`]; 0 holds an image at its bytes only).
    /// Skipped when absent, as above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_per_image: Option<u64>,
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
        if let Some(n) = self.default_max_tokens {
            if !(1..=MAX_DEFAULT_MAX_TOKENS).contains(&n) {
                return Err(err(
                    "default_max_tokens",
                    format!("{n} is not between 1 and {MAX_DEFAULT_MAX_TOKENS}: give the most completion tokens a call that sets no max_tokens may cost, like {DEFAULT_MAX_TOKENS}"),
                ));
            }
        }
        if let Some(n) = self.max_tokens_per_image {
            if n > MAX_MAX_TOKENS_PER_IMAGE {
                return Err(err(
                    "max_tokens_per_image",
                    format!("{n} is over {MAX_MAX_TOKENS_PER_IMAGE}: give the most prompt tokens one image may cost the priced models, like {DEFAULT_MAX_TOKENS_PER_IMAGE}"),
                ));
            }
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

    /// The completion tokens held for (and written into) a chat call that sets no limit.
    pub fn default_max_tokens(&self) -> u64 {
        self.default_max_tokens
            .unwrap_or(DEFAULT_MAX_TOKENS)
            .clamp(1, MAX_DEFAULT_MAX_TOKENS)
    }

    /// The prompt tokens each image part of a call is held at.
    pub fn max_tokens_per_image(&self) -> u64 {
        self.max_tokens_per_image
            .unwrap_or(DEFAULT_MAX_TOKENS_PER_IMAGE)
            .min(MAX_MAX_TOKENS_PER_IMAGE)
    }

    /// The field [`Self::default_max_tokens`] is written into.
    pub fn default_max_tokens_field(&self) -> LimitField {
        self.default_max_tokens_field.unwrap_or_default()
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

pub(super) fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost") || h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Shortens task- or user-controlled text quoted in a message.
pub(super) fn clip(s: &str) -> String {
    if s.len() <= MAX_ECHOED_LEN {
        return s.to_string();
    }
    let mut end = MAX_ECHOED_LEN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::tests::{config, KEY};

    #[test]
    fn config_validation_names_the_field() {
        let ok = config("https://api.example.com/v1", &[("m", 1.0, 2.0)]);
        ok.validate("policy.toml").unwrap();
        assert_eq!(ok.port(), DEFAULT_PORT);
        assert_eq!(ok.task_url(), "http://127.0.0.1:8089/v1");
        assert_eq!(ok.timeout(), Duration::from_secs(30));
        assert_eq!(ok.default_max_tokens(), DEFAULT_MAX_TOKENS);
        assert_eq!(ok.max_tokens_per_image(), DEFAULT_MAX_TOKENS_PER_IMAGE);
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
            (
                "gateway.default_max_tokens",
                Box::new(|c| c.default_max_tokens = Some(0)),
            ),
            (
                "gateway.default_max_tokens",
                Box::new(|c| c.default_max_tokens = Some(MAX_DEFAULT_MAX_TOKENS + 1)),
            ),
            (
                "gateway.max_tokens_per_image",
                Box::new(|c| c.max_tokens_per_image = Some(MAX_MAX_TOKENS_PER_IMAGE + 1)),
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
        // The field the default limit is written into: max_tokens unless the policy says.
        assert_eq!(c.default_max_tokens_field(), LimitField::MaxTokens);
        // A policy without it serializes as before (its conditions hash is unchanged).
        let doc = serde_json::to_value(&c).unwrap();
        assert!(doc.get("default_max_tokens_field").is_none(), "{doc}");
        assert!(doc.get("max_tokens_per_image").is_none(), "{doc}");
        let zero = t.replace("\n[prices.m]", "\nmax_tokens_per_image = 0\n[prices.m]");
        let z: GatewayConfig = toml::from_str(&zero).unwrap();
        z.validate("p").unwrap();
        assert_eq!(z.max_tokens_per_image(), 0);
        let with = t.replace(
            "\n[prices.m]",
            "\ndefault_max_tokens_field = \"max_completion_tokens\"\n[prices.m]",
        );
        let c: GatewayConfig = toml::from_str(&with).unwrap_or_else(|e| panic!("{with}: {e}"));
        assert_eq!(
            c.default_max_tokens_field(),
            LimitField::MaxCompletionTokens
        );
        assert_eq!(c.default_max_tokens_field().name(), "max_completion_tokens");
        let bad = t.replace(
            "\n[prices.m]",
            "\ndefault_max_tokens_field = \"max_output\"\n[prices.m]",
        );
        let e = toml::from_str::<GatewayConfig>(&bad)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("max_output") && e.contains("max_completion_tokens"),
            "{e}"
        );
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
}
