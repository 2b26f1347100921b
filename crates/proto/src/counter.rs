//! The integer rules of `Incr` (Redis' INCR/INCRBY/DECR): which values are integers and
//! what an increment makes of them. Every replica applies an increment with these rules,
//! and the Redis front end's fallback for older clusters uses them too, so they live in
//! one place: a change here changes the replicated state machine.

use crate::IncrFailure;

/// Longest decimal i64 ("-9223372036854775808").
pub const DECIMAL_I64_BYTES_MAX: usize = 20;

/// `a` as an i64, as Redis reads integers: ASCII digits with an optional leading `-`,
/// no `+`, no spaces, no leading zeros past a lone `0`, no `-0`, at most 20 bytes.
pub fn parse_i64(a: &[u8]) -> Option<i64> {
    if a.is_empty() || a.len() > DECIMAL_I64_BYTES_MAX {
        return None;
    }
    let s = std::str::from_utf8(a).ok()?;
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if digits.len() > 1 && digits.starts_with('0') || digits == "0" && s.starts_with('-') {
        return None;
    }
    s.parse().ok()
}

/// The value an increment by `by` leaves in a key holding `current` (None: absent,
/// read as 0), or why it leaves the key as it is.
pub fn incremented(current: Option<&[u8]>, by: i64) -> Result<i64, IncrFailure> {
    let n = match current {
        None => 0,
        Some(v) => parse_i64(v).ok_or(IncrFailure::NotAnInteger)?,
    };
    n.checked_add(by).ok_or(IncrFailure::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_as_redis_reads_them() {
        for (s, want) in [
            ("0", Some(0)),
            ("-1", Some(-1)),
            ("42", Some(42)),
            ("9223372036854775807", Some(i64::MAX)),
            ("-9223372036854775808", Some(i64::MIN)),
            ("9223372036854775808", None),
            ("", None),
            ("-", None),
            ("+1", None),
            (" 1", None),
            ("1 ", None),
            ("01", None),
            ("-0", None),
            ("-01", None),
            ("1.5", None),
            ("1e3", None),
            ("00000000000000000001", None),
            ("000000000000000000001", None),
        ] {
            assert_eq!(parse_i64(s.as_bytes()), want, "{s:?}");
        }
        assert_eq!(parse_i64(b"\xff1"), None);
    }

    #[test]
    fn increments() {
        assert_eq!(incremented(None, 5), Ok(5));
        assert_eq!(incremented(Some(b"-3"), 1), Ok(-2));
        assert_eq!(incremented(Some(b"x"), 1), Err(IncrFailure::NotAnInteger));
        assert_eq!(
            incremented(Some(b"9223372036854775807"), 1),
            Err(IncrFailure::Overflow)
        );
        assert_eq!(
            incremented(Some(b"-9223372036854775808"), -1),
            Err(IncrFailure::Overflow)
        );
        // The failure that shows first is the one Redis reports first.
        assert_eq!(
            incremented(Some(b"x"), i64::MAX),
            Err(IncrFailure::NotAnInteger)
        );
    }
}
