//! Growth under pressure ([`crate::stream_ordered::pressure`]) in the core: a thief that found a
//! fitting block no event covers asks its resource for what the request needs, an ordinary miss
//! for the resource's own growth; on the model free list of `fault_tests`, rmm-sys's simulated
//! driver and simulated streams.

use std::cell::RefCell;

use rmm_stream::CudaStreamView;
use rmm_sys::fault::FaultScope;
use rmm_sys::DevicePtr;

use super::fault_tests::{allocate, core, drop_core, ModelBlocks, BLOCK, CHUNK};
use super::{Expand, GrowthCause, StreamOrdered};
use crate::error::MrResult;
use crate::resource::DeviceMemoryResource;
use crate::stream_ordered::pressure::PressureScope;
use crate::testing::HostMockResource;

/// An allocation of one block on `stream` whose growth (if any) takes a chunk of one block for
/// [`GrowthCause::Pressure`] and of [`CHUNK`] bytes otherwise, and logs what it was asked and
/// whether a pressure scope was active meanwhile.
fn allocate_logged(
    core: &StreamOrdered<ModelBlocks>,
    mock: &HostMockResource,
    stream: CudaStreamView<'_>,
    log: &RefCell<Vec<(Expand, bool)>>,
) -> MrResult<DevicePtr> {
    core.allocate(stream, BLOCK, mock, |ask| {
        log.borrow_mut().push((ask, PressureScope::is_active()));
        let size = match ask.cause {
            GrowthCause::Pressure => BLOCK,
            GrowthCause::Ordinary => CHUNK,
        };
        mock.allocate(stream, size, 256).map(|p| (p, size))
    })
}

fn free(core: &StreamOrdered<ModelBlocks>, stream: CudaStreamView<'_>, p: DevicePtr) {
    // SAFETY: every caller frees a block it allocated from `core` and still holds.
    unsafe { core.deallocate(stream, p, BLOCK).unwrap() };
}

/// Stream A (the second stream key: the core is eager) takes the whole chunk and frees one
/// block, which no event covers (A's list is lazy). Returns A's blocks still held.
fn a_frees_one_unrecorded_block(
    core: &StreamOrdered<ModelBlocks>,
    mock: &HostMockResource,
    a: CudaStreamView<'_>,
) -> Vec<DevicePtr> {
    let legacy = CudaStreamView::legacy();
    free(core, legacy, allocate(core, mock, legacy).unwrap());
    let mut held: Vec<DevicePtr> = (0..CHUNK / BLOCK)
        .map(|_| allocate(core, mock, a).unwrap())
        .collect();
    assert_eq!(core.pool_size(), CHUNK, "A grew");
    free(core, a, held.pop().unwrap());
    held
}

#[test]
fn a_thief_that_finds_an_unrecorded_fitting_block_grows_by_the_request() {
    let _sim = FaultScope::simulated();
    let (core, mock, _) = core();
    let a = CudaStreamView::simulated(0x7e01);
    let b = CudaStreamView::simulated(0x7e02);
    let held = a_frees_one_unrecorded_block(&core, &mock, a);
    let log = RefCell::new(Vec::new());
    // B finds A's free block uncovered: it asks A to record and grows, by one block only.
    let got = allocate_logged(&core, &mock, b, &log).unwrap();
    let asked = log.take();
    assert_eq!(asked.len(), 1, "{asked:?}");
    let (ask, scoped) = asked[0];
    assert_eq!(ask.cause, GrowthCause::Pressure, "{ask:?}");
    assert_eq!((ask.pool_size, ask.tail), (CHUNK, 0));
    assert!(
        scoped,
        "the growth under pressure ran outside a pressure scope"
    );
    assert!(!PressureScope::is_active(), "the scope outlived the growth");
    assert_eq!(core.pool_size(), CHUNK + BLOCK);
    // A's next operation records; B's next allocation steals A's block behind the event.
    let again = allocate(&core, &mock, a).unwrap();
    free(&core, a, again);
    let stolen = allocate_logged(&core, &mock, b, &log).unwrap();
    assert!(log.take().is_empty(), "B grew instead of stealing");
    assert_eq!(stolen, again);
    assert_eq!(core.pool_size(), CHUNK + BLOCK);
    for p in held {
        free(&core, a, p);
    }
    free(&core, b, got);
    free(&core, b, stolen);
    drop_core(core, &mock);
}

#[test]
fn a_miss_with_no_fitting_block_anywhere_grows_as_usual() {
    let _sim = FaultScope::simulated();
    let (core, mock, _) = core();
    let a = CudaStreamView::simulated(0x7e11);
    let b = CudaStreamView::simulated(0x7e12);
    let mut held = a_frees_one_unrecorded_block(&core, &mock, a);
    // A takes its block back: no list holds a free block.
    held.push(allocate(&core, &mock, a).unwrap());
    let log = RefCell::new(Vec::new());
    let got = allocate_logged(&core, &mock, b, &log).unwrap();
    let asked = log.take();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0].0.cause, GrowthCause::Ordinary, "{asked:?}");
    assert!(!asked[0].1, "an ordinary growth ran in a pressure scope");
    assert_eq!(core.pool_size(), 2 * CHUNK);
    for p in held {
        free(&core, a, p);
    }
    free(&core, b, got);
    drop_core(core, &mock);
}

#[test]
fn a_growth_that_serves_a_growth_under_pressure_is_under_pressure() {
    let _sim = FaultScope::simulated();
    let (core, mock, _) = core();
    let s = CudaStreamView::legacy();
    let held: Vec<DevicePtr> = (0..CHUNK / BLOCK)
        .map(|_| allocate(&core, &mock, s).unwrap())
        .collect();
    let log = RefCell::new(Vec::new());
    // Nothing is withheld here, but a resource above grows under pressure on this thread.
    let got = {
        let _outer = PressureScope::enter(GrowthCause::Pressure);
        allocate_logged(&core, &mock, s, &log).unwrap()
    };
    let asked = log.take();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0].0.cause, GrowthCause::Pressure, "{asked:?}");
    assert_eq!(core.pool_size(), CHUNK + BLOCK);
    for p in held.into_iter().chain([got]) {
        free(&core, s, p);
    }
    drop_core(core, &mock);
}
