//! A device's resource stack as [`Config`] describes it, from the bottom up: device or managed
//! memory; the pool or the driver's pool; statistics; the CSV log. [`DeviceState`] keeps the
//! top (what allocations go through), handles on the layers it reports on, and the counters
//! the C API keeps itself.

use std::ffi::c_void;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use rmm::reinitialize::per_device_log_file;
use rmm::sys::{align_down, PrimaryContextGuard};
use rmm::{
    CudaAsyncManagedMemoryResource, CudaAsyncMemoryResource, CudaAsyncOptions, CudaMemoryResource,
    CudaStreamView, DeviceId, DeviceMemoryResource, DevicePtr, LoggingResourceAdaptor,
    ManagedMemoryResource, MrResult, PoolMemoryResource, PoolOptions, SharedResource,
    StatisticsResourceAdaptor, ALLOCATION_ALIGNMENT,
};

use crate::abi::RmmRsStatistics;
use crate::config::{Config, ResourceKind};
use crate::status::CResult;

/// The layer that holds memory from the device, kept to report its size and to give its
/// memory back when the configuration is replaced.
#[derive(Debug)]
pub(crate) enum Holder {
    /// The driver's allocator per call, or a test resource: holds nothing beyond what is
    /// allocated.
    Plain,
    /// A pool.
    Pool(PoolMemoryResource),
    /// The driver's stream-ordered pool of this resource.
    Driver(CudaAsyncMemoryResource),
    /// The device's default managed pool.
    DriverManaged(CudaAsyncManagedMemoryResource),
}

/// Counters of the C API, on a cache line of their own.
#[derive(Debug, Default)]
struct Counters {
    outstanding: AtomicU64,
    failed_allocations: AtomicU64,
    failed_frees: AtomicU64,
}

/// A built device: its resource stack and counters.
#[derive(Debug)]
pub(crate) struct DeviceState {
    device: DeviceId,
    /// The top of the stack: every allocation and free goes through it.
    resource: SharedResource,
    statistics: Option<StatisticsResourceAdaptor>,
    logging: Option<LoggingResourceAdaptor>,
    holder: Holder,
    /// Whether calls need the device's primary context current (false for test resources of
    /// host memory).
    needs_context: bool,
    counters: CachePadded<Counters>,
}

/// Builds `config` for `device` on the GPU, with the device's primary context current.
///
/// # Errors
/// No driver or device, a refused initial chunk (out-of-memory), a log file that cannot be
/// created, a device without memory pools for `_ASYNC`.
pub(crate) fn build_on_device(config: &Config, device: DeviceId) -> MrResult<DeviceState> {
    let _context = PrimaryContextGuard::enter(device)?;
    let (base, holder): (SharedResource, Holder) = match (config.kind, config.managed) {
        (ResourceKind::Async, false) => {
            let mut options = CudaAsyncOptions::new();
            if let Some(bytes) = config.initial_pool_size {
                options = options.initial_pool_size(bytes);
            }
            let r = CudaAsyncMemoryResource::with_options(options)?;
            (Arc::new(r.clone()), Holder::Driver(r))
        }
        (ResourceKind::Async, true) => {
            let r = CudaAsyncManagedMemoryResource::new()?;
            (Arc::new(r), Holder::DriverManaged(r))
        }
        (kind, managed) => {
            let memory: SharedResource = if managed {
                Arc::new(ManagedMemoryResource::new())
            } else {
                Arc::new(CudaMemoryResource::new())
            };
            if kind == ResourceKind::Pool {
                let initial = match config.initial_pool_size {
                    Some(bytes) => bytes,
                    None => {
                        let half = rmm::percent_of_free_device_memory(50)?;
                        config
                            .maximum_pool_size
                            .map_or(half, |m| align_down(half.min(m), ALLOCATION_ALIGNMENT))
                    }
                };
                let pool = PoolMemoryResource::with_options(memory, pool_options(initial, config))?;
                (Arc::new(pool.clone()), Holder::Pool(pool))
            } else {
                (memory, Holder::Plain)
            }
        }
    };
    assemble(config, device, base, holder, true)
}

/// The pool options of `config` with `initial` bytes.
pub(crate) fn pool_options(initial: usize, config: &Config) -> PoolOptions {
    let options = PoolOptions::new(initial);
    match config.maximum_pool_size {
        Some(maximum) => options.maximum_pool_size(maximum),
        None => options,
    }
}

/// Puts statistics and the log over `base` as `config` says.
pub(crate) fn assemble(
    config: &Config,
    device: DeviceId,
    base: SharedResource,
    holder: Holder,
    needs_context: bool,
) -> MrResult<DeviceState> {
    let mut resource = base;
    let statistics = if config.statistics {
        let s = StatisticsResourceAdaptor::new(resource);
        resource = Arc::new(s.clone());
        Some(s)
    } else {
        None
    };
    let logging = match &config.log_file {
        Some(base_name) => {
            let l = LoggingResourceAdaptor::new(resource, per_device_log_file(base_name, device))?;
            resource = Arc::new(l.clone());
            Some(l)
        }
        None => None,
    };
    Ok(DeviceState {
        device,
        resource,
        statistics,
        logging,
        holder,
        needs_context,
        counters: CachePadded::new(Counters::default()),
    })
}

impl DeviceState {
    /// Allocations not yet freed.
    #[must_use]
    pub(crate) fn outstanding(&self) -> u64 {
        self.counters.outstanding.load(Ordering::Acquire)
    }

    fn enter(&self) -> CResult<Option<PrimaryContextGuard>> {
        if self.needs_context {
            Ok(Some(PrimaryContextGuard::enter(self.device)?))
        } else {
            Ok(None)
        }
    }

    /// Allocates `bytes` (more than 0) on `stream`, 256-byte aligned.
    pub(crate) fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
    ) -> CResult<*mut c_void> {
        let _context = self.enter()?;
        match self.resource.allocate(stream, bytes, ALLOCATION_ALIGNMENT) {
            Ok(ptr) => {
                if !ptr.is_null() {
                    self.counters.outstanding.fetch_add(1, Ordering::AcqRel);
                }
                Ok(ptr.as_host_ptr())
            }
            Err(e) => {
                self.counters
                    .failed_allocations
                    .fetch_add(1, Ordering::Relaxed);
                Err(e.into())
            }
        }
    }

    /// Frees `ptr` (not null) of `bytes` on `stream`.
    ///
    /// # Safety
    /// `ptr` was allocated here with `bytes` and is no longer used by any work not ordered
    /// before `stream`'s next work (the C contract of `rmm_rs_free`).
    pub(crate) unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: *mut c_void,
        bytes: usize,
    ) -> CResult<()> {
        let result = self.enter().and_then(|_context| {
            // SAFETY: the caller's contract: `ptr` came from this stack with `bytes` and the
            // same alignment, and nothing uses it any more.
            unsafe {
                self.resource.deallocate(
                    stream,
                    DevicePtr::from_host_ptr(ptr),
                    bytes,
                    ALLOCATION_ALIGNMENT,
                )
            }
            .map_err(Into::into)
        });
        match result {
            Ok(()) => {
                self.counters.outstanding.fetch_sub(1, Ordering::AcqRel);
                Ok(())
            }
            Err(e) => {
                self.counters.failed_frees.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Bytes the stack holds from the device.
    fn held_bytes(&self, counted: i64) -> u64 {
        let read = || -> MrResult<u64> {
            Ok(match &self.holder {
                Holder::Plain => u64::try_from(counted).unwrap_or(0),
                Holder::Pool(p) => p.pool_size() as u64,
                Holder::Driver(r) => {
                    let _context = self.enter().ok();
                    r.statistics()?.reserved_current
                }
                Holder::DriverManaged(r) => {
                    let _context = self.enter().ok();
                    r.statistics()?.reserved_current
                }
            })
        };
        read().unwrap_or(0)
    }

    /// The numbers of `rmm_rs_get_statistics`.
    #[must_use]
    pub(crate) fn statistics(&self) -> RmmRsStatistics {
        let (bytes, allocations) = self
            .statistics
            .as_ref()
            .map(StatisticsResourceAdaptor::counters)
            .unwrap_or_default();
        RmmRsStatistics {
            current_bytes: bytes.value,
            peak_bytes: bytes.peak,
            total_bytes: bytes.total,
            current_allocations: allocations.value,
            peak_allocations: allocations.peak,
            total_allocations: allocations.total,
            outstanding_allocations: self.outstanding(),
            pool_size: self.held_bytes(bytes.value),
            failed_allocations: self.counters.failed_allocations.load(Ordering::Relaxed),
            failed_frees: self.counters.failed_frees.load(Ordering::Relaxed),
            statistics_enabled: i32::from(self.statistics.is_some()),
            device: self.device.0,
        }
    }

    /// Writes the log's buffered rows out (nothing without a log).
    pub(crate) fn flush_log(&self) -> io::Result<()> {
        self.logging
            .as_ref()
            .map_or(Ok(()), LoggingResourceAdaptor::flush)
    }

    /// What a replaced configuration does: writes its log out and gives the memory it holds
    /// back to the device (it has no allocation outstanding). Failures are logged, not
    /// returned: the replacement goes ahead, and what was not given back stays with this
    /// state, which lives on.
    pub(crate) fn retire(&self) {
        if let Err(e) = self.flush_log() {
            log::error!("rmm-capi: device {}: flushing the log: {e}", self.device);
        }
        let _context = match self.enter() {
            Ok(c) => c,
            Err(e) => {
                log::error!("rmm-capi: device {}: {e}", self.device);
                return;
            }
        };
        let released = match &self.holder {
            Holder::Plain | Holder::DriverManaged(_) => Ok(()),
            Holder::Pool(p) => p.release_unused().map(drop),
            Holder::Driver(r) => r.trim_to(0),
        };
        if let Err(e) = released {
            log::error!(
                "rmm-capi: device {}: giving a replaced pool's memory back: {e}",
                self.device
            );
        }
    }
}
