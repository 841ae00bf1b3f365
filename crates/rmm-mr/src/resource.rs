//! The memory-resource trait.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use rmm_stream::CudaStreamView;
use rmm_sys::{DevicePtr, ALLOCATION_ALIGNMENT};

use crate::diagnostics::Snapshot;
use crate::error::{MrError, MrResult};

/// Where memory from a resource may be accessed (RMM's `device_accessible` and
/// `host_accessible` properties).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResourceProperties {
    /// Kernels may access the memory.
    pub device_accessible: bool,
    /// The host may access the memory.
    pub host_accessible: bool,
}

impl ResourceProperties {
    /// Device memory only.
    pub const DEVICE: Self = Self {
        device_accessible: true,
        host_accessible: false,
    };
    /// Memory accessible from both the host and the device (managed, pinned, system).
    pub const HOST_DEVICE: Self = Self {
        device_accessible: true,
        host_accessible: true,
    };
}

/// A stream-ordered memory resource: one interface, many implementations (RMM's
/// `device_async_resource_ref` concept and its resources).
///
/// # The contract
/// - `allocate(stream, bytes, alignment)` returns memory that may be used on `stream` right
///   away; use on another stream needs an explicit dependency (an event). Every address is at
///   least 256-byte aligned. `allocate(_, 0, _)` succeeds with [`DevicePtr::NULL`] and touches
///   no CUDA state (adaptors forward it, upstreams answer it).
/// - `deallocate(stream, ptr, bytes, alignment)` returns memory; `stream` must be one on which
///   the memory may be reused at once (normally the last stream that used it), and `bytes`
///   and `alignment` must be those of the allocation. Deallocating the null pointer is a no-op.
/// - Unlike RMM, whose `deallocate` is `noexcept` and aborts or silently absorbs misuse,
///   `deallocate` returns a `Result`: a misuse the resource detects (unknown pointer, double
///   free, size mismatch) is [`MrError::InvalidFree`], a driver failure [`MrError::Cuda`].
/// - [`allocate_sync`](Self::allocate_sync) and [`deallocate_sync`](Self::deallocate_sync)
///   use the default stream and really synchronize it, so the memory is ready (or released)
///   when they return.
/// - Out-of-memory is always [`MrError::OutOfMemory`], never another kind.
/// - Resources are thread-safe (`Send + Sync`) and object-safe; a shared handle is a
///   [`SharedResource`] (`Arc<dyn DeviceMemoryResource>`), which is itself a resource.
/// - A resource must be used while the device that was current at its construction is current
///   (containers switch devices for you).
///
/// # Alignment
/// The `alignment` argument is honoured or refused, never ignored:
/// - `0` means the default, 256 bytes; every power of two up to 256 is met (every address is
///   256-aligned).
/// - An alignment that is not a power of two (3, 255, 768, ...) is [`MrError::BadAlloc`] from
///   every resource and adaptor, before anything is allocated.
/// - A power of two above 256 is either honoured (the address is a multiple of it) or refused
///   with [`MrError::BadAlloc`] whose message names the largest alignment the resource honours
///   (`"... (a power of two up to 256)."`). Refused requests allocate nothing, and the
///   statistics, tracking and limiting adaptors do not count them.
/// - `deallocate` must be given the allocation's alignment (an over-aligned allocation is
///   found through it).
///
/// | resource | largest alignment honoured |
/// |---|---|
/// | base resources (CUDA, managed, pinned host, `cuda_async` and its views, system, SAM headroom) and [`CallbackMemoryResource`](crate::CallbackMemoryResource) | 256 |
/// | [`PoolMemoryResource`](crate::PoolMemoryResource), [`ArenaMemoryResource`](crate::ArenaMemoryResource) | [`MAX_OVER_ALIGNMENT`](crate::MAX_OVER_ALIGNMENT) (2 MiB), by taking up to `alignment - 256` bytes more |
/// | [`FixedSizeMemoryResource`](crate::FixedSizeMemoryResource) | 256 |
/// | [`BinningMemoryResource`](crate::BinningMemoryResource) | 256 in its bins; requests above 256 go to its upstream, which honours or refuses them |
/// | [`AlignedResourceAdaptor`](crate::AlignedResourceAdaptor) | the larger of its configured alignment and 2 MiB |
/// | the other adaptors (limiting, logging, statistics, tracking, thread-safe, failure callback, prefetch) | their upstream's |
/// | [`HostMockResource`](crate::testing::HostMockResource) | 2 MiB |
///
/// (RMM's pool, arena and fixed-size resources ignore the alignment argument and its aligned
/// adaptor the per-call one; RMM's base resources refuse alignment 0.) Sub-allocators also
/// check what their upstream returns: a null or misaligned chunk is given back and refused with
/// [`MrError::BadAlloc`] rather than carved into misaligned blocks.
///
/// # Safety
/// The trait is `unsafe` to implement because safe code trusts what `allocate` returns:
/// [`DeviceBuffer`](../rmm_containers/struct.DeviceBuffer.html) and the other containers copy
/// `bytes` bytes into it with no further check. An implementation promises that a non-null
/// pointer returned by `allocate(stream, bytes, alignment)`:
/// - starts a region of at least `bytes` bytes that is valid for reads and writes on the
///   device (or on the host, or both, exactly as [`properties`](Self::properties) says);
/// - is aligned to at least 256 bytes, and to `alignment` when that is larger (or the call
///   failed with a typed error instead);
/// - overlaps no other allocation of this resource (or of an equal one) that has not been
///   deallocated, and no memory the resource or anyone else uses;
/// - stays valid until it is passed to `deallocate`, or until the resource and every clone
///   of it (and every resource that owns it) are dropped, whichever comes first;
/// - may be used on `stream` at once: no work still queued before the allocation touches it.
///
/// A resource may promise no access at all (`properties()` with neither flag: simulated
/// memory whose addresses are bookkeeping only); containers refuse a resource whose memory is
/// not device-accessible, so they never copy into such addresses.
///
/// Adaptors and sub-allocators keep these promises by building only on their upstream's.
/// RMM's C++ concept makes the same promises implicitly; here a resource written by a user says
/// `unsafe impl` and so takes them on explicitly. Wrapping closures needs no `unsafe impl` but an
/// `unsafe` call of [`CallbackMemoryResource::new`](crate::CallbackMemoryResource::new), which
/// carries the same contract.
///
/// ```compile_fail,E0200
/// # use rmm_mr::{DeviceMemoryResource, MrResult};
/// # use rmm_stream::CudaStreamView;
/// # use rmm_sys::DevicePtr;
/// #[derive(Debug)]
/// struct Liar;
/// // Safe code cannot promise valid memory: this does not compile without `unsafe impl`.
/// impl DeviceMemoryResource for Liar {
///     fn allocate(&self, _: CudaStreamView<'_>, _: usize, _: usize) -> MrResult<DevicePtr> {
///         Ok(DevicePtr::from_raw(0x1000))
///     }
///     unsafe fn deallocate(
///         &self, _: CudaStreamView<'_>, _: DevicePtr, _: usize, _: usize,
///     ) -> MrResult<()> {
///         Ok(())
///     }
///     fn is_equal(&self, _: &dyn DeviceMemoryResource) -> bool { false }
///     fn as_any(&self) -> &dyn std::any::Any { self }
/// }
/// ```
#[doc(alias = "rmm::mr::device_memory_resource")]
#[doc(alias = "rmm::device_async_resource_ref")]
#[doc(alias = "cuda::mr::resource")]
pub unsafe trait DeviceMemoryResource: Any + Send + Sync + fmt::Debug {
    /// Allocates `bytes` aligned to `alignment` (0 for the default, 256, or a power of two:
    /// see [Alignment](#alignment)), ordered on `stream`.
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr>;

    /// Returns memory to the resource, ordered on `stream`.
    ///
    /// # Safety
    /// `ptr` was returned by `allocate` on this resource (or one equal to it, see
    /// [`is_equal`](Self::is_equal)) with the same `bytes` and `alignment`, has not been
    /// deallocated since, and no work that uses it is ordered after this point of `stream`.
    /// Resources detect what misuse they can and report it as [`MrError::InvalidFree`]; what
    /// they cannot detect (memory still in use by a kernel) is undefined behaviour.
    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()>;

    /// Allocates on the default stream and synchronizes it.
    fn allocate_sync(&self, bytes: usize, alignment: usize) -> MrResult<DevicePtr> {
        let stream = CudaStreamView::default();
        let ptr = self.allocate(stream, bytes, alignment)?;
        if bytes != 0 {
            if let Err(e) = stream.synchronize() {
                // SAFETY: `ptr` was just allocated here with these arguments and never used.
                let _ = unsafe { self.deallocate(stream, ptr, bytes, alignment) };
                return Err(e.into());
            }
        }
        Ok(ptr)
    }

    /// Deallocates on the default stream and synchronizes it.
    ///
    /// # Safety
    /// As [`deallocate`](Self::deallocate), with the default stream.
    unsafe fn deallocate_sync(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        let stream = CudaStreamView::default();
        // SAFETY: the caller's contract.
        unsafe { self.deallocate(stream, ptr, bytes, alignment)? };
        if !ptr.is_null() {
            stream.synchronize()?;
        }
        Ok(())
    }

    /// Whether memory allocated by `self` may be deallocated by `other` and vice versa (RMM's
    /// `operator==`): copies of one resource are equal; stateless resources of one type are all
    /// equal; separately built stateful resources are not.
    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool;

    /// Where the memory may be accessed.
    fn properties(&self) -> ResourceProperties {
        ResourceProperties::DEVICE
    }

    /// The concrete resource, for [`resource_cast`]. Implementations return `self`; shared
    /// handles return what they point to.
    fn as_any(&self) -> &dyn Any;

    /// The resource's segments (upstream chunks) and their blocks, and a trace of recent
    /// events where a history records one: see [`Snapshot`], which writes PyTorch's format.
    ///
    /// The sub-allocators (pool, VMM pool, arena, binning, fixed-size) answer; adaptors
    /// forward to their upstream; the default is [`MrError::Unsupported`] (a base resource
    /// keeps no blocks). The snapshot is taken under the resource's locks, block by block: it
    /// is consistent for a quiet resource and a close picture of a busy one.
    ///
    /// # Errors
    /// [`MrError::Unsupported`] for resources that keep no blocks.
    #[doc(alias = "torch.cuda.memory._snapshot")]
    fn snapshot(&self) -> MrResult<Snapshot> {
        Err(MrError::Unsupported(format!(
            "memory snapshots (this resource keeps no blocks: {})",
            std::any::type_name_of_val(self)
        )))
    }
}

/// A type-erased, shared, owning handle to a resource (RMM's `any_resource`). Cloning it is
/// cheap and clones compare equal; whatever holds one keeps the resource alive.
pub type SharedResource = Arc<dyn DeviceMemoryResource>;

// SAFETY: forwards every call to the resource it points to, which keeps the contract; the
// `Arc` keeps that resource alive as long as the handle.
unsafe impl<T: DeviceMemoryResource + ?Sized> DeviceMemoryResource for Arc<T> {
    #[inline]
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        (**self).allocate(stream, bytes, alignment)
    }

    #[inline]
    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        // SAFETY: forwarded contract.
        unsafe { (**self).deallocate(stream, ptr, bytes, alignment) }
    }

    fn allocate_sync(&self, bytes: usize, alignment: usize) -> MrResult<DevicePtr> {
        (**self).allocate_sync(bytes, alignment)
    }

    unsafe fn deallocate_sync(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        // SAFETY: forwarded contract.
        unsafe { (**self).deallocate_sync(ptr, bytes, alignment) }
    }

    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        (**self).is_equal(other)
    }

    fn properties(&self) -> ResourceProperties {
        (**self).properties()
    }

    fn as_any(&self) -> &dyn Any {
        (**self).as_any()
    }

    fn snapshot(&self) -> MrResult<Snapshot> {
        (**self).snapshot()
    }
}

impl PartialEq for dyn DeviceMemoryResource {
    fn eq(&self, other: &Self) -> bool {
        self.is_equal(other)
    }
}

/// Wraps a resource in a [`SharedResource`].
pub fn shared<R: DeviceMemoryResource>(resource: R) -> SharedResource {
    Arc::new(resource)
}

/// Recovers the concrete resource behind a (possibly shared, type-erased) resource, or `None`
/// for another type (RMM's `resource_cast`).
///
/// `T` must be the exact type, type parameters included: adaptors and sub-allocators are
/// generic over their upstream, and `PoolMemoryResource` alone means
/// `PoolMemoryResource<SharedResource>`, so a pool built over a concrete upstream is found with
/// `resource_cast::<PoolMemoryResource<CudaMemoryResource>>`. (Rust's `Any` cannot match "a
/// pool over any upstream"; a C++ `dynamic_cast` has the same limit with templates.)
///
/// ```
/// use rmm_mr::{resource_cast, shared, testing::HostMockResource, PoolMemoryResource};
///
/// let erased = shared(PoolMemoryResource::new(HostMockResource::new(), 0).unwrap());
/// assert!(resource_cast::<PoolMemoryResource<HostMockResource>>(&*erased).is_some());
/// assert!(resource_cast::<PoolMemoryResource>(&*erased).is_none());
/// ```
#[doc(alias = "rmm::mr::resource_cast")]
pub fn resource_cast<T: DeviceMemoryResource>(resource: &dyn DeviceMemoryResource) -> Option<&T> {
    resource.as_any().downcast_ref::<T>()
}

/// Checks an alignment for a base resource: 0 (the default) or a power of two no larger than
/// 256, else `bad_alloc` (RMM #2393; see [`crate::util::alignment`]).
#[inline]
pub(crate) fn check_base_alignment(alignment: usize) -> Result<(), MrError> {
    crate::util::alignment::check(alignment, ALLOCATION_ALIGNMENT).map(|_| ())
}

/// Equality for resource types whose instances share state through an `Arc`: equal when
/// `other` is the same type and points to the same state.
pub(crate) fn same_shared_state<T: DeviceMemoryResource, S>(
    other: &dyn DeviceMemoryResource,
    state: &Arc<S>,
    get: impl Fn(&T) -> &Arc<S>,
) -> bool {
    resource_cast::<T>(other).is_some_and(|o| Arc::ptr_eq(get(o), state))
}

/// Writes the methods of an `unsafe impl DeviceMemoryResource` that resources share, so each
/// impl spells out only what it does differently (its `allocate`, and its `deallocate` unless
/// that just forwards). `as_any` (which returns `self`) is always written; the rest is chosen by
/// key, each optional, in this order:
///
/// - `deallocate: forward(path.to.upstream)`: forwards `deallocate` unchanged to
///   `self.path.to.upstream`, which keeps the upstream's contract;
/// - `is_equal: shared(path)`: equal to the same type pointing to the same `Arc` at
///   `self.path` (copies share state); `is_equal: same(field)`: the same type with an equal
///   `field`; `is_equal: same_type`: every instance of the type (stateless resources);
///   `is_equal: identity`: only the object itself (test doubles);
/// - `properties: forward(path.to.upstream)`: the upstream's; `properties: CONST`: the
///   [`ResourceProperties`] constant of that name. Without the key the trait's default
///   (device memory) stays;
/// - `snapshot: forward(path.to.upstream)`: the upstream's snapshot (adaptors). Without the
///   key the trait's default ([`MrError::Unsupported`]) stays.
///
/// The `unsafe impl` line and its `// SAFETY:` comment stay at the call site: the macro writes
/// no `allocate`, so the promise about what `allocate` returns is made there.
macro_rules! resource_tail {
    (
        $(deallocate: forward($($up:ident).+),)?
        $(is_equal: $eq:ident $(($($state:ident).+))?,)?
        $(properties: $props:ident $(($($from:ident).+))?,)?
        $(snapshot: forward($($snap:ident).+),)?
    ) => {
        $(
            #[inline]
            unsafe fn deallocate(
                &self,
                stream: ::rmm_stream::CudaStreamView<'_>,
                ptr: ::rmm_sys::DevicePtr,
                bytes: usize,
                alignment: usize,
            ) -> $crate::MrResult<()> {
                // SAFETY: forwarded contract.
                unsafe { self.$($up).+.deallocate(stream, ptr, bytes, alignment) }
            }
        )?
        $($crate::resource::resource_tail!(@is_equal $eq $(($($state).+))?);)?
        $($crate::resource::resource_tail!(@properties $props $(($($from).+))?);)?
        $(
            fn snapshot(&self) -> $crate::MrResult<$crate::Snapshot> {
                self.$($snap).+.snapshot()
            }
        )?
        fn as_any(&self) -> &dyn ::std::any::Any {
            self
        }
    };
    (@is_equal shared($($state:ident).+)) => {
        fn is_equal(&self, other: &dyn $crate::DeviceMemoryResource) -> bool {
            $crate::resource::same_shared_state::<Self, _>(
                other,
                &self.$($state).+,
                |o| &o.$($state).+,
            )
        }
    };
    (@is_equal same($field:ident)) => {
        fn is_equal(&self, other: &dyn $crate::DeviceMemoryResource) -> bool {
            $crate::resource_cast::<Self>(other).is_some_and(|o| o.$field == self.$field)
        }
    };
    (@is_equal same_type) => {
        fn is_equal(&self, other: &dyn $crate::DeviceMemoryResource) -> bool {
            other.as_any().is::<Self>()
        }
    };
    (@is_equal identity) => {
        fn is_equal(&self, other: &dyn $crate::DeviceMemoryResource) -> bool {
            ::std::ptr::addr_eq(self, other)
        }
    };
    (@properties forward($($up:ident).+)) => {
        fn properties(&self) -> $crate::ResourceProperties {
            self.$($up).+.properties()
        }
    };
    (@properties $name:ident) => {
        fn properties(&self) -> $crate::ResourceProperties {
            $crate::ResourceProperties::$name
        }
    };
}
pub(crate) use resource_tail;
