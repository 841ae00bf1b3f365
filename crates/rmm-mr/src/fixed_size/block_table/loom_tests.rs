//! Loom models of the fixed-size block table (`cargo xtask loom`): concurrent frees of one
//! block, and blocks passed between threads through a free list while a chunk is added and
//! threads with stale tables refresh them. Each checks, on every interleaving: of the frees of
//! one hand-out exactly one succeeds and it gets the hand-out's tag; a wrong-size free never
//! succeeds; no block is handed out twice, lost or duplicated; nothing is handed out at the end.

use loom::sync::{Arc, Mutex};
use loom::thread;

use super::*;
use crate::sync::Seen;

const BLOCK: usize = 256;

#[test]
fn loom_one_free_of_a_block_wins() {
    static SEEN: Seen<2> = Seen::new(["the first freer won", "the second freer won"]);
    crate::sync::model("block_table::double_free", || {
        let ledger = BlockLedger::new(BLOCK).unwrap();
        ledger.add_chunk(0, 2).unwrap();
        let table = ledger.table();
        table.hand_out_tagged(0, BLOCK, 7).unwrap();
        let frees: Vec<_> = (0..2)
            .map(|_| {
                let t = table.clone();
                thread::spawn(move || t.take_back_tagged(0, BLOCK))
            })
            .collect();
        let wrong = {
            let t = table.clone();
            thread::spawn(move || t.take_back(0, 2 * BLOCK))
        };
        let results: Vec<_> = frees.into_iter().map(|f| f.join().unwrap()).collect();
        let wins: Vec<usize> = (0..2).filter(|&i| results[i].is_ok()).collect();
        assert_eq!(wins.len(), 1, "{results:?}");
        assert_eq!(results[wins[0]], Ok(7), "the winner got another tag");
        assert_eq!(
            results[1 - wins[0]],
            Err(FixedSizeError::DoubleFree { addr: 0 })
        );
        let wrong = wrong.join().unwrap();
        assert!(
            matches!(
                wrong,
                Err(FixedSizeError::SizeMismatch { .. } | FixedSizeError::DoubleFree { .. })
            ),
            "{wrong:?}"
        );
        assert_eq!(ledger.handed_out(), (0, 0));
        SEEN.saw(wins[0]);
    });
    SEEN.check();
}

/// The free list of the models: blocks with their ids, as the resource's lists keep them.
type FreeList = Mutex<Vec<(u64, BlockId)>>;

/// A thread of the resource, as far as the table is concerned: it takes a block from the free
/// list, records it as handed out with its own tag on its (possibly stale) table, by the id the
/// list kept with it, refreshing the table when the block's chunk is missing, frees it, and
/// puts it back with the id the free found.
fn use_a_block(ledger: &BlockLedger, free: &FreeList, table: &mut BlockTable, tag: u64) {
    let Some((addr, id)) = free.lock().unwrap().pop() else {
        return;
    };
    let mut handed = table.hand_out_id(id, addr, BLOCK, tag);
    if matches!(handed, Err(FixedSizeError::UnknownAddress { .. })) {
        *table = ledger.table();
        handed = table.hand_out_id(id, addr, BLOCK, tag);
    }
    assert_eq!(handed, Ok(()), "block {addr:#x} handed out twice");
    thread::yield_now();
    assert_eq!(
        table.take_back_id(addr, BLOCK),
        Ok((id, tag)),
        "block {addr:#x}"
    );
    free.lock().unwrap().push((addr, id));
}

#[test]
fn loom_blocks_are_never_lost_or_duplicated() {
    static SEEN: Seen<2> = Seen::new(["a stale table refreshed", "none needed it"]);
    crate::sync::model("block_table::free_list", || {
        let ledger = Arc::new(BlockLedger::new(BLOCK).unwrap());
        let (_, first) = ledger.add_numbered_chunk(0, 1).unwrap();
        let first: Vec<(u64, BlockId)> = first.numbered_chunks().flat_map(|c| c.blocks()).collect();
        let free = Arc::new(Mutex::new(first));
        let grower = {
            let (ledger, free) = (Arc::clone(&ledger), Arc::clone(&free));
            thread::spawn(move || {
                let (_, latest) = ledger.add_numbered_chunk(4096, 1).unwrap();
                let chunk = latest.numbered_chunks().last().unwrap();
                free.lock().unwrap().extend(chunk.blocks());
            })
        };
        let users: Vec<_> = (1..=2u64)
            .map(|tag| {
                let (ledger, free) = (Arc::clone(&ledger), Arc::clone(&free));
                thread::spawn(move || {
                    let mut table = ledger.table();
                    let stale = table.len();
                    use_a_block(&ledger, &free, &mut table, tag);
                    use_a_block(&ledger, &free, &mut table, tag);
                    table.len() != stale
                })
            })
            .collect();
        grower.join().unwrap();
        let refreshed: Vec<bool> = users.into_iter().map(|u| u.join().unwrap()).collect();
        let refreshed = refreshed.contains(&true);
        let mut blocks: Vec<u64> = free.lock().unwrap().iter().map(|&(a, _)| a).collect();
        blocks.sort_unstable();
        assert_eq!(blocks, [0, 4096], "a block was lost or duplicated");
        assert_eq!(ledger.handed_out(), (0, 0));
        SEEN.saw(usize::from(!refreshed));
    });
    SEEN.check();
}
