//! Byte sizes given as numbers or as strings like `"1GiB"` (what RMM's Python `reinitialize`
//! accepts).

use std::fmt;
use std::str::FromStr;

use rmm_mr::MrError;

/// A size in bytes, parsed from a number or a string: `"1073741824"`, `"1GiB"`, `"1 GiB"`,
/// `"512MiB"`, `"1.5GB"`, `"64k"`. Binary units (`KiB`, `MiB`, `GiB`, `TiB`, and the one-letter
/// `k`, `m`, `g`, `t`) are powers of 1024; decimal units (`KB`, `MB`, `GB`, `TB`) powers of
/// 1000. Case-insensitive; fractions are rounded down to whole bytes.
///
/// Parsing fails with [`ParseByteSizeError::Invalid`] for what is not a size and with
/// [`ParseByteSizeError::Overflow`] for a size beyond `usize::MAX` bytes, however many digits
/// it has; both convert into [`MrError::InvalidArgument`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub usize);

impl ByteSize {
    /// The number of bytes.
    #[must_use]
    pub const fn bytes(self) -> usize {
        self.0
    }
}

impl From<usize> for ByteSize {
    fn from(b: usize) -> Self {
        Self(b)
    }
}

impl TryFrom<&str> for ByteSize {
    type Error = ParseByteSizeError;

    fn try_from(s: &str) -> Result<Self, ParseByteSizeError> {
        s.parse()
    }
}

/// Why a string is not a [`ByteSize`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseByteSizeError {
    /// The string is not a number with an optional unit.
    Invalid {
        /// The string given.
        input: String,
    },
    /// The size is a number, but more bytes than `usize` holds on this platform (e.g.
    /// `99999999999999999999 GiB`, or a number of 40 digits).
    Overflow {
        /// The string given.
        input: String,
    },
}

impl fmt::Display for ParseByteSizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid { input } => {
                write!(f, "`{input}` is not a size (try `1GiB` or `1073741824`)")
            }
            Self::Overflow { input } => write!(
                f,
                "`{input}` is more bytes than this platform can address (at most {} bytes)",
                usize::MAX
            ),
        }
    }
}

impl std::error::Error for ParseByteSizeError {}

impl From<ParseByteSizeError> for MrError {
    /// Either kind is a bad argument ([`MrError::InvalidArgument`]), with the message.
    fn from(e: ParseByteSizeError) -> Self {
        MrError::invalid_argument(e.to_string())
    }
}

/// `digits` (ASCII digits only) as a number, `None` when it does not fit in `u128`.
fn parse_digits(digits: &str) -> Option<u128> {
    digits.bytes().try_fold(0u128, |n, d| {
        n.checked_mul(10)?.checked_add(u128::from(d - b'0'))
    })
}

/// `floor(0.<digits> * multiplier)` exactly, however many `digits` (ASCII digits only) there
/// are: the carry out of multiplying the digits by `multiplier` from the last one up. After
/// each digit the carry is below `multiplier`, so `9 * multiplier + carry` fits in `u128` for
/// every unit. (Keeping only the first digits is not exact: 1 / 2^40 has 40 of them, so
/// `0.0000000000009094947017729282379150390625TiB` is one byte, not zero.)
fn fraction_bytes(digits: &str, multiplier: u128) -> u128 {
    digits.bytes().rev().fold(0u128, |carry, d| {
        (u128::from(d - b'0') * multiplier + carry) / 10
    })
}

impl FromStr for ByteSize {
    type Err = ParseByteSizeError;

    /// Parses with checked arithmetic throughout: a number too large for `usize` (however
    /// many digits, whatever its unit) is [`ParseByteSizeError::Overflow`], never a panic or a
    /// wrapped-around size.
    fn from_str(s: &str) -> Result<Self, ParseByteSizeError> {
        let bad = || ParseByteSizeError::Invalid {
            input: s.to_owned(),
        };
        let overflow = || ParseByteSizeError::Overflow {
            input: s.to_owned(),
        };
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        if num.is_empty() {
            return Err(bad());
        }
        let multiplier: u128 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => 1 << 10,
            "m" | "mib" => 1 << 20,
            "g" | "gib" => 1 << 30,
            "t" | "tib" => 1 << 40,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "tb" => 1_000_000_000_000,
            _ => return Err(bad()),
        };
        // `num` holds ASCII digits and dots only.
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if frac.contains('.') || (int.is_empty() && frac.is_empty()) {
            return Err(bad());
        }
        let whole = parse_digits(int).ok_or_else(overflow)?;
        let mut bytes = whole.checked_mul(multiplier).ok_or_else(overflow)?;
        if !frac.is_empty() {
            bytes = bytes
                .checked_add(fraction_bytes(frac, multiplier))
                .ok_or_else(overflow)?;
        }
        usize::try_from(bytes).map(ByteSize).map_err(|_| overflow())
    }
}

impl fmt::Display for ByteSize {
    /// Formats like RMM's `format_bytes`: `1.000000 GiB`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&rmm_mr::format_bytes(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_numbers_and_units() {
        let p = |s: &str| s.parse::<ByteSize>().map(ByteSize::bytes);
        assert_eq!(p("1073741824").unwrap(), 1 << 30);
        assert_eq!(p("1GiB").unwrap(), 1 << 30);
        assert_eq!(p(" 1 gib ").unwrap(), 1 << 30);
        assert_eq!(p("512MiB").unwrap(), 512 << 20);
        assert_eq!(p("64k").unwrap(), 64 << 10);
        assert_eq!(p("1GB").unwrap(), 1_000_000_000);
        assert_eq!(p("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(p(".5KiB").unwrap(), 512);
        assert_eq!(p("0").unwrap(), 0);
        for bad in [
            "",
            "GiB",
            "1.2.3GiB",
            "12 parsecs",
            "-1",
            "1e9",
            "1..5GiB",
            ".",
            "1 G i B",
        ] {
            assert!(
                matches!(p(bad), Err(ParseByteSizeError::Invalid { .. })),
                "{bad:?} parsed"
            );
            let e: MrError = p(bad).unwrap_err().into();
            assert!(matches!(e, MrError::InvalidArgument(_)), "{e}");
        }
    }

    /// Very long numbers and huge units are a typed overflow error, never a panic (debug) or a
    /// wrapped-around size (release).
    #[test]
    fn overflow_is_a_typed_error() {
        let p = |s: &str| s.parse::<ByteSize>();
        let forty_digits = "1234567890123456789012345678901234567890";
        assert_eq!(forty_digits.len(), 40);
        let too_big = [
            forty_digits.to_owned(),
            format!("{forty_digits}GiB"),
            format!("{forty_digits}.5"),
            "99999999999999999999 GiB".to_owned(),
            "99999999999999999999TiB".to_owned(),
            // u128::MAX / 1000 whole kilobytes plus a fraction: the product fits in u128, the
            // sum with the fraction does not (this panicked in debug builds).
            "340282366920938463463374607431768211.999KB".to_owned(),
            format!("{}0", u128::MAX),
            format!("{}", u128::MAX),
            format!("{}1", usize::MAX),
            format!("{}", usize::MAX as u128 + 1),
        ];
        for s in &too_big {
            match p(s) {
                Err(ParseByteSizeError::Overflow { input }) => assert_eq!(&input, s),
                other => panic!("{s:?} gave {other:?}"),
            }
            let e: MrError = p(s).unwrap_err().into();
            assert!(e.to_string().contains("more bytes than"), "{e}");
        }
        // The largest size still parses; leading zeros do not count as size.
        assert_eq!(p(&usize::MAX.to_string()), Ok(ByteSize(usize::MAX)));
        assert_eq!(p(&format!("{}{}", "0".repeat(60), 42)), Ok(ByteSize(42)));
    }

    /// At the edge of a 64-bit `usize`: a fraction that brings the size to `usize::MAX` parses,
    /// one byte more overflows.
    #[cfg(target_pointer_width = "64")]
    #[test]
    fn the_largest_sizes() {
        let p = |s: &str| s.parse::<ByteSize>();
        // (2^24 - 1) TiB + 0.999999999999999999 TiB = 2^64 - 1 bytes.
        assert_eq!(
            p("16777215.999999999999999999999TiB"),
            Ok(ByteSize(usize::MAX))
        );
        assert!(matches!(
            p("16777216TiB"),
            Err(ParseByteSizeError::Overflow { .. })
        ));
        assert!(matches!(
            p("18446744073709551616"),
            Err(ParseByteSizeError::Overflow { .. })
        ));
    }

    /// Regression (found writing the fuzz target's reference parser): only 18 fraction digits
    /// were kept, but 1 / 2^40 has 40, so a TiB fraction making exactly one byte parsed as 0.
    #[test]
    fn every_fraction_digit_counts() {
        let p = |s: &str| s.parse::<ByteSize>().map(ByteSize::bytes);
        assert_eq!(p("0.0000000000009094947017729282379150390625TiB"), Ok(1));
        assert_eq!(p("0.0000000000009094947017729282379150390624999TiB"), Ok(0));
        assert_eq!(
            p("2.0000000000009094947017729282379150390625 t"),
            Ok((2 << 40) + 1)
        );
        assert_eq!(p("0.0009765625KiB"), Ok(1));
        assert_eq!(p("0.0009765624999999999999999999KiB"), Ok(0));
        assert_eq!(p(&format!("0.{}k", "9".repeat(10_000))), Ok(1023));
        assert_eq!(p(&format!("1.{}", "9".repeat(100))), Ok(1));
    }

    #[test]
    fn displays_like_rmm_format_bytes() {
        assert_eq!(ByteSize(1 << 30).to_string(), "1024.000000 MiB");
        assert_eq!(ByteSize((1 << 30) + 1).to_string(), "1.000000 GiB");
        assert_eq!(ByteSize(2048).to_string(), "2.000000 KiB");
        assert_eq!(ByteSize(10).to_string(), "10.000000 B");
    }
}
