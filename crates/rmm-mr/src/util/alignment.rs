//! The alignment rule every resource of this crate applies, as pure functions (no CUDA call),
//! and the bookkeeping of over-aligned allocations.
//!
//! The rule (for users: the guide's "Alignment" section and [`DeviceMemoryResource`]):
//!
//! - `0` means the default, 256 bytes ([`ALLOCATION_ALIGNMENT`]); every power of two up to 256
//!   is met by every resource, since every address is 256-aligned.
//! - An alignment that is not a power of two is [`MrError::BadAlloc`], everywhere.
//! - A power of two above 256 is either honoured (the address is a multiple of it) or refused
//!   with [`MrError::BadAlloc`] whose message names the largest alignment the resource
//!   honours (`... (a power of two up to N)`); it is never ignored.
//! - Sub-allocators check what their upstream hands them: a null or misaligned chunk is given
//!   back and refused with [`MrError::BadAlloc`].
//!
//! Sub-allocators honour alignments above 256 by over-allocating: a 256-aligned block of
//! `align_up(bytes, 256) + alignment - 256` bytes always holds an `alignment`-aligned run of
//! `bytes` bytes. [`OverAligned`] remembers which block each such address lies in, so that a
//! free with the same size and alignment finds the real block.
//!
//! [`DeviceMemoryResource`]: crate::DeviceMemoryResource

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use rmm_sys::{checked_align_up, is_pow2, DevicePtr, ALLOCATION_ALIGNMENT};

use crate::error::{InvalidFree, MrError, MrResult};

/// The largest alignment the pool and arena resources honour (by over-allocating up to
/// `alignment - 256` bytes per allocation), and the largest per-call alignment an
/// [`AlignedResourceAdaptor`](crate::AlignedResourceAdaptor) honours beyond the one it was built
/// with: 2 MiB, the GPU's large-page size. Larger alignments are refused with
/// [`MrError::BadAlloc`]; build an aligned adaptor with the alignment you need instead.
pub const MAX_OVER_ALIGNMENT: usize = 1 << 21;

/// `alignment` as a resource applies it: 0 is the default (256), a power of two is raised to at
/// least 256; `None` when it is neither.
#[inline]
#[must_use]
pub(crate) const fn normalized(alignment: usize) -> Option<usize> {
    if alignment == 0 {
        Some(ALLOCATION_ALIGNMENT)
    } else if !is_pow2(alignment) {
        None
    } else if alignment < ALLOCATION_ALIGNMENT {
        Some(ALLOCATION_ALIGNMENT)
    } else {
        Some(alignment)
    }
}

/// Whether `alignment` is 0 or a power of two up to 256: one that [`normalized`] takes to 256,
/// met by every 256-aligned address (a two-comparison test for the hot paths).
#[inline]
#[must_use]
pub(crate) const fn is_default(alignment: usize) -> bool {
    alignment & alignment.wrapping_sub(1) == 0 && alignment <= ALLOCATION_ALIGNMENT
}

/// Checks a requested `alignment` against the `largest` alignment a resource honours and
/// returns the alignment to honour (a power of two, at least 256).
///
/// # Errors
/// [`MrError::BadAlloc`] when `alignment` is neither 0 nor a power of two, or when it is larger
/// than `largest` (the message names `largest`).
#[inline]
pub(crate) fn check(alignment: usize, largest: usize) -> MrResult<usize> {
    match normalized(alignment) {
        Some(a) if a <= largest => Ok(a),
        Some(_) => Err(too_large(alignment, largest)),
        None => Err(not_pow2(alignment)),
    }
}

/// Checks only that `alignment` is 0 or a power of two (for a resource whose upstream decides
/// how large an alignment it honours) and returns it normalized.
///
/// # Errors
/// [`MrError::BadAlloc`] when it is neither.
#[inline]
pub(crate) fn check_valid(alignment: usize) -> MrResult<usize> {
    normalized(alignment).ok_or_else(|| not_pow2(alignment))
}

/// The alignment a free with `alignment` must honour, when that is above 256 and at most
/// `largest` (an allocation that went through [`OverAligned`]); `None` for every other value,
/// whose allocations (if any could exist) took the ordinary path.
#[inline]
#[must_use]
pub(crate) const fn over_aligned(alignment: usize, largest: usize) -> Option<usize> {
    match normalized(alignment) {
        Some(a) if a > ALLOCATION_ALIGNMENT && a <= largest => Some(a),
        _ => None,
    }
}

#[cold]
fn not_pow2(alignment: usize) -> MrError {
    MrError::bad_alloc(format!(
        "Requested alignment ({alignment}) is not a power of two."
    ))
}

#[cold]
fn too_large(alignment: usize, largest: usize) -> MrError {
    MrError::bad_alloc(format!(
        "Requested alignment ({alignment}) is larger than this memory resource supports \
         (a power of two up to {largest})."
    ))
}

/// The largest alignment named by an error of [`check`] (`... up to N)`), if it is one.
#[cfg(test)]
pub(crate) fn largest_named(e: &MrError) -> Option<usize> {
    let MrError::BadAlloc { message, .. } = e else {
        return None;
    };
    let rest = &message[message.find("up to ")? + "up to ".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// How many bytes a 256-aligned block needs to hold an `alignment`-aligned run of `bytes`
/// bytes (`alignment` a power of two of at least 256): `align_up(bytes, 256) + alignment - 256`,
/// a multiple of 256. `None` on overflow.
#[inline]
#[must_use]
pub(crate) const fn over_allocation(bytes: usize, alignment: usize) -> Option<usize> {
    match checked_align_up(bytes, ALLOCATION_ALIGNMENT) {
        Some(rounded) => rounded.checked_add(alignment.saturating_sub(ALLOCATION_ALIGNMENT)),
        None => None,
    }
}

/// The first `alignment`-aligned address of the block `[block, block + size)` from which
/// `bytes` bytes fit in the block; `None` when there is none.
#[inline]
#[must_use]
pub(crate) fn place(block: u64, size: usize, bytes: usize, alignment: usize) -> Option<u64> {
    let start = block.checked_next_multiple_of(u64::try_from(alignment).ok()?)?;
    let end = start.checked_add(u64::try_from(bytes).ok()?)?;
    let block_end = block.checked_add(u64::try_from(size).ok()?)?;
    (end <= block_end).then_some(start)
}

/// Checks a chunk an upstream handed to `who` for a non-empty request: it must be non-null and
/// 256-byte aligned, or every block carved from it would break the alignment promise.
///
/// # Errors
/// [`MrError::BadAlloc`] naming the chunk.
#[inline]
pub(crate) fn check_chunk(chunk: DevicePtr, who: &str) -> MrResult<()> {
    if !chunk.is_null() && chunk.is_aligned(ALLOCATION_ALIGNMENT) {
        Ok(())
    } else {
        Err(misaligned_upstream(chunk, ALLOCATION_ALIGNMENT, who))
    }
}

/// The error for a pointer from an upstream that is not aligned as promised.
#[cold]
pub(crate) fn misaligned_upstream(ptr: DevicePtr, required: usize, who: &str) -> MrError {
    MrError::bad_alloc(format!(
        "{who}: the upstream resource returned {ptr}, which is not {required}-byte aligned; \
         refused"
    ))
}

/// The over-aligned allocations of a sub-allocator: each address handed out for an alignment
/// above 256 -> the start of the block it lies in. Every such allocation has an entry (also
/// when the block happened to be aligned), so a free with another alignment than the
/// allocation's finds nothing here and is reported instead of freeing a wrong block.
#[derive(Debug, Default)]
pub(crate) struct OverAligned {
    blocks: Mutex<HashMap<u64, u64>>,
}

impl OverAligned {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, u64>> {
        // Nothing panics while the lock is held; a poisoned map is still consistent.
        self.blocks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Number of live over-aligned allocations.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Serves `bytes` aligned to `alignment` (a power of two above 256) from
    /// `alloc(size)`, which returns a block of `size` bytes (a multiple of 256) of the
    /// resource; `give_back(block, size)` returns that block when it cannot be used. `who`
    /// names the resource in errors. 0 bytes is the null pointer, without a call.
    ///
    /// # Errors
    /// Out-of-memory when the over-allocation overflows, `alloc`'s error, or
    /// [`MrError::BadAlloc`] when the block cannot hold the aligned run (a misaligned block)
    /// or its address is already handed out (a broken resource).
    pub(crate) fn allocate(
        &self,
        bytes: usize,
        alignment: usize,
        who: &str,
        alloc: impl FnOnce(usize) -> MrResult<DevicePtr>,
        give_back: impl FnOnce(DevicePtr, usize),
    ) -> MrResult<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let size = over_allocation(bytes, alignment).ok_or_else(|| {
            MrError::out_of_memory(
                bytes,
                format!("{who}: {bytes} bytes aligned to {alignment} exceed the address space"),
            )
        })?;
        let block = alloc(size)?;
        let failure = match place(block.addr(), size, bytes, alignment) {
            Some(addr) if !block.is_null() => match self.lock().entry(addr) {
                Entry::Vacant(v) => {
                    v.insert(block.addr());
                    return Ok(DevicePtr::from_raw(addr));
                }
                Entry::Occupied(_) => MrError::bad_alloc(format!(
                    "{who}: {} is already handed out",
                    DevicePtr::from_raw(addr)
                )),
            },
            _ => misaligned_upstream(block, ALLOCATION_ALIGNMENT, who),
        };
        give_back(block, size);
        Err(failure)
    }

    /// Frees the over-aligned allocation at `ptr` of `bytes` bytes, made with `alignment`, by
    /// `free(block, size)` on the block it lies in. Null is a no-op.
    ///
    /// # Errors
    /// [`MrError::InvalidFree`] ([`InvalidFree::UnknownPointer`]) when `ptr` was not handed
    /// out with an alignment above 256; `free`'s error otherwise (the allocation then stays
    /// live), reported for `ptr` and `bytes`.
    pub(crate) fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        free: impl FnOnce(DevicePtr, usize) -> MrResult<()>,
    ) -> MrResult<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let unknown = MrError::InvalidFree {
            ptr,
            bytes,
            kind: InvalidFree::UnknownPointer,
        };
        let Some(size) = over_allocation(bytes, alignment) else {
            return Err(unknown);
        };
        // Removed before the block is freed, so an allocation that gets the block back at once
        // cannot collide with this entry.
        let Some(block) = self.lock().remove(&ptr.addr()) else {
            return Err(unknown);
        };
        free(DevicePtr::from_raw(block), size).map_err(|e| {
            // Not freed: the allocation is still live.
            self.lock().insert(ptr.addr(), block);
            match e {
                MrError::InvalidFree { kind, .. } => MrError::InvalidFree { ptr, bytes, kind },
                other => other,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn is_default_is_normalized_to_256() {
        for a in (0..=4096).chain([usize::MAX, 1 << 40, (1 << 40) + 256]) {
            assert_eq!(
                is_default(a),
                normalized(a) == Some(ALLOCATION_ALIGNMENT),
                "{a}"
            );
        }
    }

    use super::*;
    use proptest::prelude::*;
    use std::cell::{Cell, RefCell};

    #[test]
    fn zero_is_the_default_and_small_powers_are_raised() {
        assert_eq!(normalized(0), Some(256));
        for a in [1, 2, 64, 128, 256] {
            assert_eq!(normalized(a), Some(256), "{a}");
        }
        assert_eq!(normalized(512), Some(512));
        assert_eq!(normalized(1 << 40), Some(1 << 40));
        for a in [3, 255, 257, 768, usize::MAX] {
            assert_eq!(normalized(a), None, "{a}");
        }
    }

    #[test]
    fn check_refuses_non_powers_and_names_the_largest() {
        assert_eq!(check(0, 256).unwrap(), 256);
        assert_eq!(check(64, 256).unwrap(), 256);
        assert_eq!(check(256, 256).unwrap(), 256);
        assert_eq!(check(4096, MAX_OVER_ALIGNMENT).unwrap(), 4096);
        assert_eq!(
            check(MAX_OVER_ALIGNMENT, MAX_OVER_ALIGNMENT).unwrap(),
            MAX_OVER_ALIGNMENT
        );
        let e = check(3, 256).unwrap_err();
        assert!(matches!(e, MrError::BadAlloc { .. }), "{e}");
        assert!(e.to_string().contains("not a power of two"), "{e}");
        assert_eq!(largest_named(&e), None);
        let e = check(512, 256).unwrap_err();
        assert!(matches!(e, MrError::BadAlloc { .. }), "{e}");
        assert_eq!(largest_named(&e), Some(256), "{e}");
        let e = check(1 << 40, MAX_OVER_ALIGNMENT).unwrap_err();
        assert_eq!(largest_named(&e), Some(MAX_OVER_ALIGNMENT), "{e}");
        assert!(!e.is_out_of_memory());
        assert_eq!(check_valid(1 << 40).unwrap(), 1 << 40);
        assert_eq!(check_valid(0).unwrap(), 256);
        assert!(matches!(check_valid(3), Err(MrError::BadAlloc { .. })));
    }

    #[test]
    fn only_valid_alignments_above_256_take_the_over_aligned_free_path() {
        assert_eq!(over_aligned(4096, MAX_OVER_ALIGNMENT), Some(4096));
        for a in [0, 1, 3, 256, 4095, 1 << 22] {
            assert_eq!(over_aligned(a, MAX_OVER_ALIGNMENT), None, "{a}");
        }
    }

    #[test]
    fn over_allocation_and_placement() {
        assert_eq!(over_allocation(1, 4096), Some(4096));
        assert_eq!(over_allocation(4096, 4096), Some(4096 + 3840));
        assert_eq!(over_allocation(0, 512), Some(256));
        assert_eq!(over_allocation(usize::MAX, 512), None);
        assert_eq!(over_allocation(usize::MAX - 300, 1 << 20), None);
        // RMM's mock case: an upstream pointer of 256 aligns up to 4096.
        assert_eq!(place(256, 8192, 4096, 4096), Some(4096));
        assert_eq!(place(4096, 4096, 4096, 4096), Some(4096));
        // Too small a block, a misaligned block, an address-space overflow.
        assert_eq!(place(256, 4096, 4096, 4096), None);
        assert_eq!(place(1, 4096 + 3840, 4096, 4096), None);
        assert_eq!(place(u64::MAX - 255, 256, 1, 512), None);
    }

    #[test]
    fn chunks_must_be_non_null_and_256_aligned() {
        assert!(check_chunk(DevicePtr::from_raw(0x1_0000), "t").is_ok());
        for bad in [0, 0x1_0080, 0x1_0001] {
            let e = check_chunk(DevicePtr::from_raw(bad), "pool").unwrap_err();
            assert!(matches!(e, MrError::BadAlloc { .. }), "{e}");
            assert!(e.to_string().contains("pool"), "{e}");
        }
    }

    /// Allocates through an [`OverAligned`] whose resource returns `block`, checks the placement,
    /// frees, and checks the block and size freed.
    fn over_aligned_round_trip(block: u64, bytes: usize, alignment: usize) {
        let map = OverAligned::default();
        let asked = Cell::new(0);
        let p = map
            .allocate(
                bytes,
                alignment,
                "t",
                |size| {
                    asked.set(size);
                    Ok(DevicePtr::from_raw(block))
                },
                |_, _| panic!("a usable block was given back"),
            )
            .unwrap();
        assert!(p.is_aligned(alignment));
        assert!(p.addr() >= block);
        assert!(p.addr() + bytes as u64 <= block + asked.get() as u64);
        assert_eq!(map.len(), 1);
        let freed = RefCell::new(Vec::new());
        map.deallocate(p, bytes, alignment, |b, s| {
            freed.borrow_mut().push((b.addr(), s));
            Ok(())
        })
        .unwrap();
        assert_eq!(freed.into_inner(), vec![(block, asked.get())]);
        assert_eq!(map.len(), 0);
    }

    #[test]
    fn over_aligned_allocations_find_their_block() {
        over_aligned_round_trip(256, 1, 4096);
        over_aligned_round_trip(4096, 4096, 4096);
        over_aligned_round_trip(0x7f00_0000_0100, 100_000, MAX_OVER_ALIGNMENT);
    }

    #[test]
    fn over_aligned_failures_give_the_block_back_and_leave_no_entry() {
        let map = OverAligned::default();
        let given_back = RefCell::new(Vec::new());
        // A misaligned block.
        let e = map
            .allocate(
                100,
                4096,
                "pool",
                |_| Ok(DevicePtr::from_raw(0x1001)),
                |b, s| given_back.borrow_mut().push((b.addr(), s)),
            )
            .unwrap_err();
        assert!(matches!(e, MrError::BadAlloc { .. }), "{e}");
        assert_eq!(given_back.borrow().as_slice(), &[(0x1001, 4096)]);
        // A null block for a non-empty request.
        assert!(map
            .allocate(100, 4096, "pool", |_| Ok(DevicePtr::NULL), |_, _| {})
            .is_err());
        // The resource's own error passes through.
        let e = map
            .allocate(
                100,
                4096,
                "pool",
                |n| Err(MrError::out_of_memory(n, "full")),
                |_, _| panic!("nothing to give back"),
            )
            .unwrap_err();
        assert!(e.is_out_of_memory());
        // An overflowing request is out of memory without a call.
        let e = map
            .allocate(
                usize::MAX - 10,
                4096,
                "pool",
                |_| panic!("called"),
                |_, _| {},
            )
            .unwrap_err();
        assert!(e.is_out_of_memory());
        // 0 bytes: null, no call.
        assert_eq!(
            map.allocate(0, 4096, "pool", |_| panic!("called"), |_, _| {})
                .unwrap(),
            DevicePtr::NULL
        );
        assert_eq!(map.len(), 0);
    }

    #[test]
    fn duplicate_addresses_are_refused() {
        let map = OverAligned::default();
        let p = map
            .allocate(1, 4096, "t", |_| Ok(DevicePtr::from_raw(256)), |_, _| {})
            .unwrap();
        let given_back = Cell::new(false);
        let e = map
            .allocate(
                1,
                4096,
                "t",
                |_| Ok(DevicePtr::from_raw(512)),
                |b, _| given_back.set(b.addr() == 512),
            )
            .unwrap_err();
        assert!(e.to_string().contains("already handed out"), "{e}");
        assert!(given_back.get());
        // The live entry still frees the right block.
        map.deallocate(p, 1, 4096, |b, _| {
            assert_eq!(b.addr(), 256);
            Ok(())
        })
        .unwrap();
    }

    #[test]
    fn wrong_frees_are_reported_for_the_callers_pointer() {
        let map = OverAligned::default();
        let p = map
            .allocate(
                1000,
                8192,
                "t",
                |_| Ok(DevicePtr::from_raw(0x10_0100)),
                |_, _| {},
            )
            .unwrap();
        // Unknown address, and an allocation freed with another alignment.
        for (ptr, align) in [(0x20_0000, 8192), (p.addr(), 4096)] {
            let r = map.deallocate(DevicePtr::from_raw(ptr), 1000, align, |b, s| {
                if b.addr() == 0x10_0100 && s == 8192 + 768 {
                    Ok(())
                } else {
                    Err(MrError::InvalidFree {
                        ptr: b,
                        bytes: s,
                        kind: InvalidFree::UnknownPointer,
                    })
                }
            });
            assert!(
                matches!(
                    r,
                    Err(MrError::InvalidFree {
                        kind: InvalidFree::UnknownPointer,
                        ..
                    })
                ),
                "{r:?}"
            );
        }
        // The resource refuses the free (a wrong size): reported for `p`, entry kept.
        let e = map
            .deallocate(p, 5000, 8192, |b, s| {
                Err(MrError::InvalidFree {
                    ptr: b,
                    bytes: s,
                    kind: InvalidFree::SizeMismatch { allocated: 8960 },
                })
            })
            .unwrap_err();
        assert_eq!(
            e,
            MrError::InvalidFree {
                ptr: p,
                bytes: 5000,
                kind: InvalidFree::SizeMismatch { allocated: 8960 }
            }
        );
        assert_eq!(map.len(), 1);
        map.deallocate(p, 1000, 8192, |_, _| Ok(())).unwrap();
        assert_eq!(map.len(), 0);
        map.deallocate(DevicePtr::NULL, 1000, 8192, |_, _| panic!("called"))
            .unwrap();
    }

    proptest! {
        /// Any 256-aligned block of the over-allocated size holds an aligned run of `bytes`.
        #[test]
        fn over_allocation_always_fits(
            block_units in 1u64..(1 << 40),
            bytes in 1usize..(1 << 30),
            shift in 8u32..22,
        ) {
            let alignment = 1usize << shift;
            let block = block_units * ALLOCATION_ALIGNMENT as u64;
            let size = over_allocation(bytes, alignment).unwrap();
            prop_assert_eq!(size % ALLOCATION_ALIGNMENT, 0);
            let start = place(block, size, bytes, alignment).unwrap();
            prop_assert!(start >= block);
            prop_assert_eq!(start % alignment as u64, 0);
            prop_assert!(start + bytes as u64 <= block + size as u64);
            // Nothing smaller would always do: the slack is exactly what the worst block needs.
            prop_assert!(start - block <= (alignment - ALLOCATION_ALIGNMENT) as u64);
        }

        /// `check` accepts exactly the powers of two (and 0) up to the limit.
        #[test]
        fn check_matches_the_rule(alignment in any::<usize>(), shift in 8u32..40) {
            let largest = 1usize << shift;
            match check(alignment, largest) {
                Ok(a) => {
                    prop_assert!(alignment == 0 || alignment.is_power_of_two());
                    prop_assert!(a.is_power_of_two() && a >= 256 && a <= largest);
                    prop_assert!(a >= alignment);
                }
                Err(e) => {
                    let is_bad_alloc = matches!(e, MrError::BadAlloc { .. });
                    prop_assert!(is_bad_alloc);
                    prop_assert!(
                        !alignment.is_power_of_two() && alignment != 0 || alignment > largest
                    );
                    if alignment.is_power_of_two() {
                        prop_assert_eq!(largest_named(&e), Some(largest));
                    }
                }
            }
        }
    }
}
