//! `rmm::reinitialize`: build and install the per-device resources in one call, as RMM's Python
//! `rmm.reinitialize` does.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rmm_mr::{
    set_per_device_resource, CudaMemoryResource, LoggingResourceAdaptor, ManagedMemoryResource,
    MrError, MrResult, PoolMemoryResource, PoolOptions, SharedResource,
};
use rmm_sys::{align_down, DeviceGuard, DeviceId, ALLOCATION_ALIGNMENT};

use crate::size::ByteSize;

/// Something that converts to a [`ByteSize`]: a number of bytes or a string like `"1GiB"`.
pub trait IntoByteSize {
    /// The size, or an invalid-argument error for a string that is not one.
    fn into_byte_size(self) -> MrResult<ByteSize>;
}

impl IntoByteSize for ByteSize {
    fn into_byte_size(self) -> MrResult<ByteSize> {
        Ok(self)
    }
}

impl IntoByteSize for usize {
    fn into_byte_size(self) -> MrResult<ByteSize> {
        Ok(ByteSize(self))
    }
}

impl IntoByteSize for u64 {
    fn into_byte_size(self) -> MrResult<ByteSize> {
        usize::try_from(self)
            .map(ByteSize)
            .map_err(|_| MrError::invalid_argument(format!("{self} bytes do not fit in usize")))
    }
}

impl IntoByteSize for &str {
    fn into_byte_size(self) -> MrResult<ByteSize> {
        Ok(self.parse::<ByteSize>()?)
    }
}

impl IntoByteSize for String {
    fn into_byte_size(self) -> MrResult<ByteSize> {
        Ok(self.parse::<ByteSize>()?)
    }
}

/// What [`reinitialize`] builds for each device (the keyword arguments of Python's
/// `rmm.reinitialize`).
///
/// The resource for a device is, from the bottom up: managed or device memory; optionally a
/// pool over it; optionally a CSV logging adaptor on top.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ReinitializeOptions {
    /// Sub-allocate from a [`PoolMemoryResource`].
    pub pool_allocator: bool,
    /// Use managed (unified) memory instead of device memory.
    pub managed_memory: bool,
    /// The pool's initial size; default half of the device's free memory (as RMM's Python),
    /// rounded down to 256. Only with `pool_allocator`.
    pub initial_pool_size: Option<ByteSize>,
    /// The pool's maximum size; default unbounded. Only with `pool_allocator`.
    pub maximum_pool_size: Option<ByteSize>,
    /// The devices to configure; default the current device.
    pub devices: Vec<DeviceId>,
    /// Log every allocation and free to a CSV file per device (RMM's memory-event log).
    pub logging: bool,
    /// The log file: device `N` logs to `<stem>.dev<N><ext>` (Python's naming). Required with
    /// `logging`, unless `RMM_LOG_FILE` names one.
    pub log_file_name: Option<PathBuf>,
}

impl ReinitializeOptions {
    /// RMM's defaults: plain device memory on the current device, no pool, no logging.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sub-allocate from a pool.
    #[must_use]
    pub fn pool_allocator(mut self, on: bool) -> Self {
        self.pool_allocator = on;
        self
    }

    /// Use managed memory.
    #[must_use]
    pub fn managed_memory(mut self, on: bool) -> Self {
        self.managed_memory = on;
        self
    }

    /// The pool's initial size (`1073741824`, `"1GiB"`, ...).
    pub fn initial_pool_size(mut self, size: impl IntoByteSize) -> MrResult<Self> {
        self.initial_pool_size = Some(size.into_byte_size()?);
        Ok(self)
    }

    /// The pool's maximum size.
    pub fn maximum_pool_size(mut self, size: impl IntoByteSize) -> MrResult<Self> {
        self.maximum_pool_size = Some(size.into_byte_size()?);
        Ok(self)
    }

    /// The devices to configure.
    #[must_use]
    pub fn devices(mut self, devices: impl IntoIterator<Item = DeviceId>) -> Self {
        self.devices = devices.into_iter().collect();
        self
    }

    /// Log to the file `RMM_LOG_FILE` names, as it is: one file, without the per-device suffix
    /// of [`logging`](Self::logging) (as RMM's Python does). Every configured device's
    /// adaptor opens (and truncates) that same file, so use it for a single device; for
    /// several, name a file with [`logging`](Self::logging) and get one per device.
    #[must_use]
    pub fn logging_from_env(mut self) -> Self {
        self.logging = true;
        self.log_file_name = None;
        self
    }

    /// Log to `file` (per device, see [`ReinitializeOptions::log_file_name`]).
    #[must_use]
    pub fn logging(mut self, file: impl Into<PathBuf>) -> Self {
        self.logging = true;
        self.log_file_name = Some(file.into());
        self
    }

    /// Checks the combination without touching a device: pool sizes only with a pool, sizes in
    /// multiples of 256 and `initial <= maximum`, a log file only with logging (and one with
    /// it), no device twice.
    pub fn validate(&self) -> MrResult<()> {
        let bad = |m: &str| Err(MrError::invalid_argument(m.to_owned()));
        if !self.pool_allocator
            && (self.initial_pool_size.is_some() || self.maximum_pool_size.is_some())
        {
            return bad("initial_pool_size and maximum_pool_size need pool_allocator");
        }
        for size in [self.initial_pool_size, self.maximum_pool_size]
            .into_iter()
            .flatten()
        {
            if size.0 % ALLOCATION_ALIGNMENT != 0 {
                return Err(MrError::invalid_argument(format!(
                    "pool sizes must be multiples of 256 bytes, not {} ({size})",
                    size.0
                )));
            }
        }
        if let (Some(i), Some(m)) = (self.initial_pool_size, self.maximum_pool_size) {
            if i > m {
                return bad("Initial pool size exceeds the maximum pool size!");
            }
        }
        if self.log_file_name.is_some() && !self.logging {
            return bad("log_file_name needs logging");
        }
        if self.logging
            && self.log_file_name.is_none()
            && std::env::var_os(rmm_mr::LOG_FILE_ENV).is_none()
        {
            return bad("logging needs log_file_name (or RMM_LOG_FILE)");
        }
        let mut seen = std::collections::HashSet::new();
        if !self.devices.iter().all(|d| seen.insert(*d)) {
            return bad("a device is listed twice");
        }
        Ok(())
    }
}

/// The log file of `device`: `<stem>.dev<N><.ext>` (Python's `rmm.reinitialize` naming).
#[must_use]
pub fn per_device_log_file(base: &Path, device: DeviceId) -> PathBuf {
    let stem = base
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match base.extension() {
        Some(ext) => format!("{stem}.dev{}.{}", device.0, ext.to_string_lossy()),
        None => format!("{stem}.dev{}", device.0),
    };
    base.with_file_name(name)
}

/// Builds the resource `options` describe for each configured device (with that device
/// current) and installs it as the device's resource; returns the previous resources, in
/// device order. Nothing is installed unless every device's resource was built.
#[doc(alias = "rmm.reinitialize")]
pub fn reinitialize(options: &ReinitializeOptions) -> MrResult<Vec<SharedResource>> {
    options.validate()?;
    let devices = if options.devices.is_empty() {
        vec![rmm_sys::current_device()?]
    } else {
        options.devices.clone()
    };
    let mut built = Vec::with_capacity(devices.len());
    for &device in &devices {
        let _guard = DeviceGuard::new(device)?;
        built.push((device, build(options, device)?));
    }
    Ok(built
        .into_iter()
        .map(|(device, r)| set_per_device_resource(device, r))
        .collect())
}

fn build(options: &ReinitializeOptions, device: DeviceId) -> MrResult<SharedResource> {
    let base: SharedResource = if options.managed_memory {
        Arc::new(ManagedMemoryResource::new())
    } else {
        Arc::new(CudaMemoryResource::new())
    };
    let resource: SharedResource = if options.pool_allocator {
        let initial = match options.initial_pool_size {
            Some(s) => s.0,
            None => {
                let half = rmm_sys::percent_of_free_device_memory(50)?;
                options
                    .maximum_pool_size
                    .map_or(half, |m| align_down(half.min(m.0), ALLOCATION_ALIGNMENT))
            }
        };
        let mut pool = PoolOptions::new(initial);
        pool.maximum_pool_size = options.maximum_pool_size.map(ByteSize::bytes);
        Arc::new(PoolMemoryResource::with_options(base, pool)?)
    } else {
        base
    };
    if !options.logging {
        return Ok(resource);
    }
    let logged = match &options.log_file_name {
        Some(base_name) => {
            LoggingResourceAdaptor::new(resource, per_device_log_file(base_name, device))?
        }
        None => LoggingResourceAdaptor::from_env(resource)?,
    };
    Ok(Arc::new(logged))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_as_numbers_or_strings() {
        let o = ReinitializeOptions::new()
            .pool_allocator(true)
            .initial_pool_size("1GiB")
            .unwrap()
            .maximum_pool_size(4usize << 30)
            .unwrap();
        assert_eq!(o.initial_pool_size, Some(ByteSize(1 << 30)));
        assert_eq!(o.maximum_pool_size, Some(ByteSize(4 << 30)));
        assert!(o.validate().is_ok());
        assert!(ReinitializeOptions::new()
            .initial_pool_size("lots")
            .is_err());
    }

    #[test]
    fn validation_rejects_bad_combinations() {
        let invalid =
            |o: ReinitializeOptions| matches!(o.validate(), Err(MrError::InvalidArgument(_)));
        assert!(invalid(
            ReinitializeOptions::new()
                .initial_pool_size(1usize << 20)
                .unwrap()
        ));
        assert!(invalid(
            ReinitializeOptions::new()
                .pool_allocator(true)
                .initial_pool_size(1000usize)
                .unwrap()
        ));
        assert!(invalid(
            ReinitializeOptions::new()
                .pool_allocator(true)
                .initial_pool_size("2GiB")
                .unwrap()
                .maximum_pool_size("1GiB")
                .unwrap()
        ));
        assert!(invalid(ReinitializeOptions {
            log_file_name: Some("x.csv".into()),
            ..ReinitializeOptions::default()
        }));
        assert!(invalid(
            ReinitializeOptions::new().devices([DeviceId(0), DeviceId(0)])
        ));
        assert!(ReinitializeOptions::new()
            .logging("rmm_log.csv")
            .validate()
            .is_ok());
        assert!(ReinitializeOptions::new()
            .managed_memory(true)
            .validate()
            .is_ok());
    }

    #[test]
    fn log_files_are_per_device() {
        assert_eq!(
            per_device_log_file(Path::new("/tmp/rmm_log.csv"), DeviceId(1)),
            PathBuf::from("/tmp/rmm_log.dev1.csv")
        );
        assert_eq!(
            per_device_log_file(Path::new("log"), DeviceId(0)),
            PathBuf::from("log.dev0")
        );
    }

    #[test]
    fn errors_come_before_any_installation() {
        // Invalid options fail before any device is touched, with or without a GPU.
        let e = reinitialize(
            &ReinitializeOptions::new()
                .maximum_pool_size(1usize << 20)
                .unwrap(),
        );
        assert!(matches!(e, Err(MrError::InvalidArgument(_))), "{e:?}");
        if !rmm_sys::is_driver_present() {
            let e = reinitialize(&ReinitializeOptions::new().pool_allocator(true)).unwrap_err();
            assert!(e.is_no_device(), "{e}");
        }
    }
}
