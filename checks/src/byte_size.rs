//! `ByteSize::from_str` against an exact reference parser.
//!
//! The reference follows the documented grammar (a number of digits with at most one `.`,
//! optional whitespace, an optional case-insensitive unit; whitespace around) and computes the
//! size exactly, whatever the number of digits: the whole part with checked `u128` arithmetic,
//! the fraction by long multiplication (`floor(0.d1d2...dn * unit)` is the carry out of
//! multiplying the digits by the unit from the last one up, so no digit is ever dropped).
//! [`check`] asks that `ByteSize::from_str` never panics, gives the same size where the
//! reference gives one, the same kind of error where it does not (invalid or overflow, naming
//! the input), and that sizes and errors display.

use std::str::FromStr;

use rmm::{ByteSize, ParseByteSizeError};

/// What the reference parser makes of a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// A size in bytes.
    Size(usize),
    /// Not a size.
    Invalid,
    /// A size above `usize::MAX`.
    Overflow,
}

/// The multiplier of a unit (already trimmed), case-insensitive.
fn unit_multiplier(unit: &str) -> Option<u64> {
    Some(match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    })
}

/// `floor(0.<digits> * multiplier)`, exactly, for ASCII digits and `multiplier <= 10^12`.
fn fraction_bytes(digits: &str, multiplier: u64) -> u64 {
    // Multiply from the last digit up; after digit k the carry is floor(0.dk..dn * m), and it
    // stays below m, so `9 * m + carry` fits in u64.
    digits.bytes().rev().fold(0u64, |carry, d| {
        (u64::from(d - b'0') * multiplier + carry) / 10
    })
}

/// The reference parse of `s`.
#[must_use]
pub fn reference(s: &str) -> Expected {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let Some(multiplier) = unit_multiplier(unit.trim()) else {
        return Expected::Invalid;
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if fraction.contains('.') || (whole.is_empty() && fraction.is_empty()) {
        return Expected::Invalid;
    }
    let significant = whole.trim_start_matches('0');
    // 2^64 has 20 digits: more significant digits than that overflow whatever the unit.
    if significant.len() > 20 {
        return Expected::Overflow;
    }
    let whole: u128 = significant
        .bytes()
        .fold(0u128, |n, d| n * 10 + u128::from(d - b'0'));
    let total = whole * u128::from(multiplier) + u128::from(fraction_bytes(fraction, multiplier));
    match usize::try_from(total) {
        Ok(bytes) => Expected::Size(bytes),
        Err(_) => Expected::Overflow,
    }
}

/// Checks `ByteSize::from_str` on `s` against [`reference()`].
///
/// # Errors
///
/// What differs.
pub fn check(s: &str) -> Result<(), String> {
    let got = ByteSize::from_str(s);
    let want = reference(s);
    match (&got, want) {
        (Ok(size), Expected::Size(bytes)) if size.bytes() == bytes => {
            if size.to_string().is_empty() {
                return Err(format!("{size:?} displays as nothing"));
            }
            Ok(())
        }
        (Err(ParseByteSizeError::Invalid { input }), Expected::Invalid)
        | (Err(ParseByteSizeError::Overflow { input }), Expected::Overflow)
            if input == s =>
        {
            let e = got
                .as_ref()
                .err()
                .map(ToString::to_string)
                .unwrap_or_default();
            if e.is_empty() {
                return Err(format!("the error for {s:?} displays as nothing"));
            }
            Ok(())
        }
        _ => Err(format!("{s:?} parsed as {got:?}, expected {want:?}")),
    }
}

/// [`check`] on `data` as text (invalid UTF-8 replaced).
///
/// # Errors
///
/// What differs.
pub fn check_bytes(data: &[u8]) -> Result<(), String> {
    check(&String::from_utf8_lossy(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_parses_the_documented_forms() {
        assert_eq!(reference("1GiB"), Expected::Size(1 << 30));
        assert_eq!(reference(" 1 gib "), Expected::Size(1 << 30));
        assert_eq!(reference("1.5GiB"), Expected::Size(3 << 29));
        assert_eq!(reference(".5KiB"), Expected::Size(512));
        assert_eq!(reference("5."), Expected::Size(5));
        assert_eq!(reference("1GB"), Expected::Size(1_000_000_000));
        assert_eq!(
            reference("0000000000000000000000000042"),
            Expected::Size(42)
        );
        for bad in [
            "",
            ".",
            "GiB",
            "1.2.3",
            "1 G i B",
            "-1",
            "1e9",
            "12 parsecs",
        ] {
            assert_eq!(reference(bad), Expected::Invalid, "{bad:?}");
        }
        assert_eq!(reference("18446744073709551616"), Expected::Overflow);
        assert_eq!(reference("16777216TiB"), Expected::Overflow);
        assert_eq!(
            reference("16777215.999999999999999999999TiB"),
            Expected::Size(usize::MAX)
        );
    }

    /// The exact fraction: 1 / 2^40 has 40 decimal digits, and a TiB times it is one byte.
    #[test]
    fn the_reference_keeps_every_fraction_digit() {
        let one_byte = "0.0000000000009094947017729282379150390625TiB";
        assert_eq!(reference(one_byte), Expected::Size(1));
        let just_below = "0.0000000000009094947017729282379150390624999TiB";
        assert_eq!(reference(just_below), Expected::Size(0));
        assert_eq!(
            fraction_bytes("999999999999999999999999", 1 << 40),
            (1 << 40) - 1
        );
    }

    #[test]
    fn the_parser_agrees_on_long_fractions() {
        // Regression: the parser kept only 18 fraction digits, which loses a byte where the
        // unit's fraction needs up to 40 (1 / 2^40 has 40 decimal digits).
        check("0.0000000000009094947017729282379150390625TiB").unwrap();
        check("0.0000000000009094947017729282379150390624999TiB").unwrap();
        check("1.5 GiB").unwrap();
        check("not a size").unwrap();
        check(&"9".repeat(50)).unwrap();
        check_bytes(b"\xff1GiB").unwrap();
    }
}
