//! RMM's human-readable byte sizes, used in error and log messages.

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

#[cfg(test)]
mod tests {
    use super::*;

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
