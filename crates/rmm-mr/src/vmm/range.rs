//! The VMM pool's map of its reserved address range: which parts are mapped (one chunk per
//! physical allocation), where the mapped memory ends, and where the next chunk goes.
//!
//! Growth appends at the end, so the pool stays one contiguous range: the chunk is sized so
//! that, with the free block already at the end (`tail`), the request fits. Releasing a chunk
//! that is not the last one leaves a hole; growth fills holes only when the end has no room for
//! the request (the core asks again until the request fits or nothing is left to map).
//!
//! Pure bookkeeping: offsets from the start of the range, no CUDA call.

use std::collections::BTreeMap;
use std::fmt;

use rmm_sys::align::checked_align_up;

/// Where a new chunk goes: `size` bytes at `offset` from the start of the range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    /// Offset of the chunk in the range (a multiple of the granularity).
    pub(crate) offset: usize,
    /// Its size (a multiple of the granularity).
    pub(crate) size: usize,
}

/// Why a range cannot be built, or a chunk cannot be placed, added or removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RangeError {
    /// The granularity is 0, or the capacity not a positive multiple of it.
    BadGeometry {
        /// The capacity asked for.
        capacity: usize,
        /// The granularity asked for.
        granularity: usize,
    },
    /// No chunk can make room for the request: the end of the range is too close and no hole
    /// is left to fill.
    NoRoom {
        /// The request, in bytes.
        request: usize,
        /// The free bytes at the end of the mapped memory that would have merged with it.
        tail: usize,
        /// Bytes mapped now.
        mapped: usize,
        /// The size of the range.
        capacity: usize,
    },
    /// A chunk that is misaligned, outside the range, or overlaps a mapped one.
    BadChunk(Placement),
    /// No mapped chunk starts at this offset with this size.
    UnknownChunk(Placement),
}

impl fmt::Display for RangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadGeometry {
                capacity,
                granularity,
            } => write!(
                f,
                "a range of {capacity} bytes cannot be mapped in chunks of {granularity} bytes"
            ),
            Self::NoRoom {
                request,
                tail,
                mapped,
                capacity,
            } => write!(
                f,
                "Not enough room to grow, current/max/request size = {mapped}/{capacity}/{request} \
                 bytes ({tail} free at the end)"
            ),
            Self::BadChunk(p) => write!(
                f,
                "a chunk of {} bytes at offset {} is misaligned, outside the range or overlaps \
                 a mapped one",
                p.size, p.offset
            ),
            Self::UnknownChunk(p) => write!(
                f,
                "no chunk of {} bytes is mapped at offset {}",
                p.size, p.offset
            ),
        }
    }
}

impl std::error::Error for RangeError {}

/// The mapped parts of a reserved range of `capacity` bytes, in chunks whose offsets and sizes
/// are multiples of `granularity`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MappedRange {
    capacity: usize,
    granularity: usize,
    /// Chunks by offset.
    chunks: BTreeMap<usize, usize>,
    /// Sum of the chunk sizes.
    mapped: usize,
    /// A chunk at the end is at least this percentage of `mapped` (rounded down to the
    /// granularity), when it fits.
    min_growth_percent: usize,
}

impl MappedRange {
    /// A range of `capacity` bytes with nothing mapped.
    pub(crate) fn new(capacity: usize, granularity: usize) -> Result<Self, RangeError> {
        if granularity == 0 || capacity == 0 || capacity % granularity != 0 {
            return Err(RangeError::BadGeometry {
                capacity,
                granularity,
            });
        }
        Ok(Self {
            capacity,
            granularity,
            chunks: BTreeMap::new(),
            mapped: 0,
            min_growth_percent: 0,
        })
    }

    /// The size of the range.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes mapped.
    pub(crate) fn mapped(&self) -> usize {
        self.mapped
    }

    /// Number of chunks.
    pub(crate) fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// The offset one past the last mapped byte (0 when nothing is mapped).
    pub(crate) fn end(&self) -> usize {
        self.chunks.last_key_value().map_or(0, |(&o, &s)| o + s)
    }

    /// The unmapped gaps below [`end`](Self::end), `(offset, size)`, lowest first.
    pub(crate) fn holes(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let mut at = 0;
        self.chunks.iter().filter_map(move |(&offset, &size)| {
            let hole = (offset > at).then(|| (at, offset - at));
            at = offset + size;
            hole
        })
    }

    /// The chunks, `(offset, size)`, by offset.
    pub(crate) fn chunks(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.chunks.iter().map(|(&o, &s)| (o, s))
    }

    /// Makes a chunk placed at the end at least `percent` % (at most 100) of the bytes mapped
    /// then, rounded down to the granularity, where the range has room for it (0, the default:
    /// just what the request lacks).
    pub(crate) fn set_min_growth_percent(&mut self, percent: usize) {
        self.min_growth_percent = percent.min(100);
    }

    /// Where to map for a request of `request` bytes when the free block ending at
    /// [`end`](Self::end) has `tail` bytes (0 if there is none): at the end, just enough for the
    /// tail and the new chunk to hold the request (at least one granule), or the minimum growth
    /// ([`set_min_growth_percent`](Self::set_min_growth_percent)) if that is more and fits;
    /// else, when the end has no room for the request, the lowest hole, whole; else
    /// [`RangeError::NoRoom`].
    pub(crate) fn place(&self, request: usize, tail: usize) -> Result<Placement, RangeError> {
        self.place_growing(request, tail, self.min_growth_percent)
    }

    /// [`place`](Self::place) without the minimum growth: a chunk at the end is just what the
    /// request lacks beyond the tail, rounded up to the granularity (growth under pressure,
    /// when free memory that fits waits on another stream's event).
    pub(crate) fn place_exact(&self, request: usize, tail: usize) -> Result<Placement, RangeError> {
        self.place_growing(request, tail, 0)
    }

    /// [`place`](Self::place) with a minimum growth of `min_growth_percent` (at most 100).
    fn place_growing(
        &self,
        request: usize,
        tail: usize,
        min_growth_percent: usize,
    ) -> Result<Placement, RangeError> {
        let no_room = || RangeError::NoRoom {
            request,
            tail,
            mapped: self.mapped,
            capacity: self.capacity,
        };
        if request > self.capacity {
            return Err(no_room());
        }
        let end = self.end();
        let tail = tail.min(end);
        let need = request.saturating_sub(tail).max(1);
        let size = checked_align_up(need, self.granularity).ok_or_else(no_room)?;
        let room = self.capacity - end;
        if size <= room {
            let g = self.granularity;
            // At most `mapped`, which is a usize (the percentage is at most 100).
            let least = (self.mapped as u128 * min_growth_percent.min(100) as u128 / 100) as usize;
            let least = least / g * g;
            return Ok(Placement {
                offset: end,
                size: size.max(least.min(room / g * g)),
            });
        }
        self.holes()
            .next()
            .map(|(offset, size)| Placement { offset, size })
            .ok_or_else(no_room)
    }

    /// Records `p` as mapped. On error nothing changes.
    pub(crate) fn insert(&mut self, p: Placement) -> Result<(), RangeError> {
        let g = self.granularity;
        let fits = p.size > 0
            && p.offset % g == 0
            && p.size % g == 0
            && p.offset
                .checked_add(p.size)
                .is_some_and(|end| end <= self.capacity);
        let before_ok = self
            .chunks
            .range(..=p.offset)
            .next_back()
            .is_none_or(|(&o, &s)| o + s <= p.offset);
        let after_ok = self
            .chunks
            .range(p.offset..)
            .next()
            .is_none_or(|(&o, _)| p.offset + p.size <= o);
        if !(fits && before_ok && after_ok) {
            return Err(RangeError::BadChunk(p));
        }
        self.chunks.insert(p.offset, p.size);
        self.mapped += p.size;
        Ok(())
    }

    /// Forgets the chunk `p` (exactly one mapped chunk). On error nothing changes.
    pub(crate) fn remove(&mut self, p: Placement) -> Result<(), RangeError> {
        if self.chunks.get(&p.offset) != Some(&p.size) {
            return Err(RangeError::UnknownChunk(p));
        }
        self.chunks.remove(&p.offset);
        self.mapped -= p.size;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const G: usize = 2 << 20;
    const MIB: usize = 1 << 20;

    fn at(offset: usize, size: usize) -> Placement {
        Placement { offset, size }
    }

    #[test]
    fn geometry_is_checked() {
        assert!(MappedRange::new(64 * MIB, 0).is_err());
        assert!(MappedRange::new(0, G).is_err());
        assert!(MappedRange::new(3 * MIB, G).is_err());
        let r = MappedRange::new(64 * MIB, G).unwrap();
        assert_eq!(
            (r.capacity(), r.mapped(), r.end(), r.chunk_count()),
            (64 * MIB, 0, 0, 0)
        );
        assert!(RangeError::BadGeometry {
            capacity: 3,
            granularity: 2
        }
        .to_string()
        .contains("chunks of 2 bytes"));
    }

    /// RMM issue 1957: initial 2 MiB, maximum 64 MiB, one allocation of 64 MiB. The new chunk
    /// extends the free 2 MiB at the end to exactly 64 MiB.
    #[test]
    fn growth_extends_the_free_tail() {
        let mut r = MappedRange::new(64 * MIB, G).unwrap();
        r.insert(at(0, G)).unwrap();
        assert_eq!(r.place(64 * MIB, G).unwrap(), at(G, 62 * MIB));
        // Without the tail the request cannot fit at the end, and there is no hole.
        assert!(matches!(
            r.place(64 * MIB, 0),
            Err(RangeError::NoRoom { .. })
        ));
        // A small request maps one granule, a larger one what it lacks, rounded up.
        assert_eq!(r.place(256, 0).unwrap(), at(G, G));
        assert_eq!(r.place(5 * MIB, MIB).unwrap(), at(G, 4 * MIB));
        // A request the tail covers (a race) still maps one granule.
        assert_eq!(r.place(MIB, G).unwrap(), at(G, G));
        // Beyond the range: no room, whatever the tail.
        let e = r.place(64 * MIB + 256, 64 * MIB).unwrap_err();
        assert!(e.to_string().starts_with("Not enough room to grow"), "{e}");
    }

    /// With a minimum growth, a chunk at the end is at least that share of what is mapped
    /// (rounded down to the granularity), but never more than the range has room for, and never
    /// less than the request lacks.
    #[test]
    fn the_minimum_growth_adds_slack_where_it_fits() {
        let mut r = MappedRange::new(64 * MIB, G).unwrap();
        r.set_min_growth_percent(25);
        // Nothing mapped: the request alone.
        assert_eq!(r.place(256, 0).unwrap(), at(0, G));
        r.insert(at(0, 16 * MIB)).unwrap();
        // 25 % of 16 MiB is 4 MiB: two granules for a request of one.
        assert_eq!(r.place(256, 0).unwrap(), at(16 * MIB, 4 * MIB));
        // Under pressure, no minimum: just what the request lacks beyond the tail.
        assert_eq!(r.place_exact(256, 0).unwrap(), at(16 * MIB, G));
        assert_eq!(r.place_exact(5 * MIB, MIB).unwrap(), at(16 * MIB, 4 * MIB));
        // A request that lacks more gets what it lacks.
        assert_eq!(r.place(10 * MIB, 0).unwrap(), at(16 * MIB, 10 * MIB));
        r.insert(at(16 * MIB, 44 * MIB)).unwrap();
        // 25 % of 60 MiB is 15 MiB, but only 4 MiB are left: those.
        assert_eq!(r.place(256, 0).unwrap(), at(60 * MIB, 4 * MIB));
        // Capped at 100 %.
        r.set_min_growth_percent(1000);
        assert_eq!(r.min_growth_percent, 100);
        r.set_min_growth_percent(0);
        assert_eq!(r.place(256, 0).unwrap(), at(60 * MIB, G));
    }

    #[test]
    fn holes_are_filled_when_the_end_has_no_room() {
        let mut r = MappedRange::new(16 * MIB, G).unwrap();
        for i in 0..8 {
            r.insert(at(i * G, G)).unwrap();
        }
        assert!(matches!(r.place(256, 0), Err(RangeError::NoRoom { .. })));
        r.remove(at(2 * G, G)).unwrap();
        r.remove(at(3 * G, G)).unwrap();
        r.remove(at(6 * G, G)).unwrap();
        r.remove(at(7 * G, G)).unwrap();
        // The end moved back to 12 MiB; the hole at 4-8 MiB stays.
        assert_eq!(r.end(), 6 * G);
        assert_eq!(r.holes().collect::<Vec<_>>(), vec![(2 * G, 2 * G)]);
        assert_eq!(r.place(4 * MIB, 0).unwrap(), at(6 * G, 2 * G));
        // 6 MiB do not fit after 12 MiB: the hole is filled, whole.
        assert_eq!(r.place(6 * MIB, 0).unwrap(), at(2 * G, 2 * G));
        assert_eq!(r.mapped(), 4 * G);
    }

    #[test]
    fn bad_chunks_change_nothing() {
        let mut r = MappedRange::new(16 * MIB, G).unwrap();
        r.insert(at(2 * G, 2 * G)).unwrap();
        let before = r.clone();
        for bad in [
            at(0, 0),
            at(MIB, G),
            at(0, MIB),
            at(2 * G, G),
            at(3 * G, 2 * G),
            at(G, 2 * G),
            at(6 * G, 4 * G),
            at(usize::MAX - G + 1, G),
        ] {
            assert_eq!(r.insert(bad), Err(RangeError::BadChunk(bad)), "{bad:?}");
            assert_eq!(r, before);
        }
        for unknown in [at(2 * G, G), at(0, G), at(4 * G, 2 * G)] {
            assert_eq!(r.remove(unknown), Err(RangeError::UnknownChunk(unknown)));
            assert_eq!(r, before);
        }
        r.remove(at(2 * G, 2 * G)).unwrap();
        assert_eq!((r.mapped(), r.end(), r.chunk_count()), (0, 0, 0));
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Place a request (in 256-byte units) with a tail (in granules) and map it.
        Grow { units: usize, tail: usize },
        /// Unmap chunk `i % chunks`.
        Release { i: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (1..40_000usize, 0..4usize).prop_map(|(units, tail)| Op::Grow { units, tail }),
            1 => any::<usize>().prop_map(|i| Op::Release { i }),
        ]
    }

    proptest! {
        /// Against a model of granules: chunks never overlap and stay inside the range, the
        /// counters agree, a placement is always mappable, growth goes to the end exactly when
        /// the end has room, and "no room" means the end has none and no hole is left.
        #[test]
        fn placements_match_a_granule_model(ops in prop::collection::vec(op(), 1..80)) {
            const GRANULES: usize = 16;
            let mut r = MappedRange::new(GRANULES * G, G).unwrap();
            let mut model = [false; GRANULES];
            for op in ops {
                match op {
                    Op::Grow { units, tail } => {
                        let request = units * 256;
                        let tail = (tail * G).min(r.end());
                        // No minimum growth is set: `place` and `place_exact` agree.
                        prop_assert_eq!(r.place(request, tail), r.place_exact(request, tail));
                        match r.place(request, tail) {
                            Ok(p) => {
                                let need = request.saturating_sub(tail).max(1).div_ceil(G) * G;
                                if p.offset == r.end() {
                                    prop_assert_eq!(p.size, need);
                                } else {
                                    // A hole, filled whole, because the end lacked room.
                                    prop_assert!(r.end() + need > r.capacity());
                                    prop_assert_eq!(Some((p.offset, p.size)), r.holes().next());
                                }
                                r.insert(p).unwrap();
                                let granules = &mut model[p.offset / G..(p.offset + p.size) / G];
                                prop_assert!(granules.iter().all(|&m| !m), "a granule mapped twice");
                                granules.fill(true);
                            }
                            Err(RangeError::NoRoom { .. }) => {
                                prop_assert!(r.holes().next().is_none() || request > r.capacity());
                                let need = request.saturating_sub(tail).max(1).div_ceil(G) * G;
                                prop_assert!(r.end() + need > r.capacity());
                            }
                            Err(e) => prop_assert!(false, "unexpected {}", e),
                        }
                    }
                    Op::Release { i } => {
                        let chunks: Vec<(usize, usize)> = r.chunks().collect();
                        if chunks.is_empty() {
                            continue;
                        }
                        let (offset, size) = chunks[i % chunks.len()];
                        r.remove(at(offset, size)).unwrap();
                        model[offset / G..(offset + size) / G].fill(false);
                    }
                }
                let mapped = model.iter().filter(|&&m| m).count() * G;
                prop_assert_eq!(r.mapped(), mapped);
                let end = model.iter().rposition(|&m| m).map_or(0, |g| (g + 1) * G);
                prop_assert_eq!(r.end(), end);
                let holes: usize = r.holes().map(|h| h.1).sum();
                prop_assert_eq!(holes + mapped, end);
            }
        }
    }
}
