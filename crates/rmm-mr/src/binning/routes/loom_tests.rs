//! Loom models of the binning routes (`cargo xtask loom routes`): an allocation racing an
//! insertion, with the seal that decides which version the allocation routes by. Each checks,
//! on every interleaving: the route the allocation took is among the candidates of its free
//! afterwards; when it took the old version's route into the new bin's range, the insertion's
//! `admit` saw that route (so a refusal could be made); a refused insertion leaves the routes
//! unsealed and unchanged, and the allocation never waits for ever.
//!
//! The main thread only spawns and joins; ghost state is in std atomics.

use std::sync::atomic::{AtomicUsize, Ordering};

use loom::sync::Arc;
use loom::thread;

use super::{BinRoutes, SEALED};
use crate::sync::Seen;

/// No route recorded yet (the upstream is 0, bins are their sizes).
const NONE: usize = usize::MAX;

fn payload(route: Option<&usize>) -> usize {
    route.copied().unwrap_or(0)
}

#[test]
fn loom_an_allocation_racing_a_new_bin_keeps_its_route() {
    static SEEN: Seen<2> = Seen::new([
        "the allocation routed by the old version",
        "the allocation waited for the seal and routed by the new one",
    ]);
    crate::sync::model("binning::routes::insert_vs_allocate", || {
        let routes = Arc::new(BinRoutes::new());
        routes
            .insert(1024, 1024usize, |_, _| Ok::<_, ()>(()))
            .unwrap();
        let went = Arc::new(AtomicUsize::new(NONE));
        let served = Arc::new(std::sync::Mutex::new(Vec::new()));
        let allocator = {
            let (routes, went) = (Arc::clone(&routes), Arc::clone(&went));
            thread::spawn(move || {
                let v = routes.for_allocation(600);
                went.store(payload(v.route(600).map(|(_, b)| b)), Ordering::SeqCst);
            })
        };
        let writer = {
            let (routes, served) = (Arc::clone(&routes), Arc::clone(&served));
            thread::spawn(move || {
                let added = routes.insert(768, 768, |_, s| {
                    served.lock().unwrap().extend(s.map(payload));
                    Ok::<_, ()>(())
                });
                assert_eq!(added, Ok(true));
            })
        };
        allocator.join().unwrap();
        writer.join().unwrap();
        let went = went.load(Ordering::SeqCst);
        let candidates: Vec<usize> = routes
            .candidates(routes.current(), 600)
            .map(payload)
            .collect();
        assert!(candidates.contains(&went), "{went} not in {candidates:?}");
        let served = served.lock().unwrap();
        match went {
            1024 => {
                assert!(served.contains(&1024), "admit missed the old route");
                assert_eq!(candidates, [768, 1024]);
                SEEN.saw(0);
            }
            768 => {
                assert_eq!(candidates, [768], "an unused version kept as a candidate");
                SEEN.saw(1);
            }
            other => panic!("routed to {other}"),
        }
    });
    SEEN.check();
}

#[test]
fn loom_a_refused_bin_unseals_and_the_allocation_goes_on() {
    static SEEN: Seen<2> = Seen::new(["admit saw the allocation", "admit saw nothing"]);
    crate::sync::model("binning::routes::refuse_vs_allocate", || {
        let routes = Arc::new(BinRoutes::new());
        let allocator = {
            let routes = Arc::clone(&routes);
            thread::spawn(move || {
                let v = routes.for_allocation(300);
                assert_eq!(v.route(300), None, "no bin was ever added");
            })
        };
        let writer = {
            let routes = Arc::clone(&routes);
            thread::spawn(move || {
                let refused = routes.insert(512, 512usize, |_, s| {
                    SEEN.saw(if s.count() > 0 { 0 } else { 1 });
                    Err("no")
                });
                assert!(refused.is_err());
            })
        };
        allocator.join().unwrap();
        writer.join().unwrap();
        assert!(routes.is_empty());
        let v = routes.current();
        assert_eq!(
            v.allocated.load(Ordering::Relaxed) & SEALED,
            0,
            "left sealed"
        );
        assert!(v.allocated(300), "the allocation's class was not recorded");
    });
    SEEN.check();
}
