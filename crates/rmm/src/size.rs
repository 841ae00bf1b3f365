//! Byte sizes given as numbers or as strings like `"1GiB"` (what RMM's Python `reinitialize`
//! accepts).

use std::fmt;
use std::str::FromStr;

use rmm_mr::MrError;

/// A size in bytes, parsed from a number or a string: `"1073741824"`, `"1GiB"`, `"1 GiB"`,
/// `"512MiB"`, `"1.5GB"`, `"64k"`. Binary units (`KiB`, `MiB`, `GiB`, `TiB`, and the one-letter
/// `k`, `m`, `g`, `t`) are powers of 1024; decimal units (`KB`, `MB`, `GB`, `TB`) powers of
/// 1000. Case-insensitive; fractions are rounded down to whole bytes.
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
    type Error = MrError;

    fn try_from(s: &str) -> Result<Self, MrError> {
        s.parse()
    }
}

impl FromStr for ByteSize {
    type Err = MrError;

    fn from_str(s: &str) -> Result<Self, MrError> {
        let bad = || {
            MrError::invalid_argument(format!("`{s}` is not a size (try `1GiB` or `1073741824`)"))
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
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if frac.contains('.') || (int.is_empty() && frac.is_empty()) {
            return Err(bad());
        }
        let whole: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| bad())?
        };
        let mut bytes = whole.checked_mul(multiplier).ok_or_else(bad)?;
        if !frac.is_empty() {
            let digits = frac.len().min(18) as u32;
            let f: u128 = frac[..digits as usize].parse().map_err(|_| bad())?;
            bytes += f * multiplier / 10u128.pow(digits);
        }
        usize::try_from(bytes).map(ByteSize).map_err(|_| bad())
    }
}

impl fmt::Display for ByteSize {
    /// Formats like RMM's `format_bytes`: `1.000000 GiB`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&rmm_mr::pool::growth::format_bytes(self.0))
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
            "99999999999999999999TiB",
        ] {
            assert!(
                matches!(p(bad), Err(MrError::InvalidArgument(_))),
                "{bad:?} parsed"
            );
        }
    }

    #[test]
    fn displays_like_rmm_format_bytes() {
        assert_eq!(ByteSize(1 << 30).to_string(), "1024.000000 MiB");
        assert_eq!(ByteSize((1 << 30) + 1).to_string(), "1.000000 GiB");
        assert_eq!(ByteSize(2048).to_string(), "2.000000 KiB");
        assert_eq!(ByteSize(10).to_string(), "10.000000 B");
    }
}
