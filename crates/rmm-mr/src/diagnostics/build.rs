//! Building snapshots and reports from what a resource's bookkeeping lists (pure).

use super::report::OomReport;
use super::snapshot::{BlockRecord, Segment};
use crate::stream_ordered::stream_lists::StreamKey;

/// A stream-ordered resource's free lists: `(stream, [(address, size)])`.
type Lists<K> = Vec<(K, Vec<(u64, usize)>)>;

/// One block as a resource lists it: `(address, size, allocated, stream, requested)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) address: u64,
    pub(crate) size: usize,
    pub(crate) allocated: bool,
    pub(crate) stream: u64,
    pub(crate) requested: usize,
}

impl Piece {
    /// A handed-out block of `size` bytes for a request of `requested` (rounded) bytes.
    pub(crate) fn handed(address: u64, size: usize, requested: usize) -> Self {
        Self {
            address,
            size,
            allocated: true,
            stream: 0,
            requested,
        }
    }
}

/// The segments of `chunks` (`(address, size)`), each with the parts of `pieces` that lie in
/// it, in address order. A piece that spans chunks (the VMM pool's chunks merge) is cut at
/// their boundaries; pieces outside every chunk are left out.
pub(crate) fn segments(device: i32, chunks: &[(u64, usize)], pieces: &mut [Piece]) -> Vec<Segment> {
    pieces.sort_unstable_by_key(|p| p.address);
    let mut chunks = chunks.to_vec();
    chunks.sort_unstable();
    chunks
        .iter()
        .map(|&(start, size)| {
            let end = start.saturating_add(size as u64);
            let first =
                pieces.partition_point(|p| p.address.saturating_add(p.size as u64) <= start);
            let blocks = pieces[first..]
                .iter()
                .take_while(|p| p.address < end)
                .map(|p| {
                    let a = p.address.max(start);
                    let b = p.address.saturating_add(p.size as u64).min(end);
                    let size = usize::try_from(b - a).unwrap_or(0);
                    BlockRecord {
                        address: a,
                        size,
                        requested: if p.allocated {
                            p.requested.min(size)
                        } else {
                            0
                        },
                        allocated: p.allocated,
                        stream: p.stream,
                        frames: Vec::new(),
                    }
                })
                .collect();
            Segment {
                device,
                address: start,
                size,
                stream: 0,
                blocks,
            }
        })
        .collect()
}

/// Fills the free-memory fields of `report` from free lists (`(stream, blocks)`): the free
/// bytes, the largest block, and the bytes per list.
pub(crate) fn free_lists(report: &mut OomReport, lists: &[(u64, Vec<(u64, usize)>)]) {
    report.free_per_stream = lists
        .iter()
        .map(|(stream, blocks)| (*stream, blocks.iter().map(|b| b.1).sum()))
        .collect();
    report.free = report.free_per_stream.iter().map(|s| s.1).sum();
    report.largest_free_block = lists
        .iter()
        .flat_map(|(_, blocks)| blocks.iter().map(|b| b.1))
        .max()
        .unwrap_or(0);
}

/// The number a stream list is reported under: the stream's id (`cuStreamGetId`) for
/// ordinary streams, 0 for the legacy default stream, 2 (`CU_STREAM_PER_THREAD`) for a
/// per-thread default stream, `u64::MAX` for the list of blocks whose stream is gone.
fn stream_number(key: StreamKey) -> u64 {
    match key {
        StreamKey::Legacy => 0,
        StreamKey::PerThread(_) => 2,
        StreamKey::Stream(id) => id,
        StreamKey::Orphan => u64::MAX,
    }
}

/// The free lists of a stream-ordered core (`StreamOrdered::free_lists`), each under its
/// stream's number ([`stream_number`]), for [`free_lists`] and [`free_pieces`].
pub(crate) fn numbered(lists: Lists<StreamKey>) -> Lists<u64> {
    lists
        .into_iter()
        .map(|(key, blocks)| (stream_number(key), blocks))
        .collect()
}

/// The blocks of `lists` as free pieces on their lists' streams.
pub(crate) fn free_pieces(lists: Lists<u64>) -> impl Iterator<Item = Piece> {
    lists.into_iter().flat_map(|(stream, blocks)| {
        blocks.into_iter().map(move |(address, size)| Piece {
            address,
            size,
            allocated: false,
            stream,
            requested: 0,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(address: u64, size: usize, allocated: bool) -> Piece {
        Piece {
            allocated,
            ..Piece::handed(address, size, size)
        }
    }

    #[test]
    fn pieces_are_cut_at_chunk_boundaries() {
        let mut pieces = vec![
            piece(0x1000, 0x100, true),
            // Spans the two chunks (contiguous chunks merge).
            piece(0x1100, 0x200, false),
            piece(0x1300, 0x100, true),
            // Outside every chunk.
            piece(0x9000, 0x100, true),
        ];
        let segs = segments(0, &[(0x1200, 0x200), (0x1000, 0x200)], &mut pieces);
        assert_eq!(segs.len(), 2);
        assert_eq!(segs[0].address, 0x1000);
        let s0: Vec<_> = segs[0].blocks.iter().map(|b| (b.address, b.size)).collect();
        assert_eq!(s0, [(0x1000, 0x100), (0x1100, 0x100)]);
        let s1: Vec<_> = segs[1].blocks.iter().map(|b| (b.address, b.size)).collect();
        assert_eq!(s1, [(0x1200, 0x100), (0x1300, 0x100)]);
        assert_eq!(segs[1].allocated_bytes(), 0x100);
    }

    #[test]
    fn free_lists_are_numbered_by_stream() {
        let lists = numbered(vec![
            (StreamKey::Legacy, vec![(0x100, 1)]),
            (StreamKey::PerThread(7), vec![]),
            (StreamKey::Stream(42), vec![(0x200, 2), (0x300, 3)]),
            (StreamKey::Orphan, vec![(0x400, 4)]),
        ]);
        let streams: Vec<u64> = lists.iter().map(|l| l.0).collect();
        assert_eq!(streams, [0, 2, 42, u64::MAX]);
        let pieces: Vec<_> = free_pieces(lists)
            .map(|p| (p.address, p.size, p.allocated, p.stream))
            .collect();
        assert_eq!(
            pieces,
            [
                (0x100, 1, false, 0),
                (0x200, 2, false, 42),
                (0x300, 3, false, 42),
                (0x400, 4, false, u64::MAX)
            ]
        );
    }

    #[test]
    fn free_list_totals() {
        let mut r = OomReport::new(10);
        free_lists(&mut r, &[(0, vec![(0, 4), (8, 2)]), (7, vec![(16, 5)])]);
        assert_eq!((r.free, r.largest_free_block), (11, 5));
        assert_eq!(r.free_per_stream, [(0, 6), (7, 5)]);
    }
}
