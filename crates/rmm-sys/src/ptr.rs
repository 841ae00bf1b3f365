//! Device addresses.

use std::fmt;

/// An address handed out by a memory resource: a `CUdeviceptr` for device memory, the host
/// address for host-accessible memory (pinned, system). Plain data: it owns nothing.
///
/// The null address is what a zero-byte allocation returns.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(transparent)]
pub struct DevicePtr(u64);

impl DevicePtr {
    /// The null address.
    pub const NULL: Self = Self(0);

    /// Wraps a raw address.
    #[must_use]
    pub const fn from_raw(addr: u64) -> Self {
        Self(addr)
    }

    /// Wraps a host pointer (pinned or system memory).
    #[must_use]
    pub fn from_host_ptr<T>(ptr: *mut T) -> Self {
        Self(ptr as usize as u64)
    }

    /// The raw address (`CUdeviceptr`).
    #[must_use]
    pub const fn addr(self) -> u64 {
        self.0
    }

    /// The address as a host pointer (meaningful for host-accessible memory only).
    #[must_use]
    pub fn as_host_ptr<T>(self) -> *mut T {
        self.0 as usize as *mut T
    }

    /// Whether this is the null address.
    #[must_use]
    pub const fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The address `bytes` further on, or `None` on overflow.
    #[must_use]
    pub const fn checked_add(self, bytes: usize) -> Option<Self> {
        match self.0.checked_add(bytes as u64) {
            Some(a) => Some(Self(a)),
            None => None,
        }
    }

    /// Whether the address is a multiple of `alignment` (a power of two).
    #[must_use]
    pub const fn is_aligned(self, alignment: usize) -> bool {
        alignment.is_power_of_two() && self.0 % alignment as u64 == 0
    }
}

impl fmt::Debug for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DevicePtr({:#x})", self.0)
    }
}

impl fmt::Display for DevicePtr {
    /// Formats as C's `%p` does on Linux (RMM's logs): `0x7f..` or `(nil)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            f.write_str("(nil)")
        } else {
            write!(f, "{:#x}", self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_printf_p() {
        assert_eq!(DevicePtr::NULL.to_string(), "(nil)");
        assert_eq!(
            DevicePtr::from_raw(0x7f00_0000_0100).to_string(),
            "0x7f0000000100"
        );
        assert!(DevicePtr::from_raw(512).is_aligned(256));
        assert!(!DevicePtr::from_raw(513).is_aligned(256));
        assert_eq!(DevicePtr::from_raw(u64::MAX).checked_add(1), None);
    }
}
