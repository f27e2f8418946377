//! Go-style durations (`30m`, `1h30m`, `45s`) as the CRDs' timeouts spell them.
//!
//! The subset accepted is whole numbers with the units `h`, `m`, `s` and `ms`, in any order
//! (as Go accepts), or a bare `0`. Signs and fractions are refused: a timeout is never negative,
//! and the CRD pattern allows neither.

use std::time::Duration;

/// Why a duration string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// The value is not a sequence of `<number><unit>`.
    #[error("invalid duration {input:?}: expected a duration like 30m, 1h30m or 45s")]
    Invalid {
        /// The value as given.
        input: String,
    },
    /// The value does not fit in a duration.
    #[error("invalid duration {input:?}: too large")]
    Overflow {
        /// The value as given.
        input: String,
    },
}

/// Parses a Go-style duration such as `30m`, `1h30m`, `45s` or `0`.
///
/// # Example
/// ```
/// use capt_controller::status::duration::parse_duration;
/// assert_eq!(parse_duration("1h30m").unwrap().as_secs(), 5400);
/// ```
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let invalid = || DurationError::Invalid { input: s.into() };
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut total_ms: u64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let unit_len = rest[digits..]
            .bytes()
            .take_while(u8::is_ascii_alphabetic)
            .count();
        if digits == 0 || unit_len == 0 {
            return Err(invalid());
        }
        let (number, unit) = (&rest[..digits], &rest[digits..digits + unit_len]);
        let scale = unit_millis(unit).ok_or_else(invalid)?;
        let overflow = || DurationError::Overflow { input: s.into() };
        let value: u64 = number.parse().map_err(|_| overflow())?;
        total_ms = value
            .checked_mul(scale)
            .and_then(|ms| total_ms.checked_add(ms))
            .ok_or_else(overflow)?;
        rest = &rest[digits + unit_len..];
    }
    Ok(Duration::from_millis(total_ms))
}

/// Renders a duration the short way a user writes it: `15m`, `1h30m`, `45s`, `0s`.
/// Sub-second parts are dropped.
pub fn format_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

fn unit_millis(unit: &str) -> Option<u64> {
    match unit {
        "h" => Some(3_600_000),
        "m" => Some(60_000),
        "s" => Some(1_000),
        "ms" => Some(1),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_durations_parse_to_their_length() {
        for (input, secs) in [
            ("30m", 1800),
            ("15m", 900),
            ("1h30m", 5400),
            ("45s", 45),
            ("1h", 3600),
            ("2h3m4s", 7384),
            ("3m1h", 3780),
            ("0", 0),
            ("0s", 0),
        ] {
            assert_eq!(parse_duration(input).unwrap().as_secs(), secs, "{input}");
        }
        assert_eq!(parse_duration("1500ms").unwrap().as_millis(), 1500);
    }

    #[test]
    fn malformed_durations_are_rejected_naming_the_input() {
        for input in ["", "30", "m", "1d", "-5m", "1.5h", "30 m", "h30", "1hh"] {
            let message = parse_duration(input).unwrap_err().to_string();
            assert_eq!(
                message,
                format!("invalid duration {input:?}: expected a duration like 30m, 1h30m or 45s"),
            );
        }
    }

    #[test]
    fn huge_durations_are_rejected_as_too_large() {
        let message = parse_duration("99999999999999999999h")
            .unwrap_err()
            .to_string();
        assert!(message.ends_with("too large"), "{message}");
        assert!(parse_duration("9999999999999999h").is_err());
    }

    #[test]
    fn durations_format_the_way_users_write_them() {
        for (secs, text) in [
            (900, "15m"),
            (5400, "1h30m"),
            (45, "45s"),
            (0, "0s"),
            (3601, "1h1s"),
        ] {
            assert_eq!(format_duration(Duration::from_secs(secs)), text);
        }
    }
}
