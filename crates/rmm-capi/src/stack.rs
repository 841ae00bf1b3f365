//! A device's resource stack as [`Config`] describes it, from the bottom up: device or managed
//! memory; the pool or the driver's pool; statistics; the CSV log. [`DeviceState`] keeps the
//! top (what allocations go through), handles on the layers it reports on, and the counters
//! the C API keeps itself.
//!
//! The hot path (`allocate`, `deallocate`) is what every PyTorch allocation runs: the common
//! stacks (a pool, statistics over a pool) are held as concrete types, so that no dynamic call
//! sits above the pool and the statistics' counting is inlined, and the device's primary
//! context is made current only if a driver call needs it ([`DeferredPrimaryContext`]): a pool
//! serving from its free memory makes none.

use std::ffi::c_void;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crossbeam_utils::CachePadded;
use rmm::mr::Counter;
use rmm::reinitialize::per_device_log_file;
use rmm::sys::{
    align_down, primary_context, DeferredPrimaryContext, PrimaryContext, PrimaryContextGuard,
};
use rmm::{
    CudaAsyncManagedMemoryResource, CudaAsyncMemoryResource, CudaAsyncOptions, CudaMemoryResource,
    CudaStreamView, DeviceId, DeviceMemoryResource, DevicePtr, LoggingResourceAdaptor,
    ManagedMemoryResource, MrError, MrResult, PoolMemoryResource, PoolOptions, SharedResource,
    StatisticsResourceAdaptor, ALLOCATION_ALIGNMENT,
};

use crate::abi::RmmRsStatistics;
use crate::config::{Config, ResourceKind};
use crate::status::{CResult, Error};

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

/// The top of a stack: what allocations and frees go through.
#[derive(Debug)]
enum Top {
    /// A pool alone.
    Pool(PoolMemoryResource),
    /// Statistics over a pool.
    StatisticsPool(StatisticsResourceAdaptor<PoolMemoryResource>),
    /// Any other stack (the driver's pools, no pool, the log).
    Shared(SharedResource),
}

impl Top {
    #[inline]
    fn allocate(&self, stream: CudaStreamView<'_>, bytes: usize) -> MrResult<DevicePtr> {
        match self {
            Top::Pool(r) => r.allocate(stream, bytes, ALLOCATION_ALIGNMENT),
            Top::StatisticsPool(r) => r.allocate(stream, bytes, ALLOCATION_ALIGNMENT),
            Top::Shared(r) => r.allocate(stream, bytes, ALLOCATION_ALIGNMENT),
        }
    }

    /// # Safety
    /// `DeviceMemoryResource::deallocate`'s contract.
    #[inline]
    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
    ) -> MrResult<()> {
        // SAFETY: the caller's contract.
        unsafe {
            match self {
                Top::Pool(r) => r.deallocate(stream, ptr, bytes, ALLOCATION_ALIGNMENT),
                Top::StatisticsPool(r) => r.deallocate(stream, ptr, bytes, ALLOCATION_ALIGNMENT),
                Top::Shared(r) => r.deallocate(stream, ptr, bytes, ALLOCATION_ALIGNMENT),
            }
        }
    }
}

/// The statistics layer of a stack, kept to read its counters.
#[derive(Debug)]
enum Counted {
    /// Over a pool ([`Top::StatisticsPool`]).
    Pool(StatisticsResourceAdaptor<PoolMemoryResource>),
    /// Over another resource.
    Shared(StatisticsResourceAdaptor),
}

impl Counted {
    /// `(bytes, allocations)` of the top frame.
    fn counters(&self) -> (Counter, Counter) {
        match self {
            Counted::Pool(s) => s.counters(),
            Counted::Shared(s) => s.counters(),
        }
    }

    /// Starts a frame of zero counters; returns the frame below as it stands.
    fn push(&self) -> (Counter, Counter) {
        match self {
            Counted::Pool(s) => s.push_counters(),
            Counted::Shared(s) => s.push_counters(),
        }
    }

    /// Merges the top frame into the one below (nothing when only the base frame is left).
    fn pop(&self) {
        let _ = match self {
            Counted::Pool(s) => s.pop_counters(),
            Counted::Shared(s) => s.pop_counters(),
        };
    }
}

/// A counter read as a frame pushed over `base`: the value and total of both, the peak since
/// the push (the top frame's peak counts from the value at the push).
fn over(base: Counter, top: Counter) -> Counter {
    Counter {
        value: base.value.saturating_add(top.value),
        peak: base.value.saturating_add(top.peak),
        total: base.total.saturating_add(top.total),
    }
}

/// What a peak reset keeps (`rmm_rs_reset_peak_statistics`): reads and resets take its lock,
/// the hot path never does.
#[derive(Debug, Default)]
struct Peaks {
    /// The statistics' frame below the one pushed at the last reset, as it stood then
    /// (`None` before the first reset): the counters reported are the top frame over it.
    base: Option<(Counter, Counter)>,
    /// The most bytes held from the device seen by a read since the last reset.
    held: u64,
    /// Whether a reset happened (the driver's high watermark then no longer counts).
    reset: bool,
}

/// Counters of the C API, on a cache line of their own.
#[derive(Debug, Default)]
struct Counters {
    /// Allocations not yet freed, for stacks whose bottom keeps no record (not a pool); never
    /// below zero: a free finding it at zero is refused.
    outstanding: AtomicU64,
    failed_allocations: AtomicU64,
    /// The failed allocations that were out of memory.
    out_of_memory: AtomicU64,
    failed_frees: AtomicU64,
}

/// A built device: its resource stack and counters.
#[derive(Debug)]
pub(crate) struct DeviceState {
    device: DeviceId,
    /// The top of the stack: every allocation and free goes through it.
    top: Top,
    statistics: Option<Counted>,
    logging: Option<LoggingResourceAdaptor>,
    holder: Holder,
    /// The device's primary context, which the stack's driver calls need current (`None` for
    /// the stacks of tests and benchmarks, which make no context-bound call).
    context: Option<PrimaryContext>,
    counters: CachePadded<Counters>,
    peaks: Mutex<Peaks>,
}

/// Builds `config` for `device` on the GPU, with the device's primary context current.
///
/// # Errors
/// No driver or device, a refused initial chunk (out-of-memory), a log file that cannot be
/// created, a device without memory pools for `_ASYNC`.
pub(crate) fn build_on_device(config: &Config, device: DeviceId) -> MrResult<DeviceState> {
    let _context = PrimaryContextGuard::enter(device)?;
    let context = primary_context(device.0)?;
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
    assemble(config, device, base, holder, Some(context))
}

/// The pool options of `config` with `initial` bytes.
pub(crate) fn pool_options(initial: usize, config: &Config) -> PoolOptions {
    let options = PoolOptions::new(initial);
    match config.maximum_pool_size {
        Some(maximum) => options.maximum_pool_size(maximum),
        None => options,
    }
}

/// Puts statistics and the log over `base` as `config` says; `context`: the device's primary
/// context when the stack makes driver calls.
pub(crate) fn assemble(
    config: &Config,
    device: DeviceId,
    base: SharedResource,
    holder: Holder,
    context: Option<PrimaryContext>,
) -> MrResult<DeviceState> {
    let (top, statistics, logging) = match (&holder, config.statistics, &config.log_file) {
        (Holder::Pool(pool), false, None) => (Top::Pool(pool.clone()), None, None),
        (Holder::Pool(pool), true, None) => {
            let s = StatisticsResourceAdaptor::new(pool.clone());
            (Top::StatisticsPool(s.clone()), Some(Counted::Pool(s)), None)
        }
        _ => {
            let mut resource = base;
            let statistics = if config.statistics {
                let s = StatisticsResourceAdaptor::new(resource);
                resource = Arc::new(s.clone());
                Some(Counted::Shared(s))
            } else {
                None
            };
            let logging = match &config.log_file {
                Some(base_name) => {
                    let l = LoggingResourceAdaptor::new(
                        resource,
                        per_device_log_file(base_name, device),
                    )?;
                    resource = Arc::new(l.clone());
                    Some(l)
                }
                None => None,
            };
            (Top::Shared(resource), statistics, logging)
        }
    };
    Ok(DeviceState {
        device,
        top,
        statistics,
        logging,
        holder,
        context,
        counters: CachePadded::new(Counters::default()),
        peaks: Mutex::new(Peaks::default()),
    })
}

impl DeviceState {
    /// Allocations not yet freed: a pool's own record of what it handed out, else the C API's
    /// count.
    #[must_use]
    pub(crate) fn outstanding(&self) -> u64 {
        match &self.holder {
            Holder::Pool(p) => p.outstanding_allocations() as u64,
            _ => self.counters.outstanding.load(Ordering::Acquire),
        }
    }

    /// Whether the hot path counts allocations outstanding itself (a pool records them
    /// anyway: two atomic read-modify-writes a pair saved).
    #[inline]
    fn counts_outstanding(&self) -> bool {
        !matches!(self.holder, Holder::Pool(_))
    }

    /// Makes the device's primary context current now (for the calls that are not on the hot
    /// path).
    fn enter(&self) -> CResult<Option<PrimaryContextGuard>> {
        match self.context {
            Some(_) => Ok(Some(PrimaryContextGuard::enter(self.device)?)),
            None => Ok(None),
        }
    }

    /// The hot path's context: the device's primary context, made current by the first driver
    /// call that needs it.
    #[inline]
    fn defer_context(&self) -> Option<DeferredPrimaryContext> {
        self.context.map(DeferredPrimaryContext::enter)
    }

    /// Allocates `bytes` (more than 0) on `stream`, 256-byte aligned.
    #[inline]
    pub(crate) fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
    ) -> CResult<*mut c_void> {
        let _context = self.defer_context();
        match self.top.allocate(stream, bytes) {
            Ok(ptr) => {
                if !ptr.is_null() && self.counts_outstanding() {
                    self.counters.outstanding.fetch_add(1, Ordering::AcqRel);
                }
                Ok(ptr.as_host_ptr())
            }
            Err(e) => Err(self.allocation_failed(e)),
        }
    }

    #[cold]
    #[inline(never)]
    fn allocation_failed(&self, e: MrError) -> Error {
        self.counters
            .failed_allocations
            .fetch_add(1, Ordering::Relaxed);
        if e.is_out_of_memory() {
            self.counters.out_of_memory.fetch_add(1, Ordering::Relaxed);
        }
        e.into()
    }

    #[cold]
    #[inline(never)]
    fn free_failed(&self, e: MrError) -> Error {
        self.counters.failed_frees.fetch_add(1, Ordering::Relaxed);
        e.into()
    }

    /// Frees `ptr` (not null) of `bytes` on `stream`.
    ///
    /// # Safety
    /// `ptr` was allocated here with `bytes` and is no longer used by any work not ordered
    /// before `stream`'s next work (the C contract of `rmm_rs_free`).
    #[inline]
    pub(crate) unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: *mut c_void,
        bytes: usize,
    ) -> CResult<()> {
        // Taken from the count before the free: a stack with none outstanding did not hand
        // `ptr` out, whatever the resource below would accept (`cuMemFree` frees any device
        // allocation), and the count never goes below zero (it would wrap, and the
        // configuration would be busy for good).
        let counted = self.counts_outstanding();
        if counted && !self.take_outstanding() {
            return Err(self.uncounted_free(ptr, bytes));
        }
        let _context = self.defer_context();
        // SAFETY: the caller's contract: `ptr` came from this stack with `bytes` and the same
        // alignment, and nothing uses it any more.
        match unsafe {
            self.top
                .deallocate(stream, DevicePtr::from_host_ptr(ptr), bytes)
        } {
            Ok(()) => Ok(()),
            Err(e) => {
                if counted {
                    self.counters.outstanding.fetch_add(1, Ordering::AcqRel);
                }
                Err(self.free_failed(e))
            }
        }
    }

    /// Takes one allocation off the outstanding count; false (nothing changed) at zero.
    #[inline]
    fn take_outstanding(&self) -> bool {
        self.counters
            .outstanding
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }

    /// A free while no allocation is outstanding: refused before it reaches any resource.
    #[cold]
    #[inline(never)]
    fn uncounted_free(&self, ptr: *mut c_void, bytes: usize) -> Error {
        self.free_failed(MrError::InvalidFree {
            ptr: DevicePtr::from_host_ptr(ptr),
            bytes,
            kind: rmm::mr::InvalidFree::UnknownPointer,
        })
    }

    /// Bytes the stack holds from the device (`counted`: the bytes allocated, what the
    /// driver's allocator per call holds), and the driver pool's high watermark of them.
    fn held_bytes(&self, counted: i64) -> (u64, Option<u64>) {
        let read = || -> MrResult<(u64, Option<u64>)> {
            Ok(match &self.holder {
                Holder::Plain => (u64::try_from(counted).unwrap_or(0), None),
                Holder::Pool(p) => (p.pool_size() as u64, None),
                Holder::Driver(r) => {
                    let _context = self.enter().ok();
                    let s = r.statistics()?;
                    (s.reserved_current, Some(s.reserved_high))
                }
                Holder::DriverManaged(r) => {
                    let _context = self.enter().ok();
                    let s = r.statistics()?;
                    (s.reserved_current, Some(s.reserved_high))
                }
            })
        };
        read().unwrap_or((0, None))
    }

    /// The statistics' `(bytes, allocations)` counters, over the frame below the last
    /// reset's.
    fn counted(&self, peaks: &Peaks) -> (Counter, Counter) {
        let top = self
            .statistics
            .as_ref()
            .map(Counted::counters)
            .unwrap_or_default();
        match peaks.base {
            Some((bytes, allocations)) => (over(bytes, top.0), over(allocations, top.1)),
            None => top,
        }
    }

    /// The numbers of `rmm_rs_get_statistics`.
    #[must_use]
    pub(crate) fn statistics(&self) -> RmmRsStatistics {
        let mut peaks = self.peaks.lock().unwrap_or_else(PoisonError::into_inner);
        let (bytes, allocations) = self.counted(&peaks);
        let (held, driver_high) = self.held_bytes(bytes.value);
        peaks.held = peaks.held.max(held);
        let peak_held = match (&self.holder, driver_high) {
            // What the driver's allocator per call holds is what is allocated.
            (Holder::Plain, _) => u64::try_from(bytes.peak).unwrap_or(0),
            (_, Some(high)) if !peaks.reset => peaks.held.max(high),
            // A pool gives nothing back while it is configured: what it holds is its peak.
            _ => peaks.held,
        };
        RmmRsStatistics {
            current_bytes: bytes.value,
            peak_bytes: bytes.peak,
            total_bytes: bytes.total,
            current_allocations: allocations.value,
            peak_allocations: allocations.peak,
            total_allocations: allocations.total,
            outstanding_allocations: self.outstanding(),
            pool_size: held,
            failed_allocations: self.counters.failed_allocations.load(Ordering::Relaxed),
            failed_frees: self.counters.failed_frees.load(Ordering::Relaxed),
            statistics_enabled: i32::from(self.statistics.is_some()),
            device: self.device.0,
            peak_pool_size: peak_held,
            out_of_memory_failures: self.counters.out_of_memory.load(Ordering::Relaxed),
        }
    }

    /// Resets the peaks (bytes, allocations, bytes held) to the current values, as
    /// `torch.cuda.reset_peak_memory_stats`: the statistics' frame of the last reset is merged
    /// down and a fresh one pushed, whose peaks count from now.
    pub(crate) fn reset_peaks(&self) {
        let mut peaks = self.peaks.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(counted) = &self.statistics {
            if peaks.base.is_some() {
                counted.pop();
            }
            peaks.base = Some(counted.push());
        }
        let (bytes, _) = self.counted(&peaks);
        peaks.held = self.held_bytes(bytes.value).0;
        peaks.reset = true;
    }

    /// The snapshot of the stack's top resource (its segments and blocks, and the trace of a
    /// history if one records).
    ///
    /// # Errors
    /// [`MrError::Unsupported`] for a stack whose resources keep no blocks.
    pub(crate) fn snapshot(&self) -> MrResult<rmm::Snapshot> {
        match &self.top {
            Top::Pool(r) => r.snapshot(),
            Top::StatisticsPool(r) => r.snapshot(),
            Top::Shared(r) => r.snapshot(),
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
