//! The options of [`VmmPoolMemoryResource`](crate::VmmPoolMemoryResource), and the pure rules
//! that turn them into the pool's geometry.

use rmm_sys::align::checked_align_up;
use rmm_sys::{AllocationHandleType, DeviceId};

/// How to build a [`VmmPoolMemoryResource`](crate::VmmPoolMemoryResource).
///
/// Built with [`new`](Self::new) (the maximum pool size is required: the pool reserves that
/// much address space up front) and the chained setters; the fields are public to read.
/// `#[non_exhaustive]`: later options do not break callers.
///
/// ```
/// use rmm_mr::VmmPoolOptions;
/// use rmm_sys::{AllocationHandleType, DeviceId};
///
/// let options = VmmPoolOptions::new(64 << 30)
///     .initial_pool_size(256 << 20)
///     .granularity(32 << 20)
///     .peer_access([DeviceId(1)])
///     .export_handle_type(AllocationHandleType::PosixFileDescriptor);
/// assert_eq!((options.maximum_pool_size, options.initial_pool_size), (64 << 30, 256 << 20));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct VmmPoolOptions {
    /// The size of the reserved address range and the most the pool maps, rounded down to the
    /// granularity. Required.
    pub maximum_pool_size: usize,
    /// Bytes mapped at construction, rounded up to the granularity (default 0: nothing until
    /// the first allocation).
    pub initial_pool_size: usize,
    /// The pool maps physical memory in chunks whose sizes are multiples of this; `None` (the
    /// default): the device's recommended granularity (`cuMemGetAllocationGranularity`, 2 MiB
    /// on current GPUs). It must be a multiple of the device's minimum granularity. A larger
    /// value means fewer, larger chunks (fewer driver calls as the pool grows) and coarser
    /// growth and release.
    pub granularity: Option<usize>,
    /// Other devices granted read and write access to the pool's memory (peer access), beside
    /// the device the pool was built on (default: none). The driver refuses a device that
    /// cannot reach it when memory is first mapped.
    pub peer_access: Vec<DeviceId>,
    /// Physical memory exportable for IPC as this handle type (default `None`: not
    /// exportable). [`AllocationHandleType::PosixFileDescriptor`] is supported where the device
    /// supports it; see [`export_chunks`](crate::VmmPoolMemoryResource::export_chunks).
    pub export_handle_type: Option<AllocationHandleType>,
    /// Each growth maps at least this percentage of what is mapped already (rounded down to the
    /// granularity; default [`DEFAULT_MIN_GROWTH_PERCENT`], 100: the pool's rule, each growth at
    /// least doubles what is mapped), when the range has room for it, so that a pool used from
    /// many streams keeps free memory in each stream's list instead of taking blocks from the
    /// other streams (an event record and a wait each) at nearly every miss. A growth made because another stream's fitting
    /// block waits on an event maps only what the request lacks, whatever this says. Lower
    /// values trade time at many threads for memory: 12 held 1.1-1.5x the live bytes on the
    /// GPU benchmark's traces against 2.0x with the default, and cost up to 1.5x the pool's
    /// time at 16 threads (`docs/perf-log/2026-11-26-vmm-default-growth.md`). 12 is the
    /// setting recommended for memory efficiency: replaying real PyTorch snapshots it reserved
    /// a median 1.09x the peak in use, against 1.81x with the default (`docs/performance.md`,
    /// "Issue 32, target 1"). 0: map only what the request lacks (a growth per granule the
    /// workload grows by). Values above 100 count as 100.
    pub min_growth_percent: usize,
}

/// The default of [`VmmPoolOptions::min_growth_percent`]: each growth maps at least as much as
/// is mapped already (the pool doubles, as RMM's pool does without a maximum).
pub const DEFAULT_MIN_GROWTH_PERCENT: usize = 100;

impl VmmPoolOptions {
    /// The defaults for a pool of at most `maximum_pool_size` bytes: nothing mapped up front,
    /// the recommended granularity, no peers, no export, growth by at least what is mapped (doubling).
    #[must_use]
    pub fn new(maximum_pool_size: usize) -> Self {
        Self {
            maximum_pool_size,
            initial_pool_size: 0,
            granularity: None,
            peer_access: Vec::new(),
            export_handle_type: None,
            min_growth_percent: DEFAULT_MIN_GROWTH_PERCENT,
        }
    }

    /// Sets the field `maximum_pool_size`.
    #[must_use]
    pub fn maximum_pool_size(mut self, bytes: usize) -> Self {
        self.maximum_pool_size = bytes;
        self
    }

    /// Sets the field `initial_pool_size`.
    #[must_use]
    pub fn initial_pool_size(mut self, bytes: usize) -> Self {
        self.initial_pool_size = bytes;
        self
    }

    /// Sets the field `granularity` to `Some(bytes)`.
    #[must_use]
    pub fn granularity(mut self, bytes: usize) -> Self {
        self.granularity = Some(bytes);
        self
    }

    /// Sets the field `peer_access`.
    #[must_use]
    pub fn peer_access(mut self, devices: impl IntoIterator<Item = DeviceId>) -> Self {
        self.peer_access = devices.into_iter().collect();
        self
    }

    /// Sets the field `export_handle_type` to `Some(handle_type)`.
    #[must_use]
    pub fn export_handle_type(mut self, handle_type: AllocationHandleType) -> Self {
        self.export_handle_type = Some(handle_type);
        self
    }

    /// Sets the field `min_growth_percent`.
    #[must_use]
    pub fn min_growth_percent(mut self, percent: usize) -> Self {
        self.min_growth_percent = percent;
        self
    }
}

/// The sizes a pool is built with, from its options and the device's granularities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// The chunk granularity.
    pub(crate) granularity: usize,
    /// The reserved range and the most the pool maps: the maximum rounded down to the
    /// granularity.
    pub(crate) capacity: usize,
    /// Mapped at construction: the initial size rounded up to the granularity.
    pub(crate) initial: usize,
}

impl Geometry {
    /// Checks and rounds: the granularity is `options.granularity` or `recommended`, a positive
    /// multiple of `minimum` (itself a positive multiple of 256); the maximum is rounded down
    /// and the initial size up to it, and must then be positive and no larger than the maximum.
    /// The error says what is wrong (an invalid argument).
    pub(crate) fn new(
        maximum: usize,
        initial: usize,
        granularity: Option<usize>,
        recommended: usize,
        minimum: usize,
    ) -> Result<Self, String> {
        if minimum == 0 || minimum % 256 != 0 {
            return Err(format!(
                "the device's minimum granularity ({minimum} bytes) is not a multiple of 256"
            ));
        }
        let granularity = granularity.unwrap_or(recommended);
        if granularity == 0 || granularity % minimum != 0 {
            return Err(format!(
                "granularity {granularity} is not a positive multiple of the device's minimum \
                 granularity ({minimum} bytes)"
            ));
        }
        let capacity = maximum - maximum % granularity;
        if capacity == 0 {
            return Err(format!(
                "maximum pool size {maximum} is smaller than the granularity ({granularity} bytes)"
            ));
        }
        let initial = checked_align_up(initial, granularity)
            .filter(|&i| i <= capacity)
            .ok_or_else(|| {
                format!(
                    "Initial pool size exceeds the maximum pool size! ({initial} bytes rounded up \
                     to the granularity of {granularity}, maximum {capacity})"
                )
            })?;
        Ok(Self {
            granularity,
            capacity,
            initial,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn sizes_are_rounded_to_the_granularity() {
        let g = Geometry::new(65 * MIB, MIB, None, 2 * MIB, 2 * MIB).unwrap();
        assert_eq!(
            g,
            Geometry {
                granularity: 2 * MIB,
                capacity: 64 * MIB,
                initial: 2 * MIB
            }
        );
        let g = Geometry::new(64 * MIB, 0, Some(8 * MIB), 2 * MIB, 2 * MIB).unwrap();
        assert_eq!(
            (g.granularity, g.capacity, g.initial),
            (8 * MIB, 64 * MIB, 0)
        );
        let g = Geometry::new(64 * MIB, 64 * MIB, None, 2 * MIB, 2 * MIB).unwrap();
        assert_eq!(g.initial, 64 * MIB);
    }

    #[test]
    fn bad_options_are_refused_with_a_reason() {
        let e = |r: Result<Geometry, String>| r.unwrap_err();
        assert!(
            e(Geometry::new(64 * MIB, 0, Some(3 * MIB), 2 * MIB, 2 * MIB))
                .contains("granularity 3145728")
        );
        assert!(
            e(Geometry::new(64 * MIB, 0, Some(0), 2 * MIB, 2 * MIB)).contains("positive multiple")
        );
        assert!(e(Geometry::new(MIB, 0, None, 2 * MIB, 2 * MIB))
            .contains("smaller than the granularity"));
        assert!(e(Geometry::new(64 * MIB, 65 * MIB, None, 2 * MIB, 2 * MIB))
            .contains("exceeds the maximum"));
        assert!(
            e(Geometry::new(64 * MIB, usize::MAX, None, 2 * MIB, 2 * MIB))
                .contains("exceeds the maximum")
        );
        assert!(e(Geometry::new(64 * MIB, 0, None, 2 * MIB, 100)).contains("multiple of 256"));
    }
}
