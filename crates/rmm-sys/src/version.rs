//! CUDA driver versions (`cuDriverGetVersion`'s `1000 * major + 10 * minor`).

use std::fmt;

/// A CUDA version as the driver reports it: `12040` is CUDA 12.4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DriverVersion(pub i32);

impl DriverVersion {
    /// The oldest driver rmm-rs supports: CUDA 12.0.
    pub const MINIMUM: Self = Self(12000);
    /// CUDA 12.8, which brought hardware decompression (the `usage` of pools and allocations,
    /// and the pointer attribute that tells whether memory may serve it).
    pub const CUDA_12_8: Self = Self(12080);
    /// CUDA 13.0, which brought the default managed pool and the new prefetch ABI.
    pub const CUDA_13_0: Self = Self(13000);

    /// The major version (12 for `12040`).
    #[must_use]
    pub const fn major(self) -> i32 {
        self.0 / 1000
    }

    /// The minor version (4 for `12040`).
    #[must_use]
    pub const fn minor(self) -> i32 {
        (self.0 % 1000) / 10
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major(), self.minor())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes() {
        let v = DriverVersion(12040);
        assert_eq!((v.major(), v.minor()), (12, 4));
        assert_eq!(v.to_string(), "12.4");
        assert_eq!(DriverVersion(13000).to_string(), "13.0");
        assert!(DriverVersion(11080) < DriverVersion::MINIMUM);
    }
}
