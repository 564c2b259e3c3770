//! Human units used by the CLI and the policy files: durations ("90s", "10m", "1h")
//! and sizes ("64MiB", "10GiB", "1000000").

use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
pub enum UnitError {
    #[error("`{0}` is not a duration: write it like 30s, 10m or 1h")]
    Duration(String),
    #[error("`{0}` is longer than any budget or timeout may be: at most 365 days")]
    TooLong(String),
    #[error("`{0}` is not a size: write it like 512MiB, 2GiB or a number of bytes")]
    Size(String),
}

/// The longest duration [`parse_duration`] accepts: every duration a user gives is a budget
/// or a timeout, added to the clock (a longer one would overflow it).
pub const MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);

/// Parses a duration such as `2s`, `10m`, `1h 30m` or a bare number of seconds, at most
/// [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<std::time::Duration, UnitError> {
    let t = s.trim();
    let d = if let Ok(secs) = t.parse::<f64>() {
        if !(secs.is_finite() && secs >= 0.0) {
            return Err(UnitError::Duration(s.to_string()));
        }
        if secs > MAX_DURATION.as_secs_f64() {
            return Err(UnitError::TooLong(s.to_string()));
        }
        std::time::Duration::from_secs_f64(secs)
    } else {
        humantime::parse_duration(t).map_err(|_| UnitError::Duration(s.to_string()))?
    };
    if d > MAX_DURATION {
        return Err(UnitError::TooLong(s.to_string()));
    }
    Ok(d)
}

/// Parses a size such as `64MiB`, `10GiB`, `1.5GB` or a bare number of bytes.
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let t = s.trim();
    if let Ok(n) = t.parse::<u64>() {
        return Ok(n);
    }
    t.parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|_| UnitError::Size(s.to_string()))
}

/// Formats a byte count for people (`64.0 MiB`).
pub fn format_size(n: u64) -> String {
    bytesize::ByteSize::b(n).to_string_as(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1").is_err());
        // Past the clock's range (Duration::from_secs_f64 and Instant + d would panic).
        assert_eq!(parse_duration("365d").unwrap(), MAX_DURATION);
        for long in ["1e20", "1e19", "31536001", "300000000000y", "366d"] {
            assert_eq!(
                parse_duration(long),
                Err(UnitError::TooLong(long.into())),
                "{long}"
            );
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("10GiB").unwrap(), 10 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("lots").is_err());
    }
}
