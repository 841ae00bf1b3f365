//! Fault injection into the arena resource, with the harness of [`crate::fault_tests`]: under
//! rmm-sys's simulated driver the arena records and waits on events as on a GPU, so event
//! creation, records, waits, queries and synchronizations can fail at any step; after every
//! failed call the blocks handed out (every live block of every superblock, but those whose free
//! is pending) and the mock's live set must be as before it.

use super::{ArenaMemoryResource, ArenaOptions};
use crate::fault_tests::{driver_faults, expect, sweep, Faulty, Subject, STREAM_CALLS};
use crate::testing::{FaultKind, FaultyResource, HostMockResource};
use rmm_sys::fault::{DriverCall, FaultScope};

const MIB: usize = 1 << 20;

fn subject<'a>(
    name: &'static str,
    mr: &'a ArenaMemoryResource<Faulty>,
    faulty: &'a Faulty,
    mock: &'a HostMockResource,
    stream_count: usize,
) -> Subject<'a> {
    let mut faults = driver_faults(&STREAM_CALLS);
    faults.extend(driver_faults(&[DriverCall::Query]));
    Subject {
        name,
        mr,
        faulty,
        mock,
        state: Box::new(|| format!("{:?}", mr.inner.live_blocks())),
        memory: None,
        check: Box::new(move |live| {
            let mut want: Vec<u64> = live.iter().map(|l| l.ptr.addr()).collect();
            want.sort_unstable();
            let got: Vec<u64> = mr.inner.live_blocks().iter().map(|&(a, _)| a).collect();
            expect("blocks handed out", got, want)?;
            expect("upstream allocations", mock.live_allocations(), 1)
        }),
        faults,
        max_bytes: 3 * MIB / 2,
        alignments: &[256],
        stream_count,
        mismatch_frees: false,
        maintain: None,
        maintenance: 0,
        writer: None,
    }
}

#[test]
fn arena() {
    sweep(
        "arena",
        |f| ArenaMemoryResource::with_options(f.clone(), ArenaOptions::new().arena_size(16 * MIB)),
        |mr, faulty, mock| subject("arena", mr, faulty, mock, 4),
    );
}

#[test]
fn a_refused_arena_allocation_leaves_nothing_behind() {
    let _sim = FaultScope::simulated();
    for kind in FaultKind::ALL {
        let mock = HostMockResource::new();
        let faulty = FaultyResource::new(mock.clone());
        faulty.fail_next_allocation(kind);
        let e = ArenaMemoryResource::with_options(
            faulty.clone(),
            ArenaOptions::new().arena_size(4 * MIB),
        )
        .unwrap_err();
        assert!(kind.matches(&e), "{kind:?}: {e}");
        assert_eq!(mock.live_allocations(), 0);
    }
    // The arena's upstream allocation is synchronized (as on a GPU): when that fails, the
    // memory goes back.
    let mock = HostMockResource::new();
    rmm_sys::fault::inject(rmm_sys::fault::Fault::next(DriverCall::Synchronize));
    assert!(ArenaMemoryResource::with_options(
        mock.clone(),
        ArenaOptions::new().arena_size(4 * MIB)
    )
    .is_err());
    assert_eq!(mock.live_allocations(), 0);
}
