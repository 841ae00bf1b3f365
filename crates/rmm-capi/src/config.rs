//! [`Config`]: the options of `rmm_rs_configure`, checked and in Rust form. Pure: no CUDA
//! call.

use std::collections::HashSet;
use std::ffi::{CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use rmm::{DeviceId, ALLOCATION_ALIGNMENT};

use crate::abi::{
    RmmRsOptions, RMM_RS_RESOURCE_ASYNC, RMM_RS_RESOURCE_CUDA, RMM_RS_RESOURCE_POOL,
    RMM_RS_SIZE_DEFAULT,
};
use crate::status::{CResult, Error};

/// Which resource sits at the bottom of a device's stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResourceKind {
    /// `RMM_RS_RESOURCE_CUDA`.
    Cuda,
    /// `RMM_RS_RESOURCE_POOL`.
    Pool,
    /// `RMM_RS_RESOURCE_ASYNC`.
    Async,
}

/// What to build for a device, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Config {
    /// The resource.
    pub(crate) kind: ResourceKind,
    /// Managed memory.
    pub(crate) managed: bool,
    /// The initial size (pool) or priming size (async); `None`: the default.
    pub(crate) initial_pool_size: Option<usize>,
    /// The pool's maximum; `None`: none.
    pub(crate) maximum_pool_size: Option<usize>,
    /// The CSV log's base path (each device writes `<stem>.dev<N><ext>`).
    pub(crate) log_file: Option<PathBuf>,
    /// Count bytes and allocations.
    pub(crate) statistics: bool,
    /// The devices to build now; empty: every device, lazily.
    pub(crate) devices: Vec<DeviceId>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            kind: ResourceKind::Pool,
            managed: false,
            initial_pool_size: None,
            maximum_pool_size: None,
            log_file: None,
            statistics: true,
            devices: Vec::new(),
        }
    }
}

fn size(value: u64, name: &str) -> CResult<Option<usize>> {
    if value == RMM_RS_SIZE_DEFAULT {
        return Ok(None);
    }
    let bytes = usize::try_from(value)
        .map_err(|_| Error::invalid_argument(format!("{name} {value} does not fit in size_t")))?;
    if bytes % ALLOCATION_ALIGNMENT != 0 {
        return Err(Error::invalid_argument(format!(
            "{name} must be a multiple of 256 bytes, not {bytes}"
        )));
    }
    Ok(Some(bytes))
}

impl Config {
    /// Reads and checks the C options.
    ///
    /// # Safety
    /// `options.log_file` is null or a NUL-terminated string, and `options.devices` points to
    /// `options.num_devices` readable ints when `num_devices > 0`; both only for this call.
    pub(crate) unsafe fn from_c(options: &RmmRsOptions) -> CResult<Self> {
        let kind = match options.resource {
            RMM_RS_RESOURCE_CUDA => ResourceKind::Cuda,
            RMM_RS_RESOURCE_POOL => ResourceKind::Pool,
            RMM_RS_RESOURCE_ASYNC => ResourceKind::Async,
            other => {
                return Err(Error::invalid_argument(format!(
                "resource must be RMM_RS_RESOURCE_CUDA (0), _POOL (1) or _ASYNC (2), not {other}"
            )))
            }
        };
        let log_file = if options.log_file.is_null() {
            None
        } else {
            // SAFETY: non-null, NUL-terminated and readable for this call (the caller's
            // contract).
            let bytes = unsafe { CStr::from_ptr(options.log_file) }.to_bytes();
            if bytes.is_empty() {
                return Err(Error::invalid_argument(
                    "log_file is empty (use NULL for no log)",
                ));
            }
            Some(PathBuf::from(OsStr::from_bytes(bytes)))
        };
        let devices = match options.num_devices {
            0 => Vec::new(),
            n if n < 0 => {
                return Err(Error::invalid_argument(format!(
                    "num_devices must not be negative, not {n}"
                )))
            }
            _ if options.devices.is_null() => {
                return Err(Error::invalid_argument(
                    "devices is NULL but num_devices is not 0",
                ))
            }
            n => {
                // SAFETY: `devices` points to `n` readable ints for this call (the caller's
                // contract); n > 0, so the length is positive and fits usize.
                let ordinals = unsafe { std::slice::from_raw_parts(options.devices, n as usize) };
                ordinals.iter().map(|&d| DeviceId(d)).collect()
            }
        };
        let config = Self {
            kind,
            managed: options.managed_memory != 0,
            initial_pool_size: size(options.initial_pool_size, "initial_pool_size")?,
            maximum_pool_size: size(options.maximum_pool_size, "maximum_pool_size")?,
            log_file,
            statistics: options.statistics != 0,
            devices,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the combination: sizes only where they mean something, the initial size within
    /// the maximum, device ordinals non-negative and each once.
    pub(crate) fn validate(&self) -> CResult<()> {
        let bad = |m: &str| Err(Error::invalid_argument(m));
        match self.kind {
            ResourceKind::Cuda
                if self.initial_pool_size.is_some() || self.maximum_pool_size.is_some() =>
            {
                return bad("initial_pool_size and maximum_pool_size need RMM_RS_RESOURCE_POOL or _ASYNC (leave them at RMM_RS_SIZE_DEFAULT)");
            }
            ResourceKind::Async if self.maximum_pool_size.is_some() => {
                return bad(
                    "maximum_pool_size is for RMM_RS_RESOURCE_POOL; the driver's pool has none",
                );
            }
            ResourceKind::Async if self.managed && self.initial_pool_size.is_some() => {
                return bad("initial_pool_size is not supported for the driver's managed pool");
            }
            _ => {}
        }
        if let (Some(i), Some(m)) = (self.initial_pool_size, self.maximum_pool_size) {
            if i > m {
                return bad("Initial pool size exceeds the maximum pool size!");
            }
        }
        if let Some(d) = self.devices.iter().find(|d| d.0 < 0) {
            return Err(Error::invalid_argument(format!(
                "device ordinals are not negative, not {}",
                d.0
            )));
        }
        let mut seen = HashSet::new();
        if !self.devices.iter().all(|d| seen.insert(*d)) {
            return bad("a device is listed twice");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::RMM_RS_ERROR_INVALID_ARGUMENT;
    use std::ffi::CString;

    fn read(options: &RmmRsOptions) -> CResult<Config> {
        // SAFETY: the tests' pointers are null or live for the call.
        unsafe { Config::from_c(options) }
    }

    fn refused(options: RmmRsOptions, words: &str) {
        let e = read(&options).unwrap_err();
        assert_eq!(e.code, RMM_RS_ERROR_INVALID_ARGUMENT);
        assert!(e.message.contains(words), "{e} should say {words:?}");
    }

    #[test]
    fn the_defaults_are_a_pool_on_every_device() {
        let c = read(&RmmRsOptions::default()).unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn every_field_is_read() {
        let log = CString::new("/tmp/x/rmm_log.csv").unwrap();
        let devices = [1, 0];
        let c = read(&RmmRsOptions {
            resource: RMM_RS_RESOURCE_POOL,
            managed_memory: 1,
            initial_pool_size: 1 << 20,
            maximum_pool_size: 1 << 30,
            log_file: log.as_ptr(),
            statistics: 0,
            num_devices: 2,
            devices: devices.as_ptr(),
        })
        .unwrap();
        assert_eq!(
            c,
            Config {
                kind: ResourceKind::Pool,
                managed: true,
                initial_pool_size: Some(1 << 20),
                maximum_pool_size: Some(1 << 30),
                log_file: Some(PathBuf::from("/tmp/x/rmm_log.csv")),
                statistics: false,
                devices: vec![DeviceId(1), DeviceId(0)],
            }
        );
        let c = read(&RmmRsOptions {
            resource: RMM_RS_RESOURCE_ASYNC,
            initial_pool_size: 0,
            ..RmmRsOptions::default()
        })
        .unwrap();
        assert_eq!(
            (c.kind, c.initial_pool_size),
            (ResourceKind::Async, Some(0))
        );
    }

    #[test]
    fn bad_options_are_refused_with_a_reason() {
        let d = RmmRsOptions::default();
        refused(RmmRsOptions { resource: 7, ..d }, "not 7");
        refused(
            RmmRsOptions {
                initial_pool_size: 1000,
                ..d
            },
            "multiple of 256",
        );
        refused(
            RmmRsOptions {
                initial_pool_size: 2 << 20,
                maximum_pool_size: 1 << 20,
                ..d
            },
            "exceeds the maximum",
        );
        refused(
            RmmRsOptions {
                resource: RMM_RS_RESOURCE_CUDA,
                maximum_pool_size: 1 << 20,
                ..d
            },
            "need RMM_RS_RESOURCE_POOL",
        );
        refused(
            RmmRsOptions {
                resource: RMM_RS_RESOURCE_ASYNC,
                maximum_pool_size: 1 << 20,
                ..d
            },
            "driver's pool has none",
        );
        refused(
            RmmRsOptions {
                resource: RMM_RS_RESOURCE_ASYNC,
                managed_memory: 1,
                initial_pool_size: 1 << 20,
                ..d
            },
            "managed pool",
        );
        let empty = CString::new("").unwrap();
        refused(
            RmmRsOptions {
                log_file: empty.as_ptr(),
                ..d
            },
            "log_file is empty",
        );
        refused(
            RmmRsOptions {
                num_devices: -1,
                ..d
            },
            "negative",
        );
        refused(
            RmmRsOptions {
                num_devices: 1,
                ..d
            },
            "devices is NULL",
        );
        let twice = [0, 0];
        refused(
            RmmRsOptions {
                num_devices: 2,
                devices: twice.as_ptr(),
                ..d
            },
            "twice",
        );
        let negative = [-3];
        refused(
            RmmRsOptions {
                num_devices: 1,
                devices: negative.as_ptr(),
                ..d
            },
            "not -3",
        );
        if usize::BITS < 64 {
            refused(
                RmmRsOptions {
                    maximum_pool_size: 1 << 40,
                    ..d
                },
                "size_t",
            );
        }
    }
}
