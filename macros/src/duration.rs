//! `"250ms"` / `"1s"` / `"forever"` / `"watchdog"` → typed values, errors spanned on the literal.
//!
//! Grammar: `0`, or an integer followed by one unit among `ms`, `s`, `m`, `h`, nothing else: no
//! sign, no fraction, no space, no sub-millisecond unit (lock timing below 1 ms is meaningless: a
//! single Redis round trip costs about that). The value must fit `u64` nanoseconds because the
//! generated code builds it with the `const fn Duration::from_nanos`.

use std::fmt;
use std::time::Duration;

use syn::{Error, LitStr};

/// The shortest lease, and the shortest `max_hold`: below this a lease can expire before the
/// acquire reply has even come back, and a watchdog renewing every TTL/3 cannot keep up.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(100);

/// `wait`: how long to wait for a busy lock before `LockError::Busy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    For(Duration),
    Forever,
}

/// `lease`: renewed by the watchdog, or fixed and never renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lease {
    Watchdog,
    Fixed(Duration),
}

/// What is wrong with a duration string; the caller adds what its argument accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DurationError {
    Empty,
    Whitespace(String),
    Negative(String),
    Fraction(String),
    NotADuration(String),
    MissingUnit(String),
    SubMillisecond(String),
    UnknownUnit { text: String, unit: String },
    Overflow(String),
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DurationError::Empty => write!(f, "the duration is empty"),
            DurationError::Whitespace(text) => write!(f, "`{text}` contains whitespace"),
            DurationError::Negative(text) => write!(f, "`{text}` is negative"),
            DurationError::Fraction(text) => {
                write!(f, "`{text}` has a fraction; use a smaller unit instead")
            }
            DurationError::NotADuration(text) => write!(f, "`{text}` is not a duration"),
            DurationError::MissingUnit(text) => write!(f, "`{text}` has no unit"),
            DurationError::SubMillisecond(text) => write!(
                f,
                "`{text}` uses a unit below milliseconds, too fine for lock timing"
            ),
            DurationError::UnknownUnit { text, unit } => {
                write!(f, "`{text}` has an unknown unit `{unit}`")
            }
            DurationError::Overflow(text) => write!(
                f,
                "`{text}` does not fit in 64-bit nanoseconds (about 584 years)"
            ),
        }
    }
}

/// The grammar, as the second half of every duration error.
const UNITS: &str = "an integer followed by `ms`, `s`, `m` or `h`";

/// Parses the duration grammar described at the top of this file.
pub(crate) fn parse(text: &str) -> Result<Duration, DurationError> {
    let owned = || text.to_owned();
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    if text.chars().any(char::is_whitespace) {
        return Err(DurationError::Whitespace(owned()));
    }
    if text.starts_with('-') {
        return Err(DurationError::Negative(owned()));
    }
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(DurationError::NotADuration(owned()));
    }
    if unit.starts_with(['.', ',']) {
        return Err(DurationError::Fraction(owned()));
    }
    let nanos_per_unit: u64 = match unit {
        "" if digits.bytes().all(|b| b == b'0') => 0,
        "" => return Err(DurationError::MissingUnit(owned())),
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60 * 1_000_000_000,
        "h" => 3_600 * 1_000_000_000,
        "us" | "µs" | "μs" | "ns" => return Err(DurationError::SubMillisecond(owned())),
        _ => {
            return Err(DurationError::UnknownUnit {
                text: owned(),
                unit: unit.to_owned(),
            })
        }
    };
    let count: u64 = digits
        .parse()
        .map_err(|_| DurationError::Overflow(owned()))?;
    let nanos = count
        .checked_mul(nanos_per_unit)
        .ok_or_else(|| DurationError::Overflow(owned()))?;
    Ok(Duration::from_nanos(nanos))
}

/// `wait`: `"forever"` or a duration, zero included (try once, do not wait).
pub(crate) fn wait(lit: &LitStr) -> Result<Wait, Error> {
    let text = lit.value();
    if text == "forever" {
        return Ok(Wait::Forever);
    }
    parse(&text).map(Wait::For).map_err(|problem| {
        Error::new(
            lit.span(),
            format!("invalid `wait`: {problem}; expected `forever`, `0` or {UNITS}, such as `250ms` or `1s`"),
        )
    })
}

/// `lease`: `"watchdog"` or a fixed duration of at least [`MIN_LEASE`].
pub(crate) fn lease(lit: &LitStr) -> Result<Lease, Error> {
    let text = lit.value();
    if text == "watchdog" {
        return Ok(Lease::Watchdog);
    }
    let fixed = parse(&text).map_err(|problem| {
        Error::new(
            lit.span(),
            format!("invalid `lease`: {problem}; expected `watchdog` or {UNITS} of at least 100ms, such as `30s`"),
        )
    })?;
    if fixed < MIN_LEASE {
        return Err(Error::new(
            lit.span(),
            format!("lease `{text}` is under the 100ms minimum; expected `watchdog` or a duration of at least `100ms`"),
        ));
    }
    Ok(Lease::Fixed(fixed))
}

/// `max_hold`: a duration of at least [`MIN_LEASE`].
pub(crate) fn max_hold(lit: &LitStr) -> Result<Duration, Error> {
    let text = lit.value();
    let cap = parse(&text).map_err(|problem| {
        Error::new(
            lit.span(),
            format!(
                "invalid `max_hold`: {problem}; expected {UNITS} of at least 100ms, such as `5m`"
            ),
        )
    })?;
    if cap < MIN_LEASE {
        return Err(Error::new(
            lit.span(),
            format!("`max_hold` `{text}` is under the 100ms minimum; expected a duration of at least `100ms`, such as `5m`"),
        ));
    }
    Ok(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(text: &str) -> LitStr {
        LitStr::new(text, proc_macro2::Span::call_site())
    }

    #[test]
    fn accepts_every_unit() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("007s"), Ok(Duration::from_secs(7)));
    }

    #[test]
    fn bare_zero_is_the_only_unitless_value() {
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("000"), Ok(Duration::ZERO));
        assert_eq!(parse("0ms"), Ok(Duration::ZERO));
        assert_eq!(parse("10"), Err(DurationError::MissingUnit("10".into())));
    }

    #[test]
    fn rejects_malformed_text() {
        assert_eq!(parse(""), Err(DurationError::Empty));
        assert_eq!(
            parse("1 sec"),
            Err(DurationError::Whitespace("1 sec".into()))
        );
        assert_eq!(parse(" 1s"), Err(DurationError::Whitespace(" 1s".into())));
        assert_eq!(parse("-1s"), Err(DurationError::Negative("-1s".into())));
        assert_eq!(parse("1.5s"), Err(DurationError::Fraction("1.5s".into())));
        assert_eq!(parse("s"), Err(DurationError::NotADuration("s".into())));
        assert_eq!(parse("+1s"), Err(DurationError::NotADuration("+1s".into())));
        assert_eq!(
            parse("soon"),
            Err(DurationError::NotADuration("soon".into()))
        );
        assert_eq!(
            parse("1sec"),
            Err(DurationError::UnknownUnit {
                text: "1sec".into(),
                unit: "sec".into()
            })
        );
        assert_eq!(
            parse("1S"),
            Err(DurationError::UnknownUnit {
                text: "1S".into(),
                unit: "S".into()
            })
        );
        assert_eq!(
            parse("1s2ms"),
            Err(DurationError::UnknownUnit {
                text: "1s2ms".into(),
                unit: "s2ms".into()
            })
        );
    }

    #[test]
    fn rejects_sub_millisecond_units() {
        for text in ["10us", "10µs", "10ns"] {
            assert_eq!(parse(text), Err(DurationError::SubMillisecond(text.into())));
        }
    }

    #[test]
    fn rejects_values_past_u64_nanoseconds() {
        // u64::MAX ns is about 5124095 hours.
        assert_eq!(parse("5124095h"), Ok(Duration::from_secs(5_124_095 * 3600)));
        assert_eq!(
            parse("5124096h"),
            Err(DurationError::Overflow("5124096h".into()))
        );
        assert_eq!(
            parse("18446744073709551616ms"),
            Err(DurationError::Overflow("18446744073709551616ms".into()))
        );
        assert_eq!(
            parse("18446744073709551615s"),
            Err(DurationError::Overflow("18446744073709551615s".into()))
        );
    }

    #[test]
    fn wait_accepts_forever_and_zero() {
        assert_eq!(wait(&lit("forever")).unwrap(), Wait::Forever);
        assert_eq!(wait(&lit("0")).unwrap(), Wait::For(Duration::ZERO));
        let message = wait(&lit("10")).unwrap_err().to_string();
        assert_eq!(
            message,
            "invalid `wait`: `10` has no unit; expected `forever`, `0` or an integer followed by `ms`, `s`, `m` or `h`, such as `250ms` or `1s`"
        );
    }

    #[test]
    fn lease_has_a_floor_of_100ms() {
        assert_eq!(lease(&lit("watchdog")).unwrap(), Lease::Watchdog);
        assert_eq!(lease(&lit("100ms")).unwrap(), Lease::Fixed(MIN_LEASE));
        for short in ["0", "0s", "99ms"] {
            let message = lease(&lit(short)).unwrap_err().to_string();
            assert!(
                message.starts_with(&format!("lease `{short}` is under the 100ms minimum")),
                "{message}"
            );
        }
        assert!(lease(&lit("forever")).is_err());
    }

    #[test]
    fn max_hold_has_a_floor_of_100ms() {
        assert_eq!(max_hold(&lit("5m")).unwrap(), Duration::from_secs(300));
        assert!(max_hold(&lit("0")).is_err());
        assert!(max_hold(&lit("watchdog")).is_err());
    }
}
