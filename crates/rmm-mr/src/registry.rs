//! The per-device resource registry (RMM's `per_device_resource.hpp`).
//!
//! Each device has a slot holding a [`SharedResource`]; initially a [`CudaMemoryResource`].
//! Reads are the hot path (every default allocation asks for the current device's resource),
//! so they take no lock: each thread caches the handles it read together with a global
//! generation number, and only re-reads the slots (under a read lock) after a setter bumped the
//! generation. Setters take a write lock.
//!
//! The per-thread cache holds *weak* handles: a thread that read a resource once and then went
//! idle does not keep it alive after it was replaced, so a replaced pool and its memory go as
//! soon as nobody else holds them. Reads never panic, not even from a thread-local destructor
//! after the cache is gone (they then read the slots directly).
//!
//! Better than RMM: the slots hold owning handles and readers get owning clones, so replacing a
//! device's resource while memory from the old one is alive is safe (whatever holds that
//! memory keeps the old resource alive), where RMM's references into the map would dangle.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock, Weak};

use rmm_sys::DeviceId;

use crate::error::MrResult;
use crate::resource::{DeviceMemoryResource, SharedResource};
use crate::resources::CudaMemoryResource;

struct Registry {
    generation: AtomicU64,
    slots: RwLock<HashMap<i32, SharedResource>>,
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Registry {
        generation: AtomicU64::new(1),
        slots: RwLock::new(HashMap::new()),
    })
}

/// The initial resource of every device (RMM's `detail::initial_resource()`).
fn initial_resource() -> SharedResource {
    static INITIAL: OnceLock<SharedResource> = OnceLock::new();
    Arc::clone(INITIAL.get_or_init(|| Arc::new(CudaMemoryResource::new())))
}

/// A thread's cache: the generation it was filled at, and a weak handle per device.
type Cache = (u64, HashMap<i32, Weak<dyn DeviceMemoryResource>>);

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new((0, HashMap::new()));
}

/// The resource for `device` (RMM's `get_per_device_resource_ref`, but owning).
#[doc(alias = "rmm::mr::get_per_device_resource_ref")]
pub fn per_device_resource(device: DeviceId) -> SharedResource {
    let reg = registry();
    let generation = reg.generation.load(Ordering::Acquire);
    let cached = CACHE
        .try_with(|cache| {
            let mut cache = cache.try_borrow_mut().ok()?;
            if cache.0 != generation {
                cache.1.clear();
                cache.0 = generation;
                return None;
            }
            cache.1.get(&device.0)?.upgrade()
        })
        .ok()
        .flatten();
    if let Some(r) = cached {
        return r;
    }
    let r = reg
        .slots
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&device.0)
        .cloned()
        .unwrap_or_else(initial_resource);
    // Nothing to do when the cache is gone (thread-local teardown) or busy.
    let _ = CACHE.try_with(|cache| {
        if let Ok(mut cache) = cache.try_borrow_mut() {
            if cache.0 == generation {
                cache.1.insert(device.0, Arc::downgrade(&r));
            }
        }
    });
    r
}

/// Installs `resource` for `device` and returns the previous one (or the initial resource), so
/// the caller can put it back later (RMM's `set_per_device_resource`). The resource must have been created with
/// `device` current.
#[doc(alias = "rmm::mr::set_per_device_resource")]
pub fn set_per_device_resource(device: DeviceId, resource: SharedResource) -> SharedResource {
    replace(device, Some(resource))
}

/// Puts the initial resource back for `device` and returns the previous one.
#[doc(alias = "rmm::mr::reset_per_device_resource")]
pub fn reset_per_device_resource(device: DeviceId) -> SharedResource {
    replace(device, None)
}

fn replace(device: DeviceId, resource: Option<SharedResource>) -> SharedResource {
    let reg = registry();
    let mut slots = reg.slots.write().unwrap_or_else(|e| e.into_inner());
    let previous = match resource {
        Some(r) => slots.insert(device.0, r),
        None => slots.remove(&device.0),
    };
    reg.generation.fetch_add(1, Ordering::AcqRel);
    previous.unwrap_or_else(initial_resource)
}

/// The current device's resource (RMM's `get_current_device_resource_ref`).
#[doc(alias = "rmm::mr::get_current_device_resource_ref")]
pub fn current_device_resource() -> MrResult<SharedResource> {
    Ok(per_device_resource(rmm_sys::current_device()?))
}

/// Installs `resource` for the current device; returns the previous one.
#[doc(alias = "rmm::mr::set_current_device_resource")]
pub fn set_current_device_resource(resource: SharedResource) -> MrResult<SharedResource> {
    Ok(set_per_device_resource(
        rmm_sys::current_device()?,
        resource,
    ))
}

/// Puts the initial resource back for the current device; returns the previous one.
#[doc(alias = "rmm::mr::reset_current_device_resource")]
pub fn reset_current_device_resource() -> MrResult<SharedResource> {
    Ok(reset_per_device_resource(rmm_sys::current_device()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{resource_cast, DeviceMemoryResource};
    use crate::testing::HostMockResource;
    use rmm_stream::CudaStreamView;

    // Device ids far from real ones, so these tests cannot disturb each other or GPU tests.
    #[test]
    fn initial_resource_is_cuda() {
        let r = per_device_resource(DeviceId(9001));
        assert!(resource_cast::<CudaMemoryResource>(&*r).is_some());
        assert!(r.is_equal(&CudaMemoryResource::new()));
    }

    #[test]
    fn set_returns_previous_and_reset_restores() {
        let dev = DeviceId(9002);
        let mock = HostMockResource::new();
        let prev = set_per_device_resource(dev, Arc::new(mock.clone()));
        assert!(resource_cast::<CudaMemoryResource>(&*prev).is_some());
        let now = per_device_resource(dev);
        assert!(now.is_equal(&mock));
        let back = reset_per_device_resource(dev);
        assert!(back.is_equal(&mock));
        assert!(resource_cast::<CudaMemoryResource>(&*per_device_resource(dev)).is_some());
    }

    #[test]
    fn replaced_resource_stays_alive_for_its_memory() {
        let dev = DeviceId(9003);
        let mock = HostMockResource::new();
        set_per_device_resource(dev, Arc::new(mock.clone()));
        let held = per_device_resource(dev);
        let p = held.allocate(CudaStreamView::default(), 64, 256).unwrap();
        reset_per_device_resource(dev);
        // The old resource is still usable through the handle we hold.
        // SAFETY: `p` came from `held` with these arguments.
        unsafe {
            held.deallocate(CudaStreamView::default(), p, 64, 256)
                .unwrap()
        };
        assert_eq!(mock.live_allocations(), 0);
    }

    #[test]
    fn other_threads_see_updates() {
        let dev = DeviceId(9004);
        let a = HostMockResource::new();
        let b = HostMockResource::new();
        set_per_device_resource(dev, Arc::new(a.clone()));
        // Warm this thread's cache, then change the slot from another thread.
        assert!(per_device_resource(dev).is_equal(&a));
        let b2 = b.clone();
        std::thread::spawn(move || {
            assert!(per_device_resource(dev).is_equal(&a));
            set_per_device_resource(dev, Arc::new(b2));
        })
        .join()
        .unwrap();
        assert!(per_device_resource(dev).is_equal(&b));
        reset_per_device_resource(dev);
    }

    #[test]
    fn an_idle_thread_does_not_keep_a_replaced_resource_alive() {
        let dev = DeviceId(9005);
        let r: SharedResource = Arc::new(HostMockResource::new());
        let weak = Arc::downgrade(&r);
        set_per_device_resource(dev, r);
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        // A thread reads the resource once (filling its cache), then idles.
        let idle = std::thread::spawn(move || {
            drop(per_device_resource(dev));
            seen_tx.send(()).unwrap();
            let _ = done_rx.recv();
        });
        seen_rx.recv().unwrap();
        drop(reset_per_device_resource(dev));
        let alive = weak.upgrade().is_some();
        done_tx.send(()).unwrap();
        idle.join().unwrap();
        assert!(
            !alive,
            "an idle thread's cache kept the replaced resource alive"
        );
    }

    #[test]
    fn a_read_from_a_thread_local_destructor_does_not_panic() {
        struct Late(std::sync::mpsc::Sender<bool>);
        impl Drop for Late {
            fn drop(&mut self) {
                // Runs after the cache was destroyed (registered before it).
                let r = per_device_resource(DeviceId(9006));
                let _ = self
                    .0
                    .send(resource_cast::<CudaMemoryResource>(&*r).is_some());
            }
        }
        thread_local! {
            static LATE: RefCell<Option<Late>> = const { RefCell::new(None) };
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            LATE.with(|l| *l.borrow_mut() = Some(Late(tx)));
            drop(per_device_resource(DeviceId(9006)));
        })
        .join()
        .unwrap();
        assert!(rx.recv().unwrap(), "the late read got the wrong resource");
    }

    #[test]
    fn current_device_needs_a_driver() {
        if rmm_sys::is_driver_present() {
            assert!(!matches!(current_device_resource(), Err(e) if e.is_no_device()));
        } else {
            assert!(current_device_resource().unwrap_err().is_no_device());
            assert!(reset_current_device_resource().unwrap_err().is_no_device());
        }
    }
}
