//! The out-of-memory report and its verdict.

use std::fmt;

use crate::util::format::HumanBytes;

/// Why a request could not be met, as the refusing resource sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Verdict {
    /// Not enough memory: the free bytes (and any room to grow) are smaller than the request.
    #[default]
    Capacity,
    /// Enough bytes are free in total, but no free block (in any stream's list) is large
    /// enough: the free memory is split into pieces.
    Fragmentation,
    /// A configured maximum (a pool's maximum size, a limiting adaptor's limit, an arena's
    /// size, a fixed-size resource's block size) stops the request.
    Limit,
    /// The resource asked its upstream (or the driver) for more memory and was refused.
    UpstreamRefused,
}

impl Verdict {
    /// The verdict for a refused request of `requested` bytes, given the free bytes, the
    /// largest free block, whether a configured maximum stopped growth (`limit_hit`) and
    /// whether the upstream refused (`upstream_refused`).
    ///
    /// Fragmentation wins whenever the free bytes would cover the request but no block does
    /// (the memory is there, in pieces); then a hit limit, then an upstream's refusal; else the
    /// resource is simply full.
    #[must_use]
    pub fn classify(
        requested: usize,
        free: usize,
        largest_free_block: usize,
        limit_hit: bool,
        upstream_refused: bool,
    ) -> Self {
        if free >= requested && largest_free_block < requested && requested > 0 {
            Self::Fragmentation
        } else if limit_hit {
            Self::Limit
        } else if upstream_refused {
            Self::UpstreamRefused
        } else {
            Self::Capacity
        }
    }

    /// The verdict's name as written in reports: `capacity`, `fragmentation`, `limit`,
    /// `upstream refused`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Capacity => "capacity",
            Self::Fragmentation => "fragmentation",
            Self::Limit => "limit",
            Self::UpstreamRefused => "upstream refused",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a resource knew when it refused a request: carried, boxed, by
/// [`MrError::OutOfMemory`](crate::MrError) and read with
/// [`MrError::oom_report`](crate::MrError::oom_report). Built only when a request fails.
///
/// Its `Display` is one line:
///
/// ```text
/// out of memory: requested 40.0 MiB; in use 30.0 MiB of 32.0 MiB reserved (max 64.0 MiB); free 2.0 MiB, largest free block 2.0 MiB; verdict: limit
/// ```
///
/// (`{:#}` leaves out the leading `out of memory: `). Fields a resource cannot know are 0
/// (a driver pool knows no block sizes) and its `free_per_stream` is empty.
///
/// New fields may be added: outside this crate build a report with
/// [`OomReport::new`] and struct update syntax (`..OomReport::new(bytes)`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OomReport {
    /// The resource that refused (`"pool"`, `"arena"`, `"limiting"`, `"cuda"`, ...).
    pub resource: &'static str,
    /// The bytes requested (before any rounding).
    pub requested: usize,
    /// The bytes the resource holds from its upstream (a pool's chunks, an arena's
    /// superblocks); for a base resource the device's total memory.
    pub reserved: usize,
    /// The bytes handed out and not yet freed (rounded sizes where the resource rounds).
    pub in_use: usize,
    /// The bytes reserved but not handed out (for a base resource, the device's free memory).
    pub free: usize,
    /// The largest single free block, in any stream's list.
    pub largest_free_block: usize,
    /// The free bytes in each stream's list, as `(stream handle, bytes)`, for resources that
    /// keep one free list per stream (pool, VMM pool, fixed-size); empty otherwise.
    pub free_per_stream: Vec<(u64, usize)>,
    /// The maximum the resource may reserve, where one is configured (a pool's maximum size,
    /// a limiting adaptor's limit).
    pub limit: Option<usize>,
    /// Why the request failed.
    pub verdict: Verdict,
    /// The device's free memory (`cuMemGetInfo`) where the resource asked the driver
    /// (the CUDA and driver-pool resources); PyTorch's `device_free` of an `oom` event.
    pub device_free: Option<usize>,
}

impl OomReport {
    /// A report of a refused request of `requested` bytes with every other field empty; fill
    /// in the rest with struct update syntax.
    #[must_use]
    pub fn new(requested: usize) -> Self {
        Self {
            requested,
            ..Self::default()
        }
    }

    /// Sets [`verdict`](Self::verdict) from the other fields by [`Verdict::classify`].
    #[must_use]
    pub fn classified(mut self, limit_hit: bool, upstream_refused: bool) -> Self {
        self.verdict = Verdict::classify(
            self.requested,
            self.free,
            self.largest_free_block,
            limit_hit,
            upstream_refused,
        );
        self
    }
}

/// A size for people in a report: [`HumanBytes`] of a `usize`.
#[allow(clippy::cast_possible_truncation)] // usize fits in u64 on every target.
fn human(bytes: usize) -> HumanBytes {
    HumanBytes(bytes as u64)
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !f.alternate() {
            f.write_str("out of memory: ")?;
        }
        if !self.resource.is_empty() {
            write!(f, "{} ", self.resource)?;
        }
        write!(
            f,
            "requested {}; in use {} of {} reserved",
            human(self.requested),
            human(self.in_use),
            human(self.reserved)
        )?;
        if let Some(limit) = self.limit {
            write!(f, " (max {})", human(limit))?;
        }
        write!(
            f,
            "; free {}, largest free block {}",
            human(self.free),
            human(self.largest_free_block)
        )?;
        if self.free_per_stream.len() > 1 {
            f.write_str(" (per stream:")?;
            for (i, (stream, bytes)) in self.free_per_stream.iter().enumerate() {
                let sep = if i == 0 { " " } else { ", " };
                write!(f, "{sep}{stream:#x}: {}", human(*bytes))?;
            }
            f.write_str(")")?;
        }
        if let Some(device_free) = self.device_free {
            write!(f, "; device free {}", human(device_free))?;
        }
        write!(f, "; verdict: {}", self.verdict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn display_is_one_line_with_request_and_use() {
        let r = OomReport {
            resource: "pool",
            reserved: 32 * MIB,
            in_use: 30 * MIB,
            free: 2 * MIB,
            largest_free_block: 2 * MIB,
            limit: Some(64 * MIB),
            ..OomReport::new(40 * MIB)
        }
        .classified(true, false);
        assert_eq!(
            r.to_string(),
            "out of memory: pool requested 40.0 MiB; in use 30.0 MiB of 32.0 MiB reserved \
             (max 64.0 MiB); free 2.0 MiB, largest free block 2.0 MiB; verdict: limit"
        );
        assert!(!format!("{r:#}").starts_with("out of memory"));
    }

    #[test]
    fn per_stream_lists_are_named() {
        let r = OomReport {
            free_per_stream: vec![(0, MIB), (0x10, 3 * MIB)],
            ..OomReport::new(4 * MIB)
        };
        let s = r.to_string();
        assert!(
            s.contains("(per stream: 0x0: 1.0 MiB, 0x10: 3.0 MiB)"),
            "{s}"
        );
    }

    #[test]
    fn verdicts() {
        // Free memory in pieces: fragmentation, even when a limit also stopped growth.
        assert_eq!(
            Verdict::classify(8, 10, 4, true, false),
            Verdict::Fragmentation
        );
        assert_eq!(Verdict::classify(8, 4, 4, true, false), Verdict::Limit);
        assert_eq!(
            Verdict::classify(8, 4, 4, false, true),
            Verdict::UpstreamRefused
        );
        assert_eq!(Verdict::classify(8, 4, 4, false, false), Verdict::Capacity);
        assert_eq!(Verdict::classify(8, 8, 8, false, false), Verdict::Capacity);
    }

    proptest! {
        #[test]
        fn verdict_is_consistent(
            req in 0usize..1 << 40,
            free in 0usize..1 << 40,
            largest_frac in 0u32..=100,
            limit_hit: bool,
            upstream: bool,
        ) {
            let largest = (free as u128 * u128::from(largest_frac) / 100) as usize;
            let v = Verdict::classify(req, free, largest, limit_hit, upstream);
            if v == Verdict::Fragmentation {
                prop_assert!(free >= req && largest < req);
            } else if free >= req && req > 0 {
                prop_assert!(largest >= req);
            }
            if v == Verdict::Limit { prop_assert!(limit_hit); }
            if v == Verdict::UpstreamRefused { prop_assert!(upstream && !limit_hit); }
            if v == Verdict::Capacity { prop_assert!(!limit_hit && !upstream); }
            let r = OomReport { free, largest_free_block: largest, ..OomReport::new(req) }
                .classified(limit_hit, upstream);
            let line = r.to_string();
            prop_assert!(!line.contains('\n'));
            let want = format!("requested {}", human(req));
            prop_assert!(line.contains(&want));
            prop_assert!(line.contains("in use"));
        }
    }
}
