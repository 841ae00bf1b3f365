//! Byte sizes as text: RMM's exact form ([`format_bytes`], for messages that match RMM's) and
//! a short one for people ([`HumanBytes`], for reports and tools).

use std::fmt;

/// RMM's `rmm::detail::format_bytes`: the value divided by 1024 while it exceeds 1024, printed
/// with six decimals and a binary unit (`1000` -> `"1000.000000 B"`, `2048` ->
/// `"2.000000 KiB"`). Every message of this crate that names a size in bytes uses it.
#[doc(alias = "rmm::detail::format_bytes")]
#[must_use]
pub fn format_bytes(value: usize) -> String {
    const UNITS: [&str; 9] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"];
    #[allow(clippy::cast_precision_loss)] // Same lossy conversion as RMM's.
    let mut size = value as f64;
    let mut index = 0;
    while size > 1024.0 && index + 1 < UNITS.len() {
        size /= 1024.0;
        index += 1;
    }
    format!("{size:.6} {}", UNITS[index])
}

/// A byte size for people: bytes below 1 KiB as an integer (`512 B`), larger sizes in the
/// largest binary unit that keeps the value at or above 1, with the formatter's precision as
/// decimals (one by default): `format!("{}", HumanBytes(40 << 20))` is `"40.0 MiB"`,
/// `format!("{:.2}", HumanBytes(1536))` is `"1.50 KiB"`.
///
/// ```
/// use rmm_mr::HumanBytes;
/// assert_eq!(HumanBytes(512).to_string(), "512 B");
/// assert_eq!(format!("{:.2}", HumanBytes(3 << 29)), "1.50 GiB");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanBytes(pub u64);

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        #[allow(clippy::cast_precision_loss)] // A few decimals are shown.
        let mut size = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while size >= 1024.0 && unit + 1 < UNITS.len() {
            size /= 1024.0;
            unit += 1;
        }
        let decimals = f.precision().unwrap_or(1);
        write!(f, "{size:.decimals$} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_picks_the_unit_and_the_precision() {
        assert_eq!(HumanBytes(0).to_string(), "0 B");
        assert_eq!(HumanBytes(1023).to_string(), "1023 B");
        assert_eq!(HumanBytes(1024).to_string(), "1.0 KiB");
        assert_eq!(format!("{:.2}", HumanBytes(1536)), "1.50 KiB");
        assert_eq!(HumanBytes(3 << 30).to_string(), "3.0 GiB");
        assert_eq!(HumanBytes(u64::MAX).to_string(), "16.0 EiB");
        assert_eq!(format!("{:.2}", HumanBytes(80 << 30)), "80.00 GiB");
    }

    #[test]
    fn format_bytes_matches_rmm() {
        assert_eq!(format_bytes(0), "0.000000 B");
        assert_eq!(format_bytes(1000), "1000.000000 B");
        assert_eq!(format_bytes(1024), "1024.000000 B");
        assert_eq!(format_bytes(2048), "2.000000 KiB");
        assert_eq!(format_bytes(1536), "1.500000 KiB");
        assert_eq!(format_bytes(3 << 30), "3.000000 GiB");
        assert_eq!(format_bytes(usize::MAX), "16.000000 EiB");
    }
}
