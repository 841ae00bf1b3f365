//! The alignment rows of the conformance suite: the rule of `DeviceMemoryResource`'s
//! "Alignment" section, checked on any resource. Shared by the GPU trials (through
//! `conformance`) and the CPU test `tests/alignment.rs` (over host memory), so both apply the
//! same checks.

#![allow(dead_code, unreachable_pub, missing_docs)]

use rmm_mr::{DeviceMemoryResource, MrError};
use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

/// Alignments that are not powers of two (0 is the default, not one of them).
pub const NOT_POW2: [usize; 5] = [3, 255, 257, 768, usize::MAX];

/// Powers of two above 256, increasing: each is honoured or refused.
pub const LARGE: [usize; 8] = [
    512,
    4096,
    1 << 16,
    1 << 20,
    1 << 21,
    1 << 22,
    1 << 40,
    1 << 63,
];

/// Where the checks allocate: the synchronous API, or a stream.
#[derive(Clone, Copy)]
pub enum How<'s> {
    Sync,
    Stream(CudaStreamView<'s>),
}

pub fn allocate(
    mr: &dyn DeviceMemoryResource,
    how: How<'_>,
    bytes: usize,
    alignment: usize,
) -> Result<DevicePtr, MrError> {
    match how {
        How::Sync => mr.allocate_sync(bytes, alignment),
        How::Stream(s) => mr.allocate(s, bytes, alignment),
    }
}

pub fn free(
    mr: &dyn DeviceMemoryResource,
    how: How<'_>,
    p: DevicePtr,
    bytes: usize,
    alignment: usize,
) -> Result<(), String> {
    // SAFETY: every caller frees what it allocated from `mr` with these arguments, unused.
    let r = unsafe {
        match how {
            How::Sync => mr.deallocate_sync(p, bytes, alignment),
            How::Stream(s) => mr.deallocate(s, p, bytes, alignment),
        }
    };
    r.map_err(|e| format!("freeing {p} ({bytes} B, alignment {alignment}): {e}"))
}

/// The largest alignment a refusal names (`"... (a power of two up to N)."`).
pub fn largest_named(e: &MrError) -> Option<usize> {
    let MrError::BadAlloc { message, .. } = e else {
        return None;
    };
    let rest = &message[message.find("up to ")? + "up to ".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn ensure(cond: bool, msg: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(msg())
    }
}

/// Two live allocations of `bytes` with `alignment`: non-null, aligned, disjoint; then freed.
fn honoured_pair(
    mr: &dyn DeviceMemoryResource,
    how: How<'_>,
    bytes: usize,
    alignment: usize,
    first: DevicePtr,
) -> Result<(), String> {
    let check = |p: DevicePtr| {
        ensure(!p.is_null() && p.is_aligned(alignment.max(256)), || {
            format!("alignment {alignment}: {p} is not {alignment}-aligned")
        })
    };
    let second = match allocate(mr, how, bytes, alignment) {
        Ok(p) => p,
        Err(e) => {
            free(mr, how, first, bytes, alignment)?;
            return Err(format!(
                "alignment {alignment}: the first allocation was honoured, the second failed: {e}"
            ));
        }
    };
    let result = check(first).and_then(|()| check(second)).and_then(|()| {
        let (a, b) = (first.addr(), second.addr());
        let len = bytes as u64;
        ensure(a + len <= b || b + len <= a, || {
            format!("alignment {alignment}: live allocations {first} and {second} overlap")
        })
    });
    free(mr, how, second, bytes, alignment)?;
    free(mr, how, first, bytes, alignment)?;
    result
}

/// `alignment_zero_is_default`: 0 means 256, for allocation and free alike.
pub fn zero_is_default(mr: &dyn DeviceMemoryResource, how: How<'_>) -> Result<(), String> {
    let p = allocate(mr, how, 0, 0).map_err(|e| format!("0 bytes, alignment 0: {e}"))?;
    ensure(p.is_null(), || {
        format!("0 bytes, alignment 0: {p}, not null")
    })?;
    for bytes in [1, 1000, 5000] {
        let p = allocate(mr, how, bytes, 0)
            .map_err(|e| format!("{bytes} B with alignment 0 (the default) failed: {e}"))?;
        let ok = !p.is_null() && p.is_aligned(256);
        // Freed with 0, or with the 256 it stands for.
        free(mr, how, p, bytes, if bytes == 1000 { 256 } else { 0 })?;
        ensure(ok, || {
            format!("{bytes} B with alignment 0: {p} is not a 256-aligned pointer")
        })?;
    }
    Ok(())
}

/// `alignment_not_pow2_is_error`: every alignment that is not a power of two is
/// `MrError::BadAlloc` (not out-of-memory), also for 0 bytes, and the resource still works.
pub fn not_pow2_is_error(mr: &dyn DeviceMemoryResource, how: How<'_>) -> Result<(), String> {
    for alignment in NOT_POW2 {
        for bytes in [0, 1000] {
            match allocate(mr, how, bytes, alignment) {
                Err(MrError::BadAlloc { .. }) => {}
                Ok(p) => {
                    if !p.is_null() {
                        // Best effort: give it back with the alignment the caller asked for.
                        let _ = free(mr, how, p, bytes, alignment);
                    }
                    return Err(format!(
                        "{bytes} B with alignment {alignment} was accepted ({p})"
                    ));
                }
                Err(e) => {
                    return Err(format!(
                        "{bytes} B with alignment {alignment}: {e:?}, not BadAlloc"
                    ))
                }
            }
        }
    }
    let p = allocate(mr, how, 1000, 256).map_err(|e| format!("after the refusals: {e}"))?;
    free(mr, how, p, 1000, 256)
}

/// `alignment_large_honoured_or_refused`: each power of two above 256 is honoured (two live
/// allocations aligned to it, disjoint, freed with the same size and alignment) or refused with
/// `MrError::BadAlloc` naming the largest alignment honoured, N; every alignment up to N is
/// honoured and every larger one refused naming the same N. Returns N (or `None` when all of
/// [`LARGE`] were honoured, which no resource of this crate does).
pub fn large_honoured_or_refused(
    mr: &dyn DeviceMemoryResource,
    how: How<'_>,
    bytes: usize,
) -> Result<Option<usize>, String> {
    let mut largest: Option<usize> = None;
    for alignment in LARGE {
        match allocate(mr, how, bytes, alignment) {
            Ok(p) => {
                honoured_pair(mr, how, bytes, alignment, p)?;
                if let Some(n) = largest {
                    return Err(format!(
                        "alignment {alignment} was honoured after a refusal naming {n} as the \
                         largest"
                    ));
                }
                let z = allocate(mr, how, 0, alignment)
                    .map_err(|e| format!("0 B with alignment {alignment}: {e}"))?;
                ensure(z.is_null(), || {
                    format!("0 B with alignment {alignment}: {z}")
                })?;
            }
            Err(e) => {
                let n = largest_named(&e).ok_or_else(|| {
                    format!(
                        "alignment {alignment} refused with {e:?}: not BadAlloc naming the \
                         largest alignment"
                    )
                })?;
                ensure(n.is_power_of_two() && n >= 256 && n < alignment, || {
                    format!("alignment {alignment} refused naming {n} as the largest: {e}")
                })?;
                ensure(largest.is_none_or(|l| l == n), || {
                    format!("refusals name different largest alignments: {largest:?} and {n}")
                })?;
                largest = Some(n);
                match allocate(mr, how, 0, alignment) {
                    Err(MrError::BadAlloc { .. }) => {}
                    other => {
                        return Err(format!(
                            "0 B with refused alignment {alignment}: {other:?}, not BadAlloc"
                        ))
                    }
                }
            }
        }
    }
    if let Some(n) = largest {
        // The named limit is true: exactly N is honoured.
        let p = allocate(mr, how, bytes, n)
            .map_err(|e| format!("the largest alignment named, {n}, was refused: {e}"))?;
        honoured_pair(mr, how, bytes, n, p)?;
    }
    Ok(largest)
}
